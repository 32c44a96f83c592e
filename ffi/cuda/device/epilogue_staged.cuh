// Epilogues of the wgmma GEMMs through shared memory, for x in bf16:
//   glu_staged, swiglu_bwd_staged (BF16 and FP8 gate/up and dy·Wd^T), glu_quant_epilogue (the FP8
//   gate/up's E4M3 a and h): in the tile's held ring stage;
//   store_rows_staged (the plain row outputs): in the 8 KB staging buffers, by TMA (BF16) or by
//   thread copies (FP8).
//
// After a routed-M tile's mainloop the consumers keep the ring stage they read last instead of
// handing it back at once (the producer meanwhile fills the other stages with the next tile), and
// each consumer warpgroup uses 24 KB of it as three 64-row x 128-byte buffers (EpiBuffers). Per
// pass of 64 columns, the accumulator fragments go into the buffers (and h comes in through them),
// and rows leave (and arrive) as whole 16-byte chunks, 8 consecutive threads per 128-byte row.
// Pair stores and loads straight from the fragments (run_epilogue) touch 8 rows with 16 bytes
// each per warp instruction; with three outputs and two inputs per pair the backward's SwiGLU
// epilogue then took longer than its tile's mainloop, with the tensor pipe idle. The element math
// and the rounding are run_epilogue's (silu_mul, swiglu_bwd), so the outputs are bitwise equal.
#pragma once

#include "cuda/device/epilogue.cuh"
#include "cuda/device/fp8_format.cuh"

namespace mok::cuda {

// One consumer warpgroup's three buffers inside the held stage: shared-memory addresses of
// 1024-byte aligned areas of 8 KB (32-bit shared addresses: an element's address is one XOR and
// one add from a per-thread base, where generic pointers need 64-bit arithmetic per access).
struct EpiBuffers {
  uint32_t buf[3];
};

// The buffers' layout: (row, byte) of a 64 x 128-byte buffer at row * 128 + byte, its 16-byte
// chunks XOR-swizzled by row & 7 (the TMA 128B swizzle), so the 8 rows of one fragment access
// (lane / 4) land in 8 different bank groups and a row's chunk read out for a coalesced store
// stays whole. A thread's accumulator values lie in rows frag_row(0, t) and frag_row(2, t), both
// with row & 7 = (t / 4) & 7, and its byte inside a chunk does not depend on the value's index:
// chunk c of its row h is row_base[h] + ((c << 4) ^ swizzle).
struct FragOffsets {
  uint32_t row_base[2];
  uint32_t swizzle;
  // elem_bytes: 2 (bf16 pairs: bytes 4 (t & 3) of a chunk) or 1 (E4M3 pairs: 2 (t & 3), plus 8
  // for the second group of 8 columns inside the 16-column chunk, added by the caller).
  __device__ __forceinline__ FragOffsets(int t, int elem_bytes) {
#pragma unroll
    for (int h = 0; h < 2; ++h) row_base[h] = frag_row(2 * h, t) * 128 + elem_bytes * 2 * (t & 3);
    swizzle = ((t >> 2) & 7) << 4;
  }
  __device__ __forceinline__ uint32_t at(int row_half, int chunk) const {
    return row_base[row_half] + ((static_cast<uint32_t>(chunk) << 4) ^ swizzle);
  }
};

// Named barrier 3 + wg: the 128 threads of consumer warpgroup wg (0 or 1).
__device__ __forceinline__ void warpgroup_sync(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(3 + wg) : "memory");
}

// f(row, chunk, offset) over the 512 16-byte chunks of a buffer: thread t takes chunk t & 7 of
// rows t / 8 + 16 j (8 consecutive threads per 128-byte row: full lines in global memory), whose
// swizzled offsets differ by 16 rows. Not unrolled: unrolled, the copies' loads were hoisted
// ahead of their stores and spilled the FP8 kernels' registers.
// Thread t's first chunk (row t / 8, chunk t % 8) in a buffer; its others are 2048 bytes apart.
__device__ __forceinline__ uint32_t chunk_offset(int t) {
  const int row0 = t >> 3, chunk = t & 7;
  return row0 * 128 + (((chunk ^ row0) & 7) << 4);
}

