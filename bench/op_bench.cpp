// op_bench.cpp — the device time of the ops a model's blocks spend their step in, on one device, at
// the shapes one microbatch of CONFIG gives them: attention and the Mamba-2 scan forward and backward,
// the convolution and the gated norm of a Mamba-2 block, and the linear products of its input
// projection and of an MLP's up projection. Each op runs on random values (the backward after its
// forward, on what the forward saved) `--warmup` times, then in `--batches` batches of `--runs` with
// the device synchronised around each batch; the median batch's mean is the op's time. An op whose
// output is not finite fails the run (exit 1), so a kernel that leaves an output unwritten cannot
// pass for a fast one. Storage and products follow train.precision, as the units compute under it
// (bf16: bf16 tensors and products; fp32; tf32 products). The model FLOPs of each op, and so its
// TFLOP/s, come from bench/model_flops.py --ops, the one definition of them (scripts/gpu-check.sh).
//
// Usage: BUILD_DIR/bench/op_bench CONFIG [--set key=value ...] [--runs N] [--batches N] [--warmup N]
//   -> one JSON line per op: {"op":..,"device":..,"storage":..,"shape":[..],"median_ms":..}
//      ("shape": for a product its m, n, k; else the op's main tensor's shape)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "config/config.hpp"
#include "model/model.hpp"
#include "runtime/rank_runtime.hpp"

namespace {

using namespace piper;
using backend::DType;
using backend::MemCategory;
using backend::Shape;
using backend::Tensor;

struct Args {
  std::string config;
  std::vector<std::string> sets;
  int runs = 10, batches = 3, warmup = 2;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "op_bench: %s\nusage: op_bench CONFIG [--set key=value ...] [--runs N (>= 1)] [--batches N (>= 1)] "
               "[--warmup N (>= 0)]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--set")
      a.sets.push_back(value());
    else if (arg == "--runs")
      a.runs = std::atoi(value().c_str());
    else if (arg == "--batches")
      a.batches = std::atoi(value().c_str());
    else if (arg == "--warmup")
      a.warmup = std::atoi(value().c_str());
    else if (a.config.empty() && arg.rfind("--", 0) != 0)
      a.config = arg;
    else
      usage("unknown argument '" + arg + "'");
  }
  if (a.config.empty()) usage("no CONFIG");
  if (a.runs < 1 || a.batches < 1 || a.warmup < 0) usage("--runs and --batches must be >= 1, --warmup >= 0");
  return a;
}

class Bench {
 public:
  Bench(backend::Backend& be, DType storage, const Args& a) : be_(be), storage_(storage), args_(a) {}

  // A tensor of `shape` in `dtype` holding values drawn uniformly from [lo, hi).
  Tensor random(Shape shape, DType dtype, float lo = -1.0f, float hi = 1.0f) {
    Tensor f32(be_, shape, MemCategory::MEM_BUFFERS);
    std::vector<float> host(static_cast<size_t>(shape.numel()));
    std::uniform_real_distribution<float> dist(lo, hi);
    for (float& v : host) v = dist(gen_);
    be_.to_device(f32.view().ptr, host.data(), host.size() * sizeof(float));
    if (dtype == DType::DTYPE_F32) return f32;
    return backend::converted(f32.view(), dtype, MemCategory::MEM_BUFFERS);
  }
  Tensor data(Shape shape, float lo = -1.0f, float hi = 1.0f) { return random(shape, storage_, lo, hi); }
  Tensor f32(Shape shape, float lo = -1.0f, float hi = 1.0f) { return random(shape, DType::DTYPE_F32, lo, hi); }
  Tensor empty(Shape shape, DType dtype) { return Tensor(be_, shape, MemCategory::MEM_BUFFERS, dtype); }
  Tensor out(Shape shape) { return empty(shape, storage_); }

