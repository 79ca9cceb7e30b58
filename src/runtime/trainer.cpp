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
#include "runtime/fit.hpp"
#include "runtime/rank_runtime.hpp"
#include "runtime/tracing.hpp"

namespace piper::runtime {

namespace {

// SIGTERM / SIGUSR1 (what Slurm sends before a time limit or a preemption):
// every rank checkpoints at the next step boundary and exits cleanly.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

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
// parts' padding: ZeRO-3 shards gathered over each part's group.
std::vector<float> local_values(model::ParamStore& ps, const Groups& groups, int u) {
  std::vector<float> full(static_cast<size_t>(ps.padded_numel(u)));
  if (ps.sharding().zero(u) >= 3) {
    for (const ir::FlatPart& p : ps.parts(u))
      (p.experts ? groups.edp : groups.dp)
          ->allgather(ps.shard_values(u, p), full.data() + p.full_offset, static_cast<size_t>(p.zero.len));
  } else {
    std::copy(ps.values(u), ps.values(u) + ps.padded_numel(u), full.begin());
  }
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
  const Groups& groups = rt.groups();
  model::ParamStore& ps = rt.model().params();
  const ir::Degrees degrees = grid.degrees();
  const int tp = degrees.tp, ep = degrees.ep;
  std::map<int, std::vector<float>> values;
  for (const auto& unit : plan.model.units) {
    const int u = unit.index;
    const std::vector<float> local = ps.holds(u) ? local_values(ps, groups, u) : std::vector<float>{};
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
        if (env.rank() == src) groups.world->send(piece.data(), static_cast<size_t>(n_local), 0, tag);
        if (env.rank() == 0) {
          piece.resize(static_cast<size_t>(n_local));
          groups.world->recv(piece.data(), static_cast<size_t>(n_local), src, tag);
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

void print_sample(model::Model& m, const config::Config& cfg, int64_t step) {
  data::ByteTokenizer tok;
  const std::vector<int32_t> prompt = tok.encode("The ");
  // A stop signal cuts the sample short: the checkpoint at the step boundary comes first.
  auto out = m.generate(prompt, cfg.train.sample_tokens, cfg.train.seq_len,
                        cfg.train.seed + static_cast<uint64_t>(step), 0.8f, [] { return g_stop_signal != 0; });
  std::printf("sample @ step %" PRId64 ": \"The %s\"\n", step, tok.decode_printable(out).c_str());
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

// Every rank reads the token file; all stop if any cannot.
std::unique_ptr<data::TokenFile> open_tokens(const config::Config& cfg, const MpiEnv& env) {
  std::unique_ptr<data::TokenFile> tokens;
  std::string data_error;
  try {
    tokens = std::make_unique<data::TokenFile>(cfg.data.path);
    data::check_vocab(*tokens, cfg.model.vocab_size);
  } catch (const data::DataError& e) {
    data_error = std::string("data.path: ") + e.what();
  }
  if (env.any(!data_error.empty()))
    throw UserError(!data_error.empty() ? data_error
                                        : "data.path: another rank could not read '" + cfg.data.path +
                                              "'; every rank needs the token file (a shared file system or a copy per node)");
  return tokens;
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

std::unique_ptr<comm::Communicator> make_world(const config::Config& cfg) {
  comm::CommOptions copts;
  copts.timeout_s = cfg.parallel.comm_timeout_s;
  return comm::make_mpi_world(copts);
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

void print_banner(const config::Config& cfg, const RankRuntime& rt, const MpiEnv& env) {
  if (env.rank() != 0) return;
  const ir::Plan& plan = rt.plan();
  // One ZeRO stage, or the stage of each unit where they differ.
  const std::vector<int>& zero = plan.strategy.replicate.zero_of_unit;
  std::string zero_text;
  for (size_t u = 0; u < zero.size(); ++u) zero_text += (u ? "," : "") + std::to_string(zero[u]);
  if (std::count(zero.begin(), zero.end(), zero.front()) == static_cast<std::ptrdiff_t>(zero.size()))
    zero_text = std::to_string(zero.front());
  const std::string ep_text = plan.strategy.shard.ep > 1 ? ", ep " + std::to_string(plan.strategy.shard.ep) : "";
  std::printf("piper: %" PRId64 " parameters, pattern %s, %d rank(s) (dp %d, tp %d, pp %d%s, zero %s, %s), "
              "%d thread(s), BLAS %s, plan %016" PRIx64 "\n",
              plan.model.param_count(), cfg.model.pattern.c_str(), env.world_size(), rt.replicas(),
              plan.strategy.shard.tp, plan.strategy.place.pp, ep_text.c_str(), zero_text.c_str(),
              plan.strategy.order.custom.empty() ? ir::schedule_name(plan.strategy.order.schedule) : "custom order",
              omp_get_max_threads(), kernels::blas_name(), plan.hash);
  if (cfg.train.sample_every > 0 && !rt.holds_whole_model())
    std::printf("piper: train.sample_every: samples need the whole model on one rank; none will be printed\n");
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
};

StepResult run_step(RankRuntime& rt, const data::TokenFile& tokens, comm::Communicator& world) {
  const config::TrainConfig& train = rt.config().train;
  const int64_t tokens_per_step = train.global_batch * train.seq_len;
  StepResult r;
  r.step = rt.position().step;
  const auto t0 = std::chrono::steady_clock::now();
  r.stats = rt.step(tokens);
  double loss_sum = r.stats.loss_sum;
  if (world.size() > 1) world.allreduce_double(&loss_sum, 1);
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.routing = routing_of(rt, train, world);
  r.loss = loss_sum / static_cast<double>(tokens_per_step);
  r.tokens_per_s = static_cast<double>(tokens_per_step) / (r.ms / 1000.0);
  r.mem = rt.model().backend().memory();
  r.ranks = gather_figures(figures_of(r.stats, r.mem), world);
  return r;
}

// The progress line (rank 0) and one JSON line of --metrics.
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
  *metrics << j.dump() << '\n';
  metrics->flush();
}

// What the loop leaves for the summary.
struct RunLog {
  std::vector<double> step_ms;
  double first_loss = 0.0, last_loss = 0.0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  bool stopped = false;  // by a signal
};

// Step boundary: a signal on any rank stops every rank, after a checkpoint.
// Returns whether the run stops here.
bool at_step_boundary(Checkpointer& ckpt, const RankRuntime& rt, const MpiEnv& env, int64_t& saved_at) {
  const config::Config& cfg = rt.config();
  const int64_t done = rt.position().step;
  const bool saving = !cfg.checkpoint.dir.empty();
  const bool stop = env.any(g_stop_signal != 0);
  if (saving && (stop || (cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0))) {
    ckpt.save();
    if (stop) ckpt.wait();  // the job ends: the file must be complete
    saved_at = done;
  } else {
    ckpt.poll();
  }
  if (stop && env.rank() == 0)
    std::printf(saving ? "piper: checkpointed at step %" PRId64 " after signal\n"
                       : "piper: stopped at step %" PRId64 " after signal (no checkpoint.dir)\n",
                done);
  return stop;
}

// The steps from the runtime's position to train.steps, each with its hooks:
// progress and metrics, a sample, the checkpoint or the stop; a last
// checkpoint at the end when the last step has none.
RunLog run_steps(RankRuntime& rt, const data::TokenFile& tokens, Checkpointer& ckpt, std::ofstream* metrics,
                 const TrainOptions& opts, comm::Communicator& world, const MpiEnv& env) {
  const config::Config& cfg = rt.config();
  RunLog log;
  int64_t saved_at = rt.position().step;
  while (rt.position().step < cfg.train.steps) {
    const StepResult r = run_step(rt, tokens, world);
    if (log.step_ms.empty()) log.first_loss = r.loss;
    log.step_ms.push_back(r.ms);
    log.last_loss = r.loss;
    report_step(r, rt, opts, metrics, env);
    if (env.rank() == 0 && rt.holds_whole_model() && cfg.train.sample_every > 0 &&
        (r.step + 1) % cfg.train.sample_every == 0)
      print_sample(rt.model(), cfg, r.step);
    std::fflush(stdout);
    if (at_step_boundary(ckpt, rt, env, saved_at)) {
      log.stopped = true;
      return log;
    }
  }
  if (!cfg.checkpoint.dir.empty() && saved_at < cfg.train.steps) ckpt.save();
  return log;
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
  std::printf("summary: %" PRId64 " steps in %.1f s | loss %.4f -> %.4f | median step %.1f ms | "
              "%.0f tok/s | rank 0 peak memory %s (params %s, grads %s, optimizer %s, activations %s, buffers %s)\n",
              static_cast<int64_t>(log.step_ms.size()), total_s, log.first_loss, log.last_loss, median,
              static_cast<double>(train.global_batch * train.seq_len) / (median / 1000.0),
              human_bytes(mem.total_peak).c_str(), human_bytes(mem.peak[0]).c_str(),
              human_bytes(mem.peak[1]).c_str(), human_bytes(mem.peak[2]).c_str(),
              human_bytes(mem.peak[3]).c_str(), human_bytes(mem.peak[4]).c_str());
}

}  // namespace

std::string human_bytes(int64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  return s;
}

void train(const config::Config& cfg, const TrainOptions& opts, const MpiEnv& env) try {
  if (cfg.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg.train.threads));
  const TraceSteps trace_steps = check_trace_options(opts);
  const std::unique_ptr<data::TokenFile> tokens = open_tokens(cfg, env);
  ir::Plan plan = compile_checked(cfg, env);
  const std::unique_ptr<comm::Communicator> world = make_world(cfg);
  RankRuntime rt(cfg, std::move(plan), *world);
  if (!opts.dump_init_path.empty()) dump_params(opts.dump_init_path, rt, env);
  const std::unique_ptr<std::ofstream> metrics = open_outputs(opts, env);
  print_banner(cfg, rt, env);

  Checkpointer ckpt(cfg, rt, env);
  ckpt.preflight();
  if (!opts.resume.empty()) resume(ckpt, opts.resume, cfg, *world, env);
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);
  const std::unique_ptr<TraceRecorder> recorder = start_trace(opts, trace_steps, rt, *world);

  const RunLog log = run_steps(rt, *tokens, ckpt, metrics.get(), opts, *world, env);
  ckpt.wait();  // a background save finishes before the job does
  std::fflush(stdout);
  if (recorder) write_trace(*recorder, rt.plan(), cfg.source, opts.trace_path, env.rank(), env.world_size());
  if (log.stopped) return;
  if (!opts.dump_final_path.empty()) dump_params(opts.dump_final_path, rt, env);
  if (env.rank() == 0) print_summary(log, rt);
} catch (const std::bad_alloc&) {
  out_of_memory(env);  // a user error with the memory figures, on every rank
}

}  // namespace piper::runtime
