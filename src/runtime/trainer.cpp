// trainer.cpp — the step loop around the executor.
#include "runtime/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/token_file.hpp"
#include "data/tokenizer.hpp"
#include "comm/mpi_comm.hpp"
#include "ir/compile.hpp"
#include "io/regular_file.hpp"
#include "ir/grid.hpp"
#include "kernels.hpp"
#include "model/model.hpp"
#include "runtime/checkpointing.hpp"
#include "runtime/executor.hpp"
#include "runtime/fit.hpp"
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

// Collects every unit's full values on rank 0 — gathering ZeRO-3 shards over
// the data-parallel group and tensor-parallel pieces into their global
// places — and writes them. Collective: every rank calls it.
void dump_params(const std::string& path, model::Model& m, const ir::Plan& plan, const ir::RankGrid& grid,
                 const Groups& groups, const MpiEnv& env) {
  model::ParamStore& ps = m.params();
  const int tp = ps.sharding().tp_size;
  std::map<int, std::vector<float>> values;
  for (const auto& unit : plan.model.units) {
    const int u = unit.index;
    std::vector<float> local;  // this rank's tp piece of the unit, all dp shards together
    if (ps.holds(u)) {
      local.resize(static_cast<size_t>(ps.padded_numel(u)));
      if (ps.sharding().zero >= 3)
        groups.dp->allgather(ps.shard_values(u), local.data(), static_cast<size_t>(ps.shard_len(u)));
      else
        std::copy(ps.values(u), ps.values(u) + ps.padded_numel(u), local.begin());
    }
    std::vector<float> global(env.rank() == 0 ? static_cast<size_t>(unit.param_count()) : 0);
    auto coords = grid.coords(plan.devices_of_unit[static_cast<size_t>(u)].front());
    for (int t = 0; t < tp; ++t) {
      coords["tp"] = t;
      const int src = grid.rank_of(coords);
      // Local sizes of tp rank t are those of every tp rank.
      int64_t n_local = 0;
      for (const auto& p : unit.params) {
        int64_t n = 1;
        for (int64_t d : ir::tp_local_shape(p, tp)) n *= d;
        n_local += n;
      }
      std::vector<float> piece;
      if (env.rank() == src) piece.assign(local.begin(), local.begin() + n_local);
      if (src != 0) {
        if (env.rank() == src) groups.world->send(piece.data(), static_cast<size_t>(n_local), 0, u * tp + t);
        if (env.rank() == 0) {
          piece.resize(static_cast<size_t>(n_local));
          groups.world->recv(piece.data(), static_cast<size_t>(n_local), src, u * tp + t);
        }
      }
      if (env.rank() != 0) continue;
      int64_t local_off = 0, global_off = 0;
      for (const auto& p : unit.params) {
        int64_t n = 1;
        for (int64_t d : ir::tp_local_shape(p, tp)) n *= d;
        for (int64_t j = 0; j < n; ++j)
          global[static_cast<size_t>(global_off + ir::tp_global_index(p, t, tp, j))] = piece[static_cast<size_t>(local_off + j)];
        local_off += n;
        global_off += p.numel();
      }
    }
    if (env.rank() == 0) values[u] = std::move(global);
  }
  if (env.rank() == 0) write_params(path, plan.model, values);
}

// The tokens of step `step`: samples g = step * global_batch + j (spec/MODEL.md,
// "Data order"), split into `n_mb` equal microbatches in sample order.
struct StepBatch {
  std::vector<int32_t> inputs, targets;  // [global_batch, T]
  std::vector<model::MicroBatch> mbs;
};

// Replica `replica` of `replicas` takes the contiguous share
// [replica * GB/replicas, (replica + 1) * GB/replicas) of the global batch.
void load_step(const data::TokenFile& tf, const config::Config& cfg, int64_t step, int n_mb, int replica,
               int replicas, StepBatch& b) {
  const int64_t GB = cfg.train.global_batch, T = cfg.train.seq_len, share = GB / replicas;
  b.inputs.resize(static_cast<size_t>(share * T));
  b.targets.resize(static_cast<size_t>(share * T));
  std::vector<int32_t> seq(static_cast<size_t>(T + 1));
  for (int64_t j = 0; j < share; ++j) {
    tf.sample(step * GB + replica * share + j, T, seq.data());
    std::copy(seq.begin(), seq.end() - 1, b.inputs.begin() + j * T);
    std::copy(seq.begin() + 1, seq.end(), b.targets.begin() + j * T);
  }
  const int64_t per = share / n_mb;
  const float scale = static_cast<float>(1.0 / static_cast<double>(GB * T));
  b.mbs.clear();
  for (int i = 0; i < n_mb; ++i)
    b.mbs.push_back({b.inputs.data() + i * per * T, b.targets.data() + i * per * T, per, T, scale});
}

