// test_tune.cpp — the tuner: the exhaustive optimum on small cases, the same output for the same
// input, written configs that read back to the chosen strategy, the memory limit kept, never slower
// than a baseline, and its refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>

#include "config/config.hpp"
#include "ir/compile.hpp"
#include "ir/validate.hpp"
#include "sim/hardware.hpp"
#include "sim/simulator.hpp"
#include "unit/test_configs.hpp"
#include "tune/tune.hpp"

namespace piper {
namespace {

using ir::ScheduleKind;


// The analytic model of the small model on an H100 table entry, covering tp 1 and 2 and every
// group size up to `world`.
sim::CostModel costs(const config::Config& cfg, int world) {
  std::vector<int> groups;
  for (int g = 2; g <= world; ++g)
    if (world % g == 0) groups.push_back(g);
  return sim::analytic_cost(cfg.model, cfg.train.seq_len, 4, *sim::find_hardware("h100-sxm"), {1, 2}, groups);
}

tune::Request request(const config::Config& cfg, int world, double mem_bytes) {
  tune::Request r;
  r.cfg = cfg;
  r.world = world;
  r.cost = costs(cfg, world);
  r.mem_limit_bytes = mem_bytes;
  r.time_budget_s = 600;
  return r;
}

// Every contiguous partition of `units` units over `stages` stages (the embedding on the first,
// the head on the last, none empty).
void partitions(int units, int stages, const std::function<void(const std::vector<int>&)>& f) {
  std::vector<int> st(static_cast<size_t>(units), 0);
  std::function<void(int, int)> rec = [&](int u, int s) {
    if (u == units) {
      if (s == stages - 1) f(st);
      return;
    }
    for (int next : {s, s + 1}) {
      if (next >= stages || (u == 0 && next != 0)) continue;
      if (u == units - 1 && next != stages - 1) continue;
      st[static_cast<size_t>(u)] = next;
      rec(u + 1, next);
    }
  };
  st[0] = 0;
  rec(1, 0);
}

struct Brute {
  double step_ms = std::numeric_limits<double>::infinity();
  std::string what;
  int simulations = 0;
};

// The exhaustive optimum over the tuner's outer space (degrees, ZeRO, microbatches, the library
// schedules with their virtual stages and pairs, recomputation) and every partition, each
// simulated at the full world with its library order.
Brute exhaustive(const config::Config& base, int world, double mem) {
  Brute best;
  const sim::CostModel cost = costs(base, world);
  const int units = static_cast<int>(ir::make_model_graph(base.model).units.size());
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; tp * pp <= world; ++pp) {
      if (world % (tp * pp) != 0) continue;
      const int dp = world / (tp * pp);
      for (int mb = 1; mb <= base.train.global_batch; ++mb)
        for (const char* sched : {"1f1b", "interleaved", "zbh1", "dualpipev"})
          for (bool pairs : {false, true})
            for (int zero = 0; zero <= 3; ++zero)
              for (const char* rec : {"none", "selective", "full"}) {
                const std::string s = sched;
                if (pp == 1 && s != "1f1b") continue;
                if (pairs && s != "dualpipev") continue;
                config::Config c = base;
                c.parallel.tp = tp, c.parallel.pp = pp, c.parallel.dp = dp, c.parallel.zero = zero;
                c.parallel.microbatches = mb, c.parallel.schedule = s, c.parallel.pairs = pairs;
                c.parallel.recompute = rec;
                c.parallel.virtual_stages = s == "interleaved" ? 2 : 1;
                try {
                  ir::validate(c, world);
                } catch (const config::ConfigError&) {
                  continue;
                }
                const ir::Strategy st0 = ir::expand(c, world);
                if (st0.place.stage_of_unit.empty()) continue;  // more stages than units: ir::build refuses it
                const int stages = static_cast<int>(*std::max_element(st0.place.stage_of_unit.begin(),
                                                                      st0.place.stage_of_unit.end())) + 1;
                partitions(units, stages, [&](const std::vector<int>& p) {
                  ir::Strategy st = st0;
                  st.place.stage_of_unit = p;
                  const ir::Plan plan = ir::compile(c.model, st);
                  const sim::SimResult r = sim::simulate(plan, c, cost);
                  ++best.simulations;
                  double peak = 0;
                  for (const auto& rr : r.ranks) peak = std::max(peak, rr.peak_total);
                  if (peak <= mem && r.step_ms < best.step_ms) {
                    best.step_ms = r.step_ms;
                    best.what = "tp" + std::to_string(tp) + " pp" + std::to_string(pp) + " dp" + std::to_string(dp) +
                                " zero" + std::to_string(zero) + " mb" + std::to_string(mb) + " " + s +
                                (pairs ? " pairs" : "") + " recompute " + rec;
                  }
                });
              }
    }
  return best;
}

// The tuner finds the exhaustive optimum of its outer space and partitions (its order phase may
// go below it; it never stays above).
TEST(Tune, FindsTheExhaustiveOptimumOnSmallCases) {
  struct Case {
    std::string pattern;
    int world;
    int64_t batch;
  };
  for (const Case& k : {Case{"MM*-", 2, 4}, Case{"M*-M-", 4, 4}}) {
    const config::Config cfg = testing::small_config(k.pattern, k.batch, 64);
    const double mem = 1e12;
    const Brute b = exhaustive(cfg, k.world, mem);
    const tune::Result r = tune::tune(request(cfg, k.world, mem));
    const double gap = r.chosen.step_ms / b.step_ms - 1;
    std::printf("pattern %s, %d ranks: tuner %.6g ms (%s, %d simulations), exhaustive %.6g ms (%s, %d simulations), "
                "gap %+.3g%%\n",
                k.pattern.c_str(), k.world, r.chosen.step_ms, r.chosen.label.c_str(), r.simulations, b.step_ms,
                b.what.c_str(), b.simulations, 100 * gap);
    EXPECT_LE(gap, 1e-9) << "tolerance: 1e-9 relative above the exhaustive optimum";
  }
}

// A limit that excludes the fastest strategies: the choice fits it, by the simulator's account.
TEST(Tune, TheChoiceFitsTheMemoryLimit) {
  const config::Config cfg = testing::small_config("M*-M-", 8, 64);
  const tune::Result free = tune::tune(request(cfg, 4, 1e12));
  const double limit = free.chosen.peak_mem_bytes * 0.8;
  const tune::Result r = tune::tune(request(cfg, 4, limit));
  std::printf("unlimited: %s, peak %.0f bytes; limit %.0f: %s, peak %.0f bytes\n", free.chosen.label.c_str(),
              free.chosen.peak_mem_bytes, limit, r.chosen.label.c_str(), r.chosen.peak_mem_bytes);
  EXPECT_LE(r.chosen.peak_mem_bytes, limit);
  const ir::Plan plan = ir::compile(cfg.model, r.chosen.strategy);
  const sim::SimResult s = sim::simulate(plan, tune::degrees_config(cfg, r.chosen.degrees), costs(cfg, 4));
  for (const auto& rr : s.ranks) EXPECT_LE(rr.peak_total, limit) << "rank " << rr.rank;
  for (const auto& b : r.baselines) {
    if (b) {
      EXPECT_LE(b->peak_mem_bytes, limit) << b->label;
    }
  }
}

TEST(Tune, NeverSlowerThanABaseline) {
  const config::Config cfg = testing::small_config("MM*-E-M*", 8, 64);
  const tune::Result r = tune::tune(request(cfg, 8, 1e12));
  for (int b = 0; b < tune::kBaselines; ++b) {
    const auto& e = r.baselines[static_cast<size_t>(b)];
    ASSERT_TRUE(e) << tune::baseline_name(static_cast<tune::Baseline>(b));
    std::printf("%-11s %.6g ms (%s); chosen %.6g ms (%s): %.4fx\n", tune::baseline_name(static_cast<tune::Baseline>(b)),
                e->step_ms, e->label.c_str(), r.chosen.step_ms, r.chosen.label.c_str(), e->step_ms / r.chosen.step_ms);
    EXPECT_LE(r.chosen.step_ms, e->step_ms);
  }
  EXPECT_GE(r.chosen.step_ms, r.chosen.lower_bound_ms * (1 - 1e-12));
}

// The written config reads back, validates, and compiles to the chosen strategy; the same input
// writes the same file, byte for byte.
TEST(Tune, WritesAConfigThatReadsBackToTheChoice) {
  config::Config cfg = testing::small_config("MM*-M-", 8, 64);
  cfg.source = "small.yaml";
  const tune::Request req = request(cfg, 4, 1e12);
  const tune::Result a = tune::tune(req);
  const tune::Result b = tune::tune(req);
  const std::string text = tune::tuned_config_yaml(cfg, req, a);
  EXPECT_EQ(text, tune::tuned_config_yaml(cfg, req, b));
  const config::Config back = config::parse(text, "tuned.yaml");
  ir::validate(back, 4);
  EXPECT_EQ(back.model, cfg.model);
  const ir::Plan plan = ir::compile(back, 4);
  const ir::Plan chosen = ir::compile(cfg.model, a.chosen.strategy);
  EXPECT_EQ(plan.hash, chosen.hash) << text;
  EXPECT_NE(text.find("# chosen: " + a.chosen.label), std::string::npos) << text;
}

TEST(Tune, RefusesWhenNothingFitsAndSaysWhatWould) {
  const config::Config cfg = testing::small_config("M*-M-", 8, 64);
  double least = 0;
  try {
    (void)tune::tune(request(cfg, 4, 1000.0));
    FAIL() << "a 1000-byte limit was accepted";
  } catch (const tune::NoFitError& e) {
    const std::string m = e.what();
    std::printf("%s\n", m.c_str());
    EXPECT_NE(m.find("no strategy fits the memory limit of 1 KiB per rank on 4 ranks"), std::string::npos) << m;
    EXPECT_NE(m.find(e.least_strategy), std::string::npos) << m;
    EXPECT_NE(m.find("--mem-gib"), std::string::npos) << m;
    least = e.least_bytes;
  }
  // The limit it names is enough: at it, a choice within it.
  const tune::Result r = tune::tune(request(cfg, 4, least));
  std::printf("at %.0f bytes: %s, peak %.0f bytes\n", least, r.chosen.label.c_str(), r.chosen.peak_mem_bytes);
  EXPECT_LE(r.chosen.peak_mem_bytes, least);
}

TEST(Tune, RefusesAWorldWithNoValidGrid) {
  // Of 7 ranks: tp 7 divides no size, 7 stages are more than the 6 units, 8 sequences do not
  // split over 7 replicas.
  const config::Config cfg = testing::small_config("M*-M", 8, 64);
  try {
    (void)tune::tune(request(cfg, 7, 1e12));
    FAIL() << "7 ranks were accepted";
  } catch (const tune::TuneError& e) {
    const std::string m = e.what();
    std::printf("%s\n", m.c_str());
    EXPECT_NE(m.find("no valid grid for 7 ranks"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace piper
