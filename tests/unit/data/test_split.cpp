// test_split.cpp — held-out data (docs/data.md, "Held-out data"): samples drawn from a stretch of a
// token file wrap within it, and the last sequences held out are disjoint from every sample the
// training order draws.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "data/split.hpp"
#include "data/token_file.hpp"

namespace fs = std::filesystem;
using namespace piper::data;

namespace {

// A token file of ids 0..n-1 (so an id is its index), removed with the object.
struct IotaFile {
  fs::path path;
  explicit IotaFile(int n) {
    path = fs::temp_directory_path() / ("piper-split-" + std::to_string(::getpid()) + "-" + std::to_string(n) + ".tok");
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::iota(ids.begin(), ids.end(), 0);
    write_token_file(path.string(), static_cast<uint32_t>(n), ids);
  }
  ~IotaFile() { fs::remove(path); }
};

TEST(Split, SampleOfARangeWrapsWithinIt) {
  const IotaFile file(50);
  const TokenFile f(file.path.string());
  const TokenRange r{10, 17};
  for (int64_t T : {1, 3, 7, 16, 20}) {
    std::vector<int32_t> out(static_cast<size_t>(T + 1)), whole(out.size()), all(out.size());
    for (int64_t g = 0; g < 30; ++g) {
      f.sample(r, g, T, out.data());
      for (int64_t i = 0; i <= T; ++i) ASSERT_EQ(out[i], 10 + (g * T + i) % 17) << "g=" << g << " T=" << T << " i=" << i;
      f.sample(g, T, whole.data());
      f.sample(f.all(), g, T, all.data());
      EXPECT_EQ(whole, all) << "the whole file is the range all()";
    }
  }
  std::vector<int32_t> out(5);
  for (const TokenRange bad : {TokenRange{-1, 5}, TokenRange{45, 10}, TokenRange{0, 0}, TokenRange{50, 1}})
    EXPECT_THROW(f.sample(bad, 0, 4, out.data()), DataError) << bad.first << " + " << bad.count;
}

TEST(Split, SequencesAreTheWholeSamplesOfTheFile) {
  EXPECT_EQ(sequence_count(10, 10), 0);  // 10 tokens: no sample of 11 without wrapping
  EXPECT_EQ(sequence_count(11, 10), 1);
  EXPECT_EQ(sequence_count(101, 10), 10);
  EXPECT_EQ(sequence_count(2, 1), 1);
  EXPECT_EQ(sequence_count(0, 3), 0);
}

TEST(Split, NoFractionTrainsOnEveryToken) {
  const Split s = split_tail(101, 10, 0.0);
  EXPECT_EQ(s.train, (TokenRange{0, 101}));
  EXPECT_EQ(s.held, 0);
  EXPECT_EQ(s.sequences, 10);
}

TEST(Split, TheLastSequencesAreHeldOutAndTrainingNeverReadsThem) {
  const IotaFile file(101);
  const TokenFile f(file.path.string());
  const int64_t T = 10;
  const Split s = split_tail(f.size(), T, 0.25);  // S = 10, E = ceil(2.5) = 3
  EXPECT_EQ(s.sequences, 10);
  EXPECT_EQ(s.held, 3);
  EXPECT_EQ(s.train, (TokenRange{0, 70}));
  EXPECT_EQ(s.held_out, (TokenRange{70, 31}));
  std::vector<int32_t> out(static_cast<size_t>(T + 1));
  for (int64_t k = 0; k < s.held; ++k) {  // held-out sequence k: tokens 70 + 10k .. 80 + 10k, no wrap
    f.sample(s.held_out, k, T, out.data());
    for (int64_t i = 0; i <= T; ++i) ASSERT_EQ(out[i], 70 + k * T + i) << "k=" << k << " i=" << i;
  }
  for (int64_t g = 0; g < 200; ++g) {  // the training order wraps before the held-out tokens
    f.sample(s.train, g, T, out.data());
    for (int32_t id : out) ASSERT_LT(id, 70) << "training sample " << g << " reads a held-out token";
  }
  EXPECT_EQ(split_tail(f.size(), T, 0.5).held, 5);
  const Split all_held = split_tail(f.size(), T, 0.95);  // ceil(9.5) = 10 of 10: nothing left to train on
  EXPECT_EQ(all_held.held, 10);
  EXPECT_EQ(all_held.train.count, 0);
}

}  // namespace
