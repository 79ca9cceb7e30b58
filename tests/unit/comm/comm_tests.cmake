# comm_tests.cmake — the MPI tests of src/comm, and of the MoE token dispatcher over real ep groups:
# test_comm_mpi under mpirun on 2, 3 and 4 ranks.
# Included from the top-level CMakeLists.txt after piper_comm is defined:
#   include(tests/unit/comm/comm_tests.cmake)
add_executable(test_comm_mpi ${CMAKE_CURRENT_LIST_DIR}/mpi/test_comm_mpi.cpp ${CMAKE_CURRENT_LIST_DIR}/mpi/test_dispatch_mpi.cpp)
target_include_directories(test_comm_mpi PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_link_libraries(test_comm_mpi PRIVATE piper_comm piper_ir piper_model GTest::gtest)
if(TARGET unit_comm)
  add_dependencies(unit_comm test_comm_mpi)  # building unit_comm builds the MPI tests too
endif()
# The sanitizer build leaves out the two overlap tests: they assert wall-clock ratios (a transfer finishing
# during compute) that ASan's slower compute and allocation do not keep.
set(comm_mpi_filter "-CommMpi.Nccl*")
if(PIPER_SANITIZE)
  string(APPEND comm_mpi_filter ":CommMpi.ProgressThreadFinishesATransferDuringCompute:CommMpi.OverlapOfAllreduceAndCompute")
endif()
foreach(np 2 3 4)
  add_test(NAME comm_mpi_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root ${MPIEXEC_NUMPROC_FLAG} ${np}
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_comm_mpi> ${MPIEXEC_POSTFLAGS} --gtest_filter=${comm_mpi_filter})
  set_tests_properties(comm_mpi_np${np} PROPERTIES LABELS "comm_mpi" TIMEOUT 120 PROCESSORS ${np})
endforeach()
# NCCL on one GPU per rank: a GPU test of its own, not run (never passed) where the ranks have none.
add_test(NAME comm_mpi_nccl_np2
         COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root ${MPIEXEC_NUMPROC_FLAG} 2
                 ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_comm_mpi> ${MPIEXEC_POSTFLAGS} --gtest_filter=CommMpi.Nccl*)
set_tests_properties(comm_mpi_nccl_np2 PROPERTIES LABELS "comm_mpi" TIMEOUT 120 PROCESSORS 2
                     SKIP_REGULAR_EXPRESSION "\\[..SKIPPED")
