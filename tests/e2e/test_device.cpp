// test_device.cpp — training on a device the host cannot address: train.device=cpu_detached runs the
// CPU kernels on memory whose pointers fault when the host dereferences them, so every path of the
// runtime that touched device memory directly would crash here. It must give the CPU run's numbers bit
// for bit, under data, tensor, pipeline, expert parallelism and ZeRO-3, with samples, held-out loss and
// checkpoints written on one device and resumed on the other.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>

#include "e2e/e2e_util.hpp"

namespace piper::e2e {
namespace {

constexpr int kSteps = 6, kSaveAt = 3;

std::string train(int np, const std::string& device, const std::string& sets, const std::string& config) {
  return (np > 1 ? "mpirun --oversubscribe --allow-run-as-root -np " + std::to_string(np) + " " : std::string()) +
         piper() + " train " + source(config) + " --quiet --set data.path=" + corpus() +
         " --set train.threads=1 --set train.device=" + device + " " + sets;
}

struct Strategy {
  const char* name;
  int np;
  const char* config;
  const char* sets;
};
void PrintTo(const Strategy& s, std::ostream* os) { *os << s.name; }

class Detached : public ::testing::TestWithParam<Strategy> {};

// The same run on cpu and cpu_detached: equal losses, gradient norms, held-out losses and final parameters;
// then each device resumes the other's step-3 checkpoint and continues with the uninterrupted run's losses.
TEST_P(Detached, TrainsAndResumesBitForBitAsTheCpu) {
  const Strategy& s = GetParam();
  TempDir tmp(std::string("device-") + s.name);
  const std::string common = std::string(s.sets) + " --set train.steps=" + std::to_string(kSteps) +
                             " --set data.eval_fraction=0.05 --set train.eval_every=3 --set train.eval_batches=1" +
                             " --set checkpoint.every=" + std::to_string(kSaveAt);
  for (const char* device : {"cpu", "cpu_detached"}) {
    const std::string d = device;
    auto r = run(train(s.np, d, common + " --set checkpoint.dir=" + tmp.file(d + ".ckpt") + " --metrics " +
                                    tmp.file(d + ".jsonl") + " --dump-final " + tmp.file(d + ".prm"),
                       s.config));
    ASSERT_EQ(r.code, 0) << device << ":\n" << r.output;
  }
  const auto cpu = read_metrics(tmp.file("cpu.jsonl")), det = read_metrics(tmp.file("cpu_detached.jsonl"));
  ASSERT_EQ(cpu.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(det.size(), cpu.size());
  int evals = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_EQ(det[i]["loss"].get<double>(), cpu[i]["loss"].get<double>()) << "step " << i;
    EXPECT_EQ(det[i]["grad_norm"].get<double>(), cpu[i]["grad_norm"].get<double>()) << "step " << i;
    if (cpu[i].contains("eval_loss")) {
      ++evals;
      EXPECT_EQ(det[i]["eval_loss"].get<double>(), cpu[i]["eval_loss"].get<double>()) << "step " << i;
    }
  }
  EXPECT_EQ(evals, 2);
  const auto pc = read_params(tmp.file("cpu.prm")), pd = read_params(tmp.file("cpu_detached.prm"));
  ASSERT_FALSE(pc.empty());
  EXPECT_TRUE(pc == pd) << "final parameters differ between cpu and cpu_detached";

  // Each device resumes the other's checkpoint of step 3.
  char saved[32];
  std::snprintf(saved, sizeof saved, "/step_%08d.h5", kSaveAt);
  for (const auto& [device, from] : {std::pair<std::string, std::string>{"cpu_detached", "cpu"}, {"cpu", "cpu_detached"}}) {
    const std::string file = tmp.file("resume-" + device + ".jsonl");
    auto r = run(train(s.np, device, common + " --set checkpoint.dir=" + tmp.file("again-" + device) + " --resume " +
                                         tmp.file(from + ".ckpt") + saved + " --metrics " + file,
                       s.config));
    ASSERT_EQ(r.code, 0) << device << " from " << from << ":\n" << r.output;
    const auto rows = read_metrics(file);
    ASSERT_EQ(rows.size(), static_cast<size_t>(kSteps - kSaveAt)) << device;
    for (const auto& row : rows) {
      const auto step = static_cast<size_t>(row["step"].get<int64_t>());
      EXPECT_EQ(row["loss"].get<double>(), cpu.at(step)["loss"].get<double>()) << device << " step " << step;
    }
  }
  std::printf("[ device ] %-24s cpu_detached = cpu over %d steps, %d evaluations, %zu tensors, both resumes\n", s.name,
              kSteps, evals, pc.size());
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, Detached,
    ::testing::Values(Strategy{"single", 1, "config/tiny.yaml", "--set train.sample_every=3 --set train.sample_tokens=8"},
                      Strategy{"tp2_vocab_parallel", 2, "config/tiny.yaml", "--set parallel.tp=2"},
                      Strategy{"pp2", 2, "config/tiny.yaml",
                               "--set parallel.pp=2 --set parallel.microbatches=2"},
                      Strategy{"moe_dp2_ep2_zero3", 2, "config/tiny-moe.yaml",
                               "--set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=3"}),
    [](const ::testing::TestParamInfo<Strategy>& p) { return std::string(p.param.name); });

// An online switch (dp 2 ZeRO-1 -> tp 2 at step 3) moves the state between two runtimes on the device, through
// host staging on cpu_detached: the same losses and final parameters as on the cpu.
TEST(Device, DetachedSwitchesStrategyAsTheCpu) {
  TempDir tmp("device-switch");
  const std::string config = tmp.write("switch.yaml", read_text(source("config/tiny.yaml")) +
                                                          "\nswitch:\n  - {at_step: 3, world: 2, parallel: {dp: 1, tp: 2, zero: 0}}\n");
  for (const char* device : {"cpu", "cpu_detached"}) {
    const std::string d = device;
    auto r = run("mpirun --oversubscribe --allow-run-as-root -np 2 " + piper() + " train " + config +
                 " --quiet --set data.path=" + corpus() + " --set train.threads=1 --set train.steps=6 --set train.device=" +
                 d + " --set parallel.dp=2 --set parallel.zero=1 --metrics " + tmp.file(d + ".jsonl") +
                 " --dump-final " + tmp.file(d + ".prm"));
    ASSERT_EQ(r.code, 0) << device << ":\n" << r.output;
  }
  // The steps' rows, and the switch's event row between them.
  const auto steps = [](const std::vector<nlohmann::json>& rows) {
    std::vector<double> loss;
    int switches = 0;
    for (const auto& r : rows) {
      if (!r.contains("event"))
        loss.push_back(r["loss"]);
      else if (r["event"] == "switch")
        ++switches;
    }
    EXPECT_EQ(switches, 1);
    return loss;
  };
  const auto cpu = steps(read_metrics(tmp.file("cpu.jsonl"))), det = steps(read_metrics(tmp.file("cpu_detached.jsonl")));
  ASSERT_EQ(cpu.size(), 6u);
  EXPECT_EQ(det, cpu);
  EXPECT_TRUE(read_params(tmp.file("cpu.prm")) == read_params(tmp.file("cpu_detached.prm")));
}

// The device throughput benchmark (bench/device_train, what scripts/gpu-check.sh runs on the 1B hybrid) trains
// one rank without MPI and reports one JSON line.
TEST(Device, ThroughputBenchmarkReportsOneLine) {
  auto r = run(std::string(PIPER_BINARY_DIR) + "/bench/device_train " + source("config/tiny-moe.yaml") +
               " --set train.device=cpu_detached --set train.threads=1 --warmup 1 --steps 2");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["device"], "cpu_detached");
  EXPECT_EQ(j["tokens_per_step"].get<double>(), 8.0 * 64);  // global_batch x seq_len
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["peak_bytes"].get<double>(), 0.0);
  EXPECT_TRUE(std::isfinite(j["loss_last"].get<double>()));
  auto bad = run(std::string(PIPER_BINARY_DIR) + "/bench/device_train " + source("config/tiny.yaml") + " --steps 0");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--steps"), std::string::npos) << bad.output;
}

