// calibrate.cpp — `piper calibrate CONFIG -o FILE`: measures the cost model
// (runtime::calibrate) under mpirun like train, and rank 0 writes it.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <new>

#include "cli/commands.hpp"
#include "config/config.hpp"
#include "io/regular_file.hpp"
#include "runtime/calibrate.hpp"
#include "runtime/mpi_env.hpp"
#include "runtime/trainer.hpp"
#include "sim/cost_model.hpp"

namespace piper::cli {

int run_calibrate(int* argc, char*** argv, const CalibrateArgs& a) {
  runtime::MpiEnv env(argc, argv);
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const config::Config cfg = config::load(a.config, a.sets);
    env.set_timeout(cfg.parallel.comm_timeout_s);
    // Refuse an unwritable output before measuring for minutes.
    bool bad_output = false;
    if (env.rank() == 0) {
      const bool existed = std::filesystem::exists(a.output);
      bad_output = !io::why_not_regular(a.output).empty() || !std::ofstream(a.output, std::ios::app);
      if (!existed && !bad_output) std::filesystem::remove(a.output);
    }
    if (env.any(bad_output)) throw runtime::UserError("-o: cannot write the cost file '" + a.output + "'");
    runtime::CalibrateOptions opts;
    opts.quick = a.quick;
    opts.quiet = a.quiet;
    const sim::CostModel m = runtime::calibrate(cfg, opts, env);
    if (env.rank() == 0) {
      sim::save_cost(m, a.output);
      std::printf("piper calibrate: wrote %s (%zu unit costs, %zu communication costs) in %.1f s\n", a.output.c_str(),
                  m.ops.size(), m.comm.size(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return 0;
  } catch (const std::bad_alloc&) {
    // calibrate runs the whole model on each measuring rank: what `train` would split may not fit here.
    return job_failed(runtime::UserError("calibrate: out of memory while measuring the model of " + a.config +
                                         "; calibrate a smaller model (model.* sizes, train.global_batch, "
                                         "train.seq_len) on this machine, or use --hardware in piper simulate"),
                      env);
  } catch (const std::exception& e) {
    return job_failed(e, env);
  }
}

}  // namespace piper::cli
