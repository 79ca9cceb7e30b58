// commands.hpp — the piper subcommands that live outside main.cpp. Each
// returns the process exit code; user errors throw (main prints them, exit 2).
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "runtime/mpi_env.hpp"

namespace piper::cli {

constexpr int kExitUsage = 2;    // bad config, bad input: nothing was started
constexpr int kExitFailure = 3;  // the job failed while running: a rank lost or stalled, a checkpoint not saved

// A problem with what the user gave (config, data, strategy, checkpoint, trace).
bool is_user_error(const std::exception& e);
// Ends an MPI job on `e`: a user error printed once (rank 0), exit 2; anything
// else printed by this rank with its host, the job aborted; exit 3 for a
// communication failure, 1 otherwise.
int job_failed(const std::exception& e, const runtime::MpiEnv& env);
// Writes `text` to `path` (a picture, a report); throws trace::TraceError naming the path.
void write_file(const std::string& path, const std::string& text);

// piper simulate CONFIG: predicted per-rank timeline, step time, bubble and memory.
struct SimulateArgs {
  std::string config;
  std::vector<std::string> sets;
  int world = 0;              // 0: the config's tp x dp x pp
  std::string cost;           // cost file (piper calibrate, or written by hand)
  std::string hardware;       // analytic model: a table name or a hardware JSON file
  bool json = false;          // one JSON object on stdout
  std::string svg;            // schedule picture
  std::string trace;          // Chrome trace of the predicted step
  int ranks_per_host = 0;     // ranks sharing one host's cores (0: each rank has its own)
};
int run_simulate(const SimulateArgs& a);

// piper plan-switch FROM TO --world-from N --world-to M --hardware NAME: the plan of an online
// switch of one model's state from FROM's strategy to TO's and its predicted time (docs/switching.md).
// Processes 0..max(N, M)-1: the first min(N, M) in both layouts, the rest in one only.
struct PlanSwitchArgs {
  std::string from, to;                     // the two configs
  std::vector<std::string> sets_from, sets_to;
  int world_from = 0, world_to = 0;
  std::string hardware;                     // a table name or a hardware JSON file
  int ranks_per_host = 0;                   // processes to a host; 0: the hardware's devices_per_node
  double buffer_mb = 64;                    // the largest message, MiB (each process stages one out, one in)
  bool json = false;                        // one JSON object on stdout
};
int run_plan_switch(const PlanSwitchArgs& a);

// piper tune CONFIG --world N -o OUT.yaml: the fastest strategy under a memory
// limit, searched on the simulator, written as a config (docs/tuner.md).
struct TuneArgs {
  std::string config;
  std::vector<std::string> sets;
  int world = 0;
  std::string cost;           // cost file (piper calibrate)
  std::string hardware;       // analytic model: a table name or a hardware JSON file
  double mem_gib = 0;         // memory limit per rank; 0: the hardware's memory
  int ranks_per_host = 0;
  double time_budget_s = 60;
  std::string output;         // the tuned config to write
  bool json = false;          // one JSON object on stdout
  bool explain = false;       // the chosen strategy's cost breakdown
  bool quiet = false;         // no progress line
};
int run_tune(const TuneArgs& a);

// piper calibrate CONFIG -o FILE: measures this machine's cost model
// (docs/calibration.md). Runs under mpirun like train and reports its own
// errors (rank 0 prints; exit 2 for bad input).
struct CalibrateArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string output;         // cost file to write (rank 0)
  bool quick = false;         // fewer sizes and repetitions
  bool quiet = false;         // no table of measurements
};
int run_calibrate(int* argc, char*** argv, const CalibrateArgs& a);

// piper plot INPUT -o OUT.svg: a metrics JSONL (train --metrics) as loss and
// throughput plots, or a Chrome trace (train/simulate --trace) as the schedule
// of one step (docs/trace.md). Bad input throws trace::TraceError.
struct PlotArgs {
  std::string input;
  std::string output;         // the SVG to write
  int step = -1;              // trace: the step to draw; -1: the last one
  int width = 0;              // picture width in pixels; 0: the default
  bool no_comm = false;       // trace: leave out the communication lanes
  bool time_units = false;    // trace: abstract costs, the axis reads "time units"
  std::string compare;        // trace: a second trace (e.g. simulated) below the first, one time axis
};
int run_plot(const PlotArgs& a);

}  // namespace piper::cli
