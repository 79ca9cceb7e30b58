// trainer.cpp — train as named steps: compile, preflight, the runtime, resume,
// the step loop with its hooks, the summary.
#include "runtime/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/token_file.hpp"
#include "data/tokenizer.hpp"
#include "comm/mpi_comm.hpp"
#include "ir/compile.hpp"
#include "io/regular_file.hpp"
#include "kernels.hpp"
#include "runtime/checkpointing.hpp"
#include "runtime/elastic.hpp"
#include "runtime/fit.hpp"
#include "runtime/rank_runtime.hpp"
#include "runtime/switching.hpp"
#include "runtime/tracing.hpp"
#include "runtime/train_data.hpp"

namespace piper::runtime {

namespace {

// PIPERPRM: magic, u32 version 1, u32 count; per tensor u32 name length, name,
// u32 ndim, i64 dims, float32 data (little-endian, row-major).
void write_params(const std::string& path, const ir::ModelGraph& g,
                  const std::map<int, std::vector<float>>& unit_values) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw UserError("cannot write parameters to '" + path + "'");
  auto u32 = [&](uint32_t v) { f.write(reinterpret_cast<const char*>(&v), 4); };
  uint32_t count = 0;
  for (const auto& u : g.units) count += static_cast<uint32_t>(u.params.size());
  f.write("PIPERPRM", 8);
  u32(1);
  u32(count);
  for (const auto& u : g.units) {
    const float* base = unit_values.at(u.index).data();
    for (const auto& p : u.params) {
      u32(static_cast<uint32_t>(p.name.size()));
      f.write(p.name.data(), static_cast<std::streamsize>(p.name.size()));
      u32(static_cast<uint32_t>(p.shape.size()));
      for (int64_t d : p.shape) f.write(reinterpret_cast<const char*>(&d), 8);
      f.write(reinterpret_cast<const char*>(base), static_cast<std::streamsize>(p.numel() * 4));
      base += p.numel();
    }
  }
}

// This rank's pieces of a unit's parameters, one after the other without the
// parts' padding, on the host: ZeRO-3 shards gathered over each part's group.
std::vector<float> local_values(RankRuntime& rt, int u) {
  model::ParamStore& ps = rt.model().params();
  const backend::Tensor gathered = ps.sharding().zero(u) >= 3 ? rt.gathered_values(u) : backend::Tensor();
  const float* values = gathered.empty() ? ps.values(u) : gathered.data();
  std::vector<float> full(static_cast<size_t>(ps.padded_numel(u)));
  rt.device().to_host(full.data(), values, full.size() * sizeof(float));
  std::vector<float> local;
  for (const ir::FlatPart& p : ps.parts(u))
    local.insert(local.end(), full.begin() + p.full_offset, full.begin() + p.full_offset + p.numel);
  return local;
}

// Collects every unit's full values on rank 0 — gathering ZeRO-3 shards over
// the data-parallel group and tensor- and expert-parallel pieces into their
// global places — and writes them. Collective: every rank calls it.
void dump_params(const std::string& path, RankRuntime& rt, const MpiEnv& env) {
  const ir::Plan& plan = rt.plan();
  const ir::ParallelDims& grid = rt.grid();
  model::ParamStore& ps = rt.model().params();
  const ir::Degrees degrees = grid.degrees();
  const int tp = degrees.tp, ep = degrees.ep;
  std::map<int, std::vector<float>> values;
  for (const auto& unit : plan.model.units) {
    const int u = unit.index;
    const std::vector<float> local = ps.holds(u) ? local_values(rt, u) : std::vector<float>{};
    std::vector<float> global(env.rank() == 0 ? static_cast<size_t>(unit.param_count()) : 0);
    ir::Coords first = grid.coords(plan.devices_of_unit[static_cast<size_t>(u)].front());
    // Local sizes of tp rank t and ep rank e are those of every rank.
    const int64_t n_local = ir::local_numel(unit, degrees);
    for (int piece_index = 0; piece_index < tp * ep; ++piece_index) {
      first.tp = piece_index % tp, first.dp = piece_index / tp;  // dp coordinates 0..ep-1: ep coordinates 0..ep-1
      const int src = grid.rank_of(first);
      const ir::Coords coords = grid.coords(src);
      const int tag = u * tp * ep + piece_index;
      std::vector<float> piece;
      if (env.rank() == src) piece.assign(local.begin(), local.begin() + n_local);
      if (src != 0) {
        if (env.rank() == src) rt.host_world().send(piece.data(), static_cast<size_t>(n_local), backend::DType::DTYPE_F32, 0, tag);
        if (env.rank() == 0) {
          piece.resize(static_cast<size_t>(n_local));
          rt.host_world().recv(piece.data(), static_cast<size_t>(n_local), backend::DType::DTYPE_F32, src, tag);
        }
      }
      if (env.rank() != 0) continue;
      int64_t local_off = 0, global_off = 0;
      for (const auto& p : unit.params) {
        const int64_t n = ir::local_numel(p, degrees);
        for (int64_t j = 0; j < n;) {
          const ir::Stretch st = ir::global_stretch(p, degrees, coords, j);
          const int64_t len = std::min(st.len, n - j);
          std::copy_n(piece.begin() + local_off + j, len, global.begin() + global_off + st.global);
          j += len;
        }
        local_off += n;
        global_off += p.numel();
      }
    }
    if (env.rank() == 0) values[u] = std::move(global);
  }
  if (env.rank() == 0) write_params(path, plan.model, values);
}

void print_sample(model::Model& m, const config::Config& cfg, const data::Tokenizer& tok, int64_t step) {
  // No trailing space: a subword vocabulary joins a space to the word after it, so a prompt ending in one
  // asks for a continuation training rarely saw.
  std::vector<int32_t> text = tok.encode("The");
  // A stop signal cuts the sample short: the checkpoint at the step boundary comes first.
  const auto out = m.generate(text, cfg.train.sample_tokens, cfg.train.seq_len,
                              cfg.train.seed + static_cast<uint64_t>(step), 0.8f, 0, [] { return stop_requested(); });
  text.insert(text.end(), out.begin(), out.end());
  std::printf("sample @ step %" PRId64 ": \"%s\"\n", step, tok.decode_printable(text).c_str());
}

// Per-rank figures of a step: its time split, its memory peaks, and the
// model state held after it.
struct RankFigures {
  double compute_ms = 0, comm_ms = 0, idle_ms = 0;
  std::array<double, backend::kMemCategoryCount> peak{};  // bytes, each category's own peak
  double total_peak = 0;                                   // bytes, the peak of the sum
  std::array<double, 3> state{};                           // params, grads, optimizer bytes held after the step
};

RankFigures figures_of(const StepStats& st, const backend::MemoryStats& mem) {
  RankFigures f;
  f.compute_ms = st.compute_ms, f.comm_ms = st.comm_ms, f.idle_ms = st.idle_ms;
  for (size_t c = 0; c < f.peak.size(); ++c) f.peak[c] = static_cast<double>(mem.peak[c]);
  f.total_peak = static_cast<double>(mem.total_peak);
  for (size_t c = 0; c < f.state.size(); ++c) f.state[c] = static_cast<double>(mem.current[c]);
  return f;
}

// The one layout of the figures in a flat array of doubles.
constexpr size_t kFigureSlots = 3 + backend::kMemCategoryCount + 1 + 3;
std::array<double*, kFigureSlots> slots_of(RankFigures& f) {
  std::array<double*, kFigureSlots> s{};
  size_t k = 0;
  for (double* x : {&f.compute_ms, &f.comm_ms, &f.idle_ms}) s[k++] = x;
  for (double& x : f.peak) s[k++] = &x;
  s[k++] = &f.total_peak;
  for (double& x : f.state) s[k++] = &x;
  return s;
}

// Every rank's figures, on every rank: each fills its slots of one array and
// the world sums it into place.
std::vector<RankFigures> gather_figures(RankFigures mine, comm::Communicator& world) {
  std::vector<double> slots(static_cast<size_t>(world.size()) * kFigureSlots, 0.0);
  const auto in = slots_of(mine);
  for (size_t k = 0; k < kFigureSlots; ++k) slots[static_cast<size_t>(world.rank()) * kFigureSlots + k] = *in[k];
  if (world.size() > 1) world.allreduce_double(slots.data(), slots.size());
  std::vector<RankFigures> all(static_cast<size_t>(world.size()));
  for (size_t r = 0; r < all.size(); ++r) {
    const auto out = slots_of(all[r]);
    for (size_t k = 0; k < kFigureSlots; ++k) *out[k] = slots[r * kFigureSlots + k];
  }
  return all;
}

nlohmann::json figures_json(const std::vector<RankFigures>& all) {
  nlohmann::json per_rank = nlohmann::json::array();
  for (size_t r = 0; r < all.size(); ++r) {
    const RankFigures& f = all[r];
    per_rank.push_back({{"rank", r},
                        {"compute_ms", f.compute_ms},
                        {"comm_ms", f.comm_ms},
                        {"idle_ms", f.idle_ms},
                        {"peak_mem_bytes", f.total_peak},
                        {"mem_bytes", {{"params", f.peak[0]}, {"grads", f.peak[1]}, {"optimizer", f.peak[2]},
                                       {"activations", f.peak[3]}, {"buffers", f.peak[4]}}},
                        {"state_bytes", {{"params", f.state[0]}, {"grads", f.state[1]}, {"optimizer", f.state[2]}}}});
  }
  return per_rank;
}

// ---- the steps of train -------------------------------------------------------

TraceSteps check_trace_options(const TrainOptions& opts) {
  const TraceSteps steps = parse_trace_steps(opts.trace_steps);
  if (!opts.trace_steps.empty() && opts.trace_path.empty())
    throw UserError("--trace-steps " + opts.trace_steps + " needs --trace PATH, the file to write the trace to");
  return steps;
}

// The plan, the same on every rank, and checked to fit in memory before the model is allocated.
ir::Plan compile_checked(const config::Config& cfg, const MpiEnv& env) {
  ir::Plan plan = ir::compile(cfg, env.world_size());
  if (!env.all_equal(plan.hash))
    throw UserError("the ranks compiled different plans (rank " + std::to_string(env.rank()) +
                    " on " + env.host() + " has hash " + std::to_string(plan.hash) +
                    "); every rank must run the same piper binary with the same config");
  check_memory_fit(cfg, plan, env);
  return plan;
}

comm::CommOptions comm_options(const config::Config& cfg) {
  comm::CommOptions copts;
  copts.timeout_s = cfg.parallel.comm_timeout_s;
  return copts;
}

// Rank 0 writes the metrics and the trace; every rank learns whether it can,
// so a bad path stops the whole job at once rather than leaving the others
// waiting. A FIFO or a device is refused before it is opened (opening a FIFO
// for writing waits for a reader). Returns the metrics stream (rank 0, with
// --metrics).
std::unique_ptr<std::ofstream> open_outputs(const TrainOptions& opts, const MpiEnv& env) {
  const bool lead = env.rank() == 0;
  std::unique_ptr<std::ofstream> metrics;
  std::string metrics_problem;
  if (!opts.metrics_path.empty() && lead) {
    metrics_problem = io::why_not_regular(opts.metrics_path);
    if (metrics_problem.empty()) metrics = std::make_unique<std::ofstream>(opts.metrics_path, std::ios::trunc);
    if (metrics && !*metrics) metrics_problem = std::strerror(errno);
  }
  if (env.any(!metrics_problem.empty()))
    throw UserError("--metrics: cannot write '" + opts.metrics_path + "' (on rank 0, " + env.host() + "): " +
                    metrics_problem);
  // Appending does not spoil an existing file before the run has a trace to replace it with.
  std::string trace_problem;
  if (lead && !opts.trace_path.empty()) {
    trace_problem = io::why_not_regular(opts.trace_path);
    if (trace_problem.empty() && !std::ofstream(opts.trace_path, std::ios::app)) trace_problem = std::strerror(errno);
  }
  if (env.any(!trace_problem.empty()))
    throw UserError("--trace: cannot write '" + opts.trace_path + "' (on rank 0, " + env.host() + "): " +
                    trace_problem);
  return metrics;
}

// "dp 2, tp 1, pp 2, zero 1, zbh1": a strategy as the banner and the switch log print it.
std::string strategy_text(const ir::Plan& plan) {
  // One ZeRO stage, or the stage of each unit where they differ.
  const std::vector<int>& zero = plan.strategy.replicate.zero_of_unit;
  std::string zero_text;
  for (size_t u = 0; u < zero.size(); ++u) zero_text += (u ? "," : "") + std::to_string(zero[u]);
  if (std::count(zero.begin(), zero.end(), zero.front()) == static_cast<std::ptrdiff_t>(zero.size()))
    zero_text = std::to_string(zero.front());
  const ir::ParallelDims dims = plan.strategy.dims();
  const std::string ep_text = plan.strategy.shard.ep > 1 ? ", ep " + std::to_string(plan.strategy.shard.ep) : "";
  return "dp " + std::to_string(dims.degree(ir::Axis::DP)) + ", tp " + std::to_string(plan.strategy.shard.tp) +
         ", pp " + std::to_string(plan.strategy.place.pp) + ep_text + ", zero " + zero_text + ", " +
         (plan.strategy.order.custom.empty() ? ir::schedule_name(plan.strategy.order.schedule) : "custom order");
}

// Where the held-out sequences are, and when they are evaluated.
void print_held_out(const config::Config& cfg, const TrainData& d) {
  const data::Split& s = d.split;
  std::string what;
  if (d.held)
    what = "the " + std::to_string(s.held) + " whole sequences of " + d.held->path() + " (data.eval_path)";
  else if (s.held > 0)
    what = "the last " + std::to_string(s.held) + " of the " + std::to_string(s.sequences) + " whole sequences of " +
           d.tokens->path() + " (tokens " + std::to_string(s.held_out.first) + ".." +
           std::to_string(s.held_out.first + s.held_out.count - 1) + "; training reads tokens 0.." +
           std::to_string(s.train.count - 1) + ")";
  else
    return;
  const config::TrainConfig& t = cfg.train;
  const std::string when = t.eval_every > 0 ? "; the loss over the first " +
                                                  std::to_string(t.eval_batches * t.global_batch) + " after every " +
                                                  std::to_string(t.eval_every) + " step(s) and the last"
                                            : "; not evaluated (train.eval_every is 0)";
  std::printf("piper: held out: %s%s\n", what.c_str(), when.c_str());
}

void print_banner(const config::Config& cfg, const RankRuntime& rt, const TrainData& data, const MpiEnv& env,
                  int standby) {
  if (env.rank() != 0) return;
  const ir::Plan& plan = rt.plan();
  const std::string reserve = standby > 0 ? " + " + std::to_string(standby) + " in reserve" : "";
  std::printf("piper: %" PRId64 " parameters, pattern %s, %d rank(s)%s (%s), "
              "device %s, %d thread(s), BLAS %s, plan %016" PRIx64 "\n",
              plan.model.param_count(), cfg.model.pattern.c_str(), env.world_size(), reserve.c_str(),
              strategy_text(plan).c_str(), rt.device().name(), omp_get_max_threads(), kernels::blas_name(), plan.hash);
  if (cfg.train.sample_every > 0 && !rt.holds_whole_model())
    std::printf("piper: train.sample_every: samples need the whole model on one rank; none will be printed\n");
  print_held_out(cfg, data);
}

// --resume: the checkpoint into the runtime, timed from when every rank has
// arrived to when the slowest is done.
void resume(Checkpointer& ckpt, const std::string& where, const config::Config& cfg, comm::Communicator& world,
            const MpiEnv& env) {
  if (world.size() > 1) world.barrier();
  const auto t_load = std::chrono::steady_clock::now();
  const int64_t done = ckpt.load(where);
  double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();
  if (world.size() > 1) {
    std::vector<double> all(static_cast<size_t>(world.size()), 0.0);
    all[static_cast<size_t>(env.rank())] = load_ms;
    world.allreduce_double(all.data(), all.size());
    load_ms = *std::max_element(all.begin(), all.end());
  }
  if (env.rank() != 0) return;
  if (done < 0)
    std::printf("piper: no checkpoint in '%s' yet; starting from step 0\n", cfg.checkpoint.dir.c_str());
  else
    std::printf("piper: resumed from %s at step %" PRId64 " (loaded in %.1f ms)\n", where.c_str(), done, load_ms);
}

// --trace: one time origin, taken as the ranks leave one barrier (on one
// host exactly the same; across hosts, each host's barrier exit).
std::unique_ptr<TraceRecorder> start_trace(const TrainOptions& opts, const TraceSteps& steps, RankRuntime& rt,
                                           comm::Communicator& world) {
  if (opts.trace_path.empty()) return nullptr;
  auto recorder = std::make_unique<TraceRecorder>(steps, rt.position().step, rt.config().train.steps - 1,
                                                  rt.instructions_per_step());
  rt.executor().set_recorder(recorder.get());
  recorder->set_origin(trace_origin(world));
  return recorder;
}

// The MoE blocks' routing in one step, over the whole batch: the balance loss aux_loss
// (docs/model.md) averaged over the E blocks, and the worst block's tokens-per-expert spread
// (the busiest expert's rows over the mean; 1 is perfectly balanced, n_experts / top_k is
// every token on the same experts: routing collapse).
struct Routing {
  double balance_loss = 0, expert_spread = 0;
};

// Collective: every rank calls it. Empty without MoE blocks.
std::optional<Routing> routing_of(RankRuntime& rt, const config::TrainConfig& train, comm::Communicator& world) {
  const ir::ModelGraph& g = rt.plan().model;
  std::vector<int> moe;
  for (const ir::UnitSpec& u : g.units)
    if (u.kind == ir::UnitKind::UNIT_MOE) moe.push_back(u.index);
  if (moe.empty()) return std::nullopt;
  const size_t E = static_cast<size_t>(g.n_experts), stride = 1 + E;
  std::vector<double> v(moe.size() * stride, 0.0);  // per block: [aux sum | rows per expert]
  for (size_t i = 0; i < moe.size(); ++i) {
    if (!rt.model().holds(moe[i])) continue;
    const model::Unit::Routing r = rt.model().unit(moe[i]).take_routing();
    v[i * stride] = r.aux_sum;
    std::copy(r.tokens.begin(), r.tokens.end(), v.begin() + static_cast<std::ptrdiff_t>(i * stride + 1));
  }
  if (world.size() > 1) world.allreduce_double(v.data(), v.size());
  Routing out;
  for (size_t i = 0; i < moe.size(); ++i) {
    out.balance_loss += v[i * stride] / static_cast<double>(train.global_batch) / static_cast<double>(moe.size());
    const auto first = v.begin() + static_cast<std::ptrdiff_t>(i * stride + 1), last = first + static_cast<std::ptrdiff_t>(E);
    const double mean = std::accumulate(first, last, 0.0) / static_cast<double>(E);
    if (mean > 0) out.expert_spread = std::max(out.expert_spread, *std::max_element(first, last) / mean);
  }
  return out;
}

// One step as the loop reports it.
struct StepResult {
  int64_t step = 0;  // 0-based
  StepStats stats;
  std::optional<Routing> routing;  // with MoE blocks
  double loss = 0, ms = 0, tokens_per_s = 0;
  backend::MemoryStats mem;        // this rank's
  std::vector<RankFigures> ranks;  // every rank's
  std::optional<double> eval_loss;  // the held-out loss after the step, when one was due
  double eval_ms = 0;
};

// Whether the held-out loss is due after step `step` (0-based): after every eval_every-th step and the last.
bool eval_due(const config::TrainConfig& train, int64_t step) {
  return train.eval_every > 0 && ((step + 1) % train.eval_every == 0 || step + 1 == train.steps);
}

// The held-out loss: the world's sum of token losses over the evaluation's tokens.
double held_out_loss(RankRuntime& rt, const TrainData& data, comm::Communicator& world) {
  const config::TrainConfig& train = rt.config().train;
  double loss_sum = rt.evaluate(data.held_file(), data.split.held_out, train.eval_batches);
  if (world.size() > 1) world.allreduce_double(&loss_sum, 1);
  return loss_sum / static_cast<double>(train.eval_batches * train.global_batch * train.seq_len);
}

StepResult run_step(RankRuntime& rt, const TrainData& data, comm::Communicator& world) {
  const config::TrainConfig& train = rt.config().train;
  const int64_t tokens_per_step = train.global_batch * train.seq_len;
  StepResult r;
  r.step = rt.position().step;
  const auto t0 = std::chrono::steady_clock::now();
  r.stats = rt.step(*data.tokens, data.split.train);
  double loss_sum = r.stats.loss_sum;
  if (world.size() > 1) world.allreduce_double(&loss_sum, 1);
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.routing = routing_of(rt, train, world);
  r.loss = loss_sum / static_cast<double>(tokens_per_step);
  r.tokens_per_s = static_cast<double>(tokens_per_step) / (r.ms / 1000.0);
  r.mem = rt.model().backend().memory();
  r.ranks = gather_figures(figures_of(r.stats, r.mem), world);
  if (eval_due(train, r.step)) {
    const auto e0 = std::chrono::steady_clock::now();
    r.eval_loss = held_out_loss(rt, data, world);
    r.eval_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - e0).count();
  }
  return r;
}

