// svg.cpp — one step of a Trace as an SVG schedule picture, drawn like the
// figures of the zero-bubble paper and the DualPipe README: ranks down, time
// across, a box per pass with its microbatch inside, idle time left blank.
#include "trace/svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

namespace piper::trace {

namespace {

// ---- colours ---------------------------------------------------------------------

struct Rgb {
  int r, g, b;
};

// Base hues, close to the papers: forward blue, backward green, weight
// gradients purple; the rest out of their way.
Rgb base_colour(std::string_view kind) {
  if (kind == "FWD") return {0x3b, 0x78, 0xc3};
  if (kind == "BWD_I") return {0x3e, 0xa6, 0x4f};
  if (kind == "BWD_W") return {0x8e, 0x5e, 0xb8};
  if (kind == "BWD") return {0x1f, 0x93, 0x8c};
  if (kind == "RECOMP") return {0x7f, 0xa7, 0xd8};
  if (kind == "UPD") return {0xe8, 0xa2, 0x2c};
  if (kind == "SEND" || kind == "RECV") return {0xd6, 0x4f, 0x4f};
  if (kind == "ALLREDUCE" || kind == "REDUCE_SCATTER" || kind == "ALLGATHER" || kind == "ALLTOALL")
    return {0x9c, 0x6b, 0x3c};
  if (kind == "WAIT") return {0xd4, 0xd4, 0xd4};
  return {0x80, 0x80, 0x80};
}

// How much white a chunk's tint mixes in: chunk 0 none, chunk 1 half.
double tint_of(int chunk) { return chunk <= 0 ? 0.0 : std::min(0.45 + 0.15 * (chunk - 1), 0.8); }

std::string hex(Rgb c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c.r, c.g, c.b);
  return buf;
}

Rgb mix_white(Rgb c, double t) {
  auto m = [t](int v) { return static_cast<int>(std::lround(v + (255 - v) * t)); };
  return {m(c.r), m(c.g), m(c.b)};
}

// Dark text on light fills, white on dark ones (relative luminance).
bool is_light(Rgb c) { return 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b > 150; }

// The order and the words of the legend.
struct KindName {
  const char* kind;
  const char* words;
};
constexpr KindName kKindNames[] = {
    {"FWD", "forward"},          {"BWD_I", "backward (input)"}, {"BWD_W", "backward (weights)"},
    {"BWD", "backward"},         {"RECOMP", "recompute"},       {"UPD", "optimizer"},          {"SEND", "send"},
    {"RECV", "receive"},         {"ALLREDUCE", "all-reduce"},  {"REDUCE_SCATTER", "reduce-scatter"},
    {"ALLGATHER", "all-gather"}, {"ALLTOALL", "all-to-all"},   {"WAIT", "wait"},
};

int kind_order(const std::string& kind) {
  for (size_t i = 0; i < std::size(kKindNames); ++i)
    if (kind == kKindNames[i].kind) return static_cast<int>(i);
  return static_cast<int>(std::size(kKindNames));
}

std::string kind_words(const std::string& kind) {
  for (const KindName& k : kKindNames)
    if (kind == k.kind) return k.words;
  return kind;
}

// ---- layout ----------------------------------------------------------------------

constexpr double kLeft = 96;        // rank labels
constexpr double kRight = 76;       // idle share per rank
constexpr double kTop = 62;         // title and subtitle
constexpr double kComputeH = 26;    // the compute lane
constexpr double kCommGap = 2;      // between the lanes
constexpr double kCommH = 12;       // the communication lane (all its sub-lanes)
constexpr double kRowGap = 12;      // between ranks
constexpr int kMaxCommSubLanes = 3; // overlapping communication stacks this deep at most
constexpr double kDigitW = 6.7;     // width of a digit at font-size 11

// A drawn event: the event, the chunk it belongs to, its sub-lane.
struct Placed {
  const Event* e;
  int chunk = 0;
  int sub = 0;
};

struct Row {
  std::vector<Placed> compute, comm;
  int comm_lanes = 1;
  double busy_us = 0;  // union of compute passes (not waits)
};

struct TimeAxis {
  double div = 1000;  // trace value per axis unit
  std::string label;
};

TimeAxis pick_axis(bool abstract) { return abstract ? TimeAxis{1, "time units"} : TimeAxis{1000, "time (ms)"}; }

int pick_step(const Trace& t, int wanted) {
  std::set<int> steps;
  for (const Event& e : t.events) steps.insert(e.step);
  if (steps.empty()) throw TraceError("the trace '" + t.title + "' has no events to draw");
  if (wanted < 0) return *steps.rbegin();
  if (steps.count(wanted)) return wanted;
  std::string have;
  int listed = 0;
  for (int s : steps) {
    if (listed++ == 12) {
      have += ", ...";
      break;
    }
    have += (have.empty() ? "" : ", ") + std::to_string(s);
  }
  throw TraceError("the trace '" + t.title + "' has no step " + std::to_string(wanted) + " (it has steps " + have + ")");
}

// Total length of the union of [start, end) intervals.
double union_length(std::vector<std::pair<double, double>> iv) {
  std::sort(iv.begin(), iv.end());
  double total = 0, cur_s = 0, cur_e = -1e300;
  for (auto [s, e] : iv) {
    if (s > cur_e) {
      if (cur_e > cur_s) total += cur_e - cur_s;
      cur_s = s, cur_e = e;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (cur_e > cur_s) total += cur_e - cur_s;
  return total;
}

// Greedy interval packing of a rank's communication into sub-lanes.
int pack_comm(std::vector<Placed>& comm) {
  std::sort(comm.begin(), comm.end(), [](const Placed& a, const Placed& b) { return a.e->start_us < b.e->start_us; });
  std::vector<double> lane_end;
  for (Placed& p : comm) {
    int lane = -1;
    for (size_t i = 0; i < lane_end.size(); ++i)
      if (lane_end[i] <= p.e->start_us) {
        lane = static_cast<int>(i);
        break;
      }
    if (lane < 0 && static_cast<int>(lane_end.size()) < kMaxCommSubLanes) {
      lane = static_cast<int>(lane_end.size());
      lane_end.push_back(0);
    }
    if (lane < 0) lane = static_cast<int>(std::min_element(lane_end.begin(), lane_end.end()) - lane_end.begin());
    lane_end[static_cast<size_t>(lane)] = std::max(lane_end[static_cast<size_t>(lane)], p.e->end_us);
    p.sub = lane;
  }
  return std::max(1, static_cast<int>(lane_end.size()));
}

// The rows of step `step`: chunk of each compute event (its rank's stages in
// order), sub-lanes of communication, busy time. Sets t0/t1 to the step's span.
std::vector<Row> make_rows(const Trace& t, int step, bool comm_lane, double& t0, double& t1) {
  int ranks = t.ranks;
  t0 = 1e300, t1 = -1e300;
  for (const Event& e : t.events)
    if (e.step == step) {
      ranks = std::max(ranks, e.rank + 1);
      t0 = std::min(t0, e.start_us);
      t1 = std::max(t1, e.end_us);
    }
  std::vector<Row> rows(static_cast<size_t>(ranks));
  std::vector<std::set<int>> stages(static_cast<size_t>(ranks));
  for (const Event& e : t.events)
    if (e.step == step && e.lane == Lane::LANE_COMPUTE && e.stage >= 0) stages[static_cast<size_t>(e.rank)].insert(e.stage);
  for (const Event& e : t.events) {
    if (e.step != step) continue;
    Row& row = rows[static_cast<size_t>(e.rank)];
    if (e.lane == Lane::LANE_COMM) {
      if (comm_lane) row.comm.push_back({&e, 0, 0});
      continue;
    }
    const std::set<int>& st = stages[static_cast<size_t>(e.rank)];
    const int chunk = e.stage < 0 ? 0 : static_cast<int>(std::distance(st.begin(), st.find(e.stage)));
    row.compute.push_back({&e, chunk, 0});
  }
  for (Row& row : rows) {
    std::stable_sort(row.compute.begin(), row.compute.end(),
                     [](const Placed& a, const Placed& b) { return a.e->start_us < b.e->start_us; });
    std::vector<std::pair<double, double>> iv;
    for (const Placed& p : row.compute)
      if (p.e->kind != "WAIT") iv.emplace_back(p.e->start_us, p.e->end_us);
    row.busy_us = union_length(std::move(iv));
    row.comm_lanes = pack_comm(row.comm);
  }
  return rows;
}

// ---- drawing ---------------------------------------------------------------------

void append_text(std::string& out, double x, double y, const std::string& text, const char* attrs) {
  out += "<text x=\"" + svg_num(x) + "\" y=\"" + svg_num(y) + "\" " + attrs + ">" + xml_escape(text) + "</text>\n";
}

std::string fmt_time(double v, const TimeAxis& ax) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f", v / ax.div);
  std::string s = buf;  // no trailing zeros: "35.22 ms", "27 units"
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s + (ax.div == 1 ? " units" : " ms");
}

// Where the step sits in the picture: x of a trace time, and the axis unit.
struct Frame {
  double x0, scale, t0;
  TimeAxis ax;
  double x(double t_us) const { return x0 + (t_us - t0) * scale; }
};

// One event's rect with its tooltip (name, rank, stage, start + duration);
// no outline: its pass draws one.
void draw_event(std::string& out, const Placed& p, const Frame& f, double y, double h) {
  const Event& e = *p.e;
  out += "<rect class=\"ev\" data-kind=\"" + xml_escape(e.kind) + "\" data-rank=\"" + std::to_string(e.rank) +
         "\" data-mb=\"" + std::to_string(e.microbatch) + "\" data-chunk=\"" + std::to_string(p.chunk) + "\" x=\"" +
         svg_num(f.x(e.start_us)) + "\" y=\"" + svg_num(y) + "\" width=\"" +
         svg_num(std::max((e.end_us - e.start_us) * f.scale, 0.5)) + "\" height=\"" + svg_num(h) + "\" fill=\"" +
         kind_colour(e.kind, p.chunk) + "\"><title>" + xml_escape(e.name.empty() ? e.kind : e.name) + " (rank " +
         std::to_string(e.rank) + (e.stage >= 0 ? ", stage " + std::to_string(e.stage) : "") +
         "): " + fmt_time(e.start_us - f.t0, f.ax) + " + " + fmt_time(e.end_us - e.start_us, f.ax) + "</title></rect>\n";
}

// A lane's events (sorted by start) as passes: consecutive events of one
// kind, microbatch and chunk with no visible gap between them (a pass over a
// stage's units, recorded unit by unit) share one outline, one hatch (third
// chunk on, waits) and one microbatch number, written when it fits.
void draw_lane(std::string& out, const std::vector<Placed>& ps, const Frame& f, double y, double h, bool label) {
  for (size_t i = 0; i < ps.size();) {
    size_t j = i + 1;
    double end = ps[i].e->end_us;
    while (j < ps.size() && ps[j].e->kind == ps[i].e->kind && ps[j].e->microbatch == ps[i].e->microbatch &&
           ps[j].chunk == ps[i].chunk && (ps[j].e->start_us - end) * f.scale < 1.0) {
      end = std::max(end, ps[j].e->end_us);
      ++j;
    }
    for (size_t k = i; k < j; ++k) draw_event(out, ps[k], f, y, h);
    const Event& e = *ps[i].e;
    const double x = f.x(e.start_us), w = std::max((end - e.start_us) * f.scale, 0.5);
    const std::string box = "x=\"" + svg_num(x) + "\" y=\"" + svg_num(y) + "\" width=\"" + svg_num(w) + "\" height=\"" + svg_num(h) + "\"";
    if (ps[i].chunk >= 2 || e.kind == "WAIT")
      out += "<rect " + box + " fill=\"url(#" + (e.kind == "WAIT" ? "hatch-dark" : "hatch-light") + ")\" pointer-events=\"none\"/>\n";
    if (w >= 4) out += "<rect " + box + " fill=\"none\" stroke=\"#ffffff\" stroke-width=\"0.8\" pointer-events=\"none\"/>\n";
    const std::string mb = std::to_string(e.microbatch);
    if (label && e.microbatch >= 0 && w >= kDigitW * static_cast<double>(mb.size()) + 4) {
      const Rgb fill = mix_white(base_colour(e.kind), tint_of(ps[i].chunk));
      append_text(out, x + w / 2, y + h / 2 + 4, mb,
                  is_light(fill) ? "class=\"mb\" text-anchor=\"middle\" font-size=\"11\" fill=\"#1a1a1a\""
                                 : "class=\"mb\" text-anchor=\"middle\" font-size=\"11\" fill=\"#ffffff\"");
    }
    i = j;
  }
}

// The legend: one entry per kind drawn, in the papers' order, with a swatch
// per model chunk present (send and receive share one); wraps at the width.
double draw_legend(std::string& out, const std::vector<Row>& rows, double y, double width) {
  std::map<std::pair<int, std::string>, std::set<int>> chunks;  // (order, kind) -> chunks drawn
  auto key = [](const std::string& kind) { return kind == "RECV" ? std::string("SEND") : kind; };
  for (const Row& row : rows) {
    for (const Placed& p : row.compute) chunks[{kind_order(key(p.e->kind)), key(p.e->kind)}].insert(std::min(p.chunk, 2));
    for (const Placed& p : row.comm) chunks[{kind_order(key(p.e->kind)), key(p.e->kind)}].insert(0);
  }
  int most = 0;
  double x = kLeft;
  auto place = [&](double w) {
    if (x + w > width - 10 && x > kLeft) x = kLeft, y += 22;
  };
  for (const auto& [k, cs] : chunks) {
    const std::string& kind = k.second;
    const std::string words = kind == "SEND" ? "send / receive" : kind_words(kind);
    const double sw = 16 * static_cast<double>(cs.size());
    const double w = sw + 4 + 6.6 * static_cast<double>(words.size()) + 18;
    place(w);
    double sx = x;
    for (int c : cs) {
      most = std::max(most, c);
      out += "<rect class=\"legend\" x=\"" + svg_num(sx) + "\" y=\"" + svg_num(y - 11) + "\" width=\"14\" height=\"14\" fill=\"" +
             kind_colour(kind, c) + "\" stroke=\"#666666\" stroke-width=\"0.5\"/>\n";
      if (c >= 2 || kind == "WAIT")
        out += "<rect x=\"" + svg_num(sx) + "\" y=\"" + svg_num(y - 11) + "\" width=\"14\" height=\"14\" fill=\"url(#" +
               (kind == "WAIT" ? "hatch-dark" : "hatch-light") + ")\"/>\n";
      sx += 16;
    }
    append_text(out, x + sw + 4, y, words, "font-size=\"12\" fill=\"#333333\"");
    x += w;
  }
  if (most > 0) {
    const std::string note = most == 1 ? "(light: a rank's 2nd model chunk)" : "(light: 2nd model chunk; hatched: 3rd and later)";
    place(6.6 * static_cast<double>(note.size()));
    append_text(out, x, y, note, "font-size=\"12\" fill=\"#666666\"");
  }
  return y + 14;
}

const char* kDefs =
    "<defs>\n"
    "<pattern id=\"hatch-light\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" patternTransform=\"rotate(45)\">"
    "<rect width=\"2\" height=\"6\" fill=\"#ffffff\" fill-opacity=\"0.65\"/></pattern>\n"
    "<pattern id=\"hatch-dark\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" patternTransform=\"rotate(45)\">"
    "<rect width=\"1.5\" height=\"6\" fill=\"#8a8a8a\" fill-opacity=\"0.8\"/></pattern>\n"
    "</defs>\n";

}  // namespace

std::string kind_colour(std::string_view kind, int chunk) { return hex(mix_white(base_colour(kind), tint_of(chunk))); }

std::string schedule_svg(const Trace& t, const SvgOptions& o) {
  const int step = pick_step(t, o.step);
  double t0 = 0, t1 = 0;
  const std::vector<Row> rows = make_rows(t, step, o.comm_lane, t0, t1);
  const double span = std::max(t1 - t0, 1e-9);
  const TimeAxis ax = pick_axis(o.abstract_time);
  const double width = std::max(o.width_px, 320);
  const double x0 = kLeft, x1 = width - kRight;
  const double scale = (x1 - x0) / span;
  const Frame frame{x0, scale, t0, ax};
  const double row_h = kComputeH + (o.comm_lane ? kCommGap + kCommH : 0) + kRowGap;
  const double rows_bottom = kTop + row_h * static_cast<double>(rows.size()) - kRowGap;

  std::string body;
  // Grid lines at the ticks, behind the boxes.
  std::vector<double> ticks = nice_ticks(0, span / ax.div, 10);
  ticks.erase(std::remove_if(ticks.begin(), ticks.end(), [&](double v) { return v * ax.div > span * (1 + 1e-9); }), ticks.end());
  const double tick_step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1;
  for (double v : ticks) {
    const double x = x0 + v * ax.div * scale;
    body += "<line x1=\"" + svg_num(x) + "\" y1=\"" + svg_num(kTop - 4) + "\" x2=\"" + svg_num(x) + "\" y2=\"" +
            svg_num(rows_bottom + 4) + "\" stroke=\"#e6e6e6\" stroke-width=\"1\"/>\n";
  }
  double idle_sum = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    const double y = kTop + row_h * static_cast<double>(r);
    append_text(body, kLeft - 10, y + kComputeH / 2 + 4.5,
                r < o.row_labels.size() ? fit_text(o.row_labels[r], 16) : "rank " + std::to_string(r),
                "class=\"row-label\" text-anchor=\"end\" font-size=\"13\" fill=\"#222222\"");
    body += "<rect x=\"" + svg_num(x0) + "\" y=\"" + svg_num(y) + "\" width=\"" + svg_num(x1 - x0) + "\" height=\"" +
            svg_num(kComputeH) + "\" fill=\"#ffffff\" stroke=\"#bbbbbb\" stroke-width=\"0.6\"/>\n";
    draw_lane(body, row.compute, frame, y, kComputeH, true);
    if (o.comm_lane) {
      const double cy = y + kComputeH + kCommGap;
      body += "<rect x=\"" + svg_num(x0) + "\" y=\"" + svg_num(cy) + "\" width=\"" + svg_num(x1 - x0) + "\" height=\"" +
              svg_num(kCommH) + "\" fill=\"#fafafa\" stroke=\"#dddddd\" stroke-width=\"0.5\"/>\n";
      append_text(body, kLeft - 10, cy + kCommH - 2.5, "comm", "text-anchor=\"end\" font-size=\"9\" fill=\"#888888\"");
      const double sub_h = kCommH / row.comm_lanes;
      for (const Placed& p : row.comm) draw_lane(body, {p}, frame, cy + sub_h * p.sub, sub_h, false);
    }
    const double idle = 1 - row.busy_us / span;
    idle_sum += idle;
    char buf[32];
    std::snprintf(buf, sizeof buf, "idle %.0f%%", 100 * idle);
    append_text(body, x1 + 8, y + kComputeH / 2 + 4, buf, "class=\"idle\" font-size=\"11\" fill=\"#666666\"");
  }
  // Time axis.
  const double ay = rows_bottom + 8;
  body += "<line x1=\"" + svg_num(x0) + "\" y1=\"" + svg_num(ay) + "\" x2=\"" + svg_num(x1) + "\" y2=\"" + svg_num(ay) +
          "\" stroke=\"#444444\" stroke-width=\"1\"/>\n";
  for (double v : ticks) {
    const double x = x0 + v * ax.div * scale;
    body += "<line x1=\"" + svg_num(x) + "\" y1=\"" + svg_num(ay) + "\" x2=\"" + svg_num(x) + "\" y2=\"" + svg_num(ay + 5) +
            "\" stroke=\"#444444\" stroke-width=\"1\"/>\n";
    append_text(body, x, ay + 18, tick_label(v, tick_step), "class=\"tick\" text-anchor=\"middle\" font-size=\"11\" fill=\"#333333\"");
  }
  append_text(body, (x0 + x1) / 2, ay + 36, ax.label, "text-anchor=\"middle\" font-size=\"12\" fill=\"#333333\"");
  const double legend_bottom = draw_legend(body, rows, ay + 62, width);
  const double height = legend_bottom + 10;

  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    svg_num(width) + "\" height=\"" + svg_num(height) + "\" viewBox=\"0 0 " + svg_num(width) + " " +
                    svg_num(height) + "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  out += kDefs;
  out += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  const size_t title_fit = static_cast<size_t>((width - x0 - 10) / 10);  // bold 16 px: about 10 px a character
  append_text(out, x0, 24, fit_text(t.title.empty() ? "schedule" : t.title, title_fit), "class=\"title\" font-size=\"16\" font-weight=\"bold\" fill=\"#111111\"");
  char sub[160];
  std::snprintf(sub, sizeof sub, "step %d: %s across %zu ranks, %.1f%% idle on average", step,
                fmt_time(span, ax).c_str(), rows.size(), rows.empty() ? 0.0 : 100 * idle_sum / static_cast<double>(rows.size()));
  append_text(out, x0, 44, sub, "class=\"subtitle\" font-size=\"12\" fill=\"#555555\"");
  out += body;
  out += "</svg>\n";
  return out;
}

