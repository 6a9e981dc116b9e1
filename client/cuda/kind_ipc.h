/* SPDX-License-Identifier: Apache-2.0 */
/* Internal: the legacy CUDA IPC memory kind (kind_ipc.c), the state it
 * keeps in mappings and leases, and its functions behind the kind table
 * (kind.h). Only client/cuda/ includes this. */
#ifndef TB_CUDA_KIND_IPC_H
#define TB_CUDA_KIND_IPC_H

#include "kind.h"

struct tb__cuda_acq;
struct tb__cuda_client;
struct tb__cuda_conn;
struct tb__cuda_view;

/* The kind's state in the client and the connection (kind.h). */
#define C_CUDA(c) ((struct tb__cuda_client *)(c)->kind[TB_MEMORY_CUDA_IPC])
#define K_CUDA(k) ((struct tb__cuda_conn *)(k)->kind[TB_MEMORY_CUDA_IPC])

/* A consumer's mapping-cache entry of a CUDA_IPC buffer. */
struct tb__cuda_map {
  struct tb__map m;
  int device; /* ordinal in this process of the memory's device (matched
               * by uuid) */
  uint8_t uuid[TB__UUID_SIZE];
  /* the IPC handle, opened lazily once per consumer device (a mapping
   * opened in one device's context is never handed to another device),
   * closed by tb__cuda_map_close */
  uint8_t handle[TB__CUDA_IPC_HANDLE_SIZE];
  struct tb__cuda_view *views;
};


/* tb_lease_wait: make stream (resolved under k's contract) wait for a
 * lease's ready event, and remember it in a (tb__cuda_lease_use_locked).
 * Takes only k->lock; any thread. */
int tb__cuda_lease_wait(struct tb__conn *k, struct tb__cuda_acq *a,
                        uint64_t event_id, const uint8_t *handle,
                        const uint8_t *uuid, int complete, void *stream);
/* Producer: make stream wait on the consumers' done events. */
int tb__cuda_wait_done(struct tb_client *c, const struct tb__freed *f,
                       void *stream);

/* Consumer: map a CUDA_IPC buffer (new cache entry, not yet inserted). */
int tb__cuda_map_open(struct tb_client *c,
                      const Tensorbroker__V1__BufferInfo *bi,
                      struct tb__cuda_map **out);
/* A stream a consumer declared for a lease: to acquire, tb_lease_wait,
 * tb_lease_use or tb_release (docs/cuda.md, "When a lease ends"). The done
 * event is recorded on every one of them when the lease ends. */
#define TB__LEASE_STREAMS 8 /* declared ones; the release stream has one more */
struct tb__lease_stream {
  void *stream;         /* tb_cu_stream: legacy, per-thread or a CUstream */
  void *ctx;            /* tb_cu_context the stream runs in */
  int device;           /* the context's device ordinal */
  pthread_t thread;     /* per-thread default stream: whose it is */
};

struct tb__cuda_acq {
  /* the streams the consumer declared, in the order it declared them */
  unsigned n_streams;
  struct tb__lease_stream streams[TB__LEASE_STREAMS + 1];
  uint64_t base;   /* the buffer's byte 0 as this consumer addresses it */
  int done_device; /* device whose done event the release records */
  int enter;       /* 1: a consumer device was given; default streams at
                    * release and tb_lease_wait are that device's */
  int implicit;    /* the contract chose the stream */
  /* TB_ACQUIRE_COPY_TO_DEVICE across devices (copy != 0): */
  uint64_t copy;          /* the allocation on the consumer's device */
  void *copy_ctx;         /* its context (tb_cu_context) */
  int copy_pooled;        /* cuMemAllocAsync'ed: freed with cuMemFreeAsync */
  void *copy_event;       /* plain event recorded after the copy */
  uint64_t done_event_id; /* done event recorded after the copy, 0: none */
};

/* Consumer, while an Acquire's request is in flight: when the driver is
 * loaded and a context is current, make the done event this client will
 * need for that device (if it has none yet), so that a new client's first
 * CUDA acquire does not create it after the reply. Quiet on failure. */
