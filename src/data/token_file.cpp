// token_file.cpp — opening, validating, sampling and writing token files (docs/data.md).
#include "data/token_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "io/regular_file.hpp"

namespace piper::data {

// Ids and header fields are read and written as native integers.
static_assert(std::endian::native == std::endian::little, "token files are little-endian");

namespace {

__extension__ typedef unsigned __int128 u128;  // for (g * T) mod n without overflow

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError("token file '" + path + "': " + what);
}

template <typename U>
U load_le(const unsigned char* p) {
  U v;
  std::memcpy(&v, p, sizeof(U));
  return v;
}

template <typename U>
void store_le(unsigned char* p, U v) {
  std::memcpy(p, &v, sizeof(U));
}

// The magic as printable text, non-printable bytes as \xNN.
std::string escape_magic(const unsigned char* p) {
  std::string s;
  for (int i = 0; i < 8; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\') {
      s += static_cast<char>(p[i]);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", p[i]);
      s += buf;
    }
  }
  return s;
}

// Index of the first id >= limit among n ids of type U, or -1. A fast pass takes the maximum
// (vectorised; threaded on big files); only a file with a bad id pays for the second pass.
template <typename U>
int64_t first_id_at_least(const unsigned char* ids, int64_t n, uint64_t limit) {
  U mx = 0;
#pragma omp parallel for reduction(max : mx) schedule(static) if (n > (int64_t{1} << 24))
  for (int64_t i = 0; i < n; ++i) {
    const U v = load_le<U>(ids + i * static_cast<int64_t>(sizeof(U)));
    mx = v > mx ? v : mx;
  }
  if (mx < limit) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (load_le<U>(ids + i * static_cast<int64_t>(sizeof(U))) >= limit) return i;
  }
  return -1;
}

// out[k] = id (first + k), k < count, converted from U.
template <typename U>
void copy_ids(const unsigned char* ids, int64_t first, int64_t count, int32_t* out) {
  const unsigned char* p = ids + first * static_cast<int64_t>(sizeof(U));
  for (int64_t k = 0; k < count; ++k) {
    out[k] = static_cast<int32_t>(load_le<U>(p + k * static_cast<int64_t>(sizeof(U))));
  }
}

}  // namespace

