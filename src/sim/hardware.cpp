// hardware.cpp — the hardware table, user hardware files, and the analytic
// cost model built from ir/work.hpp's work over a device's peaks.
#include "sim/hardware.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "io/regular_file.hpp"

namespace piper::sim {

using nlohmann::json;

namespace {

constexpr double kTera = 1e12, kGiga = 1e9, kMicro = 1e-6;

// Bandwidth is per direction per device; latency is a per-step estimate
// (NCCL/MPI-level, not from a datasheet). Sources: docs/hardware.md.
std::vector<Link> make_links() {
  return {
      {"nvlink3", 300 * kGiga, 2 * kMicro},          // A100: 12 links, 600 GB/s bidirectional
      {"nvlink4", 450 * kGiga, 2 * kMicro},          // H100/H200: 18 links, 900 GB/s bidirectional
      {"nvlink5", 900 * kGiga, 2 * kMicro},          // B200: 18 links, 1.8 TB/s bidirectional
      {"infinity-fabric", 448 * kGiga, 3 * kMicro},  // MI300X: 7 links x 128 GB/s bidirectional
      {"ib-hdr", 25 * kGiga, 5 * kMicro},            // InfiniBand HDR 200 Gb/s, one NIC per device
      {"ib-ndr", 50 * kGiga, 5 * kMicro},            // InfiniBand NDR 400 Gb/s
      {"ib-xdr", 100 * kGiga, 5 * kMicro},           // InfiniBand XDR 800 Gb/s
      {"roce-100", 12.5 * kGiga, 8 * kMicro},        // RoCE v2 over 100 GbE
      {"roce-200", 25 * kGiga, 8 * kMicro},          // RoCE v2 over 200 GbE
      {"roce-400", 50 * kGiga, 8 * kMicro},          // RoCE v2 over 400 GbE
      {"pcie4", 31.5 * kGiga, 3 * kMicro},           // PCIe 4.0 x16: 16 GT/s x 16 lanes, 128b/130b
      {"pcie5", 63 * kGiga, 3 * kMicro},             // PCIe 5.0 x16: 32 GT/s x 16 lanes, 128b/130b
      {"shm", 5 * kGiga, 1 * kMicro},                // MPI over shared memory (estimate, one core per rank)
  };
}

const Link& link_named(const std::string& name) {
  const Link* l = find_link(name);
  if (!l) throw std::logic_error("sim: hardware table names unknown link " + name);
  return *l;
}

std::string fmt(double v, int precision = 4) {
  std::ostringstream s;
  s.precision(precision);
  s << v;
  return s.str();
}

std::string describe(const std::string& device, const Hardware& h) {
  return device + ": " + fmt(h.peak_flops / kTera) + " TFLOP/s " + (h.elem_bytes == 2 ? "bf16" : "fp32") +
         " dense, " + fmt(h.mem_bw / kGiga) + " GB/s, " + fmt(h.memory_bytes / kGiga) + " GB; " +
         h.intra_node.name + " within " + std::to_string(h.devices_per_node) + "-device nodes, " +
         h.inter_node.name + " between nodes";
}

// peak_tflops, vector_tflops, mem_bw (TB/s), memory (GB): vendor datasheets (docs/hardware.md).
Hardware gpu(const std::string& name, const std::string& device, double peak_tflops, double vector_tflops,
             double mem_tbs, double memory_gb, double mfu, double launch_us, const std::string& intra,
             const std::string& inter) {
  Hardware h;
  h.name = name;
  h.peak_flops = peak_tflops * kTera;
  h.vector_flops = vector_tflops * kTera;
  h.mem_bw = mem_tbs * kTera;
  h.mfu = mfu;
  h.mem_eff = 0.8;
  h.elem_bytes = 2;
  h.launch = launch_us * kMicro;
  h.devices_per_node = 8;
  h.intra_node = link_named(intra);
  h.inter_node = link_named(inter);
  h.memory_bytes = memory_gb * kGiga;
  h.description = describe(device, h);
  return h;
}

// This host: one core per rank, as docs/benchmarks.md and docs/hardware.md measured it
// (GEMM peak 100.6 GFLOP/s on one core; 14 GB/s triad on one core).
Hardware cpu_local() {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const double mem = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) / cores : 0.0;
  Hardware h = cpu_hardware(100 * kGiga, 14 * kGiga, cores, mem);
  h.name = "cpu-local";
  h.description = "this host, one core per rank (" + std::to_string(cores) + " per node), " + h.description;
  return h;
}

std::vector<Hardware> make_table() {
  return {
      gpu("h100-sxm", "NVIDIA H100 SXM5 80GB", 989.4, 66.9, 3.35, 80, 0.65, 4, "nvlink4", "ib-ndr"),
      gpu("h200-sxm", "NVIDIA H200 SXM 141GB", 989.4, 66.9, 4.8, 141, 0.65, 4, "nvlink4", "ib-ndr"),
      gpu("b200", "NVIDIA B200 (HGX, 1000 W)", 2250, 80, 8.0, 180, 0.6, 4, "nvlink5", "ib-ndr"),
      gpu("a100-sxm-80gb", "NVIDIA A100 SXM4 80GB", 312, 19.5, 2.039, 80, 0.7, 4, "nvlink3", "ib-hdr"),
      gpu("mi300x", "AMD Instinct MI300X", 1307.4, 163.4, 5.3, 192, 0.5, 5, "infinity-fabric", "roce-400"),
      cpu_local(),
  };
}

// ---- JSON -----------------------------------------------------------------------------------

[[noreturn]] void bad(const std::string& where, const std::string& key, const std::string& what) {
  throw std::invalid_argument(where + ": key \"" + key + "\": " + what);
}

// The number times `unit` (the key's unit in SI), refused where that product is not finite: it would be
// written back as null (hardware_to_json) and turn every time into 0 or inf.
// Values are also held within [lo, hi] in the key's own unit (docs/hardware.md, "Validation"), so that
// the analytic times stay finite and within the cost model's bounds.
double positive(const json& j, const std::string& where, const std::string& key, bool allow_zero = false,
                double unit = 1.0, double lo = 0.0, double hi = 1e300) {
  if (!j.is_number()) bad(where, key, "expected a number, got " + j.dump());
  const double v = j.get<double>();
  if (!std::isfinite(v) || v < 0 || (!allow_zero && v == 0))
    bad(where, key, std::string("expected a ") + (allow_zero ? "non-negative" : "positive") + " number, got " + j.dump());
  if (v > hi || (v != 0 && v < lo))
    bad(where, key, "expected " + std::string(allow_zero && lo > 0 ? "0 or " : "") + "a number from " + fmt(lo) +
                        " to " + fmt(hi) + ", got " + j.dump());
  if (!std::isfinite(v * unit)) bad(where, key, "too large, got " + j.dump());
  return v * unit;
}

// Ranges of the hardware file's numbers, in the file's units.
constexpr double kMinRate = 1e-6, kMaxRate = 1e6;  // TFLOP/s and GB/s: 1 MFLOP/s .. 1 EFLOP/s, 1 kB/s .. 1 PB/s
constexpr double kMaxMicros = 1e9;                 // latency_us, launch_us: at most 1000 s
constexpr double kMaxMemoryGb = 1e6;               // memory_gb: at most 1 PB
constexpr int kMaxDevicesPerNode = 65536;

double fraction(const json& j, const std::string& where, const std::string& key) {
  const double v = positive(j, where, key);
  if (v > 1) bad(where, key, "expected a fraction in (0, 1], got " + j.dump());
  return v;
}

int integer(const json& j, const std::string& where, const std::string& key, int lo, int hi) {
  if (!j.is_number_integer() || j.get<int64_t>() < lo || j.get<int64_t>() > hi)
    bad(where, key, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + j.dump());
  return j.get<int>();
}

std::string text(const json& j, const std::string& where, const std::string& key) {
  if (!j.is_string() || j.get<std::string>().empty()) bad(where, key, "expected a non-empty string, got " + j.dump());
  return j.get<std::string>();
}

std::string link_names() {
  std::string s;
  for (const Link& l : link_table()) s += (s.empty() ? "" : ", ") + l.name;
  return s;
}

// A link: a table name, or {"name": .., "bandwidth_gbs": .., "latency_us": ..}.
Link link_from(const json& j, const std::string& where, const std::string& key) {
  if (j.is_string()) {
    const Link* l = find_link(j.get<std::string>());
    if (!l) bad(where, key, "unknown link " + j.dump() + "; known: " + link_names());
    return *l;
  }
  if (!j.is_object()) bad(where, key, "expected a link name or {\"name\", \"bandwidth_gbs\", \"latency_us\"}");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "name" && it.key() != "bandwidth_gbs" && it.key() != "latency_us")
      bad(where, key + "." + it.key(), "unknown key; a link has name, bandwidth_gbs, latency_us");
  for (const char* k : {"name", "bandwidth_gbs", "latency_us"})
    if (!j.contains(k)) bad(where, key + "." + k, "missing");
  return {text(j.at("name"), where, key + ".name"), positive(j.at("bandwidth_gbs"), where, key + ".bandwidth_gbs", false, kGiga, kMinRate, kMaxRate),
          positive(j.at("latency_us"), where, key + ".latency_us", true, kMicro, 0.0, kMaxMicros)};
}

