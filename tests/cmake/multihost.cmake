# multihost.cmake - several "hosts" on one machine: network namespaces joined
# by a bridge, one `kaitian run --nnodes` per namespace (tests/multihost/).
# Needs root; skipped (exit 77) where `ip netns add` fails. RUN_SERIAL: the
# jobs are large and timing-sensitive.
set(KT_MULTIHOST_DIR ${KT_TEST_DIR}/multihost)
if(TARGET coll_test)
  set(KT_MULTIHOST_COLL $<TARGET_FILE:coll_test>)
else()
  set(KT_MULTIHOST_COLL "")
endif()

add_test(NAME multihost.netns.jobs
  COMMAND sh ${KT_MULTIHOST_DIR}/netns.sh ${KT_CLI} jobs ${KT_MULTIHOST_COLL})
set_tests_properties(multihost.netns.jobs PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE
  SKIP_RETURN_CODE 77 LABELS "multihost")

if(TARGET fault_prog)
  add_test(NAME multihost.netns.kill
    COMMAND sh ${KT_MULTIHOST_DIR}/netns.sh ${KT_CLI} kill $<TARGET_FILE:fault_prog>)
  set_tests_properties(multihost.netns.kill PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE
    SKIP_RETURN_CODE 77 LABELS "multihost")
endif()
