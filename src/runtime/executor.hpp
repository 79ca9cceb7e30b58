// executor.hpp — runs a rank's Program for one training step: dispatches
// FWD / BWD / BWD_I / BWD_W / UPD instructions to the model's units, holds the
// activations and gradients flowing between units, and owns the optimiser
// state. It does not decide order: the Program does.
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "config/config.hpp"
#include "ir/program.hpp"
#include "model/model.hpp"

namespace piper::runtime {

struct StepStats {
  double loss_sum = 0.0;   // sum of token losses of this rank's microbatches
  double grad_norm = 0.0;  // global L2 norm of the gradients, before clipping
  double lr = 0.0;         // learning rate applied
};

class Executor {
 public:
  Executor(model::Model& model, ir::Program program, const config::TrainConfig& train);

  // Runs every instruction of the program once. `mbs[i]` is microbatch i.
  StepStats run_step(int64_t step, const std::vector<model::MicroBatch>& mbs);

  const ir::Program& program() const { return program_; }

 private:
  using Key = std::pair<int, int>;  // (unit, microbatch)
  void forward(const ir::Instr& in, const model::MicroBatch& mb, StepStats& st);
  void backward(const ir::Instr& in);
  void update(int unit, int64_t step, StepStats& st);
  backend::Tensor take(std::map<Key, backend::Tensor>& m, Key k);
  float* get(std::map<Key, backend::Tensor>& m, Key k, const char* what);

  model::Model& model_;
  ir::Program program_;
  const config::TrainConfig& train_;
  int last_unit_ = 0;
  std::map<Key, backend::Tensor> acts_;   // output of unit u for microbatch mb
  std::map<Key, backend::Tensor> grads_;  // gradient w.r.t. the input of unit u
  std::map<int, std::pair<backend::Tensor, backend::Tensor>> moments_;  // AdamW m, v per unit
  int64_t adam_steps_ = 0;
  bool norm_ready_ = false;
  float clip_scale_ = 1.0f;
};

}  // namespace piper::runtime
