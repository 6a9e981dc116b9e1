/* SPDX-License-Identifier: Apache-2.0 */
/* The examples' CUDA driver loader: dlopen("libcuda.so.1") and dlsym of
 * the versioned names (see cuda_loader.h). */
#include "cuda_loader.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* cuDevicePrimaryCtxRetain and the rest return CUresult; this names a
 * failed call's result for a message. */
const char *cudl_error_name(const struct cudl *cu, cudl_result err) {
  const char *name = NULL;

  if (cu == NULL || cu->get_error_name == NULL ||
      cu->get_error_name(err, &name) != CUDL_SUCCESS || name == NULL)
    return "unknown CUDA error";
  return name;
}

/* dlsym() gives an object pointer; POSIX guarantees it converts to the
 * function pointer type of the member it is stored in. */
#define RESOLVE(api, member, sym)                                           \
  do {                                                                      \
    void *p_ = dlsym((api).lib, sym);                                       \
    if (p_ == NULL) {                                                       \
      snprintf(why, len, "libcuda.so.1 has no %s (a CUDA 12 driver or "    \
               "newer is needed)", sym);                                    \
      goto out_close_lib;                                                   \
    }                                                                       \
    (api).member = (__typeof__((api).member))p_;                            \
  } while (0)

#define CALL_OR_FAIL(api, what, call)                                       \
  do {                                                                      \
    cudl_result r_ = (call);                                                \
    if (r_ != CUDL_SUCCESS) {                                               \
      snprintf(why, len, "%s: %s (%d)", what, cudl_error_name(&(api), r_), \
               r_);                                                         \
      goto out_initialised;                                                 \
    }                                                                       \
  } while (0)

int cudl_open(struct cudl *cu, int device, char *why, size_t len) {
  struct cudl api;
  cudl_result r;
  int count = 0;

  memset(&api, 0, sizeof(api));
  api.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (api.lib == NULL) {
    const char *e = dlerror();
    snprintf(why, len, "%s", e ? e : "libcuda.so.1: cannot be loaded");
    return -1;
  }
  RESOLVE(api, get_error_name, "cuGetErrorName");
  RESOLVE(api, init, "cuInit");
  RESOLVE(api, device_get_count, "cuDeviceGetCount");
  RESOLVE(api, device_get, "cuDeviceGet");
  RESOLVE(api, primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  RESOLVE(api, primary_ctx_release, "cuDevicePrimaryCtxRelease_v2");
  RESOLVE(api, ctx_set_current, "cuCtxSetCurrent");
  RESOLVE(api, stream_create, "cuStreamCreate");
  RESOLVE(api, stream_synchronize, "cuStreamSynchronize");
  RESOLVE(api, stream_destroy, "cuStreamDestroy_v2");
  RESOLVE(api, mem_alloc, "cuMemAlloc_v2");
  RESOLVE(api, mem_free, "cuMemFree_v2");
  RESOLVE(api, memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
  RESOLVE(api, memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2");

  CALL_OR_FAIL(api, "cuInit", api.init(0));
  CALL_OR_FAIL(api, "cuDeviceGetCount", api.device_get_count(&count));
  if (count <= 0) {
    snprintf(why, len, "the CUDA driver sees no device");
    goto out_initialised;
  }
  if (device < 0 || device >= count) {
    snprintf(why, len, "CUDA device %d not visible (%d device%s)", device,
             count, count == 1 ? "" : "s");
    goto out_initialised;
  }
  CALL_OR_FAIL(api, "cuDeviceGet", api.device_get(&api.device, device));
  CALL_OR_FAIL(api, "cuDevicePrimaryCtxRetain",
               api.primary_ctx_retain(&api.ctx, api.device));
  r = api.ctx_set_current(api.ctx);
  if (r != CUDL_SUCCESS) {
    snprintf(why, len, "cuCtxSetCurrent: %s (%d)", cudl_error_name(&api, r),
             r);
    goto out_release_ctx;
  }
  *cu = api;
  return 0;

out_release_ctx:
  api.primary_ctx_release(api.device);
out_initialised:
  /* cuInit ran: the driver stays loaded (see cudl_close). */
  return -1;
out_close_lib:
  dlclose(api.lib);
  return -1;
}

void cudl_close(struct cudl *cu) {
  if (cu == NULL || cu->lib == NULL)
    return;
  cu->ctx_set_current(NULL);
  cu->primary_ctx_release(cu->device);
  cu->lib = NULL;
  cu->ctx = NULL;
}
