#!/usr/bin/env bash
# run.sh — builds bench/blas/blas_compare.cpp once per Debian CPU BLAS candidate (OpenBLAS
# openmp/pthread, BLIS openmp/pthread, oneDNN), runs each at 1 and 2 threads, and prints a
# markdown table of GFLOP/s per GEMM shape (the source of docs/blas.md).
# Usage: bench/blas/run.sh [--threads "1 2"] [--reps N] [--rounds R] [--keep DIR]
# Every (library, threads) run is repeated R times (default 3), interleaved, and each case
# reports the best of the R per-run medians: on a shared or virtual machine a neighbour can
# only slow a run down, so the best round is the closest to the library's own speed. The
# summary also gives the worst round's total, which shows how steady a library is.
# Before each run the script waits (up to --max-wait seconds, default 120) for the CPUs to be
# idle (< 10% busy over one second), so other jobs on the machine disturb the numbers less.
# Each binary is linked straight to the variant's .so with an rpath to its folder, so the
# loader does not swap in whatever /etc/alternatives points libopenblas.so.0 / libblis.so.4 at.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
threads="1 2"
reps=25
rounds=3
max_wait=120
keep=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --max-wait) max_wait="$2"; shift 2 ;;
    --keep) keep="$2"; shift 2 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [[ -n "$keep" ]]; then
  work="$keep"; mkdir -p "$work"
else
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fi

lib=/usr/lib/x86_64-linux-gnu
# name | define | library file | Debian package that ships it
candidates=(
  "openblas-openmp|USE_CBLAS|$lib/openblas-openmp/libopenblas.so|libopenblas-openmp-dev"
  "openblas-pthread|USE_CBLAS|$lib/openblas-pthread/libopenblas.so|libopenblas-pthread-dev"
  "blis-openmp|USE_CBLAS|$lib/blis-openmp/libblis.so|libblis-openmp-dev"
  "blis-pthread|USE_CBLAS|$lib/blis-pthread/libblis.so|libblis-pthread-dev"
  "onednn|USE_DNNL|$lib/libdnnl.so|libdnnl-dev"
)

# Busy fraction of all CPUs over one second, in percent (from /proc/stat).
cpu_busy() {
  local a b
  read -r -a a < <(head -n1 /proc/stat)
  sleep 1
  read -r -a b < <(head -n1 /proc/stat)
  local total=0 idle i
  for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
  idle=$((b[4] - a[4] + b[5] - a[5]))
  echo $(( total > 0 ? 100 * (total - idle) / total : 0 ))
}
wait_quiet() {
  local waited=0 busy
  while busy=$(cpu_busy); [[ $busy -ge 10 && $waited -lt $max_wait ]]; do
    waited=$((waited + 1))
  done
  [[ $busy -lt 10 ]] || echo "run.sh: CPUs still ${busy}% busy after ${max_wait}s; measuring anyway" >&2
}

cxx=${CXX:-g++}
built=()
for c in "${candidates[@]}"; do
  IFS='|' read -r name def so pkg <<<"$c"
  if [[ ! -e "$so" ]]; then
    echo "run.sh: skipping $name ($so missing; apt-get install $pkg)" >&2
    continue
  fi
  "$cxx" -std=c++20 -O2 -D"$def" "$here/blas_compare.cpp" -o "$work/bench_$name" \
    "$so" -Wl,-rpath,"$(dirname "$so")" -Wl,--no-as-needed
  built+=("$name")
done
[[ ${#built[@]} -gt 0 ]] || { echo "run.sh: no BLAS candidate found" >&2; exit 1; }

for r in $(seq 1 "$rounds"); do
  for name in "${built[@]}"; do
    for t in $threads; do
      wait_quiet
      echo "run.sh: round $r: $name at $t thread(s)" >&2
      OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t BLIS_NUM_THREADS=$t \
        "$work/bench_$name" --reps "$reps" >"$work/out_${name}_${t}_$r.tsv"
    done
  done
done

# Markdown: one table per thread count, rows = cases, columns = libraries, best in bold;
# then a summary: geometric mean of GFLOP/s and summed time over the model-shape cases
# (every case except the square peak).
/usr/bin/python3 - "$work" "$threads" "$rounds" "${built[@]}" <<'EOF'
import math, sys
work, threads, rounds, libs = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4:]
def load(path):
    rows, meta = [], []
    for line in open(path):
        if line.startswith("#"):
            meta.append(line[1:].strip()); continue
        f = line.rstrip("\n").split("\t")
        rows.append((f[0], float(f[5]), float(f[6])))
    return rows, meta
def best_of_rounds(lib, t):
    runs = [load(f"{work}/out_{lib}_{t}_{r}.tsv")[0] for r in range(1, rounds + 1)]
    worst_total = max(sum(x[1] for x in run if not x[0].startswith("peak")) for run in runs)
    best = [max((run[i] for run in runs), key=lambda x: x[2]) for i in range(len(runs[0]))]
    return best, worst_total
summary = {}
for t in threads:
    both = {lib: best_of_rounds(lib, t) for lib in libs}
    data = {lib: both[lib][0] for lib in libs}
    cases = [r[0] for r in data[libs[0]]]
    print(f"\n**{t} thread{'s' if t != '1' else ''}** — GFLOP/s (median of the timed repetitions, best of {rounds} rounds; fastest library in bold)\n")
    print("| case | " + " | ".join(libs) + " |")
    print("|---|" + "---:|" * len(libs))
    for i, c in enumerate(cases):
        vals = [data[lib][i][2] for lib in libs]
        best = max(vals)
        cells = [f"**{v:.1f}**" if v == best else f"{v:.1f}" for v in vals]
        print(f"| {c} | " + " | ".join(cells) + " |")
    for lib in libs:
        model = [r for r in data[lib] if not r[0].startswith("peak")]
        gm = math.exp(sum(math.log(r[2]) for r in model) / len(model))
        tot = sum(r[1] for r in model)
        peak = [r[2] for r in data[lib] if r[0].startswith("peak")][0]
        summary[(lib, t)] = (gm, tot, peak, both[lib][1])
print("\n**Summary** — model shapes (all cases except the square peak): geometric-mean GFLOP/s, "
      "and the summed median time of one pass over every case (ms, lower is better)\n")
print("| library | " + " | ".join(f"geomean {t}t | total ms {t}t | worst-round ms {t}t | peak {t}t" for t in threads) + " |")
print("|---|" + "---:|" * (4 * len(threads)))
for lib in libs:
    cells = []
    for t in threads:
        gm, tot, peak, worst = summary[(lib, t)]
        cells += [f"{gm:.1f}", f"{tot:.2f}", f"{worst:.2f}", f"{peak:.1f}"]
    print(f"| {lib} | " + " | ".join(cells) + " |")
for t in threads:
    best = min(libs, key=lambda l: summary[(l, t)][1])
    print(f"\nFastest overall at {t} thread(s) (least total time on the model shapes): **{best}**")
EOF
for name in "${built[@]}"; do
  f=$(ls "$work"/out_"${name}"_*_1.tsv | head -n1)
  echo "" ; echo "<!-- $name: $(grep '^# library' "$f" | sed 's/^# library: //' | tr -s ' ') -->"
done