json link_to(const Link& l) {
  return {{"name", l.name}, {"bandwidth_gbs", l.bandwidth / kGiga}, {"latency_us", l.latency / kMicro}};
}

const std::vector<std::string>& hardware_keys() {
  static const std::vector<std::string> keys = {
      "base",     "name",         "description", "peak_tflops",      "vector_tflops", "mem_bw_gbs", "mfu",
      "mem_eff",  "elem_bytes",   "launch_us",   "devices_per_node", "memory_gb",     "intra_node", "inter_node"};
  return keys;
}

std::string hardware_names() {
  std::string s;
  for (const Hardware& h : hardware_table()) s += (s.empty() ? "" : ", ") + h.name;
  return s;
}

// ---- analytic times -------------------------------------------------------------------------

// (latency steps, bandwidth factor) of a ring algorithm over n ranks.
std::pair<double, double> ring_terms(CommOp op, int n) {
  const double steps = n - 1, f = static_cast<double>(n - 1) / n;
  switch (op) {
    case CommOp::COMM_P2P: return {1.0, 1.0};
    case CommOp::COMM_ALLREDUCE: return {2 * steps, 2 * f};
    case CommOp::COMM_REDUCE_SCATTER:
    case CommOp::COMM_ALLGATHER:
    case CommOp::COMM_ALLTOALL: return {steps, f};
  }
  return {0.0, 0.0};
}

