# optim.cmake - tests of the CPU optimizer kernels (src/optim): every kernel
# family the CPU has against float32 and float64 references, thread counts,
# concurrent callers and argument errors; then the public entry under
# KAITIAN_OPTIM_IMPL for each family (the whole matrix where the CPU has it,
# the documented error where it does not) and for an unknown name.
kt_add_test_exe(test_optim ${KT_TEST_DIR}/c/test_optim.c)
add_test(NAME optim_kernels COMMAND test_optim)
set_tests_properties(optim_kernels PROPERTIES TIMEOUT 300 LABELS optim)
foreach(impl scalar avx2 avx512 bogus)
  add_test(NAME optim_impl_${impl} COMMAND test_optim --env)
  set_tests_properties(optim_impl_${impl} PROPERTIES TIMEOUT 300 LABELS optim
    ENVIRONMENT "KAITIAN_OPTIM_IMPL=${impl}")
endforeach()
