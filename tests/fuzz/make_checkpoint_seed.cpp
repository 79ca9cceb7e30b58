// make_checkpoint_seed.cpp — writes the seed of the checkpoint fuzz harness: a real checkpoint written by
// checkpoint::save, kept to a few KiB (three small datasets, a short config).
//
//   fuzz_checkpoint_seed OUT.h5      (one process, no mpirun)
// tests/fuzz/corpus/checkpoint/tiny.h5 was written by it; run it again after a format change.
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"

using namespace piper;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.h5\n", argv[0]);
    return 2;
  }
  MPI_Init(&argc, &argv);
  const std::vector<checkpoint::DatasetSpec> all = {
      {"/model/embed.weight", {4, 3}}, {"/model/layers.0.norm.weight", {3}}, {"/optim/exp_avg/embed.weight", {4, 3}}};
  std::vector<std::vector<float>> values;
  std::vector<checkpoint::Piece> mine;
  for (const auto& d : all) {
    int64_t n = 1;
    for (int64_t e : d.shape) n *= e;
    std::vector<float>& v = values.emplace_back();
    for (int64_t i = 0; i < n; ++i) v.push_back(0.25f * static_cast<float>(i) - 1.0f);
    mine.push_back({d.name, {{0, n}}, v.data()});
  }
  checkpoint::Meta meta;
  meta.step = 3;
  meta.tokens_seen = 96;
  meta.data_position = 12;
  meta.seed = 1234;
  meta.config_yaml = "model: {pattern: \"M-\"}\n";
  meta.strategy = "dp=1 tp=1 pp=1";
  int rc = 0;
  try {
    checkpoint::save(argv[1], MPI_COMM_WORLD, meta, all, mine);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
