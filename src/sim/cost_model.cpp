// cost_model.cpp — lookups, linear fits and the JSON form of the cost model.
#include "sim/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "io/regular_file.hpp"

namespace piper::sim {

using nlohmann::json;

Linear fit_linear(const std::vector<std::pair<double, double>>& points) {
  if (points.empty()) return {};
  if (points.size() == 1) return {0.0, points[0].first != 0 ? points[0].second / points[0].first : 0.0};
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = static_cast<double>(points.size());
  for (const auto& [x, y] : points) {
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double den = n * sxx - sx * sx;
  if (den == 0) return {sy / n, 0.0};
  const double b = (n * sxy - sx * sy) / den;
  return {(sy - b * sx) / n, b};
}

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::COMM_P2P: return "p2p";
    case CommOp::COMM_ALLREDUCE: return "allreduce";
    case CommOp::COMM_REDUCE_SCATTER: return "reduce_scatter";
    case CommOp::COMM_ALLGATHER: return "allgather";
    case CommOp::COMM_ALLTOALL: return "alltoall";
  }
  return "?";
}

CommOp comm_op_of(ir::NodeKind k) {
  switch (k) {
    case ir::NodeKind::SEND:
    case ir::NodeKind::RECV: return CommOp::COMM_P2P;
    case ir::NodeKind::ALLREDUCE: return CommOp::COMM_ALLREDUCE;
    case ir::NodeKind::REDUCE_SCATTER: return CommOp::COMM_REDUCE_SCATTER;
    case ir::NodeKind::ALLGATHER: return CommOp::COMM_ALLGATHER;
    case ir::NodeKind::ALLTOALL: return CommOp::COMM_ALLTOALL;
    default:
      throw std::invalid_argument(std::string("sim: node kind ") + ir::node_kind_name(k) +
                                  " is compute, not communication; expected SEND, RECV, ALLREDUCE, REDUCE_SCATTER, "
                                  "ALLGATHER or ALLTOALL");
  }
}

namespace {

[[noreturn]] void bad(const std::string& at, const std::string& what) { throw std::invalid_argument(at + ": " + what); }

std::string num(double v) {
  std::ostringstream s;
  s.precision(6);
  s << v;
  return s.str();
}

CommOp comm_op_from(const json& j, const std::string& at) {
  if (!j.is_string()) bad(at, "expected a string (p2p, allreduce, reduce_scatter, allgather or alltoall), got " + j.dump());
  const std::string s = j.get<std::string>();
  for (CommOp op : {CommOp::COMM_P2P, CommOp::COMM_ALLREDUCE, CommOp::COMM_REDUCE_SCATTER, CommOp::COMM_ALLGATHER,
                    CommOp::COMM_ALLTOALL})
    if (s == comm_op_name(op)) return op;
  bad(at, "unknown communication op \"" + s + "\"; expected p2p, allreduce, reduce_scatter, allgather or alltoall");
}

// Typed reads: a wrong type is refused naming the key path and the type expected.
double number_from(const json& j, const std::string& at) {
  if (!j.is_number()) bad(at, "expected a number, got " + j.dump());
  const double v = j.get<double>();
  if (!std::isfinite(v)) bad(at, "expected a finite number, got " + j.dump());
  return v;
}

int integer_from(const json& j, const std::string& at, int lo, int hi) {
  if (!j.is_number_integer() || j.get<int64_t>() < lo || j.get<int64_t>() > hi)
    bad(at, "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " + j.dump());
  return static_cast<int>(j.get<int64_t>());
}

std::string string_from(const json& j, const std::string& at) {
  if (!j.is_string()) bad(at, "expected a string, got " + j.dump());
  return j.get<std::string>();
}

bool bool_from(const json& j, const std::string& at) {
  if (!j.is_boolean()) bad(at, "expected true or false, got " + j.dump());
  return j.get<bool>();
}

const json& array_from(const json& j, const std::string& at, const char* of) {
  if (!j.is_array()) bad(at, std::string("expected an array of ") + of + ", got " + j.dump().substr(0, 80));
  return j;
}

// A Linear is written {"a": .., "b": ..}; a bare number means a constant.
Linear linear_from(const json& j, const std::string& at) {
  if (j.is_number()) return {number_from(j, at), 0.0};
  if (!j.is_object()) bad(at, "expected a number or {\"a\": .., \"b\": ..}, got " + j.dump().substr(0, 80));
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "a" && it.key() != "b") bad(at + "." + it.key(), "unknown key; a linear cost has \"a\" and \"b\"");
  Linear l;
  if (j.contains("a")) l.a = number_from(j.at("a"), at + ".a");
  if (j.contains("b")) l.b = number_from(j.at("b"), at + ".b");
  return l;
}

