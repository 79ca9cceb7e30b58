// tokenizer.hpp — the byte-level tokenizer: one token per byte of UTF-8 (or any) text, vocab 256.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace piper::data {

class ByteTokenizer {
 public:
  static constexpr int32_t kVocabSize = 256;
  int32_t vocab_size() const { return kVocabSize; }

  // Each byte of text becomes one id in [0, 256).
  std::vector<int32_t> encode(std::string_view text) const;

  // The exact bytes back: decode(encode(s)) == s. Throws DataError on an id outside [0, 256).
  std::string decode(std::span<const int32_t> ids) const;

  // Safe to print (model samples): printable ASCII, '\n' and '\t' as they are; every other
  // byte, and any id outside [0, 256), as '?'.
  std::string decode_printable(std::span<const int32_t> ids) const;
};

}  // namespace piper::data
