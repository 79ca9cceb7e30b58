// fit.cpp — the memory check before the model is allocated (docs/config.md,
// "Memory check"). The estimate is the simulator's (sim::simulate on the
// analytic cost model of this host); this file only sums it per host, reads
// what the host has, and words the refusal.
#include "runtime/fit.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "config/checked.hpp"
#include "runtime/trainer.hpp"
#include "sim/hardware.hpp"
#include "sim/simulator.hpp"

namespace piper::runtime {

namespace {

std::string fmt_bytes(double b) {
  char s[48];
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(s, sizeof s, "%.1f GiB", b / (1024.0 * 1024 * 1024));
  else
    std::snprintf(s, sizeof s, "%.1f MiB", b / (1024.0 * 1024));
  return s;
}

// A "Key: N kB" line of /proc/meminfo, in bytes; -1 when absent.
double meminfo(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    double kb = -1;
    fields >> kb;
    return kb < 0 ? -1 : kb * 1024.0;
  }
  return -1;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return f ? s.str() : std::string();
}

// A cgroup's memory limit minus its usage, in bytes; -1 when there is no limit.
double cgroup_room() {
  auto number = [](const std::string& text, double& out) {
    if (text.empty() || text.rfind("max", 0) == 0) return false;
    char* end = nullptr;
    out = std::strtod(text.c_str(), &end);
    return end != text.c_str();
  };
  double limit = 0, used = 0;
  if (number(slurp("/sys/fs/cgroup/memory.max"), limit) && number(slurp("/sys/fs/cgroup/memory.current"), used))
    return std::max(0.0, limit - used);
  // cgroup v1: "no limit" reads as a huge number, which the min() below ignores.
  if (number(slurp("/sys/fs/cgroup/memory/memory.limit_in_bytes"), limit) &&
      number(slurp("/sys/fs/cgroup/memory/memory.usage_in_bytes"), used) && limit < 1e18)
    return std::max(0.0, limit - used);
  return -1;
}

// The message for an allocation that fails after the check passed, set by check_memory_fit.
std::string g_oom_text;

// One line of the refusal: what holds the memory, the keys that make it large, and how much.
struct Contributor {
  std::string what;
  double bytes = 0;
};

std::vector<Contributor> contributors(const config::Config& cfg, const ir::Plan& plan, int rank,
                                      const RankMemory& m) {
  const config::ModelConfig& mc = cfg.model;
  const ir::Degrees degrees = plan.strategy.dims().degrees();
  // The state (parameters, gradients, Adam moments) of each unit is in proportion to its
  // parameters on this rank; the simulator gives the total.
  std::map<char, double> params_of_kind;
  double held = 0;
  for (const auto& u : plan.model.units) {
    const auto& devs = plan.devices_of_unit[static_cast<size_t>(u.index)];
    if (std::find(devs.begin(), devs.end(), rank) == devs.end()) continue;
    double n = 0;
    for (const auto& p : u.params) n += static_cast<double>(ir::local_numel(p, degrees));
    const char sym = ir::unit_symbol(u.kind);
    params_of_kind[sym == 'h' ? 'e' : sym] += n;
    held += n;
  }
  const double state = m.peak[0] + m.peak[1] + m.peak[2];
  const std::string pgo = " (parameters, gradients and Adam moments)";
  std::vector<Contributor> out;
  for (const auto& [kind, n] : params_of_kind) {
    const double bytes = held > 0 ? state * n / held : 0;
    const std::string d = std::to_string(mc.d_model);
    std::string what;
    if (kind == 'e')
      what = "the embedding and head: model.vocab_size x model.d_model = " + std::to_string(mc.vocab_size) + " x " + d;
    else if (kind == '-')
      what = "the MLP blocks: model.ffn_hidden x model.d_model = " + std::to_string(mc.ffn_hidden) + " x " + d +
             " per matrix";
    else if (kind == '*')
      what = "the attention blocks: model.d_model = " + d + " (model.n_heads, model.n_kv_heads)";
    else if (kind == 'M')
      what = "the Mamba-2 blocks: model.expand x model.d_model = d_inner " + std::to_string(mc.d_inner()) +
             " (model.d_state, model.n_groups, model.head_dim)";
    else
      what = std::string("the '") + kind + "' blocks";
    out.push_back({what + pgo, bytes});
  }
  const int64_t per_mb = cfg.train.global_batch /
                         std::max<int64_t>(1, int64_t{plan.strategy.replicate.dp} * plan.strategy.split.microbatches);
  out.push_back({"activations: train.global_batch / (parallel.dp x parallel.microbatches) x train.seq_len = " +
                     std::to_string(per_mb) + " x " + std::to_string(cfg.train.seq_len) +
                     " tokens per microbatch, each as wide as model.d_model (model.vocab_size in the head), " +
                     std::to_string(m.peak_microbatches) + " microbatch(es) held at once by the schedule",
                 m.peak[3]});
  out.push_back({"communication and scratch buffers of the same sizes", m.peak[4]});
  std::stable_sort(out.begin(), out.end(),
                   [](const Contributor& a, const Contributor& b) { return a.bytes > b.bytes; });
  return out;
}

}  // namespace