// The op benchmark (bench/op_bench, what scripts/gpu-check.sh times the 1B hybrid's ops with) reports a line for
// each op of the model's blocks, at one microbatch's shapes, in the storage train.precision asks.
TEST(Device, OpBenchmarkReportsEachOpOfTheBlocks) {
  for (const char* precision : {"fp32", "bf16"}) {
    auto r = run(std::string(PIPER_BINARY_DIR) + "/bench/op_bench " + source("config/tiny.yaml") +
                 " --set train.device=cpu_detached --set train.precision=" + precision + " --runs 1 --batches 2 --warmup 0");
    ASSERT_EQ(r.code, 0) << r.output;
    std::vector<std::string> ops;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      ops.push_back(j["op"]);
      EXPECT_EQ(j["device"], "cpu_detached");
      EXPECT_EQ(j["storage"], std::string(precision) == "bf16" ? "bf16" : "f32") << line;
      EXPECT_GT(j["median_ms"].get<double>(), 0.0) << line;
      if (j["op"] == "attention_fwd") {
        EXPECT_EQ(j["shape"], nlohmann::json({8, 64, 4, 16}));  // [B, T, H, hd]
      }
    }
    const std::vector<std::string> want{
        "linear_fwd:in_proj", "linear_bwd_input:in_proj", "linear_bwd_weight:in_proj", "conv1d_fwd", "conv1d_bwd",
        "ssd_fwd", "ssd_bwd", "gated_rmsnorm_fwd", "gated_rmsnorm_bwd", "attention_fwd", "attention_bwd",
        "linear_fwd:mlp_up", "linear_bwd_input:mlp_up", "linear_bwd_weight:mlp_up"};
    EXPECT_EQ(ops, want) << r.output;
  }
  auto bad = run(std::string(PIPER_BINARY_DIR) + "/bench/op_bench " + source("config/tiny.yaml") + " --runs 0");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--runs"), std::string::npos) << bad.output;
}

