// test_data.cpp — unit tests of src/data: token file round trip, the data order's wrapping,
// every open/write error's message, the byte tokenizer and `prepare`.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
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

template <typename U>
void put(std::string& s, U v) {
  char b[sizeof(U)];
  std::memcpy(b, &v, sizeof(U));  // little-endian host (static_assert in token_file.cpp)
  s.append(b, sizeof(U));
}

// A token file's bytes, field by field, so each test row can break one field.
struct RawFile {
  std::string magic = "PIPERTOK";
  uint32_t version = 2, vocab = 10, width = 2, kind = 0;
  uint64_t count = 4, hash = 0;
  std::vector<uint32_t> ids = {1, 2, 3, 4};
  std::string bytes() const {
    std::string s = magic;
    put(s, version);
    put(s, vocab);
    put(s, width);
    put(s, kind);
    put(s, count);
    put(s, hash);
    for (uint32_t id : ids) {
      if (width == 4)
        put(s, id);
      else
        put(s, static_cast<uint16_t>(id));
    }
    return s;
  }
};

std::vector<int32_t> iota_ids(int n) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

}  // namespace

// ---- round trip -----------------------------------------------------------------------------

TEST(TokenFile, RoundTripWidth2) {
  TempDir dir;
  const std::string path = dir / "w2.tok";
  std::mt19937 rng(7);
  std::vector<int32_t> ids(1000);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % 65536);
  ids[17] = 65535;  // the largest id a 2-byte file can hold
  write_token_file(path, 65536, ids);
  EXPECT_EQ(fs::file_size(path), 40u + 2u * ids.size());

  const TokenFile f(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.vocab_size(), 65536u);
  EXPECT_EQ(f.id_width(), 2u);
  ASSERT_EQ(f.size(), static_cast<int64_t>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(f.at(static_cast<int64_t>(i)), ids[i]) << i;
}

TEST(TokenFile, RoundTripWidth4) {
  TempDir dir;
  const std::string path = dir / "w4.tok";
  std::mt19937 rng(8);
  std::vector<int32_t> ids(1000);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % 70000);
  ids[3] = 69999;
  write_token_file(path, 70000, ids);
  EXPECT_EQ(fs::file_size(path), 40u + 4u * ids.size());

  const TokenFile f(path);
  EXPECT_EQ(f.vocab_size(), 70000u);
  EXPECT_EQ(f.id_width(), 4u);
  ASSERT_EQ(f.size(), static_cast<int64_t>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(f.at(static_cast<int64_t>(i)), ids[i]) << i;
}

TEST(TokenFile, HeaderLayoutIsAsDocumented) {
  TempDir dir;
  const std::string path = dir / "h.tok";
  write_token_file(path, 256, {0x41, 0xff, 7});
  RawFile want;
  want.vocab = 256;
  want.count = 3;
  want.ids = {0x41, 0xff, 7};
  EXPECT_EQ(read_bytes(path), want.bytes());
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) entries += e.is_regular_file();
  EXPECT_EQ(entries, 1) << "the temporary file was left behind";
}

TEST(TokenFile, MoveKeepsTheMapping) {
  TempDir dir;
  const std::string path = dir / "m.tok";
  write_token_file(path, 16, iota_ids(10));
  TokenFile a(path);
  TokenFile b(std::move(a));
  EXPECT_EQ(b.at(9), 9);
  TokenFile c(path);
  c = std::move(b);
  EXPECT_EQ(c.size(), 10);
  EXPECT_EQ(c.at(4), 4);
}

TEST(TokenFile, AtOutOfRangeThrows) {
  TempDir dir;
  const std::string path = dir / "r.tok";
  write_token_file(path, 16, iota_ids(5));
  const TokenFile f(path);
  EXPECT_THROW(f.at(5), DataError);
  EXPECT_THROW(f.at(-1), DataError);
}

// ---- data order (docs/model.md, "Data order") ------------------------------------------------