HostMemory host_memory() {
  HostMemory h;
  const double avail = meminfo(slurp("/proc/meminfo"), "MemAvailable");
  if (avail >= 0) {
    h.bytes = avail;
    h.source = "MemAvailable in /proc/meminfo";
  } else {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) {
      h.bytes = static_cast<double>(pages) * static_cast<double>(page);
      h.source = "free physical pages (sysconf)";
    }
  }
  const double room = cgroup_room();
  if (room >= 0 && (h.bytes <= 0 || room < h.bytes)) {
    h.bytes = room;
    h.source = "the cgroup memory limit less its usage";
  }
  return h;
}

RankMemory estimate_rank_memory(const config::Config& cfg, const ir::Plan& plan, int rank) {
  // The analytic cost model of this host, as `piper simulate --hardware cpu-local` builds it; the
  // times do not matter here, the memory is the runtime's in the strategy's storage type.
  const sim::Hardware* hw = sim::find_hardware("cpu-local");
  const auto& s = plan.strategy;
  const sim::CostCoverage covers = sim::coverage_of(s.dims());
  const sim::CostModel cost = sim::analytic_cost(cfg.model, cfg.train.seq_len, static_cast<int>(s.compute_elem_bytes),
                                                 *hw, covers.tps, covers.group_sizes);
  const sim::SimResult r = sim::simulate(plan, cfg, cost);
  const sim::RankResult& rr = r.ranks.at(static_cast<size_t>(rank));
  RankMemory m;
  for (size_t c = 0; c < m.peak.size(); ++c) m.peak[c] = rr.peak[c];
  // The trainer's StepBatch: inputs and targets of this replica's share of the batch, int32.
  const int64_t share = cfg.train.global_batch / std::max(1, s.replicate.dp);
  m.input_bytes = 2.0 * static_cast<double>(share) * static_cast<double>(cfg.train.seq_len) * 4.0;
  m.total = rr.peak_total + m.input_bytes;
  m.peak_microbatches = rr.peak_microbatches;
  return m;
}

