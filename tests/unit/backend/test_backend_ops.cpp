// test_backend_ops.cpp — the cross-backend op runner: every op of the backend op table, forward
// and backward, on every registered backend, against a double-precision reference, on small
// random shapes. One line per op and output with the error seen and the tolerance; an op of the
// table without a case here is a failure. The references are the kernels' double instantiations
// (whose own correctness, against finite differences and naive forms, kernel_tests checks), the
// plain SSD recurrence, and a double AdamW written out here; the integer permutation of the MoE
// ops is compared with the kernel's own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "kernels.hpp"
#include "kernels/gradcheck.hpp"

namespace piper::backend {
namespace {

using piper::testing::normwise_err;
using piper::testing::random_f;
using piper::testing::random_ids;
namespace k = piper::kernels;
using Vec = std::vector<double>;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Host data moved to and from one backend. Data tensors (activations, their gradients and the
// parameters an op reads) go in the case's storage type, f32 or bf16 (the double values rounded
// to it); a product's weight and the embedding's table in the case's weight type (put_weight: bf16
// beside f32 activations is how train.precision bf16 computes); the tensors the op contract keeps
// in f32 (statistics, router tensors, parameter gradients, optimiser state: contract::Kind) go
// through put_f32. The reference keeps the double values, exact in f32; in bf16 the rounding of
// inputs and outputs is part of the error.
class Device {
 public:
  Device(Backend& be, DType data, DType weights) : be_(be), data_(data), weights_(weights) {}
  Backend& be() { return be_; }
  DType data() const { return data_; }
  Tensor put(const Vec& host, Shape s) { return put_as(host, s, data_); }
  Tensor put_weight(const Vec& host, Shape s) { return put_as(host, s, weights_); }
  DType weights() const { return weights_; }
  // The float type that is not the storage type: a product's operand or output of the other type.
  DType other() const { return data_ == DType::DTYPE_F32 ? DType::DTYPE_BF16 : DType::DTYPE_F32; }
  Tensor put_other(const Vec& host, Shape s) { return put_as(host, s, other()); }
  Tensor put_f32(const Vec& host, Shape s) { return put_as(host, s, DType::DTYPE_F32); }
  // Uninitialised data of the case's storage type.
  Tensor empty(Shape s) { return Tensor(be_, s, MemCategory::MEM_BUFFERS, data_); }
  Tensor put_ids(const std::vector<int32_t>& host) {
    return put_ids(host, Shape{static_cast<int64_t>(host.size())});
  }
  Tensor put_ids(const std::vector<int32_t>& host, Shape s) {
    EXPECT_EQ(static_cast<int64_t>(host.size()), s.numel()) << "test ids for shape " << s.str();
    Tensor t(be_, s, MemCategory::MEM_BUFFERS, DType::DTYPE_I32);
    be_.to_device(t.view().ptr, host.data(), t.bytes());
    return t;
  }
  Vec get(const Tensor& t) {
    const auto n = static_cast<size_t>(t.numel());
    Vec out(n);
    if (t.dtype() == DType::DTYPE_BF16) {
      std::vector<uint16_t> h(n);
      be_.to_host(h.data(), t.view().ptr, t.bytes());
      for (size_t i = 0; i < n; ++i) out[i] = k::bf16_to_f32(h[i]);
    } else {
      std::vector<float> f(n);
      be_.to_host(f.data(), t.view().ptr, t.bytes());
      for (size_t i = 0; i < n; ++i) out[i] = f[i];
    }
    return out;
  }
  std::vector<int32_t> get_ids(const Tensor& t) {
    std::vector<int32_t> ids(static_cast<size_t>(t.numel()));
    be_.to_host(ids.data(), t.view().ptr, t.bytes());
    return ids;
  }

 private:
  Tensor put_as(const Vec& host, Shape s, DType dtype) {
    EXPECT_EQ(static_cast<int64_t>(host.size()), s.numel()) << "test data for shape " << s.str();
    Tensor t(be_, s, MemCategory::MEM_BUFFERS, dtype);
    if (dtype == DType::DTYPE_BF16) {
      std::vector<uint16_t> h(host.size());
      for (size_t i = 0; i < host.size(); ++i) h[i] = k::f32_to_bf16(static_cast<float>(host[i]));
      be_.to_device(t.view().ptr, h.data(), t.bytes());
    } else {
      const std::vector<float> f(host.begin(), host.end());
      be_.to_device(t.view().ptr, f.data(), t.bytes());
    }
    return t;
  }
  Backend& be_;
  DType data_, weights_;
};

// Values rounded to float, so a reference computed from them sees what a backend is given.
Vec rounded(const Vec& v) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(v[i]);
  return r;
}

Vec filled(int64_t n, double value) { return Vec(static_cast<size_t>(n), value); }

// The outputs of one op case: name and error (normwise, see gradcheck.hpp).
using Errors = std::vector<std::pair<std::string, double>>;
struct Case {
  double tol;       // f32 storage
  double tol_bf16;  // bf16 storage (see cases())
  std::function<Errors(Device&)> run;
};

// Shapes shared by the cases: small, with remainders (rows not a multiple of any blocking).
constexpr int64_t M = 13, Kd = 12, N = 9;                   // matrices
constexpr int64_t B = 2, T = 10, H = 4, KV = 2, HD = 32;    // attention
constexpr int64_t C = 6, KC = 4;                            // conv
constexpr int64_t HM = 4, P = 3, G = 2, NS = 5, CHUNK = 4;  // ssd

Errors linear_fwd(Device& d) {
  const Vec x = random_f(M * Kd, 1), w = random_f(N * Kd, 2);
  Vec y = filled(M * N, 0);
  k::linear_fwd<double>(x.data(), w.data(), y.data(), M, Kd, N);
  Tensor tx = d.put(x, {M, Kd}), tw = d.put_weight(w, {N, Kd}), ty = d.put(filled(M * N, kNaN), {M, N});
  d.be().linear_fwd(tx.view(), tw.view(), ty.view());
  Errors e{{"y", normwise_err(d.get(ty), y)}};
  if (d.weights() == DType::DTYPE_BF16) {  // products mix types: the output in the other one
    Tensor to = d.put_other(filled(M * N, kNaN), {M, N});
    d.be().linear_fwd(tx.view(), tw.view(), to.view());
    e.emplace_back(std::string("y (into ") + dtype_name(d.other()) + ")", normwise_err(d.get(to), y));
  }
  return e;
}

Errors linear_bwd_input(Device& d) {
  const Vec dy = random_f(M * N, 3), w = random_f(N * Kd, 4), dx0 = random_f(M * Kd, 5);
  Vec dx = filled(M * Kd, 0), dxa = dx0;
  k::linear_bwd_input<double>(dy.data(), w.data(), dx.data(), M, Kd, N, false);
  k::linear_bwd_input<double>(dy.data(), w.data(), dxa.data(), M, Kd, N, true);
  Tensor tdy = d.put(dy, {M, N}), tw = d.put_weight(w, {N, Kd});
  Tensor tdx = d.put(filled(M * Kd, kNaN), {M, Kd}), tdxa = d.put(dx0, {M, Kd});
  d.be().linear_bwd_input(tdy.view(), tw.view(), tdx.view(), false);
  d.be().linear_bwd_input(tdy.view(), tw.view(), tdxa.view(), true);
  Errors e{{"dx", normwise_err(d.get(tdx), dx)}, {"dx (accumulate)", normwise_err(d.get(tdxa), dxa)}};
  if (d.weights() == DType::DTYPE_BF16) {  // accumulated into the other type
    Tensor to = d.put_other(dx0, {M, Kd});
    d.be().linear_bwd_input(tdy.view(), tw.view(), to.view(), true);
    e.emplace_back(std::string("dx (accumulate into ") + dtype_name(d.other()) + ")", normwise_err(d.get(to), dxa));
  }
  return e;
}

Errors linear_bwd_weight(Device& d) {
  const Vec dy = random_f(M * N, 6), x = random_f(M * Kd, 7);
  Vec dw = random_f(N * Kd, 8);
  Tensor tdy = d.put(dy, {M, N}), tx = d.put(x, {M, Kd}), tdw = d.put_f32(dw, {N, Kd});
  const Vec dw0 = dw;
  k::linear_bwd_weight<double>(dy.data(), x.data(), dw.data(), M, Kd, N);
  d.be().linear_bwd_weight(tdy.view(), tx.view(), tdw.view());
  Errors e{{"dw (accumulated)", normwise_err(d.get(tdw), dw)}};
  if (d.data() == DType::DTYPE_BF16) {  // dy of the other type beside x
    Tensor tdyo = d.put_other(dy, {M, N}), tdwo = d.put_f32(dw0, {N, Kd});
    d.be().linear_bwd_weight(tdyo.view(), tx.view(), tdwo.view());
    e.emplace_back(std::string("dw (dy ") + dtype_name(d.other()) + ")", normwise_err(d.get(tdwo), dw));
  }
  return e;
}

constexpr float kEps = 1e-5f;

Errors rmsnorm_fwd(Device& d) {
  const Vec x = random_f(M * Kd, 9), w = random_f(Kd, 10, 0.5, 1.5);
  Vec y = filled(M * Kd, 0), rstd = filled(M, 0);
  k::rmsnorm_fwd<double>(x.data(), w.data(), y.data(), rstd.data(), M, Kd, kEps);
  Tensor tx = d.put(x, {M, Kd}), tw = d.put(w, {Kd});
  Tensor ty = d.put(filled(M * Kd, kNaN), {M, Kd}), tr = d.put_f32(filled(M, kNaN), {M});
  d.be().rmsnorm_fwd(tx.view(), tw.view(), ty.view(), tr.view(), kEps);
  return {{"y", normwise_err(d.get(ty), y)}, {"rstd", normwise_err(d.get(tr), rstd)}};
}

Errors rmsnorm_bwd(Device& d) {
  const Vec x = random_f(M * Kd, 11), w = random_f(Kd, 12, 0.5, 1.5), dy = random_f(M * Kd, 13);
  Vec y = filled(M * Kd, 0), rstd = filled(M, 0);
  k::rmsnorm_fwd<double>(x.data(), w.data(), y.data(), rstd.data(), M, Kd, kEps);
  rstd = rounded(rstd);
  Vec dx = filled(M * Kd, 0), dw = random_f(Kd, 14);
  Tensor tdy = d.put(dy, {M, Kd}), tx = d.put(x, {M, Kd}), tw = d.put(w, {Kd}), tr = d.put_f32(rstd, {M});
  Tensor tdx = d.put(filled(M * Kd, kNaN), {M, Kd}), tdw = d.put_f32(dw, {Kd});
  k::rmsnorm_bwd<double>(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), M, Kd);
  d.be().rmsnorm_bwd(tdy.view(), tx.view(), tw.view(), tr.view(), tdx.view(), tdw.view());
  return {{"dx", normwise_err(d.get(tdx), dx)}, {"dw (accumulated)", normwise_err(d.get(tdw), dw)}};
}

Errors gated_rmsnorm_fwd(Device& d) {
  const Vec y = random_f(M * Kd, 15), z = random_f(M * Kd, 16), w = random_f(Kd, 17, 0.5, 1.5);
  Vec out = filled(M * Kd, 0), rstd = filled(M * G, 0);
  k::gated_rmsnorm_fwd<double>(y.data(), z.data(), w.data(), out.data(), rstd.data(), M, Kd, G, kEps);
  Tensor ty = d.put(y, {M, Kd}), tz = d.put(z, {M, Kd}), tw = d.put(w, {Kd});
  Tensor to = d.put(filled(M * Kd, kNaN), {M, Kd}), tr = d.put_f32(filled(M * G, kNaN), {M, G});
  d.be().gated_rmsnorm_fwd(ty.view(), tz.view(), tw.view(), to.view(), tr.view(), kEps);
  return {{"out", normwise_err(d.get(to), out)}, {"rstd", normwise_err(d.get(tr), rstd)}};
}

Errors gated_rmsnorm_bwd(Device& d) {
  const Vec y = random_f(M * Kd, 18), z = random_f(M * Kd, 19), w = random_f(Kd, 20, 0.5, 1.5);
  const Vec dout = random_f(M * Kd, 21);
  Vec out = filled(M * Kd, 0), rstd = filled(M * G, 0);
  k::gated_rmsnorm_fwd<double>(y.data(), z.data(), w.data(), out.data(), rstd.data(), M, Kd, G, kEps);
  rstd = rounded(rstd);
  Vec dy = filled(M * Kd, 0), dz = filled(M * Kd, 0), dw = random_f(Kd, 22);
  Tensor tdo = d.put(dout, {M, Kd}), ty = d.put(y, {M, Kd}), tz = d.put(z, {M, Kd});
  Tensor tw = d.put(w, {Kd}), tr = d.put_f32(rstd, {M, G}), tdw = d.put_f32(dw, {Kd});
  Tensor tdy = d.put(filled(M * Kd, kNaN), {M, Kd}), tdz = d.put(filled(M * Kd, kNaN), {M, Kd});
  k::gated_rmsnorm_bwd<double>(dout.data(), y.data(), z.data(), w.data(), rstd.data(), dy.data(),
                               dz.data(), dw.data(), M, Kd, G);
  d.be().gated_rmsnorm_bwd(tdo.view(), ty.view(), tz.view(), tw.view(), tr.view(), tdy.view(),
                           tdz.view(), tdw.view());
  return {{"dy", normwise_err(d.get(tdy), dy)},
          {"dz", normwise_err(d.get(tdz), dz)},
          {"dw (accumulated)", normwise_err(d.get(tdw), dw)}};
}

constexpr double kTheta = 10000.0;

Errors rope(Device& d, bool backward) {
  const Vec x = random_f(B * T * H * HD, backward ? 24 : 23);
  Vec y = filled(B * T * H * HD, 0);
  const Shape s{B, T, H, HD};
  Tensor tx = d.put(x, s), ty = d.put(filled(s.numel(), kNaN), s), tin = d.put(x, s);
  if (backward) {
    k::rope_bwd<double>(x.data(), y.data(), B, T, H, HD, kTheta);
    d.be().rope_bwd(tx.view(), ty.view(), kTheta);
    d.be().rope_bwd(tin.view(), tin.view(), kTheta);
  } else {
    k::rope_fwd<double>(x.data(), y.data(), B, T, H, HD, kTheta);
    d.be().rope_fwd(tx.view(), ty.view(), kTheta);
    d.be().rope_fwd(tin.view(), tin.view(), kTheta);
  }
  const std::string out = backward ? "dx" : "y";
  return {{out, normwise_err(d.get(ty), y)}, {out + " (in place)", normwise_err(d.get(tin), y)}};
}

// Attention at three shapes: the small one of the other cases (one tile of the CUDA kernels' query and
// key blocks, 64 and 32 rows); one of several tiles each way with a remainder, eight query heads to a
// kv head and the widest head dim the kernels take (the tiles' rescaling, the backward's sums over
// query tiles and heads, the 113 KiB shared-memory launch); and the narrowest head dim, narrower than
// a key tile (the bf16 kernels' score tile is wider than their output tile).
struct AttnShape {
  int64_t b, t, h, kv, hd;
  // The suffix of an output's name: none for the small shape.
  std::string label() const {
    if (b == B && t == T && h == H && kv == KV && hd == HD) return "";
    return " (T " + std::to_string(t) + ", " + std::to_string(h) + ":" + std::to_string(kv) + " heads, hd " +
           std::to_string(hd) + ")";
  }
  Shape qs() const { return {b, t, h, hd}; }
  Shape ks() const { return {b, t, kv, hd}; }
  Shape ls() const { return {b, h, t}; }
};
const AttnShape kAttnShapes[] = {{B, T, H, KV, HD}, {1, 130, 8, 1, 128}, {1, 40, 2, 2, 16}};

struct AttnData {
  Vec q, k, v, out, lse;
};
AttnData attention_data(const AttnShape& a, uint64_t seed) {
  AttnData r{random_f(a.qs().numel(), seed), random_f(a.ks().numel(), seed + 1), random_f(a.ks().numel(), seed + 2),
             filled(a.qs().numel(), 0), filled(a.ls().numel(), 0)};
  k::attention_fwd<double>(r.q.data(), r.k.data(), r.v.data(), r.out.data(), r.lse.data(), a.b, a.t, a.h, a.kv,
                           a.hd);
  return r;
}

Errors attention_fwd(Device& d) {
  Errors e;
  for (const AttnShape& s : kAttnShapes) {
    const AttnData a = attention_data(s, 25);
    Tensor tq = d.put(a.q, s.qs()), tk = d.put(a.k, s.ks()), tv = d.put(a.v, s.ks());
    Tensor to = d.put(filled(s.qs().numel(), kNaN), s.qs()), tl = d.put_f32(filled(s.ls().numel(), kNaN), s.ls());
    d.be().attention_fwd(tq.view(), tk.view(), tv.view(), to.view(), tl.view());
    e.emplace_back("out" + s.label(), normwise_err(d.get(to), a.out));
    e.emplace_back("lse" + s.label(), normwise_err(d.get(tl), a.lse));
  }
  return e;
}

Errors attention_bwd(Device& d) {
  Errors e;
  for (const AttnShape& s : kAttnShapes) {
    AttnData a = attention_data(s, 28);
    a.out = rounded(a.out), a.lse = rounded(a.lse);
    const Vec dout = random_f(s.qs().numel(), 31);
    Vec dq = filled(a.q.size(), 0), dk = filled(a.k.size(), 0), dv = filled(a.v.size(), 0);
    k::attention_bwd<double>(dout.data(), a.q.data(), a.k.data(), a.v.data(), a.out.data(), a.lse.data(), dq.data(),
                             dk.data(), dv.data(), s.b, s.t, s.h, s.kv, s.hd);
    Tensor tdo = d.put(dout, s.qs()), tq = d.put(a.q, s.qs()), tk = d.put(a.k, s.ks()), tv = d.put(a.v, s.ks());
    Tensor to = d.put(a.out, s.qs()), tl = d.put_f32(a.lse, s.ls());
    Tensor tdq = d.put(filled(s.qs().numel(), kNaN), s.qs()), tdk = d.put(filled(s.ks().numel(), kNaN), s.ks());
    Tensor tdv = d.put(filled(s.ks().numel(), kNaN), s.ks());
    d.be().attention_bwd(tdo.view(), tq.view(), tk.view(), tv.view(), to.view(), tl.view(), tdq.view(), tdk.view(),
                         tdv.view());
    e.emplace_back("dq" + s.label(), normwise_err(d.get(tdq), dq));
    e.emplace_back("dk" + s.label(), normwise_err(d.get(tdk), dk));
    e.emplace_back("dv" + s.label(), normwise_err(d.get(tdv), dv));
  }
  return e;
}

Errors conv1d_fwd(Device& d) {
  const Vec x = random_f(B * T * C, 32), w = random_f(C * KC, 33), bias = random_f(C, 34);
  Vec y = filled(B * T * C, 0);
  k::conv1d_fwd<double>(x.data(), w.data(), bias.data(), y.data(), B, T, C, KC);
  Tensor tx = d.put(x, {B, T, C}), tw = d.put(w, {C, KC}), tb = d.put(bias, {C});
  Tensor ty = d.put(filled(B * T * C, kNaN), {B, T, C});
  d.be().conv1d_fwd(tx.view(), tw.view(), tb.view(), ty.view());
  return {{"y", normwise_err(d.get(ty), y)}};
}

Errors conv1d_bwd(Device& d) {
  const Vec dy = random_f(B * T * C, 35), x = random_f(B * T * C, 36), w = random_f(C * KC, 37);
  Vec dx = filled(B * T * C, 0), dw = random_f(C * KC, 38), db = random_f(C, 39);
  Tensor tdy = d.put(dy, {B, T, C}), tx = d.put(x, {B, T, C}), tw = d.put(w, {C, KC});
  Tensor tdx = d.put(filled(B * T * C, kNaN), {B, T, C}), tdw = d.put_f32(dw, {C, KC}), tdb = d.put_f32(db, {C});
  k::conv1d_bwd<double>(dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), B, T, C, KC);
  d.be().conv1d_bwd(tdy.view(), tx.view(), tw.view(), tdx.view(), tdw.view(), tdb.view());
  return {{"dx", normwise_err(d.get(tdx), dx)},
          {"dw (accumulated)", normwise_err(d.get(tdw), dw)},
          {"dbias (accumulated)", normwise_err(d.get(tdb), db)}};
}

