// See peer_call.h. A CUDA translation unit: it launches the exchange kernel.
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "common/env.h"
#include "cuda/host/peer_call.h"
#include "cuda/host/stage.h"

namespace mok::cuda::ep {

ffi::Error ReadPeerOptions(int32_t copy_engine, int32_t sync_check, int64_t timeout_ms,
                           int32_t ctas_per_sm, PeerOptions* out) {
  MOK_CHECK(copy_engine == 0 || copy_engine == 1,
            "attribute copy_engine must be 1 (copy engines) or 0 (SM stores), got ", copy_engine);
  MOK_CHECK(sync_check == 0 || sync_check == 1,
            "attribute sync_check must be 1 (synchronize after the call) or 0 (deferred), got ",
            sync_check);
  // The bound becomes nanoseconds of %globaltimer; a day is far beyond any exchange.
  MOK_CHECK(timeout_ms >= 1 && timeout_ms <= 86400000,
            "attribute timeout_ms must be in [1, 86400000], got ", timeout_ms);
  // Co-residency of the exchange kernel's CTAs (256 threads, few registers each) holds up to 4.
  MOK_CHECK(ctas_per_sm >= 1 && ctas_per_sm <= 4, "attribute ctas_per_sm must be in [1, 4], got ",
            ctas_per_sm);
  out->copy_engine = copy_engine == 1;
  out->sync_check = sync_check == 1;
  out->timeout_ms = timeout_ms;
  out->ctas_per_sm = ctas_per_sm;
  return ffi::Error::Success();
}

int ExchangeGrid(int64_t bytes_per_peer, int sms, int ctas_per_sm) {
  const int64_t vectors = bytes_per_peer / 16 + 1;
  const int64_t wanted = (vectors + kThreads - 1) / kThreads;
  const int64_t most = static_cast<int64_t>(ctas_per_sm) * sms;
  return static_cast<int>(wanted < most ? (wanted > 0 ? wanted : 1) : most);
}

std::string DescribeErrorCode(unsigned int code, int rank, int device, int64_t id,
                              int64_t timeout_ms) {
  const int phase = static_cast<int>((code - 1u) / 256u),
            peer = static_cast<int>((code - 1u) % 256u);
  if (phase == kEpochCheck)
    return StrCat("jax_mok peer transport: rank ", rank, " (device ", device, ", workspace ", id,
                  "): the device's exchange count differs from the host's (every exchange on a "
                  "workspace must go through its handlers, each counted once); nothing was stored");
  return StrCat(
      "jax_mok peer transport: rank ", rank, " (device ", device, ") timed out waiting for rank ",
      peer, " in phase ", PhaseName(phase), " (workspace ", id,
      "): that rank never ran the matching call. Every rank of the expert axis must "
      "run the same sequence of peer calls",
      timeout_ms > 0 ? StrCat(" (the bound is the calls' timeout_ms attribute: ", timeout_ms,
                              " ms for this one)")
                     : std::string());
}

std::vector<std::string> PendingErrors() {
  std::vector<std::string> out;
  for (const symmetric::ErrorState& e : symmetric::Errors())
    out.push_back(e.code != 0u ? DescribeErrorCode(e.code, e.rank, e.ordinal, e.id, 0)
                               : e.poisoned);
  return out;
}

ffi::Error PeerCall::Begin(const PeerOptions& options) {
  options_ = options;
  MOK_RETURN_IF_ERROR(env::Status());
  MOK_RETURN_IF_ERROR(GetDevice(device_, &device_info_));
  const std::string why = symmetric::Lookup(id_, device_, &view_);
  if (!why.empty()) return ffi::Error::Internal(StrCat("jax_mok peer transport: ", why));
  if (options_.sync_check) return ffi::Error::Success();
  // Deferred check: an error any earlier call left, on this workspace (which it poisons) or on
  // any other of this process (a rank whose partner failed must not go on as if nothing happened).
  MOK_RETURN_IF_ERROR(CheckErrorWord(false));
  const std::vector<std::string> pending = PendingErrors();
  if (pending.empty()) return ffi::Error::Success();
  return ffi::Error::Internal(
      StrCat("an earlier peer call failed (deferred check): ", pending[0],
             pending.size() > 1 ? " (and more: jax_mok.peer_errors())" : ""));
}

ffi::Error PeerCall::CheckErrorWord(bool sync) {
  const symmetric::View& v = view_;
  if (sync) MOK_CUDA_RETURN(cudaStreamSynchronize(stream_));
  if (sync && env::Get().cuda_debug_sync) {  // the epoch this rank has finished
    unsigned long long epoch = 0;
    MOK_CUDA_RETURN(cudaMemcpy(&epoch, v.local + offsetof(symmetric::Signal, epoch), sizeof(epoch),
                               cudaMemcpyDeviceToHost));
    std::fprintf(stderr, "jax_mok peer: workspace %lld rank %d device %d finished epoch %llu\n",
                 static_cast<long long>(id_), v.rank, static_cast<int>(device_), epoch);
  }
  const unsigned int code = *v.error_host;
  if (code == 0u) return ffi::Error::Success();
  const std::string message = DescribeErrorCode(code, v.rank, device_, id_, options_.timeout_ms);
  symmetric::Poison(id_, device_, message);
  return ffi::Error::Internal(message);
}

ffi::Error PeerCall::Poisoned(ffi::Error error) {
  if (error.failure())
    symmetric::Poison(id_, device_,
                      StrCat(error.message(),
                             " (after the exchange was counted: the host's count "
                             "and the device's epoch may differ)"));
  return error;
}

// Every field of `p`, to every destination (but me, unless `include_own`), into its slot in the
// area `area` of that rank: the copies run on the stream before the kernel, which then only
// signals, waits and reads.
ffi::Error PeerCall::PushWithCopyEngine(const Exchange& p, int64_t area, bool include_own) {
  const symmetric::View& v = view_;
  for (int fi = 0; fi < p.num_fields; ++fi) {
    const Field& f = p.field[fi];
    for (int d = 0; d < v.ep_size; ++d) {
      if (d == v.rank && !include_own) continue;
      char* dst = v.peer_base[d] + area + f.offset + static_cast<int64_t>(v.rank) * f.stride;
      MOK_CUDA_RETURN(cudaMemcpyAsync(dst, f.src + static_cast<int64_t>(d) * f.chunk_bytes,
                                      static_cast<size_t>(f.chunk_bytes), cudaMemcpyDeviceToDevice,
                                      stream_));
    }
  }
  return ffi::Error::Success();
}

namespace {

const char* StageName(int phase) {
  switch (phase) {
    case kCombine:
      return "peer combine";
    case kReverseDispatch:
      return "peer reverse dispatch";
    case kReverseCombine:
      return "peer reverse combine";
    default:
      return "peer dispatch";
  }
}

}  // namespace

ffi::Error PeerCall::Launch(const Exchange& p, ExchangeMode mode, ffi::DataType dtype) {
  // In-place mode with copy engines: the kernel only signals and waits, one CTA suffices.
  int64_t bytes_per_peer = 0;
  for (int fi = 0; fi < p.num_fields; ++fi) bytes_per_peer += Pad16(p.field[fi].chunk_bytes);
  if (mode == kReduce)  // the reduction reads every token's rows over all ranks
    bytes_per_peer = p.field[0].chunk_bytes > p.tokens * p.hidden * 4 ? p.field[0].chunk_bytes
                                                                      : p.tokens * p.hidden * 4;
  const int grid = mode == kInPlace && p.pushed
                       ? 1
                       : ExchangeGrid(bytes_per_peer, device_info_.sms, options_.ctas_per_sm);
  if (mode == kCopyOut)
    exchange_kernel<float, kCopyOut><<<grid, kThreads, 0, stream_>>>(p);
  else if (mode == kInPlace)
    exchange_kernel<float, kInPlace><<<grid, kThreads, 0, stream_>>>(p);
  else if (dtype == ffi::DataType::BF16)
    exchange_kernel<bf16, kReduce><<<grid, kThreads, 0, stream_>>>(p);
  else
    exchange_kernel<float, kReduce><<<grid, kThreads, 0, stream_>>>(p);
  return Stage(StageName(p.phase), cudaGetLastError(), stream_);
}

ffi::Error PeerCall::RunExchange(Exchange& p, ExchangeMode mode, ffi::DataType dtype) {
  const symmetric::View& v = view_;
  p.rank = v.rank, p.ep = v.ep_size, p.peers = v.peers;
  p.error = v.error_device;
  p.timeout_ns = static_cast<unsigned long long>(options_.timeout_ms) * 1000000ull;
  // Counted for every exchange, whatever its copy mode, so that the host's count always equals
  // the device's epoch: the copy engines need it for the half they store into, and the kernel
  // checks it (phase kEpochCheck) whichever mode this or any earlier call used.
  p.expected_epoch = symmetric::NextExchange(id_, device_);
  MOK_CHECK(p.expected_epoch > 0, "peer workspace ", id_, " is not set up on device ", device_);
  p.pushed = options_.copy_engine;
  if (p.pushed) {
    const int64_t area = p.area[p.expected_epoch & 1ull];
    // In-place mode stores my own chunk into my own slot as well; the other modes read it from
    // the operand (reduce) or copy it straight to the result (copy-out) below.
    MOK_RETURN_IF_ERROR(Poisoned(PushWithCopyEngine(p, area, mode == kInPlace)));
    if (mode == kCopyOut) {
      for (int fi = 0; fi < p.num_fields; ++fi) {
        const Field& f = p.field[fi];
        const int64_t at = static_cast<int64_t>(v.rank) * f.chunk_bytes;
        const cudaError_t err =
            cudaMemcpyAsync(f.dst + at, f.src + at, static_cast<size_t>(f.chunk_bytes),
                            cudaMemcpyDeviceToDevice, stream_);
        if (err != cudaSuccess)
          return Poisoned(ffi::Error::Internal(
              StrCat("jax_mok CUDA: copying my own chunk of an exchange failed: ",
                     cudaGetErrorString(err))));
      }
    }
  }
  return Poisoned(Launch(p, mode, dtype));
}

}  // namespace mok::cuda::ep
