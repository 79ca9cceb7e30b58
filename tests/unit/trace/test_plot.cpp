// test_plot.cpp — metrics JSONL parsing (errors name file and line) and the two-panel SVG, with the
// held-out loss beside the training loss when the run evaluated.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "trace/plot.hpp"
#include "trace/trace.hpp"
#include "unit/trace/sample_traces.hpp"

namespace piper::trace {
namespace {

// Lines as src/runtime/trainer.cpp writes them (per-rank figures included).
std::string trainer_lines(int steps) {
  std::string s;
  for (int i = 0; i < steps; ++i) {
    const double loss = 5.6 - 0.35 * std::log1p(i) + 0.03 * std::sin(i);
    const double tps = i == 0 ? 9100 : 14200 + 300 * std::sin(0.7 * i);
    s += "{\"grad_norm\":1.2,\"loss\":" + std::to_string(loss) + ",\"lr\":0.0003,\"peak_mem_bytes\":123456789," +
         "\"ranks\":[{\"comm_ms\":1.5,\"compute_ms\":30.0,\"idle_ms\":2.0,\"rank\":0}],\"step\":" + std::to_string(i) +
         ",\"step_ms\":" + std::to_string(8192.0 / tps * 1000) + ",\"tokens\":" + std::to_string((i + 1) * 8192) +
         ",\"tokens_per_s\":" + std::to_string(tps) + "}\n";
  }
  return s;
}

std::string error_of(const std::string& text) {
  try {
    parse_metrics(text, "run.jsonl");
  } catch (const TraceError& e) {
    return e.what();
  }
  return "(no TraceError)";
}

TEST(Metrics, ParsesTheTrainersLines) {
  const auto rows = parse_metrics(trainer_lines(3) + "\n", "run.jsonl");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[2].step, 2);
  EXPECT_NEAR(rows[0].loss, 5.6, 1e-6);
  EXPECT_NEAR(rows[0].tokens_per_s, 9100, 1e-6);
  EXPECT_GT(rows[1].step_ms, 0);
  EXPECT_TRUE(std::isnan(rows[1].eval_loss));  // no evaluation
}

TEST(Metrics, MalformedLinesNameFileAndLine) {
  const std::string good = trainer_lines(2);
  EXPECT_NE(error_of(good + "{\"step\": 2, \"loss\": 1.0,\n").find("run.jsonl:3: not a JSON object"), std::string::npos);
  EXPECT_NE(error_of("{\"step\": 0, \"tokens_per_s\": 5}\n").find("run.jsonl:1: no \"loss\""), std::string::npos);
  EXPECT_NE(error_of(good + "\n{\"step\": \"two\", \"loss\": 1, \"tokens_per_s\": 5}\n").find("run.jsonl:4: \"step\" is \"two\""),
            std::string::npos);
  EXPECT_NE(error_of(good + "[1, 2]\n").find("run.jsonl:3: not a JSON object"), std::string::npos);
  EXPECT_NE(error_of("{\"step\": 0, \"loss\": \"low\", \"tokens_per_s\": 5}").find("run.jsonl:1: \"loss\" is \"low\""),
            std::string::npos);
}

TEST(Metrics, NullLossIsAGapNotAnError) {
  const auto rows = parse_metrics(
      "{\"step\":0,\"loss\":3.0,\"tokens_per_s\":10}\n{\"step\":1,\"loss\":null,\"tokens_per_s\":11}\n"
      "{\"step\":2,\"loss\":2.0,\"tokens_per_s\":12}\n",
      "x");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_TRUE(std::isnan(rows[1].loss));
  const std::string svg = metrics_svg(rows);
  size_t lines = 0;
  for (size_t p = 0; (p = svg.find("<polyline", p)) != std::string::npos; ++p) ++lines;
  EXPECT_EQ(lines, 3u);  // loss broken in two, throughput whole
}

TEST(Metrics, ReadNamesTheFile) {
  const std::string path = ::testing::TempDir() + "piper_trace_metrics_bad.jsonl";
  {
    std::ofstream f(path, std::ios::trunc);
    f << trainer_lines(4) << "{oops}\n";
  }
  try {
    read_metrics(path);
    FAIL() << "no error";
  } catch (const TraceError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":5:"), std::string::npos) << e.what();
  }
  const std::string empty = ::testing::TempDir() + "piper_trace_metrics_empty.jsonl";
  { std::ofstream f(empty, std::ios::trunc); }
  EXPECT_THROW(read_metrics(empty), TraceError);
  EXPECT_THROW(read_metrics(::testing::TempDir() + "piper_trace_no_such.jsonl"), TraceError);
}

