// CUDA handlers: validate, carve scratch, launch the phases on XLA's stream (no host sync).
//   forward : route → gate/up GEMM (+SwiGLU) → down GEMM (× routing weight) → combine over k
//   backward: route → gate/up GEMM (h) → dy·Wd^T GEMM (+SwiGLU bwd, d_w partials) → dh·Wgu^T GEMM
//             → combine dx, reduce d_w → weight-gradient GEMMs (K = the expert's tokens)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>

#include "common/bindings.h"
#include "common/problem.h"
#include "cuda/handlers/moe.h"
#include "cuda/phases/phases.h"
#include "cuda/host/stage.h"

namespace mok::cuda {

ffi::Error GetDevice(int32_t ordinal, DeviceInfo* info) {
  static std::mutex mu;
  static DeviceInfo cache[64];
  MOK_CUDA_CHECK(ordinal >= 0 && ordinal < 64, "device ordinal ", ordinal, " out of range");
  std::lock_guard<std::mutex> lock(mu);
  DeviceInfo& c = cache[ordinal];
  if (c.sms == 0) {
    MOK_CUDA_RETURN(cudaDeviceGetAttribute(&c.major, cudaDevAttrComputeCapabilityMajor, ordinal));
    MOK_CUDA_RETURN(cudaDeviceGetAttribute(&c.minor, cudaDevAttrComputeCapabilityMinor, ordinal));
    MOK_CUDA_RETURN(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, ordinal));
  }
  *info = c;
  // Kernel attributes (dynamic shared memory) are set per device: make sure it is this one.
  int current = -1;
  MOK_CUDA_RETURN(cudaGetDevice(&current));
  if (current != ordinal) MOK_CUDA_RETURN(cudaSetDevice(ordinal));
  if (c.major != 9) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      Msg("jax_mok CUDA kernels are built for sm_90a (Hopper, compute "
                          "capability 9.0); device ",
                          ordinal, " has compute capability ", c.major, ".", c.minor,
                          ". Use implementation=\"reference\" on this GPU."));
  }
  return ffi::Error::Success();
}

ffi::Error CheckCommon(const Problem& pr) {
  MOK_CUDA_CHECK(pr.hidden % 8 == 0 && pr.ffn % 8 == 0,
                 "the CUDA kernels need H and F to be multiples of 8 (16-byte rows), got H=",
                 pr.hidden, " F=", pr.ffn);
  MOK_CUDA_CHECK(pr.assignments() < (int64_t{1} << 30), "T*k must be < 2^30, got ",
                 pr.assignments());
  // The GEMM kernels keep two (E+1)-entry prefix arrays in shared memory beside the tile ring.
  MOK_CUDA_CHECK(pr.experts <= 4096,
                 "the CUDA kernels support E <= 4096 experts per call, got E=", pr.experts);
  return ffi::Error::Success();
}

