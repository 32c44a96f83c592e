// What the FP8 forward and backward sequences share: the weight operand's tensor map and scale
// addressing, the routed GEMMs' parameters, and the recipe dispatch.
#pragma once

#include <type_traits>

// The XLA FFI headers first: CuTe's sm100 traits turn -Wmissing-field-initializers into an error
// for the rest of the unit (a GCC pragma), which XLA's api.h then trips over.
#include "cuda/phases/fp8.h"
// (launch.h includes the sm90 mainloop, and with it CuTe, after its own FFI headers)
#include "cuda/host/launch.h"
#include "cuda/host/tma.h"
// The FP8 device code (CuTe).
#include "cuda/device/fp8_gemm.cuh"
#include "cuda/device/fp8_quantize.cuh"

namespace mok::cuda::fp8 {

static_assert(fp8_smem_bytes<Recipe::kBlock>(kFp8MaxExperts) <= 227 * 1024 &&
                  fp8_smem_bytes<Recipe::kMx>(kFp8MaxExperts) <= 227 * 1024,
              "the FP8 GEMMs' shared memory fits the opt-in limit up to kFp8MaxExperts");

// Calls fn(std::integral_constant<Recipe, R>{}) for the call's recipe.
template <class Fn>
ffi::Error DispatchRecipe(Recipe recipe, Fn&& fn) {
  if (recipe == Recipe::kMx) return fn(std::integral_constant<Recipe, Recipe::kMx>{});
  return fn(std::integral_constant<Recipe, Recipe::kBlock>{});
}

// A 3-D E4M3 tensor map [experts][rows][k] (k contiguous), boxes of 128 k x 64 rows, swizzled
// like the GEMM's shared-memory tiles; zero fill past `rows` and `k`.
inline bool EncodeFp8(CUtensorMap* map, const void* base, int64_t k, int64_t rows,
                      int64_t experts) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(experts)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows * k)};
  const cuuint32_t box[3] = {kBK, kBoxRows, 1};
  return EncodeSwizzledStatus(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, base, 3, dims, strides, box) ==
         CUDA_SUCCESS;
}

// Operand B of a GEMM: `experts` matrices of [rows][k] E4M3 with their scales. A weight's fp8_block
// scales are per 128 x 128 block ([E][rows / 128][k / 128] float32); every other B operand has
// one scale row per B row ([E][rows][k / 32] bytes).
inline ffi::Error SetOperandB(Fp8GemmParams& p, Quantized b, int64_t rows, int64_t k,
                              int64_t experts, bool block_scales, const char* name) {
  MOK_CHECK(EncodeFp8(&p.tmap_b, b.values, k, rows, experts),
            "could not encode the TMA descriptor of ", name, " [", experts, ", ", rows, ", ", k,
            "] (float8_e4m3fn)");
  p.b_rows = static_cast<int>(rows);
  p.b_scale = b.scales;
  if (block_scales) {
    p.b_scale_ld = (k / 128) * kScaleBytesPerK128;
    p.b_scale_expert_stride = (rows / 128) * p.b_scale_ld;
  } else {
    p.b_scale_ld = k / 32;
    p.b_scale_expert_stride = rows * p.b_scale_ld;
  }
  return ffi::Error::Success();
}

// A routed GEMM over the expert-sorted positions: out columns N, reduction K, A rows of `a`
// (gathered by `gather`, or in position order), 256-wide n-tiles (gate/up: 128 F columns).
// `counter`: which of the routing's tile counters (Routing::tile_counters) hands out its tiles;
// each routed GEMM of a call takes its own, since a counter is zeroed once per call.
inline Fp8GemmParams RoutedFp8(const Routing& r, const float* topk_weights, Quantized a,
                               const int* gather, int64_t n, int64_t k, bool glu, int counter) {
  Fp8GemmParams p{};
  p.expert_offset = r.expert_offset;
  p.mtile_prefix = r.mtile_prefix;
  p.experts = r.experts;
  p.N = static_cast<int>(n);
  p.K = static_cast<int>(k);
  p.glu = glu;
  p.glu_offset = glu ? static_cast<int>(n) : 0;
  p.n_tiles = glu ? CeilDiv(n, kHalfN) : CeilDiv(n, kBN);
  p.a = a.values;
  p.lda = k;
  p.a_gather = gather;
  p.a_scale = a.scales;
  p.a_scale_ld = k / 32;
  p.epi = RoutedMParams(r, topk_weights, counter);
  p.epi.N = static_cast<int>(n);
  p.epi.n_tiles = p.n_tiles;
  return p;
}

// The weight gradients' padded position offsets [E+1] (fp8_quantize.cuh), from the routing.
inline ffi::Error BuildTokenOffsets(const Routing& r, int* k_offset, cudaStream_t stream) {
  fp8_schedule_kernel<<<1, 1024, 0, stream>>>(r.expert_offset, r.experts, k_offset);
  return Stage("padded token offsets", cudaGetLastError(), stream);
}

}  // namespace mok::cuda::fp8
