// test_moe.cpp — MoE routing: the top-k router and its backward, the balance loss, the
// expert-major permutation, gather/combine and their backwards, round trips and determinism.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/gradcheck.hpp"
#include "moe.hpp"

namespace {

using namespace piper::testing;
namespace k = piper::kernels;
using Vec = std::vector<double>;
using Ids = std::vector<int32_t>;

// K distinct experts in [0, E) per row, in random order.
Ids random_experts(int64_t M, int64_t E, int64_t K, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Ids all(static_cast<size_t>(E)), out;
  for (int64_t m = 0; m < M; ++m) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    out.insert(out.end(), all.begin(), all.begin() + K);
  }
  return out;
}

// ---- naive double references --------------------------------------------------------------

struct Route {
  Vec probs, weights;
  Ids experts;
};

// Softmax by rows, then a stable sort of the expert indices by descending probability.
Route ref_route(const Vec& logits, int64_t M, int64_t E, int64_t K) {
  Route r{Vec(M * E), Vec(M * K), Ids(M * K)};
  for (int64_t m = 0; m < M; ++m) {
    const double* x = &logits[m * E];
    const double mx = *std::max_element(x, x + E);
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(x[e] - mx);
    for (int64_t e = 0; e < E; ++e) r.probs[m * E + e] = std::exp(x[e] - mx) / s;
    Ids order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    const double* p = &r.probs[m * E];
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    double S = 0;
    for (int64_t j = 0; j < K; ++j) S += p[order[j]];
    for (int64_t j = 0; j < K; ++j) {
      r.experts[m * K + j] = order[j];
      r.weights[m * K + j] = p[order[j]] / S;
    }
  }
  return r;
}

// The router backward through full Jacobians: dw_k/dp_j = (delta S - p_k) / S^2 over the picked
// experts, dp_f/dx_e = p_f (delta - p_e).
Vec ref_route_bwd(const Vec& dw, const Vec& dprobs, const Vec& probs, const Ids& experts, int64_t M,
                  int64_t E, int64_t K) {
  Vec dl(M * E, 0.0);
  for (int64_t m = 0; m < M; ++m) {
    const double* p = &probs[m * E];
    const int32_t* idx = &experts[m * K];
    double S = 0;
    for (int64_t j = 0; j < K; ++j) S += p[idx[j]];
    Vec dp(dprobs.begin() + m * E, dprobs.begin() + (m + 1) * E);
    for (int64_t j = 0; j < K; ++j)
      for (int64_t kk = 0; kk < K; ++kk)
        dp[idx[j]] += dw[m * K + kk] * ((kk == j ? S : 0.0) - p[idx[kk]]) / (S * S);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t f = 0; f < E; ++f) dl[m * E + e] += dp[f] * p[f] * ((f == e ? 1.0 : 0.0) - p[e]);
  }
  return dl;
}

// The balance loss written out per sequence, and its gradient of probs.
double ref_balance(const Vec& probs, const Ids& experts, Vec& dprobs, int64_t M, int64_t E,
                   int64_t K, int64_t seq, double scale) {
  dprobs.assign(M * E, 0.0);
  double total = 0;
  for (int64_t s0 = 0; s0 < M; s0 += seq) {
    for (int64_t e = 0; e < E; ++e) {
      double f = 0, P = 0;
      for (int64_t m = s0; m < s0 + seq; ++m) {
        P += probs[m * E + e] / seq;
        for (int64_t j = 0; j < K; ++j) f += experts[m * K + j] == e ? 1.0 / (seq * K) : 0.0;
      }
      total += E * f * P;
      for (int64_t m = s0; m < s0 + seq; ++m) dprobs[m * E + e] = scale * E * f / seq;
    }
  }
  return total;
}

Vec ref_gather(const Vec& src, const Ids& rows, int64_t D) {
  Vec dst;
  for (int32_t r : rows) dst.insert(dst.end(), src.begin() + r * D, src.begin() + (r + 1) * D);
  return dst;
}

Vec ref_combine(const Vec& y, const Ids& pos, const Vec& w, int64_t M, int64_t K, int64_t D) {
  Vec out(M * D, 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < K; ++j)
      for (int64_t d = 0; d < D; ++d) out[m * D + d] += w[m * K + j] * y[pos[m * K + j] * D + d];
  return out;
}

// ---- helpers ------------------------------------------------------------------------------

