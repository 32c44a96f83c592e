// Handlers of the peer transport: validate against the workspace, launch the exchange
// kernel on XLA's stream, turn the kernel's error word into an ffi::Error naming the peer.
//   mok_ep_dispatch: x [EP,R,H], ids [EP,R,k] i32, w [EP,R,k] f32 -> the same shapes; chunk d
//                    goes to rank d, result chunk s came from rank s (an all_to_all).
//   mok_ep_combine : rows [EP,R,H] (chunk s = rows computed for rank s), home_row [T,EP] i32
//                    -> y [T,H] f32, y[t] = sum_{d asc, home_row[t,d] >= 0} rows_from_d[home_row]
//   mok_ep_moe_fwd : the fused forward (one call, no host round trip between its phases): the
//                    dispatch of mok_ep_dispatch into the workspace's fixed area 2 (rows stay
//                    there), the single-GPU forward phases on those rows, the combine of
//                    mok_ep_combine through area 3 -> y [T,H] f32. Bitwise what the staged
//                    dispatch -> mok_moe_fwd -> combine sequence computes.
//   mok_ep_moe_fwd_train: the same, also handing back the received rows and the saved h.
//   mok_ep_moe_bwd : the fused backward (reverse combine of dy, the single-GPU backward phases,
//                    reverse dispatch of dx and d_topk_weights).
//   mok_home_sum   : the combine's reduction over one device's [EP,R,H] buffer (no peer).
// Attributes: workspace_id (i64), phase (i32, names the exchange in errors).
// Status (2026-11-30): every handler run on 2 x H200 (tools/gpu_check_ep.sh; BENCHMARKS.md).
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "common/problem.h"
#include "cuda/host/driver.h"
#include "cuda/device/exchange.cuh"
#include "cuda/handlers/ep.h"
#include "cuda/phases/phases.h"
#include "cuda/device/row_wait.cuh"
#include "cuda/host/stage.h"
#include "cuda/host/symmetric.h"

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

// The device (current from here on, its SM count cached by GetDevice) and the workspace view.
ffi::Error Prepare(int32_t device, int64_t id, symmetric::View* view, DeviceInfo* dev) {
  MOK_RETURN_IF_ERROR(GetDevice(device, dev));
  const std::string why = symmetric::Lookup(id, device, view);
  if (!why.empty()) return ffi::Error::Internal(Msg("jax_mok peer transport: ", why));
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
      phase == kEpochCheck
          ? Msg("jax_mok peer transport: rank ", v.rank, " (device ", device, ", workspace ", id,
                "): the device's exchange count differs from the host's (JAX_MOK_PEER_COPY=ce "
                "needs every peer call to be counted on the host); nothing was stored")
          : Msg("jax_mok peer transport: rank ", v.rank, " (device ", device, ") timed out after ",
                TimeoutNs() / 1000000ull, " ms waiting for rank ", peer, " in phase ",
                PhaseName(phase), " (workspace ", id,
                "): that rank never ran the matching call. Every rank of the "
                "expert axis must run the same sequence of peer calls (JAX_MOK_PEER_TIMEOUT_MS "
                "sets "
                "the bound)");
  symmetric::Poison(id, device, message);
  return ffi::Error::Internal(message);
}

// JAX_MOK_PEER_UNROLL=4: the tuned exchange kernel (with copy engines, the default, it only
// affects the copy-out reads; tune it with JAX_MOK_PEER_COPY=sm; ep_exchange.cuh: 4 vectors in
// flight per thread, my own chunk copied under the peers' arrival; experimental, 2 % on S1 / 8192
// in one run; 8 bytes of register spill in its two float variants; default 1).
int Unroll() {
  static const int unroll = [] {
    const char* env = std::getenv("JAX_MOK_PEER_UNROLL");
    return env && std::atoi(env) == 4 ? 4 : 1;
  }();
  return unroll;
}

// CTAs per SM at most (default 2). JAX_MOK_PEER_CTAS_PER_SM=1..4 for bandwidth sweeps
// (tools/peer_bw.py); capped at 4 so that every CTA of the grid stays co-resident (256 threads
// each, a few registers): a CTA spinning on a peer's flag must never keep another CTA of its own
// grid, whose stores that peer may be waiting for, from being scheduled.
int CtasPerSm() {
  static const int ctas = [] {
    const char* env = std::getenv("JAX_MOK_PEER_CTAS_PER_SM");
    const int n = env ? std::atoi(env) : 2;
    return n >= 1 && n <= 4 ? n : 2;
  }();
  return ctas;
}

