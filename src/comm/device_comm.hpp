// device_comm.hpp — which communicator moves the tensors of a device: NCCL where every rank has a GPU of
// its own, the host communicator through host staging elsewhere (docs/comm.md, "Device buffers").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.hpp"
#include "comm/comm.hpp"

namespace piper::comm {

// How a device's tensors travel: auto (NCCL where it can serve, else staging), nccl, or mpi (host
// staging). `train.device_comm` names them (config::DeviceComm; runtime::device_comm_of).
enum class DeviceComm : uint8_t { DEVICE_COMM_AUTO, DEVICE_COMM_NCCL, DEVICE_COMM_MPI };

// The communicator over `host`'s ranks for float buffers on `device` (collective over `host`):
// nullptr where `host` serves them as they are (a device the host addresses); NCCL for nccl, and
// for auto where NCCL can serve (a CUDA device, one GPU per rank); a StagedCommunicator over
// `host` otherwise. Throws CommError for nccl where NCCL cannot serve, saying why.
std::unique_ptr<Communicator> for_device(Communicator& host, backend::Backend& device, DeviceComm how);

}  // namespace piper::comm
