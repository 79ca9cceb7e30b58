// calibrate.cpp — `piper calibrate`: times one unit of each kind, the
// optimiser, the step's batch assembly and the collectives, and fits the
// linear costs of sim::CostModel (docs/calibration.md says what and how).
#include "runtime/calibrate.hpp"

#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/mpi_comm.hpp"
#include "data/token_file.hpp"
#include "ir/build.hpp"
#include "ir/model_graph.hpp"
#include "ir/strategy.hpp"
#include "ir/validate.hpp"
#include "kernels.hpp"
#include "model/model.hpp"
#include "model/params.hpp"
#include "model/unit.hpp"
#include "optim/adamw.hpp"

namespace piper::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using Points = std::vector<std::pair<double, double>>;
using backend::MemCategory;
using backend::Tensor;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// How hard to try: warm-up calls, then the median of `reps` timed calls, reps
// chosen so a shape takes about budget_ms (clamped to [min_reps, max_reps]).
struct Effort {
  double budget_ms = 600.0;
  int min_reps = 5;
  int max_reps = 15;
  int reps_for(double one_ms) const {
    const double r = one_ms > 0 ? budget_ms / one_ms : max_reps;
    return static_cast<int>(std::clamp(r, static_cast<double>(min_reps), static_cast<double>(max_reps)));
  }
};

// Worst relative error of `l` over the points, and where.
double worst_error(const sim::Linear& l, const Points& pts, double* at = nullptr) {
  double worst = 0.0;
  for (const auto& [x, y] : pts) {
    const double e = y != 0 ? std::abs(l.at(x) - y) / std::abs(y) : 0.0;
    if (e >= worst) {
      worst = e;
      if (at) *at = x;
    }
  }
  return worst;
}

// Least squares with weights w_i / y_i^2 (relative error), w = 1 when empty.
sim::Linear fit_weighted(const Points& pts, const std::vector<double>& w) {
  double s0 = 0, s1 = 0, s2 = 0, t0 = 0, t1 = 0;
  for (size_t i = 0; i < pts.size(); ++i) {
    const auto [x, y] = pts[i];
    if (y <= 0) continue;
    const double wi = (w.empty() ? 1.0 : w[i]) / (y * y);
    s0 += wi, s1 += wi * x, s2 += wi * x * x, t0 += wi * y, t1 += wi * x * y;
  }
  const double den = s0 * s2 - s1 * s1;
  if (!(den > 0)) return sim::fit_linear(pts);
  return {(t0 * s2 - s1 * t1) / den, (s0 * t1 - s1 * t0) / den};
}

// The line with the smallest worst relative error (Lawson's iteratively
// reweighted least squares), so a fit holds from a latency floor of
// microseconds up to the bandwidth regime; plain least squares when that is
// better (it rarely is).
sim::Linear fit_minimax(const Points& pts) {
  std::vector<double> w(pts.size(), 1.0);
  sim::Linear best = sim::fit_linear(pts);
  double best_err = worst_error(best, pts);
  for (int it = 0; it < 200; ++it) {
    const sim::Linear l = fit_weighted(pts, w);
    const double e = worst_error(l, pts);
    if (e < best_err) best = l, best_err = e;
    double sum = 0.0;
    for (size_t i = 0; i < pts.size(); ++i) {
      const double y = pts[i].second;
      w[i] *= y != 0 ? std::abs(l.at(pts[i].first) - y) / std::abs(y) + 1e-12 : 1e-12;
      sum += w[i];
    }
    if (!(sum > 0)) break;
    for (double& v : w) v /= sum;
  }
  return best;
}

// The line through the anchor point (x0, y0) whose slope minimises the
// squared relative error at the other points: exact at the size the
// strategy runs (its microbatch), close across the range around it.
sim::Linear fit_anchored(const Points& pts, double x0) {
  auto it = std::find_if(pts.begin(), pts.end(), [&](const auto& p) { return p.first == x0; });
  if (it == pts.end() || pts.size() < 2) return sim::fit_linear(pts);
  const double y0 = it->second;
  double num = 0, den = 0;
  for (const auto& [x, y] : pts) {
    if (x == x0 || y <= 0) continue;
    const double w = 1.0 / (y * y);
    num += w * (x - x0) * (y - y0), den += w * (x - x0) * (x - x0);
  }
  if (!(den > 0)) return sim::fit_linear(pts);
  const double b = num / den;
  return {y0 - b * x0, b};
}

// ---- tokens and the step's batch assembly ---------------------------------------

// Token ids for the measurements: the config's token file, or uniform random
// ids when it cannot be read (calibration needs no corpus).
struct Tokens {
  std::unique_ptr<data::TokenFile> file;
  std::vector<int32_t> random;

  // out[0..T] = T + 1 ids of global sample g, as TokenFile::sample.
  void sample(int64_t g, int64_t T, int32_t* out) const {
    if (file) return file->sample(g, T, out);
    const auto n = static_cast<int64_t>(random.size());
    for (int64_t i = 0; i <= T; ++i) out[i] = random[static_cast<size_t>((g * T + i) % n)];
  }
};

Tokens open_tokens(const config::Config& cfg, std::string* note) {
  Tokens t;
  try {
    t.file = std::make_unique<data::TokenFile>(cfg.data.path);
    data::check_vocab(*t.file, cfg.model.vocab_size);
  } catch (const data::DataError& e) {
    t.file.reset();
    *note = std::string("data.path: ") + e.what() + "; measuring with random tokens";
    std::mt19937 rng(static_cast<uint32_t>(cfg.train.seed));
    std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(cfg.model.vocab_size - 1));
    t.random.resize(1 << 20);
    for (auto& v : t.random) v = id(rng);
  }
  return t;
}