int Grid(int64_t bytes_per_peer, int sms) {
  const int64_t vectors = bytes_per_peer / 16 + 1;
  const int64_t wanted = (vectors + kThreads - 1) / kThreads;
  const int64_t most = static_cast<int64_t>(CtasPerSm()) * sms;
  return static_cast<int>(wanted < most ? (wanted > 0 ? wanted : 1) : most);
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
void LaunchUnrolled(const Exchange& p, ExchangeMode mode, ffi::DataType dtype, int grid,
                    cudaStream_t stream) {
  if (mode == kCopyOut)
    exchange_kernel<float, kCopyOut, kUnroll><<<grid, kThreads, 0, stream>>>(p);
  else if (mode == kInPlace)
    exchange_kernel<float, kInPlace, kUnroll><<<grid, kThreads, 0, stream>>>(p);
  else if (dtype == ffi::DataType::BF16)
    exchange_kernel<bf16, kReduce, kUnroll><<<grid, kThreads, 0, stream>>>(p);
  else
    exchange_kernel<float, kReduce, kUnroll><<<grid, kThreads, 0, stream>>>(p);
}

ffi::Error Launch(const Exchange& p, ExchangeMode mode, ffi::DataType dtype, int grid,
                  cudaStream_t stream) {
  if (Unroll() == 4)
    LaunchUnrolled<4>(p, mode, dtype, grid, stream);
  else
    LaunchUnrolled<1>(p, mode, dtype, grid, stream);
  return Stage(mode == kReduce ? "peer combine" : "peer dispatch", cudaGetLastError(), stream);
}

// JAX_MOK_PEER_COPY (default ce): every exchange stores through the copy engines
// (cudaMemcpyAsync into the peers' slots, then the kernel only signals, waits and reads); `sm`:
// the exchange kernel's SM stores. On 2 x H200 (2026-11-30, S1 / 8192) one dispatch exchange
// alone took 0.27 ms with copy engines against 0.45 ms with SM stores, and the fused forward
// 2.02 against 2.10 ms. The staged calls' half depends on the epoch, so with copy engines the host
// counts every exchange launch (symmetric::NextExchange) and each kernel checks the count.
bool CopyEngine() {
  static const bool ce = [] {
    const char* env = std::getenv("JAX_MOK_PEER_COPY");
    return !(env && std::string(env) == "sm");
  }();
  return ce;
}

// JAX_MOK_PEER_COPY=ce: the epoch a launch will run, counted on the host (every exchange launch
// on the workspace counts while copy-engine pushes are on), checked by the kernel.
void CountEpoch(int64_t id, int32_t device, Exchange* p) {
  if (CopyEngine()) p->expected_epoch = symmetric::NextExchange(id, device);
}

// The copy-engine push of exchange `p` (every field, every destination including my own slot,
// or, in reduce mode, every destination but me) into the fixed area `area_offset`.
ffi::Error PushWithCopyEngine(const symmetric::View& v, int64_t area_offset, bool include_own,
                              Exchange* p, cudaStream_t stream) {
  for (int fi = 0; fi < p->num_fields; ++fi) {
    const Field& f = p->field[fi];
    for (int d = 0; d < v.ep_size; ++d) {
      if (d == v.rank && !include_own) continue;
      char* dst = v.peer_base[d] + area_offset + f.offset + static_cast<int64_t>(v.rank) * f.stride;
      MOK_CUDA_RETURN(cudaMemcpyAsync(dst, f.src + static_cast<int64_t>(d) * f.chunk_bytes,
                                      static_cast<size_t>(f.chunk_bytes), cudaMemcpyDeviceToDevice,
                                      stream));
    }
  }
  p->pushed = true;
  return ffi::Error::Success();
}

// JAX_MOK_PEER_OVERLAP=1 (experimental; bitwise tested on 2 x H200, no gain yet): the x rows
// of the fused forward travel on a side stream by copy engine while the main stream exchanges
// ids and weights, routes and starts the gate/up GEMM, whose tiles wait for the rows of other
// ranks (row_wait.cuh).
// Needs cuStreamWriteValue64 (the arrival flags written by the side stream without an SM);
// without it the switch is ignored.
bool Overlap() {
  static const bool on = [] {
    const char* env = std::getenv("JAX_MOK_PEER_OVERLAP");
    return env && env[0] == '1' && symmetric::GetStreamWriteValue64() != nullptr;
  }();
  return on;
}

// One side stream per device with the events that fork it from and join it to XLA's stream.
// (XLA runs one program at a time on a device's compute stream, so one set suffices.)
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, done = nullptr;
};

