// test_tune.cpp — `piper tune` end to end: the config it writes plans, verifies and trains as it
// is, a tuned strategy with a partition other than equal blocks gives the single-rank losses, the
// same input writes the same file, and its refusals exit 2 naming what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "e2e/e2e_util.hpp"

namespace piper::e2e {
namespace {

// A hybrid whose units differ in cost (two Mamba-2 blocks, attention, three MLPs, one MoE); three
// heads, so tensor parallelism over 2 ranks is out and 2 ranks run a pipeline or replicas.
const std::string kModel =
    "model:\n"
    "  pattern: \"MM*---E\"\n"
    "  d_model: 48\n"
    "  n_heads: 3\n"
    "  n_kv_heads: 1\n"
    "  ffn_hidden: 96\n"
    "  d_state: 16\n"
    "  head_dim: 16\n"
    "  n_groups: 1\n"
    "  n_experts: 4\n"
    "  top_k: 2\n"
    "  moe_ffn_hidden: 64\n"
    "train:\n"
    "  global_batch: 1\n"
    "  seq_len: 32\n"
    "  steps: 3\n"
    "  threads: 1\n";

std::string read(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<double> losses(const std::string& metrics) {
  std::vector<double> out;
  for (const auto& row : read_metrics(metrics)) out.push_back(row["loss"].get<double>());
  return out;
}

std::string tune_cmd(const std::string& cfg, const std::string& out, const std::string& more = "") {
  return piper() + " tune " + cfg + " --world 2 --hardware h100-sxm --quiet -o " + out + " " + more;
}

// The tuned config trains as it is on 2 ranks, with the losses of one rank (1e-5 relative), and
// its partition is not Megatron's equal blocks; tuning again writes the same bytes.
TEST(Tune, TunedConfigTrainsWithTheSingleRankLosses) {
  TempDir tmp("tune");
  const std::string cfg = tmp.write("model.yaml", kModel + "data:\n  path: " + corpus() + "\n");
  const std::string out = tmp.file("tuned.yaml"), again = tmp.file("again.yaml");
  auto t = run(tune_cmd(cfg, out, "--json"));
  ASSERT_EQ(t.code, 0) << t.output;
  const nlohmann::json j = nlohmann::json::parse(t.output.substr(t.output.find('{')));
  const auto& chosen = j["chosen"];
  std::printf("chosen: %s, stages %s\n", chosen["label"].get<std::string>().c_str(),
              chosen["stage_of_unit"].dump().c_str());
  ASSERT_EQ(chosen["pp"].get<int>(), 2) << t.output;
  // Equal blocks: 7 blocks over 2 stages is 4 + 3, the embedding first, the head last.
  const std::vector<int> uniform = {0, 0, 0, 0, 0, 1, 1, 1, 1};
  EXPECT_NE(chosen["stage_of_unit"].get<std::vector<int>>(), uniform)
      << "the balanced partition is the uniform one: this model no longer shows the difference";
  EXPECT_LE(chosen["peak_mem_bytes"].get<double>(), j["mem_limit_bytes"].get<double>());
  auto t2 = run(tune_cmd(cfg, again));
  ASSERT_EQ(t2.code, 0) << t2.output;
  EXPECT_EQ(read(out), read(again)) << "the same input wrote different configs";

  auto plan = run(piper() + " plan " + out + " --world 2");
  ASSERT_EQ(plan.code, 0) << plan.output;
  const std::string m1 = tmp.file("one.jsonl"), m2 = tmp.file("two.jsonl");
  auto one = run(piper() + " train " + cfg + " --quiet --metrics " + m1);
  ASSERT_EQ(one.code, 0) << one.output;
  auto two = run("mpirun --oversubscribe --allow-run-as-root -np 2 " + piper() + " train " + out +
                 " --quiet --metrics " + m2);
  ASSERT_EQ(two.code, 0) << read(out) << "\n" << two.output;
  const std::vector<double> a = losses(m1), b = losses(m2);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double rel = std::abs(a[i] - b[i]) / std::abs(a[i]);
    std::printf("step %zu: 1 rank %.7f, tuned 2 ranks %.7f, relative error %.2e (tolerance 1e-5)\n", i + 1, a[i], b[i],
                rel);
    EXPECT_LE(rel, 1e-5);
  }
}

TEST(Tune, RefusalsExitTwoNamingWhatIsWrong) {
  TempDir tmp("tune-refusals");
  const std::string cfg = tmp.write("model.yaml", kModel);
  const std::string out = tmp.file("out.yaml");
  // A cost file with the Mamba-2 block only.
  const std::string cost = tmp.write(
      "cost.json",
      "{\"source\": \"manual\", \"ops\": [{\"kind\": \"M\", \"tp\": 1, \"f\": {\"a\": 1, \"b\": 0}, "
      "\"b\": {\"a\": 2, \"b\": 0}, \"bi\": {\"a\": 1, \"b\": 0}, \"bw\": {\"a\": 1, \"b\": 0}}], \"free_comm\": true}");
  struct Case {
    std::string args, expect;
  };
  for (const Case& c : {
           Case{"--world 2 --cost " + cost + " --mem-gib 1",
                "has no entry for unit kind(s) '*', '-', 'E', 'e', 'h', which " + cfg},
           Case{"--world 2 --cost " + cost, "give --mem-gib X"},
           Case{"--world 2 --hardware h100-sxm --mem-gib 0.000001", "no strategy fits the memory limit of 2 KiB"},
           Case{"--world 16 --hardware h100-sxm", "no valid grid for 16 ranks"},
           Case{"--world 2", "give one of --cost FILE"},
       }) {
    auto r = run(piper() + " tune " + cfg + " --quiet -o " + out + " " + c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace piper::e2e
