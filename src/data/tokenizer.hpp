// tokenizer.hpp — text to token ids and back (docs/data.md, "Tokenizers"): the byte tokenizer (one id
// per byte, vocab 256) and SentencePiece subword models (BPE or unigram), trained by `piper prepare`
// and stored beside the token file and inside every checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/token_file.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace piper::data {

// "byte" or "sentencepiece".
const char* kind_name(TokenizerKind kind);

// FNV-1a, 64 bit, of a model file's bytes: what a token file records to name its model.
uint64_t model_hash(std::string_view bytes);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual TokenizerKind kind() const = 0;
  virtual int32_t vocab_size() const = 0;
  // The model file's bytes: empty for the byte tokenizer.
  virtual const std::string& model() const = 0;
  TokenizerStamp stamp() const { return {kind(), model().empty() ? 0 : model_hash(model())}; }

  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The exact text back: decode(encode(s)) == s. Throws DataError on an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Safe to print (model samples): ids outside the vocabulary and control characters other than
  // '\n' and '\t' become '?'.
  virtual std::string decode_printable(std::span<const int32_t> ids) const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kVocabSize = 256;
  TokenizerKind kind() const override { return TokenizerKind::BYTE; }
  int32_t vocab_size() const override { return kVocabSize; }
  const std::string& model() const override;
  // Each byte of text becomes one id in [0, 256).
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  // Printable ASCII, '\n' and '\t' as they are; every other byte (a lone byte of a UTF-8
  // sequence is not text) as '?'.
  std::string decode_printable(std::span<const int32_t> ids) const override;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // `model`: a SentencePiece model file's bytes; `origin` names where they came from in errors.
  // Throws DataError when they are not a model SentencePiece can load.
  SentencePieceTokenizer(std::string model, const std::string& origin);
  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  TokenizerKind kind() const override { return TokenizerKind::SENTENCEPIECE; }
  int32_t vocab_size() const override { return vocab_size_; }
  const std::string& model() const override { return model_; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  std::string decode_printable(std::span<const int32_t> ids) const override;

 private:
  std::string model_;
  std::string origin_;
  int32_t vocab_size_ = 0;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

// The tokenizer of a recorded kind and model (a checkpoint's): the byte tokenizer takes no model.
// Throws DataError, naming `origin`, on a model that does not load or one given to the byte kind.
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, std::string model, const std::string& origin);

// The file a token file's SentencePiece model lives in: its path with the extension replaced by
// ".model" ("data/corpus.tok" -> "data/corpus.model").
std::string model_path_for(const std::string& token_path);

// Reads a model file whole. Throws DataError naming it when it cannot.
std::string read_model_file(const std::string& path);

// The tokenizer a token file was written with: the byte tokenizer, or the SentencePiece model at
// model_path_for(file.path()) whose hash and vocabulary match the file's header. Throws DataError
// naming both files when the model is missing, unreadable, another model, or of another vocabulary.
std::unique_ptr<Tokenizer> tokenizer_of(const TokenFile& file);

// How `piper prepare --tokenizer-train` trains a model.
struct SubwordOptions {
  int32_t vocab_size = 0;
  std::string model_type = "bpe";  // "bpe" or "unigram"
};

// Trains a SentencePiece model on the lines of `text` and returns the model file's bytes. Every UTF-8
// text round-trips (byte fallback, no normalisation, whitespace kept as it is), and the same text and
// options give the same model, byte for byte (one thread, input in order). Throws DataError with
// SentencePiece's reason (a vocabulary larger than the text supports, an unknown model type).
std::string train_sentencepiece(std::string_view text, const SubwordOptions& options);

}  // namespace piper::data
