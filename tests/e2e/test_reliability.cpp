// test_reliability.cpp — what piper promises when the disk or a rank fails during a checkpoint save
// (docs/reliability.md): the job ends in bounded time with one message and the right exit code, or goes on
// (checkpoint.on_error: continue); no segfault, no hang, no Open MPI help text; the temporary is gone,
// `latest` still names the previous checkpoint, and that checkpoint verifies and resumes.
//
// A signal during a long step (a text sample) is honoured at once.
//
// Faults come from outside piper: the write-fault shim (tests/fault/write_fault.c, LD_PRELOAD) fails or slows
// the writes of one checkpoint file on one rank; a small tmpfs is a file system that fills up; a read-only bind
// mount is a folder nobody may write. Mounting needs root; where it is refused those cases report themselves
// as skipped (not run), never as passed.
#include <gtest/gtest.h>

#include <sys/mount.h>

#include <filesystem>
#include <regex>

#include "e2e/e2e_util.hpp"
#include "e2e/job.hpp"

namespace piper::e2e {
namespace {

namespace fs = std::filesystem;

constexpr double kBoundS = 60;  // every faulty job must end within this

std::string shim_env(const std::string& file, const std::string& more) {
  return "env LD_PRELOAD=" + std::string(PIPER_WRITE_FAULT) + " PIPER_FAULT_FILE=" + file + " " + more + " ";
}

// mpirun's -x for each PIPER_FAULT_* and LD_PRELOAD variable of `env`, so every rank sees them.
std::string forwarded() {
  return "-x LD_PRELOAD -x PIPER_FAULT_FILE -x PIPER_FAULT_RANK -x PIPER_FAULT_AFTER -x PIPER_FAULT_ERRNO "
         "-x PIPER_FAULT_SYNC -x PIPER_FAULT_DELAY_MS ";
}

std::string ckpt_sets(const std::string& dir, int steps, bool async, const std::string& on_error) {
  return "--set train.steps=" + std::to_string(steps) + " --set train.log_every=1 --set checkpoint.dir=" + dir +
         " --set checkpoint.every=1 --set checkpoint.keep=2 --set checkpoint.async=" + (async ? "true" : "false") +
         " --set checkpoint.on_error=" + on_error + " --set parallel.comm_timeout_s=5";
}

std::string dp_sets(int np) { return np > 1 ? "--set parallel.dp=" + std::to_string(np) + " " : ""; }

std::vector<std::string> temporaries(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().find(".tmp") != std::string::npos) out.push_back(e.path().string());
  return out;
}

std::string latest_of(const std::string& dir) {
  std::ifstream f(dir + "/latest");
  std::string name;
  std::getline(f, name);
  return name;
}

// The promises after a failed save whose previous checkpoint was step `kept`: `latest` names step `kept`,
// which verifies and resumes under the same strategy; nothing half-written is left (after a rank was killed:
// once the resumed run has saved).
void expect_previous_checkpoint_intact(const std::string& dir, int np, int kept, bool killed = false) {
  if (!killed) {
    EXPECT_TRUE(temporaries(dir).empty()) << "a temporary file is left in " << dir;
  }
  char name[32];
  std::snprintf(name, sizeof name, "step_%08d.h5", kept);
  EXPECT_EQ(latest_of(dir), name);
  const auto v = run("timeout 60 " + piper() + " ckpt verify " + dir + "/latest");
  EXPECT_EQ(v.code, 0) << v.output;
  const auto r = run("timeout 120 " + mpirun(np) + piper() +
                     train_args(dp_sets(np) + ckpt_sets(dir, kept + 1, false, "stop")) + " --resume");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from latest at step " + std::to_string(kept)), std::string::npos) << r.output;
  EXPECT_TRUE(temporaries(dir).empty()) << "a temporary file is left in " << dir << " after the resumed run";
}

void expect_one_clean_message(const std::string& out) {
  EXPECT_EQ(out.find("internal error"), std::string::npos) << out;
  EXPECT_EQ(out.find("Segmentation"), std::string::npos) << out;
  EXPECT_EQ(out.find("terminate called"), std::string::npos) << out;
  EXPECT_EQ(out.find("MPI_ABORT was invoked"), std::string::npos) << "Open MPI's help text reached the user:\n"
                                                                   << out;
}

// ---- a write error during a save: the shim -------------------------------------------------

struct DiskFault {
  const char* name;
  int np;
  bool async;
  int rank;            // the rank whose writes fail; -1 every rank
  long long after;     // bytes of step 2's file let through before the writes fail
  int err;             // errno of the failed writes (28 ENOSPC, 5 EIO); 0: the flush fails instead
  const char* expect;  // the OS error in the message
};

void PrintTo(const DiskFault& f, std::ostream* os) { *os << f.name; }

class SaveWriteError : public ::testing::TestWithParam<DiskFault> {};

std::string fault_command(const DiskFault& f, const std::string& dir, const std::string& on_error) {
  std::string env = "PIPER_FAULT_AFTER=" + std::to_string(f.after);
  if (f.err) env += " PIPER_FAULT_ERRNO=" + std::to_string(f.err);
  else env = "PIPER_FAULT_SYNC=1";
  if (f.rank >= 0) env += " PIPER_FAULT_RANK=" + std::to_string(f.rank);
  return "timeout 120 " + shim_env("step_00000002", env) + mpirun(f.np, forwarded()) + piper() +
         train_args(dp_sets(f.np) + ckpt_sets(dir, 4, f.async, on_error));
}

TEST_P(SaveWriteError, StopEndsExit3NamingRankPathAndErrorAndKeepsTheLastCheckpoint) {
  const DiskFault& f = GetParam();
  TempDir tmp(std::string("wfault-") + f.name);
  const std::string dir = tmp.file("ckpt");
  const auto t0 = Clock::now();
  const auto r = run(fault_command(f, dir, "stop"));
  const double took = seconds_since(t0);
  std::printf("[ disk fault ] %s: exit %d after %.1f s\n%s", f.name, r.code, took, r.output.c_str());
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_LT(took, kBoundS);
  EXPECT_EQ(count(r.output, "piper: error: checkpoint save failed"), 1u) << r.output;
  EXPECT_NE(r.output.find(".step_00000002.h5.tmp"), std::string::npos) << "the path is not named";
  EXPECT_NE(r.output.find(f.expect), std::string::npos) << "the OS error is not named";
  if (f.np > 1 && f.rank >= 0) {
    EXPECT_NE(r.output.find("world rank " + std::to_string(f.rank)), std::string::npos) << "the rank is not named";
  }
  // A synchronous save fails before step 3; a background one is found failed at a later step boundary.
  if (f.async) {
    EXPECT_GE(step_lines(r.output), 2u);
  } else {
    EXPECT_EQ(step_lines(r.output), 2u) << "training went on past the failed save";
  }
  expect_one_clean_message(r.output);
  expect_previous_checkpoint_intact(dir, f.np, 1);
}

TEST_P(SaveWriteError, ContinueWarnsAndTrainsOn) {
  const DiskFault& f = GetParam();
  TempDir tmp(std::string("wfault-cont-") + f.name);
  const std::string dir = tmp.file("ckpt");
  const auto r = run(fault_command(f, dir, "continue"));
  std::printf("[ disk fault, continue ] %s: exit %d\n", f.name, r.code);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "piper: warning: checkpoint " + dir + "/step_00000002.h5 not saved"), 1u) << r.output;
  EXPECT_NE(r.output.find("the newest checkpoint is still " + dir + "/step_00000001.h5"), std::string::npos)
      << r.output;
  EXPECT_EQ(step_lines(r.output), 4u);
  expect_one_clean_message(r.output);
  // Only step 2's file was faulty: the later saves land, and the last is `latest`.
  EXPECT_TRUE(temporaries(dir).empty());
  EXPECT_FALSE(fs::exists(dir + "/step_00000002.h5"));
  EXPECT_EQ(latest_of(dir), "step_00000004.h5");
  EXPECT_EQ(run(piper() + " ckpt verify " + dir + "/latest").code, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, SaveWriteError,
    ::testing::Values(
        // One rank: the structure itself cannot be written, or the data after the first MiB.
        DiskFault{"sync_1rank_structure_enospc", 1, false, -1, 0, 28, "No space left on device"},
        DiskFault{"sync_1rank_data_enospc", 1, false, -1, 1 << 20, 28, "No space left on device"},
        DiskFault{"async_1rank_data_eio", 1, true, -1, 1 << 20, 5, "Input/output error"},
        DiskFault{"sync_1rank_flush_eio", 1, false, -1, 1LL << 40, 0, "Input/output error"},
        // Two ranks: only one of them fails.
        DiskFault{"sync_2rank_rank1_data_eio", 2, false, 1, 0, 5, "Input/output error"},
        DiskFault{"sync_2rank_rank0_structure_enospc", 2, false, 0, 0, 28, "No space left on device"},
        DiskFault{"async_2rank_rank1_data_enospc", 2, true, 1, 0, 28, "No space left on device"}),
    [](const ::testing::TestParamInfo<DiskFault>& p) { return std::string(p.param.name); });

