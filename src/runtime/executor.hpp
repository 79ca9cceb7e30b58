// executor.hpp — runs a rank's Program for one training step (or its forward
// only, for an evaluation: Passes::FORWARD): plays it by ir::Player's rules,
// with real compute and communicators. Compute instructions (segments of
// FWD / BWD / BWD_I / BWD_W, RECOMP, NORM, UPD) go to the model's units and
// the optimiser; communication instructions (SEND / RECV, data-parallel
// buckets, ZeRO gathers, tensor-parallel collectives between segments, the
// norm's all-reduce) are issued non-blocking on the communicator of their
// group. The executor holds the activations and gradients flowing between
// units; the optimiser holds its state and does the norm's local part and
// the updates. It does not decide order: the Program does.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "comm/comm.hpp"
#include "ir/player.hpp"
#include "ir/program.hpp"
#include "model/model.hpp"
#include "runtime/optimizer.hpp"
#include "runtime/tracing.hpp"

namespace piper::runtime {

// The process groups a rank's program talks over (null when of size 1).
struct Groups {
  comm::Communicator* world = nullptr;  // point-to-point, the gradient norm, step totals
  comm::Communicator* dp = nullptr;     // data-parallel collectives
  comm::Communicator* tp = nullptr;     // tensor-parallel collectives
  comm::Communicator* ep = nullptr;     // expert-parallel all-to-alls (MoE dispatch and combine)
  comm::Communicator* edp = nullptr;    // expert-data-parallel collectives of the experts' parameters
  // The communicator of a collective over `g` (null where this rank has none).
  comm::Communicator* of(ir::GroupDim g) const;
};

struct StepStats {
  double loss_sum = 0.0;   // sum of token losses of this rank's microbatches
  double grad_norm = 0.0;  // global L2 norm of the gradients, before clipping
  double lr = 0.0;         // learning rate applied
  double compute_ms = 0.0; // time in compute instructions
  double comm_ms = 0.0;    // time waiting for collectives (exposed communication)
  double idle_ms = 0.0;    // time waiting for another stage's data (bubble)
};

// What a program runs: a training step, or only its forward (an evaluation: ir::forward_program),
// where each unit releases what its forward saved, and its input activation, as soon as the forward
// is done, since no backward reads them.
enum class Passes : uint8_t { TRAINING, FORWARD };

class Executor : private ir::PlayHost {
 public:
  Executor(model::Model& model, Optimizer& optimizer, ir::Program program, Groups groups,
           Passes passes = Passes::TRAINING);

  // Runs every instruction of the program once. `mbs[i]` is microbatch i of
  // this rank's data-parallel replica.
  StepStats run_step(int64_t step, const std::vector<model::MicroBatch>& mbs);

  // --trace: record every instruction of the steps `rec` traces (null: off,
  // which costs one pointer test per instruction). Compute instructions from
  // start to end; communication from issue to the first moment the executor
  // sees it complete (it polls around compute instructions while tracing).
  void set_recorder(TraceRecorder* rec) { recorder_ = rec; }

 private:
  using Key = std::pair<int, int>;  // (unit, microbatch)
  // ir::PlayHost
  void issue(size_t k) override;
  bool complete(size_t k) override;
  void run(size_t i) override;

  void run_segment(const ir::Instr& in);
  void forward_done(int unit, int mb);
  void recompute(const ir::Instr& in);
  void norm_squares();
  void finish_norm();
  void update(int unit);
  comm::Communicator& group_of(const ir::Instr& c) const;

  void gather_for_compute(int u, comm::Communicator& dense, std::vector<comm::Request>& reqs,
                          std::vector<backend::Tensor>& held);
  backend::ConstTensorView compute_copy(int u);
  comm::Communicator& part_group(const ir::FlatPart& p, comm::Communicator& dense) const;
  void poll_traced();
  void trace_comm_end(size_t k);

  backend::Tensor take(std::map<Key, backend::Tensor>& m, Key k);
  backend::Tensor& get(std::map<Key, backend::Tensor>& m, Key k, const char* what);
  backend::Tensor boundary(int64_t rows, backend::MemCategory c);

  model::Model& model_;
  Optimizer& optimizer_;
  ir::Program program_;
  ir::Player player_;
  Groups groups_;
  Passes passes_;
  int last_unit_ = 0;
  // [rows, D] in Model::storage_dtype, as units pass them and messages carry them.
  std::map<Key, backend::Tensor> acts_;   // output of unit u for microbatch mb
  std::map<Key, backend::Tensor> grads_;  // gradient w.r.t. the input of unit u
  std::map<Key, ir::Recompute> recomputed_;  // the program's RECOMPs: the unit drops that state after its forward
  double norm_sq_ = 0.0;   // NORM: this rank's sum of squares, then (all-reduced) the world's
  bool norm_ready_ = false;

  // Per step.
  int64_t step_ = 0;
  const std::vector<model::MicroBatch>* mbs_ = nullptr;
  StepStats* stats_ = nullptr;
  std::vector<std::vector<comm::Request>> inflight_;  // per communication instruction
  std::vector<std::vector<backend::Tensor>> held_;    // buffers a request reads or writes (sends, gathers)
  std::map<int, int> uses_left_;                      // ZeRO-3 gather node -> compute uses left this step
  std::map<int, backend::Tensor> compute_copies_;     // unit -> its values in the storage type (compute_copy)

  // Tracing: the recorder (null when off), the one of this step (null when
  // the step is not traced), issue times and whether an end was recorded.
  TraceRecorder* recorder_ = nullptr;
  TraceRecorder* step_trace_ = nullptr;
  std::vector<TraceClock::time_point> issued_at_;    // per communication instruction
  std::vector<char> comm_traced_;                    // per communication instruction
};

}  // namespace piper::runtime
