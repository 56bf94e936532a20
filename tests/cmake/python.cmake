# python.cmake - the PyTorch backend (python/torch_kaitian): import and library
# lookup, every operation at 1-3 ranks and over env:// tcp:// file://, errors
# surfacing from the core, asynchronous completion and DDP, the README's
# training job against gloo, a slice of torch's own conformance suite, the
# benchmark and torch_kaitian.optim.CPUAdam against torch's Adam/AdamW. Needs
# a Python with torch ($PYTHON, else /usr/bin/python3); the full conformance
# suite is `make conformance` (tests/python/conformance.py).
# Not under sanitizers: an ASan/TSan libkaitian cannot be loaded into python3.
if(KT_SANITIZE_ADDRESS OR KT_SANITIZE_THREAD)
  return()
endif()
# Included twice: tests python_<name> under Debian's torch 1.13 ($PYTHON, else
# /usr/bin/python3), and again as python2_<name> under torch 2.x from PyPI, where
# python_torch2.cmake sets KT_TORCH2_PYTHON to its venv's interpreter.
if(KT_TORCH2_PYTHON)
  set(KT_PY_PREFIX python2)
  set(KT_PYTHON ${KT_TORCH2_PYTHON})
elseif(DEFINED ENV{PYTHON} AND NOT "$ENV{PYTHON}" STREQUAL "")
  set(KT_PY_PREFIX python)
  set(KT_PYTHON "$ENV{PYTHON}")
else()
  set(KT_PY_PREFIX python)
  set(KT_PYTHON /usr/bin/python3)
endif()
set(kt_py_rc 0)  # the torch-2 venv is made by the test python2_venv, after configuring
if(NOT KT_TORCH2_PYTHON)
  execute_process(COMMAND ${KT_PYTHON} -c "import torch.distributed, numpy"
                  RESULT_VARIABLE kt_py_rc OUTPUT_QUIET ERROR_QUIET)
endif()
if(NOT kt_py_rc EQUAL 0)
  # Not a silent skip: make test installs python3-torch, so a torch that cannot
  # be imported is a broken machine, and one failing test says so in the summary.
  message(WARNING "python tests: ${KT_PYTHON} cannot import torch and numpy: the tests of "
                  "torch_kaitian cannot run (python_torch_importable fails)")
  add_test(NAME python_torch_importable
           COMMAND ${KT_PYTHON} -c "import torch.distributed, numpy")
  set_tests_properties(python_torch_importable PROPERTIES TIMEOUT 60 LABELS "python;no_sanitizer")
  return()
endif()

set(KT_PY_DIR ${KT_TEST_DIR}/python)
# Every test loads this build's library and runs ranks under the same Python; on a
# host with accelerators, -n beyond them fills up with CPU ranks (auto+cpu).
set(KT_PY_ENV KAITIAN_LIBRARY=$<TARGET_FILE:kaitian> PYTHON=${KT_PYTHON} KAITIAN_TIMEOUT=120000
    KAITIAN_DEVICES=auto+cpu
    PYTHONPATH=${PROJECT_SOURCE_DIR}/python)

# kt_py_test(name timeout_s command...)
function(kt_py_test name timeout)
  add_test(NAME ${KT_PY_PREFIX}_${name} COMMAND ${CMAKE_COMMAND} -E env ${KT_PY_ENV} ${ARGN})
  set_tests_properties(${KT_PY_PREFIX}_${name} PROPERTIES TIMEOUT ${timeout} LABELS "python;no_sanitizer")
endfunction()