template <class F>
__device__ __forceinline__ void for_each_chunk(int t, F&& f) {
  const int row0 = t >> 3, chunk = t & 7;
  const uint32_t off0 = chunk_offset(t);
#pragma unroll 1
  for (int j = 0; j < 4; ++j) f(row0 + 16 * j, chunk, off0 + 2048 * j);
}

__device__ __forceinline__ void st_shared_pair(uint32_t addr, float v0, float v1) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(v0, v1);
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(*reinterpret_cast<const uint32_t*>(&v))
               : "memory");
}
__device__ __forceinline__ float2 ld_shared_pair(uint32_t addr) {
  uint32_t raw;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(raw) : "r"(addr) : "memory");
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw));
}
__device__ __forceinline__ void st_shared_u16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(v) : "memory");
}
// 16 bytes of shared memory to global memory.
__device__ __forceinline__ void copy16(void* dst, uint32_t src) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(src)
               : "memory");
  *reinterpret_cast<uint4*>(dst) = v;
}

// kSwiGLUBwd only: the h rows the tile's epilogue will read, pulled into L2 while its mainloop
// runs. Thread t of the warpgroup takes row t / 2, the gate (even t) or up (odd t) columns.
template <int BN>
__device__ __forceinline__ void prefetch_h_to_l2(const GemmParams& p, const WorkTile& w, int wg,
                                                 int t) {
  const int row = 64 * wg + (t >> 1), f0 = w.n_tile * BN, F = p.N;
  if (row >= w.rows || f0 >= F) return;
  const int bytes = 2 * min(BN, F - f0);  // F is a multiple of 8: 16-byte multiples, aligned
  const bf16* src =
      static_cast<const bf16*>(p.h) + static_cast<int64_t>(w.row0 + row) * 2 * F + (t & 1) * F + f0;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// kSwiGLU / kSwiGLUSave / kStoreGLU of a gate/up tile (BN/2 gate columns, then their up columns):
// a -> buffer 0, h's gate -> 1, up -> 2, one pass per 64 F columns. kSwiGLUMx / kSwiGLUSaveMx
// store a as deq(Q(a)) (mxfp8 along F): a row's 32 columns of a block lie in one quad (4 lanes,
// 8 values each), and a pass's 32 values of a thread are 2 blocks x 2 rows (value i of the tile:
// block i >> 4, row (i >> 1) & 1), so each block's amax is 8 values and two quad shuffles away.
template <Epi kEpi, int BN, class Acc>
__device__ __forceinline__ void glu_staged(const GemmParams& p, const WorkTile& w, Acc&& acc,
                                           int wg, int t, const EpiBuffers& eb) {
  static_assert(kEpi == Epi::kSwiGLU || kEpi == Epi::kSwiGLUSave || kEpi == Epi::kStoreGLU ||
                IsMxGlu(kEpi));
  constexpr bool kAct = kEpi != Epi::kStoreGLU, kMx = IsMxGlu(kEpi);
  constexpr bool kH =
      kEpi == Epi::kSwiGLUSave || kEpi == Epi::kSwiGLUSaveMx || kEpi == Epi::kStoreGLU;
  static_assert(!kMx || BN == 256, "mx blocks: 128 F columns a tile, 64 a pass");
  constexpr int kUp = BN / 4;  // gate value i pairs with up value i + kUp
  const int F = p.N, row_base = 64 * wg;
  bf16* act = static_cast<bf16*>(p.out);
  bf16* h = static_cast<bf16*>(kEpi == Epi::kStoreGLU ? p.out : p.out2);  // [P, 2F]
  const FragOffsets fo(t, 2);
#pragma unroll
  for (int pass = 0; pass < BN / 128; ++pass) {
    const int f0 = w.n_tile * (BN / 2) + 64 * pass;
    if constexpr (kMx) {
      float a[32];  // value l is the tile's value 32 pass + l
#pragma unroll
      for (int l = 0; l < 32; ++l) a[l] = silu_mul(acc(32 * pass + l), acc(32 * pass + l + kUp));
      float m[2][2] = {{0.f, 0.f}, {0.f, 0.f}};  // [row][block of the pass]
#pragma unroll
      for (int l = 0; l < 32; ++l)
        m[(l >> 1) & 1][l >> 4] = fp8::amax_combine(m[(l >> 1) & 1][l >> 4], a[l]);
      fp8::BlockScale bs[2][2];
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int b = 0; b < 2; ++b)
          bs[r][b] = fp8::block_scale<fp8::Recipe::kMx>(fp8::quad_amax(m[r][b]));
#pragma unroll
      for (int l = 0; l < 32; l += 2) {
        const float2 q = fp8::mx_qdq_pair(make_float2(a[l], a[l + 1]), bs[(l >> 1) & 1][l >> 4]);
        st_shared_pair(eb.buf[0] + fo.at((l >> 1) & 1, ((32 * pass + l) >> 2) & 7), q.x, q.y);
      }
    }
#pragma unroll
    for (int i = 32 * pass; i < 32 * pass + 32; i += 2) {
      const uint32_t off = fo.at((i >> 1) & 1, (i >> 2) & 7);
      const float g0 = acc(i), g1 = acc(i + 1), u0 = acc(i + kUp), u1 = acc(i + kUp + 1);
      if constexpr (kAct && !kMx)
        st_shared_pair(eb.buf[0] + off, silu_mul(g0, u0), silu_mul(g1, u1));
      if constexpr (kH) {
        st_shared_pair(eb.buf[1] + off, g0, g1);
        st_shared_pair(eb.buf[2] + off, u0, u1);
      }
    }
    warpgroup_sync(wg);
    for_each_chunk(t, [&](int r, int chunk, uint32_t off) {
      const int row = row_base + r, f = f0 + 8 * chunk;
      if (row >= w.rows || f >= F) return;  // F % 8 == 0: a chunk is wholly in or out
      const int64_t pos = w.row0 + row;
      if constexpr (kAct) copy16(act + pos * p.ldo + f, eb.buf[0] + off);
      if constexpr (kH) {
        copy16(h + pos * 2 * F + f, eb.buf[1] + off);
        copy16(h + pos * 2 * F + F + f, eb.buf[2] + off);
      }
    });
    warpgroup_sync(wg);  // the buffers are free for the next pass
  }
}