ffi::Error GetSideStream(int32_t device, SideStream** out) {
  static std::mutex mu;
  static SideStream sides[symmetric::kMaxRanks];
  MOK_CUDA_CHECK(device >= 0 && device < symmetric::kMaxRanks, "device ordinal ", device,
                 " out of range");
  std::lock_guard<std::mutex> lock(mu);
  SideStream& s = sides[device];
  if (s.stream == nullptr) {
    MOK_CUDA_RETURN(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    MOK_CUDA_RETURN(cudaEventCreateWithFlags(&s.start, cudaEventDisableTiming));
    MOK_CUDA_RETURN(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  }
  *out = &s;
  return ffi::Error::Success();
}

// Forks the side stream: x chunk d -> rank d's area-2 slot by copy engine, then arrival_x[me] =
// the call's number on every peer. My own chunk is copied on XLA's stream (no flag covers it:
// the GEMMs must find it there). Fills `wait` for the expert phases.
ffi::Error StartRowPush(const symmetric::View& v, int64_t id, int32_t device, const Field& x,
                        int64_t area_offset, cudaStream_t stream, SideStream** side_out,
                        RowWait* wait) {
  SideStream* side = nullptr;
  MOK_RETURN_IF_ERROR(GetSideStream(device, &side));
  const unsigned long long call = symmetric::NextFusedCall(id, device);
  MOK_CUDA_CHECK(call > 0, "peer workspace ", id, " is not set up on device ", device);
  MOK_CUDA_RETURN(cudaEventRecord(side->start, stream));
  MOK_CUDA_RETURN(cudaStreamWaitEvent(side->stream, side->start, 0));
  for (int d = 0; d < v.ep_size; ++d) {
    char* dst = v.peer_base[d] + area_offset + x.offset + static_cast<int64_t>(v.rank) * x.stride;
    MOK_CUDA_RETURN(cudaMemcpyAsync(dst, x.src + static_cast<int64_t>(d) * x.chunk_bytes,
                                    static_cast<size_t>(x.chunk_bytes), cudaMemcpyDeviceToDevice,
                                    d == v.rank ? stream : side->stream));
  }
  // The flag needs no SM: a kernel here could find every SM taken by GEMM CTAs that wait for
  // the peer's flag, which waits for ours (Overlap() requires the stream write).
  const symmetric::StreamWriteValue64 write = symmetric::GetStreamWriteValue64();
  for (int q = 0; q < v.ep_size; ++q) {
    if (q == v.rank) continue;
    char* flag = v.peer_base[q] + offsetof(symmetric::Signal, arrival_x) +
                 static_cast<int64_t>(v.rank) * sizeof(unsigned long long);
    const CUresult r = write(reinterpret_cast<CUstream>(side->stream),
                             reinterpret_cast<CUdeviceptr>(flag), call, 0);
    MOK_CUDA_CHECK(r == CUDA_SUCCESS, "cuStreamWriteValue64 into rank ", q,
                   "'s workspace failed (CUresult ", static_cast<int>(r),
                   "); JAX_MOK_PEER_OVERLAP=0 runs the fused forward without the side stream");
  }
  MOK_CUDA_RETURN(cudaEventRecord(side->done, side->stream));
  wait->flags =
      reinterpret_cast<const unsigned long long*>(v.local + offsetof(symmetric::Signal, arrival_x));
  wait->target = call;
  wait->self = v.rank, wait->sources = v.ep_size;
  wait->error = v.error_device, wait->timeout_ns = TimeoutNs();
  *side_out = side;
  return ffi::Error::Success();
}

// One region of the workspace (symmetric.h: kAreas areas of EP regions after the signal area).
int64_t RegionBytes(const symmetric::View& v) {
  return (v.bytes - symmetric::kSignalBytes) / (symmetric::kAreas * v.ep_size);
}

// Byte offset of data area `a` in every rank's workspace.
int64_t AreaOffset(const symmetric::View& v, int a) {
  return symmetric::kSignalBytes + a * v.ep_size * RegionBytes(v);
}

// The staged calls: area 0 in even epochs, area 1 in odd ones; a source's slot is one region.
void StagedAreas(const symmetric::View& v, Exchange* p) {
  p->area[0] = AreaOffset(v, 0);
  p->area[1] = AreaOffset(v, 1);
}

void Common(const symmetric::View& v, int32_t phase, Exchange* p) {
  p->rank = v.rank, p->ep = v.ep_size, p->phase = phase, p->peers = v.peers;
  p->error = v.error_device, p->timeout_ns = TimeoutNs();
}

// The combine's reduction: y[t] = sum over d ascending of the rows computed for token t.
ffi::Error CheckCombineShapes(const symmetric::View& v, const ffi::AnyBuffer& home_row,
                              const ffi::AnyBuffer& y, int64_t H) {
  auto hd = home_row.dimensions();
  auto yd = y.dimensions();
  MOK_CUDA_CHECK(
      hd.size() == 2 && hd[1] == v.ep_size && home_row.element_type() == ffi::DataType::S32,
      "home_row must be int32 [T, EP=", v.ep_size, "]");
  MOK_CUDA_CHECK(
      yd.size() == 2 && yd[0] == hd[0] && yd[1] == H && y.element_type() == ffi::DataType::F32,
      "y must be float32 [T=", hd[0], ", H=", H, "]");
  return ffi::Error::Success();
}

void SetReduction(const ffi::AnyBuffer& home_row, ffi::AnyBuffer& y, int64_t H, Exchange* p) {
  p->home_row = static_cast<const int*>(home_row.untyped_data());
  p->y = static_cast<float*>(y.untyped_data());
  p->tokens = home_row.dimensions()[0], p->hidden = H;
}

int ReduceGrid(const Exchange& p, int sms) {
  const int64_t chunk = p.field[0].chunk_bytes;
  const int64_t work = chunk > p.tokens * p.hidden * 4 ? chunk : p.tokens * p.hidden * 4;
  return Grid(work, sms);
}

ffi::Error Dispatch(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer ids,
                    ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> rx,
                    ffi::Result<ffi::AnyBuffer> rids, ffi::Result<ffi::AnyBuffer> rw,
                    int64_t workspace_id, int32_t phase) {
  symmetric::View v;
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(Prepare(device, workspace_id, &v, &dev));
  const int sms = dev.sms;
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
                       static_cast<char*>(out[i]->untyped_data()), chunk, offset, RegionBytes(v)};
    offset += Pad16(chunk);
  }
  p.num_fields = 3;
  MOK_CUDA_CHECK(offset <= RegionBytes(v), "peer dispatch needs ", offset,
                 " bytes per (source, destination) chunk but workspace ", workspace_id,
                 " was sized for ", RegionBytes(v), " (x ", x.size_bytes(),
                 " B over EP=", v.ep_size, " ranks); the WorkspaceSpec does not match this call");
  StagedAreas(v, &p);
  Common(v, phase, &p);
  CountEpoch(workspace_id, device, &p);
  int grid = Grid(offset, sms);
  if (p.expected_epoch != 0) {  // copy engines: the host knows this epoch's half
    const int half = static_cast<int>(p.expected_epoch & 1ull);
    MOK_RETURN_IF_ERROR(PushWithCopyEngine(v, p.area[half], false, &p, stream));
    for (int i = 0; i < p.num_fields; ++i) {  // my own chunk straight to the output
      const Field& f = p.field[i];
      const int64_t at = static_cast<int64_t>(v.rank) * f.chunk_bytes;
      MOK_CUDA_RETURN(cudaMemcpyAsync(f.dst + at, f.src + at, static_cast<size_t>(f.chunk_bytes),
                                      cudaMemcpyDeviceToDevice, stream));
    }
  }
  MOK_RETURN_IF_ERROR(Launch(p, kCopyOut, x.element_type(), grid, stream));
  return SyncCheck() ? Check(v, workspace_id, device, stream, true) : ffi::Error::Success();
}