// ---- a file system that fills up: a small tmpfs ------------------------------------------------

// A tmpfs of `mib` MiB at a fresh folder, unmounted with the object; ok() false where mounting is refused.
class SmallFs {
 public:
  SmallFs(const std::string& path, int mib, bool read_only_bind = false) : path_(path) {
    fs::create_directories(path_);
    if (read_only_bind) {
      const std::string src = path_ + ".src";
      fs::create_directories(src);
      ok_ = ::mount(src.c_str(), path_.c_str(), nullptr, MS_BIND, nullptr) == 0;
      if (ok_) ok_ = ::mount(nullptr, path_.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) == 0;
    } else {
      const std::string opts = "size=" + std::to_string(mib) + "m";
      ok_ = ::mount("tmpfs", path_.c_str(), "tmpfs", 0, opts.c_str()) == 0;
    }
    if (!ok_) why_ = std::strerror(errno);
  }
  ~SmallFs() { ::umount2(path_.c_str(), MNT_DETACH); }
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }

 private:
  std::string path_, why_;
  bool ok_ = false;
};

struct FullCase {
  const char* name;
  int np;
  bool async;
};
void PrintTo(const FullCase& c, std::ostream* os) { *os << c.name; }
class FullDisk : public ::testing::TestWithParam<FullCase> {};