// A linear cost a + b x (ms or bytes at size x >= 0): a constant is never negative, and neither is a line
// at every size (a < 0 with b <= 0). A fitted line may be negative on one side only — a negative
// intercept with a rising line, or (measured on a busy machine) a falling one that is positive at the
// sizes measured; the simulator takes 0 where it is negative. Both parts within kMaxCoefficient.
void check_linear(const Linear& l, const std::string& at, const char* unit) {
  const std::string range = "allowed: -" + num(kMaxCoefficient) + " to " + num(kMaxCoefficient);
  if (l.b == 0 && (!std::isfinite(l.a) || l.a < 0 || l.a > kMaxCoefficient))
    bad(at, "the constant " + num(l.a) + " " + unit + " is out of range (allowed: 0 to " + num(kMaxCoefficient) + ")");
  if (!std::isfinite(l.a) || std::abs(l.a) > kMaxCoefficient)
    bad(at + ".a", "the intercept " + num(l.a) + " " + unit + " is out of range (" + range + ")");
  if (!std::isfinite(l.b) || std::abs(l.b) > kMaxCoefficient)
    bad(at + ".b", "the per-size part " + num(l.b) + " " + unit + " is out of range (" + range + ")");
  if (l.a < 0 && l.b <= 0)
    bad(at, num(l.a) + " + " + num(l.b) + " x size is negative at every size (a " + unit +
                " count is at least 0 somewhere: a >= 0, or a rising line b > 0)");
}

json linear_to(const Linear& l) { return {{"a", l.a}, {"b", l.b}}; }

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The keys of a cost file and of an op (docs/calibration.md).
const std::vector<std::string> kCostKeys = {"format",        "source", "hardware", "threads_per_rank", "host_cores",
                                            "host_slowdown", "ops",    "update",   "step_overhead",    "free_comm",
                                            "comm",          "comment"};
const std::vector<std::pair<std::string, Linear OpCost::*>> kOpLines = {
    {"f", &OpCost::f},         {"b", &OpCost::b},
    {"bi", &OpCost::bi},       {"bw", &OpCost::bw},
    {"saved", &OpCost::saved}, {"kept_for_w", &OpCost::kept_for_w},
    {"transient", &OpCost::transient}};

double ring_factor(CommOp op, int n) {
  const double f = static_cast<double>(n - 1) / n;
  return op == CommOp::COMM_ALLREDUCE ? 2 * f : op == CommOp::COMM_P2P ? 1.0 : f;
}

}  // namespace

double CommCost::at(double bytes) const {
  if (points.size() < 2 || bytes < points.front().first || bytes > points.back().first) return t.at(bytes);
  auto hi = std::lower_bound(points.begin(), points.end(), bytes,
                             [](const std::pair<double, double>& p, double b) { return p.first < b; });
  if (hi == points.begin()) return hi->second;
  const auto lo = hi - 1;
  const double f = (bytes - lo->first) / (hi->first - lo->first);
  return lo->second + f * (hi->second - lo->second);
}

const OpCost& CostModel::op(char kind, int tp) const {
  const OpCost* base = nullptr;
  for (const OpCost& o : ops) {
    if (o.kind != kind) continue;
    if (o.tp == tp) return o;
    if (o.tp == 1) base = &o;
  }
  if (base) return *base;
  std::string have;
  for (const OpCost& o : ops) have += std::string(have.empty() ? "" : ", ") + o.kind + "@tp" + std::to_string(o.tp);
  throw std::out_of_range(std::string("the cost model has no entry for unit kind '") + kind + "' (at tp " +
                          std::to_string(tp) + " or 1); it has: " + (have.empty() ? "none" : have) +
                          ". Calibrate with a config whose pattern has this kind.");
}

double CostModel::compute_ms(char kind, ir::Pass pass, int tp, int64_t rows) const {
  const OpCost& o = op(kind, tp);
  const Linear* l = nullptr;
  switch (pass) {
    case ir::Pass::PASS_F: l = &o.f; break;
    case ir::Pass::PASS_B: l = &o.b; break;
    case ir::Pass::PASS_BI: l = &o.bi; break;
    case ir::Pass::PASS_BW: l = &o.bw; break;
    default: return 0.0;
  }
  const double scale = o.tp == tp ? 1.0 : static_cast<double>(o.tp) / tp;  // the row part splits over tp
  return std::max(0.0, l->a + l->b * static_cast<double>(rows) * scale);
}

