// The gradient reducer of dist.h: buckets of gradients all-reduced while the
// backward pass goes on, launched by hooks on the parameters' gradient
// accumulators, on the world's process groups (dist.cpp, through backend.h).
#include "host/dist/dist.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "host/dist/backend.h"

#include <algorithm>
#include <chrono>
#include <mutex>

namespace anatomy::dist {

using Clock = std::chrono::steady_clock;

struct Reducer::State {
  std::mutex mu;
  std::vector<at::Tensor> params;
  struct Bucket {
    at::Tensor flat;
    std::vector<size_t> members;
    std::vector<int64_t> offsets;
    size_t pending = 0;
    bool launched = false;
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::vector<Bucket> buckets;
  std::vector<std::pair<size_t, size_t>> place;  // parameter -> (bucket, slot)
  std::vector<char> got;                           // the parameter's gradient is in its bucket
  std::vector<char> local;                         // ... and came from this rank's backward pass
  size_t next = 0;                                 // the next bucket to launch
  bool armed = false;
  Clock::time_point first_launch;
  double wait_seconds = 0, communication_seconds = 0;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<uintptr_t> hook_keys;

  void launch_ready() {
    while (next < buckets.size() && buckets[next].pending == 0) {
      Bucket& b = buckets[next];
      if (next == 0) first_launch = Clock::now();
      std::vector<at::Tensor> v{b.flat};
      collective("train.fit (all-reduce of gradients)",
                 [&] { b.work = backend_for("train.fit", b.flat).allreduce(v, c10d::ReduceOp::SUM); });
      b.launched = true;
      ++next;
    }
  }

  void put(size_t i, bool from_backward) {
    auto [bi, slot] = place[i];
    Bucket& b = buckets[bi];
    const at::Tensor& g = params[i].grad();
    int64_t n = params[i].numel();
    at::Tensor dest = b.flat.narrow(0, b.offsets[slot], n);
    if (g.defined())
      dest.copy_(g.reshape({-1}));
    else
      dest.zero_();
    got[i] = 1;
    local[i] = from_backward && g.defined();
    --b.pending;
  }

  void ready(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed || got[i]) return;
    at::NoGradGuard no_grad;
    put(i, true);
    launch_ready();
  }
};

namespace {
struct ReadyHook final : torch::autograd::FunctionPostHook {
  std::weak_ptr<Reducer::State> state;
  size_t index;
  ReadyHook(std::weak_ptr<Reducer::State> s, size_t i) : state(std::move(s)), index(i) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto s = state.lock()) s->ready(index);
    return outputs;
  }
};
}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, int64_t bucket_bytes) : state_(std::make_shared<State>()) {
  if (!is_initialized())
    throw Error("train.fit: no process group for the gradient reducer: run under `anatomy --nproc N` or a launcher, or call "
                "dist.init_process_group first");
  State& s = *state_;
  for (auto& p : params)
    if (p.requires_grad()) s.params.push_back(p);
  s.place.resize(s.params.size());
  s.got.assign(s.params.size(), 0);
  s.local.assign(s.params.size(), 0);
  // Reverse order; a bucket holds one dtype on one device. The first is
  // small (1 MiB), so that communication starts early in the backward pass.
  int64_t cap = std::min<int64_t>(bucket_bytes, 1 << 20);
  int64_t filled = 0;
  for (size_t k = s.params.size(); k-- > 0;) {
    const at::Tensor& p = s.params[k];
    int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    bool fresh = s.buckets.empty() || filled + bytes > cap ||
                 s.params[s.buckets.back().members[0]].scalar_type() != p.scalar_type() ||
                 s.params[s.buckets.back().members[0]].device() != p.device();
    if (fresh) {
      if (!s.buckets.empty()) cap = bucket_bytes;
      s.buckets.emplace_back();
      filled = 0;
    }
    auto& b = s.buckets.back();
    b.offsets.push_back(b.members.empty() ? 0 : b.offsets.back() + s.params[b.members.back()].numel());
    b.members.push_back(k);
    s.place[k] = {s.buckets.size() - 1, b.members.size() - 1};
    filled += bytes;
  }
  for (auto& b : s.buckets) {
    const at::Tensor& p0 = s.params[b.members[0]];
    int64_t total = b.offsets.back() + s.params[b.members.back()].numel();
    b.flat = at::zeros({total}, p0.options().requires_grad(false));
    b.pending = b.members.size();
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(s.params[i]);
    if (!acc) throw Error("train.fit: a parameter has no gradient accumulator (is it a leaf?)");
    s.hook_keys.push_back(acc->add_post_hook(std::make_unique<ReadyHook>(state_, i)));
    s.accumulators.push_back(std::move(acc));  // kept alive, hooks and all, between passes
  }
}

Reducer::~Reducer() {
  State& s = *state_;
  for (size_t i = 0; i < s.accumulators.size(); ++i) s.accumulators[i]->del_post_hook(s.hook_keys[i]);
}

void Reducer::prepare() {
  std::lock_guard<std::mutex> lock(state_->mu);
  State& s = *state_;
  s.armed = true;
  s.next = 0;
  std::fill(s.got.begin(), s.got.end(), 0);
  std::fill(s.local.begin(), s.local.end(), 0);
  for (auto& b : s.buckets) {
    b.pending = b.members.size();
    b.launched = false;
    b.work.reset();
  }
}

void Reducer::finish() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.armed) throw Error("train.fit: the gradient reducer finished a pass it was not prepared for");
  at::NoGradGuard no_grad;
  // parameters the backward pass did not reach on this rank count as zeros
  for (size_t i = 0; i < s.params.size(); ++i)
    if (!s.got[i]) s.put(i, false);
  s.launch_ready();
  auto started = Clock::now();
  int world = world_size();  // the ranks
  for (auto& b : s.buckets) {
    collective("train.fit (all-reduce of gradients)", [&] { b.work->wait(); });
    b.flat.div_(world);
    for (size_t slot = 0; slot < b.members.size(); ++slot) {
      size_t i = b.members[slot];
      at::Tensor& p = s.params[i];
      at::Tensor avg = b.flat.narrow(0, b.offsets[slot], p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(avg);
      } else if (s.local[i] || avg.ne(0).any().item<bool>()) {
        p.mutable_grad() = avg.clone();
      }  // no rank had a gradient: stays undefined, as in one process
    }
  }
  auto ended = Clock::now();
  s.wait_seconds += std::chrono::duration<double>(ended - started).count();
  s.communication_seconds += std::chrono::duration<double>(ended - s.first_launch).count();
  s.armed = false;
}

int64_t Reducer::buckets() const { return static_cast<int64_t>(state_->buckets.size()); }
double Reducer::wait_seconds() const { return state_->wait_seconds; }
double Reducer::communication_seconds() const { return state_->communication_seconds; }

}  // namespace anatomy::dist
