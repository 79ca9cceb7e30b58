// test_ssd.cpp — Mamba-2 SSD scan: reference bwd vs finite differences, chunked vs reference.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "kernels/gradcheck.hpp"
#include "ssd.hpp"

namespace {

using piper::kernels::SsdShape;
using namespace piper::testing;

// Inputs in realistic ranges: dt uniform [0.01, 0.5] (softplus outputs), A_log = log(U[1,16]),
// x, B, C uniform [-1, 1], D uniform [0.5, 1.5].
template <class T>
struct SsdInputs {
  std::vector<T> x, dt, A_log, Bm, Cm, D;
};

template <class T>
SsdInputs<T> make_inputs(const SsdShape& s, uint64_t seed) {
  SsdInputs<double> d;
  d.x = random_vec<double>(s.B * s.Tn * s.Hm * s.P, seed + 1);
  d.dt = random_vec<double>(s.B * s.Tn * s.Hm, seed + 2, 0.01, 0.5);
  d.A_log = random_vec<double>(s.Hm, seed + 3, 1.0, 16.0);
  for (auto& v : d.A_log) v = std::log(v);
  d.Bm = random_vec<double>(s.B * s.Tn * s.G * s.N, seed + 4);
  d.Cm = random_vec<double>(s.B * s.Tn * s.G * s.N, seed + 5);
  d.D = random_vec<double>(s.Hm, seed + 6, 0.5, 1.5);
  return {cast<T>(d.x),  cast<T>(d.dt), cast<T>(d.A_log),
          cast<T>(d.Bm), cast<T>(d.Cm), cast<T>(d.D)};
}

template <class T>
struct SsdGrads {
  std::vector<T> dx, ddt, dA_log, dBm, dCm, dD;
};

template <class T>
SsdGrads<T> zero_grads(const SsdShape& s) {
  return {std::vector<T>(s.B * s.Tn * s.Hm * s.P), std::vector<T>(s.B * s.Tn * s.Hm),
          std::vector<T>(s.Hm),                    std::vector<T>(s.B * s.Tn * s.G * s.N),
          std::vector<T>(s.B * s.Tn * s.G * s.N),  std::vector<T>(s.Hm)};
}

template <class T>
std::vector<T> ref_fwd(const SsdShape& s, const SsdInputs<T>& in) {
  std::vector<T> y(s.B * s.Tn * s.Hm * s.P);
  piper::kernels::ssd_ref_fwd<T>(s, in.x.data(), in.dt.data(), in.A_log.data(), in.Bm.data(),
                                 in.Cm.data(), in.D.data(), y.data());
  return y;
}

template <class T>
std::vector<T> chunk_fwd(const SsdShape& s, const SsdInputs<T>& in,
                         std::vector<T>* saved_out = nullptr) {
  std::vector<T> y(s.B * s.Tn * s.Hm * s.P, std::numeric_limits<T>::quiet_NaN());
  std::vector<T> saved(piper::kernels::ssd_saved_size(s), std::numeric_limits<T>::quiet_NaN());
  std::vector<T> work(piper::kernels::ssd_fwd_workspace_size(s));
  piper::kernels::ssd_fwd<T>(s, in.x.data(), in.dt.data(), in.A_log.data(), in.Bm.data(),
                             in.Cm.data(), in.D.data(), y.data(), saved.data(), work.data());
  if (saved_out) *saved_out = saved;
  return y;
}

template <class T>
SsdGrads<T> ref_bwd(const SsdShape& s, const SsdInputs<T>& in, const std::vector<T>& dy) {
  auto g = zero_grads<T>(s);
  piper::kernels::ssd_ref_bwd<T>(s, dy.data(), in.x.data(), in.dt.data(), in.A_log.data(),
                                 in.Bm.data(), in.Cm.data(), in.D.data(), g.dx.data(),
                                 g.ddt.data(), g.dA_log.data(), g.dBm.data(), g.dCm.data(),
                                 g.dD.data());
  return g;
}

// Chunked backward into gradient buffers prefilled with NaN (inputs) and zero (parameters),
// so a gradient that is not fully overwritten shows up.
template <class T>
SsdGrads<T> chunk_bwd(const SsdShape& s, const SsdInputs<T>& in, const std::vector<T>& dy) {
  std::vector<T> saved;
  chunk_fwd(s, in, &saved);
  auto g = zero_grads<T>(s);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (auto* v : {&g.dx, &g.ddt, &g.dBm, &g.dCm}) std::fill(v->begin(), v->end(), nan);
  std::vector<T> work(piper::kernels::ssd_bwd_workspace_size(s), nan);
  piper::kernels::ssd_bwd<T>(s, dy.data(), in.x.data(), in.dt.data(), in.A_log.data(),
                             in.Bm.data(), in.Cm.data(), in.D.data(), saved.data(), g.dx.data(),
                             g.ddt.data(), g.dA_log.data(), g.dBm.data(), g.dCm.data(),
                             g.dD.data(), work.data());
  return g;
}

// Relative error with the floor set to `rel_floor` times the largest reference magnitude (and
// at least 1e-30), so near-zero entries of a gradient are judged against the gradient's own scale.
template <class A, class B>
double scaled_err(const std::vector<A>& a, const std::vector<B>& b, double rel_floor = 1e-2) {
  return scaled_rel_err(a, b, rel_floor, 1e-30);
}

std::string name_of(const SsdShape& s) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "B%lld T%lld H%lld P%lld G%lld N%lld L%lld", (long long)s.B,
                (long long)s.Tn, (long long)s.Hm, (long long)s.P, (long long)s.G, (long long)s.N,
                (long long)s.chunk);
  return buf;
}

