/* SPDX-License-Identifier: Apache-2.0 */
/* The host memory kind (kind.h): a producer's buffer is a sealed memfd,
 * mapped read-write here and registered with the daemon (which keeps a dup,
 * so the bytes outlive us); a consumer maps the memfd the daemon attaches,
 * read-only unless the producer granted writes. Host memory is ready when
 * published: no events, no streams. */
#include "kind.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <utlist.h>

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1; older C libraries lack it */
#endif

static int register_memfd(struct tb_client *c, int fd, size_t size,
                          unsigned flags, uint64_t *id) {
  Tensorbroker__V1__BufferRegister br = TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;
  int pinned = (flags & TB_BUFFER_PINNED) != 0;

  dev.type = pinned ? kDLCUDAHost : kDLCPU;
  br.kind = pinned ? TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_HOST
                   : TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
  br.size = size;
  br.device = &dev;
  br.consumers_may_write = (flags & TB_BUFFER_CONSUMERS_MAY_WRITE) != 0;
  return tb__buffer_register(c, &br, fd, id);
}

/* Seal fd, which this process has mapped read-write already. Shrinking
 * and growing are sealed so that no one (producer included) can change the
 * size under a consumer's mapping: a SIGBUS on read is not an error we can
 * report. Unless consumers may write, F_SEAL_FUTURE_WRITE too: from now on
 * the kernel refuses every new writable shared mapping, write() and hole
 * punch on this inode, through any descriptor (a consumer's re-open through
 * /proc included), and read-only mappings made from now on cannot be
 * mprotect()ed writable; our own mapping, made before, stays writable. The
 * daemon refuses a read-only buffer without these seals
 * (docs/memory-access.md). */
static int seal_memfd(struct tb_client *c, int fd, unsigned flags) {
  int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  struct utsname u;

  if (!(flags & TB_BUFFER_CONSUMERS_MAY_WRITE))
    seals |= F_SEAL_FUTURE_WRITE;
  if (fcntl(fd, F_ADD_SEALS, seals) == 0)
    return 0;
  if (errno == EINVAL && (seals & F_SEAL_FUTURE_WRITE)) {
    /* kernels before 5.1 refuse seal bits they do not know with EINVAL */
    if (uname(&u) < 0)
      snprintf(u.release, sizeof(u.release), "unknown");
    return tb__set_error(c, TB_ENOTSUP,
                         "read-only host buffers need Linux 5.1 or newer "
                         "(F_SEAL_FUTURE_WRITE); this kernel is %s "
                         "(TB_BUFFER_CONSUMERS_MAY_WRITE buffers need no "
                         "such seal, and consumers may write them)",
                         u.release);
  }
  return tb__set_error(c, TB_ESYS, "F_ADD_SEALS: %s", strerror(errno));
}

#define KNOWN_FLAGS (TB_BUFFER_CONSUMERS_MAY_WRITE | TB_BUFFER_PINNED)

