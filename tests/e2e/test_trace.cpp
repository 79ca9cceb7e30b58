// test_trace.cpp — `piper train --trace`: the Chrome trace read back holds every
// instruction of every rank's program once per traced step, in an order that
// respects the program (compute never overlaps, forwards before their
// backwards, receives after their sends), on one time base across ranks;
// --trace-steps limits the steps; a signal-triggered stop still writes it.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "e2e/e2e_util.hpp"
#include "trace/trace.hpp"

namespace piper::e2e {
namespace {

constexpr int kSteps = 3;

std::string mpirun(int np) {
  return np > 1 ? "mpirun --oversubscribe --allow-run-as-root -np " + std::to_string(np) + " " : "";
}

std::string train_cmd(int np, const std::string& sets, int steps = kSteps) {
  return mpirun(np) + piper() + " train " + source("config/tiny.yaml") + " --quiet --set data.path=" + corpus() +
         " --set train.steps=" + std::to_string(steps) + " --set train.threads=1 " + sets;
}

// A rank's program as `piper plan` prints it: (kind, node) per instruction.
struct RankProgram {
  std::vector<std::pair<std::string, int>> compute, comm;
};

std::vector<RankProgram> plan_programs(int world, const std::string& sets) {
  const auto r = run(piper() + " plan " + source("config/tiny.yaml") + " --world " + std::to_string(world) + " " + sets);
  EXPECT_EQ(r.code, 0) << r.output;
  std::vector<RankProgram> progs;
  std::vector<std::pair<std::string, int>>* stream = nullptr;
  const std::regex instr(R"(^\s+\d+\s+([A-Z_]+)\s.*\bnode (\d+))");
  std::istringstream in(r.output);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (line.rfind("rank ", 0) == 0) {
      progs.emplace_back();
      stream = nullptr;
    } else if (line == "  stream compute:") {
      stream = &progs.back().compute;
    } else if (line == "  stream comm:") {
      stream = &progs.back().comm;
    } else if (stream && std::regex_search(line, m, instr)) {
      stream->emplace_back(m[1].str(), std::stoi(m[2].str()));
    }
  }
  EXPECT_EQ(static_cast<int>(progs.size()), world) << r.output;
  return progs;
}

bool is_backward(const std::string& kind) { return kind == "BWD" || kind == "BWD_I" || kind == "BWD_W"; }

// Every check of a trace against the programs it ran, for the steps `steps`.
void check_trace(const trace::Trace& t, const std::vector<RankProgram>& progs, const std::set<int>& steps) {
  const int world = static_cast<int>(progs.size());
  EXPECT_EQ(t.ranks, world);
  EXPECT_EQ(t.title.rfind("measured: ", 0), 0u) << t.title;
  EXPECT_NE(t.title.find("(" + std::to_string(world) + " ranks)"), std::string::npos) << t.title;

  // Instructions per (rank, step): each of the program exactly once, nothing else.
  using RankStep = std::pair<int, int>;
  std::map<RankStep, std::multiset<std::pair<std::string, int>>> seen_compute, seen_comm;
  for (const auto& e : t.events) {
    ASSERT_TRUE(e.rank >= 0 && e.rank < world) << e.name;
    EXPECT_TRUE(steps.count(e.step)) << "event of untraced step " << e.step << ": " << e.name;
    EXPECT_GE(e.start_us, 0.0) << e.name;
    if (e.lane == trace::Lane::LANE_COMPUTE) {
      EXPECT_LT(e.start_us, e.end_us) << e.name;
      EXPECT_EQ(e.bytes, 0) << e.name;
      seen_compute[{e.rank, e.step}].insert({e.kind, e.node});
    } else {
      EXPECT_LE(e.start_us, e.end_us) << e.name;
      EXPECT_GT(e.bytes, 0) << e.name;
      seen_comm[{e.rank, e.step}].insert({e.kind, e.node});
    }
    EXPECT_FALSE(e.name.empty());
    EXPECT_EQ(e.name.rfind(e.kind, 0), 0u) << e.name;
  }
  for (int r = 0; r < world; ++r)
    for (int s : steps) {
      const std::multiset<std::pair<std::string, int>> want_compute(progs[static_cast<size_t>(r)].compute.begin(),
                                                                    progs[static_cast<size_t>(r)].compute.end());
      const std::multiset<std::pair<std::string, int>> want_comm(progs[static_cast<size_t>(r)].comm.begin(),
                                                                 progs[static_cast<size_t>(r)].comm.end());
      EXPECT_FALSE(want_compute.empty());
      EXPECT_EQ(seen_compute[RankStep(r, s)], want_compute) << "rank " << r << " step " << s;
      EXPECT_EQ(seen_comm[RankStep(r, s)], want_comm) << "rank " << r << " step " << s;
    }

  // Compute of one rank never overlaps; steps follow one another.
  for (int r = 0; r < world; ++r) {
    std::vector<const trace::Event*> mine;
    for (const auto& e : t.events)
      if (e.rank == r && e.lane == trace::Lane::LANE_COMPUTE) mine.push_back(&e);
    std::sort(mine.begin(), mine.end(), [](auto* a, auto* b) { return a->start_us < b->start_us; });
    for (size_t i = 1; i < mine.size(); ++i) {
      EXPECT_LE(mine[i - 1]->end_us, mine[i]->start_us)
          << "rank " << r << ": " << mine[i - 1]->name << " overlaps " << mine[i]->name;
      EXPECT_LE(mine[i - 1]->step, mine[i]->step) << "rank " << r << ": " << mine[i]->name;
    }
  }

  // A forward ends before its backward starts; a receive ends no earlier
  // than its send started (on another rank: the ranks share a time base).
  using Key = std::tuple<int, int, int, int>;  // rank, step, unit, microbatch
  std::map<Key, const trace::Event*> fwd;
  std::map<std::tuple<int, int, int>, std::vector<const trace::Event*>> sends;  // step, unit, mb
  for (const auto& e : t.events) {
    if (e.kind == "FWD") fwd[{e.rank, e.step, e.unit, e.microbatch}] = &e;
    if (e.kind == "SEND") sends[{e.step, e.unit, e.microbatch}].push_back(&e);
  }
  int backwards = 0;
  for (const auto& e : t.events) {
    if (is_backward(e.kind)) {
      auto it = fwd.find({e.rank, e.step, e.unit, e.microbatch});
      ASSERT_NE(it, fwd.end()) << "no forward for " << e.name << " on rank " << e.rank;
      EXPECT_LE(it->second->end_us, e.start_us) << e.name << " on rank " << e.rank << " starts before its forward ends";
      ++backwards;
    }
    if (e.kind == "RECV") {
      const auto& s = sends[{e.step, e.unit, e.microbatch}];
      ASSERT_EQ(s.size(), 1u) << "sends matching " << e.name << " step " << e.step;
      EXPECT_NE(s.front()->rank, e.rank);
      EXPECT_LE(s.front()->start_us, e.end_us) << e.name << " on rank " << e.rank << " ends before "
                                               << s.front()->name << " started";
    }
  }
  EXPECT_GT(backwards, 0);

  // One time base: each rank's first event of the first traced step within 1 s.
  std::vector<double> first(static_cast<size_t>(world), 1e300);
  for (const auto& e : t.events)
    if (e.step == *steps.begin()) first[static_cast<size_t>(e.rank)] = std::min(first[static_cast<size_t>(e.rank)], e.start_us);
  const auto [lo, hi] = std::minmax_element(first.begin(), first.end());
  EXPECT_LT(*hi - *lo, 1e6) << "ranks' first events " << *lo << " us and " << *hi << " us apart";
}

// Runs training with --trace and reads the file back; checks the summary line.
trace::Trace traced_run(const TempDir& tmp, int np, const std::string& sets, const std::string& extra,
                        size_t steps_expected) {
  const std::string path = tmp.file("trace.json");
  const std::string cmd = train_cmd(np, sets) + " --trace " + path + " " + extra;
  const auto r = run(cmd);
  EXPECT_EQ(r.code, 0) << cmd << "\n" << r.output;
  trace::Trace t;
  try {
    t = trace::read_chrome(path);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what() << "\n" << r.output;
    return t;
  }
  const std::string line = "trace: wrote " + std::to_string(t.events.size()) + " events of " +
                           std::to_string(steps_expected) + " steps to " + path;
  EXPECT_NE(r.output.find(line), std::string::npos) << "expected '" << line << "' in\n" << r.output;
  return t;
}

const std::string kPp2 = "--set parallel.pp=2 --set parallel.microbatches=4";
const std::string kDp2Zero1 = "--set parallel.dp=2 --set parallel.zero=1";

TEST(TraceRun, PipelineOneFOneBEveryInstructionOnce) {
  TempDir tmp("trace-pp2");
  const auto progs = plan_programs(2, kPp2);
  const trace::Trace t = traced_run(tmp, 2, kPp2, "", kSteps);
  check_trace(t, progs, {0, 1, 2});
  // Both directions cross the stage boundary: activations and gradients.
  int sends = 0;
  for (const auto& e : t.events) sends += e.kind == "SEND";
  EXPECT_EQ(sends, kSteps * 2 * 4);  // per step: m activations forward, m gradients back
}

TEST(TraceRun, DataParallelZero1EveryInstructionOnce) {
  TempDir tmp("trace-dp2");
  const auto progs = plan_programs(2, kDp2Zero1);
  const trace::Trace t = traced_run(tmp, 2, kDp2Zero1, "", kSteps);
  check_trace(t, progs, {0, 1, 2});
  std::set<std::string> comm_kinds;
  for (const auto& e : t.events)
    if (e.lane == trace::Lane::LANE_COMM) comm_kinds.insert(e.kind);
  EXPECT_EQ(comm_kinds, (std::set<std::string>{"ALLREDUCE", "ALLGATHER"}));
}

// Tensor parallelism: every all-reduce and all-gather between the segments of a pass is an
// event on the communication lane of both ranks, once per instruction.
TEST(TraceRun, TensorParallelCollectivesAreCommunicationEvents) {
  TempDir tmp("trace-tp2");
  const std::string tp2 = "--set parallel.tp=2 --set parallel.microbatches=2";
  const auto progs = plan_programs(2, tp2);
  const trace::Trace t = traced_run(tmp, 2, tp2, "", kSteps);
  check_trace(t, progs, {0, 1, 2});
  // The plan lists each rank's tensor-parallel collectives as "<KIND> ... tp <bytes> bytes point <k>".
  const auto plan = run(piper() + " plan " + source("config/tiny.yaml") + " --world 2 " + tp2);
  const std::regex point(R"(\btp \d+ bytes point \d+)");
  const auto tp_instrs = static_cast<size_t>(
      std::distance(std::sregex_iterator(plan.output.begin(), plan.output.end(), point), std::sregex_iterator()));
  ASSERT_GT(tp_instrs, 0u) << plan.output;
  size_t tp_events = 0;
  for (const auto& e : t.events)
    if (e.lane == trace::Lane::LANE_COMM && e.name.find(" tp ") != std::string::npos) ++tp_events;
  EXPECT_EQ(tp_events, tp_instrs * kSteps);
}

TEST(TraceRun, StepsRangeRecordsOnlyThoseSteps) {
  TempDir tmp("trace-steps");
  const auto progs = plan_programs(2, kPp2);
  const trace::Trace t = traced_run(tmp, 2, kPp2, "--trace-steps 1:1", 1);
  check_trace(t, progs, {1});
}

TEST(TraceRun, BadStepsIsUserError) {
  TempDir tmp("trace-bad");
  for (const std::string bad : {"3", "2:1", "a:b", "1:", "-1:2", "1:2:3"}) {
    const auto r = run(train_cmd(1, "", 1) + " --trace " + tmp.file("t.json") + " --trace-steps '" + bad + "'");
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.output;
    EXPECT_NE(r.output.find("--trace-steps: expected A:B"), std::string::npos) << bad << "\n" << r.output;
    EXPECT_NE(r.output.find("'" + bad + "'"), std::string::npos) << r.output;
  }
  const auto r = run(train_cmd(1, "", 1) + " --trace-steps 0:1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("needs --trace PATH"), std::string::npos) << r.output;
  const auto w = run(train_cmd(1, "", 1) + " --trace " + tmp.file("no/such/dir/t.json"));
  EXPECT_EQ(w.code, 2) << w.output;
  EXPECT_NE(w.output.find("--trace: cannot write"), std::string::npos) << w.output;
}

// SIGUSR1 to mpirun (which forwards it to the ranks): the run stops at a step
// boundary and rank 0 still writes the trace of the steps that ran.
TEST(TraceRun, SignalStopStillWritesTrace) {
  TempDir tmp("trace-signal");
  const std::string path = tmp.file("trace.json"), out = tmp.file("out.txt"), pid_file = tmp.file("pid");
  const std::string cmd = train_cmd(2, kDp2Zero1 + " --set train.log_every=1", 100000) +
                          " --metrics " + tmp.file("m.jsonl") + " --trace " + path;
  // mpirun itself in the background (its pid in pid_file), its exit status appended to out.
  run("sh -c '(exec " + cmd + " > " + out + " 2>&1) & echo $! > " + pid_file + "; wait $!; echo exit=$? >> " + out +
      "' > /dev/null 2>&1 &");
  for (int i = 0; i < 300 && !std::filesystem::exists(tmp.file("m.jsonl")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  pid_t pid = 0;
  std::ifstream(pid_file) >> pid;
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGUSR1), 0);
  std::string text;
  for (int i = 0; i < 600; ++i) {
    std::ifstream f(out);
    text.assign(std::istreambuf_iterator<char>(f), {});
    if (text.find("exit=") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (text.find("exit=") == std::string::npos) kill(pid, SIGKILL);
  EXPECT_NE(text.find("stopped at step"), std::string::npos) << text;
  EXPECT_NE(text.find("exit=0"), std::string::npos) << text;
  const size_t steps = read_metrics(tmp.file("m.jsonl")).size();
  ASSERT_GT(steps, 0u);
  const trace::Trace t = trace::read_chrome(path);
  EXPECT_NE(text.find("trace: wrote " + std::to_string(t.events.size()) + " events of " + std::to_string(steps) +
                      " steps"),
            std::string::npos)
      << text;
  std::set<int> all;
  for (int s = 0; s < static_cast<int>(steps); ++s) all.insert(s);
  check_trace(t, plan_programs(2, kDp2Zero1), all);
}

}  // namespace
}  // namespace piper::e2e