// The trainer's per-step batch assembly (trainer.cpp load_step): `n_mb`
// microbatches of `per` samples each, read from `first` on, split into inputs
// and targets.
struct Batch {
  std::vector<int32_t> inputs, targets;
  std::vector<model::MicroBatch> mbs;
};

void assemble(const Tokens& tok, int64_t first, int64_t per, int n_mb, int64_t T, float scale, Batch& b) {
  const int64_t share = per * n_mb;
  b.inputs.resize(static_cast<size_t>(share * T));
  b.targets.resize(static_cast<size_t>(share * T));
  std::vector<int32_t> seq(static_cast<size_t>(T + 1));
  for (int64_t j = 0; j < share; ++j) {
    tok.sample(first + j, T, seq.data());
    std::copy(seq.begin(), seq.end() - 1, b.inputs.begin() + j * T);
    std::copy(seq.begin() + 1, seq.end(), b.targets.begin() + j * T);
  }
  b.mbs.clear();
  for (int i = 0; i < n_mb; ++i)
    b.mbs.push_back({b.inputs.data() + i * per * T, b.targets.data() + i * per * T, per, T, scale});
}

// ---- compute: one unit of each kind -----------------------------------------------

// One unit kind at one microbatch size: median milliseconds and activation bytes.
struct UnitSample {
  int64_t rows = 0;
  double f = 0, b = 0, bi = 0, bw = 0;
  double saved = 0, kept = 0, transient = 0;
  int reps = 0;
};

struct KindSamples {
  char kind = '?';
  std::vector<UnitSample> at;  // by rows, ascending
};

// The precision training runs the units at (train.precision): the backend's products, and the
// storage of what the units keep and pass on.
model::Precision training_precision(const config::Config& cfg) {
  return model::precision_of(config::precision_of(cfg.train));
}

// A unit made as training makes it: its kept activations in the training precision's storage.
std::unique_ptr<model::Unit> training_unit(const config::Config& cfg, const ir::UnitSpec& spec, model::ParamStore& ps,
                                           backend::Backend& be, model::TpInfo tp = {}) {
  std::unique_ptr<model::Unit> unit = model::make_unit(spec, cfg.model, ps, be, tp);
  unit->keep_activations_in(training_precision(cfg).storage);
  return unit;
}

// Pass p of `unit` (unit u of ps) as training plays it: with its compute copy `copy` bound where it has
// one (train.precision bf16; ParamStore::rounded_values), as the executor binds it for each instruction.
double play_bound(model::Unit& unit, model::ParamStore& ps, int u, const Tensor& copy, ir::NodeKind p,
                  const model::PassArgs& a, double* ms) {
  if (!copy.empty()) ps.bind_compute_values(u, copy.view());
  const double r = model::play_pass(unit, p, 0, a, ms);
  if (!copy.empty()) ps.unbind_compute_values(u);
  return r;
}

// What the measured units run on, in the storage type units pass between them: upstream
// activations and output gradients for `samples` sequences, normal(0, 1) from `seed`, output
// buffers of the same size, and one microbatch of `samples` sequences of tokens.
struct UnitInputs {
  Tensor x, dy, y, dx;
  Batch batch;
  UnitInputs(const config::Config& cfg, const Tokens& tok, int64_t samples, uint32_t seed) {
    backend::Backend& be = backend::cpu();
    const int64_t T = cfg.train.seq_len;
    const backend::Shape shape{samples * T, cfg.model.d_model};
    const backend::DType t = training_precision(cfg).storage;
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto normals = [&] {
      Tensor f32(be, shape, MemCategory::MEM_BUFFERS);
      for (int64_t i = 0; i < f32.numel(); ++i) f32.data()[i] = normal(rng);
      return backend::converted(f32.view(), t, MemCategory::MEM_BUFFERS);
    };
    x = normals(), dy = normals();
    y = Tensor(be, shape, MemCategory::MEM_BUFFERS, t), dx = Tensor(be, shape, MemCategory::MEM_BUFFERS, t);
    assemble(tok, 0, samples, 1, T, static_cast<float>(1.0 / static_cast<double>(cfg.train.global_batch * T)), batch);
  }
  // What `pass` of a unit reads and writes for mb's rows of width D: no input for the embedding, no
  // output for the head.
  model::PassArgs args(backend::Backend& be, const model::MicroBatch& mb, int64_t D, ir::NodeKind pass, bool embed,
                       bool head) {
    const backend::Shape rows{mb.rows(), D};
    const bool fwd = pass == ir::NodeKind::FWD;
    model::PassArgs a;
    a.mb = &mb;
    auto first = [&](Tensor& t) { return backend::TensorView{&be, t.dtype(), rows, t.view().ptr}; };
    if (!embed) a.x = first(x);
    if (fwd && !head) a.y = first(y);
    if (!fwd && !head) a.dy = first(dy);
    if (!fwd && pass != ir::NodeKind::BWD_W && !embed) a.dx = first(dx);
    return a;
  }
};

// The first unit of each kind in model order: embedding, the pattern's block
// kinds in order of appearance, head.
std::vector<int> representatives(const ir::ModelGraph& g) {
  std::vector<int> out;
  std::string seen;
  for (const auto& u : g.units) {
    const char s = ir::unit_symbol(u.kind);
    if (seen.find(s) != std::string::npos) continue;
    seen += s;
    out.push_back(u.index);
  }
  return out;
}

