// Handlers of the staged peer transport: validate against the workspace, launch the exchange
// kernel on XLA's stream, turn the kernel's error word into an ffi::Error naming the peer.
//   mok_ep_dispatch: x [EP,R,H], ids [EP,R,k] i32, w [EP,R,k] f32 -> the same shapes; chunk d
//                    goes to rank d, result chunk s came from rank s (an all_to_all).
//   mok_ep_combine : rows [EP,R,H] (chunk s = rows computed for rank s), home_row [T,EP] i32
//                    -> y [T,H] f32, y[t] = sum_{d asc, home_row[t,d] >= 0} rows_from_d[home_row]
// Attributes: workspace_id (i64), phase (i32, names the exchange in errors).
// Status (2026-11-29): run on 2 x H200 (tools/gpu_check_ep.sh; BENCHMARKS.md).
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "common/problem.h"
#include "cuda/ep_exchange.cuh"
#include "cuda/ep_handlers.h"
#include "cuda/status.cuh"
#include "cuda/symmetric.h"

namespace mok::cuda::ep {
namespace {

int64_t Pad16(int64_t n) { return (n + 15) / 16 * 16; }

unsigned long long TimeoutNs() {
  static const unsigned long long ns = [] {
    const char* env = std::getenv("JAX_MOK_PEER_TIMEOUT_MS");
    const long long ms = env ? std::atoll(env) : 10000;
    return static_cast<unsigned long long>(ms > 0 ? ms : 10000) * 1000000ull;
  }();
  return ns;
}

// JAX_MOK_PEER_CHECK=deferred: no host sync after a call; an error shows at the next call.
bool SyncCheck() {
  static const bool sync = [] {
    const char* env = std::getenv("JAX_MOK_PEER_CHECK");
    return !(env && std::string(env) == "deferred");
  }();
  return sync;
}

ffi::Error Prepare(int32_t device, int64_t id, symmetric::View* view, int* sms) {
  int current = -1;
  MOK_CUDA_RETURN(cudaGetDevice(&current));
  if (current != device) MOK_CUDA_RETURN(cudaSetDevice(device));
  const std::string why = symmetric::Lookup(id, device, view);
  if (!why.empty()) return ffi::Error::Internal(Msg("jax_mok peer transport: ", why));
  MOK_CUDA_RETURN(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device));
  return ffi::Error::Success();
}

// Reads the error word (after a sync in the default mode) and poisons the workspace on error.
ffi::Error Check(const symmetric::View& v, int64_t id, int32_t device, cudaStream_t stream,
                 bool sync) {
  if (sync) MOK_CUDA_RETURN(cudaStreamSynchronize(stream));
  if (sync && DebugSync()) {  // JAX_MOK_CUDA_DEBUG_SYNC=1: the epoch this rank has finished
    unsigned long long epoch = 0;
    MOK_CUDA_RETURN(cudaMemcpy(&epoch, v.local + offsetof(symmetric::Signal, epoch), sizeof(epoch),
                               cudaMemcpyDeviceToHost));
    std::fprintf(stderr, "jax_mok peer: workspace %lld rank %d device %d finished epoch %llu\n",
                 static_cast<long long>(id), v.rank, static_cast<int>(device), epoch);
  }
  const unsigned int code = *v.error_host;
  if (code == 0u) return ffi::Error::Success();
  const int phase = static_cast<int>((code - 1u) / 256u),
            peer = static_cast<int>((code - 1u) % 256u);
  const std::string message =
      Msg("jax_mok peer transport: rank ", v.rank, " (device ", device, ") timed out after ",
          TimeoutNs() / 1000000ull, " ms waiting for rank ", peer, " in phase ", PhaseName(phase),
          " (workspace ", id,
          "): that rank never ran the matching call. Every rank of the "
          "expert axis must run the same sequence of peer calls (JAX_MOK_PEER_TIMEOUT_MS sets "
          "the bound)");
  symmetric::Poison(id, device, message);
  return ffi::Error::Internal(message);
}

// JAX_MOK_PEER_UNROLL=4: the tuned exchange (ep_exchange.cuh: 4 vectors in flight per thread,
// my own chunk copied under the peers' arrival; experimental, compile-checked only; 8 bytes of
// register spill in its two float variants; default 1).
int Unroll() {
  static const int unroll = [] {
    const char* env = std::getenv("JAX_MOK_PEER_UNROLL");
    return env && std::atoi(env) == 4 ? 4 : 1;
  }();
  return unroll;
}

int Grid(int64_t bytes_per_peer, int sms) {
  const int64_t vectors = bytes_per_peer / 16 + 1;
  const int64_t wanted = (vectors + kThreads - 1) / kThreads;
  return static_cast<int>(wanted < 2 * sms ? (wanted > 0 ? wanted : 1) : 2 * sms);
}

ffi::Error CheckChunked(const char* name, const ffi::AnyBuffer& a, int ep, int64_t* chunk) {
  auto d = a.dimensions();
  MOK_CUDA_CHECK(d.size() >= 2 && d[0] == ep, name, " must be [EP=", ep, ", R, ...], got rank ",
                 d.size(), " with leading dim ", d.size() ? d[0] : -1);
  *chunk = static_cast<int64_t>(a.size_bytes()) / ep;
  MOK_CUDA_CHECK(*chunk % 4 == 0, name, ": a chunk of ", *chunk,
                 " bytes is not a multiple of 4 bytes");
  return ffi::Error::Success();
}

template <int kUnroll>
void LaunchUnrolled(const Exchange& p, bool reduce, ffi::DataType dtype, int grid,
                    cudaStream_t stream) {
  if (!reduce)
    exchange_kernel<float, false, kUnroll><<<grid, kThreads, 0, stream>>>(p);
  else if (dtype == ffi::DataType::BF16)
    exchange_kernel<bf16, true, kUnroll><<<grid, kThreads, 0, stream>>>(p);
  else
    exchange_kernel<float, true, kUnroll><<<grid, kThreads, 0, stream>>>(p);
}

ffi::Error Launch(const Exchange& p, bool reduce, ffi::DataType dtype, int grid,
                  cudaStream_t stream) {
  if (Unroll() == 4)
    LaunchUnrolled<4>(p, reduce, dtype, grid, stream);
  else
    LaunchUnrolled<1>(p, reduce, dtype, grid, stream);
  return Stage(reduce ? "peer combine" : "peer dispatch", cudaGetLastError(), stream);
}

ffi::Error Dispatch(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer ids,
                    ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> rx,
                    ffi::Result<ffi::AnyBuffer> rids, ffi::Result<ffi::AnyBuffer> rw,
                    int64_t workspace_id, int32_t phase) {
  symmetric::View v;
  int sms = 0;
  MOK_RETURN_IF_ERROR(Prepare(device, workspace_id, &v, &sms));
  if (!SyncCheck()) MOK_RETURN_IF_ERROR(Check(v, workspace_id, device, stream, false));
  Exchange p;
  const ffi::AnyBuffer* in[3] = {&x, &ids, &w};
  ffi::AnyBuffer* out[3] = {&*rx, &*rids, &*rw};
  const char* names[3] = {"x", "topk_ids", "topk_weights"};
  int64_t offset = 0;
  for (int i = 0; i < 3; ++i) {
    int64_t chunk = 0;
    MOK_RETURN_IF_ERROR(CheckChunked(names[i], *in[i], v.ep_size, &chunk));
    MOK_CUDA_CHECK(out[i]->size_bytes() == in[i]->size_bytes() &&
                       out[i]->element_type() == in[i]->element_type(),
                   "the result for ", names[i], " must have its operand's shape and dtype");
    p.field[i] = Field{static_cast<const char*>(in[i]->untyped_data()),
                       static_cast<char*>(out[i]->untyped_data()), chunk, offset};
    offset += Pad16(chunk);
  }
  p.num_fields = 3;
  p.region_bytes = (v.bytes - symmetric::kSignalBytes) / (2 * v.ep_size);
  MOK_CUDA_CHECK(offset <= p.region_bytes, "peer dispatch needs ", offset,
                 " bytes per (source, destination) chunk but workspace ", workspace_id,
                 " was sized for ", p.region_bytes, " (x ", x.size_bytes(),
                 " B over EP=", v.ep_size, " ranks); the WorkspaceSpec does not match this call");
  p.rank = v.rank, p.ep = v.ep_size, p.phase = phase, p.peers = v.peers;
  p.error = v.error_device, p.timeout_ns = TimeoutNs();
  MOK_RETURN_IF_ERROR(Launch(p, false, x.element_type(), Grid(offset, sms), stream));
  return SyncCheck() ? Check(v, workspace_id, device, stream, true) : ffi::Error::Success();
}

ffi::Error Combine(cudaStream_t stream, int32_t device, ffi::AnyBuffer rows,
                   ffi::AnyBuffer home_row, ffi::Result<ffi::AnyBuffer> y, int64_t workspace_id,
                   int32_t phase) {
  symmetric::View v;
  int sms = 0;
  MOK_RETURN_IF_ERROR(Prepare(device, workspace_id, &v, &sms));
  if (!SyncCheck()) MOK_RETURN_IF_ERROR(Check(v, workspace_id, device, stream, false));
  auto rd = rows.dimensions();
  auto hd = home_row.dimensions();
  auto yd = y->dimensions();
  MOK_CUDA_CHECK(rd.size() == 3 && rd[0] == v.ep_size, "rows must be [EP=", v.ep_size,
                 ", R, H], got rank ", rd.size());
  const int64_t H = rd[2];
  MOK_CUDA_CHECK(
      rows.element_type() == ffi::DataType::BF16 || rows.element_type() == ffi::DataType::F32,
      "rows must be bfloat16 or float32, got ", DtypeName(rows.element_type()));
  MOK_CUDA_CHECK(H % 8 == 0, "the peer combine needs H to be a multiple of 8, got H=", H);
  MOK_CUDA_CHECK(
      hd.size() == 2 && hd[1] == v.ep_size && home_row.element_type() == ffi::DataType::S32,
      "home_row must be int32 [T, EP=", v.ep_size, "]");
  MOK_CUDA_CHECK(
      yd.size() == 2 && yd[0] == hd[0] && yd[1] == H && y->element_type() == ffi::DataType::F32,
      "y must be float32 [T=", hd[0], ", H=", H, "]");
  Exchange p;
  const int64_t chunk = static_cast<int64_t>(rows.size_bytes()) / v.ep_size;
  p.field[0] = Field{static_cast<const char*>(rows.untyped_data()), nullptr, chunk, 0};
  p.num_fields = 1;
  p.region_bytes = (v.bytes - symmetric::kSignalBytes) / (2 * v.ep_size);
  MOK_CUDA_CHECK(chunk <= p.region_bytes, "peer combine needs ", chunk,
                 " bytes per chunk but workspace ", workspace_id, " was sized for ",
                 p.region_bytes);
  p.rank = v.rank, p.ep = v.ep_size, p.phase = phase, p.peers = v.peers;
  p.error = v.error_device, p.timeout_ns = TimeoutNs();
  p.home_row = static_cast<const int*>(home_row.untyped_data());
  p.y = static_cast<float*>(y->untyped_data());
  p.tokens = hd[0], p.hidden = H;
  const int64_t work = chunk > p.tokens * H * 4 ? chunk : p.tokens * H * 4;
  MOK_RETURN_IF_ERROR(Launch(p, true, rows.element_type(), Grid(work, sms), stream));
  return SyncCheck() ? Check(v, workspace_id, device, stream, true) : ffi::Error::Success();
}

}  // namespace
}  // namespace mok::cuda::ep