// The 16-byte chunks of h's gate (v[0]) and up (v[1]) columns f0.. f0 + 63 that thread t copies
// (for_each_chunk's rows and chunk), from global memory into registers; zeros past w.rows or F
// (as cp_async_16's zero fill). h is read once, here: evict-first.
__device__ __forceinline__ void load_h_pass(const GemmParams& p, const WorkTile& w, int row_base,
                                            int f0, int t, uint4 (&v)[2][4]) {
  const int F = p.N, row0 = t >> 3, f = f0 + 8 * (t & 7);
  const bf16* h = static_cast<const bf16*>(p.h);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int row = row_base + row0 + 16 * j;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    v[0][j] = v[1][j] = zero;
    if (row < w.rows && f < F) {
      const bf16* src = h + static_cast<int64_t>(w.row0 + row) * 2 * F + f;
      v[0][j] = __ldcs(reinterpret_cast<const uint4*>(src));
      v[1][j] = __ldcs(reinterpret_cast<const uint4*>(src + F));
    }
  }
}

__device__ __forceinline__ void st_shared16(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// kSwiGLUBwd (acc = g = dy @ Wd^T over BN columns of F): per pass h's gate and up arrive in
// buffers 0 and 1, dh_gate and dh_up overwrite them in place (each thread reads and writes only
// its own fragment's elements), w*a goes to buffer 2; then all three leave as rows. Pass 0's h
// comes by cp.async; each later pass's h is loaded into registers as soon as the previous pass's h
// is visible, stays in flight through that pass's math and stores, and is written into the freed
// buffers after its copy-out — so no pass waits a whole L2/HBM round trip with nothing else in
// flight (each pass waiting for its own h left four such waits a tile exposed).
template <int BN, class Acc>
__device__ __forceinline__ void swiglu_bwd_staged(const GemmParams& p, const WorkTile& w, Acc&& acc,
                                                  int wg, int t, const EpiBuffers& eb) {
  const int F = p.N, row_base = 64 * wg;
  const bf16* h = static_cast<const bf16*>(p.h);
  bf16* dh = static_cast<bf16*>(p.out);
  bf16* aw_out = static_cast<bf16*>(p.out2);
  const FragRows rows(p, w, wg, t, true);
  float dw_rows[2] = {0.f, 0.f};
  const FragOffsets fo(t, 2);
  for_each_chunk(t, [&](int r, int chunk, uint32_t off) {  // pass 0's h
    const int row = row_base + r, f = w.n_tile * BN + 8 * chunk;
    const bool ok = row < w.rows && f < F;  // else zero-filled (and never stored)
    const bf16* src = ok ? h + static_cast<int64_t>(w.row0 + row) * 2 * F + f : h;
    cp_async_16(eb.buf[0] + off, src, ok);
    cp_async_16(eb.buf[1] + off, ok ? src + F : h, ok);
  });
  cp_async_commit();
  uint4 next[2][4];  // the next pass's h, in flight while this pass runs
#pragma unroll
  for (int pass = 0; pass < BN / 64; ++pass) {
    const int f0 = w.n_tile * BN + 64 * pass;
    if (pass == 0) cp_async_wait<0>();
    warpgroup_sync(wg);  // h of this pass is in buffers 0 and 1
    if (pass + 1 < BN / 64) load_h_pass(p, w, row_base, f0 + 64, t, next);
#pragma unroll
    for (int i = 32 * pass; i < 32 * pass + 32; i += 2) {
      const int rh = (i >> 1) & 1, c = frag_col(i, t) - 64 * pass;
      if (!rows.ok[rh] || f0 + c >= F) continue;
      const uint32_t off = fo.at(rh, (i >> 2) & 7);
      const float2 hg = ld_shared_pair(eb.buf[0] + off), hu = ld_shared_pair(eb.buf[1] + off);
      const SwiGLUGrad d0 = swiglu_bwd(acc(i), hg.x, hu.x, rows.weight[rh]);
      const SwiGLUGrad d1 = swiglu_bwd(acc(i + 1), hg.y, hu.y, rows.weight[rh]);
      dw_rows[rh] += acc(i) * d0.a;
      dw_rows[rh] += acc(i + 1) * d1.a;
      st_shared_pair(eb.buf[0] + off, d0.dgate, d1.dgate);
      st_shared_pair(eb.buf[1] + off, d0.dup, d1.dup);
      st_shared_pair(eb.buf[2] + off, d0.aw, d1.aw);
    }
    warpgroup_sync(wg);
    for_each_chunk(t, [&](int r, int chunk, uint32_t off) {
      const int row = row_base + r, f = f0 + 8 * chunk;
      if (row >= w.rows || f >= F) return;
      const int64_t at = w.row0 + row;
      copy16(dh + at * 2 * F + f, eb.buf[0] + off);
      copy16(dh + at * 2 * F + F + f, eb.buf[1] + off);
      copy16(aw_out + at * F + f, eb.buf[2] + off);
    });
    warpgroup_sync(wg);
    if (pass + 1 < BN / 64) {  // the chunks for_each_chunk gives this thread, rows t / 8 + 16 j
      const uint32_t off0 = chunk_offset(t);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        st_shared16(eb.buf[0] + off0 + 2048 * j, next[0][j]);
        st_shared16(eb.buf[1] + off0 + 2048 * j, next[1][j]);
      }
    }
  }
  store_dw_partials(p, w, rows, dw_rows, t);
}

