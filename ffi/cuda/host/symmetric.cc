// Symmetric workspace: allocation, peer linking (peer access / CUDA IPC / fabric handles), and
// the registry the peer-transport handlers read. See symmetric.h and docs/peer-transport.md.
#include "cuda/host/symmetric.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "common/check.h"
#include "cuda/host/driver.h"

namespace mok::cuda::symmetric {
namespace {

[[noreturn]] void Fail(const std::string& message) {
  throw std::runtime_error("jax_mok peer memory: " + message);
}

void Cuda(cudaError_t err, const char* what, int ordinal) {
  if (err != cudaSuccess)
    Fail(StrCat(what, " on device ", ordinal, " failed: ", cudaGetErrorString(err)));
}

void Drv(CUresult res, const char* what, int ordinal) {
  if (res != CUDA_SUCCESS)
    Fail(StrCat(what, " on device ", ordinal, " failed: CUresult ", static_cast<int>(res)));
}

// Makes `ordinal` current for the scope (bootstrap runs on Python's thread).
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal) {
    Cuda(cudaGetDevice(&previous_), "cudaGetDevice", ordinal);
    if (previous_ != ordinal) Cuda(cudaSetDevice(ordinal), "cudaSetDevice", ordinal);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// One mapping of some rank's workspace, as seen from this device.
struct Mapping {
  char* base = nullptr;
  enum Kind { kNone, kOwn, kLocalPeer, kIpc, kFabric } kind = kNone;
  CUmemGenericAllocationHandle handle = 0;  // fabric: the imported or created allocation
  size_t size = 0;                          // fabric: mapped (granularity-rounded) size
};

struct Entry {
  int rank = -1, ep_size = 0, ordinal = -1;
  int64_t bytes = 0;
  Mapping own;
  std::vector<Mapping> peers;  // [ep_size], peers[rank] == own
  char** table = nullptr;      // device copy of the peer bases
  unsigned int* error_host = nullptr;
  unsigned int* error_device = nullptr;
  bool finalized = false;
  std::string poisoned;
  unsigned long long exchanges = 0;  // exchange launches issued (NextExchange)
};

std::mutex mu;
std::map<std::pair<int64_t, int>, std::unique_ptr<Entry>> registry;

Entry& Find(int64_t id, int ordinal) {
  auto it = registry.find({id, ordinal});
  if (it == registry.end())
    Fail(StrCat("workspace ", id, " has no allocation on device ", ordinal,
                " (call workspace_alloc first)"));
  return *it->second;
}

CUmemAllocationProp FabricProp(int ordinal) {
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
  return prop;
}

// Reserves an address range for `handle`, maps it and grants `ordinal` read/write access.
char* MapFabric(const Driver& d, CUmemGenericAllocationHandle handle, size_t size, int ordinal) {
  CUdeviceptr ptr = 0;
  Drv(d.reserve(&ptr, size, 0, 0, 0), "cuMemAddressReserve", ordinal);
  Drv(d.map(ptr, size, 0, handle, 0), "cuMemMap", ordinal);
  CUmemAccessDesc access;
  std::memset(&access, 0, sizeof(access));
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = ordinal;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  Drv(d.set_access(ptr, size, &access, 1), "cuMemSetAccess", ordinal);
  return reinterpret_cast<char*>(ptr);
}

void Release(const Mapping& m, int ordinal) {
  const Driver& d = GetDriver();
  switch (m.kind) {
    case Mapping::kIpc:
      cudaIpcCloseMemHandle(m.base);
      break;
    case Mapping::kFabric:
      if (d.ok) {
        d.unmap(reinterpret_cast<CUdeviceptr>(m.base), m.size);
        d.address_free(reinterpret_cast<CUdeviceptr>(m.base), m.size);
        d.release(m.handle);
      }
      break;
    case Mapping::kOwn:
      cudaFree(m.base);
      break;
    default:
      break;
  }
  (void)ordinal;
}

}  // namespace

std::string Lookup(int64_t id, int ordinal, View* view) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = registry.find({id, ordinal});
  if (it == registry.end())
    return StrCat("peer workspace ", id, " is not set up on device ", ordinal,
                  " (was jax_mok.workspace.reset() called after this program was compiled?)");
  const Entry& e = *it->second;
  if (!e.finalized) return StrCat("peer workspace ", id, " on device ", ordinal, " is not linked");
  if (!e.poisoned.empty()) return e.poisoned;
  view->rank = e.rank;
  view->ep_size = e.ep_size;
  view->bytes = e.bytes;
  view->local = e.own.base;
  view->peers = e.table;
  for (int r = 0; r < e.ep_size; ++r) view->peer_base[r] = e.peers[r].base;
  view->error_device = e.error_device;
  view->error_host = e.error_host;
  return "";
}