// The scan at two shapes: the small one of the other cases, and one whose chunks (70, 70 and 10
// steps) and head dim (70) cross the CUDA kernels' 64-row tiles.
struct SsdData {
  explicit SsdData(const k::SsdShape& shape = {B, T, HM, P, G, NS, CHUNK}) : s(shape) {}
  k::SsdShape s;
  Shape xs{s.B, s.Tn, s.Hm, s.P}, ts{s.B, s.Tn, s.Hm}, bs{s.B, s.Tn, s.G, s.N};
  Vec x = random_f(xs.numel(), 40), dt = random_f(ts.numel(), 41, 0.05, 0.5);
  Vec A_log = random_f(s.Hm, 42, -1.0, 0.5), Bm = random_f(bs.numel(), 43);
  Vec Cm = random_f(bs.numel(), 44), D = random_f(s.Hm, 45);
  // The suffix of an output's name: none for the small shape.
  std::string label() const {
    if (s.Tn == T) return "";
    return " (T " + std::to_string(s.Tn) + ", chunk " + std::to_string(s.chunk) + ", P " + std::to_string(s.P) + ")";
  }
};
const k::SsdShape kSsdShapes[] = {{B, T, HM, P, G, NS, CHUNK}, {1, 150, 4, 70, 2, 20, 70}};

