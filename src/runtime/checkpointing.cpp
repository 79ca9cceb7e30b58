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

std::string strategy_text(const ir::Plan& plan) { return ir::directives_yaml(plan.strategy); }

// Calls f(first run, end run, local offset) for each stretch of a piece's runs that lies back to back in its
// local buffer: one checkpoint piece or request each, read or written in place.
template <class F>
void for_each_stretch(const state::Piece& p, F&& f) {
  size_t a = 0;
  for (size_t r = 1; r <= p.runs.size(); ++r)
    if (r == p.runs.size() || p.local_offsets[r] != p.local_offsets[r - 1] + p.runs[r - 1].size()) {
      f(a, r, p.local_offsets[a]);
      a = r;
    }
}

std::vector<checkpoint::Run> runs_of(const std::vector<state::Run>& runs, size_t a, size_t b) {
  std::vector<checkpoint::Run> out;
  for (size_t r = a; r < b; ++r) out.push_back({runs[r].begin, runs[r].end});
  return out;
}

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
  // This rank's owned elements. A synchronous save writes them straight from the live buffers (nothing
  // changes them before it returns); a background one from a copy, run after run per dataset, in staging
  // buffers kept from one save to the next.
  const auto owned = state::owned_for_write(plan_.model, layout, env_.rank());
  std::vector<checkpoint::Piece> mine;
  if (cfg_.checkpoint.async) staged_.resize(owned.size());
  for (size_t i = 0; i < owned.size(); ++i) {
    const state::Piece& p = owned[i];
    const float* base = base_of(ps, exec_, p);
    const std::string name = state::dataset_name(p.kind, p.param);
    if (!cfg_.checkpoint.async) {
      for_each_stretch(p, [&](size_t a, size_t b, int64_t at) {
        mine.push_back({name, runs_of(p.runs, a, b), base + at});
      });
      continue;
    }
    std::vector<float>& data = staged_[i];
    data.clear();
    data.reserve(static_cast<size_t>(state::total(p.runs)));
    for (size_t r = 0; r < p.runs.size(); ++r)
      data.insert(data.end(), base + p.local_offsets[r], base + p.local_offsets[r] + p.runs[r].size());
    mine.push_back({name, runs_of(p.runs, 0, p.runs.size()), data.data()});
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
    checkpoint::save(path, comm_, meta, all, mine, cfg_.checkpoint.direct_io);
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
  // Read straight into the model's and the optimiser's buffers (a failed load ends the run).
  const auto held = state::held(plan_.model, layout, env_.rank());
  std::vector<checkpoint::Request> mine;
  for (const state::Piece& p : held) {
    float* base = base_of(ps, exec_, p);
    const std::string name = state::dataset_name(p.kind, p.param);
    for_each_stretch(p, [&](size_t a, size_t b, int64_t at) {
      mine.push_back({name, runs_of(p.runs, a, b), base + at});
    });
  }
  checkpoint::Meta meta;
  try {
    meta = checkpoint::load(path, comm_, all_datasets(plan_.model), mine);
  } catch (const checkpoint::CheckpointError& e) {
    throw UserError(std::string("--resume: ") + e.what());
  }
  exec_.set_adam_steps(meta.step);  // one AdamW step per optimiser step
  return meta.step;
}

}  // namespace piper::runtime