unsigned long long NextExchange(int64_t id, int ordinal) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = registry.find({id, ordinal});
  return it == registry.end() ? 0 : ++it->second->exchanges;
}

void Poison(int64_t id, int ordinal, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = registry.find({id, ordinal});
  if (it != registry.end() && it->second->poisoned.empty())
    it->second->poisoned = StrCat(message, " [workspace ", id,
                                  " is unusable now; jax_mok.workspace.reset() frees it]");
}

std::vector<ErrorState> Errors() {
  std::lock_guard<std::mutex> lock(mu);
  std::vector<ErrorState> out;
  for (const auto& [key, e] : registry) {
    const unsigned int code =
        e->error_host ? *static_cast<volatile unsigned int*>(e->error_host) : 0u;
    if (code == 0u && e->poisoned.empty()) continue;
    out.push_back(ErrorState{key.first, key.second, e->rank, code, e->poisoned});
  }
  return out;
}

bool CanAccessPeer(int a, int b) {
  int access = 0, atomics = 0;
  if (cudaDeviceCanAccessPeer(&access, a, b) != cudaSuccess) return false;
  if (cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, a, b) != cudaSuccess)
    return false;
  return access == 1 && atomics == 1;
}

void Alloc(int64_t id, int ordinal, int rank, int ep_size, int64_t bytes, bool fabric) {
  if (ep_size < 1 || ep_size > kMaxRanks)
    Fail(StrCat("ep_size must be in [1, ", kMaxRanks, "], got ", ep_size));
  if (rank < 0 || rank >= ep_size)
    Fail(StrCat("rank must be in [0, ep_size=", ep_size, "), got ", rank));
  if (bytes < kSignalBytes)
    Fail(StrCat("bytes must be >= ", kSignalBytes, " (the signal area), got ", bytes));
  std::lock_guard<std::mutex> lock(mu);
  if (registry.count({id, ordinal}))
    Fail(StrCat("workspace ", id, " is already allocated on device ", ordinal));
  DeviceGuard guard(ordinal);
  auto e = std::make_unique<Entry>();
  e->rank = rank, e->ep_size = ep_size, e->ordinal = ordinal, e->bytes = bytes;
  if (fabric) {
    const Driver& d = GetDriver();
    if (!d.ok) Fail("fabric handles requested but " + d.why);
    CUmemAllocationProp prop = FabricProp(ordinal);
    size_t granule = 0;
    Drv(d.granularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "cuMemGetAllocationGranularity", ordinal);
    const size_t size = (static_cast<size_t>(bytes) + granule - 1) / granule * granule;
    Drv(d.create(&e->own.handle, size, &prop, 0), "cuMemCreate(fabric)", ordinal);
    e->own.base = MapFabric(d, e->own.handle, size, ordinal);
    e->own.size = size;
    e->own.kind = Mapping::kFabric;
  } else {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (err != cudaSuccess)
      Fail(StrCat("cudaMalloc of the ", bytes, "-byte workspace on device ", ordinal,
                  " failed: ", cudaGetErrorString(err),
                  " (XLA preallocates XLA_PYTHON_CLIENT_MEM_FRACTION of the GPU; lower it)"));
    e->own.base = static_cast<char*>(p);
    e->own.kind = Mapping::kOwn;
  }
  Cuda(cudaMemset(e->own.base, 0, kSignalBytes), "cudaMemset(signal area)", ordinal);
  Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", ordinal);
  void* host = nullptr;
  Cuda(cudaHostAlloc(&host, 64, cudaHostAllocMapped | cudaHostAllocPortable),
       "cudaHostAlloc(error word)", ordinal);
  std::memset(host, 0, 64);
  e->error_host = static_cast<unsigned int*>(host);
  void* dev = nullptr;
  Cuda(cudaHostGetDevicePointer(&dev, host, 0), "cudaHostGetDevicePointer", ordinal);
  e->error_device = static_cast<unsigned int*>(dev);
  e->peers.resize(ep_size);
  e->peers[rank] = e->own;
  registry[{id, ordinal}] = std::move(e);
}