// The progress lines (rank 0) and one JSON line of --metrics.
void report_step(const StepResult& r, const RankRuntime& rt, const TrainOptions& opts, std::ofstream* metrics,
                 const MpiEnv& env) {
  const config::TrainConfig& train = rt.config().train;
  if (env.rank() == 0 && !opts.quiet && (r.step % train.log_every == 0 || r.step + 1 == train.steps)) {
    char moe[64] = "";
    if (r.routing)
      std::snprintf(moe, sizeof moe, " | balance %.3f | expert spread %.2f", r.routing->balance_loss,
                    r.routing->expert_spread);
    std::printf("step %5" PRId64 " | loss %.4f | lr %.3e | grad norm %.4f | %8.0f tok/s | %7.1f ms%s\n",
                r.step, r.loss, r.stats.lr, r.stats.grad_norm, r.tokens_per_s, r.ms, moe);
  }
  if (env.rank() == 0 && !opts.quiet && r.eval_loss)
    std::printf("eval %5" PRId64 " | held-out loss %.4f | %" PRId64 " sequences | %7.1f ms\n", r.step, *r.eval_loss,
                train.eval_batches * train.global_batch, r.eval_ms);
  if (!metrics) return;
  nlohmann::json j = {{"step", r.step},
                      {"loss", r.loss},
                      {"grad_norm", r.stats.grad_norm},
                      {"lr", r.stats.lr},
                      {"tokens_per_s", r.tokens_per_s},
                      {"step_ms", r.ms},
                      {"tokens", rt.position().tokens_seen},
                      {"peak_mem_bytes", r.mem.total_peak},
                      {"ranks", figures_json(r.ranks)}};
  if (r.routing) j["moe_balance_loss"] = r.routing->balance_loss, j["moe_expert_spread"] = r.routing->expert_spread;
  if (r.eval_loss) j["eval_loss"] = *r.eval_loss, j["eval_ms"] = r.eval_ms;
  *metrics << j.dump() << '\n';
  metrics->flush();
}