MemoryFit check_memory_fit(const config::Config& cfg, const ir::Plan& plan, const MpiEnv& env) {
  // Every rank plays the whole plan; beyond what the simulator plays in seconds, or when it
  // cannot time the plan, there is no estimate (the same on every rank: the plan is).
  std::string skipped;
  RankMemory mine;
  if (const int64_t n = sim::instructions(plan); n > kFitMaxInstructions) {
    skipped = "the plan has " + std::to_string(n) + " instructions over all ranks, more than the " +
              std::to_string(kFitMaxInstructions) + " the estimate plays in seconds (docs/config.md, Memory check)";
  } else {
    try {
      mine = estimate_rank_memory(cfg, plan, env.rank());
    } catch (const sim::SimError& e) {
      skipped = e.what();
    }
  }
  if (!skipped.empty()) {
    if (env.rank() == 0) std::printf("piper: memory check skipped: %s\n", skipped.c_str());
    return {};
  }
  const HostMemory host = host_memory();

  // The ranks of this host share its memory.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(env.comm(), MPI_COMM_TYPE_SHARED, env.rank(), MPI_INFO_NULL, &node);
  int on_host = 1;
  MPI_Comm_size(node, &on_host);
  double need = mine.total * (1.0 + kFitMargin) + kFitPerRankBytes, host_need = 0;
  double avail = host.bytes > 0 ? host.bytes : 0, host_avail = 0;
  MPI_Allreduce(&need, &host_need, 1, MPI_DOUBLE, MPI_SUM, node);
  MPI_Allreduce(&avail, &host_avail, 1, MPI_DOUBLE, MPI_MIN, node);
  MPI_Comm_free(&node);

  // The host short of memory by the largest factor speaks for the job.
  struct {
    double ratio;
    int rank;
  } in{host_avail > 0 ? host_need / host_avail : 0.0, env.rank()}, worst{0.0, 0};
  MPI_Allreduce(&in, &worst, 1, MPI_DOUBLE_INT, MPI_MAXLOC, env.comm());

  const std::string cats = "params " + fmt_bytes(mine.peak[0]) + ", grads " + fmt_bytes(mine.peak[1]) +
                           ", optimizer " + fmt_bytes(mine.peak[2]) + ", activations " + fmt_bytes(mine.peak[3]) +
                           ", buffers " + fmt_bytes(mine.peak[4]) + ", input batch " + fmt_bytes(mine.input_bytes);
  const std::string remedy =
      "use smaller sizes, or spread the model over more ranks: parallel.zero 1-3 (with parallel.dp >= 2) shards "
      "the optimizer state, gradients and parameters, parallel.pp and parallel.tp split the model, more "
      "parallel.microbatches shrink the activations";
  const std::string available = fmt_bytes(host_avail) + " available (" + host.source + ")";

  std::string message;
  if (worst.ratio > 1.0 && worst.rank == env.rank()) {
    std::vector<Contributor> top = contributors(cfg, plan, env.rank(), mine);
    std::string largest;
    for (size_t i = 0; i < top.size() && i < 3; ++i)
      if (top[i].bytes > 0) largest += (largest.empty() ? "" : "; ") + top[i].what + ": " + fmt_bytes(top[i].bytes);
    const std::string margin = "the margin of " + std::to_string(static_cast<int>(kFitMargin * 100)) + "% + " +
                               fmt_bytes(kFitPerRankBytes) + " per rank";
    message = "memory: the run does not fit on host " + env.host() + ": rank " + std::to_string(env.rank()) +
              " needs an estimated " + fmt_bytes(mine.total) + " (" + cats + "); " +
              (on_host > 1 ? "the " + std::to_string(on_host) + " ranks on this host together, with " + margin +
                                 ", need "
                           : "with " + margin + " that is ") +
              fmt_bytes(host_need) + ", but the host has " + available + ". Largest: " + largest + ". To fit, " +
              remedy + " (docs/config.md, Memory check)";
  }
  if (worst.ratio > 1.0) {
    // Every rank throws the same message, so rank 0 can print it.
    int len = static_cast<int>(message.size());
    MPI_Bcast(&len, 1, MPI_INT, worst.rank, env.comm());
    message.resize(static_cast<size_t>(len));
    MPI_Bcast(message.data(), len, MPI_CHAR, worst.rank, env.comm());
    throw UserError(message);
  }
  g_oom_text = "out of memory on rank " + std::to_string(env.rank()) + " (" + env.host() +
               "): an allocation failed; the estimate for this rank was " + fmt_bytes(mine.total) + " (" + cats +
               ") and the host had " + available + " for " + std::to_string(on_host) +
               " rank(s) when the run started (other processes, or a limit such as ulimit -v, may have left less); " +
               remedy + " (docs/config.md, Memory check)";
  return {mine, host_need, host, on_host};
}

void out_of_memory(const MpiEnv& env) {
  const std::string text = !g_oom_text.empty()
                               ? g_oom_text
                               : "out of memory on rank " + std::to_string(env.rank()) + " (" + env.host() +
                                     "): an allocation failed (there is no memory estimate for this plan; docs/config.md, Memory check)";
  if (env.world_size() == 1) throw UserError(text);
  // The other ranks are waiting for this one: say it here, stop them all.
  std::fprintf(stderr, "piper: error: %s\n", text.c_str());
  std::fflush(stderr);
  env.abort(2);
}

}  // namespace piper::runtime
