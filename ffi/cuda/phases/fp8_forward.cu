// The FP8 forward: route -> gate/up GEMM (+ SwiGLU, quantized along F) -> down GEMM (x routing
// weight) -> combine over k. Quantized x and weights come from jax_mok/kernels (XLA fusions of
// jax_mok.quantization, bit for bit the same format).
#include "cuda/phases/fp8_common.cuh"

namespace mok::cuda::fp8 {

template <class T>
ffi::Error Forward8(Recipe recipe, cudaStream_t stream, ffi::ScratchAllocator& scratch,
                    const DeviceInfo& dev, const Problem& pr, Quantized x, const int* ids,
                    const float* w, Quantized w_gate_up, Quantized w_down, T* y, T* h_save) {
  const int64_t P = pr.assignments(), H = pr.hidden, F = pr.ffn, E = pr.experts;
  Routing r;
  uint8_t *act, *act_scales;
  T* y_part;
  MOK_RETURN_IF_ERROR(CarveScratch(scratch, [&](Carve& c) {
    r = CarveRouting(c, pr, ids);
    act = c.take<uint8_t>(P * F);              // a = SwiGLU(h), E4M3 [P, F]
    act_scales = c.take<uint8_t>(P * F / 32);  // its scales
    y_part = c.take<T>(P * H);                 // w * (a @ Wd[e]) per assignment
  }));

  ProfileStart(stream);
  MOK_RETURN_IF_ERROR(Stage("routing", build_routing(r, stream), stream));
  return DispatchRecipe(recipe, [&](auto tag) -> ffi::Error {
    constexpr Recipe R = decltype(tag)::value;
    constexpr bool kPerRow = R == Recipe::kMx;  // fp8_block weights: 128 x 128 blocks

    Fp8GemmParams g1 = RoutedFp8(r, w, x, r.sorted_token, F, H, true, 0);
    MOK_RETURN_IF_ERROR(SetOperandB(g1, w_gate_up, 2 * F, H, E, !kPerRow, "w_gate_up"));
    g1.q_out = act, g1.q_scale = act_scales;
    g1.epi.out2 = h_save;
    MOK_RETURN_IF_ERROR(Stage(
        "fp8 gate/up GEMM + SwiGLU",
        launch_fp8_gemm<R, TileShape::kRoutedM, kPerRow, Epi8::kGluQuant, T>(g1, dev.sms, stream),
        stream));

    Fp8GemmParams g2 = RoutedFp8(r, w, Quantized{act, act_scales}, nullptr, H, F, false, 1);
    MOK_RETURN_IF_ERROR(SetOperandB(g2, w_down, H, F, E, !kPerRow, "w_down"));
    g2.epi.out = y_part, g2.epi.ldo = H;
    g2.staged_out = std::is_same_v<T, bf16>;
    MOK_RETURN_IF_ERROR(Stage(
        "fp8 down GEMM x weight",
        launch_fp8_gemm<R, TileShape::kRoutedM, kPerRow, Epi8::kWeighted, T>(g2, dev.sms, stream),
        stream));

    return Stage(
        "combine y",
        launch_combine<T>(y_part, r.assign_pos, y, static_cast<int>(pr.tokens),
                          static_cast<int>(pr.top_k), static_cast<int>(H), dev.sms, stream),
        stream);
  });
}

template <class T>
ffi::Error QuantizeRows(Recipe recipe, cudaStream_t stream, const DeviceInfo& dev, const T* src,
                        int64_t rows, int64_t cols, uint8_t* values, uint8_t* scales) {
  ProfileStart(stream);
  return DispatchRecipe(recipe, [&](auto tag) -> ffi::Error {
    constexpr Recipe R = decltype(tag)::value;
    return Stage(
        "quantize rows",
        launch_quantize_rows<T, R>(src, static_cast<int>(rows), nullptr, static_cast<int>(cols),
                                   values, scales, dev.sms, stream),
        stream);
  });
}

template <class T>
ffi::Error QuantizeWeight(Recipe recipe, cudaStream_t stream, const T* w, int64_t experts,
                          int64_t a_dim, int64_t b_dim, const WeightLayouts& out) {
  ProfileStart(stream);
  return DispatchRecipe(recipe, [&](auto tag) -> ffi::Error {
    constexpr Recipe R = decltype(tag)::value;
    return Stage("quantize expert weights",
                 launch_quantize_weight<T, R>(
                     w, experts, a_dim, b_dim, QuantizedOut{out.along_a_values, out.along_a_scales},
                     QuantizedOut{out.along_b_values, out.along_b_scales}, stream),
                 stream);
  });
}

#define MOK_FP8_FORWARD(T)                                                                         \
  template ffi::Error Forward8<T>(Recipe, cudaStream_t, ffi::ScratchAllocator&, const DeviceInfo&, \
                                  const Problem&, Quantized, const int*, const float*, Quantized,  \
                                  Quantized, T*, T*);                                              \
  template ffi::Error QuantizeRows<T>(Recipe, cudaStream_t, const DeviceInfo&, const T*, int64_t,  \
                                      int64_t, uint8_t*, uint8_t*);                                \
  template ffi::Error QuantizeWeight<T>(Recipe, cudaStream_t, const T*, int64_t, int64_t, int64_t, \
                                        const WeightLayouts&);
MOK_FP8_FORWARD(bf16)
MOK_FP8_FORWARD(float)
#undef MOK_FP8_FORWARD

}  // namespace mok::cuda::fp8