TEST(Metrics, SvgHasTwoPanelsWithAxesAndTicks) {
  const auto rows = parse_metrics(trainer_lines(40), "run.jsonl");
  PlotOptions o;
  o.title = "run <7> & co";
  const std::string svg = metrics_svg(rows, o);
  EXPECT_EQ(testing::xml_problem(svg), "");
  EXPECT_NE(svg.find(">loss</text>"), std::string::npos);
  EXPECT_NE(svg.find(">throughput (tokens/s)</text>"), std::string::npos);
  EXPECT_NE(svg.find("run &lt;7&gt; &amp; co"), std::string::npos);
  size_t step_labels = 0, ticks = 0, lines = 0;
  for (size_t p = 0; (p = svg.find(">step</text>", p)) != std::string::npos; ++p) ++step_labels;
  for (size_t p = 0; (p = svg.find("class=\"tick\"", p)) != std::string::npos; ++p) ++ticks;
  for (size_t p = 0; (p = svg.find("<polyline", p)) != std::string::npos; ++p) ++lines;
  EXPECT_EQ(step_labels, 2u);
  EXPECT_GE(ticks, 16u);
  EXPECT_EQ(lines, 2u);
  EXPECT_NE(svg.find(">16k</text>"), std::string::npos);  // throughput ticks in thousands
  EXPECT_NE(svg.find("median 14."), std::string::npos);
  EXPECT_THROW(metrics_svg({}), TraceError);
  if (const char* dir = std::getenv("PIPER_TRACE_SAMPLES")) std::ofstream(std::string(dir) + "/metrics.svg") << svg;
}

// Every 10th line with the held-out loss of an evaluation after it, as the trainer writes it.
std::string with_evaluations(const std::string& lines) {
  std::string out, ln;
  std::istringstream in(lines);
  for (int i = 0; std::getline(in, ln); ++i)
    out += (i % 10 == 9 ? ln.substr(0, ln.size() - 1) + ",\"eval_loss\":" + std::to_string(5.0 - 0.02 * i) +
                              ",\"eval_ms\":12.5}"
                        : ln) +
           "\n";
  return out;
}

TEST(Metrics, HeldOutLossIsDrawnBesideTheTrainingLoss) {
  const auto rows = parse_metrics(with_evaluations(trainer_lines(40)), "run.jsonl");
  ASSERT_EQ(rows.size(), 40u);
  EXPECT_TRUE(std::isnan(rows[0].eval_loss));
  EXPECT_NEAR(rows[9].eval_loss, 4.82, 1e-9);
  const std::string svg = metrics_svg(rows);
  EXPECT_EQ(testing::xml_problem(svg), "");
  size_t lines = 0, held_out_dots = 0;
  for (size_t p = 0; (p = svg.find("<polyline", p)) != std::string::npos; ++p) ++lines;
  for (size_t p = 0; (p = svg.find("fill=\"#e07b28\"", p)) != std::string::npos; ++p) ++held_out_dots;
  EXPECT_EQ(lines, 3u);          // training and held-out loss (one line through the 4 evaluations), throughput
  EXPECT_EQ(held_out_dots, 4u);  // a dot per evaluation
  EXPECT_NE(svg.find(">training</text>"), std::string::npos);
  EXPECT_NE(svg.find(">held-out</text>"), std::string::npos);
  EXPECT_NE(svg.find("last held-out loss 4.2200"), std::string::npos);
  // Without evaluations: one loss line and no legend.
  const std::string plain = metrics_svg(parse_metrics(trainer_lines(40), "run.jsonl"));
  EXPECT_EQ(plain.find(">held-out</text>"), std::string::npos);
  EXPECT_EQ(plain.find("class=\"legend\""), std::string::npos);
  if (const char* dir = std::getenv("PIPER_TRACE_SAMPLES")) std::ofstream(std::string(dir) + "/metrics-eval.svg") << svg;
}

}  // namespace
}  // namespace piper::trace
