// generate.cpp — text from a checkpoint on one process.
#include "runtime/generate.hpp"

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/files.hpp"
#include "comm/mpi_comm.hpp"
#include "config/config.hpp"
#include "data/tokenizer.hpp"
#include "ir/compile.hpp"
#include "ir/validate.hpp"
#include "runtime/checkpointing.hpp"
#include "runtime/rank_runtime.hpp"
#include "runtime/trainer.hpp"

namespace piper::runtime {

namespace {

data::TokenizerKind kind_of(const std::string& name, const std::string& path) {
  for (uint32_t k = 0; k < data::kTokenizerKindCount; ++k) {
    const auto kind = static_cast<data::TokenizerKind>(k);
    if (name == data::kind_name(kind)) return kind;
  }
  throw UserError("checkpoint " + path + ": tokenizer '" + name + "' is unknown (expected byte or sentencepiece)");
}

// The checkpoint's config with the strategy of one rank on `device`: the model and training as written (the
// data order's batch and sequence length are what its position is counted in), no parallelism, no switches.
config::Config one_rank(const std::string& yaml, const std::string& path, const std::string& device) {
  config::Config cfg = config::parse(yaml, "the config of checkpoint " + path);
  cfg.train.device = device;
  cfg.parallel = config::ParallelConfig{};
  cfg.directives = config::DirectivesConfig{};
  cfg.switches.clear();
  cfg.checkpoint = config::CheckpointConfig{};
  cfg.train.standby = 0;
  cfg.train.switch_file.clear();
  return cfg;
}

}  // namespace

Generated generate(const GenerateOptions& o, const MpiEnv& env) {
  if (env.world_size() != 1)
    throw UserError("piper generate runs on one process (launched on " + std::to_string(env.world_size()) +
                    "); run it without mpirun, or with -np 1");
  if (o.prompt.empty()) throw UserError("--prompt is empty (expected some text to continue)");
  std::string path;
  checkpoint::Meta meta;
  try {
    path = checkpoint::resolve(o.checkpoint);
    meta = checkpoint::inspect(path, false).meta;
  } catch (const checkpoint::CheckpointError& e) {
    throw UserError(e.what());
  }
  std::unique_ptr<data::Tokenizer> tok;
  try {
    tok = data::make_tokenizer(kind_of(meta.tokenizer, path), meta.tokenizer_model, "checkpoint " + path);
  } catch (const data::DataError& e) {
    throw UserError(e.what());
  }
  const std::optional<config::Device> device = config::device_named(o.device);
  if (!device) {
    std::string names;
    for (const std::string& n : config::device_names()) names += (names.empty() ? "" : ", ") + n;
    throw UserError("--device " + o.device + ": not a device; use one of " + names);
  }
  const config::Config cfg = one_rank(meta.config_yaml, path, o.device);
  try {
    (void)backend_of(cfg);
  } catch (const std::runtime_error& e) {
    throw UserError(std::string("--device: ") + e.what());
  }
  ir::validate(cfg, 1);
  const ir::Plan plan = ir::compile(cfg, 1);
  const std::unique_ptr<comm::Communicator> world = comm::make_mpi_world();
  RankRuntime rt(cfg, plan, *world);
  Checkpointer ckpt(cfg, rt, env, *tok);
  ckpt.load(path);

  std::vector<int32_t> ids = tok->encode(o.prompt);
  if (ids.empty()) throw UserError("--prompt '" + o.prompt + "' encodes to no token");
  Generated g;
  g.tokenizer = meta.tokenizer;
  g.step = meta.step;
  g.prompt_tokens = static_cast<int64_t>(ids.size());
  std::vector<int32_t> out;
  rt.with_compute_values([&] { out = rt.model().generate(ids, o.tokens, cfg.train.seq_len, o.seed, o.temperature, o.top_k); });
  g.new_tokens = static_cast<int64_t>(out.size());
  ids.insert(ids.end(), out.begin(), out.end());
  g.text = tok->decode_printable(ids);
  return g;
}

}  // namespace piper::runtime
