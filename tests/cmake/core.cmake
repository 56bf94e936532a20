# Core API tests that are not per-collective: completion queues.
kt_add_test_exe(cq_test ${KT_TEST_DIR}/c/cq_test.c)
foreach(np 1 3)
  add_test(NAME cq_np${np} COMMAND ${KT_CLI} run -n ${np} $<TARGET_FILE:cq_test>)
  set_tests_properties(cq_np${np} PROPERTIES TIMEOUT 120 LABELS core ENVIRONMENT "KAITIAN_TIMEOUT=60000")
endforeach()
