/* SPDX-License-Identifier: Apache-2.0 */
/* HOST_MEMFD buffers: a sealed memfd the producer registers. The daemon
 * checks its size and seals, keeps its own descriptor (a read-only one
 * where consumers may not write) and attaches one to a consumer's
 * AcquireReply. Its row is in kinds.c. */
#include "registry_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tensorbroker/tensorbroker.h>

#include "kinds.h"
#include "log.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1; older C libraries lack it */
#endif

/* Why a HOST_MEMFD buffer's seals are not acceptable, or NULL. The kernel,
 * not the producer's library, keeps consumers from writing a read-only
 * buffer (docs/memory-access.md): it must be sealed against writes
 * (F_SEAL_FUTURE_WRITE, which leaves the producer's earlier mapping
 * writable), shrinking and growing. The daemon refuses rather than adding
 * the seal itself: only the producer knows whether it has mapped the memfd
 * yet (a mapping attempted after the seal is refused), a producer that
 * added F_SEAL_SEAL cannot be sealed further anyway, and a seal cannot be
 * taken back if the registration then fails. A buffer consumers may write
 * must not be write-sealed, or their writable mappings would fail. */
static const char *memfd_seals_bad(int seals, bool consumers_may_write) {
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    return "memfd is not sealed against shrinking (F_SEAL_SHRINK)";
  if (consumers_may_write)
    return seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)
               ? "consumers may write this buffer but its memfd is sealed "
                 "against writes (F_SEAL_WRITE or F_SEAL_FUTURE_WRITE)"
               : NULL;
  if (!(seals & F_SEAL_GROW))
    return "read-only buffer: memfd is not sealed against growing "
           "(F_SEAL_GROW)";
  if (!(seals & F_SEAL_FUTURE_WRITE))
    return "read-only buffer: memfd is not sealed against writes "
           "(F_SEAL_FUTURE_WRITE, added after the producer maps it; Linux "
           "5.1 or newer)";
  return NULL;
}

/* A read-only file description of memfd fd (the daemon's own open of the
 * inode), or -1. Consumers of a read-only buffer, and consumers not granted
 * write of one that consumers may write, are sent this one, so that
 * write(), fallocate() and writable shared mappings fail at the descriptor
 * already. It is the second wall, not the first: a consumer can re-open it
 * read-write through /proc/self/fd (memfds are created mode 0777), and
 * only the seal stops that. fd passed F_GET_SEALS, so it is a memfd (shmem or
 * hugetlbfs): this open cannot block, as one on a FUSE file could. */
static int readonly_description(int fd) {
  static bool warned;
  char path[40];
  int ro;

  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ro = open(path, O_RDONLY | O_CLOEXEC);
  if (ro < 0 && !warned) {
    warned = true;
    tbd_warn("cannot re-open a memfd read-only through %s (%s): read-only "
             "buffers go to consumers as the producer's read-write "
             "description, guarded by their seals alone",
             path, strerror(errno));
  }
  return ro;
}

/* Consumers not granted write of a buffer that consumers may write get a
 * read-only description, but no seal stops them re-opening it read-write
 * through /proc/self/fd (the producer must keep writing, and those granted
 * write need writable mappings): the inode's mode must. memfds are made
 * 0777 (0666 with MFD_NOEXEC_SEAL); owner-only, a consumer of another uid
 * gets EACCES. The library makes such memfds 0600 once registered (the
 * daemon must re-open it read-only first); this makes fd so for a producer
 * that speaks the wire, where the daemon may (root, or the producer's uid),
 * and with warn says once when it may not (called as a read-only
 * description goes out: by then the library has done it). */
static void memfd_restrict(int fd, bool warn) {
  static bool warned;
  struct stat st;

  if (fstat(fd, &st) < 0 || (st.st_mode & 077) == 0 ||
      fchmod(fd, st.st_mode & 0700) == 0 || !warn || warned)
    return;
  warned = true;
  tbd_warn("a consumers-may-write memfd is mode %04o and the daemon cannot "
           "make it owner-only (fchmod: %s): consumers of other uids not "
           "granted write can re-open it read-write through /proc (the "
           "library makes its memfds 0600; this producer did not)",
           (unsigned)(st.st_mode & 07777), strerror(errno));
}

int tbd_kind_memfd_validate(const Tensorbroker__V1__BufferRegister *m,
                            const int *fds, int nfds, char *why, size_t len) {
  struct stat st;
  const char *bad;
  int seals;

  if (nfds != 1) {
    snprintf(why, len, "%s",
             nfds > 1 ? "BufferRegister with more than one descriptor"
                      : "HOST_MEMFD needs a memfd attached");
    return nfds > 1 ? TB_EPROTO : TB_EINVAL;
  }
  if (m->size == 0) {
    snprintf(why, len, "buffer size is 0");
    return TB_EINVAL;
  }
  if (fstat(fds[0], &st) < 0 || !S_ISREG(st.st_mode)) {
    snprintf(why, len, "descriptor is not a memfd");
    return TB_EINVAL;
  }
  if ((uint64_t)st.st_size < m->size) {
    snprintf(why, len, "memfd has %lld bytes, %llu declared",
             (long long)st.st_size, (unsigned long long)m->size);
    return TB_EINVAL;
  }
  seals = fcntl(fds[0], F_GET_SEALS);
  bad = memfd_seals_bad(seals, m->consumers_may_write);
  if (bad != NULL) {
    snprintf(why, len, "%s", bad);
    return TB_EINVAL;
  }
  return 0;
}

/* a buffer consumers may write keeps a second, read-only descriptor */
uint32_t tbd_kind_memfd_fds_held(const Tensorbroker__V1__BufferRegister *m) {
  return m->consumers_may_write ? 2 : 1;
}

void tbd_kind_memfd_adopt(struct tbd_buffer *b, int *fds, int nfds) {
  if (nfds != 1)
    return;
  /* the received descriptor is the daemon's own dup; a read-only
   * buffer's is replaced by a read-only one (closed with fds); a buffer
   * consumers may write keeps both, the read-only one for consumers not
   * granted write */
  if (b->writable) {
    b->rofd = readonly_description(fds[0]);
    memfd_restrict(fds[0], false);
  }
  b->fd = b->writable ? -1 : readonly_description(fds[0]);
  if (b->fd < 0) {
    b->fd = fds[0];
    fds[0] = -1;
  }
}

int tbd_kind_memfd_attach_fd(struct tbd_buffer *b, bool write) {
  int fd = b->writable && !write ? b->rofd : b->fd;

  if (fd >= 0 && fd == b->rofd)
    memfd_restrict(b->fd, true);
  return fd;
}
