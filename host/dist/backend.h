// Inside host/dist: one interface over c10d's process groups, which are a
// ProcessGroup in LibTorch 1.13 and a Backend in 2.x but have the same
// collectives. Gloo's is made in dist.cpp, NCCL's in nccl.cpp (CUDA build);
// what the world lends the reducer (reducer.cpp) is at the end.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace anatomy::dist {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& ts, c10d::ReduceOp op) = 0;
  virtual c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& ts, int root) = 0;
  virtual c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out,
                                                   std::vector<at::Tensor>& in) = 0;
  virtual c10::intrusive_ptr<c10d::Work> barrier() = 0;
};

template <typename PG>
class BackendOf final : public Backend {
 public:
  explicit BackendOf(c10::intrusive_ptr<PG> pg) : pg_(std::move(pg)) {}
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& ts, c10d::ReduceOp op) override {
    c10d::AllreduceOptions o;
    o.reduceOp = op;
    return pg_->allreduce(ts, o);
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& ts, int root) override {
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return pg_->broadcast(ts, o);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out,
                                           std::vector<at::Tensor>& in) override {
    return pg_->allgather(out, in);
  }
  c10::intrusive_ptr<c10d::Work> barrier() override { return pg_->barrier(); }

 private:
  c10::intrusive_ptr<PG> pg_;
};

/// NCCL's process group over `store` (nccl.cpp); throws when this build has
/// no CUDA (nccl_none.cpp).
std::unique_ptr<Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                                   int device, std::chrono::milliseconds timeout);

/// The world's process group for t's device: Gloo for CPU tensors, NCCL for
/// CUDA ones (made on first use). An Error outside a world; fn names the caller.
Backend& backend_for(const char* fn, const at::Tensor& t);

/// Runs f, which launches or waits for a collective; a failure becomes an
/// Error naming the rank that caused it when one is known (dist.cpp).
void collective(const char* fn, const std::function<void()>& f);

}  // namespace anatomy::dist
