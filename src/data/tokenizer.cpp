// tokenizer.cpp — the byte tokenizer, SentencePiece models (loading, training), and the tokenizer
// of a token file.
#include "data/tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <unordered_map>

#include "io/regular_file.hpp"

namespace piper::data {

const char* kind_name(TokenizerKind kind) { return kind == TokenizerKind::BYTE ? "byte" : "sentencepiece"; }

uint64_t model_hash(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

namespace {

// '?' for every control character but '\n' and '\t'; the bytes of UTF-8 text as they are.
std::string printable(std::string text) {
  for (char& c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7f) c = '?';
  }
  return text;
}

}  // namespace

// ---- byte ---------------------------------------------------------------------------------------

const std::string& ByteTokenizer::model() const {
  static const std::string none;
  return none;
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= kVocabSize) {
      throw DataError("byte tokenizer: token id " + std::to_string(ids[i]) + " at position " +
                      std::to_string(i) + " is not a byte (expected 0 <= id < 256)");
    }
    text[i] = static_cast<char>(ids[i]);
  }
  return text;
}

std::string ByteTokenizer::decode_printable(std::span<const int32_t> ids) const {
  std::string text(ids.size(), '?');
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t c = ids[i];
    if ((c >= 0x20 && c < 0x7f) || c == '\n' || c == '\t') text[i] = static_cast<char>(c);
  }
  return text;
}

// ---- SentencePiece ------------------------------------------------------------------------------

SentencePieceTokenizer::SentencePieceTokenizer(std::string model, const std::string& origin)
    : model_(std::move(model)), origin_(origin), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const auto st = sp_->LoadFromSerializedProto(model_);
  if (!st.ok()) {
    throw DataError("tokenizer model " + origin_ + ": not a SentencePiece model (" + st.ToString() +
                    "); `piper prepare --tokenizer-train` writes one");
  }
  vocab_size_ = sp_->GetPieceSize();
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto st = sp_->Encode(text, &ids);
  if (!st.ok()) throw DataError("tokenizer model " + origin_ + ": cannot encode: " + st.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size_) {
      throw DataError("tokenizer model " + origin_ + ": token id " + std::to_string(ids[i]) + " at position " +
                      std::to_string(i) + " is outside its vocabulary (expected 0 <= id < " +
                      std::to_string(vocab_size_) + ")");
    }
  }
  std::string text;
  const auto st = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  if (!st.ok()) throw DataError("tokenizer model " + origin_ + ": cannot decode: " + st.ToString());
  return text;
}

std::string SentencePieceTokenizer::decode_printable(std::span<const int32_t> ids) const {
  std::vector<int> known;
  known.reserve(ids.size());
  std::string text;
  const auto flush = [&] {
    std::string part;
    if (!known.empty() && sp_->Decode(known, &part).ok()) text += part;
    known.clear();
  };
  for (const int32_t id : ids) {
    if (id >= 0 && id < vocab_size_) {
      known.push_back(id);
    } else {
      flush();
      text += '?';
    }
  }
  flush();
  return printable(std::move(text));
}

namespace {

// The non-empty lines of a text, in order: what SentencePiece trains on.
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::string_view text) : text_(text) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (pos_ < text_.size()) {
      const size_t end = std::min(text_.find('\n', pos_), text_.size());
      line_.assign(text_.substr(pos_, end - pos_));
      pos_ = end + 1;
      if (!line_.empty()) return;
    }
    done_ = true;
  }
  std::string_view text_;
  size_t pos_ = 0;
  std::string line_;
  bool done_ = false;
};

}  // namespace

std::string train_sentencepiece(std::string_view text, const SubwordOptions& o) {
  if (o.model_type != "bpe" && o.model_type != "unigram") {
    throw DataError("tokenizer: model type '" + o.model_type + "' is unknown (expected bpe or unigram)");
  }
  if (o.vocab_size < 2 * ByteTokenizer::kVocabSize || o.vocab_size > 65536) {
    throw DataError("tokenizer: vocabulary size " + std::to_string(o.vocab_size) +
                    " is out of range (expected 512 to 65536: the 256 byte pieces every text falls back to, "
                    "and at least as many learned ones)");
  }
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},                // a byte never seen in training still encodes, and decodes back
      {"normalization_rule_name", "identity"},  // decode(encode(s)) == s
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"max_sentence_length", "65536"},
      {"input_sentence_size", "0"},  // every line, in order: no sampling
      {"shuffle_input_sentence", "false"},
      {"num_threads", "1"},  // the same model every time
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"pad_id", "-1"},
      {"minloglevel", "2"},
  };
  sentencepiece::SetRandomGeneratorSeed(1);
  LineIterator lines(text);
  std::string model;
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  if (!st.ok()) {
    throw DataError("tokenizer: SentencePiece could not train a " + o.model_type + " model of " +
                    std::to_string(o.vocab_size) + " pieces: " + st.ToString() +
                    " (a smaller --tokenizer-train, or more text)");
  }
  return model;
}

// ---- the tokenizer of a token file ----------------------------------------------------------------

std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, std::string model, const std::string& origin) {
  if (kind == TokenizerKind::BYTE) {
    if (!model.empty())
      throw DataError(origin + ": the byte tokenizer has no model, but " + std::to_string(model.size()) +
                      " bytes of one are recorded");
    return std::make_unique<ByteTokenizer>();
  }
  return std::make_unique<SentencePieceTokenizer>(std::move(model), origin);
}

std::string model_path_for(const std::string& token_path) {
  return std::filesystem::path(token_path).replace_extension(".model").string();
}

std::string read_model_file(const std::string& path) {
  try {
    return io::read_regular(path, 0);  // only a regular file: a FIFO named as a model is refused, not waited on
  } catch (const io::FileError& e) {
    throw DataError("tokenizer model '" + path + "': " + e.what());
  }
}

std::unique_ptr<Tokenizer> tokenizer_of(const TokenFile& file) {
  const TokenizerStamp& stamp = file.tokenizer();
  if (stamp.kind == TokenizerKind::BYTE) return std::make_unique<ByteTokenizer>();
  const std::string path = model_path_for(file.path());
  const std::string head = "token file '" + file.path() + "' was written with the SentencePiece model '" + path + "'";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw DataError(head + ", which does not exist (expected the model `piper prepare` wrote beside it)");
  std::string bytes = read_model_file(path);
  if (model_hash(bytes) != stamp.hash)
    throw DataError(head + " with hash " + std::to_string(stamp.hash) + ", but that file's hash is " +
                    std::to_string(model_hash(bytes)) + ": another model (prepare the text again with this model)");
  auto tok = std::make_unique<SentencePieceTokenizer>(std::move(bytes), "'" + path + "'");
  if (static_cast<uint32_t>(tok->vocab_size()) != file.vocab_size())
    throw DataError(head + " of " + std::to_string(tok->vocab_size()) + " pieces, but the file's vocab size is " +
                    std::to_string(file.vocab_size()));
  return tok;
}

}  // namespace piper::data
