// XLA FFI handlers for platform "cpu": decode operands, validate, run the phases. They bind the
// kernel attributes of every backend (common/bindings.h) and validate them, but have one kernel:
// pregather_x and gemm do not change what the CPU runs.
#include "cpu/handlers.h"

#include <exception>

#include "common/bindings.h"
#include "common/check.h"
#include "common/env.h"
#include "common/problem.h"
#include "cpu/phases.h"

namespace mok::cpu {
namespace {

ffi::Error ToOperands(const ffi::AnyBuffer& x, const ffi::AnyBuffer& topk_ids,
                      const ffi::AnyBuffer& topk_weights, const ffi::AnyBuffer& w_gate_up,
                      const ffi::AnyBuffer& w_down, MoeOperands* op) {
  Problem p;
  MOK_RETURN_IF_ERROR(ReadProblem(x, topk_ids, topk_weights, w_gate_up, w_down, &p));
  op->x = x.untyped_data();
  op->topk_ids = static_cast<const int32_t*>(topk_ids.untyped_data());
  op->topk_weights = static_cast<const float*>(topk_weights.untyped_data());
  op->w_gate_up = w_gate_up.untyped_data();
  op->w_down = w_down.untyped_data();
  op->dtype = p.dtype == ffi::DataType::F32 ? Dtype::kF32 : Dtype::kBF16;
  op->tokens = p.tokens;
  op->hidden = p.hidden;
  op->ffn = p.ffn;
  op->experts = p.experts;
  op->top_k = p.top_k;
  return ffi::Error::Success();
}

// Anything thrown below (e.g. std::bad_alloc for a huge scratch buffer) becomes an ffi::Error
// instead of terminating the process.
template <typename Fn>
ffi::Error Guard(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return ffi::Error::Internal(StrCat("jax_mok cpu kernel failed: ", e.what()));
  }
  return ffi::Error::Success();
}

// The debugging switches and the attributes, validated like the CUDA handlers' (same errors).
ffi::Error CheckCall(int32_t pregather_x, int32_t gemm) {
  MOK_RETURN_IF_ERROR(env::Status());
  KernelOptions unused;
  return ReadKernelOptions(pregather_x, gemm, &unused);
}

ffi::Error MoeFwd(ffi::AnyBuffer x, ffi::AnyBuffer topk_ids, ffi::AnyBuffer topk_weights,
                  ffi::AnyBuffer w_gate_up, ffi::AnyBuffer w_down, ffi::Result<ffi::AnyBuffer> y,
                  int32_t pregather_x, int32_t gemm) {
  MOK_RETURN_IF_ERROR(CheckCall(pregather_x, gemm));
  MoeOperands op;
  MOK_RETURN_IF_ERROR(ToOperands(x, topk_ids, topk_weights, w_gate_up, w_down, &op));
  MOK_CHECK(y->element_type() == x.element_type() && y->dimensions().size() == 2 &&
                y->dimensions()[0] == op.tokens && y->dimensions()[1] == op.hidden,
            "y must be [T, H] with x's dtype");
  return Guard([&] { MoeForward(op, y->untyped_data()); });
}

ffi::Error MoeBwd(ffi::AnyBuffer dy, ffi::AnyBuffer x, ffi::AnyBuffer topk_ids,
                  ffi::AnyBuffer topk_weights, ffi::AnyBuffer w_gate_up, ffi::AnyBuffer w_down,
                  ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> d_topk_weights,
                  ffi::Result<ffi::AnyBuffer> d_w_gate_up, ffi::Result<ffi::AnyBuffer> d_w_down,
                  int32_t pregather_x, int32_t gemm) {
  MOK_RETURN_IF_ERROR(CheckCall(pregather_x, gemm));
  MoeOperands op;
  MOK_RETURN_IF_ERROR(ToOperands(x, topk_ids, topk_weights, w_gate_up, w_down, &op));
  MOK_CHECK(dy.element_type() == x.element_type() && dy.dimensions().size() == 2 &&
                dy.dimensions()[0] == op.tokens && dy.dimensions()[1] == op.hidden,
            "dy must be [T=", op.tokens, ", H=", op.hidden, "] with x's dtype");
  MOK_CHECK(d_topk_weights->element_type() == ffi::DataType::F32, "d_topk_weights must be float32");
  return Guard([&] {
    MoeBackward(op, dy.untyped_data(), dx->untyped_data(),
                static_cast<float*>(d_topk_weights->untyped_data()), d_w_gate_up->untyped_data(),
                d_w_down->untyped_data());
  });
}

}  // namespace
}  // namespace mok::cpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeFwdCpu, mok::cpu::MoeFwd,
                              mok::BindForward(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokMoeBwdCpu, mok::cpu::MoeBwd,
                              mok::BindBackward(xla::ffi::Ffi::Bind()));