// ---- helpers -----------------------------------------------------------------------

std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters are not allowed in XML 1.0 text.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') out += ' ';
        else out += c;
    }
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) {
    lo -= 0.5;
    hi += 0.5;
  }
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  const double first = std::floor(lo / step + 1e-9) * step;
  const double last = std::ceil(hi / step - 1e-9) * step;
  std::vector<double> ticks;
  for (int i = 0; first + i * step <= last + step * 1e-6; ++i) {
    double v = first + i * step;
    if (std::fabs(v) < step * 1e-9) v = 0;  // no "-0"
    ticks.push_back(v);
  }
  return ticks;
}

std::string tick_label(double v, double step, bool si) {
  double scaled = v, scaled_step = step;
  const char* suffix = "";
  if (si && std::fabs(step) >= 1e6) {
    scaled = v / 1e6, scaled_step = step / 1e6, suffix = "M";
  } else if (si && std::fabs(step) >= 1e3) {
    scaled = v / 1e3, scaled_step = step / 1e3, suffix = "k";
  }
  int decimals = 0;
  if (scaled_step > 0 && scaled_step < 1) decimals = std::min(6, static_cast<int>(std::ceil(-std::log10(scaled_step) - 1e-9)));
  // A step such as 0.25 needs one more decimal than its magnitude says.
  if (decimals < 6 && std::fabs(std::round(scaled_step * std::pow(10, decimals)) - scaled_step * std::pow(10, decimals)) > 1e-6)
    ++decimals;
  if (std::fabs(scaled) < std::fabs(scaled_step) * 1e-9) return "0";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f%s", decimals, scaled, suffix);
  return buf;
}