void check_hardware(const Hardware& hw) {
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("sim: hardware \"" + hw.name + "\": " + what);
  };
  need(std::isfinite(hw.peak_flops) && hw.peak_flops > 0, "peak_flops must be positive and finite");
  need(std::isfinite(hw.vector_flops) && hw.vector_flops >= 0, "vector_flops must be finite, >= 0 (0: peak_flops)");
  need(std::isfinite(hw.mem_bw) && hw.mem_bw > 0, "mem_bw must be positive and finite");
  need(std::isfinite(hw.launch) && hw.launch >= 0, "launch must be finite and >= 0");
  need(std::isfinite(hw.intra_node.bandwidth) && std::isfinite(hw.inter_node.bandwidth) &&
           std::isfinite(hw.intra_node.latency) && std::isfinite(hw.inter_node.latency) &&
           hw.intra_node.latency >= 0 && hw.inter_node.latency >= 0,
       "link bandwidths and latencies must be finite, latencies >= 0");
  need(hw.mfu > 0 && hw.mfu <= 1, "mfu must be in (0, 1]");
  need(hw.mem_eff > 0 && hw.mem_eff <= 1, "mem_eff must be in (0, 1]");
  need(hw.elem_bytes >= 1, "elem_bytes must be at least 1");
  need(hw.devices_per_node >= 1, "devices_per_node must be at least 1");
  need(hw.intra_node.bandwidth > 0 && hw.inter_node.bandwidth > 0, "link bandwidths must be positive");
}

Linear fit_points(const std::vector<int64_t>& rows, const std::function<double(int64_t)>& f) {
  std::vector<std::pair<double, double>> pts;
  for (int64_t r : rows) pts.emplace_back(static_cast<double>(r), f(r));
  return fit_linear(pts);
}

}  // namespace

const std::vector<Link>& link_table() {
  static const std::vector<Link> links = make_links();
  return links;
}

const std::vector<Hardware>& hardware_table() {
  static const std::vector<Hardware> table = make_table();
  return table;
}

