// nccl_comm.hpp — NCCL behind the communicator interface, for float buffers on the CUDA backend.
//
// Each communicator holds three NCCL communicators ("lanes"), each with its own CUDA stream:
// collectives on one, messages to higher group ranks on a second, messages to
// lower ranks on a third. An operation is posted at once and never waits for its peer: an event
// recorded on the backend's current stream marks the work that produced or last used the buffer;
// the lane's stream waits for it, then NCCL puts the operation on the stream (the first message to
// a peer first connects to it, in NCCL's own thread, while the lane holds later posts in order),
// and an event recorded after it completes the request. So communication overlaps the compute
// queued after it, and two ranks exchanging messages never wait on each other's lane.
// NCCL matches the messages between two ranks in posting order (it has no tags): the sends of
// one rank to a peer and that peer's receives must be posted in the same order (the runtime's
// programs are; docs/comm.md). Messages to itself are matched by tag, as MPI does, and copied on
// the device, on a stream of their own.
//
// NCCL is bootstrapped over the host communicator (its unique id travels over it); the NCCL
// communicators are non-blocking, and every wait, including their creation, honours
// CommOptions::timeout_s: a stuck operation throws CommError naming the world rank, host,
// operation, group, peer and bytes, and destroying its request while the error unwinds aborts
// the lane (ncclCommAbort) so the process can exit. Doubles (norms, losses) and barriers go over
// the host communicator: they live in host memory.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.hpp"
#include "comm/comm.hpp"

namespace piper::comm {

// NCCL over `host`'s ranks for buffers on `device`; collective over `host`. nullptr, with `why`
// said, where NCCL cannot serve them: a build without the CUDA backend, a device other than
// CUDA, or two ranks on one GPU (NCCL refuses that; every rank learns it, so all return nullptr
// together). Throws CommError when NCCL fails to start.
std::unique_ptr<Communicator> make_nccl(Communicator& host, backend::Backend& device, std::string* why);

// make_nccl's part for a CUDA device (comm/nccl/, in builds with the CUDA backend): the check for a
// shared GPU, the bootstrap and the lanes.
std::unique_ptr<Communicator> start_nccl(Communicator& host, backend::Backend& device, std::string* why);

}  // namespace piper::comm
