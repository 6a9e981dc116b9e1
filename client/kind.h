/* SPDX-License-Identifier: Apache-2.0 */
/* Internal: memory kinds, the client's transports.
 *
 * A memory kind is one way bytes reach another process: a host memfd
 * (kind_host.c), legacy CUDA IPC (cuda/kind_ipc.c), CUDA VMM buffers
 * (cuda/kind_vmm.c). Each fills one
 * struct tb__kind_ops, a table of what the lease, mapping, publish and
 * connection code needs from it (in the style of nng's transports); that
 * code finds the table with tb__kind(kind) or tb__kind_for_device() and
 * never names a kind. An operation a kind does not need is NULL, and the
 * callers treat NULL as "nothing to do" (host memory is ready when
 * published: it has no ready_wait). Adding a kind is its own files plus one
 * row in kind.c's table (docs/internals.md, "Memory kinds in the
 * client"). */
#ifndef TB_KIND_H
#define TB_KIND_H

#include "client_internal.h"

/* Bytes a lease keeps for its kind (the CUDA kind's streams and events:
 * 472 bytes on x86-64, a little more than the lease held for CUDA before
 * (456), so that a lease stays about the size it was, and which leases the
 * connection's spare can hold); each kind checks that its state fits. */
#define TB__KIND_LEASE_STATE 480

/* What a kind's acquire hands the lease code. */
struct tb__kind_acq {
  uint64_t base;   /* the buffer's byte 0 as this process addresses it */
  DLDevice device; /* where the tensor's data is */
  int implicit;    /* the call relied on the contract's default stream */
  /* The tensor is a private copy (DLPack IS_COPIED): the lease ended when
   * the copy was made, with this done event (0: none). */
  int copied;
  uint64_t done_event_id;
};

/* What a kind's publish hands the publish code for the Publish request. */
struct tb__kind_publish {
  uint64_t buffer_id;
  uint64_t byte_offset; /* of the tensor's first byte in the buffer */
  uint64_t ready_event_id;
  int ready_complete;
  uint64_t ready_signal; /* written after the work (docs/cuda.md,
                          * "Signals"); 0: none */
  Tensorbroker__V1__Device dev;
  uint8_t uuid[TB__UUID_SIZE]; /* dev.uuid's storage */
};

/* What the end of a lease leaves for its Release. */
struct tb__lease_done {
  uint64_t event_id; /* the done event recorded; 0: nothing to wait for */
  uint64_t signal;   /* the done signal written in this session's done slot
                      * (docs/cuda.md, "Signals"); 0: none */
  int implicit;      /* the contract chose a stream */
};

struct tb__kind_ops {
  const char *name;
  int kind;      /* enum tb_memory_kind, the protocol's MemoryKind */
  int dl_device; /* the DLDeviceType a producer publishes this kind from */
  /* Bytes of lease state the kind uses (<= TB__KIND_LEASE_STATE). */
  size_t lease_state;

  /* ---- producer (call_lock held) ---- */
  /* Publish t, already checked (tb__tensor_check: elem_bits, start): find
   * the memory holding start, check the tensor fits it
   * (tb__tensor_fits), register it if new, mark its readiness on stream.
   * Errors are set on c. */
  int (*publish)(struct tb_client *c, const DLTensor *t, uintptr_t start,
                 uint64_t elem_bits, uint64_t flags, void *stream,
                 struct tb__kind_publish *out);
  /* Whether start lies in memory of this kind that this client made
   * (tb_buffer_create_cuda's VMM buffers): a tensor there is published as
   * this kind rather than as the first kind of its device type. NULL:
   * never. */
  int (*owns)(struct tb_client *c, uintptr_t start);
  /* tb_buffer_destroy of a buffer of this kind (b->ops). call_lock held. */
  int (*buffer_destroy)(struct tb_client *c, struct tb_buffer *b);
  /* tb_wait_free: make stream wait for the consumers' done events. */
  int (*done_wait)(struct tb_client *c, const struct tb__freed *f,
                   void *stream);
  /* Whether buffer_id is one of c's buffers that this kind keeps on a
   * list of its own (b->ops), so that tb_wait_free finds its kind. NULL:
   * the kind keeps none. call_lock held. */
  int (*has_buffer)(struct tb_client *c, uint64_t buffer_id);