TokenFile::TokenFile(const std::string& path) : path_(path) {
  // Only a regular file is opened (io::open_regular: a FIFO, a device or a directory is refused before the
  // open, which would wait for a writer forever).
  io::Opened f{};
  try {
    f = io::open_regular(path);
  } catch (const io::FileError& e) {
    fail(path, std::string(e.what()) + " (expected a readable token file; `piper prepare` makes one)");
  }
  const int fd = f.fd;
  const auto file_bytes = static_cast<uint64_t>(f.bytes);
  if (file_bytes < static_cast<uint64_t>(kTokenHeaderBytes)) {
    ::close(fd);
    fail(path, "file is " + std::to_string(file_bytes) + " bytes, shorter than the " +
                   std::to_string(kTokenHeaderBytes) +
                   "-byte header (expected a piper token file)");
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping stays valid
  if (map == MAP_FAILED) fail(path, std::string("cannot mmap: ") + std::strerror(map_errno));
  map_ = map;
  map_bytes_ = file_bytes;

  try {
    const auto* h = static_cast<const unsigned char*>(map_);
    if (std::memcmp(h, kTokenMagic, sizeof kTokenMagic) != 0) {
      fail(path,
           "not a piper token file (magic is \"" + escape_magic(h) + "\", expected \"PIPERTOK\")");
    }
    const auto version = load_le<uint32_t>(h + 8);
    vocab_size_ = load_le<uint32_t>(h + 12);
    id_width_ = load_le<uint32_t>(h + 16);
    const auto kind = load_le<uint32_t>(h + 20);
    const auto count = load_le<uint64_t>(h + 24);
    if (version != kTokenFormatVersion) {
      fail(path, "unsupported format version " + std::to_string(version) + " (expected version " +
                     std::to_string(kTokenFormatVersion) +
                     (version < kTokenFormatVersion ? "; written by an earlier piper: run `piper prepare` on its text again)"
                                                    : ")"));
    }
    if (id_width_ != 2 && id_width_ != 4) {
      fail(path, "unsupported id width " + std::to_string(id_width_) + " bytes (expected 2 or 4)");
    }
    if (vocab_size_ == 0 || vocab_size_ > static_cast<uint32_t>(INT32_MAX)) {
      fail(path, "vocab size " + std::to_string(vocab_size_) + " is out of range (expected 1 to " +
                     std::to_string(INT32_MAX) + ")");
    }
    if (kind >= kTokenizerKindCount) {
      fail(path, "tokenizer kind " + std::to_string(kind) + " is unknown (expected 0, byte, or 1, sentencepiece)");
    }
    tokenizer_ = {static_cast<TokenizerKind>(kind), load_le<uint64_t>(h + 32)};
    if (tokenizer_.kind == TokenizerKind::BYTE && tokenizer_.hash != 0) {
      fail(path, "the byte tokenizer's model hash is " + std::to_string(tokenizer_.hash) +
                     " (expected 0: the byte tokenizer has no model file)");
    }
    const uint64_t payload = file_bytes - kTokenHeaderBytes;
    if (count > payload / id_width_ || payload != count * id_width_) {
      std::string expected = std::to_string(kTokenHeaderBytes) + " + " + std::to_string(count) +
                             " * " + std::to_string(id_width_);
      if (count <= (UINT64_MAX - kTokenHeaderBytes) / id_width_) {
        expected += " = " + std::to_string(kTokenHeaderBytes + count * id_width_);
      }
      fail(path, "file is " + std::to_string(file_bytes) + " bytes but its header says " +
                     std::to_string(count) + " tokens of " + std::to_string(id_width_) +
                     " bytes (expected " + expected + " bytes; truncated or corrupt)");
    }
    size_ = static_cast<int64_t>(count);
    if (size_ < kTokenMinCount) {
      fail(path, "holds " + std::to_string(size_) + " tokens (expected at least " +
                     std::to_string(kTokenMinCount) + ": an input and its next-token target)");
    }
    ids_ = h + kTokenHeaderBytes;
    const int64_t bad = id_width_ == 2 ? first_id_at_least<uint16_t>(ids_, size_, vocab_size_)
                                       : first_id_at_least<uint32_t>(ids_, size_, vocab_size_);
    if (bad >= 0) {
      fail(path, "token id " + std::to_string(static_cast<uint32_t>(load(bad))) + " at index " +
                     std::to_string(bad) + " is not below the vocab size " +
                     std::to_string(vocab_size_) + " (expected every id < " +
                     std::to_string(vocab_size_) + ")");
    }
  } catch (...) {
    release();
    throw;
  }
}

TokenFile::~TokenFile() { release(); }

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      ids_(std::exchange(other.ids_, nullptr)),
      vocab_size_(std::exchange(other.vocab_size_, 0)),
      id_width_(std::exchange(other.id_width_, 0)),
      tokenizer_(std::exchange(other.tokenizer_, {})),
      size_(std::exchange(other.size_, 0)) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    ids_ = std::exchange(other.ids_, nullptr);
    vocab_size_ = std::exchange(other.vocab_size_, 0);
    id_width_ = std::exchange(other.id_width_, 0);
    tokenizer_ = std::exchange(other.tokenizer_, {});
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void TokenFile::release() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  ids_ = nullptr;
}

int32_t TokenFile::load(int64_t i) const {
  return id_width_ == 2 ? static_cast<int32_t>(load_le<uint16_t>(ids_ + 2 * i))
                        : static_cast<int32_t>(load_le<uint32_t>(ids_ + 4 * i));
}

int32_t TokenFile::at(int64_t i) const {
  if (i < 0 || i >= size_) {
    fail(path_, "token index " + std::to_string(i) + " is out of range (expected 0 to " +
                    std::to_string(size_ - 1) + ")");
  }
  return load(i);
}