std::string fit_text(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t n = max_bytes > 3 ? max_bytes - 3 : 0;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // not inside a character
  return s.substr(0, n) + "...";
}

std::string svg_num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", std::fabs(v) < 0.005 ? 0.0 : v);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

Trace stack(const Trace& a, int step_a, const Trace& b, int step_b, std::vector<std::string>& row_labels) {
  Trace out;
  out.title = a.title + "  vs  " + b.title;
  row_labels.clear();
  int offset = 0;
  for (auto [t, wanted] : {std::pair<const Trace*, int>{&a, step_a}, std::pair<const Trace*, int>{&b, step_b}}) {
    const int step = pick_step(*t, wanted);
    double t0 = std::numeric_limits<double>::infinity();
    int ranks = t->ranks;
    for (const Event& e : t->events)
      if (e.step == step) t0 = std::min(t0, e.start_us), ranks = std::max(ranks, e.rank + 1);
    for (const Event& e : t->events) {
      if (e.step != step) continue;
      Event m = e;
      m.rank += offset;
      m.step = 0;
      m.start_us -= t0;
      m.end_us -= t0;
      out.events.push_back(std::move(m));
    }
    const std::string word = t->title.substr(0, t->title.find_first_of(": "));
    for (int r = 0; r < ranks; ++r) row_labels.push_back((word.empty() ? "trace" : word) + " r" + std::to_string(r));
    offset += ranks;
  }
  out.ranks = offset;
  return out;
}

}  // namespace piper::trace
