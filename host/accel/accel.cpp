// The "accel" device (see accel.h): PrivateUse1 with memory from the CPU
// allocator, a one-device guard, hooks, the few kernels a backend must own
// (allocation, copies, views, resize, item) and a boxed fallback that runs
// every other operation on the CPU after the device check CUDA makes.
// Follows the layout of PyTorch's out-of-tree backend test (torch_openreg).
#include "host/accel/accel.h"

#include <torch/csrc/api/include/torch/version.h>

#define ANATOMY_ACCEL_SUPPORTED (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))

#if ANATOMY_ACCEL_SUPPORTED

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace anatomy::accel {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
const c10::Device kDevice(kType, 0);

// Memory comes from the CPU allocator in force (host/memory_guard.cpp's guard
// and pool, when installed), relabelled as the device's.
struct AccelAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DataPtr p = c10::GetCPUAllocator()->allocate(nbytes);
    p.unsafe_set_device(kDevice);
    return p;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);
  }
};
AccelAllocator g_allocator;

// One device, one stream, work done when the call returns: events are no-ops.
struct AccelGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    setDevice(d);
    return kDevice;
  }
  c10::Device getDevice() const override { return kDevice; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType && d.index() <= 0, "accel has one device, accel:0 (got ", d, ")");
  }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const override { return c10::Stream(c10::Stream::DEFAULT, kDevice); }
  c10::Stream getDefaultStream(c10::Device) const override { return c10::Stream(c10::Stream::DEFAULT, kDevice); }
  c10::Stream exchangeStream(c10::Stream) const override { return c10::Stream(c10::Stream::DEFAULT, kDevice); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  bool queryStream(const c10::Stream&) const override { return true; }
};

// accel's own generator, as CUDA has its own: a CPU generator (the kernels
// that draw are the CPU's) whose state is not the CPU's, so that a seed
// reaches it through at::manual_seed as it reaches CUDA's, and state saved
// from the CPU's generator alone does not restore what a run drew on the
// device (a checkpoint that forgot the device's stream resumed exactly here,
// and not on a GPU). The fallback hands it to every draw that names none.
at::Generator& generator() {
  static at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val);
  return gen;
}

struct AccelHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  // random numbers on accel are drawn on the CPU (the fallback runs there),
  // from accel's own generator: a seed gives the CPU's numbers, from a stream of its own
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override { return generator(); }
  at::Device getDeviceFromPtr(void*) const override { return kDevice; }
  bool isPinnedPtr(const void*) const override { return false; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    TORCH_CHECK(false, "accel: storages are resized through resize_, not directly (asked for ", newsize, " bytes)");
  }
};
AccelHooks g_hooks;

thread_local int g_device_code = 0;

// Marks accel's own work inside an operator (see in_device_code).
struct DeviceCode {
  DeviceCode() { ++g_device_code; }
  ~DeviceCode() { --g_device_code; }
};

// A CPU tensor over the same memory: how the kernels below reach the data.
at::Tensor as_cpu(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "accel: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "accel: only CPU tensors can be pinned");
  constexpr c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  return at::detail::empty_generic(size, &g_allocator, keys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "accel: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "accel: only CPU tensors can be pinned");
  constexpr c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  return at::detail::empty_strided_generic(size, stride, &g_allocator, keys, c10::dtype_or_default(dtype));
}

// self -> dst, either of them (or both) on accel: copy between CPU views of
// the accel sides, with LibTorch's own copy (dtype conversion, strides, and
// another device such as cuda on the far side).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  DeviceCode inside;
  at::Tensor src = self.device().type() == kType ? as_cpu(self) : self;
  at::Tensor out = dst.device().type() == kType ? as_cpu(dst) : dst;
  out.copy_(src, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  DeviceCode inside;
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size, std::optional<at::MemoryFormat> format) {
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), format);
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  return at::native::set_storage_cpu_(self, std::move(source), offset, size, stride);
}

// x.data = y between the CPU (or cuda) and accel, as between the CPU and
// cuda: LibTorch counts only its own dense backends as one kind of tensor,
// and m:to() keeps every parameter's identity through set_data.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && !t.is_quantized() && (t.is_cpu() || t.is_cuda() || t.device().type() == kType);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) || (dense(self) && dense(from));
}

// Index arguments that CUDA accepts on the CPU (advanced indexing moves them).
bool cpu_indices_allowed(const c10::OperatorName& op, const c10::Argument& arg) {
  if (arg.name() != "indices") return false;
  const std::string& n = op.name;
  return n == "aten::index" || n == "aten::index_put" || n == "aten::index_put_" || n == "aten::_index_put_impl_" ||
         n == "aten::_unsafe_index" || n == "aten::_unsafe_index_put";
}

