// test_cli.cpp — the command line: help, plan output, prepare, and a table of
// bad inputs, each refused with its message and exit code 2 before any work.
#include <gtest/gtest.h>

#include "e2e/e2e_util.hpp"

namespace piper::e2e {
namespace {

TEST(Cli, HelpForEveryCommand) {
  for (const char* sub : {"", "train", "plan", "prepare"}) {
    auto r = run(piper() + " " + sub + " --help");
    EXPECT_EQ(r.code, 0) << sub << "\n" << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << sub << "\n" << r.output;
  }
}

TEST(Cli, PlanPrintsDagAndProgram) {
  auto r = run(piper() + " plan " + source("config/tiny.yaml") + " --set parallel.microbatches=2");
  ASSERT_EQ(r.code, 0) << r.output;
  // tiny: 5 blocks + embed + head = 7 units; 2 microbatches.
  EXPECT_NE(r.output.find("FWD=14"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("BWD=14"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("UPD=7"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("plan hash"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("FWD            layers.0     mb1"), std::string::npos) << r.output;
  auto d = run(piper() + " plan " + source("config/tiny.yaml") + " --directives");
  ASSERT_EQ(d.code, 0) << d.output;
  EXPECT_NE(d.output.find("split: {microbatches: 1}"), std::string::npos) << d.output;
  EXPECT_NE(d.output.find("order:  # 1f1b, op by op\n      ranks:\n        - [F0, B0]\n"), std::string::npos) << d.output;
}

TEST(Cli, PrepareWritesTokenFile) {
  TempDir tmp("prepare");
  tmp.write("a.txt", "hello piper\n");
  auto r = run(piper() + " prepare -o " + tmp.file("a.tok") + " " + tmp.file("a.txt"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote"), std::string::npos) << r.output;
  auto bad = run(piper() + " prepare -o " + tmp.file("b.tok") + " " + tmp.file("missing.txt"));
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("missing.txt"), std::string::npos) << bad.output;
}

struct BadCase {
  const char* name;
  const char* yaml;    // written to bad.yaml (nullptr: use the tiny config)
  const char* extra;   // more arguments
  std::vector<std::string> expect;  // substrings of the message
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInput, RefusedWithMessage) {
  const BadCase& c = GetParam();
  TempDir tmp(std::string("bad-") + c.name);
  // A malformed token file for the data cases.
  tmp.write("garbage.tok", "this is not a token file at all, just text long enough for a header");
  std::string cfg = c.yaml ? tmp.write("bad.yaml", c.yaml) : source("config/tiny.yaml");
  std::string extra = c.extra;
  for (size_t p; (p = extra.find("@TMP@")) != std::string::npos;) extra.replace(p, 5, tmp.file(""));
  const std::string cmd = piper() + " train " + cfg + " --set data.path=" + corpus() + " " + extra;
  auto r = run(cmd);
  std::printf("[ cli ] %s -> exit %d: %s", c.name, r.code, r.output.c_str());
  EXPECT_EQ(r.code, 2) << cmd;
  for (const auto& s : c.expect) EXPECT_NE(r.output.find(s), std::string::npos) << "missing '" << s << "'";
  EXPECT_EQ(r.output.find("step "), std::string::npos) << "training started";
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos);
  EXPECT_EQ(r.output.find("Aborted"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadInput,
    ::testing::Values(
        BadCase{"syntax", "model:\n  d_model: [64\ntrain:\n  steps: 3\n", "", {"bad.yaml:3:6", "YAML syntax error"}},
        BadCase{"unknown_key", "model:\n  d_modle: 64\n", "", {"bad.yaml:2:3", "d_modle", "did you mean 'd_model'"}},
        BadCase{"unknown_section", "modle:\n  d_model: 64\n", "", {"bad.yaml:1:1", "modle"}},
        BadCase{"wrong_type", "train:\n  steps: many\n", "", {"bad.yaml:2:10", "train.steps", "expected an integer"}},
        BadCase{"heads_divide_width", "model:\n  d_model: 64\n  n_heads: 5\n  n_kv_heads: 5\n", "",
                {"d_model", "n_heads", "bad.yaml:3"}},
        BadCase{"kv_heads_divide_heads", "model:\n  n_heads: 8\n  n_kv_heads: 3\n", "", {"n_kv_heads", "n_heads"}},
        BadCase{"inner_divides_head_dim", "model:\n  d_model: 64\n  head_dim: 24\n", "", {"head_dim", "d_inner"}},
        BadCase{"groups_divide_heads", "model:\n  d_model: 64\n  head_dim: 16\n  n_groups: 3\n", "", {"n_groups"}},
        BadCase{"moe_without_keys", "model:\n  pattern: \"M-E\"\n", "",
                {"bad.yaml:2:3: model.n_experts: not given", "MoE blocks", "set model.n_experts"}},
        BadCase{"bad_symbol", "model:\n  pattern: \"M-X\"\n", "", {"model.pattern", "'X'"}},
        BadCase{"dp_refused", nullptr, "--set parallel.dp=2", {"world size 1", "dp(2)", "parallel.dp=2"}},
        BadCase{"batch_split", nullptr, "--set parallel.microbatches=3", {"global_batch", "microbatches"}},
        BadCase{"bad_schedule", nullptr, "--set parallel.schedule=fast", {"parallel.schedule", "fast", "1f1b"}},
        BadCase{"bad_override", nullptr, "--set train.steps", {"--set train.steps", "key=value"}},
        BadCase{"missing_tokens", nullptr, "--set data.path=/nonexistent/corpus.tok",
                {"data.path", "/nonexistent/corpus.tok", "No such file"}},
        BadCase{"malformed_tokens", nullptr, "--set data.path=@TMP@garbage.tok",
                {"data.path", "garbage.tok", "not a piper token file"}},
        BadCase{"vocab_too_small", nullptr, "--set model.vocab_size=100", {"vocab", "256", "100"}}),
    [](const ::testing::TestParamInfo<BadCase>& p) { return std::string(p.param.name); });

// A config file that does not exist.
TEST(Cli, MissingConfigFile) {
  auto r = run(piper() + " train /nonexistent/run.yaml");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/run.yaml"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("No such file"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace piper::e2e
