# ctest_costs.cmake — the longest tests, each given a COST (its seconds in the sanitizer build, where the
# order matters most) so that a parallel ctest starts them first. Without a cost, a fresh build's ctest
# starts tests in the order of their numbers, and a long one started last runs alone while the other
# cores idle. ctest reads this file after the files of gtest_discover_tests (the top-level CMakeLists.txt
# adds it last), so the discovered tests exist when it sets their properties; a name that no test has
# is ignored, so a renamed test keeps its place here by hand. The fuzz drivers' costs are in
# tests/fuzz/fuzz_tests.cmake, beside their mutation counts.
set(piper_test_costs
    "DeviceTraining.CudaMatchesTheCpuInFp32|225"
    "Training.TinyLossFalls|85"
    "SentencePiece.SameTextAndOptionsGiveTheSameFilesByteForByte|30"
    "DeviceTraining.Bf16KeptActivationsAreExactUnderRecomputationAndASplitBackward|27"
    "Checkpoint.InspectVerifyAndCorruption|22"
    "SentencePiece.RoundTripsTheCorpus|22"
    "SwitchPlan.RunOverIdsWritesEveryElementOnceFromAHolder|20")
foreach(entry ${piper_test_costs})
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 name)
  list(GET parts 1 seconds)
  set_tests_properties(${name} PROPERTIES COST ${seconds})
endforeach()