Errors ssd_fwd(Device& d) {
  Errors e;
  for (const k::SsdShape& shape : kSsdShapes) {
    const SsdData in(shape);
    Vec y = filled(in.xs.numel(), 0);
    k::ssd_ref_fwd<double>(in.s, in.x.data(), in.dt.data(), in.A_log.data(), in.Bm.data(), in.Cm.data(), in.D.data(),
                           y.data());
    Backend& be = d.be();
    Tensor tx = d.put(in.x, in.xs), tdt = d.put(in.dt, in.ts), ta = d.put_f32(in.A_log, {in.s.Hm});
    Tensor tb = d.put(in.Bm, in.bs), tc = d.put(in.Cm, in.bs), tD = d.put_f32(in.D, {in.s.Hm});
    Tensor ty = d.put(filled(in.xs.numel(), kNaN), in.xs);
    Tensor saved(be, Shape{be.ssd_saved_numel(in.xs, in.bs, in.s.chunk)}, MemCategory::MEM_BUFFERS);
    be.ssd_fwd(tx.view(), tdt.view(), ta.view(), tb.view(), tc.view(), tD.view(), ty.view(), saved.view(),
               in.s.chunk);
    e.emplace_back("y" + in.label(), normwise_err(d.get(ty), y));
  }
  return e;
}

Errors ssd_bwd(Device& d) {
  Errors e;
  for (const k::SsdShape& shape : kSsdShapes) {
    const SsdData in(shape);
    const int64_t hm = in.s.Hm, chunk = in.s.chunk;
    const Vec dy = random_f(in.xs.numel(), 46);
    Vec dx = filled(in.xs.numel(), 0), ddt = filled(in.ts.numel(), 0), dA = random_f(hm, 47);
    Vec dB = filled(in.bs.numel(), 0), dC = filled(in.bs.numel(), 0), dD = random_f(hm, 48);
    Backend& be = d.be();
    Tensor tx = d.put(in.x, in.xs), tdt = d.put(in.dt, in.ts), ta = d.put_f32(in.A_log, {hm});
    Tensor tb = d.put(in.Bm, in.bs), tc = d.put(in.Cm, in.bs), tD = d.put_f32(in.D, {hm});
    Tensor ty = d.put(filled(in.xs.numel(), kNaN), in.xs), tdy = d.put(dy, in.xs);
    Tensor saved(be, Shape{be.ssd_saved_numel(in.xs, in.bs, chunk)}, MemCategory::MEM_BUFFERS);
    be.ssd_fwd(tx.view(), tdt.view(), ta.view(), tb.view(), tc.view(), tD.view(), ty.view(), saved.view(), chunk);
    Tensor tdx = d.put(filled(in.xs.numel(), kNaN), in.xs), tddt = d.put(filled(in.ts.numel(), kNaN), in.ts);
    Tensor tdB = d.put(filled(in.bs.numel(), kNaN), in.bs), tdC = d.put(filled(in.bs.numel(), kNaN), in.bs);
    Tensor tdA = d.put_f32(dA, {hm}), tdD = d.put_f32(dD, {hm});
    k::ssd_ref_bwd<double>(in.s, dy.data(), in.x.data(), in.dt.data(), in.A_log.data(), in.Bm.data(), in.Cm.data(),
                           in.D.data(), dx.data(), ddt.data(), dA.data(), dB.data(), dC.data(), dD.data());
    be.ssd_bwd(tdy.view(), tx.view(), tdt.view(), ta.view(), tb.view(), tc.view(), tD.view(), saved.view(),
               tdx.view(), tddt.view(), tdA.view(), tdB.view(), tdC.view(), tdD.view(), chunk);
    const std::string l = in.label();
    e.emplace_back("dx" + l, normwise_err(d.get(tdx), dx));
    e.emplace_back("ddt" + l, normwise_err(d.get(tddt), ddt));
    e.emplace_back("dBm" + l, normwise_err(d.get(tdB), dB));
    e.emplace_back("dCm" + l, normwise_err(d.get(tdC), dC));
    e.emplace_back("dA_log (accumulated)" + l, normwise_err(d.get(tdA), dA));
    e.emplace_back("dD (accumulated)" + l, normwise_err(d.get(tdD), dD));
  }
  return e;
}

constexpr int64_t kElems = 1000;  // elementwise ops

Errors silu_fwd(Device& d) {
  const Vec x = random_f(kElems, 49, -6, 6);
  Vec y = filled(kElems, 0);
  k::silu_fwd<double>(x.data(), y.data(), kElems);
  Tensor tx = d.put(x, {kElems}), ty = d.put(filled(kElems, kNaN), {kElems});
  d.be().silu_fwd(tx.view(), ty.view());
  return {{"y", normwise_err(d.get(ty), y)}};
}

Errors silu_bwd(Device& d) {
  const Vec dy = random_f(kElems, 50), x = random_f(kElems, 51, -6, 6);
  Vec dx = filled(kElems, 0);
  k::silu_bwd<double>(dy.data(), x.data(), dx.data(), kElems);
  Tensor tdy = d.put(dy, {kElems}), tx = d.put(x, {kElems}), tdx = d.put(filled(kElems, kNaN), {kElems});
  d.be().silu_bwd(tdy.view(), tx.view(), tdx.view());
  return {{"dx", normwise_err(d.get(tdx), dx)}};
}

