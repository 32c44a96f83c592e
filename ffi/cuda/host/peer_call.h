// The choreography every peer-transport handler shares (docs/peer-transport.md), in call order:
//   Begin       the debugging switches, the call's attributes (PeerOptions), the device (made
//               current), the workspace's view; with the deferred check (sync_check = 0), the
//               error an earlier call on this workspace left in the error word;
//   RunExchange one exchange: the epoch counted on the host, the copy-engine push (copy_engine =
//               1) with my own chunk's copy, the grid, the exchange kernel's launch;
//   Finish      with sync_check = 1, synchronize and report this call's error word.
// A failure after an exchange was counted poisons the workspace: the host's count and the
// device's epoch may disagree from then on, and every rank must run the same sequence of calls.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/check.h"
#include "cuda/device/exchange.cuh"
#include "cuda/handlers/ep.h"
#include "cuda/host/device.h"
#include "cuda/host/symmetric.h"

namespace mok::cuda::ep {

// The peer attributes of a call (common/bindings.h: AppendPeerAttrs), validated.
struct PeerOptions {
  bool copy_engine = true;  // stores into the peers by copy engines (else by the kernel's SMs)
  bool sync_check = true;   // synchronize after the call (else: report at the next call)
  int64_t timeout_ms = 10000;
  int ctas_per_sm = 2;  // the exchange kernel's grid: at most this many CTAs per SM
};

// The grid of the calls without attributes (mok_home_sum).
constexpr int kDefaultCtasPerSm = 2;

ffi::Error ReadPeerOptions(int32_t copy_engine, int32_t sync_check, int64_t timeout_ms,
                           int32_t ctas_per_sm, PeerOptions* out);

// CTAs for a grid-stride pass over `bytes_per_peer` (16-byte vectors, kThreads per CTA), at most
// ctas_per_sm per SM so that every CTA of the grid is co-resident (exchange.cuh).
int ExchangeGrid(int64_t bytes_per_peer, int sms, int ctas_per_sm);

// The message of an error word's code (exchange.cuh: 1 + phase * 256 + peer) on (id, device);
// timeout_ms > 0 names the bound of the failed call.
std::string DescribeErrorCode(unsigned int code, int rank, int device, int64_t id,
                              int64_t timeout_ms);
// PendingErrors() (declared in handlers/ep.h for the Python module) lists symmetric::Errors()
// with these messages.

// `n` rounded up to the alignment of a field inside an area (symmetric::kFieldAlign = 16).
inline int64_t Pad16(int64_t n) {
  static_assert(symmetric::kFieldAlign == 16, "Pad16 pads to 16 bytes");
  return (n + 15) / 16 * 16;
}

// One region of a workspace (symmetric.h: kAreas areas of EP regions after the signal area).
inline int64_t RegionBytes(const symmetric::View& v) {
  return (v.bytes - symmetric::kSignalBytes) / (symmetric::kAreas * v.ep_size);
}

// Byte offset of data area `a` in every rank's workspace.
inline int64_t AreaOffset(const symmetric::View& v, int a) {
  return symmetric::kSignalBytes + a * v.ep_size * RegionBytes(v);
}

class PeerCall {
 public:
  PeerCall(cudaStream_t stream, int32_t device, int64_t workspace_id)
      : stream_(stream), device_(device), id_(workspace_id) {}

  ffi::Error Begin(const PeerOptions& options);

  // Runs exchange `p` (its fields, phase and areas set by the caller; the rest is filled here).
  // The staged calls use areas 0 / 1 by epoch parity (area[0] != area[1]); the fused calls one
  // fixed area (area[0] == area[1]).
  ffi::Error RunExchange(Exchange& p, ExchangeMode mode, ffi::DataType dtype);

  ffi::Error Finish() { return options_.sync_check ? CheckErrorWord(true) : ffi::Error::Success(); }

  const symmetric::View& view() const { return view_; }
  const DeviceInfo& device() const { return device_info_; }
  int64_t workspace_id() const { return id_; }

 private:
  // Reads the error word (after a stream sync when `sync`) and poisons the workspace on error.
  ffi::Error CheckErrorWord(bool sync);
  ffi::Error PushWithCopyEngine(const Exchange& p, int64_t area, bool include_own);
  ffi::Error Launch(const Exchange& p, ExchangeMode mode, ffi::DataType dtype);
  ffi::Error Poisoned(ffi::Error error);

  cudaStream_t stream_;
  int32_t device_;
  int64_t id_;
  PeerOptions options_;
  DeviceInfo device_info_;
  symmetric::View view_;
};

}  // namespace mok::cuda::ep
