// main.cpp — the piper command line: train, plan, simulate, plan-switch, tune, calibrate, plot, prepare,
// generate, ckpt.
#include <algorithm>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/files.hpp"
#include "cli/commands.hpp"
#include "config/config.hpp"
#include "data/prepare.hpp"
#include "data/tokenizer.hpp"
#include "ir/compile.hpp"
#include "ir/validate.hpp"
#include "runtime/generate.hpp"
#include "runtime/mpi_env.hpp"
#include "runtime/trainer.hpp"
#include "sim/simulator.hpp"

namespace {

using namespace piper;
using cli::is_user_error;
using cli::kExitUsage;

int run_plan(const std::string& path, const std::vector<std::string>& sets, int world,
             bool directives) {
  config::Config cfg = config::load(path, sets);
  ir::validate(cfg, world);
  ir::Plan plan = ir::compile(cfg, world);
  if (directives) {
    std::fputs(ir::directives_yaml(plan.strategy, plan.model).c_str(), stdout);
    return 0;
  }
  std::fputs(ir::summary(plan.graph, plan.model).c_str(), stdout);
  for (int r = 0; r < world; ++r)
    std::fputs(ir::format_program(ir::lower(plan.graph, r), plan.model).c_str(), stdout);
  return 0;
}

// piper ckpt inspect|verify PATH
int run_ckpt(const std::string& where, bool verify) {
  runtime::MpiEnv env(nullptr, nullptr);  // parallel HDF5 needs MPI, even on one process
  const std::string path = checkpoint::resolve(where);
  const checkpoint::Inspection in = checkpoint::inspect(path, verify);
  std::printf("checkpoint %s (%.1f MiB)\n  format %d, step %lld, tokens seen %lld, data position %lld, seed %llu\n",
              path.c_str(), static_cast<double>(in.bytes) / (1 << 20), in.meta.format_version,
              static_cast<long long>(in.meta.step), static_cast<long long>(in.meta.tokens_seen),
              static_cast<long long>(in.meta.data_position), static_cast<unsigned long long>(in.meta.seed));
  if (in.meta.tokenizer_model.empty())
    std::printf("  tokenizer: %s\n", in.meta.tokenizer.c_str());
  else
    std::printf("  tokenizer: %s (a model of %zu bytes, hash %llu)\n", in.meta.tokenizer.c_str(),
                in.meta.tokenizer_model.size(),
                static_cast<unsigned long long>(data::model_hash(in.meta.tokenizer_model)));
  std::printf("  strategy:\n%s", in.meta.strategy.c_str());
  int bad = 0;
  std::printf("  %zu tensors:\n", in.datasets.size());
  for (const auto& d : in.datasets) {
    std::string shape;
    for (size_t i = 0; i < d.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(d.shape[i]);
    std::printf("    %-52s [%s]%s\n", d.name.c_str(), shape.c_str(),
                verify ? (d.checksum_ok ? "  checksum ok" : "  CHECKSUM MISMATCH") : "");
    bad += verify && !d.checksum_ok;
  }
  if (!verify) std::printf("  config:\n%s", in.meta.config_yaml.c_str());
  if (verify) std::printf("%s: %d of %zu tensors failed their checksum\n", bad ? "FAILED" : "ok", bad, in.datasets.size());
  return bad ? kExitUsage : 0;
}

// piper generate CHECKPOINT --prompt TEXT
int run_generate(const runtime::GenerateOptions& o) {
  runtime::MpiEnv env(nullptr, nullptr);  // loading a checkpoint is parallel HDF5: MPI, on one process
  const runtime::Generated g = runtime::generate(o, env);
  std::printf("%s\n", g.text.c_str());
  std::fprintf(stderr, "piper generate: step %lld, %s tokenizer, %lld prompt + %lld new tokens\n",
               static_cast<long long>(g.step), g.tokenizer.c_str(), static_cast<long long>(g.prompt_tokens),
               static_cast<long long>(g.new_tokens));
  return 0;
}

// piper prepare INPUT... -o OUT
int run_prepare(const std::vector<std::string>& inputs, const std::string& out, const data::PrepareOptions& o) {
  const data::Prepared p = data::prepare(inputs, out, o);
  std::printf("piper prepare: wrote %lld tokens (%s, vocab %d) from %lld bytes to %s in %.2f s: %.0f tokens/s, "
              "%.2f bytes/token\n",
              static_cast<long long>(p.tokens), data::kind_name(p.kind), p.vocab_size, static_cast<long long>(p.bytes),
              out.c_str(), p.seconds, static_cast<double>(p.tokens) / std::max(p.seconds, 1e-9),
              static_cast<double>(p.bytes) / static_cast<double>(p.tokens));
  if (o.train.vocab_size > 0)
    std::printf("piper prepare: trained the tokenizer model %s in %.1f s\n", p.model_path.c_str(), p.train_seconds);
  else if (!p.model_path.empty())
    std::printf("piper prepare: tokenizer model %s\n", p.model_path.c_str());
  return 0;
}

int run_train(int* argc, char*** argv, const std::string& path, const std::vector<std::string>& sets,
              const runtime::TrainOptions& opts) {
  runtime::MpiEnv env(argc, argv);
  try {
    config::Config cfg = config::load(path, sets);
    env.set_timeout(cfg.parallel.comm_timeout_s);
    ir::validate(cfg, std::max(1, env.world_size() - static_cast<int>(cfg.train.standby)));
    runtime::train(cfg, opts, env);
    return 0;
  } catch (const std::exception& e) {
    return cli::job_failed(e, env);
  }
}


// Every subcommand's settings, as parsing fills them in.
struct Commands {
  std::string config_path;  // train, plan
  std::vector<std::string> sets;
  runtime::TrainOptions train;
  CLI::Option* resume = nullptr;
  std::string ckpt_path;
  CLI::App* verify = nullptr;
  int world = 1;  // plan
  bool directives = false;
  cli::SimulateArgs simulate;
  cli::PlanSwitchArgs plan_switch;
  cli::TuneArgs tune;
  cli::PlotArgs plot;
  cli::CalibrateArgs calibrate;
  std::string out_path;  // prepare
  std::vector<std::string> inputs;
  data::PrepareOptions prep;
  bool prep_quiet = false;
  runtime::GenerateOptions generate;
};

CLI::App* add_train(CLI::App& app, Commands& c) {
  runtime::TrainOptions& topts = c.train;
  auto* train = app.add_subcommand("train", "Train the model of CONFIG with its parallel strategy");
  train->add_option("config", c.config_path, "YAML config (docs/config.md)")->required();
  train->add_option("--set", c.sets, "Override a config key: --set train.steps=50 (repeatable)");
  train->add_option("--metrics", topts.metrics_path, "Write one JSON object per step to PATH");
  train->add_option("--dump-init", topts.dump_init_path,
                    "Write the initial parameters to PATH (PIPERPRM format, docs/data.md)");
  train->add_option("--dump-final", topts.dump_final_path,
                    "Write the parameters after the last step to PATH (PIPERPRM format)");
  train->add_flag("--quiet", topts.quiet, "No per-step progress lines");
  train->add_option("--trace", topts.trace_path,
                    "Write a Chrome trace (Perfetto) of every rank's instructions to PATH (docs/trace.md)");
  train->add_option("--trace-steps", topts.trace_steps, "With --trace: record only steps A..B, as A:B (0-based)");
  c.resume = train->add_option("--resume", topts.resume,
                               "Resume from a checkpoint: PATH (a .h5 file or a folder), or latest in "
                               "checkpoint.dir (the default when no value is given)")
                 ->expected(0, 1);
  return train;
}

CLI::App* add_ckpt(CLI::App& app, Commands& c) {
  auto* ckpt = app.add_subcommand("ckpt", "Look into a checkpoint");
  ckpt->require_subcommand(1);
  auto* inspect = ckpt->add_subcommand("inspect", "Step, config, strategy, tensors, sizes and checksum status");
  inspect->add_option("path", c.ckpt_path, "Checkpoint file, folder or latest pointer")->required();
  c.verify = ckpt->add_subcommand("verify", "Read every tensor and check its checksum; exit 0 when all match");
  c.verify->add_option("path", c.ckpt_path, "Checkpoint file, folder or latest pointer")->required();
  return ckpt;
}

CLI::App* add_plan(CLI::App& app, Commands& c) {
  auto* plan = app.add_subcommand("plan", "Print the global training DAG and each rank's program");
  plan->add_option("config", c.config_path, "YAML config")->required();
  plan->add_option("--set", c.sets, "Override a config key (repeatable)");
  // plan lowers every rank's program, as the simulator does: the same world limit.
  plan->add_option("--world", c.world, "World size to compile for")->check(CLI::Range(1, sim::kMaxWorld));
  plan->add_flag("--directives", c.directives, "Print the directives the parallel shorthand expands to");
  return plan;
}

CLI::App* add_simulate(CLI::App& app, Commands& c) {
  cli::SimulateArgs& sim_args = c.simulate;
  auto* simulate = app.add_subcommand("simulate", "Predict each rank's timeline, step time, bubble and memory");
  simulate->add_option("config", sim_args.config, "YAML config")->required();
  simulate->add_option("--set", sim_args.sets, "Override a config key (repeatable)");
  simulate->add_option("--world", sim_args.world, "World size (default: tp x dp x pp of the config)")
      ->check(CLI::Range(1, sim::kMaxWorld));
  simulate->add_option("--cost", sim_args.cost, "Cost file: from piper calibrate, or written by hand");
  simulate->add_option("--hardware", sim_args.hardware, "Analytic cost model: a hardware name or JSON file");
  simulate->add_flag("--json", sim_args.json, "Print one JSON object (step_ms, per-rank figures)");
  simulate->add_option("--svg", sim_args.svg, "Draw the predicted schedule to PATH (SVG)");
  simulate->add_option("--trace", sim_args.trace, "Write the predicted timeline as a Chrome trace to PATH");
  simulate->add_option("--ranks-per-host", sim_args.ranks_per_host,
                       "Ranks sharing one host's cores (host_cores of the cost file); default: one rank per core")
      ->check(CLI::Range(0, sim::kMaxWorld));
  return simulate;
}

CLI::App* add_plan_switch(CLI::App& app, Commands& c) {
  cli::PlanSwitchArgs& ps_args = c.plan_switch;
  auto* plan_switch = app.add_subcommand("plan-switch", "Plan an online switch of the state from one strategy to "
                                                        "another and predict its time");
  plan_switch->add_option("from", ps_args.from, "YAML config of the running strategy")->required();
  plan_switch->add_option("to", ps_args.to, "YAML config of the strategy to switch to (the same model)")->required();
  plan_switch->add_option("--set-from", ps_args.sets_from, "Override a key of FROM (repeatable)");
  plan_switch->add_option("--set-to", ps_args.sets_to, "Override a key of TO (repeatable)");
  plan_switch->add_option("--world-from", ps_args.world_from, "Ranks of FROM")->required()->check(CLI::Range(1, sim::kMaxWorld));
  plan_switch->add_option("--world-to", ps_args.world_to, "Ranks of TO")->required()->check(CLI::Range(1, sim::kMaxWorld));
  plan_switch->add_option("--hardware", ps_args.hardware, "The cluster: a hardware name or JSON file (help lists them)");
  plan_switch->add_option("--ranks-per-host", ps_args.ranks_per_host,
                          "Processes to a host, numbered host by host (default: the hardware's devices per node)")
      ->check(CLI::Range(0, sim::kMaxWorld));
  plan_switch->add_option("--buffer-mb", ps_args.buffer_mb, "Staging per process in MiB, one message out and one in (default 64, as train.switch_buffer_mb)")
      ->check(CLI::Range(1.0 / 1024, 1024.0 * 1024));
  plan_switch->add_flag("--json", ps_args.json, "Print one JSON object");
  return plan_switch;
}

CLI::App* add_tune(CLI::App& app, Commands& c) {
  cli::TuneArgs& tune_args = c.tune;
  auto* tune = app.add_subcommand("tune", "Search the fastest strategy under a memory limit and write it as a config");
  tune->add_option("config", tune_args.config, "YAML config: the model and training to tune for")->required();
  tune->add_option("--set", tune_args.sets, "Override a config key (repeatable)");
  tune->add_option("--world", tune_args.world, "Ranks to tune for")->required()->check(CLI::Range(1, sim::kMaxWorld));
  tune->add_option("--cost", tune_args.cost, "Cost file: from piper calibrate, or written by hand");
  tune->add_option("--hardware", tune_args.hardware, "Analytic cost model: a hardware name or JSON file");
  tune->add_option("--mem-gib", tune_args.mem_gib, "Memory limit per rank in GiB (default: the hardware's memory)")
      ->check(CLI::PositiveNumber);
  tune->add_option("--ranks-per-host", tune_args.ranks_per_host, "Ranks sharing one host's cores, as for simulate")
      ->check(CLI::Range(0, sim::kMaxWorld));
  tune->add_option("--time-budget-s", tune_args.time_budget_s, "Stop taking new candidates after this long")
      ->check(CLI::PositiveNumber);
  tune->add_option("-o,--output", tune_args.output, "The tuned config to write (YAML)")->required();
  tune->add_flag("--json", tune_args.json, "Print one JSON object: the chosen strategy and the baselines");
  tune->add_flag("--explain", tune_args.explain, "Print the chosen strategy's FLOPs, communication and memory");
  tune->add_flag("--quiet", tune_args.quiet, "No progress line");
  return tune;
}

CLI::App* add_plot(CLI::App& app, Commands& c) {
  cli::PlotArgs& plot_args = c.plot;
  auto* plot_cmd = app.add_subcommand("plot", "Draw a metrics JSONL (loss, throughput) or a Chrome trace (schedule) as SVG");
  plot_cmd->add_option("input", plot_args.input, "Metrics JSONL (train --metrics) or Chrome trace (--trace)")->required();
  plot_cmd->add_option("-o,--output", plot_args.output, "SVG file to write")->required();
  plot_cmd->add_option("--step", plot_args.step, "Trace: the step to draw (default: the last)")->check(CLI::NonNegativeNumber);
  plot_cmd->add_option("--width", plot_args.width, "Picture width in pixels")->check(CLI::Range(320, 20000));
  plot_cmd->add_option("--compare", plot_args.compare,
                       "Trace: a second trace (e.g. simulate --trace) drawn below the first, same time axis");
  plot_cmd->add_flag("--no-comm", plot_args.no_comm, "Trace: leave out the communication lanes");
  plot_cmd->add_flag("--time-units", plot_args.time_units, "Trace: abstract costs; label the axis \"time units\"");
  return plot_cmd;
}

CLI::App* add_calibrate(CLI::App& app, Commands& c) {
  cli::CalibrateArgs& cal_args = c.calibrate;
  auto* calibrate = app.add_subcommand("calibrate", "Measure this machine's cost model for piper simulate");
  calibrate->add_option("config", cal_args.config, "YAML config: the model, microbatch size and tp to measure")->required();
  calibrate->add_option("--set", cal_args.sets, "Override a config key (repeatable)");
  calibrate->add_option("-o,--output", cal_args.output, "Cost file to write (JSON, docs/calibration.md)")->required();
  calibrate->add_flag("--quick", cal_args.quick, "Fewer sizes and repetitions (tests)");
  calibrate->add_flag("--quiet", cal_args.quiet, "No table of measurements");
  return calibrate;
}

CLI::App* add_prepare(CLI::App& app, Commands& c) {
  auto* prepare = app.add_subcommand("prepare", "Tokenize text files into a token file: bytes (vocab 256), or a "
                                                "SentencePiece model trained on them or given");
  prepare->add_option("-o,--output", c.out_path, "Token file to write")->required();
  prepare->add_option("inputs", c.inputs, "Text files or directories")->required();
  prepare->add_option("--tokenizer-train", c.prep.train.vocab_size,
                      "Train a SentencePiece model of this many pieces on the inputs; written beside the token file")
      ->check(CLI::Range(512, 65536));
  prepare->add_option("--model-type", c.prep.train.model_type, "With --tokenizer-train: bpe (default) or unigram")
      ->check(CLI::IsMember({"bpe", "unigram"}));
  prepare->add_option("--tokenizer", c.prep.tokenizer,
                      "Tokenize with this SentencePiece model file (copied beside the token file)");
  prepare->add_flag("--quiet", c.prep_quiet, "No progress lines");
  return prepare;
}

CLI::App* add_generate(CLI::App& app, Commands& c) {
  runtime::GenerateOptions& gen = c.generate;
  auto* generate = app.add_subcommand("generate", "Continue a prompt with the model of a checkpoint (any strategy), "
                                                  "on one process");
  generate->add_option("checkpoint", gen.checkpoint, "Checkpoint file, folder or latest pointer")->required();
  generate->add_option("--prompt", gen.prompt, "Text to continue")->required();
  generate->add_option("--tokens", gen.tokens, "New tokens (default 200)")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  generate->add_option("--temperature", gen.temperature, "Sampling temperature; 0 is greedy (default 0.8)")
      ->check(CLI::Range(0.0, 100.0));
  generate->add_option("--top-k", gen.top_k, "Sample among the K most likely tokens; 0 is all (default)")
      ->check(CLI::NonNegativeNumber);
  generate->add_option("--seed", gen.seed, "Seed of the sampler (default 0)");
  generate->add_option("--device", gen.device, "Where to compute: cpu (default), cuda or cpu_detached, whatever the "
                                               "checkpoint was trained on")
      ->check(CLI::IsMember(config::device_names()));
  return generate;
}

}  // namespace

int main(int argc, char** argv) {
  piper::backend::set_cuda_environment();
  CLI::App app{"piper: distributed training of hybrid Transformer / Mamba-2 language models"};
  app.require_subcommand(1);
  Commands c;
  CLI::App* train = add_train(app, c);
  CLI::App* ckpt = add_ckpt(app, c);
  CLI::App* plan = add_plan(app, c);
  CLI::App* simulate = add_simulate(app, c);
  CLI::App* plan_switch = add_plan_switch(app, c);
  CLI::App* tune = add_tune(app, c);
  CLI::App* plot_cmd = add_plot(app, c);
  CLI::App* calibrate = add_calibrate(app, c);
  CLI::App* prepare = add_prepare(app, c);
  CLI::App* generate = add_generate(app, c);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }

  if (*train) {
    if (c.resume->count() > 0 && c.train.resume.empty()) c.train.resume = "latest";
    return run_train(&argc, &argv, c.config_path, c.sets, c.train);
  }
  if (*calibrate) return cli::run_calibrate(&argc, &argv, c.calibrate);
  try {
    if (*plan) return run_plan(c.config_path, c.sets, c.world, c.directives);
    if (*simulate) return cli::run_simulate(c.simulate);
    if (*plan_switch) return cli::run_plan_switch(c.plan_switch);
    if (*tune) return cli::run_tune(c.tune);
    if (*plot_cmd) return cli::run_plot(c.plot);
    if (*ckpt) return run_ckpt(c.ckpt_path, c.verify->parsed());
    if (*generate) return run_generate(c.generate);
    if (*prepare) {
      c.prep.progress = !c.prep_quiet;
      return run_prepare(c.inputs, c.out_path, c.prep);
    }
  } catch (const std::exception& e) {
    const bool user = is_user_error(e);
    std::fprintf(stderr, "piper: %s%s\n", user ? "error: " : "internal error: ", e.what());
    return user ? kExitUsage : 1;
  }
  return 0;
}
