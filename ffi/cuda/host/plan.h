// Which kernels one call runs, decided once per call from its attributes (KernelOptions), its
// problem and the device's limits; the phases (phases/forward.cu, backward.cu) only follow it.
#pragma once

#include "common/bindings.h"
#include "common/problem.h"
#include "cuda/device/pipeline.cuh"
#include "cuda/host/device.h"

namespace mok::cuda {

struct Plan {
  // The wgmma tensor-core kernels (bfloat16, a build with the CUTLASS headers, gemm = auto); else
  // the SIMT kernels. The wgmma kernels load the weights by TMA and A by TMA wherever A is not
  // gathered.
  bool wgmma = false;
  // wgmma only (KernelOptions::pregather_x): a forward copies x once into expert order (the
  // gate/up GEMM's A then by TMA); a backward copies x and dy (the weight-gradient GEMMs' operands
  // and dy·Wd^T's A then by TMA). Off, those GEMMs gather the token-order rows themselves.
  bool pregather_x = false;
  // wgmma only: the plain row outputs (the down GEMM's weighted rows, dh·Wguᵀ, the weight
  // gradients) go out through a shared-memory staging area in 16-byte stores, where that area fits
  // the device's opt-in shared memory next to the ring and the E-sized tables.
  bool staged_stores = false;
  int sms = 0;  // the device's SMs: grid sizes
};

// Whether this build has the wgmma kernels (it was compiled with the CUTLASS headers).
#ifdef JAX_MOK_HAVE_CUTLASS
constexpr bool kHasWgmma = true;
#else
constexpr bool kHasWgmma = false;
#endif

inline Plan ChoosePlan(const Problem& pr, const KernelOptions& options, const DeviceInfo& dev) {
  Plan plan;
  plan.sms = dev.sms;
  plan.wgmma = kHasWgmma && pr.dtype == ffi::DataType::BF16 && options.gemm == kGemmAuto;
  plan.pregather_x = plan.wgmma && options.pregather_x == 1;
  plan.staged_stores =
      plan.wgmma && WgmmaStorage::dynamic_bytes(static_cast<int>(pr.experts), kOutStageBytes) <=
                        static_cast<size_t>(dev.smem_optin);
  return plan;
}

}  // namespace mok::cuda
