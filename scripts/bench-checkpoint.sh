#!/usr/bin/env bash
# bench-checkpoint.sh BUILD_DIR — checkpoint save and load bandwidth from 4
# ranks (config/bench-checkpoint.yaml, ~690 MB of state), next to the raw
# sequential write and read bandwidth of the same bytes to the same disk,
# measured in the same run with dd. Writes docs/benchmarks.md's region
# `checkpoint`.
#
# Every figure is the median of RUNS (default 3) rounds; each round measures,
# in turn: piper's synchronous save, its load with the file's pages dropped
# from the page cache first (cold: `dd iflag=nocache count=0`, no root needed)
# and again with the file just read (warm); the same for dd: write
# (conv=fsync), read cold, read warm, and also read and write with O_DIRECT
# (the raw figure each operation is held to is the faster way dd moves the
# bytes); piper's asynchronous save.
#
# Every measurement starts SETTLE seconds (default 4) after the last file was
# deleted or dropped from the cache: on a VM that hands freed memory back to
# its host (virtio-balloon free page reporting, after ~2 s), filling the page
# cache with memory freed a moment ago is ~3x faster than with memory freed
# earlier. A piper run can never start within that moment (the processes start
# first), so dd does not either.
set -euo pipefail
build=${1:?usage: scripts/bench-checkpoint.sh BUILD_DIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
piper=$build/piper
np=${NP:-4}
runs=${RUNS:-3}
work=$(mktemp -d "${TMPDIR:-/tmp}/piper-bench-ckpt.XXXXXX")
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun --oversubscribe -np "$np")
[[ $(id -u) -eq 0 ]] && mpirun+=(--allow-run-as-root)
common=(train "$root/config/bench-checkpoint.yaml" --quiet --set "data.path=$build/data/corpus.tok"
        --set train.threads=1 --set parallel.dp=2 --set parallel.pp=2 --set parallel.zero=1)

now() { date +%s.%N; }
ms() { python3 -c 'import sys; print(f"{(float(sys.argv[2]) - float(sys.argv[1])) * 1000:.1f}")' "$1" "$2"; }
drop_cache() { dd if="$1" iflag=nocache count=0 status=none; }  # the file's clean pages leave the page cache
settle() { sleep "${SETTLE:-4}"; }
median() { python3 -c 'import statistics, sys; print(f"{statistics.median(map(float, sys.argv[1:])):.1f}")' "$@"; }
mbps() { python3 -c 'import sys; print(f"{float(sys.argv[1]) / 2**20 / (float(sys.argv[2]) / 1000):.0f}")' "$1" "$2"; }
pct() { python3 -c 'import sys; print(f"{100 * float(sys.argv[1]) / float(sys.argv[2]):.0f}%")' "$1" "$2"; }

piper_save() {  # $1 = sync|async, $2 = dir -> the step-loop stall in ms
  "${mpirun[@]}" "$piper" "${common[@]}" --set "checkpoint.dir=$2" --set checkpoint.every=1 \
    --set "checkpoint.async=$([[ $1 == async ]] && echo true || echo false)" >"$work/save.log" 2>&1
  sed -n 's/.*stalled \([0-9.]*\) ms.*/\1/p' "$work/save.log" | head -1
}
piper_load() {  # $1 = checkpoint file -> the load time in ms
  "${mpirun[@]}" "$piper" "${common[@]}" --set train.steps=2 --set "checkpoint.dir=$work/ckpt-load" \
    --resume "$1" >"$work/load.log" 2>&1
  rm -rf "$work/ckpt-load"
  sed -n 's/.*loaded in \([0-9.]*\) ms.*/\1/p' "$work/load.log" | head -1
}
dd_write() {  # $1 = MiB -> ms
  local t0 t1; t0=$(now)
  dd if=/dev/zero of="$work/raw" bs=1M count="$1" conv=fsync status=none
  t1=$(now); ms "$t0" "$t1"
}
dd_write_direct() {  # $1 = MiB -> ms; O_DIRECT, no page cache
  local t0 t1; t0=$(now)
  dd if=/dev/zero of="$work/raw" bs=1M count="$1" oflag=direct conv=fsync status=none
  t1=$(now); ms "$t0" "$t1"
}
dd_read_direct() {
  local t0 t1; t0=$(now)
  dd if="$work/raw" of=/dev/null bs=1M iflag=direct status=none
  t1=$(now); ms "$t0" "$t1"
}
dd_read() {
  local t0 t1; t0=$(now)
  dd if="$work/raw" of=/dev/null bs=1M status=none
  t1=$(now); ms "$t0" "$t1"
}

