#!/usr/bin/env bash
# not-run.sh BUILD_DIR — after ctest (make test): how many tests did not run here, and why. A GPU
# test on a machine without a GPU skips itself saying "GPU test not run: <why>"; ctest counts it as
# not run, never as passed (docs/testing.md).
set -euo pipefail
log="${1:?usage: not-run.sh BUILD_DIR}/Testing/Temporary/LastTest.log"
[[ -f "$log" ]] || exit 0
skipped=$(grep -c '^Skip regular expression found in output' "$log" || true)
gpu=$(grep -c '^GPU test not run: ' "$log" || true)
if (( gpu > 0 )); then
  why=$(grep -m1 '^GPU test not run: ' "$log" | sed 's/^GPU test not run: //')
  echo "make test: ${gpu} GPU test(s) not run: ${why}"
else
  echo "make test: every GPU test ran"
fi
if (( skipped > gpu )); then
  echo "make test: $((skipped - gpu)) other test(s) not run (ctest lists them above, each says why in its log)"
fi
