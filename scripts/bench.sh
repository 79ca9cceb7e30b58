#!/usr/bin/env bash
# bench.sh — the throughput benchmark of `make bench`: piper against PyTorch eager
# (bench/torch_peer.py) on the benchmark model (config/bench.yaml) at 1 and 2 threads, with the
# sgemm peak (BUILD_DIR/bench/gemm_peak) and the model's analytic FLOPs (bench/model_flops.py).
# Prints a markdown table and writes it into docs/benchmarks.md between
# <!-- bench:throughput:begin --> and <!-- bench:throughput:end --> (only that region).
# Builds nothing: run `make build corpus` first (`make bench` does).
#
# Usage: scripts/bench.sh BUILD_DIR [--threads "1 2"] [--config FILE] [--torch-steps N]
#                                   [--out FILE] [--skip N]
# Commands can be swapped for tests (a fake piper only has to write --metrics PATH as JSON lines
# with step and tokens_per_s):
#   PIPER_BIN      default BUILD_DIR/piper
#   GEMM_PEAK_BIN  default BUILD_DIR/bench/gemm_peak   (prints {"peak_gflops": X, ...})
#   TORCH_PEER     default "/usr/bin/python3 bench/torch_peer.py"  (prints {"tokens_per_s": X})
#   PYTHON         default /usr/bin/python3 (Debian's, with torch and yaml)
set -euo pipefail

usage() { sed -n '9,10p' "${BASH_SOURCE[0]}" | sed 's/^# //' >&2; exit 2; }
[[ $# -ge 1 ]] || usage
build=$1; shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
threads="1 2"
config=$root/config/bench.yaml
torch_steps=30
out=$root/docs/benchmarks.md
skip=3  # leading piper steps left out of the median (warm-up)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --torch-steps) torch_steps="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --skip) skip="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "bench.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ -d $build ]] || { echo "bench.sh: build folder '$build' not found (make build)" >&2; exit 1; }
build=$(cd "$build" && pwd)
ncpu=$(getconf _NPROCESSORS_ONLN)  # before OMP_NUM_THREADS is set: nproc would honour it
PYTHON=${PYTHON:-/usr/bin/python3}
PIPER_BIN=${PIPER_BIN:-$build/piper}
GEMM_PEAK_BIN=${GEMM_PEAK_BIN:-$build/bench/gemm_peak}
TORCH_PEER=${TORCH_PEER:-"$PYTHON $root/bench/torch_peer.py"}

for f in "$PIPER_BIN" "$GEMM_PEAK_BIN"; do
  [[ -x $f ]] || { echo "bench.sh: $f not found or not executable (make build)" >&2; exit 1; }
done
[[ -f $config ]] || { echo "bench.sh: config $config not found" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The corpus of `make corpus`, when there, feeds both sides (speed does not depend on it).
corpus=$build/data/corpus.tok
piper_extra=()
torch_extra=()
if [[ -f $corpus ]]; then
  piper_extra=(--set "data.path=$corpus")
  torch_extra=(--tokens "$corpus")
fi

flops=$("$PYTHON" "$root/bench/model_flops.py" "$config")
echo "bench.sh: model FLOPs per token (training) = $flops" >&2

rows=()
for t in $threads; do
  export OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t BLIS_NUM_THREADS=$t MKL_NUM_THREADS=$t

  echo "bench.sh: sgemm peak at $t thread(s)" >&2
  "$GEMM_PEAK_BIN" >"$tmp/peak_$t.json"

  echo "bench.sh: piper at $t thread(s)" >&2
  (cd "$root" && "$PIPER_BIN" train "$config" --metrics "$tmp/piper_$t.jsonl" \
      ${piper_extra[@]+"${piper_extra[@]}"}) >"$tmp/piper_$t.log" 2>&1 || {
    echo "bench.sh: piper failed at $t thread(s):" >&2; tail -n 20 "$tmp/piper_$t.log" >&2; exit 1; }

  echo "bench.sh: torch eager at $t thread(s)" >&2
  # shellcheck disable=SC2086  # TORCH_PEER is a command line
  $TORCH_PEER --bench --threads "$t" --steps "$torch_steps" \
    ${torch_extra[@]+"${torch_extra[@]}"} >"$tmp/torch_$t.json"

  rows+=("$t")
done

table=$("$PYTHON" - "$tmp" "$flops" "$skip" "${rows[@]}" <<'EOF'
import json, statistics, sys
tmp, flops, skip, threads = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]

def last_json(path, key):
    for line in reversed(open(path).read().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            d = json.loads(line)
            if key in d:
                return d
    sys.exit(f"bench.sh: no JSON line with '{key}' in {path}")

print("| threads | piper tokens/s | torch tokens/s | piper / torch | piper GFLOP/s | "
      "peak GFLOP/s | fraction of peak |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for t in threads:
    steps = [json.loads(l) for l in open(f"{tmp}/piper_{t}.jsonl") if l.strip()]
    steps = [s for s in steps if "step" in s and "tokens_per_s" in s]
    if not steps:
        sys.exit(f"bench.sh: piper wrote no step metrics at {t} thread(s)")
    timed = [s["tokens_per_s"] for s in steps if s["step"] >= skip] or \
            [s["tokens_per_s"] for s in steps]
    piper = statistics.median(timed)
    torch_tps = last_json(f"{tmp}/torch_{t}.json", "tokens_per_s")["tokens_per_s"]
    peak = last_json(f"{tmp}/peak_{t}.json", "peak_gflops")["peak_gflops"]
    achieved = piper * flops / 1e9
    print(f"| {t} | {piper:.0f} | {torch_tps:.0f} | {piper / torch_tps:.2f} | {achieved:.1f} | "
          f"{peak:.1f} | {achieved / peak:.1%} |")
EOF
)

cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //' || true)
block="<!-- bench:throughput:begin -->
Measured $(date -u +%Y-%m-%d) on ${cpu:-unknown CPU} ($ncpu CPUs), \`$(basename "$config")\`,
piper median over steps >= $skip, torch median over its steps after 3 warm-up steps;
model FLOPs per token (training) = $flops (\`bench/model_flops.py\`).

$table
<!-- bench:throughput:end -->"

echo "$table"

mkdir -p "$(dirname "$out")"
if [[ ! -f $out ]]; then
  cat >"$out" <<'EOF'
# Benchmarks

Throughput of piper against PyTorch eager (`bench/torch_peer.py`, the same model in plain
torch, float32) on the benchmark model (`config/bench.yaml`), same thread count, same machine,
same run; the peer runs torch's matmuls on Debian's OpenMP OpenBLAS, one thread pool with
torch's own (see its `--system-blas`). `make bench` (`scripts/bench.sh`) regenerates the table
below; the choice of CPU BLAS is measured separately in `docs/blas.md`. On a shared
machine, other jobs running at the same time lower the numbers, 2-thread runs most.
EOF
fi
printf '%s\n' "$block" | "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/doc-region.py" "$out" throughput
echo "bench.sh: wrote $out" >&2
