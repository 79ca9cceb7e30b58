// gemm_peak.cpp — measures the CPU's practical sgemm peak (GFLOP/s) through piper's own GEMM
// wrapper (kernels/gemm.hpp, so whatever BLAS piper links), the denominator of "fraction of
// peak" in scripts/bench.sh / docs/benchmarks.md.
// Threads come from the environment (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, BLIS_NUM_THREADS).
// Usage: BUILD_DIR/bench/gemm_peak [--reps N]   -> one JSON line:
//   {"threads":T,"blas":"...","peak_gflops":X,"sizes":{"768":..,"1024":..,"1536":..}}
// Peak = the best, over a few square sizes, of the median over N (>= 20) timed repetitions.
#include "gemm.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

double median_seconds(int n, int reps) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  auto run = [&] {
    piper::kernels::gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                                c.data(), n);
  };
  for (int w = 0; w < 3; ++w) run();  // warm-up: thread pool, page faults
  std::vector<double> t(reps);
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    t[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::max(20, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--reps N]\n", argv[0]);
      return 2;
    }
  }
  const char* env = std::getenv("OMP_NUM_THREADS");
  const int threads = env ? std::atoi(env) : 0;
  double peak = 0.0;
  std::string sizes;
  for (int n : {768, 1024, 1536}) {
    const double s = median_seconds(n, reps);
    const double gf = 2.0 * n * n * static_cast<double>(n) / s / 1e9;
    peak = std::max(peak, gf);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s\"%d\":%.2f", sizes.empty() ? "" : ",", n, gf);
    sizes += buf;
  }
  std::printf("{\"threads\":%d,\"blas\":\"%s\",\"peak_gflops\":%.2f,\"sizes\":{%s}}\n",
              threads, piper::kernels::blas_name(), peak, sizes.c_str());
  return 0;
}
