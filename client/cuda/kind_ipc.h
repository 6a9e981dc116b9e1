/* SPDX-License-Identifier: Apache-2.0 */
/* Internal: the legacy CUDA IPC memory kind (kind_ipc.c), the state it
 * keeps in mappings and leases, and its functions behind the kind table
 * (kind.h), in four files: kind_ipc.c (the table, consumer mappings and
 * acquire, prefetch), ipc_producer.c (registrations, ready events),
 * ipc_events.c (event tables, done events), ipc_lease.c (a lease's
 * streams and its end). Only client/cuda/ includes this. */
#ifndef TB_CUDA_KIND_IPC_H
#define TB_CUDA_KIND_IPC_H

#include "kind.h"

#include "cuda.h"
#include "signal.h"

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
  /* How a view for a device other than those in views opens; NULL: the
   * IPC handle (cuIpcOpenMemHandle). Another kind whose mappings are this
   * struct (kind_vmm.c) says here how it reaches a device, or why not. */
  int (*view_open)(struct tb__cuda_map *m, int dev, tb_cu_deviceptr *p,
                   int *local, char *why, size_t whylen);
  /* A VMM buffer's signal area as mapped here (BufferInfo.signal_offset;
   * docs/cuda.md, "Signals"): word 0, the producer's ready counter, and
   * its size in bytes; 0: none. done_slot: this session's done slot
   * there (AcquireReply.done_slot; 0: none), written through done. */
  tb_cu_deviceptr signal;
  uint64_t signal_bytes;
  uint32_t done_slot;
  struct tb__signal done;
  /* the signal area where this process may write it (the same as signal
   * for a read-write mapping; 0: not yet), made by signal_rw_open */
  tb_cu_deviceptr signal_rw;
  int (*signal_rw_open)(struct tb__cuda_map *m, char *why, size_t whylen);
};


/* tb_lease_wait: make stream (resolved under k's contract) wait for a
 * lease's ready event (or, where the event does not reach this process,
 * signal_value != 0: the buffer's ready signal), and remember it in a
 * (tb__cuda_lease_use_locked). Takes only k->lock; any thread. */
int tb__cuda_lease_wait(struct tb__conn *k, struct tb__cuda_acq *a,
                        uint64_t event_id, const uint8_t *handle,
                        const uint8_t *uuid, int complete,
                        uint64_t signal_value, void *stream);
/* TB_ENOTSUP (set on c, saying why) when a consumer in another PID
 * namespace or with another /dev/shm released f with a done event and no
 * done signal: its reads cannot be waited for. Else 0. Every CUDA kind's
 * done_wait asks it first, whatever the stream. */
int tb__ci_done_unreachable(struct tb_client *c, const struct tb__freed *f);
/* Producer: make stream wait on the consumers' done events (those of
 * consumers in another PID namespace or with another /dev/shm, whose
 * events do not reach here, are skipped: tb__ci_done_unreachable lets
 * through only those with a done signal, which only buffers with a signal
 * area give, and c has none of that buffer left). */
int tb__cuda_wait_done(struct tb_client *c, const struct tb__freed *f,
                       void *stream);
/* The same, where the events of consumers in another PID namespace or
 * with another /dev/shm are stood for by their done signals: word_of
 * finds done slot slot's word in buffer buffer_id of c (0; 1: c has no
 * such buffer any more, nothing left to rewrite; or an error). */
typedef int tb__signal_word_fn(struct tb_client *c, uint64_t buffer_id,
                               uint32_t slot, tb_cu_deviceptr *word,
                               char *why, size_t whylen);