ffi::Error Combine(cudaStream_t stream, int32_t device, ffi::AnyBuffer rows,
                   ffi::AnyBuffer home_row, ffi::Result<ffi::AnyBuffer> y, int64_t workspace_id,
                   int32_t phase) {
  symmetric::View v;
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(Prepare(device, workspace_id, &v, &dev));
  const int sms = dev.sms;
  if (!SyncCheck()) MOK_RETURN_IF_ERROR(Check(v, workspace_id, device, stream, false));
  auto rd = rows.dimensions();
  MOK_CUDA_CHECK(rd.size() == 3 && rd[0] == v.ep_size, "rows must be [EP=", v.ep_size,
                 ", R, H], got rank ", rd.size());
  const int64_t H = rd[2];
  MOK_CUDA_CHECK(
      rows.element_type() == ffi::DataType::BF16 || rows.element_type() == ffi::DataType::F32,
      "rows must be bfloat16 or float32, got ", DtypeName(rows.element_type()));
  MOK_CUDA_CHECK(H % 8 == 0, "the peer combine needs H to be a multiple of 8, got H=", H);
  MOK_RETURN_IF_ERROR(CheckCombineShapes(v, home_row, *y, H));
  Exchange p;
  const int64_t chunk = static_cast<int64_t>(rows.size_bytes()) / v.ep_size;
  p.field[0] =
      Field{static_cast<const char*>(rows.untyped_data()), nullptr, chunk, 0, RegionBytes(v)};
  p.num_fields = 1;
  MOK_CUDA_CHECK(chunk <= RegionBytes(v), "peer combine needs ", chunk,
                 " bytes per chunk but workspace ", workspace_id, " was sized for ",
                 RegionBytes(v));
  StagedAreas(v, &p);
  Common(v, phase, &p);
  SetReduction(home_row, *y, H, &p);
  CountEpoch(workspace_id, device, &p);
  if (p.expected_epoch != 0)
    MOK_RETURN_IF_ERROR(PushWithCopyEngine(v, p.area[p.expected_epoch & 1ull], false, &p, stream));
  MOK_RETURN_IF_ERROR(Launch(p, kReduce, rows.element_type(), ReduceGrid(p, sms), stream));
  return SyncCheck() ? Check(v, workspace_id, device, stream, true) : ffi::Error::Success();
}

// What the differentiated fused forward keeps for the fused backward: the received rows (copied
// out of area 2, which the next fused call overwrites) and, when saved, the pre-activations h.
struct Residuals {
  ffi::AnyBuffer* x;    // [EP*R, H] in x's dtype
  ffi::AnyBuffer* ids;  // [EP*R, k] i32
  ffi::AnyBuffer* w;    // [EP*R, k] f32
  ffi::AnyBuffer* h;    // [EP*R*k, 2F] in x's dtype, or 0 elements: recomputed by the backward
};

ffi::Error CheckResiduals(const Problem& pr, const Residuals& r) {
  MOK_CUDA_CHECK(r.x->element_count() == pr.tokens * pr.hidden && r.x->element_type() == pr.dtype,
                 "the saved rows must be [EP*R=", pr.tokens, ", H=", pr.hidden, "] in x's dtype");
  MOK_CUDA_CHECK(
      r.ids->element_count() == pr.assignments() && r.ids->element_type() == ffi::DataType::S32 &&
          r.w->element_count() == pr.assignments() && r.w->element_type() == ffi::DataType::F32,
      "the saved ids / weights must be int32 / float32 [EP*R=", pr.tokens, ", k=", pr.top_k, "]");
  MOK_CUDA_CHECK(
      r.h->element_count() == 0 || (r.h->element_count() == pr.assignments() * 2 * pr.ffn &&
                                    r.h->element_type() == pr.dtype),
      "h must be [EP*R*k, 2F] in x's dtype (or empty: recompute)");
  return ffi::Error::Success();
}