// What the loop leaves for the summary.
struct RunLog {
  std::vector<double> step_ms;
  double first_loss = 0.0, last_loss = 0.0;
  std::optional<double> last_eval_loss;
  int64_t last_peak = 0;  // this rank's peak in its last step
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  bool stopped = false;  // by a signal
  bool left = false;     // this process left the job in a switch
};

// The strategy running now: its config and plan on every member, its runtime and checkpointer on the
// ranks that train.
struct Generation {
  std::unique_ptr<config::Config> cfg;
  std::unique_ptr<ir::Plan> plan;
  std::unique_ptr<RankRuntime> rt;
  std::unique_ptr<Checkpointer> ckpt;
  const data::Tokenizer* tokenizer = nullptr;  // the run's data's, for every strategy
};

// After a step (or a stop): the checkpoint that is due, or a background save reported. Returns whether
// it saved.
bool checkpoint_at_boundary(Generation& gen, bool ran, bool stop, const MpiEnv& env) {
  const config::Config& cfg = *gen.cfg;
  const int64_t done = gen.rt->position().step;
  const bool saving = !cfg.checkpoint.dir.empty();
  const bool save = saving && (stop || (ran && cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0));
  if (save) {
    gen.ckpt->save();
    if (stop) gen.ckpt->wait();  // the job ends: the file must be complete
  } else {
    gen.ckpt->poll();
  }
  if (stop && env.rank() == 0)
    std::printf(saving ? "piper: checkpointed at step %" PRId64 " after signal\n"
                       : "piper: stopped at step %" PRId64 " after signal (no checkpoint.dir)\n",
                done);
  return save;
}

