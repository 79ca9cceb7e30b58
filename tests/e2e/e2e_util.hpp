// e2e_util.hpp — running the piper binary from tests: commands, metrics
// files, parameter dumps and temporary folders.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace piper::e2e {

struct RunResult {
  int code = -1;       // exit status
  std::string output;  // stdout and stderr together
};

inline RunResult run(const std::string& cmd) {
  RunResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline std::string piper() { return PIPER_EXE; }
// The whole of a text file ("" when it cannot be read).
inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
inline std::string corpus() { return std::string(PIPER_BINARY_DIR) + "/data/corpus.tok"; }
inline std::string source(const std::string& rel) { return std::string(PIPER_SOURCE_DIR) + "/" + rel; }

// A fresh folder under the system temp dir, removed with the object.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = std::filesystem::temp_directory_path() /
            ("piper-e2e-" + tag + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name)) << text;
    return file(name);
  }

 private:
  std::filesystem::path path_;
};

inline std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// PIPERPRM parameter dump: name -> values.
inline std::map<std::string, std::vector<float>> read_params(const std::string& path) {
  std::map<std::string, std::vector<float>> out;
  std::ifstream f(path, std::ios::binary);
  char magic[8];
  f.read(magic, 8);
  if (!f || std::memcmp(magic, "PIPERPRM", 8) != 0) return out;
  uint32_t version = 0, count = 0;
  f.read(reinterpret_cast<char*>(&version), 4);
  f.read(reinterpret_cast<char*>(&count), 4);
  for (uint32_t t = 0; t < count && f; ++t) {
    uint32_t len = 0, ndim = 0;
    f.read(reinterpret_cast<char*>(&len), 4);
    std::string name(len, '\0');
    f.read(name.data(), len);
    f.read(reinterpret_cast<char*>(&ndim), 4);
    int64_t numel = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      int64_t dim = 0;
      f.read(reinterpret_cast<char*>(&dim), 8);
      numel *= dim;
    }
    std::vector<float> v(static_cast<size_t>(numel));
    f.read(reinterpret_cast<char*>(v.data()), numel * 4);
    out[name] = std::move(v);
  }
  return out;
}

}  // namespace piper::e2e
