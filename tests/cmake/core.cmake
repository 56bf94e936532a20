# Core API tests that are not per-collective: completion queues.
kt_add_test_exe(cq_test ${KT_TEST_DIR}/c/cq_test.c)
foreach(np 1 3)
  add_test(NAME cq_np${np} COMMAND ${KT_CLI} run -n ${np} $<TARGET_FILE:cq_test>)
  set_tests_properties(cq_np${np} PROPERTIES TIMEOUT 120 LABELS core ENVIRONMENT "KAITIAN_TIMEOUT=60000")
endforeach()

# The owner's path: one thread's blocking calls without the lock, until a
# second thread or a non-blocking call comes (also mid-op).
kt_add_test_exe(owner_test ${KT_TEST_DIR}/c/owner_test.c)
target_link_libraries(owner_test PRIVATE Threads::Threads)
foreach(np 2 3)
  add_test(NAME owner_np${np} COMMAND ${KT_CLI} run -n ${np} $<TARGET_FILE:owner_test>)
  set_tests_properties(owner_np${np} PROPERTIES TIMEOUT 120 LABELS core ENVIRONMENT "KAITIAN_TIMEOUT=60000")
endforeach()

# The job's shape from the environment: host lists (against scontrol where it
# is installed), tasks-per-node lists, every source, bad environments.
kt_add_test_exe(test_jobenv ${KT_TEST_DIR}/c/test_jobenv.c)
add_test(NAME jobenv COMMAND test_jobenv)
set_tests_properties(jobenv PROPERTIES TIMEOUT 60 LABELS core)

# The TCP transport's striping of long messages over a pair's connections,
# between two communicators of one process joined by socketpairs.
kt_add_test_exe(test_tcp_stripe ${KT_TEST_DIR}/c/test_tcp_stripe.c)
add_test(NAME tcp_stripe COMMAND test_tcp_stripe)
set_tests_properties(tcp_stripe PROPERTIES TIMEOUT 120 LABELS core)

kt_add_test_exe(size_faults ${KT_TEST_DIR}/c/size_faults.c)
foreach(np 2 4)
  add_test(NAME size_faults_np${np} COMMAND ${KT_CLI} run -n ${np} $<TARGET_FILE:size_faults>)
  # Not under the sanitizers: their shadow memory faults in pages of its own.
  set_tests_properties(size_faults_np${np} PROPERTIES TIMEOUT 120 LABELS "no_sanitizer")
endforeach()