void tb__cuda_acquire_early(struct tb_client *c);
/* tb_client_connect, between sending the Hello and reading its reply
 * (unless no_prefetch): when this thread has a CUDA context current
 * (tb__cuda_context_current), make the done event of the current device
 * and send its registration; tb__cuda_connect_end reads the reply (or,
 * hello_ok 0, drops the event). The client's first CUDA acquire then makes
 * one request, not two, and connect waits for one round trip (docs/cuda.md,
 * "Ready at connect"). Quiet on failure. */
void tb__cuda_connect_begin(struct tb_client *c);
void tb__cuda_connect_end(struct tb_client *c, int hello_ok);
/* Consumer, on a NewVersion notice that carries a buffer (Hello.prefetch):
 * when the driver is loaded and a context is current, open the buffer for
 * the current device into the mapping cache, and the ready event (unless
 * complete) into the event cache, so that the acquire that follows finds
 * both. Quiet: a failure is left for that acquire to meet and report. */
void tb__cuda_prefetch(struct tb_client *c,
                       const Tensorbroker__V1__BufferInfo *bi,
                       const Tensorbroker__V1__EventInfo *ready);
/* Consumer: make the mapping (or copy) for the consumer's device, make
 * the acquire stream wait on the ready event, make sure a done event is
 * registered for the device. device -1: the memory's own device (or the
 * current context's, as before); flags: TB_ACQUIRE_*. [lo, hi): the bytes of
 * the buffer the tensor touches (what a copy copies). */
int tb__cuda_acquire(struct tb_client *c, struct tb__cuda_map *m,
                     const Tensorbroker__V1__EventInfo *ready, void *stream,
                     int device, unsigned flags, uint64_t lo, uint64_t hi,
                     struct tb__cuda_acq *out);
/* Consumer: a lease ends. stream (the release's; NULL: the streams the
 * lease remembers, or the contract's default when it remembers none) joins
 * the remembered ones, and the done event of a->done_device is recorded
 * after the work of all of them (one stream: on it; several: on a stream
 * of the library's that waits for each). Writes the registered event id, 0
 * when there is nothing to wait for (no stream declared, or all idle).
 * TB__LEASE_LATER when a remembered stream is capturing a graph (nothing
 * can be recorded after its real work until the capture ends): the caller
 * keeps the lease and asks again later, with stream NULL. Other errors:
 * the lease ends without a done event. Caller holds k->lock. */
int tb__cuda_lease_end_locked(struct tb__conn *k, struct tb__cuda_acq *a,
                              void *stream, uint64_t *done_event_id,
                              int *implicit);
/* Consumer: remember stream (resolved under k's contract; -1 adds
 * nothing) as one that reads the lease. TB_ELIMIT beyond
 * TB__LEASE_STREAMS. Caller holds k->lock. */
int tb__cuda_lease_use_locked(struct tb__conn *k, struct tb__cuda_acq *a,
                              void *stream);
/* Consumer: free a copy made by tb__cuda_acquire on the stream its lease
 * remembers (stream: the release's, as for tb__cuda_lease_end_locked;
 * nothing remembered and no-sync: the copy's device's legacy stream),
 * destroy its event. */
int tb__cuda_copy_free(struct tb__conn *k, struct tb__cuda_acq *a,
                       void *stream);
/* tb_lease_wait for a copy: make stream wait for the copy's event. */
int tb__cuda_copy_wait(struct tb__conn *k, struct tb__cuda_acq *a,
                       int device, void *stream);
/* Free the client's (producer, event cache) and the connection's CUDA
 * state. */
void tb__cuda_client_free(struct tb_client *c);
void tb__cuda_conn_free(struct tb__cuda_conn *cc);
/* Release an unused CUDA mapping (its views; the entry stays). */
void tb__cuda_map_close(struct tb__cuda_map *m);

/* A lease's CUDA state (kind.h: the lease keeps it for the kind). */
struct tb__cuda_lease {
  struct tb__cuda_acq acq; /* the consumer device's done event, mapping or
                            * copy */
  /* the producer's ready event, for tb_lease_wait (0: none) */
  uint64_t ready_event_id;
  int ready_complete; /* finished at publish: only a capture waits */
  uint8_t ready_handle[TB__CUDA_IPC_HANDLE_SIZE];
  uint8_t ready_uuid[TB__UUID_SIZE];
};

#endif /* TB_CUDA_KIND_IPC_H */
