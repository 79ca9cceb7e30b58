// test_directives.cpp — the `directives:` section end to end through `piper plan` (no mpirun needed for
// --world 2): hand-written pipeline orders for pp = 2 that are refused, each with exit code 2 and a
// message naming the first offending op or node and its rank; a hand-written 1F1B that plans (and
// trains) exactly like `schedule: 1f1b`; and `piper plan --directives` output that, used as the config's
// `directives:` section, gives the same plan hash.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "e2e/e2e_util.hpp"

namespace piper::e2e {
namespace {

// The tiny model (blocks M * - M -) with a short sequence: plans are small and print fast.
const std::string kModel =
    "model:\n"
    "  pattern: \"M*-M-\"\n"
    "  d_model: 64\n"
    "  n_heads: 4\n"
    "  n_kv_heads: 2\n"
    "  ffn_hidden: 128\n"
    "  d_state: 16\n"
    "  head_dim: 16\n"
    "  n_groups: 2\n"
    "train:\n"
    "  global_batch: 8\n"
    "  seq_len: 16\n";

// Two pipeline stages chosen by filters, four microbatches, then `order`.
std::string two_stages(const std::string& order) {
  return kModel +
         "directives:\n"
         "  - split: {microbatches: 4}\n"
         "  - place: {pp: 2, stages: [{blocks: \"0-1\"}, {blocks: \"2-4\"}]}\n" +
         order;
}

std::string ranks(const std::string& rank0, const std::string& rank1) {
  return "  - order:\n"
         "      ranks:\n"
         "        - [" + rank0 + "]\n"
         "        - [" + rank1 + "]\n";
}

// 1F1B for 2 ranks and 4 microbatches, as docs/schedules.md draws it.
const std::string k1f1bRank0 = "F0, F1, B0, F2, B1, F3, B2, B3";
const std::string k1f1bRank1 = "F0, B0, F1, B1, F2, B2, F3, B3";

std::string plan_hash(const std::string& output) {
  const size_t at = output.find("plan hash ");
  return at == std::string::npos ? "" : output.substr(at + 10, 16);
}

struct BadOrder {
  const char* name;
  std::string rank0, rank1;
  std::vector<std::string> expect;  // substrings of the message
};

void PrintTo(const BadOrder& c, std::ostream* os) { *os << c.name; }

class DirectiveBrokenOrder : public ::testing::TestWithParam<BadOrder> {};

TEST_P(DirectiveBrokenOrder, RefusedNamingOpAndRank) {
  const BadOrder& c = GetParam();
  TempDir tmp(std::string("directives-") + c.name);
  const std::string cfg = tmp.write("order.yaml", two_stages(ranks(c.rank0, c.rank1)));
  auto r = run(piper() + " plan " + cfg + " --world 2");
  std::printf("[ directives ] %s -> exit %d: %s", c.name, r.code, r.output.c_str());
  EXPECT_EQ(r.code, 2) << r.output;
  for (const auto& s : c.expect) EXPECT_NE(r.output.find(s), std::string::npos) << "missing '" << s << "'";
  EXPECT_EQ(r.output.find("rank 0:"), std::string::npos) << "a program was printed";
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Table, DirectiveBrokenOrder,
    ::testing::Values(
        // rank 1 runs the backward of microbatch 0 before its forward
        BadOrder{"backward_before_forward", k1f1bRank0, "B0, F0, F1, B1, F2, B2, F3, B3",
                 {"the schedule can deadlock", "a cycle of data and ordering edges",
                  "FWD layers.2 mb0 (pass F, microbatch 0, stage 1) on rank 1", "which waits for"}},
        // rank 0 waits for microbatch 0's gradient before sending microbatch 1's activation,
        // which rank 1 wants first
        BadOrder{"gradient_before_activation", "F0, B0, F1, B1, F2, B2, F3, B3", "F0, F1, B0, B1, F2, B2, F3, B3",
                 {"the schedule can deadlock", "a cycle of data and ordering edges",
                  "BWD head mb0 (pass B, microbatch 0, stage 1) on rank 1", "(pass F, microbatch 1, stage 0) on rank 0"}},
        // rank 0 leaves out microbatch 3
        BadOrder{"missing_microbatch", "F0, F1, B0, F2, B1, B2", k1f1bRank1,
                 {"order.yaml:18:11: directives[2].order.ranks[0]: no op runs F of embed (unit 0, stage 0) for "
                  "microbatch 3; add F3"}},
        // a group whose second op needs the first: the ops of a group run at once
        BadOrder{"group_with_a_dependency", k1f1bRank0, "[F0, B0], F1, B1, F2, B2, F3, B3",
                 {"order.yaml:19:17: directives[2].order.ranks[1][1]", "the group [F0, B0] runs B0, which needs F0",
                  "must be independent"}},
        // a unit range outside the op's stage (stage 0 holds units 0..2: embed, layers.0-1)
        BadOrder{"unit_range_outside_its_stage", "F0/0-4, F1, B0, F2, B1, F3, B2, B3", k1f1bRank1,
                 {"order.yaml:18:12: directives[2].order.ranks[0][0]", "F0/0-4 names units 0..4, but its stage 0 "
                  "holds units 0..2"}},
        // two unit ranges that overlap
        BadOrder{"unit_ranges_overlap", "F0/0-1, F0/1-2, F1, B0, F2, B1, F3, B2, B3", k1f1bRank1,
                 {"directives[2].order.ranks[0][1]", "runs F of layers.0 for microbatch 0, which op 0 of the rank "
                  "runs already"}},
        // a microbatch that does not exist
        BadOrder{"nonexistent_microbatch", "F0, F1, B0, F2, B1, F9, B2, B3", k1f1bRank1,
                 {"order.yaml:18:32", "directives[2].order.ranks[0][5]", "rank 0 runs F9",
                  "there are 4 microbatches (0..3"}},
        // a chunk rank 0 does not hold (one chunk per rank: F3.1 would be stage 2)
        BadOrder{"nonexistent_chunk", "F0, F1, B0, F2, B1, F3.1, B2, B3", k1f1bRank1,
                 {"order.yaml:18:32", "rank 0 runs F3.1", "each rank holds 1 model chunk(s)"}},
        // rank 0's last backward moved to rank 1, which already runs B3
        BadOrder{"op_on_the_wrong_rank", "F0, F1, B0, F2, B1, F3, B2", k1f1bRank1 + ", B3",
                 {"order.yaml:19:44", "directives[2].order.ranks[1][8]", "rank 1 runs B3 twice",
                  "order.yaml:19:40: directives[2].order.ranks[1][7]"}},
        // an op written twice
        BadOrder{"duplicated_op", k1f1bRank0 + ", F1", k1f1bRank1,
                 {"order.yaml:18:44", "rank 0 runs F1 twice", "order.yaml:18:16: directives[2].order.ranks[0][1]",
                  "each op runs once per step"}},
        // not an op at all
        BadOrder{"not_an_op", "F0, F1, B0, X3, B1, F3, B2, B3", k1f1bRank1,
                 {"order.yaml:18:24", "directives[2].order.ranks[0][3] (rank 0)", "found 'X3'",
                  "expected an op: F, B, BI or BW"}},
        BadOrder{"op_without_microbatch", "F0, F1, B0, F, B1, F3, B2, B3", k1f1bRank1,
                 {"order.yaml:18:24", "'F' names no microbatch"}}),
    [](const ::testing::TestParamInfo<BadOrder>& p) { return std::string(p.param.name); });

// Placements that are not one, each refused at the place directive's ranks.
TEST(Directives, BadPlacementsAreRefusedAtTheirRanks) {
  struct Case {
    const char* name;
    std::string place, order;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"rank_without_a_stage", "  - place: {pp: 2, ranks: [0, 0]}\n", ranks(k1f1bRank0, k1f1bRank1),
       {"order.yaml:15:20: directives[1].place.ranks", "pipeline rank 1 holds no stage"}},
      {"rank_out_of_range", "  - place: {pp: 2, ranks: [0, 2]}\n", ranks(k1f1bRank0, k1f1bRank1),
       {"directives[1].place.ranks", "stage 1 is placed on pipeline rank 2, but there are 2 pipeline ranks"}},
      {"unequal_chunks", "  - place: {pp: 2, ranks: [0, 1, 1]}\n", ranks(k1f1bRank0, k1f1bRank1),
       {"directives[1].place.ranks", "rank 0 holds 1 stage(s) but rank 1 holds 2"}},
      {"named_schedule_elsewhere", "  - place: {pp: 2, ranks: [1, 0]}\n", "  - order: {schedule: 1f1b}\n",
       {"directives[1].place.ranks", "1f1b orders its ops for its own layout, stages on ranks [0, 1]",
        "order: {ranks: ...}"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir tmp(std::string("placement-") + c.name);
    const std::string cfg =
        tmp.write("order.yaml", kModel + "directives:\n  - split: {microbatches: 4}\n" + c.place + c.order);
    auto r = run(piper() + " plan " + cfg + " --world 2");
    std::printf("[ placement ] %s -> exit %d: %s", c.name, r.code, r.output.c_str());
    EXPECT_EQ(r.code, 2) << r.output;
    for (const auto& s : c.expect) EXPECT_NE(r.output.find(s), std::string::npos) << "missing '" << s << "'";
  }
}

// A hand-written 1F1B prints exactly what `schedule: 1f1b` prints: same DAG, same plan hash, same
// instruction sequence on every rank.
TEST(Directives, HandWritten1F1BPlansLikeTheSchedule) {
  TempDir tmp("directives-1f1b");
  const std::string custom = tmp.write("custom.yaml", two_stages(ranks(k1f1bRank0, k1f1bRank1)));
  const std::string named = tmp.write("named.yaml", two_stages("  - order: {schedule: 1f1b}\n"));
  auto a = run(piper() + " plan " + custom + " --world 2");
  auto b = run(piper() + " plan " + named + " --world 2");
  ASSERT_EQ(a.code, 0) << a.output;
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_NE(a.output.find("rank 1:"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("2 stage(s), 4 microbatch(es)"), std::string::npos) << a.output;
  EXPECT_EQ(a.output, b.output);
  // The shipped example is the same order.
  auto e = run(piper() + " plan " + source("config/examples/custom_order.yaml") + " --world 2");
  ASSERT_EQ(e.code, 0) << e.output;
  auto d = run(piper() + " plan " + source("config/examples/custom_order.yaml") + " --world 2 --directives");
  ASSERT_EQ(d.code, 0) << d.output;
  EXPECT_NE(d.output.find("        - [F0, F1, B0, F2, B1, F3, B2, B3]\n"), std::string::npos) << d.output;
  EXPECT_NE(d.output.find("stage_of_unit: [0, 0, 0, 1, 1, 1, 1]"), std::string::npos) << d.output;
}

// `piper plan --directives` output, appended to the config as its directives, plans the same.
TEST(Directives, PrintedDirectivesGiveTheSamePlanHash) {
  struct Case {
    const char* name;
    std::string config;  // config text
    int world;
    std::string sets;
  };
  const std::string custom_zb = two_stages(ranks("F0, F1, BI0, F2, BI1, BW0, F3, BI2, BW1, BI3, BW2, BW3",
                                                 "F0, BI0, F1, BI1, BW0, F2, BI2, BW1, F3, BI3, BW2, BW3"));
  const std::vector<Case> cases = {
      {"tiny", kModel, 1, ""},
      {"accumulation", kModel, 1, "--set parallel.microbatches=4 --set parallel.split_backward=true"},
      {"gpipe", kModel, 2, "--set parallel.pp=2 --set parallel.microbatches=2 --set parallel.schedule=gpipe"},
      {"zbh1", kModel, 2, "--set parallel.pp=2 --set parallel.microbatches=4 --set parallel.schedule=zbh1"},
      {"interleaved", kModel, 2,
       "--set parallel.pp=2 --set parallel.microbatches=4 --set parallel.schedule=interleaved "
       "--set parallel.virtual_stages=2"},
      {"dualpipev", kModel, 2, "--set parallel.pp=2 --set parallel.microbatches=4 --set parallel.schedule=dualpipev"},
      {"dp_zero", kModel, 4,
       "--set parallel.dp=2 --set parallel.pp=2 --set parallel.zero=2 --set parallel.bucket_mb=0.01 "
       "--set parallel.order=pp-dp-tp"},
      {"tp", kModel, 2, "--set parallel.tp=2"},
      {"custom_1f1b", two_stages(ranks(k1f1bRank0, k1f1bRank1)), 2, ""},
      {"custom_zero_bubble", custom_zb, 2, ""},
      {"dualpipev_pairs", kModel, 2,
       "--set parallel.pp=2 --set parallel.microbatches=4 --set parallel.schedule=dualpipev --set parallel.pairs=true"},
      {"tp_pairs", kModel, 2, "--set parallel.tp=2 --set parallel.microbatches=2 --set parallel.pairs=true"},
      {"custom_groups_and_units",
       two_stages(ranks("F0, F1, [F2/0-1, B0], F2/2, B1, F3, B2, B3", "F0, B0, F1, B1, F2, B2, F3, B3")), 2, ""},
      {"subsets", kModel + "directives:\n  - replicate: {dp: 2}\n  - replicate: {shard_optimizer: true, shard_grads: "
                           "true, shard_params: true, kind: [embed, head]}\n  - split_backward: {kind: \"*\"}\n",
       2, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir tmp(std::string("directives-rt-") + c.name);
    const std::string cfg = tmp.write("orig.yaml", c.config);
    const std::string args = " --world " + std::to_string(c.world) + " " + c.sets;
    auto orig = run(piper() + " plan " + cfg + args);
    auto dirs = run(piper() + " plan " + cfg + args + " --directives");
    ASSERT_EQ(orig.code, 0) << orig.output;
    ASSERT_EQ(dirs.code, 0) << dirs.output;
    ASSERT_EQ(dirs.output.rfind("directives:\n", 0), 0u) << dirs.output;
    // The model and training keys of the original, its parallel shorthand and directives replaced
    // by the printed list (no --set: the list must say everything).
    std::string base = c.config.substr(0, c.config.find("directives:"));
    const std::string again = tmp.write("again.yaml", base + dirs.output);
    auto back = run(piper() + " plan " + again + " --world " + std::to_string(c.world));
    ASSERT_EQ(back.code, 0) << back.output << "\n" << dirs.output;
    EXPECT_FALSE(plan_hash(orig.output).empty()) << orig.output;
    EXPECT_EQ(plan_hash(back.output), plan_hash(orig.output)) << dirs.output;
    EXPECT_EQ(back.output, orig.output);
    // And after a different shorthand: the directives override every value it sets.
    const std::string other =
        tmp.write("other.yaml", base + "parallel:\n  dp: 3\n  microbatches: 8\n  schedule: gpipe\n  zero: 1\n" +
                                    dirs.output);
    auto back2 = run(piper() + " plan " + other + " --world " + std::to_string(c.world));
    ASSERT_EQ(back2.code, 0) << back2.output;
    EXPECT_EQ(plan_hash(back2.output), plan_hash(orig.output)) << dirs.output;
  }
}

// A hand-written order runs: two ranks train the same losses as with the named schedule.
TEST(Directives, HandWrittenOrderTrainsLikeTheSchedule) {
  TempDir tmp("directives-train");
  const std::string example = source("config/examples/custom_order.yaml");
  std::string text;
  {
    std::ifstream f(example);
    text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  const std::string named =
      tmp.write("named.yaml", text.substr(0, text.find("  - order:")) + "  - order: {schedule: 1f1b}\n");
  std::vector<std::vector<double>> losses;
  for (const std::string& cfg : {example, named}) {
    const std::string metrics = tmp.file("m" + std::to_string(losses.size()) + ".jsonl");
    const std::string cmd = "mpirun --oversubscribe --allow-run-as-root -np 2 " + piper() + " train " + cfg +
                            " --quiet --set data.path=" + corpus() +
                            " --set train.steps=4 --set train.threads=1 --metrics " + metrics;
    auto r = run(cmd);
    ASSERT_EQ(r.code, 0) << cmd << "\n" << r.output;
    losses.emplace_back();
    for (const auto& row : read_metrics(metrics)) losses.back().push_back(row["loss"].get<double>());
  }
  ASSERT_EQ(losses[0].size(), 4u);
  EXPECT_EQ(losses[0], losses[1]);  // the same program: bit-identical
}

}  // namespace
}  // namespace piper::e2e
