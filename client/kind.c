/* SPDX-License-Identifier: Apache-2.0 */
/* The table of memory kinds (kind.h): one row per kind, indexed by the
 * protocol's MemoryKind. Adding a kind adds its row here. */
#include "kind.h"

#include <utlist.h>

static const struct tb__kind_ops *const kinds[] = {
    [TB_MEMORY_HOST] = &tb__kind_host,
    [TB_MEMORY_CUDA_IPC] = &tb__kind_cuda_ipc,
    [TB_MEMORY_CUDA_VMM] = &tb__kind_cuda_vmm,
    [TB_MEMORY_CUDA_HOST] = &tb__kind_pinned,
};

#define N_KINDS (sizeof(kinds) / sizeof(kinds[0]))

_Static_assert(N_KINDS <= TB__KINDS, "struct tb_client's kind state has "
                                     "no room for every kind");

const struct tb__kind_ops *tb__kind(int kind) {
  if (kind < 0 || (size_t)kind >= N_KINDS)
    return NULL;
  return kinds[kind];
}

const struct tb__kind_ops *tb__kind_for_device(int dl_device_type) {
  for (size_t i = 0; i < N_KINDS; i++)
    if (kinds[i] != NULL && kinds[i]->dl_device == dl_device_type)
      return kinds[i];
  return NULL;
}

const struct tb__kind_ops *tb__kind_for_tensor(struct tb_client *c,
                                               int dl_device_type,
                                               uintptr_t start) {
  for (size_t i = 0; i < N_KINDS; i++)
    if (kinds[i] != NULL && kinds[i]->dl_device == dl_device_type &&
        kinds[i]->owns != NULL && kinds[i]->owns(c, start))
      return kinds[i];
  return tb__kind_for_device(dl_device_type);
}

uint32_t tb__kinds_mask(void) {
  uint32_t mask = 0;

  for (size_t i = 0; i < N_KINDS; i++)
    if (kinds[i] != NULL)
      mask |= 1u << kinds[i]->kind;
  return mask;
}

void tb__kinds_acquire_early(struct tb_client *c) {
  for (size_t i = 0; i < N_KINDS; i++)
    if (kinds[i] != NULL && kinds[i]->acquire_early != NULL)
      kinds[i]->acquire_early(c);
}

void tb__kinds_connect_begin(struct tb_client *c) {
  for (size_t i = 0; i < N_KINDS; i++)
    if (kinds[i] != NULL && kinds[i]->connect_begin != NULL)
      kinds[i]->connect_begin(c);
}

void tb__kinds_connect_end(struct tb_client *c, int hello_ok) {
  for (size_t i = 0; i < N_KINDS; i++)
    if (kinds[i] != NULL && kinds[i]->connect_end != NULL)
      kinds[i]->connect_end(c, hello_ok);
}

void tb__kinds_client_free(struct tb_client *c) {
  for (size_t i = 0; i < N_KINDS; i++)
    if (kinds[i] != NULL && kinds[i]->client_free != NULL)
      kinds[i]->client_free(c);
}

void tb__kinds_conn_free(struct tb__conn *k) {
  for (size_t i = 0; i < N_KINDS; i++)
    if (kinds[i] != NULL && kinds[i]->conn_free != NULL)
      kinds[i]->conn_free(k);
}

void tb__kind_prefetch(struct tb_client *c,
                       const Tensorbroker__V1__BufferInfo *bi,
                       const Tensorbroker__V1__EventInfo *ready) {
  const struct tb__kind_ops *ops = tb__kind((int)bi->kind);

  if (ops != NULL && ops->prefetch != NULL)
    ops->prefetch(c, bi, ready);
}

int tb__kinds_done_wait(struct tb_client *c, const struct tb__freed *f,
                        void *stream) {
  const struct tb__kind_ops *ops = NULL;
  struct tb_buffer *b;

  /* A version of one of c's buffers waits as the buffer's kind says
   * (pinned memory: the host blocks; a VMM buffer: stream waits on events
   * and done signals). Device memory published from an allocation, and a
   * buffer c no longer has, wait as legacy IPC does (stream waits on the
   * events; nothing of a destroyed buffer is left to rewrite). */
  if (f->buffer_id != 0) {
    DL_FOREACH(c->buffers, b) {
      if (b->id == f->buffer_id) {
        ops = tb__kind(b->kind);
        break;
      }
    }
    for (size_t i = 0; ops == NULL && i < N_KINDS; i++)
      if (kinds[i] != NULL && kinds[i]->has_buffer != NULL &&
          kinds[i]->has_buffer(c, f->buffer_id))
        ops = kinds[i];
  }
  if (ops == NULL)
    ops = tb__kind(TB_MEMORY_CUDA_IPC);
  if (ops == NULL || ops->done_wait == NULL)
    return 0;
  return ops->done_wait(c, f, stream);
}
