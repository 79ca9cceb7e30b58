// driver.cpp — runs one fuzz harness without libFuzzer (the g++ build; ctest label `fuzz`).
//
//   fuzz_<reader> [options] PATH...      PATH: a corpus folder (every file in it) or one input file
//     --mutations N   deterministic mutations after the seeds (default 1000 with a folder, 0 with files only)
//     --seed S        seed of the mutation generator (default 1)
//     --max-len L     mutated inputs are cut to L bytes (default 65536)
//     --dict FILE     libFuzzer-style dictionary ("token" per line) used by the token mutations
//     --crash-dir D   where a failing input is written (default: the current folder)
//     --timeout S     one input running longer than S seconds fails the run (default 20)
//
// Every input goes to LLVMFuzzerTestOneInput. An exception escaping the harness (the harness catches only
// the reader's documented error), a crash or a timeout writes the input to D/crash-<reader>-<n>.bin, prints
// how to reproduce it and fails. The mutations are a fixed sequence for a given seed and corpus: bit flips,
// byte insert/delete/set, chunk copy, splicing two inputs, integer boundary values (binary and as text) and
// dictionary tokens, 1 to 4 of them stacked per input.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

// ---- the input being run, for the signal handlers -------------------------------------------
const Bytes* g_current = nullptr;
char g_crash_path[4096];
int g_timeout_s = 20;

void write_current() {
  if (!g_current) return;
  const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  size_t off = 0;
  while (off < g_current->size()) {
    const ssize_t w = ::write(fd, g_current->data() + off, g_current->size() - off);
    if (w <= 0) break;
    off += static_cast<size_t>(w);
  }
  ::close(fd);
}

void say(const char* s) { [[maybe_unused]] ssize_t r = ::write(2, s, std::strlen(s)); }

void on_fatal_signal(int sig) {
  write_current();
  say(sig == SIGALRM ? "\nfuzz: TIMEOUT on an input; written to " : "\nfuzz: CRASH (fatal signal) on an input; written to ");
  say(g_crash_path);
  say("\n");
  if (sig == SIGALRM) _exit(1);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

#if defined(__SANITIZE_ADDRESS__)  // g++ -fsanitize=address (PIPER_SANITIZE)
#define PIPER_FUZZ_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)  // clang
#define PIPER_FUZZ_SANITIZED 1
#endif
#endif
#ifdef PIPER_FUZZ_SANITIZED
extern "C" void __sanitizer_set_death_callback(void (*callback)(void));
// A sanitizer report ends the process without a signal this driver sees: write the input first.
void on_sanitizer_death() {
  write_current();
  say("\nfuzz: SANITIZER REPORT on an input (above); written to ");
  say(g_crash_path);
  say("\n");
}
#endif

void install_handlers() {
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM}) ::signal(sig, on_fatal_signal);
#ifdef PIPER_FUZZ_SANITIZED
  __sanitizer_set_death_callback(on_sanitizer_death);
#endif
}

// ---- deterministic randomness -----------------------------------------------------------------
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n ? static_cast<size_t>(next() % n) : 0; }
};

constexpr uint64_t kBoundaries[] = {0,
                                    1,
                                    2,
                                    0x7f,
                                    0x80,
                                    0xff,
                                    0x100,
                                    0x7fff,
                                    0x8000,
                                    0xffff,
                                    0x10000,
                                    0x7fffffff,
                                    0x80000000,
                                    0xffffffff,
                                    0x100000000ull,
                                    0x7fffffffffffffffull,
                                    0x8000000000000000ull,
                                    0xffffffffffffffffull,
                                    0xfffffffffffffffeull};
const char* const kTextNumbers[] = {"0",    "-1",         "1",     "-0",   "2147483647",  "2147483648",
                                    "4294967296",         "9223372036854775807", "9223372036854775808",
                                    "-9223372036854775808", "18446744073709551616", "1e308", "1e309", "-1e309",
                                    "5e-324", "0.0",      ".nan",  "nan",  ".inf",        "-.inf",
                                    "1e-310", "0x7fffffff", "99999999999999999999999"};

// Cuts `in` to max_len and returns it.
Bytes& cap(Bytes& in, size_t max_len) {
  if (in.size() > max_len) in.resize(max_len);
  return in;
}

