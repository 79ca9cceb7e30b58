# checkpoint_tests.cmake — the MPI tests of src/checkpoint: test_checkpoint_mpi under mpirun on 2 and 4 ranks.
# Included from the top-level CMakeLists.txt after unit_checkpoint is defined:
#   include(tests/unit/checkpoint/checkpoint_tests.cmake)
add_executable(test_checkpoint_mpi ${CMAKE_CURRENT_LIST_DIR}/mpi/test_checkpoint_mpi.cpp)
target_include_directories(test_checkpoint_mpi PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_link_libraries(test_checkpoint_mpi PRIVATE piper_checkpoint GTest::gtest)
target_compile_definitions(test_checkpoint_mpi PRIVATE PIPER_BINARY_DIR="${CMAKE_BINARY_DIR}")
if(TARGET unit_checkpoint)
  add_dependencies(unit_checkpoint test_checkpoint_mpi)  # building unit_checkpoint builds the MPI tests too
endif()
foreach(np 2 4)
  add_test(NAME checkpoint_mpi_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root ${MPIEXEC_NUMPROC_FLAG} ${np}
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_checkpoint_mpi> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(checkpoint_mpi_np${np} PROPERTIES LABELS "checkpoint_mpi" TIMEOUT 120 PROCESSORS ${np})
endforeach()
