// test_tokenizer.cpp — SentencePiece in src/data: decode(encode(text)) == text on the shipped corpus,
// the same text and options giving the same model and token file byte for byte, a model reused with
// --tokenizer, and the refusals that name both files (a missing or another model).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/prepare.hpp"
#include "data/token_file.hpp"
#include "data/tokenizer.hpp"
#include "unit/data/data_test_util.hpp"

namespace fs = std::filesystem;
using namespace piper::data;
using namespace piper::data::test;

namespace {

// The shipped corpus, unpacked by `make corpus` (make test runs it first).
const std::string& corpus_text() {
  static const std::string text = read_bytes(std::string(PIPER_BINARY_DIR) + "/data/corpus.txt");
  return text;
}

// A model of 2048 pieces trained on the corpus, once for the whole test program.
const SentencePieceTokenizer& corpus_model() {
  static const SentencePieceTokenizer tok(train_sentencepiece(corpus_text(), {2048, "bpe"}), "the corpus model");
  return tok;
}

std::vector<int32_t> ids_of(const TokenFile& f) {
  std::vector<int32_t> ids(static_cast<size_t>(f.size()));
  for (int64_t i = 0; i < f.size(); ++i) ids[static_cast<size_t>(i)] = f.at(i);
  return ids;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no DataError";
  return "";
}

TEST(SentencePiece, RoundTripsTheCorpus) {
  const std::string& text = corpus_text();
  ASSERT_GT(text.size(), 1000000u) << "the corpus is missing: run make corpus";
  const SentencePieceTokenizer& tok = corpus_model();
  EXPECT_EQ(tok.vocab_size(), 2048);
  const std::vector<int32_t> ids = tok.encode(text);
  const double bytes_per_token = static_cast<double>(text.size()) / static_cast<double>(ids.size());
  std::printf("[ tokenizer ] corpus: %zu bytes -> %zu tokens, %.2f bytes/token\n", text.size(), ids.size(),
              bytes_per_token);
  EXPECT_GT(bytes_per_token, 2.0) << "a subword vocabulary of 2048 should more than halve the byte count";
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(SentencePiece, BytesItNeverSawRoundTripThroughByteFallback) {
  const SentencePieceTokenizer& tok = corpus_model();
  for (const std::string& s : {std::string("tab\there  two  spaces\n\nnew lines\r\n"), std::string("caf\xc3\xa9 \xe2\x98\x83 \xf0\x9f\x98\x80"),
                              std::string("\x01\x02 control\x7f"), std::string(" leading and trailing ")}) {
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
  }
  EXPECT_EQ(tok.decode_printable(tok.encode("a\x01" "b\n\tc")), "a?b\n\tc");
  const std::string msg = error_of([&] { tok.decode(std::vector<int32_t>{5, 2048}); });
  EXPECT_NE(msg.find("token id 2048 at position 1 is outside its vocabulary"), std::string::npos) << msg;
  EXPECT_EQ(tok.decode_printable(std::vector<int32_t>{-1}), "?");
}

// The corpus's first lines up to about `bytes`, a text big enough for training to take many sentences.
std::string corpus_prefix(size_t bytes) {
  const std::string& text = corpus_text();
  const size_t end = text.find('\n', bytes);
  return end == std::string::npos ? text : text.substr(0, end + 1);
}

TEST(SentencePiece, SameTextAndOptionsGiveTheSameFilesByteForByte) {
  TempDir dir;
  fs::create_directories(dir.path / "a");
  fs::create_directories(dir.path / "b");
  // A sixth of the corpus: training twice on all of it takes most of a minute, three under ASan.
  const std::string text = corpus_prefix(512 * 1024);
  const std::string in = dir / "in.txt";
  write_bytes(in, text);
  PrepareOptions o;
  o.train = {1024, "unigram"};
  const Prepared a = prepare({in}, dir / "a/c.tok", o);
  const Prepared b = prepare({in}, dir / "b/c.tok", o);
  EXPECT_EQ(a.kind, TokenizerKind::SENTENCEPIECE);
  EXPECT_EQ(a.vocab_size, 1024);
  EXPECT_EQ(a.model_path, dir / "a/c.model");
  EXPECT_EQ(read_bytes(dir / "a/c.model"), read_bytes(dir / "b/c.model"));
  EXPECT_EQ(read_bytes(dir / "a/c.tok"), read_bytes(dir / "b/c.tok"));

  const TokenFile f(dir / "a/c.tok");
  EXPECT_EQ(f.vocab_size(), 1024u);
  EXPECT_EQ(f.id_width(), 2u);
  EXPECT_EQ(f.tokenizer().kind, TokenizerKind::SENTENCEPIECE);
  EXPECT_EQ(f.tokenizer().hash, model_hash(read_bytes(dir / "a/c.model")));
  const auto tok = tokenizer_of(f);
  EXPECT_EQ(tok->decode(ids_of(f)), text);
}

TEST(SentencePiece, AGivenModelIsCopiedBesideTheTokenFile) {
  TempDir dir;
  write_bytes(dir / "m.model", corpus_model().model());
  write_bytes(dir / "t.txt", "The quick brown fox.\nIt jumps.\n");
  PrepareOptions o;
  o.tokenizer = dir / "m.model";
  const Prepared p = prepare({dir / "t.txt"}, dir / "out/t.tok", o);
  EXPECT_EQ(read_bytes(dir / "out/t.model"), corpus_model().model());
  const TokenFile f(dir / "out/t.tok");
  EXPECT_EQ(ids_of(f), corpus_model().encode("The quick brown fox.\nIt jumps.\n"));
  EXPECT_EQ(p.tokens, f.size());

  o.train = {1024, "bpe"};
  const std::string both = error_of([&] { prepare({dir / "t.txt"}, dir / "x.tok", o); });
  EXPECT_NE(both.find("both --tokenizer-train and --tokenizer"), std::string::npos) << both;
}

TEST(SentencePiece, AMissingOrAnotherModelIsRefusedNamingBothFiles) {
  TempDir dir;
  write_bytes(dir / "t.txt", "some text to tokenize\n");
  PrepareOptions o;
  write_bytes(dir / "m.model", corpus_model().model());
  o.tokenizer = dir / "m.model";
  prepare({dir / "t.txt"}, dir / "t.tok", o);
  const TokenFile f(dir / "t.tok");

  fs::remove(dir / "t.model");
  std::string msg = error_of([&] { tokenizer_of(f); });
  EXPECT_NE(msg.find("'" + (dir / "t.tok") + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'" + (dir / "t.model") + "', which does not exist"), std::string::npos) << msg;

  write_bytes(dir / "t.model", train_sentencepiece(corpus_text().substr(0, 400000), {600, "bpe"}));
  msg = error_of([&] { tokenizer_of(f); });
  EXPECT_NE(msg.find("another model"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(f.tokenizer().hash)), std::string::npos) << msg;

  msg = error_of([&] { SentencePieceTokenizer("not a model", "'x.model'"); });
  EXPECT_NE(msg.find("'x.model': not a SentencePiece model"), std::string::npos) << msg;
  msg = error_of([&] { make_tokenizer(TokenizerKind::BYTE, "bytes", "checkpoint c.h5"); });
  EXPECT_NE(msg.find("checkpoint c.h5: the byte tokenizer has no model"), std::string::npos) << msg;
}

TEST(SentencePiece, TrainingRefusalsSayWhatWouldBeRight) {
  std::string msg = error_of([] { train_sentencepiece("a b c\n", {100, "bpe"}); });
  EXPECT_NE(msg.find("expected 512 to 65536"), std::string::npos) << msg;
  msg = error_of([] { train_sentencepiece("a b c\n", {1024, "wordpiece"}); });
  EXPECT_NE(msg.find("'wordpiece' is unknown (expected bpe or unigram)"), std::string::npos) << msg;
  msg = error_of([] { train_sentencepiece("a few words of text\n", {4096, "unigram"}); });
  EXPECT_NE(msg.find("could not train a unigram model of 4096 pieces"), std::string::npos) << msg;
}

TEST(ByteTokenizer, IsWhatAByteTokenFileRecords) {
  TempDir dir;
  write_bytes(dir / "t.txt", "hello\n");
  const Prepared p = prepare({dir / "t.txt"}, dir / "t.tok", {});
  EXPECT_EQ(p.kind, TokenizerKind::BYTE);
  EXPECT_TRUE(p.model_path.empty());
  EXPECT_FALSE(fs::exists(dir / "t.model"));
  const TokenFile f(dir / "t.tok");
  EXPECT_EQ(f.tokenizer(), (TokenizerStamp{TokenizerKind::BYTE, 0}));
  EXPECT_EQ(tokenizer_of(f)->decode(ids_of(f)), "hello\n");
}

}  // namespace