// rank 0's value on every member of `c` (reps must agree inside a tp group:
// the units all-reduce over it).
int agree(int value, comm::Communicator* c) {
  if (!c || c->size() == 1) return value;
  double v = c->rank() == 0 ? value : 0.0;
  c->allreduce_double(&v, 1);
  return static_cast<int>(std::lround(v));
}

// Times forward, backward_input, backward_weight and the fused backward of one
// unit of each kind at batch sizes `batches` (samples of seq_len), and takes
// the activation memory from the backend's accounting. Every member of the tp
// group calls it together.
std::vector<KindSamples> measure_units(const config::Config& cfg, const ir::ModelGraph& g,
                                       const std::vector<int64_t>& batches, int64_t anchor_batch, model::TpInfo tp,
                                       const Tokens& tok, const Effort& effort) {
  backend::Backend& be = backend::cpu();
  const std::vector<int> units = representatives(g);
  model::ParamStore ps(g, units, be, {0, 1, {}, tp.rank, tp.size});
  ps.init(cfg.train.seed);
  UnitInputs in(cfg, tok, batches.back(), 7);
  const Batch& batch = in.batch;

  std::vector<KindSamples> out;
  for (int u : units) {
    const ir::UnitSpec& spec = g.units[static_cast<size_t>(u)];
    std::unique_ptr<model::Unit> unit = training_unit(cfg, spec, ps, be, tp);
    const Tensor copy = ps.rounded_values(u, training_precision(cfg).storage);
    const bool embed = spec.kind == ir::UnitKind::UNIT_EMBED, head = spec.kind == ir::UnitKind::UNIT_HEAD;
    KindSamples ks;
    ks.kind = ir::unit_symbol(spec.kind);
    for (int64_t b : batches) {
      model::MicroBatch mb = batch.mbs.front();
      mb.batch = b;
      UnitSample s;
      s.rows = mb.rows();
      // Each pass as training plays it, its tensor-parallel collectives
      // blocking between its segments; only the segments are timed (the
      // simulator times the collectives from their nodes).
      auto pass = [&](ir::NodeKind p, double* ms) {
        play_bound(*unit, ps, u, copy, p, in.args(be, mb, cfg.model.d_model, p, embed, head), ms);
      };
      // The embedding has no input-gradient half: its BWD_W is its whole backward.
      const ir::NodeKind bi = embed ? ir::NodeKind::BWD_W : ir::NodeKind::BWD_I;
      // Memory, on the first (warm-up) call: the levels around each pass.
      auto level = [&] { return be.memory().total_current; };
      auto peak = [&] { return be.memory().total_peak; };
      const int64_t l0 = level();
      be.reset_peak();
      pass(ir::NodeKind::FWD, nullptr);
      const int64_t l1 = level(), pf = peak() - l0;
      be.reset_peak();
      pass(bi, nullptr);
      const int64_t l2 = level(), pbi = peak() - l1;
      be.reset_peak();
      if (!embed) pass(ir::NodeKind::BWD_W, nullptr);
      const int64_t pbw = peak() - l2;
      s.saved = static_cast<double>(l1 - l0);
      s.kept = static_cast<double>(l2 - l0);
      s.transient = static_cast<double>(std::max({pf, pbi, pbw}));
      // One repetition: F, BI, BW, then F and the fused backward.
      std::vector<double> tf, tbi, tbw, tb;
      auto timed = [&](ir::NodeKind p, std::vector<double>& into) {
        double ms = 0;
        pass(p, &ms);
        into.push_back(ms);
      };
      auto rep = [&] {
        timed(ir::NodeKind::FWD, tf);
        if (embed) {  // no input-gradient half: bi, which no node runs, records its whole backward too
          timed(ir::NodeKind::BWD_W, tbw);
          tbi.push_back(tbw.back());
        } else {
          timed(ir::NodeKind::BWD_I, tbi);
          timed(ir::NodeKind::BWD_W, tbw);
        }
        timed(ir::NodeKind::FWD, tf);
        timed(ir::NodeKind::BWD, tb);
      };
      // A second warm-up, timed to choose the repetitions; twice as many at
      // the strategy's microbatch, where the time fits are anchored.
      const auto t0 = Clock::now();
      rep();
      int reps = effort.reps_for(ms_since(t0)) * (b == anchor_batch ? 2 : 1);
      tf.clear(), tbi.clear(), tbw.clear(), tb.clear();
      reps = agree(reps, tp.comm);
      for (int r = 0; r < reps; ++r) rep();
      s.f = median(tf), s.bi = median(tbi), s.bw = median(tbw), s.b = median(tb);
      s.reps = reps;
      ks.at.push_back(s);
    }
    out.push_back(std::move(ks));
  }
  ps.zero_grads();
  return out;
}

