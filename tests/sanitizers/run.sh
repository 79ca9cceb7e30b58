#!/usr/bin/env bash
# run.sh — the tests of the sanitizer build (`make sanitize`; docs/testing.md): AddressSanitizer with leak
# detection and UndefinedBehaviorSanitizer, every report fatal, over
#   1. the unit, kernel, MPI (comm_mpi, checkpoint_mpi) and fuzz-driver tests (ctest labels), and
#   2. a sample of the end-to-end tests (gtest names: the CLI, refusals, training on 1 and 2 ranks,
#      checkpoints, directives), each running the sanitized piper binary, under mpirun where the test does.
# Usage: tests/sanitizers/run.sh BUILD_DIR JOBS "CTEST_SELECTION" "E2E_SELECTION"
# The selections are ctest arguments (-L ... / -R ...); the Makefile's SANITIZE_TESTS and SANITIZE_E2E.
set -euo pipefail
build=${1:?usage: tests/sanitizers/run.sh BUILD_DIR JOBS SELECTION E2E_SELECTION}
jobs=${2:-2}
selection=${3:-}
e2e=${4:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Every process a test starts inherits these, mpirun's ranks included (Open MPI forwards the environment of
# local launches). halt_on_error / abort_on_error: the first report ends the process with a non-zero status;
# fast_unwind_on_malloc=0 records whole allocation stacks, which lsan.supp needs to recognise Open MPI's own.
export ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

cd "$build"
start=$(date +%s)
echo "sanitize: ctest $selection"
eval ctest --output-on-failure -j "$jobs" "$selection"
mid=$(date +%s)
echo "sanitize: ctest $e2e"
eval ctest --output-on-failure -j "$jobs" "$e2e"
end=$(date +%s)
echo "sanitize: no AddressSanitizer, LeakSanitizer or UndefinedBehaviorSanitizer report; unit/kernel/MPI/fuzz" \
     "tests $((mid - start)) s, end-to-end sample $((end - mid)) s"
