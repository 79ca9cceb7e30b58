// kernels.hpp — the CPU kernel interface of piper: forward and backward of every op.
//
// Conventions (all kernels):
//   * row-major, contiguous unless a leading dimension is passed;
//   * templates over T in {float, double}: float is the training path, double
//     exists for finite-difference gradient checks (explicitly instantiated in
//     each op's .cpp);
//   * gradients of *inputs* (dx, dq, ...) are overwritten;
//     gradients of *parameters* (dw, dbias, dA_log, ...) are accumulated (+=),
//     so gradient accumulation over microbatches needs no extra buffers;
//   * OpenMP with static schedules only and no atomics: for a fixed thread
//     count every kernel is bit-reproducible.
//
// Shapes use B (batch), Tn (sequence length), D (model width); "M" is B*Tn rows.
#pragma once

#include "gemm.hpp"
#include "linear.hpp"
#include "embedding.hpp"
#include "rmsnorm.hpp"
#include "rope.hpp"
#include "attention.hpp"
#include "swiglu.hpp"
#include "moe.hpp"
#include "silu.hpp"
#include "conv1d.hpp"
#include "dt_softplus.hpp"
#include "ssd.hpp"
#include "gated_rmsnorm.hpp"
#include "cross_entropy.hpp"
#include "tensor_ops.hpp"
#include "adamw.hpp"
#include "bf16.hpp"
