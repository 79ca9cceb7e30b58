// test_chrome.cpp — Chrome trace-event JSON: write_chrome / read_chrome round trip and errors.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "trace/trace.hpp"
#include "unit/trace/sample_traces.hpp"

namespace piper::trace {
namespace {

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "piper_trace_" + name; }

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const TraceError& e) {
    return e.what();
  }
  return "(no TraceError)";
}

TEST(ChromeJson, RoundTripKeepsEveryField) {
  Trace t = testing::sample_dualpipev();
  t.title = "simulated: \"quoted\" <title> & more";
  t.events[3].bytes = int64_t{1} << 40;
  t.events[5].start_us = 0.1;
  t.events[5].end_us = 0.3;  // 0.1 + (0.3 - 0.1) != 0.3 in doubles
  const std::string path = temp_path("roundtrip.json");
  write_chrome(t, path);
  const Trace back = read_chrome(path);
  EXPECT_EQ(back.title, t.title);
  EXPECT_EQ(back.ranks, t.ranks);
  ASSERT_EQ(back.events.size(), t.events.size());
  for (size_t i = 0; i < t.events.size(); ++i) {
    const Event& a = t.events[i];
    const Event& b = back.events[i];
    SCOPED_TRACE("event " + std::to_string(i) + " " + a.name);
    EXPECT_EQ(b.rank, a.rank);
    EXPECT_EQ(b.lane, a.lane);
    EXPECT_EQ(b.kind, a.kind);
    EXPECT_EQ(b.name, a.name);
    EXPECT_EQ(b.node, a.node);
    EXPECT_EQ(b.step, a.step);
    EXPECT_EQ(b.microbatch, a.microbatch);
    EXPECT_EQ(b.stage, a.stage);
    EXPECT_EQ(b.unit, a.unit);
    EXPECT_EQ(b.start_us, a.start_us);
    EXPECT_EQ(b.end_us, a.end_us);
    EXPECT_EQ(b.bytes, a.bytes);
  }
}

TEST(ChromeJson, OneProcessPerRankTwoThreads) {
  Trace t;
  t.ranks = 3;
  t.events.push_back({2, Lane::LANE_COMM, "SEND", "SEND x", 7, 0, 1, 2, -1, 10, 20, 64});
  const std::string s = chrome_json(t);
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(s.find("\"name\":\"rank " + std::to_string(r) + "\""), std::string::npos) << "no process name for rank " << r;
  EXPECT_NE(s.find("\"name\":\"compute\""), std::string::npos);
  EXPECT_NE(s.find("\"name\":\"communication\""), std::string::npos);
  EXPECT_NE(s.find("\"pid\":2"), std::string::npos);
  EXPECT_NE(s.find("\"tid\":1"), std::string::npos);
}

TEST(ChromeJson, ReadRefusesWhatIsNotATrace) {
  const std::string bad_json = temp_path("bad.json");
  write_text(bad_json, "{\"traceEvents\": [");
  EXPECT_NE(error_of([&] { read_chrome(bad_json); }).find(bad_json + ": not a JSON trace"), std::string::npos);

  const std::string no_events = temp_path("noevents.json");
  write_text(no_events, "{\"step\": 1, \"loss\": 2.5}");
  EXPECT_NE(error_of([&] { read_chrome(no_events); }).find("no \"traceEvents\""), std::string::npos);

  const std::string no_ts = temp_path("nots.json");
  write_text(no_ts, "{\"traceEvents\": [{\"ph\": \"X\", \"pid\": 0, \"dur\": 3}]}");
  EXPECT_NE(error_of([&] { read_chrome(no_ts); }).find(no_ts + ": a trace event is malformed"), std::string::npos);

  const std::string bad_other = temp_path("badother.json");
  write_text(bad_other, "{\"otherData\": {\"title\": 5}, \"traceEvents\": []}");
  EXPECT_NE(error_of([&] { read_chrome(bad_other); }).find(bad_other), std::string::npos);

  const std::string missing = temp_path("does_not_exist.json");
  EXPECT_NE(error_of([&] { read_chrome(missing); }).find("cannot read the trace file " + missing), std::string::npos);
}

TEST(ChromeJson, ReadSkipsMetadataAndCountsRanks) {
  const std::string path = temp_path("meta.json");
  write_text(path,
             "{\"traceEvents\": [{\"ph\": \"M\", \"pid\": 0, \"name\": \"process_name\"},"
             "{\"ph\": \"X\", \"pid\": 4, \"tid\": 1, \"ts\": 5, \"dur\": 2, \"name\": \"RECV\", \"cat\": \"RECV\"}]}");
  const Trace t = read_chrome(path);
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.ranks, 5);
  EXPECT_EQ(t.events[0].lane, Lane::LANE_COMM);
  EXPECT_EQ(t.events[0].kind, "RECV");  // from "cat" when args has no kind
  EXPECT_DOUBLE_EQ(t.events[0].end_us, 7);
}

}  // namespace
}  // namespace piper::trace