kt_py_test(import 60 ${KT_PYTHON} ${KT_PY_DIR}/test_import.py)
kt_py_test(cpu_adam 300 ${KT_PYTHON} ${KT_PY_DIR}/test_cpu_adam.py)
kt_py_test(device 60 ${KT_PYTHON} ${KT_PY_DIR}/test_device.py)
# The decoders of the Python layer fuzzed in process, 3 s each (a longer
# campaign: test_fuzz_decoders.py SECONDS).
kt_py_test(fuzz_decoders 120 ${KT_PYTHON} ${KT_PY_DIR}/test_fuzz_decoders.py 3)
kt_py_test(ops_np1 300 ${KT_CLI} run -n 1 ${KT_PY_DIR}/test_ops.py)
kt_py_test(solo 300 ${KT_CLI} run -n 1 ${KT_PY_DIR}/test_solo.py)
# The device path on this CPU machine (test_devpath.py): ranks that declare a
# device type (KAITIAN_TEST_DEVICE_TYPE, one entry per rank) stage their CPU
# tensors as a device rank does, in pieces (tiny ones here: every boundary
# case); gloo stands in for a device type's own library (KAITIAN_DEVICE_LIBRARY).
kt_py_test(devpath_unit 120 ${KT_PYTHON} ${KT_PY_DIR}/test_devpath.py unit)
kt_py_test(devpath_paths_np3 200 ${CMAKE_COMMAND} -E env KAITIAN_TEST_DEVICE_TYPE=x,cpu,cpu
           KAITIAN_DEVICE_PIECE_BYTES=1000 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_devpath.py paths)
kt_py_test(devpath_ops_np2 300 ${CMAKE_COMMAND} -E env KAITIAN_TEST_DEVICE_TYPE=x,cpu
           KAITIAN_DEVICE_PIECE_BYTES=24 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_ops.py)
kt_py_test(devpath_ops_np3 400 ${CMAKE_COMMAND} -E env KAITIAN_TEST_DEVICE_TYPE=x
           KAITIAN_DEVICE_PIECE_BYTES=40 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_ops.py)
kt_py_test(devpath_pipelined_np3 300 ${CMAKE_COMMAND} -E env KAITIAN_TEST_DEVICE_TYPE=x,cpu,cpu
           ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_devpath.py cuda)
kt_py_test(devpath_bench_smoke 200 ${CMAKE_COMMAND} -E env KAITIAN_TEST_DEVICE_TYPE=x,cpu
           ${KT_PYTHON} -m torch_kaitian.bench --device cpu --max-bytes 262144 --reps 1 --scale 0.05
           --steps 2 --batch 16)
kt_py_test(devpath_hetero_exact 200 ${CMAKE_COMMAND} -E env KAITIAN_TEST_DEVICE_TYPE=x,cpu,cpu
           KAITIAN_DEVICE_PIECE_BYTES=4096 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_hetero.py exact --caps 4,1,1)
foreach(layout "2x2;a,b,a,b" "3p1;a,a,a,cpu")
  list(GET layout 0 name)
  list(GET layout 1 types)
  set(kt_hier_env ${CMAKE_COMMAND} -E env KAITIAN_TEST_DEVICE_TYPE=${types} KAITIAN_DEVICE_LIBRARY=gloo)
  kt_py_test(hier_ops_${name} 400 ${kt_hier_env} ${KT_CLI} run -n 4 ${KT_PY_DIR}/test_ops.py)
  kt_py_test(hier_${name} 200 ${kt_hier_env} ${KT_CLI} run -n 4 ${KT_PY_DIR}/test_devpath.py hier)
  kt_py_test(hier_dead_${name} 120 ${kt_hier_env} ${KT_CLI} run -n 4 ${KT_PY_DIR}/test_devpath.py hier_dead)
  kt_py_test(hier_hetero_exact_${name} 200 ${kt_hier_env} ${KT_CLI} run -n 4 ${KT_PY_DIR}/test_hetero.py
             exact --caps 1,2,3,5)
endforeach()
kt_py_test(mutation_plants 60 ${KT_PYTHON} ${KT_TEST_DIR}/mutation/mutate.py --check)
kt_py_test(ops_np2 300 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_ops.py)
kt_py_test(ops_np3 400 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_ops.py)
kt_py_test(ops_tcp_init 200 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_ops.py --init tcp --quick)
kt_py_test(ops_file_init 200 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_ops.py --init file --quick)
foreach(scenario timeout dead_peer mismatch ddp)
  kt_py_test(errors_${scenario} 120 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_errors.py ${scenario})
endforeach()
kt_py_test(errors_env_timeout 120 ${CMAKE_COMMAND} -E env KAITIAN_TIMEOUT=2000
           ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_errors.py env_timeout)
