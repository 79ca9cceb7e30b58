// test_bounds.cpp — sizes that cannot be computed with are refused by validate() (per-key upper
// bounds and checked products, docs/config.md "Bounds"); the checked arithmetic helper; the config
// file reader (regular files only, a size bound) and CR / CRLF line endings.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "config/checked.hpp"
#include "config/config.hpp"

namespace piper::config {
namespace {

namespace fs = std::filesystem;

constexpr const char* k31 = "2147483647";            // 2^31 - 1
constexpr const char* k63 = "9223372036854775807";   // 2^63 - 1

// ---- the checked arithmetic helper -----------------------------------------------------------

TEST(Checked, MulDetectsOverflowBothSigns) {
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_FALSE(checked_mul(int64_t{1} << 32, int64_t{1} << 31).has_value());
  EXPECT_FALSE(checked_mul(std::numeric_limits<int64_t>::max(), 2).has_value());
  EXPECT_FALSE(checked_mul(std::numeric_limits<int64_t>::min(), -1).has_value());
  EXPECT_EQ(checked_mul(-3, 4), -12);
  EXPECT_FALSE(checked_add(std::numeric_limits<int64_t>::max(), 1).has_value());
  EXPECT_EQ(checked_add(40, 2), 42);
}

TEST(Checked, ProductOverflowAnywhereIsReported) {
  EXPECT_EQ(checked_product({}), 1);
  EXPECT_EQ(checked_product({2, 3, 7}), 42);
  // Each partial product fits but the last step does not.
  EXPECT_FALSE(checked_product({int64_t{1} << 31, int64_t{1} << 31, 2}).has_value());
  // Overflow early, then a zero: still an overflow (no wrapped partial product is used).
  EXPECT_FALSE(checked_product({int64_t{1} << 40, int64_t{1} << 40, 0}).has_value());
  const std::vector<int64_t> v = {1024, 1024, 1024};
  EXPECT_EQ(checked_product(v), int64_t{1} << 30);
}

TEST(Checked, SizeProductThrowsAConfigErrorNamingWhatAndTheFactors) {
  EXPECT_EQ(size_product({6, 7}, "x"), 42);
  try {
    size_product({int64_t{1} << 40, int64_t{1} << 30}, "parameter embed.weight");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("parameter embed.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("1099511627776 x 1073741824"), std::string::npos) << m;
    EXPECT_NE(m.find("64-bit"), std::string::npos) << m;
  }
}

// ---- validate(): per-key bounds and products ----------------------------------------------------

struct Huge {
  const char* name;
  std::vector<std::string> sets;  // --set overrides on the defaults
  std::vector<std::string> needs; // substrings of the message
};

void PrintTo(const Huge& h, std::ostream* os) { *os << h.name; }

// The message of validate() on the defaults with `sets`, or "" when it accepts them. Also fails the
// test when validation takes more than a second (a loop over a huge value).
std::string refusal(const std::vector<std::string>& sets) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    validate(parse("", "huge.yaml", sets), 1);
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  return msg;
}

const std::vector<Huge> kHuge = {
    {"DModel", {std::string("model.d_model=") + k31},
     {"--set model.d_model=2147483647: must be at most 1048576", "Bounds"}},
    {"DModel63", {std::string("model.d_model=") + k63}, {"model.d_model=9223372036854775807: must be at most"}},
    {"Vocab", {"model.vocab_size=2147483648"}, {"model.vocab_size=2147483648: must be at most 2147483647", "32-bit"}},
    {"FfnHidden", {std::string("model.ffn_hidden=") + k31}, {"model.ffn_hidden=2147483647: must be at most 16777216"}},
    {"Heads", {std::string("model.n_heads=") + k31}, {"model.n_heads=2147483647: must be at most 65536"}},
    {"KvHeads", {std::string("model.n_kv_heads=") + k31}, {"model.n_kv_heads=2147483647: must be at most 65536"}},
    {"DState", {std::string("model.d_state=") + k31}, {"model.d_state=2147483647: must be at most 4096", "head_dim x d_state"}},
    {"HeadDim", {std::string("model.head_dim=") + k63}, {"model.head_dim=9223372036854775807: must be at most 4096"}},
    {"Expand", {std::string("model.expand=") + k31}, {"model.expand=2147483647: must be at most 1024"}},
    {"Groups", {std::string("model.n_groups=") + k31}, {"model.n_groups=2147483647: must be at most 65536"}},
    {"Conv", {std::string("model.d_conv=") + k31}, {"model.d_conv=2147483647: must be at most 1024"}},
    {"SsdChunk", {std::string("model.ssd_chunk=") + k63},
     {"--set model.ssd_chunk=9223372036854775807: must be at most 4096", "one chunk"}},
    {"Pattern", {"model.pattern=" + std::string(4097, '-')}, {"model.pattern", "4097 blocks", "at most 4096"}},
    {"GlobalBatch", {std::string("train.global_batch=") + k31},
     {"--set train.global_batch=2147483647: must be at most 16777216"}},
    {"SeqLen", {std::string("train.seq_len=") + k31}, {"--set train.seq_len=2147483647: must be at most 16777216"}},
    {"Threads", {std::string("train.threads=") + k31}, {"--set train.threads=2147483647: must be at most 4096"}},
    {"SampleTokens", {std::string("train.sample_tokens=") + k63}, {"train.sample_tokens=9223372036854775807: must be at most 65536"}},
    {"Dp", {std::string("parallel.dp=") + k31}, {"parallel.dp=2147483647: must be at most 65536"}},
    {"Tp", {std::string("parallel.tp=") + k63}, {"parallel.tp=9223372036854775807: must be at most 65536"}},
    {"Pp", {std::string("parallel.pp=") + k31}, {"parallel.pp=2147483647: must be at most 65536"}},
    // dp x pp = 2^62 does not wrap to a plausible world size
    {"DpTimesPp", {"parallel.dp=65536", "parallel.pp=65536", "parallel.tp=65536"},
     {"world size 1 != dp(65536) x tp(65536) x pp(65536) = 281474976710656"}},
    {"Microbatches", {std::string("parallel.microbatches=") + k31},
     {"parallel.microbatches=2147483647: must be at most 65536"}},
    {"UnitPasses", {"model.pattern=" + std::string(1022, '-'), "parallel.microbatches=2048", "train.global_batch=2048"},
     {"--set parallel.microbatches=2048: the unit passes of a step (blocks + 2) x microbatches = 1024 x 2048 = "
      "2097152 is above the bound 2^20"}},
    {"VirtualStages", {std::string("parallel.virtual_stages=") + k31}, {"parallel.virtual_stages=2147483647"}},
    {"BucketMb", {"parallel.bucket_mb=1e300"}, {"parallel.bucket_mb=1e+300", "at most 1048576 MiB"}},
    {"CommTimeout", {"parallel.comm_timeout_s=1e300"}, {"parallel.comm_timeout_s=1e+300", "at most 1e9 seconds"}},
    // products of values that are each within their bounds
    {"EmbeddingMatrix", {std::string("model.vocab_size=") + k31, "model.d_model=1048576"},
     {"--set model.vocab_size=2147483647: the embedding (and head) matrix vocab_size x d_model = 2147483647 x "
      "1048576 = 2251799812636672 is above the bound 2^40",
      "model.d_model=1048576 (from --set)"}},
    {"MlpMatrix", {"model.ffn_hidden=16777216", "model.d_model=1048576"},
     {"model.ffn_hidden=16777216: the MLP gate/up matrix", "is above the bound 2^40"}},
    {"StepTokens", {"train.global_batch=16777216", "train.seq_len=16777216"},
     {"--set train.global_batch=16777216: the tokens per step global_batch x seq_len = 16777216 x 16777216",
      "above the bound 2^36", "train.seq_len=16777216 (from --set)"}},
    {"RunTokens", {std::string("train.steps=") + k63},
     {"--set train.steps=9223372036854775807: the tokens of the run steps x global_batch x seq_len",
      "= more than 2^63 is above the bound 2^62"}},
};

class HugeSize : public testing::TestWithParam<Huge> {};

TEST_P(HugeSize, IsRefusedNamingTheKeyAndTheBound) {
  const Huge& h = GetParam();
  const std::string msg = refusal(h.sets);
  ASSERT_FALSE(msg.empty()) << "validate() accepted it (a ConfigError, exit 2, was expected)";
  for (const std::string& s : h.needs)
    EXPECT_NE(msg.find(s), std::string::npos) << "missing '" << s << "' in:\n" << msg;
}

INSTANTIATE_TEST_SUITE_P(Table, HugeSize, testing::ValuesIn(kHuge),
                         [](const testing::TestParamInfo<Huge>& i) { return std::string(i.param.name); });

TEST(Bounds, TheLargestValueOfEachBoundIsAccepted) {
  // At the bound itself, with the other sizes at their defaults, validation passes: the bounds
  // refuse only what is beyond them.
  for (const std::vector<std::string>& sets : std::vector<std::vector<std::string>>{
           {"model.vocab_size=2147483647", "model.d_model=256"},
           {"model.d_model=1048576", "model.pattern=*"},  // d_model x d_model = 2^40
           {"model.ssd_chunk=4096"},
           {"model.d_state=4096", "model.head_dim=4096", "model.expand=16"},  // d_inner 4096 = one head
           {"train.sample_tokens=65536"},
           {"train.threads=4096"},
           {"train.global_batch=16777216", "train.seq_len=4096"},
           {"train.seq_len=16777216", "train.global_batch=4096"},
           {"parallel.bucket_mb=1048576", "parallel.comm_timeout_s=1e9"},
           {"model.pattern=" + std::string(1022, '-'), "parallel.microbatches=1024", "train.global_batch=1024"},
       }) {
    std::string joined;
    for (const std::string& s : sets) joined += s + " ";
    EXPECT_EQ(refusal(sets), "") << joined;
  }
}

TEST(Bounds, ShippedConfigsAreWithinTheBounds) {
  // config/ and config/examples/, each at the world its strategy names.
  int checked = 0;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(PIPER_SOURCE_DIR) / "config")) {
    if (e.path().extension() != ".yaml") continue;
    const Config c = load(e.path().string());
    const EffectiveStrategy s = effective_strategy(c);
    const int world = static_cast<int>(s.parallel.dp * s.parallel.tp * s.parallel.pp);
    EXPECT_NO_THROW(validate(c, world)) << e.path();
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

// ---- the config file reader ----------------------------------------------------------------

class ConfigFiles : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("piper_cfg_files_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) const {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
  std::string load_error(const std::string& path) const {
    try {
      load(path);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

// A hung open() ends the test binary after 10 s instead of hanging ctest.
struct Alarm {
  explicit Alarm(unsigned s) { ::alarm(s); }
  ~Alarm() { ::alarm(0); }
};

TEST_F(ConfigFiles, AFifoIsRefusedWithoutWaitingForAWriter) {
  const std::string fifo = (dir_ / "run.yaml").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Alarm guard(10);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = load_error(fifo);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  EXPECT_NE(msg.find("config file " + fifo), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a regular file: it is a FIFO (named pipe)"), std::string::npos) << msg;
}

TEST_F(ConfigFiles, ADirectoryIsRefused) {
  const std::string msg = load_error(dir_.string());
  EXPECT_NE(msg.find("config file " + dir_.string() + ": not a regular file: it is a directory"), std::string::npos)
      << msg;
}

TEST_F(ConfigFiles, AFileAboveSixteenMiBIsRefusedAndOneAtTheBoundIsRead) {
  const std::string comment_line = "# " + std::string(1021, 'x') + "\n";  // 1024 bytes
  std::string text;
  for (int i = 0; i < 16 * 1024; ++i) text += comment_line;  // exactly 16 MiB of comments
  const std::string at_bound = write("at_bound.yaml", text);
  EXPECT_EQ(load_error(at_bound), "");
  const std::string over = write("over.yaml", text + "\n");
  const std::string msg = load_error(over);
  EXPECT_NE(msg.find("config file " + over + ": is 16777217 bytes, more than the 16777216 allowed"), std::string::npos) << msg;
}

TEST_F(ConfigFiles, MissingFileStillSaysSo) {
  const std::string path = (dir_ / "nope.yaml").string();
  EXPECT_EQ(load_error(path), "cannot open config file " + path + ": No such file or directory");
}

// ---- line endings --------------------------------------------------------------------------

TEST(LineEndings, CrOnlyConfigIsReadLineByLine) {
  const Config c = parse("# old Mac\rmodel:\r  d_model: 128\r  n_heads: 4\rtrain:\r  steps: 7\r", "cr.yaml");
  EXPECT_EQ(c.model.d_model, 128);
  EXPECT_EQ(c.model.n_heads, 4);
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.locations.at("model.d_model"), "cr.yaml:3:3");
  EXPECT_EQ(c.locations.at("train.steps"), "cr.yaml:6:3");
}

TEST(LineEndings, CrlfAndMixedConfigsKeepLineNumbers) {
  const Config crlf = parse("model:\r\n  d_model: 128\r\ntrain:\r\n  steps: 7\r\n", "crlf.yaml");
  EXPECT_EQ(crlf.model.d_model, 128);
  EXPECT_EQ(crlf.train.steps, 7);
  EXPECT_EQ(crlf.locations.at("train.steps"), "crlf.yaml:4:3");
  const Config mixed = parse("model:\r\n  d_model: 128\rtrain:\n  steps: 7\r", "mixed.yaml");
  EXPECT_EQ(mixed.model.d_model, 128);
  EXPECT_EQ(mixed.locations.at("train.steps"), "mixed.yaml:4:3");
}

TEST(LineEndings, ErrorsInACrOnlyFileNameTheRightLine) {
  try {
    parse("model:\r  d_model: 64\r  d_modle: 3\r", "cr.yaml");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cr.yaml:3:3: unknown key 'model.d_modle'"), std::string::npos) << e.what();
  }
}

TEST_F(ConfigFiles, CrOnlyFileLoadsWithItsValues) {
  const std::string path = write("cr.yaml", "train:\r  steps: 3\r  seq_len: 32\r");
  const Config c = load(path);
  EXPECT_EQ(c.train.steps, 3);
  EXPECT_EQ(c.train.seq_len, 32);
  EXPECT_EQ(c.locations.at("train.seq_len"), path + ":3:3");
}

}  // namespace
}  // namespace piper::config