// The metrics stream belongs to the strategy's rank 0, which a switch may move to another process.
void follow_metrics(std::unique_ptr<std::ofstream>& metrics, const TrainOptions& opts, const MpiEnv& env) {
  if (opts.metrics_path.empty()) return;
  if (env.rank() != 0) metrics.reset();
  else if (!metrics) metrics = std::make_unique<std::ofstream>(opts.metrics_path, std::ios::app);
}

// A switch's figures over every member: sums, the slowest, and each process's peaks.
struct SwitchFigures {
  double sent = 0, local = 0, stall_ms = 0, build_ms = 0, plan_ms = 0, move_ms = 0;
  std::vector<double> peak, before;  // per member, in members order
};

SwitchFigures gather_switch(const MoveFigures& f, double stall_ms, int64_t before, Membership& m) {
  const size_t n = m.members().size(), me = static_cast<size_t>(m.member_comm().rank());
  std::vector<double> v(6 + 2 * n, 0.0);
  v[0] = static_cast<double>(f.bytes_sent), v[1] = static_cast<double>(f.bytes_local);
  v[6 + me] = static_cast<double>(f.peak_bytes), v[6 + n + me] = static_cast<double>(before);
  m.member_comm().allreduce_double(v.data(), v.size());
  // The slowest process's times: each takes its turn in a max over sums (one slot per figure).
  std::vector<double> t(4 * n, 0.0);
  const double mine[4] = {stall_ms, f.build_ms, f.plan_ms, f.move_ms};
  for (size_t k = 0; k < 4; ++k) t[k * n + me] = mine[k];
  m.member_comm().allreduce_double(t.data(), t.size());
  SwitchFigures out;
  out.sent = v[0], out.local = v[1];
  double* slow[4] = {&out.stall_ms, &out.build_ms, &out.plan_ms, &out.move_ms};
  for (size_t k = 0; k < 4; ++k) *slow[k] = *std::max_element(t.begin() + k * n, t.begin() + (k + 1) * n);
  out.peak.assign(v.begin() + 6, v.begin() + 6 + n);
  out.before.assign(v.begin() + 6 + n, v.end());
  return out;
}

