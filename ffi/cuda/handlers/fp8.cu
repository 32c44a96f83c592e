// FFI handlers of the FP8 layer (docs/ffi-contract.md): validate the quantized operands, carve
// scratch, run the FP8 phases on XLA's stream.
//   mok_moe_fwd_fp8       x_q [T,H] e4m3, x_s, topk_ids [T,k] i32, topk_weights [T,k] f32,
//                         w_gate_up_q [E,2F,H], its scales, w_down_q [E,H,F], its scales
//                         -> y [T,H] (bf16 / f32)
//   mok_moe_fwd_train_fp8 the same -> y, h [T*k, 2F] in y's dtype (the backward's saved h)
//   mok_moe_bwd_fp8       dy [T,H], dy_q, dy_s, x [T,H], x_q, x_s, topk_ids, topk_weights,
//                         w_gate_up_q [E,2F,H] + s (recompute), w_down_b [E,F,H] + s,
//                         w_gate_up_b [E,H,2F] + s
//                         -> dx [T,H], d_topk_weights [T,k] f32, d_w_gate_up [E,H,2F],
//                            d_w_down [E,F,H] (in dy's dtype); h recomputed
//   mok_moe_bwd_saved_fp8 the same operands less w_gate_up_q and its scales (nothing recomputes
//                         with them), + h [T*k, 2F] from mok_moe_fwd_train_fp8
//   mok_quantize          x [R, C] (bf16 / f32) -> values [R, C] e4m3, scales (the recipe's)
//   mok_quantize_weight   w [E, A, B] (bf16 / f32), attribute axis (1 or 2) -> values and scales
//                         along that axis, reduction dim last: axis 1 [E, B, A], axis 2 [E, A, B]
//                         (scales: mxfp8 [E, ., ./32] e8m0; fp8_block 128x128 blocks f32)
//   mok_quantize_weight_both  w -> along A (values, scales), along B (values, scales), one pass
// Attribute `recipe` (int32): 1 mxfp8 (scales float8_e8m0fnu, one per 32 along the reduction
// dim), 2 fp8_block (scales float32: 1x128 for activations, 128x128 blocks for weights).
// Attribute `weight_grads` (int32, the backward handlers): 0 FP8 weight-gradient GEMMs on the
// operands quantized along tokens, 1 the routed-K GEMMs in dy's dtype on the unquantized operands
// (MoEConfig.fp8_weight_gradients). Attribute `pregather_x` (int32, the backward handlers): with
// weight_grads = 1 on the wgmma path, 1 copies x and dy into expert order for those GEMMs, 0 lets
// them gather their token-order operand themselves (the same bits either way).
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "common/bindings.h"
#include "common/env.h"
#include "common/problem.h"
#include "cuda/device/fp8_quantize.cuh"
#include "cuda/handlers/bind.h"
#include "cuda/handlers/fp8.h"
#include "cuda/host/device.h"
#include "cuda/host/stage.h"
#include "cuda/phases/fp8.h"
#include "cuda/phases/phases.h"

