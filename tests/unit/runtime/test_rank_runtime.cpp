// test_rank_runtime.cpp — runtime::RankRuntime on one rank: training state moved
// into a second runtime of the same plan continues bitwise as the first would,
// the optimiser state (moments, Adam steps) and the data position round-trip
// through a checkpoint, and an evaluation is the step's forward and changes no
// training state.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/mpi_comm.hpp"
#include "config/config.hpp"
#include "data/token_file.hpp"
#include "data/tokenizer.hpp"
#include "ir/compile.hpp"
#include "runtime/checkpointing.hpp"
#include "runtime/mpi_env.hpp"
#include "runtime/rank_runtime.hpp"
#include "runtime/switching.hpp"
#include "unit/test_configs.hpp"

namespace piper::runtime {
namespace {

namespace fs = std::filesystem;

// MPI for the whole test binary (a singleton without mpirun), finalised at exit.
const MpiEnv& mpi() {
  static MpiEnv env(nullptr, nullptr);
  return env;
}

class RankRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mpi();
    dir_ = fs::temp_directory_path() / ("piper-rank-runtime-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // Random ids: every step sees different samples.
    std::mt19937 gen(7);
    std::vector<int32_t> ids(4096);
    for (int32_t& id : ids) id = static_cast<int32_t>(gen() % 32);
    data::write_token_file((dir_ / "tokens.tok").string(), 32, ids);
    tokens_ = std::make_unique<data::TokenFile>((dir_ / "tokens.tok").string());
    cfg_.model = testing::small_model("M*-");
    cfg_.train.steps = 4;
    cfg_.train.global_batch = 4;
    cfg_.train.seq_len = 8;
    cfg_.train.warmup_steps = 1;
    cfg_.parallel.microbatches = 2;
    cfg_.data.path = (dir_ / "tokens.tok").string();
    cfg_.checkpoint.dir = (dir_ / "ckpt").string();
    cfg_.yaml_text = config::to_yaml(cfg_);
    config::validate(cfg_, 1);
    world_ = comm::make_mpi_world();
  }
  void TearDown() override {
    tokens_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::unique_ptr<RankRuntime> make() { return std::make_unique<RankRuntime>(cfg_, ir::compile(cfg_, 1), *world_); }

  fs::path dir_;
  config::Config cfg_;
  std::unique_ptr<data::TokenFile> tokens_;
  const data::ByteTokenizer tokenizer_;
  std::unique_ptr<comm::Communicator> world_;
};

// Elements of every state buffer (values, both moments) of `a` that differ from `b`'s, bit for bit.
int64_t state_differences(RankRuntime& a, RankRuntime& b) {
  int64_t diff = 0;
  for (const state::Piece& p : state::held(a.plan().model, a.layout(), a.rank())) {
    const float* x = a.state_buffer(p);
    const float* y = b.state_buffer(p);
    for (size_t r = 0; r < p.runs.size(); ++r)
      for (int64_t i = 0; i < p.runs[r].size(); ++i)
        diff += std::memcmp(x + p.local_offsets[r] + i, y + p.local_offsets[r] + i, sizeof(float)) != 0;
  }
  return diff;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// A runtime's state moved (runtime/switching.hpp) into a runtime of `plan` on this one rank.
std::unique_ptr<RankRuntime> moved(std::unique_ptr<RankRuntime> from, const config::Config& cfg, const ir::Plan& plan,
                                   comm::Communicator& world, MoveFigures& fig) {
  const ir::Plan old_plan = from->plan();
  auto to = move_state(from.get(), {&old_plan, {0}}, cfg, {&plan, {0}}, &world, world, int64_t{1} << 16, fig);
  from.reset();
  return to;
}

TEST_F(RankRuntimeTest, StateMovedIntoANewRuntimeContinuesBitwise) {
  auto reference = make(), first = make();
  const StepStats s0 = reference->step(*tokens_, tokens_->all());
  first->step(*tokens_, tokens_->all());
  EXPECT_GT(s0.loss_sum, 0.0);
  // The step changed the state: a fresh runtime differs, so the move below is what makes them agree.
  auto fresh = make();
  const int64_t before = state_differences(*reference, *fresh);
  std::printf("[ runtime ] elements differing from a fresh runtime after one step: %lld\n",
              static_cast<long long>(before));
  EXPECT_GT(before, 0);
  fresh.reset();
  MoveFigures fig;
  const ir::Plan plan = ir::compile(cfg_, 1);
  auto second = moved(std::move(first), cfg_, plan, *world_, fig);
  EXPECT_EQ(state_differences(*reference, *second), 0);
  EXPECT_EQ(fig.bytes_sent, 0);  // one process: every piece is a local copy
  EXPECT_GT(fig.bytes_local, 0);
  EXPECT_EQ(second->position().step, 1);
  EXPECT_EQ(second->position().data_position, cfg_.train.global_batch);
  EXPECT_EQ(second->position().tokens_seen, cfg_.train.global_batch * cfg_.train.seq_len);
  EXPECT_EQ(second->optimizer().steps(), 1);
  for (int k = 0; k < 2; ++k) {
    const StepStats a = reference->step(*tokens_, tokens_->all()), b = second->step(*tokens_, tokens_->all());
    std::printf("[ runtime ] step %d: loss sum %.9g vs %.9g, grad norm %.9g vs %.9g\n", k + 1, a.loss_sum,
                b.loss_sum, a.grad_norm, b.grad_norm);
    EXPECT_TRUE(same_bits(a.loss_sum, b.loss_sum));
    EXPECT_TRUE(same_bits(a.grad_norm, b.grad_norm));
    EXPECT_TRUE(same_bits(a.lr, b.lr));
    EXPECT_EQ(state_differences(*reference, *second), 0) << "after step " << k + 1;
  }
}

TEST_F(RankRuntimeTest, StateMovedIntoAnotherPlanKeepsEveryElement) {
  auto reference = make(), first = make();
  reference->step(*tokens_, tokens_->all());
  first->step(*tokens_, tokens_->all());
  config::Config other = cfg_;
  other.parallel.microbatches = 1;
  const ir::Plan plan = ir::compile(other, 1);
  ASSERT_NE(plan.hash, reference->plan().hash);
  MoveFigures fig;
  auto second = moved(std::move(first), other, plan, *world_, fig);
  EXPECT_EQ(state_differences(*reference, *second), 0);
  EXPECT_EQ(second->position().step, 1);
  EXPECT_EQ(second->optimizer().steps(), 1);
  std::printf("[ runtime ] move into microbatches 1: %lld bytes copied\n", static_cast<long long>(fig.bytes_local));
}

TEST_F(RankRuntimeTest, OptimiserStateAndPositionRoundTripThroughACheckpoint) {
  auto saved = make();
  saved->step(*tokens_, tokens_->all());
  saved->step(*tokens_, tokens_->all());
  {
    Checkpointer ckpt(cfg_, *saved, mpi(), tokenizer_);
    ckpt.save();
    ckpt.wait();
  }
  auto loaded = make();
  EXPECT_GT(state_differences(*saved, *loaded), 0);
  Checkpointer ckpt(cfg_, *loaded, mpi(), tokenizer_);
  EXPECT_EQ(ckpt.load("latest"), 2);
  EXPECT_EQ(loaded->optimizer().steps(), saved->optimizer().steps());
  EXPECT_EQ(loaded->position().step, 2);
  EXPECT_EQ(loaded->position().data_position, saved->position().data_position);
  EXPECT_EQ(loaded->position().tokens_seen, saved->position().tokens_seen);
  EXPECT_EQ(state_differences(*saved, *loaded), 0);
  const StepStats a = saved->step(*tokens_, tokens_->all()), b = loaded->step(*tokens_, tokens_->all());
  std::printf("[ runtime ] step after the checkpoint: loss sum %.9g vs %.9g\n", a.loss_sum, b.loss_sum);
  EXPECT_TRUE(same_bits(a.loss_sum, b.loss_sum));
  EXPECT_EQ(state_differences(*saved, *loaded), 0);
}

// Held-out batch 0 of the whole file holds step 0's samples: its loss is the loss sum of step 0's
// forward, bit for bit (the same program's FWD instructions on the same microbatches), and a runtime
// that evaluated trains on exactly as one that did not. For a model with an MoE block too: its balance
// loss is part of both, and its routing statistics stay the training steps'.
TEST_F(RankRuntimeTest, EvaluationIsTheStepsForwardAndChangesNoTrainingState) {
  for (const char* pattern : {"M*-", "*E"}) {
    cfg_.model = testing::small_model(pattern);
    config::validate(cfg_, 1);
    auto evaluated = make(), trained = make();
    const double eval_sum = evaluated->evaluate(*tokens_, tokens_->all(), 1);
    const double again = evaluated->evaluate(*tokens_, tokens_->all(), 1);
    EXPECT_EQ(state_differences(*evaluated, *trained), 0) << pattern;
    EXPECT_EQ(evaluated->position().step, 0);
    EXPECT_EQ(evaluated->position().data_position, 0);
    const StepStats a = trained->step(*tokens_, tokens_->all()), b = evaluated->step(*tokens_, tokens_->all());
    std::printf("[ runtime ] %s: evaluation loss sum %.9g, step 0's %.9g; after it: %.9g\n", pattern, eval_sum,
                a.loss_sum, b.loss_sum);
    EXPECT_TRUE(same_bits(eval_sum, a.loss_sum)) << pattern;
    EXPECT_TRUE(same_bits(eval_sum, again)) << pattern;
    EXPECT_TRUE(same_bits(a.loss_sum, b.loss_sum)) << pattern;
    EXPECT_TRUE(same_bits(a.grad_norm, b.grad_norm)) << pattern;
    EXPECT_EQ(state_differences(*evaluated, *trained), 0) << pattern;
    // The routing statistics of a step, taken (as train does) before an evaluation of two held-out batches.
    auto routing = [](RankRuntime& rt) {
      std::vector<double> v;
      for (const ir::UnitSpec& u : rt.plan().model.units) {
        const model::Unit::Routing r = rt.model().unit(u.index).take_routing();
        v.push_back(r.aux_sum);
        v.insert(v.end(), r.tokens.begin(), r.tokens.end());
      }
      return v;
    };
    EXPECT_EQ(routing(*evaluated), routing(*trained)) << pattern;
    EXPECT_GT(evaluated->evaluate(*tokens_, {1024, 1024}, 2), 0.0);
    const StepStats c = trained->step(*tokens_, tokens_->all()), d = evaluated->step(*tokens_, tokens_->all());
    EXPECT_TRUE(same_bits(c.loss_sum, d.loss_sum)) << pattern;
    EXPECT_EQ(routing(*evaluated), routing(*trained)) << pattern << ": the evaluation's routing is not the step's";
    EXPECT_EQ(state_differences(*evaluated, *trained), 0) << pattern;
  }
}

// A device whose attention kernels take only some head dims refuses a model with another one,
// naming the keys and the head counts that would do; the CPU's (any head dim) takes every model.
TEST(ModelUncomputable, NamesTheHeadDimAndTheHeadCountsThatFit) {
  config::ModelConfig m = testing::small_model("M*-");
  m.d_model = 384;
  m.n_heads = 8;  // head dim 48
  m.n_kv_heads = 2;
  const std::vector<int64_t> dims{16, 32, 64, 80, 96, 128};
  const std::optional<std::string> why = model_uncomputable(m, dims, "cuda");
  ASSERT_TRUE(why.has_value());
  for (const char* want : {"model.n_heads", "384/8 = 48", "device cuda", "(16, 32, 64, 80, 96, 128)",
                           "use n_heads 24, 12, 6, 4 "})
    EXPECT_NE(why->find(want), std::string::npos) << "missing '" << want << "' in: " << *why;
  EXPECT_EQ(model_uncomputable(m, {}, "cpu"), std::nullopt);
  m.n_heads = 6;  // head dim 64
  EXPECT_EQ(model_uncomputable(m, dims, "cuda"), std::nullopt);
  m.pattern = "M-";  // no attention: any head dim
  m.n_heads = 8;
  EXPECT_EQ(model_uncomputable(m, dims, "cuda"), std::nullopt);
  m.pattern = "*";
  m.d_model = 40;  // no supported head dim divides 40 into a multiple of 2 heads
  m.n_heads = 2;
  const std::optional<std::string> none = model_uncomputable(m, dims, "cuda");
  ASSERT_TRUE(none.has_value());
  EXPECT_NE(none->find("change model.d_model"), std::string::npos) << *none;
}

}  // namespace
}  // namespace piper::runtime
