# layers.cmake - the C core's layering (docs/layers.md): no include or call
# runs up the layer order, beyond the known edges still to remove
# (tests/layers/upward_edges.txt). Reads the library's objects with nm and
# each source's includes with the compiler's -MM.
find_program(KT_LAYERS_PYTHON NAMES python3 REQUIRED)
add_test(NAME layers
  COMMAND ${KT_LAYERS_PYTHON} ${KT_TEST_DIR}/layers/check_layers.py --root ${PROJECT_SOURCE_DIR}
          --cc ${CMAKE_C_COMPILER} --allow ${KT_TEST_DIR}/layers/upward_edges.txt
          $<TARGET_OBJECTS:kaitian_obj>)
set_tests_properties(layers PROPERTIES TIMEOUT 120 LABELS "layers")
