// test_cost_model.cpp — the cost file: JSON round trip, errors naming the key, lookups with their
// fallbacks (tp, group size), measured communication points, and the host-sharing slowdown.
#include <gtest/gtest.h>

#include <string>

#include "sim/cost_model.hpp"

namespace piper::sim {
namespace {

CostModel sample() {
  CostModel m;
  m.source = "calibrate";
  m.hardware = "test host";
  m.host_cores = 2;
  m.host_slowdown = {1.0, 1.2, 1.9, 2.4};
  OpCost o;
  o.kind = 'M';
  o.f = {0.5, 0.01};
  o.b = {1.0, 0.02};
  o.saved = {0, 4096};
  m.ops.push_back(o);
  m.update = {0.0, 4e-6};
  m.comm.push_back({CommOp::COMM_P2P, 2, {0.01, 1e-6}, {{4096, 0.004}, {262144, 0.05}, {4194304, 0.5}}});
  m.comm.push_back({CommOp::COMM_ALLREDUCE, 2, {0.02, 2e-6}, {}});
  return m;
}

TEST(CostFile, RoundTripsThroughJson) {
  const CostModel a = sample();
  const CostModel b = parse_cost(to_json(a), "a.json");
  EXPECT_EQ(b.source, "calibrate");
  EXPECT_EQ(b.host_slowdown, a.host_slowdown);
  ASSERT_EQ(b.ops.size(), 1u);
  EXPECT_DOUBLE_EQ(b.ops[0].f.b, 0.01);
  EXPECT_DOUBLE_EQ(b.ops[0].saved.b, 4096);
  ASSERT_EQ(b.comm.size(), 2u);
  EXPECT_EQ(b.comm[0].points, a.comm[0].points);
  EXPECT_TRUE(b.comm[1].points.empty());
}

TEST(CostFile, ErrorsNameTheFileAndTheKey) {
  auto message = [](const std::string& text) {
    try {
      parse_cost(text, "bad.json");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(R"({"opz": []})").find("bad.json: unknown key \"opz\""), std::string::npos);
  EXPECT_NE(message(R"({"ops": [{"kind": "Q"}]})").find("ops[0].kind"), std::string::npos);
  EXPECT_NE(message(R"({"ops": [{"kind": "M", "fwd": 1}]})").find("unknown key \"fwd\""), std::string::npos);
  EXPECT_NE(message(R"({"comm": [{"op": "bcast", "t": 1}]})").find("comm[0].op"), std::string::npos);
  EXPECT_NE(message(R"({"comm": [{"op": "p2p", "t": 1, "points": [[2, 1], [1, 1]]}]})").find("ascending"),
            std::string::npos);
  EXPECT_NE(message(R"({"host_slowdown": [1, 0]})").find("host_slowdown"), std::string::npos);
  EXPECT_NE(message("{").find("not JSON"), std::string::npos);
}

TEST(CostFile, LookupsFallBackAsDocumented) {
  const CostModel m = sample();
  EXPECT_DOUBLE_EQ(m.compute_ms('M', ir::Pass::PASS_F, 1, 100), 0.5 + 0.01 * 100);
  // no tp-2 entry: the tp-1 entry with the per-row part halved
  EXPECT_DOUBLE_EQ(m.compute_ms('M', ir::Pass::PASS_F, 2, 100), 0.5 + 0.01 * 50);
  EXPECT_THROW(m.compute_ms('*', ir::Pass::PASS_F, 1, 100), std::out_of_range);
  // measured points: interpolated between neighbours, the line outside them
  EXPECT_DOUBLE_EQ(m.comm_ms(CommOp::COMM_P2P, 2, 262144), 0.05);
  EXPECT_NEAR(m.comm_ms(CommOp::COMM_P2P, 2, (262144 + 4194304) / 2), 0.275, 1e-12);
  EXPECT_DOUBLE_EQ(m.comm_ms(CommOp::COMM_P2P, 2, 8 << 20), 0.01 + 1e-6 * (8 << 20));
  // a group size not measured: scaled from the nearest as a ring scales (2(n-1)/n bandwidth, n-1 latency)
  EXPECT_NEAR(m.comm_ms(CommOp::COMM_ALLREDUCE, 4, 1000), 0.02 * 3 + 2e-6 * 1000 * 1.5, 1e-12);
  EXPECT_THROW(m.comm_ms(CommOp::COMM_ALLGATHER, 2, 1000), std::out_of_range);
  EXPECT_EQ(m.comm_ms(CommOp::COMM_ALLGATHER, 1, 1000), 0.0) << "a group of one moves nothing";
}

TEST(CostFile, HostSharingInterpolatesAndExtends) {
  CostModel m = sample();
  EXPECT_DOUBLE_EQ(m.sharing(1), 1.0);
  EXPECT_DOUBLE_EQ(m.sharing(1.5), 1.1);
  EXPECT_DOUBLE_EQ(m.sharing(4), 2.4);
  EXPECT_DOUBLE_EQ(m.sharing(8), 4.8) << "beyond the measured ranks: the cores are shared proportionally";
  m.host_slowdown.clear();
  EXPECT_DOUBLE_EQ(m.sharing(1), 1.0);
  EXPECT_DOUBLE_EQ(m.sharing(4), 2.0) << "no measurement: busy threads over cores";
}

}  // namespace
}  // namespace piper::sim
