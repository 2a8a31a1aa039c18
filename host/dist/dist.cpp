// c10d for anatomy: the world (store + Gloo, NCCL on demand), collectives
// whose failures name the rank that caused them, and the launcher's store.
// The bucketed gradient reducer is in reducer.cpp. See dist.h.
#include "host/dist/dist.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "host/dist/backend.h"
#include "host/tensor_format.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace anatomy::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::string message_of(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

struct World {
  Options options;
  c10::intrusive_ptr<c10d::Store> store;  // prefixed "anatomy/"
  std::unique_ptr<Backend> gloo;
  std::unique_ptr<Backend> nccl;
};
// Never destroyed at exit: a process group's threads may still wait on a
// peer that is gone, and joining them would hang the exit.
World* g_world = nullptr;

World& world(const char* fn) {
  if (!g_world)
    throw Error(std::string(fn) + ": no process group: run under `anatomy --nproc N` or a launcher that sets "
                "MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE, or call dist.init_process_group first");
  return *g_world;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

long env_integer(const char* name, long low, long high) {
  std::string v = env(name);
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || n < low || n > high)
    throw Error(std::string("the environment variable ") + name + "='" + v + "' is not an integer in " +
                std::to_string(low) + ".." + std::to_string(high));
  return n;
}

// The keys of this group in the store; under torchrun, a restarted group
// must not read the keys of the attempt before.
std::string store_prefix() {
  std::string attempt = env("TORCHELASTIC_RESTART_COUNT");
  return attempt.empty() ? "anatomy" : "anatomy/attempt_" + attempt;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

std::string key_failed(int rank) { return "failed/" + std::to_string(rank); }
std::string key_beat(int rank) { return "beat/" + std::to_string(rank); }

// Every rank counts up its heartbeat in the store twice a second, from a
// thread with its own connection: when a collective fails and nobody said
// why (no launcher saw the death), the rank whose count stopped is named.
constexpr auto kBeat = std::chrono::milliseconds(500);
struct Heartbeat {
  std::atomic<bool> stop{false};
  std::thread thread;
};
Heartbeat* g_heartbeat = nullptr;

void stop_heartbeat() {
  if (!g_heartbeat) return;
  g_heartbeat->stop = true;
  if (g_heartbeat->thread.joinable()) g_heartbeat->thread.join();
  delete g_heartbeat;
  g_heartbeat = nullptr;
}

void start_heartbeat(const Options& o) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(o.port);
  so.isServer = false;
  so.waitWorkers = false;
  so.timeout = o.timeout;
  auto store = c10::make_intrusive<c10d::PrefixStore>(store_prefix(), c10::make_intrusive<c10d::TCPStore>(o.master_addr, so));
  g_heartbeat = new Heartbeat;
  static bool registered = (std::atexit(stop_heartbeat), true);
  (void)registered;
  Heartbeat* h = g_heartbeat;
  std::string key = key_beat(o.rank);
  h->thread = std::thread([h, store, key] {
    try {
      while (!h->stop) {
        store->add(key, 1);
        for (int i = 0; i < 10 && !h->stop; ++i) std::this_thread::sleep_for(kBeat / 10);
      }
    } catch (const std::exception&) {
      // the store is gone: the collectives will say so
    }
  });
}