// Shapes for chunked-vs-reference: Tn not a multiple of chunk, chunk = 1, chunk >= Tn,
// chunk == Tn, G = 1 and G = 2 (and G = Hm) with Hm = 4, and a benchmark-like long sequence.
const std::vector<SsdShape> kShapes = {
    {2, 37, 4, 8, 1, 6, 8},    // 37 = 4*8 + 5
    {2, 37, 4, 8, 2, 6, 8},    // two groups
    {1, 19, 4, 5, 4, 3, 4},    // one head per group
    {2, 11, 4, 3, 2, 5, 1},    // chunk = 1
    {2, 13, 4, 4, 1, 4, 64},   // chunk > Tn
    {1, 16, 4, 4, 2, 4, 16},   // chunk == Tn
    {1, 256, 4, 16, 1, 16, 64} // long, benchmark-like chunking
};

// ---------------------------------------------------------------------------------------------

TEST(Ssd, RefBackwardMatchesFiniteDifferences) {
  const SsdShape s{2, 7, 4, 3, 2, 5, 0};
  auto in = make_inputs<double>(s, 100);
  const auto w = random_vec<double>(s.B * s.Tn * s.Hm * s.P, 200);
  auto loss = [&] { return weighted_sum(ref_fwd(s, in), w); };
  const auto g = ref_bwd(s, in, w);
  const double tol = 1e-6;
  struct Item {
    const char* name;
    std::vector<double>* input;
    const std::vector<double>* grad;
  } items[] = {{"ref dx vs finite diff", &in.x, &g.dx},
               {"ref ddt vs finite diff", &in.dt, &g.ddt},
               {"ref dA_log vs finite diff", &in.A_log, &g.dA_log},
               {"ref dB vs finite diff", &in.Bm, &g.dBm},
               {"ref dC vs finite diff", &in.Cm, &g.dCm},
               {"ref dD vs finite diff", &in.D, &g.dD}};
  for (auto& it : items) {
    const auto fd = finite_diff(*it.input, loss);
    EXPECT_LE(report(it.name, scaled_err(*it.grad, fd), tol), tol) << it.name;
  }
}

TEST(Ssd, ChunkedForwardMatchesReferenceDouble) {
  const double tol = 1e-10;
  uint64_t seed = 300;
  for (const auto& s : kShapes) {
    const auto in = make_inputs<double>(s, seed += 10);
    std::vector<double> saved;
    const auto y = chunk_fwd(s, in, &saved);
    const auto y_ref = ref_fwd(s, in);
    const std::string what = "fwd double " + name_of(s);
    EXPECT_LE(report(what.c_str(), scaled_err(y, y_ref, 1e-3), tol), tol) << what;
    for (auto v : saved) ASSERT_TRUE(std::isfinite(v)) << "saved state not written";
  }
}