// One mutation of `b`, in place.
void mutate_once(Bytes& b, const std::vector<Bytes>& pool, const std::vector<std::string>& dict, Rng& rng) {
  const size_t n = b.size();
  switch (rng.below(10)) {
    case 0:  // flip one bit
      if (n) b[rng.below(n)] ^= static_cast<uint8_t>(1u << rng.below(8));
      break;
    case 1:  // set a byte
      if (n) b[rng.below(n)] = static_cast<uint8_t>(rng.next());
      break;
    case 2: {  // insert 1..4 bytes
      const size_t at = rng.below(n + 1), k = 1 + rng.below(4);
      for (size_t i = 0; i < k; ++i) b.insert(b.begin() + static_cast<ptrdiff_t>(at + i), static_cast<uint8_t>(rng.next()));
      break;
    }
    case 3: {  // delete 1..16 bytes
      if (!n) break;
      const size_t at = rng.below(n), k = std::min(n - at, 1 + rng.below(16));
      b.erase(b.begin() + static_cast<ptrdiff_t>(at), b.begin() + static_cast<ptrdiff_t>(at + k));
      break;
    }
    case 4: {  // copy a chunk of the input over another place
      if (n < 2) break;
      const size_t from = rng.below(n), to = rng.below(n), k = std::min({n - from, n - to, 1 + rng.below(64)});
      std::memmove(b.data() + to, b.data() + from, k);
      break;
    }
    case 5: {  // splice: our head, another input's tail
      const Bytes& o = pool[rng.below(pool.size())];
      const size_t cut = rng.below(n + 1), from = rng.below(o.size() + 1);
      b.resize(cut);
      b.insert(b.end(), o.begin() + static_cast<ptrdiff_t>(from), o.end());
      break;
    }
    case 6: {  // a binary integer boundary value, little-endian, 1/2/4/8 bytes
      const size_t w = size_t{1} << rng.below(4);
      if (n < w) break;
      const uint64_t v = kBoundaries[rng.below(std::size(kBoundaries))];
      const size_t at = rng.below(n - w + 1);
      for (size_t i = 0; i < w; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
      break;
    }
    case 7: {  // a number written as text replaced by a boundary value (YAML, JSON)
      std::vector<size_t> starts;
      for (size_t i = 0; i < n; ++i)
        if (std::isdigit(b[i]) && (i == 0 || !std::isdigit(b[i - 1]))) starts.push_back(i);
      if (starts.empty()) break;
      const size_t at = starts[rng.below(starts.size())];
      size_t end = at;
      while (end < n && (std::isdigit(b[end]) || b[end] == '.' || b[end] == 'e' || b[end] == '-')) ++end;
      const char* t = kTextNumbers[rng.below(std::size(kTextNumbers))];
      b.erase(b.begin() + static_cast<ptrdiff_t>(at), b.begin() + static_cast<ptrdiff_t>(end));
      b.insert(b.begin() + static_cast<ptrdiff_t>(at), t, t + std::strlen(t));
      break;
    }
    case 8: {  // a dictionary token inserted or written over
      if (dict.empty()) break;
      const std::string& t = dict[rng.below(dict.size())];
      const size_t at = rng.below(n + 1);
      if (rng.below(2) && at + t.size() <= n)
        std::memcpy(b.data() + at, t.data(), t.size());
      else
        b.insert(b.begin() + static_cast<ptrdiff_t>(at), t.begin(), t.end());
      break;
    }
    default: {  // duplicate a line / a run (nesting, repeated keys)
      if (!n) break;
      const size_t at = rng.below(n), k = std::min(n - at, 1 + rng.below(32));
      Bytes run(b.begin() + static_cast<ptrdiff_t>(at), b.begin() + static_cast<ptrdiff_t>(at + k));
      b.insert(b.begin() + static_cast<ptrdiff_t>(at), run.begin(), run.end());
      break;
    }
  }
}

Bytes read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// libFuzzer's dictionary format: one "token" per line (optionally name="token"), \xNN and \\ \" escapes.
std::vector<std::string> read_dict(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "fuzz: cannot read the dictionary %s\n", path.c_str());
    std::exit(2);
  }
  std::string line;
  while (std::getline(f, line)) {
    const size_t q = line.find('"'), e = line.rfind('"');
    if (line.empty() || line[0] == '#' || q == std::string::npos || e <= q) continue;
    std::string t;
    for (size_t i = q + 1; i < e; ++i) {
      if (line[i] == '\\' && i + 1 < e) {
        if (line[i + 1] == 'x' && i + 3 < e) {
          t += static_cast<char>(std::stoi(line.substr(i + 2, 2), nullptr, 16));
          i += 3;
        } else {
          t += line[++i];
        }
      } else {
        t += line[i];
      }
    }
    out.push_back(t);
  }
  return out;
}

