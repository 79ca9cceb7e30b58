// test_directives.cpp — the `directives:` section: parsing of each directive, stage filters, hand-written
// orders, how directives override the `parallel:` shorthand, YAML round trips, and errors with file:line:col.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.hpp"
#include "unit/test_configs.hpp"

namespace piper::config {
namespace {

const std::string& kModel = testing::kSmallModelYaml;  // lines 1..8

std::string message_of(const std::string& yaml, int world, const std::vector<std::string>& sets = {}) {
  try {
    Config c = parse(yaml, "d.yaml", sets);
    validate(c, world);
    (void)effective_strategy(c);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// ---- parsing -------------------------------------------------------------------

// Every filter key a directive takes, read beside its own keys: single values, lists, ranges,
// unit indices and names, each key at its file position; the subsets the directives give, in order.
TEST(Filters, ReadBesideTheDirectivesKeys) {
  const std::string text = kModel +
                           "directives:\n"                                                                // 9
                           "  - split_backward: {kind: [\"*\", M], blocks: [0, \"2-4\"]}\n"              // 10
                           "  - replicate: {dp: 2}\n"                                                    // 11
                           "  - replicate: {shard_optimizer: true, unit: [0, head, layers.1], stage: \"0-1\"}\n"  // 12
                           "  - place: {pp: 2, stages: [{unit: [embed, 1]}, {blocks: \"1-4\"}]}\n"          // 13
                           "  - split_backward:\n"                                                       // 14
                           "      stage: 1\n";                                                          // 15
  const Config c = parse(text, "d.yaml");
  const auto& d = c.directives.list;
  ASSERT_EQ(d.size(), 5u);
  EXPECT_EQ(d[0].split_backward, true);
  EXPECT_EQ(d[0].filter.kinds, (std::vector<std::string>{"*", "M"}));
  EXPECT_EQ(d[0].filter.blocks, (Filter::Ranges{{0, 0}, {2, 4}}));
  EXPECT_TRUE(d[1].filter.empty());
  EXPECT_EQ(d[2].filter.units, (std::vector<std::string>{"0", "head", "layers.1"}));
  EXPECT_EQ(d[2].filter.stages, (Filter::Ranges{{0, 1}}));
  EXPECT_EQ((*d[3].stages)[0].units, (std::vector<std::string>{"embed", "1"}));
  EXPECT_EQ(d[4].filter.stages, (Filter::Ranges{{1, 1}}));
  EXPECT_EQ(c.locations.at("directives[0].split_backward.filter"), "d.yaml:10:22");
  EXPECT_EQ(c.locations.at("directives[0].split_backward.blocks"), "d.yaml:10:38");
  EXPECT_EQ(c.locations.at("directives[2].replicate.filter"), "d.yaml:12:40");
  EXPECT_EQ(c.locations.at("directives[2].replicate.stage"), "d.yaml:12:67");
  EXPECT_EQ(c.locations.at("directives[3].place.stages[0].unit"), "d.yaml:13:30");
  EXPECT_EQ(c.locations.at("directives[4].split_backward.stage"), "d.yaml:15:7");
  EXPECT_NO_THROW(validate(c, 4));
  // The filtered directives are subsets over the uniform values, which they leave alone.
  const EffectiveStrategy e = effective_strategy(c);
  EXPECT_FALSE(e.parallel.split_backward);
  EXPECT_EQ(e.parallel.zero, 0);
  ASSERT_EQ(e.split_subsets.size(), 2u);
  EXPECT_EQ(e.split_subsets[0].path, "directives[0].split_backward");
  EXPECT_EQ(e.split_subsets[1].filter, d[4].filter);
  ASSERT_EQ(e.zero_subsets.size(), 1u);
  EXPECT_EQ(e.zero_subsets[0].value, 1);
  EXPECT_EQ(e.zero_subsets[0].filter, d[2].filter);
  // The resolved config writes the filters back as they read.
  const Config back = parse(to_yaml(c), "back.yaml");
  EXPECT_TRUE(back.same_settings(c)) << to_yaml(c);
}

// A directive without a filter sets every unit: the subsets before it are dropped.
TEST(Filters, ADirectiveWithoutAFilterDropsTheSubsetsBefore) {
  const Config c = parse(kModel +
                             "directives:\n"
                             "  - split_backward: {kind: \"*\"}\n"
                             "  - replicate: {dp: 2, shard_optimizer: true}\n"
                             "  - replicate: {shard_grads: true, kind: head}\n"
                             "  - split_backward: false\n"
                             "  - replicate: {shard_optimizer: false}\n",
                         "d.yaml");
  const EffectiveStrategy e = effective_strategy(c);
  EXPECT_TRUE(e.split_subsets.empty());
  EXPECT_TRUE(e.zero_subsets.empty());
  EXPECT_EQ(e.parallel.zero, 0);
}

// shard takes ep beside tp; the shorthand's parallel.ep and the directive are one value, named by the directive.
TEST(Directives, ShardTakesExpertParallelism) {
  const std::string text = "model:\n  pattern: \"M-E\"\n  d_model: 64\n  n_experts: 4\n  top_k: 2\n  moe_ffn_hidden: 32\n"
                           "train:\n  global_batch: 8\n"
                           "directives:\n"                       // 9
                           "  - replicate: {dp: 4}\n"            // 10
                           "  - shard: {tp: 1, ep: 2}\n";        // 11
  Config c = parse(text, "d.yaml");
  ASSERT_EQ(c.directives.list.size(), 2u);
  EXPECT_EQ(c.directives.list[1].ep, 2);
  EXPECT_EQ(c.locations.at("directives[1].shard.ep"), "d.yaml:11:20");
  EXPECT_EQ(effective_strategy(c).parallel.ep, 2);
  EXPECT_NO_THROW(validate(c, 4));
  c.directives.list[1].ep = 3;  // does not divide dp 4, nor the 4 experts
  try {
    validate(c, 4);
    ADD_FAILURE() << "ep 3 of dp 4 accepted";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("d.yaml:11:20: directives[1].shard.ep=3: 3 does not divide directives[0].replicate.dp=4"),
              std::string::npos) << m;
    EXPECT_NE(m.find("model.n_experts=4 (at d.yaml:4:3) does not split into 3 equal groups"), std::string::npos) << m;
  }
}

TEST(Directives, ParseEachDirective) {
  const std::string text = kModel +
                           "directives:\n"                                                          // 9
                           "  - split: {microbatches: 4}\n"                                         // 10
                           "  - split_backward: true\n"                                             // 11
                           "  - place: {pp: 2, virtual_stages: 1, stage_of_unit: [0, 0, 0, 1, 1, 1, 1]}\n"  // 12
                           "  - replicate: {dp: 2, shard_optimizer: true, shard_grads: true, bucket_mb: 12.5}\n"  // 13
                           "  - shard: {tp: 1}\n"                                                   // 14
                           "  - order: {schedule: zbh1}\n"                                          // 15
                           "  - grid:\n"                                                            // 16
                           "      order: pp-dp-tp\n";                                               // 17
  Config c = parse(text, "d.yaml");
  ASSERT_TRUE(c.directives.present);
  ASSERT_EQ(c.directives.list.size(), 7u);
  const auto& d = c.directives.list;
  EXPECT_EQ(d[0].kind, DirectiveKind::SPLIT);
  EXPECT_EQ(d[0].microbatches, 4);
  EXPECT_EQ(d[1].kind, DirectiveKind::SPLIT_BACKWARD);
  EXPECT_EQ(d[1].split_backward, true);
  EXPECT_EQ(d[2].kind, DirectiveKind::PLACE);
  EXPECT_EQ(d[2].pp, 2);
  EXPECT_EQ(d[2].virtual_stages, 1);
  EXPECT_EQ(*d[2].stage_of_unit, (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 1}));
  EXPECT_FALSE(d[2].stages.has_value());
  EXPECT_EQ(d[3].dp, 2);
  EXPECT_EQ(d[3].shard_optimizer, true);
  EXPECT_EQ(d[3].shard_grads, true);
  EXPECT_FALSE(d[3].shard_params.has_value());
  EXPECT_EQ(d[3].bucket_mb, 12.5);
  EXPECT_EQ(d[4].tp, 1);
  EXPECT_FALSE(d[4].ep.has_value());
  EXPECT_EQ(d[5].schedule, "zbh1");
  EXPECT_FALSE(d[5].ranks.has_value());
  EXPECT_EQ(d[6].grid_order, "pp-dp-tp");
  EXPECT_STREQ(directive_name(d[6].kind), "grid");
  // Locations: the item, and each key.
  EXPECT_EQ(c.locations.at("directives"), "d.yaml:9:1");
  EXPECT_EQ(c.locations.at("directives[0]"), "d.yaml:10:5");
  EXPECT_EQ(c.locations.at("directives[0].split.microbatches"), "d.yaml:10:13");
  EXPECT_EQ(c.locations.at("directives[3].replicate.bucket_mb"), "d.yaml:13:66");
  EXPECT_EQ(c.locations.at("directives[6].grid.order"), "d.yaml:17:7");
  EXPECT_NO_THROW(validate(c, 4));

  const EffectiveStrategy e = effective_strategy(c);
  EXPECT_EQ(e.parallel.microbatches, 4);
  EXPECT_TRUE(e.parallel.split_backward);
  EXPECT_EQ(e.parallel.pp, 2);
  EXPECT_EQ(e.parallel.dp, 2);
  EXPECT_EQ(e.parallel.zero, 2);
  EXPECT_EQ(e.parallel.bucket_mb, 12.5);
  EXPECT_EQ(e.parallel.schedule, "zbh1");
  EXPECT_EQ(e.parallel.order, "pp-dp-tp");
  EXPECT_EQ(e.stage_of_unit, (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 1}));
  EXPECT_TRUE(e.order_ranks.empty());
}

TEST(Directives, NoSectionMeansShorthandOnly) {
  Config c = parse(kModel + "parallel:\n  microbatches: 2\n", "d.yaml");
  EXPECT_FALSE(c.directives.present);
  EXPECT_TRUE(c.directives.list.empty());
  EXPECT_EQ(c.yaml_text.find("directives"), std::string::npos);
  const EffectiveStrategy e = effective_strategy(c);
  EXPECT_EQ(e.parallel, c.parallel);
  EXPECT_TRUE(e.stage_of_unit.empty());
  EXPECT_TRUE(e.order_ranks.empty());
  // An empty section is present, changes nothing, and round-trips.
  Config empty = parse(kModel + "directives:\n", "d.yaml");
  EXPECT_TRUE(empty.directives.present);
  EXPECT_NE(empty.yaml_text.find("directives: []"), std::string::npos) << empty.yaml_text;
  EXPECT_TRUE(parse(empty.yaml_text, "again").same_settings(empty));
  EXPECT_FALSE(parse(empty.yaml_text, "again").same_settings(c));
}

TEST(Directives, OverrideTheShorthandInOrder) {
  const std::string text = kModel +
                           "parallel:\n"
                           "  dp: 4\n"
                           "  pp: 3\n"
                           "  microbatches: 2\n"
                           "  zero: 1\n"
                           "  bucket_mb: 5\n"
                           "directives:\n"
                           "  - split: {microbatches: 4}\n"
                           "  - place: {pp: 2}\n"
                           "  - split: {microbatches: 1}\n"    // later wins
                           "  - replicate: {dp: 2}\n";         // no shard_* key: zero stays 1
  Config c = parse(text, "d.yaml", {"parallel.dp=8"});        // an override of the shorthand: still overridden
  const EffectiveStrategy e = effective_strategy(c);
  EXPECT_EQ(e.parallel.microbatches, 1);
  EXPECT_EQ(e.parallel.pp, 2);
  EXPECT_EQ(e.parallel.dp, 2);
  EXPECT_EQ(e.parallel.zero, 1);
  EXPECT_EQ(e.parallel.bucket_mb, 5.0);
  EXPECT_EQ(e.parallel.schedule, "1f1b");
  EXPECT_EQ(c.parallel.dp, 8);  // the shorthand itself is untouched
  EXPECT_NO_THROW(validate(c, 4));
}

TEST(Directives, ReplicateFlagsGiveTheZeroStage) {
  struct Row {
    std::string keys;
    int64_t zero;
  };
  for (const Row& r : std::vector<Row>{{"shard_optimizer: false", 0},
                                       {"shard_optimizer: true", 1},
                                       {"shard_grads: true", 2},
                                       {"shard_optimizer: true, shard_grads: true", 2},
                                       {"shard_grads: true, shard_params: true", 3},
                                       {"shard_optimizer: true, shard_grads: true, shard_params: true", 3}}) {
    SCOPED_TRACE(r.keys);
    Config c = parse(kModel + "parallel:\n  zero: 3\ndirectives:\n  - replicate: {dp: 2, " + r.keys + "}\n", "d.yaml");
    EXPECT_EQ(effective_strategy(c).parallel.zero, r.zero);
  }
}

TEST(Directives, HandWrittenOrders) {
  Config c = parse(kModel +
                       "directives:\n"
                       "  - split: {microbatches: 2}\n"
                       "  - place: {pp: 2, virtual_stages: 2}\n"
                       "  - order:\n"
                       "      ranks:\n"
                       "        - [F0.0, F1.0, F0.1, F1.1, BI0.1, BW0.1, BI1.1, BW1.1, BI0, BW0, BI1, BW1]\n"
                       "        - \"F0 F1 F0.1 F1.1 BI0.1 BW0.1 BI1.1 BW1.1 BI0.0 BW0.0 BI1.0 BW1.0\"\n",
                   "d.yaml");
  const auto& ranks = *c.directives.list[2].ranks;
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_EQ(ranks[0].size(), 12u);
  EXPECT_EQ(ranks[0], ranks[1]);  // the list and the string read the same
  EXPECT_EQ(ranks[0][0], (OrderOp{"F", 0, 0}));
  EXPECT_EQ(ranks[0][3], (OrderOp{"F", 1, 1}));
  EXPECT_EQ(ranks[0][4], (OrderOp{"BI", 0, 1}));
  EXPECT_EQ(ranks[0][5], (OrderOp{"BW", 0, 1}));
  EXPECT_EQ(ranks[0][4].name(true), "BI0.1");
  EXPECT_EQ(ranks[0][0].name(false), "F0");
  EXPECT_EQ(c.locations.at("directives[2].order.ranks[0][2]"), "d.yaml:14:24");
  EXPECT_NO_THROW(validate(c, 2));
  const EffectiveStrategy e = effective_strategy(c);
  EXPECT_EQ(e.order_ranks, ranks);
  EXPECT_EQ(e.parallel.virtual_stages, 2);  // any count with a hand-written order
  // A later named schedule replaces the hand-written order.
  Config d = parse(c.yaml_text + "  - order: {schedule: gpipe}\n", "d.yaml");
  EXPECT_TRUE(effective_strategy(d).order_ranks.empty());
}

// Unit ranges, groups, explicit stage ranks and schedule pairs.
TEST(Directives, GroupsUnitRangesPlacementAndPairs) {
  Config c = parse(kModel +
                       "directives:\n"
                       "  - split: {microbatches: 4}\n"
                       "  - place: {pp: 2, ranks: [1, 0]}\n"
                       "  - order:\n"
                       "      ranks:\n"
                       "        - [F0, B0, F1, B1, F2, B2, F3, B3]\n"
                       "        - [F0, F1/0-1, F1/2, [F2, B0/2-3, BI1.1/4], B1, F3, B2, B3]\n",
                   "g.yaml");
  const auto& ranks = *c.directives.list[2].ranks;
  ASSERT_EQ(ranks[1].size(), 10u);
  EXPECT_EQ(ranks[1][1], (OrderOp{"F", 1, 0, 0, 1, false}));
  EXPECT_EQ(ranks[1][2], (OrderOp{"F", 1, 0, 2, 2, false}));
  EXPECT_EQ(ranks[1][3], (OrderOp{"F", 2, 0, -1, -1, false}));  // a group's first op
  EXPECT_EQ(ranks[1][4], (OrderOp{"B", 0, 0, 2, 3, true}));
  EXPECT_EQ(ranks[1][5], (OrderOp{"BI", 1, 1, 4, 4, true}));
  EXPECT_FALSE(ranks[1][6].grouped);
  EXPECT_EQ(ranks[1][4].name(false), "B0/2-3");
  EXPECT_EQ(ranks[1][5].name(true), "BI1.1/4");
  EXPECT_EQ(c.locations.at("directives[2].order.ranks[1][4]"), "g.yaml:15:35");
  EXPECT_EQ(*c.directives.list[1].rank_of_stage, (std::vector<int64_t>{1, 0}));
  const EffectiveStrategy e = effective_strategy(c);
  EXPECT_EQ(e.rank_of_stage, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(e.ranks_path, "directives[1].place.ranks");
  // Written back, groups keep their brackets.
  const Config back = parse(to_yaml(c), "back.yaml");
  EXPECT_EQ(back.directives, c.directives) << to_yaml(c);
  EXPECT_NE(to_yaml(c).find("[F0.0, F1.0/0-1, F1.0/2, [F2.0, B0.0/2-3, BI1.1/4], B1.0, F3.0, B2.0, B3.0]"), std::string::npos)
      << to_yaml(c);
  // pairs: the shorthand and the order directive.
  EXPECT_TRUE(parse(kModel + "parallel:\n  pairs: true\n", "p.yaml").parallel.pairs);
  const Config o = parse(kModel + "directives:\n  - order: {schedule: dualpipev, pairs: true}\n", "o.yaml");
  EXPECT_TRUE(effective_strategy(o).parallel.pairs);
  EXPECT_EQ(effective_strategy(o).positions.shown("parallel.pairs"), "directives[0].order.pairs");
}

TEST(Directives, BadGroupsAndUnitRanges) {
  struct Case {
    std::string order;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"[[F0], B0]", {"d.yaml:10:22: directives[0].order.ranks[0][0]", "a group runs two or more ops", "found a group of 1 op"}},
      {"[F0/3-1, B0]", {"directives[0].order.ranks[0][0]", "the unit range runs backwards; write 1-3"}},
      {"[F0/, B0]", {"names no unit after '/'"}},
      {"[F0/1-, B0]", {"names no last unit after '-'"}},
      {"[[F0, {a: 1}], B0]", {"directives[0].order.ranks[0][0][1]", "expected an op"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.order);
    const std::string m = message_of(kModel + "directives:\n  - order: {ranks: [" + c.order + "]}\n", 1);
    for (const std::string& want : c.expect) EXPECT_NE(m.find(want), std::string::npos) << m;
  }
  const std::string both =
      message_of(kModel + "directives:\n  - order: {pairs: true, ranks: [[F0, B0]]}\n", 1);
  EXPECT_NE(both.find("give pairs or ranks, not both"), std::string::npos) << both;
}

TEST(Directives, RoundTripThroughToYaml) {
  const std::string text = kModel +
                           "directives:\n"
                           "  - split: {microbatches: 4}\n"
                           "  - split_backward: false\n"
                           "  - place: {pp: 2, stages: [{blocks: \"0-1\", kind: [M, \"*\"]}, {blocks: [2, \"3-4\"]}]}\n"
                           "  - replicate: {dp: 1, shard_optimizer: false, bucket_mb: 0.1}\n"
                           "  - shard: {tp: 1}\n"
                           "  - order: {ranks: [[F0, F1, B0, F2, B1, F3, B2, B3], [F0, B0, F1, B1, F2, B2, F3, B3]]}\n"
                           "  - grid: {order: \"tp-dp-pp\"}\n"
                           "  - place: {}\n";
  Config c = parse(text, "d.yaml");
  EXPECT_NE(c.yaml_text.find("directives:\n  - split: {microbatches: 4}\n"), std::string::npos) << c.yaml_text;
  EXPECT_NE(c.yaml_text.find("stages: [{blocks: \"0-1\", kind: [\"M\", \"*\"]}, {blocks: [2, \"3-4\"]}]"),
            std::string::npos)
      << c.yaml_text;
  EXPECT_NE(c.yaml_text.find("ranks: [[F0, F1, B0, F2, B1, F3, B2, B3], [F0, B0, F1"), std::string::npos)
      << c.yaml_text;
  Config back = parse(c.yaml_text, "resolved.yaml");
  EXPECT_TRUE(back.same_settings(c));
  EXPECT_EQ(back.yaml_text, c.yaml_text);
  EXPECT_EQ(effective_strategy(back).stage_filters, effective_strategy(c).stage_filters);
  EXPECT_NO_THROW(validate(back, 2));
  // Changing one directive changes the settings.
  Config other = parse(text + "  - split: {microbatches: 2}\n", "d.yaml");
  EXPECT_FALSE(other.same_settings(c));
}

// ---- errors: each row throws a ConfigError naming the pieces --------------------

struct BadCase {
  const char* name;
  std::string directives;  // appended to kModel (its first line is line 9)
  int world;
  std::vector<std::string> needs;
  std::vector<std::string> sets = {};
};

std::ostream& operator<<(std::ostream& os, const BadCase& b) { return os << b.name; }

const std::vector<BadCase> kBad = {
    // structure
    {"NotAList", "directives: {split: 2}\n", 1, {"d.yaml:9:13", "expected a list of directives", "found a map"}},
    {"UnknownDirective", "directives:\n  - spilt: {microbatches: 2}\n", 1,
     {"d.yaml:10:5", "directives[0]", "unknown directive 'spilt'", "did you mean 'split'?", "directives are split"}},
    {"TwoKeysInOneItem", "directives:\n  - place:\n    pp: 2\n", 1,
     {"d.yaml:10:5", "directives[0]", "one-key map", "a map with 2 keys (place, pp)"}},
    {"ItemNotAMap", "directives:\n  - split\n", 1, {"d.yaml:10:5", "expected one directive", "found 'split'"}},
    {"DirectiveNotAMap", "directives:\n  - shard: 2\n", 1,
     {"d.yaml:10:12", "directives[0].shard", "expected a map of keys (tp, ep)", "found '2'"}},
    {"UnknownKey", "directives:\n  - place: {pp: 1, virtual_stage: 1}\n", 1,
     {"d.yaml:10:20", "directives[0].place", "unknown key 'virtual_stage'", "did you mean 'virtual_stages'?"}},
    {"KeyOfAnotherDirective", "directives:\n  - split: {dp: 2}\n", 1,
     {"d.yaml:10:13", "unknown key 'dp' in directive split", "its keys are microbatches"}},
    {"DuplicateKey", "directives:\n  - split: {microbatches: 2, microbatches: 4}\n", 1,
     {"d.yaml:10:30", "duplicate key 'directives[0].split.microbatches'", "first at d.yaml:10:13"}},
    {"DuplicateSection", "directives:\n  - split: {microbatches: 2}\ndirectives: []\n", 1,
     {"d.yaml:11:1", "duplicate section 'directives'"}},
    {"SetDirectives", "", 1, {"--set directives.split=2", "write it in the config file"}, {"directives.split=2"}},
    // types
    {"NotAnInteger", "directives:\n  - split: {microbatches: four}\n", 1,
     {"d.yaml:10:27", "directives[0].split.microbatches", "expected an integer, found 'four'"}},
    {"NotABool", "directives:\n  - replicate: {shard_grads: maybe}\n", 1,
     {"d.yaml:10:30", "directives[0].replicate.shard_grads", "expected true or false, found 'maybe'"}},
    {"SplitBackwardNotABool", "directives:\n  - split_backward: {on: 1}\n", 1,
     {"d.yaml:10:21", "directives[0].split_backward", "expected true or false, found a map"}},
    {"NotANumber", "directives:\n  - replicate: {bucket_mb: lots}\n", 1,
     {"d.yaml:10:28", "directives[0].replicate.bucket_mb", "expected a number, found 'lots'"}},
    {"StageOfUnitNotAList", "directives:\n  - place: {stage_of_unit: 0}\n", 1,
     {"d.yaml:10:28", "directives[0].place.stage_of_unit", "expected a list of stage numbers", "found '0'"}},
    {"StageOfUnitItem", "directives:\n  - place: {stage_of_unit: [0, x]}\n", 1,
     {"d.yaml:10:32", "directives[0].place.stage_of_unit[1]", "expected an integer, found 'x'"}},
    {"RanksNotAList", "directives:\n  - order: {ranks: 3}\n", 1,
     {"d.yaml:10:20", "directives[0].order.ranks", "ops of each pipeline rank", "found '3'"}},
    {"RankIsAMap", "directives:\n  - order: {ranks: [{a: 1}]}\n", 1,
     {"d.yaml:10:21", "directives[0].order.ranks[0]", "ops of pipeline rank 0", "found a map"}},
    // the op grammar
    {"BadPass", "directives:\n  - order: {ranks: [[F0, X3]]}\n", 1,
     {"d.yaml:10:26", "directives[0].order.ranks[0][1] (rank 0)", "expected an op: F, B, BI or BW", "found 'X3'"}},
    {"NoMicrobatch", "directives:\n  - order: {ranks: [[F0], [B0, F]]}\n", 1,
     {"d.yaml:10:32", "ranks[1][1] (rank 1)", "'F' names no microbatch", "F3, B3, BI3, BW3, F3.1"}},
    {"NoChunk", "directives:\n  - order: {ranks: [[F0.]]}\n", 1, {"d.yaml:10:22", "'F0.' names no chunk"}},
    {"TrailingText", "directives:\n  - order: {ranks: [[F0x]]}\n", 1, {"d.yaml:10:22", "found 'F0x'"}},
    {"OpInAString", "directives:\n  - order: {ranks: [\"F0 B0 W0\"]}\n", 1,
     {"d.yaml:10:21", "directives[0].order.ranks[0][2] (rank 0)", "found 'W0'"}},
    // keys that exclude each other
    {"ScheduleAndRanks", "directives:\n  - order: {schedule: 1f1b, ranks: [[F0, B0]]}\n", 1,
     {"d.yaml:10:29", "directives[0].order: give schedule or ranks, not both"}},
    {"StageOfUnitAndStages", "directives:\n  - place: {stage_of_unit: [0], stages: [{blocks: 0}]}\n", 1,
     {"give stage_of_unit or stages, not both"}},
    {"ShardParamsWithoutGrads", "directives:\n  - replicate: {dp: 2, shard_params: true}\n", 2,
     {"d.yaml:10:24", "directives[0].replicate", "shard_params (ZeRO-3) also shards the gradients",
      "shard_grads: true"}},
    {"ShardGradsWithoutOptimizer", "directives:\n  - replicate: {shard_grads: true, shard_optimizer: false}\n", 2,
     {"d.yaml:10:36", "also shard the optimiser state"}},
    // stage filters
    {"FilterUnknown", "directives:\n  - place: {pp: 2, stages: [{block: 0}, {blocks: \"1-4\"}]}\n", 2,
     {"d.yaml:10:30", "directives[0].place.stages[0]", "unknown filter 'block'", "did you mean 'blocks'?"}},
    {"FilterEmpty", "directives:\n  - place: {pp: 2, stages: [{}, {blocks: \"1-4\"}]}\n", 2,
     {"d.yaml:10:29", "directives[0].place.stages[0]", "expected a filter over the units' tags (unit:, blocks:, kind:)"}},
    {"FilterBadRange", "directives:\n  - place: {pp: 2, stages: [{blocks: \"0-a\"}, {blocks: \"1-4\"}]}\n", 2,
     {"d.yaml:10:38", "directives[0].place.stages[0].blocks", "expected a block index (3), a range (\"3-7\")",
      "found '0-a'"}},
    {"FilterBackwardRange", "directives:\n  - place: {pp: 2, stages: [{blocks: \"2-0\"}, {blocks: \"3-4\"}]}\n", 2,
     {"d.yaml:10:38", "runs backwards; write 0-2"}},
    {"FilterBadKind", "directives:\n  - place: {pp: 2, stages: [{kind: X}, {blocks: \"1-4\"}]}\n", 2,
     {"d.yaml:10:36", "directives[0].place.stages[0].kind", "expected a block kind", "found 'X'"}},
    // values checked against each other, named by the directive that set them
    {"WorldSize", "directives:\n  - replicate: {dp: 2}\n  - place: {pp: 2}\n", 2,
     {"world size 2 != dp(2) x tp(1) x pp(2) = 4", "directives[0].replicate.dp=2 (at d.yaml:10:17)",
      "directives[1].place.pp=2 (at d.yaml:11:13)", "parallel.tp=1 (default)"}},
    {"BatchSplit", "directives:\n  - split: {microbatches: 3}\n", 1,
     {"d.yaml:8:3: train.global_batch=8", "not divisible by dp x microbatches = 1 x 3 = 3",
      "directives[0].split.microbatches=3 (at d.yaml:10:13)"}},
    {"MicrobatchesAtLeastOne", "directives:\n  - split: {microbatches: 0}\n", 1,
     {"d.yaml:10:13: directives[0].split.microbatches=0: must be at least 1"}},
    {"ZeroWithoutDp", "directives:\n  - replicate: {shard_optimizer: true}\n", 1,
     {"d.yaml:10:17: directives[0].replicate.zero=1: ZeRO shards over data-parallel ranks"}},
    // filters
    {"DpWithFilter", "directives:\n  - replicate: {dp: 2, kind: M}\n", 2,
     {"d.yaml:10:17: directives[0].replicate.dp: dp applies to the whole model",
      "uniform over it, so they take no filter (kind at d.yaml:10:24)"}},
    {"MicrobatchesWithFilter", "directives:\n  - split: {microbatches: 2, blocks: 1}\n", 1,
     {"d.yaml:10:13: directives[0].split.microbatches: microbatches applies to the whole model"}},
    {"ScheduleWithFilter", "directives:\n  - order: {schedule: zbh1, unit: embed}\n", 1,
     {"d.yaml:10:13: directives[0].order.schedule: schedule applies to the whole model"}},
    {"BucketWithFilter", "directives:\n  - replicate: {bucket_mb: 4, shard_optimizer: true, kind: head}\n", 2,
     {"d.yaml:10:17: directives[0].replicate.bucket_mb: bucket_mb applies to the whole model"}},
    {"MicrobatchOnReplicate", "directives:\n  - replicate: {shard_optimizer: true, microbatch: 0}\n", 2,
     {"d.yaml:10:40: directives[0].replicate.microbatch: the filter of replicate takes stage, unit, blocks, kind, "
      "not microbatch (microbatch and pass select passes; replicate acts on units)"}},
    {"PassOnSplitBackward", "directives:\n  - split_backward: {pass: BW}\n", 1,
     {"d.yaml:10:22: directives[0].split_backward.pass: the filter of split_backward takes stage, unit, blocks, kind"}},
    {"FilterOnAHandWrittenOrder", "directives:\n  - order: {ranks: [[F0, B0]], kind: M}\n", 1,
     {"d.yaml:10:32: directives[0].order.kind: order takes no filter"}},
    {"StageInAStageFilter", "directives:\n  - place: {pp: 2, stages: [{stage: 0}, {blocks: \"0-4\"}]}\n", 2,
     {"d.yaml:10:30: directives[0].place.stages[0].stage: the filter of a stage takes unit, blocks, kind, not stage"}},
    {"ReplicateFilterWithoutZeroKeys", "directives:\n  - replicate: {kind: M}\n", 1,
     {"d.yaml:10:17: directives[0].replicate: a filter selects the units the directive's ZeRO keys apply to"}},
    {"UnknownKeyBesideAFilter", "directives:\n  - split_backward: {kind: M, knd: M}\n", 1,
     {"d.yaml:10:31: directives[0].split_backward: unknown key 'knd'; did you mean 'kind'?",
      "split_backward takes true, false or a filter (stage, unit, blocks, kind)"}},
    {"BackwardsRangeInAFilter", "directives:\n  - split_backward: {blocks: \"4-2\"}\n", 1,
     {"d.yaml:10:30: directives[0].split_backward.blocks: the range 4-2 runs backwards; write 2-4"}},
    {"BadStageInAFilter", "directives:\n  - split_backward: {stage: first}\n", 1,
     {"d.yaml:10:29: directives[0].split_backward.stage: expected a stage index (3), a range (\"3-7\") or a list "
      "of them, found 'first'"}},
    {"BadKindInAFilter", "directives:\n  - replicate: {shard_optimizer: true, kind: [M, X]}\n", 2,
     {"d.yaml:10:50: directives[0].replicate.kind: expected a block kind M"}},
    {"ZeroSubsetWithoutDp", "directives:\n  - replicate: {shard_optimizer: true, kind: head}\n", 1,
     {"d.yaml:10:40: directives[0].replicate.filter: ZeRO shards over data-parallel ranks and parallel.dp=1 "
      "(default)"}},
};

class BadDirectives : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadDirectives, ThrowsANamedMessage) {
  const BadCase& b = GetParam();
  const std::string message = message_of(kModel + b.directives, b.world, b.sets);
  std::printf("[ directives ] %s:\n%s\n", b.name, message.c_str());
  ASSERT_FALSE(message.empty()) << "no ConfigError";
  for (const std::string& s : b.needs)
    EXPECT_NE(message.find(s), std::string::npos) << "missing '" << s << "' in:\n" << message;
}

INSTANTIATE_TEST_SUITE_P(Table, BadDirectives, ::testing::ValuesIn(kBad),
                         [](const ::testing::TestParamInfo<BadCase>& i) { return std::string(i.param.name); });

TEST(Directives, EveryProblemIsReported) {
  const std::string m = message_of(kModel +
                                       "directives:\n"
                                       "  - split: {microbatches: x}\n"
                                       "  - shard: {tp: y}\n"
                                       "  - grid: {order: [a]}\n",
                                   1);
  EXPECT_NE(m.find("d.yaml:10:27: directives[0].split.microbatches: expected an integer"), std::string::npos) << m;
  EXPECT_NE(m.find("d.yaml:11:17: directives[1].shard.tp: expected an integer"), std::string::npos) << m;
  EXPECT_NE(m.find("d.yaml:12:19: directives[2].grid.order: expected a string, found a list"), std::string::npos) << m;
}

}  // namespace
}  // namespace piper::config