int tb__cuda_wait_done_signals(struct tb_client *c, const struct tb__freed *f,
                               void *stream, tb__signal_word_fn *word_of);

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
  uint64_t thread;      /* per-thread default stream: whose it is
                         * (tb__thread_id) */
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
  int ready_gone; /* the ready event's producer died after its work on the
                   * version finished: nothing to wait for */
  struct tb__cuda_map *map; /* the mapping (the lease holds a reference):
                             * its done slot, if any, gets the done signal */
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
 * keeps the lease and asks again later, with stream NULL. A release stream
 * that cannot be named (a bad value) is returned as an error after the
 * done event was recorded on the remembered streams (*done_event_id set);
 * other errors: no done event. Default streams (NULL, legacy, per-thread)
 * are those of a->done_device when a device was given at acquire or no
 * context is current. Caller holds k->lock. */
int tb__cuda_lease_end_locked(struct tb__conn *k, struct tb__cuda_acq *a,
                              void *stream, struct tb__lease_done *done);
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
  /* the event does not reach this process: tb_lease_wait waits for the
   * ready signal instead (0: none) */
  uint64_t ready_signal;
};

/* ---- shared by the files of the kind: kind_ipc.c (the table, mappings,
 * acquire), ipc_producer.c, ipc_events.c, ipc_lease.c ---- */

#define TB__EVENT_CACHE_MAX 256 /* opened foreign events per client */
#define TB__READY_EVENTS_MAX 256 /* producer streams per client */

/* Producer: an allocation registered with the daemon, keyed by its base. */
struct tb__cuda_reg {
  tb_cu_deviceptr base;
  size_t size;
  uint64_t alloc_id;
  uint64_t buffer_id;
  int device;
  uint8_t uuid[TB__UUID_SIZE];
  uint8_t handle[TB__CUDA_IPC_HANDLE_SIZE];
  UT_hash_handle hh;
};

/* An interprocess event of ours, registered once with the daemon: a
 * producer's ready event (one per device and producer stream, re-recorded
 * for every version), or a consumer's done event (one per device). */
struct tb__cuda_ev {
  struct tb__cuda_ev *next;
  tb_cu_event ev;
  uint64_t event_id;
  int device;
  tb_cu_stream stream; /* ready events: the producer stream it records on */
  uint64_t thread;     /* ready events on a per-thread default stream: the
                        * thread whose stream it is (tb__thread_id) */
  int recorded;        /* ready events: recorded at least once */
  /* done events: the stream of the latest record (last.stream NULL: none
   * yet) and, for a per-thread default stream, whose it is
   * (tb__ci_done_record_locked) */
  struct tb__cuda_stream last;
  uint64_t last_thread;
};

/* Another process's event, opened once and kept (and a wait on it costs
 * ~150 us even when it has completed: docs/cuda.md). */
struct tb__cuda_open_ev {
  uint64_t event_id; /* key */
  tb_cu_event ev;
  int own; /* created by this process: used as is, never destroyed here */
  uint64_t stamp;
  UT_hash_handle hh;
};

/* Events this process created, by handle, process-wide: a consumer in the
 * producer's own process (another tb_client, or the same) uses the event
 * itself rather than opening its handle, as for memory (opening one's own
 * IPC handle fails). */
struct tb__own_ev {
  uint8_t handle[TB__CUDA_IPC_HANDLE_SIZE]; /* key */
  tb_cu_event ev;
  UT_hash_handle hh;
};

/* A consumer's done event whose registration is in flight. */
struct done_pending {
  struct tb__cuda_ev *e; /* NULL: nothing in flight */
  uint64_t request_id;
};

struct tb__cuda_client {
  struct tb__cuda_reg *regs;
  struct tb__cuda_ev *ready;
  int has_done; /* a done event is registered (the connection's done list is not empty) */
  /* A done event made ahead by tb__cuda_acquire_early, not registered
   * yet (ev NULL: none); tb__ci_done_event_begin takes it for its device. */
  struct {
    tb_cu_event ev;
    int device;
    uint8_t handle[TB__CUDA_IPC_HANDLE_SIZE];
  } spare;
  /* The done event tb__cuda_connect_begin sent to be registered, whose
   * reply tb__cuda_connect_end reads (e NULL: none). */
  struct done_pending connect;
};

/* Lives in the refcounted connection, under its lock: deleters record the
 * done events, and tb_lease_wait (any thread, also after disconnect) uses
 * the cache of opened events, so neither may need the call lock. */
