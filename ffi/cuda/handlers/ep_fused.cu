// The fused peer-transport handlers (docs/peer-transport.md): one call each, no host round trip
// between their phases.
//   mok_ep_moe_fwd : the dispatch of mok_ep_dispatch into the workspace's fixed area 2 (rows stay
//                    there), the single-GPU forward phases on those rows, the combine of
//                    mok_ep_combine through area 3 -> y [T,H] f32. Bitwise what the staged
//                    dispatch -> mok_moe_fwd -> combine sequence computes.
//   mok_ep_moe_fwd_train: the same, also handing back the received rows and the saved h.
//   mok_ep_moe_bwd : the reverse combine of dy, the single-GPU backward phases, the reverse
//                    dispatch of dx and d_topk_weights.
// Attributes: the peer attributes, then pregather_x and gemm (common/bindings.h).
#include <cstdint>
#include <utility>

#include "common/bindings.h"
#include "common/problem.h"
#include "cuda/handlers/bind.h"
#include "cuda/handlers/ep.h"
#include "cuda/host/launch.h"
#include "cuda/host/peer_call.h"
#include "cuda/host/plan.h"
#include "cuda/phases/phases.h"

namespace mok::cuda::ep {
namespace {

// The attributes of a fused call, as bound (AppendPeerAttrs after workspace_id, then
// AppendKernelAttrs).
struct FusedAttrs {
  int32_t copy_engine, sync_check;
  int64_t timeout_ms;
  int32_t ctas_per_sm, pregather_x, gemm;
};

// Validates the attributes and begins the peer call.
ffi::Error BeginFused(PeerCall& call, const FusedAttrs& a, KernelOptions* kernel) {
  PeerOptions options;
  MOK_RETURN_IF_ERROR(
      ReadPeerOptions(a.copy_engine, a.sync_check, a.timeout_ms, a.ctas_per_sm, &options));
  MOK_RETURN_IF_ERROR(ReadKernelOptions(a.pregather_x, a.gemm, kernel));
  return call.Begin(options);
}

// What the differentiated fused forward keeps for the fused backward: the received rows (copied
// out of area 2, which the next fused call overwrites) and, when saved, the pre-activations h.
struct Residuals {
  ffi::AnyBuffer* x;    // [EP*R, H] in x's dtype
  ffi::AnyBuffer* ids;  // [EP*R, k] i32
  ffi::AnyBuffer* w;    // [EP*R, k] f32
  ffi::AnyBuffer* h;    // [EP*R*k, 2F] in x's dtype, or nullptr: recomputed by the backward
};

// The saved pre-activations h [EP*R*k, 2F] in x's dtype (written by the fused forward of a
// training step, read by the fused backward).
ffi::Error CheckSavedH(const Problem& pr, const ffi::AnyBuffer& h) {
  MOK_CHECK(h.element_count() == pr.assignments() * 2 * pr.ffn && h.element_type() == pr.dtype,
            "h must be [EP*R*k, 2F] in x's dtype");
  return ffi::Error::Success();
}

ffi::Error CheckResiduals(const Problem& pr, const Residuals& r) {
  MOK_CHECK(r.x->element_count() == pr.tokens * pr.hidden && r.x->element_type() == pr.dtype,
            "the saved rows must be [EP*R=", pr.tokens, ", H=", pr.hidden, "] in x's dtype");
  MOK_CHECK(
      r.ids->element_count() == pr.assignments() && r.ids->element_type() == ffi::DataType::S32 &&
          r.w->element_count() == pr.assignments() && r.w->element_type() == ffi::DataType::F32,
      "the saved ids / weights must be int32 / float32 [EP*R=", pr.tokens, ", k=", pr.top_k, "]");
  return r.h ? CheckSavedH(pr, *r.h) : ffi::Error::Success();
}

// The fused forward: dispatch into area 2 (rows stay there: x [EP*R, H], ids and weights
// [EP*R, k], each field contiguous over the sources), the single-GPU forward on them, the
// combine through area 3. One handler, no host round trip between the phases; the workspace's
// epoch advances twice, as in the staged dispatch + combine.
ffi::Error FusedForwardCall(cudaStream_t stream, ffi::ScratchAllocator& scratch, int32_t device,
                            const ffi::AnyBuffer& x, const ffi::AnyBuffer& ids,
                            const ffi::AnyBuffer& w, const ffi::AnyBuffer& home_row,
                            const ffi::AnyBuffer& wgu, const ffi::AnyBuffer& wd, ffi::AnyBuffer& y,
                            int64_t workspace_id, const FusedAttrs& attrs, const Residuals* keep) {
  PeerCall call(stream, device, workspace_id);
  KernelOptions kernel;
  MOK_RETURN_IF_ERROR(BeginFused(call, attrs, &kernel));
  const symmetric::View& v = call.view();
  const int ep = v.ep_size;
  auto xd = x.dimensions();
  auto id = ids.dimensions();
  auto wt = w.dimensions();
  MOK_CHECK(xd.size() == 3 && xd[0] == ep, "x must be [EP=", ep, ", R, H], got rank ", xd.size());
  const int64_t R = xd[1], H = xd[2];
  MOK_CHECK(id.size() == 3 && id[0] == ep && id[1] == R && ids.element_type() == ffi::DataType::S32,
            "topk_ids must be int32 [EP=", ep, ", R=", R, ", k]");
  const int64_t k = id[2];
  MOK_CHECK(wt.size() == 3 && wt[0] == ep && wt[1] == R && wt[2] == k &&
                w.element_type() == ffi::DataType::F32,
            "topk_weights must be float32 [EP=", ep, ", R=", R, ", k=", k, "]");
  auto gu = wgu.dimensions();
  auto dn = wd.dimensions();
  MOK_CHECK(gu.size() == 3 && dn.size() == 3 && gu[1] == H && dn[2] == H && gu[0] == dn[0] &&
                gu[2] == 2 * dn[1],
            "w_gate_up must be [E, H=", H, ", 2F] and w_down [E, F, H=", H, "]");
  MOK_CHECK(x.element_type() == wgu.element_type() && x.element_type() == wd.element_type(),
            "x, w_gate_up and w_down must share one dtype");
  MOK_RETURN_IF_ERROR(CheckCombineShapes(ep, home_row, y, H));
  Problem pr;
  pr.tokens = ep * R, pr.hidden = H, pr.ffn = dn[1], pr.experts = gu[0], pr.top_k = k;
  pr.dtype = x.element_type();
  MOK_CHECK(pr.dtype == ffi::DataType::BF16 || pr.dtype == ffi::DataType::F32,
            "x must be bfloat16 or float32, got ", DtypeName(pr.dtype));
  MOK_RETURN_IF_ERROR(CheckCommon(pr));
  if (keep) MOK_RETURN_IF_ERROR(CheckResiduals(pr, *keep));
  const Plan plan = ChoosePlan(pr, kernel, call.device());
  void* const h = keep && keep->h ? keep->h->untyped_data() : nullptr;

  // Area 2: [x | ids | weights], each [EP, chunk] without padding between sources.
  const int64_t x_chunk = x.size_bytes() / ep, meta_chunk = R * k * 4;
  const int64_t area_bytes = ep * RegionBytes(v);
  Exchange d;
  const ffi::AnyBuffer* in[3] = {&x, &ids, &w};
  const int64_t chunks[3] = {x_chunk, meta_chunk, meta_chunk};
  int64_t offset = 0;
  for (int i = 0; i < 3; ++i) {
    d.field[i] = Field{static_cast<const char*>(in[i]->untyped_data()), nullptr, chunks[i], offset,
                       chunks[i]};
    offset += Pad16(ep * chunks[i]);
  }
  d.num_fields = 3;
  MOK_CHECK(offset <= area_bytes && ep * x_chunk <= area_bytes, "the fused forward needs ", offset,
            " bytes per area but workspace ", workspace_id, " has ", area_bytes,
            "; the WorkspaceSpec does not match this call");
  d.area[0] = d.area[1] = AreaOffset(v, 2);
  d.phase = kDispatch;
  const int64_t ids_offset = d.field[1].offset, w_offset = d.field[2].offset;
  MOK_RETURN_IF_ERROR(call.RunExchange(d, kInPlace, pr.dtype));

  // The expert phases read the received rows in place (my own workspace, area 2).
  const char* area = v.local + AreaOffset(v, 2);
  char* rows = nullptr;  // [EP*R, H] in x's dtype: each row's local experts summed
  MOK_RETURN_IF_ERROR(AllocateScratch(scratch, static_cast<size_t>(ep * x_chunk), &rows));
  const int* rid = reinterpret_cast<const int*>(area + ids_offset);
  const float* rw = reinterpret_cast<const float*>(area + w_offset);
  MOK_RETURN_IF_ERROR(DispatchDtype(pr.dtype, [&](auto tag) {
    using T = decltype(tag);
    return Forward<T>(stream, scratch, plan, pr, reinterpret_cast<const T*>(area), rid, rw,
                      static_cast<const T*>(wgu.untyped_data()),
                      static_cast<const T*>(wd.untyped_data()), reinterpret_cast<T*>(rows),
                      static_cast<T*>(h));
  }));
  if (keep) {  // the received rows out of area 2, which the next fused call overwrites
    const struct {
      ffi::AnyBuffer* out;
      int64_t at;
    } saved[3] = {{keep->x, 0}, {keep->ids, ids_offset}, {keep->w, w_offset}};
    for (const auto& f : saved)
      MOK_CUDA_RETURN(cudaMemcpyAsync(f.out->untyped_data(), area + f.at, f.out->size_bytes(),
                                      cudaMemcpyDeviceToDevice, stream));
  }

  // Area 3: the rows computed for source s go home to rank s; then the fixed-order reduction.
  Exchange c;
  c.field[0] = Field{rows, nullptr, x_chunk, 0, x_chunk};
  c.num_fields = 1;
  c.area[0] = c.area[1] = AreaOffset(v, 3);
  c.phase = kCombine;
  SetReduction(home_row, y, H, &c);
  MOK_RETURN_IF_ERROR(call.RunExchange(c, kReduce, pr.dtype));
  return call.Finish();
}

ffi::Error FusedForward(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                        ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w,
                        ffi::AnyBuffer home_row, ffi::AnyBuffer wgu, ffi::AnyBuffer wd,
                        ffi::Result<ffi::AnyBuffer> y, int64_t workspace_id, int32_t copy_engine,
                        int32_t sync_check, int64_t timeout_ms, int32_t ctas_per_sm,
                        int32_t pregather_x, int32_t gemm) {
  const FusedAttrs attrs{copy_engine, sync_check, timeout_ms, ctas_per_sm, pregather_x, gemm};
  return FusedForwardCall(stream, scratch, device, x, ids, w, home_row, wgu, wd, *y, workspace_id,
                          attrs, nullptr);
}

// mok_ep_moe_fwd_train: the fused forward of a training step, which also hands back the received
// rows and h (the fused backward's operands). mok_ep_moe_fwd_train_recompute: the same without h
// (the backward recomputes it). Two targets rather than an empty h: no call takes or returns a
// zero-element buffer (XLA's GPU compiler crashed on the empty h of this call).
ffi::Error FusedForwardTrain(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                             ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w,
                             ffi::AnyBuffer home_row, ffi::AnyBuffer wgu, ffi::AnyBuffer wd,
                             ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> x_rows,
                             ffi::Result<ffi::AnyBuffer> ids_rows,
                             ffi::Result<ffi::AnyBuffer> w_rows, ffi::Result<ffi::AnyBuffer> h,
                             int64_t workspace_id, int32_t copy_engine, int32_t sync_check,
                             int64_t timeout_ms, int32_t ctas_per_sm, int32_t pregather_x,
                             int32_t gemm) {
  const FusedAttrs attrs{copy_engine, sync_check, timeout_ms, ctas_per_sm, pregather_x, gemm};
  const Residuals keep{&*x_rows, &*ids_rows, &*w_rows, &*h};
  return FusedForwardCall(stream, scratch, device, x, ids, w, home_row, wgu, wd, *y, workspace_id,
                          attrs, &keep);
}

ffi::Error FusedForwardTrainRecompute(cudaStream_t stream, ffi::ScratchAllocator scratch,
                                      int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer ids,
                                      ffi::AnyBuffer w, ffi::AnyBuffer home_row, ffi::AnyBuffer wgu,
                                      ffi::AnyBuffer wd, ffi::Result<ffi::AnyBuffer> y,
                                      ffi::Result<ffi::AnyBuffer> x_rows,
                                      ffi::Result<ffi::AnyBuffer> ids_rows,
                                      ffi::Result<ffi::AnyBuffer> w_rows, int64_t workspace_id,
                                      int32_t copy_engine, int32_t sync_check, int64_t timeout_ms,
                                      int32_t ctas_per_sm, int32_t pregather_x, int32_t gemm) {
  const FusedAttrs attrs{copy_engine, sync_check, timeout_ms, ctas_per_sm, pregather_x, gemm};
  const Residuals keep{&*x_rows, &*ids_rows, &*w_rows, nullptr};
  return FusedForwardCall(stream, scratch, device, x, ids, w, home_row, wgu, wd, *y, workspace_id,
                          attrs, &keep);
}

// The fused backward: the reverse combine of dy rows into area 2 (read in place), the single-GPU
// backward phases on them, the reverse dispatch of dx rows and d_topk_weights through area 3 into
// XLA's results. Bitwise what the staged reverse combine -> mok_moe_bwd(_saved) -> reverse dispatch
// computes.
//   dy_rows [EP,R,H] (row i of chunk d: the cotangent of the token this rank sent to d as row i),
//   x [EP*R,H], topk_ids [EP*R,k], topk_weights [EP*R,k] (the forward's received rows),
//   w_gate_up, w_down, h [EP*R*k, 2F] (the saved pre-activations; mok_ep_moe_bwd_recompute has
//   no h and recomputes it)
//   -> dx [EP,R,H] (chunk s: for the rows rank s sent), d_topk_weights [EP,R,k] f32 (likewise),
//      d_w_gate_up, d_w_down.
ffi::Error FusedBackwardCall(cudaStream_t stream, ffi::ScratchAllocator& scratch, int32_t device,
                             const ffi::AnyBuffer& dy_rows, const ffi::AnyBuffer& x,
                             const ffi::AnyBuffer& ids, const ffi::AnyBuffer& w,
                             const ffi::AnyBuffer& wgu, const ffi::AnyBuffer& wd,
                             const ffi::AnyBuffer* h, ffi::Result<ffi::AnyBuffer>& dx,
                             ffi::Result<ffi::AnyBuffer>& d_w, ffi::Result<ffi::AnyBuffer>& d_wgu,
                             ffi::Result<ffi::AnyBuffer>& d_wd, int64_t workspace_id,
                             const FusedAttrs& attrs) {
  PeerCall call(stream, device, workspace_id);
  KernelOptions kernel;
  MOK_RETURN_IF_ERROR(BeginFused(call, attrs, &kernel));
  const symmetric::View& v = call.view();
  const int ep = v.ep_size;
  Problem pr;
  MOK_RETURN_IF_ERROR(ReadCudaProblem(x, ids, w, wgu, wd, &pr));
  const Plan plan = ChoosePlan(pr, kernel, call.device());
  auto gd = dy_rows.dimensions();
  MOK_CHECK(gd.size() == 3 && gd[0] == ep && gd[0] * gd[1] == pr.tokens && gd[2] == pr.hidden &&
                dy_rows.element_type() == pr.dtype,
            "dy_rows must be [EP=", ep, ", R, H=", pr.hidden, "] with EP*R = ", pr.tokens,
            " rows in x's dtype");
  const int64_t R = gd[1];
  MOK_CHECK(dx->size_bytes() == dy_rows.size_bytes() && dx->element_type() == pr.dtype,
            "dx must be [EP, R, H] in x's dtype");
  MOK_CHECK(d_w->element_count() == pr.assignments() && d_w->element_type() == ffi::DataType::F32,
            "d_topk_weights must be float32 [EP, R, k]");
  MOK_CHECK(
      d_wgu->element_count() == wgu.element_count() && d_wd->element_count() == wd.element_count(),
      "d_w_gate_up / d_w_down must match the weights");
  if (h) MOK_RETURN_IF_ERROR(CheckSavedH(pr, *h));
  const int64_t area_bytes = ep * RegionBytes(v);
  const int64_t row_chunk = dy_rows.size_bytes() / ep, dw_chunk = R * pr.top_k * 4;

  // Reverse combine: dy chunk d -> rank d's area 2, slot me (rows stay there).
  Exchange a;
  a.field[0] =
      Field{static_cast<const char*>(dy_rows.untyped_data()), nullptr, row_chunk, 0, row_chunk};
  a.num_fields = 1;
  MOK_CHECK(ep * row_chunk <= area_bytes, "the fused backward needs ", ep * row_chunk,
            " bytes per area but workspace ", workspace_id, " has ", area_bytes);
  a.area[0] = a.area[1] = AreaOffset(v, 2);
  a.phase = kReverseCombine;
  MOK_RETURN_IF_ERROR(call.RunExchange(a, kInPlace, pr.dtype));

  // The backward phases on the received dy rows; dx rows and d_w into scratch.
  char* dx_rows = nullptr;
  char* dw_rows = nullptr;
  MOK_RETURN_IF_ERROR(AllocateScratch(scratch, static_cast<size_t>(ep * row_chunk), &dx_rows));
  MOK_RETURN_IF_ERROR(AllocateScratch(scratch, static_cast<size_t>(ep * dw_chunk), &dw_rows));
  const char* dy = v.local + AreaOffset(v, 2);
  MOK_RETURN_IF_ERROR(DispatchDtype(pr.dtype, [&](auto tag) {
    using T = decltype(tag);
    return Backward<T>(
        stream, scratch, plan, pr, reinterpret_cast<const T*>(dy),
        static_cast<const T*>(x.untyped_data()), static_cast<const int*>(ids.untyped_data()),
        static_cast<const float*>(w.untyped_data()), static_cast<const T*>(wgu.untyped_data()),
        static_cast<const T*>(wd.untyped_data()), reinterpret_cast<T*>(dx_rows),
        reinterpret_cast<float*>(dw_rows), static_cast<T*>(d_wgu->untyped_data()),
        static_cast<T*>(d_wd->untyped_data()),
        h ? static_cast<const T*>(h->untyped_data()) : nullptr);
  }));

  // Reverse dispatch: dx rows and d_w of chunk s -> rank s's area 3 -> XLA's results.
  Exchange b;
  b.field[0] = Field{dx_rows, static_cast<char*>(dx->untyped_data()), row_chunk, 0, row_chunk};
  b.field[1] = Field{dw_rows, static_cast<char*>(d_w->untyped_data()), dw_chunk,
                     Pad16(ep * row_chunk), dw_chunk};
  b.num_fields = 2;
  MOK_CHECK(Pad16(ep * row_chunk) + ep * dw_chunk <= area_bytes, "the fused backward needs ",
            Pad16(ep * row_chunk) + ep * dw_chunk, " bytes in area 3, workspace ", workspace_id,
            " has ", area_bytes);
  b.area[0] = b.area[1] = AreaOffset(v, 3);
  b.phase = kReverseDispatch;
  MOK_RETURN_IF_ERROR(call.RunExchange(b, kCopyOut, pr.dtype));
  return call.Finish();
}

ffi::Error FusedBackward(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                         ffi::AnyBuffer dy_rows, ffi::AnyBuffer x, ffi::AnyBuffer ids,
                         ffi::AnyBuffer w, ffi::AnyBuffer wgu, ffi::AnyBuffer wd, ffi::AnyBuffer h,
                         ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> d_w,
                         ffi::Result<ffi::AnyBuffer> d_wgu, ffi::Result<ffi::AnyBuffer> d_wd,
                         int64_t workspace_id, int32_t copy_engine, int32_t sync_check,
                         int64_t timeout_ms, int32_t ctas_per_sm, int32_t pregather_x,
                         int32_t gemm) {
  const FusedAttrs attrs{copy_engine, sync_check, timeout_ms, ctas_per_sm, pregather_x, gemm};
  return FusedBackwardCall(stream, scratch, device, dy_rows, x, ids, w, wgu, wd, &h, dx, d_w, d_wgu,
                           d_wd, workspace_id, attrs);
}

ffi::Error FusedBackwardRecompute(cudaStream_t stream, ffi::ScratchAllocator scratch,
                                  int32_t device, ffi::AnyBuffer dy_rows, ffi::AnyBuffer x,
                                  ffi::AnyBuffer ids, ffi::AnyBuffer w, ffi::AnyBuffer wgu,
                                  ffi::AnyBuffer wd, ffi::Result<ffi::AnyBuffer> dx,
                                  ffi::Result<ffi::AnyBuffer> d_w,
                                  ffi::Result<ffi::AnyBuffer> d_wgu,
                                  ffi::Result<ffi::AnyBuffer> d_wd, int64_t workspace_id,
                                  int32_t copy_engine, int32_t sync_check, int64_t timeout_ms,
                                  int32_t ctas_per_sm, int32_t pregather_x, int32_t gemm) {
  const FusedAttrs attrs{copy_engine, sync_check, timeout_ms, ctas_per_sm, pregather_x, gemm};
  return FusedBackwardCall(stream, scratch, device, dy_rows, x, ids, w, wgu, wd, nullptr, dx, d_w,
                           d_wgu, d_wd, workspace_id, attrs);
}

}  // namespace
}  // namespace mok::cuda::ep