void report_switch(const Decision& d, const std::string& from, const std::string& to, int64_t step,
                   const std::vector<int>& old_active, const std::vector<int>& members, const SwitchFigures& f,
                   const MoveFigures& mine, int64_t buffer, std::ofstream* metrics, const MpiEnv& env) {
  if (env.rank() != 0) return;
  const double peak = *std::max_element(f.peak.begin(), f.peak.end());
  const double before = *std::max_element(f.before.begin(), f.before.end());
  std::printf("piper: switch at step %" PRId64 " (%s): %zu rank(s) (%s) -> %zu rank(s) (%s); moved %s over the "
              "network and %s locally in %d rounds; step loop stalled %.1f ms (build %.1f, plan %.1f, move %.1f); "
              "peak %s during the switch (the last step's %s)\n",
              step, d.why.c_str(), old_active.size(), from.c_str(), d.active.size(), to.c_str(),
              human_bytes(static_cast<int64_t>(f.sent)).c_str(), human_bytes(static_cast<int64_t>(f.local)).c_str(),
              mine.rounds, f.stall_ms, f.build_ms, f.plan_ms, f.move_ms, human_bytes(static_cast<int64_t>(peak)).c_str(),
              human_bytes(static_cast<int64_t>(before)).c_str());
  if (!d.leaving.empty()) {
    std::string ranks;
    for (int r : d.leaving) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    std::printf("piper: rank(s) %s left the job\n", ranks.c_str());
  }
  std::fflush(stdout);
  if (!metrics) return;
  nlohmann::json j = {{"event", "switch"}, {"step", step}, {"why", d.why}, {"from", from}, {"to", to},
                      {"active_before", old_active}, {"active_after", d.active}, {"leaving", d.leaving},
                      {"members", members}, {"bytes_moved", f.sent}, {"bytes_local", f.local},
                      {"rounds", mine.rounds}, {"stall_ms", f.stall_ms}, {"build_ms", f.build_ms},
                      {"plan_ms", f.plan_ms}, {"move_ms", f.move_ms}, {"buffer_bytes", buffer},
                      {"peak_bytes", f.peak}, {"before_peak_bytes", f.before}, {"config_yaml", d.config_yaml}};
  *metrics << j.dump() << '\n';
  metrics->flush();
}

