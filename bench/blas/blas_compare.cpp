// blas_compare.cpp — times single-precision GEMM on piper's benchmark-model shapes, to
// choose the CPU BLAS by measurement (docs/blas.md). One source, compiled once per library
// by bench/blas/run.sh: -DUSE_CBLAS (OpenBLAS, BLIS: cblas_sgemm) or -DUSE_DNNL (oneDNN:
// dnnl_sgemm). Threads come from the environment (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
// BLIS_NUM_THREADS), set by run.sh. Prints one line per case:
//   <case> <M> <N> <K> <calls per rep> <median ms per rep> <GFLOP/s>
// All matrices are row-major. Not part of the CMake build (it lives in bench/blas/).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#if defined(USE_CBLAS)
// Declared here rather than taken from a header so the same source builds against
// OpenBLAS and BLIS, whose cblas headers live in different places. The ABI is the standard
// CBLAS one (enums are ints).
extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K,
                            float alpha, const float* A, int lda, const float* B, int ldb,
                            float beta, float* C, int ldc);
// Present only in the matching library; weak so one source links with either.
extern "C" char* openblas_get_config(void) __attribute__((weak));
extern "C" const char* bli_info_get_version_str(void) __attribute__((weak));
static constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
#elif defined(USE_DNNL)
#include <dnnl.h>
#else
#error "define USE_CBLAS or USE_DNNL"
#endif

namespace {

// C[M,N] = op(A) op(B) + beta C, row-major; lda/ldb/ldc are the stored row lengths.
void sgemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B,
           int ldb, float beta, float* C, int ldc) {
#if defined(USE_CBLAS)
  cblas_sgemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, M, N, K, 1.0f, A,
              lda, B, ldb, beta, C, ldc);
#else
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb,
                                beta, C, ldc);
  if (st != dnnl_success) {
    std::fprintf(stderr, "dnnl_sgemm failed: %d\n", static_cast<int>(st));
    std::exit(1);
  }
#endif
}

const char* library_name() {
#if defined(USE_CBLAS)
  if (openblas_get_config) return openblas_get_config();
  if (bli_info_get_version_str) return bli_info_get_version_str();
  return "cblas (unknown)";
#else
  static char buf[64];
  const dnnl_version_t* v = dnnl_version();
  std::snprintf(buf, sizeof buf, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
  return buf;
#endif
}

struct Case {
  std::string name;
  bool ta, tb;
  int M, N, K;
  int calls;  // GEMMs per repetition (attention: one per (sample, head))
};

float* alloc(size_t n, std::mt19937& rng) {
  auto* p = static_cast<float*>(std::aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) p[i] = u(rng);
  return p;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 25;        // timed repetitions (median reported); >= 20
  double min_rep_s = 0.002;  // a repetition repeats its case until it lasts this long
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--min-rep-ms") && i + 1 < argc)
      min_rep_s = std::atof(argv[++i]) / 1e3;
  }
  reps = std::max(reps, 20);

  const int M = 2048;  // B*T = 8 * 256 rows
  // (K, N): in = K features, out = N features; weight W is [N, K] (torch Linear layout).
  struct Lin { const char* what; int K, N; };
  const Lin lins[] = {
      {"D->D(256x256)", 256, 256},      // attention q/o-ish projections
      {"D->F(256x768)", 256, 768},      // MLP gate/up
      {"F->D(768x256)", 768, 256},      // MLP down
      {"D->inproj(256x1104)", 256, 1104},  // Mamba-2 in_proj: 2*512 + 2*32 + 16
      {"dinner->D(512x256)", 512, 256},    // Mamba-2 out_proj
      {"D->V(256x256)", 256, 256},      // lm_head (vocab 256)
  };
  std::vector<Case> cases;
  for (const auto& l : lins) {
    std::string w = l.what;
    cases.push_back({"fwd y=xW^T " + w, false, true, M, l.N, l.K, 1});
    cases.push_back({"bwd dx=dyW " + w, false, false, M, l.K, l.N, 1});
    cases.push_back({"bwd dW=dy^Tx " + w, true, false, l.N, l.K, M, 1});
  }
  // Attention per (sample, head): T=256, hd=32; a repetition covers B*H = 8*8 heads.
  cases.push_back({"attn S=QK^T (256x32 . 32x256)", false, true, 256, 256, 32, 64});
  cases.push_back({"attn O=PV (256x256 . 256x32)", false, false, 256, 32, 256, 64});
  cases.push_back({"peak square 1024", false, false, 1024, 1024, 1024, 1});

  std::mt19937 rng(1234);
  const char* thr = std::getenv("OMP_NUM_THREADS");
  std::printf("# library: %s\n# threads(OMP_NUM_THREADS): %s\n", library_name(),
              thr ? thr : "unset");
  for (const auto& c : cases) {
    // Stored shapes: A is op(A)[M,K] stored as [K,M] when transposed; same for B.
    const int a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
    const int b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
    // Separate buffers per call so attention heads do not all hit one cached block.
    std::vector<float*> As, Bs, Cs;
    for (int i = 0; i < c.calls; ++i) {
      As.push_back(alloc(size_t(a_rows) * a_cols, rng));
      Bs.push_back(alloc(size_t(b_rows) * b_cols, rng));
      Cs.push_back(alloc(size_t(c.M) * c.N, rng));
    }
    // dW accumulates (beta = 1) as in gradient accumulation; the rest overwrite.
    const float beta = c.ta ? 1.0f : 0.0f;
    auto one_pass = [&] {
      for (int i = 0; i < c.calls; ++i)
        sgemm(c.ta, c.tb, c.M, c.N, c.K, As[i], a_cols, Bs[i], b_cols, beta, Cs[i], c.N);
    };
    // Warm up (thread pools, page faults), then size the inner loop to >= min_rep_s.
    for (int w = 0; w < 3; ++w) one_pass();
    double t0 = now_s();
    one_pass();
    double single = std::max(now_s() - t0, 1e-7);
    int inner = std::max(1, static_cast<int>(min_rep_s / single));
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
      t0 = now_s();
      for (int k = 0; k < inner; ++k) one_pass();
      times.push_back((now_s() - t0) / inner);
    }
    std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
    double med = times[reps / 2];
    double flops = 2.0 * c.M * c.N * c.K * c.calls;
    std::printf("%s\t%d\t%d\t%d\t%d\t%.4f\t%.2f\n", c.name.c_str(), c.M, c.N, c.K, c.calls,
                med * 1e3, flops / med / 1e9);
    std::fflush(stdout);
    for (int i = 0; i < c.calls; ++i) {
      std::free(As[i]);
      std::free(Bs[i]);
      std::free(Cs[i]);
    }
  }
  return 0;
}
