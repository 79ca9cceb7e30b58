// agreement.hpp — bounded waits over a raw MPI communicator, for the steps that are not tensor traffic:
// a job's start-up checks and every step of a checkpoint save or load.
//
// agree(): every rank reports its outcome (an error text, or nothing) to rank 0, which answers every rank
// with the first failure. No rank blocks: a rank that does not report within the timeout is named, on every
// rank that waited, in a StallError ("rank 3 did not reach <phase> within 3 s"); rank 0 not answering
// likewise. wait_bounded(): a set of non-blocking MPI requests, finished or a StallError at the deadline.
#pragma once

#include <mpi.h>

#include <string>

#include "comm/comm.hpp"

namespace piper::comm {

// A rank did not arrive within the timeout (stalled or dead). Ends the job: the stalled rank may never
// reach MPI_Finalize, so the job is aborted after this is printed.
class StallError : public CommError {
 public:
  using CommError::CommError;
};

// Collective over comm, bounded by timeout_s. Returns "" when no rank reported an error, else the error of
// the lowest rank that did (the same text on every rank). Throws StallError when a rank does not arrive:
// rank 0 waits timeout_s after it arrives; the others wait for rank 0's answer up to 2 * timeout_s + 1 s,
// since rank 0 may arrive late by up to the timeout itself.
std::string agree(MPI_Comm comm, const std::string& local_error, double timeout_s, const std::string& phase);

// Polls n requests until all complete; throws StallError naming `phase`, this rank and the time waited
// once timeout_s has passed (the requests are then left pending: the job is ending).
void wait_bounded(MPI_Request* requests, int n, double timeout_s, const std::string& phase, MPI_Comm comm);

}  // namespace piper::comm
