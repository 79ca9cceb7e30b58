// fuzz_checkpoint.cpp — the checkpoint reader (src/checkpoint): checkpoint::inspect(path, verify = true) on
// a damaged HDF5 file: the root attributes (step, seed, config, strategy, format version), the dataset
// list, shapes, types and every checksum recomputed.
//
// Input: the whole file (seeds: tests/fuzz/corpus/checkpoint/, small checkpoints written by
// checkpoint::save; tests/fuzz/make_checkpoint_seed.cpp). The harness writes it to a scratch file.
// Refusal: checkpoint::CheckpointError. MPI is initialised once (singleton, no mpirun), as the parallel
// HDF5 library the reader links expects.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "fuzz.hpp"

using namespace piper;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) MPI_Init(nullptr, nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::scratch_path("ckpt.h5");
  fuzz::write_bytes(path, data, size);
  try {
    const checkpoint::Inspection in = checkpoint::inspect(path, true);
    fuzz::require(in.bytes == static_cast<int64_t>(size), "inspect reports another file size");
    for (const auto& d : in.datasets)
      for (int64_t n : d.shape) fuzz::require(n >= 0, "a dataset with a negative extent");
    ++fuzz::accepted;
  } catch (const checkpoint::CheckpointError&) {
    ++fuzz::refused;
  }
  return 0;
}
