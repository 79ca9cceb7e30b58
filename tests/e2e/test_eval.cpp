// test_eval.cpp — held-out evaluation end to end (docs/data.md, "Held-out data"): the held-out
// loss is the same under every parallel layout (1 rank, dp 2, pp 2, tp 2 and combined) to 1e-5
// relative; evaluating changes no bit of training; a resumed run evaluates at the same steps to the
// same values, and a run that switches strategy keeps evaluating; a held-out file holding the same
// tokens gives the same loss as the held-out fraction; the refusals name the file and the key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <vector>

#include "e2e/e2e_util.hpp"

namespace piper::e2e {
namespace {

constexpr int kSteps = 4;
constexpr double kTol = 1e-5;
// Held out: the last 1% of the corpus's sequences; the loss over 2 batches after steps 1 and 3.
const std::string kEval = " --set data.eval_fraction=0.01 --set train.eval_every=2 --set train.eval_batches=2";

std::string mpi(int np) {
  return np > 1 ? "mpirun --oversubscribe --allow-run-as-root -np " + std::to_string(np) + " " : "";
}

struct TrainRun {
  RunResult r;
  std::vector<nlohmann::json> metrics;
};

// `piper train` of `config` for kSteps (unless `sets` says otherwise) on the corpus.
TrainRun train(const TempDir& tmp, const std::string& tag, int np, const std::string& sets,
          const std::string& config = source("config/tiny.yaml")) {
  const std::string metrics = tmp.file(tag + ".jsonl");
  const std::string cmd = mpi(np) + piper() + " train " + config + " --quiet --set data.path=" + corpus() +
                          " --set train.threads=1 --set train.steps=" + std::to_string(kSteps) + " " + sets +
                          " --metrics " + metrics;
  TrainRun run_result{run(cmd), {}};
  EXPECT_EQ(run_result.r.code, 0) << cmd << "\n" << run_result.r.output;
  run_result.metrics = read_metrics(metrics);
  return run_result;
}

// step -> eval_loss of the rows that have one.
std::map<int64_t, double> evals(const std::vector<nlohmann::json>& rows) {
  std::map<int64_t, double> out;
  for (const auto& row : rows)
    if (row.contains("eval_loss")) out[row["step"].get<int64_t>()] = row["eval_loss"].get<double>();
  return out;
}

// The worst relative difference of `got`'s held-out losses from `want`'s, at the same steps.
double worst_error(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (const auto& [step, w] : want) {
    auto it = got.find(step);
    if (it == got.end()) {
      ADD_FAILURE() << "no held-out loss at step " << step;
      return INFINITY;
    }
    worst = std::max(worst, std::fabs(it->second - w) / std::fabs(w));
  }
  return worst;
}

// The single-rank run of a config with the held-out loss, once for the suite.
const std::map<int64_t, double>& reference(const std::string& config) {
  static TempDir tmp("eval-ref");
  static std::map<std::string, std::map<int64_t, double>> refs;
  auto it = refs.find(config);
  if (it != refs.end()) return it->second;
  return refs[config] = evals(train(tmp, "ref" + std::to_string(refs.size()), 1, kEval, config).metrics);
}

struct Layout {
  const char* name;
  int np;
  const char* sets;
  const char* config = "config/tiny.yaml";
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

class HeldOut : public ::testing::TestWithParam<Layout> {};

TEST_P(HeldOut, SameLossAsOneRank) {
  const Layout& l = GetParam();
  TempDir tmp(std::string("eval-") + l.name);
  const std::map<int64_t, double>& want = reference(source(l.config));
  ASSERT_EQ(want.size(), 2u) << "after steps 1 and 3";
  EXPECT_EQ(want.count(1) + want.count(3), 2u);
  const std::map<int64_t, double> got = evals(train(tmp, "run", l.np, kEval + " " + l.sets, source(l.config)).metrics);
  const double err = worst_error(got, want);
  std::printf("[ eval ] %-22s np %d: held-out loss %.6f at step 3 (1 rank: %.6f), worst rel err %.2e (tol %.0e)\n",
              l.name, l.np, got.count(3) ? got.at(3) : NAN, want.at(3), err, kTol);
  EXPECT_LE(err, kTol);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HeldOut,
    ::testing::Values(Layout{"dp2", 2, "--set parallel.dp=2"},
                      Layout{"pp2", 2, "--set parallel.pp=2 --set parallel.microbatches=2"},
                      Layout{"tp2", 2, "--set parallel.tp=2"},
                      Layout{"dp2_zero3", 2, "--set parallel.dp=2 --set parallel.zero=3"},
                      Layout{"pp2_tp2_zbh1", 4,
                             "--set parallel.pp=2 --set parallel.tp=2 --set parallel.microbatches=2 "
                             "--set parallel.schedule=zbh1 --set parallel.split_backward=true"},
                      Layout{"moe_dp2_ep2", 2, "--set parallel.dp=2 --set parallel.ep=2", "config/tiny-moe.yaml"}),
    [](const ::testing::TestParamInfo<Layout>& i) { return std::string(i.param.name); });

// Every number a step reports about training, bit for bit: evaluating between steps moves no data
// position, draws no random number and leaves the state as it was; and holding out the last
// sequences leaves the training order before them as it is without held-out data.
TEST(Eval, DoesNotDisturbTraining) {
  TempDir tmp("eval-undisturbed");
  const std::string pp2 = "--set parallel.pp=2 --set parallel.microbatches=2 --dump-final ";
  const TrainRun plain = train(tmp, "plain", 2, pp2 + tmp.file("plain.prm"));
  const TrainRun evaluated = train(tmp, "eval", 2, pp2 + tmp.file("eval.prm") + kEval);
  ASSERT_EQ(plain.metrics.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(evaluated.metrics.size(), plain.metrics.size());
  EXPECT_TRUE(evals(plain.metrics).empty());
  EXPECT_EQ(evals(evaluated.metrics).size(), 2u);
  size_t differing = 0;
  for (size_t i = 0; i < plain.metrics.size(); ++i)
    for (const char* key : {"loss", "grad_norm", "lr", "tokens"})
      differing += plain.metrics[i][key] != evaluated.metrics[i][key];
  const auto a = read_params(tmp.file("plain.prm")), b = read_params(tmp.file("eval.prm"));
  ASSERT_FALSE(a.empty());
  size_t params_differing = 0;
  for (const auto& [name, values] : a) {
    auto it = b.find(name);
    params_differing += it == b.end() || it->second.size() != values.size() ||
                        std::memcmp(it->second.data(), values.data(), values.size() * sizeof(float)) != 0;
  }
  std::printf("[ eval ] pp 2, with and without evaluation: %zu step figures and %zu of %zu final parameters differ "
              "(need 0)\n",
              differing, params_differing, a.size());
  EXPECT_EQ(differing, 0u);
  EXPECT_EQ(params_differing, 0u);
}

// A run checkpointed at step 4 and resumed to step 8 evaluates after steps 5 and 7, as the
// uninterrupted run does, to the same bits.
TEST(Eval, SameStepsAfterResume) {
  TempDir tmp("eval-resume");
  const std::string dir = tmp.file("ckpt");
  const TrainRun whole = train(tmp, "whole", 1, kEval + " --set train.steps=8");
  const TrainRun first = train(tmp, "first", 1, kEval + " --set checkpoint.dir=" + dir);
  const TrainRun rest = train(tmp, "rest", 1, kEval + " --set train.steps=8 --resume " + dir);
  EXPECT_NE(rest.r.output.find("resumed from"), std::string::npos) << rest.r.output;
  const std::map<int64_t, double> all = evals(whole.metrics), resumed = evals(rest.metrics);
  ASSERT_EQ(all.size(), 4u);
  ASSERT_EQ(resumed.size(), 2u);
  for (int64_t step : {5, 7}) {
    ASSERT_EQ(resumed.count(step), 1u) << "no held-out loss at step " << step;
    std::printf("[ eval ] step %lld: resumed %.9f, uninterrupted %.9f\n", static_cast<long long>(step),
                resumed.at(step), all.at(step));
    EXPECT_EQ(resumed.at(step), all.at(step));
  }
  EXPECT_EQ(evals(first.metrics).at(3), all.at(3));
}

// A job that switches from dp 2 to pp 2 at step 2 evaluates under both, as one rank does.
TEST(Eval, KeepsEvaluatingAfterASwitch) {
  TempDir tmp("eval-switch");
  const std::string config = tmp.write(
      "switch.yaml", read_text(source("config/tiny.yaml")) +
                         "\nswitch:\n  - {at_step: 2, parallel: {dp: 1, pp: 2, microbatches: 2}}\n");
  const TrainRun s = train(tmp, "switch", 2, kEval + " --set parallel.dp=2", config);
  EXPECT_NE(s.r.output.find("switch at step 2"), std::string::npos) << s.r.output;
  const double err = worst_error(evals(s.metrics), reference(source("config/tiny.yaml")));
  std::printf("[ eval ] dp 2 -> pp 2 at step 2: worst held-out loss rel err %.2e against 1 rank (tol %.0e)\n", err,
              kTol);
  EXPECT_LE(err, kTol);
}

// A token file (docs/data.md, "Token file format") of ids [first, first + count) of `from`.
// The token file header's size, docs/data.md: the count at offset 24, the ids after the header.
constexpr int kTokenHeader = 40;

void write_slice(const std::string& from, int64_t first, int64_t count, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  char header[kTokenHeader];
  in.read(header, kTokenHeader);
  uint32_t width = 0;
  std::memcpy(&width, header + 16, 4);
  ASSERT_EQ(width, 2u) << "the corpus has 2-byte ids";
  std::vector<char> ids(static_cast<size_t>(count * 2));
  in.seekg(kTokenHeader + first * 2);
  in.read(ids.data(), static_cast<std::streamsize>(ids.size()));
  ASSERT_TRUE(in) << from;
  const uint64_t n = static_cast<uint64_t>(count);
  std::memcpy(header + 24, &n, 8);
  std::ofstream out(to, std::ios::binary);
  out.write(header, kTokenHeader);
  out.write(ids.data(), static_cast<std::streamsize>(ids.size()));
}

int64_t token_count(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char header[kTokenHeader];
  in.read(header, kTokenHeader);
  uint64_t n = 0;
  std::memcpy(&n, header + 24, 8);
  return static_cast<int64_t>(n);
}

// data.eval_path holding exactly the tokens data.eval_fraction holds out: the same held-out loss, bit
// for bit (the training orders agree until the fraction's wraps at the held-out part).
TEST(Eval, HeldOutFileEqualsTheHeldOutFraction) {
  TempDir tmp("eval-file");
  const int64_t T = 64, n = token_count(corpus()), S = (n - 1) / T;
  const auto E = static_cast<int64_t>(std::ceil(0.01 * static_cast<double>(S)));
  const std::string held = tmp.file("held.tok");
  write_slice(corpus(), (S - E) * T, E * T + 1, held);
  const TrainRun fraction = train(tmp, "fraction", 1, kEval);
  const TrainRun file = train(tmp, "file", 1, "--set train.eval_every=2 --set train.eval_batches=2 --set data.eval_path=" + held);
  EXPECT_NE(file.r.output.find("data.eval_path"), std::string::npos) << file.r.output;
  const std::map<int64_t, double> a = evals(fraction.metrics), b = evals(file.metrics);
  ASSERT_EQ(a.size(), 2u);
  std::printf("[ eval ] the last %lld of %lld sequences as data.eval_path: %.9f, as data.eval_fraction: %.9f\n",
              static_cast<long long>(E), static_cast<long long>(S), b.count(3) ? b.at(3) : NAN, a.at(3));
  EXPECT_EQ(a, b);
}

struct Refusal {
  const char* name;
  std::string data;                  // the config's data section, after "data:\n  path: <file>\n"
  std::string sets;                  // "@" stands for the small token file's path
  std::vector<std::string> needs;    // substrings of the message; "@" stands for the small token file's path
};
void PrintTo(const Refusal& r, std::ostream* os) { *os << r.name; }

class EvalRefusal : public ::testing::TestWithParam<Refusal> {};

// A small token file (200 ids: 3 whole sequences of 65 tokens) as data.path, the rest of config/tiny.yaml
// as it is: each bad value stops the job before any step, exit 2, naming the key's position and the file.
TEST_P(EvalRefusal, NamesTheFileAndTheKey) {
  const Refusal& c = GetParam();
  TempDir tmp(std::string("eval-refusal-") + c.name);
  const std::string small = tmp.file("small.tok");
  write_slice(corpus(), 0, 200, small);
  std::string yaml = read_text(source("config/tiny.yaml"));
  const std::string data = "data:\n  path: build/data/corpus.tok\n";
  ASSERT_NE(yaml.find(data), std::string::npos) << "config/tiny.yaml's data section changed";
  yaml.replace(yaml.find(data), data.size(), "data:\n  path: " + small + "\n" + c.data);
  const std::string config = tmp.write("run.yaml", yaml);
  std::string sets = c.sets;
  if (const size_t at = sets.find('@'); at != std::string::npos) sets.replace(at, 1, small);
  const RunResult r = run(piper() + " train " + config + " --set train.threads=1 " + sets);
  std::printf("[ eval ] %s: %s", c.name, r.output.c_str());
  EXPECT_EQ(r.code, 2) << r.output;
  for (std::string need : c.needs) {
    if (need == "@") need = small;
    EXPECT_NE(r.output.find(need), std::string::npos) << "missing '" << need << "' in:\n" << r.output;
  }
  EXPECT_EQ(r.output.find("step "), std::string::npos) << "trained before refusing";
}

INSTANTIATE_TEST_SUITE_P(
    Table, EvalRefusal,
    ::testing::Values(
        Refusal{"NoTrainingDataLeft", "  eval_fraction: 0.9\n", "",
                {"run.yaml:", "data.eval_fraction=0.9: '", "@", "holds 3 whole sequence(s) of train.seq_len + 1 = 65",
                 "ceil(0.9 x 3) = 3 of them leaves none to train on", "use an eval_fraction of at most 0.666666"}},
        Refusal{"TooFewHeldOut", "  eval_fraction: 0.5\n", "--set train.eval_every=1 --set train.eval_batches=1",
                {"--set train.eval_batches=1: an evaluation reads eval_batches x global_batch = 1 x 8 = 8 held-out",
                 "data.eval_fraction=0.5 (at ", "run.yaml:28:3)", "holds out ceil(0.5 x 3) = 2 of the 3 whole sequences of '",
                 "@", "; use a longer token file"}},
        Refusal{"HeldOutFileMissing", "  eval_path: /nonexistent/held.tok\n", "--set train.eval_every=1",
                {"run.yaml:28:3: data.eval_path=\"/nonexistent/held.tok\": token file '/nonexistent/held.tok': cannot open"}},
        Refusal{"HeldOutFileTooShort", "", "--set train.eval_every=1 --set train.eval_batches=2 --set data.eval_path=@",
                {"--set train.eval_batches=2: an evaluation reads eval_batches x global_batch = 2 x 8 = 16",
                 "data.eval_path=", "holds 3 whole sequence(s)", "; use a held-out file of at least 1025 tokens"}}),
    [](const ::testing::TestParamInfo<Refusal>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace piper::e2e
