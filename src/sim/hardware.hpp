// hardware.hpp — accelerators and interconnects for the analytic cost model:
// a table of public peak numbers (docs/hardware.md cites the datasheets),
// user hardware files (JSON), and analytic_cost, which turns the FLOPs and
// bytes of ir/work.hpp into a CostModel:
//   time of an op   = max(matmul FLOPs / (peak x mfu) + other FLOPs / (vector peak x mfu),
//                         bytes / (mem_bw x mem_eff)) + launch
//   time of a call  = sum over its ops + its tensor-parallel collectives
//   a collective    = ring algorithm, alpha-beta over the link it crosses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/parallel_dims.hpp"
#include "ir/work.hpp"
#include "sim/cost_model.hpp"

namespace piper::sim {

// A link between devices.
struct Link {
  std::string name;        // "nvlink4", "ib-ndr", ...
  double bandwidth = 0.0;  // bytes/s per direction per device
  double latency = 0.0;    // seconds per message step (an estimate: no datasheet gives it)
  bool operator==(const Link&) const = default;
};

// One device (a GPU, or one CPU rank) and the links of its cluster.
struct Hardware {
  std::string name;         // the table key, e.g. "h100-sxm"
  std::string description;  // for people: the device, its peaks and its links
  // FLOP/s of dense matrix products: the bf16 tensor-core peak (no sparsity)
  // on GPUs, the fp32 FMA peak on CPUs (piper trains fp32 on the CPU).
  double peak_flops = 0.0;
  double vector_flops = 0.0;  // FLOP/s of other arithmetic (fp32 vector units, no tensor cores)
  double mem_bw = 0.0;        // bytes/s of device memory
  double mfu = 0.6;           // achievable fraction of peak_flops (and vector_flops)
  double mem_eff = 0.8;       // achievable fraction of mem_bw
  int elem_bytes = 2;         // bytes per tensor element the times assume: 2 bf16 (GPUs), 4 fp32 (CPU)
  double launch = 4e-6;       // seconds added per op (kernel launch, OpenMP fork/join)
  int devices_per_node = 8;   // devices sharing the intra-node link
  Link intra_node, inter_node;
  double memory_bytes = 0.0;  // device memory
  bool operator==(const Hardware&) const = default;
};

// The interconnects and devices known by name.
const std::vector<Link>& link_table();
const std::vector<Hardware>& hardware_table();
const Link* find_link(const std::string& name);          // nullptr when unknown
const Hardware* find_hardware(const std::string& name);  // nullptr when unknown
// A CPU rank measured or given: `peak_flops` fp32 FLOP/s and `mem_bw` bytes/s
// per rank, `ranks_per_node` ranks sharing a node's memory (MPI shared memory
// between them, InfiniBand HDR between nodes). The table's "cpu-local" is one
// core of this host as docs/hardware.md measured it.
Hardware cpu_hardware(double peak_flops, double mem_bw, int ranks_per_node, double memory_bytes);
// The table as text, for `--hardware help`.
std::string hardware_help();

// A user hardware file (JSON; docs/hardware.md):
//   {"name": "my-gpu", "peak_tflops": 989, "mem_bw_gbs": 3350, "memory_gb": 80,
//    "intra_node": "nvlink4", "inter_node": {"name": "eth", "bandwidth_gbs": 25, "latency_us": 10}}
// "base": "h100-sxm" starts from a table entry and overrides the keys given.
// Throws std::invalid_argument naming `where` and the key that is missing or wrong.
Hardware parse_hardware(const std::string& json_text, const std::string& where);
Hardware load_hardware(const std::string& path);
std::string hardware_to_json(const Hardware& hw);  // parse_hardware reads it back (equal to rounding)
// A table name, else a file path; throws std::invalid_argument listing the names.
Hardware resolve_hardware(const std::string& name_or_file);

// Which link a group of ranks crosses.
enum class NodeSpan : uint8_t {
  SPAN_BY_SIZE,    // intra-node when the group has at most devices_per_node ranks, else inter-node
  SPAN_INTRA_NODE, // always the intra-node link
  SPAN_INTER_NODE, // always the inter-node link (e.g. a dp group whose ranks sit on different nodes)
};
const Link& link_for(const Hardware& hw, int ranks, NodeSpan span);

// Seconds of one op, and of one unit call on a tp group of `tp` ranks (its
// collectives over link_for(hw, tp, SPAN_BY_SIZE)).
double op_seconds(const ir::OpWork& op, const Hardware& hw);
double call_seconds(const ir::Work& w, int tp, const Hardware& hw);
// Ring collectives, alpha-beta, `bytes` as a collective node's bytes (the whole
// buffer each rank reduces or gathers; ir/build.cpp), n = ranks:
//   allreduce 2(n-1)/n bytes/bw + 2(n-1) latency; reduce_scatter, allgather and
//   alltoall (n-1)/n bytes/bw + (n-1) latency; p2p bytes/bw + latency.
double comm_seconds(CommOp op, int ranks, double bytes, const Link& link);

struct AnalyticOptions {
  // Row counts the time and memory lines are fitted through (times are convex
  // in rows: weights are read once per call); empty: seq_len and 8 seq_len.
  std::vector<int64_t> fit_rows;
  NodeSpan collectives = NodeSpan::SPAN_BY_SIZE;  // data-parallel collectives
  NodeSpan p2p = NodeSpan::SPAN_BY_SIZE;          // pipeline sends (group of 2)
};

// The analytic cost model of `m` at sequence length `seq_len` on `hw`: an
// OpCost for the embedding, each block kind of the pattern and the head at
// each tensor-parallel degree in `tps`; the update; a CommCost for each
// collective at each group size in `group_sizes` (> 1) and p2p at 2 ranks.
// The units' activation memory is the runtime's (unit_memory) with their kept activations stored
// at `kept_bytes` per element (Strategy::compute_elem_bytes), whatever hw.elem_bytes.
// Throws std::invalid_argument as unit_work does (an 'E' block, a tp that
// does not divide a size) and for hardware without positive peaks.
CostModel analytic_cost(const config::ModelConfig& m, int64_t seq_len, int kept_bytes, const Hardware& hw,
                        std::vector<int> tps, std::vector<int> group_sizes, const AnalyticOptions& opt = {});

// The tensor-parallel degrees (1 and tp) and the collective group sizes (2,
// dp, tp, ep, the expert-data group, the world) a strategy's DAG has: what
// analytic_cost is given to cover it.
struct CostCoverage {
  std::vector<int> tps, group_sizes;
};
CostCoverage coverage_of(const ir::ParallelDims& dims);

}  // namespace piper::sim
