// test_plan_switch.cpp — `piper plan-switch` end to end on config/tiny.yaml: the figures its JSON and
// text carry, how they follow the strategies, and its refusals.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "e2e_util.hpp"

namespace piper::e2e {
namespace {

std::string plan_switch(const std::string& args) {
  const std::string tiny = source("config/tiny.yaml");
  return piper() + " plan-switch " + tiny + " " + tiny + " " + args;
}

nlohmann::json json_of(const std::string& args) {
  const RunResult r = run(plan_switch(args + " --json"));
  EXPECT_EQ(r.code, 0) << r.output;
  return r.code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
}

// dp4 zero1 -> dp2 zero3: processes 0, 1 stay (2 and 3 leave); the moments' shards and the values' are re-cut.
const char* kShrink = "--world-from 4 --world-to 2 --set-from parallel.dp=4 --set-from parallel.zero=1 "
                      "--set-to parallel.dp=2 --set-to parallel.zero=3 --hardware h100-sxm";

TEST(PlanSwitchCli, JsonHasTheFiguresOfThePlan) {
  const nlohmann::json j = json_of(kShrink);
  ASSERT_FALSE(j.empty());
  EXPECT_EQ(j.at("from").at("strategy"), "tp1 pp1 dp4 zero1");
  EXPECT_EQ(j.at("to").at("strategy"), "tp1 pp1 dp2 zero3");
  EXPECT_EQ(j.at("from").at("world"), 4);
  EXPECT_EQ(j.at("processes"), 4);
  EXPECT_EQ(j.at("hardware"), "h100-sxm");
  EXPECT_EQ(j.at("ranks_per_host"), 8) << "h100-sxm's devices per node";
  EXPECT_EQ(j.at("blocks"), 7 * 3) << "embedding, 5 blocks, head; values and two moments";
  EXPECT_GT(j.at("bytes_moved").get<double>(), 0);
  EXPECT_GT(j.at("bytes_local").get<double>(), 0);
  EXPECT_GE(j.at("messages").get<int>(), j.at("rounds").get<int>());
  EXPECT_GT(j.at("rounds").get<int>(), 0);
  EXPECT_GE(j.at("peak_bytes_max").get<double>(), j.at("to").at("state_bytes_max").get<double>());
  EXPECT_GE(j.at("peak_above_bytes_max").get<double>(), 0);
  EXPECT_GT(j.at("predicted_s").get<double>(), 0);
  EXPECT_NEAR(j.at("predicted_s").get<double>(), j.at("network_s").get<double>() + j.at("local_s").get<double>(),
              1e-12);
  EXPECT_EQ(j.at("chunk_bytes").get<double>(), 32.0 * 1024 * 1024);  // half the default 64 MiB staging
  EXPECT_GE(j.at("planning_s").get<double>(), 0);
}

// Replicas that stay hold what they need: a dp shrink without ZeRO copies and sends nothing.
TEST(PlanSwitchCli, ReplicasThatStayOnlyCopy) {
  const nlohmann::json j = json_of("--world-from 4 --world-to 2 --set-from parallel.dp=4 --set-to parallel.dp=2 "
                                   "--hardware h100-sxm");
  ASSERT_FALSE(j.empty());
  EXPECT_EQ(j.at("bytes_moved"), 0);
  EXPECT_EQ(j.at("rounds"), 0);
  EXPECT_EQ(j.at("network_s").get<double>(), 0.0);
  // Both ranks copy all their state: the blocks' elements, less the padding of each unit's buffer to dp 2.
  const double held = 2 * j.at("to").at("state_bytes_max").get<double>();
  EXPECT_LE(j.at("bytes_local").get<double>(), held) << j.dump();
  EXPECT_GT(j.at("bytes_local").get<double>(), 0.99 * held) << j.dump();
}

// Smaller messages: as many bytes, more messages and rounds, a longer predicted time (more latencies).
TEST(PlanSwitchCli, SmallerBuffersCutMoreMessages) {
  const nlohmann::json big = json_of(kShrink), small = json_of(std::string(kShrink) + " --buffer-mb 0.0009765625");
  ASSERT_FALSE(big.empty());
  ASSERT_FALSE(small.empty());
  EXPECT_EQ(small.at("chunk_bytes").get<double>(), 512.0);  // half the staging
  EXPECT_EQ(small.at("bytes_moved"), big.at("bytes_moved"));
  EXPECT_GT(small.at("messages").get<int>(), big.at("messages").get<int>());
  EXPECT_GT(small.at("rounds").get<int>(), big.at("rounds").get<int>());
  EXPECT_GT(small.at("network_s").get<double>(), big.at("network_s").get<double>());
  // One process to a host: every message crosses the slower inter-node link.
  const nlohmann::json spread = json_of(std::string(kShrink) + " --ranks-per-host 1");
  EXPECT_GT(spread.at("network_s").get<double>(), big.at("network_s").get<double>());
}

TEST(PlanSwitchCli, TextNamesTheStrategiesAndTheParts) {
  const RunResult r = run(plan_switch(kShrink));
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* s : {"tp1 pp1 dp4 zero1", "tp1 pp1 dp2 zero3", "4 processes (the first 2 in both layouts)",
                        "above max(before, after)", "over the network", "copied locally", "21 blocks", "rounds",
                        "messages of at most 32.00 MiB", "predicted switch", "local copies"})
    EXPECT_NE(r.output.find(s), std::string::npos) << "no \"" << s << "\" in:\n" << r.output;
}

TEST(PlanSwitchCli, Refusals) {
  const std::string worlds = "--world-from 2 --world-to 2 --set-from parallel.dp=2 --set-to parallel.pp=2 ";
  RunResult r = run(plan_switch(worlds + "--set-to model.d_model=32 --hardware h100-sxm"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("different models: model.d_model is 64 in FROM"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tiny.yaml:5:3"), std::string::npos) << "where FROM sets it: " << r.output;
  EXPECT_NE(r.output.find("32 in TO"), std::string::npos) << r.output;

  r = run(plan_switch("--world-from 3 --world-to 2 --set-from parallel.dp=2 --set-to parallel.pp=2 --hardware h100-sxm"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("FROM"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--world-from 3"), std::string::npos) << r.output;

  r = run(plan_switch(worlds));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--hardware NAME"), std::string::npos) << r.output;

  r = run(plan_switch(worlds + "--hardware h900"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("h100-sxm"), std::string::npos) << "the message lists the known names: " << r.output;

  r = run(plan_switch(worlds + "--hardware h100-sxm --buffer-mb 0"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--buffer-mb"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace piper::e2e