// The fused forward: dispatch into area 2 (rows stay there: x [EP*R, H], ids and weights
// [EP*R, k], each field contiguous over the sources), the single-GPU forward on them, the
// combine through area 3. One handler, no host round trip between the phases; the workspace's
// epoch advances twice, as in the staged dispatch + combine.
ffi::Error FusedForwardCall(cudaStream_t stream, ffi::ScratchAllocator& scratch, int32_t device,
                            const ffi::AnyBuffer& x, const ffi::AnyBuffer& ids,
                            const ffi::AnyBuffer& w, const ffi::AnyBuffer& home_row,
                            const ffi::AnyBuffer& wgu, const ffi::AnyBuffer& wd, ffi::AnyBuffer& y,
                            int64_t workspace_id, const Residuals* keep) {
  symmetric::View v;
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(Prepare(device, workspace_id, &v, &dev));
  const int sms = dev.sms;
  if (!SyncCheck()) MOK_RETURN_IF_ERROR(Check(v, workspace_id, device, stream, false));
  const int ep = v.ep_size;
  auto xd = x.dimensions();
  auto id = ids.dimensions();
  auto wt = w.dimensions();
  MOK_CUDA_CHECK(xd.size() == 3 && xd[0] == ep, "x must be [EP=", ep, ", R, H], got rank ",
                 xd.size());
  const int64_t R = xd[1], H = xd[2];
  MOK_CUDA_CHECK(
      id.size() == 3 && id[0] == ep && id[1] == R && ids.element_type() == ffi::DataType::S32,
      "topk_ids must be int32 [EP=", ep, ", R=", R, ", k]");
  const int64_t k = id[2];
  MOK_CUDA_CHECK(wt.size() == 3 && wt[0] == ep && wt[1] == R && wt[2] == k &&
                     w.element_type() == ffi::DataType::F32,
                 "topk_weights must be float32 [EP=", ep, ", R=", R, ", k=", k, "]");
  auto gu = wgu.dimensions();
  auto dn = wd.dimensions();
  MOK_CUDA_CHECK(gu.size() == 3 && dn.size() == 3 && gu[1] == H && dn[2] == H && gu[0] == dn[0] &&
                     gu[2] == 2 * dn[1],
                 "w_gate_up must be [E, H=", H, ", 2F] and w_down [E, F, H=", H, "]");
  MOK_CUDA_CHECK(x.element_type() == wgu.element_type() && x.element_type() == wd.element_type(),
                 "x, w_gate_up and w_down must share one dtype");
  MOK_RETURN_IF_ERROR(CheckCombineShapes(v, home_row, y, H));
  Problem pr;
  pr.tokens = ep * R, pr.hidden = H, pr.ffn = dn[1], pr.experts = gu[0], pr.top_k = k;
  pr.dtype = x.element_type();
  MOK_CUDA_CHECK(pr.dtype == ffi::DataType::BF16 || pr.dtype == ffi::DataType::F32,
                 "x must be bfloat16 or float32, got ", DtypeName(pr.dtype));
  MOK_RETURN_IF_ERROR(CheckCommon(pr));
  if (keep) MOK_RETURN_IF_ERROR(CheckResiduals(pr, *keep));
  void* const h = keep && keep->h->element_count() > 0 ? keep->h->untyped_data() : nullptr;

  // Area 2: [x | ids | weights], each [EP, chunk] without padding between sources.
  const int64_t x_chunk = x.size_bytes() / ep, meta_chunk = R * k * 4;
  const int64_t area_bytes = ep * RegionBytes(v);
  Exchange d;
  const ffi::AnyBuffer* in[3] = {&x, &ids, &w};
  const int64_t chunks[3] = {x_chunk, meta_chunk, meta_chunk};
  int64_t offset = 0;
  for (int i = 0; i < 3; ++i) {
    d.field[i] = Field{static_cast<const char*>(in[i]->untyped_data()), nullptr, chunks[i], offset,
                       chunks[i]};
    offset += Pad16(ep * chunks[i]);
  }
  d.num_fields = 3;
  MOK_CUDA_CHECK(offset <= area_bytes && ep * x_chunk <= area_bytes, "the fused forward needs ",
                 offset, " bytes per area but workspace ", workspace_id, " has ", area_bytes,
                 "; the WorkspaceSpec does not match this call");
  d.area[0] = d.area[1] = AreaOffset(v, 2);
  Common(v, kDispatch, &d);
  const int64_t ids_offset = d.field[1].offset, w_offset = d.field[2].offset;
  RowWait row_wait;
  const RowWait* wait = nullptr;
  SideStream* side = nullptr;
  if (Overlap()) {  // x on the side stream; the exchange below carries ids and weights only
    MOK_RETURN_IF_ERROR(StartRowPush(v, workspace_id, device, d.field[0], AreaOffset(v, 2), stream,
                                     &side, &row_wait));
    row_wait.rows_per_source = static_cast<int>(R);
    wait = &row_wait;
    d.field[0] = d.field[1], d.field[1] = d.field[2], d.num_fields = 2;
  }
  int grid = Grid(offset / ep, sms);
  CountEpoch(workspace_id, device, &d);
  if (CopyEngine()) {
    MOK_RETURN_IF_ERROR(PushWithCopyEngine(v, AreaOffset(v, 2), true, &d, stream));
    grid = 1;  // the kernel only signals and waits
  }
  MOK_RETURN_IF_ERROR(Launch(d, kInPlace, pr.dtype, grid, stream));

  // The expert phases read the received rows in place (my own workspace, area 2).
  const char* area = v.local + AreaOffset(v, 2);
  char* rows = nullptr;  // [EP*R, H] in x's dtype: each row's local experts summed
  MOK_RETURN_IF_ERROR(AllocateScratch(scratch, static_cast<size_t>(ep * x_chunk), &rows));
  const int* rid = reinterpret_cast<const int*>(area + ids_offset);
  const float* rw = reinterpret_cast<const float*>(area + w_offset);
  MOK_RETURN_IF_ERROR(DispatchDtype(pr.dtype, [&](auto tag) {
    using T = decltype(tag);
    return Forward<T>(stream, scratch, dev, pr, reinterpret_cast<const T*>(area), rid, rw,
                      static_cast<const T*>(wgu.untyped_data()),
                      static_cast<const T*>(wd.untyped_data()), reinterpret_cast<T*>(rows),
                      static_cast<T*>(h), wait);
  }));
  if (keep) {  // after the GEMMs: with the side-stream push, x is complete once they waited for it
    const struct {
      ffi::AnyBuffer* out;
      int64_t at;
    } saved[3] = {{keep->x, 0}, {keep->ids, ids_offset}, {keep->w, w_offset}};
    for (const auto& f : saved)
      MOK_CUDA_RETURN(cudaMemcpyAsync(f.out->untyped_data(), area + f.at, f.out->size_bytes(),
                                      cudaMemcpyDeviceToDevice, stream));
  }

  // Area 3: the rows computed for source s go home to rank s; then the fixed-order reduction.
  Exchange c;
  c.field[0] = Field{rows, nullptr, x_chunk, 0, x_chunk};
  c.num_fields = 1;
  c.area[0] = c.area[1] = AreaOffset(v, 3);
  Common(v, kCombine, &c);
  SetReduction(home_row, y, H, &c);
  CountEpoch(workspace_id, device, &c);
  if (CopyEngine()) MOK_RETURN_IF_ERROR(PushWithCopyEngine(v, AreaOffset(v, 3), false, &c, stream));
  MOK_RETURN_IF_ERROR(Launch(c, kReduce, pr.dtype, ReduceGrid(c, sms), stream));
  if (side) MOK_CUDA_RETURN(cudaStreamWaitEvent(stream, side->done, 0));  // join the x push
  return SyncCheck() ? Check(v, workspace_id, device, stream, true) : ffi::Error::Success();
}

