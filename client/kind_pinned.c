/* SPDX-License-Identifier: Apache-2.0 */
/* The pinned host memory kind (kind.h; TB_MEMORY_CUDA_HOST): a host
 * buffer's sealed memfd, as kind_host.c makes and maps it, registered with
 * cuMemHostRegister by every process that maps it, so that copies between
 * it and a GPU run at DMA speed; its tensors are kDLCUDAHost.
 *
 * Each process pins its own mapping: the producer when it creates the
 * buffer (TB_BUFFER_PINNED, read-write), a consumer once per buffer when it
 * maps it into the mapping cache (read-only, with
 * CU_MEMHOSTREGISTER_READ_ONLY, unless it was granted write), and each
 * unregisters before it unmaps. Where no CUDA driver loads (or it finds no
 * device) the mapping stays plain host memory: the same pages, not a copy,
 * handed out as kDLCPU. A driver that loads and refuses the registration
 * is an error naming the kind, and nothing is mapped or created. The
 * registration itself is cuda/host_register.c's, which the host kind's
 * buffer creation calls too. */
#include "kind.h"

#include <stdlib.h>
#include <sys/mman.h>

#define KIND_TEXT "pinned host memory (cuda-host)"

/* ---- the kind's table (kind.h) ---- */

/* A consumer's mapping-cache entry of a pinned buffer. */
struct pinned_map {
  struct tb__map m;
  void *p;
  int pinned; /* registered here; 0: the no-driver fallback */
};

/* kind.h, publish: a kDLCUDAHost tensor, which must lie in a pinned
 * buffer of c (kDLCPU tensors of a pinned buffer come through the host
 * kind's publish, which publishes them as kDLCUDAHost too). */
static int pinned_publish(struct tb_client *c, const DLTensor *t,
                          uintptr_t start, uint64_t elem_bits, uint64_t flags,
                          void *stream, struct tb__kind_publish *out) {
  struct tb_buffer *b = tb__buffer_find(c, (const void *)start, 0);

  if (b != NULL && b->kind != TB_MEMORY_CUDA_HOST)
    return tb__set_error(c, TB_EDEVICE,
                         "a kDLCUDAHost tensor must lie in " KIND_TEXT
                         "; buffer %llu is plain host memory (create it with "
                         "TB_BUFFER_PINNED, or publish the tensor as kDLCPU)",
                         (unsigned long long)b->id);
  return tb__host_publish(c, t, start, elem_bits, flags, stream, out);
}

static int pinned_map(struct tb_client *c,
                      const Tensorbroker__V1__BufferInfo *bi, const int *fds,
                      int nfds, struct tb__map **out) {
  struct pinned_map *m;
  void *p;
  int rc;

  m = calloc(1, sizeof(*m));
  if (m == NULL)
    return TB_ENOMEM;
  rc = tb__host_mmap(c, bi, fds, nfds, &p);
  if (rc < 0)
    goto out_free;
  rc = tb__pinned_pin(c, p, (size_t)bi->size, bi->writable != 0,
                      bi->buffer_id, &m->pinned);
  if (rc < 0)
    goto out_unmap;
  m->m.buffer_id = bi->buffer_id;
  m->m.generation = bi->generation;
  m->m.ops = &tb__kind_pinned;
  m->m.writable = bi->writable != 0;
  m->m.size = (size_t)bi->size;
  m->p = p;
  *out = &m->m;
  return 0;

out_unmap:
  munmap(p, (size_t)bi->size);
out_free:
  free(m);
  return rc;
}

static void pinned_unmap(struct tb__map *m) {
  struct pinned_map *pm = (struct pinned_map *)m;

  if (pm->pinned)
    tb__pinned_unpin(pm->p);
  munmap(pm->p, m->size);
  free(pm);
}

static int pinned_acquire(struct tb_client *c, struct tb__map *m,
                          const Tensorbroker__V1__AcquireReply *ar,
                          const struct tb_acquire_options *o, void *state,
                          struct tb__kind_acq *out) {
  struct pinned_map *pm = (struct pinned_map *)m;

  (void)ar;
  /* the GPU may read pinned pages: the lease ends with a done event */
  if (pm->pinned) {
    int rc = tb__pinned_lease_begin(c, o->stream, state);
    if (rc < 0)
      return rc;
  }
  out->base = (uint64_t)(uintptr_t)pm->p;
  out->device.device_type = pm->pinned ? kDLCUDAHost : kDLCPU;
  out->device.device_id = 0;
  return 0;
}

const struct tb__kind_ops tb__kind_pinned = {
    .name = "cuda-host",
    .kind = TB_MEMORY_CUDA_HOST,
    .dl_device = kDLCUDAHost,
    .lease_state = TB__KIND_LEASE_STATE,
    .publish = pinned_publish,
    .done_wait = tb__pinned_done_wait,
    .map = pinned_map,
    .unmap = pinned_unmap,
    .acquire = pinned_acquire,
    .ready_wait = tb__pinned_lease_wait,
    .use_locked = tb__pinned_lease_use_locked,
    .done_record_locked = tb__pinned_lease_end_locked,
};