double CostModel::comm_ms(CommOp op, int ranks, int64_t bytes) const {
  if (free_comm || ranks <= 1) return 0.0;
  const CommCost* best = nullptr;
  for (const CommCost& c : comm) {
    if (c.op != op) continue;
    if (c.ranks == ranks) return std::max(0.0, c.at(static_cast<double>(bytes)));
    if (!best || std::abs(c.ranks - ranks) < std::abs(best->ranks - ranks)) best = &c;
  }
  if (!best)
    throw std::out_of_range(std::string("the cost model has no ") + comm_op_name(op) +
                            " entry; calibrate on more than one rank, or set \"free_comm\": true");
  // Ring algorithms: bandwidth term scales with the ring factor, latency with the steps.
  const double bw = best->t.b * ring_factor(op, ranks) / ring_factor(op, best->ranks);
  const double lat = best->t.a * std::max(1, ranks - 1) / std::max(1, best->ranks - 1);
  return std::max(0.0, lat + bw * static_cast<double>(bytes));
}

double CostModel::sharing(double busy) const {
  if (!std::isfinite(busy) || busy < 0)
    throw std::logic_error("sim: host sharing asked at " + num(busy) + " busy ranks; expected a finite count >= 0");
  if (host_slowdown.empty())
    return host_cores > 0 ? std::max(1.0, busy * std::max(1, threads_per_rank) / host_cores) : 1.0;
  if (busy <= 1) return host_slowdown.front();
  const double n = static_cast<double>(host_slowdown.size());
  if (busy >= n) return host_slowdown.back() * busy / n;
  // Between k = i and i + 1, 1 <= i < n here (1 < busy < n).
  const size_t i = std::clamp(static_cast<size_t>(busy), size_t{1}, host_slowdown.size() - 1);
  const double f = busy - static_cast<double>(i);
  return host_slowdown[i - 1] * (1 - f) + host_slowdown[i] * f;
}

std::string to_json(const CostModel& m) {
  json ops = json::array();
  for (const OpCost& o : m.ops)
    ops.push_back({{"kind", std::string(1, o.kind)},
                   {"tp", o.tp},
                   {"f", linear_to(o.f)},
                   {"b", linear_to(o.b)},
                   {"bi", linear_to(o.bi)},
                   {"bw", linear_to(o.bw)},
                   {"saved", linear_to(o.saved)},
                   {"kept_for_w", linear_to(o.kept_for_w)},
                   {"transient", linear_to(o.transient)}});
  json comm = json::array();
  for (const CommCost& c : m.comm) {
    json e = {{"op", comm_op_name(c.op)}, {"ranks", c.ranks}, {"t", linear_to(c.t)}};
    if (!c.points.empty()) e["points"] = c.points;
    comm.push_back(e);
  }
  json j = {{"format", "piper-cost-1"},
            {"source", m.source},
            {"hardware", m.hardware},
            {"threads_per_rank", m.threads_per_rank},
            {"host_cores", m.host_cores},
            {"host_slowdown", m.host_slowdown},
            {"ops", ops},
            {"update", linear_to(m.update)},
            {"step_overhead", linear_to(m.step_overhead)},
            {"free_comm", m.free_comm},
            {"comm", comm}};
  return j.dump(2) + "\n";
}