kt_py_test(hetero_sampler 120 ${KT_PYTHON} ${KT_PY_DIR}/test_hetero.py sampler)
kt_py_test(hetero_exact_np2 200 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_hetero.py exact --caps 1,3)
kt_py_test(hetero_exact_np3 200 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_hetero.py exact --caps 1,2,5)
kt_py_test(hetero_exact_np4_accum 200 ${KT_CLI} run -n 4 ${KT_PY_DIR}/test_hetero.py exact
           --caps 2,1,1,3 --accum 2)
kt_py_test(hetero_exact_np3_gloo 200 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_hetero.py exact
           --caps 1,2,5 --accum 2 --backend gloo)
kt_py_test(hetero_micro_np3 200 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_hetero.py micro
           --caps 1,2,3 --max-local 3)
kt_py_test(hetero_micro_np2_gloo 200 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_hetero.py micro
           --caps 1,4 --max-local 2 --backend gloo)
kt_py_test(hetero_slow 120 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_hetero.py slow)
kt_py_test(hetero_planner 120 ${KT_PYTHON} ${KT_PY_DIR}/test_hetero.py planner)
kt_py_test(hetero_exact_np3_plan 200 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_hetero.py exact
           --caps 1,2,5 --plan-out 1)
kt_py_test(hetero_exact_np3_plan_accum 200 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_hetero.py exact
           --caps 1,2,5 --plan-out 0 --accum 2)
kt_py_test(hetero_exact_np3_plan_gloo 200 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_hetero.py exact
           --caps 1,2,5 --plan-out 2 --backend gloo)
kt_py_test(hetero_curves 200 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_hetero.py curves)
kt_py_test(hetero_leaveout 200 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_hetero.py leaveout)
kt_py_test(hetero_rebalance 200 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_hetero.py rebalance)
kt_py_test(hetero_overhead 120 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_hetero.py overhead)
kt_py_test(hetero_leftout_fails 200 ${KT_PYTHON} ${KT_PY_DIR}/test_hetero.py drive_leftout_fails
           ${KT_CLI})
set_tests_properties(${KT_PY_PREFIX}_hetero_slow ${KT_PY_PREFIX}_hetero_curves
                     ${KT_PY_PREFIX}_hetero_leaveout ${KT_PY_PREFIX}_hetero_rebalance
                     PROPERTIES SKIP_RETURN_CODE 77)
# The package's modules import in one direction (no cycle, lazy imports too).
kt_py_test(imports 60 ${KT_PYTHON} ${KT_PY_DIR}/test_imports.py ${PROJECT_SOURCE_DIR}/python/torch_kaitian)
kt_py_test(balance_cut 120 ${KT_PYTHON} ${KT_PY_DIR}/test_balance.py cut)
kt_py_test(balance_slow 200 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_balance.py slow)
kt_py_test(balance_exact_np3 200 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_balance.py exact)
kt_py_test(balance_exact_np4 200 ${KT_CLI} run -n 4 ${KT_PY_DIR}/test_balance.py exact)
kt_py_test(balance_exact_np4_gloo 200 ${KT_CLI} run -n 4 ${KT_PY_DIR}/test_balance.py exact
           --backend gloo)