// The plain row outputs (kWeighted, kStoreRows, kStoreCast) through a warpgroup's 8 KB staging
// buffer `buf`: per 64-column pass the fragments go into the buffer, then leave
//   kBoxes (the BF16 kernel: `buf` 1024-byte aligned, p.tmap_out encoded): as one TMA box that
//     clips rows and columns past the tensor; one thread issues it and the warpgroup goes on, the
//     store draining while the next pass is written and the next tile's mainloop runs. A routed-M
//     warpgroup whose 64 rows run past the expert's count (the next expert's positions follow,
//     which a box would overwrite) copies by threads instead;
//   else (the FP8 kernels): as 16-byte chunks copied by every thread, 8 per 128-byte row.
// kWhole (the weight gradients, pipeline.cuh: kWholeTileStaging): `buf` holds all BN / 64 passes,
// 8 KB each, so the passes go into the buffer back to back and leave as BN / 64 boxes issued
// together; the only wait is for the previous tile's boxes to have left the buffer, which they
// did during this tile's mainloop.
// Same rounding as run_epilogue (bitwise equal outputs).
template <Epi kEpi, int BN, bool kBoxes, bool kWhole = false, class Acc>
__device__ __forceinline__ void store_rows_staged(const GemmParams& p, const WorkTile& w, Acc&& acc,
                                                  int wg, int t, uint32_t buf) {
  static_assert(kEpi == Epi::kStoreCast || kEpi == Epi::kWeighted || kEpi == Epi::kStoreRows,
                "plain row stores only");
  if constexpr (kWhole) {
    static_assert(kBoxes && kEpi == Epi::kStoreCast, "whole-tile staging: weight-gradient boxes");
    const FragOffsets fo(t, 2);
    if (t == 0) bulk_wait<0, true>();  // the previous tile's boxes have left the buffer
    warpgroup_sync(wg);
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2)
      st_shared_pair(buf + (i / 32) * 8192 + fo.at((i >> 1) & 1, (i >> 2) & 7), acc(i), acc(i + 1));
    fence_proxy_async();  // the buffer's generic writes, before the async proxy reads them
    warpgroup_sync(wg);
    if (t == 0) {
#pragma unroll
      for (int pass = 0; pass < BN / 64; ++pass)
        tma_store_3d(&p.tmap_out, buf + pass * 8192, w.n_tile * BN + 64 * pass, w.row0 + 64 * wg,
                     w.expert);
      bulk_commit();
    }
    return;
  }
  const int row_base = 64 * wg;
  const FragRows rows(p, w, wg, t, kEpi == Epi::kWeighted);  // weight 1 unweighted
  const bool boxed = kBoxes && (kEpi == Epi::kStoreCast || w.rows >= row_base + 64);
  // kStoreCast: dW_e [M, N] per expert; routed-M: rows are positions of the [P, N] output
  bf16* out = static_cast<bf16*>(p.out) +
              (kEpi == Epi::kStoreCast ? static_cast<int64_t>(w.expert) * p.M * p.ldo : 0);
  const FragOffsets fo(t, 2);