namespace mok::cuda::fp8 {
namespace {

using ffi::AnyBuffer;
using ffi::DataType;

// What every FP8 call checks first, as the BF16 calls' Prologue does: the debugging switches
// (a bad JAX_MOK_CUDA_* value is an error here too), then the recipe attribute.
ffi::Error Fp8Prologue(int32_t recipe) {
  MOK_RETURN_IF_ERROR(env::Status());
  MOK_CHECK(recipe == 1 || recipe == 2, "recipe must be 1 (mxfp8) or 2 (fp8_block), got ", recipe);
  return ffi::Error::Success();
}

DataType ScaleType(int32_t recipe) { return recipe == 1 ? DataType::F8E8M0FNU : DataType::F32; }

ffi::Error CheckDims(const char* name, const AnyBuffer& a, std::initializer_list<int64_t> dims,
                     DataType dtype) {
  auto d = a.dimensions();
  bool ok = d.size() == dims.size() && a.element_type() == dtype;
  size_t i = 0;
  for (int64_t want : dims) ok = ok && d[i++] == want;
  if (ok) return ffi::Error::Success();
  std::string want = "[", got = "[";
  for (int64_t v : dims) want += (want.size() > 1 ? ", " : "") + std::to_string(v);
  for (size_t j = 0; j < d.size(); ++j) got += (j ? ", " : "") + std::to_string(d[j]);
  return ffi::Error::InvalidArgument(StrCat("jax_mok: ", name, " must be ", want, "] (dtype ",
                                            DtypeName(dtype), "), got ", got, "] (dtype ",
                                            DtypeName(a.element_type()), ")"));
}

// A quantized [.., rows, k] operand (reduction dim last) and its scales: [.., rows, k / 32] bytes
// (mxfp8), [.., rows, k / 128] float32 (fp8_block activations) or [.., rows / 128, k / 128]
// float32 (fp8_block weights).
ffi::Error CheckQuantized(const char* name, const AnyBuffer& v, const AnyBuffer& s, int32_t recipe,
                          std::initializer_list<int64_t> lead, int64_t rows, int64_t k, bool weight,
                          Quantized* out) {
  std::vector<int64_t> dims(lead);
  dims.push_back(rows);
  dims.push_back(k);
  auto vd = v.dimensions();
  MOK_CHECK(v.element_type() == DataType::F8E4M3FN && vd.size() == dims.size(), name,
            " must be float8_e4m3fn of rank ", dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    MOK_CHECK(vd[i] == dims[i], name, " dim ", i, " must be ", dims[i], ", got ", vd[i]);
  std::vector<int64_t> sdims(lead);
  if (recipe == 1) {
    sdims.push_back(rows), sdims.push_back(k / 32);
  } else {
    sdims.push_back(weight ? rows / 128 : rows), sdims.push_back(k / 128);
  }
  auto sd = s.dimensions();
  MOK_CHECK(s.element_type() == ScaleType(recipe) && sd.size() == sdims.size(), name,
            " scales must be ", recipe == 1 ? "float8_e8m0fnu" : "float32", " of rank ",
            sdims.size());
  for (size_t i = 0; i < sdims.size(); ++i)
    MOK_CHECK(sd[i] == sdims[i], name, " scales dim ", i, " must be ", sdims[i], ", got ", sd[i]);
  out->values = static_cast<const uint8_t*>(v.untyped_data());
  out->scales = static_cast<const uint8_t*>(s.untyped_data());
  return ffi::Error::Success();
}

// Sizes from x_q [T, H], topk_ids [T, k], w_down_q [E, H, F] (forward layout) or the backward's
// w_down [E, F, H]; H and F multiples of 128 (whole k-blocks and scale blocks).
ffi::Error ReadFp8Problem(const AnyBuffer& x_q, const AnyBuffer& ids, const AnyBuffer& w,
                          const AnyBuffer& w_down, bool backward_layout, DataType dtype,
                          Problem* pr) {
  auto xd = x_q.dimensions(), id = ids.dimensions(), dn = w_down.dimensions();
  MOK_CHECK(xd.size() == 2 && id.size() == 2 && dn.size() == 3,
            "x_q must be [T, H], topk_ids [T, k], w_down [E, ., .]");
  pr->tokens = xd[0], pr->hidden = xd[1], pr->top_k = id[1], pr->experts = dn[0];
  pr->ffn = backward_layout ? dn[1] : dn[2];
  pr->dtype = dtype;
  MOK_CHECK(dtype == DataType::BF16 || dtype == DataType::F32,
            "the FP8 layer's outputs must be bfloat16 or float32");
  MOK_CHECK(id[0] == pr->tokens && ids.element_type() == DataType::S32,
            "topk_ids must be int32 [T=", pr->tokens, ", k]");
  MOK_RETURN_IF_ERROR(CheckDims("topk_weights", w, {pr->tokens, pr->top_k}, DataType::F32));
  MOK_CHECK(pr->experts <= kFp8MaxExperts, "the FP8 kernels take at most ", kFp8MaxExperts,
            " experts per call, got E=", pr->experts);
  MOK_CHECK(pr->hidden % 128 == 0 && pr->ffn % 128 == 0,
            "the FP8 kernels need H and F to be multiples of 128, got H=", pr->hidden,
            " F=", pr->ffn);
  return CheckCommon(*pr);
}

ffi::Error ForwardCall(cudaStream_t stream, ffi::ScratchAllocator& scratch, int32_t device,
                       const AnyBuffer& x_q, const AnyBuffer& x_s, const AnyBuffer& ids,
                       const AnyBuffer& w, const AnyBuffer& wgu, const AnyBuffer& wgu_s,
                       const AnyBuffer& wd, const AnyBuffer& wd_s, AnyBuffer& y, AnyBuffer* h,
                       int32_t recipe) {
  MOK_RETURN_IF_ERROR(Fp8Prologue(recipe));
  Problem pr;
  MOK_RETURN_IF_ERROR(ReadFp8Problem(x_q, ids, w, wd, false, y.element_type(), &pr));
  const int64_t T = pr.tokens, H = pr.hidden, F = pr.ffn, E = pr.experts;
  Quantized x, gu, dn;
  MOK_RETURN_IF_ERROR(CheckQuantized("x_q", x_q, x_s, recipe, {}, T, H, false, &x));
  MOK_RETURN_IF_ERROR(CheckQuantized("w_gate_up_q", wgu, wgu_s, recipe, {E}, 2 * F, H, true, &gu));
  MOK_RETURN_IF_ERROR(CheckQuantized("w_down_q", wd, wd_s, recipe, {E}, H, F, true, &dn));
  MOK_RETURN_IF_ERROR(CheckDims("y", y, {T, H}, pr.dtype));
  if (h) MOK_RETURN_IF_ERROR(CheckDims("h", *h, {pr.assignments(), 2 * F}, pr.dtype));
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(GetDevice(device, &dev));
  if (T == 0) return ffi::Error::Success();
  return DispatchDtype(pr.dtype, [&](auto tag) {
    using T_ = decltype(tag);
    return Forward8<T_>(static_cast<Recipe>(recipe), stream, scratch, dev, pr, x,
                        static_cast<const int*>(ids.untyped_data()),
                        static_cast<const float*>(w.untyped_data()), gu, dn,
                        static_cast<T_*>(y.untyped_data()),
                        h ? static_cast<T_*>(h->untyped_data()) : nullptr);
  });
}

ffi::Error MoeFwdFp8(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                     AnyBuffer x_q, AnyBuffer x_s, AnyBuffer ids, AnyBuffer w, AnyBuffer wgu,
                     AnyBuffer wgu_s, AnyBuffer wd, AnyBuffer wd_s, ffi::Result<AnyBuffer> y,
                     int32_t recipe) {
  return ForwardCall(stream, scratch, device, x_q, x_s, ids, w, wgu, wgu_s, wd, wd_s, *y, nullptr,
                     recipe);
}

ffi::Error MoeFwdTrainFp8(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                          AnyBuffer x_q, AnyBuffer x_s, AnyBuffer ids, AnyBuffer w, AnyBuffer wgu,
                          AnyBuffer wgu_s, AnyBuffer wd, AnyBuffer wd_s, ffi::Result<AnyBuffer> y,
                          ffi::Result<AnyBuffer> h, int32_t recipe) {
  return ForwardCall(stream, scratch, device, x_q, x_s, ids, w, wgu, wgu_s, wd, wd_s, *y, &*h,
                     recipe);
}

ffi::Error BackwardCall(cudaStream_t stream, ffi::ScratchAllocator& scratch, int32_t device,
                        AnyBuffer dy, AnyBuffer dy_q, AnyBuffer dy_s, AnyBuffer x, AnyBuffer x_q,
                        AnyBuffer x_s, AnyBuffer ids, AnyBuffer w, const AnyBuffer* wgu_f,
                        const AnyBuffer* wgu_fs, AnyBuffer wd_b, AnyBuffer wd_bs, AnyBuffer wgu_b,
                        AnyBuffer wgu_bs, const AnyBuffer* h, ffi::Result<AnyBuffer> dx,
                        ffi::Result<AnyBuffer> d_w, ffi::Result<AnyBuffer> d_wgu,
                        ffi::Result<AnyBuffer> d_wd, int32_t recipe, int32_t weight_grads,
                        int32_t pregather_x) {
  MOK_RETURN_IF_ERROR(Fp8Prologue(recipe));
  MOK_CHECK(weight_grads == 0 || weight_grads == 1,
            "weight_grads must be 0 (FP8) or 1 (unquantized), got ", weight_grads);
  MOK_CHECK(pregather_x == 0 || pregather_x == 1,
            "attribute pregather_x must be 0 (off) or 1 (on), got ", pregather_x);
  Problem pr;
  MOK_RETURN_IF_ERROR(ReadFp8Problem(x_q, ids, w, wd_b, true, dy.element_type(), &pr));
  const int64_t T = pr.tokens, H = pr.hidden, F = pr.ffn, E = pr.experts;
  Backward8Operands op{};
  MOK_RETURN_IF_ERROR(CheckDims("dy", dy, {T, H}, pr.dtype));
  MOK_RETURN_IF_ERROR(CheckDims("x", x, {T, H}, pr.dtype));
  MOK_RETURN_IF_ERROR(CheckQuantized("dy_q", dy_q, dy_s, recipe, {}, T, H, false, &op.dy_q));
  MOK_RETURN_IF_ERROR(CheckQuantized("x_q", x_q, x_s, recipe, {}, T, H, false, &op.x_q));
  // Recomputing h reads the forward's gate/up layout; with h saved it is not an operand.
  if (!h)
    MOK_RETURN_IF_ERROR(CheckQuantized("w_gate_up_q", *wgu_f, *wgu_fs, recipe, {E}, 2 * F, H, true,
                                       &op.w_gate_up_fwd));
  MOK_RETURN_IF_ERROR(
      CheckQuantized("w_down_b", wd_b, wd_bs, recipe, {E}, F, H, true, &op.w_down_bwd));
  MOK_RETURN_IF_ERROR(
      CheckQuantized("w_gate_up_b", wgu_b, wgu_bs, recipe, {E}, H, 2 * F, true, &op.w_gate_up_bwd));
  if (h) MOK_RETURN_IF_ERROR(CheckDims("h", *h, {pr.assignments(), 2 * F}, pr.dtype));
  MOK_RETURN_IF_ERROR(CheckDims("dx", *dx, {T, H}, pr.dtype));
  MOK_RETURN_IF_ERROR(CheckDims("d_topk_weights", *d_w, {T, pr.top_k}, DataType::F32));
  MOK_RETURN_IF_ERROR(CheckDims("d_w_gate_up", *d_wgu, {E, H, 2 * F}, pr.dtype));
  MOK_RETURN_IF_ERROR(CheckDims("d_w_down", *d_wd, {E, F, H}, pr.dtype));
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(GetDevice(device, &dev));
  if (T == 0) {
    MOK_CUDA_RETURN(cudaMemsetAsync(d_wgu->untyped_data(), 0, d_wgu->size_bytes(), stream));
    MOK_CUDA_RETURN(cudaMemsetAsync(d_wd->untyped_data(), 0, d_wd->size_bytes(), stream));
    return ffi::Error::Success();
  }
  op.dy = dy.untyped_data(), op.x = x.untyped_data();
  op.ids = static_cast<const int*>(ids.untyped_data());
  op.w = static_cast<const float*>(w.untyped_data());
  op.h_saved = h ? h->untyped_data() : nullptr;
  op.unquantized_weight_grads = weight_grads == 1;
  op.pregather_x = pregather_x;
  return DispatchDtype(pr.dtype, [&](auto tag) {
    using T_ = decltype(tag);
    return Backward8<T_>(
        static_cast<Recipe>(recipe), stream, scratch, dev, pr, op,
        static_cast<T_*>(dx->untyped_data()), static_cast<float*>(d_w->untyped_data()),
        static_cast<T_*>(d_wgu->untyped_data()), static_cast<T_*>(d_wd->untyped_data()));
  });
}

ffi::Error MoeBwdFp8(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                     AnyBuffer dy, AnyBuffer dy_q, AnyBuffer dy_s, AnyBuffer x, AnyBuffer x_q,
                     AnyBuffer x_s, AnyBuffer ids, AnyBuffer w, AnyBuffer wgu_f, AnyBuffer wgu_fs,
                     AnyBuffer wd_b, AnyBuffer wd_bs, AnyBuffer wgu_b, AnyBuffer wgu_bs,
                     ffi::Result<AnyBuffer> dx, ffi::Result<AnyBuffer> d_w,
                     ffi::Result<AnyBuffer> d_wgu, ffi::Result<AnyBuffer> d_wd, int32_t recipe,
                     int32_t weight_grads, int32_t pregather_x) {
  return BackwardCall(stream, scratch, device, dy, dy_q, dy_s, x, x_q, x_s, ids, w, &wgu_f, &wgu_fs,
                      wd_b, wd_bs, wgu_b, wgu_bs, nullptr, dx, d_w, d_wgu, d_wd, recipe,
                      weight_grads, pregather_x);
}

ffi::Error MoeBwdSavedFp8(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                          AnyBuffer dy, AnyBuffer dy_q, AnyBuffer dy_s, AnyBuffer x, AnyBuffer x_q,
                          AnyBuffer x_s, AnyBuffer ids, AnyBuffer w, AnyBuffer wd_b,
                          AnyBuffer wd_bs, AnyBuffer wgu_b, AnyBuffer wgu_bs, AnyBuffer h,
                          ffi::Result<AnyBuffer> dx, ffi::Result<AnyBuffer> d_w,
                          ffi::Result<AnyBuffer> d_wgu, ffi::Result<AnyBuffer> d_wd, int32_t recipe,
                          int32_t weight_grads, int32_t pregather_x) {
  return BackwardCall(stream, scratch, device, dy, dy_q, dy_s, x, x_q, x_s, ids, w, nullptr,
                      nullptr, wd_b, wd_bs, wgu_b, wgu_bs, &h, dx, d_w, d_wgu, d_wd, recipe,
                      weight_grads, pregather_x);
}

ffi::Error Quantize(cudaStream_t stream, int32_t device, AnyBuffer x, ffi::Result<AnyBuffer> values,
                    ffi::Result<AnyBuffer> scales, int32_t recipe) {
  MOK_RETURN_IF_ERROR(Fp8Prologue(recipe));
  auto d = x.dimensions();
  MOK_CHECK(d.size() == 2, "mok_quantize takes x [rows, cols], got rank ", d.size());
  MOK_CHECK(x.element_type() == DataType::BF16 || x.element_type() == DataType::F32,
            "mok_quantize takes bfloat16 or float32 x");
  const int64_t rows = d[0], cols = d[1];
  MOK_CHECK(cols % 128 == 0, "mok_quantize needs cols to be a multiple of 128, got ", cols);
  MOK_RETURN_IF_ERROR(CheckDims("values", *values, {rows, cols}, DataType::F8E4M3FN));
  MOK_RETURN_IF_ERROR(
      CheckDims("scales", *scales, {rows, cols / (recipe == 1 ? 32 : 128)}, ScaleType(recipe)));
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(GetDevice(device, &dev));
  auto* v = static_cast<uint8_t*>(values->untyped_data());
  auto* s = static_cast<uint8_t*>(scales->untyped_data());
  return DispatchDtype(x.element_type(), [&](auto tag) {
    using T_ = decltype(tag);
    return QuantizeRows<T_>(static_cast<Recipe>(recipe), stream, dev,
                            static_cast<const T_*>(x.untyped_data()), rows, cols, v, s);
  });
}

// mok_mx_qdq: deq(Q(x)) of mxfp8 in bf16, x's shape: x [R, C] along C (axis 1), or expert
// weights [E, A, B] along A (axis 1) or B (axis 2). mxfp8 through the BF16 GEMMs.
ffi::Error MxQdq(cudaStream_t stream, int32_t device, AnyBuffer x, ffi::Result<AnyBuffer> y,
                 int32_t axis) {
  MOK_RETURN_IF_ERROR(env::Status());
  auto d = x.dimensions();
  const int64_t rank = static_cast<int64_t>(d.size());
  MOK_CHECK(x.element_type() == DataType::BF16, "mok_mx_qdq takes bfloat16 x, got ",
            DtypeName(x.element_type()));
  MOK_CHECK((rank == 2 && axis == 1) || (rank == 3 && (axis == 1 || axis == 2)),
            "mok_mx_qdq takes x [R, C] with axis 1 or w [E, A, B] with axis 1 or 2, got rank ",
            rank, " axis ", axis);
  MOK_CHECK(d[axis] % 32 == 0, "mok_mx_qdq needs the quantized axis to be a multiple of 32, got ",
            d[axis]);
  MOK_CHECK(y->element_type() == DataType::BF16 && y->element_count() == x.element_count(),
            "mok_mx_qdq: the result must be x's shape in bfloat16");
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(GetDevice(device, &dev));
  const auto* src = static_cast<const bf16*>(x.untyped_data());
  auto* dst = static_cast<bf16*>(y->untyped_data());
  ProfileStart(stream);
  if (axis == rank - 1)
    return Stage("mx qdq rows", launch_mx_qdq(src, dst, x.element_count(), stream), stream);
  MOK_CHECK(d[2] % 2 == 0, "mok_mx_qdq along A needs an even B, got ", d[2]);
  return Stage("mx qdq along A", launch_mx_qdq_cols(src, dst, d[0], d[1], d[2], stream), stream);
}

// w [E, A, B] and the layout(s) asked for: along A -> [E, B, A], along B -> [E, A, B].
ffi::Error QuantizeWeightCall(cudaStream_t stream, int32_t device, const AnyBuffer& w,
                              AnyBuffer* a_values, AnyBuffer* a_scales, AnyBuffer* b_values,
                              AnyBuffer* b_scales, int32_t recipe) {
  MOK_RETURN_IF_ERROR(Fp8Prologue(recipe));
  auto d = w.dimensions();
  MOK_CHECK(d.size() == 3, "mok_quantize_weight takes w [E, A, B], got rank ", d.size());
  MOK_CHECK(w.element_type() == DataType::BF16 || w.element_type() == DataType::F32,
            "mok_quantize_weight takes bfloat16 or float32 w");
  const int64_t E = d[0], A = d[1], B = d[2];
  MOK_CHECK(A % 128 == 0 && B % 128 == 0,
            "mok_quantize_weight needs both dims of each expert to be multiples of 128, got [", E,
            ", ", A, ", ", B, "]");
  const DataType st = ScaleType(recipe);
  WeightLayouts out;
  if (a_values) {
    MOK_RETURN_IF_ERROR(CheckDims("values (along A)", *a_values, {E, B, A}, DataType::F8E4M3FN));
    MOK_RETURN_IF_ERROR(recipe == 1
                            ? CheckDims("scales (along A)", *a_scales, {E, B, A / 32}, st)
                            : CheckDims("scales (along A)", *a_scales, {E, B / 128, A / 128}, st));
    out.along_a_values = static_cast<uint8_t*>(a_values->untyped_data());
    out.along_a_scales = static_cast<uint8_t*>(a_scales->untyped_data());
  }
  if (b_values) {
    MOK_RETURN_IF_ERROR(CheckDims("values (along B)", *b_values, {E, A, B}, DataType::F8E4M3FN));
    MOK_RETURN_IF_ERROR(recipe == 1
                            ? CheckDims("scales (along B)", *b_scales, {E, A, B / 32}, st)
                            : CheckDims("scales (along B)", *b_scales, {E, A / 128, B / 128}, st));
    out.along_b_values = static_cast<uint8_t*>(b_values->untyped_data());
    out.along_b_scales = static_cast<uint8_t*>(b_scales->untyped_data());
  }
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(GetDevice(device, &dev));
  return DispatchDtype(w.element_type(), [&](auto tag) {
    using T_ = decltype(tag);
    return QuantizeWeight<T_>(static_cast<Recipe>(recipe), stream,
                              static_cast<const T_*>(w.untyped_data()), E, A, B, out);
  });
}

ffi::Error QuantizeWeightOne(cudaStream_t stream, int32_t device, AnyBuffer w,
                             ffi::Result<AnyBuffer> values, ffi::Result<AnyBuffer> scales,
                             int32_t recipe, int32_t axis) {
  MOK_CHECK(axis == 1 || axis == 2, "mok_quantize_weight: attribute axis must be 1 or 2, got ",
            axis);
  if (axis == 1)
    return QuantizeWeightCall(stream, device, w, &*values, &*scales, nullptr, nullptr, recipe);
  return QuantizeWeightCall(stream, device, w, nullptr, nullptr, &*values, &*scales, recipe);
}

ffi::Error QuantizeWeightBoth(cudaStream_t stream, int32_t device, AnyBuffer w,
                              ffi::Result<AnyBuffer> a_values, ffi::Result<AnyBuffer> a_scales,
                              ffi::Result<AnyBuffer> b_values, ffi::Result<AnyBuffer> b_scales,
                              int32_t recipe) {
  return QuantizeWeightCall(stream, device, w, &*a_values, &*a_scales, &*b_values, &*b_scales,
                            recipe);
}

}  // namespace
}  // namespace mok::cuda::fp8

namespace {
// x_q, x_s, topk_ids, topk_weights, w_gate_up_q, its scales, w_down_q, its scales.
auto Fp8ForwardOperands() { return mok::AppendBuffers<8>(mok::cuda::BindStreamScratchDevice()); }
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeFwdFp8Cuda, mok::cuda::fp8::MoeFwdFp8,
                              Fp8ForwardOperands()
                                  .Ret<xla::ffi::AnyBuffer>()  // y
                                  .Attr<int32_t>("recipe"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeFwdTrainFp8Cuda, mok::cuda::fp8::MoeFwdTrainFp8,
                              Fp8ForwardOperands()
                                  .Ret<xla::ffi::AnyBuffer>()  // y
                                  .Ret<xla::ffi::AnyBuffer>()  // h
                                  .Attr<int32_t>("recipe"));

namespace {
// dy, dy_q, dy_s, x, x_q, x_s, topk_ids, topk_weights, w_gate_up_q [E, 2F, H] + scales,
// w_down_b [E, F, H] + scales, w_gate_up_b [E, H, 2F] + scales.
auto Fp8BackwardOperands() { return mok::AppendBuffers<14>(mok::cuda::BindStreamScratchDevice()); }

// dx, d_topk_weights, d_w_gate_up, d_w_down; the recipe, the weight gradients' kind and whether
// their operands are copied into expert order.
template <typename Binding>
auto Fp8GradientRets(Binding&& b) {
  return mok::AppendGradientRets(std::move(b))
      .template Attr<int32_t>("recipe")
      .template Attr<int32_t>("weight_grads")
      .template Attr<int32_t>("pregather_x");
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeBwdFp8Cuda, mok::cuda::fp8::MoeBwdFp8,
                              Fp8GradientRets(Fp8BackwardOperands()));

// dy, dy_q, dy_s, x, x_q, x_s, topk_ids, topk_weights, w_down_b + scales, w_gate_up_b + scales,
// h.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    MokMoeBwdSavedFp8Cuda, mok::cuda::fp8::MoeBwdSavedFp8,
    Fp8GradientRets(mok::AppendBuffers<13>(mok::cuda::BindStreamScratchDevice())));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokQuantizeCuda, mok::cuda::fp8::Quantize,
                              mok::cuda::BindStreamDevice()
                                  .Arg<xla::ffi::AnyBuffer>()  // x [R, C]
                                  .Ret<xla::ffi::AnyBuffer>()  // values
                                  .Ret<xla::ffi::AnyBuffer>()  // scales
                                  .Attr<int32_t>("recipe"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokQuantizeWeightCuda, mok::cuda::fp8::QuantizeWeightOne,
                              mok::cuda::BindStreamDevice()
                                  .Arg<xla::ffi::AnyBuffer>()  // w [E, A, B]
                                  .Ret<xla::ffi::AnyBuffer>()  // values
                                  .Ret<xla::ffi::AnyBuffer>()  // scales
                                  .Attr<int32_t>("recipe")
                                  .Attr<int32_t>("axis"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokQuantizeWeightBothCuda, mok::cuda::fp8::QuantizeWeightBoth,
                              mok::cuda::BindStreamDevice()
                                  .Arg<xla::ffi::AnyBuffer>()  // w [E, A, B]
                                  .Ret<xla::ffi::AnyBuffer>()  // values along A [E, B, A]
                                  .Ret<xla::ffi::AnyBuffer>()  // scales along A
                                  .Ret<xla::ffi::AnyBuffer>()  // values along B [E, A, B]
                                  .Ret<xla::ffi::AnyBuffer>()  // scales along B
                                  .Attr<int32_t>("recipe"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMxQdqCuda, mok::cuda::fp8::MxQdq,
                              mok::cuda::BindStreamDevice()
                                  .Arg<xla::ffi::AnyBuffer>()  // x [R, C] or w [E, A, B]
                                  .Ret<xla::ffi::AnyBuffer>()  // deq(Q(x)), x's shape
                                  .Attr<int32_t>("axis"));