// What another rank (or the launcher) wrote of a failure, waiting up to
// `patience` for it: a peer's death closes its sockets a moment before the
// launcher has reaped it and written why. Failing that, the ranks whose
// heartbeat stopped meanwhile.
std::string reported_failure(World& w, std::chrono::milliseconds patience) {
  auto until = Clock::now() + patience;
  std::vector<int64_t> beats(w.options.world_size, -1);
  try {
    for (int r = 0; r < w.options.world_size; ++r)
      if (r != w.options.rank) beats[r] = w.store->add(key_beat(r), 0);
  } catch (const std::exception&) {
  }
  for (;;) {
    try {
      for (int r = 0; r < w.options.world_size; ++r) {
        if (r == w.options.rank) continue;
        if (w.store->check({key_failed(r)})) {
          auto v = w.store->get(key_failed(r));
          return std::string(v.begin(), v.end());
        }
      }
    } catch (const std::exception&) {
      return w.options.rank == 0 || w.options.store_hosted_elsewhere
                 ? "the rendezvous store is gone (the launcher exited)"
                 : "the rendezvous store is gone: rank 0, which hosts it, has exited";
    }
    if (Clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string silent;
  try {
    for (int r = 0; r < w.options.world_size; ++r) {
      if (r == w.options.rank || beats[r] < 0) continue;
      if (w.store->add(key_beat(r), 0) == beats[r]) silent += (silent.empty() ? "" : ", ") + std::to_string(r);
    }
  } catch (const std::exception&) {
    return "the rendezvous store is gone";
  }
  if (silent.empty()) return "";
  bool several = silent.find(',') != std::string::npos;
  return std::string(several ? "ranks " : "rank ") + silent + (several ? " have" : " has") + " stopped: no heartbeat for " +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(patience).count()) +
         " s (killed, or frozen outside Lua)";
}

}  // namespace

void collective(const char* fn, const std::function<void()>& f) {
  World& w = world(fn);
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string what = message_of(e);
    auto nl = what.find('\n');
    if (nl != std::string::npos) what.resize(nl);
    std::string cause = reported_failure(w, std::chrono::milliseconds(3000));
    if (!cause.empty()) throw Error(std::string(fn) + " on rank " + std::to_string(w.options.rank) + ": " + cause);
    throw Error(std::string(fn) + " on rank " + std::to_string(w.options.rank) + " failed: " + what +
                " (no rank reported an error: one may have been killed, or be stuck for longer than the " +
                std::to_string(w.options.timeout.count() / 1000) + " s timeout)");
  }
}

Backend& backend_for(const char* fn, const at::Tensor& t) {
  World& w = world(fn);
  if (t.is_cpu()) return *w.gloo;
  if (t.is_cuda()) {
    if (!w.nccl) {
      auto store = c10::make_intrusive<c10d::PrefixStore>("nccl", w.store);
      w.nccl = make_nccl(store, w.options.rank, w.options.world_size, w.options.local_rank, w.options.timeout);
    }
    return *w.nccl;
  }
  throw Error(std::string(fn) + ": tensors on " + t.device().str() + " have no collective backend (cpu: Gloo, cuda: NCCL)");
}