ffi::Error FusedForward(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                        ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w,
                        ffi::AnyBuffer home_row, ffi::AnyBuffer wgu, ffi::AnyBuffer wd,
                        ffi::Result<ffi::AnyBuffer> y, int64_t workspace_id) {
  return FusedForwardCall(stream, scratch, device, x, ids, w, home_row, wgu, wd, *y, workspace_id,
                          nullptr);
}

// mok_ep_moe_fwd_train: the fused forward of a training step, which also hands back the received
// rows and, when saved, h (the fused backward's operands).
ffi::Error FusedForwardTrain(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                             ffi::AnyBuffer x, ffi::AnyBuffer ids, ffi::AnyBuffer w,
                             ffi::AnyBuffer home_row, ffi::AnyBuffer wgu, ffi::AnyBuffer wd,
                             ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> x_rows,
                             ffi::Result<ffi::AnyBuffer> ids_rows,
                             ffi::Result<ffi::AnyBuffer> w_rows, ffi::Result<ffi::AnyBuffer> h,
                             int64_t workspace_id) {
  const Residuals keep{&*x_rows, &*ids_rows, &*w_rows, &*h};
  return FusedForwardCall(stream, scratch, device, x, ids, w, home_row, wgu, wd, *y, workspace_id,
                          &keep);
}

