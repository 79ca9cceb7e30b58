// moe_dispatch.hpp — the token dispatcher of an MoE block (Megatron's
// all-to-all dispatcher): one microbatch's rows permuted into per-expert
// groups, moved to the ranks of the ep group that hold their experts, sorted
// expert-major for the experts, and the experts' outputs moved back and
// combined with the routing weights; the backward retraces the same path.
//
// Each step is a method; the steps that move data over the ep group return
// the CommBuffer of their all-to-all, which the caller runs (a DAG node, or
// a blocking collective) before the next step. At ep 1 those steps do not
// exist and the rows stay where they are. The rows are in `rows`, the
// activations' storage type (bf16 under train.precision bf16), from the
// block's xn to the experts; their outputs, and the gradients on the way back,
// are in `outputs`: `rows` too, or f32 where the tp group sums them (each tp
// rank's experts give a partial sum over its slice of moe_ffn_hidden). All
// travel as they are. The experts' input gradient, which sums two products, is
// f32 and rounded once into `outputs` as it leaves them. The combine and the
// dispatch backward write the block's f32 output and input gradient.
//
// Forward:  route | counts() | size() | dispatch() | sort() | the experts
//           read expert_input(), write expert_output() | unsort() |
//           give_back() | combine().
// Backward: combine_backward() | dispatch_grad() | sort_grad() | the experts
//           read expert_grad_output(), write expert_grad_input() |
//           unsort_grad() | return_grad() | dispatch_backward().
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "model/unit.hpp"

namespace piper::model {

class Dispatcher {
 public:
  // n_experts: E over the whole ep group, each ep rank holding E / ep consecutive experts.
  Dispatcher(backend::Backend& be, int64_t n_experts, int64_t d_model, int ep_size, backend::DType rows,
             backend::DType outputs);

  // ---- forward ----
  // experts: i32 [M, K], the routed experts of each row of x [M, D] (in `rows`). Permutes
  // the rows expert-major (ties: rows in order) and counts them per expert.
  void route(backend::ConstTensorView experts, backend::ConstTensorView x);
  CommBuffer counts();    // ep > 1: the rows per expert, to the experts' ranks
  void size();            // ep > 1: the rows each rank sends each local expert, from the counts received
  CommBuffer dispatch();  // ep > 1: the permuted rows to their experts' ranks
  void sort();            // the received rows expert-major
  // The experts' rows [R, D], expert-major: rows_of_expert()[l] rows of local expert l after another.
  // Each accessor gives rows [first, first + n).
  backend::ConstTensorView expert_input(int64_t first, int64_t n) const;
  const std::vector<int64_t>& rows_of_expert() const { return expert_rows_; }
  int64_t rows() const;   // R
  backend::TensorView expert_output(int64_t first, int64_t n);  // written by the experts, in `outputs`
  void unsort();           // ep > 1: the outputs back in the order they were received
  CommBuffer give_back();  // ep > 1: the outputs back to the rows' ranks
  // out [M, D] (f32 or `rows`) = sum over k of weights[m, k] * the output for (m, k).
  void combine(backend::ConstTensorView weights, backend::TensorView out);

  // ---- backward ----
  // dout [M, D] -> the outputs' gradients (in `outputs`), and dweights [M, K] (overwritten).
  void combine_backward(backend::ConstTensorView dout, backend::ConstTensorView weights, backend::TensorView dweights);
  CommBuffer dispatch_grad();  // ep > 1: the outputs' gradients to the experts' ranks
  void sort_grad();            // expert-major
  backend::ConstTensorView expert_grad_output(int64_t first, int64_t n) const;  // in `outputs`
  backend::TensorView expert_grad_input(int64_t first, int64_t n);  // f32, written by the experts' backward
  void unsort_grad();        // rounded into `outputs` (ep > 1), back in the order received
  CommBuffer return_grad();  // ep > 1: the inputs' gradients back
  // dx [M, D] (f32 or `rows`) += the gradient of the permutation's input.
  void dispatch_backward(backend::TensorView dx);

  // Rows per expert of this rank's tokens (all E experts), for the routing statistics.
  const std::vector<int64_t>& counts_per_expert() const { return counts_; }

 private:
  std::vector<int64_t> rows_to() const;    // rows this rank sends each ep rank
  std::vector<int64_t> rows_from() const;  // rows each ep rank sends this one
  std::vector<int64_t> elements(const std::vector<int64_t>& rows) const;
  // The steps both passes take, on the forward's rows or the backward's row gradients.
  CommBuffer to_experts(backend::Tensor& permuted, backend::Tensor& received);
  void expert_major(backend::Tensor& permuted, backend::Tensor& received, backend::Tensor& sorted);
  void received_order(backend::Tensor& sorted, backend::Tensor& received, backend::Tensor& permuted);
  CommBuffer from_experts(backend::Tensor& received, backend::Tensor& permuted);
  // Storage for n rows of `t` (`rows_` unless said), at least one element: a buffer handed to MPI is never null.
  backend::Tensor rows_tensor(int64_t n);
  backend::Tensor rows_tensor(int64_t n, backend::DType t);
  backend::Tensor index_tensor(const std::vector<int32_t>& host);
  // dst = the rows of src [src rows, D] at index, one per row of the experts' side.
  void gather(const backend::Tensor& src, int64_t src_rows, const backend::Tensor& index, backend::Tensor& dst);

  backend::Backend& be_;
  int64_t n_experts_, d_, ep_, local_;  // E, D, ep, E / ep
  backend::DType rows_, outputs_;       // the rows' type; their outputs' and the gradients' type
  int64_t tokens_ = 0, slots_ = 0;      // M, P = M * K
  backend::Tensor order_, pos_;         // i32 [P]: the row of each permuted row; i32 [M, K]: its permuted row
  std::vector<int64_t> counts_;         // [E]
  std::vector<int64_t> recv_;           // ep > 1: [ep][local] rows rank j sends local expert l
  std::vector<int64_t> expert_rows_;    // [local]
  backend::Tensor count_send_, count_recv_;   // ep > 1: [E] floats
  backend::Tensor sort_, unsort_;       // ep > 1: i32 [R] both ways between received and expert-major
  // xp_, xr_, xs_ in rows_; the rest in outputs_, but dxs_ (f32; and dxp_ at ep 1, which is dxs_).
  backend::Tensor xp_, xr_, xs_;        // permuted [P, D], received [R, D], expert-major [R, D]
  backend::Tensor ys_, yr_, yp_;        // the outputs, the same three ways back
  backend::Tensor dyp_, dyr_, dys_;     // the outputs' gradients
  backend::Tensor dxs_, dxr_, dxp_;     // the inputs' gradients
};

}  // namespace piper::model