// 5 MiB hold the tiny model's first two checkpoints (1.9 MB each, keep 2); the third save finds no room.
TEST_P(FullDisk, SaveWithoutRoomStopsExit3AndKeepsTheLastCheckpoint) {
  const FullCase& c = GetParam();
  TempDir tmp(std::string("full-") + c.name);
  SmallFs small(tmp.file("mnt"), 5);
  if (!small.ok()) GTEST_SKIP() << "not run: cannot mount a tmpfs here (" << small.why() << ")";
  const std::string dir = tmp.file("mnt") + "/ckpt";
  const auto t0 = Clock::now();
  const auto r = run("timeout 120 " + mpirun(c.np) + piper() + train_args(dp_sets(c.np) + ckpt_sets(dir, 4, c.async, "stop")));
  const double took = seconds_since(t0);
  std::printf("[ full disk ] %s: exit %d after %.1f s\n%s", c.name, r.code, took, r.output.c_str());
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_LT(took, kBoundS);
  EXPECT_EQ(count(r.output, "piper: error: checkpoint save failed"), 1u) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(".step_00000003.h5.tmp"), std::string::npos) << r.output;
  expect_one_clean_message(r.output);
  EXPECT_TRUE(temporaries(dir).empty());
  EXPECT_EQ(latest_of(dir), "step_00000002.h5");
  EXPECT_EQ(run(piper() + " ckpt verify " + dir + "/latest").code, 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, FullDisk,
                         ::testing::Values(FullCase{"sync_1rank", 1, false}, FullCase{"async_1rank", 1, true},
                                           FullCase{"sync_2rank", 2, false}, FullCase{"async_2rank", 2, true}),
                         [](const ::testing::TestParamInfo<FullCase>& p) { return std::string(p.param.name); });

