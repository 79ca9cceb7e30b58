# fuzz_tests.cmake — the fuzz harnesses of tests/fuzz (docs/testing.md). Included from the top-level
# CMakeLists.txt after the module libraries are defined:
#   include(${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_tests.cmake)
#
# fuzz_<reader> = tests/fuzz/fuzz_<reader>.cpp (LLVMFuzzerTestOneInput) plus
#   - tests/fuzz/driver.cpp in a normal build: ctest `fuzz_<reader>` (label fuzz) runs the seed corpus
#     tests/fuzz/corpus/<reader>/ and a fixed number of deterministic mutations;
#   - clang's libFuzzer with PIPER_LIBFUZZER=ON (`make fuzz`, tests/fuzz/run-libfuzzer.sh).
# `cmake --build B --target fuzz_tests` builds every harness.
set(PIPER_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})
# reader, the libraries it links, the mutations ctest runs after the seeds (sized so that all fuzz
# tests together take well under 60 s on one core of the CI machine; docs/testing.md has the times),
# and its seconds in the sanitizer build: its ctest COST, so that the longest start first
# (tests/ctest_costs.cmake has the other tests' costs).
set(PIPER_FUZZ_READERS
    "config|piper_config|40000|55"
    "directives|piper_ir|20000|16"
    "token_file|piper_data|60000|10"
    "checkpoint|piper_checkpoint|15000|41"
    "cost|piper_sim|150000|102"
    "hardware|piper_sim|150000|65")

add_custom_target(fuzz_tests)
foreach(entry ${PIPER_FUZZ_READERS})
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 reader)
  list(GET parts 1 lib)
  list(GET parts 2 mutations)
  list(GET parts 3 seconds)
  set(exe fuzz_${reader})
  if(PIPER_LIBFUZZER)
    add_executable(${exe} ${PIPER_FUZZ_DIR}/fuzz_${reader}.cpp)
    target_link_options(${exe} PRIVATE -fsanitize=fuzzer)
  else()
    add_executable(${exe} ${PIPER_FUZZ_DIR}/fuzz_${reader}.cpp ${PIPER_FUZZ_DIR}/driver.cpp)
  endif()
  target_include_directories(${exe} PRIVATE ${PIPER_FUZZ_DIR})
  target_link_libraries(${exe} PRIVATE ${lib})
  set_target_properties(${exe} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
  add_dependencies(fuzz_tests ${exe})
  if(NOT PIPER_LIBFUZZER)
    set(dict_args "")
    if(EXISTS ${PIPER_FUZZ_DIR}/dict/${reader}.dict)
      set(dict_args --dict ${PIPER_FUZZ_DIR}/dict/${reader}.dict)
    endif()
    add_test(NAME ${exe}
             COMMAND ${exe} --mutations ${mutations} --seed 1 --crash-dir ${CMAKE_BINARY_DIR}/fuzz/crashes
                     ${dict_args} ${PIPER_FUZZ_DIR}/corpus/${reader})
    set(labels fuzz)
    if(reader STREQUAL "checkpoint")
      list(APPEND labels fuzz_mpi)  # initialises MPI: the sanitizer build runs it with the MPI tests
    endif()
    set_tests_properties(${exe} PROPERTIES LABELS "${labels}" TIMEOUT 300 COST ${seconds})
  endif()
endforeach()

# Writes a small real checkpoint: the seed tests/fuzz/corpus/checkpoint/tiny.h5 (regenerate after a format change).
add_executable(fuzz_checkpoint_seed ${PIPER_FUZZ_DIR}/make_checkpoint_seed.cpp)
target_link_libraries(fuzz_checkpoint_seed PRIVATE piper_checkpoint)
set_target_properties(fuzz_checkpoint_seed PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
add_dependencies(fuzz_tests fuzz_checkpoint_seed)
