// Without CUDA there is no NCCL: a CUDA tensor cannot reach a collective.
#include "host/dist/backend.h"
#include "host/dist/dist.h"

namespace anatomy::dist {

std::unique_ptr<Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>&, int, int, int, std::chrono::milliseconds) {
  throw Error("NCCL (collectives of CUDA tensors) needs the CUDA build (scripts/setup --torch=cuda)");
}

}  // namespace anatomy::dist