const Link* find_link(const std::string& name) {
  for (const Link& l : link_table())
    if (l.name == name) return &l;
  return nullptr;
}

const Hardware* find_hardware(const std::string& name) {
  for (const Hardware& h : hardware_table())
    if (h.name == name) return &h;
  return nullptr;
}

Hardware cpu_hardware(double peak_flops, double mem_bw, int ranks_per_node, double memory_bytes) {
  Hardware h;
  h.name = "cpu";
  h.peak_flops = peak_flops;
  h.vector_flops = peak_flops;
  h.mem_bw = mem_bw;
  h.mfu = 0.7;      // piper reaches 71% of the GEMM peak on the benchmark model (docs/benchmarks.md)
  h.mem_eff = 0.9;  // mem_bw is a measured triad, not a datasheet peak
  h.elem_bytes = 4;
  h.launch = 2 * kMicro;  // OpenMP fork/join per kernel
  h.devices_per_node = std::max(1, ranks_per_node);
  h.intra_node = link_named("shm");
  h.inter_node = link_named("ib-hdr");
  h.memory_bytes = memory_bytes;
  h.description = describe("CPU rank", h);
  return h;
}

std::string hardware_help() {
  std::string s = "hardware (--hardware NAME, or a JSON file: docs/hardware.md)\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-14s %9s %9s %8s %7s  %-24s %s\n", "name", "TFLOP/s", "mem GB/s", "mem GB",
                "dev/node", "intra-node (GB/s/dir)", "inter-node (GB/s/dir)");
  s += line;
  for (const Hardware& h : hardware_table()) {
    const std::string intra = h.intra_node.name + " (" + fmt(h.intra_node.bandwidth / kGiga) + ")";
    const std::string inter = h.inter_node.name + " (" + fmt(h.inter_node.bandwidth / kGiga) + ")";
    std::snprintf(line, sizeof line, "  %-14s %9.1f %9.0f %8.0f %7d  %-24s %s\n", h.name.c_str(), h.peak_flops / kTera,
                  h.mem_bw / kGiga, h.memory_bytes / kGiga, h.devices_per_node, intra.c_str(), inter.c_str());
    s += line;
  }
  s += "links: " + link_names() + "\n";
  return s;
}

Hardware parse_hardware(const std::string& json_text, const std::string& where) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw std::invalid_argument(where + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::invalid_argument(where + ": expected a JSON object of hardware keys");
  const auto& keys = hardware_keys();
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) {
      std::string known;
      for (const std::string& k : keys) known += (known.empty() ? "" : ", ") + k;
      bad(where, it.key(), "unknown key; known keys: " + known);
    }
  Hardware h;
  const bool has_base = j.contains("base");
  if (has_base) {
    const std::string base = text(j.at("base"), where, "base");
    const Hardware* b = find_hardware(base);
    if (!b) bad(where, "base", "unknown hardware \"" + base + "\"; known: " + hardware_names());
    h = *b;
  } else {
    for (const char* k : {"name", "peak_tflops", "mem_bw_gbs"})
      if (!j.contains(k))
        throw std::invalid_argument(where + ": missing key \"" + k +
                                    "\" (name, peak_tflops and mem_bw_gbs are required without \"base\")");
    h.intra_node = link_named("pcie4");  // defaults without a base: docs/hardware.md
    h.inter_node = link_named("roce-100");
    h.vector_flops = 0;
  }
  if (j.contains("name")) h.name = text(j.at("name"), where, "name");
  if (j.contains("peak_tflops")) h.peak_flops = positive(j.at("peak_tflops"), where, "peak_tflops", false, kTera, kMinRate, kMaxRate);
  if (j.contains("vector_tflops")) h.vector_flops = positive(j.at("vector_tflops"), where, "vector_tflops", false, kTera, kMinRate, kMaxRate);
  if (h.vector_flops <= 0) h.vector_flops = h.peak_flops;
  if (j.contains("mem_bw_gbs")) h.mem_bw = positive(j.at("mem_bw_gbs"), where, "mem_bw_gbs", false, kGiga, kMinRate, kMaxRate);
  if (j.contains("mfu")) h.mfu = fraction(j.at("mfu"), where, "mfu");
  if (j.contains("mem_eff")) h.mem_eff = fraction(j.at("mem_eff"), where, "mem_eff");
  if (j.contains("elem_bytes")) h.elem_bytes = integer(j.at("elem_bytes"), where, "elem_bytes", 1, 8);
  if (j.contains("launch_us")) h.launch = positive(j.at("launch_us"), where, "launch_us", true, kMicro, 0.0, kMaxMicros);
  if (j.contains("devices_per_node"))
    h.devices_per_node = integer(j.at("devices_per_node"), where, "devices_per_node", 1, kMaxDevicesPerNode);
  if (j.contains("memory_gb")) h.memory_bytes = positive(j.at("memory_gb"), where, "memory_gb", true, kGiga, 0.0, kMaxMemoryGb);
  if (j.contains("intra_node")) h.intra_node = link_from(j.at("intra_node"), where, "intra_node");
  if (j.contains("inter_node")) h.inter_node = link_from(j.at("inter_node"), where, "inter_node");
  if (j.contains("description"))
    h.description = text(j.at("description"), where, "description");
  else if (!has_base || j.size() > 1)
    h.description = describe(h.name + " (" + where + ")", h);
  return h;
}

