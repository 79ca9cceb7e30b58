// test_training.cpp — end-to-end training: the loss falls, runs are
// reproducible, and splitting the batch into microbatches changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "e2e/e2e_util.hpp"

namespace piper::e2e {
namespace {

std::string train_cmd(const std::string& extra) {
  return piper() + " train " + source("config/tiny.yaml") + " --quiet --set data.path=" + corpus() +
         " " + extra;
}

// The tiny config trains 200 steps; the loss falls at least 30% from step 0.
TEST(Training, TinyLossFalls) {
  TempDir tmp("loss");
  auto r = run(train_cmd("--metrics " + tmp.file("m.jsonl")));
  ASSERT_EQ(r.code, 0) << r.output;
  auto rows = read_metrics(tmp.file("m.jsonl"));
  ASSERT_EQ(rows.size(), 200u);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i]["step"].get<int64_t>(), static_cast<int64_t>(i));
  const double first = rows.front()["loss"], last = rows.back()["loss"];
  const double drop = 1.0 - last / first;
  std::printf("[ e2e ] loss %.4f -> %.4f: fell %.1f%% (need >= 30%%)\n", first, last, 100 * drop);
  EXPECT_GE(drop, 0.30);
  for (const auto& row : rows) {
    for (const char* key : {"loss", "grad_norm", "lr", "tokens_per_s", "step_ms"}) {
      ASSERT_TRUE(row.contains(key)) << key;
      EXPECT_TRUE(std::isfinite(row[key].get<double>())) << key;
    }
  }
}

// A model with MoE blocks reports its routing every step: the balance loss (1 for uniform
// routing) and the tokens-per-expert spread, between 1 (balanced) and n_experts / top_k (collapse);
// at ep 2 over the same batch, the same figures. A model without MoE blocks reports neither.
TEST(Training, MoeRoutingInTheMetrics) {
  TempDir tmp("moe-metrics");
  const std::string cmd = piper() + " train " + source("config/tiny-moe.yaml") + " --quiet --set data.path=" + corpus() +
                          " --set train.steps=20 --set train.threads=1 --metrics ";
  auto one = run(cmd + tmp.file("one.jsonl"));
  ASSERT_EQ(one.code, 0) << one.output;
  auto two = run("mpirun --oversubscribe --allow-run-as-root -np 2 " + cmd + tmp.file("two.jsonl") +
                 " --set parallel.dp=2 --set parallel.ep=2");
  ASSERT_EQ(two.code, 0) << two.output;
  const auto a = read_metrics(tmp.file("one.jsonl")), b = read_metrics(tmp.file("two.jsonl"));
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), a.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].contains("moe_balance_loss") && a[i].contains("moe_expert_spread")) << a[i].dump();
    const double balance = a[i]["moe_balance_loss"], spread = a[i]["moe_expert_spread"];
    EXPECT_GT(balance, 0.5) << "step " << i;
    EXPECT_LT(balance, 4.0) << "step " << i;  // at most n_experts
    EXPECT_GE(spread, 1.0) << "step " << i;
    EXPECT_LE(spread, 2.0) << "step " << i;  // n_experts / top_k = 4 / 2
    EXPECT_EQ(spread, b[i]["moe_expert_spread"].get<double>()) << "step " << i;  // whole rows: exact
    worst = std::max(worst, std::fabs(balance - b[i]["moe_balance_loss"].get<double>()) / balance);
  }
  std::printf("[ e2e ] moe routing: balance %.4f -> %.4f, spread %.3f -> %.3f; ep 2 vs 1 rank balance rel err %.1e "
              "(tol 1e-6)\n",
              a.front()["moe_balance_loss"].get<double>(), a.back()["moe_balance_loss"].get<double>(),
              a.front()["moe_expert_spread"].get<double>(), a.back()["moe_expert_spread"].get<double>(), worst);
  EXPECT_LE(worst, 1e-6);
  auto dense = run(train_cmd("--set train.steps=2 --metrics " + tmp.file("dense.jsonl")));
  ASSERT_EQ(dense.code, 0) << dense.output;
  for (const auto& row : read_metrics(tmp.file("dense.jsonl"))) EXPECT_FALSE(row.contains("moe_balance_loss"));
}

// The same config twice: bit-identical losses, gradient norms and parameters.
TEST(Training, BitIdenticalRuns) {
  TempDir tmp("bits");
  for (const char* tag : {"a", "b"}) {
    auto r = run(train_cmd(std::string("--set train.steps=8 --metrics ") + tmp.file(std::string(tag) + ".jsonl") +
                           " --dump-final " + tmp.file(std::string(tag) + ".prm")));
    ASSERT_EQ(r.code, 0) << r.output;
  }
  auto a = read_metrics(tmp.file("a.jsonl")), b = read_metrics(tmp.file("b.jsonl"));
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << i;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>()) << "step " << i;
  }
  auto pa = read_params(tmp.file("a.prm")), pb = read_params(tmp.file("b.prm"));
  ASSERT_FALSE(pa.empty());
  EXPECT_EQ(pa, pb);
}

