// plot.cpp — the metrics JSONL of a training run as two SVG line plots.
#include "trace/plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "trace/svg.hpp"
#include "trace/trace.hpp"

#include "io/regular_file.hpp"

namespace piper::trace {

namespace {

using nlohmann::json;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// A number or null (NaN) under `key`; anything else is an error of this line.
double number_or_null(const json& j, const char* key, const std::string& where, bool required) {
  const auto it = j.find(key);
  if (it == j.end()) {
    if (required) throw TraceError(where + ": no \"" + key + "\" (expected a metrics line of piper train --metrics)");
    return kNan;
  }
  if (it->is_null()) return kNan;
  if (!it->is_number()) throw TraceError(where + ": \"" + key + "\" is " + it->dump() + ", not a number");
  return it->get<double>();
}

// One line of a panel. A sparse line (the held-out loss, every eval_every steps) is drawn through its
// finite points; a dense one is broken where a value is missing (a diverged step).
struct Line {
  const char* label;
  const char* colour;
  bool sparse;
  std::function<double(const MetricsRow&)> get;
};

struct Panel {
  const char* title;
  bool si;         // tick labels as 12k
  bool from_zero;  // the y axis starts at 0
  bool median;     // a dashed line at the first line's median
  std::vector<Line> lines;
};

// Integer-valued ticks for the step axis.
std::vector<double> step_ticks(double lo, double hi) {
  std::vector<double> t = nice_ticks(lo, hi, 8);
  if (t.size() > 1 && t[1] - t[0] >= 1) return t;
  t.clear();
  const double a = std::floor(lo) - (hi == lo ? 1 : 0), b = std::ceil(hi) + (hi == lo ? 1 : 0);
  for (double v = a; v <= b; ++v) t.push_back(v);
  return t;
}

void text(std::string& out, double x, double y, const std::string& s, const char* attrs) {
  out += "<text x=\"" + svg_num(x) + "\" y=\"" + svg_num(y) + "\" " + attrs + ">" + xml_escape(s) + "</text>\n";
}

void line(std::string& out, double xa, double ya, double xb, double yb, const char* attrs) {
  out += "<line x1=\"" + svg_num(xa) + "\" y1=\"" + svg_num(ya) + "\" x2=\"" + svg_num(xb) + "\" y2=\"" + svg_num(yb) +
         "\" " + attrs + "/>\n";
}

// A line's points, one polyline per run of finite values (a sparse line: one run), and dots when
// there are few points.
void draw_line(std::string& out, const std::vector<MetricsRow>& rows, const Line& l,
               const std::function<double(double)>& px, const std::function<double(double)>& py) {
  std::string pts;
  auto flush = [&] {
    if (!pts.empty())
      out += "<polyline class=\"series\" fill=\"none\" stroke=\"" + std::string(l.colour) +
             "\" stroke-width=\"1.8\" stroke-linejoin=\"round\" points=\"" + pts + "\"/>\n";
    pts.clear();
  };
  size_t finite = 0;
  for (const MetricsRow& r : rows) {
    const double v = l.get(r);
    if (!std::isfinite(v)) {
      if (!l.sparse) flush();
      continue;
    }
    ++finite;
    pts += (pts.empty() ? "" : " ") + svg_num(px(static_cast<double>(r.step))) + "," + svg_num(py(v));
  }
  flush();
  if (finite <= 60)
    for (const MetricsRow& r : rows)
      if (std::isfinite(l.get(r)))
        out += "<circle cx=\"" + svg_num(px(static_cast<double>(r.step))) + "\" cy=\"" + svg_num(py(l.get(r))) +
               "\" r=\"2.6\" fill=\"" + l.colour + "\"/>\n";
}

// Above the frame, right-aligned beside the panel's title: a short stroke and the label of each line.
void draw_legend(std::string& out, const std::vector<Line>& lines, double x1, double top) {
  double x = x1;
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    text(out, x, top - 12, it->label, "class=\"legend\" text-anchor=\"end\" font-size=\"11\" fill=\"#555555\"");
    x -= 6.2 * static_cast<double>(std::string(it->label).size()) + 6;  // 11 px text: about 6 px a character
    line(out, x - 20, top - 16, x, top - 16,
         ("stroke=\"" + std::string(it->colour) + "\" stroke-width=\"1.8\"").c_str());
    x -= 34;
  }
}

// One panel: frame, grid, y ticks, step ticks, its lines, a legend when it has more than one, and
// for throughput its median.
void draw_panel(std::string& out, const std::vector<MetricsRow>& rows, const Panel& p, double x0, double x1,
                double top, double height) {
  const double y0 = top + height;  // bottom of the plot area
  std::vector<double> vals;
  for (const Line& l : p.lines)
    for (const MetricsRow& r : rows)
      if (std::isfinite(l.get(r))) vals.push_back(l.get(r));
  double lo = vals.empty() ? 0 : *std::min_element(vals.begin(), vals.end());
  double hi = vals.empty() ? 1 : *std::max_element(vals.begin(), vals.end());
  if (p.from_zero) lo = std::min(lo, 0.0);
  const std::vector<double> yt = nice_ticks(lo, hi, 6);
  const double ylo = yt.front(), yhi = yt.back();
  const std::vector<double> xt = step_ticks(static_cast<double>(rows.front().step), static_cast<double>(rows.back().step));
  const double xlo = xt.front(), xhi = xt.back();
  auto px = [&](double step) { return x0 + (step - xlo) / (xhi - xlo) * (x1 - x0); };
  auto py = [&](double v) { return y0 - (v - ylo) / (yhi - ylo) * height; };

  text(out, x0, top - 12, p.title, "class=\"panel-title\" font-size=\"13\" font-weight=\"bold\" fill=\"#222222\"");
  const double ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  for (double v : yt) {
    line(out, x0, py(v), x1, py(v), "stroke=\"#e8e8e8\" stroke-width=\"1\"");
    line(out, x0 - 5, py(v), x0, py(v), "stroke=\"#444444\" stroke-width=\"1\"");
    text(out, x0 - 8, py(v) + 4, tick_label(v, ystep, p.si), "class=\"tick\" text-anchor=\"end\" font-size=\"11\" fill=\"#333333\"");
  }
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1;
  for (double v : xt) {
    line(out, px(v), y0, px(v), y0 + 5, "stroke=\"#444444\" stroke-width=\"1\"");
    text(out, px(v), y0 + 18, tick_label(v, xstep), "class=\"tick\" text-anchor=\"middle\" font-size=\"11\" fill=\"#333333\"");
  }
  out += "<rect x=\"" + svg_num(x0) + "\" y=\"" + svg_num(top) + "\" width=\"" + svg_num(x1 - x0) + "\" height=\"" +
         svg_num(height) + "\" fill=\"none\" stroke=\"#444444\" stroke-width=\"1\"/>\n";
  text(out, (x0 + x1) / 2, y0 + 36, "step", "text-anchor=\"middle\" font-size=\"12\" fill=\"#333333\"");

  for (const Line& l : p.lines) draw_line(out, rows, l, px, py);
  if (p.lines.size() > 1) draw_legend(out, p.lines, x1, top);
  std::vector<double> first;
  for (const MetricsRow& r : rows)
    if (std::isfinite(p.lines.front().get(r))) first.push_back(p.lines.front().get(r));
  if (p.median && !first.empty()) {
    std::vector<double> v = first;
    std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
    const double m = v[v.size() / 2];
    line(out, x0, py(m), x1, py(m), "stroke=\"#555555\" stroke-width=\"1\" stroke-dasharray=\"5,4\"");
    char buf[64];
    if (m >= 1e6) std::snprintf(buf, sizeof buf, "median %.2fM tokens/s", m / 1e6);
    else if (m >= 1e3) std::snprintf(buf, sizeof buf, "median %.1fk tokens/s", m / 1e3);
    else std::snprintf(buf, sizeof buf, "median %.1f tokens/s", m);
    // Above the frame, beside the panel's title: never over the data.
    line(out, x1 - 162, top - 16, x1 - 138, top - 16, "stroke=\"#555555\" stroke-width=\"1\" stroke-dasharray=\"5,4\"");
    text(out, x1, top - 12, buf, "text-anchor=\"end\" font-size=\"11\" fill=\"#555555\"");
  }
}

}  // namespace

