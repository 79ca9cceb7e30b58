// liveness.hpp — which ranks of the job still answer: every process keeps a small thread that answers
// probes on a UDP socket of its own (addresses exchanged once over MPI when the world communicator is made),
// so a rank whose wait timed out can tell a stalled or dead rank (no answer) from one that is alive but
// waiting itself. A SIGSTOPped or killed process answers nothing. No MPI call is made after start-up, so the
// responder does not advance MPI transfers (docs/comm.md).
#pragma once

#include <string>
#include <vector>

namespace piper::comm {

// How long a rank whose wait timed out waits for the others to answer its probe.
inline constexpr double kLivenessProbeS = 1.0;

// Collective over MPI_COMM_WORLD the first time: starts this process's responder once. It stops when MPI is
// finalised.
void start_liveness_responder();

// Probes every other world rank and returns those that did not answer within wait_s, sorted; empty when the
// responder is not running (then nothing is known).
std::vector<int> unresponsive_world_ranks(double wait_s);

// For an error message: "; world rank 3 did not answer a liveness probe within 1.0 s (stalled or dead)", or
// "; every other rank answered a liveness probe", or "" when no probe can be made.
std::string liveness_report(double wait_s);

}  // namespace piper::comm
