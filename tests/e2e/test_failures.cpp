// test_failures.cpp — failures under mpirun. A strategy the world, the schedule or the model cannot run is
// refused on every rank before any step, with one message and a non-zero exit; a rank that dies
// (kill -9) or stalls (SIGSTOP, with parallel.comm_timeout_s) mid-run ends the whole job within a
// bounded time, non-zero, naming a rank (a stalled one by name: it alone does not answer a liveness probe).
//
// piper has no fault-injection switch, so the tests act on a rank's process from outside: they
// start mpirun in the background, wait for the first step line, find the rank's process by its
// unique --metrics path and OMPI_COMM_WORLD_RANK, and signal it.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "e2e/e2e_util.hpp"
#include "e2e/job.hpp"

namespace piper::e2e {
namespace {

// ---- refused before any step ------------------------------------------------------------

struct Refused {
  const char* name;
  int np;
  const char* sets;
  std::vector<std::string> expect;  // substrings of the message
  std::string once;                 // a substring printed exactly once
};

void PrintTo(const Refused& c, std::ostream* os) { *os << c.name; }

class RefusedUnderMpirun : public ::testing::TestWithParam<Refused> {};

TEST_P(RefusedUnderMpirun, EveryRankExitsNonZeroOneMessageNoStep) {
  const Refused& c = GetParam();
  const std::string args = train_args(std::string("--set train.steps=3 ") + c.sets);

  // As a user runs it: mpirun fails, the message is printed once, nothing trained.
  const std::string cmd = "timeout 120 " + mpirun(c.np) + piper() + args;
  auto r = run(cmd);
  std::printf("[ refused ] %s (np %d) -> mpirun exit %d: %s", c.name, c.np, r.code, r.output.c_str());
  EXPECT_NE(r.code, 0) << cmd;
  EXPECT_NE(r.code, 124) << "timed out (hang): " << cmd;
  for (const auto& s : c.expect) EXPECT_NE(r.output.find(s), std::string::npos) << "missing '" << s << "'";
  EXPECT_EQ(count(r.output, c.once), 1u) << "'" << c.once << "' should be printed exactly once";
  EXPECT_EQ(count(r.output, "piper: error:"), 1u);
  EXPECT_EQ(step_lines(r.output), 0u) << "training started";
  EXPECT_EQ(r.output.find("piper: internal error"), std::string::npos);
  EXPECT_EQ(r.output.find("communication failure"), std::string::npos);
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos);

