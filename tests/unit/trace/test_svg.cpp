// test_svg.cpp — schedule pictures: structure, one box per event of the drawn
// step in its kind's colour, microbatch labels, step choice, chunks, escaping.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "trace/svg.hpp"
#include "unit/trace/sample_traces.hpp"

namespace piper::trace {
namespace {

// The attributes of every <rect class="ev" ...> in document order.
std::vector<std::map<std::string, std::string>> event_rects(const std::string& svg) {
  std::vector<std::map<std::string, std::string>> out;
  const std::regex rect("<rect class=\"ev\"([^>]*)>");
  const std::regex attr("([a-z-]+)=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), rect); it != std::sregex_iterator(); ++it) {
    const std::string attrs = (*it)[1];
    std::map<std::string, std::string> m;
    for (auto a = std::sregex_iterator(attrs.begin(), attrs.end(), attr); a != std::sregex_iterator(); ++a) m[(*a)[1]] = (*a)[2];
    out.push_back(m);
  }
  return out;
}

// The contents of every <text ...class="CLS"...>...</text>.
std::vector<std::string> texts_of_class(const std::string& svg, const std::string& cls) {
  std::vector<std::string> out;
  const std::regex text("<text [^>]*class=\"" + cls + "\"[^>]*>([^<]*)</text>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), text); it != std::sregex_iterator(); ++it) out.push_back((*it)[1]);
  return out;
}

struct Rgb {
  int r, g, b;
};
Rgb rgb(const std::string& hex) {
  EXPECT_EQ(hex.size(), 7u) << hex;
  const long v = std::strtol(hex.c_str() + 1, nullptr, 16);
  return {static_cast<int>((v >> 16) & 255), static_cast<int>((v >> 8) & 255), static_cast<int>(v & 255)};
}

// 2 ranks, 2 microbatches, split backward; step 0 is a decoy, step 1 drawn.
Trace small_trace() {
  Trace t;
  t.title = "hand-made <F/B/W> & friends";
  t.ranks = 2;
  auto add = [&](int rank, Lane lane, const char* kind, int step, int mb, double s, double e) {
    t.events.push_back({rank, lane, kind, std::string(kind) + " mb" + std::to_string(mb), -1, step, mb, rank, -1, s, e, 0});
  };
  add(0, Lane::LANE_COMPUTE, "FWD", 0, 0, 0, 100);  // the decoy step
  const double o = 10000;                            // step 1 starts here
  add(0, Lane::LANE_COMPUTE, "FWD", 1, 0, o + 0, o + 100);
  add(0, Lane::LANE_COMPUTE, "FWD", 1, 1, o + 100, o + 200);
  add(1, Lane::LANE_COMPUTE, "FWD", 1, 0, o + 120, o + 220);
  add(1, Lane::LANE_COMPUTE, "BWD_I", 1, 0, o + 220, o + 320);
  add(1, Lane::LANE_COMPUTE, "FWD", 1, 1, o + 320, o + 420);
  add(0, Lane::LANE_COMPUTE, "BWD_I", 1, 0, o + 340, o + 440);
  add(1, Lane::LANE_COMPUTE, "BWD_I", 1, 1, o + 420, o + 520);
  add(1, Lane::LANE_COMPUTE, "BWD_W", 1, 0, o + 520, o + 610);
  add(0, Lane::LANE_COMPUTE, "BWD_W", 1, 0, o + 440, o + 530);
  add(0, Lane::LANE_COMPUTE, "BWD_I", 1, 1, o + 540, o + 640);
  add(0, Lane::LANE_COMPUTE, "BWD_W", 1, 1, o + 640, o + 730);
  add(1, Lane::LANE_COMPUTE, "BWD_W", 1, 1, o + 610, o + 700);
  add(0, Lane::LANE_COMM, "SEND", 1, 0, o + 100, o + 120);
  add(1, Lane::LANE_COMM, "RECV", 1, 0, o + 100, o + 120);
  return t;
}

void write_sample_if_asked(const std::string& name, const std::string& svg) {
  if (const char* dir = std::getenv("PIPER_TRACE_SAMPLES")) {
    std::ofstream f(std::string(dir) + "/" + name, std::ios::trunc);
    f << svg;
  }
}

TEST(ScheduleSvg, IsWellFormedWithARowLabelPerRank) {
  const std::string svg = schedule_svg(small_trace());
  EXPECT_EQ(testing::xml_problem(svg), "");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_EQ(texts_of_class(svg, "row-label"), (std::vector<std::string>{"rank 0", "rank 1"}));
  // Self-contained: nothing fetched from elsewhere.
  EXPECT_EQ(svg.find("href"), std::string::npos);
  EXPECT_EQ(svg.find("@import"), std::string::npos);
}

TEST(XmlCheck, CatchesBrokenDocuments) {
  EXPECT_EQ(testing::xml_problem("<svg><g></g></svg>"), "");
  EXPECT_NE(testing::xml_problem("<svg><g></svg>"), "");
  EXPECT_NE(testing::xml_problem("<svg><text>a & b</text></svg>"), "");
  EXPECT_NE(testing::xml_problem("<svg></svg><svg></svg>"), "");
}

TEST(ScheduleSvg, OneBoxPerEventOfTheLastStepInItsKindsColour) {
  const Trace t = small_trace();
  const std::string svg = schedule_svg(t);
  const auto rects = event_rects(svg);
  std::map<std::string, int> want, got;
  for (const Event& e : t.events)
    if (e.step == 1) ++want[e.kind];
  for (const auto& r : rects) ++got[r.at("data-kind")];
  EXPECT_EQ(got, want);  // the decoy of step 0 is not drawn
  std::map<std::string, std::string> fill_of;
  for (const auto& r : rects) {
    const std::string& kind = r.at("data-kind");
    EXPECT_EQ(r.at("data-chunk"), "0");  // one stage per rank
    if (fill_of.count(kind)) {
      EXPECT_EQ(fill_of[kind], r.at("fill")) << kind << " drawn in two colours";
    }
    fill_of[kind] = r.at("fill");
  }
  const Rgb f = rgb(fill_of["FWD"]), bi = rgb(fill_of["BWD_I"]), bw = rgb(fill_of["BWD_W"]);
  EXPECT_TRUE(f.b > f.r && f.b > f.g) << "forward is not blue: " << fill_of["FWD"];
  EXPECT_TRUE(bi.g > bi.r && bi.g > bi.b) << "input backward is not green: " << fill_of["BWD_I"];
  EXPECT_TRUE(bw.r > bw.g && bw.b > bw.g) << "weight backward is not purple: " << fill_of["BWD_W"];
  EXPECT_NE(fill_of["SEND"], fill_of["FWD"]);
  EXPECT_NE(fill_of["SEND"], fill_of["BWD_W"]);
  EXPECT_EQ(fill_of["SEND"], fill_of["RECV"]);
}

TEST(ScheduleSvg, MicrobatchNumbersInsideTheBoxes) {
  const Trace t = small_trace();
  std::vector<std::string> want;
  for (const Event& e : t.events)
    if (e.step == 1 && e.lane == Lane::LANE_COMPUTE) want.push_back(std::to_string(e.microbatch));
  std::vector<std::string> got = texts_of_class(schedule_svg(t), "mb");
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
  // Too narrow to hold a digit: no number.
  Trace with_tiny = t;
  with_tiny.events.push_back({1, Lane::LANE_COMPUTE, "FWD", "tiny", -1, 1, 9, 1, -1, 10720, 10722, 0});
  got = texts_of_class(schedule_svg(with_tiny), "mb");
  EXPECT_EQ(got.size(), want.size());
  EXPECT_EQ(std::count(got.begin(), got.end(), "9"), 0);
}

TEST(ScheduleSvg, UnitEventsOfOnePassShareOneNumber) {
  Trace t;
  t.ranks = 1;
  for (int u = 0; u < 4; ++u)  // FWD mb3 recorded unit by unit, back to back
    t.events.push_back({0, Lane::LANE_COMPUTE, "FWD", "FWD unit " + std::to_string(u), u, 0, 3, 0, u, 100.0 * u, 100.0 * (u + 1), 0});
  t.events.push_back({0, Lane::LANE_COMPUTE, "FWD", "FWD mb4", 9, 0, 4, 0, 0, 400, 500, 0});
  const std::string svg = schedule_svg(t);
  EXPECT_EQ(event_rects(svg).size(), 5u);
  EXPECT_EQ(texts_of_class(svg, "mb"), std::vector<std::string>({"3", "4"}));
}

TEST(ScheduleSvg, TimeStartsAtTheStepsFirstEvent) {
  const std::string svg = schedule_svg(small_trace());
  double min_x = 1e9;
  for (const auto& r : event_rects(svg)) min_x = std::min(min_x, std::stod(r.at("x")));
  const std::regex zero_tick("<text x=\"([0-9.]+)\" y=\"[0-9.]+\" class=\"tick\"[^>]*>0</text>");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, zero_tick)) << "no tick at 0";
  EXPECT_DOUBLE_EQ(std::stod(m[1]), min_x);
  EXPECT_NE(svg.find(">time (ms)<"), std::string::npos);  // 730 us across: shown in ms
}

TEST(ScheduleSvg, ChoosesTheStepAndSaysWhichExist) {
  SvgOptions o;
  o.step = 0;
  EXPECT_EQ(event_rects(schedule_svg(small_trace(), o)).size(), 1u);
  o.step = 7;
  try {
    schedule_svg(small_trace(), o);
    FAIL() << "no error for a missing step";
  } catch (const TraceError& e) {
    EXPECT_NE(std::string(e.what()).find("no step 7 (it has steps 0, 1)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(schedule_svg(Trace{}), TraceError);
}

TEST(ScheduleSvg, CommunicationLaneIsOptional) {
  SvgOptions o;
  o.comm_lane = false;
  for (const auto& r : event_rects(schedule_svg(small_trace(), o)))
    EXPECT_TRUE(r.at("data-kind") != "SEND" && r.at("data-kind") != "RECV");
}

TEST(ScheduleSvg, EscapesTheTitleAndNamesAbstractTime) {
  SvgOptions o;
  o.abstract_time = true;
  const std::string svg = schedule_svg(small_trace(), o);
  EXPECT_NE(svg.find("hand-made &lt;F/B/W&gt; &amp; friends"), std::string::npos);
  EXPECT_EQ(svg.find("<F/B/W>"), std::string::npos);
  EXPECT_NE(svg.find(">time units<"), std::string::npos);
}

TEST(ScheduleSvg, SecondChunkIsALighterShadeOfTheSameKind) {
  const Trace t = testing::sample_dualpipev();
  const std::string svg = schedule_svg(t);
  EXPECT_EQ(testing::xml_problem(svg), "");
  std::map<std::pair<std::string, std::string>, std::string> fill;  // (kind, chunk) -> fill
  int chunk1 = 0;
  for (const auto& r : event_rects(svg)) {
    fill[{r.at("data-kind"), r.at("data-chunk")}] = r.at("fill");
    chunk1 += r.at("data-chunk") == "1";
  }
  EXPECT_GT(chunk1, 0);
  for (const char* kind : {"FWD", "BWD_I", "BWD_W"}) {
    const std::string first = fill[std::make_pair(std::string(kind), std::string("0"))];
    const std::string second = fill[std::make_pair(std::string(kind), std::string("1"))];
    const Rgb a = rgb(first), b = rgb(second);
    EXPECT_GT(b.r + b.g + b.b, a.r + a.g + a.b + 60) << kind << ": chunk 1 " << second << " not lighter than " << first;
    EXPECT_EQ(kind_colour(kind, 1), second);
  }
  // Rank 1 holds stages 1 and 2 (the V's bottom): stage 2 is its second chunk.
  size_t stage2 = 0, drawn_chunk1 = 0;
  for (const Event& e : t.events) stage2 += e.rank == 1 && e.lane == Lane::LANE_COMPUTE && e.stage == 2;
  for (const auto& r : event_rects(svg)) drawn_chunk1 += r.at("data-rank") == "1" && r.at("data-chunk") == "1";
  EXPECT_EQ(drawn_chunk1, stage2);
  write_sample_if_asked("dualpipev.svg", svg);
}

TEST(ScheduleSvg, Realistic1F1BHasEveryPassOfTheLastStep) {
  const Trace t = testing::sample_1f1b();
  const std::string svg = schedule_svg(t);
  EXPECT_EQ(testing::xml_problem(svg), "");
  EXPECT_EQ(texts_of_class(svg, "row-label").size(), 4u);
  size_t in_step = 0;
  for (const Event& e : t.events) in_step += e.step == 1;
  EXPECT_EQ(event_rects(svg).size(), in_step);
  EXPECT_EQ(texts_of_class(svg, "mb").size(), 4u * 16u);  // 8 forwards and 8 backwards per rank
  EXPECT_NE(svg.find("step 1:"), std::string::npos);
  write_sample_if_asked("1f1b.svg", svg);
  SvgOptions o;
  o.comm_lane = false;
  o.width_px = 800;
  write_sample_if_asked("1f1b_narrow.svg", schedule_svg(t, o));
}

TEST(SvgHelpers, TicksAndLabels) {
  EXPECT_EQ(nice_ticks(0, 10, 5), std::vector<double>({0, 2, 4, 6, 8, 10}));
  const std::vector<double> t = nice_ticks(0.3, 7.2, 8);
  EXPECT_LE(t.front(), 0.3);
  EXPECT_GE(t.back(), 7.2);
  EXPECT_EQ(tick_label(2.5, 0.5), "2.5");
  EXPECT_EQ(tick_label(0.25, 0.25), "0.25");
  EXPECT_EQ(tick_label(12000, 2000, true), "12k");
  EXPECT_EQ(tick_label(12000, 2000), "12000");
  EXPECT_EQ(xml_escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&apos;");
  EXPECT_EQ(svg_num(1.004), "1");
  EXPECT_EQ(fit_text("abcdef", 6), "abcdef");
  EXPECT_EQ(fit_text("abcdefg", 6), "abc...");
  EXPECT_EQ(fit_text("ab\xc2\xb5" "defg", 6), "ab...");  // not half of the two-byte character
  SvgOptions narrow;
  narrow.width_px = 320;
  Trace long_title = small_trace();
  long_title.title = std::string(200, 'x');
  EXPECT_NE(schedule_svg(long_title, narrow).find(std::string(10, 'x') + "..."), std::string::npos);
  EXPECT_EQ(schedule_svg(long_title, narrow).find(std::string(100, 'x')), std::string::npos);
  EXPECT_EQ(svg_num(12.5), "12.5");
}

// A measured and a simulated trace on one axis: the first's last step and the second's only step,
// each from 0, the second's ranks below, rows named after each title's first word.
TEST(ScheduleSvg, StackLaysTwoTracesOnOneTimeAxis) {
  Trace measured = small_trace();
  measured.title = "measured: run.yaml (2 ranks)";
  Trace simulated;
  simulated.title = "simulated: run.yaml (2 ranks, calibrate costs)";
  simulated.ranks = 2;
  simulated.events.push_back({0, Lane::LANE_COMPUTE, "FWD", "FWD mb0", -1, 0, 0, 0, -1, 500, 600, 0});
  simulated.events.push_back({1, Lane::LANE_COMPUTE, "FWD", "FWD mb0", -1, 0, 0, 1, -1, 600, 700, 0});
  std::vector<std::string> labels;
  const Trace both = stack(measured, -1, simulated, -1, labels);
  EXPECT_EQ(both.ranks, 4);
  EXPECT_EQ(labels, (std::vector<std::string>{"measured r0", "measured r1", "simulated r0", "simulated r1"}));
  size_t from_measured = 0;
  for (const Event& e : both.events) {
    EXPECT_EQ(e.step, 0);
    EXPECT_GE(e.start_us, 0.0);
    from_measured += e.rank < 2;
  }
  EXPECT_EQ(from_measured, 14u) << "step 1 of the measured trace only: the decoy step 0 is left out";
  EXPECT_DOUBLE_EQ(both.events.back().start_us, 100.0) << "the simulated step moved to start at 0";
  SvgOptions o;
  o.row_labels = labels;
  const std::string svg = schedule_svg(both, o);
  EXPECT_NE(svg.find(">simulated r1<"), std::string::npos);
  EXPECT_THROW(stack(measured, 7, simulated, -1, labels), TraceError);
}

}  // namespace
}  // namespace piper::trace