#pragma unroll
  for (int pass = 0; pass < BN / 64; ++pass) {
    if (kBoxes && t == 0) bulk_wait<0, true>();  // the previous box has left the buffer
    warpgroup_sync(wg);  // every thread is done reading the buffer (thread copies, previous pass)
#pragma unroll
    for (int i = 32 * pass; i < 32 * pass + 32; i += 2) {
      const float s = rows.weight[(i >> 1) & 1];
      float v0 = acc(i), v1 = acc(i + 1);
      if constexpr (kEpi == Epi::kWeighted) v0 = s * v0, v1 = s * v1;
      st_shared_pair(buf + fo.at((i >> 1) & 1, (i >> 2) & 7), v0, v1);
    }
    const int n0 = w.n_tile * BN + 64 * pass;
    if (boxed) {
      fence_proxy_async();  // the buffer's generic writes, before the async proxy reads them
      warpgroup_sync(wg);
      if (t == 0) {
        tma_store_3d(&p.tmap_out, buf, n0, w.row0 + row_base,
                     kEpi == Epi::kStoreCast ? w.expert : 0);
        bulk_commit();
      }
    } else {
      warpgroup_sync(wg);
      for_each_chunk(t, [&](int r, int chunk, uint32_t off) {
        const int row = row_base + r, n = n0 + 8 * chunk;
        if (row < w.rows && n < p.N) copy16(out + (w.row0 + row) * p.ldo + n, buf + off);
      });
    }
  }
}