// Times anchored at the strategy's microbatch (`anchor_rows`); memory, which
// is linear in rows, by least squares.
sim::OpCost fit_op(const KindSamples& ks, int tp, int64_t anchor_rows) {
  sim::OpCost o;
  o.kind = ks.kind;
  o.tp = tp;
  auto points = [&](double UnitSample::*field) {
    Points p;
    for (const UnitSample& s : ks.at) p.emplace_back(static_cast<double>(s.rows), s.*field);
    return p;
  };
  auto time = [&](double UnitSample::*field) { return fit_anchored(points(field), static_cast<double>(anchor_rows)); };
  auto bytes = [&](double UnitSample::*field) { return sim::fit_linear(points(field)); };
  o.f = time(&UnitSample::f), o.b = time(&UnitSample::b), o.bi = time(&UnitSample::bi), o.bw = time(&UnitSample::bw);
  o.saved = bytes(&UnitSample::saved), o.kept_for_w = bytes(&UnitSample::kept);
  o.transient = bytes(&UnitSample::transient);
  // The embedding has no input gradient: the DAG's only backward node of it
  // (BWD, or BWD_W with split backward) runs the fused backward.
  if (ks.kind == 'e') o.bw = o.b;
  return o;
}

// The measurements, the fits, and each time fit's worst relative error over
// the sizes measured (0 at the strategy's microbatch, where it is anchored).
void print_units(const std::vector<KindSamples>& all, const std::vector<sim::OpCost>& fits, int tp) {
  std::printf("compute at tp %d (ms per call, median; activation MiB beyond the output):\n", tp);
  std::printf("  kind     rows        F        B       BI       BW   saved    kept  transient  reps\n");
  constexpr double kMiB = 1024.0 * 1024.0;
  for (const KindSamples& ks : all)
    for (const UnitSample& s : ks.at)
      std::printf("  %c    %7" PRId64 " %8.3f %8.3f %8.3f %8.3f %7.2f %7.2f %10.2f %5d\n", ks.kind, s.rows, s.f, s.b,
                  s.bi, s.bw, s.saved / kMiB, s.kept / kMiB, s.transient / kMiB, s.reps);
  for (size_t k = 0; k < all.size(); ++k) {
    const sim::OpCost& o = fits[k];
    std::printf("  fit %c: F %.4f + %.3g*rows, B %.4f + %.3g*rows, BI %.4f + %.3g*rows, BW %.4f + %.3g*rows\n",
                o.kind, o.f.a, o.f.b, o.b.a, o.b.b, o.bi.a, o.bi.b, o.bw.a, o.bw.b);
    std::string errors;
    for (auto [name, field, lin] : {std::tuple{"F", &UnitSample::f, o.f}, std::tuple{"B", &UnitSample::b, o.b},
                                    std::tuple{"BI", &UnitSample::bi, o.bi}, std::tuple{"BW", &UnitSample::bw, o.bw}}) {
      if (o.kind == 'e' && field == &UnitSample::bw) continue;  // the embedding's bw is its fused b
      Points p;
      for (const UnitSample& s : all[k].at) p.emplace_back(static_cast<double>(s.rows), s.*field);
      double at = 0.0;
      const double e = worst_error(lin, p, &at);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s %s %.1f%% at %.0f rows", errors.empty() ? "" : ",", name, 100.0 * e, at);
      errors += buf;
    }
    std::printf("         worst error:%s\n", errors.c_str());
  }
}

// ---- optimiser and step overhead ----------------------------------------------------

// An UPD's work per element: its share of the clipping norm (sum of squares),
// the AdamW step, and zeroing the gradient.
Points measure_update(const std::vector<int64_t>& sizes, const Effort& effort) {
  Points pts;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  backend::Backend& be = backend::cpu();
  backend::AdamWStep step{1e-3, 0.9, 0.95, 1e-8, 0.1, 0, true, 1.0f};
  volatile double sink = 0.0;
  for (int64_t n : sizes) {
    std::vector<float> p(static_cast<size_t>(n)), g(p.size()), m(p.size(), 0.0f), v(p.size(), 0.0f), z(p.size());
    for (size_t i = 0; i < p.size(); ++i) p[i] = normal(rng), g[i] = normal(rng);
    int64_t t = 0;
    auto once = [&] {
      const auto t0 = Clock::now();
      sink = sink + be.sum_squares(backend::view(be, g.data(), {n}));
      step.t = ++t;
      be.adamw_update(backend::view(be, p.data(), {n}), backend::view(be, g.data(), {n}),
                      backend::view(be, m.data(), {n}), backend::view(be, v.data(), {n}), step);
      std::memset(z.data(), 0, z.size() * sizeof(float));
      return ms_since(t0);
    };
    once();
    const int reps = effort.reps_for(once());
    std::vector<double> ts;
    for (int r = 0; r < reps; ++r) ts.push_back(once());
    pts.emplace_back(static_cast<double>(n), median(ts));
  }
  return pts;
}

// The batch assembly of a step of k microbatches of the config's size.
Points measure_batch_assembly(const Tokens& tok, const std::vector<int>& counts, int64_t per, int64_t T,
                              const Effort& effort) {
  Points pts;
  Batch b;
  int64_t first = 0;
  for (int k : counts) {
    auto once = [&] {
      const auto t0 = Clock::now();
      assemble(tok, first, per, k, T, 1.0f, b);
      first += per * k;  // fresh samples each time, as successive steps read
      return ms_since(t0);
    };
    once();
    const int reps = effort.reps_for(once());
    std::vector<double> ts;
    for (int r = 0; r < reps; ++r) ts.push_back(once());
    pts.emplace_back(k, median(ts));
  }
  return pts;
}