std::string Export(int64_t id, int ordinal) {
  std::lock_guard<std::mutex> lock(mu);
  Entry& e = Find(id, ordinal);
  DeviceGuard guard(ordinal);
  std::string out;
  if (e.own.kind == Mapping::kFabric) {
    CUmemFabricHandle handle;
    Drv(GetDriver().export_handle(&handle, e.own.handle, CU_MEM_HANDLE_TYPE_FABRIC, 0),
        "cuMemExportToShareableHandle(fabric)", ordinal);
    out.push_back('F');
    out.append(reinterpret_cast<const char*>(&handle), sizeof(handle));
  } else {
    cudaIpcMemHandle_t handle;
    Cuda(cudaIpcGetMemHandle(&handle, e.own.base), "cudaIpcGetMemHandle", ordinal);
    out.push_back('I');
    out.append(reinterpret_cast<const char*>(&handle), sizeof(handle));
  }
  const uint64_t size = e.own.kind == Mapping::kFabric ? e.own.size : e.bytes;
  out.append(reinterpret_cast<const char*>(&size), sizeof(size));
  return out;
}

void LinkLocal(int64_t id, int ordinal, int peer_rank, int peer_ordinal) {
  std::lock_guard<std::mutex> lock(mu);
  Entry& e = Find(id, ordinal);
  Entry& p = Find(id, peer_ordinal);
  if (p.rank != peer_rank || p.ep_size != e.ep_size || p.bytes != e.bytes)
    Fail(StrCat("device ", peer_ordinal, " holds rank ", p.rank, " of ", p.ep_size, " (", p.bytes,
                " B), expected rank ", peer_rank, " of ", e.ep_size, " (", e.bytes, " B)"));
  DeviceGuard guard(ordinal);
  if (p.own.kind == Mapping::kFabric) {
    CUmemAccessDesc access;
    std::memset(&access, 0, sizeof(access));
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = ordinal;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    Drv(GetDriver().set_access(reinterpret_cast<CUdeviceptr>(p.own.base), p.own.size, &access, 1),
        "cuMemSetAccess(peer)", ordinal);
  } else {
    const cudaError_t err = cudaDeviceEnablePeerAccess(peer_ordinal, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();  // clear the sticky-free "already enabled" status
    } else {
      Cuda(err, "cudaDeviceEnablePeerAccess", ordinal);
    }
  }
  Mapping m;
  m.base = p.own.base;
  m.kind = Mapping::kLocalPeer;
  e.peers[peer_rank] = m;
}

