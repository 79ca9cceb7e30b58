// test_cost_model.cpp — the cost file: JSON round trip, errors naming the key, the bounds every number
// is held to (finite, typed, negative times refused), lookups with their fallbacks (tp, group size),
// measured communication points, and the host-sharing slowdown.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
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

// The message parse_cost refuses `text` with ("no error" when it accepts it).
std::string refusal(const std::string& text) {
  try {
    parse_cost(text, "bad.json");
  } catch (const std::invalid_argument& e) {
    return std::string(e.what());
  }
  return "no error";
}

// Each refusal names the file, the key path and what is allowed.
void expect_refused(const std::string& text, const std::string& key, const std::string& allowed) {
  const std::string m = refusal(text);
  EXPECT_NE(m.find("bad.json: " + key + ":"), std::string::npos) << text << "\n  -> " << m;
  EXPECT_NE(m.find(allowed), std::string::npos) << text << "\n  -> " << m;
}

TEST(CostFileBounds, NegativeTimesAndSizesAreRefused) {
  expect_refused(R"({"ops": [{"kind": "M", "f": -5}]})", "ops[0].f", "allowed: 0 to 1e+12");
  expect_refused(R"({"ops": [{"kind": "M", "saved": {"a": -1, "b": 0}}]})", "ops[0].saved", "allowed: 0 to 1e+12");
  expect_refused(R"({"update": {"a": -1, "b": -1e-6}})", "update", "negative at every size");
  expect_refused(R"({"ops": [{"kind": "M", "bi": {"a": -0.5}}]})", "ops[0].bi", "allowed: 0 to 1e+12");
  expect_refused(R"({"step_overhead": -0.5})", "step_overhead", "allowed: 0 to 1e+12");
  expect_refused(R"({"comm": [{"op": "p2p", "t": -1}]})", "comm[0].t", "allowed: 0 to 1e+12");
  expect_refused(R"({"comm": [{"op": "p2p", "t": 1, "points": [[-4096, 1]]}]})", "comm[0].points[0]",
                 "allowed: 0 to 1e+15");
  expect_refused(R"({"comm": [{"op": "p2p", "t": 1, "points": [[4096, -1]]}]})", "comm[0].points[0]",
                 "allowed: 0 to 1e+12");
  // A fitted line may start below 0 when it rises (calibrate's fits do); the time is 0 there.
  const CostModel m = parse_cost(R"({"ops": [{"kind": "M", "f": {"a": -0.09, "b": 0.0129}}]})", "fit.json");
  EXPECT_DOUBLE_EQ(m.compute_ms('M', ir::Pass::PASS_F, 1, 1), 0.0);
  EXPECT_NEAR(m.compute_ms('M', ir::Pass::PASS_F, 1, 256), -0.09 + 0.0129 * 256, 1e-12);
  // A noisy calibration can fit a falling line, right at the microbatch it is anchored at (256 rows).
  const CostModel noisy = parse_cost(R"({"ops": [{"kind": "h", "f": {"a": 141.9, "b": -0.2722}}]})", "noisy.json");
  EXPECT_NEAR(noisy.compute_ms('h', ir::Pass::PASS_F, 1, 256), 141.9 - 0.2722 * 256, 1e-9);
  EXPECT_DOUBLE_EQ(noisy.compute_ms('h', ir::Pass::PASS_F, 1, 4096), 0.0);
}

// Values whose sums would overflow to inf (printed as null) are refused at the key.
TEST(CostFileBounds, HugeValuesAreRefused) {
  expect_refused(R"({"ops": [{"kind": "M", "f": 1e308, "b": 1e308}]})", "ops[0].f", "allowed: 0 to 1e+12");
  expect_refused(R"({"ops": [{"kind": "*", "bw": {"a": 0, "b": 1e300}}]})", "ops[0].bw.b",
                 "allowed: -1e+12 to 1e+12");
  expect_refused(R"({"ops": [{"kind": "*", "bw": {"a": -1e300, "b": 1}}]})", "ops[0].bw.a",
                 "allowed: -1e+12 to 1e+12");
  expect_refused(R"({"comm": [{"op": "allreduce", "ranks": 4, "t": {"a": 1e13, "b": 0}}]})", "comm[0].t",
                 "allowed: 0 to 1e+12");
  expect_refused(R"({"comm": [{"op": "p2p", "t": 1, "points": [[1e300, 1]]}]})", "comm[0].points[0]",
                 "allowed: 0 to 1e+15");
  expect_refused(R"({"host_slowdown": [1, 1e308]})", "host_slowdown[1]", "at most 1000");
  expect_refused(R"({"host_slowdown": [1, 1001]})", "host_slowdown[1]", "at most 1000");
  expect_refused(R"({"host_slowdown": [1, -2]})", "host_slowdown[1]", "above 0");
  // JSON has no inf or NaN; a literal beyond the double range is refused by the parser.
  EXPECT_NE(refusal(R"({"update": 1e309})").find("not JSON (numbers must be finite"), std::string::npos);
}

TEST(CostFileBounds, CoreAndThreadCountsWithinStatedBounds) {
  expect_refused(R"({"host_cores": -5})", "host_cores", "an integer from 0 to 4096");
  expect_refused(R"({"host_cores": 100000})", "host_cores", "an integer from 0 to 4096");
  expect_refused(R"({"host_cores": 1e9})", "host_cores", "an integer from 0 to 4096");
  expect_refused(R"({"threads_per_rank": 0})", "threads_per_rank", "an integer from 1 to 4096");
  expect_refused(R"({"threads_per_rank": -3})", "threads_per_rank", "an integer from 1 to 4096");
  expect_refused(R"({"threads_per_rank": 1000000000})", "threads_per_rank", "an integer from 1 to 4096");
  expect_refused(R"({"threads_per_rank": 2.5})", "threads_per_rank", "an integer from 1 to 4096");
  expect_refused(R"({"ops": [{"kind": "M", "tp": 0}]})", "ops[0].tp", "an integer from 1 to 65536");
  expect_refused(R"({"comm": [{"op": "p2p", "ranks": 1, "t": 1}]})", "comm[0].ranks", "an integer from 2 to 65536");
  const CostModel ok = parse_cost(R"({"host_cores": 4096, "threads_per_rank": 4096})", "ok.json");
  EXPECT_EQ(ok.host_cores, 4096);
  EXPECT_EQ(ok.threads_per_rank, 4096);
}

