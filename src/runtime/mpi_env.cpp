// mpi_env.cpp — MPI start-up, shutdown and world-level agreement checks.
#include "runtime/mpi_env.hpp"

#include "comm/agreement.hpp"
#include "comm/mpi_comm.hpp"

#include <mpi.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace piper::runtime {

bool early_exit_allowed() {
  const char* v = std::getenv("OMPI_MCA_orte_allowed_exit_without_sync");
  const std::string allowed = v ? v : "";
  return allowed == "1" || allowed == "true" || allowed == "yes" || allowed == "t" || allowed == "y";
}

MpiEnv::MpiEnv(int* argc, char*** argv) {
  if (early_exit_allowed()) setenv("OMPI_MCA_async_mpi_finalize", "1", 0);  // read by MPI_Init
  comm::init_mpi(argc, argv);  // MPI_THREAD_MULTIPLE: the communicator's progress thread
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  host_.assign(name, static_cast<size_t>(len));
}

MpiEnv::~MpiEnv() { comm::finalize_mpi(); }

void MpiEnv::use(MPI_Comm comm) {
  comm_ = comm;
  rank_ = -1, size_ = 0;
  if (comm == MPI_COMM_NULL) return;
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
}

bool MpiEnv::all_equal(uint64_t value) const {
  std::vector<uint64_t> all(static_cast<size_t>(size_));
  MPI_Request r;
  MPI_Iallgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm_, &r);
  comm::wait_bounded(&r, 1, timeout_s_, "a check every rank makes (the plan hash)", comm_);
  for (uint64_t v : all)
    if (v != value) return false;
  return true;
}

bool MpiEnv::any(bool flag) const {
  int in = flag ? 1 : 0, out = 0;
  MPI_Request r;
  MPI_Iallreduce(&in, &out, 1, MPI_INT, MPI_MAX, comm_, &r);
  comm::wait_bounded(&r, 1, timeout_s_, "a check every rank makes (a flag any rank may raise)", comm_);
  return out != 0;
}

void MpiEnv::abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace piper::runtime