void OpenPeer(int64_t id, int ordinal, int peer_rank, const std::string& handle) {
  std::lock_guard<std::mutex> lock(mu);
  Entry& e = Find(id, ordinal);
  if (peer_rank < 0 || peer_rank >= e.ep_size || peer_rank == e.rank)
    Fail(StrCat("peer_rank must be in [0, ", e.ep_size, ") and not ", e.rank, ", got ", peer_rank));
  const size_t payload = handle.empty() ? 0 : handle.size() - 1 - sizeof(uint64_t);
  uint64_t size = 0;
  DeviceGuard guard(ordinal);
  Mapping m;
  if (!handle.empty() && handle[0] == 'I' && payload == sizeof(cudaIpcMemHandle_t)) {
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data() + 1, sizeof(h));
    std::memcpy(&size, handle.data() + 1 + sizeof(h), sizeof(size));
    void* p = nullptr;
    Cuda(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle",
         ordinal);
    m.base = static_cast<char*>(p);
    m.kind = Mapping::kIpc;
  } else if (!handle.empty() && handle[0] == 'F' && payload == sizeof(CUmemFabricHandle)) {
    const Driver& d = GetDriver();
    if (!d.ok) Fail("a peer exported a fabric handle but " + d.why);
    CUmemFabricHandle h;
    std::memcpy(&h, handle.data() + 1, sizeof(h));
    std::memcpy(&size, handle.data() + 1 + sizeof(h), sizeof(size));
    Drv(d.import_handle(&m.handle, &h, CU_MEM_HANDLE_TYPE_FABRIC),
        "cuMemImportFromShareableHandle(fabric)", ordinal);
    m.base = MapFabric(d, m.handle, size, ordinal);
    m.size = size;
    m.kind = Mapping::kFabric;
  } else {
    Fail(StrCat("peer handle of rank ", peer_rank, " is malformed (", handle.size(), " bytes)"));
  }
  if (m.kind == Mapping::kIpc && static_cast<int64_t>(size) != e.bytes)
    Fail(StrCat("rank ", peer_rank, " has a ", size, "-byte workspace, rank ", e.rank, " has ",
                e.bytes));
  e.peers[peer_rank] = m;
}

void Finalize(int64_t id, int ordinal) {
  std::lock_guard<std::mutex> lock(mu);
  Entry& e = Find(id, ordinal);
  std::vector<char*> bases(e.ep_size);
  for (int r = 0; r < e.ep_size; ++r) {
    if (e.peers[r].base == nullptr)
      Fail(StrCat("workspace ", id, " on device ", ordinal, ": rank ", r, " is not linked"));
    bases[r] = e.peers[r].base;
  }
  DeviceGuard guard(ordinal);
  if (e.table == nullptr) {
    void* t = nullptr;
    Cuda(cudaMalloc(&t, sizeof(char*) * kMaxRanks), "cudaMalloc(peer table)", ordinal);
    e.table = static_cast<char**>(t);
  }
  Cuda(cudaMemcpy(e.table, bases.data(), sizeof(char*) * e.ep_size, cudaMemcpyHostToDevice),
       "cudaMemcpy(peer table)", ordinal);
  e.finalized = true;
}

void FreeAll() {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [key, e] : registry) {  // no kernel may still be touching any mapping
    DeviceGuard guard(e->ordinal);
    cudaDeviceSynchronize();
  }
  for (auto& [key, e] : registry) {  // peers' mappings first, then the owners' memory
    DeviceGuard guard(e->ordinal);
    for (int r = 0; r < e->ep_size; ++r)
      if (r != e->rank) Release(e->peers[r], e->ordinal);
  }
  for (auto& [key, e] : registry) {
    DeviceGuard guard(e->ordinal);
    Release(e->own, e->ordinal);
    if (e->table) cudaFree(e->table);
    if (e->error_host) cudaFreeHost(e->error_host);
  }
  registry.clear();
}

std::pair<bool, std::string> FabricSupported(int ordinal) {
  const Driver& d = GetDriver();
  if (!d.ok) return {false, d.why};
  DeviceGuard guard(ordinal);
  if (cudaFree(nullptr) != cudaSuccess) return {false, "no CUDA context on this device"};
  CUdevice dev = 0;
  int supported = 0;
  if (d.device_get(&dev, ordinal) != CUDA_SUCCESS) return {false, "cuDeviceGet failed"};
  if (d.device_attribute(&supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev) !=
      CUDA_SUCCESS)
    return {false, "cuDeviceGetAttribute(HANDLE_TYPE_FABRIC_SUPPORTED) failed"};
  if (!supported) return {false, "the driver reports no fabric handle support on this device"};
  return {true, "fabric handles supported"};
}

}  // namespace mok::cuda::symmetric
