// job.hpp — piper jobs under mpirun for the failure tests: the command line, the progress lines in the
// output, and a job run in the background whose ranks a test can find and signal (test_failures.cpp,
// test_reliability.cpp).
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "e2e/e2e_util.hpp"

namespace piper::e2e {

using Clock = std::chrono::steady_clock;

inline std::string mpirun(int np, const std::string& mca = "") {
  return "mpirun --oversubscribe --allow-run-as-root " + mca + "-np " + std::to_string(np) + " ";
}

inline std::string train_args(const std::string& sets) {
  return " train " + source("config/tiny.yaml") + " --set data.path=" + corpus() + " --set train.threads=1 " + sets;
}

inline size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + needle.size())) ++n;
  return n;
}

// Lines that start with "step " (the per-step progress lines of rank 0).
inline size_t step_lines(const std::string& text) {
  size_t n = text.rfind("step ", 0) == 0 ? 1 : 0;
  return n + count(text, "\nstep ");
}

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// mpirun in the background, its output in a file; killed (with its ranks) if still running at the end.
class Job {
 public:
  Job(const std::string& cmd, std::string out_path, std::string marker)
      : out_(std::move(out_path)), marker_(std::move(marker)) {
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);  // its own process group, so the cleanup can reach every rank
      execl("/bin/sh", "sh", "-c", ("exec " + cmd + " >" + out_ + " 2>&1").c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Job() {
    for (pid_t p : ranks()) kill(p, SIGCONT), kill(p, SIGKILL);  // a stalled rank left behind
    if (pid_ > 0 && !finished_) {
      kill(-pid_, SIGKILL);
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  std::string output() const {
    std::ifstream f(out_);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }
  // Waits until the output has a step line; false after `limit_s` or when the job ended first.
  bool wait_for_step(double limit_s) {
    const auto t0 = Clock::now();
    while (seconds_since(t0) < limit_s) {
      if (step_lines(output()) > 0) return true;
      if (poll()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  // Waits for the job to end; false after `limit_s`.
  bool wait_end(double limit_s) {
    const auto t0 = Clock::now();
    while (seconds_since(t0) < limit_s) {
      if (poll()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return poll();
  }
  int code() const { return code_; }

  // The pid of the process of world rank `rank`: a piper process whose command line holds the
  // marker and whose environment says OMPI_COMM_WORLD_RANK=rank; -1 when none.
  pid_t rank_pid(int rank) const {
    for (pid_t p : ranks())
      if (environ_of(p).count("OMPI_COMM_WORLD_RANK=" + std::to_string(rank))) return p;
    return -1;
  }

 private:
  bool poll() {
    if (finished_) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
    finished_ = true;
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return true;
  }
  static std::string read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }
  static std::set<std::string> environ_of(pid_t p) {
    std::set<std::string> vars;
    std::istringstream s(read_all("/proc/" + std::to_string(p) + "/environ"));
    for (std::string v; std::getline(s, v, '\0');) vars.insert(v);
    return vars;
  }
  std::vector<pid_t> ranks() const {
    std::vector<pid_t> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      const std::string cmdline = read_all(e.path().string() + "/cmdline");
      // argv[0] is the piper binary (not mpirun, not the shell); the marker is in its arguments.
      if (cmdline.rfind(piper() + '\0', 0) == 0 && cmdline.find(marker_) != std::string::npos)
        out.push_back(static_cast<pid_t>(std::stol(name)));
    }
    return out;
  }

  std::string out_, marker_;
  pid_t pid_ = -1;
  bool finished_ = false;
  int code_ = -1;
};

}  // namespace piper::e2e