// Token (g*T + i) mod n for i = 0..T; ids are 0..n-1, so the id is the index.
void expect_samples_wrap(uint32_t vocab, int n) {
  TempDir dir;
  const std::string path = dir / "s.tok";
  write_token_file(path, vocab, iota_ids(n));
  const TokenFile f(path);
  for (int64_t T : {1, 2, 3, 9, 10, 11, 25}) {
    std::vector<int32_t> out(T + 1);
    for (int64_t g = 0; g < 40; ++g) {
      f.sample(g, T, out.data());
      for (int64_t i = 0; i <= T; ++i) {
        ASSERT_EQ(out[i], (g * T + i) % n) << "g=" << g << " T=" << T << " i=" << i;
      }
    }
  }
  // g * T beyond int64 (g = 2^61, T = 2^10): still (g*T + i) mod n, computed exactly.
  // 2^k mod n by doubling, so the expectation needs no wide integers.
  const auto pow2_mod = [n](int k) {
    int64_t r = 1 % n;
    for (int j = 0; j < k; ++j) r = 2 * r % n;
    return r;
  };
  const int64_t g = int64_t{1} << 61, T = 1024;
  std::vector<int32_t> out(T + 1);
  f.sample(g, T, out.data());
  for (int64_t i = 0; i <= T; ++i) {
    ASSERT_EQ(out[i], (pow2_mod(71) + i) % n) << "i=" << i;
  }
  EXPECT_THROW(f.sample(-1, 4, out.data()), DataError);
  EXPECT_THROW(f.sample(0, 0, out.data()), DataError);
}

TEST(TokenFile, SampleWrapsAsSpecWidth2) { expect_samples_wrap(16, 10); }
TEST(TokenFile, SampleWrapsAsSpecWidth4) { expect_samples_wrap(100000, 7); }

// ---- errors: every message names the file and the reason -------------------------------------

struct OpenErrorCase {
  const char* name;
  std::function<void(const std::string& path)> make;  // writes the broken file at path
  std::vector<std::string> reason;                    // substrings of the message
};

TEST(TokenFile, EveryOpenErrorNamesFileAndReason) {
  const auto raw = [](std::function<void(RawFile&)> edit) {
    return [edit](const std::string& path) {
      RawFile r;
      edit(r);
      write_bytes(path, r.bytes());
    };
  };
  const std::vector<OpenErrorCase> cases = {
      {"missing", [](const std::string&) {}, {"cannot open", std::strerror(ENOENT)}},
      {"directory", [](const std::string& p) { fs::create_directory(p); }, {"not a regular file"}},
      {"empty", [](const std::string& p) { write_bytes(p, ""); }, {"0 bytes", "40-byte header"}},
      {"short",
       [](const std::string& p) { write_bytes(p, RawFile().bytes().substr(0, 39)); },
       {"39 bytes", "shorter than the 40-byte header"}},
      {"bad_magic",
       raw([](RawFile& r) { r.magic = "GPT2TOK\x01"; }),
       {"not a piper token file", "GPT2TOK\\x01", "expected \"PIPERTOK\""}},
      {"version",
       raw([](RawFile& r) { r.version = 3; }),
       {"unsupported format version 3", "expected version 2"}},
      {"version1",
       raw([](RawFile& r) { r.version = 1; }),
       {"unsupported format version 1", "written by an earlier piper", "piper prepare"}},
      {"width3",
       raw([](RawFile& r) { r.width = 3; }),
       {"unsupported id width 3", "expected 2 or 4"}},
      {"width8", raw([](RawFile& r) { r.width = 8; }), {"unsupported id width 8"}},
      {"vocab0", raw([](RawFile& r) { r.vocab = 0; }), {"vocab size 0 is out of range"}},
      {"kind",
       raw([](RawFile& r) { r.kind = 5; }),
       {"tokenizer kind 5 is unknown", "expected 0, byte, or 1, sentencepiece"}},
      {"byte_hash",
       raw([](RawFile& r) { r.hash = 77; }),
       {"byte tokenizer's model hash is 77", "expected 0"}},
      {"truncated",
       raw([](RawFile& r) { r.count = 5; }),
       {"file is 48 bytes", "header says 5 tokens of 2 bytes", "40 + 5 * 2 = 50"}},
      {"trailing",
       raw([](RawFile& r) { r.count = 3; }),
       {"file is 48 bytes", "header says 3 tokens", "= 46 bytes"}},
      {"huge_count",
       raw([](RawFile& r) { r.count = UINT64_MAX; }),
       {"header says 18446744073709551615 tokens"}},
      {"id_too_big",
       raw([](RawFile& r) {
         r.ids = {1, 9, 10, 11};
       }),
       {"token id 10 at index 2", "vocab size 10", "expected every id < 10"}},
      {"id_too_big_w4",
       raw([](RawFile& r) {
         r.width = 4;
         r.ids = {0, 1, 2, 0xFFFFFFFFu};
       }),
       {"token id 4294967295 at index 3"}},
      {"one_token",
       raw([](RawFile& r) {
         r.count = 1;
         r.ids = {3};
       }),
       {"holds 1 tokens", "expected at least 2"}},
      {"no_tokens",
       raw([](RawFile& r) {
         r.count = 0;
         r.ids = {};
       }),
       {"holds 0 tokens"}},
  };
  TempDir dir;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir / (std::string(c.name) + ".tok");
    c.make(path);
    try {
      TokenFile f(path);
      ADD_FAILURE() << "opened a broken file";
    } catch (const DataError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + path + "'"), std::string::npos) << msg;
      for (const auto& r : c.reason)
        EXPECT_NE(msg.find(r), std::string::npos) << "want '" << r << "' in: " << msg;
    }
  }
}