int tb_host_buffer_create(tb_client *c, size_t size, unsigned flags,
                          tb_buffer **out) {
  struct tb_buffer *b;
  void *p;
  int fd, rc, pinned = 0;

  if (c == NULL || out == NULL)
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  if (size == 0 || size > (size_t)INT64_MAX || (flags & ~KNOWN_FLAGS) != 0) {
    rc = tb__set_error(c, TB_EINVAL, "buffer size must be > 0; unknown flags %#x",
                       flags & ~KNOWN_FLAGS);
    goto out_unlock;
  }
  if (flags & TB_BUFFER_PINNED) {
    rc = tb__pinned_supported(c);
    if (rc < 0)
      goto out_unlock;
  }
  b = calloc(1, sizeof(*b));
  if (b == NULL) {
    rc = TB_ENOMEM;
    goto out_unlock;
  }
  fd = memfd_create("tensorbroker", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    rc = tb__set_error(c, TB_ESYS, "memfd_create: %s", strerror(errno));
    goto out_free;
  }
  if (ftruncate(fd, (off_t)size) < 0) {
    rc = tb__set_error(c, errno == ENOMEM || errno == ENOSPC ? TB_ENOMEM : TB_ESYS,
                       "ftruncate(%zu): %s", size, strerror(errno));
    goto out_close;
  }
  /* mapped before sealing: F_SEAL_FUTURE_WRITE spares only mappings that
   * exist when it is added */
  p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    rc = tb__set_error(c, TB_ENOMEM, "mmap(%zu): %s", size, strerror(errno));
    goto out_close;
  }
  /* pinned before anything is registered: a driver that refuses leaves
   * the daemon untouched */
  if (flags & TB_BUFFER_PINNED) {
    rc = tb__pinned_pin(c, p, size, 1, 0, &pinned);
    if (rc < 0)
      goto out_unmap;
  }
  rc = seal_memfd(c, fd, flags);
  if (rc < 0)
    goto out_unpin;
  rc = register_memfd(c, fd, size, flags, &b->id);
  if (rc < 0)
    goto out_unpin;
  /* No seal stops a consumer re-opening a buffer consumers may write
   * read-write through /proc/self/fd; owner-only, one of another uid that
   * the daemon's rules do not grant write cannot (docs/memory-access.md).
   * After the registration, at which the daemon (perhaps of another uid)
   * made its read-only description, and before anything is published from
   * the buffer. Best effort: the memfd is ours, so it fails only where
   * fchmod is forbidden, and the daemon then warns. */
  if (flags & TB_BUFFER_CONSUMERS_MAY_WRITE)
    (void)fchmod(fd, 0600);
  close(fd); /* the mapping and the daemon's dup keep the memory */
  b->c = c;
  b->data = p;
  b->size = size;
  b->kind = flags & TB_BUFFER_PINNED ? TB_MEMORY_CUDA_HOST : TB_MEMORY_HOST;
  b->pinned = pinned;
  DL_APPEND(c->buffers, b);
  *out = b;
  pthread_mutex_unlock(&c->call_lock);
  return 0;

out_unpin:
  if (pinned)
    tb__pinned_unpin(p);
out_unmap:
  munmap(p, size);
out_close:
  close(fd);
out_free:
  free(b);
out_unlock:
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

void *tb_buffer_data(const tb_buffer *b) { return b ? b->data : NULL; }

size_t tb_buffer_size(const tb_buffer *b) { return b ? b->size : 0; }

uint64_t tb_buffer_id(const tb_buffer *b) { return b ? b->id : 0; }

int tb_buffer_pinned(const tb_buffer *b) { return b ? b->pinned : 0; }

/* Undo b's local mapping: unpinned first, as CUDA wants a registered range
 * unregistered before it is unmapped. */
static void buffer_unmap(struct tb_buffer *b) {
  if (b->pinned)
    tb__pinned_unpin(b->data);
  munmap(b->data, b->size);
}

int tb__buffer_destroy(struct tb_client *c, struct tb_buffer *b) {
  int rc;

  if (b->ops != NULL)
    return b->ops->buffer_destroy(c, b);
  rc = tb__buffer_unregister(c, b->id);
  DL_DELETE(c->buffers, b);
  buffer_unmap(b);
  free(b);
  return rc;
}

