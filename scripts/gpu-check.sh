#!/usr/bin/env bash
# gpu-check.sh — the device check of the CUDA backend (docs/backend.md), in two halves:
#
#   scripts/gpu-check.sh prepare   here, on the development machine: builds build-gpu/ (the CUDA
#                                  backend for sm_90, OpenBLAS for the CPU reference) and packs the
#                                  op runner, the NCCL tests, the device training test and the
#                                  throughput benchmark with every shared library
#                                  they load, the loader and libc included, into gpu-check/ (ignored
#                                  by git);
#   scripts/gpu-check.sh run       on a machine with one NVIDIA GPU and its driver, nothing else
#                                  installed: runs the op runner on the GPU against the double
#                                  reference, runs the NCCL communicator's one-GPU tests
#                                  (nccl.txt), and trains a hybrid (Mamba-2, MoE, attention, MLP) for
#                                  6 steps on the GPU in fp32 against the CPU's losses (one rank, no
#                                  MPI started), and writes the results to gpu-check/results/
#                                  (op-runner.txt, the per-op lines; training.txt, the per-step
#                                  losses), then measures the training throughput of
#                                  config/nemotron-h-1b.yaml (1.06B parameters, seq 4096) on the GPU
#                                  with bf16 products (throughput.json), with MFU against the GPU's
#                                  bf16 dense peak, and the time of its blocks' heavy ops at one
#                                  microbatch's shapes in bf16 (bench/op_bench: ops.json, and in the
#                                  summary each op's TFLOP/s); summary.txt has one line per check.
#
# PEAK_TFLOPS: the dense bf16 peak MFU is quoted against, default 989.4 (H100/H200 SXM, the
# hardware table's h200-sxm entry, src/sim/hardware.cpp).
#
# The carried libraries run under the carried loader, so the check does not depend on the
# machine's distribution; the CUDA runtime, cuBLAS, NCCL and the driver come from the machine
# (CUDA_HOME, default /usr/local/cuda, whose lib64 holds NCCL on the CUDA 13 toolkit, and the driver's
# libcuda.so.1).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out="$root/gpu-check"
mode="${1:-}"

prepare() {
  local build="$root/build-gpu" log="$root/build-gpu/prepare.log"
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPIPER_CUDA=ON -DPIPER_BLAS=openblas \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DPIPER_WERROR=ON ${CMAKE_FLAGS:-} > "$log" 2>&1 \
    || { tail -30 "$log"; exit 1; }
  cmake --build "$build" -j "$(nproc)" --target unit_backend unit_comm unit_runtime device_train op_bench >> "$log" 2>&1 || { tail -30 "$log"; exit 1; }
  # The executables and every library they load except the CUDA ones the GPU machine has (runtime,
  # cuBLAS, driver), xz-packed into one file: unpacked they pass the 64 MiB a working tree carries.
  local stage="$build/gpu-check-stage"
  rm -rf "$stage" "$out" && mkdir -p "$stage/lib" "$out"
  local programs=("$build/unit_backend" "$build/unit_comm" "$build/unit_runtime" "$build/bench/device_train"
                  "$build/bench/op_bench")
  cp "${programs[@]}" "$stage/"
  ldd "${programs[@]}" | awk '/=>/ {print $3} /ld-linux/ {print $1}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libcuda.so*|libcudart.so*|libcublas*.so*|libnccl.so*) ;;
      *) cp -L "$lib" "$stage/lib/" ;;
    esac
  done
  ln -sf "$(basename "$(ls "$stage"/lib/ld-linux-x86-64.so.* | head -1)")" "$stage/lib/loader"
  tar -cJf "$out/pack.tar.xz" -C "$stage" .
  echo "gpu-check: packed $(du -sh "$stage" | cut -f1) into $out/pack.tar.xz ($(du -sh "$out/pack.tar.xz" | cut -f1); carry gpu-check with the working tree; run: scripts/gpu-check.sh run)"
}

