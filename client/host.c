/* SPDX-License-Identifier: Apache-2.0 */
/* Producer host buffers: a sealed memfd, mapped read-write here and
 * registered with the daemon (which keeps a dup, so the bytes outlive us). */
#include "client_internal.h"

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

  dev.type = kDLCPU;
  br.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
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

int tb_host_buffer_create(tb_client *c, size_t size, unsigned flags,
                          tb_buffer **out) {
  struct tb_buffer *b;
  void *p;
  int fd, rc;

  if (c == NULL || out == NULL)
    return TB_EINVAL;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  if (size == 0 || size > (size_t)INT64_MAX ||
      (flags & ~TB_BUFFER_CONSUMERS_MAY_WRITE) != 0) {
    rc = tb__set_error(c, TB_EINVAL, "buffer size must be > 0; unknown flags %#x",
                       flags & ~TB_BUFFER_CONSUMERS_MAY_WRITE);
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
  rc = seal_memfd(c, fd, flags);
  if (rc < 0)
    goto out_unmap;
  rc = register_memfd(c, fd, size, flags, &b->id);
  if (rc < 0)
    goto out_unmap;
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
  DL_APPEND(c->buffers, b);
  *out = b;
  pthread_mutex_unlock(&c->call_lock);
  return 0;

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

int tb_buffer_destroy(tb_buffer *b) {
  Tensorbroker__V1__BufferUnregister bu =
      TENSORBROKER__V1__BUFFER_UNREGISTER__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  struct tb_client *c;
  tb__server_message *m = NULL;
  int fds[TB__MAX_FDS], nfds = 0, rc;

  if (b == NULL)
    return 0;
  c = b->c;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  bu.buffer_id = b->id;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_UNREGISTER;
  r.buffer_unregister = &bu;
  rc = tb__call(c, &r, NULL, 0, 0, &m, fds, &nfds);
  if (rc == 0) {
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    tb__msg_free(c, m);
  }
  DL_DELETE(c->buffers, b);
  munmap(b->data, b->size);
  free(b);
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
    munmap(b->data, b->size);
    free(b);
  }
}
