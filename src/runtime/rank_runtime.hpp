// rank_runtime.hpp — everything one rank trains with, in one object: the plan,
// the rank grid and the process groups, the slice of the model the rank holds,
// the optimiser state, the executor of the rank's program, and where training
// stands in the data. train, the checkpoints and the resume path use it.
//
// A runtime is built from a config, a compiled plan and the world
// communicator, with freshly initialised parameters; existing training state
// comes in afterwards, from a checkpoint (Checkpointer::load) or, built empty,
// block by block from the runtime of another strategy (runtime/switching.hpp),
// so that switching strategies is "build the new one, move the state, drop the
// old one".
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "comm/device_comm.hpp"
#include "config/config.hpp"
#include "data/token_file.hpp"
#include "ir/compile.hpp"
#include "ir/parallel_dims.hpp"
#include "model/model.hpp"
#include "runtime/executor.hpp"
#include "runtime/optimizer.hpp"
#include "state/layout.hpp"

namespace piper::runtime {

// Where training stands: what a checkpoint records and resuming continues from.
struct DataPosition {
  int64_t step = 0;           // optimiser steps completed
  int64_t tokens_seen = 0;    // tokens of those steps, over all ranks
  int64_t data_position = 0;  // samples consumed: the first sample of the next step
};

// The backend cfg's train.device names: the CPU's, the detached CPU's, or the rank's GPU; throws
// std::runtime_error saying why where this machine has none, or where that backend cannot compute
// cfg's model (model_uncomputable).
backend::Backend& backend_of(const config::Config& cfg);
// Why `model` cannot compute on `device`, whose attention takes the head dims `head_dims` (empty:
// any), naming the keys to change; nullopt where it can.
std::optional<std::string> model_uncomputable(const config::ModelConfig& model, const std::vector<int64_t>& head_dims,
                                              const char* device);
// The communicator choice train.device_comm names, for comm::for_device.
comm::DeviceComm device_comm_of(config::DeviceComm how);

// What a runtime's training state starts as.
enum class StateStart {
  INITIALISED,  // parameters from train.seed, zeroed moments and gradients
  EMPTY,        // no state buffers: a switch allocates and fills them block by block, then allocate_grads()
};

class RankRuntime {
 public:
  // Collective over `world` (it splits the dp and tp groups; world's group
  // rank i is the plan's rank i): builds this rank's slice of the model with
  // its state as `start` says, the executor of its program, at step 0. `cfg`
  // and `world` must outlive the runtime.
  RankRuntime(const config::Config& cfg, ir::Plan plan, comm::Communicator& world,
              StateStart start = StateStart::INITIALISED);
  // The model and the executor refer to the plan and the groups held here.
  RankRuntime(const RankRuntime&) = delete;
  RankRuntime& operator=(const RankRuntime&) = delete;

  const config::Config& config() const { return cfg_; }
  const ir::Plan& plan() const { return plan_; }
  const ir::ParallelDims& grid() const { return grid_; }
  // The groups for the rank's device tensors (float buffers on device()).
  const Groups& groups() const { return groups_; }
  // The world for host buffers: the communicator the runtime was built over.
  comm::Communicator& host_world() { return host_world_; }
  int rank() const { return rank_; }
  int replica() const { return grid_.coord(rank_, ir::Axis::DP); }
  int replicas() const { return grid_.degree(ir::Axis::DP); }
  // Whether every unit is on this rank (generating text needs the whole model).
  // Every unit, each parameter whole (no tp or ep pieces): what sampling needs.
  bool holds_whole_model() const {
    return held_units_.size() == plan_.model.units.size() && grid_.degree(ir::Axis::TP) == 1 &&
           grid_.degree(ir::Axis::EP) == 1;
  }
  // Instructions of this rank's program per step, both streams.
  size_t instructions_per_step() const { return instructions_per_step_; }

  backend::Backend& device() const { return device_; }
  model::Model& model() { return model_; }
  Optimizer& optimizer() { return optimizer_; }
  Executor& executor() { return executor_; }
  const DataPosition& position() const { return position_; }

  // Runs the next step on its samples of `tokens` (this replica's share of
  // the global batch at data_position, split into the plan's microbatches),
  // drawn from the ids in `range` (docs/data.md, "Held-out data"), with the
  // memory peaks counted from the step's start, and moves the position on by
  // one step.
  StepStats step(const data::TokenFile& tokens, const data::TokenRange& range);

  // The held-out loss (docs/data.md, "Held-out data"): the forward of this
  // rank's program (ir::forward_program) over held-out batches 0..batches-1,
  // batch k being samples k * global_batch + j of `held_out`, each shared out
  // and split as a step's. Returns this rank's sum of token losses (the
  // world's sum over batches x global_batch x seq_len tokens is the loss).
  // Changes no training state: parameters, optimiser and data position stay
  // as they were, and the MoE routing statistics of its forwards are dropped
  // (call it once the step's have been taken). Collective over the world.
  double evaluate(const data::TokenFile& tokens, const data::TokenRange& held_out, int64_t batches);

  // ZeRO-3: unit u's full values [padded_numel], f32, gathered from the shards over each part's group
  // (collective over those groups: every rank holding u calls it); a logic_error for a unit it does not shard.
  backend::Tensor gathered_values(int u);

  // Runs `use` with every unit held here bound to the values a step's passes compute with: ZeRO-3's
  // gathered (gathered_values: collective, so where ZeRO-3 shards a unit every rank of its groups calls
  // this) and, under a storage type narrower than f32, rounded to it, as the executor's compute copies
  // are; unbound again when `use` returns or throws. What generating text computes with.
  void with_compute_values(const std::function<void()>& use);

  // Training state from a checkpoint: the position it records and the Adam
  // steps taken (one per optimiser step). The values and moments are read
  // straight into state_buffer() by the checkpoint.
  void resume_at(const DataPosition& at);

  // The buffers this rank's state lives in, one per state::held piece: the
  // parameter values (the shard with ZeRO-3) or one of the two moments.
  state::LayoutParams layout() const { return state::layout_params(plan_); }
  float* state_buffer(const state::Piece& piece);

  // One state block (a unit's values, exp_avg or exp_avg_sq buffer: state::BlockKey), zeroed, and taking
  // it back: how a switch moves state in without holding two whole layouts.
  void allocate_block(int unit, state::StateKind kind);
  void release_block(int unit, state::StateKind kind);
  // The gradient buffers kept between steps: released while a switch moves state, allocated again after.
  void release_grads() { model_.params().release_grads(); }
  void allocate_grads() { model_.params().allocate_grads(); }

 private:
  // The plan is moved in only once `program`, its lowering for this rank, exists.
  RankRuntime(const config::Config& cfg, ir::Plan&& plan, ir::Program program, comm::Communicator& world,
              StateStart start);

  const config::Config& cfg_;
  const ir::Plan plan_;
  const int rank_;
  const ir::ParallelDims grid_;
  backend::Backend& device_;  // train.device: where the rank's tensors live
  comm::Communicator& host_world_;
  // The world for a device the host cannot address: NCCL, or host staging (comm::for_device).
  std::unique_ptr<comm::Communicator> device_world_;
  comm::Communicator& world_;  // the world the groups come from: *device_world_ or the one given
  std::unique_ptr<comm::Communicator> dp_, tp_, ep_, edp_;
  const Groups groups_;
  const std::vector<int> held_units_;
  model::Model model_;
  Optimizer optimizer_;
  size_t instructions_per_step_ = 0;
  Executor evaluator_;  // the forward of the program, for evaluate()
  Executor executor_;
  DataPosition position_;
};

}  // namespace piper::runtime
