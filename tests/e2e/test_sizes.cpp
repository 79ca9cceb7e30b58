// test_sizes.cpp — sizes a machine cannot hold, and inputs that are not regular files, are
// refused by `piper train` within seconds: exit code 2, one "piper: error:" message naming the key
// (or file), never an internal error, a crash or a hang. Sizes beyond the bounds of docs/config.md
// are refused by validation; sizes within them that do not fit in memory by the memory check
// before the model is allocated; an allocation that fails after that check is an out-of-memory
// user error. Also: a FIFO as the config file or as data.path, and a config with CR-only line
// endings (read line by line, not as one comment).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "e2e/e2e_util.hpp"

namespace piper::e2e {
namespace {

using Clock = std::chrono::steady_clock;

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + needle.size())) ++n;
  return n;
}

std::string tiny_train(const std::string& config = source("config/tiny.yaml")) {
  return piper() + " train " + config + " --set data.path=" + corpus() + " --set train.threads=1 --set train.steps=2";
}

struct Timed {
  RunResult r;
  double seconds = 0;
};

// Runs `cmd` under `timeout 30`; a hang shows as exit code 124.
Timed run_timed(const std::string& cmd) {
  const auto t0 = Clock::now();
  Timed t;
  t.r = run("timeout 30 " + cmd);
  t.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("[ sizes ] %s\n  -> exit %d in %.2f s: %s\n", cmd.c_str(), t.r.code, t.seconds, t.r.output.c_str());
  return t;
}

// Exit 2 within 10 s (not 124: no hang), one error message with every `needs` in it, no
// internal error, no crash, no training step.
void expect_refused(const Timed& t, const std::vector<std::string>& needs) {
  EXPECT_NE(t.r.code, 124) << "timed out (a hang)";
  EXPECT_EQ(t.r.code, 2) << t.r.output;
  EXPECT_LT(t.seconds, 10.0);
  EXPECT_EQ(count(t.r.output, "piper: error:"), 1u) << t.r.output;
  EXPECT_EQ(t.r.output.find("internal error"), std::string::npos) << t.r.output;
  EXPECT_EQ(t.r.output.find("bad_alloc"), std::string::npos) << t.r.output;
  EXPECT_EQ(t.r.output.find("\nstep "), std::string::npos) << "training started";
  for (const std::string& s : needs) EXPECT_NE(t.r.output.find(s), std::string::npos) << "missing '" << s << "'";
}

// ---- sizes ------------------------------------------------------------------------------------

struct HugeCase {
  const char* name;
  const char* sets;
  std::vector<std::string> needs;
};

void PrintTo(const HugeCase& c, std::ostream* os) { *os << c.name; }

class HugeSize : public ::testing::TestWithParam<HugeCase> {};

TEST_P(HugeSize, TrainRefusesWithinSecondsNamingTheKey) {
  const HugeCase& c = GetParam();
  expect_refused(run_timed(tiny_train() + " " + c.sets), c.needs);
}

const std::vector<HugeCase> kHuge = {
    {"DModel", "--set model.d_model=2147483647", {"--set model.d_model=2147483647: must be at most 1048576"}},
    {"FfnHidden", "--set model.ffn_hidden=2147483647", {"--set model.ffn_hidden=2147483647: must be at most"}},
    {"GlobalBatch", "--set train.global_batch=2147483647", {"--set train.global_batch=2147483647: must be at most"}},
    {"SeqLen", "--set train.seq_len=2147483647", {"--set train.seq_len=2147483647: must be at most"}},
    {"Threads", "--set train.threads=2147483647", {"--set train.threads=2147483647: must be at most 4096"}},
    {"SsdChunk", "--set model.ssd_chunk=9223372036854775807",
     {"--set model.ssd_chunk=9223372036854775807: must be at most 4096"}},
    {"DpTimesPp", "--set parallel.dp=4294967296 --set parallel.pp=4294967296", {"parallel.dp=4294967296"}},
    // Within every bound, but terabytes: the memory check names the embedding's keys.
    {"VocabNotInMemory", "--set model.vocab_size=2147483647",
     {"memory: the run does not fit on host", "model.vocab_size x model.d_model = 2147483647 x 64",
      "available (", "docs/config.md, Memory check"}},
    {"WidthNotInMemory", "--set model.d_model=65536 --set model.ffn_hidden=65536",
     {"memory: the run does not fit on host", "model.ffn_hidden x model.d_model = 65536 x 65536",
      "model.expand x model.d_model"}},
    {"BatchNotInMemory", "--set train.global_batch=16777216 --set train.seq_len=4096",
     {"memory: the run does not fit on host", "activations: train.global_batch / (parallel.dp x "
      "parallel.microbatches) x train.seq_len = 16777216 x 4096"}},
};

INSTANTIATE_TEST_SUITE_P(Train, HugeSize, ::testing::ValuesIn(kHuge),
                         [](const ::testing::TestParamInfo<HugeCase>& i) { return std::string(i.param.name); });

