// See driver.h.
#include "cuda/host/driver.h"

#include <cuda_runtime.h>

#include <type_traits>

#include "common/check.h"

namespace mok::cuda::symmetric {

const Driver& GetDriver() {
  static const Driver driver = [] {
    Driver d;
    bool all = true;
    auto get = [&](const char* name, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
      const cudaError_t err =
          cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found);
      if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
        if (d.why.empty()) d.why = StrCat("driver entry point ", name, " is not available");
        all = false;
        return;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    get("cuDeviceGet", d.device_get);
    get("cuDeviceGetAttribute", d.device_attribute);
    get("cuMemGetAllocationGranularity", d.granularity);
    get("cuMemCreate", d.create);
    get("cuMemRelease", d.release);
    get("cuMemAddressReserve", d.reserve);
    get("cuMemAddressFree", d.address_free);
    get("cuMemMap", d.map);
    get("cuMemUnmap", d.unmap);
    get("cuMemSetAccess", d.set_access);
    get("cuMemExportToShareableHandle", d.export_handle);
    get("cuMemImportFromShareableHandle", d.import_handle);
    d.ok = all;
    return d;
  }();
  return driver;
}

}  // namespace mok::cuda::symmetric