struct Perm {
  Ids counts, rows, pos;
};
Perm permute(const Ids& experts, int64_t M, int64_t E, int64_t K) {
  Perm p{Ids(E, -1), Ids(M * K, -1), Ids(M * K, -1)};
  k::moe_permute_index(experts.data(), p.counts.data(), p.rows.data(), p.pos.data(), M, E, K);
  return p;
}

template <class T>
Route route(const std::vector<T>& logits, int64_t M, int64_t E, int64_t K) {
  std::vector<T> probs(M * E, NAN), w(M * K, NAN);
  Ids experts(M * K, -1);
  k::moe_route_fwd<T>(logits.data(), probs.data(), experts.data(), w.data(), M, E, K);
  return {cast<double>(probs), cast<double>(w), experts};
}

double dot(const Vec& a, const Vec& b) { return weighted_sum(a, b); }

}  // namespace

// L = sum(a * weights) + balance loss (coef): d/dlogits through the renormalisation and the
// softmax, the balance loss's dprobs added before the softmax backward.
TEST(Moe, RouterGradcheckDouble) {
  for (const int64_t K : {1, 2, 3}) {
    const int64_t M = 6, E = 5, seq = 3;
    const double coef = 0.3;
    auto logits = random_vec<double>(M * E, 1, -2, 2);
    const auto a = random_vec<double>(M * K, 2);
    const Route base = route(logits, M, E, K);
    auto loss = [&] {
      const Route r = route(logits, M, E, K);
      EXPECT_EQ(r.experts, base.experts) << "a finite-difference step changed the selection";
      Vec dp(M * E);
      const double bal = k::moe_balance<double>(r.probs.data(), r.experts.data(), dp.data(), M, E,
                                                K, seq, coef);
      return weighted_sum(r.weights, a) + coef * bal;
    };
    Vec dprobs(M * E, NAN), dl(M * E, NAN);
    k::moe_balance<double>(base.probs.data(), base.experts.data(), dprobs.data(), M, E, K, seq, coef);
    k::moe_route_bwd<double>(a.data(), dprobs.data(), base.probs.data(), base.experts.data(),
                             base.weights.data(), dl.data(), M, E, K);
    EXPECT_ERR(("moe_route_bwd dlogits vs finite diff (double), K=" + std::to_string(K)).c_str(),
               max_rel_err(dl, finite_diff(logits, loss, kFdStep)), 1e-6);
  }
}

// dprobs is the gradient of scale * (the returned loss) w.r.t. probs, the selection fixed.
TEST(Moe, BalanceGradcheckDouble) {
  const int64_t M = 12, E = 5, K = 2, seq = 4;
  const double scale = 0.7;
  auto probs = random_vec<double>(M * E, 3, 0, 1);
  const Ids experts = random_experts(M, E, K, 4);
  Vec scratch(M * E);
  auto loss = [&] {
    return scale * k::moe_balance<double>(probs.data(), experts.data(), scratch.data(), M, E, K,
                                          seq, scale);
  };
  Vec dprobs(M * E, NAN);
  k::moe_balance<double>(probs.data(), experts.data(), dprobs.data(), M, E, K, seq, scale);
  EXPECT_ERR("moe_balance dprobs vs finite diff (double)",
             max_rel_err(dprobs, finite_diff(probs, loss, kFdStep)), 1e-8);
}

// L = sum(g * out): dy and dweights from moe_combine_bwd.
TEST(Moe, CombineGradcheckDouble) {
  const int64_t M = 7, E = 4, K = 2, D = 5;
  const Perm pm = permute(random_experts(M, E, K, 5), M, E, K);
  auto y = random_vec<double>(M * K * D, 6);
  auto w = random_vec<double>(M * K, 7, 0, 1);
  const auto g = random_vec<double>(M * D, 8);
  auto loss = [&] {
    Vec out(M * D);
    k::moe_combine<double>(y.data(), pm.pos.data(), w.data(), out.data(), M, K, D);
    return weighted_sum(out, g);
  };
  Vec dy(M * K * D, NAN), dw(M * K, NAN);
  k::moe_combine_bwd<double>(g.data(), y.data(), pm.pos.data(), w.data(), dy.data(), dw.data(), M,
                             K, D);
  const auto [fdy, fdw] = finite_diffs(loss, kFdStep, y, w);
  EXPECT_ERR("moe_combine_bwd dy vs finite diff (double)", max_rel_err(dy, fdy), 1e-7);
  EXPECT_ERR("moe_combine_bwd dweights vs finite diff (double)", max_rel_err(dw, fdw), 1e-7);
}

