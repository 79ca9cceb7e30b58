// mpi_env.hpp — MPI start-up and shutdown for the process (RAII), the
// communicator of the ranks that train, and the few checks every one of them
// makes before any work.
//
// The job's processes are MPI_COMM_WORLD; the ranks that train under the
// current strategy are comm(), all of them at the start unless some are kept
// in reserve (train.standby), and another set after an elastic switch
// (docs/switching.md). rank() and world_size() are positions in comm(); every
// collective check here and in the runtime's start-up (memory fit,
// checkpoints, traces) runs over it.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

namespace piper::runtime {

// Whether the launcher lets a process end without MPI_Finalize while the job goes on (Open MPI's
// orte_allowed_exit_without_sync: `mpirun --mca orte_allowed_exit_without_sync 1`), so that a rank
// leaving an elastic job can exit at once (leave_job, docs/switching.md).
bool early_exit_allowed();

class MpiEnv {
 public:
  // Initialises MPI (works as a singleton without mpirun as well as under it). Where early_exit_allowed(),
  // MPI_Finalize is set not to wait at Open MPI's closing fence (async_mpi_finalize): that fence also
  // counts the processes that left, and may then wait for them forever; train() ends with a barrier over
  // the processes still in the job instead (Membership::finish).
  MpiEnv(int* argc, char*** argv);
  ~MpiEnv();
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;

  // This process's rank among the ranks that train, and their number (-1 and 0 on a rank in reserve).
  int rank() const { return rank_; }
  int world_size() const { return size_; }
  // The communicator of the ranks that train (MPI_COMM_NULL on a rank in reserve).
  MPI_Comm comm() const { return comm_; }
  // From now on the ranks that train are `comm` (MPI_COMM_NULL: this process is not one of them). The
  // caller owns `comm` and keeps it alive while it is in use.
  void use(MPI_Comm comm);
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
  MPI_Comm comm_ = MPI_COMM_WORLD;
  int rank_ = 0;
  int size_ = 1;
  std::string host_;
  double timeout_s_ = 300;
};

}  // namespace piper::runtime
