# fuzz.cmake - libFuzzer harnesses (tests/fuzz/fuzz_*.c), built with clang
# (-fsanitize=fuzzer,address,undefined) when it has libFuzzer, from the
# library sources each parser needs. make test runs each for a few seconds
# over its seed corpus and regression inputs (fuzz_smoke_*); the campaign is
# `make fuzz FUZZ_SECONDS=N`.
if(KT_SANITIZE_ADDRESS OR KT_SANITIZE_THREAD)
  return()
endif()
find_program(KT_CLANG NAMES clang clang-14)
if(NOT KT_CLANG)
  message(STATUS "fuzz: no clang; the libFuzzer harnesses are not built")
  return()
endif()
execute_process(COMMAND sh -c "printf 'int LLVMFuzzerTestOneInput(const char*d,unsigned long n){(void)d;(void)n;return 0;}' | ${KT_CLANG} -x c -fsanitize=fuzzer - -o /dev/null"
                RESULT_VARIABLE kt_fuzz_rc OUTPUT_QUIET ERROR_QUIET)
if(NOT kt_fuzz_rc EQUAL 0)
  message(STATUS "fuzz: ${KT_CLANG} has no libFuzzer (-fsanitize=fuzzer); the harnesses are not built")
  return()
endif()

set(KT_FUZZ_DIR ${KT_TEST_DIR}/fuzz)
set(KT_FUZZ_FLAGS -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined
    -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/src -I${PROJECT_SOURCE_DIR}/src/core)
# kt_fuzz_harness(name sources...): tests/fuzz/fuzz_<name>.c with the library
# sources it needs (relative to src/).
function(kt_fuzz_harness name)
  set(srcs ${KT_FUZZ_DIR}/fuzz_${name}.c)
  foreach(s ${ARGN})
    list(APPEND srcs ${PROJECT_SOURCE_DIR}/src/${s})
  endforeach()
  add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/fuzz/fuzz_${name}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/fuzz
    COMMAND ${KT_CLANG} ${KT_FUZZ_FLAGS} ${srcs} -o ${CMAKE_BINARY_DIR}/fuzz/fuzz_${name}
    DEPENDS ${srcs} COMMENT "libFuzzer harness fuzz_${name}" VERBATIM)
  add_custom_target(fuzz_${name} ALL DEPENDS ${CMAKE_BINARY_DIR}/fuzz/fuzz_${name})
  add_test(NAME fuzz_smoke_${name}
    COMMAND sh ${KT_FUZZ_DIR}/run.sh ${CMAKE_BINARY_DIR}/fuzz/fuzz_${name} ${KT_FUZZ_DIR}/corpus/${name}
            ${KT_FUZZ_DIR}/regress/${name} 5)
  set_tests_properties(fuzz_smoke_${name} PROPERTIES TIMEOUT 60 LABELS "fuzz;no_sanitizer")
endfunction()

kt_fuzz_harness(jobenv core/hostlist.c core/jobenv.c core/error.c core/log.c core/params.c core/util.c
                store/store.c)
kt_fuzz_harness(store_server store/tcp_server.c store/tcp_client.c store/store.c core/error.c core/log.c
                core/params.c core/util.c)
