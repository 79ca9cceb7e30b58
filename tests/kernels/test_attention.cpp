// test_attention.cpp — causal GQA attention: finite-difference gradcheck, naive reference
// (explicit scores, mask, softmax), GQA group sizes, overwrite semantics, determinism.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "attention.hpp"
#include "kernels/gradcheck.hpp"

using namespace piper::kernels;
using namespace piper::testing;

namespace {

struct Shape {
  int64_t B, Tn, H, KV, hd;
};

// Central differences with h = 1e-5: for these losses (|L| ~ 10) that balances rounding
// (~1e-16 |L| / h) against truncation (~h^2), both well under 1e-8.
constexpr double kH = 1e-5;

// Float results are compared normwise (normwise_err): error relative to the largest reference
// magnitude. Elementwise relative error is dominated by entries near zero (dS = P * (dP - D)
// cancels), which are float rounding noise; normwise 1e-5 is still ~100x float epsilon.

void print_shape(const Shape& s) {
  std::printf("shape B=%ld Tn=%ld H=%ld KV=%ld hd=%ld\n", long(s.B), long(s.Tn), long(s.H),
              long(s.KV), long(s.hd));
}

struct Ref {
  std::vector<double> out, lse, dq, dk, dv;
};

// Naive double reference: for every (b, h) build the full [Tn, Tn] score matrix, mask the
// future with -inf, softmax each row, multiply by V; backward from the explicit P.
Ref reference(const std::vector<double>& q, const std::vector<double>& k,
              const std::vector<double>& v, const std::vector<double>& dout, const Shape& s) {
  const int64_t B = s.B, Tn = s.Tn, H = s.H, KV = s.KV, hd = s.hd;
  const double scale = 1.0 / std::sqrt(double(hd));
  auto Q = [&](int64_t b, int64_t t, int64_t h, int64_t d) {
    return ((b * Tn + t) * H + h) * hd + d;
  };
  auto Kx = [&](int64_t b, int64_t t, int64_t g, int64_t d) {
    return ((b * Tn + t) * KV + g) * hd + d;
  };
  Ref r;
  r.out.assign(B * Tn * H * hd, 0.0);
  r.dq.assign(B * Tn * H * hd, 0.0);
  r.lse.assign(B * H * Tn, 0.0);
  r.dk.assign(B * Tn * KV * hd, 0.0);
  r.dv.assign(B * Tn * KV * hd, 0.0);
  std::vector<double> S(Tn * Tn), P(Tn * Tn), dP(Tn * Tn);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      for (int64_t i = 0; i < Tn; ++i)
        for (int64_t j = 0; j < Tn; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += q[Q(b, i, h, d)] * k[Kx(b, j, g, d)];
          S[i * Tn + j] = j <= i ? dot * scale : -std::numeric_limits<double>::infinity();
        }
      for (int64_t i = 0; i < Tn; ++i) {
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t j = 0; j < Tn; ++j) mx = std::max(mx, S[i * Tn + j]);
        for (int64_t j = 0; j < Tn; ++j) sum += std::exp(S[i * Tn + j] - mx);
        for (int64_t j = 0; j < Tn; ++j) P[i * Tn + j] = std::exp(S[i * Tn + j] - mx) / sum;
        r.lse[(b * H + h) * Tn + i] = mx + std::log(sum);
      }
      for (int64_t i = 0; i < Tn; ++i)
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < Tn; ++j) acc += P[i * Tn + j] * v[Kx(b, j, g, d)];
          r.out[Q(b, i, h, d)] = acc;
        }
      if (dout.empty()) continue;
      // dP = dO V^T ; dS = P * (dP - rowsum(P * dP))
      for (int64_t i = 0; i < Tn; ++i)
        for (int64_t j = 0; j < Tn; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < hd; ++d) acc += dout[Q(b, i, h, d)] * v[Kx(b, j, g, d)];
          dP[i * Tn + j] = acc;
        }
      for (int64_t i = 0; i < Tn; ++i) {
        double rs = 0;
        for (int64_t j = 0; j < Tn; ++j) rs += P[i * Tn + j] * dP[i * Tn + j];
        for (int64_t j = 0; j < Tn; ++j) {
          const double dS = P[i * Tn + j] * (dP[i * Tn + j] - rs);
          const double p = P[i * Tn + j];
          for (int64_t d = 0; d < hd; ++d) {
            r.dq[Q(b, i, h, d)] += dS * k[Kx(b, j, g, d)] * scale;
            r.dk[Kx(b, j, g, d)] += dS * q[Q(b, i, h, d)] * scale;
            r.dv[Kx(b, j, g, d)] += p * dout[Q(b, i, h, d)];
          }
        }
      }
    }
  return r;
}