// The optimiser's cost per element and the batch assembly's per microbatch,
// into m.update and m.step_overhead (rank 0 alone).
void measure_update_and_batches(sim::CostModel& m, const ir::ModelGraph& graph, const Tokens& tokens, int64_t per_mb,
                                int n_mb, int64_t T, bool quick, const Effort& effort, bool print) {
  int64_t largest = 0;
  for (const auto& u : graph.units) largest = std::max(largest, u.param_count());
  // 16 Ki elements up to at least 1 Mi and 4x the largest unit (at most
  // 64 Mi), and the sizes of the model's units, which UPD nodes update.
  const int64_t top = std::max<int64_t>(1 << 20, std::min<int64_t>(4 * largest, int64_t{1} << 26));
  std::vector<int64_t> sizes;
  for (int64_t n = 1 << 14; n <= top; n *= 4) sizes.push_back(n);
  if (quick) sizes = {1 << 14, 1 << 20};
  for (const auto& u : graph.units) sizes.push_back(u.param_count());
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const Points upd = measure_update(sizes, effort);
  m.update = fit_minimax(upd);
  std::vector<int> counts{1, 2, 4, 8};
  for (int k = 16; k <= n_mb * 2; k *= 2) counts.push_back(k);
  if (quick) counts = {1, 4};
  const Points load = measure_batch_assembly(tokens, counts, per_mb, T, effort);
  m.step_overhead = sim::fit_linear(load);
  if (!print) return;
  std::printf("optimiser update (norm share + AdamW + zeroing; ms per call, median):\n");
  for (const auto& [n, ms] : upd) std::printf("  %10.0f elements %9.3f ms\n", n, ms);
  std::printf("  fit: %.4f ms + %.3g ms/element; worst error %.1f%%\n", m.update.a, m.update.b,
              100.0 * worst_error(m.update, upd));
  std::printf("batch assembly (%" PRId64 " samples per microbatch):\n", per_mb);
  for (const auto& [k, ms] : load) std::printf("  %3.0f microbatches %9.3f ms\n", k, ms);
}

// Per rank per rep durations -> per rep maximum over the group -> median.
double median_of_max(comm::Communicator& c, const std::vector<double>& mine) {
  const int n = c.size(), me = c.rank();
  if (n == 1) return median(mine);
  std::vector<double> all(mine.size() * static_cast<size_t>(n), 0.0);
  for (size_t r = 0; r < mine.size(); ++r) all[r * static_cast<size_t>(n) + static_cast<size_t>(me)] = mine[r];
  c.allreduce_double(all.data(), all.size());
  std::vector<double> mx(mine.size());
  for (size_t r = 0; r < mine.size(); ++r)
    mx[r] = *std::max_element(all.begin() + static_cast<int64_t>(r) * n, all.begin() + static_cast<int64_t>(r + 1) * n);
  return median(mx);
}

// What the trainer does every step besides the batch and the program, the
// same on every rank: memory statistics, the loss and per-rank figures summed
// over the world, and the stop-signal agreement. Every rank calls it.
double measure_step_fixed(comm::Communicator& world, const MpiEnv& env, int reps) {
  backend::Backend& be = backend::cpu();
  constexpr int kFigures = 12;  // trainer.cpp kRankFigures
  std::vector<double> ts;
  for (int r = 0; r < reps; ++r) {
    world.barrier();
    const auto t0 = Clock::now();
    be.reset_peak();
    double loss = 1.0;
    std::vector<double> figures(static_cast<size_t>(world.size() * kFigures), 0.0);
    const backend::MemoryStats mem = be.memory();
    figures[0] = static_cast<double>(mem.total_peak);
    if (world.size() > 1) {
      world.allreduce_double(&loss, 1);
      world.allreduce_double(figures.data(), figures.size());
    }
    (void)env.any(false);
    ts.push_back(ms_since(t0));
  }
  return median_of_max(world, ts);
}

// ---- ranks sharing a host ----------------------------------------------------------

// How much slower a rank computes while k ranks of its host compute at once
// (shared cores, caches, memory bandwidth, hyperthread siblings): the mean
// over the k ranks of the median time of a forward and fused backward of one
// unit of each kind at the strategy's microbatch, over that time on one rank alone,
// for k = 1 .. the ranks of rank 0's host. Ranks not computing wait in a
// sleeping barrier. Collective over the world; the result is rank 0's host's.
std::vector<double> measure_host_sharing(const config::Config& cfg, const ir::ModelGraph& g, int64_t per_mb,
                                         const Tokens& tok, comm::Communicator& world, bool quick, bool print) {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_size = 1, node_rank = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_rank(node, &node_rank);
  std::vector<int> members(static_cast<size_t>(node_size));
  int me = world.rank();
  MPI_Allgather(&me, 1, MPI_INT, members.data(), 1, MPI_INT, node);
  MPI_Comm_free(&node);
  std::unique_ptr<comm::Communicator> host = world.split(members, "calibrate host");

  // One unit of each kind (embedding, each block kind, head), forward then
  // backward in reverse: the mix of work training does.
  const std::vector<int> units = representatives(g);
  backend::Backend& be = backend::cpu();
  model::ParamStore ps(g, units, be, {});
  ps.init(cfg.train.seed);
  std::vector<std::unique_ptr<model::Unit>> made;
  std::vector<Tensor> copies;
  for (int u : units) {
    made.push_back(training_unit(cfg, g.units[static_cast<size_t>(u)], ps, be));
    copies.push_back(ps.rounded_values(u, training_precision(cfg).storage));
  }
  UnitInputs in(cfg, tok, per_mb, 11);
  const Batch& batch = in.batch;
  const model::MicroBatch mb = batch.mbs.front();
  const size_t last = made.size() - 1;
  auto pass = [&](size_t i, ir::NodeKind p) {
    play_bound(*made[i], ps, units[i], copies[i], p, in.args(be, mb, cfg.model.d_model, p, i == 0, i == last),
               nullptr);
  };
  auto once = [&] {
    const auto t0 = Clock::now();
    for (size_t i = 0; i < made.size(); ++i) pass(i, ir::NodeKind::FWD);
    for (size_t i = made.size(); i-- > 0;) pass(i, ir::NodeKind::BWD);
    return ms_since(t0);
  };
  double reps_d = std::clamp(std::ceil((quick ? 60.0 : 300.0) / std::max(1e-3, (once(), once()))), 3.0, 15.0);
  host->allreduce_double(&reps_d, 1);  // the same count everywhere: the sum over the host
  const int reps = static_cast<int>(reps_d / host->size());

  std::vector<double> slowdown;
  double alone = 0;
  for (int k = 1; k <= host->size(); ++k) {
    host->barrier();
    double med = 0;
    if (host->rank() < k) {
      std::vector<double> ts;
      for (int r = 0; r < reps; ++r) ts.push_back(once());
      med = median(ts);
    }
    host->allreduce_double(&med, 1);
    const double mean = med / k;
    if (k == 1) alone = mean;
    slowdown.push_back(mean / alone);
    if (print)
      std::printf("  %d rank(s) computing at once: %.2f ms per forward + backward of one unit of each kind, %.3f x alone\n",
                  k, mean, slowdown.back());
  }
  ps.zero_grads();
  return slowdown;
}