namespace {
void check_dense(const char* fn, const at::Tensor& t) {
  if (!t.defined()) throw Error(std::string(fn) + ": the tensor is undefined");
  if (t.is_sparse()) throw Error(std::string(fn) + ": sparse tensors are not supported");
}

c10d::ReduceOp reduce_op(Op op) {
  switch (op) {
    case Op::Sum:
    case Op::Avg: return c10d::ReduceOp::SUM;
    case Op::Max: return c10d::ReduceOp::MAX;
    case Op::Min: return c10d::ReduceOp::MIN;
    case Op::Product: return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

}  // namespace

std::optional<Options> options_from_environment() {
  if (env("WORLD_SIZE").empty()) return std::nullopt;
  Options o;
  o.world_size = static_cast<int>(env_integer("WORLD_SIZE", 1, 1 << 20));
  if (env("RANK").empty()) throw Error("WORLD_SIZE is set but RANK is not (a launcher sets both)");
  o.rank = static_cast<int>(env_integer("RANK", 0, o.world_size - 1));
  o.local_rank = env("LOCAL_RANK").empty() ? o.rank : static_cast<int>(env_integer("LOCAL_RANK", 0, 1 << 20));
  o.master_addr = env("MASTER_ADDR").empty() ? "127.0.0.1" : env("MASTER_ADDR");
  if (env("MASTER_PORT").empty()) {
    if (o.world_size > 1) throw Error("WORLD_SIZE is " + std::to_string(o.world_size) + " but MASTER_PORT is not set");
  } else {
    o.port = static_cast<int>(env_integer("MASTER_PORT", 1, 65535));
  }
  if (!env("ANATOMY_DIST_TIMEOUT").empty()) o.timeout = std::chrono::seconds(env_integer("ANATOMY_DIST_TIMEOUT", 1, 86400));
  o.store_hosted_elsewhere = env("ANATOMY_STORE_HOSTED") == "1" || env("TORCHELASTIC_USE_AGENT_STORE") == "True";
  return o;
}

void init(const Options& o) {
  if (g_world) throw Error("dist.init_process_group: this process is already rank " + std::to_string(g_world->options.rank) +
                           " of " + std::to_string(g_world->options.world_size));
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    throw Error("dist.init_process_group: rank " + std::to_string(o.rank) + " is outside 0.." + std::to_string(o.world_size - 1));
  if (o.world_size > 1 && o.port <= 0) throw Error("dist.init_process_group: a world of several ranks needs a port (MASTER_PORT)");
  auto w = std::make_unique<World>();
  w->options = o;
  std::string where = o.master_addr + ":" + std::to_string(o.port);
  c10::intrusive_ptr<c10d::Store> tcp;
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(o.port);
  so.isServer = o.rank == 0 && !o.store_hosted_elsewhere;
  so.waitWorkers = false;
  so.timeout = o.timeout;
  try {
    tcp = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
  } catch (const std::exception& e) {
    std::string what = message_of(e);
    if (so.isServer)
      throw Error("dist.init_process_group: rank 0 cannot host the rendezvous on " + where + ": " + what +
                  (what.find("in use") != std::string::npos ? " (choose another MASTER_PORT)" : ""));
    throw Error("dist.init_process_group: rank " + std::to_string(o.rank) + " cannot reach the rendezvous at " + where +
                " within " + std::to_string(o.timeout.count() / 1000) + " s: " + what);
  }
  w->store = c10::make_intrusive<c10d::PrefixStore>(store_prefix(), tcp);
  try {
    auto go = c10d::ProcessGroupGloo::Options::create();
    go->timeout = o.timeout;
    std::string ifname = env("GLOO_SOCKET_IFNAME");
    if (!ifname.empty())
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (is_loopback(o.master_addr))
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
      go->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", w->store),
                                                          o.rank, o.world_size, go);
    w->gloo = std::make_unique<BackendOf<c10d::ProcessGroupGloo>>(pg);
  } catch (const std::exception& e) {
    std::string what = message_of(e);
    auto nl = what.find('\n');
    if (nl != std::string::npos) what.resize(nl);
    throw Error("dist.init_process_group: rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size) +
                " could not connect to the others through " + where + ": " + what);
  }
  if (o.world_size > 1) {
    try {
      start_heartbeat(o);
    } catch (const std::exception& e) {
      throw Error("dist.init_process_group: rank " + std::to_string(o.rank) + " cannot open its heartbeat connection to " +
                  where + ": " + message_of(e));
    }
  }
  g_world = w.release();
}

bool is_initialized() { return g_world != nullptr; }

void destroy() {
  stop_heartbeat();
  delete g_world;
  g_world = nullptr;
}

int rank() { return g_world ? g_world->options.rank : 0; }
int world_size() { return g_world ? g_world->options.world_size : 1; }
int local_rank() { return g_world ? g_world->options.local_rank : 0; }
std::chrono::milliseconds timeout() { return g_world ? g_world->options.timeout : Options().timeout; }

Op parse_op(const std::string& name) {
  if (name == "sum") return Op::Sum;
  if (name == "avg" || name == "mean") return Op::Avg;
  if (name == "max") return Op::Max;
  if (name == "min") return Op::Min;
  if (name == "product") return Op::Product;
  throw std::invalid_argument("unknown op '" + name + "', expected sum, avg, max, min or product");
}

namespace {
// What a rank is about to do, as every rank sees it before doing it: a
// collective whose tensors differ across ranks in size would make Gloo abort
// the process from its own thread, and one whose op or dtype differs would
// give a wrong answer silently. So each Lua-level collective first gathers a
// small fixed-size description from every rank (one extra all-gather of
// kFields int64s) and raises the same clear error on all of them when they
// differ. The reducer's buckets skip it: their shapes are the parameters',
// checked by the broadcast that starts a data-parallel run.
enum class Call : int64_t { None = 0, AllReduce, Broadcast, AllGather, Barrier };  // None: not compared
constexpr int kMaxDims = 8;
constexpr int64_t kFields = 6 + kMaxDims;  // call, extra, dtype, device, ndim, sizes, numel

std::string describe(const int64_t* d) {
  static const char* calls[] = {"?", "all_reduce", "broadcast", "all_gather", "barrier"};
  static const char* ops[] = {"sum", "avg", "max", "min", "product"};
  auto call = static_cast<Call>(d[0]);
  std::string out = calls[d[0] >= 1 && d[0] <= 4 ? d[0] : 0];
  if (call == Call::Barrier) return out;
  out += std::string(" of ") + dtype_name(static_cast<c10::ScalarType>(d[2]));
  out += d[3] == static_cast<int64_t>(c10::DeviceType::CPU) ? "" : " (" + c10::DeviceTypeName(static_cast<c10::DeviceType>(d[3]), true) + ")";
  out += " [";
  bool folded = d[4] > kMaxDims;  // the last slot holds the sizes past it, folded: say the element count
  for (int64_t i = 0; i < std::min<int64_t>(d[4], folded ? kMaxDims - 1 : kMaxDims); ++i) out += (i ? ", " : "") + std::to_string(d[5 + i]);
  out += folded ? ", ...] (" + std::to_string(d[5 + kMaxDims]) + " elements)" : "]";
  if (call == Call::AllReduce) out += std::string(" op ") + ops[d[1] >= 0 && d[1] <= 4 ? d[1] : 0];
  if (call == Call::Broadcast) out += " from rank " + std::to_string(d[1]);
  return out;
}

void agree(const char* fn, Call call, const at::Tensor& t, int64_t extra) {
  World& w = world(fn);
  if (w.options.world_size == 1) return;
  at::NoGradGuard no_grad;
  at::Tensor mine = at::zeros({kFields}, at::kLong);
  int64_t* d = mine.data_ptr<int64_t>();
  d[0] = static_cast<int64_t>(call);
  d[1] = extra;
  if (t.defined()) {
    d[2] = static_cast<int64_t>(t.scalar_type());
    d[3] = static_cast<int64_t>(t.device().type());
    d[4] = t.dim();
    for (int64_t i = 0; i < t.dim(); ++i) {
      if (i < kMaxDims - 1) d[5 + i] = t.size(i);
      else d[5 + kMaxDims - 1] = d[5 + kMaxDims - 1] * 1000003 + t.size(i);  // the rest, folded
    }
    d[5 + kMaxDims] = t.numel();
  }
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < w.options.world_size; ++r) out[0].push_back(at::empty_like(mine));
  std::vector<at::Tensor> in{mine};
  collective(fn, [&] { w.gloo->allgather(out, in)->wait(); });
  bool same = true;
  for (const auto& other : out[0]) same = same && at::equal(other, out[0][0]);
  if (same) return;
  std::string said;
  for (int r = 0; r < w.options.world_size; ++r)
    said += (r ? "; rank " : "rank ") + std::to_string(r) + ": " + describe(out[0][r].data_ptr<int64_t>());
  throw Error(std::string(fn) + " on rank " + std::to_string(w.options.rank) +
              ": the ranks disagree on the collective (" + said +
              "); every rank must make the same calls, with tensors of one shape, dtype and device");
}

// A collective on t in place, once the ranks agree on (call, extra): run(backend,
// {buffer}) on a contiguous buffer (t itself when it is one), then
// finish(buffer), then the buffer back into t.
template <typename Run, typename Finish>
void in_place(const char* fn, at::Tensor& t, Call call, int64_t extra, Run&& run, Finish&& finish) {
  check_dense(fn, t);
  if (call != Call::None) agree(fn, call, t, extra);
  at::NoGradGuard no_grad;
  at::Tensor target = t.detach();
  at::Tensor buffer = target.is_contiguous() ? target : target.contiguous();
  Backend& b = backend_for(fn, t);
  collective(fn, [&] {
    std::vector<at::Tensor> v{buffer};
    run(b, v)->wait();
  });
  finish(buffer);
  if (!buffer.is_same(target)) target.copy_(buffer);
}
}  // namespace

