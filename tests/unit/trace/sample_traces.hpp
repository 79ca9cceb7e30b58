// sample_traces.hpp — realistic traces for the trace tests: pipeline orders
// (1F1B, DualPipeV) played with fixed pass costs into Events, as a measured
// run would record them, and a small checker for the SVG the tests draw.
#pragma once

#include <algorithm>
#include <deque>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "trace/trace.hpp"

namespace piper::testing {

using trace::Event;
using trace::Lane;
using trace::Trace;

// One pipeline operation: 'F' forward, 'B' backward (input half when split,
// else fused), 'W' weight half; on a rank's chunk (0 or 1).
struct SampleOp {
  char pass;
  int mb;
  int chunk;
};

// 1F1B (PipeDream-Flush) on `p` ranks: warm-up forwards, F B pairs, cool-down.
inline std::vector<std::vector<SampleOp>> order_1f1b(int p, int m) {
  std::vector<std::vector<SampleOp>> ops(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto& o = ops[static_cast<size_t>(r)];
    const int w = std::min(p - r - 1, m);
    for (int i = 0; i < w; ++i) o.push_back({'F', i, 0});
    for (int i = 0; i < m - w; ++i) o.push_back({'F', w + i, 0}), o.push_back({'B', i, 0});
    for (int i = m - w; i < m; ++i) o.push_back({'B', i, 0});
  }
  return ops;
}

// DualPipeV (DualPipe's dualpipev.py step()): rank r holds stages r and 2p-1-r.
inline std::vector<std::vector<SampleOp>> order_dualpipev(int p, int m) {
  std::vector<std::vector<SampleOp>> ops(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto& o = ops[static_cast<size_t>(r)];
    int f[2] = {0, 0}, b[2] = {0, 0};
    std::deque<std::pair<int, int>> queued_w;
    auto F = [&](int c) { o.push_back({'F', f[c]++, c}); };
    auto B = [&](int c, bool zb) {
      o.push_back({'B', b[c], c});
      if (zb) queued_w.push_back({b[c], c});
      else o.push_back({'W', b[c], c});
      ++b[c];
    };
    auto W = [&] {
      o.push_back({'W', queued_w.front().first, queued_w.front().second});
      queued_w.pop_front();
    };
    for (int i = 0; i < 2 * (p - r - 1); ++i) F(0);                      // 1: nF0
    for (int i = 0; i < r + 1; ++i) F(0), F(1);                          // 2: nF0F1
    for (int i = 0; i < p - r - 1; ++i) B(1, true), W(), F(1);           // 3: nB1W1F1
    for (int i = 0; i < m - 2 * p + r + 1; ++i) F(0), B(1, false), F(1), B(0, false);  // 4: nF0B1F1B0
    for (int i = 0; i < p - r - 1; ++i) B(1, false), F(1), B(0, false);  // 5: nB1F1B0
    bool zb = false;                                                     // 6: nB1B0, zero bubble from the middle
    for (int i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) zb = true;
      B(1, zb);
      if (i == (r + 1) / 2 && r % 2 == 0) zb = true;
      B(0, zb);
    }
    for (int i = 0; i < p - r - 1; ++i) W(), B(0, true);                 // 7: nWB0
    for (int i = 0; i < r + 1; ++i) W();                                 // 8: nW
  }
  return ops;
}

struct SampleCosts {
  double f_us = 1000, b_us = 2000, bi_us = 1000, bw_us = 900, upd_us = 300, link_us = 120;
};

