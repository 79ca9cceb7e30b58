// device_train.cpp — training throughput of one rank on one device: the runtime `piper train` runs
// (runtime::RankRuntime), over a SelfCommunicator so no MPI starts and the program runs on a bare GPU
// machine (scripts/gpu-check.sh), on token ids drawn at random (the throughput does not depend on
// them). Warm-up steps, then timed steps; the device is synchronised before each clock reading.
// The model FLOPs per token, and so MFU, come from bench/model_flops.py, the one definition of them.
//
// Usage: BUILD_DIR/bench/device_train CONFIG [--set key=value ...] [--steps N] [--warmup N]
//   -> one JSON line: {"device":..,"precision":..,"params":..,"tokens_per_step":..,
//      "median_step_ms":..,"tokens_per_s":..,"peak_bytes":..,"loss_first":..,"loss_last":..}
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/self_comm.hpp"
#include "config/config.hpp"
#include "data/token_file.hpp"
#include "ir/compile.hpp"
#include "runtime/rank_runtime.hpp"

namespace {

namespace fs = std::filesystem;
using namespace piper;

struct Args {
  std::string config;
  std::vector<std::string> sets;
  int steps = 10, warmup = 3;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "device_train: %s\nusage: device_train CONFIG [--set key=value ...] [--steps N (>= 1)] "
               "[--warmup N (>= 0)]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--set") {
      a.sets.push_back(value());
    } else if (arg == "--steps") {
      a.steps = std::atoi(value().c_str());
    } else if (arg == "--warmup") {
      a.warmup = std::atoi(value().c_str());
    } else if (a.config.empty() && arg.rfind("--", 0) != 0) {
      a.config = arg;
    } else {
      usage("unknown argument '" + arg + "'");
    }
  }
  if (a.config.empty()) usage("no CONFIG");
  if (a.steps < 1 || a.warmup < 0) usage("--steps must be >= 1 and --warmup >= 0");
  return a;
}

// Enough random ids in `path` for every step's samples, drawn once.
void write_tokens(const std::string& path, const config::Config& cfg, int steps) {
  const int64_t need = cfg.train.global_batch * (cfg.train.seq_len + 1) * (steps + 1);
  std::mt19937 gen(static_cast<uint32_t>(cfg.train.seed));
  std::vector<int32_t> ids(static_cast<size_t>(need));
  for (int32_t& id : ids) id = static_cast<int32_t>(gen() % static_cast<uint32_t>(cfg.model.vocab_size));
  data::write_token_file(path, cfg.model.vocab_size, ids);
}

int run(const Args& a) {
  const fs::path dir = fs::temp_directory_path() / ("piper-device-train-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<std::string> sets = a.sets;
  sets.push_back("data.path=" + (dir / "ids.tok").string());
  config::Config cfg = config::load(a.config, sets);
  config::validate(cfg, 1);
  write_tokens((dir / "ids.tok").string(), cfg, a.warmup + a.steps);
  const data::TokenFile tokens((dir / "ids.tok").string());
  comm::SelfCommunicator world;
  runtime::RankRuntime rt(cfg, ir::compile(cfg, 1), world);
  backend::Backend& be = rt.device();
  const double tokens_per_step = static_cast<double>(cfg.train.global_batch * cfg.train.seq_len);
  std::vector<double> ms, loss;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    be.synchronize(0);
    const auto t0 = std::chrono::steady_clock::now();
    const runtime::StepStats st = rt.step(tokens, tokens.all());
    be.synchronize(0);
    if (s >= a.warmup) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    loss.push_back(st.loss_sum / tokens_per_step);
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  std::printf("{\"device\":\"%s\",\"precision\":\"%s\",\"params\":%lld,\"tokens_per_step\":%.0f,"
              "\"median_step_ms\":%.3f,\"tokens_per_s\":%.1f,\"peak_bytes\":%lld,\"loss_first\":%.6f,"
              "\"loss_last\":%.6f}\n",
              be.name(), cfg.train.precision.c_str(), static_cast<long long>(rt.plan().model.param_count()),
              tokens_per_step, median, tokens_per_step / (median / 1000.0),
              static_cast<long long>(be.memory().total_peak), loss.front(), loss.back());
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  piper::backend::set_cuda_environment();
  const Args a = parse(argc, argv);
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "device_train: %s\n", e.what());
    return 1;
  }
}