// The held stage's 48 KB as six 8 KB areas: A's 16 KB at `a`, B's first and second 16 KB at
// `b_lo`, `b_hi` (one B tile in the BF16 kernel, its two halves in the FP8 kernel); consumer
// warpgroup wg (0 or 1) takes three.
__device__ __forceinline__ EpiBuffers held_buffers(uint32_t a, uint32_t b_lo, uint32_t b_hi,
                                                   int wg) {
  return wg == 0 ? EpiBuffers{{a, a + 8192, b_lo}} : EpiBuffers{{b_lo + 8192, b_hi, b_hi + 8192}};
}

// Hands the held stage back: each thread orders its generic-proxy writes of the buffers before
// the async-proxy (TMA) writes that refill the stage, then one arrival per warpgroup.
__device__ __forceinline__ void release_held_stage(uint64_t* empty, int wg, int t) {
  fence_proxy_async();
  warpgroup_sync(wg);
  if (t == 0) mbar_arrive(empty);
}

}  // namespace mok::cuda

namespace mok::cuda::fp8 {

// The FP8 gate/up GEMM's kGluQuant: a = silu(gate) * up of a warpgroup's 64 rows x 128 F columns
// (gate value i pairs with up value i + 64), quantized along F: a row's 128 values lie in one quad
// (4 lanes), mxfp8's blocks of 32 columns are values i >> 4 of it. h (training) is saved in T as
// the BF16 path saves it. With buffers (T = bf16), the E4M3 bytes gather in buffer 0 (64 rows x
// 128 bytes) and h passes through buffers 1, 2 in two passes of 64 columns, all leaving as
// 16-byte row chunks; without (T = float), pair stores. Params: Fp8GemmParams (fp8_gemm.cuh).
template <Recipe R, class T, bool kStaged, class Params>
__device__ __forceinline__ void glu_quant_epilogue(const Params& p, const WorkTile& w,
                                                   const float* acc, int wg, int t,
                                                   const EpiBuffers& eb) {
  static_assert(!kStaged || std::is_same_v<T, bf16>, "staged: 16-byte chunks of bf16");
  constexpr int kCols = 128;  // F columns of the tile
  const int F = p.N, row_base = 64 * wg, f_base = w.n_tile * kCols;
  // h first, a after it: a[64] and all 128 accumulators are never live together (registers).
  T* h = static_cast<T*>(p.epi.out2);  // [P, 2F] gate | up, saved for the backward
  if constexpr (kStaged) {
    if (h) {
      const FragOffsets fo(t, 2);
#pragma unroll
      for (int pass = 0; pass < 2; ++pass) {
#pragma unroll
        for (int i = 32 * pass; i < 32 * pass + 32; i += 2) {
          const uint32_t off = fo.at((i >> 1) & 1, (i >> 2) & 7);
          st_shared_pair(eb.buf[1] + off, acc[i], acc[i + 1]);
          st_shared_pair(eb.buf[2] + off, acc[i + 64], acc[i + 65]);
        }
        warpgroup_sync(wg);
        for_each_chunk(t, [&](int r, int chunk, uint32_t off) {
          const int row = row_base + r, f = f_base + 64 * pass + 8 * chunk;
          if (row >= w.rows || f >= F) return;
          T* h_row = h + static_cast<int64_t>(w.row0 + row) * 2 * F;
          copy16(h_row + f, eb.buf[1] + off);
          copy16(h_row + F + f, eb.buf[2] + off);
        });
        warpgroup_sync(wg);
      }
    }
  } else if (h) {
#pragma unroll
    for (int i = 0; i < 64; i += 2) {
      const int r = row_base + frag_row(i, t);
      if (r >= w.rows) continue;
      T* row = h + static_cast<int64_t>(w.row0 + r) * 2 * F + f_base + frag_col(i, t);
      store2(row, acc[i], acc[i + 1]);
      store2(row + F, acc[i + 64], acc[i + 65]);
    }
  }
  float a[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) a[i] = silu_mul(acc[i], acc[i + 64]);
  constexpr int kBlocks = R == Recipe::kMx ? 4 : 1;  // scale blocks in 128 columns
  float m[2][kBlocks];
#pragma unroll
  for (int rh = 0; rh < 2; ++rh)
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) m[rh][b] = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int b = kBlocks == 4 ? (i >> 4) : 0;  // column 8 (i >> 2) + ...: block of 32 = i >> 4
    m[(i >> 1) & 1][b] = amax_combine(m[(i >> 1) & 1][b], a[i]);
  }
  BlockScale bs[2][kBlocks];
