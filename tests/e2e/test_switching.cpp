// test_switching.cpp — online strategy switches (docs/switching.md) against checkpoint + resume: a run
// that switches from A to B at step k gives the same losses, bit for bit, and the same final parameters
// as saving a checkpoint under A at step k and resuming under B; the memory of every process during the
// switch stays within one staging buffer of the larger of its two layouts; shrinking and growing the
// rank set during a run (the switch file, standby ranks, the tuner's choice); and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "e2e/e2e_util.hpp"
#include "e2e/job.hpp"

namespace piper::e2e {
namespace {

constexpr int kSteps = 8, kSwitchAt = 4;
constexpr double kBufferMb = 1;  // small, so that the state moves in many chunks

// A strategy: its ranks and its parallel section, every key written (an entry's keys override the
// current strategy's, so none may be left to inherit).
struct Strategy {
  int np = 1;
  int dp = 1, tp = 1, pp = 1, ep = 1, zero = 0, microbatches = 1, virtual_stages = 1;
  const char* schedule = "1f1b";
  std::string yaml() const {
    std::ostringstream s;
    s << "{dp: " << dp << ", tp: " << tp << ", pp: " << pp << ", ep: " << ep << ", zero: " << zero
      << ", microbatches: " << microbatches << ", virtual_stages: " << virtual_stages << ", schedule: " << schedule
      << "}";
    return s.str();
  }
  std::string sets() const {
    std::ostringstream s;
    s << " --set parallel.dp=" << dp << " --set parallel.tp=" << tp << " --set parallel.pp=" << pp
      << " --set parallel.ep=" << ep << " --set parallel.zero=" << zero << " --set parallel.microbatches="
      << microbatches << " --set parallel.virtual_stages=" << virtual_stages << " --set parallel.schedule=" << schedule;
    return s.str();
  }
};

struct Pair {
  const char* name;
  Strategy a, b;
  bool moe = false;
};
void PrintTo(const Pair& p, std::ostream* os) { *os << p.name; }

std::string mpi(int np, const std::string& extra = "") {
  return "mpirun --oversubscribe --allow-run-as-root --mca orte_allowed_exit_without_sync 1 " + extra + "-np " +
         std::to_string(np) + " ";
}

std::string model_config(bool moe) { return source(moe ? "config/tiny-moe.yaml" : "config/tiny.yaml"); }

std::string common_sets(int steps = kSteps) {
  return " --quiet --set data.path=" + corpus() + " --set train.threads=1 --set train.steps=" + std::to_string(steps);
}

std::vector<nlohmann::json> steps_of(const std::vector<nlohmann::json>& rows) {
  std::vector<nlohmann::json> out;
  for (const auto& r : rows)
    if (!r.contains("event")) out.push_back(r);
  return out;
}

const nlohmann::json* switch_event(const std::vector<nlohmann::json>& rows) {
  for (const auto& r : rows)
    if (r.contains("event") && r["event"] == "switch") return &r;
  return nullptr;
}

// Losses equal bit for bit (the metrics print doubles so that they read back exactly); returns the
// number that differ.
int loss_differences(const std::vector<nlohmann::json>& got, const std::vector<nlohmann::json>& want) {
  int bad = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    bad += got[i]["loss"].get<double>() != want[i]["loss"].get<double>();
  return bad + static_cast<int>(got.size() != want.size());
}

int64_t param_differences(const std::string& a, const std::string& b) {
  const auto x = read_params(a), y = read_params(b);
  if (x.empty() || x.size() != y.size()) return -1;
  int64_t bad = 0;
  for (const auto& [name, v] : x) {
    auto it = y.find(name);
    if (it == y.end() || it->second.size() != v.size()) return -1;
    for (size_t i = 0; i < v.size(); ++i) bad += std::memcmp(&v[i], &it->second[i], sizeof(float)) != 0;
  }
  return bad;
}

// Peak during the switch against max(before, after) + the staging buffer, per process; returns the
// worst excess (<= 0 when every process kept the bound) and prints it.
double worst_excess(const nlohmann::json& ev, const std::vector<nlohmann::json>& steps, const char* name) {
  const std::vector<int> members = ev["members"], after = ev["active_after"];
  const std::vector<double> peak = ev["peak_bytes"], before = ev["before_peak_bytes"];
  const double buffer = ev["buffer_bytes"];
  const int64_t at = ev["step"];
  const nlohmann::json* next = nullptr;
  for (const auto& s : steps)
    if (s["step"].get<int64_t>() == at) next = &s;
  double worst = -1e300;
  for (size_t i = 0; i < members.size(); ++i) {
    double after_peak = 0;
    const auto pos = std::find(after.begin(), after.end(), members[i]);
    if (next && pos != after.end()) after_peak = (*next)["ranks"][pos - after.begin()]["peak_mem_bytes"];
    const double excess = peak[i] - (std::max(before[i], after_peak) + buffer);
    worst = std::max(worst, excess);
    std::printf("[ switch ] %-30s process %d: peak %.2f MiB, before %.2f, after %.2f, bound %.2f MiB\n", name,
                members[i], peak[i] / 1048576, before[i] / 1048576, after_peak / 1048576,
                (std::max(before[i], after_peak) + buffer) / 1048576);
  }
  return worst;
}

class Switch : public ::testing::TestWithParam<Pair> {};

// Switch from A to B at step 4 of 8 within one run; against it, A with a checkpoint at step 4, resumed
// under B. Losses and final parameters bit for bit; memory during the switch within the bound.
TEST_P(Switch, EqualsCheckpointAndResume) {
  const Pair& p = GetParam();
  TempDir tmp(std::string("switch-") + p.name);
  const int np = std::max(p.a.np, p.b.np);
  const std::string config = tmp.write(
      "switch.yaml", read_text(model_config(p.moe)) + "\nswitch:\n  - {at_step: " + std::to_string(kSwitchAt) +
                         ", world: " + std::to_string(p.b.np) + ", parallel: " + p.b.yaml() + "}\n");
  const std::string standby = " --set train.standby=" + std::to_string(np - p.a.np);
  const std::string buffer = " --set train.switch_buffer_mb=" + std::to_string(kBufferMb);
  auto s = run(mpi(np) + piper() + " train " + config + common_sets() + p.a.sets() + standby + buffer +
               " --metrics " + tmp.file("s.jsonl") + " --dump-final " + tmp.file("s.prm"));
  ASSERT_EQ(s.code, 0) << s.output;

  const std::string dir = tmp.file("ckpt");
  auto a = run(mpi(p.a.np) + piper() + " train " + model_config(p.moe) + common_sets() + p.a.sets() +
               " --set checkpoint.dir=" + dir + " --set checkpoint.every=" + std::to_string(kSwitchAt) +
               " --metrics " + tmp.file("a.jsonl"));
  ASSERT_EQ(a.code, 0) << a.output;
  char file[64];
  std::snprintf(file, sizeof file, "/step_%08d.h5", kSwitchAt);
  auto b = run(mpi(p.b.np) + piper() + " train " + model_config(p.moe) + common_sets() + p.b.sets() + " --resume " +
               dir + file + " --metrics " + tmp.file("b.jsonl") + " --dump-final " + tmp.file("b.prm"));
  ASSERT_EQ(b.code, 0) << b.output;

  const auto rows = read_metrics(tmp.file("s.jsonl"));
  const auto got = steps_of(rows);
  auto want = read_metrics(tmp.file("a.jsonl"));
  want.resize(kSwitchAt);
  for (const auto& r : read_metrics(tmp.file("b.jsonl"))) want.push_back(r);
  const int losses = loss_differences(got, want);
  const int64_t params = param_differences(tmp.file("s.prm"), tmp.file("b.prm"));
  const nlohmann::json* ev = switch_event(rows);
  ASSERT_NE(ev, nullptr) << s.output;
  const double excess = worst_excess(*ev, got, p.name);
  std::printf("[ switch ] %-30s %d -> %d ranks: %zu steps, losses differing %d, parameters differing %lld "
              "(tolerance 0: bit for bit); moved %.0f B + %.0f B local, stalled %.1f ms; worst excess over "
              "max(before, after) + buffer %.0f B\n",
              p.name, p.a.np, p.b.np, got.size(), losses, static_cast<long long>(params),
              ev->at("bytes_moved").get<double>(), ev->at("bytes_local").get<double>(),
              ev->at("stall_ms").get<double>(), excess);
  EXPECT_EQ(got.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(losses, 0);
  EXPECT_EQ(params, 0);
  EXPECT_EQ(ev->at("step").get<int64_t>(), kSwitchAt);
  EXPECT_LE(excess, 0.0);
}

Strategy S(int np) { return Strategy{.np = np}; }
Strategy dp(int np, int zero) { return Strategy{.np = np, .dp = np, .zero = zero}; }

INSTANTIATE_TEST_SUITE_P(
    Pairs, Switch,
    ::testing::Values(
        Pair{"dp2_to_dp2_zero3", dp(2, 0), dp(2, 3)},
        Pair{"dp2_zero1_to_tp2", dp(2, 1), {.np = 2, .tp = 2}},
        Pair{"tp2_to_pp2_1f1b", {.np = 2, .tp = 2}, {.np = 2, .pp = 2, .microbatches = 2}},
        Pair{"pp2_gpipe_to_pp2_zbh1", {.np = 2, .pp = 2, .microbatches = 2, .schedule = "gpipe"},
             {.np = 2, .pp = 2, .microbatches = 4, .schedule = "zbh1"}},
        Pair{"pp2_1f1b_to_interleaved", {.np = 2, .pp = 2, .microbatches = 2},
             {.np = 2, .pp = 2, .microbatches = 2, .virtual_stages = 2, .schedule = "interleaved"}},
        Pair{"dualpipev_to_dp2_zero2", {.np = 2, .pp = 2, .microbatches = 4, .schedule = "dualpipev"}, dp(2, 2)},
        Pair{"single_mb1_to_single_mb4", S(1), {.np = 1, .microbatches = 4}},
        Pair{"dp2_zero2_to_mb2", dp(2, 2), {.np = 2, .dp = 2, .zero = 2, .microbatches = 2}},
        Pair{"shrink_8_to_4", {.np = 8, .dp = 2, .tp = 2, .pp = 2, .zero = 1, .microbatches = 2}, dp(4, 3)},
        Pair{"grow_2_to_4", dp(2, 1), {.np = 4, .dp = 2, .pp = 2, .zero = 1, .microbatches = 2}},
        Pair{"shrink_4_to_1", dp(4, 2), S(1)},
        Pair{"grow_1_to_2_pp", S(1), {.np = 2, .pp = 2, .microbatches = 2}},
        Pair{"shrink_4_to_2_tp", {.np = 4, .dp = 2, .tp = 2}, {.np = 2, .tp = 2, .zero = 0}},
        Pair{"grow_2_to_4_tp2_dp2_zero3", {.np = 2, .tp = 2}, {.np = 4, .dp = 2, .tp = 2, .zero = 3}},
        Pair{"pp4_to_pp2", {.np = 4, .pp = 4, .microbatches = 4}, {.np = 2, .pp = 2, .microbatches = 2}},
        Pair{"zbh1_to_dualpipev", {.np = 2, .pp = 2, .microbatches = 4, .schedule = "zbh1"},
             {.np = 2, .pp = 2, .microbatches = 4, .schedule = "dualpipev"}},
        Pair{"interleaved_to_gpipe_4", {.np = 4, .dp = 2, .pp = 2, .microbatches = 2, .virtual_stages = 2,
                                       .schedule = "interleaved"},
             {.np = 4, .pp = 4, .microbatches = 4, .schedule = "gpipe"}},
        Pair{"moe_ep2_to_ep1", {.np = 2, .dp = 2, .ep = 2, .zero = 1}, dp(2, 1), true},
        Pair{"moe_single_to_ep2_zero3", S(1), {.np = 2, .dp = 2, .ep = 2, .zero = 3}, true},
        Pair{"moe_ep2_to_pp2", {.np = 2, .dp = 2, .ep = 2}, {.np = 2, .pp = 2, .microbatches = 2}, true},
        Pair{"moe_grow_2_to_4_ep4", {.np = 2, .dp = 2, .ep = 2, .zero = 2}, {.np = 4, .dp = 4, .ep = 4, .zero = 1},
             true},
        Pair{"moe_shrink_4_to_2_ep", {.np = 4, .dp = 4, .ep = 2, .zero = 1}, {.np = 2, .tp = 2}, true}),
    [](const ::testing::TestParamInfo<Pair>& p) { return std::string(p.param.name); });

// ---- elastic: the switch file, standby ranks, leave notices ---------------------------------------

constexpr int kLongSteps = 40;

std::string elastic_train(const std::string& config, const std::string& sets, const std::string& metrics) {
  return piper() + " train " + config + " --set data.path=" + corpus() + " --set train.threads=1 --set train.steps=" +
         std::to_string(kLongSteps) + " --set train.log_every=1 --metrics " + metrics + " " + sets;
}

// Waits until `path` holds a line with `needle` (up to limit_s); false if the job ended first.
bool wait_for_text(Job& job, const std::string& path, const std::string& needle, double limit_s) {
  const auto t0 = Clock::now();
  while (seconds_since(t0) < limit_s) {
    if (read_text(path).find(needle) != std::string::npos) return true;
    if (job.wait_end(0.02)) return read_text(path).find(needle) != std::string::npos;
  }
  return false;
}

void write_atomically(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp") << text;
  std::filesystem::rename(path + ".tmp", path);
}

std::vector<nlohmann::json> events_of(const std::vector<nlohmann::json>& rows) {
  std::vector<nlohmann::json> out;
  for (const auto& r : rows)
    if (r.contains("event")) out.push_back(r);
  return out;
}

// A 4-process job starts on 2 ranks (2 in reserve), grows to 4 when the switch file asks, then shrinks
// back to 2 when the file names ranks 2 and 3 as leaving, with the tuner choosing the strategy. Against
// it: checkpoints at both switch steps and resumes under each new strategy and world.
TEST(Elastic, GrowAndShrinkEqualCheckpointAndResume) {
  TempDir tmp("elastic-grow-shrink");
  const std::string file = tmp.file("strategy.yaml"), metrics = tmp.file("s.jsonl");
  const std::string sets = "--set parallel.dp=2 --set parallel.zero=1 --set train.standby=2 --set train.switch_file=" +
                           file + " --set train.switch_hardware=h100-sxm --set train.switch_tune_s=2";
  Job job(mpi(4) + elastic_train(source("config/tiny.yaml"), sets + " --dump-final " + tmp.file("s.prm"), metrics),
          tmp.file("s.out"), metrics);
  ASSERT_TRUE(job.wait_for_step(60)) << job.output();
  write_atomically(file, "world: 4\nparallel: {dp: 4, zero: 1}\n");
  ASSERT_TRUE(wait_for_text(job, metrics, "\"event\":\"switch\"", 60)) << job.output();
  write_atomically(file, "leave: [2, 3]\n");
  ASSERT_TRUE(job.wait_end(120)) << job.output();
  ASSERT_EQ(job.code(), 0) << job.output();
  const std::string out = job.output();
  EXPECT_NE(out.find("rank(s) 2, 3 left the job"), std::string::npos) << out;

  const auto rows = read_metrics(metrics);
  const auto events = events_of(rows);
  ASSERT_EQ(events.size(), 2u) << out;
  const int64_t grow_at = events[0]["step"], shrink_at = events[1]["step"];
  EXPECT_EQ(events[0]["active_after"].size(), 4u);
  EXPECT_EQ(events[1]["active_after"].size(), 2u);
  EXPECT_LT(grow_at, shrink_at);
  ASSERT_LT(shrink_at, kLongSteps) << "the shrink came after the last step";

  // The reference: a checkpoint every step, resumed at each switch under the strategy it switched to.
  const std::string ckpt = tmp.file("ckpt");
  const std::string keep = " --set checkpoint.dir=" + ckpt + " --set checkpoint.every=1 --set checkpoint.keep=1000";
  auto at = [&](int64_t step) {
    char name[64];
    std::snprintf(name, sizeof name, "/step_%08lld.h5", static_cast<long long>(step));
    return ckpt + name;
  };
  auto a = run(mpi(2) + elastic_train(source("config/tiny.yaml"), "--quiet --set parallel.dp=2 --set parallel.zero=1" +
                                                                       keep, tmp.file("a.jsonl")));
  ASSERT_EQ(a.code, 0) << a.output;
  const std::string ckpt_b = ckpt + "-b";
  auto b = run(mpi(4) + elastic_train(source("config/tiny.yaml"),
                                      "--quiet --set parallel.dp=4 --set parallel.zero=1 --set checkpoint.dir=" +
                                          ckpt_b + " --set checkpoint.every=1 --set checkpoint.keep=1000 --resume " +
                                          at(grow_at),
                                      tmp.file("b.jsonl")));
  ASSERT_EQ(b.code, 0) << b.output;
  const std::string tuned = tmp.write("tuned.yaml", events[1]["config_yaml"].get<std::string>());
  char name[64];
  std::snprintf(name, sizeof name, "/step_%08lld.h5", static_cast<long long>(shrink_at));
  auto c = run(mpi(2) + elastic_train(tuned, "--quiet --set train.standby=0 --resume " + ckpt_b + name + " --dump-final " + tmp.file("c.prm"),
                                      tmp.file("c.jsonl")));
  ASSERT_EQ(c.code, 0) << c.output;

  std::vector<nlohmann::json> want = read_metrics(tmp.file("a.jsonl"));
  want.resize(static_cast<size_t>(grow_at));
  auto from_b = read_metrics(tmp.file("b.jsonl"));
  from_b.resize(static_cast<size_t>(shrink_at - grow_at));
  want.insert(want.end(), from_b.begin(), from_b.end());
  for (const auto& r : read_metrics(tmp.file("c.jsonl"))) want.push_back(r);
  const auto got = steps_of(rows);
  const int losses = loss_differences(got, want);
  const int64_t params = param_differences(tmp.file("s.prm"), tmp.file("c.prm"));
  std::printf("[ elastic ] grow 2 -> 4 at step %lld, shrink 4 -> 2 (tuner: %s) at step %lld: losses differing %d "
              "of %zu, parameters differing %lld (tolerance 0: bit for bit)\n",
              static_cast<long long>(grow_at), events[1]["to"].get<std::string>().c_str(),
              static_cast<long long>(shrink_at), losses, got.size(), static_cast<long long>(params));
  EXPECT_EQ(losses, 0);
  EXPECT_EQ(params, 0);
  for (const auto& ev : events) EXPECT_LE(worst_excess(ev, got, ev["why"].get<std::string>().c_str()), 0.0);
}

// SIGUSR2 is a leave notice: rank 1 hands its state off and leaves; rank 0 trains on alone.
TEST(Elastic, LeaveNoticeBySignal) {
  TempDir tmp("elastic-signal");
  const std::string metrics = tmp.file("s.jsonl");
  Job job(mpi(2) + elastic_train(source("config/tiny.yaml"),
                                 "--set parallel.dp=2 --set train.switch_hardware=h100-sxm --set train.switch_tune_s=2",
                                 metrics),
          tmp.file("s.out"), metrics);
  ASSERT_TRUE(job.wait_for_step(60)) << job.output();
  const pid_t rank1 = job.rank_pid(1);
  ASSERT_GT(rank1, 0);
  kill(rank1, SIGUSR2);
  ASSERT_TRUE(job.wait_end(120)) << job.output();
  const std::string out = job.output();
  EXPECT_EQ(job.code(), 0) << out;
  EXPECT_NE(out.find("the leave notice of rank(s) 1"), std::string::npos) << out;
  EXPECT_NE(out.find("rank(s) 1 left the job"), std::string::npos) << out;
  const auto rows = read_metrics(metrics);
  EXPECT_EQ(steps_of(rows).size(), static_cast<size_t>(kLongSteps));
  ASSERT_EQ(events_of(rows).size(), 1u);
  EXPECT_EQ(events_of(rows)[0]["active_after"], nlohmann::json::array({0}));
}

// Ranks that stay in reserve through a switch take part in it without state: 4 processes, 2 training and
// 2 in reserve; at step 3 the job shrinks to 1 rank (rank 1 joins the reserve, ranks 2 and 3 stay in it),
// at step 6 it grows to all 4.
TEST(Elastic, ReserveStaysThroughAShrinkAndJoinsLater) {
  TempDir tmp("elastic-reserve");
  const std::string config = tmp.write(
      "reserve.yaml", read_text(source("config/tiny.yaml")) +
                          "\nswitch:\n  - {at_step: 3, world: 1, parallel: {dp: 1}}\n"
                          "  - {at_step: 6, world: 4, parallel: {dp: 4}}\n");
  const std::string metrics = tmp.file("s.jsonl");
  auto r = run(mpi(4) + piper() + " train " + config + common_sets() +
               " --set parallel.dp=2 --set train.standby=2 --metrics " + metrics);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto rows = read_metrics(metrics);
  const auto events = events_of(rows);
  ASSERT_EQ(events.size(), 2u) << r.output;
  EXPECT_EQ(events[0]["active_after"], nlohmann::json::array({0})) << events[0].dump();
  EXPECT_EQ(events[1]["active_after"], nlohmann::json::array({0, 1, 2, 3})) << events[1].dump();
  EXPECT_EQ(events[1]["step"], 6);
  EXPECT_EQ(steps_of(rows).size(), static_cast<size_t>(kSteps));
}

// A switch file that does not parse, and one that names every rank as leaving: the job says why and
// trains on under its strategy.
TEST(Elastic, RefusedSwitchFilesKeepTheJobRunning) {
  TempDir tmp("elastic-refused");
  const std::string file = tmp.file("strategy.yaml"), metrics = tmp.file("s.jsonl");
  Job job(mpi(2) + elastic_train(source("config/tiny.yaml"), "--set parallel.dp=2 --set train.switch_file=" + file,
                                 metrics),
          tmp.file("s.out"), metrics);
  ASSERT_TRUE(job.wait_for_step(60)) << job.output();
  write_atomically(file, "parallel: {dp: [2\n");
  ASSERT_TRUE(wait_for_text(job, tmp.file("s.out"), "is not applied", 60)) << job.output();
  write_atomically(file, "leave: [0, 1]\n");
  ASSERT_TRUE(wait_for_text(job, tmp.file("s.out"), "every rank of the job has a leave notice", 60)) << job.output();
  ASSERT_TRUE(job.wait_end(120)) << job.output();
  const std::string out = job.output();
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (line.find("is not applied") != std::string::npos) std::printf("[ elastic ] %s\n", line.c_str());
  EXPECT_EQ(job.code(), 0) << out;
  EXPECT_NE(out.find(file), std::string::npos) << out;
  const auto rows = read_metrics(metrics);
  EXPECT_EQ(steps_of(rows).size(), static_cast<size_t>(kLongSteps));
  EXPECT_TRUE(events_of(rows).empty());
}

// An entry of the `switch:` list that is not valid at its world: refused with its position before any step.
TEST(Elastic, InvalidScheduleEntryRefusedBeforeTraining) {
  TempDir tmp("elastic-invalid-entry");
  const std::string config = tmp.write(
      "bad.yaml", read_text(source("config/tiny.yaml")) + "\nswitch:\n  - {at_step: 2, world: 2, parallel: {dp: 3}}\n");
  auto r = run(mpi(2) + piper() + " train " + config + common_sets() + " --set parallel.dp=2");
  std::printf("[ elastic ] %s", r.output.c_str());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("bad.yaml:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("switch[0]"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step "), std::string::npos) << "trained before refusing";
}

}  // namespace
}  // namespace piper::e2e
