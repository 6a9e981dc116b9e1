/* SPDX-License-Identifier: Apache-2.0 */
/* Registering a host mapping with CUDA (cuMemHostRegister) for the pinned
 * host memory kind (kind.h: tb__pinned_*): the producer's buffer
 * (kind_host.c, TB_BUFFER_PINNED) and a consumer's mapping
 * (kind_pinned.c). In a file of its own, below both, so that the host kind
 * and the pinned kind, which reuses the host kind's mmap and publish, do
 * not call each other. */
#include "../kind.h"

#include <stdio.h>
#include <unistd.h>

#include "cuda.h"

#define KIND_TEXT "pinned host memory (cuda-host)"

int tb__pinned_supported(struct tb_client *c) {
  if (c->features & TENSORBROKER__V1__FEATURE__FEATURE_CUDA_HOST)
    return 0;
  return tb__set_error(c, TB_ENOTSUP,
                       KIND_TEXT ": this daemon does not take pinned host "
                       "buffers (no FEATURE_CUDA_HOST: it is older than this "
                       "library); create the buffer without TB_BUFFER_PINNED");
}

/* The registered length: whole pages, as the mapping is. */
static size_t page_round(size_t size) {
  long pg = sysconf(_SC_PAGESIZE);
  size_t page = pg > 0 ? (size_t)pg : 4096;

  return size > SIZE_MAX - (page - 1) ? size : (size + page - 1) / page * page;
}

int tb__pinned_pin(struct tb_client *c, void *p, size_t size, int writable,
                   uint64_t buffer_id, int *pinned) {
  const struct tb_cuda *cu;
  struct tb__cuda_devctx d;
  unsigned flags = TB_CU_MEMHOSTREGISTER_PORTABLE |
                   TB_CU_MEMHOSTREGISTER_DEVICEMAP;
  char why[256] = "", name[32] = "";
  tb_cu_result r;
  int rc;

  *pinned = 0;
  if (tb__cu_get(&cu, why, sizeof(why)) == TB_ENOCUDA)
    return 0; /* the fallback: plain host memory, the same pages */
  if (!writable)
    flags |= TB_CU_MEMHOSTREGISTER_READ_ONLY;
  if (buffer_id != 0)
    snprintf(name, sizeof(name), " of buffer %llu",
             (unsigned long long)buffer_id);
  rc = tb__cuda_device_enter(0, &d, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, KIND_TEXT "%s: no CUDA context to register "
                         "it in: %s", name, why);
  r = cu->cuMemHostRegister(p, page_round(size), flags);
  tb__cuda_device_leave(&d);
  if (r != 0)
    return tb__set_error(c, TB_ECUDA,
                         KIND_TEXT "%s: cuMemHostRegister of %zu bytes%s "
                         "failed: %s; nothing was mapped",
                         name, size, writable ? "" : " (read-only)",
                         tb__cuda_err_name(r));
  *pinned = 1;
  return 0;
}

void tb__pinned_unpin(void *p) {
  const struct tb_cuda *cu;
  struct tb__cuda_devctx d;

  if (tb__cuda_load(&cu) != 0 ||
      tb__cuda_device_enter(0, &d, NULL, 0) != 0)
    return;
  (void)cu->cuMemHostUnregister(p);
  tb__cuda_device_leave(&d);
}

