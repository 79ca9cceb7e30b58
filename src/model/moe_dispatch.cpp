// moe_dispatch.cpp — an MoE block's rows to their experts and back.
#include "model/moe_dispatch.hpp"

#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace piper::model {

using backend::MemCategory;
using backend::Tensor;

namespace {

// The first n indices of an i32 tensor.
backend::TensorView indices(Tensor& t, int64_t n) {
  return {t.device(), backend::DType::DTYPE_I32, backend::Shape{n}, t.view().ptr};
}
backend::ConstTensorView indices(const Tensor& t, int64_t n) {
  return {t.device(), backend::DType::DTYPE_I32, backend::Shape{n}, t.view().ptr};
}

}  // namespace


Dispatcher::Dispatcher(backend::Backend& be, int64_t n_experts, int64_t d_model, int ep_size, backend::DType rows,
                       backend::DType outputs)
    : be_(be), n_experts_(n_experts), d_(d_model), ep_(ep_size), local_(n_experts / ep_size), rows_(rows),
      outputs_(outputs) {
  if (n_experts < 1 || ep_size < 1 || n_experts % ep_size != 0)
    throw std::invalid_argument("MoE dispatcher: " + std::to_string(n_experts) + " experts do not split over ep " +
                                std::to_string(ep_size));
}

Tensor Dispatcher::rows_tensor(int64_t n) { return rows_tensor(n, rows_); }

Tensor Dispatcher::rows_tensor(int64_t n, backend::DType t) {
  return Tensor(be_, backend::Shape{std::max<int64_t>(1, n * d_)}, MemCategory::MEM_ACTIVATIONS, t);
}

Tensor Dispatcher::index_tensor(const std::vector<int32_t>& host) {
  Tensor t(be_, backend::Shape{std::max<int64_t>(1, static_cast<int64_t>(host.size()))}, MemCategory::MEM_BUFFERS,
           backend::DType::DTYPE_I32);
  if (!host.empty()) be_.to_device(t.view().ptr, host.data(), host.size() * sizeof(int32_t));
  return t;
}

// dst[i] = src[index[i]] for every row of index.
void Dispatcher::gather(const Tensor& src, int64_t src_rows, const Tensor& index, Tensor& dst) {
  const int64_t n = rows();
  dst = rows_tensor(n, src.dtype());
  be_.gather_rows(src.part(0, {src_rows, d_}), indices(index, n), dst.part(0, {n, d_}));
}

std::vector<int64_t> Dispatcher::rows_to() const {
  std::vector<int64_t> out(static_cast<size_t>(ep_), 0);
  for (int64_t e = 0; e < n_experts_; ++e) out[static_cast<size_t>(e / local_)] += counts_[static_cast<size_t>(e)];
  return out;
}

std::vector<int64_t> Dispatcher::rows_from() const {
  std::vector<int64_t> out(static_cast<size_t>(ep_), 0);
  for (int64_t j = 0; j < ep_; ++j)
    for (int64_t l = 0; l < local_; ++l) out[static_cast<size_t>(j)] += recv_[static_cast<size_t>(j * local_ + l)];
  return out;
}

std::vector<int64_t> Dispatcher::elements(const std::vector<int64_t>& rows) const {
  std::vector<int64_t> out;
  for (int64_t r : rows) out.push_back(r * d_);
  return out;
}

int64_t Dispatcher::rows() const {
  return std::accumulate(expert_rows_.begin(), expert_rows_.end(), int64_t{0});
}

// ---- forward ----

void Dispatcher::route(backend::ConstTensorView experts, backend::ConstTensorView x) {
  tokens_ = experts.shape[0];
  slots_ = tokens_ * experts.shape[1];
  Tensor counts(be_, backend::Shape{n_experts_}, MemCategory::MEM_BUFFERS, backend::DType::DTYPE_I32);
  order_ = Tensor(be_, backend::Shape{std::max<int64_t>(1, slots_)}, MemCategory::MEM_ACTIVATIONS,
                  backend::DType::DTYPE_I32);
  pos_ = Tensor(be_, experts.shape, MemCategory::MEM_ACTIVATIONS, backend::DType::DTYPE_I32);
  be_.moe_permute_index(experts, counts.view(), indices(order_, slots_), pos_.view());
  std::vector<int32_t> host(static_cast<size_t>(n_experts_));
  be_.to_host(host.data(), counts.view().ptr, host.size() * sizeof(int32_t));
  counts_.assign(host.begin(), host.end());
  xp_ = rows_tensor(slots_);
  be_.gather_rows(x, indices(std::as_const(order_), slots_), xp_.part(0, {slots_, d_}));
  if (ep_ == 1) expert_rows_ = counts_;
}

CommBuffer Dispatcher::counts() {
  std::vector<float> host(counts_.begin(), counts_.end());  // row counts, exact as floats below 2^24
  count_send_ = Tensor(be_, n_experts_, MemCategory::MEM_BUFFERS);
  count_recv_ = Tensor(be_, n_experts_, MemCategory::MEM_BUFFERS);
  be_.to_device(count_send_.data(), host.data(), host.size() * sizeof(float));
  return {count_send_.data(), count_recv_.data(), n_experts_, {}, {}};
}