// A SWITCH decision on every member: the new strategy's config and plan, its communicator, the state
// moved, the old runtime dropped, the members and the active set renewed. Returns false on a process
// that left the job.
bool switch_strategy(Generation& gen, Membership& m, const Decision& d, int64_t last_peak,
                     std::unique_ptr<std::ofstream>& metrics, const TrainOptions& opts, MpiEnv& env) {
  const auto t0 = std::chrono::steady_clock::now();
  auto cfg = std::make_unique<config::Config>(config::parse(d.config_yaml, "the strategy of " + d.why));
  cfg->switches = gen.cfg->switches;
  auto plan = std::make_unique<ir::Plan>(ir::compile(*cfg, static_cast<int>(d.active.size())));
  if (gen.ckpt) gen.ckpt->wait();  // a background save of the old state finishes first
  const int64_t step = gen.rt ? gen.rt->position().step : 0;
  const std::vector<int> old_active = m.active(), members = m.members();
  const std::string from = strategy_text(*gen.plan), to = strategy_text(*plan);

  Membership::Next next = m.split(d.active);
  MoveFigures fig;
  const int64_t buffer = static_cast<int64_t>(gen.cfg->train.switch_buffer_mb * 1024 * 1024);
  std::unique_ptr<RankRuntime> rt =
      move_state(gen.rt.get(), {gen.plan.get(), m.procs(old_active)}, *cfg, {plan.get(), m.procs(d.active)},
                 next.world.get(), m.member_comm(), buffer, fig);
  gen.ckpt.reset();
  gen.rt.reset();
  const double stall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const SwitchFigures f = gather_switch(fig, stall_ms, last_peak, m);
  m.commit(std::move(next), d.leaving);
  const bool leaving = std::find(d.leaving.begin(), d.leaving.end(), m.me()) != d.leaving.end();
  gen.cfg = std::move(cfg);
  gen.plan = std::move(plan);
  gen.rt = std::move(rt);
  if (gen.rt) gen.ckpt = std::make_unique<Checkpointer>(*gen.cfg, *gen.rt, env, *gen.tokenizer);
  if (leaving) return false;
  follow_metrics(metrics, opts, env);
  int64_t at = step;
  if (gen.rt) at = gen.rt->position().step;
  report_switch(d, from, to, at, old_active, members, f, fig, buffer, metrics.get(), env);
  return true;
}

