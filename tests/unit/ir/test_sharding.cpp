// test_sharding.cpp — unit tests of the shard description (ParamSpec::shards)
// and of the ZeRO flat shard: local shapes, local -> global index round trips
// for tp, ep and cp descriptions, the divisibility messages, and ZeRO shards
// that cover the padded buffer without overlap.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/model_graph.hpp"

namespace piper::ir {
namespace {

ParamSpec spec(std::vector<int64_t> shape, std::vector<Shard> shards) {
  ParamSpec p;
  p.name = "w";
  p.shape = std::move(shape);
  p.shards = std::move(shards);
  return p;
}

// Every coordinate combination of the axes the parameter splits along.
std::vector<Coords> all_coords(const ParamSpec& p, const Degrees& n) {
  std::vector<Coords> out{Coords{}};
  for (const Shard& s : p.shards) {
    std::vector<Coords> next;
    for (const Coords& c : out)
      for (int i = 0; i < n[s.axis]; ++i) {
        Coords d = c;
        d[s.axis] = i;
        next.push_back(d);
      }
    out = std::move(next);
  }
  return out;
}

// The pieces of all coordinates map their local elements onto the global
// tensor one to one, and each stretch is globally contiguous for its length.
void expect_round_trip(const ParamSpec& p, const Degrees& n) {
  const int64_t local = local_numel(p, n);
  std::vector<int> seen(static_cast<size_t>(p.numel()), 0);
  int64_t stretches = 0;
  for (const Coords& at : all_coords(p, n)) {
    for (int64_t i = 0; i < local;) {
      const Stretch st = global_stretch(p, n, at, i);
      ASSERT_GE(st.len, 1);
      ++stretches;
      for (int64_t k = 0; k < st.len && i + k < local; ++k) {
        const int64_t g = global_index(p, n, at, i + k);
        ASSERT_EQ(g, st.global + k) << "stretch from local " << i << ", element " << k;
        ASSERT_GE(g, 0);
        ASSERT_LT(g, p.numel());
        ++seen[static_cast<size_t>(g)];
      }
      i += st.len;
    }
  }
  for (size_t g = 0; g < seen.size(); ++g) ASSERT_EQ(seen[g], 1) << "global element " << g;
  std::printf("  shape of %lld elements, %zu shard(s): %lld stretches\n", static_cast<long long>(p.numel()),
              p.shards.size(), static_cast<long long>(stretches));
}

TEST(Shard, LocalShapes) {
  const Degrees tp2{.tp = 2};
  EXPECT_EQ(local_shape(spec({6, 8}, {}), tp2), (std::vector<int64_t>{6, 8}));                     // replicated
  EXPECT_EQ(local_shape(spec({6, 8}, {{0, Axis::TP, {}}}), tp2), (std::vector<int64_t>{3, 8}));    // rows
  EXPECT_EQ(local_shape(spec({6, 8}, {{1, Axis::TP, {}}}), tp2), (std::vector<int64_t>{6, 4}));    // columns
  EXPECT_EQ(local_shape(spec({12, 4}, {{0, Axis::TP, {4, 6, 2}}}), tp2), (std::vector<int64_t>{6, 4}));  // packed
  EXPECT_EQ(local_numel(spec({12, 4}, {{0, Axis::TP, {4, 6, 2}}}), tp2), 24);
  // Experts over ep and their rows over tp: [experts, out, in].
  const ParamSpec moe = spec({4, 6, 8}, {{0, Axis::EP, {}}, {1, Axis::TP, {}}});
  EXPECT_EQ(local_shape(moe, {.tp = 3, .ep = 2}), (std::vector<int64_t>{2, 2, 8}));
  EXPECT_TRUE(split_along(moe, Axis::EP));
  EXPECT_TRUE(split_along(moe, Axis::TP));
  EXPECT_FALSE(split_along(moe, Axis::CP));
  // Degree 1 everywhere: every piece is the whole tensor, index for index.
  EXPECT_EQ(local_shape(moe, Degrees{}), moe.shape);
  EXPECT_EQ(global_index(moe, Degrees{}, Coords{}, 17), 17);
}

TEST(Shard, PackedPartsSplitEachPart) {
  // Parts 4 | 6 | 2 of 12 rows over tp 2: rank 1 holds rows 2-3, 7-9, 11.
  const ParamSpec p = spec({12, 1}, {{0, Axis::TP, {4, 6, 2}}});
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < 6; ++i) rows.push_back(global_index(p, {.tp = 2}, {.tp = 1}, i));
  EXPECT_EQ(rows, (std::vector<int64_t>{2, 3, 7, 8, 9, 11}));
}

TEST(Shard, RoundTripsForTpEpAndCpDescriptions) {
  expect_round_trip(spec({6, 8}, {{0, Axis::TP, {}}}), {.tp = 3});
  expect_round_trip(spec({6, 8}, {{1, Axis::TP, {}}}), {.tp = 4});
  expect_round_trip(spec({12, 4}, {{0, Axis::TP, {4, 6, 2}}}), {.tp = 2});
  expect_round_trip(spec({3, 8, 4}, {{1, Axis::TP, {4, 4}}}), {.tp = 2});
  // "split along the expert axis over ep": experts on dimension 0, rows of each expert over tp.
  expect_round_trip(spec({4, 6, 8}, {{0, Axis::EP, {}}, {1, Axis::TP, {}}}), {.tp = 3, .ep = 2});
  expect_round_trip(spec({4, 6, 8}, {{0, Axis::EP, {}}, {2, Axis::TP, {4, 4}}}), {.tp = 2, .ep = 4});
  // "split along the sequence over cp": [sequence, hidden], and the sequence split again after a tp split.
  expect_round_trip(spec({16, 6}, {{0, Axis::CP, {}}}), {.cp = 4});
  expect_round_trip(spec({16, 6}, {{1, Axis::TP, {}}, {0, Axis::CP, {}}}), {.tp = 3, .cp = 2});
  // Two splits of one dimension: over ep, then what ep leaves over tp.
  expect_round_trip(spec({8, 3}, {{0, Axis::EP, {}}, {0, Axis::TP, {}}}), {.tp = 2, .ep = 2});
}

TEST(Shard, ProblemsNameTheParameterDimensionPartAndDegree) {
  const auto problem = [](std::vector<int64_t> shape, std::vector<Shard> shards, Degrees n) {
    ParamSpec p = spec(std::move(shape), std::move(shards));
    p.name = "layers.0.mixer.in_proj.weight";
    return shard_problem(p, n);
  };
  EXPECT_EQ(problem({12, 4}, {{0, Axis::TP, {4, 6, 2}}}, {.tp = 2}), "");
  EXPECT_EQ(problem({12, 4}, {{0, Axis::TP, {4, 6, 2}}}, {.tp = 4}),
            "parameter layers.0.mixer.in_proj.weight (shape [12 x 4], split along tp): part 1 of dimension 0 "
            "(size 6) does not divide by tp 4; use a degree that divides 6");
  EXPECT_EQ(problem({10, 4}, {{0, Axis::TP, {}}}, {.tp = 4}),
            "parameter layers.0.mixer.in_proj.weight (shape [10 x 4], split along tp): dimension 0 (size 10) does "
            "not divide by tp 4; use a degree that divides 10");
  EXPECT_EQ(problem({4, 6, 8}, {{0, Axis::EP, {}}, {1, Axis::TP, {}}}, {.tp = 4, .ep = 2}),
            "parameter layers.0.mixer.in_proj.weight (shape [2 x 6 x 8], split along tp): dimension 1 (size 6) "
            "does not divide by tp 4; use a degree that divides 6");
  EXPECT_EQ(problem({12, 4}, {{0, Axis::TP, {4, 6}}}, {.tp = 2}),
            "parameter layers.0.mixer.in_proj.weight (shape [12 x 4], split along tp): its parts along dimension "
            "0 sum to 10, the dimension is 12");
  EXPECT_EQ(problem({12, 4}, {{2, Axis::TP, {}}}, {.tp = 2}),
            "parameter layers.0.mixer.in_proj.weight (shape [12 x 4], split along tp): dimension 2 does not exist; "
            "use 0..1");
  EXPECT_EQ(problem({12, 4}, {{0, Axis::TP, {}}, {1, Axis::TP, {}}}, {.tp = 2}),
            "parameter layers.0.mixer.in_proj.weight (shape [6 x 4], split along tp): split twice along tp; give "
            "one shard per axis");
  ParamSpec bad = spec({10, 4}, {{0, Axis::TP, {}}});
  EXPECT_THROW(local_shape(bad, {.tp = 4}), std::invalid_argument);
  ModelGraph g;
  g.units.push_back({0, UnitKind::UNIT_EMBED, -1, "embed", {bad}});
  EXPECT_THROW(check_shards(g, {.tp = 4}), std::invalid_argument);
  EXPECT_NO_THROW(check_shards(g, {.tp = 2}));
}

TEST(ZeroShard, ShardsCoverThePaddedBufferWithoutOverlap) {
  for (int64_t numel : {0, 1, 7, 8, 9, 100, 1001})
    for (int dp : {1, 2, 3, 4, 8}) {
      const FlatShard first = flat_shard(numel, dp, 0);
      EXPECT_EQ(first.padded, first.len * dp);
      EXPECT_GE(first.padded, numel);
      EXPECT_LT(first.padded - numel, dp) << "padding is less than one element per rank";
      int64_t next = 0;
      for (int d = 0; d < dp; ++d) {
        const FlatShard z = flat_shard(numel, dp, d);
        EXPECT_EQ(z.len, first.len);
        EXPECT_EQ(z.padded, first.padded);
        EXPECT_EQ(z.offset, next) << "numel " << numel << " dp " << dp << " rank " << d;  // no gap, no overlap
        next = z.offset + z.len;
      }
      EXPECT_EQ(next, first.padded);
    }
}

TEST(ZeroShard, WhichStateEachLevelShards) {
  const ZeroState states[] = {ZeroState::ZERO_PARAMS, ZeroState::ZERO_GRADS, ZeroState::ZERO_MOMENTS};
  const bool expect[4][3] = {{false, false, false}, {false, false, true}, {false, true, true}, {true, true, true}};
  for (int zero = 0; zero <= 3; ++zero)
    for (int s = 0; s < 3; ++s) EXPECT_EQ(zero_shards(zero, states[s]), expect[zero][s]) << "zero " << zero;
}

}  // namespace
}  // namespace piper::ir
