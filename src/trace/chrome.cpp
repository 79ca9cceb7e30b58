// chrome.cpp — Chrome trace-event JSON: one process per rank, one thread per lane.
#include <algorithm>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "trace/trace.hpp"

#include "io/regular_file.hpp"

namespace piper::trace {

using nlohmann::json;

std::string chrome_json(const Trace& t) {
  json events = json::array();
  for (int r = 0; r < t.ranks; ++r) {
    events.push_back({{"ph", "M"}, {"pid", r}, {"name", "process_name"}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    events.push_back({{"ph", "M"}, {"pid", r}, {"name", "process_sort_index"}, {"args", {{"sort_index", r}}}});
    events.push_back({{"ph", "M"}, {"pid", r}, {"tid", 0}, {"name", "thread_name"}, {"args", {{"name", "compute"}}}});
    events.push_back({{"ph", "M"}, {"pid", r}, {"tid", 1}, {"name", "thread_name"}, {"args", {{"name", "communication"}}}});
  }
  for (const Event& e : t.events) {
    events.push_back({{"ph", "X"},
                      {"pid", e.rank},
                      {"tid", e.lane == Lane::LANE_COMPUTE ? 0 : 1},
                      {"name", e.name},
                      {"cat", e.kind},
                      {"ts", e.start_us},
                      {"dur", e.end_us - e.start_us},
                      {"args",
                       {{"kind", e.kind},
                        {"node", e.node},
                        {"step", e.step},
                        {"microbatch", e.microbatch},
                        {"stage", e.stage},
                        {"unit", e.unit},
                        {"bytes", e.bytes},
                        {"end_us", e.end_us}}}});  // exact: ts + dur may round
  }
  json doc = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ms"},
              {"otherData", {{"title", t.title}, {"ranks", t.ranks}, {"producer", "piper"}}}};
  // Names are ours, but a byte that is not UTF-8 must not lose the whole trace.
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

void write_chrome(const Trace& t, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw TraceError("cannot write the trace file " + path);
  f << chrome_json(t) << '\n';
  f.close();
  if (!f) throw TraceError("writing the trace file " + path + " failed (disk full?)");
}

Trace read_chrome(const std::string& path) {
  std::string text;
  try {
    text = io::read_regular(path, kMaxTraceFileBytes);
  } catch (const io::FileError& e) {
    throw TraceError("cannot read the trace file " + path + ": " + e.what());
  }
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    throw TraceError(path + ": not a JSON trace: " + e.what());
  }
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array())
    throw TraceError(path + ": no \"traceEvents\" array; expected a Chrome trace written by piper");
  Trace t;
  try {
    if (doc.contains("otherData") && doc["otherData"].is_object()) {
      t.title = doc["otherData"].value("title", "");
      t.ranks = doc["otherData"].value("ranks", 0);
    }
  } catch (const json::exception& e) {
    throw TraceError(path + ": \"otherData\" is malformed: " + e.what());
  }
  try {
    for (const json& j : doc["traceEvents"]) {
      if (j.value("ph", "") != "X") continue;
      Event e;
      e.rank = j.at("pid").get<int>();
      if (e.rank < 0) throw TraceError(path + ": a trace event has the negative pid (rank) " + std::to_string(e.rank));
      e.lane = j.value("tid", 0) == 0 ? Lane::LANE_COMPUTE : Lane::LANE_COMM;
      e.name = j.value("name", "");
      e.start_us = j.at("ts").get<double>();
      e.end_us = e.start_us + j.at("dur").get<double>();
      const json a = j.value("args", json::object());
      e.end_us = a.value("end_us", e.end_us);
      e.kind = a.value("kind", j.value("cat", ""));
      e.node = a.value("node", -1);
      e.step = a.value("step", 0);
      e.microbatch = a.value("microbatch", -1);
      e.stage = a.value("stage", -1);
      e.unit = a.value("unit", -1);
      e.bytes = a.value("bytes", int64_t{0});
      t.ranks = std::max(t.ranks, e.rank + 1);
      t.events.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    throw TraceError(path + ": a trace event is malformed: " + e.what());
  }
  return t;
}

}  // namespace piper::trace