// CUDA's rule: every tensor argument on the operation's device, except a
// 0-dim CPU tensor (a scalar). Its message, with the operator's name.
void check_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t first = stack.size() - n;
  for (size_t i = 0; i < n; ++i) {
    const c10::Argument& arg = schema.arguments()[i];
    if (cpu_indices_allowed(schema.operator_name(), arg)) continue;
    auto check = [&](const at::Tensor& t) {
      if (!t.defined() || t.device().type() == kType) return;
      if (t.is_cpu() && t.dim() == 0) return;
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but got ", arg.name(), " is on ", t.device(),
                  ", different from other tensors on ", kDevice, " (when checking argument in method ",
                  schema.operator_name(), ")");
    };
    const c10::IValue& v = stack[first + i];
    if (v.isTensor()) {
      check(v.toTensor());
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor()) check(e.toTensor());
    }
  }
}

// A draw that names no generator draws from accel's (the CPU kernel would take the CPU's).
void give_generator(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack.size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* optional = args[i].type()->castRaw<c10::OptionalType>();
    if (optional && optional->getElementType()->kind() == c10::TypeKind::GeneratorType && stack[first + i].isNone())
      stack[first + i] = c10::IValue(generator());
  }
}

// An operator that draws and takes no generator (native_dropout, which
// dropout on a GPU-like device calls) draws from its device's default one:
// for its call the CPU's generator holds accel's state, then both go back.
struct DrawsFromAccel {
  at::Tensor cpu_state;
  explicit DrawsFromAccel(bool on) {
    if (!on) return;
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    at::Tensor accel_state;
    {
      std::lock_guard<std::mutex> lock(generator().mutex());
      accel_state = generator().get_state();
    }
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu_state = cpu.get_state();
    cpu.set_state(accel_state);
  }
  ~DrawsFromAccel() {
    if (!cpu_state.defined()) return;
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    at::Tensor drawn;
    {
      std::lock_guard<std::mutex> lock(cpu.mutex());
      drawn = cpu.get_state();
      cpu.set_state(cpu_state);
    }
    std::lock_guard<std::mutex> lock(generator().mutex());
    generator().set_state(drawn);
  }
};

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_devices(op, *stack);
  give_generator(op, *stack);
  DrawsFromAccel draws(op.schema().operator_name().name == "aten::native_dropout");
  DeviceCode inside;
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

std::atomic<bool> g_installed{false};

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("resize_", resize);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("set_.source_Tensor", at::native::set_tensor_);
  m.impl("set_.source_Storage", at::native::set_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("_local_scalar_dense", at::native::_local_scalar_dense_cpu);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

// Operators whose kernel for a device without its own is a loop of other
// operators (the foreach ops' slow path): through the fallback instead, one
// operator as on CUDA, where each is one kernel.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* op : {"_foreach_add_.Scalar", "_foreach_add_.List", "_foreach_mul_.Scalar", "_foreach_mul_.Tensor",
                         "_foreach_zero_", "_foreach_norm.Scalar", "_foreach_add.Scalar", "_foreach_mul.Scalar"})
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

namespace {
bool g_cuda_present = false;
}

bool install(bool cuda_present) {
  static std::once_flag once;
  std::call_once(once, [cuda_present] {
    if (cuda_present) {
      g_cuda_present = true;
      return;
    }
    c10::register_privateuse1_backend(kName);
    c10::SetAllocator(kType, &g_allocator);
    static c10::impl::DeviceGuardImplRegistrar guard(kType, new AccelGuard());
    at::RegisterPrivateUse1HooksInterface(&g_hooks);
    g_installed = true;
  });
  return g_installed;
}

bool available() { return g_installed; }

bool in_device_code() { return g_device_code > 0; }

std::string unavailable_reason() {
  if (g_installed) return {};
  if (g_cuda_present)
    return "this machine has a CUDA device, and accel stands in for one only where there is none "
           "(LibTorch keeps one accelerator a process); use cuda";
  return "accel was not installed";
}

}  // namespace anatomy::accel

// Autocast on accel casts as it does on CUDA: the lists PyTorch keeps for
// every GPU-like backend (matmuls and convolutions in the lower precision;
// reductions, norms, losses and exp/log in float32; mixed inputs promoted).
// Training in bf16 on accel therefore takes the paths it takes on a GPU.
// (In at::autocast: PyTorch's registration macros name ATen's types unqualified.)
namespace at::autocast {
namespace {
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define ACCEL_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define ACCEL_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define ACCEL_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define ACCEL_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(ACCEL_LOWER_PRECISION_FP)
  AT_FORALL_FP32(ACCEL_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(ACCEL_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(ACCEL_PROMOTE)
#undef ACCEL_LOWER_PRECISION_FP
#undef ACCEL_FP32
#undef ACCEL_FP32_SET_OPT_DTYPE
#undef ACCEL_PROMOTE
}

}  // namespace
}  // namespace at::autocast

#else  // LibTorch before 2.1: no PrivateUse1 backends from C++

namespace anatomy::accel {
bool install(bool) { return false; }
bool available() { return false; }
bool in_device_code() { return false; }
std::string unavailable_reason() {
  return "this LibTorch (" + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
         ") cannot host the accel device (LibTorch 2.1 or later registers a PrivateUse1 backend from C++)";
}
}  // namespace anatomy::accel

#endif
