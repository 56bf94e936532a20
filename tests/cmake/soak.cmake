# soak.cmake - long runs whose memory and descriptors must stay flat
# (tests/soak/). `make soak` is the full run (10^6 small and 10^3 64 MiB
# allreduces, 2000 rounds of every collective, 1000 communicators split and
# destroyed, on 4 ranks); the suite runs a short one.
kt_add_test_exe(soak_prog ${KT_TEST_DIR}/soak/soak_prog.c)
add_test(NAME soak.smoke
  COMMAND sh ${KT_TEST_DIR}/soak/soak.sh ${KT_CLI} $<TARGET_FILE:soak_prog> 4
          small=100000 large=20 large_bytes=4194304 mix=60 churn=100)
set_tests_properties(soak.smoke PROPERTIES TIMEOUT 300 LABELS "soak" PROCESSORS 4)