const Shape kSmall[] = {
    {2, 5, 4, 2, 6}, {2, 7, 4, 2, 6}, {2, 6, 4, 4, 6}, {2, 7, 4, 1, 6}, {1, 1, 2, 1, 4},
};
// Longer sequences cross the kernel's 64-row blocks (including a partial last block).
const Shape kLong[] = {{1, 150, 4, 2, 8}, {2, 129, 2, 2, 4}, {1, 65, 3, 1, 16}};

}  // namespace

TEST(Attention, GradcheckDouble) {
  for (const Shape& s : kSmall) {
    const size_t nq = s.B * s.Tn * s.H * s.hd, nk = s.B * s.Tn * s.KV * s.hd;
    auto q = random_vec<double>(nq, 70, -2, 2);
    auto k = random_vec<double>(nk, 71, -2, 2);
    auto v = random_vec<double>(nk, 72);
    auto wt = random_vec<double>(nq, 73);
    std::vector<double> out(nq), lse(s.B * s.H * s.Tn);
    auto loss = [&] {
      attention_fwd<double>(q.data(), k.data(), v.data(), out.data(), lse.data(), s.B, s.Tn, s.H,
                            s.KV, s.hd);
      return weighted_sum(out, wt);
    };
    const auto [fdq, fdk, fdv] = finite_diffs(loss, kH, q, k, v);
    loss();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> dq(nq, nan), dk(nk, nan), dv(nk, nan);
    attention_bwd<double>(wt.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                          dq.data(), dk.data(), dv.data(), s.B, s.Tn, s.H, s.KV, s.hd);
    print_shape(s);
    EXPECT_LT(report("attention dq vs finite diff", max_rel_err(dq, fdq), 1e-6), 1e-6);
    EXPECT_LT(report("attention dk vs finite diff", max_rel_err(dk, fdk), 1e-6), 1e-6);
    EXPECT_LT(report("attention dv vs finite diff", max_rel_err(dv, fdv), 1e-6), 1e-6);
  }
}

TEST(Attention, NaiveReferenceMatchesFiniteDiff) {
  // The reference backward used below is itself checked once against finite differences.
  const Shape s{2, 6, 4, 2, 6};
  const size_t nq = s.B * s.Tn * s.H * s.hd, nk = s.B * s.Tn * s.KV * s.hd;
  auto q = random_vec<double>(nq, 80, -2, 2);
  auto k = random_vec<double>(nk, 81, -2, 2);
  auto v = random_vec<double>(nk, 82);
  auto wt = random_vec<double>(nq, 83);
  auto L = [&] { return weighted_sum(reference(q, k, v, {}, s).out, wt); };
  const auto [fdq, fdk, fdv] = finite_diffs(L, kH, q, k, v);
  Ref r = reference(q, k, v, wt, s);
  EXPECT_LT(report("attention reference dq vs finite diff", max_rel_err(r.dq, fdq), 1e-6), 1e-6);
  EXPECT_LT(report("attention reference dk vs finite diff", max_rel_err(r.dk, fdk), 1e-6), 1e-6);
  EXPECT_LT(report("attention reference dv vs finite diff", max_rel_err(r.dv, fdv), 1e-6), 1e-6);
}

TEST(Attention, FloatMatchesNaiveReference) {
  std::vector<Shape> shapes(std::begin(kSmall), std::end(kSmall));
  shapes.insert(shapes.end(), std::begin(kLong), std::end(kLong));
  for (const Shape& s : shapes) {
    const size_t nq = s.B * s.Tn * s.H * s.hd, nk = s.B * s.Tn * s.KV * s.hd;
    // Float-representable inputs, so that the reference sees the same numbers.
    const auto q = random_f(nq, 90, -2, 2);
    const auto k = random_f(nk, 91, -2, 2);
    const auto v = random_f(nk, 92);
    const auto dout = random_f(nq, 93);
    Ref r = reference(q, k, v, dout, s);
    const auto qf = cast<float>(q), kf = cast<float>(k), vf = cast<float>(v),
               df = cast<float>(dout);
    std::vector<float> of(nq), lf(s.B * s.H * s.Tn), dqf(nq), dkf(nk), dvf(nk);
    attention_fwd<float>(qf.data(), kf.data(), vf.data(), of.data(), lf.data(), s.B, s.Tn, s.H,
                         s.KV, s.hd);
    attention_bwd<float>(df.data(), qf.data(), kf.data(), vf.data(), of.data(), lf.data(),
                         dqf.data(), dkf.data(), dvf.data(), s.B, s.Tn, s.H, s.KV, s.hd);
    print_shape(s);
    EXPECT_LT(report("attention float out vs naive (normwise)", normwise_err(of, r.out), 1e-5),
              1e-5);
    EXPECT_LT(report("attention float lse vs naive (normwise)", normwise_err(lf, r.lse), 1e-5),
              1e-5);
    EXPECT_LT(report("attention float dq vs naive (normwise)", normwise_err(dqf, r.dq), 1e-5),
              1e-5);
    EXPECT_LT(report("attention float dk vs naive (normwise)", normwise_err(dkf, r.dk), 1e-5),
              1e-5);
    EXPECT_LT(report("attention float dv vs naive (normwise)", normwise_err(dvf, r.dv), 1e-5),
              1e-5);
  }
}

