// optimizer.hpp — a rank's AdamW state and its step: the two moments of every
// unit the rank holds (its data-parallel shard with ZeRO >= 1), the Adam step
// count, and the clipping coefficient and learning rate of the step under way.
// The executor decides when (before the first UPD of a step, then per UPD);
// this object decides what, on the buffers of the model's ParamStore.
#pragma once

#include <cstdint>
#include <map>
#include <utility>

#include "backend/backend.hpp"
#include "config/config.hpp"
#include "model/model.hpp"

namespace piper::runtime {

class Optimizer {
 public:
  // Zeroed moments for every unit `model` holds, in the optimizer memory category; with `allocate` false
  // none yet (an online switch allocates them moment by moment).
  Optimizer(model::Model& model, const config::TrainConfig& train, bool allocate = true);

  // The sum of squares of the gradients this rank counts towards the global
  // norm: its data-parallel shard of each unit (after the reduction), a
  // parameter replicated over the tp group counted by tp rank 0 only. Summed
  // over the world it is the squared global norm.
  double local_grad_sq();
  // Starts optimiser step `step` (0-based) from the global gradient norm: the
  // clipping coefficient, the learning rate, one Adam step more. Returns the lr.
  double begin_step(int64_t step, double grad_norm);
  // AdamW on the unit's parameters (this rank's shard with ZeRO >= 1) with
  // the step's lr and clipping, then zeroes the unit's gradients.
  void update(int unit);

  // Moment 0 (exp_avg) or 1 (exp_avg_sq) of a unit, indexed like its shard
  // (ZeRO >= 1) or its full buffer: what checkpoints write and read.
  float* moment(int unit, int which);
  // Adam steps taken (the bias corrections' t); a checkpoint sets it on resume.
  int64_t steps() const { return steps_; }
  // One moment's buffer of a unit, zeroed, and taking it back.
  void allocate_moment(int unit, int which);
  void release_moment(int unit, int which);
  void set_steps(int64_t n) { steps_ = n; }

 private:
  template <class Fn>
  void for_each_owned_range(int unit, bool shard, Fn&& fn);

  model::Model& model_;
  const config::TrainConfig& train_;
  std::map<int, std::pair<backend::Tensor, backend::Tensor>> moments_;  // AdamW m, v per unit
  int64_t steps_ = 0;
  double lr_ = 0.0;
  float clip_scale_ = 1.0f;
};

}  // namespace piper::runtime