save_ms=() async_ms=() cold_ms=() warm_ms=() dd_w=() dd_wd=() dd_rc=() dd_rd=() dd_rw=()
bytes=0 mib=0
for ((i = 1; i <= runs; ++i)); do
  echo "bench-checkpoint.sh: round $i of $runs" >&2
  settle
  save_ms+=("$(piper_save sync "$work/ckpt-$i")")
  file=$(ls "$work/ckpt-$i"/step_*.h5)
  bytes=$(stat -c %s "$file")
  mib=$(((bytes + 1048575) / 1048576))
  drop_cache "$file"
  settle
  cold_ms+=("$(piper_load "$file")")
  dd if="$file" of=/dev/null bs=1M status=none
  warm_ms+=("$(piper_load "$file")")
  rm -rf "$work/ckpt-$i"
  settle
  dd_w+=("$(dd_write "$mib")")
  drop_cache "$work/raw"
  settle
  dd_rc+=("$(dd_read)")
  dd_rw+=("$(dd_read)")
  settle
  dd_rd+=("$(dd_read_direct)")
  rm -f "$work/raw"
  settle
  dd_wd+=("$(dd_write_direct "$mib")")
  rm -f "$work/raw"
  settle
  async_ms+=("$(piper_save async "$work/ckpt-async")")
  rm -rf "$work/ckpt-async"
  echo "  save ${save_ms[-1]} ms, dd write ${dd_w[-1]} ms, direct ${dd_wd[-1]} ms; dd read cold ${dd_rc[-1]} ms," \
       "direct ${dd_rd[-1]} ms, warm ${dd_rw[-1]} ms;" \
       "load cold ${cold_ms[-1]} ms, warm ${warm_ms[-1]} ms; async save stall ${async_ms[-1]} ms" >&2
done

raw_bytes=$((mib * 1048576))
save=$(median "${save_ms[@]}") cold=$(median "${cold_ms[@]}") warm=$(median "${warm_ms[@]}")
async=$(median "${async_ms[@]}")
w=$(median "${dd_w[@]}") rc=$(median "${dd_rc[@]}") rw=$(median "${dd_rw[@]}")
wd=$(median "${dd_wd[@]}") rd=$(median "${dd_rd[@]}")
save_bw=$(mbps "$bytes" "$save") cold_bw=$(mbps "$bytes" "$cold") warm_bw=$(mbps "$bytes" "$warm")
w_bw=$(mbps "$raw_bytes" "$w") rc_bw=$(mbps "$raw_bytes" "$rc") rw_bw=$(mbps "$raw_bytes" "$rw")
wd_bw=$(mbps "$raw_bytes" "$wd") rd_bw=$(mbps "$raw_bytes" "$rd")
# The raw figure an operation is held to: the faster way dd moves the same bytes to or from the disk.
best() { python3 -c 'import sys; print(max(map(float, sys.argv[1:])))' "$@"; }
w_best=$(best "$w_bw" "$wd_bw") r_best=$(best "$rc_bw" "$rd_bw")
block="<!-- bench:checkpoint:begin -->
## Checkpoint save and load

Measured $(date +%F) by \`scripts/bench-checkpoint.sh\` on $(nproc) CPUs: $np ranks (dp 2 x pp 2, ZeRO-1),
\`config/bench-checkpoint.yaml\`, one checkpoint of $((bytes / 1048576)) MiB (parameters and both Adam moments,
fp32), written to the same disk as the raw \`dd\` runs of the same size. Each figure is the median of $runs
rounds, each round measuring both sides in turn, each measurement ${SETTLE:-4} s after the last file was deleted
(see the script); cold: the file's pages dropped from the page cache before the read
(\`dd iflag=nocache count=0\`), warm: the file just read. Raw writes and cold reads are measured both
through the page cache and with \`O_DIRECT\` (\`oflag=direct\`, \`iflag=direct\`); the fraction is of the
faster of the two.

| operation | time | MiB/s | raw dd MiB/s | fraction of raw |
|---|---:|---:|---:|---:|
| save (synchronous) | ${save} ms | $save_bw | $w_bw (write, fsync), $wd_bw (O_DIRECT, fsync) | $(pct "$save_bw" "$w_best") |
| load (\`--resume\`, checksums verified), cold cache | ${cold} ms | $cold_bw | $rc_bw (read, cold), $rd_bw (O_DIRECT) | $(pct "$cold_bw" "$r_best") |
| load (\`--resume\`, checksums verified), warm cache | ${warm} ms | $warm_bw | $rw_bw (read, warm) | $(pct "$warm_bw" "$rw_bw") |

Step-loop stall per save: synchronous ${save} ms, asynchronous (\`checkpoint.async: true\`) ${async} ms.
<!-- bench:checkpoint:end -->"
echo "$block"
printf '%s\n' "$block" | /usr/bin/python3 "$root/scripts/doc-region.py" "$root/docs/benchmarks.md" checkpoint
echo "bench-checkpoint.sh: wrote docs/benchmarks.md" >&2
