// test_schedule_rules.cpp — the rules the IR owns (schedule names and requirements, hand-written
// orders, stage filters and the stages of a placement) reported on a config by ir::validate, once, at the file
// position of the key they concern; config::validate does not restate them.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "unit/test_configs.hpp"
#include "ir/filter.hpp"
#include "ir/model_graph.hpp"
#include "ir/pipeline_schedules.hpp"
#include "ir/strategy.hpp"
#include "ir/validate.hpp"

namespace piper::ir {
namespace {

const std::string& kModel = testing::kSmallModelYaml;  // lines 1..8

struct RuleCase {
  const char* name;
  std::string yaml;                // after kModel; a section written here starts on line 9
  int world;
  std::vector<std::string> needs;  // substrings of ir::validate's message
};

std::ostream& operator<<(std::ostream& os, const RuleCase& c) { return os << c.name; }

const std::vector<RuleCase> kRules = {
    // the named schedule
    {"UnknownSchedule", "parallel:\n  schedule: 1f1d\n", 1,
     {"d.yaml:10:3: parallel.schedule=\"1f1d\": unknown schedule", "did you mean '1f1b'?"}},
    {"UnknownScheduleByDirective", "directives:\n  - order: {schedule: 1f1d}\n", 1,
     {"d.yaml:10:13: directives[0].order.schedule=\"1f1d\": unknown schedule", "did you mean '1f1b'?"}},
    {"VirtualStagesOnlyInterleaved", "parallel:\n  virtual_stages: 2\n", 1,
     {"d.yaml:10:3: parallel.virtual_stages=2: 1f1b holds one model chunk per rank: virtual_stages must be 1 (got 2)"}},
    {"VirtualStagesByDirective", "directives:\n  - place: {virtual_stages: 2}\n", 1,
     {"d.yaml:10:13: directives[0].place.virtual_stages=2: 1f1b holds one model chunk per rank"}},
    {"InterleavedNeedsVirtualStages", "parallel:\n  schedule: interleaved\n", 1,
     {"parallel.virtual_stages=1", "interleaved needs virtual_stages >= 2 model chunks per rank (got 1)",
      "parallel.schedule=\"interleaved\" (at d.yaml:10:3)"}},
    {"DualpipevChunks", "parallel:\n  schedule: dualpipev\n  virtual_stages: 3\n", 1,
     {"d.yaml:11:3: parallel.virtual_stages=3: dualpipev holds exactly 2 model chunks per rank"}},
    {"InterleavedMicrobatches",
     "parallel:\n  pp: 2\n  schedule: interleaved\n  virtual_stages: 2\n  microbatches: 1\n", 2,
     {"d.yaml:13:3: parallel.microbatches=1: interleaved needs microbatches divisible by pipeline ranks "
      "(got 1 microbatches for 2 ranks)"}},
    {"DualpipevMicrobatches", "parallel:\n  pp: 2\n  schedule: dualpipev\n  microbatches: 2\n", 2,
     {"d.yaml:12:3: parallel.microbatches=2: dualpipev needs microbatches >= 2 x pipeline ranks"}},
    // the stages a placement gives against pp x chunks
    {"StageCount", "directives:\n  - place: {pp: 2, stages: [{blocks: 0}, {blocks: 1}, {blocks: \"2-4\"}]}\n", 2,
     {"d.yaml:10:20: directives[0].place.stages: lists 3 stages, but pp x chunks per rank = 2 x 1 = 2 stages",
      "directives[0].place.pp=2 (at d.yaml:10:13)"}},
    {"StageOfUnitCount", "directives:\n  - place: {pp: 3, stage_of_unit: [0, 0, 0, 1, 1, 1, 1]}\n", 3,
     {"d.yaml:10:20: directives[0].place.stage_of_unit: lists 2 stages, but pp x chunks per rank = 3 x 1 = 3"}},
    // hand-written orders against the strategy
    {"OrderRankCount", "directives:\n  - place: {pp: 2}\n  - order: {ranks: [[F0, B0]]}\n", 2,
     {"d.yaml:11:13", "directives[1].order.ranks: lists the ops of 1 rank(s), but there are 2 pipeline ranks",
      "directives[0].place.pp=2"}},
    {"OrderNoSuchMicrobatch",
     "directives:\n  - split: {microbatches: 4}\n  - place: {pp: 2}\n"
     "  - order: {ranks: [[F0, F1, B0, F2, B1, F9, B2, B3], [F0, B0, F1, B1, F2, B2, F3, B3]]}\n",
     2,
     {"d.yaml:12:42", "directives[2].order.ranks[0][5]: rank 0 runs F9, but there are 4 microbatches (0..3",
      "directives[0].split.microbatches=4 (at d.yaml:10:13)"}},
    {"OrderNoSuchChunk", "directives:\n  - place: {pp: 2}\n  - order: {ranks: [[F0, B0], [F0, F0.1, B0]]}\n", 2,
     {"d.yaml:11:36", "directives[1].order.ranks[1][1]: rank 1 runs F0.1, but each rank holds 1 model chunk(s)"}},
    {"OrderDuplicate",
     "directives:\n  - split: {microbatches: 2}\n  - place: {pp: 2}\n"
     "  - order: {ranks: [[F0, F1, B0, B1], [F0, B0, F1, B1, B0]]}\n",
     2,
     {"d.yaml:12:56", "directives[2].order.ranks[1][4]: rank 1 runs B0 twice",
      "first as d.yaml:12:44: directives[2].order.ranks[1][1]", "each op runs once per step"}},
    {"OrderMixedBackwards", "directives:\n  - place: {pp: 2}\n  - order: {ranks: [[F0, B0], [F0, BI0, BW0]]}\n", 2,
     {"d.yaml:11:36", "rank 1 runs BI0", "d.yaml:11:26: directives[1].order.ranks[0][1] is a fused backward"}},
    {"OrderFusedButSplit",
     "directives:\n  - split_backward: true\n  - place: {pp: 2}\n  - order: {ranks: [[F0, B0], [F0, B0]]}\n", 2,
     {"d.yaml:12:26", "rank 0 runs B0, a fused backward", "directives[0].split_backward=true", "write BI0 and BW0"}},
    {"OrderEmptyRank", "directives:\n  - place: {pp: 2}\n  - order: {ranks: [[F0, B0], []]}\n", 2,
     {"d.yaml:11:31", "directives[1].order.ranks[1]: rank 1 has no ops"}},
};

// What ir::validate reports for the case's config, which config's own rules accept.
std::string ir_problem(const RuleCase& c) {
  const config::Config cfg = config::parse(kModel + c.yaml, "d.yaml");
  EXPECT_NO_THROW(config::validate(cfg, c.world)) << "config restates a rule of the IR";
  try {
    ir::validate(cfg, c.world);
  } catch (const config::ConfigError& e) {
    return e.what();
  }
  return {};
}

class IrRules : public ::testing::TestWithParam<RuleCase> {};

// The config's own rules accept it; the IR's report it once, at the file position of its key.
TEST_P(IrRules, ReportedOnceByTheOwnerAtTheFilePosition) {
  const RuleCase& c = GetParam();
  const std::string message = ir_problem(c);
  std::printf("[ ir rule ] %s: %s\n", c.name, message.c_str());
  ASSERT_FALSE(message.empty()) << "no ConfigError";
  // One problem, one line, naming a file position.
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_NE(message.find("d.yaml:"), std::string::npos) << message;
  for (const std::string& s : c.needs) EXPECT_NE(message.find(s), std::string::npos) << "missing '" << s << "' in:\n" << message;
}

INSTANTIATE_TEST_SUITE_P(Table, IrRules, ::testing::ValuesIn(kRules),
                         [](const ::testing::TestParamInfo<RuleCase>& i) { return std::string(i.param.name); });

// The schedule names a message lists are the IR's own list, and the line is the key's.
TEST(IrRules, UnknownScheduleListsTheNamesTheIrKnows) {
  std::string known;
  for (const std::string& n : schedule_names()) known += (known.empty() ? "" : ", ") + n;
  ASSERT_EQ(schedule_names().size(), 5u);
  const std::string text = kModel + "parallel:\n  dp: 1\n  schedule: gpipee\n";  // schedule on line 11
  const config::Config cfg = config::parse(text, "s.yaml");
  std::string message;
  try {
    ir::validate(cfg, 1);
  } catch (const config::ConfigError& e) {
    message = e.what();
  }
  std::printf("[ ir rule ] %s\n", message.c_str());
  EXPECT_EQ(message.rfind("s.yaml:11:3: parallel.schedule=\"gpipee\": unknown schedule; expected one of " + known, 0), 0u)
      << message;
  EXPECT_NE(message.find("did you mean 'gpipe'?"), std::string::npos) << message;
  for (const std::string& n : schedule_names()) EXPECT_NO_THROW(parse_schedule(n)) << n;
  for (size_t k = 0; k < schedule_names().size(); ++k)
    EXPECT_EQ(schedule_name(static_cast<ScheduleKind>(k)), schedule_names()[k]);
}

// The config's own problems come first, all of them; the IR's rules run on values that passed them.
TEST(IrRules, ConfigProblemsFirst) {
  const config::Config cfg = config::parse(kModel + "parallel:\n  schedule: 1f1d\n  zero: 7\n", "d.yaml");
  try {
    ir::validate(cfg, 1);
    ADD_FAILURE() << "accepted";
  } catch (const config::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("d.yaml:11:3: parallel.zero=7: must be 0, 1, 2 or 3"), std::string::npos) << m;
    EXPECT_EQ(m.find("unknown schedule"), std::string::npos) << m;
  }
}

// Every schedule, with values its rules accept, passes.
TEST(IrRules, ValidStrategiesPass) {
  for (const std::string& yaml :
       {std::string("parallel:\n  pp: 2\n  schedule: interleaved\n  virtual_stages: 2\n  microbatches: 4\n"),
        std::string("parallel:\n  pp: 2\n  schedule: dualpipev\n  microbatches: 4\n"),
        std::string("parallel:\n  pp: 2\n  schedule: zbh1\n  microbatches: 2\n"),
        std::string("directives:\n  - place: {pp: 2, stages: [{blocks: \"0-1\"}, {blocks: \"2-4\"}]}\n"
                    "  - order: {ranks: [[F0, B0], [F0, B0]]}\n")}) {
    const config::Config cfg = config::parse(kModel + yaml, "ok.yaml");
    EXPECT_NO_THROW(ir::validate(cfg, 2)) << yaml;
  }
}

// ---- placement: stage filters resolved over the units, stages along the model ------------------

TEST(Placement, StageFiltersSelectUnitsByTags) {
  auto stages = [&](const std::string& place, const std::string& pattern = "M*-M-") {
    std::string model = kModel;
    model.replace(model.find("M*-M-"), 5, pattern);
    const config::Config c = config::parse(model + "directives:\n  - place: " + place + "\n", "d.yaml");
    const std::vector<int> st = expand(c, 1).place.stage_of_unit;
    return std::vector<int64_t>(st.begin(), st.end());
  };
  // embed goes with the first stage, head with the last.
  EXPECT_EQ(stages("{pp: 2, stages: [{blocks: \"0-1\"}, {blocks: \"2-4\"}]}"),
            (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 1}));
  // A single index, a list, and a list of ranges.
  EXPECT_EQ(stages("{pp: 3, stages: [{blocks: 0}, {blocks: [1, 2]}, {blocks: [\"3-3\", 4]}]}"),
            (std::vector<int64_t>{0, 0, 1, 1, 2, 2, 2}));
  // embed and head named on stages of their own.
  EXPECT_EQ(stages("{pp: 3, stages: [{kind: embed}, {blocks: \"0-4\"}, {kind: head}]}"),
            (std::vector<int64_t>{0, 1, 1, 1, 1, 1, 2}));
  // kind with blocks: both filters must match; kind lists.
  EXPECT_EQ(stages("{pp: 2, stages: [{blocks: \"0-2\", kind: [M, \"*\", \"-\"]}, "
                   "{blocks: \"3-4\", kind: [M, \"-\", head]}]}"),
            (std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1}));
  // Block filters never select embed or head: "MM**" with the head named.
  EXPECT_EQ(stages("{pp: 2, stages: [{kind: M}, {kind: [\"*\", head]}]}", "MM**"),
            (std::vector<int64_t>{0, 0, 0, 1, 1, 1}));
  // Block-style YAML, with the stages one per line.
  const config::Config c = config::parse(kModel +
                       "directives:\n"
                       "  - place:\n"
                       "      pp: 2\n"
                       "      stages:\n"
                       "        - blocks: \"0-2\"\n"
                       "        - blocks: [3, 4]\n",
                   "d.yaml");
  const auto& f = *c.directives.list[0].stages;
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].blocks, (std::vector<std::pair<int64_t, int64_t>>{{0, 2}}));
  EXPECT_EQ(f[1].blocks, (std::vector<std::pair<int64_t, int64_t>>{{3, 3}, {4, 4}}));
  EXPECT_TRUE(f[1].kinds.empty());
  EXPECT_EQ(c.locations.at("directives[0].place.stages[1]"), "d.yaml:14:11");
  EXPECT_NO_THROW(ir::validate(c, 2));
}