// ---- a folder nobody can write: refused before any step -----------------------------------------

void expect_refused_before_work(const std::string& dir, int np, const std::string& reason) {
  const auto t0 = Clock::now();
  const auto r = run("timeout 60 " + mpirun(np) + piper() + train_args(dp_sets(np) + ckpt_sets(dir, 3, false, "stop")));
  std::printf("[ unwritable ] %s (np %d): exit %d after %.1f s: %s", dir.c_str(), np, r.code, seconds_since(t0),
              r.output.c_str());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(count(r.output, "piper: error: checkpoint.dir '" + dir + "'"), 1u) << r.output;
  EXPECT_NE(r.output.find(reason), std::string::npos) << r.output;
  EXPECT_EQ(step_lines(r.output), 0u) << "training started";
  expect_one_clean_message(r.output);
}

TEST(UnwritableCheckpointDir, PathUnderARegularFile) {
  TempDir tmp("unwritable-under-file");
  const std::string file = tmp.write("plain", "x");
  expect_refused_before_work(file + "/ckpt", 2, "Not a directory");
}

TEST(UnwritableCheckpointDir, PathThatIsAFile) {
  TempDir tmp("unwritable-is-file");
  expect_refused_before_work(tmp.write("plain", "x"), 1, "Not a directory");
}

TEST(UnwritableCheckpointDir, ReadOnlyMount) {
  TempDir tmp("unwritable-ro");
  SmallFs ro(tmp.file("ro"), 0, true);
  if (!ro.ok()) GTEST_SKIP() << "not run: cannot bind-mount read-only here (" << ro.why() << ")";
  expect_refused_before_work(tmp.file("ro") + "/ckpt", 2, "Read-only file system");
}

TEST(UnwritableCheckpointDir, NoRoomForOneCheckpoint) {
  TempDir tmp("unwritable-small");
  SmallFs small(tmp.file("mnt"), 3);
  if (!small.ok()) GTEST_SKIP() << "not run: cannot mount a tmpfs here (" << small.why() << ")";
  expect_refused_before_work(tmp.file("mnt") + "/ckpt", 2, "free, but a checkpoint of this model takes up to");
}

// ---- a rank that stalls or dies during a save ----------------------------------------------------

struct RankFault {
  const char* name;
  bool async;
  int victim;
  int signal;
};
void PrintTo(const RankFault& c, std::ostream* os) { *os << c.name; }
class RankDuringSave : public ::testing::TestWithParam<RankFault> {};