// <gather_rows(x), u> = <x, dispatch_bwd(u)>: the dispatch backward is gather_rows' adjoint.
TEST(Moe, DispatchBwdIsTheAdjointOfGatherRows) {
  const int64_t M = 9, E = 6, K = 3, D = 70;  // D past one column block
  const Perm pm = permute(random_experts(M, E, K, 9), M, E, K);
  const auto x = random_vec<double>(M * D, 10), u = random_vec<double>(M * K * D, 11);
  Vec xp(M * K * D, NAN), dx(M * D, 0.0);
  k::gather_rows<double>(x.data(), pm.rows.data(), xp.data(), M * K, D);
  k::moe_dispatch_bwd<double>(u.data(), pm.pos.data(), dx.data(), M, K, D);
  const double lhs = dot(xp, u), rhs = dot(x, dx);
  EXPECT_ERR("<gather_rows(x), u> vs <x, moe_dispatch_bwd(u)> (double)",
             max_rel_err(Vec{lhs}, Vec{rhs}), 1e-12);
  // and it accumulates: a second call adds the same again
  Vec dx2 = dx;
  k::moe_dispatch_bwd<double>(u.data(), pm.pos.data(), dx2.data(), M, K, D);
  Vec twice(dx.size());
  for (size_t i = 0; i < dx.size(); ++i) twice[i] = 2 * dx[i];
  EXPECT_ERR("moe_dispatch_bwd twice vs 2x once (double)", max_rel_err(dx2, twice), 1e-14);
}

TEST(Moe, FloatMatchesNaiveReference) {
  const int64_t M = 11, E = 7, K = 3, D = 9, seq = 11;
  const auto logits = random_f(M * E, 12, -3, 3);
  const Route want = ref_route(logits, M, E, K);
  const Route got = route(cast<float>(logits), M, E, K);
  EXPECT_EQ(got.experts, want.experts);
  EXPECT_ERR("moe_route_fwd probs (float vs naive double)", max_rel_err(got.probs, want.probs), 1e-6);
  EXPECT_ERR("moe_route_fwd weights (float vs naive double)", max_rel_err(got.weights, want.weights),
             1e-6);

  const auto probs = cast<float>(got.probs);
  std::vector<float> dpf(M * E, NAN);
  Vec rdp;
  const double rbal = ref_balance(got.probs, got.experts, rdp, M, E, K, seq, 0.01);
  const double bal = k::moe_balance<float>(probs.data(), got.experts.data(), dpf.data(), M, E, K, seq,
                                           0.01f);
  EXPECT_ERR("moe_balance loss (float vs naive double)", max_rel_err(Vec{bal}, Vec{rbal}), 1e-6);
  EXPECT_ERR("moe_balance dprobs (float vs naive double)", max_rel_err(dpf, rdp), 1e-6);

  const auto dw = random_f(M * K, 13), dp = random_f(M * E, 14, -0.1, 0.1);
  const auto wf = cast<float>(got.weights), dwf = cast<float>(dw), dpf2 = cast<float>(dp);
  std::vector<float> dl(M * E, NAN);
  k::moe_route_bwd<float>(dwf.data(), dpf2.data(), probs.data(), got.experts.data(), wf.data(),
                          dl.data(), M, E, K);
  EXPECT_ERR("moe_route_bwd dlogits (float vs naive double)",
             normwise_err(dl, ref_route_bwd(dw, dp, got.probs, got.experts, M, E, K)), 1e-5);

  const Perm pm = permute(got.experts, M, E, K);
  const auto x = random_f(M * D, 15), y = random_f(M * K * D, 16), dout = random_f(M * D, 17);
  const auto xf = cast<float>(x), yf = cast<float>(y), doutf = cast<float>(dout);
  std::vector<float> xp(M * K * D, NAN), out(M * D, NAN), dy(M * K * D, NAN), dwt(M * K, NAN);
  k::gather_rows<float>(xf.data(), pm.rows.data(), xp.data(), M * K, D);
  EXPECT_ERR("gather_rows (float vs naive double)", max_rel_err(xp, ref_gather(x, pm.rows, D)), 0.0);
  k::moe_combine<float>(yf.data(), pm.pos.data(), wf.data(), out.data(), M, K, D);
  EXPECT_ERR("moe_combine out (float vs naive double)",
             normwise_err(out, ref_combine(y, pm.pos, got.weights, M, K, D)), 1e-6);
  k::moe_combine_bwd<float>(doutf.data(), yf.data(), pm.pos.data(), wf.data(), dy.data(), dwt.data(),
                            M, K, D);
  Vec rdy(M * K * D), rdw(M * K, 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < K; ++j)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t p = pm.pos[m * K + j];
        rdy[p * D + d] = got.weights[m * K + j] * dout[m * D + d];
        rdw[m * K + j] += dout[m * D + d] * y[p * D + d];
      }
  EXPECT_ERR("moe_combine_bwd dy (float vs naive double)", max_rel_err(dy, rdy), 1e-6);
  EXPECT_ERR("moe_combine_bwd dweights (float vs naive double)", normwise_err(dwt, rdw), 1e-6);
}