const std::vector<RuleCase> kPlacement = {
    {"UnitOnNoStage", "directives:\n  - place: {pp: 2, stages: [{blocks: \"0-2\"}, {blocks: \"3-4\", kind: \"*\"}]}\n",
     2,
     {"d.yaml:10:46: directives[0].place.stages[1]: the filter (block 3-4, kind '*') selects no unit: no unit of the pattern \"M*-M-\" passes all of its keys",
      "d.yaml:10:20: directives[0].place.stages: unit layers.3 (block 3, 'M') is on no stage",
      "unit layers.4 (block 4, '-') is on no stage", "every unit must be on exactly one"}},
    {"UnitOnTwoStages", "directives:\n  - place: {pp: 2, stages: [{blocks: \"0-2\"}, {blocks: \"2-4\"}]}\n", 2,
     {"d.yaml:10:46", "directives[0].place.stages[1]", "unit layers.2 (block 2, '-') is already on stage 0",
      "(d.yaml:10:29: directives[0].place.stages[0])", "a unit belongs to one stage"}},
    {"StagesNotContiguous", "directives:\n  - place: {pp: 2, stages: [{blocks: [0, 1, 4]}, {blocks: \"2-3\"}]}\n", 2,
     {"d.yaml:10:29", "directives[0].place.stages[0]", "unit layers.4 (block 4, '-') is on stage 0 but comes after "
                                                        "layers.3 on stage 1", "contiguous"}},
    {"HeadBeforeLastStage", "directives:\n  - place: {pp: 2, stages: [{kind: head}, {blocks: \"0-4\"}]}\n", 2,
     {"d.yaml:10:29: directives[0].place.stages[0]: unit head is on stage 0 but comes after layers.4 on stage 1"}},
    {"NonexistentBlock", "directives:\n  - place: {pp: 2, stages: [{blocks: \"0-1\"}, {blocks: \"2-9\"}]}\n", 2,
     {"d.yaml:10:46", "directives[0].place.stages[1]", "block 9 does not exist", "blocks 0..4"}},
    {"StageOfUnitLength", "directives:\n  - place: {pp: 2, stage_of_unit: [0, 0, 1, 1]}\n", 2,
     {"d.yaml:10:20", "directives[0].place.stage_of_unit", "lists 4 stages, one per unit", "the model has 7 units"}},
    {"StageOfUnitGap", "directives:\n  - place: {pp: 3, stage_of_unit: [0, 0, 0, 2, 2, 2, 2]}\n", 3,
     {"d.yaml:10:20", "unit layers.2 (block 2, '-') is on stage 2 right after layers.1 on stage 0",
      "stage 1 holds no unit"}},
};