#pragma unroll
  for (int rh = 0; rh < 2; ++rh)
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) bs[rh][b] = block_scale<R>(quad_amax(m[rh][b]));
  quantize_pairs<R, 32>(
      [&](int j) { return make_float2(a[2 * j], a[2 * j + 1]); },
      [&](int j) -> const BlockScale& { return bs[j & 1][kBlocks == 4 ? (j >> 3) : 0]; },
      [&](int j, uint16_t q) {
        const int i = 2 * j;  // the pair's first value
        if constexpr (kStaged) {
          // byte column frag_col(i, t) = 16 (i / 8) + 8 ((i / 4) & 1) + 2 (t & 3)
          st_shared_u16(
              eb.buf[0] + FragOffsets(t, 1).at((i >> 1) & 1, (i >> 3) & 7) + 8 * ((i >> 2) & 1), q);
        } else if (row_base + frag_row(i, t) < w.rows) {
          *reinterpret_cast<uint16_t*>(
              p.q_out + static_cast<int64_t>(w.row0 + row_base + frag_row(i, t)) * F + f_base +
              frag_col(i, t)) = q;
        }
      });
  if constexpr (kStaged) {
    warpgroup_sync(wg);
    for_each_chunk(t, [&](int r, int chunk, uint32_t off) {  // 16 E4M3 columns a chunk
      const int row = row_base + r, f = f_base + 16 * chunk;
      if (row >= w.rows || f >= F) return;  // the FP8 kernels need F % 128 == 0
      copy16(p.q_out + static_cast<int64_t>(w.row0 + row) * F + f, eb.buf[0] + off);
    });
  }
  if ((t & 3) == 0) {
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const int r = row_base + frag_row(2 * rh, t);
      if (r >= w.rows) continue;
      uint8_t* row_scales = p.q_scale + static_cast<int64_t>(w.row0 + r) * (F / 32);
      if constexpr (R == Recipe::kMx) {
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) row_scales[f_base / 32 + b] = bs[rh][b].stored;
      } else {
        reinterpret_cast<uint32_t*>(row_scales)[w.n_tile] = bs[rh][0].stored;
      }
    }
  }
}

}  // namespace mok::cuda::fp8
