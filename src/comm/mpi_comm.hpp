// mpi_comm.hpp — the MPI communicator (make_mpi_world), MPI start-up helpers and the MPI check macro.
//
// Groups: Communicator::split (collective over the parent; see comm.hpp)
// builds them (the runtime passes each the ranks of its rank-grid group).
//
// Progress: Open MPI moves a large non-blocking transfer only while some
// thread is inside the library, so a world made with
// CommOptions::progress_thread (the default) starts one progress thread that
// polls the pending MPI_Requests of that world and its splits with
// MPI_Testsome while compute runs, sleeping between polls that complete
// nothing (progress_min_sleep_us doubling up to progress_max_sleep_us). A
// thread in wait() polls itself and the progress thread stands aside. This
// needs MPI_THREAD_MULTIPLE (init_mpi asks for it). Without it, make_mpi_world
// prints a one-time warning and falls back to progress inside test()/wait().
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/comm.hpp"

namespace piper::comm {

// Initialises MPI with MPI_THREAD_MULTIPLE unless it is initialised already;
// returns the thread level provided (an MPI_THREAD_* value).
int init_mpi(int* argc, char*** argv);
// Finalises MPI unless it is finalised already. MPI_Finalize first stops every
// progress thread (a hook on MPI_COMM_SELF), however MPI is finalised.
void finalize_mpi();
// True when MPI is initialised with MPI_THREAD_MULTIPLE.
bool mpi_thread_multiple();

// A communicator over all ranks, named "world [0..N-1]": a duplicate of
// MPI_COMM_WORLD, so its traffic never matches other users of MPI_COMM_WORLD,
// with errors returned (and thrown as CommError) instead of aborting.
// Collective; MPI must be initialised.
std::unique_ptr<Communicator> make_mpi_world(const CommOptions& options = {});
// The same over the processes of `base` (a subset of MPI_COMM_WORLD, e.g. the ranks that train after an
// elastic switch), named "world [its world ranks]"; group ranks are `base`'s, world_rank() maps them to
// MPI_COMM_WORLD. Collective over `base`; the caller keeps `base` (it is duplicated).
std::unique_ptr<Communicator> make_mpi_world(MPI_Comm base, const CommOptions& options = {});

// For messages: this process's world rank (-1 before MPI_Init) and host name.
int mpi_world_rank();
const std::string& mpi_host_name();

namespace detail {
[[noreturn]] void mpi_check_failed(int rc, const char* expr, const char* file, int line);
}  // namespace detail

}  // namespace piper::comm

// Checks an MPI call: on failure throws CommError with file, line, the call,
// the MPI error string, the world rank and the host. (MPI_SUCCESS is 0.)
#define PIPER_MPI_CHECK(call)                                                        \
  do {                                                                               \
    const int piper_mpi_rc_ = (call);                                                \
    if (piper_mpi_rc_ != 0)                                                          \
      ::piper::comm::detail::mpi_check_failed(piper_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
