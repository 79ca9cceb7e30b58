// trainer.cpp — the step loop around the executor.
#include "runtime/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/token_file.hpp"
#include "data/tokenizer.hpp"
#include "ir/compile.hpp"
#include "kernels.hpp"
#include "model/model.hpp"
#include "runtime/executor.hpp"

namespace piper::runtime {

namespace {

// PIPERPRM: magic, u32 version 1, u32 count; per tensor u32 name length, name,
// u32 ndim, i64 dims, float32 data (little-endian, row-major).
void dump_params(const std::string& path, model::Model& m) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw UserError("cannot write parameters to '" + path + "'");
  auto u32 = [&](uint32_t v) { f.write(reinterpret_cast<const char*>(&v), 4); };
  f.write("PIPERPRM", 8);
  u32(1);
  u32(static_cast<uint32_t>(m.params().params().size()));
  for (const auto& r : m.params().params()) {
    u32(static_cast<uint32_t>(r.spec->name.size()));
    f.write(r.spec->name.data(), static_cast<std::streamsize>(r.spec->name.size()));
    u32(static_cast<uint32_t>(r.spec->shape.size()));
    for (int64_t d : r.spec->shape) f.write(reinterpret_cast<const char*>(&d), 8);
    f.write(reinterpret_cast<const char*>(m.params().values(r.unit) + r.offset),
            static_cast<std::streamsize>(r.spec->numel() * 4));
  }
}

// The tokens of step `step`: samples g = step * global_batch + j (spec/MODEL.md,
// "Data order"), split into `n_mb` equal microbatches in sample order.
struct StepBatch {
  std::vector<int32_t> inputs, targets;  // [global_batch, T]
  std::vector<model::MicroBatch> mbs;
};

void load_step(const data::TokenFile& tf, const config::Config& cfg, int64_t step, int n_mb,
               StepBatch& b) {
  const int64_t GB = cfg.train.global_batch, T = cfg.train.seq_len;
  b.inputs.resize(static_cast<size_t>(GB * T));
  b.targets.resize(static_cast<size_t>(GB * T));
  std::vector<int32_t> seq(static_cast<size_t>(T + 1));
  for (int64_t j = 0; j < GB; ++j) {
    tf.sample(step * GB + j, T, seq.data());
    std::copy(seq.begin(), seq.end() - 1, b.inputs.begin() + j * T);
    std::copy(seq.begin() + 1, seq.end(), b.targets.begin() + j * T);
  }
  const int64_t per = GB / n_mb;
  const float scale = static_cast<float>(1.0 / static_cast<double>(GB * T));
  b.mbs.clear();
  for (int i = 0; i < n_mb; ++i)
    b.mbs.push_back({b.inputs.data() + i * per * T, b.targets.data() + i * per * T, per, T, scale});
}

std::string human_bytes(int64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  return s;
}

void print_sample(model::Model& m, const config::Config& cfg, int64_t step) {
  data::ByteTokenizer tok;
  const std::vector<int32_t> prompt = tok.encode("The ");
  auto out = m.generate(prompt, cfg.train.sample_tokens, cfg.train.seq_len, cfg.train.seed + static_cast<uint64_t>(step), 0.8f);
  std::printf("sample @ step %" PRId64 ": \"The %s\"\n", step, tok.decode_printable(out).c_str());
}

}  // namespace

