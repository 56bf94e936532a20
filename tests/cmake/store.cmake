# Rendezvous store: wrappers, TCP server and client, secret, malformed frames.
# The test re-executes itself for its client processes.
kt_add_test_exe(test_store ${KT_TEST_DIR}/c/test_store.c)
target_link_libraries(test_store PRIVATE Threads::Threads)
add_test(NAME store COMMAND test_store)
set_tests_properties(store PROPERTIES TIMEOUT 180 LABELS "store")
