// moe_block.cpp — the MoE block's forward + backward throughput against a dense SwiGLU MLP block
// of the same active parameters (MLP hidden = top_k x moe_ffn_hidden), one rank, through the
// units training runs (model::make_unit, model::play_pass on the CPU backend). bench/moe.py
// prints its table and writes it into docs/benchmarks.md.
// Threads: --threads N (default 1). Per size: warm-up, then --reps (>= 3) repetitions of
// [MoE forward + fused backward, MLP forward + fused backward], the two interleaved so that
// both see the same machine; medians.
// Usage: BUILD_DIR/bench/moe_block [--threads N] [--reps N]   -> one JSON line per size:
//   {"d_model":D,"n_experts":E,"top_k":K,"moe_ffn_hidden":F,"rows":R,"moe_ms":..,"mlp_ms":..,
//    "moe_tokens_per_s":..,"mlp_tokens_per_s":..,"ratio":..}   (ratio: MoE over MLP tokens/s)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.hpp"
#include "config/config.hpp"
#include "ir/model_graph.hpp"
#include "model/params.hpp"
#include "model/unit.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Size {
  int64_t d_model, n_experts, top_k, moe_ffn_hidden, rows;
};

// Jamba-like's block (config/examples/jamba-like.yaml) at its microbatch, then wider ones.
constexpr Size kSizes[] = {
    {128, 8, 2, 256, 256},
    {256, 8, 2, 512, 512},
    {256, 16, 2, 512, 1024},
    {512, 8, 2, 1024, 512},
};
constexpr int64_t kSeq = 128;  // positions per sequence: the balance loss is per sequence

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One block ('E' or '-') of `s` with its parameters and inputs, timed forward + fused backward.
class BlockRun {
 public:
  BlockRun(const Size& s, char kind) : be_(piper::backend::cpu()) {
    cfg_.pattern = std::string(1, kind);
    cfg_.d_model = s.d_model;
    cfg_.n_experts = s.n_experts;
    cfg_.top_k = s.top_k;
    cfg_.moe_ffn_hidden = s.moe_ffn_hidden;
    cfg_.ffn_hidden = s.top_k * s.moe_ffn_hidden;  // the dense block's hidden: the MoE's active width
    graph_ = piper::ir::make_model_graph(cfg_);
    ps_ = std::make_unique<piper::model::ParamStore>(graph_, std::vector<int>{1}, be_);
    ps_->init(1234);
    unit_ = piper::model::make_unit(graph_.units[1], cfg_, *ps_, be_);
    const auto n = static_cast<size_t>(s.rows * s.d_model);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    x_.resize(n), dy_.resize(n), y_.resize(n), dx_.resize(n);
    for (auto& v : x_) v = normal(rng);
    for (auto& v : dy_) v = normal(rng);
    tokens_.assign(static_cast<size_t>(s.rows), 0);
    mb_ = {tokens_.data(), tokens_.data(), s.rows / kSeq, kSeq, 1.0f / static_cast<float>(s.rows)};
  }
  int64_t active_params() const {
    int64_t n = graph_.units[1].param_count();
    if (cfg_.pattern == "E") n -= (cfg_.n_experts - cfg_.top_k) * 3 * cfg_.d_model * cfg_.moe_ffn_hidden;
    return n;
  }
  double once_ms() {
    const auto t0 = Clock::now();
    const piper::backend::Shape rows{mb_.rows(), cfg_.d_model};
    piper::model::play_pass(*unit_, piper::ir::NodeKind::FWD, 0,
                            {&mb_, piper::backend::view(be_, x_.data(), rows), {}, piper::backend::view(be_, y_.data(), rows), {}});
    piper::model::play_pass(*unit_, piper::ir::NodeKind::BWD, 0,
                            {nullptr, piper::backend::view(be_, x_.data(), rows), piper::backend::view(be_, dy_.data(), rows), {},
                             piper::backend::view(be_, dx_.data(), rows)});
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }

 private:
  piper::backend::Backend& be_;
  piper::config::ModelConfig cfg_;
  piper::ir::ModelGraph graph_;
  std::unique_ptr<piper::model::ParamStore> ps_;
  std::unique_ptr<piper::model::Unit> unit_;
  std::vector<float> x_, dy_, y_, dx_;
  std::vector<int32_t> tokens_;
  piper::model::MicroBatch mb_;
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 7, threads = 1;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::max(3, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  omp_set_num_threads(threads);
  for (const Size& s : kSizes) {
    BlockRun moe(s, 'E'), mlp(s, '-');
    for (int w = 0; w < 2; ++w) moe.once_ms(), mlp.once_ms();  // warm-up: allocations, page faults
    std::vector<double> tm, td;
    for (int r = 0; r < reps; ++r) tm.push_back(moe.once_ms()), td.push_back(mlp.once_ms());
    const double m = median(tm), d = median(td), rows = static_cast<double>(s.rows);
    std::printf("{\"threads\":%d,\"reps\":%d,\"d_model\":%lld,\"n_experts\":%lld,\"top_k\":%lld,"
                "\"moe_ffn_hidden\":%lld,\"rows\":%lld,\"moe_active_params\":%lld,\"mlp_params\":%lld,"
                "\"moe_ms\":%.4f,\"mlp_ms\":%.4f,\"moe_tokens_per_s\":%.1f,\"mlp_tokens_per_s\":%.1f,\"ratio\":%.4f}\n",
                threads, reps, static_cast<long long>(s.d_model), static_cast<long long>(s.n_experts),
                static_cast<long long>(s.top_k), static_cast<long long>(s.moe_ffn_hidden),
                static_cast<long long>(s.rows), static_cast<long long>(moe.active_params()),
                static_cast<long long>(mlp.active_params()), m, d, rows / m * 1e3, rows / d * 1e3, d / m);
    std::fflush(stdout);
  }
  return 0;
}