void print_sample(model::Model& m, const config::Config& cfg, int64_t step) {
  data::ByteTokenizer tok;
  const std::vector<int32_t> prompt = tok.encode("The ");
  // A stop signal cuts the sample short: the checkpoint at the step boundary comes first.
  auto out = m.generate(prompt, cfg.train.sample_tokens, cfg.train.seq_len,
                        cfg.train.seed + static_cast<uint64_t>(step), 0.8f, [] { return g_stop_signal != 0; });
  std::printf("sample @ step %" PRId64 ": \"The %s\"\n", step, tok.decode_printable(out).c_str());
}

}  // namespace

std::string human_bytes(int64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  return s;
}

// Per-rank figures of a step, one slot of kRankFigures per rank, summed into
// place over the world so rank 0 can write them: compute, comm, idle ms; peak
// params, grads, optimizer, activations, buffers, total bytes; params, grads,
// optimizer bytes held after the step (the model state).
constexpr int kRankFigures = 12;

void train(const config::Config& cfg, const TrainOptions& opts, const MpiEnv& env) try {
  const bool lead = env.rank() == 0;
  if (cfg.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg.train.threads));
  const TraceSteps trace_steps = parse_trace_steps(opts.trace_steps);
  if (!opts.trace_steps.empty() && opts.trace_path.empty())
    throw UserError("--trace-steps " + opts.trace_steps + " needs --trace PATH, the file to write the trace to");

  // Every rank reads the token file; all stop if any cannot.
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

  ir::Plan plan = ir::compile(cfg, env.world_size());
  if (!env.all_equal(plan.hash))
    throw UserError("the ranks compiled different plans (rank " + std::to_string(env.rank()) +
                    " on " + env.host() + " has hash " + std::to_string(plan.hash) +
                    "); every rank must run the same piper binary with the same config");
  check_memory_fit(cfg, plan, env);  // refuses what cannot fit, before the model is allocated
  ir::Program program = ir::lower(plan.graph, env.rank());

  // Process groups from the rank grid, passed down explicitly.
  const ir::RankGrid grid(env.world_size(), plan.strategy.grid_order,
                          {{"tp", plan.strategy.shard.tp}, {"dp", plan.strategy.replicate.dp},
                           {"pp", plan.strategy.place.pp}});
  comm::CommOptions copts;
  copts.timeout_s = cfg.parallel.comm_timeout_s;
  std::unique_ptr<comm::Communicator> world = comm::make_mpi_world(copts);
  std::unique_ptr<comm::Communicator> dp = world->split(grid.group(env.rank(), "dp"), "dp");
  std::unique_ptr<comm::Communicator> tp = world->split(grid.group(env.rank(), "tp"), "tp");
  const Groups groups{world.get(), dp.get(), tp.get()};
  const int replica = grid.coord(env.rank(), "dp"), replicas = grid.size("dp");

  std::vector<int> held;
  for (const auto& in : program.compute)
    if (in.unit >= 0 && std::find(held.begin(), held.end(), in.unit) == held.end()) held.push_back(in.unit);
  std::sort(held.begin(), held.end());
  model::Model m(cfg.model, plan.model, held, backend::cpu(),
                 {replica, replicas, plan.strategy.replicate.zero, grid.coord(env.rank(), "tp"), grid.size("tp")},
                 tp.get());
  m.params().init(cfg.train.seed);
  if (!opts.dump_init_path.empty()) dump_params(opts.dump_init_path, m, plan, grid, groups, env);
  const size_t instrs_per_step = program.compute.size() + program.comm.size();
  Executor exec(m, std::move(program), cfg.train, groups);

  // Rank 0 writes the metrics; every rank learns whether it can, so a bad
  // path stops the whole job at once rather than leaving the others waiting.
  // A FIFO or a device is refused before it is opened (opening a FIFO for writing waits for a reader).
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
  const bool can_sample = held.size() == plan.model.units.size();
  const int64_t tokens_per_step = cfg.train.global_batch * cfg.train.seq_len;
  if (lead) {
    std::printf("piper: %" PRId64 " parameters, pattern %s, %d rank(s) (dp %d, tp %d, pp %d, zero %d, %s), "
                "%d thread(s), BLAS %s, plan %016" PRIx64 "\n",
                plan.model.param_count(), cfg.model.pattern.c_str(), env.world_size(), replicas,
                plan.strategy.shard.tp, plan.strategy.place.pp, plan.strategy.replicate.zero,
                plan.strategy.order.custom.empty() ? ir::schedule_name(plan.strategy.order.schedule) : "custom order",
                omp_get_max_threads(), kernels::blas_name(),
                plan.hash);
    if (cfg.train.sample_every > 0 && !can_sample)
      std::printf("piper: train.sample_every: samples need the whole model on one rank; none will be printed\n");
  }

  Checkpointer ckpt(cfg, plan, m, exec, env);
  ckpt.preflight();
  int64_t first_step = 0;
  if (!opts.resume.empty()) {
    // Timed from when every rank has arrived to when the slowest is done.
    if (world->size() > 1) world->barrier();
    const auto t_load = std::chrono::steady_clock::now();
    const int64_t done = ckpt.load(opts.resume);
    double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();
    if (world->size() > 1) {
      std::vector<double> all(static_cast<size_t>(world->size()), 0.0);
      all[static_cast<size_t>(env.rank())] = load_ms;
      world->allreduce_double(all.data(), all.size());
      load_ms = *std::max_element(all.begin(), all.end());
    }
    if (done < 0) {
      if (lead) std::printf("piper: no checkpoint in '%s' yet; starting from step 0\n", cfg.checkpoint.dir.c_str());
    } else {
      first_step = done;
      if (lead) std::printf("piper: resumed from %s at step %" PRId64 " (loaded in %.1f ms)\n", opts.resume.c_str(), done, load_ms);
    }
  }
  const bool saving = !cfg.checkpoint.dir.empty();
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);

  StepBatch batch;
  std::vector<double> step_ms;
  double first_loss = 0.0, last_loss = 0.0;
  // --trace: one time origin, taken as the ranks leave one barrier (on one
  // host exactly the same; across hosts, each host's barrier exit).
  std::unique_ptr<TraceRecorder> recorder;
  if (!opts.trace_path.empty()) {
    recorder = std::make_unique<TraceRecorder>(trace_steps, first_step, cfg.train.steps - 1, instrs_per_step);
    exec.set_recorder(recorder.get());
    recorder->set_origin(trace_origin(*world));
  }
  auto finish_trace = [&] {
    if (recorder) write_trace(*recorder, plan, cfg.source, opts.trace_path, env.rank(), env.world_size());
  };
  const auto t_start = std::chrono::steady_clock::now();
  int64_t saved_at = first_step;
  for (int64_t step = first_step; step < cfg.train.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    load_step(*tokens, cfg, step, plan.strategy.split.microbatches, replica, replicas, batch);
    m.backend().reset_peak();
    StepStats st = exec.run_step(step, batch.mbs);
    double loss_sum = st.loss_sum;
    if (world->size() > 1) world->allreduce_double(&loss_sum, 1);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double loss = loss_sum / static_cast<double>(tokens_per_step);
    const double tps = static_cast<double>(tokens_per_step) / (ms / 1000.0);
    // Per-rank time split and memory, one slot per rank, summed into place.
    const auto mem = m.backend().memory();
    std::vector<double> ranks(static_cast<size_t>(env.world_size() * kRankFigures), 0.0);
    double* mine = ranks.data() + env.rank() * kRankFigures;
    for (int c = 0; c < 3; ++c) mine[9 + c] = static_cast<double>(mem.current[static_cast<size_t>(c)]);
    mine[0] = st.compute_ms, mine[1] = st.comm_ms, mine[2] = st.idle_ms;
    for (int c = 0; c < backend::kMemCategoryCount; ++c) mine[3 + c] = static_cast<double>(mem.peak[static_cast<size_t>(c)]);
    mine[8] = static_cast<double>(mem.total_peak);
    if (world->size() > 1) world->allreduce_double(ranks.data(), ranks.size());
    step_ms.push_back(ms);
    if (step == first_step) first_loss = loss;
    last_loss = loss;
    if (lead && !opts.quiet && (step % cfg.train.log_every == 0 || step + 1 == cfg.train.steps))
      std::printf("step %5" PRId64 " | loss %.4f | lr %.3e | grad norm %.4f | %8.0f tok/s | %7.1f ms\n",
                  step, loss, st.lr, st.grad_norm, tps, ms);
    if (metrics) {
      nlohmann::json per_rank = nlohmann::json::array();
      for (int r = 0; r < env.world_size(); ++r) {
        const double* f = ranks.data() + r * kRankFigures;
        per_rank.push_back({{"rank", r},
                            {"compute_ms", f[0]},
                            {"comm_ms", f[1]},
                            {"idle_ms", f[2]},
                            {"peak_mem_bytes", f[8]},
                            {"mem_bytes", {{"params", f[3]}, {"grads", f[4]}, {"optimizer", f[5]},
                                           {"activations", f[6]}, {"buffers", f[7]}}},
                            {"state_bytes", {{"params", f[9]}, {"grads", f[10]}, {"optimizer", f[11]}}}});
      }
      nlohmann::json j = {{"step", step},       {"loss", loss},        {"grad_norm", st.grad_norm},
                          {"lr", st.lr},        {"tokens_per_s", tps}, {"step_ms", ms},
                          {"tokens", (step + 1) * tokens_per_step},    {"peak_mem_bytes", mem.total_peak},
                          {"ranks", per_rank}};
      *metrics << j.dump() << '\n';
      metrics->flush();
    }
    if (lead && can_sample && cfg.train.sample_every > 0 && (step + 1) % cfg.train.sample_every == 0)
      print_sample(m, cfg, step);
    std::fflush(stdout);
    // Step boundary: a signal on any rank stops every rank, after a checkpoint.
    const bool stop = env.any(g_stop_signal != 0);
    if (saving && (stop || (cfg.checkpoint.every > 0 && (step + 1) % cfg.checkpoint.every == 0))) {
      ckpt.save(step + 1);
      if (stop) ckpt.wait();  // the job ends: the file must be complete
      saved_at = step + 1;
    } else {
      ckpt.poll();
    }
    if (stop) {
      if (lead)
        std::printf(saving ? "piper: checkpointed at step %" PRId64 " after signal\n"
                           : "piper: stopped at step %" PRId64 " after signal (no checkpoint.dir)\n",
                    step + 1);
      std::fflush(stdout);
      finish_trace();
      return;
    }
  }
  if (saving && saved_at < cfg.train.steps) ckpt.save(cfg.train.steps);
  ckpt.wait();  // a background save finishes before the job does
  finish_trace();
  if (!opts.dump_final_path.empty()) dump_params(opts.dump_final_path, m, plan, grid, groups, env);
  if (!lead) return;
  if (step_ms.empty()) {
    std::printf("summary: the checkpoint had already completed all %" PRId64 " steps\n", cfg.train.steps);
    return;
  }
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::vector<double> sorted = step_ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const auto mem = m.backend().memory();
  std::printf("summary: %" PRId64 " steps in %.1f s | loss %.4f -> %.4f | median step %.1f ms | "
              "%.0f tok/s | rank 0 peak memory %s (params %s, grads %s, optimizer %s, activations %s, buffers %s)\n",
              static_cast<int64_t>(step_ms.size()), total_s, first_loss, last_loss, median,
              static_cast<double>(tokens_per_step) / (median / 1000.0), human_bytes(mem.total_peak).c_str(),
              human_bytes(mem.peak[0]).c_str(), human_bytes(mem.peak[1]).c_str(),
              human_bytes(mem.peak[2]).c_str(), human_bytes(mem.peak[3]).c_str(),
              human_bytes(mem.peak[4]).c_str());
} catch (const std::bad_alloc&) {
  out_of_memory(env);  // a user error with the memory figures, on every rank
}

}  // namespace piper::runtime
