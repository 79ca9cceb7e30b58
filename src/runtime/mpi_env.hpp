// mpi_env.hpp — MPI start-up and shutdown for the process (RAII), with the
// few world-level checks every rank makes before any work.
#pragma once

#include <cstdint>
#include <string>

namespace piper::runtime {

class MpiEnv {
 public:
  // Initialises MPI (works as a singleton without mpirun as well as under it).
  MpiEnv(int* argc, char*** argv);
  ~MpiEnv();
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return size_; }
  const std::string& host() const { return host_; }

  // Bounds the waits of all_equal() and any() (parallel.comm_timeout_s once the config is read): a rank
  // that does not arrive within it is a comm::StallError naming the ranks that do not answer.
  void set_timeout(double seconds) { timeout_s_ = seconds; }

  // True on every rank when all ranks passed the same value.
  bool all_equal(uint64_t value) const;
  // True on every rank when any rank passed true.
  bool any(bool flag) const;
  // Aborts every rank with `code` (used after a user-facing error was printed).
  [[noreturn]] void abort(int code) const;

 private:
  int rank_ = 0;
  int size_ = 1;
  std::string host_;
  double timeout_s_ = 300;
};

}  // namespace piper::runtime
