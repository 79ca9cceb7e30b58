// search.cpp — the tuner's search: candidates of the outer search, their
// closed-form bounds, the inner phases and the baselines (docs/tuner.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <limits>
#include <map>

#include "ir/compile.hpp"
#include "ir/placement.hpp"
#include "ir/validate.hpp"
#include "ir/work.hpp"
#include "tune/tune.hpp"

namespace piper::tune {

namespace {

using ir::Recompute;
using ir::ScheduleKind;
using Clock = std::chrono::steady_clock;

constexpr int kMaxVirtualStages = 4;       // interleaved chunks per rank tried
constexpr int kPartitionRounds = 16;       // moves of the partition phase per candidate, at most
constexpr int kOrderRounds = 8;            // rounds of the order phase, at most
constexpr int kRefined = 4;                // candidates of the outer search given the inner phases
// A candidate whose probe would play more instructions is left out (a step of so many
// microbatches that its bubble is already small, and whose simulation would take seconds).
constexpr double kMaxProbeInstructions = double{1 << 21};
constexpr double kImproves = 1e-6;         // a change counts when the step shortens by more than this share
constexpr std::array<Recompute, 3> kRecompute = {Recompute::RECOMPUTE_NONE, Recompute::RECOMPUTE_SELECTIVE,
                                                 Recompute::RECOMPUTE_FULL};

std::vector<int> divisors(int64_t n) {
  std::vector<int> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(static_cast<int>(i));
  return d;
}

// Which units form each stage, which rank holds each stage, and a hand-written order (empty: the
// schedule's own), as the search edits them.
struct Layout {
  std::vector<int> stage_of_unit;
  std::vector<int> rank_of_stage;
  std::vector<std::vector<ir::PipeOp>> custom;
  bool operator==(const Layout&) const = default;
};

// A candidate's config at `world` ranks: the shorthand set to its degrees, no directives.
config::Config config_for(const config::Config& base, const Degrees& d, int dp, int64_t global_batch) {
  config::Config c = base;
  config::ParallelConfig& p = c.parallel;
  p.tp = d.tp, p.pp = d.pp, p.dp = dp, p.ep = d.ep, p.zero = d.zero;
  p.microbatches = d.microbatches;
  p.schedule = ir::schedule_name(d.schedule);
  p.virtual_stages = d.schedule == ScheduleKind::SCHEDULE_INTERLEAVED ? d.virtual_stages : 1;
  p.pairs = d.pairs;
  p.split_backward = false;
  p.recompute = ir::recompute_name(d.recompute);
  c.directives = {};
  c.train.global_batch = global_batch;
  return c;
}

int chunks_of(const Degrees& d) { return ir::schedule_chunks(d.schedule, d.virtual_stages); }

// Megatron's split: the blocks in equal runs over the stages (the first ones one longer when they
// do not divide), the embedding with the first and the head with the last.
std::vector<int> uniform_stages(int units, int stages) {
  const int blocks = units - 2;
  std::vector<int> st(static_cast<size_t>(units), 0);
  int b = 0;
  for (int s = 0; s < stages; ++s) {
    const int n = blocks / stages + (s < blocks % stages ? 1 : 0);
    for (int i = 0; i < n; ++i) st[static_cast<size_t>(1 + b++)] = s;
  }
  st.back() = stages - 1;
  return st;
}

// Per unit and microbatch, milliseconds (Search::unit_times).
struct UnitTimes {
  std::vector<double> f, bi, w, total;
};

// The contiguous partition of the units over `stages` stages, one per pipeline rank in order,
// that minimises the longest rank's bound (Search::lower_bound), and that bound: rank s waits for
// the first forward through the stages before it, runs its microbatches' work, and then the last
// microbatch's input gradients still pass the stages before it, less its deferrable weight
// gradients.
std::pair<std::vector<int>, double> pipeline_partition(const UnitTimes& t, int stages, int mb) {
  const int n = static_cast<int>(t.total.size());
  std::vector<double> F(n + 1, 0.0), BI(n + 1, 0.0), W(n + 1, 0.0), T(n + 1, 0.0);
  for (int u = 0; u < n; ++u) {
    F[u + 1] = F[u] + t.f[static_cast<size_t>(u)], BI[u + 1] = BI[u] + t.bi[static_cast<size_t>(u)];
    W[u + 1] = W[u] + t.w[static_cast<size_t>(u)], T[u + 1] = T[u] + t.total[static_cast<size_t>(u)];
  }
  const auto rank_bound = [&](int c, int e) {  // the stage of units [c, e)
    return F[c] + mb * (T[e] - T[c]) + std::max(0.0, BI[c] - mb * (W[e] - W[c]));
  };
  ir::Partition p = ir::min_max_partition(n, stages, rank_bound);
  return {std::move(p.stage_of), p.most};
}

class Search {
 public:
  explicit Search(const Request& req) : req_(req), t0_(Clock::now()), model_(ir::make_model_graph(req.cfg.model)) {}

