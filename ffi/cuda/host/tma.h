// Host side of the TMA path: the tensor maps of a routed-M GEMM's weight operand B and of its
// non-gathered activations A, and of both operands of a routed-K (weight-gradient) GEMM. A map
// that cannot be encoded is an ffi::Error naming the GEMM, the operand and its sizes: the wgmma
// kernels have no other way to load the weights. The driver entry point is fetched at run time
// (the module links no libcuda).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "common/check.h"
#include "cuda/device/gemm_params.cuh"

namespace mok::cuda {

// cuTensorMapEncodeTiled (driver API 12.0). Declared here: CUTLASS includes cudaTypedefs.h
// inside its own namespace, which hides the driver's PFN_ typedefs.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiledFn TensorMapEncoder() {
  static EncodeTiledFn encode = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &status) == cudaSuccess &&
        status == cudaDriverEntryPointSuccess)
      encode = reinterpret_cast<EncodeTiledFn>(fn);
  });
  return encode;
}

// A tensor map of `type` elements in `rank` (<= 3) dimensions (innermost first; `strides` in bytes
// for dimensions 1..rank-1), 128B-swizzled like the shared-memory tiles, zero fill out of range.
// The driver's result; CUDA_ERROR_NOT_FOUND when the driver offers no cuTensorMapEncodeTiled.
inline CUresult EncodeSwizzledStatus(CUtensorMap* map, CUtensorMapDataType type, const void* base,
                                     cuuint32_t rank, const cuuint64_t* dims,
                                     const cuuint64_t* strides, const cuuint32_t* box) {
  EncodeTiledFn encode = TensorMapEncoder();
  if (encode == nullptr) return CUDA_ERROR_NOT_FOUND;
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, type, rank, const_cast<void*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// The bf16 tensor map of the wgmma kernels' operands.
inline CUresult EncodeBf16Status(CUtensorMap* map, const void* base, cuuint32_t rank,
                                 const cuuint64_t* dims, const cuuint64_t* strides,
                                 const cuuint32_t* box) {
  return EncodeSwizzledStatus(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, rank, dims, strides,
                              box);
}

// A [rows][width] matrix with rows `ld` elements apart, in boxes of box_cols × box_rows.
inline CUresult EncodeRowsStatus(CUtensorMap* map, const void* base, int64_t width, int64_t rows,
                                 int64_t ld, cuuint32_t box_cols, cuuint32_t box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(width), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {box_cols, box_rows};
  return EncodeBf16Status(map, base, 2, dims, strides, box);
}

// What the error of a failed encode names: the GEMM (its phase) and its two operands.
struct GemmNames {
  const char* phase;  // e.g. "gate/up GEMM + SwiGLU"
  const char* a;      // operand A, e.g. "x (expert order)"
  const char* b;      // operand B, e.g. "w_gate_up"
};

inline ffi::Error EncodeError(CUresult result, const GemmNames& names, const char* operand,
                              const std::string& shape, const void* base) {
  if (result == CUDA_SUCCESS) return ffi::Error::Success();
  if (result == CUDA_ERROR_NOT_FOUND && TensorMapEncoder() == nullptr)
    return ffi::Error::Internal(StrCat("jax_mok CUDA: ", names.phase,
                                       ": the driver offers no cuTensorMapEncodeTiled (driver API "
                                       ">= 12.0), which the bfloat16 kernels need for ",
                                       operand, "; update the NVIDIA driver"));
  return ffi::Error::Internal(StrCat(
      "jax_mok CUDA: ", names.phase, ": the TMA tensor map of ", operand, " ", shape,
      " could not be encoded (CUresult ", static_cast<int>(result),
      "; base address mod 16 = ", static_cast<int>(reinterpret_cast<uintptr_t>(base) % 16), ")"));
}

// B of expert e is [K][N] (kRoutedBN: N contiguous, boxes 64 n × 64 k) or [N][K] (kRoutedBK:
// K contiguous, one box 64 k × 256 n); per expert, dimension 1 ends at the expert's K or N.
inline ffi::Error MakeWeightTensorMap(GemmParams& p, Mode mode, const GemmNames& names) {
  MOK_CHECK(mode != Mode::kRoutedK, names.phase, ": a routed-K GEMM has no weight operand");
  const bool n_major = mode == Mode::kRoutedBN;
  const cuuint64_t inner = static_cast<cuuint64_t>(p.ldb);
  const cuuint64_t outer = static_cast<cuuint64_t>(n_major ? p.K : p.N);
  const cuuint64_t dims[3] = {inner, outer, static_cast<cuuint64_t>(p.experts)};
  const cuuint64_t strides[2] = {inner * 2, static_cast<cuuint64_t>(p.b_expert_stride) * 2};
  const cuuint32_t box[3] = {64, n_major ? 64u : static_cast<cuuint32_t>(kWgmmaBN), 1};
  return EncodeError(EncodeBf16Status(&p.tmap_b, p.b, 3, dims, strides, box), names, names.b,
                     StrCat("(bfloat16 [E=", p.experts, ", ", outer, ", ", inner,
                            "], expert stride ", p.b_expert_stride, " elements)"),
                     p.b);
}

// A non-gathered A operand [a_rows][K] (K contiguous): one box of 64(k) × 128(rows).
inline ffi::Error MakeActivationTensorMap(GemmParams& p, const GemmNames& names) {
  MOK_CHECK(p.a_gather == nullptr && p.a_rows > 0, names.phase,
            ": A by TMA needs a non-gathered A with its row count, got a_rows=", p.a_rows);
  return EncodeError(EncodeRowsStatus(&p.tmap_a, p.a, p.lda, p.a_rows, p.lda, 64, kTileM), names,
                     names.a, StrCat("(bfloat16 [", p.a_rows, ", ", p.lda, "])"), p.a);
}

// Routed-K (weight gradients) with both operands in expert order, not gathered: A [a_rows][M]
// and B [a_rows][N], row = position, the columns contiguous. Boxes of 64 columns × 64 positions:
// one MN-major 64×64 block of a shared-memory tile each. Zero fill past M / N and past the last
// row; rows of the next expert inside a k-block are zeroed by the consumers.
inline ffi::Error MakeWgradTensorMaps(GemmParams& p, const GemmNames& names) {
  MOK_CHECK(!(p.a_gather != nullptr && p.b_gather != nullptr) && p.a_rows > 0, names.phase,
            ": the wgmma weight-gradient GEMM gathers at most one operand (the other one is read "
            "in expert order)");
  if (p.a_gather == nullptr)
    MOK_RETURN_IF_ERROR(
        EncodeError(EncodeRowsStatus(&p.tmap_a, p.a, p.M, p.a_rows, p.lda, 64, 64), names, names.a,
                    StrCat("(bfloat16 [", p.a_rows, ", ", p.M, "], row stride ", p.lda, ")"), p.a));
  if (p.b_gather != nullptr) return ffi::Error::Success();
  return EncodeError(EncodeRowsStatus(&p.tmap_b, p.b, p.N, p.a_rows, p.ldb, 64, 64), names, names.b,
                     StrCat("(bfloat16 [", p.a_rows, ", ", p.N, "], row stride ", p.ldb, ")"), p.b);
}

// The staged row outputs' tensor map (store_rows_staged): routed-M `out` [a_rows][N], routed-K the
// weight gradient [E][M][N], rows `ldo` elements apart; boxes of 64 columns x 64 rows.
inline ffi::Error MakeOutputTensorMap(GemmParams& p, Mode mode, const GemmNames& names) {
  const bool wgrad = mode == Mode::kRoutedK;
  const cuuint64_t rows = static_cast<cuuint64_t>(wgrad ? p.M : p.a_rows);
  const cuuint64_t ld_bytes = static_cast<cuuint64_t>(p.ldo) * 2;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(p.N), rows,
                              static_cast<cuuint64_t>(wgrad ? p.experts : 1)};
  const cuuint64_t strides[2] = {ld_bytes, rows * ld_bytes};
  const cuuint32_t box[3] = {64, 64, 1};
  return EncodeError(
      EncodeBf16Status(&p.tmap_out, p.out, 3, dims, strides, box), names, "the output",
      StrCat("(bfloat16 [", dims[2], ", ", rows, ", ", p.N, "], row stride ", p.ldo, ")"), p.out);
}

}  // namespace mok::cuda