  /* ---- consumer ---- */
  /* Map buffer bi (the reply's descriptors in fds) into a new mapping-cache
   * entry, not inserted yet (call_lock held). */
  int (*map)(struct tb_client *c, const Tensorbroker__V1__BufferInfo *bi,
             const int *fds, int nfds, struct tb__map **out);
  /* Undo a mapping and free the entry (any thread, conn->lock held or the
   * connection being freed). */
  void (*unmap)(struct tb__map *m);
  /* The tensor of acquire reply ar over mapping m: where its bytes are as
   * this process addresses them, its readiness ordered on the acquire's
   * stream; the kind's lease state into state (lease_state bytes, zeroed).
   * call_lock held. */
  int (*acquire)(struct tb_client *c, struct tb__map *m,
                 const Tensorbroker__V1__AcquireReply *ar,
                 const struct tb_acquire_options *o, void *state,
                 struct tb__kind_acq *out);
  /* tb_lease_wait: make stream wait until the tensor t is ready. Any
   * thread; takes only k->lock. */
  int (*ready_wait)(struct tb__conn *k, void *state, const DLTensor *t,
                    void *stream);
  /* tb_lease_use: remember stream as one that reads the lease. k->lock
   * held. */
  int (*use_locked)(struct tb__conn *k, void *state, void *stream);
  /* A lease ends: record its done event (and signal) after the reads on
   * its streams (and stream); done->event_id 0: nothing to wait for.
   * TB__LEASE_LATER: not now (a capture), ask again with stream NULL.
   * k->lock held. */
  int (*done_record_locked)(struct tb__conn *k, void *state, void *stream,
                            struct tb__lease_done *done);
  /* A copy's lease (tb__kind_acq.copied) ends: free the copy after the
   * reads on stream and the lease's streams. Takes k->lock. */
  int (*copy_free)(struct tb__conn *k, void *state, void *stream);
  /* A version's buffer named ahead (a NewVersion notice, a channel named
   * at connect): open it into the mapping cache now, quietly. */
  void (*prefetch)(struct tb_client *c, const Tensorbroker__V1__BufferInfo *bi,
                   const Tensorbroker__V1__EventInfo *ready);

  /* ---- a connection's life ---- */
  /* An Acquire is in flight (its kind not known yet): work done ahead. */
  void (*acquire_early)(struct tb_client *c);
  /* connect, between sending the Hello and reading its reply; and after. */
  void (*connect_begin)(struct tb_client *c);
  void (*connect_end)(struct tb_client *c, int hello_ok);
  /* Free the kind's state of the client (disconnect) and of the
   * refcounted connection (its last reference). */
  void (*client_free)(struct tb_client *c);
  void (*conn_free)(struct tb__conn *k);
};

/* The table of kind (enum tb_memory_kind), NULL for a kind this library
 * does not know. */
const struct tb__kind_ops *tb__kind(int kind);
/* The table of the kind a producer's tensor on this DLDeviceType is
 * published as, NULL for none. */
const struct tb__kind_ops *tb__kind_for_device(int dl_device_type);
/* The kind that publishes a tensor of this device type starting at start:
 * a kind that owns start (its owns), else tb__kind_for_device's. */
const struct tb__kind_ops *tb__kind_for_tensor(struct tb_client *c,
                                               int dl_device_type,
                                               uintptr_t start);
/* Hello.memory_kinds: every kind this library can map. */
uint32_t tb__kinds_mask(void);

/* The operations every kind takes part in, called for each that has one. */
void tb__kinds_acquire_early(struct tb_client *c);
void tb__kinds_connect_begin(struct tb_client *c);
void tb__kinds_connect_end(struct tb_client *c, int hello_ok);
void tb__kinds_client_free(struct tb_client *c);
void tb__kinds_conn_free(struct tb__conn *k);
/* Prefetch bi when its kind does that (quiet). */
void tb__kind_prefetch(struct tb_client *c,
                       const Tensorbroker__V1__BufferInfo *bi,
                       const Tensorbroker__V1__EventInfo *ready);