# Times layers on CPUs it pins (one rank shares its CPU with a busy process):
# nothing else may run meanwhile.
set_tests_properties(${KT_PY_PREFIX}_balance_slow PROPERTIES SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
kt_py_test(bench_hetero_smoke 300 ${KT_PYTHON} ${KT_PY_DIR}/test_bench_hetero.py ${KT_CLI} ${KT_PYTHON})
kt_py_test(train_zero 500 ${KT_PYTHON} ${KT_PY_DIR}/test_train_zero.py ${KT_CLI})
kt_py_test(train_gpt 500 ${KT_PYTHON} ${KT_PY_DIR}/test_train_gpt.py ${KT_CLI})
kt_py_test(train_hetero 400 ${KT_PYTHON} ${KT_PY_DIR}/test_train_hetero.py ${KT_CLI})
foreach(np 1 2 3 4 5 6 7 8)
  kt_py_test(topology_np${np} 200 ${KT_CLI} run -n ${np} ${KT_PY_DIR}/test_topology.py)
endforeach()
foreach(np 4 6)
  kt_py_test(topology_np${np}_gloo 200 ${KT_CLI} run -n ${np} ${KT_PY_DIR}/test_topology.py --backend gloo)
endforeach()
foreach(np 1 2 3 4)
  kt_py_test(zero_np${np} 300 ${KT_CLI} run -n ${np} ${KT_PY_DIR}/test_zero.py check)
endforeach()
kt_py_test(zero_np3_gloo 300 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_zero.py check --backend gloo)
kt_py_test(zero_resume 300 ${KT_PYTHON} ${KT_PY_DIR}/test_zero.py resume ${KT_CLI})
foreach(np 2 3 4)
  kt_py_test(pipeline_np${np} 300 ${KT_CLI} run -n ${np} ${KT_PY_DIR}/test_pipeline.py)
endforeach()
kt_py_test(pipeline_np3_gloo 300 ${KT_CLI} run -n 3 ${KT_PY_DIR}/test_pipeline.py --backend gloo)
foreach(np 2 4)
  kt_py_test(tensor_parallel_np${np} 300 ${KT_CLI} run -n ${np} ${KT_PY_DIR}/test_tensor_parallel.py)
endforeach()
kt_py_test(tensor_parallel_np2_gloo 300 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_tensor_parallel.py
           --backend gloo)
kt_py_test(async 200 ${KT_CLI} run -n 2 ${KT_PY_DIR}/test_async.py)
kt_py_test(train_digits 600 ${KT_PYTHON} ${KT_PY_DIR}/test_train_digits.py ${KT_CLI})
kt_py_test(conformance_smoke 600 ${KT_PYTHON} ${KT_PY_DIR}/conformance.py --world-size 2
           -k test_all_reduce_sum -k test_broadcast_full -k test_DistributedDataParallelCPU
           -k test_send_recv_any_source -k test_sparse_all_reduce_sum)
kt_py_test(bench_smoke 300 ${KT_PYTHON} -m torch_kaitian.bench --max-bytes 65536 --reps 1 --scale 0.05 --steps 2)
# pip (wheel, venv, --target) and make install from a fresh copy of the tree,
# with the README's C example; torchrun (skips on Debian's 1.13, whose torchrun
# is broken on Python 3.11).
kt_py_test(install 900 ${KT_PYTHON} ${KT_PY_DIR}/test_install.py)
kt_py_test(torchrun 300 ${KT_PYTHON} ${KT_PY_DIR}/test_torchrun.py)
set_tests_properties(${KT_PY_PREFIX}_torchrun PROPERTIES SKIP_RETURN_CODE 77)

# The same sources for a torch script: torch_kaitian.init_process_group() and
# a plain dist.init_process_group("kaitian") under Slurm's and Open MPI's
# variables (the launcher cases run again, quickly, with the Python ones).
add_test(NAME ${KT_PY_PREFIX}_env_sources COMMAND ${CMAKE_COMMAND} -E env ${KT_PY_ENV}
         sh ${KT_TEST_DIR}/launcher/env_sources.sh ${KT_CLI} $<TARGET_FILE:launch_env_test>
         ${KT_PY_DIR}/test_launch_env.py)
set_tests_properties(${KT_PY_PREFIX}_env_sources PROPERTIES TIMEOUT 240 LABELS "python;no_sanitizer")

# Real Slurm and mpirun, C and Python cases (tests/launcher/slurm.sh; skips
# where the packages are missing).
add_test(NAME ${KT_PY_PREFIX}_slurm COMMAND ${CMAKE_COMMAND} -E env ${KT_PY_ENV} KT_SLURM_NODES=2
         sh ${KT_TEST_DIR}/launcher/slurm.sh ${KT_CLI} $<TARGET_FILE:launch_env_test>
         ${KT_PY_DIR}/test_launch_env.py)
set_tests_properties(${KT_PY_PREFIX}_slurm PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77 RUN_SERIAL TRUE
                     LABELS "python;no_sanitizer;slurm")

# A torch job with several communicators in a small /dev/shm: one shrink
# warning for the job (tests/launcher/shm_groups.sh; needs root for the
# mount namespace, else skipped).
add_test(NAME ${KT_PY_PREFIX}_shm_groups COMMAND ${CMAKE_COMMAND} -E env ${KT_PY_ENV}
         sh ${KT_TEST_DIR}/launcher/shm_groups.sh ${KT_CLI})
set_tests_properties(${KT_PY_PREFIX}_shm_groups PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS "python;no_sanitizer")
