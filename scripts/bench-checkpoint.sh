#!/usr/bin/env bash
# bench-checkpoint.sh BUILD_DIR — checkpoint save and load bandwidth from 4
# ranks (config/bench-checkpoint.yaml, ~690 MB of state), next to the raw
# sequential write and read bandwidth of the same bytes to the same disk,
# measured in the same run with dd. Writes docs/benchmarks.md's region
# `checkpoint`.
set -euo pipefail
build=${1:?usage: scripts/bench-checkpoint.sh BUILD_DIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
piper=$build/piper
np=${NP:-4}
work=$(mktemp -d "${TMPDIR:-/tmp}/piper-bench-ckpt.XXXXXX")
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun --oversubscribe -np "$np")
[[ $(id -u) -eq 0 ]] && mpirun+=(--allow-run-as-root)
common=(train "$root/config/bench-checkpoint.yaml" --quiet --set "data.path=$build/data/corpus.tok"
        --set train.threads=1 --set parallel.dp=2 --set parallel.pp=2 --set parallel.zero=1)

seconds() { python3 -c 'import sys; print(float(sys.argv[1]) / 1000)' "$1"; }
mbps() { python3 -c 'import sys; print(f"{float(sys.argv[1]) / 2**20 / float(sys.argv[2]):.0f}")' "$1" "$2"; }

run_save() {  # $1 = sync|async -> stall ms
  local dir=$work/ckpt-$1
  "${mpirun[@]}" "$piper" "${common[@]}" --set "checkpoint.dir=$dir" --set checkpoint.every=1 \
    --set "checkpoint.async=$([[ $1 == async ]] && echo true || echo false)" >"$work/$1.log" 2>&1
  sed -n 's/.*stalled \([0-9.]*\) ms.*/\1/p' "$work/$1.log" | head -1
}

echo "bench-checkpoint.sh: save, synchronous" >&2
save_ms=$(run_save sync)
file=$(ls "$work"/ckpt-sync/step_*.h5)
bytes=$(stat -c %s "$file")
echo "bench-checkpoint.sh: load" >&2
"${mpirun[@]}" "$piper" "${common[@]}" --set train.steps=2 --set "checkpoint.dir=$work/ckpt-load" \
  --resume "$file" >"$work/load.log" 2>&1
load_ms=$(sed -n 's/.*loaded in \([0-9.]*\) ms.*/\1/p' "$work/load.log" | head -1)
echo "bench-checkpoint.sh: save, asynchronous" >&2
async_ms=$(run_save async)

echo "bench-checkpoint.sh: raw dd of $bytes bytes" >&2
mib=$(( (bytes + 1048575) / 1048576 ))
t0=$(date +%s.%N); dd if=/dev/zero of="$work/raw" bs=1M count="$mib" conv=fsync status=none; t1=$(date +%s.%N)
dd if="$work/raw" of=/dev/null bs=1M status=none; t2=$(date +%s.%N)
raw_w=$(python3 -c "print($t1 - $t0)"); raw_r=$(python3 -c "print($t2 - $t1)")
raw_bytes=$((mib * 1048576))

save_bw=$(mbps "$bytes" "$(seconds "$save_ms")"); load_bw=$(mbps "$bytes" "$(seconds "$load_ms")")
rw_bw=$(mbps "$raw_bytes" "$raw_w"); rr_bw=$(mbps "$raw_bytes" "$raw_r")
pct() { python3 -c "print(f'{100 * float(\"$1\") / float(\"$2\"):.0f}%')"; }
block="<!-- bench:checkpoint:begin -->
## Checkpoint save and load

Measured $(date +%F) by \`scripts/bench-checkpoint.sh\` on $(nproc) CPUs: $np ranks (dp 2 x pp 2, ZeRO-1),
\`config/bench-checkpoint.yaml\`, one checkpoint of $(( bytes / 1048576 )) MiB (parameters and both Adam moments,
fp32), written to the same disk as the raw \`dd\` runs (page cache warm for the reads of both).

| operation | time | MiB/s | raw dd MiB/s | fraction of raw |
|---|---:|---:|---:|---:|
| save (synchronous) | ${save_ms} ms | $save_bw | $rw_bw (write, fsync) | $(pct "$save_bw" "$rw_bw") |
| load (\`--resume\`, checksums verified) | ${load_ms} ms | $load_bw | $rr_bw (read) | $(pct "$load_bw" "$rr_bw") |

Step-loop stall per save: synchronous ${save_ms} ms, asynchronous (\`checkpoint.async: true\`) ${async_ms} ms.
<!-- bench:checkpoint:end -->"
echo "$block"
printf '%s\n' "$block" | /usr/bin/python3 "$root/scripts/doc-region.py" "$root/docs/benchmarks.md" checkpoint
echo "bench-checkpoint.sh: wrote docs/benchmarks.md" >&2