// ---- filters of split_backward and replicate: resolved after placement, over the units ----------

const std::vector<RuleCase> kFilters = {
    {"KindTheModelHasNot", "directives:\n  - split_backward: {kind: E}\n", 1,
     {"d.yaml:10:22: directives[0].split_backward.filter: kind 'E' selects no unit: the pattern \"M*-M-\" has no "
      "moe block"}},
    {"UnitThatDoesNotExist", "directives:\n  - replicate: {dp: 2}\n  - replicate: {shard_optimizer: true, unit: layers.9}\n",
     2,
     {"d.yaml:11:40: directives[1].replicate.filter: unit 'layers.9' does not exist; the units are 0..6 (embed, "
      "layers.0 .. layers.4, head"}},
    {"StageThatDoesNotExist", "directives:\n  - place: {pp: 2}\n  - split_backward: {stage: 2}\n", 2,
     {"d.yaml:11:22: directives[1].split_backward.filter: stage 2 does not exist; there are 2 stages (0..1)"}},
    {"BlockThatDoesNotExist", "directives:\n  - split_backward: {blocks: \"3-5\"}\n", 1,
     {"d.yaml:10:22: directives[0].split_backward.filter: block 5 does not exist; the pattern \"M*-M-\" has blocks "
      "0..4"}},
    {"KeysThatSelectNoUnitTogether", "directives:\n  - split_backward: {blocks: 0, kind: \"*\"}\n", 1,
     {"d.yaml:10:22: directives[0].split_backward.filter: the filter (block 0, kind '*') selects no unit"}},
};