// The fused backward (the default; JAX_MOK_PEER_FUSED_BWD=0: the staged calls; run on 2 x H200):
// the reverse combine of dy rows into area 2 (read in place), the single-GPU backward phases on
// them, the reverse dispatch of dx rows and d_topk_weights through area 3 into XLA's results.
// Bitwise what the staged reverse combine -> mok_moe_bwd(_saved) -> reverse dispatch computes.
//   dy_rows [EP,R,H] (row i of chunk d: the cotangent of the token this rank sent to d as row i),
//   x [EP*R,H], topk_ids [EP*R,k], topk_weights [EP*R,k] (the forward's received rows),
//   w_gate_up, w_down, h [EP*R*k, 2F] (the saved pre-activations; 0 elements: recompute)
//   -> dx [EP,R,H] (chunk s: for the rows rank s sent), d_topk_weights [EP,R,k] f32 (likewise),
//      d_w_gate_up, d_w_down.
ffi::Error FusedBackward(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device,
                         ffi::AnyBuffer dy_rows, ffi::AnyBuffer x, ffi::AnyBuffer ids,
                         ffi::AnyBuffer w, ffi::AnyBuffer wgu, ffi::AnyBuffer wd, ffi::AnyBuffer h,
                         ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> d_w,
                         ffi::Result<ffi::AnyBuffer> d_wgu, ffi::Result<ffi::AnyBuffer> d_wd,
                         int64_t workspace_id) {
  symmetric::View v;
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(Prepare(device, workspace_id, &v, &dev));
  const int sms = dev.sms;
  if (!SyncCheck()) MOK_RETURN_IF_ERROR(Check(v, workspace_id, device, stream, false));
  const int ep = v.ep_size;
  Problem pr;
  MOK_RETURN_IF_ERROR(ReadProblem(x, ids, w, wgu, wd, &pr));
  MOK_RETURN_IF_ERROR(CheckCommon(pr));
  auto gd = dy_rows.dimensions();
  MOK_CUDA_CHECK(gd.size() == 3 && gd[0] == ep && gd[0] * gd[1] == pr.tokens &&
                     gd[2] == pr.hidden && dy_rows.element_type() == pr.dtype,
                 "dy_rows must be [EP=", ep, ", R, H=", pr.hidden, "] with EP*R = ", pr.tokens,
                 " rows in x's dtype");
  const int64_t R = gd[1];
  MOK_CUDA_CHECK(dx->size_bytes() == dy_rows.size_bytes() && dx->element_type() == pr.dtype,
                 "dx must be [EP, R, H] in x's dtype");
  MOK_CUDA_CHECK(
      d_w->element_count() == pr.assignments() && d_w->element_type() == ffi::DataType::F32,
      "d_topk_weights must be float32 [EP, R, k]");
  MOK_CUDA_CHECK(
      d_wgu->element_count() == wgu.element_count() && d_wd->element_count() == wd.element_count(),
      "d_w_gate_up / d_w_down must match the weights");
  const bool saved = h.element_count() > 0;
  if (saved)
    MOK_CUDA_CHECK(
        h.element_count() == pr.assignments() * 2 * pr.ffn && h.element_type() == pr.dtype,
        "h must be [EP*R*k, 2F] in x's dtype (or empty)");
  const int64_t area_bytes = ep * RegionBytes(v);
  const int64_t row_chunk = dy_rows.size_bytes() / ep, dw_chunk = R * pr.top_k * 4;

  // Reverse combine: dy chunk d -> rank d's area 2, slot me (rows stay there).
  Exchange a;
  a.field[0] =
      Field{static_cast<const char*>(dy_rows.untyped_data()), nullptr, row_chunk, 0, row_chunk};
  a.num_fields = 1;
  MOK_CUDA_CHECK(ep * row_chunk <= area_bytes, "the fused backward needs ", ep * row_chunk,
                 " bytes per area but workspace ", workspace_id, " has ", area_bytes);
  a.area[0] = a.area[1] = AreaOffset(v, 2);
  Common(v, kReverseCombine, &a);
  int grid = Grid(row_chunk, sms);
  CountEpoch(workspace_id, device, &a);
  if (CopyEngine()) {
    MOK_RETURN_IF_ERROR(PushWithCopyEngine(v, AreaOffset(v, 2), true, &a, stream));
    grid = 1;
  }
  MOK_RETURN_IF_ERROR(Launch(a, kInPlace, pr.dtype, grid, stream));

  // The backward phases on the received dy rows; dx rows and d_w into scratch.
  char* dx_rows = nullptr;
  char* dw_rows = nullptr;
  MOK_RETURN_IF_ERROR(AllocateScratch(scratch, static_cast<size_t>(ep * row_chunk), &dx_rows));
  MOK_RETURN_IF_ERROR(AllocateScratch(scratch, static_cast<size_t>(ep * dw_chunk), &dw_rows));
  const char* dy = v.local + AreaOffset(v, 2);
  MOK_RETURN_IF_ERROR(DispatchDtype(pr.dtype, [&](auto tag) {
    using T = decltype(tag);
    return Backward<T>(
        stream, scratch, dev, pr, reinterpret_cast<const T*>(dy),
        static_cast<const T*>(x.untyped_data()), static_cast<const int*>(ids.untyped_data()),
        static_cast<const float*>(w.untyped_data()), static_cast<const T*>(wgu.untyped_data()),
        static_cast<const T*>(wd.untyped_data()), reinterpret_cast<T*>(dx_rows),
        reinterpret_cast<float*>(dw_rows), static_cast<T*>(d_wgu->untyped_data()),
        static_cast<T*>(d_wd->untyped_data()),
        saved ? static_cast<const T*>(h.untyped_data()) : nullptr);
  }));

  // Reverse dispatch: dx rows and d_w of chunk s -> rank s's area 3 -> XLA's results.
  Exchange b;
  b.field[0] = Field{dx_rows, static_cast<char*>(dx->untyped_data()), row_chunk, 0, row_chunk};
  b.field[1] = Field{dw_rows, static_cast<char*>(d_w->untyped_data()), dw_chunk,
                     Pad16(ep * row_chunk), dw_chunk};
  b.num_fields = 2;
  MOK_CUDA_CHECK(Pad16(ep * row_chunk) + ep * dw_chunk <= area_bytes, "the fused backward needs ",
                 Pad16(ep * row_chunk) + ep * dw_chunk, " bytes in area 3, workspace ",
                 workspace_id, " has ", area_bytes);
  b.area[0] = b.area[1] = AreaOffset(v, 3);
  Common(v, kReverseDispatch, &b);
  CountEpoch(workspace_id, device, &b);
  if (CopyEngine()) {
    MOK_RETURN_IF_ERROR(PushWithCopyEngine(v, AreaOffset(v, 3), false, &b, stream));
    for (int i = 0; i < b.num_fields; ++i) {  // my own chunk straight to the result
      const Field& f = b.field[i];
      const int64_t at = static_cast<int64_t>(v.rank) * f.chunk_bytes;
      MOK_CUDA_RETURN(cudaMemcpyAsync(f.dst + at, f.src + at, static_cast<size_t>(f.chunk_bytes),
                                      cudaMemcpyDeviceToDevice, stream));
    }
  }
  MOK_RETURN_IF_ERROR(Launch(b, kCopyOut, pr.dtype, Grid(row_chunk + dw_chunk, sms), stream));
  return SyncCheck() ? Check(v, workspace_id, device, stream, true) : ffi::Error::Success();
}

