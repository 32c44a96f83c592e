// Python module `jax_mok._mok_cuda`: hands the CUDA handlers to jax_mok._ffi as capsules, and the
// symmetric workspace's bootstrap and layout constants to jax_mok/workspace.py.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "cuda/handlers/ep.h"
#include "cuda/handlers/fp8.h"
#include "cuda/handlers/moe.h"
#include "cuda/host/symmetric.h"

namespace nb = nanobind;

namespace {
nb::capsule Capsule(XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(_mok_cuda, m) {
  m.doc() = "jax_mok XLA FFI handlers for the CUDA platform (sm_90a kernels)";
  m.def("registrations", [] {
    nb::dict d;
    d["mok_moe_fwd"] = Capsule(MokMoeFwdCuda);
    d["mok_moe_bwd"] = Capsule(MokMoeBwdCuda);
    d["mok_moe_fwd_train"] = Capsule(MokMoeFwdTrainCuda);
    d["mok_moe_bwd_saved"] = Capsule(MokMoeBwdSavedCuda);
    // Peer transport (docs/peer-transport.md).
    d["mok_ep_dispatch"] = Capsule(MokEpDispatchCuda);
    d["mok_ep_combine"] = Capsule(MokEpCombineCuda);
    d["mok_ep_moe_fwd"] = Capsule(MokEpMoeFwdCuda);             // the fused forward
    d["mok_ep_moe_fwd_train"] = Capsule(MokEpMoeFwdTrainCuda);  // + the received rows, h
    d["mok_ep_moe_bwd"] = Capsule(MokEpMoeBwdCuda);             // the fused backward
    d["mok_ep_moe_fwd_train_recompute"] = Capsule(MokEpMoeFwdTrainRecomputeCuda);  // no h
    d["mok_ep_moe_bwd_recompute"] = Capsule(MokEpMoeBwdRecomputeCuda);             // no h
    d["mok_home_sum"] = Capsule(MokHomeSumCuda);  // the XLA transport's combine
    // The FP8 layer (MoEConfig.quantization; handlers/fp8.cu).
    d["mok_moe_fwd_fp8"] = Capsule(MokMoeFwdFp8Cuda);
    d["mok_moe_fwd_train_fp8"] = Capsule(MokMoeFwdTrainFp8Cuda);
    d["mok_moe_bwd_fp8"] = Capsule(MokMoeBwdFp8Cuda);
    d["mok_moe_bwd_saved_fp8"] = Capsule(MokMoeBwdSavedFp8Cuda);
    d["mok_quantize"] = Capsule(MokQuantizeCuda);
    d["mok_quantize_weight"] = Capsule(MokQuantizeWeightCuda);
    d["mok_quantize_weight_both"] = Capsule(MokQuantizeWeightBothCuda);
    // mxfp8 through the BF16 GEMMs (handlers/moe.cu).
    d["mok_moe_fwd_mx"] = Capsule(MokMoeFwdMxCuda);
    d["mok_moe_fwd_train_mx"] = Capsule(MokMoeFwdTrainMxCuda);
    d["mok_moe_bwd_saved_mx"] = Capsule(MokMoeBwdSavedMxCuda);
    d["mok_mx_qdq"] = Capsule(MokMxQdqCuda);  // handlers/fp8.cu
    return d;
  });
  m.def("device_info", [] {
    nb::dict d;
    d["compiled_arch"] = mok::cuda::CompiledArchitectures();
    d["wgmma_path"] = mok::cuda::HasWgmmaPath();
    return d;
  });
  m.def(
      "workspace_constants",
      [] {
        nb::dict d;
        d["signal_bytes"] = mok::cuda::symmetric::kSignalBytes;
        d["max_ranks"] = mok::cuda::symmetric::kMaxRanks;
        d["areas"] = mok::cuda::symmetric::kAreas;
        d["field_align"] = mok::cuda::symmetric::kFieldAlign;
        return d;
      },
      "The symmetric workspace's layout constants (host/symmetric.h), for jax_mok's workspace "
      "sizing to check against: signal_bytes, max_ranks, areas, field_align.");

  // Symmetric workspace bootstrap for jax_mok/workspace.py.
  namespace sym = mok::cuda::symmetric;
  m.def("can_access_peer", &sym::CanAccessPeer, nb::arg("a"), nb::arg("b"),
        "Peer access with native atomics between CUDA ordinals a and b (NVLink stand-in).");
  m.def("fabric_supported", &sym::FabricSupported, nb::arg("ordinal"));
  m.def("workspace_alloc", &sym::Alloc, nb::arg("id"), nb::arg("ordinal"), nb::arg("rank"),
        nb::arg("ep_size"), nb::arg("bytes"), nb::arg("fabric"));
  m.def(
      "workspace_export",
      [](int64_t id, int ordinal) {
        const std::string h = sym::Export(id, ordinal);
        return nb::bytes(h.data(), h.size());
      },
      nb::arg("id"), nb::arg("ordinal"));
  m.def("workspace_link_local", &sym::LinkLocal, nb::arg("id"), nb::arg("ordinal"),
        nb::arg("peer_rank"), nb::arg("peer_ordinal"));
  m.def(
      "workspace_open_peer",
      [](int64_t id, int ordinal, int peer_rank, nb::bytes handle) {
        sym::OpenPeer(id, ordinal, peer_rank, std::string(handle.c_str(), handle.size()));
      },
      nb::arg("id"), nb::arg("ordinal"), nb::arg("peer_rank"), nb::arg("handle"));
  m.def("workspace_finalize", &sym::Finalize, nb::arg("id"), nb::arg("ordinal"));
  m.def("workspace_free_all", &sym::FreeAll);
  // Reads the mapped error words without synchronizing: safe from any thread at any time
  // (the registry's lock orders it against workspace_free_all).
  m.def("peer_errors", &mok::cuda::ep::PendingErrors);
}
