// files.cpp — checkpoint names, the `latest` pointer, retention (files.hpp).
#include "checkpoint/files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "io/regular_file.hpp"

namespace piper::checkpoint {
namespace fs = std::filesystem;

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%08lld.h5", static_cast<long long>(step));
  return (fs::path(dir) / name).string();
}

std::string temp_path(const std::string& path) {
  fs::path p(path);
  return (p.parent_path() / ("." + p.filename().string() + ".tmp")).string();
}

int64_t step_of(const std::string& path) {
  static const std::regex re(R"(step_(\d+)\.h5)");
  std::smatch m;
  const std::string name = fs::path(path).filename().string();
  if (!std::regex_match(name, m, re)) return -1;
  return std::stoll(m[1].str());
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw CheckpointError("checkpoint " + path + ": cannot open to fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw CheckpointError("checkpoint " + path + ": fsync failed: " + std::strerror(err));
}

void update_latest(const std::string& dir, const std::string& path) {
  const std::string tmp = (fs::path(dir) / ".latest.tmp").string();
  const std::string dst = (fs::path(dir) / "latest").string();
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << fs::path(path).filename().string() << "\n";
    f.flush();
    if (!f) throw CheckpointError("checkpoint " + dst + ": cannot write " + tmp);
  }
  fsync_path(tmp);
  std::error_code ec;
  fs::rename(tmp, dst, ec);
  if (ec) throw CheckpointError("checkpoint " + dst + ": cannot rename " + tmp + ": " + ec.message());
  fsync_path(dir.empty() ? "." : dir);
}

namespace {

std::string read_latest(const fs::path& latest) {
  std::ifstream f(latest);
  std::string name;
  std::getline(f, name);
  while (!name.empty() && (name.back() == '\r' || name.back() == ' ' || name.back() == '\t')) name.pop_back();
  if (name.empty()) throw CheckpointError("checkpoint " + latest.string() + ": empty `latest` file");
  const fs::path target = fs::path(name).is_absolute() ? fs::path(name) : latest.parent_path() / name;
  if (!fs::is_regular_file(target))
    throw CheckpointError("checkpoint " + latest.string() + ": names " + target.string() + ", which does not exist");
  return target.string();
}

// step_*.h5 in dir, by step.
std::vector<std::pair<int64_t, fs::path>> list_steps(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    const int64_t s = step_of(e.path().string());
    if (s >= 0) out.emplace_back(s, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string resolve(const std::string& spec) {
  const fs::path p(spec);
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "latest")) return read_latest(p / "latest");
    auto steps = list_steps(p);
    if (steps.empty()) throw CheckpointError("checkpoint " + spec + ": no checkpoint in this directory");
    return steps.back().second.string();
  }
  if (fs::is_regular_file(p, ec)) {
    if (p.filename() == "latest") return read_latest(p);
    return p.string();
  }
  if (const std::string why = io::why_not_regular(spec); !why.empty())
    throw CheckpointError("checkpoint " + spec + ": " + why + " (expected a checkpoint file or a folder of them)");
  throw CheckpointError("checkpoint " + spec + ": no such file or directory");
}

void keep_last(const std::string& dir, int k) {
  if (k < 1) k = 1;
  const fs::path d(dir);
  std::string pinned;
  std::error_code ec;
  if (fs::exists(d / "latest")) {
    try {
      pinned = fs::path(read_latest(d / "latest")).filename().string();
    } catch (const CheckpointError&) {
    }
  }
  auto steps = list_steps(d);
  const size_t n = steps.size();
  for (size_t i = 0; i + static_cast<size_t>(k) < n; ++i) {
    if (steps[i].second.filename().string() == pinned) continue;
    fs::remove(steps[i].second, ec);
  }
  // Temporaries of saves that never finished (a job killed while saving): one save is in flight at a time, and
  // this one has finished, so every temporary left is of a save that never will.
  static const std::regex tmp_re(R"(\.step_(\d+)\.h5\.tmp)");
  for (const auto& e : fs::directory_iterator(d, ec))
    if (std::regex_match(e.path().filename().string(), tmp_re)) fs::remove(e.path(), ec);
}

}  // namespace piper::checkpoint
