# slurm_tests.cmake — jobs/slurm/train.sbatch and jobs/slurm/elastic.sbatch on a real one-node Slurm
# (scripts/slurm-local.sh starts munged, slurmctld and slurmd in a temporary folder and stops them at
# the end). Needs root or sudo and Debian's slurm-wlm/munge (scripts/install-deps.sh).
# Included from the top-level CMakeLists.txt:
#   include(${CMAKE_SOURCE_DIR}/tests/slurm/slurm_tests.cmake)
# Run alone with: ctest -L slurm
add_test(NAME slurm_real
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_slurm.sh ${CMAKE_SOURCE_DIR} $<TARGET_FILE:piper>)
set_tests_properties(slurm_real PROPERTIES LABELS slurm TIMEOUT 900 RUN_SERIAL TRUE)