Hardware load_hardware(const std::string& path) {
  try {
    return parse_hardware(io::read_regular(path, kMaxInputFileBytes), path);
  } catch (const io::FileError& e) {
    throw std::invalid_argument(path + ": cannot read the hardware file: " + e.what());
  }
}

std::string hardware_to_json(const Hardware& hw) {
  json j = {{"name", hw.name},
            {"description", hw.description},
            {"peak_tflops", hw.peak_flops / kTera},
            {"vector_tflops", hw.vector_flops / kTera},
            {"mem_bw_gbs", hw.mem_bw / kGiga},
            {"mfu", hw.mfu},
            {"mem_eff", hw.mem_eff},
            {"elem_bytes", hw.elem_bytes},
            {"launch_us", hw.launch / kMicro},
            {"devices_per_node", hw.devices_per_node},
            {"memory_gb", hw.memory_bytes / kGiga},
            {"intra_node", link_to(hw.intra_node)},
            {"inter_node", link_to(hw.inter_node)}};
  return j.dump(2) + "\n";
}

Hardware resolve_hardware(const std::string& name_or_file) {
  if (const Hardware* h = find_hardware(name_or_file)) return *h;
  std::error_code ec;
  if (std::filesystem::exists(name_or_file, ec)) return load_hardware(name_or_file);
  throw std::invalid_argument("unknown hardware \"" + name_or_file + "\": neither a table name (" + hardware_names() +
                              ") nor a readable JSON file; --hardware help lists the table");
}

const Link& link_for(const Hardware& hw, int ranks, NodeSpan span) {
  switch (span) {
    case NodeSpan::SPAN_INTRA_NODE: return hw.intra_node;
    case NodeSpan::SPAN_INTER_NODE: return hw.inter_node;
    case NodeSpan::SPAN_BY_SIZE: break;
  }
  return ranks <= hw.devices_per_node ? hw.intra_node : hw.inter_node;
}

double op_seconds(const ir::OpWork& op, const Hardware& hw) {
  const double vector = hw.vector_flops > 0 ? hw.vector_flops : hw.peak_flops;
  const double compute = op.matmul_flops / (hw.peak_flops * hw.mfu) + op.other_flops / (vector * hw.mfu);
  const double memory = op.bytes / (hw.mem_bw * hw.mem_eff);
  return std::max(compute, memory) + hw.launch;
}

double comm_seconds(CommOp op, int ranks, double bytes, const Link& link) {
  if (ranks <= 1) return 0.0;
  const auto [steps, factor] = ring_terms(op, ranks);
  return steps * link.latency + factor * bytes / link.bandwidth;
}

double call_seconds(const ir::Work& w, int tp, const Hardware& hw) {
  double s = 0.0;
  for (const ir::OpWork& o : w.ops) s += op_seconds(o, hw);
  const Link& link = link_for(hw, tp, NodeSpan::SPAN_BY_SIZE);
  for (const ir::TpCollective& c : w.tp_comm) s += comm_seconds(comm_op_of(c.op), tp, c.bytes, link);
  return s;
}