TEST(Attention, FirstTokenCopiesValueAndGqaSharesKv) {
  // Row 0 attends only to key 0: out[b,0,h] = v[b,0,h/(H/KV)] exactly up to rounding.
  const Shape s{2, 5, 6, 3, 4};
  const size_t nq = s.B * s.Tn * s.H * s.hd, nk = s.B * s.Tn * s.KV * s.hd;
  auto q = random_vec<float>(nq, 100);
  auto k = random_vec<float>(nk, 101);
  auto v = random_vec<float>(nk, 102);
  std::vector<float> out(nq), lse(s.B * s.H * s.Tn);
  attention_fwd<float>(q.data(), k.data(), v.data(), out.data(), lse.data(), s.B, s.Tn, s.H, s.KV,
                       s.hd);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t d = 0; d < s.hd; ++d)
        EXPECT_NEAR(out[((b * s.Tn) * s.H + h) * s.hd + d],
                    v[((b * s.Tn) * s.KV + h / 2) * s.hd + d], 1e-6);
  // Query heads 2g and 2g+1 given identical q produce identical outputs (same kv head).
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.Tn; ++t)
      for (int64_t d = 0; d < s.hd; ++d)
        q[((b * s.Tn + t) * s.H + 1) * s.hd + d] = q[((b * s.Tn + t) * s.H + 0) * s.hd + d];
  attention_fwd<float>(q.data(), k.data(), v.data(), out.data(), lse.data(), s.B, s.Tn, s.H, s.KV,
                       s.hd);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.Tn; ++t)
      for (int64_t d = 0; d < s.hd; ++d)
        EXPECT_EQ(out[((b * s.Tn + t) * s.H + 1) * s.hd + d],
                  out[((b * s.Tn + t) * s.H + 0) * s.hd + d]);
}

TEST(Attention, GradsOverwrittenAndDeterministic) {
  // Attention has no parameters; dq, dk, dv must be overwritten (garbage in, same result out),
  // and repeated calls must be bit-identical.
  const Shape s{2, 70, 4, 2, 8};
  const size_t nq = s.B * s.Tn * s.H * s.hd, nk = s.B * s.Tn * s.KV * s.hd;
  auto q = random_vec<float>(nq, 110, -2, 2);
  auto k = random_vec<float>(nk, 111, -2, 2);
  auto v = random_vec<float>(nk, 112);
  auto dout = random_vec<float>(nq, 113);
  std::vector<float> out(nq), lse(s.B * s.H * s.Tn), out2(nq), lse2(s.B * s.H * s.Tn);
  attention_fwd<float>(q.data(), k.data(), v.data(), out.data(), lse.data(), s.B, s.Tn, s.H, s.KV,
                       s.hd);
  attention_fwd<float>(q.data(), k.data(), v.data(), out2.data(), lse2.data(), s.B, s.Tn, s.H, s.KV,
                       s.hd);
  EXPECT_EQ(out, out2);
  EXPECT_EQ(lse, lse2);
  std::vector<float> dq1(nq, 0.f), dk1(nk, 0.f), dv1(nk, 0.f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> dq2(nq, nan), dk2(nk, nan), dv2(nk, nan);
  attention_bwd<float>(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                       dq1.data(), dk1.data(), dv1.data(), s.B, s.Tn, s.H, s.KV, s.hd);
  attention_bwd<float>(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                       dq2.data(), dk2.data(), dv2.data(), s.B, s.Tn, s.H, s.KV, s.hd);
  EXPECT_EQ(dq1, dq2);
  EXPECT_EQ(dk1, dk2);
  EXPECT_EQ(dv1, dv2);
}

TEST(Attention, ThreadCountDoesNotChangeResults) {
  const Shape s{2, 150, 4, 2, 8};  // large enough for the multi-threaded path
  const size_t nq = s.B * s.Tn * s.H * s.hd, nk = s.B * s.Tn * s.KV * s.hd;
  auto q = random_vec<float>(nq, 120, -2, 2);
  auto k = random_vec<float>(nk, 121, -2, 2);
  auto v = random_vec<float>(nk, 122);
  auto dout = random_vec<float>(nq, 123);
  auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> out(nq), lse(s.B * s.H * s.Tn), dq(nq), dk(nk), dv(nk);
    attention_fwd<float>(q.data(), k.data(), v.data(), out.data(), lse.data(), s.B, s.Tn, s.H, s.KV,
                         s.hd);
    attention_bwd<float>(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                         dq.data(), dk.data(), dv.data(), s.B, s.Tn, s.H, s.KV, s.hd);
    omp_set_num_threads(saved);
    for (auto* t : {&lse, &dq, &dk, &dv}) out.insert(out.end(), t->begin(), t->end());
    return out;
  };
  EXPECT_EQ(run(1), run(3));
}
