#!/usr/bin/env bash
# run-libfuzzer.sh — runs every libFuzzer harness of a PIPER_LIBFUZZER build (`make fuzz`; docs/testing.md).
# Usage: tests/fuzz/run-libfuzzer.sh BUILD_DIR [SECONDS_PER_HARNESS] [READER...]
# Each harness starts from its checked-in seeds (tests/fuzz/corpus/<reader>/, read only) and keeps what it
# finds in BUILD_DIR/fuzz/corpus/<reader>/ (the next run starts from there too). A crash, a sanitizer report,
# a leak, a timeout (20 s per input) or an input over 2 GiB of memory is written to
# BUILD_DIR/fuzz/crashes/<reader>-* and fails the run; every harness runs even when one fails. The whole
# output of a harness is in BUILD_DIR/fuzz/<reader>.log.
set -uo pipefail
build=${1:?usage: tests/fuzz/run-libfuzzer.sh BUILD_DIR [SECONDS] [READER...]}
seconds=${2:-60}
shift 2 2>/dev/null || shift $#
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readers=("$@")
[[ ${#readers[@]} -gt 0 ]] || readers=(config directives token_file checkpoint cost hardware)

# libFuzzer checks every input for leaks itself (more mallocs than frees in one run); the check at exit would
# only see what MPI_Init (checkpoint harness) never frees, so it is off.
export ASAN_OPTIONS="detect_leaks=1:leak_check_at_exit=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
# Suppressions: Open MPI's own leaks and HDF5's on damaged files, each entry explained in the file.
export LSAN_OPTIONS="suppressions=$root/../sanitizers/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# No hwloc OpenCL plugin under MPI_Init: LeakSanitizer's tracer faults on the thread-local storage it brings
# (tests/sanitizers/run.sh says why).
export HWLOC_COMPONENTS="-opencl${HWLOC_COMPONENTS:+,$HWLOC_COMPONENTS}"

failed=()
for r in "${readers[@]}"; do
  exe=$build/fuzz/fuzz_$r
  [[ -x $exe ]] || { echo "run-libfuzzer: $exe not built (cmake --build $build --target fuzz_tests)" >&2; exit 2; }
  corpus=$build/fuzz/corpus/$r
  crashes=$build/fuzz/crashes
  mkdir -p "$corpus" "$crashes"
  dict=()
  [[ -f $root/dict/$r.dict ]] && dict=(-dict="$root/dict/$r.dict")
  # The suppressions match Open MPI's and HDF5's frames only on whole allocation stacks: the checkpoint
  # harness (MPI, HDF5) records them (slower mallocs); the others need not.
  unwind=()
  [[ $r == checkpoint ]] && unwind=(env "ASAN_OPTIONS=$ASAN_OPTIONS:fast_unwind_on_malloc=0")
  echo "=== fuzz_$r: $seconds s"
  start=$(date +%s)
  "${unwind[@]}" "$exe" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
    -artifact_prefix="$crashes/$r-" "${dict[@]}" "$corpus" "$root/corpus/$r" >"$build/fuzz/$r.log" 2>&1
  rc=$?
  tail -n 60 "$build/fuzz/$r.log"
  echo "=== fuzz_$r: exit $rc after $(( $(date +%s) - start )) s, corpus $(ls "$corpus" | wc -l) inputs"
  [[ $rc -eq 0 ]] || failed+=("$r")
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "run-libfuzzer: FAILED: ${failed[*]} (inputs in $build/fuzz/crashes/; reproduce: $build/fuzz/fuzz_<reader> FILE)" >&2
  exit 1
fi
echo "run-libfuzzer: every harness ran $seconds s without a failure"
