/* SPDX-License-Identifier: Apache-2.0 */
/* CUDA_IPC buffers: a legacy IPC handle of the producer's allocation, sent
 * to consumers in the BufferInfo; no descriptor. Its row is in kinds.c. */
#include "kinds.h"

#include <stdio.h>

#include <dlpack/dlpack.h>
#include <tensorbroker/tensorbroker.h>

int tbd_kind_cuda_ipc_validate(const Tensorbroker__V1__BufferRegister *m,
                               const int *fds, int nfds, char *why,
                               size_t len) {
  (void)fds;
  if (nfds != 0) {
    snprintf(why, len, "CUDA_IPC BufferRegister with descriptors");
    return TB_EPROTO;
  }
  if (m->cuda_ipc_handle.len != TB__CUDA_IPC_HANDLE_SIZE) {
    snprintf(why, len, "cuda_ipc_handle must be %d bytes",
             TB__CUDA_IPC_HANDLE_SIZE);
    return TB_EINVAL;
  }
  if (m->device == NULL || m->device->uuid.len != TB__UUID_SIZE) {
    snprintf(why, len, "CUDA buffer needs a 16-byte device uuid");
    return TB_EINVAL;
  }
  if (m->device->type != kDLCUDA) {
    snprintf(why, len, "CUDA_IPC buffer on device type %d",
             (int)m->device->type);
    return TB_EDEVICE;
  }
  if (m->size == 0) {
    snprintf(why, len, "buffer size is 0");
    return TB_EINVAL;
  }
  return 0;
}
