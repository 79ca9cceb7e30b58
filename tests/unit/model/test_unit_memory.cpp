// test_unit_memory.cpp — ir::unit_memory, the simulator's analytic activation memory, against the
// backend's accounting of each unit kind's passes, with the kept activations stored in f32 and in bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "config/config.hpp"
#include "ir/model_graph.hpp"
#include "ir/work.hpp"
#include "model/model.hpp"
#include "model/unit.hpp"
#include "unit/test_configs.hpp"

namespace piper::model {
namespace {

using backend::DType;
using backend::Tensor;

// What a unit's passes hold, as calibrate measures it (runtime/calibrate.cpp): the level's rise over
// the forward (saved), the level after the input-gradient half above the level before the forward
// (kept_for_w), and the highest peak inside a pass above the level before that pass (transient).
struct Measured {
  double saved = 0, kept_for_w = 0, transient = 0;
};

Tensor filled(int64_t rows, int64_t D, DType t, uint32_t seed) {
  std::vector<float> host(static_cast<size_t>(rows * D));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : host) v = normal(rng);
  Tensor f32(backend::cpu(), {rows, D}, backend::MemCategory::MEM_BUFFERS);
  std::copy(host.begin(), host.end(), f32.data());
  return t == DType::DTYPE_F32 ? std::move(f32) : backend::converted(f32.view(), t, backend::MemCategory::MEM_BUFFERS);
}

// Each pass with the unit's compute copy bound (under bf16), as the executor binds it for each instruction.
Measured measure(Unit& unit, ParamStore& ps, const Tensor& copy, bool embed, bool head, const MicroBatch& mb,
                 int64_t D, DType t) {
  backend::Backend& be = backend::cpu();
  const int u = unit.spec().index;
  auto play = [&](ir::NodeKind p, const PassArgs& a) {
    if (!copy.empty()) ps.bind_compute_values(u, copy.view());
    play_pass(unit, p, 0, a);
    if (!copy.empty()) ps.unbind_compute_values(u);
  };
  const int64_t rows = mb.rows();
  Tensor x = filled(rows, D, t, 1), dy = filled(rows, D, t, 2), y = filled(rows, D, t, 3), dx = filled(rows, D, t, 4);
  auto args = [&](ir::NodeKind p) {
    const bool fwd = p == ir::NodeKind::FWD;
    PassArgs a;
    a.mb = &mb;
    if (!embed) a.x = x.view();
    if (fwd && !head) a.y = y.view();
    if (!fwd && !head) a.dy = dy.view();
    if (!fwd && p != ir::NodeKind::BWD_W && !embed) a.dx = dx.view();
    return a;
  };
  auto level = [&] { return static_cast<double>(be.memory().total_current); };
  auto peak = [&] { return static_cast<double>(be.memory().total_peak); };
  Measured m;
  const double l0 = level();
  be.reset_peak();
  play(ir::NodeKind::FWD, args(ir::NodeKind::FWD));
  const double l1 = level(), pf = peak() - l0;
  be.reset_peak();
  play(embed ? ir::NodeKind::BWD_W : ir::NodeKind::BWD_I, args(embed ? ir::NodeKind::BWD_W : ir::NodeKind::BWD_I));
  const double l2 = level(), pbi = peak() - l1;
  be.reset_peak();
  if (!embed) play(ir::NodeKind::BWD_W, args(ir::NodeKind::BWD_W));
  const double pbw = peak() - l2;
  m.saved = l1 - l0;
  m.kept_for_w = l2 - l0;
  m.transient = std::max({pf, pbi, pbw});
  EXPECT_EQ(level(), l0) << "a unit's passes free all they allocated";
  return m;
}

// The saved state and what the weight half reads are the runtime's to the byte in both storage
// types. The transient peak within 35%: the analytic model counts a pass's largest tensors, not every
// scratch (an MoE block's), nor the copies a GPU's bf16 product makes of its f32 operands (the CPU
// backend's rounded and widened copies stand for registers and are not counted).
TEST(UnitMemory, AnalyticModelMatchesTheBackendsAccountingInF32AndBf16) {
  config::ModelConfig cfg = testing::small_model("M*-E");
  cfg.ssd_chunk = 4;
  const ir::ModelGraph graph = ir::make_model_graph(cfg);
  const int64_t B = 2, T = 7, rows = B * T, D = cfg.d_model;
  std::vector<int32_t> ids(static_cast<size_t>(rows)), targets(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % 32),
                                     targets[static_cast<size_t>(i)] = static_cast<int32_t>((i * 5 + 3) % 32);
  const MicroBatch mb{ids.data(), targets.data(), B, T, 1.0f / static_cast<float>(rows)};
  for (const config::Precision p : {config::Precision::PRECISION_FP32, config::Precision::PRECISION_BF16}) {
    Model model(cfg, graph, {}, backend::cpu());
    model.params().init(3);
    model.set_precision(precision_of(p));
    const DType t = model.storage_dtype();
    const int kept_bytes = static_cast<int>(backend::dtype_size(t));
    for (size_t u = 0; u < graph.units.size(); ++u) {
      const ir::UnitSpec& spec = graph.units[u];
      const char kind = ir::unit_symbol(spec.kind);
      const bool embed = spec.kind == ir::UnitKind::UNIT_EMBED, head = spec.kind == ir::UnitKind::UNIT_HEAD;
      const Tensor copy = model.params().rounded_values(static_cast<int>(u), t);
      const Measured got = measure(model.unit(static_cast<int>(u)), model.params(), copy, embed, head, mb, D, t);
      const ir::UnitMemory want = ir::unit_memory(cfg, kind, rows, T, 1, kept_bytes);
      std::printf("[ memory ] %s %c: saved %.0f / %.0f, kept_for_w %.0f / %.0f, transient %.0f / %.0f bytes "
                  "(measured / analytic)\n",
                  backend::dtype_name(t), kind, got.saved, want.saved, got.kept_for_w, want.kept_for_w,
                  got.transient, want.transient);
      EXPECT_EQ(got.saved, want.saved) << backend::dtype_name(t) << " " << kind;
      EXPECT_EQ(got.kept_for_w, want.kept_for_w) << backend::dtype_name(t) << " " << kind;
      EXPECT_NEAR(want.transient, got.transient, 0.35 * got.transient) << backend::dtype_name(t) << " " << kind;
    }
  }
}

// What recomputation drops after a block's forward is the share of its saved state that
// ir::recompute_share says (the simulator and the tuner free that much), to the byte in both
// storage types: full, all of it; selective, all but the block's normalised input and rstd.
TEST(UnitMemory, RecomputationDropsTheAnalyticShareOfTheSavedState) {
  config::ModelConfig cfg = testing::small_model("M*-");
  cfg.ssd_chunk = 4;
  const ir::ModelGraph graph = ir::make_model_graph(cfg);
  const int64_t B = 2, T = 7, rows = B * T, D = cfg.d_model;
  const MicroBatch mb{nullptr, nullptr, B, T, 1.0f / static_cast<float>(rows)};
  backend::Backend& be = backend::cpu();
  for (const config::Precision p : {config::Precision::PRECISION_FP32, config::Precision::PRECISION_BF16}) {
    Model model(cfg, graph, {}, be);
    model.params().init(3);
    model.set_precision(precision_of(p));
    const DType t = model.storage_dtype();
    const int kept_bytes = static_cast<int>(backend::dtype_size(t));
    Tensor x = filled(rows, D, t, 1), y = filled(rows, D, t, 2);
    for (size_t u = 1; u + 1 < graph.units.size(); ++u) {
      const char kind = ir::unit_symbol(graph.units[u].kind);
      for (const ir::Recompute mode : {ir::Recompute::RECOMPUTE_SELECTIVE, ir::Recompute::RECOMPUTE_FULL}) {
        if (mode == ir::Recompute::RECOMPUTE_SELECTIVE && kind == '-') continue;  // an MLP has no mixer apart
        Unit& unit = model.unit(static_cast<int>(u));
        const double l0 = static_cast<double>(be.memory().total_current);
        play_pass(unit, ir::NodeKind::FWD, 0, {&mb, x.view(), {}, y.view(), {}});
        const double l1 = static_cast<double>(be.memory().total_current);
        unit.drop(0, mode);
        const double dropped = l1 - static_cast<double>(be.memory().total_current);
        const double want = ir::recompute_share(cfg, kind, mode, rows, T, 1, kept_bytes).saved * (l1 - l0);
        std::printf("[ memory ] %s %c %s: dropped %.0f of %.0f bytes, analytic %.0f\n", backend::dtype_name(t), kind,
                    ir::recompute_name(mode), dropped, l1 - l0, want);
        EXPECT_NEAR(dropped, want, 1e-9 * (l1 - l0)) << backend::dtype_name(t) << " " << kind;
        unit.release(0);
        EXPECT_EQ(static_cast<double>(be.memory().total_current), l0);
      }
    }
  }
}

}  // namespace
}  // namespace piper::model
