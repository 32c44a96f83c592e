// The CUDA handlers of mok_moe_fwd / _fwd_train / _bwd / _bwd_saved: validate the operands and
// attributes, choose the call's Plan, run the phase sequence (phases/phases.h) on XLA's stream
// without a host sync.
#include <cstdio>
#include <string>

#include "common/bindings.h"
#include "common/env.h"
#include "common/problem.h"
#include "cuda/handlers/bind.h"
#include "cuda/handlers/moe.h"
#include "cuda/host/device.h"
#include "cuda/host/plan.h"
#include "cuda/host/stage.h"
#include "cuda/phases/phases.h"

namespace mok::cuda {

namespace {

ffi::Error CheckSameShape(const char* name, const ffi::AnyBuffer& a, int64_t d0, int64_t d1,
                          ffi::DataType dtype) {
  auto d = a.dimensions();
  MOK_CHECK(d.size() == 2 && d[0] == d0 && d[1] == d1, name, " must be [", d0, ", ", d1, "]");
  MOK_CHECK(a.element_type() == dtype, name, " must have dtype ", DtypeName(dtype), ", got ",
            DtypeName(a.element_type()));
  return ffi::Error::Success();
}

// h (training only): [T*k, 2F] in x's dtype, written by the forward, read by the backward.
ffi::Error CheckSaved(const Problem& pr, const ffi::AnyBuffer& h) {
  return CheckSameShape("h (saved pre-activations)", h, pr.assignments(), 2 * pr.ffn, pr.dtype);
}

// mxfp8 through the BF16 GEMMs (phases.h): the bf16 wgmma kernels, and F in whole 128-column
// tiles (an mx block of 32 F columns never straddles a tile, as in the FP8 kernels).
ffi::Error CheckMx(const Problem& pr, const Plan& plan) {
  MOK_CHECK(pr.dtype == ffi::DataType::BF16 && plan.wgmma,
            "mxfp8 through the BF16 GEMMs needs bf16 x and the wgmma kernels (sm_90a), got ",
            DtypeName(pr.dtype), plan.wgmma ? "" : " without wgmma");
  MOK_CHECK(pr.ffn % 128 == 0 && pr.hidden % 128 == 0,
            "mxfp8 through the BF16 GEMMs needs H and F multiples of 128, got H=", pr.hidden,
            " F=", pr.ffn);
  return ffi::Error::Success();
}

// Everything a call checks before its problem: the debugging switches, the attributes, the
// device (made current). Then the plan for the problem.
ffi::Error Prologue(int32_t device, int32_t pregather_x, int32_t gemm, KernelOptions* options,
                    DeviceInfo* dev) {
  MOK_RETURN_IF_ERROR(env::Status());
  MOK_RETURN_IF_ERROR(ReadKernelOptions(pregather_x, gemm, options));
  return GetDevice(device, dev);
}

ffi::Error ForwardCall(cudaStream_t stream, ffi::ScratchAllocator& scratch, int32_t device,
                       const ffi::AnyBuffer& x, const ffi::AnyBuffer& ids, const ffi::AnyBuffer& w,
                       const ffi::AnyBuffer& wgu, const ffi::AnyBuffer& wd, ffi::AnyBuffer& y,
                       ffi::AnyBuffer* h, int32_t pregather_x, int32_t gemm, bool mx = false) {
  KernelOptions options;
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(Prologue(device, pregather_x, gemm, &options, &dev));
  Problem pr;
  MOK_RETURN_IF_ERROR(ReadCudaProblem(x, ids, w, wgu, wd, &pr));
  MOK_RETURN_IF_ERROR(CheckSameShape("y", y, pr.tokens, pr.hidden, pr.dtype));
  if (h) MOK_RETURN_IF_ERROR(CheckSaved(pr, *h));
  const Plan plan = ChoosePlan(pr, options, dev);
  if (mx) MOK_RETURN_IF_ERROR(CheckMx(pr, plan));
  if (DebugSync())
    std::fprintf(stderr, "jax_mok CUDA: fwd T=%ld H=%ld F=%ld E=%ld k=%ld%s, %s%s%s\n",
                 (long)pr.tokens, (long)pr.hidden, (long)pr.ffn, (long)pr.experts, (long)pr.top_k,
                 h ? " (h saved)" : "", plan.wgmma ? "wgmma" : "SIMT",
                 plan.pregather_x ? ", x pregathered" : "",
                 plan.staged_stores ? ", staged stores" : "");
  if (pr.tokens == 0) return ffi::Error::Success();
  const int* id = static_cast<const int*>(ids.untyped_data());
  const float* wt = static_cast<const float*>(w.untyped_data());
  return DispatchDtype(pr.dtype, [&](auto tag) {
    using T = decltype(tag);
    return Forward<T>(stream, scratch, plan, pr, static_cast<const T*>(x.untyped_data()), id, wt,
                      static_cast<const T*>(wgu.untyped_data()),
                      static_cast<const T*>(wd.untyped_data()), static_cast<T*>(y.untyped_data()),
                      h ? static_cast<T*>(h->untyped_data()) : nullptr, mx);
  });
}

ffi::Error MoeFwd(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                  ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w, ffi::AnyBuffer wgu,
                  ffi::AnyBuffer wd, ffi::Result<ffi::AnyBuffer> y, int32_t pregather_x,
                  int32_t gemm) {
  return ForwardCall(stream, scratch, device, x, ids, w, wgu, wd, *y, nullptr, pregather_x, gemm);
}

ffi::Error MoeFwdTrain(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                       ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w, ffi::AnyBuffer wgu,
                       ffi::AnyBuffer wd, ffi::Result<ffi::AnyBuffer> y,
                       ffi::Result<ffi::AnyBuffer> h, int32_t pregather_x, int32_t gemm) {
  return ForwardCall(stream, scratch, device, x, ids, w, wgu, wd, *y, &*h, pregather_x, gemm);
}

ffi::Error BackwardCall(cudaStream_t stream, ffi::ScratchAllocator& scratch, int32_t device,
                        const ffi::AnyBuffer& dy, const ffi::AnyBuffer& x,
                        const ffi::AnyBuffer& ids, const ffi::AnyBuffer& w,
                        const ffi::AnyBuffer& wgu, const ffi::AnyBuffer& wd,
                        const ffi::AnyBuffer* h, ffi::AnyBuffer& dx, ffi::AnyBuffer& d_w,
                        ffi::AnyBuffer& d_wgu, ffi::AnyBuffer& d_wd, int32_t pregather_x,
                        int32_t gemm, const ffi::AnyBuffer* dy_mx = nullptr,
                        bool qdq_weights = false) {
  KernelOptions options;
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(Prologue(device, pregather_x, gemm, &options, &dev));
  Problem pr;
  MOK_RETURN_IF_ERROR(ReadCudaProblem(x, ids, w, wgu, wd, &pr));
  MOK_RETURN_IF_ERROR(CheckSameShape("dy", dy, pr.tokens, pr.hidden, pr.dtype));
  MOK_RETURN_IF_ERROR(CheckSameShape("dx", dx, pr.tokens, pr.hidden, pr.dtype));
  MOK_RETURN_IF_ERROR(
      CheckSameShape("d_topk_weights", d_w, pr.tokens, pr.top_k, ffi::DataType::F32));
  MOK_CHECK(d_wgu.element_count() == wgu.element_count() && d_wgu.element_type() == pr.dtype,
            "d_w_gate_up must match w_gate_up");
  MOK_CHECK(d_wd.element_count() == wd.element_count() && d_wd.element_type() == pr.dtype,
            "d_w_down must match w_down");
  if (h) MOK_RETURN_IF_ERROR(CheckSaved(pr, *h));
  const Plan plan = ChoosePlan(pr, options, dev);
  if (dy_mx) {
    MOK_RETURN_IF_ERROR(CheckMx(pr, plan));
    MOK_RETURN_IF_ERROR(CheckSameShape("dy_mx", *dy_mx, pr.tokens, pr.hidden, pr.dtype));
  }
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
        stream, scratch, plan, pr, static_cast<const T*>(dy.untyped_data()),
        static_cast<const T*>(x.untyped_data()), id, wt, static_cast<const T*>(wgu.untyped_data()),
        static_cast<const T*>(wd.untyped_data()), static_cast<T*>(dx.untyped_data()), dw,
        static_cast<T*>(d_wgu.untyped_data()), static_cast<T*>(d_wd.untyped_data()),
        h ? static_cast<const T*>(h->untyped_data()) : nullptr,
        dy_mx ? static_cast<const T*>(dy_mx->untyped_data()) : nullptr, qdq_weights);
  });
}

