#!/usr/bin/env bash
# run.sh — the tests of the sanitizer build (`make sanitize`; docs/testing.md): AddressSanitizer with leak
# detection and UndefinedBehaviorSanitizer, every report fatal, in three CTest selections:
#   1. SELECTION      tests whose processes never start MPI: kernel and unit tests, the fuzz drivers;
#   2. MPI_SELECTION  tests whose processes call MPI_Init: unit_checkpoint, unit_runtime, the MPI tests of src/comm and
#                     src/checkpoint (mpirun, 2 to 4 ranks), the checkpoint fuzz driver;
#   3. E2E_SELECTION  a sample of the end-to-end tests (gtest names), each running the sanitized piper
#                     binary, which always starts MPI (under mpirun where the test does).
# Usage: tests/sanitizers/run.sh BUILD_DIR JOBS SELECTION MPI_SELECTION E2E_SELECTION
# (ctest arguments; the Makefile's SANITIZE_TESTS, SANITIZE_MPI_TESTS and SANITIZE_E2E).
set -euo pipefail
build=${1:?usage: tests/sanitizers/run.sh BUILD_DIR JOBS SELECTION MPI_SELECTION E2E_SELECTION}
jobs=${2:-2}
selection=${3:-}
mpi_selection=${4:-}
e2e=${5:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Every process a test starts inherits these, mpirun's ranks included (Open MPI forwards the environment of
# local launches). halt_on_error / abort_on_error: the first report ends the process with a non-zero status.
base="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# hwloc (under Open MPI's MPI_Init) loads no OpenCL plugin: through it libOpenCL's thread-local storage
# reaches the main thread's dynamic TLS, and LeakSanitizer's tracer (GCC 12) faults on that range at exit
# ("Tracer caught signal 11", the checkpoint fuzz driver on its seed alone). No test asks hwloc for OpenCL
# devices; docs/testing.md, "Suppressions".
export HWLOC_COMPONENTS="-opencl${HWLOC_COMPONENTS:+,$HWLOC_COMPONENTS}"

cd "$build"
t0=$(date +%s)
echo "sanitize: ctest $selection"
ASAN_OPTIONS="$base${ASAN_OPTIONS:+:$ASAN_OPTIONS}" eval ctest --output-on-failure -j "$jobs" "$selection"
t1=$(date +%s)
# fast_unwind_on_malloc=0: whole allocation stacks, which lsan.supp needs to recognise Open MPI's and
# HDF5's own leaks (both are built without frame pointers); slower, so only where MPI runs.
# (The sanitizer build's comm_mpi tests leave out the two that assert wall-clock ratios: comm_tests.cmake.)
echo "sanitize: ctest $mpi_selection"
ASAN_OPTIONS="$base:fast_unwind_on_malloc=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" eval ctest --output-on-failure -j "$jobs" "$mpi_selection"
t2=$(date +%s)
echo "sanitize: ctest $e2e"
ASAN_OPTIONS="$base:fast_unwind_on_malloc=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" eval ctest --output-on-failure -j "$jobs" "$e2e"
t3=$(date +%s)
echo "sanitize: no AddressSanitizer, LeakSanitizer or UndefinedBehaviorSanitizer report: unit/kernel/fuzz" \
     "$((t1 - t0)) s, MPI $((t2 - t1)) s, end-to-end sample $((t3 - t2)) s"