void check_cost(const CostModel& m, const std::string& where) {
  const std::string w = where + ": ";
  if (m.threads_per_rank < 1 || m.threads_per_rank > kMaxThreadsPerRank)
    bad(w + "threads_per_rank", std::to_string(m.threads_per_rank) + " is out of range (allowed: 1 to " +
                                    std::to_string(kMaxThreadsPerRank) + " OpenMP threads per rank)");
  if (m.host_cores < 0 || m.host_cores > kMaxHostCores)
    bad(w + "host_cores", std::to_string(m.host_cores) + " is out of range (allowed: 0 = unknown, or 1 to " +
                              std::to_string(kMaxHostCores) + " cores)");
  if (m.host_slowdown.size() > static_cast<size_t>(kMaxHostRanks))
    bad(w + "host_slowdown", std::to_string(m.host_slowdown.size()) + " entries; at most " +
                                 std::to_string(kMaxHostRanks) + " (one per rank of a host)");
  for (size_t k = 0; k < m.host_slowdown.size(); ++k) {
    const double v = m.host_slowdown[k];
    if (!std::isfinite(v) || !(v > 0) || v > kMaxSlowdown)
      bad(w + "host_slowdown[" + std::to_string(k) + "]",
          "the factor " + num(v) + " is out of range (allowed: above 0, at most " + num(kMaxSlowdown) +
              " times the time of one rank alone)");
  }
  check_linear(m.update, w + "update", "ms");
  check_linear(m.step_overhead, w + "step_overhead", "ms");
  for (size_t i = 0; i < m.ops.size(); ++i) {
    const OpCost& o = m.ops[i];
    const std::string at = w + "ops[" + std::to_string(i) + "]";
    if (std::string("eM*-Eh").find(o.kind) == std::string::npos)
      bad(at + ".kind", std::string("'") + o.kind + "' is not a unit kind; expected one of e M * - E h");
    if (o.tp < 1 || o.tp > kMaxGroupRanks)
      bad(at + ".tp", std::to_string(o.tp) + " is out of range (allowed: 1 to " + std::to_string(kMaxGroupRanks) + ")");
    check_linear(o.f, at + ".f", "ms");
    check_linear(o.b, at + ".b", "ms");
    check_linear(o.bi, at + ".bi", "ms");
    check_linear(o.bw, at + ".bw", "ms");
    check_linear(o.saved, at + ".saved", "bytes");
    check_linear(o.kept_for_w, at + ".kept_for_w", "bytes");
    check_linear(o.transient, at + ".transient", "bytes");
  }
  for (size_t i = 0; i < m.comm.size(); ++i) {
    const CommCost& c = m.comm[i];
    const std::string at = w + "comm[" + std::to_string(i) + "]";
    if (c.ranks < 2 || c.ranks > kMaxGroupRanks)
      bad(at + ".ranks", std::to_string(c.ranks) + " is out of range (allowed: 2 to " +
                             std::to_string(kMaxGroupRanks) + " ranks in a group)");
    check_linear(c.t, at + ".t", "ms");
    for (size_t k = 0; k < c.points.size(); ++k) {
      const auto [bytes, ms] = c.points[k];
      const std::string pt = at + ".points[" + std::to_string(k) + "]";
      if (!std::isfinite(bytes) || bytes < 0 || bytes > kMaxPointBytes)
        bad(pt, "bytes " + num(bytes) + " out of range (allowed: 0 to " + num(kMaxPointBytes) + ")");
      if (!std::isfinite(ms) || ms < 0 || ms > kMaxCoefficient)
        bad(pt, "time " + num(ms) + " ms out of range (allowed: 0 to " + num(kMaxCoefficient) + ")");
      if (k > 0 && bytes < c.points[k - 1].first) bad(at + ".points", "[bytes, ms] pairs must be in ascending bytes");
    }
  }
}

