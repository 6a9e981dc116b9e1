/* SPDX-License-Identifier: Apache-2.0 */
/* The daemon's table of memory kinds (kinds.h says what each column
 * decides). */
#include "kinds.h"

#include <stddef.h>

#include <dlpack/dlpack.h>
#include <tensorbroker/tensorbroker.h>

static const struct tbd_kind kinds[] = {
    /* The daemon holds its own descriptor of the memfd: the pages live as
     * long as it or any consumer's mapping does. */
    {
        .kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD,
        .name = "host memfd",
        .label = "host",
        .dev_type = kDLCPU,
        .carries_fd = true,
        .survives_producer = true,
        .prefetch_with_notice = false,
        .signals = false,
        .validate_register = tbd_kind_memfd_validate,
        .fds_held = tbd_kind_memfd_fds_held,
        .adopt = tbd_kind_memfd_adopt,
        .attach_fd = tbd_kind_memfd_attach_fd,
    },
    /* A legacy IPC handle names the producer's own allocation: the
     * allocation dies with the producer process, and a consumer's open of
     * its handle then fails (CUDA_ERROR_INVALID_HANDLE). Mappings opened
     * before keep working (measured, though CUDA calls it undefined).
     * A session that asks for prefetch is sent the handle and the ready
     * event with the NewVersion, to open both before it acquires. */
    {
        .kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC,
        .name = "CUDA IPC",
        .label = "cuda-ipc",
        .dev_type = kDLCUDA,
        .carries_fd = false,
        .survives_producer = false,
        .prefetch_with_notice = true,
        .signals = false,
        .validate_register = tbd_kind_cuda_ipc_validate,
    },
    /* An exported VMM allocation lives while any descriptor of it does,
     * the daemon's included (measured): versions are granted after the
     * producer ends. The descriptor goes to a consumer with its first
     * AcquireReply of the buffer; a NewVersion carries no descriptor, so
     * consumers import at that acquire, not ahead. The signal area lives
     * in the allocation itself, so it outlives the producer with it. */
    {
        .kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_VMM_FD,
        .name = "CUDA VMM fd",
        .label = "cuda-vmm",
        .dev_type = kDLCUDA,
        .carries_fd = true,
        .survives_producer = true,
        .prefetch_with_notice = false,
        .signals = true,
        .validate_register = tbd_kind_vmm_validate,
        .fds_held = tbd_kind_vmm_fds_held,
        .adopt = tbd_kind_vmm_adopt,
        .attach_fd = tbd_kind_vmm_attach_fd,
    },
    /* Pinned host memory: a sealed memfd exactly as HOST_MEMFD, which each
     * process that maps it registers with cuMemHostRegister (the client's
     * kind_pinned.c); to the daemon only its device type differs, so that
     * its versions are published and reported as kDLCUDAHost. */
    {
        .kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_HOST,
        .name = "pinned host memfd",
        .label = "cuda-host",
        .dev_type = kDLCUDAHost,
        .carries_fd = true,
        .survives_producer = true,
        .prefetch_with_notice = false,
        .signals = false,
        .validate_register = tbd_kind_memfd_validate,
        .fds_held = tbd_kind_memfd_fds_held,
        .adopt = tbd_kind_memfd_adopt,
        .attach_fd = tbd_kind_memfd_attach_fd,
    },
};

size_t tbd_kind_count(void) { return sizeof(kinds) / sizeof(kinds[0]); }

const struct tbd_kind *tbd_kind_at(size_t i) {
  return i < tbd_kind_count() ? &kinds[i] : NULL;
}

const struct tbd_kind *tbd_kind_find(int kind) {
  for (size_t i = 0; i < tbd_kind_count(); i++)
    if (kinds[i].kind == kind)
      return &kinds[i];
  return NULL;
}

bool tbd_kind_survives_producer(int kind) {
  const struct tbd_kind *k = tbd_kind_find(kind);

  return k != NULL && k->survives_producer;
}

const char *tbd_kind_name(int kind) {
  const struct tbd_kind *k = tbd_kind_find(kind);

  return k != NULL ? k->name : "memory";
}