TEST(Ssd, ChunkedForwardMatchesReferenceFloat) {
  const double tol = 1e-5;
  uint64_t seed = 400;
  for (const auto& s : kShapes) {
    const auto ind = make_inputs<double>(s, seed += 10);
    const auto inf = make_inputs<float>(s, seed);
    const auto y = chunk_fwd(s, inf);
    const auto y_ref = ref_fwd(s, ind);  // double reference on the same (float-exact) inputs
    const std::string what = "fwd float " + name_of(s);
    EXPECT_LE(report(what.c_str(), scaled_err(y, y_ref), tol), tol) << what;
  }
}

// Saved chunk-entry state c is S(c*L - 1): checked through y of a sequence cut there, with D = 0
// and C(t) = e_n the unit vector, which reads column n of the state.
TEST(Ssd, SavedStatesAreChunkEntryStates) {
  const SsdShape s{1, 20, 2, 3, 1, 4, 6};
  auto in = make_inputs<double>(s, 500);
  std::vector<double> saved;
  chunk_fwd(s, in, &saved);
  const int64_t nc = (s.Tn + s.chunk - 1) / s.chunk;
  ASSERT_EQ(piper::kernels::ssd_saved_size(s), s.B * nc * s.Hm * s.P * s.N);
  double worst = 0;
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t t0 = c * s.chunk;
    for (int64_t h = 0; h < s.Hm; ++h)
      for (int64_t p = 0; p < s.P; ++p)
        for (int64_t n = 0; n < s.N; ++n) {
          double expect = 0;
          if (t0 > 0) {
            SsdShape cut = s;
            cut.Tn = t0;
            SsdInputs<double> ci = in;
            ci.x.resize(t0 * s.Hm * s.P);
            ci.dt.resize(t0 * s.Hm);
            ci.Bm.resize(t0 * s.G * s.N);
            ci.Cm.assign(t0 * s.G * s.N, 0.0);
            ci.Cm[(t0 - 1) * s.G * s.N + n] = 1.0;
            std::fill(ci.D.begin(), ci.D.end(), 0.0);
            expect = ref_fwd(cut, ci)[(t0 - 1) * s.Hm * s.P + h * s.P + p];
          }
          const double got = saved[((c * s.Hm) + h) * s.P * s.N + p * s.N + n];
          worst = std::max(worst, std::fabs(got - expect));
        }
  }
  EXPECT_LE(report("saved states vs reference (abs)", worst, 1e-12), 1e-12);
}

template <class T>
void check_backward(double tol, uint64_t seed0, const char* prec) {
  uint64_t seed = seed0;
  for (const auto& s : kShapes) {
    const auto ind = make_inputs<double>(s, seed += 10);
    const auto in = make_inputs<T>(s, seed);
    const auto dyd = random_vec<double>(s.B * s.Tn * s.Hm * s.P, seed + 7);
    const std::vector<T> dy(dyd.begin(), dyd.end());
    const auto r = ref_bwd(s, ind, dyd);
    const auto g = chunk_bwd(s, in, dy);
    const std::pair<const char*, std::pair<const std::vector<T>*, const std::vector<double>*>>
        items[] = {{"dx", {&g.dx, &r.dx}},       {"ddt", {&g.ddt, &r.ddt}},
                   {"dA_log", {&g.dA_log, &r.dA_log}}, {"dB", {&g.dBm, &r.dBm}},
                   {"dC", {&g.dCm, &r.dCm}},     {"dD", {&g.dD, &r.dD}}};
    for (const auto& [nm, pr] : items) {
      const std::string what = std::string("bwd ") + prec + " " + nm + " " + name_of(s);
      EXPECT_LE(report(what.c_str(), scaled_err(*pr.first, *pr.second), tol), tol) << what;
    }
  }
}

TEST(Ssd, ChunkedBackwardMatchesReferenceDouble) { check_backward<double>(1e-9, 600, "double"); }

TEST(Ssd, ChunkedBackwardMatchesReferenceFloat) { check_backward<float>(1e-4, 700, "float"); }

