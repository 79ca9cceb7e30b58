// test_config.cpp — unit tests of config parsing, overrides, validation messages and YAML round trips.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "config/config.hpp"

namespace piper::config {
namespace {

// ---- good configs ---------------------------------------------------------------

TEST(Config, DefaultsRoundTripThroughYaml) {
  Config defaults;
  std::string text = to_yaml(defaults);
  for (const char* key : {"pattern:", "vocab_size:", "ssd_chunk:", "threads:", "path:", "split_backward:"})
    EXPECT_NE(text.find(key), std::string::npos) << key;
  Config back = parse(text, "roundtrip.yaml");
  EXPECT_TRUE(back.same_settings(defaults));
  EXPECT_EQ(back.source, "roundtrip.yaml");
  EXPECT_EQ(back.yaml_text, text);
  EXPECT_NO_THROW(validate(back, 1));
}

// train.precision's names read to their settings, and only bf16 stores the activations in bf16.
TEST(Config, PrecisionNamesAndTheActivationsStorage) {
  for (const auto& [name, want, bf16] : std::vector<std::tuple<std::string, Precision, bool>>{
           {"fp32", Precision::PRECISION_FP32, false},
           {"tf32", Precision::PRECISION_TF32, false},
           {"bf16", Precision::PRECISION_BF16, true}}) {
    ASSERT_TRUE(precision_named(name).has_value()) << name;
    EXPECT_EQ(*precision_named(name), want) << name;
    TrainConfig t;
    t.precision = name;
    EXPECT_EQ(precision_of(t), want) << name;
    EXPECT_EQ(stores_in_bf16(want), bf16) << name;
  }
  EXPECT_FALSE(precision_named("BF16").has_value());
  TrainConfig t;
  t.precision = "fp8";
  try {
    precision_of(t);
    ADD_FAILURE() << "fp8 read as a precision";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.precision: must be 'fp32', 'tf32' or 'bf16', not 'fp8'"),
              std::string::npos)
        << e.what();
  }
}

// train.device's and train.device_comm's names read to their settings, and no others.
TEST(Config, DeviceAndDeviceCommNames) {
  EXPECT_EQ(device_names(), (std::vector<std::string>{"cpu", "cuda", "cpu_detached"}));
  for (const std::string& name : device_names()) {
    ASSERT_TRUE(device_named(name).has_value()) << name;
    EXPECT_EQ(device_name(*device_named(name)), name);
  }
  EXPECT_EQ(device_named("cuda"), Device::DEVICE_CUDA);
  EXPECT_FALSE(device_named("gpu").has_value());
  for (const auto& [name, want] : std::vector<std::pair<std::string, DeviceComm>>{
           {"auto", DeviceComm::DEVICE_COMM_AUTO}, {"nccl", DeviceComm::DEVICE_COMM_NCCL}, {"mpi", DeviceComm::DEVICE_COMM_MPI}}) {
    TrainConfig t;
    t.device_comm = name;
    EXPECT_EQ(device_comm_of(t), want) << name;
  }
  TrainConfig t;
  t.device = "tpu";
  t.device_comm = "gloo";
  for (const auto& [read, want] : std::vector<std::pair<std::function<void()>, std::string>>{
           {[&] { device_of(t); }, "train.device: must be 'cpu', 'cuda' or 'cpu_detached', not 'tpu'"},
           {[&] { device_comm_of(t); }, "train.device_comm: must be 'auto', 'nccl' or 'mpi', not 'gloo'"}}) {
    try {
      read();
      ADD_FAILURE() << "read: " << want;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

TEST(Config, EmptyTextGivesDefaults) {
  const Config defaults;
  Config c = parse("", "empty.yaml");
  EXPECT_TRUE(c.same_settings(defaults));
  EXPECT_TRUE(c.locations.empty());
  EXPECT_EQ(c.yaml_text, to_yaml(defaults));
  Config d = parse("# only a comment\nmodel:\n", "comment.yaml");
  EXPECT_TRUE(d.same_settings(defaults));
}

TEST(Config, OddValuesRoundTrip) {
  Config c;
  c.model.pattern = "*M-";          // would be a YAML alias unquoted
  c.model.rope_theta = 500000.0;
  c.train.lr = 1e-8 / 3;            // needs every digit
  c.train.eps = 1e-300;
  c.train.min_lr_ratio = 0.0;
  c.train.seed = 18446744073709551615ULL;
  c.train.threads = -1;             // invalid, but the text must still carry it
  c.data.path = "dir with: colon/\"q\"\\x\t.tok";
  c.parallel.schedule = "yes";      // a string that YAML 1.1 would read as a bool
  c.parallel.split_backward = true;
  Config back = parse(to_yaml(c), "odd.yaml");
  EXPECT_TRUE(back.same_settings(c));
  EXPECT_EQ(back.train.lr, c.train.lr);
  EXPECT_EQ(back.data.path, c.data.path);
}

TEST(Config, ValidConfigParsesToItsValues) {
  const std::string text =
      "model:\n"
      "  pattern: M*-M\n"
      "  vocab_size: 512\n"
      "  d_model: 128\n"
      "  n_heads: 4\n"
      "  n_kv_heads: 2\n"
      "  rope_theta: 5e5\n"
      "train:\n"
      "  steps: 20\n"
      "  lr: 0.001\n"
      "  seed: 7\n"
      "  global_batch: 12\n"
      "data:\n"
      "  path: /tmp/x.tok\n"
      "parallel:\n"
      "  microbatches: 3\n"
      "  schedule: gpipe\n"
      "  split_backward: yes\n";
  Config c = parse(text, "good.yaml");
  EXPECT_EQ(c.model.pattern, "M*-M");
  EXPECT_EQ(c.model.n_blocks(), 4);
  EXPECT_EQ(c.model.vocab_size, 512);
  EXPECT_EQ(c.model.d_model, 128);
  EXPECT_EQ(c.model.n_heads, 4);
  EXPECT_EQ(c.model.n_kv_heads, 2);
  EXPECT_EQ(c.model.rope_theta, 5e5);
  EXPECT_EQ(c.model.ffn_hidden, ModelConfig().ffn_hidden);  // untouched keys keep defaults
  EXPECT_EQ(c.train.steps, 20);
  EXPECT_EQ(c.train.lr, 0.001);
  EXPECT_EQ(c.train.seed, 7u);
  EXPECT_EQ(c.train.global_batch, 12);
  EXPECT_EQ(c.data.path, "/tmp/x.tok");
  EXPECT_EQ(c.parallel.microbatches, 3);
  EXPECT_EQ(c.parallel.schedule, "gpipe");
  EXPECT_TRUE(c.parallel.split_backward);
  EXPECT_EQ(c.locations.at("model.d_model"), "good.yaml:4:3");
  EXPECT_EQ(c.locations.at("parallel.split_backward"), "good.yaml:18:3");
  EXPECT_EQ(c.locations.count("model.ffn_hidden"), 0u);
  EXPECT_NO_THROW(validate(c, 1));
  EXPECT_TRUE(parse(c.yaml_text, "again").same_settings(c));
}

TEST(Config, OverridesApplyAfterTheFileInOrder) {
  const std::string text = "model:\n  d_model: 128\ntrain:\n  steps: 5\n";
  Config c = parse(text, "base.yaml",
                   {"model.d_model=64", "train.steps=9", "train.steps=11", "train.lr=2e-4",
                    "parallel.split_backward=true", "model.pattern=*M-", "data.path=a b.tok",
                    "parallel.schedule='zbh1'", " train.warmup_steps = 3"});
  EXPECT_EQ(c.model.d_model, 64);
  EXPECT_EQ(c.train.steps, 11);
  EXPECT_EQ(c.train.lr, 2e-4);
  EXPECT_TRUE(c.parallel.split_backward);
  EXPECT_EQ(c.model.pattern, "*M-");
  EXPECT_EQ(c.data.path, "a b.tok");
  EXPECT_EQ(c.parallel.schedule, "zbh1");
  EXPECT_EQ(c.train.warmup_steps, 3);
  EXPECT_EQ(c.locations.at("model.d_model"), "--set");
  EXPECT_NE(c.yaml_text.find("d_model: 64"), std::string::npos);
  EXPECT_TRUE(parse(c.yaml_text, "resolved").same_settings(c));
}

TEST(Config, LoadReadsAFile) {
  std::filesystem::path p = std::filesystem::path(testing::TempDir()) / "piper_cfg_load.yaml";
  {
    std::ofstream f(p);
    f << "train:\n  steps: 3\n";
  }
  Config c = load(p.string(), {"train.seq_len=32"});
  EXPECT_EQ(c.source, p.string());
  EXPECT_EQ(c.train.steps, 3);
  EXPECT_EQ(c.train.seq_len, 32);
  EXPECT_EQ(c.locations.at("train.steps"), p.string() + ":2:3");
  std::filesystem::remove(p);
}

TEST(Config, ValidateReportsEveryProblem) {
  Config c = parse("train:\n  lr: 0\n  steps: 0\n", "two.yaml");
  try {
    validate(c, 1);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("two.yaml:2:3: train.lr=0.0: must be > 0"), std::string::npos) << m;
    EXPECT_NE(m.find("two.yaml:3:3: train.steps=0: must be at least 1"), std::string::npos) << m;
  }
}

// ---- the tuner's benchmark models (config/examples/, docs/tuner.md) ---------------

TEST(Config, TunerModelsAreTheTightRegimeOnSixtyFourRanks) {
  // Each is 4096-token sequences, 64 a step, with a strategy of 64 ranks that validates, also at the
  // ample regime's batch (bench/tuner.py sets train.global_batch=1024); its header names the
  // `piper tune` command line of its own path.
  for (const char* name : {"nemotron-h-8b", "jamba-moe", "mamba-attn-tail", "llama-8b"}) {
    const std::string rel = std::string("config/examples/") + name + ".yaml";
    const std::string path = std::string(PIPER_SOURCE_DIR) + "/" + rel;
    const Config c = load(path);
    EXPECT_EQ(c.train.seq_len, 4096) << rel;
    EXPECT_EQ(c.train.global_batch, 64) << rel;
    const EffectiveStrategy s = effective_strategy(c);
    EXPECT_EQ(s.parallel.dp * s.parallel.tp * s.parallel.pp, 64) << rel;
    EXPECT_NO_THROW(validate(c, 64)) << rel;
    EXPECT_NO_THROW(validate(load(path, {"train.global_batch=1024"}), 64)) << rel;
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("#   piper tune " + rel + " --world 64 --hardware h100-sxm -o "), std::string::npos)
        << rel;
  }
}

// ---- bad configs: each row must throw a ConfigError naming the given pieces ------

// A valid model with MoE blocks (lines 1-6), for the cases that add to it.
const std::string kMoeModel = "model:\n  pattern: M-E\n  d_model: 64\n  n_experts: 4\n  top_k: 2\n  moe_ffn_hidden: 32\n";

struct BadCase {
  const char* name;
  std::string yaml;
  std::vector<std::string> overrides;
  int world_size;                  // passed to validate() when parse() succeeds
  std::vector<std::string> needs;  // substrings of the message
};

std::ostream& operator<<(std::ostream& os, const BadCase& b) { return os << b.name; }

const std::vector<BadCase> kBad = {
    // syntax and structure
    {"SyntaxError", "model:\n  d_model: 4\n  n_heads: [1,\n", {}, 1,
     {"bad.yaml:", "YAML syntax error", "end of sequence flow not found"}},
    {"SyntaxIllegalValue", "model:\n  d_model: a: b\n", {}, 1, {"bad.yaml:2:", "YAML syntax error"}},
    {"TopLevelNotAMap", "- model\n", {}, 1, {"bad.yaml:1:1", "expected a map with the sections", "a list"}},
    {"UnknownSection", "modle:\n  d_model: 4\n", {}, 1,
     {"bad.yaml:1:1", "unknown section 'modle'", "did you mean 'model'?"}},
    {"KeyOutsideSection", "d_model: 4\n", {}, 1, {"bad.yaml:1:1", "did you mean 'model.d_model'?"}},
    {"UnknownKey", "model:\n  vocab_size: 8\n  dmodel: 3\n", {}, 1,
     {"bad.yaml:3:3", "unknown key 'model.dmodel'", "did you mean 'd_model'?"}},
    {"KeyInWrongSection", "model:\n  steps: 3\n", {}, 1,
     {"bad.yaml:2:3", "unknown key 'model.steps'", "did you mean 'train.steps'?"}},
    {"DuplicateKey", "train:\n  steps: 3\n  steps: 4\n", {}, 1,
     {"bad.yaml:3:3", "duplicate key 'train.steps'", "first at bad.yaml:2:3"}},
    {"SectionNotAMap", "train: 5\n", {}, 1, {"bad.yaml:1:8", "section 'train'", "expected a map of keys", "'5'"}},
    // types
    {"NotAnInteger", "model:\n  pattern: M-\n  d_model: abc\n", {}, 1,
     {"bad.yaml:3:12", "model.d_model", "expected an integer, found 'abc'"}},
    {"FloatForInteger", "train:\n  steps: 2.5\n", {}, 1, {"bad.yaml:2:10", "train.steps", "expected an integer"}},
    {"MapForScalar", "model:\n  d_model:\n    a: 1\n", {}, 1, {"bad.yaml:3:5", "model.d_model", "found a map"}},
    {"EmptyValue", "model:\n  d_model:\n  n_heads: 2\n", {}, 1,
     {"bad.yaml:2:3", "model.d_model", "expected an integer, found an empty value"}},
    {"NotANumber", "train:\n  lr: fast\n", {}, 1, {"bad.yaml:2:7", "train.lr", "expected a number, found 'fast'"}},
    {"InfiniteNumber", "train:\n  lr: .inf\n", {}, 1, {"train.lr", "expected a number"}},
    {"NegativeSeed", "train:\n  seed: -1\n", {}, 1, {"train.seed", "expected a non-negative integer"}},
    {"NotABool", "parallel:\n  split_backward: maybe\n", {}, 1,
     {"bad.yaml:2:19", "parallel.split_backward", "expected true or false, found 'maybe'"}},
    {"ListForString", "data:\n  path: [a, b]\n", {}, 1, {"bad.yaml:2:9", "data.path", "expected a string, found a list"}},
    // overrides
    {"OverrideNoEquals", "", {"train.steps"}, 1, {"--set train.steps", "expected section.key=value"}},
    {"OverrideNoSection", "", {"steps=3"}, 1, {"--set steps=3", "expected section.key=value"}},
    {"OverrideUnknownKey", "", {"model.dmodel=3"}, 1,
     {"--set model.dmodel=3: unknown key 'model.dmodel'", "did you mean 'd_model'?"}},
    {"OverrideUnknownSection", "", {"trian.steps=3"}, 1, {"--set trian.steps=3", "did you mean 'train'?"}},
    {"OverrideBadType", "", {"model.d_model=abc"}, 1,
     {"--set model.d_model=abc", "model.d_model", "expected an integer, found 'abc'"}},
    {"OverrideBadYaml", "", {"train.steps=[1"}, 1, {"--set train.steps=[1", "not valid YAML"}},
    // validation: model
    {"ZeroSize", "model:\n  vocab_size: 0\n", {}, 1, {"bad.yaml:2:3", "model.vocab_size=0", "at least 1"}},
    {"EmptyPattern", "model:\n  pattern: ''\n", {}, 1, {"bad.yaml:2:3", "model.pattern", "empty"}},
    {"BadPatternSymbol", "model:\n  pattern: M-X\n", {}, 1,
     {"bad.yaml:2:3", "model.pattern=\"M-X\"", "'X'", "M (Mamba-2), * (attention), - (MLP) or E (MoE)"}},
    // an E without its keys: each named at the pattern, with what to set
    {"MoeWithoutKeys", "model:\n  pattern: M-E\n", {}, 1,
     {"bad.yaml:2:3: model.n_experts: not given; the pattern \"M-E\" has MoE blocks (block 2 is E)",
      "set model.n_experts (e.g. 8)", "bad.yaml:2:3: model.top_k: not given", "bad.yaml:2:3: model.moe_ffn_hidden: not given"}},
    {"MoeTopKAboveExperts", "model:\n  pattern: E\n  n_experts: 4\n  top_k: 5\n  moe_ffn_hidden: 64\n", {}, 1,
     {"bad.yaml:4:3: model.top_k=5: 5 experts per token, but model.n_experts=4 (at bad.yaml:3:3) is 4",
      "use top_k <= n_experts"}},
    {"MoeAuxCoefNegative", "model:\n  moe_aux_coef: -1\n", {}, 1, {"bad.yaml:2:3: model.moe_aux_coef=-1", ">= 0"}},
    {"HeadsDontDivide", "model:\n  d_model: 100\n  n_heads: 8\n", {}, 1,
     {"bad.yaml:2:3", "model.d_model=100", "not divisible by model.n_heads=8 (at bad.yaml:3:3)", "96 or 104"}},
    {"KvHeadsDontDivide", "model:\n  n_heads: 8\n  n_kv_heads: 3\n", {}, 1,
     {"bad.yaml:2:3: model.n_heads=8", "model.n_kv_heads=3 (at bad.yaml:3:3)", "2 or 4"}},
    {"OddAttentionHeadDim", "model:\n  d_model: 36\n  n_heads: 4\n  n_kv_heads: 2\n  head_dim: 36\n", {}, 1,
     {"bad.yaml:2:3", "model.d_model=36", "head dim", "= 9 is odd", "RoPE"}},
    {"MambaHeadDim", "model:\n  head_dim: 48\n", {}, 1,
     {"bad.yaml:2:3: model.head_dim=48", "does not divide d_inner = expand(2) x d_model(256) = 512", "32 or 64"}},
    {"MambaGroups", "model:\n  n_groups: 3\n", {}, 1,
     {"bad.yaml:2:3: model.n_groups=3", "Mamba-2 head count", "= 16", "2 or 4"}},
    // validation: train
    {"ZeroLr", "train:\n  lr: 0\n", {}, 1, {"bad.yaml:2:3", "train.lr=0.0", "must be > 0"}},
    {"BetaOne", "train:\n  beta2: 1\n", {}, 1, {"bad.yaml:2:3", "train.beta2=1.0", "in [0, 1)"}},
    {"NegativeBeta", "", {"train.beta1=-0.1"}, 1, {"--set train.beta1=-0.1", "in [0, 1)"}},
    {"ZeroEps", "train:\n  eps: 0\n", {}, 1, {"train.eps=0.0", "must be > 0"}},
    {"NegativeWeightDecay", "train:\n  weight_decay: -0.1\n", {}, 1, {"train.weight_decay=-0.1", ">= 0"}},
    {"NegativeClip", "train:\n  grad_clip: -1\n", {}, 1, {"train.grad_clip=-1.0", ">= 0"}},
    {"NegativeWarmup", "train:\n  warmup_steps: -5\n", {}, 1, {"train.warmup_steps=-5", "at least 0"}},
    {"ZeroSteps", "train:\n  steps: 0\n", {}, 1, {"bad.yaml:2:3", "train.steps=0", "at least 1"}},
    {"ZeroSeqLen", "", {"train.seq_len=0"}, 1, {"--set train.seq_len=0", "at least 1"}},
    {"BatchNotDivisible", "train:\n  global_batch: 10\nparallel:\n  microbatches: 4\n", {}, 1,
     {"bad.yaml:2:3: train.global_batch=10", "dp x microbatches = 1 x 4 = 4",
      "parallel.microbatches=4 (at bad.yaml:4:3)", "parallel.dp=1 (default)", "8 or 12"}},
    {"EmptyDataPath", "data:\n  path: \"\"\n", {}, 1, {"bad.yaml:2:3", "data.path", "token file"}},
    // validation: held-out evaluation
    {"EvalFractionOne", "data:\n  eval_fraction: 1\n", {}, 1,
     {"bad.yaml:2:3: data.eval_fraction=1.0: must be in [0, 1)", "1 would leave nothing to train on"}},
    {"EvalFractionNegative", "", {"data.eval_fraction=-0.1"}, 1, {"--set data.eval_fraction=-0.1: must be in [0, 1)"}},
    {"EvalFractionAndPath", "data:\n  eval_fraction: 0.1\n  eval_path: held.tok\n", {}, 1,
     {"bad.yaml:3:3: data.eval_path=\"held.tok\": give data.eval_fraction or data.eval_path, not both",
      "data.eval_fraction=0.1 (at bad.yaml:2:3)"}},
    {"EvalWithoutHeldOutData", "train:\n  eval_every: 10\n", {}, 1,
     {"bad.yaml:2:3: train.eval_every=10: evaluates on held-out data, and there is none",
      "set data.eval_fraction (e.g. 0.01", "or data.eval_path"}},
    {"EvalEveryNegative", "train:\n  eval_every: -1\n", {}, 1, {"bad.yaml:2:3: train.eval_every=-1: must be at least 0"}},
    {"EvalBatchesZero", "train:\n  eval_batches: 0\n", {}, 1, {"bad.yaml:2:3: train.eval_batches=0: must be at least 1"}},
    {"EvalTokensOverBound", "train:\n  eval_batches: 16777216\n  global_batch: 16777216\n  seq_len: 16385\n", {}, 1,
     {"bad.yaml:2:3: train.eval_batches=16777216: the tokens of an evaluation eval_batches x global_batch x seq_len",
      "is above the bound 2^62", "train.global_batch=16777216 (at bad.yaml:3:3)"}},
    // validation: parallel
    {"ZeroStage", "parallel:\n  zero: 4\n", {}, 1, {"bad.yaml:2:3", "parallel.zero=4", "0, 1, 2 or 3"}},
    // expert parallelism: carved out of dp, whole experts per rank, only with E blocks
    {"EpDoesNotDivideDp", kMoeModel + "parallel:\n  dp: 3\n  ep: 2\n", {}, 3,
     {"bad.yaml:9:3: parallel.ep=2: 2 does not divide parallel.dp=3 (at bad.yaml:8:3)", "carved out of the data-parallel",
      "use ep 1 or 3, or dp 2 or 4"}},
    {"EpDoesNotDivideExperts", kMoeModel + "parallel:\n  dp: 3\n  ep: 3\n", {}, 3,
     {"bad.yaml:9:3: parallel.ep=3: model.n_experts=4 (at bad.yaml:4:3) does not split into 3 equal groups",
      "use ep 2 or 4"}},
    {"EpWithoutMoe", "parallel:\n  dp: 2\n  ep: 2\n", {}, 2,
     {"bad.yaml:3:3: parallel.ep=2: 2 expert-parallel ranks, but the pattern", "has no MoE block (E)"}},
    {"TensorParallelExperts", "model:\n  pattern: E\n  n_experts: 4\n  top_k: 2\n  moe_ffn_hidden: 30\n",
     {"parallel.tp=4"}, 4,
     {"parallel.tp=4: the expert hidden size (experts are split over tp inside) (model.moe_ffn_hidden = 30) must "
      "divide by tp"}},
    {"WorldSizeMismatch", "parallel:\n  dp: 2\n", {}, 1,
     {"world size 1 != dp(2) x tp(1) x pp(1) = 2", "parallel.dp=2 (at bad.yaml:2:3)", "mpirun -n 2"}},
    {"TensorParallelGroups", "model:\n  n_groups: 1\n", {"parallel.tp=2"}, 2,
     {"--set parallel.tp=2: the Mamba-2 groups (model.n_groups = 1) must divide by tp"}},
    {"TensorParallelKvHeads", "model:\n  n_heads: 8\n  n_kv_heads: 2\n  n_groups: 4\n", {"parallel.tp=4"}, 4,
     {"parallel.tp=4: the key/value heads (model.n_kv_heads = 2) must divide by tp"}},
    {"ZeroNeedsDataParallel", "parallel:\n  zero: 1\n", {}, 1,
     {"bad.yaml:2:3: parallel.zero=1: ZeRO shards over data-parallel ranks", "use dp >= 2 or zero 0"}},
    {"PrecisionUnknown", "train:\n  precision: fp16\n", {}, 1,
     {"bad.yaml:2:3: train.precision", "must be 'fp32', 'tf32' or 'bf16'", "not 'fp16'"}},
    {"DeviceCommUnknown", "train:\n  device_comm: gloo\n", {}, 1,
     {"bad.yaml:2:3: train.device_comm", "must be 'auto', 'nccl' or 'mpi'", "not 'gloo'"}},
    {"DeviceCommNcclOnTheCpu", "train:\n  device_comm: nccl\n", {}, 1,
     {"bad.yaml:2:3: train.device_comm", "'nccl' moves GPU tensors and needs train.device: cuda, not 'cpu'"}},
};

class BadConfig : public testing::TestWithParam<BadCase> {};

TEST_P(BadConfig, ThrowsANamedMessage) {
  const BadCase& b = GetParam();
  std::string message;
  try {
    Config c = parse(b.yaml, "bad.yaml", b.overrides);
    validate(c, b.world_size);
  } catch (const ConfigError& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "no ConfigError";
  for (const std::string& s : b.needs) EXPECT_NE(message.find(s), std::string::npos) << "missing '" << s << "' in:\n" << message;
}

INSTANTIATE_TEST_SUITE_P(Table, BadConfig, testing::ValuesIn(kBad),
                         [](const testing::TestParamInfo<BadCase>& i) { return std::string(i.param.name); });

TEST(Config, MissingFile) {
  try {
    load("/nonexistent/piper.yaml");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "cannot open config file /nonexistent/piper.yaml: No such file or directory");
  }
}

TEST(Config, WorldSizeOneDefaultsAreValid) {
  const Config defaults;
  EXPECT_NO_THROW(validate(defaults, 1));
  EXPECT_THROW(validate(defaults, 2), ConfigError);
}

}  // namespace
}  // namespace piper::config
