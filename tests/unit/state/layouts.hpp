// layouts.hpp — the strategies the state tests lay out: a small model with every block kind and
// its layouts under dp, tp, pp, ep, ZeRO and grid orders (test_layout.cpp, test_switch_plan.cpp).
#pragma once

#include <string>

#include "config/config.hpp"
#include "ir/compile.hpp"
#include "ir/model_graph.hpp"
#include "state/layout.hpp"
#include "unit/test_configs.hpp"

namespace piper::state {

// ---- strategies ---------------------------------------------------------------------

struct Strat {
  int dp = 1, tp = 1, pp = 1, zero = 0;
  std::string order = "tp-dp-pp";
  int ep = 1;  // carved out of dp
  int world() const { return dp * tp * pp; }
  std::string name() const {
    return "dp" + std::to_string(dp) + " tp" + std::to_string(tp) + " pp" + std::to_string(pp) + " zero" +
           std::to_string(zero) + (ep > 1 ? " ep" + std::to_string(ep) : "") + (order != "tp-dp-pp" ? " " + order : "");
  }
};

inline const char* kPattern = "M*-E-";  // every block kind; the MoE block's 4 experts split over ep 1, 2 or 4

inline config::Config make_config(const Strat& s) {
  config::Config c;
  c.model = testing::small_model(kPattern);  // n_groups 2, n_kv_heads 2: tp 2 divides
  c.parallel.dp = s.dp;
  c.parallel.tp = s.tp;
  c.parallel.pp = s.pp;
  c.parallel.zero = s.zero;
  c.parallel.ep = s.ep;
  c.parallel.microbatches = 2;
  c.parallel.order = s.order;
  c.train.global_batch = 8 * s.dp * 2;
  return c;
}

inline LayoutParams layout_of(const Strat& s) { return layout_params(ir::compile(make_config(s), s.world())); }

inline const ir::ModelGraph& graph() {
  static const ir::ModelGraph g = ir::make_model_graph(make_config(Strat{}).model);
  return g;
}

}  // namespace piper::state