void Dispatcher::size() {
  std::vector<float> host(static_cast<size_t>(n_experts_));
  be_.to_host(host.data(), count_recv_.data(), host.size() * sizeof(float));
  recv_.assign(host.begin(), host.end());  // [ep rank j][local expert l]
  expert_rows_.assign(static_cast<size_t>(local_), 0);
  for (int64_t j = 0; j < ep_; ++j)
    for (int64_t l = 0; l < local_; ++l)
      expert_rows_[static_cast<size_t>(l)] += recv_[static_cast<size_t>(j * local_ + l)];
  count_send_ = {}, count_recv_ = {};
}

CommBuffer Dispatcher::dispatch() { return to_experts(xp_, xr_); }

// The rows' way there and back, forward and backward alike: the permuted rows to the experts'
// ranks; received, sorted expert-major; the experts' results back to received order; back home.
CommBuffer Dispatcher::to_experts(Tensor& permuted, Tensor& received) {
  const backend::DType t = permuted.dtype();
  received = rows_tensor(rows(), t);
  return {permuted.view().ptr, received.view().ptr, slots_ * d_, elements(rows_to()), elements(rows_from()), t};
}

void Dispatcher::expert_major(Tensor& permuted, Tensor& received, Tensor& sorted) {
  if (ep_ == 1) {
    sorted = std::move(permuted);
    return;
  }
  gather(received, rows(), sort_, sorted);
  received = {}, permuted = {};
}

void Dispatcher::received_order(Tensor& sorted, Tensor& received, Tensor& permuted) {
  if (ep_ == 1) {
    permuted = std::move(sorted);
    return;
  }
  gather(sorted, rows(), unsort_, received);
  sorted = {};
}

CommBuffer Dispatcher::from_experts(Tensor& received, Tensor& permuted) {
  const backend::DType t = received.dtype();
  permuted = rows_tensor(slots_, t);
  return {received.view().ptr, permuted.view().ptr, rows() * d_, elements(rows_from()), elements(rows_to()), t};
}

// Received rows come rank by rank, each rank's expert by expert; the experts want them expert by expert.
void Dispatcher::sort() {
  if (ep_ > 1) {
    std::vector<int64_t> start(recv_.size());  // of block (j, l) in the received rows
    int64_t at = 0;
    for (size_t b = 0; b < recv_.size(); ++b) start[b] = at, at += recv_[b];
    std::vector<int32_t> sort, unsort(static_cast<size_t>(at));
    for (int64_t l = 0; l < local_; ++l)
      for (int64_t j = 0; j < ep_; ++j) {
        const size_t b = static_cast<size_t>(j * local_ + l);
        for (int64_t i = 0; i < recv_[b]; ++i) {
          unsort[static_cast<size_t>(start[b] + i)] = static_cast<int32_t>(sort.size());
          sort.push_back(static_cast<int32_t>(start[b] + i));
        }
      }
    sort_ = index_tensor(sort);
    unsort_ = index_tensor(unsort);
  }
  expert_major(xp_, xr_, xs_);
  ys_ = rows_tensor(rows(), outputs_);
}

backend::ConstTensorView Dispatcher::expert_input(int64_t first, int64_t n) const { return xs_.part(first * d_, {n, d_}); }
backend::TensorView Dispatcher::expert_output(int64_t first, int64_t n) { return ys_.part(first * d_, {n, d_}); }

void Dispatcher::unsort() { received_order(ys_, yr_, yp_); }

CommBuffer Dispatcher::give_back() { return from_experts(yr_, yp_); }

void Dispatcher::combine(backend::ConstTensorView weights, backend::TensorView out) {
  yr_ = {};
  be_.moe_combine(yp_.part(0, {slots_, d_}), pos_.view(), weights, out);
}

// ---- backward ----

void Dispatcher::combine_backward(backend::ConstTensorView dout, backend::ConstTensorView weights,
                                  backend::TensorView dweights) {
  dyp_ = rows_tensor(slots_, outputs_);
  const bool widen = dout.dtype != outputs_;  // bf16 dout beside f32 outputs (tp > 1)
  const Tensor widened = widen ? backend::converted(dout, outputs_, MemCategory::MEM_BUFFERS) : Tensor();
  be_.moe_combine_bwd(widen ? widened.view() : dout, yp_.part(0, {slots_, d_}), pos_.view(), weights,
                      dyp_.part(0, {slots_, d_}), dweights);
  yp_ = {};
}

CommBuffer Dispatcher::dispatch_grad() { return to_experts(dyp_, dyr_); }

void Dispatcher::sort_grad() {
  expert_major(dyp_, dyr_, dys_);
  dxs_ = rows_tensor(rows(), backend::DType::DTYPE_F32);
}

backend::ConstTensorView Dispatcher::expert_grad_output(int64_t first, int64_t n) const {
  return dys_.part(first * d_, {n, d_});
}
backend::TensorView Dispatcher::expert_grad_input(int64_t first, int64_t n) { return dxs_.part(first * d_, {n, d_}); }

// At ep 1 the f32 gradients go straight into dx; else rounded once into the outputs' type, to travel.
void Dispatcher::unsort_grad() {
  if (ep_ > 1 && outputs_ != backend::DType::DTYPE_F32)
    dxs_ = backend::converted(dxs_.view(), outputs_, MemCategory::MEM_ACTIVATIONS);
  received_order(dxs_, dxr_, dxp_);
}

CommBuffer Dispatcher::return_grad() { return from_experts(dxr_, dxp_); }

void Dispatcher::dispatch_backward(backend::TensorView dx) {
  be_.moe_dispatch_bwd(dxp_.part(0, {slots_, d_}), pos_.view(), dx);
  dxp_ = {}, dxr_ = {};
}

}  // namespace piper::model
