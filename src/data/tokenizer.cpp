// tokenizer.cpp — the byte-level tokenizer.
#include "data/tokenizer.hpp"

#include "data/token_file.hpp"

namespace piper::data {

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

}  // namespace piper::data
