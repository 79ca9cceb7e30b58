// test_grid.cpp — unit tests of ir::RankGrid: groups per order string, coordinates, size errors.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/grid.hpp"

namespace piper::ir {
namespace {

using Groups = std::vector<std::vector<int>>;

const std::map<std::string, int> kSizes222 = {{"tp", 2}, {"dp", 2}, {"pp", 2}};

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

TEST(RankGrid, DefaultOrderTpFastest) {
  RankGrid g(8, "tp-dp-pp", kSizes222);  // rank = tp + 2 * (dp + 2 * pp)
  EXPECT_EQ(g.order(), "tp-dp-pp");
  EXPECT_EQ(g.groups("tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.groups("dp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.groups("pp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.group(5, "dp"), (std::vector<int>{5, 7}));
  EXPECT_EQ(g.group(6, "pp"), (std::vector<int>{2, 6}));
  EXPECT_EQ(g.coord(6, "tp"), 0);
  EXPECT_EQ(g.coord(6, "dp"), 1);
  EXPECT_EQ(g.coord(6, "pp"), 1);
  EXPECT_EQ(g.rank_of({{"tp", 1}, {"dp", 0}, {"pp", 1}}), 5);
}

TEST(RankGrid, OtherOrderDpFastest) {
  RankGrid g(8, "dp-tp-pp", kSizes222);  // rank = dp + 2 * (tp + 2 * pp)
  EXPECT_EQ(g.groups("dp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.groups("tp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.groups("pp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.coord(2, "tp"), 1);
  EXPECT_EQ(g.coord(2, "dp"), 0);
}

TEST(RankGrid, UnevenSizesAndAllFiveDims) {
  RankGrid g(24, "tp-cp-ep-dp-pp", {{"tp", 2}, {"cp", 1}, {"ep", 3}, {"dp", 1}, {"pp", 4}});
  EXPECT_EQ(g.size("ep"), 3);
  EXPECT_EQ(g.size("cp"), 1);
  EXPECT_EQ(g.group(7, "ep"), (std::vector<int>{7, 9, 11}));  // tp 1, ep 0..2 (stride 2), pp 1
  EXPECT_EQ(g.group(7, "pp"), (std::vector<int>{1, 7, 13, 19}));
  EXPECT_EQ(g.group(7, "cp"), (std::vector<int>{7}));
  EXPECT_EQ(g.groups("cp").size(), 24u);
}

TEST(RankGrid, DimsOutsideTheOrderHaveSizeOne) {
  RankGrid g(4, "tp-dp-pp", {{"tp", 2}, {"dp", 2}, {"cp", 1}});
  EXPECT_EQ(g.size("cp"), 1);
  EXPECT_EQ(g.coord(3, "cp"), 0);
  EXPECT_EQ(g.group(3, "cp"), (std::vector<int>{3}));
  EXPECT_EQ(g.size("pp"), 1);  // named by the order, absent from the sizes
  EXPECT_EQ(g.group(2, "pp"), (std::vector<int>{2}));
}

TEST(RankGrid, CoordsRoundTripAndEveryRankInOneGroupPerDim) {
  for (const std::string order : {"tp-dp-pp", "dp-tp-pp", "pp-dp-tp", "tp-cp-ep-dp-pp"}) {
    RankGrid g(12, order, {{"tp", 2}, {"cp", 1}, {"ep", 1}, {"dp", 3}, {"pp", 2}});
    for (int r = 0; r < 12; ++r) EXPECT_EQ(g.rank_of(g.coords(r)), r) << order << " rank " << r;
    for (const std::string dim : {"tp", "dp", "pp"}) {
      std::map<int, int> seen;
      for (const auto& group : g.groups(dim)) {
        EXPECT_EQ(static_cast<int>(group.size()), g.size(dim));
        for (size_t i = 0; i < group.size(); ++i) {
          ++seen[group[i]];
          EXPECT_EQ(g.coord(group[i], dim), static_cast<int>(i));  // sorted by coordinate
          EXPECT_EQ(g.group(group[i], dim), group);
          for (const std::string other : {"tp", "dp", "pp"}) {  // a group varies only along dim
            if (other != dim) {
              EXPECT_EQ(g.coord(group[i], other), g.coord(group[0], other));
            }
          }
        }
      }
      ASSERT_EQ(seen.size(), 12u) << order << " " << dim;
      for (const auto& [rank, count] : seen) EXPECT_EQ(count, 1) << order << " " << dim << " rank " << rank;
    }
  }
}

TEST(RankGrid, BadSizesThrowWithEveryFactor) {
  EXPECT_EQ(error_of([] { RankGrid(6, "tp-dp-pp", kSizes222); }), "world size 6 != tp(2) x dp(2) x pp(2) = 8");
  EXPECT_EQ(error_of([] { RankGrid(8, "tp-cp-dp-pp", {{"tp", 2}, {"dp", 2}}); }),
            "world size 8 != tp(2) x cp(1) x dp(2) x pp(1) = 4");
  EXPECT_NE(error_of([] { RankGrid(8, "tp-xx-pp", kSizes222); }).find("unknown dimension 'xx'"), std::string::npos);
  EXPECT_NE(error_of([] { RankGrid(8, "tp-dp-pp", {{"tq", 8}}); }).find("unknown dimension 'tq'"), std::string::npos);
  EXPECT_NE(error_of([] { RankGrid(8, "tp-dp-tp", kSizes222); }).find("repeated"), std::string::npos);
  EXPECT_NE(error_of([] { RankGrid(8, "tp-dp-pp", {{"tp", 2}, {"dp", 2}, {"ep", 2}}); }).find("does not name ep"),
            std::string::npos);
  EXPECT_NE(error_of([] { RankGrid(8, "tp-dp-pp", {{"tp", 0}}); }).find("must be >= 1"), std::string::npos);
  RankGrid g(8, "tp-dp-pp", kSizes222);
  EXPECT_THROW(g.coord(8, "dp"), std::invalid_argument);
  EXPECT_THROW(g.group(0, "zz"), std::invalid_argument);
  EXPECT_THROW(g.rank_of({{"dp", 2}}), std::invalid_argument);
}

}  // namespace
}  // namespace piper::ir