// ---- communication ----------------------------------------------------------------

struct CommSample {
  sim::CommOp op = sim::CommOp::COMM_P2P;
  int ranks = 2;
  int64_t bytes = 0;
  double ms = 0;
  int reps = 0;
};

// One operation of `bytes` per rank in the DAG's meaning (ir/build.cpp: a
// collective node's bytes are the whole buffer every member holds — the
// bucket's parameters — so allreduce reduces `bytes`, reduce_scatter reads
// `bytes` and writes bytes/n, allgather writes `bytes` from bytes/n; a SEND's
// are the message). Returns this rank's milliseconds until it completes.
double comm_once(comm::Communicator& c, sim::CommOp op, int64_t floats, std::vector<float>& a, std::vector<float>& b) {
  const auto n = static_cast<size_t>(floats), per = n / static_cast<size_t>(c.size());
  const auto t0 = Clock::now();
  switch (op) {
    case sim::CommOp::COMM_P2P:
      if (c.rank() == 0) c.send(a.data(), n, backend::DType::DTYPE_F32, 1, 7);
      if (c.rank() == 1) c.recv(b.data(), n, backend::DType::DTYPE_F32, 0, 7);
      break;
    case sim::CommOp::COMM_ALLREDUCE: c.allreduce(a.data(), n); break;
    case sim::CommOp::COMM_REDUCE_SCATTER: c.reduce_scatter(a.data(), b.data(), per); break;
    case sim::CommOp::COMM_ALLGATHER: c.allgather(a.data(), b.data(), per, backend::DType::DTYPE_F32); break;
    case sim::CommOp::COMM_ALLTOALL: {  // as the dispatch and combine run it: alltoallv, here with equal counts
      const std::vector<int64_t> counts(static_cast<size_t>(c.size()), static_cast<int64_t>(per));
      c.alltoallv(a.data(), counts, b.data(), counts, backend::DType::DTYPE_F32);
      break;
    }
  }
  return ms_since(t0);
}

// `ops` at `sizes` over `c`. Every member of `c` calls it with the same arguments.
std::vector<CommSample> measure_comm(comm::Communicator& c, const std::vector<sim::CommOp>& ops,
                                     const std::vector<int64_t>& sizes, const Effort& effort) {
  std::vector<CommSample> out;
  const int n = c.size();
  for (sim::CommOp op : ops)
    for (int64_t bytes : sizes) {
      // Whole blocks per rank for the sharded collectives and the all-to-all.
      const int64_t floats = op == sim::CommOp::COMM_P2P || op == sim::CommOp::COMM_ALLREDUCE
                                 ? bytes / 4
                                 : std::max<int64_t>(1, bytes / 4 / n) * n;
      std::vector<float> a(static_cast<size_t>(floats), 1.0f), b(static_cast<size_t>(floats), 0.0f);
      c.barrier();
      comm_once(c, op, floats, a, b);  // warm-up: connections, registration
      c.barrier();
      std::vector<double> est{comm_once(c, op, floats, a, b)};
      const int reps = effort.reps_for(median_of_max(c, est));  // the same on every member
      std::vector<double> ts;
      for (int r = 0; r < reps; ++r) {
        c.barrier();
        ts.push_back(comm_once(c, op, floats, a, b));
      }
      out.push_back({op, n, floats * 4, median_of_max(c, ts), reps});
    }
  return out;
}

std::vector<sim::CommCost> fit_comm(const std::vector<CommSample>& samples, bool print) {
  std::vector<sim::CommCost> out;
  for (size_t i = 0; i < samples.size();) {
    size_t j = i;
    Points p;
    for (; j < samples.size() && samples[j].op == samples[i].op && samples[j].ranks == samples[i].ranks; ++j)
      p.emplace_back(static_cast<double>(samples[j].bytes), samples[j].ms);
    sim::CommCost c{samples[i].op, samples[i].ranks, fit_minimax(p), p};
    if (print) {
      double at = 0.0;
      const double e = worst_error(c.t, p, &at);
      std::printf("  fit %s over %d: %.4f ms + %.4f ms/MiB; worst error %.1f%% at %.0f bytes\n",
                  sim::comm_op_name(c.op), c.ranks, c.t.a, c.t.b * 1024.0 * 1024.0, 100.0 * e, at);
    }
    out.push_back(c);
    i = j;
  }
  return out;
}