// Plays `ops` (each rank in order, a pass starting once its rank is free and
// its inputs arrived) into the events of step `step`, starting at `t0_us`;
// sends and receives on the communication lane, one UPD per chunk at the end.
// Returns the step's end.
inline double play_sample(Trace& t, const std::vector<std::vector<SampleOp>>& ops, bool v_layout, bool split,
                          const SampleCosts& c, int step, double t0_us) {
  const int p = static_cast<int>(ops.size());
  const int stages = v_layout ? 2 * p : p;
  auto stage_of = [&](int r, int chunk) { return chunk == 0 ? r : 2 * p - 1 - r; };
  auto rank_of = [&](int s) { return s < p ? s : 2 * p - 1 - s; };
  std::map<std::tuple<char, int, int>, double> done;  // (pass, mb, stage) -> end
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), t0_us);
  std::vector<int> chunks(static_cast<size_t>(p), 1);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      if (next[static_cast<size_t>(r)] == ops[static_cast<size_t>(r)].size()) continue;
      const SampleOp op = ops[static_cast<size_t>(r)][next[static_cast<size_t>(r)]];
      const int s = stage_of(r, op.chunk);
      chunks[static_cast<size_t>(r)] = std::max(chunks[static_cast<size_t>(r)], op.chunk + 1);
      std::vector<std::tuple<char, int, int>> deps;
      if (op.pass == 'F' && s > 0) deps.push_back({'F', op.mb, s - 1});
      if (op.pass == 'B') {
        deps.push_back({'F', op.mb, s});
        if (s + 1 < stages) deps.push_back({'B', op.mb, s + 1});
      }
      if (op.pass == 'W') deps.push_back({'B', op.mb, s});
      double start = free_at[static_cast<size_t>(r)];
      bool ready = true;
      for (const auto& d : deps) {
        const auto it = done.find(d);
        if (it == done.end()) {
          ready = false;
          break;
        }
        const int from = rank_of(std::get<2>(d));
        start = std::max(start, it->second + (from != r ? c.link_us : 0));
      }
      if (!ready) continue;
      const double cost = op.pass == 'F' ? c.f_us : op.pass == 'W' ? c.bw_us : split ? c.bi_us : c.b_us;
      const std::string kind = op.pass == 'F' ? "FWD" : op.pass == 'W' ? "BWD_W" : split ? "BWD_I" : "BWD";
      t.events.push_back({r, Lane::LANE_COMPUTE, kind, kind + " stage" + std::to_string(s) + " mb" + std::to_string(op.mb),
                          -1, step, op.mb, s, -1, start, start + cost, 0});
      for (const auto& d : deps) {  // the message that brought each remote input
        const int from = rank_of(std::get<2>(d));
        if (from == r) continue;
        const double sent = done[d];
        const std::string what = std::get<0>(d) == 'F' ? "activation" : "gradient";
        t.events.push_back({from, Lane::LANE_COMM, "SEND", "SEND " + what + " mb" + std::to_string(op.mb) + " to rank " + std::to_string(r),
                            -1, step, op.mb, std::get<2>(d), -1, sent, sent + c.link_us, 1 << 20});
        t.events.push_back({r, Lane::LANE_COMM, "RECV", "RECV " + what + " mb" + std::to_string(op.mb) + " from rank " + std::to_string(from),
                            -1, step, op.mb, s, -1, sent, sent + c.link_us, 1 << 20});
      }
      done[{op.pass, op.mb, s}] = start + cost;
      free_at[static_cast<size_t>(r)] = start + cost;
      ++next[static_cast<size_t>(r)];
      progress = true;
    }
  }
  for (int r = 0; r < p; ++r)
    if (next[static_cast<size_t>(r)] != ops[static_cast<size_t>(r)].size())
      throw std::logic_error("sample order deadlocks on rank " + std::to_string(r));
  double end = t0_us;
  for (int r = 0; r < p; ++r)
    for (int ch = 0; ch < chunks[static_cast<size_t>(r)]; ++ch) {
      const double s = free_at[static_cast<size_t>(r)];
      t.events.push_back({r, Lane::LANE_COMPUTE, "UPD", "UPD stage" + std::to_string(stage_of(r, ch)), -1, step, -1,
                          stage_of(r, ch), -1, s, s + c.upd_us, 0});
      free_at[static_cast<size_t>(r)] = s + c.upd_us;
      end = std::max(end, s + c.upd_us);
    }
  t.ranks = std::max(t.ranks, p);
  return end;
}

// Two steps of 1F1B on 4 ranks (8 microbatches, fused backward).
inline Trace sample_1f1b() {
  Trace t;
  t.title = "measured: 1F1B, 4 ranks, 8 microbatches";
  const double end = play_sample(t, order_1f1b(4, 8), false, false, {}, 0, 0);
  play_sample(t, order_1f1b(4, 8), false, false, {}, 1, end + 500);
  return t;
}

// DualPipeV on 2 ranks (4 stages in a V), 6 microbatches, split backward.
inline Trace sample_dualpipev() {
  Trace t;
  t.title = "simulated: DualPipeV, 2 ranks, 6 microbatches";
  play_sample(t, order_dualpipev(2, 6), true, true, {}, 0, 0);
  return t;
}

// "" when the tags of `xml` nest (a start tag for every end tag, in order,
// one root) and no '&' stands outside an entity; else what is wrong.
inline std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  int roots = 0;
  for (size_t i = 0; i < xml.size();) {
    if (xml[i] == '&') {
      const size_t semi = xml.find(';', i);
      if (semi == std::string::npos || semi - i > 8) return "a bare '&' at byte " + std::to_string(i);
      i = semi + 1;
      continue;
    }
    if (xml[i] != '<') {
      if (xml[i] == '>') return "a bare '>' at byte " + std::to_string(i);
      ++i;
      continue;
    }
    if (xml.compare(i, 2, "<?") == 0) {
      i = xml.find("?>", i) + 2;
      continue;
    }
    if (xml.compare(i, 4, "<!--") == 0) {
      i = xml.find("-->", i) + 3;
      continue;
    }
    const size_t close = xml.find('>', i);
    if (close == std::string::npos) return "an unclosed '<' at byte " + std::to_string(i);
    std::string tag = xml.substr(i + 1, close - i - 1);
    if (tag.find('<') != std::string::npos) return "a '<' inside a tag at byte " + std::to_string(i);
    i = close + 1;
    if (!tag.empty() && tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes " + (open.empty() ? std::string("nothing") : "<" + open.back() + ">");
      open.pop_back();
      continue;
    }
    const bool self_closing = !tag.empty() && tag.back() == '/';
    const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
    if (open.empty()) ++roots;
    if (!self_closing) open.push_back(name);
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  if (roots != 1) return std::to_string(roots) + " root elements";
  return "";
}

}  // namespace piper::testing