std::vector<MetricsRow> parse_metrics(const std::string& text_in, const std::string& origin) {
  std::vector<MetricsRow> rows;
  std::istringstream in(text_in);
  std::string ln;
  for (int lineno = 1; std::getline(in, ln); ++lineno) {
    if (ln.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = origin + ":" + std::to_string(lineno);
    json j;
    try {
      j = json::parse(ln);
    } catch (const json::exception& e) {
      throw TraceError(where + ": not a JSON object: " + e.what());
    }
    if (!j.is_object()) throw TraceError(where + ": not a JSON object (expected one per step, as piper train --metrics writes)");
    if (j.contains("event")) continue;  // a strategy switch between two steps (docs/switching.md)
    const auto st = j.find("step");
    if (st == j.end()) throw TraceError(where + ": no \"step\" (expected a metrics line of piper train --metrics)");
    if (!st->is_number_integer()) throw TraceError(where + ": \"step\" is " + st->dump() + ", not an integer");
    MetricsRow r;
    r.step = st->get<int64_t>();
    r.loss = number_or_null(j, "loss", where, true);
    r.tokens_per_s = number_or_null(j, "tokens_per_s", where, true);
    r.step_ms = number_or_null(j, "step_ms", where, false);
    r.eval_loss = number_or_null(j, "eval_loss", where, false);
    rows.push_back(r);
  }
  return rows;
}

std::vector<MetricsRow> read_metrics(const std::string& path) {
  std::string text;
  try {
    text = io::read_regular(path, kMaxTraceFileBytes);
  } catch (const io::FileError& e) {
    throw TraceError("cannot read the metrics file " + path + ": " + e.what());
  }
  std::vector<MetricsRow> rows = parse_metrics(text, path);
  if (rows.empty()) throw TraceError(path + ": no metrics lines (expected one JSON object per step, as piper train --metrics writes)");
  return rows;
}

std::string metrics_svg(const std::vector<MetricsRow>& rows_in, const PlotOptions& o) {
  if (rows_in.empty()) throw TraceError("no metrics to plot");
  std::vector<MetricsRow> rows = rows_in;
  std::stable_sort(rows.begin(), rows.end(), [](const MetricsRow& a, const MetricsRow& b) { return a.step < b.step; });
  const double width = std::max(o.width_px, 320);
  const double x0 = 78, x1 = width - 24, panel_h = 220, top1 = 80, top2 = top1 + panel_h + 92;
  const double height = top2 + panel_h + 52;

  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    svg_num(width) + "\" height=\"" + svg_num(height) + "\" viewBox=\"0 0 " + svg_num(width) + " " +
                    svg_num(height) + "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  const size_t title_fit = static_cast<size_t>((width - x0 - 10) / 10);  // bold 16 px: about 10 px a character
  text(out, x0, 26, fit_text(o.title.empty() ? "training metrics" : o.title, title_fit), "class=\"title\" font-size=\"16\" font-weight=\"bold\" fill=\"#111111\"");
  double last_loss = kNan, last_eval = kNan;
  for (const MetricsRow& r : rows) {
    if (std::isfinite(r.loss)) last_loss = r.loss;
    if (std::isfinite(r.eval_loss)) last_eval = r.eval_loss;
  }
  char sub[200];
  int n = std::snprintf(sub, sizeof sub, "%zu steps (%lld to %lld), last loss %.4f", rows.size(),
                        static_cast<long long>(rows.front().step), static_cast<long long>(rows.back().step), last_loss);
  if (std::isfinite(last_eval)) std::snprintf(sub + n, sizeof sub - static_cast<size_t>(n), ", last held-out loss %.4f", last_eval);
  text(out, x0, 46, sub, "class=\"subtitle\" font-size=\"12\" fill=\"#555555\"");
  Panel loss{"loss", false, false, false, {{"training", "#3b78c3", false, [](const MetricsRow& r) { return r.loss; }}}};
  if (std::isfinite(last_eval))
    loss.lines.push_back({"held-out", "#e07b28", true, [](const MetricsRow& r) { return r.eval_loss; }});
  draw_panel(out, rows, loss, x0, x1, top1, panel_h);
  draw_panel(out, rows,
             {"throughput (tokens/s)", true, true, true,
              {{"throughput", "#3ea64f", false, [](const MetricsRow& r) { return r.tokens_per_s; }}}},
             x0, x1, top2, panel_h);
  out += "</svg>\n";
  return out;
}

}  // namespace piper::trace