// dA_log and dD accumulate (+=) in both backward forms; dx, ddt, dB, dC are overwritten.
TEST(Ssd, ParameterGradientsAccumulate) {
  const SsdShape s{2, 21, 4, 4, 2, 3, 8};
  const auto in = make_inputs<double>(s, 800);
  const auto dy = random_vec<double>(s.B * s.Tn * s.Hm * s.P, 801);
  std::vector<double> saved;
  chunk_fwd(s, in, &saved);
  std::vector<double> work(piper::kernels::ssd_bwd_workspace_size(s));
  const auto once = chunk_bwd(s, in, dy);
  const auto once_ref = ref_bwd(s, in, dy);
  for (int form = 0; form < 2; ++form) {
    auto g = zero_grads<double>(s);
    const auto a0 = random_vec<double>(s.Hm, 802), d0 = random_vec<double>(s.Hm, 803);
    g.dA_log = a0;
    g.dD = d0;
    for (int rep = 0; rep < 2; ++rep) {
      for (auto* v : {&g.dx, &g.ddt, &g.dBm, &g.dCm}) std::fill(v->begin(), v->end(), 7.0);
      if (form == 0)
        piper::kernels::ssd_bwd<double>(s, dy.data(), in.x.data(), in.dt.data(), in.A_log.data(),
                                        in.Bm.data(), in.Cm.data(), in.D.data(), saved.data(),
                                        g.dx.data(), g.ddt.data(), g.dA_log.data(), g.dBm.data(),
                                        g.dCm.data(), g.dD.data(), work.data());
      else
        piper::kernels::ssd_ref_bwd<double>(s, dy.data(), in.x.data(), in.dt.data(),
                                            in.A_log.data(), in.Bm.data(), in.Cm.data(),
                                            in.D.data(), g.dx.data(), g.ddt.data(),
                                            g.dA_log.data(), g.dBm.data(), g.dCm.data(),
                                            g.dD.data());
    }
    const auto& one = form == 0 ? once : once_ref;
    std::vector<double> expA(s.Hm), expD(s.Hm);
    for (int64_t h = 0; h < s.Hm; ++h) {
      expA[h] = a0[h] + 2 * one.dA_log[h];
      expD[h] = d0[h] + 2 * one.dD[h];
      EXPECT_NE(one.dA_log[h], 0.0);
      EXPECT_NE(one.dD[h], 0.0);
    }
    const std::string nm = form == 0 ? "chunked " : "reference ";
    auto check = [&](const char* what, const std::vector<double>& got,
                     const std::vector<double>& want) {
      const std::string label = nm + what;
      EXPECT_LE(report(label.c_str(), max_rel_err(got, want), 1e-12), 1e-12) << label;
    };
    check("dA_log accumulates", g.dA_log, expA);
    check("dD accumulates", g.dD, expD);
    check("dx overwritten", g.dx, one.dx);
    check("ddt overwritten", g.ddt, one.ddt);
    check("dB overwritten", g.dBm, one.dBm);
    check("dC overwritten", g.dCm, one.dCm);
  }
}

// Same inputs: bit-identical outputs on repeat and with 1 or 2 threads (static schedules, no
// atomics, per-task arithmetic independent of the thread that runs it).
TEST(Ssd, ChunkedIsDeterministic) {
  const SsdShape s{3, 70, 4, 8, 2, 8, 16};
  const auto in = make_inputs<float>(s, 900);
  const auto dy = random_vec<float>(s.B * s.Tn * s.Hm * s.P, 901);
  const auto y1 = chunk_fwd(s, in), y2 = chunk_fwd(s, in);
  EXPECT_EQ(y1, y2);
  const auto g1 = chunk_bwd(s, in, dy), g2 = chunk_bwd(s, in, dy);
  EXPECT_EQ(g1.dx, g2.dx);
  EXPECT_EQ(g1.ddt, g2.ddt);
  EXPECT_EQ(g1.dA_log, g2.dA_log);
  EXPECT_EQ(g1.dBm, g2.dBm);
  EXPECT_EQ(g1.dCm, g2.dCm);
  EXPECT_EQ(g1.dD, g2.dD);
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(saved_threads == 1 ? 2 : 1);
  const auto y3 = chunk_fwd(s, in);
  const auto g3 = chunk_bwd(s, in, dy);
  omp_set_num_threads(saved_threads);
  EXPECT_EQ(y1, y3);
  EXPECT_EQ(g1.dx, g3.dx);
  EXPECT_EQ(g1.ddt, g3.ddt);
  EXPECT_EQ(g1.dA_log, g3.dA_log);
  EXPECT_EQ(g1.dBm, g3.dBm);
  EXPECT_EQ(g1.dCm, g3.dCm);
  EXPECT_EQ(g1.dD, g3.dD);
}

}  // namespace