TEST(TokenFile, WriteErrorsNameFileAndReasonAndLeaveNothing) {
  TempDir dir;
  const std::string path = dir / "bad.tok";
  const auto expect_error = [&](uint32_t vocab, const std::vector<int32_t>& ids,
                                const std::string& reason) {
    try {
      write_token_file(path, vocab, ids);
      ADD_FAILURE() << "wrote " << reason;
    } catch (const DataError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(reason), std::string::npos) << msg;
    }
  };
  expect_error(10, {1, 10, 2}, "token id 10 at index 1");
  expect_error(10, {1, -1, 2}, "token id -1 at index 1");
  expect_error(10, {1}, "1 tokens (expected at least 2");
  expect_error(0, {0, 0}, "vocab size 0");
  EXPECT_FALSE(fs::exists(path));
  write_token_file(path, 10, {1, 2});
  EXPECT_TRUE(fs::exists(path));
  const std::string in_missing_dir = dir / "no/such/dir/x.tok";
  try {
    write_token_file(in_missing_dir, 10, {1, 2});
    ADD_FAILURE();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(std::strerror(ENOENT)), std::string::npos) << e.what();
  }
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) entries += e.is_regular_file();
  EXPECT_EQ(entries, 1);
}

TEST(TokenFile, CheckVocabNamesBothSizes) {
  TempDir dir;
  const std::string path = dir / "v.tok";
  write_token_file(path, 300, {0, 299, 5});
  const TokenFile f(path);
  EXPECT_NO_THROW(check_vocab(f, 300));
  EXPECT_NO_THROW(check_vocab(f, 1024));
  try {
    check_vocab(f, 256);
    ADD_FAILURE();
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("vocab size 300"), std::string::npos) << msg;
    EXPECT_NE(msg.find("vocab_size is 256"), std::string::npos) << msg;
  }
}

// ---- only regular files, of the size their header says ------------------------------------------

