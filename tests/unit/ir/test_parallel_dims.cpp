// test_parallel_dims.cpp — unit tests of ir::ParallelDims and its rank grid:
// groups per order string, coordinates, and every invalid case with its message.
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/parallel_dims.hpp"
#include "ir/strategy.hpp"

namespace piper::ir {
namespace {

using Groups = std::vector<std::vector<int>>;

const Degrees kDegrees222 = {.tp = 2, .dp = 2, .pp = 2};

// The message of the std::invalid_argument `f` throws ("" if it does not).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelDims, DefaultOrderTpFastest) {
  const ParallelDims g(8, "tp-dp-pp", kDegrees222);  // rank = tp + 2 * (dp + 2 * pp)
  EXPECT_EQ(g.order(), "tp-dp-pp");
  EXPECT_EQ(g.world_size(), 8);
  EXPECT_EQ(g.degrees(), kDegrees222);
  EXPECT_EQ(g.groups(Axis::TP), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.groups(Axis::DP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.groups(Axis::PP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.group(5, Axis::DP), (std::vector<int>{5, 7}));
  EXPECT_EQ(g.group(6, Axis::PP), (std::vector<int>{2, 6}));
  EXPECT_EQ(g.coord(6, Axis::TP), 0);
  EXPECT_EQ(g.coord(6, Axis::DP), 1);
  EXPECT_EQ(g.coord(6, Axis::PP), 1);
  EXPECT_EQ(g.rank_of({.tp = 1, .dp = 0, .pp = 1}), 5);
}

TEST(ParallelDims, OtherOrderDpFastest) {
  const ParallelDims g(8, "dp-tp-pp", kDegrees222);  // rank = dp + 2 * (tp + 2 * pp)
  EXPECT_EQ(g.groups(Axis::DP), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.groups(Axis::TP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.groups(Axis::PP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.coord(2, Axis::TP), 1);
  EXPECT_EQ(g.coord(2, Axis::DP), 0);
}

TEST(ParallelDims, AxesOutsideTheOrderHaveDegreeOne) {
  const ParallelDims g(4, "tp-dp", {.tp = 2, .dp = 2});
  EXPECT_EQ(g.degree(Axis::CP), 1);
  EXPECT_EQ(g.coord(3, Axis::CP), 0);
  EXPECT_EQ(g.group(3, Axis::CP), (std::vector<int>{3}));
  EXPECT_EQ(g.degree(Axis::PP), 1);
  EXPECT_EQ(g.group(2, Axis::PP), (std::vector<int>{2}));
  const ParallelDims one;  // a single rank
  EXPECT_EQ(one.world_size(), 1);
  EXPECT_EQ(one.group(0, Axis::TP), (std::vector<int>{0}));
}

// The grid arithmetic knows all five axes (ParallelDims admits cp 1 only, and carves ep out of dp).
TEST(RankGrid, UnevenSizesAndAllFiveAxes) {
  const RankGrid g({Axis::TP, Axis::CP, Axis::EP, Axis::DP, Axis::PP}, {.tp = 2, .cp = 1, .ep = 3, .dp = 1, .pp = 4});
  EXPECT_EQ(g.world_size(), 24);
  EXPECT_EQ(g.group(7, Axis::EP), (std::vector<int>{7, 9, 11}));  // tp 1, ep 0..2 (stride 2), pp 1
  EXPECT_EQ(g.group(7, Axis::PP), (std::vector<int>{1, 7, 13, 19}));
  EXPECT_EQ(g.group(7, Axis::CP), (std::vector<int>{7}));
  EXPECT_EQ(g.groups(Axis::CP).size(), 24u);
  EXPECT_EQ(g.rank_of({.tp = 1, .ep = 2, .pp = 3}), 1 + 2 * 2 + 6 * 3);
}

TEST(ParallelDims, CoordsRoundTripAndEveryRankInOneGroupPerAxis) {
  for (const std::string order : {"tp-dp-pp", "dp-tp-pp", "pp-dp-tp", "tp-cp-ep-dp-pp"}) {
    const ParallelDims g(12, order, {.tp = 2, .dp = 3, .pp = 2});
    for (int r = 0; r < 12; ++r) EXPECT_EQ(g.rank_of(g.coords(r)), r) << order << " rank " << r;
    for (Axis axis : {Axis::TP, Axis::DP, Axis::PP}) {
      std::map<int, int> seen;
      for (const auto& group : g.groups(axis)) {
        EXPECT_EQ(static_cast<int>(group.size()), g.degree(axis));
        for (size_t i = 0; i < group.size(); ++i) {
          ++seen[group[i]];
          EXPECT_EQ(g.coord(group[i], axis), static_cast<int>(i));  // sorted by coordinate
          EXPECT_EQ(g.group(group[i], axis), group);
          for (Axis other : kAxes) {  // a group varies only along its axis
            if (other != axis) {
              EXPECT_EQ(g.coord(group[i], other), g.coord(group[0], other));
            }
          }
        }
      }
      ASSERT_EQ(seen.size(), 12u) << order << " " << axis_name(axis);
      for (const auto& [rank, count] : seen) EXPECT_EQ(count, 1) << order << " " << axis_name(axis) << " rank " << rank;
    }
  }
}

TEST(ParallelDims, EveryInvalidCaseSaysWhatIsWrong) {
  EXPECT_EQ(error_of([] { ParallelDims(6, "tp-dp-pp", kDegrees222); }), "world size 6 != tp(2) x dp(2) x pp(2) = 8");
  EXPECT_EQ(error_of([] { ParallelDims(8, "tp-cp-dp-pp", {.tp = 2, .dp = 2}); }),
            "world size 8 != tp(2) x cp(1) x dp(2) x pp(1) = 4");
  EXPECT_EQ(error_of([] { ParallelDims(8, "tp-xx-pp", kDegrees222); }),
            "rank grid order 'tp-xx-pp': unknown dimension 'xx' (expected names from tp, cp, ep, dp, pp joined by '-')");
  EXPECT_EQ(error_of([] { ParallelDims(8, "tp-dp-tp", kDegrees222); }),
            "rank grid order 'tp-dp-tp': dimension 'tp' is repeated");
  EXPECT_EQ(error_of([] { ParallelDims(8, "", kDegrees222); }), "rank grid order is empty; use e.g. tp-dp-pp");
  EXPECT_EQ(error_of([] { ParallelDims(8, "tp-dp", kDegrees222); }),
            "rank grid order 'tp-dp' does not name pp, whose size is 2; add it, e.g. tp-cp-ep-dp-pp");
  EXPECT_EQ(error_of([] { ParallelDims(8, "tp-dp-pp", {.tp = 0}); }), "rank grid: tp size must be >= 1, got 0");
  EXPECT_EQ(error_of([] { ParallelDims(8, "tp-dp-pp", {.pp = -1}); }), "rank grid: pp size must be >= 1, got -1");
  EXPECT_EQ(error_of([] { ParallelDims(8, "tp-ep-dp-pp", {.tp = 2, .ep = 2, .dp = 2}); }),
            "world size 8 != tp(2) x dp(2) x pp(1) = 4");  // ep is carved out of dp, no factor of its own
  EXPECT_EQ(error_of([] { ParallelDims(6, "tp-dp-pp", {.ep = 2, .dp = 3, .pp = 2}); }),
            "ep = 2 does not divide dp = 3: expert parallelism splits the data-parallel ranks into groups of ep; use "
            "an ep that divides dp");
  EXPECT_EQ(error_of([] { ParallelDims(4, "ep-tp-dp-pp", {.ep = 2, .dp = 4}); }),
            "rank grid order 'ep-tp-dp-pp' puts ep elsewhere than right before dp; expert parallelism is carved out "
            "of dp (its groups are ep consecutive data-parallel ranks): write ep-dp, or leave ep out");
  EXPECT_EQ(error_of([] { ParallelDims(4, "tp-cp-dp-pp", {.cp = 2, .dp = 2}); }),
            "cp = 2: cp > 1 needs context parallelism (a sequence split over ranks), which this build does not "
            "have; use cp 1");
  EXPECT_EQ(error_of([] { ParallelDims(1 << 30, "tp-dp-pp", {.tp = 1 << 30, .dp = 1 << 30, .pp = 1 << 30}); }),
            "world size 1073741824 != tp(1073741824) x dp(1073741824) x pp(1073741824) = more than 2^63");
  const ParallelDims g(8, "tp-dp-pp", kDegrees222);
  EXPECT_EQ(error_of([&] { g.coord(8, Axis::DP); }), "rank grid: rank 8 outside world size 8");
  EXPECT_EQ(error_of([&] { g.rank_of({.dp = 2}); }), "rank grid: dp coordinate 2 outside 0..1");
}

// Megatron's layout: an ep group is ep consecutive dp ranks; the expert-data group strides over them.
TEST(ParallelDims, ExpertParallelismIsCarvedOutOfDataParallelism) {
  for (const std::string order : {"tp-dp-pp", "tp-ep-dp-pp"}) {
    const ParallelDims g(16, order, {.tp = 2, .ep = 2, .dp = 4, .pp = 2});
    EXPECT_EQ(g.world_size(), 16);
    // rank = tp + 2 dp + 8 pp; rank 11: tp 1, dp 1, pp 1.
    EXPECT_EQ(g.coord(11, Axis::DP), 1);
    EXPECT_EQ(g.coord(11, Axis::EP), 1);
    EXPECT_EQ(g.coords(11).ep, 1);
    EXPECT_EQ(g.expert_data_coord(11), 0);
    EXPECT_EQ(g.expert_data_degree(), 2);
    EXPECT_EQ(g.group(11, Axis::EP), (std::vector<int>{9, 11}));            // dp 0, 1
    EXPECT_EQ(g.expert_data_group(11), (std::vector<int>{11, 15}));         // dp 1, 3
    EXPECT_EQ(g.group(11, Axis::DP), (std::vector<int>{9, 11, 13, 15}));
    EXPECT_EQ(g.groups(Axis::EP).size(), 8u);
    for (int r = 0; r < 16; ++r) {
      EXPECT_EQ(g.rank_of(g.coords(r)), r);
      for (int m : g.group(r, Axis::EP)) EXPECT_EQ(g.expert_data_coord(m), g.expert_data_coord(r));
      for (int m : g.expert_data_group(r)) EXPECT_EQ(g.coord(m, Axis::EP), g.coord(r, Axis::EP));
    }
  }
}

TEST(ParallelDims, StrategyGivesItsDims) {
  Strategy s;
  s.world_size = 12;
  s.grid_order = "dp-tp-pp";
  s.shard.tp = 2, s.replicate.dp = 3, s.place.pp = 2;
  const ParallelDims d = s.dims();
  EXPECT_EQ(d.degrees(), (Degrees{.tp = 2, .dp = 3, .pp = 2}));
  EXPECT_EQ(d.order(), "dp-tp-pp");
  s.place.pp = 3;
  EXPECT_EQ(error_of([&] { (void)s.dims(); }), "world size 12 != dp(3) x tp(2) x pp(3) = 18");
}

}  // namespace
}  // namespace piper::ir
