// checkpointing.cpp — a rank's state to and from HDF5 checkpoints.
#include "runtime/checkpointing.hpp"

#include <mpi.h>

#include <filesystem>
#include <stdexcept>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/files.hpp"
#include "runtime/trainer.hpp"
#include "state/layout.hpp"

namespace piper::runtime {

namespace {

// Every dataset of the model, the same list on every rank.
std::vector<checkpoint::DatasetSpec> all_datasets(const ir::ModelGraph& g) {
  std::vector<checkpoint::DatasetSpec> all;
  for (const auto& u : g.units)
    for (const auto& p : u.params)
      for (auto kind : {state::StateKind::STATE_PARAM, state::StateKind::STATE_EXP_AVG,
                        state::StateKind::STATE_EXP_AVG_SQ})
        all.push_back({state::dataset_name(kind, p.name), p.shape});
  return all;
}

std::vector<checkpoint::Run> runs_of(const std::vector<state::Run>& runs) {
  std::vector<checkpoint::Run> out;
  for (const auto& r : runs) out.push_back({r.begin, r.end});
  return out;
}

std::string strategy_text(const ir::Plan& plan) { return ir::directives_yaml(plan.strategy); }

}  // namespace

Checkpointer::Checkpointer(const config::Config& cfg, const ir::Plan& plan, model::Model& model, Executor& exec,
                           const MpiEnv& env)
    : cfg_(cfg), plan_(plan), model_(model), exec_(exec), env_(env) {
  MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();
  MPI_Comm_free(&comm_);
}

void Checkpointer::wait() {
  if (writer_.joinable()) writer_.join();
  if (!error_.empty()) {
    const std::string e = error_;
    error_.clear();
    throw std::runtime_error("background checkpoint save failed: " + e);
  }
}

// The buffer a piece's local offsets index: values, or one of the two moments.
static float* base_of(model::ParamStore& ps, Executor& exec, const state::Piece& p) {
  switch (p.kind) {
    case state::StateKind::STATE_PARAM:
      return ps.sharding().zero >= 3 ? ps.shard_values(p.unit) : ps.values(p.unit);
    case state::StateKind::STATE_EXP_AVG:
      return exec.moment(p.unit, 0);
    case state::StateKind::STATE_EXP_AVG_SQ:
      return exec.moment(p.unit, 1);
  }
  return nullptr;
}

std::string Checkpointer::save(int64_t steps_done) {
  wait();  // one save at a time
  const std::string& dir = cfg_.checkpoint.dir;
  if (env_.rank() == 0) std::filesystem::create_directories(dir);
  model::ParamStore& ps = model_.params();
  const auto layout = state::layout_params(plan_);
  // Stage this rank's owned elements, run after run, per dataset.
  const auto owned = state::owned_for_write(plan_.model, layout, env_.rank());
  staged_.assign(owned.size(), {});
  std::vector<checkpoint::Piece> mine;
  for (size_t i = 0; i < owned.size(); ++i) {
    const state::Piece& p = owned[i];
    const float* base = base_of(ps, exec_, p);
    std::vector<float>& data = staged_[i];
    data.reserve(static_cast<size_t>(state::total(p.runs)));
    for (size_t r = 0; r < p.runs.size(); ++r)
      data.insert(data.end(), base + p.local_offsets[r], base + p.local_offsets[r] + p.runs[r].size());
    mine.push_back({state::dataset_name(p.kind, p.param), runs_of(p.runs), data.data()});
  }
  checkpoint::Meta meta;
  meta.step = steps_done;
  meta.tokens_seen = steps_done * cfg_.train.global_batch * cfg_.train.seq_len;
  meta.data_position = steps_done * cfg_.train.global_batch;
  meta.seed = cfg_.train.seed;
  meta.config_yaml = cfg_.yaml_text;
  meta.strategy = strategy_text(plan_);
  const std::string path = checkpoint::checkpoint_path(dir, steps_done);
  // The collective write, then (rank 0) the `latest` pointer and the clean-up.
  auto write = [this, path, meta, mine = std::move(mine), all = all_datasets(plan_.model), dir]() {
    MPI_Barrier(comm_);  // the folder exists
    checkpoint::save(path, comm_, meta, all, mine);
    if (env_.rank() == 0) {
      checkpoint::update_latest(dir, path);
      checkpoint::keep_last(dir, static_cast<int>(cfg_.checkpoint.keep));
    }
    MPI_Barrier(comm_);
  };
  if (!cfg_.checkpoint.async) {
    write();
    return path;
  }
  writer_ = std::thread([this, write = std::move(write)]() {
    try {
      write();
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  });
  return path;
}

int64_t Checkpointer::load(const std::string& where) {
  std::string path;
  try {
    path = checkpoint::resolve(where == "latest" ? cfg_.checkpoint.dir + "/latest" : where);
  } catch (const checkpoint::CheckpointError& e) {
    if (where == "latest") return -1;  // nothing saved yet: start fresh
    throw UserError(std::string("--resume: ") + e.what());
  }
  model::ParamStore& ps = model_.params();
  const auto layout = state::layout_params(plan_);
  const auto held = state::held(plan_.model, layout, env_.rank());
  std::vector<std::vector<float>> packed(held.size());
  std::vector<checkpoint::Request> mine;
  for (size_t i = 0; i < held.size(); ++i) {
    packed[i].resize(static_cast<size_t>(state::total(held[i].runs)));
    mine.push_back({state::dataset_name(held[i].kind, held[i].param), runs_of(held[i].runs), packed[i].data()});
  }
  checkpoint::Meta meta;
  try {
    meta = checkpoint::load(path, comm_, all_datasets(plan_.model), mine);
  } catch (const checkpoint::CheckpointError& e) {
    throw UserError(std::string("--resume: ") + e.what());
  }
  for (size_t i = 0; i < held.size(); ++i) {
    float* base = base_of(ps, exec_, held[i]);
    const float* src = packed[i].data();
    for (size_t r = 0; r < held[i].runs.size(); ++r) {
      std::copy(src, src + held[i].runs[r].size(), base + held[i].local_offsets[r]);
      src += held[i].runs[r].size();
    }
  }
  exec_.set_adam_steps(meta.step);  // one AdamW step per optimiser step
  return meta.step;
}

}  // namespace piper::runtime