  // Every rank exits non-zero on its own: mpirun is told not to stop the job at the first
  // non-zero exit, and each rank reports its status through a shell wrapper.
  const std::string wrapped = "timeout 120 " + mpirun(c.np, "--mca orte_abort_on_non_zero_status 0 ") + "sh -c '" +
                              piper() + args + "; rc=$?; echo \"[rank-exit] $OMPI_COMM_WORLD_RANK $rc\"; exit $rc'";
  auto w = run(wrapped);
  EXPECT_NE(w.code, 124) << "timed out (hang): " << wrapped << "\n" << w.output;
  std::set<int> ranks;
  std::istringstream lines(w.output);
  for (std::string line; std::getline(lines, line);) {
    const size_t p = line.find("[rank-exit] ");
    if (p == std::string::npos) continue;
    int rank = -1, code = -1;
    std::istringstream(line.substr(p + 12)) >> rank >> code;
    EXPECT_EQ(code, 2) << "rank " << rank << " exit code";
    ranks.insert(rank);
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(c.np)) << "not every rank reported its exit:\n" << w.output;
  EXPECT_EQ(count(w.output, c.once), 1u) << w.output;
}

INSTANTIATE_TEST_SUITE_P(
    Table, RefusedUnderMpirun,
    ::testing::Values(
        Refused{"world_too_small_for_dp", 2, "--set parallel.dp=4",
                {"world size 2 != dp(4) x tp(1) x pp(1) = 4", "mpirun -n 4", "parallel.dp=4 (from --set)",
                 "parallel.tp=1 (default)", "parallel.pp=1 (default)", "so that their product is 2"},
                "world size 2 != dp(4)"},
        Refused{"world_too_large_for_dp", 4, "--set parallel.dp=2",
                {"world size 4 != dp(2) x tp(1) x pp(1) = 2", "mpirun -n 2", "parallel.dp=2 (from --set)",
                 "parallel.tp=1 (default)", "parallel.pp=1 (default)"},
                "world size 4 != dp(2)"},
        Refused{"world_not_dp_times_pp", 3, "--set parallel.dp=2 --set parallel.pp=2",
                {"world size 3 != dp(2) x tp(1) x pp(2) = 4", "parallel.dp=2 (from --set)",
                 "parallel.tp=1 (default)", "parallel.pp=2 (from --set)"},
                "world size 3 != dp(2)"},
        Refused{"dualpipev_too_few_microbatches", 2,
                "--set parallel.pp=2 --set parallel.schedule=dualpipev --set parallel.microbatches=2",
                {"dualpipev needs microbatches >= 2 x pipeline ranks (got 2 microbatches for 2 ranks)"},
                "dualpipev needs microbatches"},
        Refused{"dualpipev_pp4_six_microbatches", 4,
                "--set parallel.pp=4 --set parallel.schedule=dualpipev --set parallel.microbatches=6 "
                "--set train.global_batch=12",
                {"dualpipev needs microbatches >= 2 x pipeline ranks (got 6 microbatches for 4 ranks)"},
                "dualpipev needs microbatches"},
        Refused{"interleaved_microbatches_not_multiple", 2,
                "--set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 "
                "--set parallel.microbatches=3 --set train.global_batch=6",
                {"interleaved needs microbatches divisible by pipeline ranks (got 3 microbatches for 2 ranks)"},
                "interleaved needs microbatches divisible"},
        Refused{"interleaved_pp4_two_microbatches", 4,
                "--set parallel.pp=4 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 "
                "--set parallel.microbatches=2",
                {"interleaved needs microbatches divisible by pipeline ranks (got 2 microbatches for 4 ranks)"},
                "interleaved needs microbatches divisible"},
        Refused{"zero1_without_dp", 2, "--set parallel.pp=2 --set parallel.zero=1 --set parallel.microbatches=2",
                {"parallel.zero", "ZeRO shards over data-parallel ranks", "parallel.dp=1 (default)",
                 "use dp >= 2 or zero 0"},
                "ZeRO shards over data-parallel ranks"},
        Refused{"zero3_without_dp", 2, "--set parallel.pp=2 --set parallel.zero=3 --set parallel.microbatches=2",
                {"parallel.zero", "ZeRO shards over data-parallel ranks", "use dp >= 2 or zero 0"},
                "ZeRO shards over data-parallel ranks"},
        Refused{"tp3_does_not_divide_heads", 3, "--set parallel.tp=3",
                {"parallel.tp=3", "(model.vocab_size = 256) must divide by tp",
                 "the attention heads (model.n_heads = 4) must divide by tp; use a tp that divides 4"},
                "the attention heads (model.n_heads = 4) must divide by tp"}),
    [](const ::testing::TestParamInfo<Refused>& p) { return std::string(p.param.name); });

// ---- a rank that dies or stalls mid-run ----------------------------------------------------

struct Fault {
  const char* name;
  int np;
  const char* sets;
  int victim;  // world rank acted on
  int signal;  // SIGKILL: the rank dies; SIGSTOP: it stalls and the others time out
};

void PrintTo(const Fault& f, std::ostream* os) { *os << f.name; }

class RankFailure : public ::testing::TestWithParam<Fault> {};

constexpr double kTimeoutS = 2;     // parallel.comm_timeout_s in these runs
constexpr double kBoundS = 60;      // the whole job must end within this after the fault
constexpr double kStartLimitS = 120;  // time allowed for the first step (4 ranks on a busy machine)

TEST_P(RankFailure, JobEndsBoundedNonZeroNamingARank) {
  const Fault& f = GetParam();
  TempDir tmp(std::string("fail-") + f.name);
  const std::string marker = tmp.file("marker-metrics.jsonl");  // unique per test process
  const std::string cmd = mpirun(f.np) + piper() +
                          train_args(std::string("--set train.steps=1000000 --set train.log_every=1 ") +
                                     "--set parallel.comm_timeout_s=" + std::to_string(static_cast<int>(kTimeoutS)) +
                                     " " + f.sets) +
                          " --metrics " + marker;
  Job job(cmd, tmp.file("out.txt"), marker);
  ASSERT_TRUE(job.wait_for_step(kStartLimitS)) << "no step line; output:\n" << job.output();
  const pid_t victim = job.rank_pid(f.victim);
  ASSERT_GT(victim, 0) << "no process for rank " << f.victim;

  const auto t0 = Clock::now();
  ASSERT_EQ(kill(victim, f.signal), 0);
  const bool ended = job.wait_end(kBoundS);
  const double took = seconds_since(t0);
  const std::string out = job.output();
  std::printf("[ fault ] %s: %s rank %d -> job ended %s after %.2f s, exit %d\n%s\n", f.name,
              f.signal == SIGKILL ? "SIGKILL" : "SIGSTOP", f.victim, ended ? "" : "NOT", took, job.code(),
              out.substr(out.find("\nstep ") == std::string::npos ? 0 : out.rfind("\nstep ") + 1).c_str());
  ASSERT_TRUE(ended) << "the job hangs " << kBoundS << " s after the fault";
  EXPECT_NE(job.code(), 0);
  EXPECT_EQ(out.find("terminate called"), std::string::npos);
  if (f.signal == SIGKILL) {
    // mpirun sees the death and stops the job, naming the rank.
    EXPECT_TRUE(out.find("process rank " + std::to_string(f.victim)) != std::string::npos ||
                out.find("communication failure on rank") != std::string::npos)
        << out;
  } else {
    // A survivor waits kTimeoutS on the stalled rank, names itself and what it waited for,
    // and aborts the job (exit 3: communication failure).
    EXPECT_GE(took, kTimeoutS * 0.9);
    EXPECT_EQ(job.code(), 3);
    EXPECT_NE(out.find("piper: communication failure on rank "), std::string::npos) << out;
    // It names the operation it waited on: a message from a peer or a collective of a group, or, when
    // the stall caught the victim between steps, the step boundary's decision (agreement over raw MPI).
    const bool at_boundary = out.find("at the step boundary's decision") != std::string::npos;
    if (at_boundary) {
      EXPECT_NE(out.find("piper comm: world rank "), std::string::npos) << out;
      EXPECT_NE(out.find("(parallel.comm_timeout_s = 2.0 s)"), std::string::npos) << out;
    } else {
      EXPECT_NE(out.find("(timeout 2.00 s)"), std::string::npos) << out;
      EXPECT_NE(out.find("piper comm: timeout on world rank "), std::string::npos) << out;
      EXPECT_TRUE(out.find(" peer ") != std::string::npos || out.find(" on dp ") != std::string::npos ||
                  out.find(" on world ") != std::string::npos)
          << out;
    }
    // And the stalled rank itself: the only one that does not answer the survivor's liveness probe.
    EXPECT_NE(out.find("world rank " + std::to_string(f.victim) + " did not answer a liveness probe"),
              std::string::npos)
        << out;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Faults, RankFailure,
    ::testing::Values(
        Fault{"pp2_kill_rank1", 2, "--set parallel.pp=2 --set parallel.microbatches=2", 1, SIGKILL},
        Fault{"dp2_kill_rank0", 2, "--set parallel.dp=2", 0, SIGKILL},
        Fault{"dp2_pp2_kill_rank3", 4, "--set parallel.dp=2 --set parallel.pp=2 --set parallel.microbatches=2", 3,
              SIGKILL},
        Fault{"pp2_stall_rank1", 2, "--set parallel.pp=2 --set parallel.microbatches=2", 1, SIGSTOP},
        Fault{"dp2_stall_rank0", 2, "--set parallel.dp=2", 0, SIGSTOP},
        Fault{"dp2_pp2_zero2_stall_rank2", 4,
              "--set parallel.dp=2 --set parallel.pp=2 --set parallel.zero=2 --set parallel.microbatches=2", 2,
              SIGSTOP}),
    [](const ::testing::TestParamInfo<Fault>& p) { return std::string(p.param.name); });

// A failure only rank 0 sees (its --metrics file cannot be written) is not agreed across ranks:
// rank 0 exits with its message while the others go on to the first collective. The job still
// ends, after parallel.comm_timeout_s (the others time out), not at once; with the default
// timeout (300 s) that is five minutes.
TEST(LeadOnlyFailure, UnwritableMetricsEndsWithinTheCommTimeout) {
  const std::string cmd = "timeout 120 " + mpirun(2) + piper() +
                          train_args("--set train.steps=50 --set parallel.dp=2 --set parallel.comm_timeout_s=3") +
                          " --metrics /nonexistent-piper-dir/metrics.jsonl";
  const auto t0 = Clock::now();
  auto r = run(cmd);
  const double took = seconds_since(t0);
  std::printf("[ lead-only ] exit %d after %.2f s: %s", r.code, took, r.output.c_str());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "hang: " << r.output;
  EXPECT_EQ(count(r.output, "--metrics: cannot write '/nonexistent-piper-dir/metrics.jsonl'"), 1u) << r.output;
  EXPECT_EQ(step_lines(r.output), 0u);
}

}  // namespace
}  // namespace piper::e2e