class FilterRules : public ::testing::TestWithParam<RuleCase> {};

TEST_P(FilterRules, ReportedAtTheFilter) {
  const RuleCase& c = GetParam();
  const std::string message = ir_problem(c);
  std::printf("[ filter ] %s:\n%s\n", c.name, message.c_str());
  ASSERT_FALSE(message.empty()) << "no ConfigError";
  for (const std::string& s : c.needs) EXPECT_NE(message.find(s), std::string::npos) << "missing '" << s << "' in:\n" << message;
}

INSTANTIATE_TEST_SUITE_P(Table, FilterRules, ::testing::ValuesIn(kFilters),
                         [](const ::testing::TestParamInfo<RuleCase>& i) { return std::string(i.param.name); });

// A stage filter sees the stages the placement gives, balanced ones too.
TEST(Filters, SelectUnitsAfterPlacement) {
  const config::Config c = config::parse(kModel +
                                             "directives:\n"
                                             "  - place: {pp: 2, stages: [{blocks: \"0-1\"}, {blocks: \"2-4\"}]}\n"
                                             "  - split_backward: {stage: 1}\n"
                                             "  - split_backward: {unit: [0, layers.0]}\n"
                                             "  - replicate: {dp: 2, shard_optimizer: true}\n"
                                             "  - replicate: {shard_grads: true, shard_params: true, kind: [embed, head]}\n"
                                             "  - replicate: {shard_optimizer: false, stage: 0, kind: \"*\"}\n",
                                         "d.yaml");
  ASSERT_NO_THROW(ir::validate(c, 4));
  const Strategy s = expand(c, 4);
  EXPECT_EQ(s.place.stage_of_unit, (std::vector<int>{0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(s.split_backward_of_unit, (std::vector<bool>{true, true, false, true, true, true, true}));
  EXPECT_EQ(s.replicate.zero_of_unit, (std::vector<int>{3, 1, 0, 1, 1, 1, 3}));
  // Without a place directive the stages are balanced, and a stage filter selects by them.
  const config::Config b = config::parse(kModel + "directives:\n  - place: {pp: 2}\n  - split_backward: {stage: 0}\n",
                                         "d.yaml");
  const Strategy t = expand(b, 2);
  ASSERT_EQ(t.place.stage_of_unit.size(), 7u);
  for (size_t u = 0; u < 7; ++u) EXPECT_EQ(t.split_backward(static_cast<int>(u)), t.place.stage_of_unit[u] == 0) << u;
}

// On a node's tags the microbatch and pass keys count too; on a unit they take no part.
TEST(Filters, NodesMatchMicrobatchAndPass) {
  const ModelGraph mg = make_model_graph(config::parse(kModel, "d.yaml").model);  // embed, M * - M -, head
  config::Filter f;
  f.kinds = {"*"};
  f.microbatches = {{1, 2}};
  f.passes = {"BI", "BW"};
  Tags t;
  t.unit = 2, t.stage = 0, t.microbatch = 1, t.pass = Pass::PASS_BW;
  EXPECT_TRUE(selects(f, t, mg));
  t.microbatch = 0;
  EXPECT_FALSE(selects(f, t, mg)) << "microbatch 0 is outside 1-2";
  t.microbatch = 2, t.pass = Pass::PASS_F;
  EXPECT_FALSE(selects(f, t, mg)) << "a forward";
  t.pass = Pass::PASS_BI, t.unit = 1;
  EXPECT_FALSE(selects(f, t, mg)) << "layers.0 is a Mamba-2 block";
  t.unit = -1;
  EXPECT_FALSE(selects(f, t, mg)) << "a node of no unit";
  EXPECT_TRUE(selects(f, mg.units[2], 0)) << "a unit passes the unit keys";
  config::Filter by_name;
  by_name.units = {"head", "1"};
  EXPECT_EQ(selected_units(by_name, mg, {}), (std::vector<int>{1, 6}));
}

// zbh1 and dualpipev split every backward unless a filter splits some: the rest stay fused.
TEST(Filters, ZeroBubbleSchedulesKeepAFilteredSplit) {
  const config::Config all = config::parse(kModel + "parallel:\n  pp: 2\n  schedule: zbh1\n  microbatches: 2\n", "d.yaml");
  EXPECT_EQ(expand(all, 2).split_backward_of_unit, std::vector<bool>(7, true));
  const config::Config some = config::parse(
      kModel + "parallel:\n  pp: 2\n  schedule: zbh1\n  microbatches: 2\ndirectives:\n  - split_backward: {kind: \"*\"}\n",
      "d.yaml");
  ASSERT_NO_THROW(ir::validate(some, 2));
  EXPECT_EQ(expand(some, 2).split_backward_of_unit, (std::vector<bool>{false, false, true, false, false, false, false}));
}

class PlacementRules : public ::testing::TestWithParam<RuleCase> {};

// The config's own rules accept it; the IR's placement rules report every problem at the filter or
// list it concerns.
TEST_P(PlacementRules, ReportedByTheOwnerAtTheFilePosition) {
  const RuleCase& c = GetParam();
  const std::string message = ir_problem(c);
  std::printf("[ placement ] %s:\n%s\n", c.name, message.c_str());
  ASSERT_FALSE(message.empty()) << "no ConfigError";
  EXPECT_EQ(message.rfind("d.yaml:", 0), 0u) << message;
  for (const std::string& s : c.needs) EXPECT_NE(message.find(s), std::string::npos) << "missing '" << s << "' in:\n" << message;
}

INSTANTIATE_TEST_SUITE_P(Table, PlacementRules, ::testing::ValuesIn(kPlacement),
                         [](const ::testing::TestParamInfo<RuleCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace piper::ir