void TokenFile::sample(const TokenRange& r, int64_t g, int64_t T, int32_t* out) const {
  if (g < 0 || T < 1) {
    fail(path_, "sample(g=" + std::to_string(g) + ", T=" + std::to_string(T) +
                    ") is invalid (expected g >= 0 and T >= 1)");
  }
  if (r.first < 0 || r.count < 1 || r.first > size_ - r.count) {
    fail(path_, "tokens [" + std::to_string(r.first) + ", " + std::to_string(r.first) + " + " +
                    std::to_string(r.count) + ") are not a non-empty stretch of its " + std::to_string(size_) +
                    " tokens");
  }
  // (g * T) mod count, without overflow for any g, T.
  const auto n = static_cast<u128>(r.count);
  auto pos = static_cast<int64_t>(static_cast<u128>(g) % n * (static_cast<u128>(T) % n) % n);
  int64_t left = T + 1;  // out[0..T]
  while (left > 0) {     // contiguous runs up to the end of the range, then wrap to its start
    const int64_t run = std::min(left, r.count - pos);
    if (id_width_ == 2) {
      copy_ids<uint16_t>(ids_, r.first + pos, run, out);
    } else {
      copy_ids<uint32_t>(ids_, r.first + pos, run, out);
    }
    out += run;
    left -= run;
    pos = 0;
  }
}

void write_token_file(const std::string& path, uint32_t vocab_size, const std::vector<int32_t>& ids,
                      const TokenizerStamp& tokenizer) {
  const std::string what = "cannot write";
  if (vocab_size == 0 || vocab_size > static_cast<uint32_t>(INT32_MAX)) {
    fail(path, what + ": vocab size " + std::to_string(vocab_size) +
                   " is out of range (expected 1 to " + std::to_string(INT32_MAX) + ")");
  }
  if (static_cast<int64_t>(ids.size()) < kTokenMinCount) {
    fail(path, what + ": " + std::to_string(ids.size()) + " tokens (expected at least " +
                   std::to_string(kTokenMinCount) + ": an input and its next-token target)");
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || static_cast<uint32_t>(ids[i]) >= vocab_size) {
      fail(path, what + ": token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                     " is outside the vocabulary (expected 0 <= id < " +
                     std::to_string(vocab_size) + ")");
    }
  }
  if (tokenizer.kind == TokenizerKind::BYTE && tokenizer.hash != 0) {
    fail(path, what + ": the byte tokenizer has no model file, so no model hash (given " +
                   std::to_string(tokenizer.hash) + ")");
  }
  const uint32_t width = vocab_size <= 65536 ? 2 : 4;

  unsigned char header[kTokenHeaderBytes] = {};
  std::memcpy(header, kTokenMagic, sizeof kTokenMagic);
  store_le<uint32_t>(header + 8, kTokenFormatVersion);
  store_le<uint32_t>(header + 12, vocab_size);
  store_le<uint32_t>(header + 16, width);
  store_le<uint32_t>(header + 20, static_cast<uint32_t>(tokenizer.kind));
  store_le<uint64_t>(header + 24, ids.size());
  store_le<uint64_t>(header + 32, tokenizer.hash);

  // A name unique to this process and call, beside the target so rename stays atomic.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    fail(path, what + " temporary file '" + tmp + "': " + std::strerror(errno));
  }
  bool ok = std::fwrite(header, 1, sizeof header, f) == sizeof header;
  std::vector<unsigned char> buf;
  constexpr size_t kChunk = size_t{1} << 16;  // ids per write
  for (size_t first = 0; ok && first < ids.size(); first += kChunk) {
    const size_t count = std::min(kChunk, ids.size() - first);
    buf.resize(count * width);
    for (size_t k = 0; k < count; ++k) {
      if (width == 2) {
        store_le<uint16_t>(buf.data() + 2 * k, static_cast<uint16_t>(ids[first + k]));
      } else {
        store_le<uint32_t>(buf.data() + 4 * k, static_cast<uint32_t>(ids[first + k]));
      }
    }
    ok = std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
  }
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    fail(path, what + ": " + std::strerror(err));
  }
}

void check_vocab(const TokenFile& file, int64_t model_vocab) {
  if (static_cast<int64_t>(file.vocab_size()) > model_vocab) {
    throw DataError(
        "token file '" + file.path() + "' has vocab size " + std::to_string(file.vocab_size()) +
        " but the model's vocab_size is " + std::to_string(model_vocab) +
        " (expected the model's vocab_size >= " + std::to_string(file.vocab_size()) + ")");
  }
}

}  // namespace piper::data
