// token_file.hpp — the on-disk token file (docs/data.md): a 32-byte little-endian header and a
// flat array of ids, memory-mapped read-only, and the samples of the data order (docs/model.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace piper::data {

// Every failure of this module: the message names the file, what was wrong and what was expected.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The tokenizer a token file's ids come from (docs/data.md, "Tokenizers").
enum class TokenizerKind : uint32_t {
  BYTE = 0,           // one id per byte, vocab 256
  SENTENCEPIECE = 1,  // a SentencePiece model, stored beside the token file (model_path_for)
};
inline constexpr uint32_t kTokenizerKindCount = 2;

// What a token file records of its tokenizer: the kind and, for SentencePiece, the hash of the
// model file's bytes (model_hash in tokenizer.hpp; 0 for the byte tokenizer).
struct TokenizerStamp {
  TokenizerKind kind = TokenizerKind::BYTE;
  uint64_t hash = 0;
  bool operator==(const TokenizerStamp&) const = default;
};

// Header layout (all little-endian):
//   offset  0  char[8]  magic "PIPERTOK"
//   offset  8  u32      format version (kTokenFormatVersion)
//   offset 12  u32      vocab size V (every id < V)
//   offset 16  u32      id width in bytes, 2 or 4
//   offset 20  u32      tokenizer kind (TokenizerKind)
//   offset 24  u64      token count n
//   offset 32  u64      tokenizer model hash (0 for the byte tokenizer)
//   offset 40  ids      n ids of `id width` bytes each, unsigned
inline constexpr char kTokenMagic[8] = {'P', 'I', 'P', 'E', 'R', 'T', 'O', 'K'};
inline constexpr uint32_t kTokenFormatVersion = 2;
inline constexpr int64_t kTokenHeaderBytes = 40;
inline constexpr int64_t kTokenMinCount = 2;  // one input and its next-token target

// A stretch of a token file's ids, [first, first + count): what the samples of the training order or of
// the held-out data are drawn from (docs/data.md, "Held-out data").
struct TokenRange {
  int64_t first = 0;
  int64_t count = 0;
  bool operator==(const TokenRange&) const = default;
};

// A validated, read-only, memory-mapped token file. Opening checks the header, the file size
// and every id (< vocab size), so a TokenFile that exists is well formed. Its tokenizer is
// opened by tokenizer_of (tokenizer.hpp).
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);  // throws DataError
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t vocab_size() const { return vocab_size_; }
  int64_t size() const { return size_; }  // token count n
  uint32_t id_width() const { return id_width_; }
  const TokenizerStamp& tokenizer() const { return tokenizer_; }

  // Token i, 0 <= i < size(); throws DataError otherwise.
  int32_t at(int64_t i) const;

  // Every id of the file: {0, size()}.
  TokenRange all() const { return {0, size_}; }

  // Global sample g of the range r (docs/model.md, "Data order"): out[i] = token r.first +
  // (g*T + i) mod r.count, for i = 0..T, i.e. T + 1 tokens (inputs out[0..T-1], targets
  // out[1..T]) wrapping to the start of the range. out has room for T + 1 ids. Throws DataError
  // unless g >= 0, T >= 1 and r is a non-empty stretch of the file.
  void sample(const TokenRange& r, int64_t g, int64_t T, int32_t* out) const;
  // The same over the whole file.
  void sample(int64_t g, int64_t T, int32_t* out) const { sample(all(), g, T, out); }

 private:
  int32_t load(int64_t i) const;  // unchecked
  void release() noexcept;

  std::string path_;
  void* map_ = nullptr;  // whole file, read-only
  size_t map_bytes_ = 0;
  const unsigned char* ids_ = nullptr;  // map_ + kTokenHeaderBytes
  uint32_t vocab_size_ = 0;
  uint32_t id_width_ = 0;
  TokenizerStamp tokenizer_;
  int64_t size_ = 0;
};

// Writes a token file atomically (to a temporary name beside `path`, then rename). The id width
// is 2 bytes when vocab_size <= 65536, else 4. Throws DataError on an id outside [0, vocab_size),
// fewer than kTokenMinCount ids, a byte stamp with a hash, or an I/O failure.
void write_token_file(const std::string& path, uint32_t vocab_size, const std::vector<int32_t>& ids,
                      const TokenizerStamp& tokenizer = {});

// Throws DataError when the file's vocab size exceeds the model's (it could hold ids the
// embedding has no row for), naming both sizes.
void check_vocab(const TokenFile& file, int64_t model_vocab);

}  // namespace piper::data