// One global batch of 8 split into 1, 2 and 4 microbatches: the same losses
// and final parameters to 1e-5 relative.
TEST(Training, MicrobatchSplitInvariance) {
  TempDir tmp("split");
  std::vector<std::vector<nlohmann::json>> metrics;
  std::vector<std::map<std::string, std::vector<float>>> params;
  for (int mb : {1, 2, 4}) {
    const std::string tag = std::to_string(mb);
    auto r = run(train_cmd("--set train.steps=10 --set parallel.microbatches=" + tag + " --metrics " +
                           tmp.file(tag + ".jsonl") + " --dump-final " + tmp.file(tag + ".prm")));
    ASSERT_EQ(r.code, 0) << r.output;
    metrics.push_back(read_metrics(tmp.file(tag + ".jsonl")));
    params.push_back(read_params(tmp.file(tag + ".prm")));
  }
  constexpr double kTol = 1e-5;
  for (size_t k = 1; k < metrics.size(); ++k) {
    ASSERT_EQ(metrics[k].size(), metrics[0].size());
    double worst_loss = 0;
    for (size_t i = 0; i < metrics[0].size(); ++i) {
      const double x = metrics[0][i]["loss"], y = metrics[k][i]["loss"];
      worst_loss = std::max(worst_loss, std::fabs(x - y) / std::fabs(x));
    }
    // Per tensor: ||got - ref|| / ||ref||.
    double worst_param = 0;
    std::string worst_name;
    ASSERT_EQ(params[k].size(), params[0].size());
    for (const auto& [name, ref] : params[0]) {
      const auto& got = params[k].at(name);
      ASSERT_EQ(got.size(), ref.size()) << name;
      double diff = 0, norm = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        diff += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
        norm += double(ref[i]) * ref[i];
      }
      const double err = std::sqrt(diff / std::max(norm, 1e-30));
      if (err > worst_param) worst_param = err, worst_name = name;
    }
    std::printf("[ e2e ] microbatches %d vs 1: worst loss rel err %.3e, worst param rel err %.3e "
                "(%s) (tol %.0e)\n",
                k == 1 ? 2 : 4, worst_loss, worst_param, worst_name.c_str(), kTol);
    EXPECT_LE(worst_loss, kTol);
    EXPECT_LE(worst_param, kTol);
  }
}

// Under mpirun with one rank, as `make run` launches it.
TEST(Training, RunsUnderMpirun) {
  TempDir tmp("mpirun");
  auto r = run("mpirun --oversubscribe --allow-run-as-root -np 1 " +
               train_cmd("--set train.steps=3 --metrics " + tmp.file("m.jsonl")));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_metrics(tmp.file("m.jsonl")).size(), 3u);
  EXPECT_NE(r.output.find("summary:"), std::string::npos) << r.output;
}

// A text sample is printed when train.sample_every is set.
TEST(Training, PrintsSamples) {
  auto r = run(train_cmd("--set train.steps=4 --set train.sample_every=2 --set train.sample_tokens=16"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("sample @ step 1:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sample @ step 3:"), std::string::npos) << r.output;
}

// Under ZeRO-3 a sample computes with the shards gathered over the data-parallel group (every rank joins the
// gathers, rank 0 prints): the same text as ZeRO-2, whose values are the same bits whole on every rank.
TEST(Training, SamplesUnderZero3GatherTheValuesFirst) {
  std::string samples[2];
  for (int zero : {2, 3}) {
    auto r = run("mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2 " +
                 train_cmd("--set train.steps=3 --set parallel.dp=2 --set parallel.zero=" + std::to_string(zero) +
                           " --set train.sample_every=1 --set train.sample_tokens=24"));
    ASSERT_EQ(r.code, 0) << "ZeRO-" << zero << ": " << r.output;
    std::string& s = samples[zero - 2];
    for (size_t at = r.output.find("sample @ step "); at != std::string::npos; at = r.output.find("sample @ step ", at + 1))
      s += r.output.substr(at, r.output.find('\n', at) - at) + "\n";
    EXPECT_NE(s.find("sample @ step 2: \"The"), std::string::npos) << "ZeRO-" << zero << ": " << r.output;
  }
  EXPECT_EQ(samples[1], samples[0]);
}

}  // namespace
}  // namespace piper::e2e
