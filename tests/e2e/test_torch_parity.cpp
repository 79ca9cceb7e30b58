// test_torch_parity.cpp — piper against an independent implementation of the
// same model: PyTorch eager (bench/torch_peer.py) starts from piper's initial
// parameters, trains on the same data order with torch.optim.AdamW, and must
// produce the same losses, gradient norms and learning rates, with and without
// MoE blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "e2e/e2e_util.hpp"

namespace piper::e2e {
namespace {

// Trains `config` for kSteps in piper and in the peer from piper's initial parameters; the
// losses and gradient norms must agree to kLossTol / kNormTol relative, the learning rates to
// rounding.
void expect_torch_parity(const std::string& config) {
  constexpr int kSteps = 30;  // warmup (10) and part of the cosine
  constexpr double kLossTol = 1e-5, kNormTol = 1e-4;
  TempDir tmp("torch");
  const std::string steps = std::to_string(kSteps);
  auto p = run(piper() + " train " + source(config) + " --quiet --set data.path=" + corpus() +
               " --set train.steps=" + steps + " --dump-init " + tmp.file("init.prm") + " --metrics " +
               tmp.file("piper.jsonl"));
  ASSERT_EQ(p.code, 0) << p.output;
  auto t = run("/usr/bin/python3 " + source("bench/torch_peer.py") + " --parity " + tmp.file("init.prm") +
               " --config " + source(config) + " --tokens " + corpus() + " --steps " + steps +
               " --schedule-steps " + steps + " --threads 2 > " + tmp.file("torch.jsonl"));
  ASSERT_EQ(t.code, 0) << t.output;
  const auto a = read_metrics(tmp.file("piper.jsonl"));
  std::vector<nlohmann::json> b;
  for (const auto& row : read_metrics(tmp.file("torch.jsonl")))
    if (row.contains("loss")) b.push_back(row);
  ASSERT_EQ(a.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(b.size(), a.size());
  double loss_err = 0, norm_err = 0, lr_err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    loss_err = std::max(loss_err, std::fabs(a[i]["loss"].get<double>() - b[i]["loss"].get<double>()) /
                                      a[i]["loss"].get<double>());
    norm_err = std::max(norm_err, std::fabs(a[i]["grad_norm"].get<double>() - b[i]["grad_norm"].get<double>()) /
                                      a[i]["grad_norm"].get<double>());
    lr_err = std::max(lr_err, std::fabs(a[i]["lr"].get<double>() - b[i]["lr"].get<double>()) / a[i]["lr"].get<double>());
  }
  std::printf("[ torch ] %s, %d steps: worst loss rel err %.2e (tol %.0e), grad norm %.2e (tol %.0e), lr %.2e\n",
              config.c_str(), kSteps, loss_err, kLossTol, norm_err, kNormTol, lr_err);
  EXPECT_LE(loss_err, kLossTol);
  EXPECT_LE(norm_err, kNormTol);
  EXPECT_LE(lr_err, 1e-12);
}

TEST(TorchParity, SameLossesAsPyTorch) { expect_torch_parity("config/tiny.yaml"); }

// MoE blocks ("ME*-E": 4 experts, top 2): routing, dropless experts and the balance loss.
TEST(TorchParity, SameLossesAsPyTorchWithMoE) { expect_torch_parity("config/tiny-moe.yaml"); }

}  // namespace
}  // namespace piper::e2e
