/* SPDX-License-Identifier: Apache-2.0 */
/* Internal: the driver calls of CUDA VMM buffers (vmm.c), free of RPC:
 * exportable device memory made, exported, imported, mapped and undone.
 * The memory kind that uses them is kind_vmm.c. */
#ifndef TB_CUDA_VMM_H
#define TB_CUDA_VMM_H

#include <stddef.h>

#include "cuda.h"

/* An allocation mapped in this process: its handle (made or imported),
 * the reserved addresses and the mapping over them. */
struct tb__vmm_mem {
  tb_cu_mem_handle handle;
  tb_cu_deviceptr va;
  size_t size; /* rounded up to the device's granularity */
  int device;  /* ordinal in this process */
  tb_cu_context ctx; /* the context it was mapped in (the caller sets it):
                      * made current again to undo it */
};

/* 1 when device ordinal can export and import POSIX descriptors of VMM
 * memory; 0 with why when it cannot (or there is no driver). */
int tb__vmm_supported(int device, char *why, size_t whylen);

/* Producer: at least bytes of exportable device memory on device (its
 * context current), mapped read-write here. */
int tb__vmm_create(int device, size_t bytes, struct tb__vmm_mem *out,
                   char *why, size_t whylen);

/* Producer: zero bytes [offset, offset + n) of m (its context current),
 * before anyone else sees it. */
int tb__vmm_zero(const struct tb__vmm_mem *m, size_t offset, size_t n,
                 char *why, size_t whylen);

/* Producer: the allocation's POSIX descriptor (the caller closes it). */
int tb__vmm_export(const struct tb__vmm_mem *m, int *fd, char *why,
                   size_t whylen);

/* Consumer: import descriptor fd of size bytes on device (its context
 * current) and map it, read-write or read-only. fd stays the caller's. */
int tb__vmm_import(int fd, size_t size, int device, int writable,
                   struct tb__vmm_mem *out, char *why, size_t whylen);

/* A second mapping of m's allocation, read-write, at *va (a consumer that
 * maps the buffer read-only writes its done signal through it); undone by
 * tb__vmm_unmap_again (in m->ctx, any thread). */
int tb__vmm_map_again(const struct tb__vmm_mem *m, tb_cu_deviceptr *va,
                      char *why, size_t whylen);
void tb__vmm_unmap_again(const struct tb__vmm_mem *m, tb_cu_deviceptr va);

/* Unmap, free the addresses and release the handle (either side), in
 * m->ctx and in relaxed capture mode, so that another thread's stream
 * capture is not invalidated (as for an IPC close); any thread. */
void tb__vmm_free(struct tb__vmm_mem *m);

#endif /* TB_CUDA_VMM_H */