TEST(Sizes, NotInMemoryUnderMpirunIsOneMessageAndEveryRankStops) {
  const Timed t = run_timed("mpirun --oversubscribe --allow-run-as-root -np 2 " + tiny_train() +
                            " --set parallel.dp=2 --set model.vocab_size=2147483647");
  EXPECT_NE(t.r.code, 124) << "timed out (a hang)";
  EXPECT_EQ(t.r.code, 2);
  EXPECT_LT(t.seconds, 20.0);
  EXPECT_EQ(count(t.r.output, "piper: error: memory: the run does not fit"), 1u) << t.r.output;
  EXPECT_NE(t.r.output.find("the 2 ranks on this host together"), std::string::npos);
  EXPECT_EQ(t.r.output.find("internal error"), std::string::npos);
}

// MemAvailable in /proc/meminfo, bytes (0 when unknown).
double mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

TEST(Sizes, AnAllocationThatFailsAfterTheCheckIsAnOutOfMemoryError) {
  // The model needs about 1.5 GiB; an address-space limit of 1.5 GB lets the check pass (it reads
  // the host's memory) and makes the allocation fail.
  if (mem_available() < 4.0 * (1 << 30)) GTEST_SKIP() << "under 4 GiB available: the check itself would refuse";
  const Timed t = run_timed("bash -c 'ulimit -v 1500000; exec " + tiny_train() + " --set model.vocab_size=262144'");
  expect_refused(t, {"piper: error: out of memory on rank 0", "the estimate for this rank was", "available ("});
}

TEST(Sizes, AChunkLongerThanTheSequenceTrainsAsOneChunk) {
  // ssd_chunk 4096 > seq_len 64 is one chunk of 64, the same arithmetic as ssd_chunk 64.
  TempDir dir("sizes-chunk");
  auto losses = [&](const std::string& chunk) {
    const std::string metrics = dir.file("m" + chunk + ".jsonl");
    auto r = run(tiny_train() + " --set train.steps=3 --set model.ssd_chunk=" + chunk + " --metrics " + metrics);
    EXPECT_EQ(r.code, 0) << r.output;
    std::vector<double> out;
    for (const auto& row : read_metrics(metrics)) out.push_back(row["loss"].get<double>());
    return out;
  };
  const std::vector<double> whole = losses("64"), longer = losses("4096");
  ASSERT_EQ(whole.size(), 3u);
  ASSERT_EQ(longer.size(), 3u);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_NEAR(longer[i], whole[i], 1e-6 * std::abs(whole[i])) << "step " << i;
}

// ---- files ------------------------------------------------------------------------------------

TEST(Files, AFifoAsTheConfigFileIsRefusedNotWaitedOn) {
  TempDir dir("sizes-fifo-config");
  const std::string fifo = dir.file("run.yaml");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_refused(run_timed(tiny_train(fifo)),
                 {"config file " + fifo + ": not a regular file: it is a FIFO (named pipe)"});
}

TEST(Files, AFifoAsDataPathIsRefusedNotWaitedOn) {
  TempDir dir("sizes-fifo-data");
  const std::string fifo = dir.file("corpus.tok");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_refused(run_timed(tiny_train() + " --set data.path=" + fifo),
                 {"--set data.path=\"" + fifo + "\": token file '" + fifo + "': not a regular file: it is a FIFO (named pipe)"});
}

TEST(Files, AConfigWithCrOnlyLineEndingsTrainsItsOwnModel) {
  // tiny.yaml with every LF turned into CR (classic Mac OS line endings): the same run as the LF
  // file, not the default model.
  TempDir dir("sizes-cr");
  std::ifstream in(source("config/tiny.yaml"), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  for (char& ch : text)
    if (ch == '\n') ch = '\r';
  const std::string cr = dir.file("tiny-cr.yaml");
  std::ofstream(cr, std::ios::binary) << text;
  const Timed lf = run_timed(tiny_train());
  const Timed mac = run_timed(tiny_train(cr));
  ASSERT_EQ(lf.r.code, 0);
  ASSERT_EQ(mac.r.code, 0);
  EXPECT_NE(mac.r.output.find("pattern M*-M-,"), std::string::npos) << "not tiny.yaml's model: " << mac.r.output;
  // Same parameters and the same losses as the LF file.
  auto line_with = [](const std::string& out, const std::string& head) {
    const size_t p = out.find(head);
    return p == std::string::npos ? std::string() : out.substr(p, out.find(',', p) - p);
  };
  EXPECT_EQ(line_with(mac.r.output, "piper: "), line_with(lf.r.output, "piper: "));
  auto loss_of = [](const std::string& out) {
    const size_t p = out.find("summary: ");
    return p == std::string::npos ? std::string() : out.substr(out.find("loss", p), 22);
  };
  EXPECT_FALSE(loss_of(lf.r.output).empty());
  EXPECT_EQ(loss_of(mac.r.output), loss_of(lf.r.output));
}

}  // namespace
}  // namespace piper::e2e
