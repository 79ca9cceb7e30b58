// op_info.cpp — the descriptions of operations in the communicators' error messages.
#include "comm/op_info.hpp"

#include <unistd.h>

#include <climits>
#include <sstream>

#include "comm/liveness.hpp"

namespace piper::comm {

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::OP_SEND: return "send";
    case OpKind::OP_RECV: return "recv";
    case OpKind::OP_ALLREDUCE: return "allreduce";
    case OpKind::OP_REDUCE_SCATTER: return "reduce_scatter";
    case OpKind::OP_ALLGATHER: return "allgather";
    case OpKind::OP_ALLTOALL: return "alltoall";
    case OpKind::OP_BARRIER: return "barrier";
  }
  return "?";
}

std::string OpInfo::describe() const {
  std::ostringstream s;
  s << op_name(kind);
  if (kind == OpKind::OP_SEND || kind == OpKind::OP_RECV) {
    s << (kind == OpKind::OP_SEND ? " to" : " from") << " peer " << peer << " (world rank " << peer_world << ") of "
      << group << ", " << bytes << " bytes, tag " << tag;
  } else {
    s << " on " << group << " (rank " << group_rank << " of " << group_size << "), " << bytes << " bytes";
  }
  return s.str();
}

std::string timeout_message(int world_rank, const std::string& op, Clock::time_point waited_from, double timeout_s,
                            Clock::time_point posted) {
  std::ostringstream msg;
  msg.setf(std::ios::fixed);
  msg.precision(2);
  msg << "piper comm: timeout on " << rank_and_host(world_rank) << ": " << op << "; waited " << seconds_since(waited_from)
      << " s (timeout " << timeout_s << " s), posted " << seconds_since(posted) << " s ago"
      << liveness_report(kLivenessProbeS);
  return msg.str();
}

const std::string& host_name() {
  static const std::string name = [] {
    char buf[HOST_NAME_MAX + 1] = {};
    if (gethostname(buf, sizeof buf - 1) != 0) return std::string("?");
    return std::string(buf);
  }();
  return name;
}

std::string rank_and_host(int world_rank) {
  return "world rank " + std::to_string(world_rank) + " (host " + host_name() + ")";
}

}  // namespace piper::comm