namespace {

ffi::Error CheckSameShape(const char* name, const ffi::AnyBuffer& a, int64_t d0, int64_t d1,
                          ffi::DataType dtype) {
  auto d = a.dimensions();
  MOK_CUDA_CHECK(d.size() == 2 && d[0] == d0 && d[1] == d1, name, " must be [", d0, ", ", d1, "]");
  MOK_CUDA_CHECK(a.element_type() == dtype, name, " must have dtype ", DtypeName(dtype), ", got ",
                 DtypeName(a.element_type()));
  return ffi::Error::Success();
}

// h (training only): [T*k, 2F] in x's dtype, written by the forward, read by the backward.
ffi::Error CheckSaved(const Problem& pr, const ffi::AnyBuffer& h) {
  return CheckSameShape("h (saved pre-activations)", h, pr.assignments(), 2 * pr.ffn, pr.dtype);
}

ffi::Error ForwardCall(cudaStream_t stream, ffi::ScratchAllocator& scratch, int32_t device,
                       const ffi::AnyBuffer& x, const ffi::AnyBuffer& ids, const ffi::AnyBuffer& w,
                       const ffi::AnyBuffer& wgu, const ffi::AnyBuffer& wd, ffi::AnyBuffer& y,
                       ffi::AnyBuffer* h) {
  Problem pr;
  MOK_RETURN_IF_ERROR(ReadProblem(x, ids, w, wgu, wd, &pr));
  MOK_RETURN_IF_ERROR(CheckCommon(pr));
  MOK_RETURN_IF_ERROR(CheckSameShape("y", y, pr.tokens, pr.hidden, pr.dtype));
  if (h) MOK_RETURN_IF_ERROR(CheckSaved(pr, *h));
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(GetDevice(device, &dev));
  if (DebugSync())
    std::fprintf(stderr, "jax_mok CUDA: fwd T=%ld H=%ld F=%ld E=%ld k=%ld%s\n", (long)pr.tokens,
                 (long)pr.hidden, (long)pr.ffn, (long)pr.experts, (long)pr.top_k,
                 h ? " (h saved)" : "");
  if (pr.tokens == 0) return ffi::Error::Success();
  const int* id = static_cast<const int*>(ids.untyped_data());
  const float* wt = static_cast<const float*>(w.untyped_data());
  return DispatchDtype(pr.dtype, [&](auto tag) {
    using T = decltype(tag);
    return Forward<T>(stream, scratch, dev, pr, static_cast<const T*>(x.untyped_data()), id, wt,
                      static_cast<const T*>(wgu.untyped_data()),
                      static_cast<const T*>(wd.untyped_data()), static_cast<T*>(y.untyped_data()),
                      h ? static_cast<T*>(h->untyped_data()) : nullptr);
  });
}

ffi::Error MoeFwd(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                  ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w, ffi::AnyBuffer wgu,
                  ffi::AnyBuffer wd, ffi::Result<ffi::AnyBuffer> y) {
  return ForwardCall(stream, scratch, device, x, ids, w, wgu, wd, *y, nullptr);
}

ffi::Error MoeFwdTrain(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                       ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w, ffi::AnyBuffer wgu,
                       ffi::AnyBuffer wd, ffi::Result<ffi::AnyBuffer> y,
                       ffi::Result<ffi::AnyBuffer> h) {
  return ForwardCall(stream, scratch, device, x, ids, w, wgu, wd, *y, &*h);
}

ffi::Error BackwardCall(cudaStream_t stream, ffi::ScratchAllocator& scratch, int32_t device,
                        const ffi::AnyBuffer& dy, const ffi::AnyBuffer& x,
                        const ffi::AnyBuffer& ids, const ffi::AnyBuffer& w,
                        const ffi::AnyBuffer& wgu, const ffi::AnyBuffer& wd,
                        const ffi::AnyBuffer* h, ffi::AnyBuffer& dx, ffi::AnyBuffer& d_w,
                        ffi::AnyBuffer& d_wgu, ffi::AnyBuffer& d_wd) {
  Problem pr;
  MOK_RETURN_IF_ERROR(ReadProblem(x, ids, w, wgu, wd, &pr));
  MOK_RETURN_IF_ERROR(CheckCommon(pr));
  MOK_RETURN_IF_ERROR(CheckSameShape("dy", dy, pr.tokens, pr.hidden, pr.dtype));
  MOK_RETURN_IF_ERROR(CheckSameShape("dx", dx, pr.tokens, pr.hidden, pr.dtype));
  MOK_RETURN_IF_ERROR(
      CheckSameShape("d_topk_weights", d_w, pr.tokens, pr.top_k, ffi::DataType::F32));
  MOK_CUDA_CHECK(d_wgu.element_count() == wgu.element_count() && d_wgu.element_type() == pr.dtype,
                 "d_w_gate_up must match w_gate_up");
  MOK_CUDA_CHECK(d_wd.element_count() == wd.element_count() && d_wd.element_type() == pr.dtype,
                 "d_w_down must match w_down");
  if (h) MOK_RETURN_IF_ERROR(CheckSaved(pr, *h));
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(GetDevice(device, &dev));
  if (pr.tokens == 0) {
    MOK_CUDA_RETURN(cudaMemsetAsync(d_wgu.untyped_data(), 0, d_wgu.size_bytes(), stream));
    MOK_CUDA_RETURN(cudaMemsetAsync(d_wd.untyped_data(), 0, d_wd.size_bytes(), stream));
    return ffi::Error::Success();
  }
  const int* id = static_cast<const int*>(ids.untyped_data());
  const float* wt = static_cast<const float*>(w.untyped_data());
  float* dw = static_cast<float*>(d_w.untyped_data());
  return DispatchDtype(pr.dtype, [&](auto tag) {
    using T = decltype(tag);
    return Backward<T>(
        stream, scratch, dev, pr, static_cast<const T*>(dy.untyped_data()),
        static_cast<const T*>(x.untyped_data()), id, wt, static_cast<const T*>(wgu.untyped_data()),
        static_cast<const T*>(wd.untyped_data()), static_cast<T*>(dx.untyped_data()), dw,
        static_cast<T*>(d_wgu.untyped_data()), static_cast<T*>(d_wd.untyped_data()),
        h ? static_cast<const T*>(h->untyped_data()) : nullptr);
  });
}

ffi::Error MoeBwd(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                  ffi::AnyBuffer dy, ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w,
                  ffi::AnyBuffer wgu, ffi::AnyBuffer wd, ffi::Result<ffi::AnyBuffer> dx,
                  ffi::Result<ffi::AnyBuffer> d_w, ffi::Result<ffi::AnyBuffer> d_wgu,
                  ffi::Result<ffi::AnyBuffer> d_wd) {
  return BackwardCall(stream, scratch, device, dy, x, ids, w, wgu, wd, nullptr, *dx, *d_w, *d_wgu,
                      *d_wd);
}

ffi::Error MoeBwdSaved(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                       ffi::AnyBuffer dy, ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w,
                       ffi::AnyBuffer wgu, ffi::AnyBuffer wd, ffi::AnyBuffer h,
                       ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> d_w,
                       ffi::Result<ffi::AnyBuffer> d_wgu, ffi::Result<ffi::AnyBuffer> d_wd) {
  return BackwardCall(stream, scratch, device, dy, x, ids, w, wgu, wd, &h, *dx, *d_w, *d_wgu,
                      *d_wd);
}

}  // namespace

std::string CompiledArchitectures() {
#ifdef JAX_MOK_CUDA_ARCHS
  return JAX_MOK_CUDA_ARCHS;
#else
  return "sm_90a";
#endif
}

bool HasWgmmaPath() {
#ifdef JAX_MOK_HAVE_CUTLASS
  return true;
#else
  return false;
#endif
}

}  // namespace mok::cuda

namespace {
// Context first (stream, scratch, device), then the operands shared with every backend.
auto CudaContext() {
  return xla::ffi::Ffi::Bind()
      .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
      .Ctx<xla::ffi::ScratchAllocator>()
      .Ctx<xla::ffi::DeviceOrdinal>();
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeFwdCuda, mok::cuda::MoeFwd,
                              mok::BindForwardOperands(CudaContext()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeBwdCuda, mok::cuda::MoeBwd,
                              mok::BindBackwardOperands(CudaContext()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeFwdTrainCuda, mok::cuda::MoeFwdTrain,
                              mok::BindForwardTrainOperands(CudaContext()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeBwdSavedCuda, mok::cuda::MoeBwdSaved,
                              mok::BindBackwardSavedOperands(CudaContext()));
