// op_info.hpp — what the communicators' error messages say about one operation: its kind, group,
// peer, tag and bytes, and where the rank that reports it runs.
#pragma once

#include <cstddef>
#include <string>

#include "comm/deadline.hpp"

namespace piper::comm {

enum class OpKind { OP_SEND, OP_RECV, OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_ALLTOALL, OP_BARRIER };

const char* op_name(OpKind k);

struct OpInfo {
  OpKind kind = OpKind::OP_SEND;
  std::string group;    // the communicator's name
  int group_rank = -1;  // this rank in it
  int group_size = 0;
  int peer = -1;        // p2p: group rank of the peer
  int peer_world = -1;  // p2p: its world rank
  int tag = -1;         // p2p only
  size_t bytes = 0;     // this rank's payload (send or receive side)

  // "send to peer 1 (world rank 3) of pp group [1,3], 4096 bytes, tag 7", "allreduce on dp group [0,2]
  // (rank 0 of 2), 4096 bytes".
  std::string describe() const;
};

// What a wait on operation `op` says when it timed out: "piper comm: timeout on world rank 0 (host
// node07): <op>; waited 1.00 s (timeout 1.00 s), posted 1.00 s ago", then what the liveness probe
// found (liveness.hpp).
std::string timeout_message(int world_rank, const std::string& op, Clock::time_point waited_from, double timeout_s,
                            Clock::time_point posted);

// "world rank 3 (host node07)": the rank an error message comes from.
std::string rank_and_host(int world_rank);
// This machine's host name.
const std::string& host_name();

}  // namespace piper::comm