  // Times `op`, checks that each tensor of `outputs` is finite, and prints the op's line.
  void time(const std::string& name, const std::vector<int64_t>& shape, const std::function<void()>& op,
            const std::vector<const Tensor*>& outputs) {
    for (int i = 0; i < args_.warmup; ++i) op();
    std::vector<double> ms;
    for (int b = 0; b < args_.batches; ++b) {
      be_.synchronize(0);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < args_.runs; ++i) op();
      be_.synchronize(0);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
                   args_.runs);
    }
    for (const Tensor* t : outputs) {
      const double s = be_.sum_squares(t->view());
      if (!std::isfinite(s)) {
        std::fprintf(stderr, "op_bench: %s on %s left an output that is not finite (sum of squares %g)\n",
                     name.c_str(), be_.name(), s);
        failed_ = true;
      }
    }
    std::sort(ms.begin(), ms.end());
    std::string dims;
    for (int64_t d : shape) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    std::printf("{\"op\":\"%s\",\"device\":\"%s\",\"storage\":\"%s\",\"shape\":[%s],\"median_ms\":%.4f}\n",
                name.c_str(), be_.name(), storage_ == DType::DTYPE_BF16 ? "bf16" : "f32", dims.c_str(),
                ms[ms.size() / 2]);
    std::fflush(stdout);
  }

  // y = x w^T for x [M,K], w [N,K]; the backward's dx and dw; under the name `what`.
  void linear(const std::string& what, int64_t M, int64_t K, int64_t N) {
    Tensor x = data({M, K}), w = data({N, K}, -0.05f, 0.05f), y = out({M, N}), dy = data({M, N});
    Tensor dx = out({M, K}), dw = f32({N, K});
    const std::vector<int64_t> mnk{M, N, K};
    time("linear_fwd:" + what, mnk, [&] { be_.linear_fwd(x.view(), w.view(), y.view()); }, {&y});
    time("linear_bwd_input:" + what, mnk, [&] { be_.linear_bwd_input(dy.view(), w.view(), dx.view(), false); }, {&dx});
    // dw accumulates: each run adds to it, its values grow with the runs but stay finite
    time("linear_bwd_weight:" + what, mnk, [&] { be_.linear_bwd_weight(dy.view(), x.view(), dw.view()); }, {&dw});
  }

  bool failed() const { return failed_; }

 private:
  backend::Backend& be_;
  DType storage_;
  Args args_;
  std::mt19937 gen_{1234};
  bool failed_ = false;
};

