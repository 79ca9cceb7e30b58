#!/usr/bin/env bash
# install-deps.sh — installs every Debian package piper needs (build, test, bench).
# A no-op when all are present; uses sudo when not root.
set -euo pipefail

packages=(
  build-essential cmake make pkg-config xz-utils
  openmpi-bin libopenmpi-dev          # launch and CPU tensor traffic
  libhdf5-openmpi-dev hdf5-tools      # parallel HDF5 checkpoints; h5dump reads them
  libyaml-cpp-dev                     # configs
  libsentencepiece-dev                # subword tokenizer (piper prepare --tokenizer-train, docs/data.md)
  nlohmann-json3-dev libcli11-dev     # metrics JSON, command line
  libgtest-dev googletest             # tests
  clang libclang-rt-14-dev            # make fuzz: clang 14 and its libFuzzer / sanitizer runtimes (docs/testing.md)
  libboost-context-dev                # make sanitize: the emulated GPU's fibers (tests/cuda_emulator)
  libdnnl-dev                         # float GEMM: oneDNN, the fastest measured (docs/blas.md)
  libopenblas-dev libopenblas0-openmp libopenblas-openmp-dev  # CBLAS (double), OpenMP build
  python3 python3-torch python3-numpy python3-yaml  # the PyTorch peer of `make bench` and the parity test
  python3-sentencepiece               # bench/tokenizer.py: bytes per held-out token
  slurm-wlm slurm-client munge        # the one-node Slurm of tests/slurm (scripts/slurm-local.sh)
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