Errors swiglu_fwd(Device& d) {
  const Vec gate = random_f(kElems, 52, -6, 6), up = random_f(kElems, 53);
  Vec h = filled(kElems, 0);
  k::swiglu_fwd<double>(gate.data(), up.data(), h.data(), kElems);
  Tensor tg = d.put(gate, {kElems}), tu = d.put(up, {kElems}), th = d.put(filled(kElems, kNaN), {kElems});
  d.be().swiglu_fwd(tg.view(), tu.view(), th.view());
  return {{"h", normwise_err(d.get(th), h)}};
}

Errors swiglu_bwd(Device& d) {
  const Vec dh = random_f(kElems, 54), gate = random_f(kElems, 55, -6, 6), up = random_f(kElems, 56);
  Vec dg = filled(kElems, 0), du = filled(kElems, 0);
  k::swiglu_bwd<double>(dh.data(), gate.data(), up.data(), dg.data(), du.data(), kElems);
  Tensor tdh = d.put(dh, {kElems}), tg = d.put(gate, {kElems}), tu = d.put(up, {kElems});
  Tensor tdg = d.put(filled(kElems, kNaN), {kElems}), tdu = d.put(filled(kElems, kNaN), {kElems});
  d.be().swiglu_bwd(tdh.view(), tg.view(), tu.view(), tdg.view(), tdu.view());
  return {{"dgate", normwise_err(d.get(tdg), dg)}, {"dup", normwise_err(d.get(tdu), du)}};
}

Errors dt_softplus_fwd(Device& d) {
  const Vec raw = random_f(M * HM, 57, -4, 4), bias = random_f(HM, 58);
  Vec dt = filled(M * HM, 0);
  k::dt_softplus_fwd<double>(raw.data(), bias.data(), dt.data(), M, HM);
  Tensor tr = d.put(raw, {M, HM}), tb = d.put_f32(bias, {HM}), tdt = d.put(filled(M * HM, kNaN), {M, HM});
  d.be().dt_softplus_fwd(tr.view(), tb.view(), tdt.view());
  return {{"dt", normwise_err(d.get(tdt), dt)}};
}

Errors dt_softplus_bwd(Device& d) {
  const Vec ddt = random_f(M * HM, 59), raw = random_f(M * HM, 60, -4, 4), bias = random_f(HM, 61);
  Vec draw = filled(M * HM, 0), dbias = random_f(HM, 62);
  Tensor tddt = d.put(ddt, {M, HM}), tr = d.put(raw, {M, HM}), tb = d.put_f32(bias, {HM});
  Tensor tdr = d.put(filled(M * HM, kNaN), {M, HM}), tdb = d.put_f32(dbias, {HM});
  k::dt_softplus_bwd<double>(ddt.data(), raw.data(), bias.data(), draw.data(), dbias.data(), M, HM);
  d.be().dt_softplus_bwd(tddt.view(), tr.view(), tb.view(), tdr.view(), tdb.view());
  return {{"ddt_raw", normwise_err(d.get(tdr), draw)},
          {"ddt_bias (accumulated)", normwise_err(d.get(tdb), dbias)}};
}

// The vocabulary [0, VOC) and the shard [OFF, OFF + VS) of a vocab-parallel rank.
constexpr int64_t VOC = 11, VS = 4, OFF = 5;

Errors embedding(Device& d, bool backward) {
  const auto ids = random_ids(M, VOC, backward ? 64 : 63);
  Tensor tids = d.put_ids(ids);
  Errors e;
  for (const auto& [rows, offset] : {std::pair<int64_t, int64_t>{VOC, 0}, {VS, OFF}}) {
    const std::string which = offset ? " (shard)" : "";
    if (backward) {
      const Vec dout = random_f(M * Kd, 65);
      Vec dt = random_f(rows * Kd, 66);
      Tensor tdo = d.put(dout, {M, Kd}), tdt = d.put_f32(dt, {rows, Kd});
      k::embedding_bwd<double>(ids.data(), dout.data(), dt.data(), M, Kd, rows, offset);
      d.be().embedding_bwd(tids.view(), tdo.view(), tdt.view(), offset);
      e.emplace_back("dtable" + which + " (accumulated)", normwise_err(d.get(tdt), dt));
    } else {
      const Vec table = random_f(rows * Kd, 67);
      Vec out = filled(M * Kd, 0);
      k::embedding_fwd<double>(ids.data(), table.data(), out.data(), M, Kd, rows, offset);
      Tensor tt = d.put_weight(table, {rows, Kd}), to = d.put(filled(M * Kd, kNaN), {M, Kd});
      d.be().embedding_fwd(tids.view(), tt.view(), to.view(), offset);
      e.emplace_back("out" + which, normwise_err(d.get(to), out));
    }
  }
  return e;
}

constexpr float kScale = 0.125f;

Errors cross_entropy(Device& d) {
  const Vec logits = random_f(M * VOC, 68, -4, 4);
  const auto targets = random_ids(M, VOC, 69);
  Vec dl = filled(M * VOC, 0);
  const double loss = k::cross_entropy<double>(logits.data(), targets.data(), dl.data(), M, VOC, kScale);
  Tensor tl = d.put(logits, {M, VOC}), tt = d.put_ids(targets), tdl = d.put(filled(M * VOC, kNaN), {M, VOC});
  const double got = d.be().cross_entropy(tl.view(), tt.view(), tdl.view(), kScale);
  return {{"loss", std::fabs(got - loss) / std::fabs(loss)}, {"dlogits", normwise_err(d.get(tdl), dl)}};
}

Errors row_max(Device& d) {
  const Vec x = random_f(M * VOC, 70, -4, 4);
  Vec mx = filled(M, 0);
  k::row_max<double>(x.data(), mx.data(), M, VOC);
  Tensor tx = d.put(x, {M, VOC}), tm = d.put_f32(filled(M, kNaN), {M});
  d.be().row_max(tx.view(), tm.view());
  return {{"out", normwise_err(d.get(tm), mx)}};
}

// One shard's logits with the row maxima of the whole vocabulary (its own max plus a margin).
struct VocabShard {
  Vec logits = random_f(M * VS, 71, -4, 4), row_max;
  std::vector<int32_t> targets = random_ids(M, VOC, 72);
  VocabShard() {
    row_max = filled(M, 0);
    k::row_max<double>(logits.data(), row_max.data(), M, VS);
    for (auto& m : row_max) m = static_cast<float>(m + 0.5);
  }
};

Errors vocab_ce_partials(Device& d) {
  const VocabShard s;
  Vec exps = filled(M * VS, 0), sums = filled(2 * M, 0);
  k::vocab_ce_partials<double>(s.logits.data(), s.row_max.data(), s.targets.data(), OFF, exps.data(),
                               sums.data(), M, VS);
  Tensor tl = d.put(s.logits, {M, VS}), tm = d.put_f32(s.row_max, {M}), tt = d.put_ids(s.targets);
  Tensor te = d.put(filled(M * VS, kNaN), {M, VS}), ts = d.put_f32(filled(2 * M, kNaN), {2, M});
  d.be().vocab_ce_partials(tl.view(), tm.view(), tt.view(), OFF, te.view(), ts.view());
  return {{"exps", normwise_err(d.get(te), exps)}, {"sums", normwise_err(d.get(ts), sums)}};
}

Errors vocab_ce_finish(Device& d) {
  const VocabShard s;
  Vec exps = filled(M * VS, 0), sums = filled(2 * M, 0);
  k::vocab_ce_partials<double>(s.logits.data(), s.row_max.data(), s.targets.data(), OFF, exps.data(),
                               sums.data(), M, VS);
  for (int64_t m = 0; m < M; ++m) sums[static_cast<size_t>(m)] += 3.0;  // the other shards' exps
  exps = rounded(exps), sums = rounded(sums);
  Tensor ts = d.put_f32(sums, {2, M}), tm = d.put_f32(s.row_max, {M}), tt = d.put_ids(s.targets);
  Tensor td = d.put(exps, {M, VS});
  const double loss = k::vocab_ce_finish<double>(sums.data(), s.row_max.data(), s.targets.data(), OFF,
                                                 exps.data(), M, VS, kScale);
  const double got = d.be().vocab_ce_finish(ts.view(), tm.view(), tt.view(), OFF, td.view(), kScale);
  return {{"loss", std::fabs(got - loss) / std::fabs(loss)}, {"dlogits", normwise_err(d.get(td), exps)}};
}

