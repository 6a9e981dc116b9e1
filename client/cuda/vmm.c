/* SPDX-License-Identifier: Apache-2.0 */
/* The driver calls of CUDA VMM buffers (vmm.h): cuMemCreate with the POSIX
 * descriptor handle type, rounded up to the device's granularity, exported
 * once; imported by consumers, each mapping reserved, mapped and given
 * access once per buffer. */
#include "vmm.h"

#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include <tensorbroker/tensorbroker.h>

static void vmm_prop(int device, int exportable, tb_cu_mem_prop *p) {
  memset(p, 0, sizeof(*p));
  p->type = TB_CU_MEM_ALLOCATION_TYPE_PINNED;
  p->requested_handle_types =
      exportable ? TB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
  p->location.type = TB_CU_MEM_LOCATION_TYPE_DEVICE;
  p->location.id = device;
}

int tb__vmm_supported(int device, char *why, size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_device dev;
  tb_cu_result r;
  int v = 0, rc;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuDeviceGet(&dev, device);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuDeviceGet", r);
  r = cu->cuDeviceGetAttribute(
      &v, TB_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
      dev);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuDeviceGetAttribute", r);
  if (v == 0)
    tb__cu_why(why, whylen, "CUDA device %d cannot share VMM memory as POSIX "
               "file descriptors (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_"
               "DESCRIPTOR_SUPPORTED is 0)", device);
  return v != 0;
}

/* Reserve addresses for m->size, map m->handle there and set access. */
static int vmm_map(const struct tb_cuda *cu, struct tb__vmm_mem *m,
                   int writable, char *why, size_t whylen) {
  tb_cu_mem_access acc;
  tb_cu_result r;

  r = cu->cuMemAddressReserve(&m->va, m->size, 0, 0, 0);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuMemAddressReserve", r);
  r = cu->cuMemMap(m->va, m->size, 0, m->handle, 0);
  if (r != 0) {
    (void)cu->cuMemAddressFree(m->va, m->size);
    return tb__cu_fail(why, whylen, "cuMemMap", r);
  }
  memset(&acc, 0, sizeof(acc));
  acc.location.type = TB_CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = m->device;
  acc.flags = writable ? TB_CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                       : TB_CU_MEM_ACCESS_FLAGS_PROT_READ;
  r = cu->cuMemSetAccess(m->va, m->size, &acc, 1);
  /* Read-only is the consumer library's courtesy, not a wall (a process
   * that imports the descriptor itself can map it writable): where a
   * driver refuses read-only device mappings, map read-write rather than
   * fail (not yet seen on a GPU: docs/gpu-validation.md). */
  if (r != 0 && !writable) {
    acc.flags = TB_CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = cu->cuMemSetAccess(m->va, m->size, &acc, 1);
  }
  if (r != 0) {
    (void)cu->cuMemUnmap(m->va, m->size);
    (void)cu->cuMemAddressFree(m->va, m->size);
    return tb__cu_fail(why, whylen, "cuMemSetAccess", r);
  }
  return 0;
}

int tb__vmm_create(int device, size_t bytes, struct tb__vmm_mem *out,
                   char *why, size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_mem_prop prop;
  tb_cu_result r;
  size_t g = 0;
  int rc;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  vmm_prop(device, 1, &prop);
  r = cu->cuMemGetAllocationGranularity(&g, &prop,
                                        TB_CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuMemGetAllocationGranularity", r);
  if (g == 0 || bytes == 0 || bytes > SIZE_MAX - (g - 1)) {
    tb__cu_why(why, whylen, "cannot round %zu bytes up to the granularity "
               "%zu", bytes, g);
    return TB_EINVAL;
  }
  memset(out, 0, sizeof(*out));
  out->size = (bytes + g - 1) / g * g;
  out->device = device;
  r = cu->cuMemCreate(&out->handle, out->size, &prop, 0);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuMemCreate", r);
  rc = vmm_map(cu, out, 1, why, whylen);
  if (rc < 0)
    (void)cu->cuMemRelease(out->handle);
  return rc;
}

int tb__vmm_zero(const struct tb__vmm_mem *m, size_t offset, size_t n,
                 char *why, size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_result r;
  void *zeros;
  int rc;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  zeros = calloc(1, n);
  if (zeros == NULL)
    return TB_ENOMEM;
  r = cu->cuMemcpyHtoD(m->va + offset, zeros, n);
  free(zeros);
  return r == 0 ? 0 : tb__cu_fail(why, whylen, "cuMemcpyHtoD", r);
}

int tb__vmm_export(const struct tb__vmm_mem *m, int *fd, char *why,
                   size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_result r;
  int rc, out = -1;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuMemExportToShareableHandle(
      &out, m->handle, TB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuMemExportToShareableHandle", r);
  *fd = out;
  return 0;
}

int tb__vmm_import(int fd, size_t size, int device, int writable,
                   struct tb__vmm_mem *out, char *why, size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_result r;
  int rc;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  memset(out, 0, sizeof(*out));
  out->size = size;
  out->device = device;
  r = cu->cuMemImportFromShareableHandle(
      &out->handle, (void *)(intptr_t)fd,
      TB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuMemImportFromShareableHandle", r);
  rc = vmm_map(cu, out, writable, why, whylen);
  if (rc < 0)
    (void)cu->cuMemRelease(out->handle);
  return rc;
}

int tb__vmm_map_again(const struct tb__vmm_mem *m, tb_cu_deviceptr *va,
                      char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb__vmm_mem again = *m;
  int rc;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = vmm_map(cu, &again, 1, why, whylen);
  if (rc == 0)
    *va = again.va;
  return rc;
}

void tb__vmm_unmap_again(const struct tb__vmm_mem *m, tb_cu_deviceptr va) {
  const struct tb_cuda *cu;
  struct tb__cu_ctx_saved saved;
  char why[16];
  int entered, mode;

  if (va == 0 || tb__cu_get(&cu, why, sizeof(why)) != 0)
    return;
  entered = tb__cu_ctx_enter(cu, m->ctx, &saved, NULL, 0) == 0;
  mode = tb__cu_relaxed_enter(cu);
  (void)cu->cuMemUnmap(va, m->size);
  (void)cu->cuMemAddressFree(va, m->size);
  tb__cu_relaxed_leave(cu, mode);
  if (entered)
    tb__cu_ctx_leave(cu, &saved);
}

void tb__vmm_free(struct tb__vmm_mem *m) {
  const struct tb_cuda *cu;
  struct tb__cu_ctx_saved saved;
  char why[16];
  int entered, mode;

  if (m->handle == 0 || tb__cu_get(&cu, why, sizeof(why)) != 0)
    return;
  entered = tb__cu_ctx_enter(cu, m->ctx, &saved, NULL, 0) == 0;
  mode = tb__cu_relaxed_enter(cu);
  (void)cu->cuMemUnmap(m->va, m->size);
  (void)cu->cuMemAddressFree(m->va, m->size);
  (void)cu->cuMemRelease(m->handle);
  tb__cu_relaxed_leave(cu, mode);
  if (entered)
    tb__cu_ctx_leave(cu, &saved);
  m->handle = 0;
}