struct tb__cuda_conn {
  struct tb__cuda_ev *done; /* one per device ordinal */
  struct tb__cuda_open_ev *opened;
  size_t n_opened;
  uint64_t clock;
  struct tb__cuda_join *joins;     /* one per done event's device */
  struct tb__cuda_join_ev *join_evs; /* one per context of a joined stream */
};

/* A lease read on several streams ends with one done event recorded on a
 * stream of ours that first waits for each of them (a plain event recorded
 * on each): the consumer's streams get nothing but those records. */
struct tb__cuda_join {
  struct tb__cuda_join *next;
  int device;
  tb_cu_context ctx;
  tb_cu_stream stream; /* non-blocking, created in ctx */
};

struct tb__cuda_join_ev {
  struct tb__cuda_join_ev *next;
  tb_cu_context ctx;
  tb_cu_event ev; /* plain; re-recorded for every stream it joins: a wait
                   * takes the record current when it is enqueued */
};

/* ---- consumer ---- */

/* A buffer's mapping for one consumer device: the IPC handle opened in a
 * context of that device. Views hang off the cache entry (struct tb__map)
 * and are added only by tb_acquire, which holds the call lock and a
 * reference on the entry; they are closed with it once unused. */
struct tb__cuda_view {
  struct tb__cuda_view *next;
  int device;        /* ordinal of the context's device: the key */
  tb_cu_context ctx; /* the context it was opened in */
  tb_cu_deviceptr p; /* the allocation's base as that device addresses it */
  int local;         /* this process's own allocation: never closed */
};

/* Work done ahead (opening ahead, Ready at connect) is quiet: the caller's
 * last error (tb_client_last_error) is kept across it. */
struct kept_error {
  char text[TB__LAST_ERROR_MAX];
  size_t len;
};

int tb__ci_own_event_create(tb_cu_event *ev, uint8_t *handle, char *why,
    size_t whylen);

void tb__ci_own_event_destroy(tb_cu_event ev);

/* The connection's CUDA state, created on first use. Caller holds k->lock. */
struct tb__cuda_conn *tb__ci_conn_cuda_locked(struct tb__conn *k);

/* The connection's done event of device, or NULL (none registered yet, or
 * no CUDA state). Caller holds k->lock. */
struct tb__cuda_ev *tb__ci_done_event_locked(struct tb__conn *k, int device);

int tb__ci_register_event(struct tb_client *c, const uint8_t *handle,
    int device, const uint8_t *uuid, uint64_t *id);

/* Open (or find) another process's event in the connection's cache.
 * Caller holds k->lock; the event stays valid while the lock is held (an
 * evicted event is destroyed, which is safe with waits already enqueued). */
int tb__ci_open_event_locked(struct tb__conn *k, uint64_t event_id,
    const uint8_t *handle, const uint8_t *uuid,
    tb_cu_event *out, char *why, size_t whylen);

/* Open the event and make s wait for it, under the connection lock.
 * complete: the work the event marks had finished when it was published
 * (Publish.ready_complete); then only a capturing s waits, so that the graph
 * waits, when it runs, for the producer's latest publish from that stream
 * (the event's latest record); otherwise the event is not even opened. */
int tb__ci_wait_event(struct tb__conn *k, uint64_t event_id,
    const uint8_t *handle, const uint8_t *uuid,
    int complete, const struct tb__cuda_stream *s,
    char *why, size_t whylen);

void tb__ci_error_keep(const struct tb_client *c, struct kept_error *ke);

void tb__ci_error_restore(struct tb_client *c, const struct kept_error *ke);

/* The consumer's done event for a device, created in a context of that
 * device and registered while we hold the call lock, so that deleters
 * (which may not take it) find it ready. The registration is sent here
 * and its reply read by tb__ci_done_event_finish, so that the caller can open
 * memory meanwhile (a new client's first acquire then costs one round
 * trip to the daemon, not two). Nothing else may be sent in between. */