// The steps from the runtime's position to train.steps, each with its hooks — the held-out loss when due,
// progress and metrics, a sample, the checkpoint — and the step boundary's decision after it: go on, stop, finish, or switch
// strategy. A process in reserve takes part in every decision and trains once a switch takes it in.
RunLog run_job(Generation& gen, Membership& m, Boundary& boundary, const TrainData& data,
               std::unique_ptr<std::ofstream>& metrics, const TrainOptions& opts, MpiEnv& env) {
  RunLog log;
  for (;;) {
    bool ran = false, finished = true;
    int64_t step = 0;
    if (gen.rt) {
      const config::Config& cfg = *gen.cfg;
      RankRuntime& rt = *gen.rt;
      if (rt.position().step < cfg.train.steps) {
        const StepResult r = run_step(rt, data, *m.world());
        if (log.step_ms.empty()) log.first_loss = r.loss;
        log.step_ms.push_back(r.ms);
        log.last_loss = r.loss;
        if (r.eval_loss) log.last_eval_loss = r.eval_loss;
        log.last_peak = r.mem.total_peak;
        report_step(r, rt, opts, metrics.get(), env);
        // The ranks of a data-parallel group hold the same units, so each group gathers ZeRO-3's shards together.
        if (rt.holds_whole_model() && cfg.train.sample_every > 0 && (r.step + 1) % cfg.train.sample_every == 0)
          rt.with_compute_values([&] {
            if (env.rank() == 0) print_sample(rt.model(), cfg, *data.tokenizer, r.step);
          });
        std::fflush(stdout);
        ran = true;
      }
      step = rt.position().step;
      finished = step >= cfg.train.steps;
    }
    const Decision d = boundary.exchange(m, *gen.cfg, step, finished, !gen.rt);
    const bool saved = gen.rt && checkpoint_at_boundary(gen, ran, d.event == Event::STOP, env);
    switch (d.event) {
      case Event::STOP:
        log.stopped = true;
        return log;
      case Event::FINISH:
        // The last step's checkpoint, unless the boundary just wrote it (or no step ran: a finished run resumed).
        if (gen.rt && !gen.cfg->checkpoint.dir.empty() && ran && !saved) gen.ckpt->save();
        return log;
      case Event::SWITCH:
        if (!switch_strategy(gen, m, d, log.last_peak, metrics, opts, env)) {
          log.left = true;
          return log;
        }
        break;
      case Event::CONTINUE:
        break;
    }
  }
}