void all_reduce(at::Tensor& t, Op op, bool compare) {
  const char* fn = "dist.all_reduce";
  if (t.defined() && op == Op::Avg && !t.is_floating_point())
    throw Error(std::string(fn) + ": op 'avg' needs a floating-point tensor, got " + std::string(c10::toString(t.scalar_type())) +
                " (use op = 'sum')");
  in_place(
      fn, t, compare ? Call::AllReduce : Call::None, static_cast<int64_t>(op),
      [&](Backend& b, std::vector<at::Tensor>& v) { return b.allreduce(v, reduce_op(op)); },
      [&](at::Tensor& buffer) {
        if (op == Op::Avg) buffer.div_(world_size());
      });
}

void broadcast(at::Tensor& t, int src) {
  in_place(
      "dist.broadcast", t, Call::Broadcast, src,
      [&](Backend& b, std::vector<at::Tensor>& v) { return b.broadcast(v, src); }, [](at::Tensor&) {});
}

std::vector<at::Tensor> all_gather(const at::Tensor& t) {
  const char* fn = "dist.all_gather";
  check_dense(fn, t);
  agree(fn, Call::AllGather, t, 0);
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> in{t.detach().contiguous()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < world_size(); ++r) out[0].push_back(at::empty_like(in[0]));
  Backend& b = backend_for(fn, t);
  collective(fn, [&] { b.allgather(out, in)->wait(); });
  return out[0];
}