int tb__ci_done_event_begin(struct tb_client *c, int device,
    struct done_pending *pd);

int tb__ci_done_event_finish(struct tb_client *c, struct done_pending *pd);

int tb__ci_done_event_ensure(struct tb_client *c, int device);

/* Make s wait for the version's ready event (none, or a no-sync s: 0).
 * One whose producer died (EventInfo.owner_died) and that was not complete
 * at publish is judged by the buffer's ready signal, whatever s: 1 if its
 * work finished (nothing to wait for, now or later), else TB_ECLOSED
 * (also without a signal). One registered by a process in another PID
 * namespace or with another /dev/shm is never opened: complete, 1; else s
 * waits for the ready signal, or TB_ENOTSUP without one. */
int tb__ci_wait_ready(struct tb_client *c, const struct tb__cuda_map *m,
    const Tensorbroker__V1__EventInfo *ready,
    const struct tb__cuda_stream *s);

/* Record the done event of device on s, under the connection lock. */
int tb__ci_record_done(struct tb__conn *k, int device,
    const struct tb__cuda_stream *s, uint64_t *id);

/* Record the done event e after the work queued on target (a resolved
 * stream), so that a wait on e's latest record also waits for everything
 * its earlier records marked: directly on target when e's previous record
 * was on that stream or has completed, else on the join stream of e's
 * device after it waited for that previous record and for target. complete
 * as tb__cuda_record's (target idle: nothing recorded). Caller holds
 * k->lock. */
int tb__ci_done_record_locked(struct tb__conn *k, struct tb__cuda_ev *e,
                              const struct tb__cuda_stream *target,
                              int *complete, char *why, size_t whylen);

/* kind.h, publish: the allocation holding start, registered once; the
 * ready event of (device, stream) recorded. */
int tb__ci_publish(struct tb_client *c, const DLTensor *t, uintptr_t start,
    uint64_t elem_bits, uint64_t flags, void *stream,
    struct tb__kind_publish *out);

/* Remember s (resolved) as a stream that reads the lease a, unless it is
 * no-sync or remembered already; room: how many a may hold. */
int tb__ci_lease_stream_add(struct tb__cuda_acq *a,
    const struct tb__cuda_stream *s, unsigned room,
    char *why, size_t whylen);

int tb__ci_cuda_client(struct tb_client *c, struct tb__cuda_client **out);

/* ---- shared with the other kinds whose memory is device memory with
 * interprocess events (kind_vmm.c): their table rows name these ---- */

/* Record the ready event of (device, the stream s resolves to) for a
 * version of buffer_id at byte_offset, and fill out (publish's tail).
 * With ready (a VMM buffer's signal area: its word 0 and writer state),
 * work still in flight also gets the ready signal written after it
 * (out->ready_signal), unless the stream captures. */
int tb__ci_publish_ready(struct tb_client *c, void *stream, int device,
                         const uint8_t *uuid, uint64_t buffer_id,
                         uint64_t byte_offset, struct tb__signal *ready,
                         tb_cu_deviceptr ready_word,
                         struct tb__kind_publish *out);
/* kind.h's acquire, ready_wait, use_locked, done_record_locked, copy_free
 * over a struct tb__cuda_map and a struct tb__cuda_lease. */
int tb__ci_kind_acquire(struct tb_client *c, struct tb__map *map,
                        const Tensorbroker__V1__AcquireReply *ar,
                        const struct tb_acquire_options *o, void *state,
                        struct tb__kind_acq *out);
int tb__ci_kind_ready_wait(struct tb__conn *k, void *state, const DLTensor *t,
                           void *stream);
int tb__ci_kind_use_locked(struct tb__conn *k, void *state, void *stream);
int tb__ci_kind_done_record_locked(struct tb__conn *k, void *state,
                                  void *stream, struct tb__lease_done *done);
int tb__ci_kind_copy_free(struct tb__conn *k, void *state, void *stream);

#endif /* TB_CUDA_KIND_IPC_H */
