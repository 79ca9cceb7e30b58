// cost_model.hpp — what each node of the training DAG costs: compute time per
// unit kind and pass as a function of the microbatch's rows (tokens), the
// activation memory a unit holds, the optimiser's time per element, and each
// collective's time per group size as a function of bytes.
//
// Three sources fill it, in one JSON format (docs/simulator.md):
//   "calibrate" — `piper calibrate CONFIG -o FILE` measured these shapes here;
//   "analytic"  — FLOPs and bytes over a hardware table's peaks (hardware.hpp);
//   "manual"    — written by hand, e.g. F=1, B=2, W=1 time units, free comm.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.hpp"

namespace piper::sim {

// a + b * x: milliseconds (or bytes) as a function of a size x.
struct Linear {
  double a = 0.0;
  double b = 0.0;
  double at(double x) const { return a + b * x; }
};

// Least-squares fit of (x, y) points; a single point gives a = 0, b = y / x.
Linear fit_linear(const std::vector<std::pair<double, double>>& points);

// One unit kind at one tensor-parallel degree.
struct OpCost {
  char kind = '?';  // ir unit symbol: 'e' embedding, 'M' Mamba-2, '*' attention, '-' MLP, 'E' MoE, 'h' head
  int tp = 1;       // tensor-parallel degree the times were taken at
  // Milliseconds per call as a function of the microbatch's rows (batch x seq).
  Linear f;   // forward
  Linear b;   // fused backward (input and weight gradients)
  Linear bi;  // input-gradient half
  Linear bw;  // weight-gradient half
  // Activation memory in bytes as a function of rows, beyond the unit's
  // output (which the simulator counts itself: rows x d_model values in the storage type).
  Linear saved;        // held by the unit from its forward until its backward ends
  Linear kept_for_w;   // of `saved`, what is still held between BWD_I and BWD_W
  Linear transient;    // scratch at the peak inside a pass, freed when the pass ends
};

// The collectives and point-to-point transfers the DAG uses.
enum class CommOp : uint8_t { COMM_P2P, COMM_ALLREDUCE, COMM_REDUCE_SCATTER, COMM_ALLGATHER, COMM_ALLTOALL };
const char* comm_op_name(CommOp op);  // "p2p", "allreduce", "reduce_scatter", "allgather", "alltoall"
// The op that prices a communication node of kind `k` (SEND and RECV: p2p); throws
// std::invalid_argument for a compute kind.
CommOp comm_op_of(ir::NodeKind k);

// Milliseconds of one operation over a group of `ranks` as a function of the
// bytes each rank contributes (the node's `bytes`).
struct CommCost {
  CommOp op = CommOp::COMM_P2P;
  int ranks = 2;
  Linear t;
  // Measured (bytes, ms), ascending in bytes: between the first and the last
  // the time is interpolated between neighbours (a line cannot follow MPI's
  // protocol changes); outside them, and without points, `t`.
  std::vector<std::pair<double, double>> points;
  double at(double bytes) const;
};

struct CostModel {
  std::string source = "manual";  // "calibrate", "analytic" or "manual"
  std::string hardware;           // what the numbers describe, for people
  int threads_per_rank = 1;       // compute threads per rank when measured
  int host_cores = 0;             // cores of the measuring host (0 = unknown)
  // [k-1]: how many times longer compute takes while k ranks of one host
  // compute at once (k = 1: 1). Empty: max(1, k x threads_per_rank / host_cores).
  std::vector<double> host_slowdown;
  std::vector<OpCost> ops;
  Linear update;                  // UPD: ms as a function of the parameter elements the rank updates
  Linear step_overhead;           // ms per step outside the program, as a function of the rank's microbatches
  bool free_comm = false;         // every transfer and collective takes no time
  std::vector<CommCost> comm;

  // Time of a compute node of unit kind `kind` in pass `pass` over `rows`
  // rows at tensor-parallel degree `tp`. Uses the entry of that kind and tp,
  // else that kind at tp 1 with the row-proportional part divided by tp.
  // Throws std::out_of_range naming the kind when the model has no entry.
  double compute_ms(char kind, ir::Pass pass, int tp, int64_t rows) const;
  // The entry for (kind, tp) as compute_ms chooses it.
  const OpCost& op(char kind, int tp) const;
  // Time of `op` over `ranks` ranks moving `bytes` per rank: the entry for
  // that group size, else the nearest measured size scaled as a ring
  // algorithm scales ((n-1)/n of the bytes per step). 0 when free_comm or
  // ranks == 1.
  double comm_ms(CommOp op, int ranks, int64_t bytes) const;
  // The slowdown at an average of `busy` ranks of a host computing at once:
  // host_slowdown interpolated, extended beyond its end as the cores are
  // shared (proportional to busy); max(1, busy x threads / cores) without it.
  // Throws std::logic_error for a busy count that is not a finite number >= 0.
  double sharing(double busy) const;
};

// What a cost model may hold (docs/calibration.md, "Validation"). Every number
// is finite; these bounds keep every time and byte count the simulator adds up
// finite, for any plan within its limits (simulator.hpp), far from overflow.
constexpr double kMaxCoefficient = 1e12;  // |a| and b of every linear cost: ms (31 years) or bytes (1 TB)
constexpr double kMaxPointBytes = 1e15;   // bytes of a measured communication point
constexpr double kMaxSlowdown = 1000;     // each host_slowdown factor
constexpr int kMaxHostRanks = 4096;       // entries of host_slowdown: ranks of one host
constexpr int kMaxHostCores = 4096;       // host_cores
constexpr int kMaxThreadsPerRank = 4096;  // threads_per_rank (as the config's train.threads)
constexpr int kMaxGroupRanks = 65536;     // an op's tp, a comm entry's ranks (2^16, the config's bound per grid axis)
constexpr int64_t kMaxInputFileBytes = int64_t{64} << 20;  // a cost or hardware file: a few KiB of JSON

// Checks every field of `m` against the bounds above; throws
// std::invalid_argument naming `where`, the key path (ops[2].f.b) and the
// allowed range. parse_cost and analytic_cost run it on what they return.
void check_cost(const CostModel& m, const std::string& where);

// JSON text <-> CostModel. parse_cost throws std::invalid_argument naming
// `where` (a file name), the key path that is wrong and what would be right:
// unknown keys, wrong types and values outside check_cost's bounds.
CostModel parse_cost(const std::string& json_text, const std::string& where);
std::string to_json(const CostModel& m);
CostModel load_cost(const std::string& path);
void save_cost(const CostModel& m, const std::string& path);

}  // namespace piper::sim
