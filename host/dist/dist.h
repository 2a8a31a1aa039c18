// Data-parallel training across processes, on LibTorch's own distributed
// engine (c10d): a TCPStore for the rendezvous, Gloo for CPU tensors and, in
// the CUDA build, NCCL for GPU tensors. One process group a process (the
// world); ranks count from 0, as in PyTorch and the launchers' RANK.
//
// Failures: a rank that raises first writes its message to the store
// (report_failure), and the launcher writes the exit of a rank it saw die; a
// collective that fails on another rank then names the rank and what happened
// instead of Gloo's "connection closed by peer".
#pragma once
#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace anatomy::dist {

/// A failed collective or rendezvous; what() names the rank when one is known.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string master_addr = "127.0.0.1";
  int port = 0;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  /// How long a collective (and the rendezvous) may wait for the other ranks.
  std::chrono::milliseconds timeout{60000};
  /// Rank 0 hosts the store unless someone else does (the launcher of
  /// `anatomy --nproc`, or torchrun's agent).
  bool store_hosted_elsewhere = false;
};

/// The options the environment gives (MASTER_ADDR, MASTER_PORT, RANK,
/// WORLD_SIZE, LOCAL_RANK, ANATOMY_DIST_TIMEOUT in seconds), or nothing when
/// WORLD_SIZE is not set. Malformed values are an Error naming the variable.
std::optional<Options> options_from_environment();

/// Joins the world: the rendezvous through the store, then Gloo's full mesh.
void init(const Options& options);
bool is_initialized();
/// Leaves the world (a no-op when not in one).
void destroy();
int rank();
int world_size();
int local_rank();
std::chrono::milliseconds timeout();

enum class Op { Sum, Avg, Max, Min, Product };
/// Op from its name: sum, avg (also mean), max, min, product.
Op parse_op(const std::string& name);

/// In place on every rank. Gloo has no average: avg is a sum divided by the
/// world size (floating-point tensors only). Every collective first has the
/// ranks compare the call (which one, dtype, device, shape, op or source: one
/// small all-gather) and raises the same Error on all of them when it differs;
/// compare = false skips that, for calls alike on every rank by construction.
void all_reduce(at::Tensor& t, Op op, bool compare = true);
void broadcast(at::Tensor& t, int src);
/// Every rank's tensor, in rank order (all of one shape and dtype).
std::vector<at::Tensor> all_gather(const at::Tensor& t);
void barrier();

/// Records in the store that this rank failed, with its message, so that the
/// others can name it; best effort (no error when the store is gone).
void report_failure(const std::string& message);

/// The launcher's side: a store for N ranks on a free loopback port, and what
/// it writes there when it sees a rank exit.
class Rendezvous {
 public:
  explicit Rendezvous(int world_size, std::chrono::milliseconds timeout);
  ~Rendezvous();
  int port() const;
  void report_exit(int rank, const std::string& what);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Gradients averaged over the world as the backward pass produces them:
/// parameters are put in buckets (in reverse order, the order backward tends
/// to finish them); a hook on each parameter's gradient accumulator copies
/// the gradient into its bucket, and a full bucket is all-reduced at once,
/// while the backward pass goes on. Buckets are launched in index order on
/// every rank, so the collectives match across ranks.
class Reducer {
 public:
  Reducer(std::vector<at::Tensor> params, int64_t bucket_bytes);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;
  /// Arms the hooks for the next backward pass.
  void prepare();
  /// Waits for the buckets (launching those whose parameters got no gradient,
  /// as zeros) and writes the averaged gradients into the parameters' .grad.
  void finish();
  int64_t buckets() const;
  /// Seconds finish() spent waiting for communication that the backward pass
  /// did not hide, and seconds from the first bucket's launch to the last
  /// one's end, summed over the steps.
  double wait_seconds() const;
  double communication_seconds() const;

  struct State;  // shared with the hooks, which outlive nothing: they hold it weakly

 private:
  std::shared_ptr<State> state_;
};

}  // namespace anatomy::dist