int run(const Args& a) {
  config::Config cfg = config::load(a.config, a.sets);
  config::validate(cfg, 1);
  backend::Backend& be = runtime::backend_of(cfg);
  const model::Precision precision = model::precision_of(config::precision_of(cfg.train));
  be.set_matmul_precision(precision.products);
  const config::ModelConfig& m = cfg.model;
  const int64_t B = std::max<int64_t>(1, cfg.train.global_batch / cfg.parallel.microbatches / cfg.parallel.dp);
  const int64_t T = cfg.train.seq_len, M = B * T, D = m.d_model;
  Bench bench(be, precision.storage, a);

  if (m.has_mamba()) {
    const int64_t Hm = m.mamba_heads(), P = m.head_dim, G = m.n_groups, N = m.d_state, C = m.conv_channels();
    const int64_t Di = m.d_inner();
    bench.linear("in_proj", M, D, m.in_proj_rows());
    Tensor cx = bench.data({B, T, C}), cw = bench.data({C, m.d_conv}, -0.5f, 0.5f), cb = bench.data({C});
    Tensor cy = bench.out({B, T, C}), cdy = bench.data({B, T, C}), cdx = bench.out({B, T, C});
    Tensor cdw = bench.f32({C, m.d_conv}), cdb = bench.f32({C});
    bench.time("conv1d_fwd", {B, T, C}, [&] { be.conv1d_fwd(cx.view(), cw.view(), cb.view(), cy.view()); }, {&cy});
    bench.time("conv1d_bwd", {B, T, C},
               [&] { be.conv1d_bwd(cdy.view(), cx.view(), cw.view(), cdx.view(), cdw.view(), cdb.view()); }, {&cdx});

    Tensor x = bench.data({B, T, Hm, P}), dt = bench.data({B, T, Hm}, 0.001f, 0.1f);
    Tensor A_log = bench.f32({Hm}, 0.0f, 2.7f), Dp = bench.f32({Hm});
    Tensor Bm = bench.data({B, T, G, N}), Cm = bench.data({B, T, G, N}), y = bench.out({B, T, Hm, P});
    Tensor saved = bench.empty({be.ssd_saved_numel(x.shape(), Bm.shape(), m.ssd_chunk)}, DType::DTYPE_F32);
    const std::vector<int64_t> xs{B, T, Hm, P};
    bench.time("ssd_fwd", xs, [&] {
      be.ssd_fwd(x.view(), dt.view(), A_log.view(), Bm.view(), Cm.view(), Dp.view(), y.view(), saved.view(), m.ssd_chunk);
    }, {&y});
    Tensor dy = bench.data({B, T, Hm, P}), dx = bench.out({B, T, Hm, P}), ddt = bench.out({B, T, Hm});
    Tensor dA = bench.f32({Hm}), dD = bench.f32({Hm}), dB = bench.out({B, T, G, N}), dC = bench.out({B, T, G, N});
    bench.time("ssd_bwd", xs, [&] {
      be.ssd_bwd(dy.view(), x.view(), dt.view(), A_log.view(), Bm.view(), Cm.view(), Dp.view(), saved.view(), dx.view(),
                 ddt.view(), dA.view(), dB.view(), dC.view(), dD.view(), m.ssd_chunk);
    }, {&dx, &ddt, &dB, &dC});

    Tensor gy = bench.data({M, Di}), gz = bench.data({M, Di}), gw = bench.data({Di}, 0.5f, 1.5f);
    Tensor go = bench.out({M, Di}), grstd = bench.empty({M, G}, DType::DTYPE_F32), gdo = bench.data({M, Di});
    Tensor gdy = bench.out({M, Di}), gdz = bench.out({M, Di}), gdw = bench.f32({Di});
    bench.time("gated_rmsnorm_fwd", {M, Di},
               [&] { be.gated_rmsnorm_fwd(gy.view(), gz.view(), gw.view(), go.view(), grstd.view(), 1e-5f); }, {&go});
    bench.time("gated_rmsnorm_bwd", {M, Di}, [&] {
      be.gated_rmsnorm_bwd(gdo.view(), gy.view(), gz.view(), gw.view(), grstd.view(), gdy.view(), gdz.view(), gdw.view());
    }, {&gdy, &gdz});
  }
  if (m.has_attention()) {
    const int64_t H = m.n_heads, KV = m.n_kv_heads, hd = m.attn_head_dim();
    Tensor q = bench.data({B, T, H, hd}), k = bench.data({B, T, KV, hd}), v = bench.data({B, T, KV, hd});
    Tensor o = bench.out({B, T, H, hd}), lse = bench.empty({B, H, T}, DType::DTYPE_F32);
    const std::vector<int64_t> qs{B, T, H, hd};
    bench.time("attention_fwd", qs, [&] { be.attention_fwd(q.view(), k.view(), v.view(), o.view(), lse.view()); },
               {&o, &lse});
    Tensor dout = bench.data({B, T, H, hd}), dq = bench.out({B, T, H, hd});
    Tensor dk = bench.out({B, T, KV, hd}), dv = bench.out({B, T, KV, hd});
    bench.time("attention_bwd", qs, [&] {
      be.attention_bwd(dout.view(), q.view(), k.view(), v.view(), o.view(), lse.view(), dq.view(), dk.view(), dv.view());
    }, {&dq, &dk, &dv});
  }
  if (m.pattern.find('-') != std::string::npos) bench.linear("mlp_up", M, D, m.ffn_hidden);
  return bench.failed() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  piper::backend::set_cuda_environment();
  const Args a = parse(argc, argv);
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "op_bench: %s\n", e.what());
    return 1;
  }
}