CostCoverage coverage_of(const ir::ParallelDims& dims) {
  CostCoverage c{{1}, {2}};
  const int tp = dims.degree(ir::Axis::TP);
  if (tp > 1) c.tps.push_back(tp);
  for (int n : {dims.degree(ir::Axis::DP), tp, dims.degree(ir::Axis::EP), dims.expert_data_degree(), dims.world_size()})
    if (n > 2 && std::find(c.group_sizes.begin(), c.group_sizes.end(), n) == c.group_sizes.end())
      c.group_sizes.push_back(n);
  return c;
}

CostModel analytic_cost(const config::ModelConfig& m, int64_t seq_len, int kept_bytes, const Hardware& hw,
                        std::vector<int> tps, std::vector<int> group_sizes, const AnalyticOptions& opt) {
  check_hardware(hw);
  if (seq_len < 1) throw std::invalid_argument("sim: seq_len must be at least 1");
  std::vector<int64_t> rows = opt.fit_rows;
  if (rows.empty()) rows = {seq_len, 8 * seq_len};
  if (tps.empty()) tps = {1};
  std::sort(tps.begin(), tps.end());
  tps.erase(std::unique(tps.begin(), tps.end()), tps.end());

  CostModel cm;
  cm.source = "analytic";
  cm.hardware = hw.description + " [analytic: mfu " + fmt(hw.mfu, 3) + ", mem_eff " + fmt(hw.mem_eff, 3) + ", " +
                std::to_string(hw.elem_bytes) + "-byte elements]";
  cm.threads_per_rank = 1;

  std::string kinds = "e";
  for (char c : m.pattern)
    if (kinds.find(c) == std::string::npos) kinds += c;
  kinds += 'h';
  constexpr double kMs = 1e3;
  for (char kind : kinds)
    for (int tp : tps) {
      auto time = [&](ir::Pass pass) {
        return fit_points(rows, [&](int64_t r) {
          return call_seconds(ir::unit_work(m, kind, pass, r, seq_len, tp, hw.elem_bytes), tp, hw) * kMs;
        });
      };
      OpCost o;
      o.kind = kind;
      o.tp = tp;
      o.f = time(ir::Pass::PASS_F);
      o.b = time(ir::Pass::PASS_B);
      o.bi = time(ir::Pass::PASS_BI);
      // The executor runs the embedding's whole backward at its BWD_W node (it has no input half).
      o.bw = kind == 'e' ? o.b : time(ir::Pass::PASS_BW);
      auto bytes = [&](double ir::UnitMemory::*of) {
        return fit_points(rows, [&](int64_t r) { return ir::unit_memory(m, kind, r, seq_len, tp, kept_bytes).*of; });
      };
      o.saved = bytes(&ir::UnitMemory::saved);
      o.kept_for_w = bytes(&ir::UnitMemory::kept_for_w);
      o.transient = bytes(&ir::UnitMemory::transient);
      cm.ops.push_back(o);
    }

  // AdamW on fp32 master weights and moments, whatever the compute precision.
  const double vector = hw.vector_flops > 0 ? hw.vector_flops : hw.peak_flops;
  const double per_element = std::max(ir::adamw_flops_per_element() / (vector * hw.mfu),
                                      ir::adamw_bytes_per_element(4) / (hw.mem_bw * hw.mem_eff));
  cm.update = {hw.launch * kMs, per_element * kMs};

  auto comm = [&](CommOp op, int n, const Link& link) {
    const auto [steps, factor] = ring_terms(op, n);
    cm.comm.push_back({op, n, Linear{steps * link.latency * kMs, factor / link.bandwidth * kMs}, {}});
  };
  std::set<int> sizes(group_sizes.begin(), group_sizes.end());
  for (int n : sizes) {
    if (n < 2) continue;
    const Link& link = link_for(hw, n, opt.collectives);
    for (CommOp op : {CommOp::COMM_ALLREDUCE, CommOp::COMM_REDUCE_SCATTER, CommOp::COMM_ALLGATHER,
                      CommOp::COMM_ALLTOALL})
      comm(op, n, link);
  }
  comm(CommOp::COMM_P2P, 2, link_for(hw, 2, opt.p2p));
  // Slow hardware and a large model can make a call take longer than a cost model holds.
  check_cost(cm, "the analytic cost model of hardware \"" + hw.name + "\" (its peaks are too low for this model)");
  return cm;
}

}  // namespace piper::sim