namespace {
// The operands of mok_ep_moe_fwd and mok_ep_moe_fwd_train (the fused calls also allocate XLA
// scratch for the single-GPU phases).
auto FusedForwardOperands() {
  return mok::cuda::BindStreamScratchDevice()
      .Arg<xla::ffi::AnyBuffer>()   // x [EP, R, H]
      .Arg<xla::ffi::AnyBuffer>()   // topk_ids [EP, R, k] i32
      .Arg<xla::ffi::AnyBuffer>()   // topk_weights [EP, R, k] f32
      .Arg<xla::ffi::AnyBuffer>()   // home_row [T, EP] i32
      .Arg<xla::ffi::AnyBuffer>()   // w_gate_up [E_loc, H, 2F]
      .Arg<xla::ffi::AnyBuffer>();  // w_down [E_loc, F, H]
}

// The results of mok_ep_moe_fwd_train and mok_ep_moe_fwd_train_recompute before h (the saved one
// only): y and the received rows, which the fused backward reads.
template <typename Binding>
auto FusedTrainRets(Binding&& binding) {
  return std::move(binding)
      .template Ret<xla::ffi::AnyBuffer>()   // y [T, H] f32
      .template Ret<xla::ffi::AnyBuffer>()   // received x [EP*R, H]
      .template Ret<xla::ffi::AnyBuffer>()   // received ids [EP*R, k]
      .template Ret<xla::ffi::AnyBuffer>();  // received w [EP*R, k]
}

// The operands of mok_ep_moe_bwd and mok_ep_moe_bwd_recompute before h (the saved one only).
auto FusedBackwardOperands() {
  return mok::cuda::BindStreamScratchDevice()
      .Arg<xla::ffi::AnyBuffer>()   // dy_rows [EP, R, H]
      .Arg<xla::ffi::AnyBuffer>()   // x [EP*R, H]
      .Arg<xla::ffi::AnyBuffer>()   // topk_ids [EP*R, k]
      .Arg<xla::ffi::AnyBuffer>()   // topk_weights [EP*R, k]
      .Arg<xla::ffi::AnyBuffer>()   // w_gate_up
      .Arg<xla::ffi::AnyBuffer>();  // w_down
}

// Every fused call's attributes: the peer transport's, then the kernel choices.
template <typename Binding>
auto BindFusedAttrs(Binding&& binding) {
  return mok::AppendKernelAttrs(mok::AppendPeerAttrs(std::move(binding)));
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    MokEpMoeFwdCuda, mok::cuda::ep::FusedForward,
    BindFusedAttrs(FusedForwardOperands().Ret<xla::ffi::AnyBuffer>()));  // y [T, H] f32

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokEpMoeFwdTrainCuda, mok::cuda::ep::FusedForwardTrain,
                              BindFusedAttrs(FusedTrainRets(FusedForwardOperands())
                                                 .Ret<xla::ffi::AnyBuffer>()));  // h [EP*R*k, 2F]

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokEpMoeFwdTrainRecomputeCuda,
                              mok::cuda::ep::FusedForwardTrainRecompute,
                              BindFusedAttrs(FusedTrainRets(FusedForwardOperands())));

// -> dx [EP, R, H], d_topk_weights [EP, R, k], d_w_gate_up, d_w_down.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    MokEpMoeBwdCuda, mok::cuda::ep::FusedBackward,
    BindFusedAttrs(mok::AppendGradientRets(
        FusedBackwardOperands().Arg<xla::ffi::AnyBuffer>())));  // h [EP*R*k, 2F]

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokEpMoeBwdRecomputeCuda, mok::cuda::ep::FusedBackwardRecompute,
                              BindFusedAttrs(mok::AppendGradientRets(FusedBackwardOperands())));