Errors gather_scatter(Device& d, bool scatter) {
  constexpr int64_t S = 10, col = 3, n = 4;
  const Vec src = random_f(M * (scatter ? n : S), 73);
  Vec dst = scatter ? random_f(M * S, 74) : filled(M * n, 0);
  Tensor tdst = d.put(scatter ? dst : filled(M * n, kNaN), {M, scatter ? S : n});
  if (scatter) {
    k::scatter_cols<double>(src.data(), n, dst.data(), S, col, M);
    Tensor ts = d.put(src, {M, n});
    d.be().scatter_cols(ts.view(), tdst.view(), col);
  } else {
    k::gather_cols<double>(src.data(), S, col, dst.data(), n, M);
    Tensor ts = d.put(src, {M, S});
    d.be().gather_cols(ts.view(), col, tdst.view());
  }
  return {{"dst", normwise_err(d.get(tdst), dst)}};
}

Errors add_inplace(Device& d) {
  const Vec x = random_f(kElems, 75);
  Vec y = random_f(kElems, 76);
  Tensor ty = d.put(y, {kElems}), tx = d.put(x, {kElems});
  k::add_inplace<double>(y.data(), x.data(), kElems);
  d.be().add_inplace(ty.view(), tx.view());
  return {{"y", normwise_err(d.get(ty), y)}};
}

// Both ways between the case's storage type and f32: f32 -> bf16 rounds, bf16 -> f32 is exact,
// f32 -> f32 a copy.
Errors convert(Device& d) {
  const Vec x = random_f(kElems, 82);
  Tensor wide = d.put_f32(x, {kElems}), narrow = d.empty({kElems});
  d.be().convert(wide.view(), narrow.view());
  Tensor back(d.be(), Shape{kElems}, MemCategory::MEM_BUFFERS, DType::DTYPE_F32);
  d.be().convert(narrow.view(), back.view());
  return {{"to storage", normwise_err(d.get(narrow), x)}, {"to f32", normwise_err(d.get(back), d.get(narrow))}};
}

// MoE routing: MM token rows in sequences of SEQ, ME experts, MK = top_k, D = Kd.
constexpr int64_t MM = 12, SEQ = 4, ME = 6, MK = 2, MP = MM * MK;
using Ids = std::vector<int32_t>;

// Entries of two index lists that differ (any is an error: the tolerance cannot pass it).
double mismatches(const Ids& a, const Ids& b) {
  if (a.size() != b.size()) return INFINITY;
  double n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// The double router on float-exact logits, its outputs rounded to float.
struct MoeRoute {
  Vec logits = random_f(MM * ME, 90, -3, 3), probs = filled(MM * ME, 0), weights = filled(MM * MK, 0);
  Ids experts = Ids(MP);
  MoeRoute() {
    k::moe_route_fwd<double>(logits.data(), probs.data(), experts.data(), weights.data(), MM, ME, MK);
    probs = rounded(probs), weights = rounded(weights);
  }
};

// The expert-major permutation of a route.
struct MoePerm {
  Ids counts = Ids(ME), rows = Ids(MP), pos = Ids(MP);
  explicit MoePerm(const Ids& experts) {
    k::moe_permute_index(experts.data(), counts.data(), rows.data(), pos.data(), MM, ME, MK);
  }
};

Errors moe_route_fwd(Device& d) {
  const MoeRoute r;
  Tensor tl = d.put_f32(r.logits, {MM, ME}), tp = d.put_f32(filled(MM * ME, kNaN), {MM, ME});
  Tensor te = d.put_ids(Ids(MP, -1), {MM, MK}), tw = d.put_f32(filled(MM * MK, kNaN), {MM, MK});
  d.be().moe_route_fwd(tl.view(), tp.view(), te.view(), tw.view());
  return {{"probs", normwise_err(d.get(tp), r.probs)},
          {"experts (mismatches)", mismatches(d.get_ids(te), r.experts)},
          {"weights", normwise_err(d.get(tw), r.weights)}};
}

Errors moe_route_bwd(Device& d) {
  const MoeRoute r;
  const Vec dw = random_f(MM * MK, 91), dp = random_f(MM * ME, 92, -0.1, 0.1);
  Vec dl = filled(MM * ME, 0);
  k::moe_route_bwd<double>(dw.data(), dp.data(), r.probs.data(), r.experts.data(), r.weights.data(),
                           dl.data(), MM, ME, MK);
  Tensor tdw = d.put_f32(dw, {MM, MK}), tdp = d.put_f32(dp, {MM, ME}), tp = d.put_f32(r.probs, {MM, ME});
  Tensor te = d.put_ids(r.experts, {MM, MK}), tw = d.put_f32(r.weights, {MM, MK});
  Tensor tdl = d.put_f32(filled(MM * ME, kNaN), {MM, ME});
  d.be().moe_route_bwd(tdw.view(), tdp.view(), tp.view(), te.view(), tw.view(), tdl.view());
  return {{"dlogits", normwise_err(d.get(tdl), dl)}};
}

Errors moe_balance(Device& d) {
  const MoeRoute r;
  Vec dp = filled(MM * ME, 0);
  const double loss = k::moe_balance<double>(r.probs.data(), r.experts.data(), dp.data(), MM, ME, MK,
                                             SEQ, kScale);
  Tensor tp = d.put_f32(r.probs, {MM, ME}), te = d.put_ids(r.experts, {MM, MK});
  Tensor tdp = d.put_f32(filled(MM * ME, kNaN), {MM, ME});
  const double got = d.be().moe_balance(tp.view(), te.view(), SEQ, tdp.view(), kScale);
  return {{"loss", std::fabs(got - loss) / std::fabs(loss)}, {"dprobs", normwise_err(d.get(tdp), dp)}};
}

Errors moe_permute_index(Device& d) {
  const MoeRoute r;
  const MoePerm want(r.experts);
  Tensor te = d.put_ids(r.experts, {MM, MK}), tc = d.put_ids(Ids(ME, -1), {ME});
  Tensor trows = d.put_ids(Ids(MP, -1), {MP}), tpos = d.put_ids(Ids(MP, -1), {MM, MK});
  d.be().moe_permute_index(te.view(), tc.view(), trows.view(), tpos.view());
  return {{"counts (mismatches)", mismatches(d.get_ids(tc), want.counts)},
          {"rows (mismatches)", mismatches(d.get_ids(trows), want.rows)},
          {"pos (mismatches)", mismatches(d.get_ids(tpos), want.pos)}};
}

Errors gather_rows(Device& d) {
  constexpr int64_t Nsrc = 5;
  const Vec src = random_f(Nsrc * Kd, 93);
  const Ids rows = {4, 0, 4, 2, 2, 2, 1, 3, 0};  // more rows than src has, repeated
  const auto Pg = static_cast<int64_t>(rows.size());
  Vec dst = filled(Pg * Kd, 0);
  k::gather_rows<double>(src.data(), rows.data(), dst.data(), Pg, Kd);
  Tensor ts = d.put(src, {Nsrc, Kd}), tr = d.put_ids(rows), td = d.put(filled(Pg * Kd, kNaN), {Pg, Kd});
  d.be().gather_rows(ts.view(), tr.view(), td.view());
  // no rows at all (an expert that got no tokens): accepted, nothing written
  Tensor tr0(d.be(), Shape{0}, MemCategory::MEM_BUFFERS, DType::DTYPE_I32);
  Tensor td0 = d.empty(Shape{0, Kd});
  d.be().gather_rows(ts.view(), tr0.view(), td0.view());
  return {{"dst", normwise_err(d.get(td), dst)}};
}

Errors moe_combine(Device& d) {
  const MoeRoute r;
  const MoePerm pm(r.experts);
  const Vec y = random_f(MP * Kd, 94);
  Vec out = filled(MM * Kd, 0);
  k::moe_combine<double>(y.data(), pm.pos.data(), r.weights.data(), out.data(), MM, MK, Kd);
  Tensor ty = d.put(y, {MP, Kd}), tpos = d.put_ids(pm.pos, {MM, MK}), tw = d.put_f32(r.weights, {MM, MK});
  Tensor to = d.put(filled(MM * Kd, kNaN), {MM, Kd});
  d.be().moe_combine(ty.view(), tpos.view(), tw.view(), to.view());
  // An MoE block's rows in the storage type combine into its f32 output.
  Tensor wide = d.put_f32(filled(MM * Kd, kNaN), {MM, Kd});
  d.be().moe_combine(ty.view(), tpos.view(), tw.view(), wide.view());
  return {{"out", normwise_err(d.get(to), out)}, {"out (f32)", normwise_err(d.get(wide), out)}};
}

Errors moe_combine_bwd(Device& d) {
  const MoeRoute r;
  const MoePerm pm(r.experts);
  const Vec dout = random_f(MM * Kd, 95), y = random_f(MP * Kd, 96);
  Vec dy = filled(MP * Kd, 0), dw = filled(MM * MK, 0);
  k::moe_combine_bwd<double>(dout.data(), y.data(), pm.pos.data(), r.weights.data(), dy.data(),
                             dw.data(), MM, MK, Kd);
  Tensor tdo = d.put(dout, {MM, Kd}), ty = d.put(y, {MP, Kd}), tpos = d.put_ids(pm.pos, {MM, MK});
  Tensor tw = d.put_f32(r.weights, {MM, MK});
  Tensor tdy = d.put(filled(MP * Kd, kNaN), {MP, Kd}), tdw = d.put_f32(filled(MM * MK, kNaN), {MM, MK});
  d.be().moe_combine_bwd(tdo.view(), ty.view(), tpos.view(), tw.view(), tdy.view(), tdw.view());
  return {{"dy", normwise_err(d.get(tdy), dy)}, {"dweights", normwise_err(d.get(tdw), dw)}};
}

Errors moe_dispatch_bwd(Device& d) {
  const MoeRoute r;
  const MoePerm pm(r.experts);
  const Vec dxp = random_f(MP * Kd, 97);
  Vec dx = random_f(MM * Kd, 98);
  Tensor tdxp = d.put(dxp, {MP, Kd}), tpos = d.put_ids(pm.pos, {MM, MK}), tdx = d.put(dx, {MM, Kd});
  Tensor wide = d.put_f32(dx, {MM, Kd});  // an MoE block's f32 input gradient
  k::moe_dispatch_bwd<double>(dxp.data(), pm.pos.data(), dx.data(), MM, MK, Kd);
  d.be().moe_dispatch_bwd(tdxp.view(), tpos.view(), tdx.view());
  d.be().moe_dispatch_bwd(tdxp.view(), tpos.view(), wide.view());
  return {{"dx (accumulated)", normwise_err(d.get(tdx), dx)}, {"dx (f32, accumulated)", normwise_err(d.get(wide), dx)}};
}

// torch.optim.AdamW, single-tensor path, in double.
void ref_adamw(Vec& p, const Vec& g, Vec& m, Vec& v, const AdamWStep& s) {
  const double bc1 = 1.0 - std::pow(s.beta1, double(s.t)), bc2 = 1.0 - std::pow(s.beta2, double(s.t));
  for (size_t i = 0; i < p.size(); ++i) {
    const double gi = g[i] * double(s.grad_scale);
    if (s.decay) p[i] *= 1.0 - s.lr * s.weight_decay;
    m[i] = s.beta1 * m[i] + (1.0 - s.beta1) * gi;
    v[i] = s.beta2 * v[i] + (1.0 - s.beta2) * gi * gi;
    p[i] -= s.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + s.eps);
  }
}