int tb_buffer_destroy(tb_buffer *b) {
  struct tb_client *c;
  int rc;

  if (b == NULL)
    return 0;
  c = b->c;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED; /* the parent's buffer */
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  rc = tb__buffer_destroy(c, b);
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

struct tb_buffer *tb__buffer_find(struct tb_client *c, const void *p,
                                  size_t len) {
  struct tb_buffer *b;
  uintptr_t a = (uintptr_t)p;

  DL_FOREACH(c->buffers, b) {
    uintptr_t lo = (uintptr_t)b->data;
    if (a >= lo && a - lo <= b->size && len <= b->size - (a - lo))
      return b;
  }
  return NULL;
}

void tb__buffers_free_all(struct tb_client *c) {
  struct tb_buffer *b, *tmp;

  DL_FOREACH_SAFE(c->buffers, b, tmp) {
    DL_DELETE(c->buffers, b);
    buffer_unmap(b);
    free(b);
  }
}

/* ---- the kind's table (kind.h) ---- */

/* A consumer's mapping-cache entry of a host buffer. */
struct host_map {
  struct tb__map m;
  void *p; /* the mapping */
};

/* kind.h, publish: the tensor must lie in one of c's buffers, and is
 * published as the buffer's kind (a pinned buffer's as kDLCUDAHost). */
int tb__host_publish(struct tb_client *c, const DLTensor *t, uintptr_t start,
                     uint64_t elem_bits, uint64_t flags, void *stream,
                     struct tb__kind_publish *out) {
  struct tb_buffer *b;
  int rc;

  if (stream != NULL)
    return tb__set_error(c, TB_ESTREAM, "host tensors take no stream (NULL)");
  b = tb__buffer_find(c, (const void *)start, 0);
  if (b == NULL)
    return tb__set_error(c, TB_EINVAL,
                         "tensor data is not inside a buffer of this client "
                         "(use tb_host_buffer_create or tb_publish_copy)");
  rc = tb__tensor_fits(c, t, elem_bits, flags, start, (uintptr_t)b->data,
                       b->size, "buffer");
  if (rc < 0)
    return rc;
  out->dev.type = b->kind == TB_MEMORY_CUDA_HOST ? kDLCUDAHost : kDLCPU;
  out->buffer_id = b->id;
  out->byte_offset = start - (uintptr_t)b->data;
  return 0;
}

/* Map a host memfd the daemon attached: read-only unless the producer
 * granted writes. MAP_SHARED, so we see the producer's bytes. */
int tb__host_mmap(struct tb_client *c, const Tensorbroker__V1__BufferInfo *bi,
                  const int *fds, int nfds, void **out) {
  void *p;

  if (!bi->fd_attached || nfds < 1)
    return tb__set_error(c, TB_EPROTO,
                         "buffer %llu not mapped and no memfd attached",
                         (unsigned long long)bi->buffer_id);
  if (bi->size == 0 || bi->size > SIZE_MAX)
    return tb__set_error(c, TB_EPROTO, "buffer of %llu bytes",
                         (unsigned long long)bi->size);
  p = mmap(NULL, (size_t)bi->size,
           bi->writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED,
           fds[0], 0);
  if (p == MAP_FAILED)
    return tb__set_error(c, TB_ESYS, "mmap of buffer %llu: %s",
                         (unsigned long long)bi->buffer_id, strerror(errno));
  *out = p;
  return 0;
}

static int host_map(struct tb_client *c, const Tensorbroker__V1__BufferInfo *bi,
                    const int *fds, int nfds, struct tb__map **out) {
  struct host_map *m;
  void *p;
  int rc;

  m = calloc(1, sizeof(*m));
  if (m == NULL)
    return TB_ENOMEM;
  rc = tb__host_mmap(c, bi, fds, nfds, &p);
  if (rc < 0) {
    free(m);
    return rc;
  }
  m->m.buffer_id = bi->buffer_id;
  m->m.generation = bi->generation;
  m->m.ops = &tb__kind_host;
  m->m.writable = bi->writable != 0;
  m->m.size = (size_t)bi->size;
  m->p = p;
  *out = &m->m;
  return 0;
}

static void host_unmap(struct tb__map *m) {
  struct host_map *h = (struct host_map *)m;

  if (h->p != NULL)
    munmap(h->p, m->size);
  free(h);
}

static int host_acquire(struct tb_client *c, struct tb__map *m,
                        const Tensorbroker__V1__AcquireReply *ar,
                        const struct tb_acquire_options *o, void *state,
                        struct tb__kind_acq *out) {
  out->base = (uint64_t)(uintptr_t)((struct host_map *)m)->p;
  out->device.device_type = kDLCPU;
  out->device.device_id = 0;
  return 0;
}

const struct tb__kind_ops tb__kind_host = {
    .name = "host",
    .kind = TB_MEMORY_HOST,
    .dl_device = kDLCPU,
    .publish = tb__host_publish,
    .map = host_map,
    .unmap = host_unmap,
    .acquire = host_acquire,
};
