// host/cuda/cuda.h for a LibTorch without CUDA (Debian's 1.13): nothing is
// available, and every call that needs a GPU says why it cannot run.
#include "host/cuda/cuda.h"

#include <torch/csrc/api/include/torch/version.h>

#include <string>

namespace anatomy::cuda {
namespace {
[[noreturn]] void refuse() {
  throw NotAvailable("this anatomy was built against a LibTorch without CUDA (" + std::string("LibTorch ") + TORCH_VERSION +
                     "); the CUDA build is made by scripts/setup --torch=cuda");
}
}  // namespace

bool built() { return false; }
std::string version() { return ""; }
bool is_available() { return false; }
int device_count() { return 0; }
void synchronize(int) { refuse(); }
int64_t memory_allocated(int) { refuse(); }
int64_t max_memory_allocated(int) { refuse(); }
int64_t memory_reserved(int) { refuse(); }
void reset_peak_memory_stats(int) { refuse(); }

struct SideStream::Impl {};
SideStream::SideStream(int) { refuse(); }
SideStream::~SideStream() = default;

struct Graph::Impl {};
Graph::Graph() { refuse(); }
Graph::~Graph() = default;
void Graph::capture_begin() { refuse(); }
void Graph::capture_end() { refuse(); }
void Graph::replay() { refuse(); }
void Graph::reset() {}
bool Graph::capturing() const { return false; }
bool Graph::captured() const { return false; }

}  // namespace anatomy::cuda