Errors adamw_update(Device& d) {
  const AdamWStep step{1e-2, 0.9, 0.95, 1e-8, 0.1, 3, true, 0.5f};
  const Vec g = random_f(kElems, 77);
  Vec p = random_f(kElems, 78), m = random_f(kElems, 79, -0.1, 0.1), v = random_f(kElems, 80, 0.0, 0.01);
  Tensor tp = d.put_f32(p, {kElems}), tg = d.put_f32(g, {kElems}), tm = d.put_f32(m, {kElems});
  Tensor tv = d.put_f32(v, {kElems});
  ref_adamw(p, g, m, v, step);
  d.be().adamw_update(tp.view(), tg.view(), tm.view(), tv.view(), step);
  return {{"p", normwise_err(d.get(tp), p)}, {"m", normwise_err(d.get(tm), m)}, {"v", normwise_err(d.get(tv), v)}};
}

Errors sum_squares(Device& d) {
  constexpr int64_t n = 20000;  // several of the kernel's fixed blocks
  const Vec x = random_f(n, 81);
  const double want = k::sum_squares<double>(x.data(), n);
  Tensor tx = d.put(x, {n});
  return {{"sum", std::fabs(d.be().sum_squares(tx.view()) - want) / want}};
}

// Tolerances. f32: normwise float error of a few ulps (elementwise ops, copies), more where a
// result sums many terms (products, norms, scans). bf16 storage (f32 arithmetic): every input and
// output is rounded to bf16, unit roundoff u = 2^-9 ~ 1.95e-3, against a reference of the
// unrounded inputs: an elementwise op or copy is off by about u for the input and u for the
// output, so 1e-2 (about 5u); an op that reduces over rows or columns (products, norms,
// attention, conv, the scan, the losses) amplifies the inputs' rounding by its conditioning, and
// the backward ops subtract nearly equal terms, so 3e-2. Ops whose tensors the contract keeps in
// f32 (the router, AdamW) keep their f32 tolerance; index outputs must match exactly.
constexpr double kBf16Elementwise = 1e-2, kBf16Reduced = 3e-2;
// TF32 products (MATMUL_TF32): each f32 input rounded to a 10-bit mantissa, u = 2^-11 ~ 4.9e-4, f32
// accumulation: a product's normwise error is about 2u times the conditioning of its sums, so 5e-3 (10u).
// The other ops compute in f32 as before and keep their f32 tolerance.
constexpr double kTf32Products = 5e-3;
bool is_product(Op op) {
  return op == Op::OP_linear_fwd || op == Op::OP_linear_bwd_input || op == Op::OP_linear_bwd_weight;
}
// The ops that read a weight (put_weight): rounded to bf16 beside f32 activations, their bf16 tolerance.
bool reads_weight(Op op) {
  return op == Op::OP_linear_fwd || op == Op::OP_linear_bwd_input || op == Op::OP_embedding_fwd;
}

std::map<Op, Case> cases() {
  using std::placeholders::_1;
  return {
      {Op::OP_linear_fwd, {1e-5, kBf16Reduced, linear_fwd}},
      {Op::OP_linear_bwd_input, {1e-5, kBf16Reduced, linear_bwd_input}},
      {Op::OP_linear_bwd_weight, {1e-5, kBf16Reduced, linear_bwd_weight}},
      {Op::OP_rmsnorm_fwd, {1e-5, kBf16Reduced, rmsnorm_fwd}},
      {Op::OP_rmsnorm_bwd, {1e-5, kBf16Reduced, rmsnorm_bwd}},
      {Op::OP_gated_rmsnorm_fwd, {1e-5, kBf16Reduced, gated_rmsnorm_fwd}},
      {Op::OP_gated_rmsnorm_bwd, {1e-5, kBf16Reduced, gated_rmsnorm_bwd}},
      {Op::OP_rope_fwd, {1e-5, kBf16Elementwise, [](Device& d) { return rope(d, false); }}},
      {Op::OP_rope_bwd, {1e-5, kBf16Elementwise, [](Device& d) { return rope(d, true); }}},
      {Op::OP_attention_fwd, {1e-5, kBf16Reduced, attention_fwd}},
      {Op::OP_attention_bwd, {1e-5, kBf16Reduced, attention_bwd}},
      {Op::OP_conv1d_fwd, {1e-5, kBf16Reduced, conv1d_fwd}},
      {Op::OP_conv1d_bwd, {1e-5, kBf16Reduced, conv1d_bwd}},
      {Op::OP_ssd_fwd, {1e-5, kBf16Reduced, ssd_fwd}},
      {Op::OP_ssd_bwd, {1e-4, kBf16Reduced, ssd_bwd}},
      {Op::OP_silu_fwd, {1e-6, kBf16Elementwise, silu_fwd}},
      {Op::OP_silu_bwd, {1e-6, kBf16Elementwise, silu_bwd}},
      {Op::OP_swiglu_fwd, {1e-6, kBf16Elementwise, swiglu_fwd}},
      {Op::OP_swiglu_bwd, {1e-6, kBf16Elementwise, swiglu_bwd}},
      {Op::OP_moe_route_fwd, {1e-6, 1e-6, moe_route_fwd}},
      {Op::OP_moe_route_bwd, {1e-6, 1e-6, moe_route_bwd}},
      {Op::OP_moe_balance, {1e-6, 1e-6, moe_balance}},
      {Op::OP_moe_permute_index, {0.0, 0.0, moe_permute_index}},
      {Op::OP_gather_rows, {0.0, kBf16Elementwise, gather_rows}},
      {Op::OP_moe_combine, {1e-6, kBf16Elementwise, moe_combine}},
      {Op::OP_moe_combine_bwd, {1e-6, kBf16Reduced, moe_combine_bwd}},
      {Op::OP_moe_dispatch_bwd, {1e-6, kBf16Elementwise, moe_dispatch_bwd}},
      {Op::OP_dt_softplus_fwd, {1e-6, kBf16Elementwise, dt_softplus_fwd}},
      {Op::OP_dt_softplus_bwd, {1e-6, kBf16Elementwise, dt_softplus_bwd}},
      {Op::OP_embedding_fwd, {1e-7, kBf16Elementwise, [](Device& d) { return embedding(d, false); }}},
      {Op::OP_embedding_bwd, {1e-6, kBf16Elementwise, [](Device& d) { return embedding(d, true); }}},
      {Op::OP_cross_entropy, {1e-6, kBf16Reduced, cross_entropy}},
      {Op::OP_row_max, {1e-7, kBf16Elementwise, row_max}},
      {Op::OP_vocab_ce_partials, {1e-6, kBf16Reduced, vocab_ce_partials}},
      {Op::OP_vocab_ce_finish, {1e-6, kBf16Reduced, vocab_ce_finish}},
      {Op::OP_gather_cols, {1e-7, kBf16Elementwise, [](Device& d) { return gather_scatter(d, false); }}},
      {Op::OP_scatter_cols, {1e-7, kBf16Elementwise, [](Device& d) { return gather_scatter(d, true); }}},
      {Op::OP_add_inplace, {1e-6, kBf16Elementwise, add_inplace}},
      {Op::OP_convert, {0.0, kBf16Elementwise, convert}},
      {Op::OP_adamw_update, {1e-5, 1e-5, adamw_update}},
      {Op::OP_sum_squares, {1e-6, kBf16Elementwise, sum_squares}},
  };
}