// Each rank's flush of step 2's file lasts 2 s (the shim), so the signal lands inside the save.
TEST_P(RankDuringSave, JobEndsBoundedNamingTheRankAndTheLastCheckpointResumes) {
  const RankFault& c = GetParam();
  constexpr int kTimeout = 3;  // parallel.comm_timeout_s
  TempDir tmp(std::string("rank-save-") + c.name);
  const std::string dir = tmp.file("ckpt");
  const std::string marker = tmp.file("marker-metrics.jsonl");
  const std::string cmd = shim_env("step_00000002", "PIPER_FAULT_DELAY_MS=2000") + mpirun(2, forwarded()) + piper() +
                          train_args(dp_sets(2) + ckpt_sets(dir, 1000000, c.async, "stop") +
                                     " --set parallel.comm_timeout_s=" + std::to_string(kTimeout)) +
                          " --metrics " + marker;
  Job job(cmd, tmp.file("out.txt"), marker);
  // Wait for step 2's temporary to appear: the save is under way.
  const auto t_start = Clock::now();
  bool saving = false;
  while (!saving && seconds_since(t_start) < 120 && !job.wait_end(0)) {
    for (const auto& t : temporaries(dir)) saving = saving || t.find("step_00000002") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(saving) << "step 2's save never started:\n" << job.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const pid_t victim = job.rank_pid(c.victim);
  ASSERT_GT(victim, 0);
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(victim, c.signal), 0);
  const bool ended = job.wait_end(kBoundS);
  const double took = seconds_since(t0);
  const std::string out = job.output();
  std::printf("[ rank during save ] %s: %s rank %d -> ended %s after %.2f s, exit %d\n%s\n", c.name,
              c.signal == SIGKILL ? "SIGKILL" : "SIGSTOP", c.victim, ended ? "" : "NOT", took, job.code(), out.c_str());
  ASSERT_TRUE(ended) << "the job hangs " << kBoundS << " s after the fault";
  EXPECT_NE(job.code(), 0);
  EXPECT_EQ(out.find("Segmentation"), std::string::npos);
  EXPECT_EQ(out.find("terminate called"), std::string::npos);
  if (c.signal == SIGSTOP) {
    // The other rank waits at most a few timeouts (it may be 2 s into its own flush) and names the stalled rank.
    EXPECT_EQ(job.code(), 3) << out;
    EXPECT_LT(took, 4.0 * kTimeout + 5) << out;
    const std::regex names_victim("world rank " + std::to_string(c.victim) + "(,|\\)| did not| \\(stalled|, which did not)");
    EXPECT_TRUE(std::regex_search(out, names_victim)) << "the stalled rank is not named:\n" << out;
  }
  // step 1's checkpoint is whole and resumes.
  expect_previous_checkpoint_intact(dir, 2, 1, c.signal == SIGKILL);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, RankDuringSave,
    ::testing::Values(RankFault{"sync_stall_rank1", false, 1, SIGSTOP}, RankFault{"sync_stall_rank0", false, 0, SIGSTOP},
                      RankFault{"async_stall_rank1", true, 1, SIGSTOP}, RankFault{"sync_kill_rank1", false, 1, SIGKILL}),
    [](const ::testing::TestParamInfo<RankFault>& p) { return std::string(p.param.name); });

// ---- a signal during a long step: a text sample of 60,000 tokens ----------------------------------

TEST(SignalDuringSample, SigtermEndsTheSampleAndCheckpointsAtOnce) {
  TempDir tmp("sigterm-sample");
  const std::string dir = tmp.file("ckpt"), marker = tmp.file("marker-metrics.jsonl");
  const std::string cmd = mpirun(1) + piper() +
                          train_args("--set train.steps=100 --set train.sample_every=1 --set train.sample_tokens=60000 "
                                     "--set checkpoint.dir=" + dir) +
                          " --metrics " + marker;
  Job job(cmd, tmp.file("out.txt"), marker);
  ASSERT_TRUE(job.wait_for_step(120)) << job.output();  // the sample after step 0 is under way
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const pid_t rank = job.rank_pid(0);
  ASSERT_GT(rank, 0);
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(rank, SIGTERM), 0);
  const bool ended = job.wait_end(60);
  const double took = seconds_since(t0);
  std::printf("[ sigterm during a sample ] ended %s after %.2f s, exit %d\n", ended ? "" : "NOT", took, job.code());
  ASSERT_TRUE(ended);
  // A whole sample takes minutes here; the signal cuts it short, and the checkpoint follows.
  EXPECT_LT(took, 20.0);
  EXPECT_EQ(job.code(), 0) << job.output();
  EXPECT_NE(job.output().find("piper: checkpointed at step 1 after signal"), std::string::npos) << job.output();
  EXPECT_EQ(latest_of(dir), "step_00000001.h5");
}

}  // namespace
}  // namespace piper::e2e