void print_summary(const RunLog& log, RankRuntime& rt) {
  const config::TrainConfig& train = rt.config().train;
  if (log.step_ms.empty()) {
    std::printf("summary: the checkpoint had already completed all %" PRId64 " steps\n", train.steps);
    return;
  }
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - log.start).count();
  std::vector<double> sorted = log.step_ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const auto mem = rt.model().backend().memory();
  char held_out[48] = "";
  if (log.last_eval_loss) std::snprintf(held_out, sizeof held_out, " | held-out loss %.4f", *log.last_eval_loss);
  std::printf("summary: %" PRId64 " steps in %.1f s | loss %.4f -> %.4f%s | median step %.1f ms | "
              "%.0f tok/s | rank 0 peak memory %s (params %s, grads %s, optimizer %s, activations %s, buffers %s)\n",
              static_cast<int64_t>(log.step_ms.size()), total_s, log.first_loss, log.last_loss, held_out, median,
              static_cast<double>(train.global_batch * train.seq_len) / (median / 1000.0),
              human_bytes(mem.total_peak).c_str(), human_bytes(mem.peak[0]).c_str(),
              human_bytes(mem.peak[1]).c_str(), human_bytes(mem.peak[2]).c_str(),
              human_bytes(mem.peak[3]).c_str(), human_bytes(mem.peak[4]).c_str());
}

// The end of a run on a rank that trains: a background save finished, the trace written, and unless a
// signal stopped it, the final parameters and the summary.
void wrap_up(Generation& gen, const RunLog& log, TraceRecorder* recorder, const TrainOptions& opts, MpiEnv& env) {
  gen.ckpt->wait();  // a background save finishes before the job does
  std::fflush(stdout);
  if (recorder) write_trace(*recorder, *gen.plan, gen.cfg->source, opts.trace_path, env.rank(), env.world_size());
  if (log.stopped) return;
  if (!opts.dump_final_path.empty()) dump_params(opts.dump_final_path, *gen.rt, env);
  if (env.rank() == 0) print_summary(log, *gen.rt);
}

}  // namespace

std::string human_bytes(int64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  return s;
}

void train(const config::Config& cfg, const TrainOptions& opts, MpiEnv& env) try {
  if (cfg.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg.train.threads));
  const TraceSteps trace_steps = check_trace_options(opts);
  const bool elastic = cfg.train.standby > 0 || !cfg.switches.empty() || !cfg.train.switch_file.empty();
  if (elastic && !opts.trace_path.empty())
    throw UserError("--trace " + opts.trace_path + ": a trace covers one strategy on one set of ranks, and this "
                    "run can switch (train.standby, switch: or train.switch_file); trace a run without them");
  const int processes = env.world_size();
  if (cfg.train.standby >= processes)
    throw UserError("train.standby=" + std::to_string(cfg.train.standby) + ": the job has " +
                    std::to_string(processes) + " process(es), and at least one must train; keep at most " +
                    std::to_string(processes - 1) + " in reserve");
  try {
    (void)backend_of(cfg);  // a device this machine lacks, or one the model cannot compute on, ends the job first
  } catch (const std::runtime_error& e) {
    throw UserError(std::string("train.device: ") + e.what());
  }
  const TrainData data = open_data(cfg, env);
  Membership members(env, static_cast<int>(cfg.train.standby), comm_options(cfg));

  Generation gen;
  gen.cfg = std::make_unique<config::Config>(cfg);
  gen.tokenizer = data.tokenizer.get();
  std::unique_ptr<std::ofstream> metrics;
  if (members.training()) {
    gen.plan = std::make_unique<ir::Plan>(compile_checked(cfg, env));
    gen.rt = std::make_unique<RankRuntime>(*gen.cfg, *gen.plan, *members.world());
    if (!opts.dump_init_path.empty()) dump_params(opts.dump_init_path, *gen.rt, env);
    metrics = open_outputs(opts, env);
    print_banner(cfg, *gen.rt, data, env, static_cast<int>(cfg.train.standby));
    gen.ckpt = std::make_unique<Checkpointer>(*gen.cfg, *gen.rt, env, *gen.tokenizer);
    gen.ckpt->preflight();
    if (!opts.resume.empty()) resume(*gen.ckpt, opts.resume, cfg, *members.world(), env);
  } else {
    gen.plan = std::make_unique<ir::Plan>(ir::compile(cfg, static_cast<int>(members.active().size())));
  }
  // Where a resumed run stands, on every member: the `switch:` entries behind it are passed over.
  double at = gen.rt && env.rank() == 0 ? static_cast<double>(gen.rt->position().step) : 0.0;
  members.member_comm().allreduce_double(&at, 1);
  Boundary boundary(cfg, processes, static_cast<int64_t>(at), env);
  install_signal_handlers();
  const std::unique_ptr<TraceRecorder> recorder =
      gen.rt ? start_trace(opts, trace_steps, *gen.rt, *members.world()) : nullptr;

  const RunLog log = run_job(gen, members, boundary, data, metrics, opts, env);
  if (log.left) return leave_job(members.me());
  if (gen.rt) wrap_up(gen, log, recorder.get(), opts, env);
  members.finish(!gen.rt, gen.cfg->parallel.comm_timeout_s);  // a process in reserve to the end waits here
} catch (const std::bad_alloc&) {
  out_of_memory(env);  // a user error with the memory figures, on every rank
}

}  // namespace piper::runtime
