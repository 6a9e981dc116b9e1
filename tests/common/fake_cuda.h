/* SPDX-License-Identifier: Apache-2.0 */
/* A CUDA_IPC BufferRegister with made-up handle bytes, for tests without a
 * GPU: the daemon stores and forwards CUDA handles, it never opens them.
 * Include after tb_proto.h. */
#ifndef TB_TESTS_FAKE_CUDA_H
#define TB_TESTS_FAKE_CUDA_H

#include <dlpack/dlpack.h>
#include <string.h>

struct tbt_fake_cuda {
  Tensorbroker__V1__BufferRegister reg; /* what to send */
  Tensorbroker__V1__Device dev;
  uint8_t handle[64], uuid[16];
};

/* 4096 bytes on a kDLCUDA device; the handle's first byte is tag, so that
 * a test can tell buffers apart in what the daemon sends on. */
static inline void tbt_fake_cuda_init(struct tbt_fake_cuda *f, uint8_t tag) {
  Tensorbroker__V1__BufferRegister reg =
      TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;

  memset(f, 0, sizeof(*f));
  f->reg = reg;
  f->dev = dev;
  f->handle[0] = tag;
  f->uuid[0] = 7;
  f->reg.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC;
  f->reg.size = 4096;
  f->reg.device = &f->dev;
  f->dev.type = kDLCUDA;
  f->dev.uuid.data = f->uuid;
  f->dev.uuid.len = sizeof(f->uuid);
  f->reg.cuda_ipc_handle.data = f->handle;
  f->reg.cuda_ipc_handle.len = sizeof(f->handle);
}

#endif /* TB_TESTS_FAKE_CUDA_H */