// Equal probabilities go to the lower expert index, in float and double.
TEST(Moe, TiesPickTheLowerExpertIndex) {
  const int64_t E = 5;
  const Vec logits = {0, 0, 0, 0, 0,  // all equal
                      1, 3, 3, 0, 3,  // three tied at the top
                      2, 2, 5, 2, 5};
  const std::vector<std::pair<int64_t, Ids>> want = {
      {1, {0, 1, 2}},
      {2, {0, 1, 1, 2, 2, 4}},
      {4, {0, 1, 2, 3, 1, 2, 4, 0, 2, 4, 0, 1}},
  };
  for (const auto& [K, experts] : want) {
    const Route d = route(logits, 3, E, K), f = route(cast<float>(logits), 3, E, K);
    EXPECT_EQ(d.experts, experts) << "double, K=" << K;
    EXPECT_EQ(f.experts, experts) << "float, K=" << K;
    for (int64_t j = 0; j < K; ++j) EXPECT_EQ(f.weights[j], 1.0 / double(K)) << "all-equal row";
  }
}

TEST(Moe, PermutationIsExpertMajorStableAndInvertedByPos) {
  const int64_t M = 37, E = 7, K = 3, P = M * K;
  const Ids experts = random_experts(M, E, K, 18);
  const Perm pm = permute(experts, M, E, K);
  EXPECT_EQ(std::accumulate(pm.counts.begin(), pm.counts.end(), int64_t{0}), P);
  int64_t start = 0;
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(pm.counts[e], std::count(experts.begin(), experts.end(), int32_t(e))) << "expert " << e;
    for (int64_t p = start; p < start + pm.counts[e]; ++p) {
      if (p > start) {
        EXPECT_LT(pm.rows[p - 1], pm.rows[p]) << "rows ascending within expert " << e;
      }
      const int32_t* row = &experts[pm.rows[p] * K];
      EXPECT_NE(std::find(row, row + K, int32_t(e)), row + K)
          << "permuted row " << p << " is token row " << pm.rows[p] << ", not routed to " << e;
    }
    start += pm.counts[e];
  }
  std::vector<int> seen(P, 0);
  for (int64_t i = 0; i < P; ++i) {
    ASSERT_GE(pm.pos[i], 0);
    ASSERT_LT(pm.pos[i], P);
    ++seen[pm.pos[i]];
    EXPECT_EQ(pm.rows[pm.pos[i]], i / K) << "pos[" << i / K << "," << i % K << "]";
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), P) << "pos is a permutation of the P rows";
}

// Gather then combine with weights 1/K gives the input back exactly, and combine_bwd then
// dispatch_bwd the output gradient.
TEST(Moe, GatherCombineRoundTripIsExact) {
  const int64_t M = 29, E = 8, D = 70;
  for (const int64_t K : {1, 2, 4}) {
    const Route r = route(cast<float>(random_f(M * E, 19, -2, 2)), M, E, K);
    const Perm pm = permute(r.experts, M, E, K);
    const auto x = cast<float>(random_f(M * D, 20)), dout = cast<float>(random_f(M * D, 21));
    const std::vector<float> w(M * K, 1.0f / float(K));
    std::vector<float> xp(M * K * D, NAN), out(M * D, NAN), dy(M * K * D, NAN), dw(M * K, NAN);
    std::vector<float> dx(M * D, 0.f);
    k::gather_rows<float>(x.data(), pm.rows.data(), xp.data(), M * K, D);
    k::moe_combine<float>(xp.data(), pm.pos.data(), w.data(), out.data(), M, K, D);
    k::moe_combine_bwd<float>(dout.data(), xp.data(), pm.pos.data(), w.data(), dy.data(), dw.data(),
                              M, K, D);
    k::moe_dispatch_bwd<float>(dy.data(), pm.pos.data(), dx.data(), M, K, D);
    const std::string tag = " (float, exact), K=" + std::to_string(K);
    EXPECT_ERR(("gather_rows + moe_combine vs x" + tag).c_str(), max_rel_err(out, x), 0.0);
    EXPECT_ERR(("moe_combine_bwd + moe_dispatch_bwd vs dout" + tag).c_str(), max_rel_err(dx, dout),
               0.0);
  }
}