int usage() {
  std::fprintf(stderr,
               "usage: fuzz_<reader> [--mutations N] [--seed S] [--max-len L] [--dict FILE] [--crash-dir D] "
               "[--timeout S] PATH...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  long mutations = -1;  // default: see above
  uint64_t seed = 1;
  size_t max_len = 65536;
  std::string dict_path, crash_dir = ".";
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) std::exit(usage());
      return argv[++i];
    };
    if (a == "--mutations") mutations = std::stol(value());
    else if (a == "--seed") seed = std::stoull(value());
    else if (a == "--max-len") max_len = std::stoul(value());
    else if (a == "--dict") dict_path = value();
    else if (a == "--crash-dir") crash_dir = value();
    else if (a == "--timeout") g_timeout_s = std::stoi(value());
    else if (a.rfind("--", 0) == 0) return usage();
    else paths.push_back(a);
  }
  if (paths.empty()) return usage();
  if (mutations < 0) mutations = std::any_of(paths.begin(), paths.end(), [](const std::string& p) { return fs::is_directory(p); }) ? 1000 : 0;
  const std::string reader = fs::path(argv[0]).filename().string();
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);

  std::vector<Bytes> seeds;
  for (const std::string& p : paths) {
    if (fs::is_directory(p)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());  // a fixed order: the mutations depend on it
      for (const auto& f : files) seeds.push_back(read_file(f));
    } else if (fs::is_regular_file(p)) {
      seeds.push_back(read_file(p));
    } else {
      std::fprintf(stderr, "fuzz: %s is neither a file nor a folder\n", p.c_str());
      return 2;
    }
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "fuzz: no inputs in %s\n", paths[0].c_str());
    return 2;
  }
  const std::vector<std::string> dict = dict_path.empty() ? std::vector<std::string>{} : read_dict(dict_path);

  fs::create_directories(crash_dir);
  install_handlers();
  const auto t0 = std::chrono::steady_clock::now();
  Rng rng{seed};
  long done = 0;
  const long total = static_cast<long>(seeds.size()) + mutations;
  Bytes input;
  for (long it = 0; it < total; ++it) {
    if (it < static_cast<long>(seeds.size())) {
      input = seeds[static_cast<size_t>(it)];
    } else {
      input = seeds[rng.below(seeds.size())];
      const size_t k = 1 + rng.below(4);
      for (size_t m = 0; m < k; ++m) mutate_once(input, seeds, dict, rng);
      cap(input, max_len);
    }
    std::snprintf(g_crash_path, sizeof g_crash_path, "%s/crash-%s-%ld.bin", crash_dir.c_str(), reader.c_str(), it);
    g_current = &input;
    ::alarm(static_cast<unsigned>(g_timeout_s));
    try {
      LLVMFuzzerTestOneInput(input.data(), input.size());
    } catch (const std::exception& e) {
      ::alarm(0);
      write_current();
      std::fprintf(stderr, "fuzz: %s: input %ld (%s) raised an unexpected exception: %s\n  input written to %s\n"
                           "  reproduce: %s %s\n",
                   reader.c_str(), it, it < static_cast<long>(seeds.size()) ? "seed" : "mutation", e.what(),
                   g_crash_path, argv[0], g_crash_path);
      return 1;
    } catch (...) {
      ::alarm(0);
      write_current();
      std::fprintf(stderr, "fuzz: %s: input %ld raised an unexpected non-std exception\n  input written to %s\n",
                   reader.c_str(), it, g_crash_path);
      return 1;
    }
    ::alarm(0);
    g_current = nullptr;
    ++done;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("fuzz: %s: %ld inputs (%zu seeds + %ld mutations, seed %llu) in %.2f s (%.0f/s): %ld accepted, "
              "%ld refused with the documented error, 0 failures\n",
              reader.c_str(), done, seeds.size(), mutations, static_cast<unsigned long long>(seed), s,
              s > 0 ? static_cast<double>(done) / s : 0.0, piper::fuzz::accepted, piper::fuzz::refused);
  return 0;
}
