// test_switch.cpp — strategy switches: the train keys of switching, the `switch:` list, switch files
// (parse_switch), a target applied onto the config it switches from (apply_switch), its checks at
// the world it runs at (validate_switch), YAML round trips, and errors with file:line:col.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.hpp"

namespace piper::config {
namespace {

// A run of 20 steps on 4 ranks that switches four times; the default model.
const std::string kSchedule =
    "train:\n"                                   // 1
    "  steps: 20\n"                              // 2
    "  global_batch: 8\n"                        // 3
    "  switch_file: run/strategy.yaml\n"         // 4
    "  switch_buffer_mb: 32\n"                   // 5
    "  standby: 2\n"                             // 6
    "  switch_hardware: h100-sxm\n"              // 7
    "  switch_tune_s: 5\n"                       // 8
    "parallel:\n"                                // 9
    "  dp: 4\n"                                  // 10
    "  bucket_mb: 8\n"                           // 11
    "switch:\n"                                  // 12
    "  - {at_step: 4, parallel: {dp: 1, pp: 2, schedule: zbh1, microbatches: 4}}\n"  // 13
    "  - at_step: 8\n"                           // 14
    "    world: 2\n"                             // 15
    "    parallel: {dp: 2, pp: 1}\n"             // 16
    "  - at_step: 12\n"                          // 17
    "    directives:\n"                          // 18
    "      - replicate: {dp: 2, shard_optimizer: true}\n"  // 19
    "      - place: {pp: 2}\n"                   // 20
    "  - at_step: 16\n";                         // 21

std::string message_of(const std::string& yaml, int world, const std::vector<std::string>& sets = {}) {
  try {
    validate(parse(yaml, "s.yaml", sets), world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string switch_message(const Config& current, const SwitchTarget& target, int world) {
  try {
    validate_switch(current, target, world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& message, const std::vector<std::string>& needs) {
  ASSERT_FALSE(message.empty()) << "no ConfigError";
  for (const std::string& s : needs)
    EXPECT_NE(message.find(s), std::string::npos) << "missing '" << s << "' in:\n" << message;
}

// ---- parsing -------------------------------------------------------------------

TEST(Switch, TrainKeysParseWithTheirPositions) {
  const Config c = parse(kSchedule, "s.yaml");
  EXPECT_EQ(c.train.switch_file, "run/strategy.yaml");
  EXPECT_EQ(c.train.switch_buffer_mb, 32.0);
  EXPECT_EQ(c.train.standby, 2);
  EXPECT_EQ(c.train.switch_hardware, "h100-sxm");
  EXPECT_EQ(c.train.switch_cost, "");
  EXPECT_EQ(c.train.switch_tune_s, 5.0);
  EXPECT_EQ(c.locations.at("train.standby"), "s.yaml:6:3");
  const TrainConfig defaults;
  EXPECT_EQ(defaults.switch_buffer_mb, 64.0);
  EXPECT_EQ(defaults.standby, 0);
  EXPECT_EQ(defaults.switch_tune_s, 10.0);
  EXPECT_TRUE(defaults.switch_file.empty());
  EXPECT_NO_THROW(validate(c, 4));
}

TEST(Switch, EntriesParseEveryForm) {
  const Config c = parse(kSchedule, "s.yaml");
  ASSERT_EQ(c.switches.size(), 4u);
  // A flow map: the parallel keys written over the section's defaults.
  const SwitchTarget& a = c.switches[0];
  EXPECT_EQ(a.at_step, 4);
  EXPECT_FALSE(a.world.has_value());
  ASSERT_TRUE(a.parallel.has_value());
  EXPECT_EQ(a.parallel->dp, 1);
  EXPECT_EQ(a.parallel->pp, 2);
  EXPECT_EQ(a.parallel->schedule, "zbh1");
  EXPECT_EQ(a.parallel->microbatches, 4);
  EXPECT_EQ(a.parallel->bucket_mb, ParallelConfig().bucket_mb);  // not written: the default, not applied
  EXPECT_EQ(a.parallel_keys(), (std::vector<std::string>{"dp", "pp", "schedule", "microbatches"}));
  EXPECT_FALSE(a.directives.present);
  EXPECT_TRUE(a.has_strategy());
  EXPECT_EQ(a.source, "s.yaml");
  EXPECT_EQ(a.path(), "switch[0]");
  EXPECT_EQ(a.locations.at("switch[0]"), "s.yaml:13:5");
  EXPECT_EQ(a.locations.at("switch[0].at_step"), "s.yaml:13:6");
  EXPECT_EQ(a.locations.at("switch[0].parallel"), "s.yaml:13:18");
  EXPECT_EQ(a.locations.at("switch[0].parallel.dp"), "s.yaml:13:29");
  EXPECT_EQ(a.locations.at("switch[0].parallel.schedule"), "s.yaml:13:43");
  // A block map with world.
  const SwitchTarget& b = c.switches[1];
  EXPECT_EQ(b.at_step, 8);
  EXPECT_EQ(b.world, 2);
  EXPECT_EQ(b.parallel_keys(), (std::vector<std::string>{"dp", "pp"}));
  EXPECT_EQ(b.locations.at("switch[1]"), "s.yaml:14:5");
  EXPECT_EQ(b.locations.at("switch[1].world"), "s.yaml:15:5");
  EXPECT_EQ(b.locations.at("switch[1].parallel.pp"), "s.yaml:16:23");
  // Directives, read as the top-level section is.
  const SwitchTarget& d = c.switches[2];
  EXPECT_FALSE(d.parallel.has_value());
  EXPECT_TRUE(d.parallel_keys().empty());
  ASSERT_TRUE(d.directives.present);
  ASSERT_EQ(d.directives.list.size(), 2u);
  EXPECT_EQ(d.directives.list[0].kind, DirectiveKind::REPLICATE);
  EXPECT_EQ(d.directives.list[0].dp, 2);
  EXPECT_EQ(d.directives.list[0].shard_optimizer, true);
  EXPECT_EQ(d.directives.list[1].kind, DirectiveKind::PLACE);
  EXPECT_EQ(d.directives.list[1].pp, 2);
  EXPECT_EQ(d.locations.at("switch[2].directives"), "s.yaml:18:5");
  EXPECT_EQ(d.locations.at("switch[2].directives[0]"), "s.yaml:19:9");
  EXPECT_EQ(d.locations.at("switch[2].directives[0].replicate.dp"), "s.yaml:19:21");
  EXPECT_EQ(d.locations.count("directives[0]"), 0u);
  EXPECT_TRUE(d.has_strategy());
  // Neither: the tuner chooses.
  const SwitchTarget& t = c.switches[3];
  EXPECT_EQ(t.at_step, 16);
  EXPECT_FALSE(t.has_strategy());
  // The entries' keys are theirs alone: the config's own sections are untouched.
  EXPECT_EQ(c.parallel.dp, 4);
  EXPECT_EQ(c.parallel.pp, 1);
  EXPECT_FALSE(c.directives.present);
  EXPECT_EQ(c.locations.count("switch[0].parallel.dp"), 0u);
}

TEST(Switch, EmptyAndNoListGiveNoSwitches) {
  EXPECT_TRUE(parse("switch:\n", "s.yaml").switches.empty());
  EXPECT_TRUE(parse("switch: []\n", "s.yaml").switches.empty());
  EXPECT_TRUE(parse("", "s.yaml").switches.empty());
  EXPECT_EQ(parse("", "s.yaml").yaml_text.find("switch:"), std::string::npos);
  // `parallel:` left empty is a strategy: the current section, without directives.
  const Config c = parse("switch:\n  - at_step: 2\n    parallel:\n", "s.yaml");
  ASSERT_EQ(c.switches.size(), 1u);
  EXPECT_TRUE(c.switches[0].has_strategy());
  EXPECT_TRUE(c.switches[0].parallel_keys().empty());
}

// ---- round trips ----------------------------------------------------------------

TEST(Switch, RoundTripThroughToYaml) {
  const Config c = parse(kSchedule, "s.yaml");
  const std::string text = to_yaml(c);
  for (const char* s : {"switch_file: \"run/strategy.yaml\"", "standby: 2", "switch_tune_s: 5.0", "switch:\n",
                        "  - at_step: 4\n    parallel: {dp: 1, pp: 2, schedule: \"zbh1\", microbatches: 4}\n",
                        "    world: 2\n", "    directives:\n      - replicate: {dp: 2, shard_optimizer: true}\n"})
    EXPECT_NE(text.find(s), std::string::npos) << s << " in:\n" << text;
  EXPECT_EQ(c.yaml_text, text);
  const Config back = parse(text, "back.yaml");
  EXPECT_TRUE(back.same_settings(c)) << text;
  ASSERT_EQ(back.switches.size(), c.switches.size());
  for (size_t i = 0; i < c.switches.size(); ++i) {
    EXPECT_TRUE(back.switches[i].same_settings(c.switches[i])) << i;
    EXPECT_EQ(back.switches[i].parallel_keys(), c.switches[i].parallel_keys()) << i;
    EXPECT_FALSE(back.switches[i] == c.switches[i]) << i;  // == compares the positions too
  }
  EXPECT_EQ(back.yaml_text, text);
}

TEST(Switch, SettingsDifferByTheKeysAnEntryWrites) {
  const std::string head = "switch:\n  - at_step: 2\n";
  const Config dp = parse(head + "    parallel: {dp: 1}\n", "a.yaml");
  const Config dp_tp = parse(head + "    parallel: {dp: 1, tp: 1}\n", "b.yaml");
  // The same values (tp 1 is the default), but the second sets tp back to 1 where the first keeps it.
  EXPECT_EQ(dp.switches[0].parallel, dp_tp.switches[0].parallel);
  EXPECT_FALSE(dp.same_settings(dp_tp));
  EXPECT_TRUE(dp.same_settings(parse(head + "    parallel:\n      dp: 1\n", "c.yaml")));
  EXPECT_FALSE(dp.same_settings(parse(head + "    parallel: {dp: 1}\n    world: 1\n", "d.yaml")));
  EXPECT_FALSE(dp.same_settings(parse("switch:\n  - at_step: 3\n    parallel: {dp: 1}\n", "e.yaml")));
  EXPECT_FALSE(dp.same_settings(parse("", "f.yaml")));
}

// ---- switch files ---------------------------------------------------------------

TEST(Switch, ParseSwitchReadsEveryKey) {
  const SwitchTarget t = parse_switch(
      "world: 3\n"
      "leave: [5, 2]\n"
      "parallel:\n"
      "  dp: 3\n"
      "  zero: 1\n"
      "directives:\n"
      "  - split: {microbatches: 2}\n",
      "run/strategy.yaml");
  EXPECT_EQ(t.at_step, -1);
  EXPECT_EQ(t.world, 3);
  EXPECT_EQ(t.leave, (std::vector<int64_t>{5, 2}));
  ASSERT_TRUE(t.parallel.has_value());
  EXPECT_EQ(t.parallel->dp, 3);
  EXPECT_EQ(t.parallel->zero, 1);
  EXPECT_EQ(t.parallel_keys(), (std::vector<std::string>{"dp", "zero"}));
  ASSERT_EQ(t.directives.list.size(), 1u);
  EXPECT_EQ(t.directives.list[0].microbatches, 2);
  EXPECT_EQ(t.source, "run/strategy.yaml");
  EXPECT_EQ(t.path(), "");
  EXPECT_EQ(t.locations.at("world"), "run/strategy.yaml:1:1");
  EXPECT_EQ(t.locations.at("leave"), "run/strategy.yaml:2:1");
  EXPECT_EQ(t.locations.at("parallel.dp"), "run/strategy.yaml:4:3");
  EXPECT_EQ(t.locations.at("directives[0].split.microbatches"), "run/strategy.yaml:7:13");
  // One key is enough; a shrink without a strategy leaves the choice to the tuner.
  const SwitchTarget shrink = parse_switch("leave: [3]\n", "s.yaml");
  EXPECT_FALSE(shrink.has_strategy());
  EXPECT_EQ(shrink.leave, (std::vector<int64_t>{3}));
  EXPECT_FALSE(shrink.world.has_value());
}

struct BadFile {
  const char* name;
  std::string text;
  std::vector<std::string> needs;
};

std::ostream& operator<<(std::ostream& os, const BadFile& b) { return os << b.name; }

const std::vector<BadFile> kBadFiles = {
    {"EmptyDocument", "", {"p.yaml: the switch file is empty", "parallel, directives, world, leave"}},
    {"OnlyAComment", "# nothing yet\n", {"p.yaml: the switch file is empty"}},
    {"EmptyMap", "{}\n", {"p.yaml: the switch file is empty"}},
    {"NotAMap", "- dp: 2\n", {"p.yaml:1:1: expected a map of the keys parallel, directives, world, leave", "a list"}},
    {"Scalar", "dp=2\n", {"p.yaml:1:1: expected a map of the keys", "found 'dp=2'"}},
    {"UnknownKey", "wrold: 2\n", {"p.yaml:1:1: unknown key 'wrold' in a switch file", "did you mean 'world'?"}},
    {"ParallelKeyOutside", "dp: 2\n", {"p.yaml:1:1: 'dp' is a key of parallel:; write it inside it"}},
    {"AtStep", "at_step: 3\n", {"p.yaml:1:1", "a switch file applies at the next step boundary",
                                "at_step belongs in an entry of the config's switch: list"}},
    {"BadWorld", "world: two\n", {"p.yaml:1:8: world: expected an integer, found 'two'"}},
    {"LeaveNotAList", "leave: 3\n", {"p.yaml:1:8: leave: expected a list of job ranks", "found '3'"}},
    {"LeaveItem", "leave: [1, x]\n", {"p.yaml:1:12: leave[1]: expected an integer, found 'x'"}},
    {"BadParallelValue", "parallel:\n  dp: many\n", {"p.yaml:2:7: parallel.dp: expected an integer, found 'many'"}},
    {"UnknownParallelKey", "parallel: {dpp: 2}\n",
     {"p.yaml:1:12: unknown key 'parallel.dpp'; did you mean 'dp'?"}},
    {"BadDirective", "directives:\n  - shard: {tp: x}\n",
     {"p.yaml:2:17: directives[0].shard.tp: expected an integer, found 'x'"}},
    {"DuplicateKey", "world: 2\nworld: 3\n", {"p.yaml:2:1: duplicate key 'world' (first at p.yaml:1:1)"}},
    {"TwoDocuments", "world: 2\n---\nworld: 3\n", {"p.yaml:2:1", "a switch file is one document"}},
    {"SyntaxError", "parallel: {dp: 2\n", {"p.yaml:", "YAML syntax error"}},
};

class BadSwitchFile : public testing::TestWithParam<BadFile> {};

TEST_P(BadSwitchFile, ThrowsANamedMessage) {
  const BadFile& b = GetParam();
  std::string message;
  try {
    parse_switch(b.text, "p.yaml");
  } catch (const ConfigError& e) {
    message = e.what();
  }
  expect_contains(message, b.needs);
}

INSTANTIATE_TEST_SUITE_P(Table, BadSwitchFile, testing::ValuesIn(kBadFiles),
                         [](const testing::TestParamInfo<BadFile>& i) { return std::string(i.param.name); });

// ---- apply_switch ---------------------------------------------------------------

TEST(Switch, ApplySetsTheKeysWrittenAndKeepsTheRest) {
  const Config c = parse(kSchedule, "s.yaml");
  const Config a = apply_switch(c, c.switches[0]);
  EXPECT_EQ(a.parallel.dp, 1);
  EXPECT_EQ(a.parallel.pp, 2);
  EXPECT_EQ(a.parallel.schedule, "zbh1");
  EXPECT_EQ(a.parallel.microbatches, 4);
  EXPECT_EQ(a.parallel.bucket_mb, 8.0);  // not written in the entry: the current value, not the default
  EXPECT_EQ(a.locations.at("parallel.dp"), "s.yaml:13:29");
  EXPECT_EQ(a.locations.at("parallel.bucket_mb"), "s.yaml:11:3");
  EXPECT_TRUE(a.model == c.model && a.train == c.train && a.data == c.data && a.checkpoint == c.checkpoint);
  EXPECT_EQ(a.switches.size(), c.switches.size());
  EXPECT_NE(a.yaml_text.find("  pp: 2"), std::string::npos) << a.yaml_text;
  EXPECT_TRUE(parse(a.yaml_text, "again").same_settings(a));
  EXPECT_NO_THROW(validate(a, 2));
  // The next entry applies over what the one before left.
  const Config b = apply_switch(a, c.switches[1]);
  EXPECT_EQ(b.parallel.dp, 2);
  EXPECT_EQ(b.parallel.pp, 1);
  EXPECT_EQ(b.parallel.schedule, "zbh1");
  EXPECT_EQ(b.parallel.microbatches, 4);
  EXPECT_EQ(b.locations.at("parallel.schedule"), "s.yaml:13:43");
}

TEST(Switch, ApplyReplacesOrDropsTheDirectives) {
  const Config c = parse(kSchedule, "s.yaml");
  const Config with = apply_switch(c, c.switches[2]);
  ASSERT_TRUE(with.directives.present);
  EXPECT_EQ(with.directives, c.switches[2].directives);
  EXPECT_EQ(with.parallel, c.parallel);  // the entry writes no parallel key
  EXPECT_EQ(with.locations.at("directives[0]"), "s.yaml:19:9");
  EXPECT_EQ(with.locations.at("directives[1].place.pp"), "s.yaml:20:17");
  const EffectiveStrategy e = effective_strategy(with);
  EXPECT_EQ(e.parallel.dp, 2);
  EXPECT_EQ(e.parallel.pp, 2);
  EXPECT_EQ(e.parallel.zero, 1);
  EXPECT_EQ(e.positions.ref("parallel.pp"), "directives[1].place.pp=2 (at s.yaml:20:17)");
  // A target with parallel keys only drops the directives, and their positions.
  const Config dropped = apply_switch(with, c.switches[1]);
  EXPECT_FALSE(dropped.directives.present);
  EXPECT_TRUE(dropped.directives.list.empty());
  EXPECT_EQ(dropped.locations.count("directives[0]"), 0u);
  EXPECT_EQ(dropped.locations.count("directives"), 0u);
  EXPECT_EQ(dropped.yaml_text.find("\ndirectives:"), std::string::npos);
  // A switch file's directives replace the ones before.
  const Config file = apply_switch(with, parse_switch("directives:\n  - split: {microbatches: 2}\n", "p.yaml"));
  ASSERT_EQ(file.directives.list.size(), 1u);
  EXPECT_EQ(file.directives.list[0].kind, DirectiveKind::SPLIT);
  EXPECT_EQ(file.locations.at("directives[0].split.microbatches"), "p.yaml:2:13");
  EXPECT_EQ(file.locations.count("directives[1].place.pp"), 0u);
}

// ---- validate_switch --------------------------------------------------------------

TEST(Switch, ValidateSwitchAcceptsEachEntryAtItsWorld) {
  const Config c = parse(kSchedule, "s.yaml");
  Config current = c;
  const int worlds[] = {2, 2, 4, 4};
  for (size_t i = 0; i < c.switches.size(); ++i) {
    EXPECT_NO_THROW(validate_switch(current, c.switches[i], worlds[i])) << i;
    current = apply_switch(current, c.switches[i]);
  }
}

TEST(Switch, ValidateSwitchNamesTheEntryAtAWorldMismatch) {
  const Config c = parse(kSchedule, "s.yaml");
  const Config before = apply_switch(c, c.switches[0]);
  // switch[1] runs dp 2 x tp 1 x pp 1 = 2 ranks; at 4 it does not fit.
  expect_contains(switch_message(before, c.switches[1], 4),
                  {"s.yaml:14:5: switch[1]: world size 4 != dp(2) x tp(1) x pp(1) = 2",
                   "switch[1].parallel.dp=2 (at s.yaml:16:16)", "switch[1].parallel.pp=1 (at s.yaml:16:23)",
                   "parallel.tp=1 (default)", "run it at 2 ranks (world: 2)"});
  // switch[2]'s directives set dp and pp: named by their paths in the entry.
  expect_contains(switch_message(before, c.switches[2], 2),
                  {"s.yaml:17:5: switch[2]: world size 2 != dp(2) x tp(1) x pp(2) = 4",
                   "switch[2].directives[0].replicate.dp=2 (at s.yaml:19:21)",
                   "switch[2].directives[1].place.pp=2 (at s.yaml:20:17)"});
}

TEST(Switch, ValidateSwitchMessagesStartAtTheEntryOrItsKey) {
  const std::string text = kSchedule.substr(0, kSchedule.find("switch:\n")) +
                           "switch:\n"
                           "  - at_step: 2\n"                  // 13
                           "    parallel: {dp: 0}\n"           // 14
                           "  - at_step: 3\n"                  // 15
                           "    parallel:\n"                   // 16
                           "      dp: 3\n"                     // 17
                           "  - at_step: 4\n"                  // 18
                           "    directives:\n"                 // 19
                           "      - replicate: {shard_optimizer: true}\n";  // 20
  const Config c = parse(text, "s.yaml");
  ASSERT_EQ(c.switches.size(), 3u);
  // The entry's own key, at its position.
  expect_contains(switch_message(c, c.switches[0], 4), {"s.yaml:14:16: switch[0].parallel.dp=0: must be at least 1"});
  // A key the entry keeps: the message starts at the entry and says where the key was set.
  expect_contains(switch_message(c, c.switches[1], 3),
                  {"s.yaml:15:5: switch[1]: train.global_batch=8 (at s.yaml:3:3): not divisible by dp x microbatches "
                   "= 3 x 1 = 3",
                   "switch[1].parallel.dp=3 (at s.yaml:17:7)"});
  // A directive's filter-free key, and a rule on the strategy the directives leave.
  const Config one = apply_switch(c, parse_switch("parallel: {dp: 1}\n", "p.yaml"));
  expect_contains(switch_message(one, c.switches[2], 1),
                  {"s.yaml:20:21: switch[2].directives[0].replicate.zero=1: ZeRO shards over data-parallel ranks and "
                   "parallel.dp=1 (at p.yaml:1:12)"});
  // Every problem, one per line.
  const std::string both = switch_message(c, c.switches[1], 2);
  expect_contains(both, {"s.yaml:15:5: switch[1]: train.global_batch=8", "\ns.yaml:15:5: switch[1]: world size 2 != "
                         "dp(3) x tp(1) x pp(1) = 3"});
}

TEST(Switch, ValidateSwitchChecksAFileAndItsRanks) {
  const Config c = parse(kSchedule, "s.yaml");
  const SwitchTarget t = parse_switch("parallel:\n  dp: 3\n", "run/strategy.yaml");
  EXPECT_NO_THROW(validate_switch(apply_switch(c, parse_switch("parallel: {microbatches: 1}\n", "p.yaml")),
                                  parse_switch("parallel: {dp: 2}\n", "q.yaml"), 2));
  expect_contains(switch_message(c, t, 2),
                  {"run/strategy.yaml: world size 2 != dp(3) x tp(1) x pp(1) = 3",
                   "parallel.dp=3 (at run/strategy.yaml:2:3)",
                   "run/strategy.yaml: train.global_batch=8 (at s.yaml:3:3): not divisible by dp x microbatches"});
  // Without a strategy only the ranks are checked: the tuner's choice is checked when it is made.
  EXPECT_NO_THROW(validate_switch(c, parse_switch("leave: [3]\n", "p.yaml"), 3));
  expect_contains(switch_message(c, parse_switch("leave: [3, -1, 3]\n", "p.yaml"), 3),
                  {"p.yaml:1:1: leave: -1 is no job rank; ranks count from 0",
                   "p.yaml:1:1: leave: rank 3 is listed twice"});
  expect_contains(switch_message(c, parse_switch("world: 0\n", "p.yaml"), 1),
                  {"p.yaml:1:1: world=0: must be at least 1"});
}

// ---- validate() and parse errors of the switch list -------------------------------

struct BadCase {
  const char* name;
  std::string yaml;
  int world;
  std::vector<std::string> needs;
  std::vector<std::string> sets = {};
};

std::ostream& operator<<(std::ostream& os, const BadCase& b) { return os << b.name; }

const std::string kTrain = "train:\n  steps: 10\n";  // lines 1-2; `switch:` on line 3

const std::vector<BadCase> kBad = {
    // structure
    {"NotAList", kTrain + "switch: {at_step: 2}\n", 1,
     {"s.yaml:3:9: switch: expected a list of strategy changes", "found a map"}},
    {"ItemNotAMap", kTrain + "switch:\n  - 4\n", 1,
     {"s.yaml:4:5: switch[0]: expected a map with at_step and the strategy from that step on", "found '4'"}},
    {"EmptyItem", kTrain + "switch:\n  - {}\n", 1, {"s.yaml:4:5: switch[0]", "found an empty map"}},
    {"UnknownEntryKey", kTrain + "switch:\n  - {at_stp: 2, parallel: {dp: 1}}\n", 1,
     {"s.yaml:4:6: switch[0]: unknown key 'at_stp' in a switch: entry; did you mean 'at_step'?",
      "its keys are at_step, world, parallel, directives", "s.yaml:4:5: switch[0]: at_step is missing"}},
    {"ParallelKeyOutsideParallel", kTrain + "switch:\n  - {at_step: 2, dp: 1}\n", 1,
     {"s.yaml:4:18: switch[0]: 'dp' is a key of parallel:; write it inside it (parallel: {dp: ...})"}},
    {"LeaveInTheSchedule", kTrain + "switch:\n  - at_step: 2\n    leave: [3]\n", 1,
     {"s.yaml:5:5: switch[0]: leave names the ranks that leave when the job runs",
      "belongs in the switch file (train.switch_file)", "a switch: entry shrinks the job with world: (e.g. world: 2)"}},
    {"DuplicateEntryKey", kTrain + "switch:\n  - at_step: 2\n    at_step: 3\n", 1,
     {"s.yaml:5:5: duplicate key 'switch[0].at_step' (first at s.yaml:4:5)"}},
    {"AtStepNotAnInteger", kTrain + "switch:\n  - {at_step: soon}\n", 1,
     {"s.yaml:4:15: switch[0].at_step: expected an integer, found 'soon'"}},
    {"WorldNotAnInteger", kTrain + "switch:\n  - {at_step: 2, world: [2]}\n", 1,
     {"s.yaml:4:25: switch[0].world: expected an integer, found a list"}},
    // the parallel section inside an entry: the section's reader and names
    {"BadParallelValue", kTrain + "switch:\n  - at_step: 2\n    parallel: {dp: two}\n", 1,
     {"s.yaml:5:20: switch[0].parallel.dp: expected an integer, found 'two'"}},
    {"UnknownParallelKey", kTrain + "switch:\n  - at_step: 2\n    parallel: {schedul: gpipe}\n", 1,
     {"s.yaml:5:16: unknown key 'switch[0].parallel.schedul'; did you mean 'schedule'?"}},
    {"TrainKeyInParallel", kTrain + "switch:\n  - at_step: 2\n    parallel: {steps: 3}\n", 1,
     {"s.yaml:5:16: unknown key 'switch[0].parallel.steps'", "valid keys of 'parallel' are dp, tp, pp"}},
    {"ParallelNotAMap", kTrain + "switch:\n  - at_step: 2\n    parallel: 2\n", 1,
     {"s.yaml:5:15: section 'switch[0].parallel': expected a map of keys (dp, tp, pp", "found '2'"}},
    {"DuplicateParallelKey", kTrain + "switch:\n  - at_step: 2\n    parallel: {dp: 1, dp: 2}\n", 1,
     {"s.yaml:5:23: duplicate key 'switch[0].parallel.dp' (first at s.yaml:5:16)"}},
    // directives inside an entry: the directives' reader and names
    {"UnknownDirective", kTrain + "switch:\n  - at_step: 2\n    directives:\n      - spilt: {microbatches: 2}\n", 1,
     {"s.yaml:6:9: switch[0].directives[0]: unknown directive 'spilt'; did you mean 'split'?"}},
    {"BadDirectiveValue", kTrain + "switch:\n  - at_step: 2\n    directives:\n      - split: {microbatches: x}\n", 1,
     {"s.yaml:6:31: switch[0].directives[0].split.microbatches: expected an integer, found 'x'"}},
    {"DirectivesNotAList", kTrain + "switch:\n  - at_step: 2\n    directives: {split: 2}\n", 1,
     {"s.yaml:5:17: switch[0].directives: expected a list of directives"}},
    // steps: in the run, in order
    {"AtStepZero", kTrain + "switch:\n  - {at_step: 0, parallel: {}}\n", 1,
     {"s.yaml:4:6: switch[0].at_step=0: must be at least 1 and less than train.steps=10 (at s.yaml:2:3)",
      "steps 0..at_step-1 run before the switch"}},
    {"AtStepAtTheEnd", kTrain + "switch:\n  - {at_step: 10, parallel: {}}\n", 1,
     {"s.yaml:4:6: switch[0].at_step=10: must be at least 1 and less than train.steps=10"}},
    {"AtStepPastAnOverride", kTrain + "switch:\n  - {at_step: 6, parallel: {}}\n", 1,
     {"s.yaml:4:6: switch[0].at_step=6: must be at least 1 and less than train.steps=5 (from --set)"},
     {"train.steps=5"}},
    {"AtStepOutOfOrder", kTrain + "switch:\n  - {at_step: 5, parallel: {}}\n  - {at_step: 3, parallel: {}}\n", 1,
     {"s.yaml:5:6: switch[1].at_step=3: must be above switch[0].at_step=5; list the entries in step order"}},
    {"AtStepTwice", kTrain + "switch:\n  - {at_step: 5, parallel: {}}\n  - {at_step: 5, parallel: {}}\n", 1,
     {"s.yaml:5:6: switch[1].at_step=5: must be above switch[0].at_step=5", "one switch per step"}},
    {"WorldZero", kTrain + "switch:\n  - {at_step: 2, world: 0, parallel: {}}\n", 1,
     {"s.yaml:4:18: switch[0].world=0: must be at least 1 (the ranks of the new strategy)"}},
    {"NoStrategyNoTuner", kTrain + "switch:\n  - {at_step: 2, parallel: {}}\n  - {at_step: 4, world: 2}\n", 1,
     {"s.yaml:5:5: switch[1] has no strategy, so the tuner chooses one; set train.switch_hardware or "
      "train.switch_cost"}},
    // the train keys
    {"BufferZero", "train:\n  switch_buffer_mb: 0\n", 1, {"s.yaml:2:3: train.switch_buffer_mb=0.0: must be > 0"}},
    {"StandbyNegative", "train:\n  standby: -1\n", 1, {"s.yaml:2:3: train.standby=-1: must be at least 0"}},
    {"TuneBudgetZero", "", 1, {"--set train.switch_tune_s=0.0: must be > 0"}, {"train.switch_tune_s=0"}},
    {"HardwareAndCost", "train:\n  switch_hardware: h100-sxm\n  switch_cost: costs.json\n", 1,
     {"s.yaml:3:3: train.switch_cost=\"costs.json\": give train.switch_hardware or train.switch_cost, not both",
      "train.switch_hardware=\"h100-sxm\" (at s.yaml:2:3)"}},
    {"SetIntoTheList", "", 1, {"--set switch.at_step=3: the switch section is a list; write it in the config file"},
     {"switch.at_step=3"}},
    {"DuplicateSection", kTrain + "switch: []\nswitch: []\n", 1, {"s.yaml:4:1: duplicate section 'switch'"}},
    {"SectionTypo", "swtich: []\n", 1, {"s.yaml:1:1: unknown section 'swtich'; did you mean 'switch'?"}},
};

class BadSwitch : public testing::TestWithParam<BadCase> {};

TEST_P(BadSwitch, ThrowsANamedMessage) {
  const BadCase& b = GetParam();
  expect_contains(message_of(b.yaml, b.world, b.sets), b.needs);
}

INSTANTIATE_TEST_SUITE_P(Table, BadSwitch, testing::ValuesIn(kBad),
                         [](const testing::TestParamInfo<BadCase>& i) { return std::string(i.param.name); });

TEST(Switch, ValidateDoesNotCheckTheEntriesStrategies) {
  // switch[0] runs dp 3 x tp 1 x pp 1 = 3 ranks and would not split the batch: validate_switch's to
  // say, at the world it runs at; validate() checks the main strategy at the active world only.
  const Config c = parse(kTrain + "switch:\n  - {at_step: 2, parallel: {dp: 3}}\n", "s.yaml");
  EXPECT_NO_THROW(validate(c, 1));
  EXPECT_THROW(validate_switch(c, c.switches[0], 3), ConfigError);
}

TEST(Switch, EveryProblemIsReported) {
  const std::string m = message_of(kTrain +
                                       "switch:\n"
                                       "  - {at_step: 0, parallel: {}}\n"
                                       "  - {at_step: 3, world: 0, parallel: {}}\n"
                                       "  - {at_step: 4}\n",
                                   1);
  EXPECT_NE(m.find("s.yaml:4:6: switch[0].at_step=0: must be at least 1"), std::string::npos) << m;
  EXPECT_NE(m.find("s.yaml:5:18: switch[1].world=0: must be at least 1"), std::string::npos) << m;
  EXPECT_NE(m.find("s.yaml:6:5: switch[2] has no strategy"), std::string::npos) << m;
}

}  // namespace
}  // namespace piper::config
