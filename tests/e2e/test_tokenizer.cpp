// test_tokenizer.cpp — subword data end to end (docs/data.md, "Tokenizers" and "Generating text"):
// `piper prepare --tokenizer-train` on the corpus, training on its token file, checkpoints that
// carry the tokenizer, `piper generate` from checkpoints written under one rank and under pp 2, and
// the refusals: a vocab_size smaller than the tokenizer's, a missing model, resuming on data of
// another tokenizer, and generate's bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "e2e/e2e_util.hpp"

namespace piper::e2e {
namespace {

namespace fs = std::filesystem;

constexpr int kVocab = 1024;

std::string mpi(int np) {
  return np > 1 ? "mpirun --oversubscribe --allow-run-as-root -np " + std::to_string(np) + " " : "";
}

// One subword token file of the corpus for every test here: tmp/sub.tok and tmp/sub.model.
class Subword : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("tokenizer");
    const RunResult r = run(piper() + " prepare --quiet --tokenizer-train " + std::to_string(kVocab) + " -o " +
                            dir_->file("sub.tok") + " " + std::string(PIPER_BINARY_DIR) + "/data/corpus.txt");
    ASSERT_EQ(r.code, 0) << r.output;
    ASSERT_NE(r.output.find("sentencepiece, vocab 1024"), std::string::npos) << r.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string sub() { return dir_->file("sub.tok"); }

  // `piper train` of config/tiny.yaml for `steps` steps on `data`, saving a checkpoint after the last.
  static RunResult train(int np, const std::string& data, int vocab, const std::string& ckpt, int steps,
                         const std::string& sets = "") {
    return run(mpi(np) + piper() + " train " + source("config/tiny.yaml") + " --quiet --set data.path=" + data +
               " --set model.vocab_size=" + std::to_string(vocab) + " --set train.threads=1 --set train.steps=" +
               std::to_string(steps) + " --set checkpoint.dir=" + ckpt + " --set checkpoint.every=" +
               std::to_string(steps) + " " + sets);
  }

  static TempDir* dir_;
};
TempDir* Subword::dir_ = nullptr;

TEST_F(Subword, TrainsAndGeneratesFromCheckpointsOfAnyStrategy) {
  const std::string one = dir_->file("ckpt-1"), pp2 = dir_->file("ckpt-pp2");
  RunResult r = train(1, sub(), kVocab, one, 3, "--set train.sample_every=3 --set train.sample_tokens=8");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("sample @ step 2: \"The"), std::string::npos) << r.output;
  r = train(2, sub(), kVocab, pp2, 3, "--set parallel.pp=2 --set parallel.microbatches=2");
  ASSERT_EQ(r.code, 0) << r.output;

  const std::string inspect = run(piper() + " ckpt inspect " + one).output;
  EXPECT_NE(inspect.find("tokenizer: sentencepiece"), std::string::npos) << inspect;

  for (const std::string& ckpt : {one, pp2}) {
    SCOPED_TRACE(ckpt);
    const std::string cmd = piper() + " generate " + ckpt + " --prompt 'The ship' --tokens 12 --seed 7 --top-k 40";
    const RunResult a = run(cmd), b = run(cmd);
    ASSERT_EQ(a.code, 0) << a.output;
    EXPECT_EQ(a.output, b.output) << "the same seed samples the same text";
    EXPECT_NE(a.output.find("The ship"), std::string::npos) << a.output;
    EXPECT_NE(a.output.find("step 3, sentencepiece tokenizer"), std::string::npos) << a.output;
    EXPECT_NE(a.output.find("+ 12 new tokens"), std::string::npos) << a.output;
    const RunResult greedy = run(piper() + " generate " + ckpt + " --prompt 'The ship' --tokens 12 --temperature 0");
    ASSERT_EQ(greedy.code, 0) << greedy.output;
  }
}

TEST_F(Subword, AVocabSizeBelowTheTokenizersIsRefusedNamingBoth) {
  const RunResult r = train(1, sub(), 256, dir_->file("never"), 1);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("model.vocab_size=256"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'" + sub() + "' has vocab size 1024"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("data.path="), std::string::npos) << r.output;
}

TEST_F(Subword, AMissingModelIsRefusedNamingTheFileAndKey) {
  TempDir alone("tokenizer-alone");
  fs::copy_file(sub(), alone.file("sub.tok"));
  const RunResult r = train(1, alone.file("sub.tok"), kVocab, alone.file("never"), 1);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("data.path="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'" + alone.file("sub.model") + "', which does not exist"), std::string::npos)
      << r.output;
}

TEST_F(Subword, ResumingOnDataOfAnotherTokenizerIsRefused) {
  const std::string ckpt = dir_->file("ckpt-bytes");
  RunResult r = train(1, corpus(), kVocab, ckpt, 1);
  ASSERT_EQ(r.code, 0) << r.output;
  r = train(1, sub(), kVocab, ckpt, 2, "--resume");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("trained on data of the byte tokenizer"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("made with the sentencepiece model"), std::string::npos) << r.output;
}

TEST_F(Subword, GenerateRefusalsSayWhatWouldBeRight) {
  RunResult r = run(piper() + " generate " + dir_->file("nothing-here") + " --prompt hi");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(dir_->file("nothing-here")), std::string::npos) << r.output;
  const std::string ckpt = dir_->file("ckpt-gen");
  ASSERT_EQ(train(1, corpus(), 256, ckpt, 1).code, 0);
  r = run(piper() + " generate " + ckpt + " --prompt ''");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--prompt is empty"), std::string::npos) << r.output;
  r = run(mpi(2) + piper() + " generate " + ckpt + " --prompt hi");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("runs on one process"), std::string::npos) << r.output;
  r = run(piper() + " generate " + ckpt + " --prompt 'The ' --tokens 5 --temperature 0");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("byte tokenizer, 4 prompt + 5 new tokens"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace piper::e2e
