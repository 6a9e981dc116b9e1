/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA VMM memory kind (kind.h): device memory made with cuMemCreate
 * and shared as a POSIX file descriptor that the daemon keeps, so that its
 * versions outlive their producer (docs/cuda.md, "VMM buffers").
 *
 * Producer: tb_buffer_create_cuda makes, maps and exports the memory once
 * and registers the descriptor (vmm.c makes the driver calls); a kDLCUDA
 * tensor inside such a buffer is published as this kind (owns). Consumer:
 * the descriptor the daemon attaches to the first AcquireReply of a buffer
 * is imported, reserved, mapped and given access once, into the mapping
 * cache; unmap undoes it when the daemon retires the buffer. Everything
 * else, readiness and done events, lease streams, copies across devices,
 * is the legacy IPC kind's (kind_ipc.h): a mapping is a struct
 * tb__cuda_map whose one view is the mapped address. */
#include "kind_ipc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utlist.h>

#include "cuda.h"
#include "vmm.h"

/* A producer's buffer. Where the device can write and wait on 64-bit words
 * from streams, its last bytes (from signal_offset, at least
 * TB__SIGNAL_AREA) are its signal area, outside the tensor bytes b.size
 * (signal.h; docs/cuda.md, "Signals"). */
struct vmm_buffer {
  struct tb_buffer b; /* b.ops = &tb__kind_cuda_vmm */
  struct tb__vmm_mem mem;
  uint8_t uuid[TB__UUID_SIZE];
  uint64_t signal_offset; /* 0: no signal area */
  struct tb__signal ready; /* word 0's writer */
};

/* The kind's state of a client: its buffers (call_lock held). */
struct vmm_client {
  struct tb_buffer *buffers;
};

/* A consumer's mapping. */
struct vmm_map {
  struct tb__cuda_map cm; /* first: the IPC kind's code sees this */
  struct tb__vmm_mem mem;
  struct tb__cuda_view view; /* the one view: mem.va on mem.device */
  tb_cu_deviceptr again; /* a read-write mapping for the done signal of a
                          * read-only one (0: none) */
};

#define C_VMM(c) ((struct vmm_client *)(c)->kind[TB_MEMORY_CUDA_VMM])

/* ---- producer ---- */

static int vmm_register(struct tb_client *c, struct vmm_buffer *vb, int fd,
                        unsigned flags) {
  Tensorbroker__V1__BufferRegister br = TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;

  dev.type = kDLCUDA;
  dev.id = vb->mem.device;
  dev.uuid.data = vb->uuid;
  dev.uuid.len = TB__UUID_SIZE;
  br.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_VMM_FD;
  br.size = vb->mem.size;
  br.device = &dev;
  br.consumers_may_write = (flags & TB_BUFFER_CONSUMERS_MAY_WRITE) != 0;
  br.signal_offset = vb->signal_offset;
  return tb__buffer_register(c, &br, fd, &vb->b.id);
}

/* Whether the daemon and the device can have a VMM buffer; why on c. */
static int vmm_create_check(struct tb_client *c, int device) {
  char why[256] = "";
  int rc;

  if (!(c->features & TENSORBROKER__V1__FEATURE__FEATURE_CUDA_VMM))
    return tb__set_error(c, TB_ENOTSUP,
                         "the daemon does not accept CUDA VMM buffers "
                         "(it predates them: no FEATURE_CUDA_VMM)");
  rc = tb__vmm_supported(device, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "cannot create a cuda-vmm buffer: %s", why);
  if (rc == 0)
    return tb__set_error(c, TB_ENOTSUP, "cannot create a cuda-vmm buffer: "
                         "%s", why);
  return 0;
}

static int vmm_client(struct tb_client *c, struct vmm_client **out) {
  if (C_VMM(c) == NULL) {
    c->kind[TB_MEMORY_CUDA_VMM] = calloc(1, sizeof(struct vmm_client));
    if (C_VMM(c) == NULL)
      return TB_ENOMEM;
  }
  *out = C_VMM(c);
  return 0;
}

