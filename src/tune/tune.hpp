// tune.hpp — `piper tune`: the search for the fastest strategy that fits a
// memory limit, on the simulator (docs/tuner.md).
//
// Outer: the parallel degrees (tp, pp, dp, ep), the ZeRO stage, the
// microbatches, the virtual stages, the schedule and the recomputation,
// pruned by closed-form lower bounds of step time and memory before anything
// is simulated. Inner, for each pipeline candidate (OctoPipe's phases,
// iterated until none improves): the partition of units over stages,
// balanced by simulated cost and then moved unit by unit; the placement of
// stages on ranks; the order, refined from the library schedule, every
// candidate order passing the verifier's deadlock check. Baselines, each at
// its best degrees under the same limit: Megatron-style uniform interleaved
// 1F1B, uniform 1F1B and uniform DualPipeV (equal blocks per stage).
//
// Depends on ir and sim only.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/strategy.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulator.hpp"

namespace piper::tune {

// What the outer search chooses.
struct Degrees {
  int tp = 1, pp = 1, dp = 1, ep = 1;
  int zero = 0;
  int microbatches = 1;
  int virtual_stages = 1;  // model chunks per pipeline rank (2 for dualpipev)
  ir::ScheduleKind schedule = ir::ScheduleKind::SCHEDULE_1F1B;
  bool pairs = false;
  ir::Recompute recompute = ir::Recompute::RECOMPUTE_NONE;
  bool operator==(const Degrees&) const = default;
};

// The config of these degrees at the full world: `base` with its parallel
// shorthand set to them and no directives.
config::Config degrees_config(const config::Config& base, const Degrees& d);

// "tp2 pp8 dp4 zero1 mb8 vs2 interleaved" (+ " pairs", " recompute selective", " ep2").
std::string degrees_label(const Degrees& d);

// One strategy, simulated.
struct Evaluated {
  std::string label;       // the degrees, then how units are partitioned and ordered
  Degrees degrees;
  ir::Strategy strategy;   // at the full world: what the written config holds
  double step_ms = 0;
  double bubble = 0;           // idle fraction over all ranks
  double exposed_comm_ms = 0;  // the most any rank waits for communication
  double peak_mem_bytes = 0;   // the most any rank holds
  double lower_bound_ms = 0;   // the step's compute spread evenly over the ranks, no bubble, no exposed comm
};

// The baselines, in this order: Megatron-style uniform interleaved 1F1B (2 to 4 virtual stages),
// uniform 1F1B and uniform DualPipeV, each with a pipeline (pp > 1) at its best degrees; and the
// best strategy without a pipeline (data and tensor parallelism, ZeRO, recomputation only).
enum class Baseline : uint8_t { BASELINE_INTERLEAVED, BASELINE_1F1B, BASELINE_DUALPIPEV, BASELINE_NO_PIPELINE };
constexpr int kBaselines = 4;
const char* baseline_name(Baseline b);  // "interleaved", "1f1b", "dualpipev", "no_pipeline"

// Where the search stands, for the progress line.
struct Progress {
  int candidates_done = 0, candidates = 0;
  int simulations = 0;
  double elapsed_s = 0;
  double best_ms = 0;     // 0 while nothing fits
  std::string best;       // label of the best so far
  std::string phase;      // "outer", "partition", "order", "baselines"
};

struct Request {
  config::Config cfg;     // validated; its parallel and directives sections are what the search replaces
  int world = 1;
  sim::CostModel cost;
  double mem_limit_bytes = 0;
  double time_budget_s = 60;  // the search stops taking new candidates after this long
  int ranks_per_host = 0;     // as sim::SimOptions (host sharing; no replica shortcut then)
  std::function<void(const Progress&)> progress;  // called as the search advances (may be empty)
};

struct Result {
  Evaluated chosen;
  std::array<std::optional<Evaluated>, kBaselines> baselines;  // nullopt: nothing of that kind fits
  double search_s = 0;
  int simulations = 0;
  int candidates = 0;        // degree sets considered (after validation)
  bool budget_hit = false;   // the time budget ended the search before every bound was reached
};

// What cannot be tuned: no valid grid for the world, no strategy within the
// memory limit, a cost model without the units the model needs. The message
// says what and what would be right; `piper tune` exits 2.
struct TuneError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// No candidate fits the memory limit: the least peak any candidate needs (each
// at its highest ZeRO stage and full recomputation), and which one that is.
struct NoFitError : TuneError {
  NoFitError(const std::string& what, double least, std::string strategy)
      : TuneError(what), least_bytes(least), least_strategy(std::move(strategy)) {}
  double least_bytes;
  std::string least_strategy;
};

// Bytes as people read them: "812 KiB", "3.4 MiB", "67.25 GiB".
std::string bytes_text(double bytes);

Result tune(const Request& req);

// The largest tensor-parallel degree the search tries: a tp group stays within a node's NVLink domain.
constexpr int kMaxTp = 8;

// The cost model a search at `world` runs on: the cost file (piper calibrate) when one is named, which
// must cover every unit kind of cfg's model, else the analytic model of `hardware` (a table name or a
// file) covering every tp the search may try and every group size of `world`, with the hardware's
// memory in `memory_bytes` (left alone for a cost file). Throws TuneError saying what is wrong.
sim::CostModel cost_model(const config::Config& cfg, int world, const std::string& cost_file,
                          const std::string& hardware, double* memory_bytes);

// The config `piper train` runs as it is: the model, train, data and
// checkpoint sections of `cfg` with the chosen strategy as its parallel
// shorthand and written out in full as directives, under a header saying what
// was chosen and why (predicted step, bubble, exposed communication, peak
// memory against the baselines; the search's candidates and simulations).
std::string tuned_config_yaml(const config::Config& cfg, const Request& req, const Result& r);

// The guide's cost breakdown of the chosen strategy: FLOPs per unit kind,
// communication volume per dp/tp/pp/ep group, memory by category.
std::string explain(const config::Config& cfg, const Request& req, const Evaluated& e);

}  // namespace piper::tune