ffi::Error MoeBwd(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                  ffi::AnyBuffer dy, ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w,
                  ffi::AnyBuffer wgu, ffi::AnyBuffer wd, ffi::Result<ffi::AnyBuffer> dx,
                  ffi::Result<ffi::AnyBuffer> d_w, ffi::Result<ffi::AnyBuffer> d_wgu,
                  ffi::Result<ffi::AnyBuffer> d_wd, int32_t pregather_x, int32_t gemm) {
  return BackwardCall(stream, scratch, device, dy, x, ids, w, wgu, wd, nullptr, *dx, *d_w, *d_wgu,
                      *d_wd, pregather_x, gemm);
}

ffi::Error MoeBwdSaved(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                       ffi::AnyBuffer dy, ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w,
                       ffi::AnyBuffer wgu, ffi::AnyBuffer wd, ffi::AnyBuffer h,
                       ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> d_w,
                       ffi::Result<ffi::AnyBuffer> d_wgu, ffi::Result<ffi::AnyBuffer> d_wd,
                       int32_t pregather_x, int32_t gemm) {
  return BackwardCall(stream, scratch, device, dy, x, ids, w, wgu, wd, &h, *dx, *d_w, *d_wgu, *d_wd,
                      pregather_x, gemm);
}

// mxfp8 through the BF16 GEMMs: x and the weights already deq(Q(.)) (jax_mok.quantization.cuda).
ffi::Error MoeFwdMx(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                    ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w, ffi::AnyBuffer wgu,
                    ffi::AnyBuffer wd, ffi::Result<ffi::AnyBuffer> y, int32_t pregather_x,
                    int32_t gemm) {
  return ForwardCall(stream, scratch, device, x, ids, w, wgu, wd, *y, nullptr, pregather_x, gemm,
                     true);
}

