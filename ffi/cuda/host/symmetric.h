// The symmetric workspace of the peer transport (docs/peer-transport.md): library-owned device
// memory with the same layout on every rank of an expert group, and a registry from (workspace
// id, device ordinal) to the rank's view (its base, the device table of peer bases, the error
// word). Host code only; the Python side drives it through _mok_cuda (jax_mok/workspace.py),
// which reads kSignalBytes, kMaxRanks and kAreas from _mok_cuda.workspace_constants().
// Peer access and CUDA IPC have run on 2 x H200; the fabric-handle path has not run (it needs an
// NVLink fabric across hosts).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mok::cuda::symmetric {

constexpr int kMaxRanks = 64;
constexpr int64_t kSignalBytes = 4096;
// After the signal area: kAreas data areas of EP regions each, one region = the largest
// (source, destination) chunk of any call (jax_mok/workspace.py: WorkspaceSpec.chunk_bytes).
// Areas 0 and 1: the staged calls' halves (alternating by epoch parity); area 2: the fused
// forward's dispatch rows, area 3: its combine rows (fixed, so that the GEMMs of the same call
// find the rows without reading the epoch). docs/peer-transport.md, "Symmetric workspace".
constexpr int kAreas = 4;
// Every field of a chunk starts on this many bytes inside an area (16-byte vector copies).
constexpr int64_t kFieldAlign = 16;

// Offset 0 of every rank's workspace. `arrival[s]` is written by rank s (remote release store);
// the rest is local to the rank.
struct Signal {
  unsigned long long epoch;        // last epoch this rank finished on this workspace
  unsigned int ticket_pushed;      // CTAs of the running call done storing into peers
  unsigned int ticket_done;        // CTAs of the running call done reading
  unsigned long long reserved[6];  // keeps arrival[] on its own 64-byte line
  unsigned long long arrival[kMaxRanks];
};
static_assert(sizeof(Signal) <= kSignalBytes, "the signal area must fit its 4096 bytes");

// What a handler needs for one (workspace, device).
struct View {
  int rank = -1;
  int ep_size = 0;
  int64_t bytes = 0;
  char* local = nullptr;                 // this rank's workspace
  char* const* peers = nullptr;          // device array [ep_size]: every rank's base (own at rank)
  char* peer_base[kMaxRanks] = {};       // the same bases, host copy (copy-engine pushes)
  unsigned int* error_device = nullptr;  // mapped pinned error word, device address
  volatile unsigned int* error_host = nullptr;
};

// Fills `view` for a handler; returns "" or the reason it cannot (unknown id, not finalized,
// poisoned by an earlier error).
std::string Lookup(int64_t id, int ordinal, View* view);
// The epoch the next exchange launch on (id, ordinal) will run (1, 2, ...): the host's count of
// launches. Every exchange launch counts, whatever its copy mode, so the count equals the
// device's epoch (each kernel checks it: phase kEpochCheck). The handlers are not captured into
// command buffers, so each handler call is one launch sequence.
unsigned long long NextExchange(int64_t id, int ordinal);
// Records that a call on (id, ordinal) failed: later calls fail at once with `message`.
void Poison(int64_t id, int ordinal, const std::string& message);

// A (workspace, device) with an error: the error word a kernel set (code != 0; read from the
// mapped pinned word without synchronizing, so a kernel still running may set it later) or the
// message of a call that failed on it (`poisoned`).
struct ErrorState {
  int64_t id = 0;
  int ordinal = -1;
  int rank = -1;
  unsigned int code = 0;
  std::string poisoned;
};
// Every registered (workspace, device) with an error, in (id, ordinal) order. Takes the registry
// lock, so it never reads a word that FreeAll is releasing.
std::vector<ErrorState> Errors();

// Bootstrap, called from Python (errors are thrown as std::runtime_error naming the values).
// Whether ordinals a and b can use each other's memory with native atomics (our NVLink test).
bool CanAccessPeer(int a, int b);
// Allocates `bytes` on `ordinal` for rank `rank` of `ep_size` (cudaMalloc, or cuMem* with a
// fabric handle when `fabric`), zeroes the signal area, maps the error word.
void Alloc(int64_t id, int ordinal, int rank, int ep_size, int64_t bytes, bool fabric);
// The shareable handle of (id, ordinal): 'I' + cudaIpcMemHandle_t, or 'F' + CUmemFabricHandle,
// then the size (8 bytes).
std::string Export(int64_t id, int ordinal);
// A peer in this process: enables peer access and records its raw base pointer.
void LinkLocal(int64_t id, int ordinal, int peer_rank, int peer_ordinal);
// A peer in another process: opens its exported handle on `ordinal`.
void OpenPeer(int64_t id, int ordinal, int peer_rank, const std::string& handle);
// Uploads the peer table to the device; every rank must be linked or opened by now.
void Finalize(int64_t id, int ordinal);
// Frees everything (unmaps opened peers first).
void FreeAll();
// Whether `ordinal` can export fabric handles, with the reason.
std::pair<bool, std::string> FabricSupported(int ordinal);

}  // namespace mok::cuda::symmetric
