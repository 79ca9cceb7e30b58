// test_checkpoint_mpi.cpp — checkpoints written and read by 2 and 4 ranks together (run under mpirun):
// disjoint irregular pieces (hashed elements, column shards, row blocks), a replicated tensor written once,
// partially overlapping pieces, reads of different runs on each rank, damage found on every rank whichever
// ranks read the damaged part, and a bad piece on one rank failing every rank.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/files.hpp"

namespace piper::checkpoint {
namespace {
namespace fs = std::filesystem;

int g_rank = 0, g_size = 1;

bool all_ok(bool ok) {
  int bad = ok ? 0 : 1, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any == 0;
}

std::string scratch(const std::string& name) {
  const fs::path d = fs::path(PIPER_BINARY_DIR) / ("test_checkpoint_mpi_np" + std::to_string(g_size)) / name;
  if (g_rank == 0) {
    fs::remove_all(d);
    fs::create_directories(d);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return d.string();
}

float value(size_t ds, int64_t i) { return static_cast<float>(ds) * 10000.f + static_cast<float>(i) * 0.5f + 1.f; }

const std::vector<DatasetSpec> kSpecs = {
    {"/model/embed.weight", {101}},                     // elements hashed to ranks
    {"/model/layers.0.mixer.in_proj.weight", {13, 17}},  // column shards: one run per row
    {"/model/layers.0.conv.weight", {4, 6, 5}},          // row blocks, uneven
    {"/model/norm.weight", {50}},                        // replicated on every rank
    {"/optim/exp_avg/layers.0.mixer.in_proj.weight", {13, 17}},  // overlapping halves
};

int owner_hash(int64_t i) { return static_cast<int>(splitmix64(static_cast<uint64_t>(i)) % static_cast<uint64_t>(g_size)); }

// The runs rank r holds of dataset ds.
std::vector<Run> runs_of(size_t ds, int r) {
  std::vector<Run> runs;
  auto add = [&](int64_t b, int64_t e) {
    if (e <= b) return;
    if (!runs.empty() && runs.back().end == b) runs.back().end = e;
    else runs.push_back({b, e});
  };
  switch (ds) {
    case 0:
      for (int64_t i = 0; i < 101; ++i)
        if (owner_hash(i) == r) add(i, i + 1);
      break;
    case 1:
      for (int64_t row = 0; row < 13; ++row)
        for (int64_t c = 0; c < 17; ++c)
          if (c % g_size == r) add(row * 17 + c, row * 17 + c + 1);
      break;
    case 2: {
      const int64_t b = 120 * r * r / (g_size * g_size), e = 120 * (r + 1) * (r + 1) / (g_size * g_size);
      add(b, e);
      break;
    }
    case 3:
      add(0, 50);
      break;
    case 4: {  // rank r holds [r*221/p - 10, (r+1)*221/p + 10) clipped
      const int64_t b = std::max<int64_t>(0, 221 * r / g_size - 10), e = std::min<int64_t>(221, 221 * (r + 1) / g_size + 10);
      add(b, e);
      break;
    }
  }
  return runs;
}

struct Owned {
  std::vector<std::vector<float>> bufs;
  std::vector<Piece> pieces;
};
Owned mine() {
  Owned o;
  o.bufs.resize(kSpecs.size());
  for (size_t ds = 0; ds < kSpecs.size(); ++ds) {
    const auto runs = runs_of(ds, g_rank);
    for (const Run& r : runs)
      for (int64_t i = r.begin; i < r.end; ++i) o.bufs[ds].push_back(value(ds, i));
    // Reversed order of runs: the packing follows the list, not the file.
    std::vector<Run> rev(runs.rbegin(), runs.rend());
    std::vector<float> packed;
    for (const Run& r : rev)
      for (int64_t i = r.begin; i < r.end; ++i) packed.push_back(value(ds, i));
    o.bufs[ds] = std::move(packed);
    o.pieces.push_back({kSpecs[ds].name, rev, o.bufs[ds].data()});
  }
  return o;
}

Meta meta() {
  Meta m;
  m.step = 7;
  m.tokens_seen = 7 * 4096;
  m.data_position = 77;
  m.seed = 1234;
  m.config_yaml = "a: 1\n";
  m.strategy = "dp=" + std::to_string(g_size);
  return m;
}

// Each rank reads what the next rank wrote, plus (rank 0) all of every dataset, and the last rank nothing of
// the replicated one.
void read_back_and_check(const std::string& path) {
  std::vector<std::vector<Run>> runs(kSpecs.size());
  std::vector<std::vector<float>> outs(kSpecs.size());
  std::vector<Request> reqs;
  for (size_t ds = 0; ds < kSpecs.size(); ++ds) {
    runs[ds] = runs_of(ds, (g_rank + 1) % g_size);
    if (ds == 3 && g_rank == g_size - 1) runs[ds].clear();
    if (g_rank == 0) {
      int64_t n = 1;
      for (auto d : kSpecs[ds].shape) n *= d;
      runs[ds].push_back({0, n});
    }
    int64_t t = 0;
    for (auto& r : runs[ds]) t += r.end - r.begin;
    outs[ds].assign(static_cast<size_t>(t), -7.f);
    reqs.push_back({kSpecs[ds].name, runs[ds], outs[ds].data()});
  }
  const Meta m = load(path, MPI_COMM_WORLD, kSpecs, reqs);
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(m.strategy, "dp=" + std::to_string(g_size));
  for (size_t ds = 0; ds < kSpecs.size(); ++ds) {
    size_t o = 0, bad = 0;
    for (const Run& r : runs[ds])
      for (int64_t i = r.begin; i < r.end; ++i) bad += outs[ds][o++] != value(ds, i);
    EXPECT_EQ(bad, 0u) << kSpecs[ds].name << " on rank " << g_rank;
  }
}

TEST(CheckpointMpi, DisjointPiecesRoundTrip) {
  const std::string dir = scratch("roundtrip");
  const std::string path = checkpoint_path(dir, 7);
  Owned o = mine();
  save(path, MPI_COMM_WORLD, meta(), kSpecs, o.pieces);
  EXPECT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(temp_path(path)));
  read_back_and_check(path);
  if (g_rank == 0) {
    const Inspection ins = inspect(path, true);
    EXPECT_EQ(ins.datasets.size(), kSpecs.size());
    for (const auto& d : ins.datasets) EXPECT_TRUE(d.checksum_ok) << d.name;
  }
  EXPECT_TRUE(all_ok(!HasFailure()));
}

TEST(CheckpointMpi, SmallRounds) {
  const std::string dir = scratch("rounds");
  const std::string path = dir + "/c.h5";
  setenv("PIPER_CKPT_ROUND_ELEMS", "3", 1);
  Owned o = mine();
  save(path, MPI_COMM_WORLD, meta(), kSpecs, o.pieces);
  read_back_and_check(path);
  unsetenv("PIPER_CKPT_ROUND_ELEMS");
  read_back_and_check(path);
  EXPECT_TRUE(all_ok(!HasFailure()));
}

TEST(CheckpointMpi, DamageFoundOnEveryRank) {
  const std::string dir = scratch("flip");
  const std::string path = dir + "/c.h5";
  Owned o = mine();
  save(path, MPI_COMM_WORLD, meta(), kSpecs, o.pieces);
  const std::string target = "/model/layers.0.conv.weight";
  if (g_rank == 0) {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, target.c_str(), H5P_DEFAULT);
    const haddr_t off = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(off + 200));
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ 1);
    io.seekp(static_cast<std::streamoff>(off + 200));
    io.write(&c, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::string err;
  try {
    load(path, MPI_COMM_WORLD, kSpecs, {});
  } catch (const CheckpointError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find(target), std::string::npos) << "rank " << g_rank << ": " << err;
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;
  EXPECT_TRUE(all_ok(!HasFailure()));
}

// Flips the lowest bit of element `at` of dataset `name` in the file (rank 0), then waits for it.
void flip_element(const std::string& path, const std::string& name, int64_t at) {
  if (g_rank == 0) {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
    const haddr_t off = H5Dget_offset(d) + static_cast<haddr_t>(at) * 4;
    H5Dclose(d);
    H5Fclose(f);
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(off));
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ 1);
    io.seekp(static_cast<std::streamoff>(off));
    io.write(&c, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

using Runs = std::vector<Run>;  // (inside a TEST, `Run` is gtest's)

// Load verifies every element exactly once in one pass, whoever reads it: damage in a part read by several
// ranks, by one, or by none (next to parts read by several) fails every rank, and the undamaged file loads.
TEST(CheckpointMpi, DamageFoundWhoeverReadsIt) {
  const std::string dir = scratch("duty");
  const std::string path = dir + "/c.h5";
  Owned o = mine();
  save(path, MPI_COMM_WORLD, meta(), kSpecs, o.pieces);
  const std::string target = kSpecs[1].name;  // 13 x 17 = 221 elements; element 100 is damaged
  const int last = g_size - 1;
  const std::vector<std::pair<std::string, Runs>> patterns = {
      {"nobody", {}},
      {"rank 0 elsewhere", g_rank == 0 ? Runs{{0, 50}, {150, 160}} : Runs{}},
      {"the last rank only", g_rank == last ? Runs{{90, 120}} : Runs{}},
      {"everyone", {{0, 221}}},
      {"all but rank 0", g_rank == 0 ? Runs{} : Runs{{80, 120}, {130, 140}}},
      {"overlaps around a gap", {{std::max<int64_t>(0, 221 * g_rank / g_size - 10), 95},
                                 {105, std::min<int64_t>(221, 221 * (g_rank + 1) / g_size + 10)}}},
  };
  auto load_with = [&](const Runs& runs, std::vector<float>& out) {
    Runs rs;
    int64_t t = 0;
    for (const auto& r : runs)
      if (r.end > r.begin) {
        rs.push_back(r);
        t += r.end - r.begin;
      }
    out.assign(static_cast<size_t>(t), -1.f);
    std::string err;
    try {
      load(path, MPI_COMM_WORLD, kSpecs, {{target, rs, out.data()}});
    } catch (const CheckpointError& e) {
      err = e.what();
    }
    return std::make_pair(rs, err);
  };
  for (const auto& [what, runs] : patterns) {
    std::vector<float> out;
    const auto [rs, err] = load_with(runs, out);
    EXPECT_EQ(err, "") << what << ", rank " << g_rank;
    size_t k = 0, bad = 0;
    for (const auto& r : rs)
      for (int64_t i = r.begin; i < r.end; ++i) bad += out[k++] != value(1, i);
    EXPECT_EQ(bad, 0u) << what << ", rank " << g_rank;
  }
  flip_element(path, target, 100);
  for (const auto& [what, runs] : patterns) {
    std::vector<float> out;
    const std::string err = load_with(runs, out).second;
    EXPECT_NE(err.find(target), std::string::npos) << what << ", rank " << g_rank << ": " << err;
    EXPECT_NE(err.find("checksum mismatch"), std::string::npos) << what << ", rank " << g_rank << ": " << err;
  }
  EXPECT_TRUE(all_ok(!HasFailure()));
}

TEST(CheckpointMpi, BadPieceOnOneRankFailsAll) {
  const std::string dir = scratch("bad");
  const std::string path = dir + "/c.h5";
  Owned o = mine();
  if (g_rank == g_size - 1) o.pieces[0].runs.push_back({100, 102});  // past the end
  std::string err;
  try {
    save(path, MPI_COMM_WORLD, meta(), kSpecs, o.pieces);
  } catch (const SaveError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("/model/embed.weight"), std::string::npos) << "rank " << g_rank << ": " << err;
  EXPECT_FALSE(fs::exists(path));
  // And a gap: a dataset nobody fully holds.
  Owned g = mine();
  if (g_rank == 0) g.pieces[2].runs.clear();
  err.clear();
  try {
    save(path, MPI_COMM_WORLD, meta(), kSpecs, g.pieces);
  } catch (const SaveError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("/model/layers.0.conv.weight"), std::string::npos) << "rank " << g_rank << ": " << err;
  EXPECT_TRUE(all_ok(!HasFailure()));
}

}  // namespace
}  // namespace piper::checkpoint

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &piper::checkpoint::g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &piper::checkpoint::g_size);
  if (piper::checkpoint::g_rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = 0;
  try {
    failed = RUN_ALL_TESTS();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s\n", piper::checkpoint::g_rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