// The all-to-all a config's plan runs: whether the model has MoE blocks, the
// ep group size, and the distinct sizes of the DAG's ALLTOALL nodes (bytes
// per rank, as a node's `bytes`: the counts exchange and the rows moved).
struct AllToAllNeed {
  bool moe = false;
  int ep = 1;
  std::vector<int64_t> bytes;  // ascending
};

AllToAllNeed alltoall_need(const ir::ModelGraph& g, const ir::Strategy& s) {
  AllToAllNeed need;
  need.moe = std::any_of(g.units.begin(), g.units.end(), [](const ir::UnitSpec& u) { return u.kind == ir::UnitKind::UNIT_MOE; });
  need.ep = s.shard.ep;
  if (need.ep <= 1) return need;
  const ir::Graph dag = ir::build(g, s);
  for (const ir::Node& n : dag.nodes())
    if (n.kind == ir::NodeKind::ALLTOALL) need.bytes.push_back(n.bytes);
  std::sort(need.bytes.begin(), need.bytes.end());
  need.bytes.erase(std::unique(need.bytes.begin(), need.bytes.end()), need.bytes.end());
  return need;
}

// Every collective (and p2p in a group of 2) over the first 2, 4, ... and all
// ranks of the world, 4 KiB to 64 MiB; for a model with MoE blocks also the
// all-to-all over those groups and the ep group, at those sizes and the DAG's
// ALLTOALL sizes. Every rank calls it; fitted on rank 0.
std::vector<sim::CommCost> measure_all_comm(comm::Communicator& world, const AllToAllNeed& a2a, bool quick, bool print) {
  std::vector<int> collective_groups;
  for (int s = 2; s < world.size(); s *= 2) collective_groups.push_back(s);
  collective_groups.push_back(world.size());
  std::vector<int> groups = collective_groups;
  if (a2a.moe && a2a.ep > 1 && a2a.ep <= world.size()) groups.push_back(a2a.ep);
  std::sort(groups.begin(), groups.end());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  std::vector<int64_t> bytes;
  for (int64_t b = 4 << 10; b <= (int64_t{64} << 20); b *= 4) bytes.push_back(b);
  if (quick) bytes = {4 << 10, 256 << 10, 4 << 20};
  std::vector<int64_t> a2a_bytes = bytes;
  a2a_bytes.insert(a2a_bytes.end(), a2a.bytes.begin(), a2a.bytes.end());
  std::sort(a2a_bytes.begin(), a2a_bytes.end());
  a2a_bytes.erase(std::unique(a2a_bytes.begin(), a2a_bytes.end()), a2a_bytes.end());
  if (print && a2a.moe && a2a.ep > world.size())
    std::printf("piper calibrate: the strategy has ep %d but the job %d rank(s); all-to-all measured over at most %d "
                "(simulate scales the nearest; run calibrate on %d ranks to measure it)\n",
                a2a.ep, world.size(), world.size(), a2a.ep);
  const Effort effort = quick ? Effort{30.0, 3, 5} : Effort{300.0, 5, 20};
  std::vector<CommSample> samples;
  for (int s : groups) {
    std::vector<int> members(static_cast<size_t>(s));
    for (int r = 0; r < s; ++r) members[static_cast<size_t>(r)] = r;
    std::unique_ptr<comm::Communicator> group = world.split(members, "calibrate");
    if (group) {
      std::vector<sim::CommOp> ops;
      if (std::count(collective_groups.begin(), collective_groups.end(), s)) {
        if (s == 2) ops.push_back(sim::CommOp::COMM_P2P);
        ops.insert(ops.end(), {sim::CommOp::COMM_ALLREDUCE, sim::CommOp::COMM_REDUCE_SCATTER, sim::CommOp::COMM_ALLGATHER});
      }
      std::vector<CommSample> got = measure_comm(*group, ops, bytes, effort);
      if (a2a.moe) {
        const std::vector<CommSample> all = measure_comm(*group, {sim::CommOp::COMM_ALLTOALL}, a2a_bytes, effort);
        got.insert(got.end(), all.begin(), all.end());
      }
      samples.insert(samples.end(), got.begin(), got.end());
    }
    world.barrier();
  }
  if (world.rank() != 0) return {};
  if (print) {
    std::printf("communication (ms until complete on every member, median over reps of the max over ranks):\n");
    std::printf("  op              ranks        bytes         ms  reps\n");
    for (const CommSample& c : samples)
      std::printf("  %-15s %5d %12" PRId64 " %10.4f %5d\n", sim::comm_op_name(c.op), c.ranks, c.bytes, c.ms, c.reps);
  }
  return fit_comm(samples, print);
}

// ---- the machine ------------------------------------------------------------------

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown CPU";
}

// 1, 2, 4, ... up to the first power of two >= mb, and once beyond; mb itself
// too. Quick: 1, mb, 2 mb.
std::vector<int64_t> batch_sizes(int64_t mb, bool quick) {
  std::vector<int64_t> b{1, mb, 2 * mb};
  if (!quick) {
    int64_t p = 1;
    for (; p < mb; p *= 2) b.push_back(p);
    b.push_back(p);
    b.push_back(2 * p);
  }
  std::sort(b.begin(), b.end());
  b.erase(std::unique(b.begin(), b.end()), b.end());
  return b;
}

