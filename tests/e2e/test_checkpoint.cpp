// test_checkpoint.cpp — checkpoints end to end: save under one strategy,
// resume under another (different world sizes too) with the losses of the
// uninterrupted run; signals checkpoint at a step boundary; a job killed while
// writing leaves the previous checkpoint intact and selected; corrupted,
// truncated and foreign files are refused with the file and the tensor named.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "e2e/e2e_util.hpp"

namespace piper::e2e {
namespace {

constexpr int kSteps = 12, kSaveAt = 6;
constexpr double kTol = 1e-5;

std::string mpi(int np) {
  return np > 1 ? "mpirun --oversubscribe --allow-run-as-root -np " + std::to_string(np) + " " : "";
}

std::string train(int np, const std::string& sets, const std::string& config = source("config/tiny.yaml")) {
  return mpi(np) + piper() + " train " + config + " --quiet --set data.path=" + corpus() +
         " --set train.threads=1 --set train.steps=" + std::to_string(kSteps) + " " + sets;
}

// The uninterrupted single-rank run of a config, once for the suite.
const std::vector<nlohmann::json>& reference(const std::string& config = source("config/tiny.yaml")) {
  static TempDir tmp("ckpt-ref");
  static std::map<std::string, std::vector<nlohmann::json>> rows;
  auto it = rows.find(config);
  if (it != rows.end()) return it->second;
  const std::string file = tmp.file("ref" + std::to_string(rows.size()) + ".jsonl");
  auto r = run(train(1, "--metrics " + file, config));
  EXPECT_EQ(r.code, 0) << r.output;
  return rows[config] = read_metrics(file);
}

// The worst relative loss error of a resumed run's steps against the uninterrupted run.
double worst_loss_error(const std::vector<nlohmann::json>& rows, const std::vector<nlohmann::json>& ref) {
  double worst = 0;
  for (const auto& r : rows) {
    const int64_t s = r["step"];
    worst = std::max(worst, std::fabs(r["loss"].get<double>() - ref.at(static_cast<size_t>(s))["loss"].get<double>()) /
                                ref.at(static_cast<size_t>(s))["loss"].get<double>());
  }
  return worst;
}

struct Pair {
  const char* name;
  int np_a;
  const char* a;
  int np_b;
  const char* b;
};
void PrintTo(const Pair& p, std::ostream* os) { *os << p.name; }

class Resume : public ::testing::TestWithParam<Pair> {};

// Save at step 6 under strategy A; resume under B; steps 6..11 equal the uninterrupted run.
TEST_P(Resume, UnderAnotherStrategy) {
  const Pair& p = GetParam();
  TempDir tmp(std::string("resume-") + p.name);
  const std::string dir = tmp.file("ckpt");
  auto a = run(train(p.np_a, std::string(p.a) + " --set checkpoint.dir=" + dir + " --set checkpoint.every=" +
                                 std::to_string(kSaveAt) + " --set train.steps=" + std::to_string(kSaveAt)));
  ASSERT_EQ(a.code, 0) << a.output;
  auto b = run(train(p.np_b, std::string(p.b) + " --resume " + dir + " --metrics " + tmp.file("b.jsonl")));
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_NE(b.output.find("resumed from"), std::string::npos) << b.output;
  const auto rows = read_metrics(tmp.file("b.jsonl"));
  ASSERT_EQ(rows.size(), static_cast<size_t>(kSteps - kSaveAt));
  const double worst = worst_loss_error(rows, reference());
  std::printf("[ resume ] %-34s steps %d..%d worst loss rel err %.2e (tol %.0e)\n", p.name, kSaveAt, kSteps - 1,
              worst, kTol);
  EXPECT_EQ(rows.front()["step"].get<int64_t>(), kSaveAt);
  EXPECT_LE(worst, kTol);
}

INSTANTIATE_TEST_SUITE_P(
    Pairs, Resume,
    ::testing::Values(
        Pair{"single_to_single", 1, "", 1, ""},
        Pair{"async_dp2_zero2_to_single", 2, "--set parallel.dp=2 --set parallel.zero=2 --set checkpoint.async=true", 1,
             ""},
        Pair{"single_to_dp2_zero3", 1, "", 2, "--set parallel.dp=2 --set parallel.zero=3"},
        Pair{"dp2_zero1_to_tp2_pp2", 2, "--set parallel.dp=2 --set parallel.zero=1", 4,
             "--set parallel.tp=2 --set parallel.pp=2 --set parallel.microbatches=2"},
        Pair{"tp2_to_pp2_zbh1", 2, "--set parallel.tp=2", 2,
             "--set parallel.pp=2 --set parallel.schedule=zbh1 --set parallel.microbatches=4"},
        Pair{"pp2_to_single", 2, "--set parallel.pp=2 --set parallel.microbatches=2", 1, ""},
        Pair{"dp4_zero2_to_dp2_zero0", 4, "--set parallel.dp=4 --set parallel.zero=2", 2, "--set parallel.dp=2"},
        Pair{"tp2dp2pp2_zero2_to_dp4_zero3", 8,
             "--set parallel.tp=2 --set parallel.dp=2 --set parallel.pp=2 --set parallel.zero=2 "
             "--set parallel.microbatches=2",
             4, "--set parallel.dp=4 --set parallel.zero=3"},
        Pair{"dualpipev_to_interleaved", 2,
             "--set parallel.pp=2 --set parallel.schedule=dualpipev --set parallel.microbatches=4", 2,
             "--set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 "
             "--set parallel.microbatches=2"},
        Pair{"pp4_gpipe_to_tp2_dp2_zero1", 4,
             "--set parallel.pp=4 --set parallel.schedule=gpipe --set parallel.microbatches=4", 4,
             "--set parallel.tp=2 --set parallel.dp=2 --set parallel.zero=1"}),
    [](const ::testing::TestParamInfo<Pair>& p) { return std::string(p.param.name); });

// The experts at their global shapes: a checkpoint written at ep 2 (dp 2, ZeRO-1) resumes at ep 1
// (one rank) and at ep 4 (dp 4), with the losses of the uninterrupted run.
TEST(Resume, AcrossExpertParallelism) {
  const std::string config = source("config/tiny-moe.yaml");
  TempDir tmp("resume-ep");
  const std::string dir = tmp.file("ckpt");
  auto a = run(train(2,
                     "--set parallel.dp=2 --set parallel.ep=2 --set parallel.zero=1 --set checkpoint.dir=" + dir +
                         " --set checkpoint.every=" + std::to_string(kSaveAt) + " --set train.steps=" +
                         std::to_string(kSaveAt),
                     config));
  ASSERT_EQ(a.code, 0) << a.output;
  struct Leg {
    const char* name;
    int np;
    const char* sets;
  };
  for (const Leg& leg : {Leg{"ep1", 1, ""}, Leg{"ep4", 4, "--set parallel.dp=4 --set parallel.ep=4"}}) {
    const std::string metrics = tmp.file(std::string(leg.name) + ".jsonl");
    auto b = run(train(leg.np, std::string(leg.sets) + " --resume " + dir + " --metrics " + metrics, config));
    ASSERT_EQ(b.code, 0) << b.output;
    const auto rows = read_metrics(metrics);
    ASSERT_EQ(rows.size(), static_cast<size_t>(kSteps - kSaveAt)) << leg.name;
    const double worst = worst_loss_error(rows, reference(config));
    std::printf("[ resume ] ep2_zero1 -> %-4s steps %d..%d worst loss rel err %.2e (tol %.0e)\n", leg.name, kSaveAt,
                kSteps - 1, worst, kTol);
    EXPECT_LE(worst, kTol) << leg.name;
  }
}

// A checkpoint written with ZeRO for subsets of the units (ZeRO-3 for the embedding and the head,
// 2 for the Mamba-2 blocks, 1 for the rest) resumes under pipeline parallelism, and a
// single-rank one under those subsets: steps 6..11 equal the uninterrupted run.
TEST(Resume, WithZeroForSubsetsOfTheUnits) {
  TempDir tmp("resume-zero-subsets");
  std::string tiny;
  {
    std::ifstream f(source("config/tiny.yaml"));
    tiny.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  const std::string subsets = tmp.write(
      "subsets.yaml", tiny + "directives:\n"
                             "  - replicate: {dp: 2, shard_optimizer: true}\n"
                             "  - replicate: {shard_grads: true, kind: M}\n"
                             "  - replicate: {shard_grads: true, shard_params: true, kind: [embed, head]}\n");
  const std::string tiny_path = source("config/tiny.yaml");
  struct Leg {
    const char* name;
    int np_a;
    std::string config_a;
    std::string a;
    int np_b;
    std::string config_b;
    std::string b;
  };
  for (const Leg& l : std::vector<Leg>{
           {"subsets_to_pp2", 2, subsets, "", 2, tiny_path, "--set parallel.pp=2 --set parallel.microbatches=2"},
           {"single_to_subsets", 1, tiny_path, "", 2, subsets, ""}}) {
    SCOPED_TRACE(l.name);
    const std::string dir = tmp.file(std::string("ckpt-") + l.name);
    auto a = run(train(l.np_a, l.a + " --set checkpoint.dir=" + dir + " --set checkpoint.every=" +
                                    std::to_string(kSaveAt) + " --set train.steps=" + std::to_string(kSaveAt),
                       l.config_a));
    ASSERT_EQ(a.code, 0) << a.output;
    const std::string metrics = tmp.file(std::string(l.name) + ".jsonl");
    auto b = run(train(l.np_b, l.b + " --resume " + dir + " --metrics " + metrics, l.config_b));
    ASSERT_EQ(b.code, 0) << b.output;
    const auto rows = read_metrics(metrics);
    const auto& ref = reference();
    ASSERT_EQ(rows.size(), static_cast<size_t>(kSteps - kSaveAt));
    double worst = 0;
    for (const auto& r : rows) {
      const double want = ref.at(static_cast<size_t>(r["step"].get<int64_t>()))["loss"].get<double>();
      worst = std::max(worst, std::fabs(r["loss"].get<double>() - want) / want);
    }
    std::printf("[ resume ] %-34s steps %d..%d worst loss rel err %.2e (tol %.0e)\n", l.name, kSaveAt, kSteps - 1,
                worst, kTol);
    EXPECT_EQ(rows.front()["step"].get<int64_t>(), kSaveAt);
    EXPECT_LE(worst, kTol);
  }
}

// `piper ckpt inspect` and `verify` on a good file, then on a corrupted one.
TEST(Checkpoint, InspectVerifyAndCorruption) {
  TempDir tmp("ckpt-corrupt");
  const std::string dir = tmp.file("ckpt");
  auto a = run(train(1, "--set train.steps=2 --set checkpoint.dir=" + dir));
  ASSERT_EQ(a.code, 0) << a.output;
  const std::string file = dir + "/step_00000002.h5";
  auto ins = run(piper() + " ckpt inspect " + dir);
  ASSERT_EQ(ins.code, 0) << ins.output;
  for (const char* want : {"step 2", "/model/layers.0.mixer.in_proj.weight", "/optim/exp_avg/embed.weight", "strategy"})
    EXPECT_NE(ins.output.find(want), std::string::npos) << want << "\n" << ins.output;
  auto ok = run(piper() + " ckpt verify " + file);
  EXPECT_EQ(ok.code, 0) << ok.output;
  // Flip bytes in the middle of the file (inside some dataset's data).
  const auto size = std::filesystem::file_size(file);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    const char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    f.write(junk, sizeof junk);
  }
  auto bad = run(piper() + " ckpt verify " + file);
  EXPECT_NE(bad.code, 0) << bad.output;
  EXPECT_NE(bad.output.find("CHECKSUM MISMATCH"), std::string::npos) << bad.output;
  auto resume = run(train(1, "--resume " + file));
  EXPECT_EQ(resume.code, 2) << resume.output;
  EXPECT_NE(resume.output.find(file), std::string::npos) << resume.output;
  EXPECT_NE(resume.output.find("checksum"), std::string::npos) << resume.output;
  EXPECT_EQ(resume.output.find("step "), std::string::npos) << "trained on garbage";
  // Truncated.
  std::filesystem::resize_file(file, size / 3);
  auto trunc = run(train(1, "--resume " + file));
  EXPECT_EQ(trunc.code, 2) << trunc.output;
  EXPECT_NE(trunc.output.find(file), std::string::npos) << trunc.output;
}

// A checkpoint of another model: the mismatching tensor is named.
TEST(Checkpoint, OtherModelRefused) {
  TempDir tmp("ckpt-other");
  const std::string dir = tmp.file("ckpt");
  ASSERT_EQ(run(train(1, "--set train.steps=1 --set checkpoint.dir=" + dir)).code, 0);
  auto r = run(train(1, "--set model.ffn_hidden=96 --resume " + dir));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("gate_proj"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("shape"), std::string::npos) << r.output;
  auto m = run(train(1, "--set model.pattern=M*-M-M --resume " + dir));
  EXPECT_EQ(m.code, 2) << m.output;
  EXPECT_NE(m.output.find("missing tensor"), std::string::npos) << m.output;
}

// SIGUSR1 to every rank: a checkpoint at the next step boundary, a clean exit.
TEST(Checkpoint, SignalCheckpointsAndExits) {
  TempDir tmp("ckpt-signal");
  const std::string dir = tmp.file("ckpt"), out = tmp.file("out.txt");
  const std::string cmd = train(2, "--set parallel.dp=2 --set train.steps=100000 --set train.log_every=1 "
                                   "--set checkpoint.dir=" + dir) +
                          " --metrics " + tmp.file("m.jsonl");
  // Not --quiet in effect for the grep below: progress lines are what we wait for.
  // In the background, detached from the pipe run() reads.
  const std::string bg = "(" + cmd + " > " + out + " 2>&1; echo exit=$? >> " + out + ") > /dev/null 2>&1 &";
  auto started = run(bg);
  ASSERT_EQ(started.code, 0);
  for (int i = 0; i < 300 && !std::filesystem::exists(tmp.file("m.jsonl")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // The ranks themselves, as Slurm's --signal does through mpirun (not the shell around them).
  run("pkill -USR1 -f '^" + piper() + " train.*checkpoint.dir=" + dir + "'");
  std::string text;
  for (int i = 0; i < 300; ++i) {
    std::ifstream f(out);
    text.assign(std::istreambuf_iterator<char>(f), {});
    if (text.find("exit=") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::printf("[ signal ] %s", text.substr(text.size() > 400 ? text.size() - 400 : 0).c_str());
  EXPECT_NE(text.find("checkpointed at step"), std::string::npos) << text;
  EXPECT_NE(text.find("exit=0"), std::string::npos) << text;
  EXPECT_EQ(run(piper() + " ckpt verify " + dir).code, 0);
}

// kill -9 at moments spread over a run that saves every step: whatever the
// moment, `latest` names a checkpoint that verifies, and resuming works.
TEST(Checkpoint, KillDuringWriteKeepsPreviousCheckpoint) {
  TempDir tmp("ckpt-kill");
  const std::string dir = tmp.file("ckpt");
  for (int trial = 0; trial < 3; ++trial) {
    const std::string out = tmp.file("out" + std::to_string(trial));
    run("(" + train(2, "--set parallel.dp=2 --set train.steps=100000 --set checkpoint.every=1 --set checkpoint.keep=2 "
                       "--set checkpoint.dir=" + dir + (trial ? " --resume" : "")) +
        " > " + out + " 2>&1 &)");
    for (int i = 0; i < 300 && !std::filesystem::exists(dir + "/latest"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + 170 * trial));
    run("pkill -9 -f 'checkpoint.dir=" + dir + "'");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto v = run(piper() + " ckpt verify " + dir);
    std::printf("[ kill ] trial %d: latest verifies with exit %d\n", trial, v.code);
    EXPECT_EQ(v.code, 0) << v.output;
  }
  auto r = run(train(1, "--set train.steps=100000 --set train.steps=1 --resume " + dir));
  EXPECT_EQ(r.code, 0) << r.output;
}

}  // namespace
}  // namespace piper::e2e