  Result run();

 private:
  // The plan the simulator plays for a candidate: its degrees at a data-parallel degree of 2 (or
  // ep) standing for all replicas (SimOptions::replicas), or at the full world.
  struct Probe {
    config::Config cfg;
    int world = 1;
    int replicas = 1;
  };
  struct Shape {
    Degrees d;        // zero 0, no recomputation
    double lb[3];     // closed-form lower bound of the step per recomputation mode
    int order = 0;    // enumeration order, the tie-break
  };

  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  bool out_of_time() {
    if (elapsed() < req_.time_budget_s) return false;
    budget_hit_ = true;
    return true;
  }
  void report(const std::string& phase) {
    if (!req_.progress) return;
    Progress p;
    p.candidates_done = done_, p.candidates = static_cast<int>(shapes_.size());
    p.simulations = sims_, p.elapsed_s = elapsed(), p.phase = phase;
    if (best_) p.best_ms = best_->step_ms, p.best = best_->label;
    req_.progress(p);
  }

  int64_t batch() const { return req_.cfg.train.global_batch; }
  bool valid(const Degrees& d) const;
  void enumerate();
  Probe probe_for(const Degrees& d) const;
  double probe_instructions(const Degrees& d) const;
  int64_t rows(const Degrees& d) const { return batch() / (d.dp * d.microbatches) * req_.cfg.train.seq_len; }
  UnitTimes unit_times(const Degrees& d) const;
  double lower_bound(const Degrees& d, Recompute r) const;
  double state_lower_bound(const Degrees& d) const;
  ir::Strategy strategy(const Degrees& d, const Layout& l, const config::Config& cfg, int world) const;
  std::optional<Evaluated> evaluate(const Degrees& d, const Layout& l, const std::string& how);
  Evaluated finish(const Degrees& d, const Layout& l, const std::string& how, const sim::SimResult& r) const;
  void measure(Evaluated& e, const sim::SimResult& r) const;
  void at_full_world(Evaluated& e);
  bool fits(const Evaluated& e) const { return e.peak_mem_bytes <= req_.mem_limit_bytes; }
  Layout balanced(const Degrees& d) const;
  Layout uniform(const Degrees& d) const;
  void consider(const Evaluated& e, std::optional<Evaluated>& slot) {
    if (fits(e) && (!slot || e.step_ms < slot->step_ms * (1 - kImproves))) slot = e;
  }
  void outer();
  std::optional<Baseline> baseline_of(const Degrees& d) const;
  double partition_bound(const Degrees& d, const Layout& l) const;
  Evaluated refine(Evaluated e, Layout l);
  std::optional<Evaluated> partition_phase(Evaluated& e, Layout& l);
  std::optional<Evaluated> order_phase(Evaluated& e, Layout& l);
  [[noreturn]] void nothing_fits();