// A run of the op runner: the backend, the storage type, the weights' type and the precision of the
// products, by name: "cpu", "cpu_detached", "cuda" (f32); "cpu_bf16", "cuda_bf16" (bf16 storage and
// weights); "cuda_tf32" (TF32 products); "cpu_bf16mm", "cuda_bf16mm" (f32 storage, bf16 weights, bf16
// products: train.precision bf16); "cpu_bf16w", "cuda_bf16w" (f32 storage and products, bf16 weights,
// widened). A GPU backend this machine lacks skips its cases, saying why (ctest counts them as not run:
// docs/testing.md).
struct RunMode {
  DType storage, weights;
  MatmulPrecision products;
  const char* label;
};
RunMode run_named(const std::string& which) {
  const auto ends = [&](const char* tail) {
    const std::string t = tail;
    return which.size() > t.size() && which.compare(which.size() - t.size(), t.size(), t) == 0;
  };
  constexpr DType f32 = DType::DTYPE_F32, bf16 = DType::DTYPE_BF16;
  if (ends("_bf16")) return {bf16, bf16, MatmulPrecision::MATMUL_FP32, "bf16"};
  if (ends("_tf32")) return {f32, f32, MatmulPrecision::MATMUL_TF32, "tf32"};
  if (ends("_bf16mm")) return {f32, bf16, MatmulPrecision::MATMUL_BF16, "bfmm"};
  if (ends("_bf16w")) return {f32, bf16, MatmulPrecision::MATMUL_FP32, "bf16w"};
  return {f32, f32, MatmulPrecision::MATMUL_FP32, "f32"};
}

class OnBackend : public ::testing::TestWithParam<std::string> {};