/* tb_wait_free's done events, waited for by the kind of the version's
 * buffer: one of c's buffers (c->buffers, or a kind's has_buffer), else
 * cuda-ipc (memory published from an allocation, or a buffer c has
 * destroyed). */
int tb__kinds_done_wait(struct tb_client *c, const struct tb__freed *f,
                        void *stream);

extern const struct tb__kind_ops tb__kind_host;
extern const struct tb__kind_ops tb__kind_cuda_ipc;
extern const struct tb__kind_ops tb__kind_cuda_vmm;
extern const struct tb__kind_ops tb__kind_pinned;

/* ---- kind_host.c's parts that the pinned kind (a host memfd) reuses ---- */

/* The host kind's publish: t in one of c's buffers, published as that
 * buffer's kind. */
int tb__host_publish(struct tb_client *c, const DLTensor *t, uintptr_t start,
                     uint64_t elem_bits, uint64_t flags, void *stream,
                     struct tb__kind_publish *out);
/* mmap the memfd of bi attached in fds (read-only unless bi->writable). */
int tb__host_mmap(struct tb_client *c, const Tensorbroker__V1__BufferInfo *bi,
                  const int *fds, int nfds, void **out);

/* ---- cuda/host_register.c: pinning a host mapping (TB_BUFFER_PINNED) ---- */

/* TB_ENOTSUP, set on c, when the daemon cannot take pinned buffers (no
 * FEATURE_CUDA_HOST); else 0. */
int tb__pinned_supported(struct tb_client *c);
/* Register the mapping of size bytes at p with cuMemHostRegister
 * (read-only unless writable); buffer_id, when not 0, names it in errors.
 * *pinned 1 when registered, 0 when no CUDA driver loads here (then 0 is
 * returned: the fallback to plain host memory). A driver that refuses is
 * TB_ECUDA, set on c, naming the kind; nothing is registered then. */
int tb__pinned_pin(struct tb_client *c, void *p, size_t size, int writable,
                   uint64_t buffer_id, int *pinned);
/* Undo tb__pinned_pin (before the munmap). Any thread. */
void tb__pinned_unpin(void *p);

/* ---- cuda/pinned_lease.c: the streams that read a pinned lease ---- */

/* A lease of a mapping pinned here (its state zeroed, at most
 * TB__KIND_LEASE_STATE bytes): make sure the done event of device 0 is
 * registered, and remember the acquire's stream (NULL: none yet) as one
 * that reads it. A lease that does not begin so (no driver here) is read
 * by the host alone, and the functions below do nothing for it. Errors are
 * set on c; call_lock held. */
int tb__pinned_lease_begin(struct tb_client *c, void *stream, void *state);
/* kind.h's ready_wait, use_locked and done_record_locked for pinned
 * leases: remember the stream; record the done event after the declared
 * streams, or on the contract's default stream when none was declared
 * (nothing under TB_CONTRACT_EXPLICIT: the host read it). */
int tb__pinned_lease_wait(struct tb__conn *k, void *state, const DLTensor *t,
                          void *stream);
int tb__pinned_lease_use_locked(struct tb__conn *k, void *state,
                                void *stream);
int tb__pinned_lease_end_locked(struct tb__conn *k, void *state,
                                void *stream, struct tb__lease_done *done);
/* kind.h's done_wait for a version of a pinned buffer: stream NULL (the
 * host rewrites it) blocks until every done event completes; a stream
 * waits for them on the GPU instead. */
int tb__pinned_done_wait(struct tb_client *c, const struct tb__freed *f,
                         void *stream);

/* ---- tensor.c: the one check of a tensor to publish ---- */

/* ndim (against the daemon's max_ndim), dtype, and data + byte_offset: the
 * storage bits of one element into *elem_bits, the address of its first
 * byte into *start. Errors are set on c. */
int tb__tensor_check(struct tb_client *c, const DLTensor *t,
                     uint64_t *elem_bits, uintptr_t *start);
/* The tensor's elements, laid out as flags say, lie inside the size bytes
 * at base (what: "buffer", "allocation", for the message). */
int tb__tensor_fits(struct tb_client *c, const DLTensor *t,
                    uint64_t elem_bits, uint64_t flags, uintptr_t start,
                    uintptr_t base, uint64_t size, const char *what);

#endif /* TB_KIND_H */
