/* SPDX-License-Identifier: Apache-2.0 */
/* Memory kinds as the daemon sees them: one row per kind. Every decision
 * that depends on a buffer's kind is a column of its row: what a
 * registration must bring and how it is checked, which descriptor the
 * daemon keeps and which one a consumer is sent, what outlives the process
 * that published it, what goes out with a prefetch, and whether its
 * buffers may carry signals. The rows are in kinds.c; a kind with code of
 * its own has its own file (kind_memfd.c, kind_cuda_ipc.c, kind_vmm.c).
 * docs/internals.md, "Memory kinds in the daemon". */
#ifndef TBD_KINDS_H
#define TBD_KINDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tb_proto.h"

struct tbd_buffer;

struct tbd_kind {
  int kind;               /* TENSORBROKER__V1__MEMORY_KIND__* */
  const char *name;       /* in messages */
  const char *label;      /* as the library and tbctl name the kind
                             (tb_memory_kind_name): the metrics' label */
  int dev_type;           /* DLPack device type of its buffers: a layout
                             published in one must name it */
  /* The memory is a descriptor: the daemon holds its own (adopt), and a
   * consumer's AcquireReply attaches one (attach_fd) until the consumer
   * holds a mapping of it. Without: the BufferInfo names the memory. */
  bool carries_fd;
  /* Its memory stays valid once its producer ends: its versions may
   * still be granted. */
  bool survives_producer;
  /* A NewVersion (and HelloReply.latest) carries the buffer and the ready
   * event to a session that asked for prefetch and maps this kind, so
   * that it may open both before it acquires. */
  bool prefetch_with_notice;
  /* Its buffers may end in a signal area (BufferRegister.signal_offset):
   * words its producer's and consumers' streams write and wait for where
   * interprocess events do not reach. The area must outlive the producer
   * (a consumer still waits on it), so such a kind carries a descriptor
   * and survives its producer; validate_register checks the offset. A
   * registration of another kind with one is refused. */
  bool signals;
  /* Check a BufferRegister of this kind with the nfds descriptors it
   * carried, before anything is counted: 0, or a negative TB_E* code with
   * why ("HOST_MEMFD needs a memfd attached"); TB_EPROTO is a protocol
   * error that ends the session. */
  int (*validate_register)(const Tensorbroker__V1__BufferRegister *m,
                           const int *fds, int nfds, char *why, size_t len);
  /* How many descriptors a registration that passed validate_register
   * makes the daemon hold, so that they are admitted against the budget
   * first (quota.c). NULL: none. */
  uint32_t (*fds_held)(const Tensorbroker__V1__BufferRegister *m);
  /* Take b's memory from the registration's descriptors into b->fd and
   * b->rofd (a descriptor taken is set to -1 in fds; the caller closes
   * those left). NULL: the kind keeps no descriptor. */
  void (*adopt)(struct tbd_buffer *b, int *fds, int nfds);
  /* The descriptor to attach to an AcquireReply for a consumer (write:
   * it was granted write), or -1 for none; called only as one is about to
   * go out. carries_fd kinds only. */
  int (*attach_fd)(struct tbd_buffer *b, bool write);
};

/* The rows, in table order: tbd_kind_at(i) for i < tbd_kind_count(). */
size_t tbd_kind_count(void);
const struct tbd_kind *tbd_kind_at(size_t i);

/* The row of kind, or NULL for a kind the daemon does not know. */
const struct tbd_kind *tbd_kind_find(int kind);

/* Whether memory of this kind may still be granted after the session that
 * published it ended. False for an unknown kind. */
bool tbd_kind_survives_producer(int kind);

/* The kind's name for messages ("memory" for an unknown kind). */
const char *tbd_kind_name(int kind);

/* ---- the kinds' own files ---- */

/* kind_memfd.c: HOST_MEMFD, a sealed memfd the daemon keeps. */
int tbd_kind_memfd_validate(const Tensorbroker__V1__BufferRegister *m,
                            const int *fds, int nfds, char *why, size_t len);
uint32_t tbd_kind_memfd_fds_held(const Tensorbroker__V1__BufferRegister *m);
void tbd_kind_memfd_adopt(struct tbd_buffer *b, int *fds, int nfds);
int tbd_kind_memfd_attach_fd(struct tbd_buffer *b, bool write);

/* kind_cuda_ipc.c: CUDA_IPC, a legacy IPC handle of the producer's
 * allocation. */
int tbd_kind_cuda_ipc_validate(const Tensorbroker__V1__BufferRegister *m,
                               const int *fds, int nfds, char *why,
                               size_t len);

/* kind_vmm.c: CUDA_VMM_FD, an exported VMM allocation's descriptor the
 * daemon keeps, which may end in a signal area. The largest size a
 * registration may declare (1 TiB: more than any one device's memory). */
#define TBD_VMM_SIZE_MAX (1ull << 40)
int tbd_kind_vmm_validate(const Tensorbroker__V1__BufferRegister *m,
                          const int *fds, int nfds, char *why, size_t len);
uint32_t tbd_kind_vmm_fds_held(const Tensorbroker__V1__BufferRegister *m);
void tbd_kind_vmm_adopt(struct tbd_buffer *b, int *fds, int nfds);
int tbd_kind_vmm_attach_fd(struct tbd_buffer *b, bool write);

#endif /* TBD_KINDS_H */