/* The buffer made, exported and registered; call_lock held. */
static int vmm_create_locked(struct tb_client *c, size_t size, int device,
                             unsigned flags, struct vmm_buffer *vb) {
  struct tb__cuda_devctx dc;
  char why[256] = "";
  int rc, fd = -1;

  rc = tb__cuda_device_enter(device, &dc, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  rc = tb__cuda_device_uuid(device, vb->uuid, why, sizeof(why));
  /* the signal area after the tensor bytes, rounded to a page; the
   * allocation's rounding up to the granularity may make it larger */
  int signals = rc == 0 && tb__signal_supported(device);
  size_t want = size;
  if (signals && size <= SIZE_MAX - 2 * TB__SIGNAL_AREA)
    want = (size + TB__SIGNAL_AREA - 1) / TB__SIGNAL_AREA * TB__SIGNAL_AREA +
           TB__SIGNAL_AREA;
  else
    signals = 0;
  if (rc == 0)
    rc = tb__vmm_create(device, want, &vb->mem, why, sizeof(why));
  if (rc == 0 && signals) {
    vb->signal_offset = want - TB__SIGNAL_AREA;
    /* words start at 0 */
    rc = tb__vmm_zero(&vb->mem, vb->signal_offset,
                      vb->mem.size - vb->signal_offset, why, sizeof(why));
    if (rc < 0)
      tb__vmm_free(&vb->mem);
  }
  vb->mem.ctx = dc.ctx;
  if (rc < 0) {
    tb__cuda_device_leave(&dc);
    return tb__set_error(c, rc, "%s", why);
  }
  rc = tb__vmm_export(&vb->mem, &fd, why, sizeof(why));
  if (rc < 0)
    rc = tb__set_error(c, rc, "%s", why);
  else
    rc = vmm_register(c, vb, fd, flags);
  if (fd >= 0)
    close(fd); /* the daemon holds its own; the mapping keeps ours */
  if (rc < 0)
    tb__vmm_free(&vb->mem);
  tb__cuda_device_leave(&dc);
  return rc;
}

int tb_buffer_create_cuda(tb_client *c, size_t size, int device,
                          unsigned flags, tb_buffer **out) {
  struct vmm_client *vc = NULL;
  struct vmm_buffer *vb;
  int rc;

  if (c == NULL || out == NULL)
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  if (size == 0 || size > (size_t)INT64_MAX || device < 0 ||
      (flags & ~TB_BUFFER_CONSUMERS_MAY_WRITE) != 0) {
    rc = tb__set_error(c, TB_EINVAL, "cuda buffer: size must be > 0, "
                       "device >= 0; unknown flags %#x",
                       flags & ~TB_BUFFER_CONSUMERS_MAY_WRITE);
    goto out_unlock;
  }
  rc = vmm_create_check(c, device);
  if (rc == 0)
    rc = vmm_client(c, &vc);
  if (rc < 0)
    goto out_unlock;
  vb = calloc(1, sizeof(*vb));
  if (vb == NULL) {
    rc = TB_ENOMEM;
    goto out_unlock;
  }
  rc = vmm_create_locked(c, size, device, flags, vb);
  if (rc < 0) {
    free(vb);
    goto out_unlock;
  }
  vb->b.c = c;
  vb->b.ops = &tb__kind_cuda_vmm;
  vb->b.kind = TB_MEMORY_CUDA_VMM;
  vb->b.data = (void *)(uintptr_t)vb->mem.va;
  vb->b.size = vb->signal_offset != 0 ? vb->signal_offset : vb->mem.size;
  DL_APPEND(vc->buffers, &vb->b);
  *out = &vb->b;
out_unlock:
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

/* kind.h, buffer_destroy: unregistered (consumers and the daemon keep the
 * memory while they hold it), then unmapped and released here. */
static int vmm_buffer_destroy(struct tb_client *c, struct tb_buffer *b) {
  struct vmm_buffer *vb = (struct vmm_buffer *)b;
  int rc = tb__buffer_unregister(c, b->id);

  DL_DELETE(C_VMM(c)->buffers, b);
  tb__vmm_free(&vb->mem);
  free(vb);
  return rc;
}

static struct vmm_buffer *vmm_find(struct tb_client *c, uintptr_t start) {
  struct tb_buffer *b;

  if (C_VMM(c) == NULL)
    return NULL;
  DL_FOREACH(C_VMM(c)->buffers, b) {
    uintptr_t lo = (uintptr_t)b->data;
    if (start >= lo && start - lo < b->size)
      return (struct vmm_buffer *)b;
  }
  return NULL;
}

static int vmm_owns(struct tb_client *c, uintptr_t start) {
  return vmm_find(c, start) != NULL;
}

/* c's VMM buffer of daemon id buffer_id, or NULL. */
static struct vmm_buffer *vmm_by_id(struct tb_client *c, uint64_t buffer_id) {
  struct tb_buffer *b;

  if (C_VMM(c) == NULL)
    return NULL;
  DL_FOREACH(C_VMM(c)->buffers, b) {
    if (b->id == buffer_id)
      return (struct vmm_buffer *)b;
  }
  return NULL;
}

static int vmm_has_buffer(struct tb_client *c, uint64_t buffer_id) {
  return vmm_by_id(c, buffer_id) != NULL;
}

/* kind.h, publish: the buffer holding start (owns found it), the ready
 * event recorded as for legacy IPC. */
static int vmm_publish(struct tb_client *c, const DLTensor *t,
                       uintptr_t start, uint64_t elem_bits, uint64_t flags,
                       void *stream, struct tb__kind_publish *out) {
  struct vmm_buffer *vb = vmm_find(c, start);
  int rc;

  if (vb == NULL)
    return tb__set_error(c, TB_EINVAL, "tensor is not in a cuda-vmm buffer");
  rc = tb__tensor_fits(c, t, elem_bits, flags, start, (uintptr_t)vb->b.data,
                       vb->b.size, "buffer");
  if (rc < 0)
    return rc;
  return tb__ci_publish_ready(
      c, stream, vb->mem.device, vb->uuid, vb->b.id,
      (uint64_t)(start - (uintptr_t)vb->b.data),
      vb->signal_offset != 0 ? &vb->ready : NULL,
      vb->mem.va + vb->signal_offset, out);
}

/* tb__signal_word_fn: the word of done slot slot of c's buffer. */
static int signal_word(struct tb_client *c, uint64_t buffer_id, uint32_t slot,
                       tb_cu_deviceptr *word, char *why, size_t whylen) {
  struct vmm_buffer *vb = vmm_by_id(c, buffer_id);

  if (vb == NULL)
    return 1;
  if (vb->signal_offset == 0 || slot == 0 ||
      (uint64_t)slot >= (vb->mem.size - vb->signal_offset) / 8) {
    snprintf(why, whylen, "the daemon named done slot %u of buffer %llu, "
             "which has no such slot", (unsigned)slot,
             (unsigned long long)buffer_id);
    return TB_EPROTO;
  }
  *word = vb->mem.va + vb->signal_offset + 8ull * slot;
  return 0;
}

/* kind.h, done_wait: the consumers' done events, and the done signals of
 * those the events do not reach (docs/cuda.md, "Signals"). */
static int vmm_done_wait(struct tb_client *c, const struct tb__freed *f,
                         void *stream) {
  return tb__cuda_wait_done_signals(c, f, stream, signal_word);
}

/* ---- consumer ---- */

/* A device other than the memory's: not mapped there (peer access to VMM
 * memory is cuMemSetAccess for that device, not done yet). */
static int vmm_view_open(struct tb__cuda_map *m, int dev, tb_cu_deviceptr *p,
                         int *local, char *why, size_t whylen) {
  (void)p;
  (void)local;
  snprintf(why, whylen, "it is mapped for its own device (%d) only, not "
           "for device %d; pass TB_ACQUIRE_COPY_TO_DEVICE with opts.device "
           "to copy it", m->device, dev);
  return TB_EDEVICE;
}

/* tb__cuda_map.signal_rw_open: the signal area of a read-only mapping,
 * mapped a second time read-write (access is set per mapping, not per
 * byte; the tensor's bytes stay read-only where they are read). */
static int vmm_signal_rw_open(struct tb__cuda_map *m, char *why,
                              size_t whylen) {
  struct vmm_map *vm = (struct vmm_map *)m;
  int rc;

  if (vm->again == 0) {
    struct tb__cuda_devctx dc;
    rc = tb__cuda_device_enter(vm->mem.device, &dc, why, whylen);
    if (rc < 0)
      return rc;
    rc = tb__vmm_map_again(&vm->mem, &vm->again, why, whylen);
    tb__cuda_device_leave(&dc);
    if (rc < 0)
      return rc;
  }
  m->signal_rw = vm->again + (m->signal - vm->mem.va);
  return 0;
}

/* kind.h, map: import the descriptor the daemon attached, on the memory's
 * device; a consumer that cannot is told which kind it cannot map. */
static int vmm_map(struct tb_client *c, const Tensorbroker__V1__BufferInfo *bi,
                   const int *fds, int nfds, struct tb__map **out) {
  struct tb__cuda_devctx dc;
  struct vmm_map *vm;
  char why[256] = "";
  int rc, ordinal;

  if (nfds != 1 || bi->device == NULL ||
      bi->device->uuid.len != TB__UUID_SIZE || bi->size == 0 ||
      bi->size > SIZE_MAX)
    return tb__set_error(c, TB_EPROTO, "cuda-vmm buffer without its "
                         "descriptor or device uuid");
  if (bi->signal_offset != 0 &&
      (bi->signal_offset % 8 != 0 || bi->signal_offset >= bi->size ||
       bi->size - bi->signal_offset < 16))
    return tb__set_error(c, TB_EPROTO, "cuda-vmm buffer with a bad signal "
                         "area (from byte %llu of %llu)",
                         (unsigned long long)bi->signal_offset,
                         (unsigned long long)bi->size);
  rc = tb__cuda_find_uuid(bi->device->uuid.data, &ordinal, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "cannot map a cuda-vmm buffer: %s", why);
  rc = tb__vmm_supported(ordinal, why, sizeof(why));
  if (rc <= 0)
    return tb__set_error(c, rc < 0 ? rc : TB_ENOTSUP,
                         "cannot map a cuda-vmm buffer: %s", why);
  vm = calloc(1, sizeof(*vm));
  if (vm == NULL)
    return TB_ENOMEM;
  rc = tb__cuda_device_enter(ordinal, &dc, why, sizeof(why));
  if (rc == 0) {
    rc = tb__vmm_import(fds[0], (size_t)bi->size, ordinal, bi->writable != 0,
                        &vm->mem, why, sizeof(why));
    vm->mem.ctx = dc.ctx;
    vm->view.ctx = dc.ctx;
    tb__cuda_device_leave(&dc);
  }
  if (rc < 0) {
    free(vm);
    return tb__set_error(c, rc, "cannot map a cuda-vmm buffer: %s", why);
  }
  vm->cm.m.buffer_id = bi->buffer_id;
  vm->cm.m.generation = bi->generation;
  vm->cm.m.ops = &tb__kind_cuda_vmm;
  vm->cm.m.writable = bi->writable != 0;
  vm->cm.m.size = (size_t)bi->size;
  vm->cm.device = ordinal;
  memcpy(vm->cm.uuid, bi->device->uuid.data, TB__UUID_SIZE);
  vm->cm.view_open = vmm_view_open;
  vm->view.device = ordinal;
  vm->view.p = vm->mem.va;
  vm->view.local = 1; /* not an IPC mapping: unmap frees it */
  vm->cm.views = &vm->view;
  if (bi->signal_offset != 0) {
    vm->cm.signal = vm->mem.va + bi->signal_offset;
    vm->cm.signal_bytes = bi->size - bi->signal_offset;
    if (bi->writable)
      vm->cm.signal_rw = vm->cm.signal;
    vm->cm.signal_rw_open = vmm_signal_rw_open;
  }
  *out = &vm->cm.m;
  return 0;
}

static void vmm_unmap(struct tb__map *m) {
  struct vmm_map *vm = (struct vmm_map *)m;

  if (vm->again != 0)
    tb__vmm_unmap_again(&vm->mem, vm->again);
  tb__vmm_free(&vm->mem);
  free(vm);
}

/* ---- a connection's life ---- */

static void vmm_client_free(struct tb_client *c) {
  struct vmm_client *vc = C_VMM(c);
  struct tb_buffer *b, *tmp;

  if (vc == NULL)
    return;
  /* buffers not destroyed by the application go with the client; the
   * daemon already dropped their registrations with the session */
  DL_FOREACH_SAFE(vc->buffers, b, tmp) {
    DL_DELETE(vc->buffers, b);
    tb__vmm_free(&((struct vmm_buffer *)b)->mem);
    free(b);
  }
  free(vc);
  c->kind[TB_MEMORY_CUDA_VMM] = NULL;
}

const struct tb__kind_ops tb__kind_cuda_vmm = {
    .name = "cuda-vmm",
    .kind = TB_MEMORY_CUDA_VMM,
    .dl_device = kDLCUDA,
    .lease_state = sizeof(struct tb__cuda_lease),
    .owns = vmm_owns,
    .has_buffer = vmm_has_buffer,
    .buffer_destroy = vmm_buffer_destroy,
    .publish = vmm_publish,
    .done_wait = vmm_done_wait,
    .map = vmm_map,
    .unmap = vmm_unmap,
    .acquire = tb__ci_kind_acquire,
    .ready_wait = tb__ci_kind_ready_wait,
    .use_locked = tb__ci_kind_use_locked,
    .done_record_locked = tb__ci_kind_done_record_locked,
    .copy_free = tb__ci_kind_copy_free,
    .client_free = vmm_client_free,
};