TEST(Moe, GatherRowsTakesAnyIndexCountAndNone) {
  const int64_t N = 5, D = 3;
  const auto src = cast<float>(random_f(N * D, 22));
  const Ids rows = {4, 0, 4, 2, 2, 2, 1};  // more rows than src has, repeated
  std::vector<float> dst(rows.size() * D, NAN);
  k::gather_rows<float>(src.data(), rows.data(), dst.data(), int64_t(rows.size()), D);
  EXPECT_ERR("gather_rows with repeats (float, exact)",
             max_rel_err(dst, ref_gather(cast<double>(src), rows, D)), 0.0);
  float untouched = 7.f;
  k::gather_rows<float>(src.data(), nullptr, &untouched, 0, D);
  EXPECT_EQ(untouched, 7.f) << "P = 0 writes nothing";
}

// Every op above its threading threshold gives bit-identical results for 1 and 3 threads.
TEST(Moe, LargeIsThreadCountIndependent) {
  const int64_t M = 4100, E = 16, K = 4, D = 96, seq = 41;  // 100 sequences
  const auto logits = cast<float>(random_f(M * E, 23, -3, 3));
  const auto x = cast<float>(random_f(M * D, 24)), dout = cast<float>(random_f(M * D, 25));
  const auto dwin = cast<float>(random_f(M * K, 26));
  using F = std::vector<float>;
  struct Out {
    F probs, w, dprobs, dl, xp, out, dy, dw, dx;
    Ids experts;
    Perm pm;
    double bal = 0;
  };
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Out o;
    o.probs = o.dprobs = o.dl = F(M * E);
    o.w = o.dw = F(M * K);
    o.xp = o.dy = F(M * K * D);
    o.out = F(M * D);
    o.dx = F(M * D, 0.5f);
    o.experts = Ids(M * K);
    k::moe_route_fwd<float>(logits.data(), o.probs.data(), o.experts.data(), o.w.data(), M, E, K);
    o.bal = k::moe_balance<float>(o.probs.data(), o.experts.data(), o.dprobs.data(), M, E, K, seq,
                                  0.01f);
    k::moe_route_bwd<float>(dwin.data(), o.dprobs.data(), o.probs.data(), o.experts.data(),
                            o.w.data(), o.dl.data(), M, E, K);
    o.pm = permute(o.experts, M, E, K);
    k::gather_rows<float>(x.data(), o.pm.rows.data(), o.xp.data(), M * K, D);
    k::moe_combine<float>(o.xp.data(), o.pm.pos.data(), o.w.data(), o.out.data(), M, K, D);
    k::moe_combine_bwd<float>(dout.data(), o.xp.data(), o.pm.pos.data(), o.w.data(), o.dy.data(),
                              o.dw.data(), M, K, D);
    k::moe_dispatch_bwd<float>(o.dy.data(), o.pm.pos.data(), o.dx.data(), M, K, D);
    return o;
  };
  const int saved = omp_get_max_threads();
  const Out a = run(1), b = run(3);
  omp_set_num_threads(saved);
  EXPECT_EQ(a.probs, b.probs);
  EXPECT_EQ(a.experts, b.experts);
  EXPECT_EQ(a.w, b.w);
  EXPECT_EQ(a.bal, b.bal);
  EXPECT_EQ(a.dprobs, b.dprobs);
  EXPECT_EQ(a.dl, b.dl);
  EXPECT_EQ(a.pm.rows, b.pm.rows);
  EXPECT_EQ(a.xp, b.xp);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.dy, b.dy);
  EXPECT_EQ(a.dw, b.dw);
  EXPECT_EQ(a.dx, b.dx);
}