namespace {
auto EpContext() {
  return xla::ffi::Ffi::Bind()
      .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
      .Ctx<xla::ffi::DeviceOrdinal>();
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokEpDispatchCuda, mok::cuda::ep::Dispatch,
                              EpContext()
                                  .Arg<xla::ffi::AnyBuffer>()  // x [EP, R, H]
                                  .Arg<xla::ffi::AnyBuffer>()  // topk_ids [EP, R, k] i32
                                  .Arg<xla::ffi::AnyBuffer>()  // topk_weights [EP, R, k] f32
                                  .Ret<xla::ffi::AnyBuffer>()  // received x
                                  .Ret<xla::ffi::AnyBuffer>()  // received ids
                                  .Ret<xla::ffi::AnyBuffer>()  // received weights
                                  .Attr<int64_t>("workspace_id")
                                  .Attr<int32_t>("phase"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokEpCombineCuda, mok::cuda::ep::Combine,
                              EpContext()
                                  .Arg<xla::ffi::AnyBuffer>()  // rows [EP, R, H]
                                  .Arg<xla::ffi::AnyBuffer>()  // home_row [T, EP] i32
                                  .Ret<xla::ffi::AnyBuffer>()  // y [T, H] f32
                                  .Attr<int64_t>("workspace_id")
                                  .Attr<int32_t>("phase"));
