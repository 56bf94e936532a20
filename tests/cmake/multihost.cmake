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

# The hierarchical algorithms of every collective that has one, on nodes of
# 2+2, 2+2+2, 3+2 and 2+2+1 ranks in scrambled rank orders, and the flat ones
# forced (KAITIAN_ALGO) on the same nodes.
if(TARGET coll_test)
  add_test(NAME multihost.netns.hier
    COMMAND sh ${KT_MULTIHOST_DIR}/netns.sh ${KT_CLI} hier $<TARGET_FILE:coll_test>)
  set_tests_properties(multihost.netns.hier PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE
    SKIP_RETURN_CODE 77 LABELS "multihost")
endif()

# A process outside the job connects to a rank's data port with the old
# predictable hello token and with a random one: rejected, one WARN line
# each naming its address, the job's results exact (tests/multihost/stranger.sh).
add_test(NAME multihost.netns.stranger COMMAND sh ${KT_MULTIHOST_DIR}/stranger.sh ${KT_CLI})
set_tests_properties(multihost.netns.stranger PROPERTIES TIMEOUT 120 RUN_SERIAL TRUE
  SKIP_RETURN_CODE 77 LABELS "multihost")

# A node's link taken down: node 0's launcher names it within
# KAITIAN_RUN_LOST_MS (5 s here), with both signals (tests/multihost/linkdown.sh).
add_test(NAME multihost.netns.linkdown COMMAND sh ${KT_MULTIHOST_DIR}/linkdown.sh ${KT_CLI})
set_tests_properties(multihost.netns.linkdown PROPERTIES TIMEOUT 120 RUN_SERIAL TRUE
  SKIP_RETURN_CODE 77 LABELS "multihost")

if(TARGET fault_prog)
  add_test(NAME multihost.netns.kill
    COMMAND sh ${KT_MULTIHOST_DIR}/netns.sh ${KT_CLI} kill $<TARGET_FILE:fault_prog>)
  set_tests_properties(multihost.netns.kill PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE
    SKIP_RETURN_CODE 77 LABELS "multihost")
endif()

# Heterogeneous data parallelism across hosts: Python ranks, so not in
# sanitizer builds (an ASan libkaitian cannot be loaded into python3).
if(NOT (KT_SANITIZE_ADDRESS OR KT_SANITIZE_THREAD))
  if(DEFINED ENV{PYTHON} AND NOT "$ENV{PYTHON}" STREQUAL "")
    set(KT_MH_PYTHON "$ENV{PYTHON}")
  else()
    set(KT_MH_PYTHON /usr/bin/python3)
  endif()
  execute_process(COMMAND ${KT_MH_PYTHON} -c "import torch.distributed"
                  RESULT_VARIABLE kt_mh_py_rc OUTPUT_QUIET ERROR_QUIET)
  if(kt_mh_py_rc EQUAL 0)
    add_test(NAME multihost.netns.hetero
      COMMAND ${CMAKE_COMMAND} -E env KAITIAN_LIBRARY=$<TARGET_FILE:kaitian> PYTHON=${KT_MH_PYTHON}
              PYTHONPATH=${PROJECT_SOURCE_DIR}/python
              sh ${KT_MULTIHOST_DIR}/netns.sh ${KT_CLI} hetero ${KT_TEST_DIR}/python/test_hetero.py)
    set_tests_properties(multihost.netns.hetero PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE
      SKIP_RETURN_CODE 77 LABELS "multihost;python;no_sanitizer")
  endif()
endif()
