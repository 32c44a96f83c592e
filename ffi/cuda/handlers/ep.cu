// The staged peer-transport handlers and the home-row reduction (docs/peer-transport.md):
//   mok_ep_dispatch: x [EP,R,H], ids [EP,R,k] i32, w [EP,R,k] f32 -> the same shapes; chunk d
//                    goes to rank d, result chunk s came from rank s (an all_to_all).
//   mok_ep_combine : rows [EP,R,H] (chunk s = rows computed for rank s), home_row [T,EP] i32
//                    -> y [T,H] f32, y[t] = sum_{d asc, home_row[t,d] >= 0} rows_from_d[home_row]
//   mok_home_sum   : the combine's reduction over one device's [EP,R,H] buffer (no peer).
// The two exchanges take the peer attributes (common/bindings.h: AppendPeerAttrs) and `phase`
// (int32, names the exchange in errors); mok_home_sum takes none. The fused calls: ep_fused.cu.
#include <cstdint>

#include "common/bindings.h"
#include "common/env.h"
#include "common/problem.h"
#include "cuda/handlers/bind.h"
#include "cuda/handlers/ep.h"
#include "cuda/host/peer_call.h"
#include "cuda/host/stage.h"

namespace mok::cuda::ep {
namespace {

ffi::Error CheckChunked(const char* name, const ffi::AnyBuffer& a, int ep, int64_t* chunk) {
  auto d = a.dimensions();
  MOK_CHECK(d.size() >= 2 && d[0] == ep, name, " must be [EP=", ep, ", R, ...], got rank ",
            d.size(), " with leading dim ", d.size() ? d[0] : -1);
  *chunk = static_cast<int64_t>(a.size_bytes()) / ep;
  MOK_CHECK(*chunk % 4 == 0, name, ": a chunk of ", *chunk, " bytes is not a multiple of 4 bytes");
  return ffi::Error::Success();
}

// The staged calls: area 0 in even epochs, area 1 in odd ones; a source's slot is one region.
void StagedAreas(const symmetric::View& v, Exchange* p) {
  p->area[0] = AreaOffset(v, 0);
  p->area[1] = AreaOffset(v, 1);
}

ffi::Error Dispatch(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer ids,
                    ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> rx,
                    ffi::Result<ffi::AnyBuffer> rids, ffi::Result<ffi::AnyBuffer> rw,
                    int64_t workspace_id, int32_t copy_engine, int32_t sync_check,
                    int64_t timeout_ms, int32_t ctas_per_sm, int32_t phase) {
  PeerOptions options;
  MOK_RETURN_IF_ERROR(ReadPeerOptions(copy_engine, sync_check, timeout_ms, ctas_per_sm, &options));
  PeerCall call(stream, device, workspace_id);
  MOK_RETURN_IF_ERROR(call.Begin(options));
  const symmetric::View& v = call.view();
  Exchange p;
  const ffi::AnyBuffer* in[3] = {&x, &ids, &w};
  ffi::AnyBuffer* out[3] = {&*rx, &*rids, &*rw};
  const char* names[3] = {"x", "topk_ids", "topk_weights"};
  int64_t offset = 0;
  for (int i = 0; i < 3; ++i) {
    int64_t chunk = 0;
    MOK_RETURN_IF_ERROR(CheckChunked(names[i], *in[i], v.ep_size, &chunk));
    MOK_CHECK(out[i]->size_bytes() == in[i]->size_bytes() &&
                  out[i]->element_type() == in[i]->element_type(),
              "the result for ", names[i], " must have its operand's shape and dtype");
    p.field[i] = Field{static_cast<const char*>(in[i]->untyped_data()),
                       static_cast<char*>(out[i]->untyped_data()), chunk, offset, RegionBytes(v)};
    offset += Pad16(chunk);
  }
  p.num_fields = 3;
  MOK_CHECK(offset <= RegionBytes(v), "peer dispatch needs ", offset,
            " bytes per (source, destination) chunk but workspace ", workspace_id,
            " was sized for ", RegionBytes(v), " (x ", x.size_bytes(), " B over EP=", v.ep_size,
            " ranks); the WorkspaceSpec does not match this call");
  StagedAreas(v, &p);
  p.phase = phase;
  MOK_RETURN_IF_ERROR(call.RunExchange(p, kCopyOut, x.element_type()));
  return call.Finish();
}

ffi::Error Combine(cudaStream_t stream, int32_t device, ffi::AnyBuffer rows,
                   ffi::AnyBuffer home_row, ffi::Result<ffi::AnyBuffer> y, int64_t workspace_id,
                   int32_t copy_engine, int32_t sync_check, int64_t timeout_ms, int32_t ctas_per_sm,
                   int32_t phase) {
  PeerOptions options;
  MOK_RETURN_IF_ERROR(ReadPeerOptions(copy_engine, sync_check, timeout_ms, ctas_per_sm, &options));
  PeerCall call(stream, device, workspace_id);
  MOK_RETURN_IF_ERROR(call.Begin(options));
  const symmetric::View& v = call.view();
  auto rd = rows.dimensions();
  MOK_CHECK(rd.size() == 3 && rd[0] == v.ep_size, "rows must be [EP=", v.ep_size,
            ", R, H], got rank ", rd.size());
  const int64_t H = rd[2];
  MOK_CHECK(rows.element_type() == ffi::DataType::BF16 || rows.element_type() == ffi::DataType::F32,
            "rows must be bfloat16 or float32, got ", DtypeName(rows.element_type()));
  MOK_CHECK(H % 8 == 0, "the peer combine needs H to be a multiple of 8, got H=", H);
  MOK_RETURN_IF_ERROR(CheckCombineShapes(v.ep_size, home_row, *y, H));
  Exchange p;
  const int64_t chunk = static_cast<int64_t>(rows.size_bytes()) / v.ep_size;
  p.field[0] =
      Field{static_cast<const char*>(rows.untyped_data()), nullptr, chunk, 0, RegionBytes(v)};
  p.num_fields = 1;
  MOK_CHECK(chunk <= RegionBytes(v), "peer combine needs ", chunk,
            " bytes per chunk but workspace ", workspace_id, " was sized for ", RegionBytes(v));
  StagedAreas(v, &p);
  p.phase = phase;
  SetReduction(home_row, *y, H, &p);
  MOK_RETURN_IF_ERROR(call.RunExchange(p, kReduce, rows.element_type()));
  return call.Finish();
}

// mok_home_sum: rows [EP, R, H] (bf16 / f32, H a multiple of one 16-byte vector), home_row
// [T, EP] i32 -> y [T, H] f32, y[t] = sum over d ascending with home_row[t, d] >= 0 of
// rows[d, home_row[t, d]]. No workspace, no peer: one device's reduction (the XLA transport's
// combine).
ffi::Error HomeSum(cudaStream_t stream, int32_t device, ffi::AnyBuffer rows,
                   ffi::AnyBuffer home_row, ffi::Result<ffi::AnyBuffer> y) {
  MOK_RETURN_IF_ERROR(env::Status());
  auto rd = rows.dimensions();
  MOK_CHECK(rd.size() == 3, "rows must be [EP, R, H], got rank ", rd.size());
  const int64_t ep = rd[0], R = rd[1], H = rd[2];
  const ffi::DataType dt = rows.element_type();
  MOK_CHECK(dt == ffi::DataType::BF16 || dt == ffi::DataType::F32,
            "rows must be bfloat16 or float32, got ", DtypeName(dt));
  const int64_t vec = dt == ffi::DataType::BF16 ? 8 : 4;
  MOK_CHECK(H % vec == 0, "mok_home_sum needs H to be a multiple of ", vec, ", got H=", H);
  MOK_RETURN_IF_ERROR(CheckCombineShapes(static_cast<int>(ep), home_row, *y, H));
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(GetDevice(device, &dev));
  const int64_t tokens = home_row.dimensions()[0];
  if (tokens == 0) return ffi::Error::Success();
  const int grid = ExchangeGrid(tokens * H * 4, dev.sms, kDefaultCtasPerSm);
  const char* base = static_cast<const char*>(rows.untyped_data());
  const int64_t chunk = R * H * (dt == ffi::DataType::BF16 ? 2 : 4);
  const int* home = static_cast<const int*>(home_row.untyped_data());
  float* out = static_cast<float*>(y->untyped_data());
  if (dt == ffi::DataType::BF16)
    home_sum_kernel<bf16>
        <<<grid, kThreads, 0, stream>>>(base, chunk, home, out, tokens, H, static_cast<int>(ep));
  else
    home_sum_kernel<float>
        <<<grid, kThreads, 0, stream>>>(base, chunk, home, out, tokens, H, static_cast<int>(ep));
  return Stage("home sum", cudaGetLastError(), stream);
}

}  // namespace

// Shared with ep_fused.cu.
ffi::Error CheckCombineShapes(int ep, const ffi::AnyBuffer& home_row, const ffi::AnyBuffer& y,
                              int64_t H) {
  auto hd = home_row.dimensions();
  auto yd = y.dimensions();
  MOK_CHECK(hd.size() == 2 && hd[1] == ep && home_row.element_type() == ffi::DataType::S32,
            "home_row must be int32 [T, EP=", ep, "]");
  MOK_CHECK(
      yd.size() == 2 && yd[0] == hd[0] && yd[1] == H && y.element_type() == ffi::DataType::F32,
      "y must be float32 [T=", hd[0], ", H=", H, "]");
  return ffi::Error::Success();
}

void SetReduction(const ffi::AnyBuffer& home_row, ffi::AnyBuffer& y, int64_t H, Exchange* p) {
  p->home_row = static_cast<const int*>(home_row.untyped_data());
  p->y = static_cast<float*>(y.untyped_data());
  p->tokens = home_row.dimensions()[0], p->hidden = H;
}

}  // namespace mok::cuda::ep

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokEpDispatchCuda, mok::cuda::ep::Dispatch,
                              mok::AppendPeerAttrs(mok::cuda::BindStreamDevice()
                                                       .Arg<xla::ffi::AnyBuffer>()   // x [EP, R, H]
                                                       .Arg<xla::ffi::AnyBuffer>()   // topk_ids
                                                       .Arg<xla::ffi::AnyBuffer>()   // topk_weights
                                                       .Ret<xla::ffi::AnyBuffer>()   // received x
                                                       .Ret<xla::ffi::AnyBuffer>()   // received ids
                                                       .Ret<xla::ffi::AnyBuffer>())  // received w
                                  .Attr<int32_t>("phase"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokEpCombineCuda, mok::cuda::ep::Combine,
                              mok::AppendPeerAttrs(mok::cuda::BindStreamDevice()
                                                       .Arg<xla::ffi::AnyBuffer>()  // rows [EP,R,H]
                                                       .Arg<xla::ffi::AnyBuffer>()  // home_row
                                                       .Ret<xla::ffi::AnyBuffer>())  // y [T, H]
                                  .Attr<int32_t>("phase"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokHomeSumCuda, mok::cuda::ep::HomeSum,
                              mok::cuda::BindStreamDevice()
                                  .Arg<xla::ffi::AnyBuffer>()    // rows [EP, R, H]
                                  .Arg<xla::ffi::AnyBuffer>()    // home_row [T, EP] i32
                                  .Ret<xla::ffi::AnyBuffer>());  // y [T, H] f32