run() {
  [[ -f "$out/pack.tar.xz" ]] || { echo "gpu-check: no $out/pack.tar.xz; run 'scripts/gpu-check.sh prepare' on the build machine first" >&2; exit 2; }
  local cuda="${CUDA_HOME:-/usr/local/cuda}" results="$out/results" bin="${TMPDIR:-/tmp}/piper-gpu-check"
  rm -rf "$bin" && mkdir -p "$bin" "$results"
  tar -xJf "$out/pack.tar.xz" -C "$bin"
  local driver
  driver=$(dirname "$(ldconfig -p 2>/dev/null | awk '/libcuda.so.1 / {print $NF; exit}')" 2>/dev/null || true)
  local path="$bin/lib:$cuda/lib64:$cuda/targets/x86_64-linux/lib${driver:+:$driver}"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$results/gpu.txt" || true
  local started=$SECONDS rc=0 train_rc=0 nccl_rc=0
  "$bin/lib/loader" --library-path "$path" "$bin/unit_backend" --gtest_filter='Backends/OnBackend.*:BackendOps.*' \
    > "$results/op-runner.txt" 2>&1 || rc=$?
  local ops_s=$((SECONDS - started))
  "$bin/lib/loader" --library-path "$path" "$bin/unit_comm" --gtest_filter='NcclComm.*' \
    > "$results/nccl.txt" 2>&1 || nccl_rc=$?
  started=$SECONDS
  "$bin/lib/loader" --library-path "$path" "$bin/unit_runtime" --gtest_filter='DeviceTraining.*' \
    > "$results/training.txt" 2>&1 || train_rc=$?
  local bench_rc=0 flops
  started=$SECONDS
  if [[ $train_rc -eq 0 ]] && grep -q 'cuda fp32 vs cpu' "$results/training.txt"; then
    "$bin/lib/loader" --library-path "$path" "$bin/device_train" "$root/config/nemotron-h-1b.yaml" \
      --set train.device=cuda --set train.precision=bf16 --warmup 2 --steps 5 > "$results/throughput.json" 2> "$results/throughput.err" \
      || bench_rc=$?
  else
    echo '{"skipped":"no GPU, or the fp32 training check failed"}' > "$results/throughput.json"
  fi
  flops=$(python3 "$root/bench/model_flops.py" "$root/config/nemotron-h-1b.yaml")
  local bench_s=$((SECONDS - started)) ops_rc=0
  if [[ $bench_rc -eq 0 ]] && grep -q tokens_per_s "$results/throughput.json"; then
    "$bin/lib/loader" --library-path "$path" "$bin/op_bench" "$root/config/nemotron-h-1b.yaml" \
      --set train.device=cuda --set train.precision=bf16 > "$results/ops.json" 2> "$results/ops.err" || ops_rc=$?
  else
    echo '{"skipped":"no throughput run"}' > "$results/ops.json"
  fi
  {
    echo "gpu: $(cat "$results/gpu.txt" 2>/dev/null || echo unknown)"
    echo "op runner: exit $rc in $ops_s s; $(grep -c '^\[ ok   \] cuda' "$results/op-runner.txt" || true) cuda outputs within tolerance, $(grep -c '^\[ FAIL \] cuda' "$results/op-runner.txt" || true) above"
    grep -m1 'GPU test not run' "$results/op-runner.txt" || true
    grep '^\[ FAIL \] cuda' "$results/op-runner.txt" || true
    echo "nccl communicator (one GPU): exit $nccl_rc; $(grep -c '^\[       OK \] NcclComm' "$results/nccl.txt" || true) passed, $(grep -c '^\[  FAILED  \] NcclComm.* ms)$' "$results/nccl.txt" || true) failed, $(grep -c '^\[  SKIPPED \] NcclComm.* ms)$' "$results/nccl.txt" || true) not run"
    echo "training against the cpu: exit $train_rc; $(grep -m1 'cuda fp32 vs cpu' "$results/training.txt" || grep -m1 'GPU test not run' "$results/training.txt" || echo 'no result line')"
    grep -m1 'cuda bf16 products vs cpu' "$results/training.txt" || true
    python3 - "$results/throughput.json" "$flops" "${PEAK_TFLOPS:-989.4}" "$bench_rc" "$bench_s" <<'PY'
import json, sys
path, flops, peak, rc, secs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
try:
    r = json.load(open(path))
except Exception as e:
    print(f"throughput (nemotron-h-1b, bf16 products): exit {rc} in {secs} s; no result ({e})"); sys.exit()
if "tokens_per_s" not in r:
    print(f"throughput (nemotron-h-1b, bf16 products): not run: {r.get('skipped', '?')}"); sys.exit()
achieved = flops * r["tokens_per_s"] / 1e12
print(f"throughput (nemotron-h-1b, bf16 products): exit {rc} in {secs} s; {r['tokens_per_s']:.0f} tokens/s, "
      f"median step {r['median_step_ms']:.1f} ms, {achieved:.1f} TFLOP/s = MFU {100 * achieved / peak:.1f}% "
      f"of the {peak} TFLOP/s bf16 dense peak, peak memory {r['peak_bytes'] / 2**30:.1f} GiB")
PY
    echo "ops of the 1b hybrid's blocks (bf16, one microbatch): exit $ops_rc"
    python3 "$root/bench/model_flops.py" "$root/config/nemotron-h-1b.yaml" --ops "$results/ops.json" --peak "${PEAK_TFLOPS:-989.4}" || true
  } > "$results/summary.txt"
  cat "$results/summary.txt"
  [[ $rc -eq 0 ]] || return "$rc"
  [[ $nccl_rc -eq 0 ]] || return "$nccl_rc"
  [[ $train_rc -eq 0 ]] || return "$train_rc"
  [[ $bench_rc -eq 0 ]] || return "$bench_rc"
  return "$ops_rc"
}

case "$mode" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: scripts/gpu-check.sh prepare | run" >&2; exit 2 ;;
esac
