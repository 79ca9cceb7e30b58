// validate.cpp — the IR's rules on a config, reported where the config sets the values they concern.
#include "ir/validate.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "ir/build.hpp"
#include "ir/model_graph.hpp"
#include "ir/pipeline_schedules.hpp"
#include "ir/placement.hpp"
#include "ir/strategy.hpp"

namespace piper::ir {
namespace {

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

std::string index(int i) { return "[" + std::to_string(i) + "]"; }

// The named schedule's rules, or those of the hand-written order that replaces it.
std::optional<std::string> order_rules(const config::EffectiveStrategy& e, const Strategy& s, const ModelGraph& model) {
  const config::Positions& at = e.positions;
  if (e.order_ranks.empty()) {
    const std::optional<ScheduleProblem> problem =
        schedule_problem(s.order.schedule, s.place.pp, static_cast<int>(e.parallel.virtual_stages),
                         s.split.microbatches, s.any_split_backward(), s.order.pairs);
    if (!problem) return std::nullopt;
    return at.head(problem->key) + ": " + problem->message + " (" + at.ref("parallel.schedule") + ")";
  }
  OrderNames names;
  names.op = [&](int rank, int op) { return at.at(e.order_path + index(rank) + index(op)); };
  // The split_backward a message names: the last directive splitting some units, else the uniform value.
  names.value = [&](const std::string& key) {
    return key == "parallel.split_backward" && !e.split_subsets.empty() ? at.at(e.split_subsets.back().path)
                                                                        : at.ref(key);
  };
  // Only a split_backward the config sets forces split backwards: an order written with BI/BW splits them itself.
  const bool split = e.parallel.split_backward || !e.split_subsets.empty();
  const std::optional<OrderProblem> problem =
      order_problem(s.order.custom, s.place.pp, s.place.virtual_stages, s.split.microbatches, split, names);
  auto at_op = [&](int rank, int op) {
    return at.at(e.order_path + (rank >= 0 ? index(rank) : "") + (op >= 0 ? index(op) : ""));
  };
  if (problem) return at_op(problem->rank, problem->op) + ": " + problem->message;
  // The rules the DAG decides: unit ranges within their stage, every unit pass run once, the ops of
  // a group independent.
  try {
    build(model, s);
  } catch (const OrderError& err) {
    return at_op(err.rank, err.op) + ": " + err.detail;
  } catch (const BuildError&) {
    // Not a rule of the order: ir::compile reports it.
  }
  return std::nullopt;
}

// The stages' pipeline ranks a place directive gives: a placement, and a named schedule's own.
std::optional<std::string> rank_rules(const config::EffectiveStrategy& e, const Strategy& s) {
  if (e.rank_of_stage.empty()) return std::nullopt;
  const std::string at = e.positions.at(e.ranks_path);
  if (const std::string problem = placement_problem(s.place.rank_of_stage, s.place.pp); !problem.empty())
    return at + ": " + problem + " (" + e.positions.ref("parallel.pp") + ")";
  try {
    schedule_of(s);
  } catch (const std::invalid_argument& err) {
    const std::string what = err.what(), said = "place ranks: ";  // the position names the key already
    return at + ": " + (what.rfind(said, 0) == 0 ? what.substr(said.size()) : what);
  }
  return std::nullopt;
}

// The stages a place directive gives against the pp x chunks per rank the schedule holds.
std::optional<std::string> stage_count_rule(const config::EffectiveStrategy& e, const Strategy& s) {
  const std::vector<int>& st = s.place.stage_of_unit;  // the placement's, filters resolved
  if (e.place_path.empty() || st.empty()) return std::nullopt;  // balanced over the stages the schedule holds
  const int64_t given = *std::max_element(st.begin(), st.end()) + 1;
  const int64_t held = static_cast<int64_t>(s.place.pp) * s.place.virtual_stages;
  if (given == held) return std::nullopt;
  return e.positions.at(e.place_path) + ": lists " + std::to_string(given) + " stages, but pp x chunks per rank = " +
         std::to_string(s.place.pp) + " x " + std::to_string(s.place.virtual_stages) + " = " + std::to_string(held) +
         " stages (" + e.positions.ref("parallel.pp") +
         (e.order_ranks.empty() ? ", " + e.positions.ref("parallel.schedule") : std::string()) + ")";
}

}  // namespace

void validate(const config::Config& cfg, int world_size) {
  config::validate(cfg, world_size);
  const config::EffectiveStrategy e = config::effective_strategy(cfg);
  const std::vector<std::string> placement = placement_problems(make_model_graph(cfg.model), e);
  if (!placement.empty()) {
    std::string text;
    for (const std::string& p : placement) text += (text.empty() ? "" : "\n") + p;
    throw config::ConfigError(text);
  }
  const std::vector<std::string>& known = schedule_names();
  if (e.order_ranks.empty() && std::find(known.begin(), known.end(), e.parallel.schedule) == known.end()) {
    const std::string near = config::closest(e.parallel.schedule, known);
    throw config::ConfigError(e.positions.head("parallel.schedule") + ": unknown schedule; expected one of " +
                              join(known) + (near.empty() ? "" : " (did you mean '" + near + "'?)"));
  }
  const Strategy s = expand(cfg, world_size);
  if (std::optional<std::string> problem = rank_rules(e, s)) throw config::ConfigError(*problem);
  if (std::optional<std::string> problem = stage_count_rule(e, s)) throw config::ConfigError(*problem);
  if (std::optional<std::string> problem = order_rules(e, s, make_model_graph(cfg.model)))
    throw config::ConfigError(*problem);
}

}  // namespace piper::ir