void train(const config::Config& cfg, const TrainOptions& opts, const MpiEnv& env) {
  const bool lead = env.rank() == 0;
  if (cfg.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg.train.threads));

  std::unique_ptr<data::TokenFile> tokens;
  try {
    tokens = std::make_unique<data::TokenFile>(cfg.data.path);
    data::check_vocab(*tokens, cfg.model.vocab_size);
  } catch (const data::DataError& e) {
    throw UserError(std::string("data.path: ") + e.what());
  }

  ir::Plan plan = ir::compile(cfg, env.world_size());
  if (!env.all_equal(plan.hash))
    throw UserError("the ranks compiled different plans (rank " + std::to_string(env.rank()) +
                    " on " + env.host() + " has hash " + std::to_string(plan.hash) +
                    "); every rank must run the same piper binary with the same config");
  ir::Program program = ir::lower(plan.graph, env.rank());

  std::vector<int> held;
  for (const auto& in : program.compute)
    if (std::find(held.begin(), held.end(), in.unit) == held.end()) held.push_back(in.unit);
  std::sort(held.begin(), held.end());
  model::Model m(cfg.model, plan.model, held, backend::cpu());
  m.params().init(cfg.train.seed);
  if (!opts.dump_init_path.empty() && lead) dump_params(opts.dump_init_path, m);
  Executor exec(m, std::move(program), cfg.train);

  std::unique_ptr<std::ofstream> metrics;
  if (!opts.metrics_path.empty() && lead) {
    metrics = std::make_unique<std::ofstream>(opts.metrics_path, std::ios::trunc);
    if (!*metrics) throw UserError("--metrics: cannot write '" + opts.metrics_path + "'");
  }
  const int64_t tokens_per_step = cfg.train.global_batch * cfg.train.seq_len;
  if (lead)
    std::printf("piper: %" PRId64 " parameters, pattern %s, %d rank(s), %d thread(s), BLAS %s, "
                "plan %016" PRIx64 "\n",
                plan.model.param_count(), cfg.model.pattern.c_str(), env.world_size(),
                omp_get_max_threads(), kernels::blas_name(), plan.hash);

  StepBatch batch;
  std::vector<double> step_ms;
  double first_loss = 0.0, last_loss = 0.0;
  const auto t_start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < cfg.train.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    load_step(*tokens, cfg, step, plan.strategy.split.microbatches, batch);
    StepStats st = exec.run_step(step, batch.mbs);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double loss = st.loss_sum / static_cast<double>(tokens_per_step);
    const double tps = static_cast<double>(tokens_per_step) / (ms / 1000.0);
    step_ms.push_back(ms);
    if (step == 0) first_loss = loss;
    last_loss = loss;
    if (!lead) continue;
    if (!opts.quiet && (step % cfg.train.log_every == 0 || step + 1 == cfg.train.steps))
      std::printf("step %5" PRId64 " | loss %.4f | lr %.3e | grad norm %.4f | %8.0f tok/s | %7.1f ms\n",
                  step, loss, st.lr, st.grad_norm, tps, ms);
    if (metrics) {
      const auto mem = m.backend().memory();
      nlohmann::json j = {{"step", step},         {"loss", loss},          {"grad_norm", st.grad_norm},
                          {"lr", st.lr},          {"tokens_per_s", tps},   {"step_ms", ms},
                          {"tokens", (step + 1) * tokens_per_step},
                          {"peak_mem_bytes", mem.total_peak}};
      *metrics << j.dump() << '\n';
      metrics->flush();
    }
    if (cfg.train.sample_every > 0 && (step + 1) % cfg.train.sample_every == 0) print_sample(m, cfg, step);
    std::fflush(stdout);
  }
  if (!lead) return;
  if (!opts.dump_final_path.empty()) dump_params(opts.dump_final_path, m);
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::vector<double> sorted = step_ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const auto mem = m.backend().memory();
  std::printf("summary: %" PRId64 " steps in %.1f s | loss %.4f -> %.4f | median step %.1f ms | "
              "%.0f tok/s | peak memory %s (params %s, grads %s, optimizer %s, activations %s, buffers %s)\n",
              cfg.train.steps, total_s, first_loss, last_loss, median,
              static_cast<double>(tokens_per_step) / (median / 1000.0), human_bytes(mem.total_peak).c_str(),
              human_bytes(mem.peak[0]).c_str(), human_bytes(mem.peak[1]).c_str(),
              human_bytes(mem.peak[2]).c_str(), human_bytes(mem.peak[3]).c_str(),
              human_bytes(mem.peak[4]).c_str());
}

}  // namespace piper::runtime