CostModel parse_cost(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw std::invalid_argument(where + ": not JSON (numbers must be finite, within +-1.8e308): " + e.what());
  }
  if (!j.is_object()) throw std::invalid_argument(where + ": a cost file is a JSON object (docs/calibration.md)");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(kCostKeys.begin(), kCostKeys.end(), it.key()) == kCostKeys.end())
      throw std::invalid_argument(where + ": unknown key \"" + it.key() + "\"; a cost file has " + joined(kCostKeys));
  const std::string w = where + ": ";
  CostModel m;
  if (j.contains("format") && string_from(j["format"], w + "format") != "piper-cost-1")
    bad(w + "format", j["format"].dump() + " is not \"piper-cost-1\"");
  if (j.contains("source")) m.source = string_from(j["source"], w + "source");
  if (j.contains("hardware")) m.hardware = string_from(j["hardware"], w + "hardware");
  if (j.contains("threads_per_rank"))
    m.threads_per_rank = integer_from(j["threads_per_rank"], w + "threads_per_rank", 1, kMaxThreadsPerRank);
  if (j.contains("host_cores")) m.host_cores = integer_from(j["host_cores"], w + "host_cores", 0, kMaxHostCores);
  if (j.contains("host_slowdown")) {
    const json& a = array_from(j["host_slowdown"], w + "host_slowdown", "factors");
    for (size_t k = 0; k < a.size(); ++k)
      m.host_slowdown.push_back(number_from(a[k], w + "host_slowdown[" + std::to_string(k) + "]"));
  }
  if (j.contains("free_comm")) m.free_comm = bool_from(j["free_comm"], w + "free_comm");
  if (j.contains("update")) m.update = linear_from(j["update"], w + "update");
  if (j.contains("step_overhead")) m.step_overhead = linear_from(j["step_overhead"], w + "step_overhead");
  if (j.contains("ops")) {
    const json& ops = array_from(j["ops"], w + "ops", "objects");
    for (size_t i = 0; i < ops.size(); ++i) {
      const json& o = ops[i];
      const std::string at = w + "ops[" + std::to_string(i) + "]";
      if (!o.is_object()) bad(at, "expected an object {\"kind\": .., \"f\": .., ...}, got " + o.dump().substr(0, 80));
      OpCost c;
      if (!o.contains("kind")) bad(at + ".kind", "missing; expected one of e M * - E h");
      const std::string kind = string_from(o["kind"], at + ".kind");
      if (kind.size() != 1 || std::string("eM*-Eh").find(kind[0]) == std::string::npos)
        bad(at + ".kind", "\"" + kind + "\" is not a unit kind; expected one of e M * - E h");
      c.kind = kind[0];
      if (o.contains("tp")) c.tp = integer_from(o["tp"], at + ".tp", 1, kMaxGroupRanks);
      for (auto it = o.begin(); it != o.end(); ++it) {
        const std::string& k = it.key();
        if (k == "kind" || k == "tp") continue;
        const auto line = std::find_if(kOpLines.begin(), kOpLines.end(), [&](const auto& l) { return l.first == k; });
        if (line == kOpLines.end()) {
          std::vector<std::string> keys = {"kind", "tp"};
          for (const auto& l : kOpLines) keys.push_back(l.first);
          bad(at, "unknown key \"" + k + "\"; an op has " + joined(keys));
        }
        c.*(line->second) = linear_from(it.value(), at + "." + k);
      }
      m.ops.push_back(c);
    }
  }
  if (j.contains("comm")) {
    const json& comm = array_from(j["comm"], w + "comm", "objects");
    for (size_t i = 0; i < comm.size(); ++i) {
      const json& c = comm[i];
      const std::string at = w + "comm[" + std::to_string(i) + "]";
      if (!c.is_object()) bad(at, "expected an object {\"op\": .., \"ranks\": .., \"t\": ..}, got " + c.dump().substr(0, 80));
      for (auto it = c.begin(); it != c.end(); ++it)
        if (it.key() != "op" && it.key() != "ranks" && it.key() != "t" && it.key() != "points")
          bad(at, "unknown key \"" + it.key() + "\"; a comm entry has op, ranks, t, points");
      CommCost cc;
      if (!c.contains("op")) bad(at + ".op", "missing; expected p2p, allreduce, reduce_scatter, allgather or alltoall");
      cc.op = comm_op_from(c["op"], at + ".op");
      if (c.contains("ranks")) cc.ranks = integer_from(c["ranks"], at + ".ranks", 2, kMaxGroupRanks);
      if (!c.contains("t")) bad(at + ".t", "missing; the time in ms as a function of bytes, {\"a\": .., \"b\": ..}");
      cc.t = linear_from(c["t"], at + ".t");
      if (c.contains("points")) {
        const json& pts = array_from(c["points"], at + ".points", "[bytes, ms] pairs");
        for (size_t k = 0; k < pts.size(); ++k) {
          const std::string pt = at + ".points[" + std::to_string(k) + "]";
          if (!pts[k].is_array() || pts[k].size() != 2) bad(pt, "expected a [bytes, ms] pair, got " + pts[k].dump());
          cc.points.emplace_back(number_from(pts[k][0], pt + "[0]"), number_from(pts[k][1], pt + "[1]"));
        }
      }
      m.comm.push_back(cc);
    }
  }
  check_cost(m, where);
  return m;
}

CostModel load_cost(const std::string& path) {
  try {
    return parse_cost(io::read_regular(path, kMaxInputFileBytes), path);
  } catch (const io::FileError& e) {
    throw std::invalid_argument("cannot read the cost file " + path + ": " + e.what());
  }
}

void save_cost(const CostModel& m, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("cannot write the cost file " + path);
  f << to_json(m);
  f.close();
  if (!f) throw std::runtime_error("writing the cost file " + path + " failed");
}

}  // namespace piper::sim