void barrier() {
  const char* fn = "dist.barrier";
  agree(fn, Call::Barrier, at::Tensor(), 0);  // an all-gather: every rank has reached it
}

void report_failure(const std::string& message) {
  if (!g_world) return;
  try {
    std::string first = message.substr(0, message.find('\n'));  // not the traceback
    std::string text = "rank " + std::to_string(g_world->options.rank) + " raised an error: " + first;
    g_world->store->set(key_failed(g_world->options.rank), std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception&) {
  }
}

// ---- the launcher's store ----------------------------------------------------

struct Rendezvous::Impl {
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  c10::intrusive_ptr<c10d::Store> store;
};

Rendezvous::Rendezvous(int world_size, std::chrono::milliseconds timeout) : impl_(std::make_unique<Impl>()) {
  c10d::TCPStoreOptions so;
  so.port = 0;  // the system picks a free port: no race with another run
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = timeout;
  try {
    impl_->tcp = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  } catch (const std::exception& e) {
    throw Error("anatomy --nproc: cannot open the rendezvous store on a loopback port: " + message_of(e));
  }
  impl_->store = c10::make_intrusive<c10d::PrefixStore>(store_prefix(), impl_->tcp);
}

Rendezvous::~Rendezvous() = default;

int Rendezvous::port() const { return impl_->tcp->getPort(); }

void Rendezvous::report_exit(int rank, const std::string& what) {
  try {
    if (impl_->store->check({key_failed(rank)})) return;  // the rank said why itself
    std::string text = "rank " + std::to_string(rank) + " " + what;
    impl_->store->set(key_failed(rank), std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception&) {
  }
}

}  // namespace anatomy::dist