ffi::Error MoeFwdTrainMx(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                         ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w, ffi::AnyBuffer wgu,
                         ffi::AnyBuffer wd, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::AnyBuffer> h, int32_t pregather_x, int32_t gemm) {
  return ForwardCall(stream, scratch, device, x, ids, w, wgu, wd, *y, &*h, pregather_x, gemm, true);
}

// (dy_mx, dy, x, ids, w, w_gate_up, w_down, h): dy_mx = deq(Q(dy)) for dy·Wd^T; the weights
// are the backward's layouts (w_gate_up along 2F, w_down along H), or with qdq_weights = 1 the
// weights themselves (their layouts made in the call's scratch, one at a time).
ffi::Error MoeBwdSavedMx(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                         ffi::AnyBuffer dy_mx, ffi::AnyBuffer dy, ffi::AnyBuffer x,
                         ffi::AnyBuffer ids, ffi::AnyBuffer w, ffi::AnyBuffer wgu,
                         ffi::AnyBuffer wd, ffi::AnyBuffer h, ffi::Result<ffi::AnyBuffer> dx,
                         ffi::Result<ffi::AnyBuffer> d_w, ffi::Result<ffi::AnyBuffer> d_wgu,
                         ffi::Result<ffi::AnyBuffer> d_wd, int32_t pregather_x, int32_t gemm,
                         int32_t qdq_weights) {
  MOK_CHECK(qdq_weights == 0 || qdq_weights == 1, "attribute qdq_weights must be 0 or 1, got ",
            qdq_weights);
  return BackwardCall(stream, scratch, device, dy, x, ids, w, wgu, wd, &h, *dx, *d_w, *d_wgu, *d_wd,
                      pregather_x, gemm, &dy_mx, qdq_weights == 1);
}

}  // namespace

std::string CompiledArchitectures() {
#ifdef JAX_MOK_CUDA_ARCHS
  return JAX_MOK_CUDA_ARCHS;
#else
  return "sm_90a";
#endif
}

bool HasWgmmaPath() { return kHasWgmma; }

}  // namespace mok::cuda

// Context first (stream, scratch, device), then the operands shared with every backend.
XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeFwdCuda, mok::cuda::MoeFwd,
                              mok::BindForward(mok::cuda::BindStreamScratchDevice()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeBwdCuda, mok::cuda::MoeBwd,
                              mok::BindBackward(mok::cuda::BindStreamScratchDevice()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeFwdTrainCuda, mok::cuda::MoeFwdTrain,
                              mok::BindForwardTrain(mok::cuda::BindStreamScratchDevice()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeBwdSavedCuda, mok::cuda::MoeBwdSaved,
                              mok::BindBackwardSaved(mok::cuda::BindStreamScratchDevice()));

// mxfp8 through the BF16 GEMMs (the same bindings; the backward with dy_mx before dy).
XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeFwdMxCuda, mok::cuda::MoeFwdMx,
                              mok::BindForward(mok::cuda::BindStreamScratchDevice()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeFwdTrainMxCuda, mok::cuda::MoeFwdTrainMx,
                              mok::BindForwardTrain(mok::cuda::BindStreamScratchDevice()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    MokMoeBwdSavedMxCuda, mok::cuda::MoeBwdSavedMx,
    mok::BindBackwardSaved(mok::cuda::BindStreamScratchDevice().template Arg<xla::ffi::AnyBuffer>())
        .template Attr<int32_t>("qdq_weights"));