  const Request& req_;
  Clock::time_point t0_;
  ir::ModelGraph model_;
  std::vector<Shape> shapes_;
  std::string invalid_why_;  // why the plainest grid (tp 1, pp 1) was refused
  int done_ = 0, sims_ = 0;
  bool budget_hit_ = false;
  std::optional<Evaluated> best_;
  std::array<std::optional<Evaluated>, kBaselines> baselines_;
  // Fitting candidates of the outer search with their layouts, for the inner phases.
  std::vector<std::pair<Evaluated, Layout>> fitting_;
  std::optional<Evaluated> smallest_;  // the least memory of any simulated candidate
};

bool Search::valid(const Degrees& d) const {
  try {
    ir::validate(config_for(req_.cfg, d, d.dp, batch()), req_.world);
    return true;
  } catch (const config::ConfigError&) {
    return false;
  }
}

// Every shape of the outer search the rules allow: degrees, microbatches, schedule, virtual stages.
void Search::enumerate() {
  const int W = req_.world;
  const int units = static_cast<int>(model_.units.size());
  const bool moe = req_.cfg.model.n_experts > 0;
  for (int tp : divisors(W)) {
    if (tp > kMaxTp) continue;
    for (int pp : divisors(W / tp)) {
      const int dp = W / (tp * pp);
      if (batch() % dp != 0 || pp > units) continue;
      for (int ep : moe ? divisors(dp) : std::vector<int>{1}) {
        if (moe && req_.cfg.model.n_experts % ep != 0) continue;
        for (int mb : divisors(batch() / dp)) {
          std::vector<Degrees> kinds;
          Degrees d{.tp = tp, .pp = pp, .dp = dp, .ep = ep, .microbatches = mb};
          kinds.push_back(d);  // 1f1b (at pp 1: gradient accumulation over the microbatches)
          if (pp > 1) {
            for (int v = 2; v <= kMaxVirtualStages && pp * v <= units; ++v) {
              Degrees i = d;
              i.schedule = ScheduleKind::SCHEDULE_INTERLEAVED, i.virtual_stages = v;
              kinds.push_back(i);
            }
            Degrees z = d;
            z.schedule = ScheduleKind::SCHEDULE_ZBH1;
            kinds.push_back(z);
            for (bool pairs : {false, true}) {
              Degrees v = d;
              v.schedule = ScheduleKind::SCHEDULE_DUALPIPEV, v.virtual_stages = 2, v.pairs = pairs;
              kinds.push_back(v);
            }
          }
          for (const Degrees& k : kinds) {
            if (pp * chunks_of(k) > units) continue;  // a stage holds at least one unit
            if (probe_instructions(k) > kMaxProbeInstructions) continue;
            if (!valid(k)) {
              if (tp == 1 && pp == 1 && invalid_why_.empty()) {
                try {
                  ir::validate(config_for(req_.cfg, k, k.dp, batch()), W);
                } catch (const config::ConfigError& e) {
                  invalid_why_ = e.what();
                }
              }
              continue;
            }
            Shape s{.d = k, .lb = {}, .order = static_cast<int>(shapes_.size())};
            for (size_t r = 0; r < kRecompute.size(); ++r) s.lb[r] = lower_bound(k, kRecompute[r]);
            shapes_.push_back(s);
          }
        }
      }
    }
  }
}

Search::Probe Search::probe_for(const Degrees& d) const {
  Probe p;
  int dp = d.dp;
  if (req_.ranks_per_host <= 1) {
    const int want = std::max(2, d.ep);
    if (d.dp > want && d.dp % want == 0) dp = want;
  }
  p.replicas = d.dp / dp;
  p.world = d.tp * d.pp * dp;
  p.cfg = config_for(req_.cfg, d, dp, batch() / p.replicas);
  return p;
}

// About how many instructions the probe's ranks play: each rank runs its share of the units'
// passes (forward, two backward halves) for every microbatch, with as many communication
// instructions again.
double Search::probe_instructions(const Degrees& d) const {
  const Probe p = probe_for(d);
  return static_cast<double>(p.world) * static_cast<double>(model_.units.size()) / d.pp * d.microbatches * 6;
}

// Each unit's time per microbatch at the candidate's degrees: its forward, the part of its
// backward a microbatch's gradient waits for on its way down (the input gradients, the
// recomputation before them; all of a fused backward), the weight gradients a zero-bubble
// schedule may defer, and their sum.
UnitTimes Search::unit_times(const Degrees& d) const {
  const sim::CostModel& c = req_.cost;
  const int64_t r = rows(d);
  const bool split = d.schedule == ScheduleKind::SCHEDULE_ZBH1 || d.schedule == ScheduleKind::SCHEDULE_DUALPIPEV;
  UnitTimes t;
  for (const ir::UnitSpec& u : model_.units) {
    const char k = ir::unit_symbol(u.kind);
    const double f = std::max(0.0, c.compute_ms(k, ir::Pass::PASS_F, d.tp, r));
    double bi = std::max(0.0, c.compute_ms(k, split ? ir::Pass::PASS_BI : ir::Pass::PASS_B, d.tp, r));
    const double bw = split ? std::max(0.0, c.compute_ms(k, ir::Pass::PASS_BW, d.tp, r)) : 0.0;
    if (u.block >= 0 && d.recompute != Recompute::RECOMPUTE_NONE && u.kind != ir::UnitKind::UNIT_MOE)
      bi += ir::recompute_share(req_.cfg.model, k, d.recompute, r, req_.cfg.train.seq_len, d.tp).time * f;
    t.f.push_back(f), t.bi.push_back(bi), t.w.push_back(bw), t.total.push_back(f + bi + bw);
  }
  return t;
}

// No step at these degrees is shorter, whatever the partition and the order: one pipeline's
// compute over all microbatches spread evenly over its ranks, and for one chunk per rank, the
// least over partitions of the longest rank's wait for the first forward to reach it, its work,
// and the input gradients of the last microbatch still to pass the stages before it (less what
// of its weight gradients could fill that time) — 1F1B's (pp - 1) (F + B) bubble at equal stages.
double Search::lower_bound(const Degrees& d, Recompute r) const {
  Degrees x = d;
  x.recompute = r;
  const UnitTimes t = unit_times(x);
  double sum = 0;
  for (double v : t.total) sum += v;
  double bound = sum * d.microbatches / d.pp;
  if (chunks_of(d) == 1 && d.pp > 1) bound = std::max(bound, pipeline_partition(t, d.pp, d.microbatches).second);
  return bound + std::max(0.0, req_.cost.step_overhead.at(d.microbatches));
}

// No rank holds less than the pipeline's parameters, gradients and moments, as the parameter
// store and the optimiser keep them (ir::flat_parts, zero_shards), and one microbatch's saved
// activations (the cost model's, less what recomputation drops), spread evenly over its stages.
double Search::state_lower_bound(const Degrees& d) const {
  const ir::Degrees n{.tp = d.tp, .ep = d.ep, .dp = d.dp, .pp = d.pp};
  double bytes = 0;
  for (const ir::UnitSpec& u : model_.units) {
    int64_t shard = 0, padded = 0;
    for (const ir::FlatPart& p : ir::flat_parts(u, n, {})) shard += p.zero.len, padded += p.zero.padded;
    const auto kept = [&](ir::ZeroState s) { return static_cast<double>(ir::zero_shards(d.zero, s) ? shard : padded); };
    bytes += 4 * kept(ir::ZeroState::ZERO_PARAMS) + 4 * kept(ir::ZeroState::ZERO_GRADS) +
             8 * kept(ir::ZeroState::ZERO_MOMENTS);
    const char k = ir::unit_symbol(u.kind);
    const int64_t r = rows(d);
    double dropped = 0;
    if (u.block >= 0 && d.recompute != Recompute::RECOMPUTE_NONE && u.kind != ir::UnitKind::UNIT_MOE)
      dropped = ir::recompute_share(req_.cfg.model, k, d.recompute, r, req_.cfg.train.seq_len, d.tp,
                                    config::storage_bytes(config::precision_of(req_.cfg.train)))
                    .saved;
    const sim::OpCost& oc = req_.cost.op(k, d.tp);  // an entry of another tp splits its rows as the work
    const double at = static_cast<double>(r) * (oc.tp == d.tp ? 1.0 : static_cast<double>(oc.tp) / d.tp);
    bytes += std::max(0.0, oc.saved.at(at)) * (1 - dropped);
  }
  return bytes / d.pp;
}

ir::Strategy Search::strategy(const Degrees& d, const Layout& l, const config::Config& cfg, int world) const {
  ir::Strategy s = ir::expand(cfg, world);
  s.place.stage_of_unit = l.stage_of_unit;
  if (!l.custom.empty()) {
    s.order.custom = l.custom;
    s.order.chunks = chunks_of(d);
    s.order.schedule = ScheduleKind::SCHEDULE_1F1B;  // a hand-written order leaves the named one at its default
    s.order.pairs = false;
    s.place.virtual_stages = chunks_of(d);
    s.place.rank_of_stage = l.rank_of_stage;
  }
  return s;
}

Evaluated Search::finish(const Degrees& d, const Layout& l, const std::string& how, const sim::SimResult& r) const {
  Evaluated e;
  e.degrees = d;
  e.label = degrees_label(d) + ", " + how;
  e.strategy = strategy(d, l, config_for(req_.cfg, d, d.dp, batch()), req_.world);
  measure(e, r);
  return e;
}

void Search::measure(Evaluated& e, const sim::SimResult& r) const {
  e.step_ms = r.step_ms;
  e.bubble = r.bubble;
  double compute = 0;
  for (const sim::RankResult& rr : r.ranks) {
    e.exposed_comm_ms = std::max(e.exposed_comm_ms, rr.comm_ms);
    e.peak_mem_bytes = std::max(e.peak_mem_bytes, rr.peak_total);
    compute += rr.compute_ms;
  }
  e.lower_bound_ms = compute / static_cast<double>(r.ranks.size()) +
                     std::max(0.0, req_.cost.step_overhead.at(e.degrees.microbatches));
}

// The figures of a result from its plan at the full world, every rank played: what the written
// config runs (the search's probes stand for the replicas they leave out, SimOptions::replicas).
void Search::at_full_world(Evaluated& e) {
  if (probe_for(e.degrees).replicas == 1) return;
  sim::SimOptions o;
  o.ranks_per_host = req_.ranks_per_host;
  ++sims_;
  measure(e, sim::simulate(ir::compile(req_.cfg.model, e.strategy), degrees_config(req_.cfg, e.degrees), req_.cost, o));
}

// One simulation of a candidate; nullopt when its order does not verify (a deadlock) or its
// degrees do not build.
std::optional<Evaluated> Search::evaluate(const Degrees& d, const Layout& l, const std::string& how) {
  const Probe p = probe_for(d);
  ir::Plan plan;
  try {
    plan = ir::compile(p.cfg.model, strategy(d, l, p.cfg, p.world));
  } catch (const ir::BuildError&) {
    return std::nullopt;
  } catch (const ir::VerifyError&) {
    return std::nullopt;
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  sim::SimOptions o;
  o.replicas = p.replicas;
  o.ranks_per_host = req_.ranks_per_host;
  ++sims_;
  Evaluated e = finish(d, l, how, sim::simulate(plan, p.cfg, req_.cost, o));
  if (!smallest_ || e.peak_mem_bytes < smallest_->peak_mem_bytes) smallest_ = e;
  return e;
}

// Stages balanced by each unit's time on the cost model: with one chunk per rank, the partition
// of the least pipeline bound (the later stages wait longer for their first forward, and the
// earlier ones for the last backward); with more, the least longest stage.
Layout Search::balanced(const Degrees& d) const {
  const UnitTimes t = unit_times(d);
  if (chunks_of(d) == 1) return {pipeline_partition(t, d.pp, d.microbatches).first, {}, {}};
  return {ir::balance_stages(t.total, d.pp * chunks_of(d)), {}, {}};
}

Layout Search::uniform(const Degrees& d) const {
  return {uniform_stages(static_cast<int>(model_.units.size()), d.pp * chunks_of(d)), {}, {}};
}

// The outer search: shapes by their lower bound, each with the least recomputation and the lowest
// ZeRO stage that fit (more of either only adds work). A shape is simulated with the partition by
// simulated cost while its bound is below the best step found, and with the uniform partition
// while the bound of that partition is below the best of its baseline; the search ends when no
// shape's bound is below any of them.
void Search::outer() {
  std::vector<const Shape*> order;
  for (const Shape& s : shapes_) order.push_back(&s);
  std::stable_sort(order.begin(), order.end(), [](const Shape* a, const Shape* b) { return a->lb[0] < b->lb[0]; });
  const auto below = [](const std::optional<Evaluated>& e, double lb) { return !e || lb < e->step_ms; };
  const auto beaten = [&](double lb) {
    if (below(best_, lb)) return false;
    for (const auto& b : baselines_)
      if (below(b, lb)) return false;
    return true;
  };
  for (const Shape* s : order) {
    if (beaten(s->lb[0]) || out_of_time()) break;
    const Degrees& base = s->d;
    const std::optional<Baseline> kind = baseline_of(base);
    std::optional<Evaluated>* slot = kind ? &baselines_[static_cast<size_t>(*kind)] : nullptr;
    ++done_;
    report("outer");
    for (size_t r = 0; r < kRecompute.size() && !out_of_time(); ++r) {
      Degrees d = base;
      d.recompute = kRecompute[r];
      const Layout bal = balanced(d), uni = uniform(d);
      const bool pipeline = base.pp > 1;
      bool tuned = below(best_, std::max(s->lb[r], partition_bound(d, bal)));
      bool baseline = pipeline && slot && below(*slot, std::max(s->lb[r], partition_bound(d, uni)));
      if (!tuned && !baseline) break;  // more recomputation only adds work
      for (int zero = 0; zero <= (base.dp > 1 ? 3 : 0) && (tuned || baseline) && !out_of_time(); ++zero) {
        d.zero = zero;
        if (state_lower_bound(d) > req_.mem_limit_bytes || !valid(d)) continue;
        std::optional<Evaluated> e;
        if (tuned) {
          e = evaluate(d, bal, pipeline ? "partition by simulated cost" : "no pipeline");
          if (e && fits(*e)) {
            tuned = false;
            consider(*e, best_);
            fitting_.push_back({*e, bal});
            if (!pipeline && slot) consider(*e, *slot);
          }
        }
        if (baseline) {
          std::optional<Evaluated> u = uni == bal && e ? e : evaluate(d, uni, "uniform partition");
          if (u && fits(*u)) {
            baseline = false;
            consider(*u, *slot);
            consider(*u, best_);
          }
        }
      }
    }
  }
}

// The baseline whose schedule a shape runs: none for ZB-H1.
std::optional<Baseline> Search::baseline_of(const Degrees& d) const {
  if (d.pp == 1) return Baseline::BASELINE_NO_PIPELINE;
  switch (d.schedule) {
    case ScheduleKind::SCHEDULE_INTERLEAVED: return Baseline::BASELINE_INTERLEAVED;
    case ScheduleKind::SCHEDULE_1F1B: return Baseline::BASELINE_1F1B;
    case ScheduleKind::SCHEDULE_DUALPIPEV: return Baseline::BASELINE_DUALPIPEV;
    default: return std::nullopt;
  }
}

// No step of this partition and placement is shorter, whatever the order: each rank waits for
// the first forward to reach its lowest stage, runs its work, and after its last backward there
// only its weight gradients can fill the time the last microbatch's input gradients take
// through the stages below (Search::lower_bound's rank bound, for any placement).
double Search::partition_bound(const Degrees& d, const Layout& l) const {
  if (d.pp < 2) return 0;
  const UnitTimes t = unit_times(d);
  const int stages = d.pp * chunks_of(d);
  const std::vector<int> rank_of = !l.rank_of_stage.empty() ? l.rank_of_stage
                                   : d.schedule == ScheduleKind::SCHEDULE_DUALPIPEV
                                       ? ir::v_placement(d.pp)
                                       : ir::loop_placement(d.pp, chunks_of(d));
  std::vector<double> f(static_cast<size_t>(stages)), bi(f.size()), w(f.size()), work(f.size());
  for (size_t u = 0; u < t.total.size(); ++u) {
    const size_t s = static_cast<size_t>(l.stage_of_unit[u]);
    f[s] += t.f[u], bi[s] += t.bi[u], w[s] += t.w[u], work[s] += t.total[u];
  }
  std::vector<double> rank_work(static_cast<size_t>(d.pp)), rank_w(rank_work.size());
  std::vector<int> lowest(rank_work.size(), stages);
  for (int s = 0; s < stages; ++s) {
    const size_t r = static_cast<size_t>(rank_of[static_cast<size_t>(s)]);
    rank_work[r] += work[static_cast<size_t>(s)], rank_w[r] += w[static_cast<size_t>(s)];
    lowest[r] = std::min(lowest[r], s);
  }
  double bound = 0;
  for (size_t r = 0; r < rank_work.size(); ++r) {
    double before_f = 0, before_bi = 0;
    for (int s = 0; s < lowest[r]; ++s) before_f += f[static_cast<size_t>(s)], before_bi += bi[static_cast<size_t>(s)];
    const int m = d.microbatches;
    bound = std::max(bound, before_f + m * rank_work[r] + std::max(0.0, before_bi - m * rank_w[r]));
  }
  return bound + std::max(0.0, req_.cost.step_overhead.at(d.microbatches));
}

// Partition: move a unit off the stage of the longest time (or of the most memory while the limit
// is exceeded) onto its neighbour, keeping the best move, until none shortens the step.
std::optional<Evaluated> Search::partition_phase(Evaluated& e, Layout& l) {
  const Degrees& d = e.degrees;
  const int stages = d.pp * chunks_of(d);
  if (stages < 2) return std::nullopt;
  const std::vector<double> t = unit_times(d).total;
  std::optional<Evaluated> improved;
  for (int round = 0; round < kPartitionRounds && !out_of_time(); ++round) {
    std::vector<double> stage_ms(static_cast<size_t>(stages), 0.0);
    for (size_t u = 0; u < t.size(); ++u) stage_ms[static_cast<size_t>(l.stage_of_unit[u])] += t[u];
    // Stages from the longest down: the first two give the moves tried.
    std::vector<int> by_time(static_cast<size_t>(stages));
    for (int s = 0; s < stages; ++s) by_time[static_cast<size_t>(s)] = s;
    std::stable_sort(by_time.begin(), by_time.end(),
                     [&](int a, int b) { return stage_ms[static_cast<size_t>(a)] > stage_ms[static_cast<size_t>(b)]; });
    std::optional<std::pair<Evaluated, Layout>> pick;
    for (size_t i = 0; i < std::min<size_t>(2, by_time.size()); ++i) {
      const int s = by_time[i];
      const auto first = std::find(l.stage_of_unit.begin(), l.stage_of_unit.end(), s) - l.stage_of_unit.begin();
      const auto last = l.stage_of_unit.rend() - std::find(l.stage_of_unit.rbegin(), l.stage_of_unit.rend(), s) - 1;
      if (first == last) continue;  // a stage keeps at least one unit
      for (auto [unit, to] : {std::pair<ptrdiff_t, int>{first, s - 1}, {last, s + 1}}) {
        if (to < 0 || to >= stages) continue;
        Layout m = l;
        m.stage_of_unit[static_cast<size_t>(unit)] = to;
        if (ir::stage_problem(model_, std::vector<int64_t>(m.stage_of_unit.begin(), m.stage_of_unit.end()), stages))
          continue;
        std::optional<Evaluated> c = evaluate(d, m, "partition by simulated cost, refined");
        if (c && fits(*c) && c->step_ms < (pick ? pick->first.step_ms : e.step_ms) * (1 - kImproves))
          pick = std::pair{*c, m};
      }
    }
    if (!pick) break;
    e = pick->first, l = pick->second, improved = e;
    report("partition");
  }
  return improved;
}

// Order: from the library schedule, pull a forward ahead of the backward before it (into the
// bubble that backward waits in) or defer a weight-gradient pass behind the op after it, one
// rank at a time, keeping the best move that verifies and shortens the step.
std::optional<Evaluated> Search::order_phase(Evaluated& e, Layout& l) {
  const Degrees& d = e.degrees;
  if (d.pp < 2) return std::nullopt;
  if (l.custom.empty()) {
    const ir::PipeSchedule sched = ir::schedule_of(e.strategy);
    l.custom = sched.ops;
    l.rank_of_stage = sched.rank_of_stage;
  }
  std::optional<Evaluated> improved;
  for (int round = 0; round < kOrderRounds && !out_of_time(); ++round) {
    std::optional<std::pair<Evaluated, Layout>> pick;
    for (size_t r = 0; r < l.custom.size(); ++r) {
      const auto& ops = l.custom[r];
      for (size_t i = 1; i < ops.size(); ++i) {
        const ir::PipeOp& a = ops[i - 1];
        const ir::PipeOp& b = ops[i];
        if (a.grouped || b.grouped) continue;
        const bool pull_forward = b.pass == ir::Pass::PASS_F && a.pass != ir::Pass::PASS_F;
        const bool defer_w = a.pass == ir::Pass::PASS_BW && b.pass != ir::Pass::PASS_BW;
        if (!pull_forward && !defer_w) continue;
        Layout m = l;
        std::swap(m.custom[r][i - 1], m.custom[r][i]);
        std::optional<Evaluated> c = evaluate(d, m, "refined order");
        if (c && fits(*c) && c->step_ms < (pick ? pick->first.step_ms : e.step_ms) * (1 - kImproves))
          pick = std::pair{*c, m};
        break;  // one move per rank and round: the earliest
      }
    }
    if (!pick) break;
    e = pick->first, l = pick->second, improved = e;
    report("order");
  }
  return improved;
}

// The inner phases, iterated until none improves.
Evaluated Search::refine(Evaluated e, Layout l) {
  for (bool again = true; again && !out_of_time();) {
    again = false;
    if (partition_phase(e, l)) again = true;
    if (order_phase(e, l)) again = true;
  }
  return e;
}

// Nothing fits: each shape at its least memory (the highest ZeRO stage, full recomputation)
// says what limit would do, and for which strategy.
[[noreturn]] void Search::nothing_fits() {
  smallest_.reset();
  for (const Shape& s : shapes_) {
    if (out_of_time()) break;
    Degrees d = s.d;
    d.zero = d.dp > 1 ? 3 : 0, d.recompute = Recompute::RECOMPUTE_FULL;
    if (!valid(d)) d.recompute = Recompute::RECOMPUTE_NONE;  // a model without recomputable blocks
    if (valid(d)) (void)evaluate(d, balanced(d), d.pp > 1 ? "partition by simulated cost" : "no pipeline");
  }
  const std::string limit = bytes_text(req_.mem_limit_bytes);
  if (!smallest_ && budget_hit_)
    throw TuneError("the time budget of " + std::to_string(static_cast<int>(req_.time_budget_s)) +
                    " s (--time-budget-s) ended the search before it found a strategy within the memory limit of " +
                    limit + " per rank on " + std::to_string(req_.world) + " ranks; give a longer budget");
  if (!smallest_)
    throw TuneError("no strategy fits the memory limit of " + limit + " per rank on " + std::to_string(req_.world) +
                    " ranks, and none could be simulated; check the cost model");
  const double need = smallest_->peak_mem_bytes;
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.3g", std::ceil(need / double{1 << 30} * 1000) / 1000);
  throw NoFitError("no strategy fits the memory limit of " + limit + " per rank on " + std::to_string(req_.world) +
                       " ranks: the least any candidate needs is " + bytes_text(need) + " per rank (" +
                       smallest_->label + "); give --mem-gib " + gib + " or more, or more ranks (--world)",
                   need, smallest_->label);
}

Result Search::run() {
  enumerate();
  if (shapes_.empty())
    throw TuneError("no valid grid for " + std::to_string(req_.world) + " ranks: no tp x pp x dp of that product " +
                    "passes the config's rules" + (invalid_why_.empty() ? "" : " (tp 1, pp 1: " + invalid_why_ + ")") +
                    "; choose a world size that divides train.global_batch with a pipeline the model's " +
                    std::to_string(model_.units.size()) + " units can fill");
  outer();
  if (!best_) nothing_fits();
  // The inner phases for the best few of the outer search.
  std::stable_sort(fitting_.begin(), fitting_.end(),
                   [](const auto& a, const auto& b) { return a.first.step_ms < b.first.step_ms; });
  for (size_t i = 0; i < std::min<size_t>(kRefined, fitting_.size()) && !out_of_time(); ++i)
    consider(refine(fitting_[i].first, fitting_[i].second), best_);
  Result out;
  out.chosen = *best_;
  for (const auto& b : baselines_)
    if (b && b->step_ms < out.chosen.step_ms * (1 - kImproves)) out.chosen = *b;  // never slower than a baseline
  out.baselines = baselines_;
  report("full world");
  at_full_world(out.chosen);
  for (auto& b : out.baselines)
    if (b) at_full_world(*b);
  out.search_s = elapsed();
  out.simulations = sims_;
  out.candidates = static_cast<int>(shapes_.size());
  out.budget_hit = budget_hit_;
  report("done");
  return out;
}

}  // namespace

std::string bytes_text(double bytes) {
  char b[48];
  if (bytes >= double{1 << 30}) std::snprintf(b, sizeof b, "%.2f GiB", bytes / double{1 << 30});
  else if (bytes >= double{1 << 20}) std::snprintf(b, sizeof b, "%.1f MiB", bytes / double{1 << 20});
  else std::snprintf(b, sizeof b, "%.0f KiB", std::ceil(bytes / 1024));
  return b;
}

config::Config degrees_config(const config::Config& base, const Degrees& d) {
  return config_for(base, d, d.dp, base.train.global_batch);
}

std::string degrees_label(const Degrees& d) {
  std::string s = "tp" + std::to_string(d.tp) + " pp" + std::to_string(d.pp) + " dp" + std::to_string(d.dp);
  if (d.ep > 1) s += " ep" + std::to_string(d.ep);
  s += " zero" + std::to_string(d.zero) + " mb" + std::to_string(d.microbatches);
  if (d.pp > 1) {
    s += " vs" + std::to_string(d.virtual_stages) + " " + ir::schedule_name(d.schedule);
    if (d.pairs) s += " pairs";
  }
  if (d.recompute != Recompute::RECOMPUTE_NONE) s += std::string(" recompute ") + ir::recompute_name(d.recompute);
  return s;
}

const char* baseline_name(Baseline b) {
  switch (b) {
    case Baseline::BASELINE_INTERLEAVED: return "interleaved";
    case Baseline::BASELINE_1F1B: return "1f1b";
    case Baseline::BASELINE_DUALPIPEV: return "dualpipev";
    case Baseline::BASELINE_NO_PIPELINE: return "no_pipeline";
  }
  return "?";
}

Result tune(const Request& req) {
  Search s(req);
  return s.run();
}

}  // namespace piper::tune
