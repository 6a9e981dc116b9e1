/* SPDX-License-Identifier: Apache-2.0 */
/* Legacy CUDA IPC memory: locating the allocation behind a pointer,
 * exporting it (cuIpcGetMemHandle, remembered per process so that a consumer
 * in the producer's own process uses the pointer), opening and closing
 * another process's (cuda.h). */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensorbroker/tensorbroker.h>

#include "cuda.h"

/* ---- memory ------------------------------------------------------------- */

static int tb_ptr_ctx(const struct tb_cuda *cu, tb_cu_deviceptr p,
                      tb_cu_context *out) {
  tb_cu_context ctx = NULL;
  if (cu->cuPointerGetAttribute(&ctx, TB_CU_POINTER_ATTRIBUTE_CONTEXT, p) != 0)
    return -1;
  *out = ctx;
  return 0;
}

int tb__cuda_locate(const void *ptr, size_t len, struct tb__cuda_alloc *out,
                    char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb__cuda_alloc a;
  struct tb__cu_ctx_saved saved;
  tb_cu_deviceptr p = (tb_cu_deviceptr)(uintptr_t)ptr;
  tb_cu_context ctx = NULL;
  tb_cu_device dev;
  tb_cu_uuid uuid;
  unsigned memtype = 0;
  int ordinal = -1;
  tb_cu_result r;
  int rc;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  if (ptr == NULL) {
    tb__cu_why(why, whylen, "NULL data pointer");
    return TB_EINVAL;
  }
  r = cu->cuPointerGetAttribute(&memtype, TB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                p);
  if (r != 0) {
    tb__cu_why(why, whylen,
           "%p is not memory CUDA knows (cuPointerGetAttribute: %s)", ptr,
           tb__cuda_err_name(r));
    return TB_EDEVICE;
  }
  if (memtype != TB_CU_MEMORYTYPE_DEVICE) {
    tb__cu_why(why, whylen,
           "%p is CUDA memory of type %u, not device memory from "
           "cudaMalloc/cuMemAlloc",
           ptr, memtype);
    return TB_EDEVICE;
  }
  if (tb_ptr_ctx(cu, p, &ctx) != 0 ||
      cu->cuPointerGetAttribute(&ordinal,
                                TB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                p) != 0) {
    tb__cu_why(why, whylen, "cannot tell the context or device of %p", ptr);
    return TB_EDEVICE;
  }
  rc = tb__cu_ctx_enter(cu, ctx, &saved, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuMemGetAddressRange(&a.base, &a.size, p);
  tb__cu_ctx_leave(cu, &saved);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuMemGetAddressRange", r);
  if (len > a.size || p - a.base > a.size - len) {
    tb__cu_why(why, whylen,
           "tensor [%p, +%zu) leaves its allocation [0x%llx, +%zu)", ptr, len,
           a.base, a.size);
    return TB_ELAYOUT;
  }
  /* Tells a new allocation from a freed one at the same address and size;
   * a driver that cannot say leaves 0 (then only the size tells). */
  {
    unsigned long long id = 0;
    if (cu->cuPointerGetAttribute(&id, TB_CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                  p) == 0)
      a.alloc_id = id;
  }
  r = cu->cuDeviceGet(&dev, ordinal);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuDeviceGet", r);
  r = cu->cuDeviceGetUuid(&uuid, dev);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuDeviceGetUuid", r);
  a.device = ordinal;
  memcpy(a.uuid, uuid.bytes, sizeof a.uuid);
  *out = a;
  return 0;
}

int tb__cuda_alloc_alive(tb_cu_deviceptr base, uint64_t alloc_id) {
  const struct tb_cuda *cu;
  unsigned long long id = 0;

  if (tb__cuda_load(&cu) != 0)
    return 1; /* cannot tell: keep it */
  if (alloc_id != 0) /* a failed query: no allocation there any more */
    return cu->cuPointerGetAttribute(&id, TB_CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                     base) == 0 &&
           id == alloc_id;
  /* a driver without allocation ids (older than any we support): keep */
  return 1;
}

/* Allocations this process exported, so a same-process consumer can use the
 * pointer: cuIpcOpenMemHandle refuses one's own handles (measured: "invalid
 * device context"). A producer registers few allocations (the daemon caps
 * them per session), so a plain array searched linearly is enough. */
struct tb_export {
  tb_cu_deviceptr base;
  size_t size;
  uint8_t handle[64];
  unsigned refs;
};

static pthread_mutex_t tb_exports_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tb_export *tb_exports;
static size_t tb_exports_len, tb_exports_cap;

/* Call with tb_exports_lock held. */
static struct tb_export *tb_export_by_base(tb_cu_deviceptr base) {
  for (size_t i = 0; i < tb_exports_len; i++)
    if (tb_exports[i].base == base)
      return &tb_exports[i];
  return NULL;
}

static struct tb_export *tb_export_by_handle(const uint8_t handle[64]) {
  for (size_t i = 0; i < tb_exports_len; i++)
    if (memcmp(tb_exports[i].handle, handle, 64) == 0)
      return &tb_exports[i];
  return NULL;
}

int tb__cuda_export_mem(const struct tb__cuda_alloc *a, uint8_t handle[64],
                        char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb__cu_ctx_saved saved;
  tb_cu_ipc_mem_handle h;
  tb_cu_context ctx = NULL;
  struct tb_export *e;
  tb_cu_result r;
  int rc, mode;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  if (tb_ptr_ctx(cu, a->base, &ctx) != 0) {
    tb__cu_why(why, whylen, "0x%llx is no longer CUDA memory", a->base);
    return TB_EDEVICE;
  }
  rc = tb__cu_ctx_enter(cu, ctx, &saved, why, whylen);
  if (rc != 0)
    return rc;
  /* Always ask the driver: if the allocation was freed and another made at
   * the same address, its handle differs. */
  mode = tb__cu_relaxed_enter(cu);
  r = cu->cuIpcGetMemHandle(&h, a->base);
  tb__cu_relaxed_leave(cu, mode);
  tb__cu_ctx_leave(cu, &saved);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuIpcGetMemHandle", r);

  pthread_mutex_lock(&tb_exports_lock);
  e = tb_export_by_base(a->base);
  if (e == NULL) {
    if (tb_exports_len == tb_exports_cap) {
      size_t cap = tb_exports_cap ? tb_exports_cap * 2 : 16;
      struct tb_export *n = realloc(tb_exports, cap * sizeof *n);
      if (n == NULL) {
        pthread_mutex_unlock(&tb_exports_lock);
        tb__cu_why(why, whylen, "out of memory");
        return TB_ENOMEM;
      }
      tb_exports = n;
      tb_exports_cap = cap;
    }
    e = &tb_exports[tb_exports_len++];
    e->base = a->base;
    e->refs = 0;
  }
  e->size = a->size;
  memcpy(e->handle, h.reserved, 64);
  e->refs++;
  pthread_mutex_unlock(&tb_exports_lock);

  memcpy(handle, h.reserved, 64);
  return 0;
}

void tb__cuda_unexport_mem(tb_cu_deviceptr base) {
  pthread_mutex_lock(&tb_exports_lock);
  struct tb_export *e = tb_export_by_base(base);
  if (e != NULL && --e->refs == 0)
    *e = tb_exports[--tb_exports_len];
  pthread_mutex_unlock(&tb_exports_lock);
}

int tb__cuda_open_mem_here(const uint8_t handle[64], int owner, size_t size,
                           tb_cu_deviceptr *out, int *local, char *why,
                           size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_ipc_mem_handle h;
  tb_cu_deviceptr p = 0, base = 0;
  tb_cu_context cur = NULL, own_ctx = NULL;
  tb_cu_device cur_dev = -1;
  size_t mapped = 0;
  struct tb_export *e;
  tb_cu_result r;
  int rc, mode;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb__cu_need_ctx(cu, "mapping another process's CUDA memory", why, whylen);
  if (rc != 0)
    return rc;
  pthread_mutex_lock(&tb_exports_lock);
  e = tb_export_by_handle(handle);
  if (e != NULL) {
    base = e->base;
    mapped = e->size;
  }
  pthread_mutex_unlock(&tb_exports_lock);
  if (base != 0) {
    if (mapped < size) {
      tb__cu_why(why, whylen,
             "own allocation is %zu bytes, the buffer claims %zu", mapped,
             size);
      return TB_ELAYOUT;
    }
    /* Our own memory used from another device's context: IPC open is
     * refused in-process, so enable peer access to its context. */
    if (cu->cuCtxGetCurrent(&cur) != 0 || cu->cuCtxGetDevice(&cur_dev) != 0)
      return tb__cu_fail(why, whylen, "cuCtxGetDevice", TB_CUDA_ERROR_INVALID_CONTEXT);
    if (cur_dev != owner) {
      if (tb_ptr_ctx(cu, base, &own_ctx) != 0) {
        tb__cu_why(why, whylen, "0x%llx is no longer CUDA memory", base);
        return TB_EDEVICE;
      }
      mode = tb__cu_relaxed_enter(cu);
      r = cu->cuCtxEnablePeerAccess(own_ctx, 0);
      tb__cu_relaxed_leave(cu, mode);
      if (r != 0 && r != TB_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
        if (r == TB_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED) {
          tb__cu_why(why, whylen, "cuCtxEnablePeerAccess: %s: device %d cannot "
                 "reach device %d", tb__cuda_err_name(r), (int)cur_dev, owner);
          return TB_EDEVICE;
        }
        return tb__cu_fail(why, whylen, "cuCtxEnablePeerAccess", r);
      }
    }
    *out = base;
    *local = 1;
    return 0;
  }

  memcpy(h.reserved, handle, 64);
  mode = tb__cu_relaxed_enter(cu);
  r = cu->cuIpcOpenMemHandle(&p, h, TB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  tb__cu_relaxed_leave(cu, mode);
  if (r == TB_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED) {
    tb__cu_why(why, whylen, "cuIpcOpenMemHandle: %s: this device cannot map "
           "memory of the tensor's device", tb__cuda_err_name(r));
    return TB_EDEVICE;
  }
  if (r == TB_CUDA_ERROR_INVALID_HANDLE) {
    tb__cu_why(why, whylen, "cuIpcOpenMemHandle failed: %s (legacy IPC "
           "memory opens only in its producer's PID namespace, while it "
           "lives; cuda-vmm buffers cross both)", tb__cuda_err_name(r));
    return TB_ECUDA;
  }
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuIpcOpenMemHandle", r);
  r = cu->cuMemGetAddressRange(&base, &mapped, p);
  if (r != 0 || mapped < size) {
    if (r != 0)
      rc = tb__cu_fail(why, whylen, "cuMemGetAddressRange", r);
    else {
      tb__cu_why(why, whylen, "mapped allocation is %zu bytes, the buffer "
             "claims %zu", mapped, size);
      rc = TB_ELAYOUT;
    }
    mode = tb__cu_relaxed_enter(cu);
    cu->cuIpcCloseMemHandle(p);
    tb__cu_relaxed_leave(cu, mode);
    return rc;
  }
  *out = p;
  *local = 0;
  return 0;
}

int tb__cuda_close_mem_in(tb_cu_context ctx, tb_cu_deviceptr p) {
  const struct tb_cuda *cu;
  struct tb__cu_ctx_saved saved;
  tb_cu_result r;
  int own, mode;

  if (tb__cuda_load(&cu) != 0)
    return TB_ENOCUDA;
  pthread_mutex_lock(&tb_exports_lock);
  own = tb_export_by_base(p) != NULL;
  pthread_mutex_unlock(&tb_exports_lock);
  if (own)
    return 0;
  if (tb__cu_ctx_enter(cu, ctx, &saved, NULL, 0) != 0)
    return TB_ECUDA;
  mode = tb__cu_relaxed_enter(cu);
  r = cu->cuIpcCloseMemHandle(p);
  tb__cu_relaxed_leave(cu, mode);
  tb__cu_ctx_leave(cu, &saved);
  return r == 0 ? 0 : TB_ECUDA;
}
