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
# The whole library compiled for fuzzing (coverage, ASan, UBSan), one object
# per source so that make builds them in parallel, in an archive: harnesses
# whose parser sits deep in the library (the transports, the tuner, the
# launcher) link it. A harness that #includes a .c file to reach its static
# functions defines every symbol of that file itself, so the archive's copy
# of it is never pulled in.
file(GLOB_RECURSE kt_fuzz_lib_srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/*.c)
set(kt_fuzz_objs)
# Each object depends on every header it includes, as the compiler lists
# them (DEPFILE, CMake 3.20 on; IMPLICIT_DEPENDS before, which misses the
# headers found through -I src/core: a changed inline there left stale
# objects and an undefined symbol at the harnesses' link).
foreach(s ${kt_fuzz_lib_srcs})
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR}/src ${s})
  string(REPLACE "/" "_" obj ${rel})
  set(obj ${CMAKE_BINARY_DIR}/fuzz/lib/${obj}.o)
  if(CMAKE_VERSION VERSION_GREATER_EQUAL 3.20)
    set(kt_fuzz_deps DEPFILE ${obj}.d)
    set(kt_fuzz_md -MD -MF ${obj}.d)
  else()
    set(kt_fuzz_deps IMPLICIT_DEPENDS C ${s})
    set(kt_fuzz_md)
  endif()
  add_custom_command(OUTPUT ${obj}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/fuzz/lib
    COMMAND ${KT_CLANG} -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer-no-link,address,undefined
            -DKT_BUILD_INFO="fuzz" -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/src
            -I${PROJECT_SOURCE_DIR}/src/core ${kt_fuzz_md} -c ${s} -o ${obj}
    DEPENDS ${s} ${kt_fuzz_deps} VERBATIM)
  list(APPEND kt_fuzz_objs ${obj})
endforeach()
set(KT_FUZZ_LIB ${CMAKE_BINARY_DIR}/fuzz/libkt_fuzz.a)
add_custom_command(OUTPUT ${KT_FUZZ_LIB}
  COMMAND ${CMAKE_COMMAND} -E rm -f ${KT_FUZZ_LIB}
  COMMAND ${CMAKE_AR} qcs ${KT_FUZZ_LIB} ${kt_fuzz_objs}
  DEPENDS ${kt_fuzz_objs} COMMENT "the library for the libFuzzer harnesses" VERBATIM)
add_custom_target(kt_fuzz_lib DEPENDS ${KT_FUZZ_LIB})

# A harness is one compile of several sources, which takes no single
# depfile: besides what IMPLICIT_DEPENDS finds (the files it includes by
# relative path), it depends on every header of the project, which
# IMPLICIT_DEPENDS misses where found through -I src/core (as above).
file(GLOB_RECURSE kt_fuzz_headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/*.h ${PROJECT_SOURCE_DIR}/src/*.h
     ${PROJECT_SOURCE_DIR}/src/*.def ${PROJECT_SOURCE_DIR}/tools/*.h ${KT_FUZZ_DIR}/*.h)

# kt_fuzz_harness(name [LIB] sources...): tests/fuzz/fuzz_<name>.c with the
# library sources it needs (relative to src/; other paths relative to the
# project), or with LIB the whole library (libkt_fuzz.a).
function(kt_fuzz_harness name)
  set(srcs ${KT_FUZZ_DIR}/fuzz_${name}.c)
  set(libs)
  set(deps)
  foreach(s ${ARGN})
    if(s STREQUAL "LIB")
      set(libs ${KT_FUZZ_LIB} -lpthread -lrt -lm)
      set(deps kt_fuzz_lib ${KT_FUZZ_LIB})
    elseif(s MATCHES "^(tools|tests)/")
      list(APPEND srcs ${PROJECT_SOURCE_DIR}/${s})
    else()
      list(APPEND srcs ${PROJECT_SOURCE_DIR}/src/${s})
    endif()
  endforeach()
  add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/fuzz/fuzz_${name}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/fuzz
    COMMAND ${KT_CLANG} ${KT_FUZZ_FLAGS} ${srcs} ${libs} -o ${CMAKE_BINARY_DIR}/fuzz/fuzz_${name}
    DEPENDS ${srcs} ${deps} ${kt_fuzz_headers} IMPLICIT_DEPENDS C ${srcs} COMMENT "libFuzzer harness fuzz_${name}"
    VERBATIM)
  add_custom_target(fuzz_${name} ALL DEPENDS ${CMAKE_BINARY_DIR}/fuzz/fuzz_${name})
  if(deps)
    add_dependencies(fuzz_${name} kt_fuzz_lib)
  endif()
  add_test(NAME fuzz_smoke_${name}
    COMMAND sh ${KT_FUZZ_DIR}/run.sh ${CMAKE_BINARY_DIR}/fuzz/fuzz_${name} ${KT_FUZZ_DIR}/corpus/${name}
            ${KT_FUZZ_DIR}/regress/${name} 3)
  set_tests_properties(fuzz_smoke_${name} PROPERTIES TIMEOUT 60 LABELS "fuzz;no_sanitizer")
endfunction()

kt_fuzz_harness(jobenv core/hostlist.c core/jobenv.c core/error.c core/log.c core/params.c core/util.c
                store/store.c)
kt_fuzz_harness(store_server store/tcp_server.c store/tcp_client.c store/store.c core/error.c core/log.c
                core/params.c core/util.c)
kt_fuzz_harness(algo LIB)
kt_fuzz_harness(run LIB tools/kaitian/run_devices.c tools/kaitian/run_live.c tools/kaitian/run_node.c tools/kaitian/run_output.c
                tools/kaitian/run_proc.c)
kt_fuzz_harness(store_client store/store.c core/error.c core/log.c core/params.c core/util.c)
kt_fuzz_harness(tcp LIB)
kt_fuzz_harness(shm LIB)
kt_fuzz_harness(params core/error.c core/log.c core/util.c)
kt_fuzz_harness(tcp_addr LIB)
kt_fuzz_harness(run_node LIB tools/kaitian/run_node.c tools/kaitian/run_live.c tools/kaitian/run_output.c
                tools/kaitian/run_proc.c tools/kaitian/run_devices.c)
kt_fuzz_harness(run_devices LIB tools/kaitian/run_output.c tools/kaitian/run_proc.c tools/kaitian/run_node.c
                tools/kaitian/run_live.c)
kt_fuzz_harness(membuf LIB)
kt_fuzz_harness(aux LIB)
kt_fuzz_harness(split LIB)
