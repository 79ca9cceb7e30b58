// fuzz.hpp — what every fuzz harness of tests/fuzz shares (docs/testing.md).
//
// A harness is `extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t)`: it feeds the bytes to one
// reader of the project and returns 0. The reader's documented error (ConfigError, DataError,
// CheckpointError, the simulator's std::invalid_argument, ...) is a correct refusal: the harness catches
// exactly that type and counts it. Anything else — std::bad_alloc, std::out_of_range, a library's own
// exception, a crash, a sanitizer report — escapes and fails the run. The same harness links with
// tests/fuzz/driver.cpp (g++, ctest: seeds plus deterministic mutations) or with clang's libFuzzer
// (`make fuzz`).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace piper::fuzz {

// Inputs a reader refused with its documented error, and inputs it accepted; the g++ driver prints both.
inline long refused = 0;
inline long accepted = 0;

// A check a harness makes on what a reader accepted (a round trip, an invariant the reader documents). It
// throws std::logic_error, which no harness catches, so the run fails with `what` as the message.
inline void require(bool ok, const std::string& what) {
  if (!ok) throw std::logic_error("fuzz invariant violated: " + what);
}

// A scratch file of this process for readers that open a path: DIR/piper-fuzz-<pid>-<tag>, removed at exit;
// DIR is $TMPDIR, else /dev/shm (memory: thousands of small files a second), else /tmp.
inline const std::string& scratch_path(const char* tag) {
  static const std::string path = [tag] {
    const char* env = std::getenv("TMPDIR");
    const std::string dir = env && *env ? env : ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string p = dir + "/piper-fuzz-" + std::to_string(::getpid()) + "-" + tag;
    static std::string remove_at_exit;
    remove_at_exit = p;
    std::atexit([] { std::remove(remove_at_exit.c_str()); });
    return p;
  }();
  return path;
}

// Writes the bytes to `path` (whole file replaced); a failure to write is the machine's, not the reader's.
inline void write_bytes(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("fuzz: cannot write the scratch file " + path);
  const bool ok = std::fwrite(data, 1, size, f) == size;
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error("fuzz: cannot write the scratch file " + path);
}

}  // namespace piper::fuzz