TEST(CostFileBounds, WrongTypesNameTheKey) {
  expect_refused(R"({"threads_per_rank": "4"})", "threads_per_rank", "expected an integer");
  expect_refused(R"({"host_cores": true})", "host_cores", "expected an integer");
  expect_refused(R"({"host_slowdown": 3})", "host_slowdown", "expected an array");
  expect_refused(R"({"host_slowdown": [1, "x"]})", "host_slowdown[1]", "expected a number");
  expect_refused(R"({"free_comm": "yes"})", "free_comm", "expected true or false");
  expect_refused(R"({"source": 5})", "source", "expected a string");
  expect_refused(R"({"format": 1})", "format", "expected a string");
  expect_refused(R"({"ops": {"kind": "M"}})", "ops", "expected an array");
  expect_refused(R"({"ops": [3]})", "ops[0]", "expected an object");
  expect_refused(R"({"ops": [{"f": 1}]})", "ops[0].kind", "missing");
  expect_refused(R"({"ops": [{"kind": 3}]})", "ops[0].kind", "expected a string");
  expect_refused(R"({"ops": [{"kind": "M", "f": "1"}]})", "ops[0].f", "expected a number or {");
  expect_refused(R"({"ops": [{"kind": "M", "f": {"a": null}}]})", "ops[0].f.a", "expected a number");
  expect_refused(R"({"ops": [{"kind": "M", "tp": 1.5}]})", "ops[0].tp", "expected an integer");
  expect_refused(R"({"comm": [{"op": 2, "t": 1}]})", "comm[0].op", "expected a string");
  expect_refused(R"({"comm": [{"op": "p2p", "ranks": "2", "t": 1}]})", "comm[0].ranks", "expected an integer");
  expect_refused(R"({"comm": [{"op": "p2p"}]})", "comm[0].t", "missing");
  expect_refused(R"({"comm": [{"op": "p2p", "t": 1, "pts": []}]})", "comm[0]", "unknown key \"pts\"");
  expect_refused(R"({"comm": [{"op": "p2p", "t": 1, "points": [[1, 2, 3]]}]})", "comm[0].points[0]",
                 "expected a [bytes, ms] pair");
}

// check_cost holds a CostModel built in code (analytic_cost, tests) to the same bounds.
TEST(CostFileBounds, CheckCostNamesTheField) {
  auto message = [](const CostModel& m) {
    try {
      check_cost(m, "model");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(sample()), "no error");
  CostModel m = sample();
  m.ops[0].b.b = std::numeric_limits<double>::infinity();
  EXPECT_NE(message(m).find("model: ops[0].b.b:"), std::string::npos) << message(m);
  m = sample();
  m.host_slowdown[2] = std::nan("");
  EXPECT_NE(message(m).find("model: host_slowdown[2]:"), std::string::npos) << message(m);
  m = sample();
  m.threads_per_rank = -1;
  EXPECT_NE(message(m).find("model: threads_per_rank:"), std::string::npos) << message(m);
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

// A busy count that is not a number used to index host_slowdown[-1] (a heap read out of bounds).
TEST(CostFile, HostSharingRefusesABusyCountThatIsNotANumber) {
  CostModel m = sample();
  EXPECT_THROW(m.sharing(std::nan("")), std::logic_error);
  EXPECT_THROW(m.sharing(std::numeric_limits<double>::infinity()), std::logic_error);
  EXPECT_THROW(m.sharing(-1), std::logic_error);
  m.host_slowdown = {1.0, 3.0};
  EXPECT_DOUBLE_EQ(m.sharing(1.999999), 1.0 * 0.000001 + 3.0 * 0.999999);
  EXPECT_DOUBLE_EQ(m.sharing(2), 3.0);
}

// The one mapping from the DAG's communication nodes (and a unit's tp collectives, ir::TpCollective)
// to the ops a cost model prices; a compute node has none.
TEST(CommOpOf, EveryCommunicationNodeKindHasItsOp) {
  using ir::NodeKind;
  EXPECT_EQ(comm_op_of(NodeKind::SEND), CommOp::COMM_P2P);
  EXPECT_EQ(comm_op_of(NodeKind::RECV), CommOp::COMM_P2P);
  EXPECT_EQ(comm_op_of(NodeKind::ALLREDUCE), CommOp::COMM_ALLREDUCE);
  EXPECT_EQ(comm_op_of(NodeKind::REDUCE_SCATTER), CommOp::COMM_REDUCE_SCATTER);
  EXPECT_EQ(comm_op_of(NodeKind::ALLGATHER), CommOp::COMM_ALLGATHER);
  EXPECT_EQ(comm_op_of(NodeKind::ALLTOALL), CommOp::COMM_ALLTOALL);
  std::string msg;
  try {
    comm_op_of(NodeKind::FWD);
  } catch (const std::invalid_argument& e) {
    msg = e.what();
  }
  std::printf("%s\n", msg.c_str());
  EXPECT_NE(msg.find("node kind FWD is compute, not communication"), std::string::npos) << msg;
}

}  // namespace
}  // namespace piper::sim
