# python_torch2.cmake - every test of python.cmake a second time, named
# python2_<name> and labelled torch2, under the current torch 2.x from PyPI,
# so that a change that breaks either torch fails the suite (issue 41). The
# first pass (python_<name>) runs on Debian's python3-torch 1.13.
#
# The torch-2 interpreter is a virtual environment in the build tree
# (build/torch2-venv, ignored by git), made by the test python2_venv the first
# time (tests/python/torch2_venv.py: pip install torch numpy scikit-learn,
# about 5.6 GB and 1.5 min from PyPI; the only network access of the suite)
# and reused after that; every python2_ test requires it (a CTest fixture, so
# `ctest -R python2_ops_np2` makes it too). -DKT_TORCH2_TESTS=OFF leaves the
# pass out (a machine without PyPI). `ctest -LE torch2` runs the first pass only.
option(KT_TORCH2_TESTS "Run the Python tests a second time under torch 2.x from PyPI" ON)
if(KT_SANITIZE_ADDRESS OR KT_SANITIZE_THREAD OR NOT KT_TORCH2_TESTS)
  return()
endif()

set(KT_TORCH2_VENV ${PROJECT_BINARY_DIR}/torch2-venv)
add_test(NAME python2_venv COMMAND /usr/bin/python3 ${KT_TEST_DIR}/python/torch2_venv.py ${KT_TORCH2_VENV})
set_tests_properties(python2_venv PROPERTIES TIMEOUT 1800 FIXTURES_SETUP kt_torch2
                     LABELS "python;torch2;no_sanitizer")

# python.cmake again, with the venv's interpreter; what it sets is put back
# after it, so that area files included later see the first pass's values.
foreach(v KT_PYTHON KT_PY_PREFIX KT_PY_ENV KT_PY_DIR)
  set(kt_saved_${v} "${${v}}")
endforeach()
set(KT_TORCH2_PYTHON ${KT_TORCH2_VENV}/bin/python)
include(${CMAKE_CURRENT_LIST_DIR}/python.cmake)
unset(KT_TORCH2_PYTHON)
foreach(v KT_PYTHON KT_PY_PREFIX KT_PY_ENV KT_PY_DIR)
  set(${v} "${kt_saved_${v}}")
endforeach()

# Whatever python.cmake added as python2_*, now or later, needs the venv.
get_property(kt_torch2_tests DIRECTORY PROPERTY TESTS)
list(FILTER kt_torch2_tests INCLUDE REGEX "^python2_")
list(REMOVE_ITEM kt_torch2_tests python2_venv)
if(kt_torch2_tests)
  set_tests_properties(${kt_torch2_tests} PROPERTIES FIXTURES_REQUIRED kt_torch2)
  set_property(TEST ${kt_torch2_tests} APPEND PROPERTY LABELS torch2)
endif()
