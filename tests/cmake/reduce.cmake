# reduce.cmake - tests of the reduction and conversion kernels (src/reduce):
# every kernel family the CPU has, then the family choice under
# KAITIAN_REDUCE_IMPL (forced, unavailable, unknown).
kt_add_test_exe(test_reduce ${KT_TEST_DIR}/c/test_reduce.c)
add_test(NAME reduce_kernels COMMAND test_reduce)
set_tests_properties(reduce_kernels PROPERTIES TIMEOUT 300)
foreach(impl scalar avx2 avx512 bogus)
  add_test(NAME reduce_select_${impl} COMMAND test_reduce --select)
  set_tests_properties(reduce_select_${impl} PROPERTIES TIMEOUT 60
    ENVIRONMENT "KAITIAN_REDUCE_IMPL=${impl}")
endforeach()