// mok_home_sum: rows [EP, R, H] (bf16 / f32, H a multiple of one 16-byte vector), home_row
// [T, EP] i32 -> y [T, H] f32, y[t] = sum over d ascending with home_row[t, d] >= 0 of
// rows[d, home_row[t, d]]. No workspace, no peer: one device's reduction (sharding._sum_home_rows).
ffi::Error HomeSum(cudaStream_t stream, int32_t device, ffi::AnyBuffer rows,
                   ffi::AnyBuffer home_row, ffi::Result<ffi::AnyBuffer> y) {
  auto rd = rows.dimensions();
  auto hd = home_row.dimensions();
  auto yd = y->dimensions();
  MOK_CUDA_CHECK(rd.size() == 3, "rows must be [EP, R, H], got rank ", rd.size());
  const int64_t ep = rd[0], R = rd[1], H = rd[2];
  const ffi::DataType dt = rows.element_type();
  MOK_CUDA_CHECK(dt == ffi::DataType::BF16 || dt == ffi::DataType::F32,
                 "rows must be bfloat16 or float32, got ", DtypeName(dt));
  const int64_t vec = dt == ffi::DataType::BF16 ? 8 : 4;
  MOK_CUDA_CHECK(H % vec == 0, "mok_home_sum needs H to be a multiple of ", vec, ", got H=", H);
  MOK_CUDA_CHECK(hd.size() == 2 && hd[1] == ep && home_row.element_type() == ffi::DataType::S32,
                 "home_row must be int32 [T, EP=", ep, "]");
  MOK_CUDA_CHECK(
      yd.size() == 2 && yd[0] == hd[0] && yd[1] == H && y->element_type() == ffi::DataType::F32,
      "y must be float32 [T=", hd[0], ", H=", H, "]");
  DeviceInfo dev;
  MOK_RETURN_IF_ERROR(GetDevice(device, &dev));
  const int sms = dev.sms;
  const int64_t tokens = hd[0];
  if (tokens == 0) return ffi::Error::Success();
  const int grid = Grid(tokens * H * 4, sms);
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
}  // namespace mok::cuda::ep

namespace {
auto EpContext() {
  return xla::ffi::Ffi::Bind()
      .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
      .Ctx<xla::ffi::DeviceOrdinal>();
}

// The fused calls also allocate XLA scratch for the single-GPU phases.
auto FusedContext() {
  return xla::ffi::Ffi::Bind()
      .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
      .Ctx<xla::ffi::ScratchAllocator>()
      .Ctx<xla::ffi::DeviceOrdinal>();
}

// The operands of mok_ep_moe_fwd and mok_ep_moe_fwd_train.
auto FusedForwardOperands() {
  return FusedContext()
      .Arg<xla::ffi::AnyBuffer>()   // x [EP, R, H]
      .Arg<xla::ffi::AnyBuffer>()   // topk_ids [EP, R, k] i32
      .Arg<xla::ffi::AnyBuffer>()   // topk_weights [EP, R, k] f32
      .Arg<xla::ffi::AnyBuffer>()   // home_row [T, EP] i32
      .Arg<xla::ffi::AnyBuffer>()   // w_gate_up [E_loc, H, 2F]
      .Arg<xla::ffi::AnyBuffer>();  // w_down [E_loc, F, H]
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokEpMoeFwdCuda, mok::cuda::ep::FusedForward,
                              FusedForwardOperands()
                                  .Ret<xla::ffi::AnyBuffer>()  // y [T, H] f32
                                  .Attr<int64_t>("workspace_id"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokEpMoeFwdTrainCuda, mok::cuda::ep::FusedForwardTrain,
                              FusedForwardOperands()
                                  .Ret<xla::ffi::AnyBuffer>()  // y [T, H] f32
                                  .Ret<xla::ffi::AnyBuffer>()  // received x [EP*R, H]
                                  .Ret<xla::ffi::AnyBuffer>()  // received ids [EP*R, k]
                                  .Ret<xla::ffi::AnyBuffer>()  // received weights [EP*R, k]
                                  .Ret<xla::ffi::AnyBuffer>()  // h [EP*R*k, 2F] or empty
                                  .Attr<int64_t>("workspace_id"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokEpMoeBwdCuda, mok::cuda::ep::FusedBackward,
                              FusedContext()
                                  .Arg<xla::ffi::AnyBuffer>()  // dy_rows [EP, R, H]
                                  .Arg<xla::ffi::AnyBuffer>()  // x [EP*R, H]
                                  .Arg<xla::ffi::AnyBuffer>()  // topk_ids [EP*R, k]
                                  .Arg<xla::ffi::AnyBuffer>()  // topk_weights [EP*R, k]
                                  .Arg<xla::ffi::AnyBuffer>()  // w_gate_up
                                  .Arg<xla::ffi::AnyBuffer>()  // w_down
                                  .Arg<xla::ffi::AnyBuffer>()  // h (empty: recompute)
                                  .Ret<xla::ffi::AnyBuffer>()  // dx [EP, R, H]
                                  .Ret<xla::ffi::AnyBuffer>()  // d_topk_weights [EP, R, k]
                                  .Ret<xla::ffi::AnyBuffer>()  // d_w_gate_up
                                  .Ret<xla::ffi::AnyBuffer>()  // d_w_down
                                  .Attr<int64_t>("workspace_id"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokHomeSumCuda, mok::cuda::ep::HomeSum,
                              EpContext()
                                  .Arg<xla::ffi::AnyBuffer>()    // rows [EP, R, H]
                                  .Arg<xla::ffi::AnyBuffer>()    // home_row [T, EP] i32
                                  .Ret<xla::ffi::AnyBuffer>());  // y [T, H] f32

XLA_FFI_DEFINE_HANDLER_SYMBOL(MokEpCombineCuda, mok::cuda::ep::Combine,
                              EpContext()
                                  .Arg<xla::ffi::AnyBuffer>()  // rows [EP, R, H]
                                  .Arg<xla::ffi::AnyBuffer>()  // home_row [T, EP] i32
                                  .Ret<xla::ffi::AnyBuffer>()  // y [T, H] f32
                                  .Attr<int64_t>("workspace_id")
                                  .Attr<int32_t>("phase"));
