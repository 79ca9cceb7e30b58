// cost_model.cpp — lookups, linear fits and the JSON form of the cost model.
#include "sim/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

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

namespace {

CommOp comm_op_from(const std::string& s, const std::string& where) {
  for (CommOp op : {CommOp::COMM_P2P, CommOp::COMM_ALLREDUCE, CommOp::COMM_REDUCE_SCATTER, CommOp::COMM_ALLGATHER,
                    CommOp::COMM_ALLTOALL})
    if (s == comm_op_name(op)) return op;
  throw std::invalid_argument(where + ": unknown communication op \"" + s +
                              "\"; expected p2p, allreduce, reduce_scatter, allgather or alltoall");
}

// A Linear is written {"a": .., "b": ..}; a bare number means a constant.
Linear linear_from(const json& j, const std::string& where) {
  if (j.is_number()) return {j.get<double>(), 0.0};
  if (!j.is_object()) throw std::invalid_argument(where + ": expected a number or {\"a\": .., \"b\": ..}");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "a" && it.key() != "b")
      throw std::invalid_argument(where + "." + it.key() + ": unknown key; a linear cost has \"a\" and \"b\"");
  Linear l;
  if (j.contains("a")) l.a = j.at("a").get<double>();
  if (j.contains("b")) l.b = j.at("b").get<double>();
  return l;
}

json linear_to(const Linear& l) { return {{"a", l.a}, {"b", l.b}}; }

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

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
  if (host_slowdown.empty())
    return host_cores > 0 ? std::max(1.0, busy * std::max(1, threads_per_rank) / host_cores) : 1.0;
  if (busy <= 1) return host_slowdown.front();
  const double n = static_cast<double>(host_slowdown.size());
  if (busy >= n) return host_slowdown.back() * busy / n;
  const size_t i = static_cast<size_t>(busy);  // between k = i and i + 1
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

CostModel parse_cost(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw std::invalid_argument(where + ": not JSON: " + e.what());
  }
  if (!j.is_object()) throw std::invalid_argument(where + ": a cost file is a JSON object (docs/calibration.md)");
  static const std::vector<std::string> known = {"format",     "source", "hardware",      "threads_per_rank",
                                                 "host_cores", "host_slowdown", "ops", "update", "step_overhead",
                                                 "free_comm",  "comm",   "comment"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end())
      throw std::invalid_argument(where + ": unknown key \"" + it.key() + "\"; a cost file has " + joined(known));
  CostModel m;
  try {
    if (j.contains("format") && j["format"] != "piper-cost-1")
      throw std::invalid_argument(where + ": format " + j["format"].dump() + " is not piper-cost-1");
    m.source = j.value("source", "manual");
    m.hardware = j.value("hardware", "");
    m.threads_per_rank = j.value("threads_per_rank", 1);
    m.host_cores = j.value("host_cores", 0);
    m.host_slowdown = j.value("host_slowdown", std::vector<double>{});
    for (double v : m.host_slowdown)
      if (!(v > 0)) throw std::invalid_argument(where + ": host_slowdown: every factor must be > 0");
    m.free_comm = j.value("free_comm", false);
    if (j.contains("update")) m.update = linear_from(j["update"], where + ": update");
    if (j.contains("step_overhead")) m.step_overhead = linear_from(j["step_overhead"], where + ": step_overhead");
    int i = 0;
    for (const json& o : j.value("ops", json::array())) {
      const std::string at = where + ": ops[" + std::to_string(i++) + "]";
      OpCost c;
      const std::string kind = o.at("kind").get<std::string>();
      if (kind.size() != 1 || std::string("eM*-Eh").find(kind[0]) == std::string::npos)
        throw std::invalid_argument(at + ".kind: \"" + kind + "\" is not a unit kind; expected one of e M * - E h");
      c.kind = kind[0];
      c.tp = o.value("tp", 1);
      if (c.tp < 1) throw std::invalid_argument(at + ".tp: must be >= 1");
      static const std::vector<std::pair<std::string, Linear OpCost::*>> lines = {
          {"f", &OpCost::f},         {"b", &OpCost::b},
          {"bi", &OpCost::bi},       {"bw", &OpCost::bw},
          {"saved", &OpCost::saved}, {"kept_for_w", &OpCost::kept_for_w},
          {"transient", &OpCost::transient}};
      for (auto it = o.begin(); it != o.end(); ++it) {
        const std::string& k = it.key();
        if (k == "kind" || k == "tp") continue;
        const auto line = std::find_if(lines.begin(), lines.end(), [&](const auto& l) { return l.first == k; });
        if (line == lines.end()) {
          std::vector<std::string> keys = {"kind", "tp"};
          for (const auto& l : lines) keys.push_back(l.first);
          throw std::invalid_argument(at + ": unknown key \"" + k + "\"; an op has " + joined(keys));
        }
        c.*(line->second) = linear_from(it.value(), at + "." + k);
      }
      m.ops.push_back(c);
    }
    i = 0;
    for (const json& c : j.value("comm", json::array())) {
      const std::string at = where + ": comm[" + std::to_string(i++) + "]";
      CommCost cc;
      cc.op = comm_op_from(c.at("op").get<std::string>(), at + ".op");
      cc.ranks = c.value("ranks", 2);
      if (cc.ranks < 2) throw std::invalid_argument(at + ".ranks: a group has at least 2 ranks");
      cc.t = linear_from(c.at("t"), at + ".t");
      if (c.contains("points")) {
        cc.points = c["points"].get<std::vector<std::pair<double, double>>>();
        if (!std::is_sorted(cc.points.begin(), cc.points.end()))
          throw std::invalid_argument(at + ".points: [bytes, ms] pairs must be in ascending bytes");
      }
      m.comm.push_back(cc);
    }
  } catch (const json::exception& e) {
    throw std::invalid_argument(where + ": " + e.what());
  }
  return m;
}

CostModel load_cost(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::invalid_argument("cannot read the cost file " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_cost(ss.str(), path);
}

void save_cost(const CostModel& m, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("cannot write the cost file " + path);
  f << to_json(m);
  f.close();
  if (!f) throw std::runtime_error("writing the cost file " + path + " failed");
}

}  // namespace piper::sim