// A checkpoint trained on one device generates on any: greedy text from a cpu_detached run's checkpoint is the
// same on cpu and on cpu_detached.
TEST(Device, GeneratesOnAnyDeviceFromACheckpointOfAnother) {
  TempDir tmp("device-generate");
  auto t = run(train(1, "cpu_detached", "--set train.steps=4 --set checkpoint.dir=" + tmp.file("ckpt"), "config/tiny.yaml"));
  ASSERT_EQ(t.code, 0) << t.output;
  std::string text[2];
  int i = 0;
  for (const char* device : {"cpu", "cpu_detached"}) {
    auto g = run(piper() + " generate " + tmp.file("ckpt") + " --prompt 'The ' --tokens 12 --temperature 0 --device " +
                 device);
    ASSERT_EQ(g.code, 0) << device << ":\n" << g.output;
    text[i++] = g.output;
  }
  EXPECT_EQ(text[0], text[1]);
  auto bad = run(piper() + " generate " + tmp.file("ckpt") + " --prompt 'The ' --device cuda");
  if (bad.code != 0) {
    EXPECT_NE(bad.output.find("--device"), std::string::npos) << bad.output;
  }
}

// The checkpoint of a bf16-products run holds the fp32 master weights: an fp32 run on another device resumes it
// at its step, and the bf16 run's losses stay within 1e-2 of an fp32 run's.
TEST(Device, Bf16ProductsCheckpointResumesUnderFp32) {
  TempDir tmp("device-bf16");
  auto a = run(train(1, "cpu_detached", "--set train.precision=bf16 --set train.steps=4 --set checkpoint.every=2 "
                                        "--set checkpoint.dir=" + tmp.file("ckpt") + " --metrics " + tmp.file("bf16.jsonl"),
                     "config/tiny.yaml"));
  ASSERT_EQ(a.code, 0) << a.output;
  auto f = run(train(1, "cpu", "--set train.steps=4 --metrics " + tmp.file("fp32.jsonl"), "config/tiny.yaml"));
  ASSERT_EQ(f.code, 0) << f.output;
  char saved[32];
  std::snprintf(saved, sizeof saved, "/step_%08d.h5", 2);
  auto b = run(train(1, "cpu", "--set train.steps=4 --resume " + tmp.file("ckpt") + saved + " --metrics " +
                                   tmp.file("resumed.jsonl"),
                     "config/tiny.yaml"));
  ASSERT_EQ(b.code, 0) << b.output;
  const auto bf = read_metrics(tmp.file("bf16.jsonl")), fp = read_metrics(tmp.file("fp32.jsonl")),
             re = read_metrics(tmp.file("resumed.jsonl"));
  ASSERT_EQ(bf.size(), 4u);
  ASSERT_EQ(re.size(), 2u);
  EXPECT_EQ(re.front()["step"].get<int64_t>(), 2);
  double worst = 0;
  for (size_t i = 0; i < bf.size(); ++i)
    worst = std::max(worst, std::fabs(bf[i]["loss"].get<double>() - fp[i]["loss"].get<double>()) / fp[i]["loss"].get<double>());
  std::printf("[ device ] bf16 products vs fp32 over 4 steps: worst loss rel err %.2e (tol 1e-2); fp32 resumed at step 2\n",
              worst);
  EXPECT_LE(worst, 1e-2);
  EXPECT_GT(worst, 0.0);
}

// A device this machine lacks is refused before training, naming the key and why; an unknown one too.
TEST(Device, AMissingOrUnknownDeviceIsRefusedSayingWhy) {
  auto r = run(train(1, "cuda", "--set train.steps=1", "config/tiny.yaml"));
  if (r.code == 0) {
    std::printf("[ device ] this machine has a CUDA device: train.device=cuda trained\n");
  } else {
    EXPECT_NE(r.output.find("no CUDA device"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("train.device"), std::string::npos) << r.output;
  }
  auto bad = run(train(1, "tpu", "--set train.steps=1", "config/tiny.yaml"));
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("train.device"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace piper::e2e