// Validates the config for the world size its own strategy needs.
int strategy_world(const config::Config& cfg, int job_world) {
  const config::ParallelConfig p = config::effective_strategy(cfg).parallel;
  const int w = p.dp >= 1 && p.tp >= 1 && p.pp >= 1 ? static_cast<int>(p.dp * p.tp * p.pp) : job_world;
  ir::validate(cfg, w);
  return w;
}

}  // namespace

sim::CostModel calibrate(const config::Config& cfg, const CalibrateOptions& opts, const MpiEnv& env) {
  const bool lead = env.rank() == 0, print = lead && !opts.quiet;
  const int world_s = strategy_world(cfg, env.world_size());
  if (cfg.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg.train.threads));
  backend::cpu().set_matmul_precision(training_precision(cfg).products);
  const ir::Strategy strategy = ir::expand(cfg, world_s);
  const ir::ModelGraph graph = ir::make_model_graph(cfg.model);
  const int64_t T = cfg.train.seq_len;
  const int n_mb = strategy.split.microbatches;
  const int64_t per_mb = cfg.train.global_batch / strategy.replicate.dp / n_mb;  // samples per microbatch
  const int tp = strategy.shard.tp;

  Effort effort;  // per shape: ~600 ms, 5 to 15 repetitions; quick: ~80 ms, 3 to 9
  if (opts.quick) effort = {80.0, 3, 9};
  std::string note;
  const Tokens tokens = open_tokens(cfg, &note);
  if (lead && !note.empty()) std::printf("piper calibrate: %s\n", note.c_str());

  // Ranks not measuring wait in a barrier (it sleeps, leaving the cores to the
  // measuring ranks) for as long as the compute measurements take.
  comm::CommOptions copts;
  copts.timeout_s = std::max(cfg.parallel.comm_timeout_s, 3600.0);
  std::unique_ptr<comm::Communicator> world = comm::make_mpi_world(copts);

  sim::CostModel m;
  m.source = "calibrate";
  m.threads_per_rank = omp_get_max_threads();
  m.host_cores = static_cast<int>(std::thread::hardware_concurrency());
  m.hardware = "x86-64 " + cpu_model() + ", " + std::to_string(m.host_cores) + " cores, BLAS " +
               kernels::blas_name() + ", " + std::to_string(m.threads_per_rank) + " thread(s) per rank";
  if (print)
    std::printf("piper calibrate: %s; pattern %s, microbatch %" PRId64 " x %" PRId64 " rows, %d rank(s)%s\n",
                m.hardware.c_str(), cfg.model.pattern.c_str(), per_mb, T, env.world_size(),
                opts.quick ? ", quick" : "");
  const std::vector<int64_t> batches = batch_sizes(per_mb, opts.quick);

  // Compute at tp 1, the optimiser and the batch assembly: rank 0 alone.
  if (lead) {
    const std::vector<KindSamples> units = measure_units(cfg, graph, batches, per_mb, {}, tokens, effort);
    std::vector<sim::OpCost> fits;
    for (const KindSamples& ks : units) fits.push_back(fit_op(ks, 1, per_mb * T));
    if (print) print_units(units, fits, 1);
    m.ops = fits;

    measure_update_and_batches(m, graph, tokens, per_mb, n_mb, T, opts.quick, effort, print);
  }
  world->barrier();

  // Compute at the strategy's tp degree, on the first tp ranks together.
  if (tp > 1 && env.world_size() >= tp) {
    std::vector<int> members(static_cast<size_t>(tp));
    for (int r = 0; r < tp; ++r) members[static_cast<size_t>(r)] = r;
    std::unique_ptr<comm::Communicator> group = world->split(members, "calibrate tp");
    if (group) {
      const std::vector<KindSamples> units =
          measure_units(cfg, graph, batches, per_mb, {group->rank(), tp, group.get()}, tokens, effort);
      std::vector<sim::OpCost> fits;
      for (const KindSamples& ks : units) fits.push_back(fit_op(ks, tp, per_mb * T));
      if (print) print_units(units, fits, tp);
      if (lead) m.ops.insert(m.ops.end(), fits.begin(), fits.end());
    }
    world->barrier();
  } else if (print && tp > 1) {
    std::printf("piper calibrate: the strategy has tp %d but the job %d rank(s); measured tp 1 only\n", tp,
                env.world_size());
  }

  // Ranks of one host computing at once.
  if (print) std::printf("ranks of this host computing at once (the simulator's --ranks-per-host):\n");
  const std::vector<double> sharing = measure_host_sharing(cfg, graph, per_mb, tokens, *world, opts.quick, print);
  if (lead) m.host_slowdown = sharing;

  // What every step costs besides the batch: on every rank, with the world.
  const double fixed = measure_step_fixed(*world, env, opts.quick ? 3 : 15);
  if (lead) {
    m.step_overhead.a += fixed;
    if (print)
      std::printf("  per-step statistics and agreement over %d rank(s): %.3f ms\n  fit: %.4f ms + %.4f ms/microbatch\n",
                  env.world_size(), fixed, m.step_overhead.a, m.step_overhead.b);
  }

  // Communication over groups of 2, 4, ... and all ranks.
  if (env.world_size() > 1) {
    std::vector<sim::CommCost> comm = measure_all_comm(*world, alltoall_need(graph, strategy), opts.quick, print);
    if (lead) m.comm = std::move(comm);
  }
  std::fflush(stdout);
  return m;
}

}  // namespace piper::runtime
