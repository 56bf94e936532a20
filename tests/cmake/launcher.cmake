# launcher.cmake - tests of the `kaitian` command: `kaitian run` (the
# launcher) and `kaitian info`. Each is a shell script given the command's path.
kt_add_test_exe(launcher_store_probe ${KT_TEST_DIR}/launcher/store_probe.c)

set(KT_LAUNCHER_DIR ${KT_TEST_DIR}/launcher)
set(KT_PROBE $<TARGET_FILE:launcher_store_probe>)

# kt_launcher_test(name timeout_s script args...)
function(kt_launcher_test name timeout script)
  add_test(NAME launcher_${name} COMMAND sh ${KT_LAUNCHER_DIR}/${script} ${ARGN})
  set_tests_properties(launcher_${name} PROPERTIES TIMEOUT ${timeout} LABELS launcher)
endfunction()

kt_launcher_test(env_contract 60 env_contract.sh ${KT_CLI} ${KT_PROBE})
kt_launcher_test(output 60 output.sh ${KT_CLI})
kt_launcher_test(exit_code 60 exit_code.sh ${KT_CLI})
kt_launcher_test(signal_rank 60 signal_rank.sh ${KT_CLI})
kt_launcher_test(sigterm 60 sigterm.sh ${KT_CLI})
kt_launcher_test(grandchild 60 grandchild.sh ${KT_CLI})
kt_launcher_test(kill9 60 kill9.sh ${KT_CLI})
kt_launcher_test(python 60 python.sh ${KT_CLI})
kt_launcher_test(multinode 120 multinode.sh ${KT_CLI} ${KT_PROBE})
# Slow is not gone: a node's launcher blocked on its output, in a store
# call, or stopped is not declared lost; one killed is named within 1 s;
# KAITIAN_RUN_LOST_MS checked.
kt_launcher_test(liveness 120 liveness.sh ${KT_CLI})
kt_launcher_test(info 60 info.sh ${KT_CLI} ${PROJECT_SOURCE_DIR}/src/core/params.def)
kt_launcher_test(env_docs 30 env_docs.sh ${KT_CLI} ${PROJECT_SOURCE_DIR}/docs/env.md)
kt_launcher_test(bind 60 bind.sh ${KT_CLI})
kt_launcher_test(devices 120 devices.sh ${KT_CLI})
kt_launcher_test(shm_cleanup 60 shm_cleanup.sh ${KT_CLI})
kt_launcher_test(shm_small 60 shm_small.sh ${KT_CLI} $<TARGET_FILE:fault_prog>)
set_tests_properties(launcher_shm_small PROPERTIES SKIP_RETURN_CODE 77)
# Its ranks are Python programs loading the library: not in sanitizer builds.
kt_launcher_test(shm_linger 60 shm_linger.sh ${KT_CLI})
set_tests_properties(launcher_shm_linger PROPERTIES SKIP_RETURN_CODE 77 LABELS "launcher;no_sanitizer")
kt_launcher_test(shm_oversub 60 shm_oversub.sh ${KT_CLI})
# The job secret on no command line and in no log line at TRACE; shared
# memory mapped only unlinked and mode 0600.
kt_launcher_test(secrets 60 secrets.sh ${KT_CLI})

# The job's shape from each environment kt_job_from_env reads (torchrun-style
# variables, Slurm's, Open MPI's, PMI's, set by hand), bad environments,
# launchers shaped by Slurm's variables, --local-rank-arg.
kt_add_test_exe(launch_env_test ${KT_TEST_DIR}/c/launch_env_test.c)
kt_launcher_test(env_sources 180 env_sources.sh ${KT_CLI} $<TARGET_FILE:launch_env_test>)

# Real Slurm (its daemons started by the test: 2 slurmd "nodes" on this host)
# and real mpirun (Open MPI, MPICH): srun, salloc, sbatch, mpirun inside an
# allocation, bad Slurm environments. Skips (77) where slurm-wlm/munge or an
# mpirun is missing. The release build also runs its Python cases
# (python_slurm in python.cmake); sanitizer builds the C ones here.
if(KT_SANITIZE_ADDRESS OR KT_SANITIZE_THREAD)
  add_test(NAME launcher_slurm COMMAND ${CMAKE_COMMAND} -E env KT_SLURM_NODES=2
           sh ${KT_LAUNCHER_DIR}/slurm.sh ${KT_CLI} $<TARGET_FILE:launch_env_test> -)
  set_tests_properties(launcher_slurm PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 RUN_SERIAL TRUE
                       LABELS "launcher;slurm")
endif()
