// device_comm.cpp — the choice between NCCL and host staging for a device's tensors.
#include "comm/device_comm.hpp"

#include <stdexcept>

#include "comm/nccl_comm.hpp"
#include "comm/staged_comm.hpp"

namespace piper::comm {

std::unique_ptr<Communicator> make_nccl(Communicator& host, backend::Backend& device, std::string* why) {
  if (device.kind() != backend::DeviceKind::DEVICE_CUDA) {
    if (why) *why = std::string("NCCL serves CUDA buffers, and the device is ") + device.name();
    return nullptr;
  }
#ifdef PIPER_HAVE_NCCL
  return start_nccl(host, device, why);
#else
  (void)host;
  if (why) *why = "this build has no NCCL (configured without -DPIPER_CUDA=ON)";
  return nullptr;
#endif
}

std::unique_ptr<Communicator> for_device(Communicator& host, backend::Backend& device, DeviceComm how) {
  if (device.host_addressable()) return nullptr;
  if (how != DeviceComm::DEVICE_COMM_MPI) {
    std::string why;
    if (std::unique_ptr<Communicator> nccl = make_nccl(host, device, &why)) return nccl;
    if (how == DeviceComm::DEVICE_COMM_NCCL)
      throw CommError("piper comm: NCCL cannot serve " + host.name() + ": " + why +
                      "; set train.device_comm: mpi (host staging) or auto");
  }
  return std::make_unique<StagedCommunicator>(host, device);
}

}  // namespace piper::comm
