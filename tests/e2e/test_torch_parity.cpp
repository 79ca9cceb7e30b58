// test_torch_parity.cpp — piper against an independent implementation of the
// same model: PyTorch eager (bench/torch_peer.py) starts from piper's initial
// parameters, trains on the same data order with torch.optim.AdamW, and must
// produce the same losses, gradient norms and learning rates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "e2e/e2e_util.hpp"

namespace piper::e2e {
namespace {

TEST(TorchParity, SameLossesAsPyTorch) {
  constexpr int kSteps = 30;  // warmup (10) and part of the cosine
  constexpr double kLossTol = 1e-5, kNormTol = 1e-4;
  TempDir tmp("torch");
  const std::string steps = std::to_string(kSteps);
  auto p = run(piper() + " train " + source("config/tiny.yaml") + " --quiet --set data.path=" + corpus() +
               " --set train.steps=" + steps + " --dump-init " + tmp.file("init.prm") + " --metrics " +
               tmp.file("piper.jsonl"));
  ASSERT_EQ(p.code, 0) << p.output;
  auto t = run("/usr/bin/python3 " + source("bench/torch_peer.py") + " --parity " + tmp.file("init.prm") +
               " --config " + source("config/tiny.yaml") + " --tokens " + corpus() + " --steps " + steps +
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
  std::printf("[ torch ] %d steps: worst loss rel err %.2e (tol %.0e), grad norm %.2e (tol %.0e), lr %.2e\n", kSteps,
              loss_err, kLossTol, norm_err, kNormTol, lr_err);
  EXPECT_LE(loss_err, kLossTol);
  EXPECT_LE(norm_err, kNormTol);
  EXPECT_LE(lr_err, 1e-12);
}

}  // namespace
}  // namespace piper::e2e
