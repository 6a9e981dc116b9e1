/* SPDX-License-Identifier: Apache-2.0 */
/* CUDA_VMM_FD buffers: device memory made with cuMemCreate and exported
 * once as a POSIX file descriptor (cuMemExportToShareableHandle). The
 * descriptor keeps the allocation alive: the daemon holds its own, so a
 * version stays readable after its producer ends, and attaches one to a
 * consumer's first AcquireReply of the buffer, which the consumer imports
 * (cuMemImportFromShareableHandle). Its last bytes may be a signal area
 * (BufferRegister.signal_offset), checked here. Its row is in kinds.c. */
#include "registry_impl.h"

#include <stdio.h>
#include <sys/stat.h>

#include <dlpack/dlpack.h>
#include <tensorbroker/tensorbroker.h>

#include "kinds.h"

/* Why a descriptor cannot be an exported allocation, or NULL. The driver's
 * descriptor is not a file the daemon can inspect (the fake driver's is a
 * memfd), so only kinds of file that are certainly not one are refused:
 * a socket (the daemon would hold a connection open), a pipe, a directory,
 * a block device or a symbolic link. */
static const char *vmm_fd_bad(const struct stat *st) {
  if (S_ISSOCK(st->st_mode))
    return "a socket";
  if (S_ISFIFO(st->st_mode))
    return "a pipe";
  if (S_ISDIR(st->st_mode))
    return "a directory";
  if (S_ISBLK(st->st_mode))
    return "a block device";
  if (S_ISLNK(st->st_mode))
    return "a symbolic link";
  return NULL;
}

static int vmm_device_check(const Tensorbroker__V1__BufferRegister *m,
                            char *why, size_t len) {
  if (m->cuda_ipc_handle.len != 0) {
    snprintf(why, len, "CUDA_VMM_FD BufferRegister with a cuda_ipc_handle");
    return TB_EINVAL;
  }
  if (m->device == NULL || m->device->uuid.len != TB__UUID_SIZE) {
    snprintf(why, len, "CUDA buffer needs a 16-byte device uuid");
    return TB_EINVAL;
  }
  if (m->device->type != kDLCUDA) {
    snprintf(why, len, "CUDA_VMM_FD buffer on device type %d",
             (int)m->device->type);
    return TB_EDEVICE;
  }
  if (m->size == 0 || m->size > TBD_VMM_SIZE_MAX) {
    snprintf(why, len, "CUDA_VMM_FD buffer size %llu: must be 1 to %llu",
             (unsigned long long)m->size,
             (unsigned long long)TBD_VMM_SIZE_MAX);
    return TB_EINVAL;
  }
  return 0;
}

/* The signal area, when there is one: 8-aligned (the words are written and
 * waited for as 64-bit values, cuStreamWriteValue64), after at least one
 * word of tensor bytes, and room for the ready word and one done slot
 * before the end. */
static int vmm_signal_check(const Tensorbroker__V1__BufferRegister *m,
                            char *why, size_t len) {
  uint64_t off = m->signal_offset;

  if (off == 0)
    return 0;
  if (off < 8) {
    snprintf(why, len, "signal_offset %llu leaves no room for a tensor "
             "before the signal area (at least 8)", (unsigned long long)off);
    return TB_EINVAL;
  }
  if (off % 8 != 0) {
    snprintf(why, len, "signal_offset %llu is not a multiple of 8",
             (unsigned long long)off);
    return TB_EINVAL;
  }
  if (off >= m->size || m->size - off < 16) {
    snprintf(why, len, "signal_offset %llu of a %llu-byte buffer leaves "
             "less than 16 bytes for the signal area (the ready word and "
             "one done slot)",
             (unsigned long long)off, (unsigned long long)m->size);
    return TB_EINVAL;
  }
  return 0;
}

int tbd_kind_vmm_validate(const Tensorbroker__V1__BufferRegister *m,
                          const int *fds, int nfds, char *why, size_t len) {
  const char *bad;
  struct stat st;
  int rc;

  if (nfds != 1) {
    snprintf(why, len, "%s",
             nfds > 1 ? "BufferRegister with more than one descriptor"
                      : "CUDA_VMM_FD needs the exported descriptor attached");
    return nfds > 1 ? TB_EPROTO : TB_EINVAL;
  }
  rc = vmm_device_check(m, why, len);
  if (rc < 0)
    return rc;
  rc = vmm_signal_check(m, why, len);
  if (rc < 0)
    return rc;
  if (fstat(fds[0], &st) < 0) {
    snprintf(why, len, "CUDA_VMM_FD descriptor cannot be examined");
    return TB_EINVAL;
  }
  bad = vmm_fd_bad(&st);
  if (bad != NULL) {
    snprintf(why, len, "CUDA_VMM_FD descriptor is %s, not an exported "
             "allocation", bad);
    return TB_EINVAL;
  }
  /* a regular file (the fake driver's memfd) says its size */
  if (S_ISREG(st.st_mode) && (uint64_t)st.st_size < m->size) {
    snprintf(why, len, "CUDA_VMM_FD descriptor has %lld bytes, %llu declared",
             (long long)st.st_size, (unsigned long long)m->size);
    return TB_EINVAL;
  }
  return 0;
}

uint32_t tbd_kind_vmm_fds_held(const Tensorbroker__V1__BufferRegister *m) {
  (void)m;
  return 1;
}

void tbd_kind_vmm_adopt(struct tbd_buffer *b, int *fds, int nfds) {
  if (nfds != 1)
    return;
  b->fd = fds[0];
  fds[0] = -1;
}

/* Every consumer imports the same allocation: read-only is the access the
 * consumer's library sets on its mapping (docs/cuda.md), not a second
 * descriptor. */
int tbd_kind_vmm_attach_fd(struct tbd_buffer *b, bool write) {
  (void)write;
  return b->fd;
}