namespace {

// A hung open() ends the test binary after 10 s instead of hanging ctest.
struct Alarm {
  explicit Alarm(unsigned s) { ::alarm(s); }
  ~Alarm() { ::alarm(0); }
};

std::string open_error(const std::string& path) {
  try {
    TokenFile f(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TokenFile, AFifoIsRefusedWithoutWaitingForAWriter) {
  TempDir dir;
  const std::string path = dir / "corpus.tok";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  Alarm guard(10);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = open_error(path);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  EXPECT_NE(msg.find("token file '" + path + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a regular file: it is a FIFO (named pipe)"), std::string::npos) << msg;
}

TEST(TokenFile, ADeviceIsRefused) {
  const std::string msg = open_error("/dev/null");
  EXPECT_NE(msg.find("token file '/dev/null': not a regular file: it is a character device"), std::string::npos)
      << msg;
}

TEST(TokenFile, AHeaderClaimingMoreTokensThanTheFileHoldsIsRefused) {
  TempDir dir;
  const std::string path = dir / "short.tok";
  RawFile r;
  r.count = uint64_t{1} << 40;  // 2 TiB of ids claimed, 8 bytes present
  write_bytes(path, r.bytes());
  const std::string msg = open_error(path);
  EXPECT_NE(msg.find("token file '" + path + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("file is 48 bytes but its header says 1099511627776 tokens of 2 bytes"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("truncated or corrupt"), std::string::npos) << msg;
}

// ---- tokenizer --------------------------------------------------------------------------------

TEST(ByteTokenizer, RoundTripsEveryByte) {
  const ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 256);
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  all += "Hello, world!\n\tcaf\xc3\xa9";
  const std::vector<int32_t> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), all.size());
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(ids[i], static_cast<int32_t>(i));
  EXPECT_EQ(tok.decode(ids), all);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{65, 256}), DataError);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{-1}), DataError);
}

TEST(ByteTokenizer, DecodePrintableMasksControlBytes) {
  const ByteTokenizer tok;
  const std::vector<int32_t> ids = {'a', '\n', '\t', 0, 27, '~', 127, 0xc3, 0xa9, 300, -5, ' '};
  EXPECT_EQ(tok.decode_printable(ids), "a\n\t??~????? ");
}

// ---- prepare ----------------------------------------------------------------------------------

TEST(Prepare, ConcatenatesSortedDocumentsWithBlankLines) {
  TempDir dir;
  fs::create_directories(dir.path / "in" / "sub");
  write_bytes(dir / "in/b.txt", "second\n");
  write_bytes(dir / "in/a.txt", "first");  // no trailing newline
  write_bytes(dir / "in/sub/c.txt", "third\n");
  write_bytes(dir / "in/empty.txt", "");
  write_bytes(dir / "extra.txt", "fourth\n");
  const std::string out = dir / "out/corpus.tok";  // directory made by prepare

  const int64_t n = prepare({dir / "in", dir / "extra.txt"}, out, {}).tokens;
  const std::string want = "first\n\nsecond\n\nthird\n\nfourth\n";
  EXPECT_EQ(n, static_cast<int64_t>(want.size()));

  const TokenFile f(out);
  EXPECT_EQ(f.vocab_size(), 256u);
  EXPECT_EQ(f.id_width(), 2u);
  ASSERT_EQ(f.size(), n);
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = f.at(i);
  EXPECT_EQ(ByteTokenizer().decode(ids), want);
}

TEST(Prepare, SkipsItsOwnOutputOnARerun) {
  TempDir dir;
  write_bytes(dir / "a.txt", "hello\n");
  const std::string out = dir / "a.tok";
  EXPECT_EQ(prepare({dir.path.string()}, out, {}).tokens, 6);
  EXPECT_EQ(prepare({dir.path.string()}, out, {}).tokens, 6);
}

TEST(Prepare, ErrorsNameTheInput) {
  TempDir dir;
  const std::string missing = dir / "nope.txt";
  const auto expect_error = [&](const std::vector<std::string>& inputs, const std::string& reason) {
    try {
      prepare(inputs, dir / "o.tok", {});
      ADD_FAILURE() << reason;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  };
  expect_error({}, "no inputs");
  expect_error({missing}, "'" + missing + "' does not exist");
  write_bytes(dir / "empty.txt", "");
  expect_error({dir / "empty.txt"}, "the inputs hold 0 tokens");
  fs::create_directory(dir.path / "empty_dir");
  expect_error({dir / "empty_dir"}, "the inputs hold 0 tokens");
}