TEST_P(OnBackend, EveryOpMatchesTheDoubleReference) {
  const std::string& which = GetParam();
  const RunMode mode = run_named(which);
  const DType storage = mode.storage;
  Backend* be = which.rfind("cpu_detached", 0) == 0 ? &cpu_detached() : &cpu();
  if (which.rfind("cuda", 0) == 0) {
    std::string why;
    be = cuda(&why);
    if (!be) GTEST_SKIP() << "GPU test not run: " << why;
  }
  const auto table = cases();
  const char* precision = mode.label;
  be->set_matmul_precision(mode.products);
  struct Restore {
    Backend* be;
    ~Restore() { be->set_matmul_precision(MatmulPrecision::MATMUL_FP32); }
  } restore{be};
  Device dev(*be, storage, mode.weights);
  for (int i = 0; i < kOpCount; ++i) {
    const Op op = static_cast<Op>(i);
    const auto it = table.find(op);
    if (it == table.end()) {
      ADD_FAILURE() << "op " << op_name(op) << " of the backend op table has no case in the op runner";
      continue;
    }
    // bf16 products round their inputs as bf16 storage does, and a bf16 weight is rounded so: the op's
    // bf16 tolerance; TF32 products round less.
    const bool rounded = is_product(op) && mode.products != MatmulPrecision::MATMUL_FP32;
    const bool bf16_weight = reads_weight(op) && mode.weights == DType::DTYPE_BF16;
    const double tol = storage == DType::DTYPE_BF16 || bf16_weight                    ? it->second.tol_bf16
                       : rounded && mode.products == MatmulPrecision::MATMUL_TF32 ? kTf32Products
                       : rounded                                                  ? it->second.tol_bf16
                                                                                  : it->second.tol;
    for (const auto& [out, err] : it->second.run(dev)) {
      const bool ok = err <= tol;  // false for NaN: an output left unwritten
      std::printf("[ %-4s ] %-4s %-5s %-18s %-28s max rel err %.3e (tol %.0e)\n", ok ? "ok" : "FAIL", be->name(),
                  precision, op_name(op), out.c_str(), err, tol);
      EXPECT_TRUE(ok) << be->name() << " " << precision << " " << op_name(op) << " " << out
                      << ": error " << err << " above tolerance " << tol;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, OnBackend,
                         ::testing::Values("cpu", "cpu_bf16", "cpu_bf16mm", "cpu_bf16w", "cpu_detached", "cuda", "cuda_bf16",
                                           "cuda_tf32", "cuda_bf16mm", "cuda_bf16w"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// A NaN logit makes its row's loss and d(loss)/d(logits) NaN on every backend, wherever in the row
// it lies: first (before any number a running max could start from), in the middle, or last.
class LossOnBackend : public ::testing::TestWithParam<std::string> {};

TEST_P(LossOnBackend, ANanLogitMakesTheLossNaN) {
  Backend* be = &cpu();
  if (GetParam() == "cuda") {
    std::string why;
    be = cuda(&why);
    if (!be) GTEST_SKIP() << "GPU test not run: " << why;
  }
  Device d(*be, DType::DTYPE_F32, DType::DTYPE_F32);
  constexpr int64_t kV = 1000;  // more logits than a block has threads
  for (const int64_t at : {int64_t(0), kV / 2 + 1, kV - 1}) {
    Vec logits = random_f(kV, 71, -4, 4);
    logits[size_t(at)] = kNaN;
    Tensor tl = d.put(logits, {1, kV}), tt = d.put_ids({3}), tdl = d.put(filled(kV, 0.0), {1, kV});
    const double loss = be->cross_entropy(tl.view(), tt.view(), tdl.view(), 1.0f);
    EXPECT_TRUE(std::isnan(loss)) << be->name() << ": NaN at logit " << at << " gave loss " << loss;
    const Vec dl = d.get(tdl);
    const auto numbers = std::count_if(dl.begin(), dl.end(), [](double v) { return !std::isnan(v); });
    EXPECT_EQ(numbers, 0) << be->name() << ": NaN at logit " << at << " left " << numbers
                          << " of d(loss)/d(logits) a number";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LossOnBackend, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// Every backend the process has is one the op runner names: the CPU first, then the CUDA
// backend where there is one.
TEST(BackendOps, RegisteredBackendsAreTheCpuThenTheGpu) {
  const std::vector<Backend*> all = registered_backends();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all[0], &cpu());
  std::string why;
  Backend* gpu = cuda(&why);
  EXPECT_EQ(all.size(), gpu ? 2u : 1u);
  if (gpu) {
    EXPECT_EQ(all[1], gpu);
    EXPECT_EQ(gpu->kind(), DeviceKind::DEVICE_CUDA);
  } else {
    std::printf("no CUDA backend here: %s\n", why.c_str());
    EXPECT_FALSE(why.empty());
  }
}

// The detached CPU backend keeps its memory out of the host's reach: copies reach it, a host read
// through one of its pointers faults; the CPU backend's memory is the host's.
TEST(BackendOps, DetachedMemoryIsReachedOnlyThroughTheBackend) {
  Backend& be = cpu_detached();
  EXPECT_FALSE(be.host_addressable());
  EXPECT_TRUE(cpu().host_addressable());
  EXPECT_STREQ(be.name(), "cpu_detached");
  const int64_t held = be.memory().current[static_cast<size_t>(MemCategory::MEM_BUFFERS)];
  Tensor t(be, 4, MemCategory::MEM_BUFFERS), u(be, 4, MemCategory::MEM_BUFFERS);
  const float in[4] = {1, 2, 3, 4};
  float out[4] = {};
  be.to_device(t.data(), in, sizeof in);
  be.copy(u.data(), t.data(), sizeof in);
  be.add_inplace(u.view(), t.view());
  be.to_host(out, u.data(), sizeof out);
  EXPECT_EQ(out[3], 8.0f);
  EXPECT_EQ(be.sum_squares(t.view()), 30.0);
  EXPECT_EQ(be.memory().current[static_cast<size_t>(MemCategory::MEM_BUFFERS)] - held, 32);
  const float* p = t.data();
  EXPECT_DEATH({ std::printf("%f\n", static_cast<double>(*static_cast<const volatile float*>(p))); }, "");
}

// The op table's names are its entries, in order, each once.
TEST(BackendOps, OpNamesAreDistinct) {
  std::map<std::string, int> seen;
  for (int i = 0; i < kOpCount; ++i) ++seen[op_name(static_cast<Op>(i))];
  EXPECT_EQ(static_cast<int>(seen.size()), kOpCount);
  EXPECT_STREQ(op_name(Op::OP_linear_fwd), "linear_fwd");
  EXPECT_STREQ(op_name(Op::OP_sum_squares), "sum_squares");
}

// Shape, dtype and device errors name the op, the tensor and what was expected.
TEST(BackendOps, MisshapenTensorsAreRefusedWithTheOpAndTensorNamed) {
  Backend& be = cpu();
  Tensor x(be, Shape{4, 3}, MemCategory::MEM_BUFFERS), w(be, Shape{5, 2}, MemCategory::MEM_BUFFERS);
  Tensor y(be, Shape{4, 5}, MemCategory::MEM_BUFFERS);
  try {
    be.linear_fwd(x.view(), w.view(), y.view());
    ADD_FAILURE() << "linear_fwd accepted w [5,2] for x [4,3]";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "backend cpu, op linear_fwd: tensor w has shape [5,2], expected [5,3]");
  }
  Tensor ids(be, Shape{4}, MemCategory::MEM_BUFFERS);  // f32, not i32
  Tensor table(be, Shape{7, 3}, MemCategory::MEM_BUFFERS);
  EXPECT_THROW(be.embedding_fwd(ids.view(), table.view(), x.view(), 0), std::invalid_argument);
  Tensor half(be, Shape{4, 3}, MemCategory::MEM_BUFFERS, DType::DTYPE_BF16);
  try {
    be.silu_fwd(half.view(), x.view());
    ADD_FAILURE() << "the cpu backend computed from bf16 into f32";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tensor y has dtype f32, expected bf16 (an op's data tensors share one "
                                         "storage type)"),
              std::string::npos)
        << e.what();
  }
  be.convert(half.view(), x.view());  // a conversion's two sides are of their own types
  try {
    be.convert(ids.view(), half.view({12}));
    ADD_FAILURE() << "convert accepted dst [12] for src [4]";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "backend cpu, op convert: tensor dst has shape [12], expected [4]");
  }
  Tensor index(be, Shape{4, 3}, MemCategory::MEM_BUFFERS, DType::DTYPE_I32);
  EXPECT_THROW(be.convert(index.view(), x.view()), std::invalid_argument);
  EXPECT_THROW(be.set_stream(1), std::invalid_argument);
}

// The embedding's table is in its op's storage type or bf16 (a unit's compute copy): bf16 beside f32 rows is
// taken, f32 beside bf16 rows refused, naming the op and the tensor. A product takes any mix.
TEST(BackendOps, TheTableIsInTheStorageTypeOrBf16AndProductsMixTypes) {
  Backend& be = cpu();
  const auto half = DType::DTYPE_BF16, full = DType::DTYPE_F32;
  Tensor rows(be, Shape{4, 3}, MemCategory::MEM_BUFFERS, half), table(be, Shape{7, 3}, MemCategory::MEM_BUFFERS, full);
  Tensor ids(be, Shape{4}, MemCategory::MEM_BUFFERS, DType::DTYPE_I32);
  ids.zero(), table.zero();
  try {
    be.embedding_fwd(ids.view(), table.view(), rows.view(), 0);
    ADD_FAILURE() << "an f32 table beside bf16 rows was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("op embedding_fwd: tensor table has dtype f32, expected bf16 (a weight is in "
                                         "the op's storage type, or a unit's bf16 compute copy)"),
              std::string::npos)
        << e.what();
  }
  Tensor x(be, Shape{4, 3}, MemCategory::MEM_BUFFERS, half), w(be, Shape{5, 3}, MemCategory::MEM_BUFFERS, full);
  Tensor y(be, Shape{4, 5}, MemCategory::MEM_BUFFERS, full);
  x.zero(), w.zero();
  EXPECT_NO_THROW(be.linear_fwd(x.view(), w.view(), y.view()));
}

// The MoE ops refuse an index outside its range, a top-k above the expert count, a sequence
// length that does not divide the rows and a pos that is not a permutation, naming the op.
TEST(BackendOps, IndicesOutsideTheirRangeAreRefusedWithTheOpNamed) {
  Backend& be = cpu();
  Device d(be, DType::DTYPE_F32, DType::DTYPE_F32);
  auto refused = [](const std::function<void()>& call, const std::string& want) {
    try {
      call();
      ADD_FAILURE() << "accepted: " << want;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  Tensor src = d.put(filled(5 * 3, 1.0), {5, 3}), dst(be, Shape{3, 3}, MemCategory::MEM_BUFFERS);
  Tensor rows = d.put_ids({0, 5, 1});
  refused([&] { be.gather_rows(src.view(), rows.view(), dst.view()); },
          "backend cpu, op gather_rows: tensor rows holds 5 at element 1, outside [0, 5) (the rows of "
          "src [5,3])");
  Tensor logits = d.put(filled(4 * 3, 0.0), {4, 3}), probs = d.put(filled(4 * 3, 0.0), {4, 3});
  Tensor experts = d.put_ids(Ids(16, 0), {4, 4}), w = d.put(filled(16, 0.0), {4, 4});
  refused([&] { be.moe_route_fwd(logits.view(), probs.view(), experts.view(), w.view()); },
          "op moe_route_fwd: top-k 4 (experts [4,4]) must be in [1, 3], the experts of logits [4,3]");
  Tensor picked = d.put_ids({0, 1, 2, 0, 1, 3, 2, 1}, {4, 2}), dp = d.put(filled(12, 0.0), {4, 3});
  refused([&] { be.moe_balance(probs.view(), picked.view(), 2, dp.view(), 1.0f); },
          "op moe_balance: tensor experts holds 3 at element 5, outside [0, 3) (the experts of probs [4,3])");
  Tensor two = d.put_ids({0, 1, 2, 0, 1, 2, 2, 1}, {4, 2});
  refused([&] { be.moe_balance(probs.view(), two.view(), 3, dp.view(), 1.0f); },
          "op moe_balance: sequence length 3 does not divide the 4 rows of probs [4,3]");
  Tensor f32_experts = d.put(filled(8, 0.0), {4, 2});
  refused([&] { be.moe_balance(probs.view(), f32_experts.view(), 2, dp.view(), 1.0f); },
          "tensor experts has dtype f32, expected i32 (an index tensor)");
  Tensor y = d.put(filled(8 * 3, 1.0), {8, 3}), dout = d.put(filled(4 * 3, 1.0), {4, 3});
  Tensor pos = d.put_ids({0, 1, 2, 3, 4, 5, 6, 6}, {4, 2}), dy(be, Shape{8, 3}, MemCategory::MEM_BUFFERS);
  Tensor dw(be, Shape{4, 2}, MemCategory::MEM_BUFFERS), cw = d.put(filled(8, 0.5), {4, 2});
  refused([&] { be.moe_combine_bwd(dout.view(), y.view(), pos.view(), cw.view(), dy.view(), dw.view()); },
          "op moe_combine_bwd: tensor pos holds 6 twice (again at element 7), expected a permutation of "
          "[0, 8)");
  Tensor far = d.put_ids({0, 1, 2, 3, 4, 5, 6, 8}, {4, 2}), dx = d.put(filled(12, 0.0), {4, 3});
  refused([&] { be.moe_dispatch_bwd(y.view(), far.view(), dx.view()); },
          "op moe_dispatch_bwd: tensor pos holds 8 at element 7, outside [0, 8) (the rows of dxp [8,3])");
  Tensor targets = d.put_ids({0, 2, 3, 1}), dlogits(be, Shape{4, 3}, MemCategory::MEM_BUFFERS);
  refused([&] { be.cross_entropy(logits.view(), targets.view(), dlogits.view(), 1.0f); },
          "op cross_entropy: tensor targets holds 3 at element 2, outside [0, 3) (the vocabulary of "
          "logits [4,3])");
}

// Kernel workspaces are backend allocations: the scan's scratch shows in the buffer category
// while it runs and is returned afterwards.
TEST(BackendOps, SsdWorkspaceIsAccountedAndReturned) {
  Backend& be = cpu();
  Device d(be, DType::DTYPE_F32, DType::DTYPE_F32);
  const SsdData in;
  Tensor tx = d.put(in.x, in.xs), tdt = d.put(in.dt, in.ts), ta = d.put_f32(in.A_log, {HM});
  Tensor tb = d.put(in.Bm, in.bs), tc = d.put(in.Cm, in.bs), tD = d.put_f32(in.D, {HM});
  Tensor ty(be, in.xs, MemCategory::MEM_BUFFERS);
  Tensor saved(be, Shape{be.ssd_saved_numel(in.xs, in.bs, CHUNK)}, MemCategory::MEM_BUFFERS);
  be.reset_peak();
  const auto before = be.memory();
  be.ssd_fwd(tx.view(), tdt.view(), ta.view(), tb.view(), tc.view(), tD.view(), ty.view(),
             saved.view(), CHUNK);
  const auto after = be.memory();
  const auto buf = static_cast<size_t>(MemCategory::MEM_BUFFERS);
  const int64_t work = k::ssd_fwd_workspace_size(in.s) * static_cast<int64_t>(sizeof(float));
  std::printf("ssd_fwd workspace %lld bytes; buffers peak %lld -> %lld\n", static_cast<long long>(work),
              static_cast<long long>(before.peak[buf]), static_cast<long long>(after.peak[buf]));
  EXPECT_GT(work, 0);
  EXPECT_EQ(after.peak[buf], before.current[buf] + work);
  EXPECT_EQ(after.current[buf], before.current[buf]);
}

}  // namespace
}  // namespace piper::backend
