// NCCL's process group for CUDA tensors (compiled in the CUDA build only).
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "host/dist/backend.h"

namespace anatomy::dist {

std::unique_ptr<Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                                   int device, std::chrono::milliseconds timeout) {
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
  return std::make_unique<BackendOf<c10d::ProcessGroupNCCL>>(pg);
}

}  // namespace anatomy::dist
