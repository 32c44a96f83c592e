// Driver API entry points of the fabric-handle path, resolved at run time with
// cudaGetDriverEntryPointByVersion: there is no libcuda stub to link against on the build
// machine, and the module must import on machines without a driver. The fabric path has not run
// (fabric handles need an NVLink fabric across hosts, e.g. NVL72).
#pragma once

#include <cuda.h>

#include <string>

namespace mok::cuda::symmetric {

// The functions; `ok` is false (and `why` says which is missing) when any did not resolve.
struct Driver {
  bool ok = false;
  std::string why;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*,
                          CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*export_handle)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                            unsigned long long) = nullptr;
  CUresult (*import_handle)(CUmemGenericAllocationHandle*, void*,
                            CUmemAllocationHandleType) = nullptr;
};

// Resolved once per process.
const Driver& GetDriver();

}  // namespace mok::cuda::symmetric
