/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA legacy-IPC paths of the client: which allocation a published
 * tensor lives in and its registration, the producer's pool of ready events,
 * the consumer's cache of opened events, its done events, and the stream
 * contract applied on both sides. The driver calls themselves are in
 * client/cuda/; this file decides when to make them and talks to the daemon.
 *
 * Host exchange never reaches this file's CUDA calls: every entry point is
 * only called for kDLCUDA tensors, CUDA_IPC buffers or versions that carry
 * done events, and each returns TB_ENOCUDA when the driver cannot be
 * loaded. */
#include "kind_ipc.h"
#include "stats.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utlist.h>

#include "cuda.h"

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
  int recorded;        /* ready events: recorded at least once */
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
static pthread_mutex_t own_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tb__own_ev *own_events;

static int own_event_create(tb_cu_event *ev, uint8_t *handle, char *why,
                            size_t whylen) {
  struct tb__own_ev *o = calloc(1, sizeof(*o));
  int rc;

  if (o == NULL)
    return TB_ENOMEM;
  rc = tb__cuda_event_create(ev, handle, why, whylen);
  if (rc < 0) {
    free(o);
    return rc;
  }
  memcpy(o->handle, handle, TB__CUDA_IPC_HANDLE_SIZE);
  o->ev = *ev;
  pthread_mutex_lock(&own_lock);
  tb__hash_oom = 0;
  HASH_ADD(hh, own_events, handle, TB__CUDA_IPC_HANDLE_SIZE, o);
  pthread_mutex_unlock(&own_lock);
  if (tb__hash_oom) {
    tb__cuda_event_destroy(*ev);
    free(o);
    return TB_ENOMEM;
  }
  return 0;
}

static void own_event_destroy(tb_cu_event ev) {
  struct tb__own_ev *o, *tmp;

  pthread_mutex_lock(&own_lock);
  HASH_ITER(hh, own_events, o, tmp) {
    if (o->ev == ev) {
      HASH_DEL(own_events, o);
      free(o);
      break;
    }
  }
  pthread_mutex_unlock(&own_lock);
  tb__cuda_event_destroy(ev);
}

static int own_event_find(const uint8_t *handle, tb_cu_event *ev) {
  struct tb__own_ev *o;

  pthread_mutex_lock(&own_lock);
  HASH_FIND(hh, own_events, handle, TB__CUDA_IPC_HANDLE_SIZE, o);
  if (o != NULL)
    *ev = o->ev;
  pthread_mutex_unlock(&own_lock);
  return o != NULL;
}

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
   * yet (ev NULL: none); done_event_begin takes it for its device. */
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

/* The connection's CUDA state, created on first use. Caller holds k->lock. */
static struct tb__cuda_conn *conn_cuda_locked(struct tb__conn *k) {
  if (K_CUDA(k) == NULL)
    k->kind[TB_MEMORY_CUDA_IPC] = calloc(1, sizeof(struct tb__cuda_conn));
  return K_CUDA(k);
}

static int cuda_client(struct tb_client *c, struct tb__cuda_client **out) {
  const struct tb_cuda *cu;

  if (tb__cuda_load(&cu) != 0)
    return tb__set_error(c, TB_ENOCUDA, "CUDA not available: %s",
                         tb__cuda_why());
  if (C_CUDA(c) == NULL) {
    c->kind[TB_MEMORY_CUDA_IPC] = calloc(1, sizeof(struct tb__cuda_client));
    if (C_CUDA(c) == NULL)
      return TB_ENOMEM;
  }
  *out = C_CUDA(c);
  return 0;
}

/* ---- registration round trips (call_lock held) ---- */

/* EventRegister in two halves, so that a consumer's done event can be
 * registered while its first memory handle opens. */
static int event_register_send(struct tb_client *c, const uint8_t *handle,
                               int device, const uint8_t *uuid,
                               uint64_t *request_id) {
  Tensorbroker__V1__EventRegister er = TENSORBROKER__V1__EVENT_REGISTER__INIT;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;

  dev.type = kDLCUDA;
  dev.id = device;
  dev.uuid.data = (uint8_t *)uuid;
  dev.uuid.len = TB__UUID_SIZE;
  er.cuda_ipc_event_handle.data = (uint8_t *)handle;
  er.cuda_ipc_event_handle.len = TB__CUDA_IPC_HANDLE_SIZE;
  er.device = &dev;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_EVENT_REGISTER;
  r.event_register = &er;
  return tb__send_request(c, &r, NULL, 0, request_id);
}

static int event_register_reply(struct tb_client *c, uint64_t request_id,
                                uint64_t *id) {
  tb__server_message *m = NULL;
  int fds[TB__MAX_FDS], nfds = 0, rc;

  rc = tb__await_reply(c, request_id, 0, &m, fds, &nfds);
  if (rc < 0)
    return rc;
  for (int i = 0; i < nfds; i++)
    close(fds[i]);
  if (m->reply->body_case != TENSORBROKER__V1__REPLY__BODY_EVENT_REGISTER ||
      m->reply->event_register == NULL ||
      m->reply->event_register->event_id == 0) {
    tb__msg_free(c, m);
    return tb__set_error(c, TB_EPROTO, "EventRegister answered without an id");
  }
  *id = m->reply->event_register->event_id;
  tb__msg_free(c, m);
  return 0;
}

static int register_event(struct tb_client *c, const uint8_t *handle,
                          int device, const uint8_t *uuid, uint64_t *id) {
  uint64_t request_id = 0;
  int rc;

  rc = event_register_send(c, handle, device, uuid, &request_id);
  if (rc < 0)
    return rc;
  return event_register_reply(c, request_id, id);
}

static int register_alloc(struct tb_client *c, const struct tb__cuda_alloc *a,
                          const uint8_t *handle, uint64_t *id) {
  Tensorbroker__V1__BufferRegister br = TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;

  dev.type = kDLCUDA;
  dev.id = a->device;
  dev.uuid.data = (uint8_t *)a->uuid;
  dev.uuid.len = TB__UUID_SIZE;
  br.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC;
  br.size = a->size;
  br.device = &dev;
  br.cuda_ipc_handle.data = (uint8_t *)handle;
  br.cuda_ipc_handle.len = TB__CUDA_IPC_HANDLE_SIZE;
  return tb__buffer_register(c, &br, -1, id);
}

static void unregister_buffer(struct tb_client *c, uint64_t id) {
  (void)tb__buffer_unregister(c, id);
}

/* ---- producer ---- */

/* Drop the registrations of allocations the application has freed (or
 * replaced) since they were published, except keep (handled by the
 * caller). Called when a new allocation registers, so a producer that
 * allocates afresh does not pile up registrations (--max-buffers) and the
 * daemon retires the dead buffers, whose mappings consumers then close:
 * a consumer's IPC mapping keeps the producer's freed memory alive. A
 * producer that never registers anything new keeps its stale entries, at
 * most as many as it ever had live. One cuPointerGetAttribute per entry. */
static void sweep_freed(struct tb_client *c, struct tb__cuda_client *cc,
                        const struct tb__cuda_reg *keep) {
  struct tb__cuda_reg *r, *tmp;

  HASH_ITER(hh, cc->regs, r, tmp) {
    if (r == keep || tb__cuda_alloc_alive(r->base, r->alloc_id))
      continue;
    HASH_DEL(cc->regs, r);
    unregister_buffer(c, r->buffer_id);
    tb__cuda_unexport_mem(r->base);
    free(r);
  }
}

/* The registration for allocation a, made or reused. A second publish from
 * the same allocation (same base, size and driver allocation id) reuses its
 * buffer id and makes no further driver call (cuIpcGetMemHandle is counted
 * by the GPU tests). Anything else at a known base means the memory was
 * freed and allocated again, possibly at the same address with the same
 * size (CU_POINTER_ATTRIBUTE_BUFFER_ID tells them apart): the old
 * registration is dropped (the daemon retires it once unused) and the new
 * allocation registered, so consumers map the new memory, never the old. */
static int alloc_registration(struct tb_client *c, struct tb__cuda_client *cc,
                              const struct tb__cuda_alloc *a,
                              struct tb__cuda_reg **out) {
  uint8_t handle[TB__CUDA_IPC_HANDLE_SIZE];
  struct tb__cuda_reg *reg = NULL;
  char why[256] = "";
  int rc;

  HASH_FIND(hh, cc->regs, &a->base, sizeof(a->base), reg);
  if (reg != NULL && reg->size == a->size && reg->alloc_id == a->alloc_id) {
    *out = reg;
    return 0;
  }
  rc = tb__cuda_export_mem(a, handle, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  sweep_freed(c, cc, reg);
  if (reg != NULL) {
    HASH_DEL(cc->regs, reg);
    unregister_buffer(c, reg->buffer_id);
    /* export_mem above took a second reference on the same base */
    tb__cuda_unexport_mem(reg->base);
    free(reg);
  }
  reg = calloc(1, sizeof(*reg));
  if (reg == NULL) {
    tb__cuda_unexport_mem(a->base);
    return TB_ENOMEM;
  }
  rc = register_alloc(c, a, handle, &reg->buffer_id);
  if (rc < 0) {
    tb__cuda_unexport_mem(a->base);
    free(reg);
    return rc;
  }
  reg->base = a->base;
  reg->size = a->size;
  reg->alloc_id = a->alloc_id;
  reg->device = a->device;
  memcpy(reg->uuid, a->uuid, TB__UUID_SIZE);
  memcpy(reg->handle, handle, sizeof(handle));
  tb__hash_oom = 0;
  HASH_ADD(hh, cc->regs, base, sizeof(reg->base), reg);
  if (tb__hash_oom) {
    unregister_buffer(c, reg->buffer_id);
    tb__cuda_unexport_mem(reg->base);
    free(reg);
    return tb__set_error(c, TB_ENOMEM, "out of memory for the buffer table");
  }
  *out = reg;
  return 0;
}

/* The ready event of (device, producer stream), created and registered the
 * first time that stream publishes, then re-recorded for every version the
 * stream publishes. Re-recording is safe because all records are on one
 * stream: a later record completes only after everything an earlier one
 * marked, so a consumer waiting on the latest record can only wait longer,
 * never too short. It is also what CUDA graph replay needs: a captured
 * external wait waits for the event's latest record at launch time, so a
 * graph captured on version N waits, on replay, for the producer's newest
 * publish from the same stream (measured on H200, GPU-FACTS.md). One event
 * per version would leave a replayed graph waiting on a stale event. */
static int ready_event_get(struct tb_client *c, struct tb__cuda_client *cc,
                           int device, const uint8_t *uuid,
                           tb_cu_stream stream, struct tb__cuda_ev **out) {
  uint8_t handle[TB__CUDA_IPC_HANDLE_SIZE];
  struct tb__cuda_ev *e;
  char why[256] = "";
  int rc, ordinal, n = 0;

  LL_FOREACH(cc->ready, e) {
    if (e->device == device && e->stream == stream) {
      *out = e;
      return 0;
    }
    n++;
  }
  if (n >= TB__READY_EVENTS_MAX)
    return tb__set_error(c, TB_ELIMIT,
                         "more than %d producer streams published on this "
                         "client; publish from fewer streams",
                         TB__READY_EVENTS_MAX);
  /* the event must belong to the device's context */
  rc = tb__cuda_device_by_uuid(uuid, &ordinal, NULL, NULL, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  e = calloc(1, sizeof(*e));
  if (e == NULL)
    return TB_ENOMEM;
  rc = own_event_create(&e->ev, handle, why, sizeof(why));
  if (rc < 0) {
    free(e);
    return tb__set_error(c, rc, "%s", why);
  }
  rc = register_event(c, handle, device, uuid, &e->event_id);
  if (rc < 0) {
    own_event_destroy(e->ev);
    free(e);
    return rc;
  }
  e->device = device;
  e->stream = stream;
  LL_PREPEND(cc->ready, e);
  *out = e;
  return 0;
}

/* kind.h, publish: the allocation holding start, registered once; the
 * ready event of (device, stream) recorded. */
static int ipc_publish(struct tb_client *c, const DLTensor *t, uintptr_t start,
                       uint64_t elem_bits, uint64_t flags, void *stream,
                       struct tb__kind_publish *out) {
  struct tb__cuda_client *cc = NULL;
  struct tb__cuda_stream s;
  struct tb__cuda_alloc a;
  struct tb__cuda_reg *reg = NULL;
  struct tb__cuda_ev *e = NULL;
  char why[256] = "";
  int rc;

  out->ready_complete = 0;
  rc = cuda_client(c, &cc);
  if (rc < 0)
    return rc;
  rc = tb__cuda_stream_resolve(c->conn->contract, stream, &s, why,
                               sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  rc = tb__cuda_locate((const void *)start, 0, &a, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  rc = tb__tensor_fits(c, t, elem_bits, flags, start, (uintptr_t)a.base,
                       a.size, "allocation");
  if (rc < 0)
    return rc;
  rc = alloc_registration(c, cc, &a, &reg);
  if (rc < 0)
    return rc;
  if (!s.no_sync) {
    rc = ready_event_get(c, cc, reg->device, reg->uuid, s.stream, &e);
    if (rc < 0)
      return rc;
    /* skipped on an idle stream once it has a record: a consumer that
     * captures a graph still finds a recorded event to wait on */
    int skipped = 0;
    rc = tb__cuda_record(e->ev, &s, e->recorded, &out->ready_complete,
                         &skipped, why, sizeof(why));
    if (rc < 0)
      return tb__set_error(c, rc, "%s", why);
    if (!skipped)
      e->recorded = 1;
  }
  memcpy(out->uuid, reg->uuid, TB__UUID_SIZE);
  out->dev.type = kDLCUDA;
  out->dev.id = reg->device;
  out->dev.uuid.data = out->uuid;
  out->dev.uuid.len = TB__UUID_SIZE;
  out->buffer_id = reg->buffer_id;
  out->byte_offset = (uint64_t)(start - (uintptr_t)a.base);
  out->ready_event_id = e ? e->event_id : 0;
  return 0;
}

/* ---- opened events (consumer ready events, producer done events) ---- */

/* Open (or find) another process's event in the connection's cache.
 * Caller holds k->lock; the event stays valid while the lock is held (an
 * evicted event is destroyed, which is safe with waits already enqueued). */
static int open_event_locked(struct tb__conn *k, uint64_t event_id,
                             const uint8_t *handle, const uint8_t *uuid,
                             tb_cu_event *out, char *why, size_t whylen) {
  struct tb__cuda_conn *cc = conn_cuda_locked(k);
  struct tb__cuda_open_ev *o;
  struct tb__cuda_devctx dc;
  int rc, ordinal;

  if (cc == NULL)
    return TB_ENOMEM;
  HASH_FIND(hh, cc->opened, &event_id, sizeof(event_id), o);
  if (o != NULL) {
    o->stamp = ++cc->clock;
    *out = o->ev;
    return 0;
  }
  /* The event is opened in a context of its own device (the current one
   * when it is on that device; with none current, that device's primary
   * context stays current, as before). A stream of any other device may
   * then wait on it: cuStreamWaitEvent accepts events of other contexts
   * and devices, with or without peer access. */
  rc = tb__cuda_find_uuid(uuid, &ordinal, why, whylen);
  if (rc < 0)
    return rc;
  rc = tb__cuda_device_enter(ordinal, &dc, why, whylen);
  if (rc < 0)
    return rc;
  while (cc->n_opened >= TB__EVENT_CACHE_MAX) {
    struct tb__cuda_open_ev *v = NULL, *x, *tmp;
    HASH_ITER(hh, cc->opened, x, tmp) {
      if (v == NULL || x->stamp < v->stamp)
        v = x;
    }
    HASH_DEL(cc->opened, v);
    cc->n_opened--;
    /* Destroying an event with waits already enqueued on it is safe: the
     * driver releases it once they complete. */
    if (!v->own)
      tb__cuda_event_destroy(v->ev);
    free(v);
  }
  o = calloc(1, sizeof(*o));
  if (o == NULL) {
    rc = TB_ENOMEM;
    goto out_leave;
  }
  if (own_event_find(handle, &o->ev)) {
    o->own = 1;
  } else {
    rc = tb__cuda_event_open(handle, &o->ev, why, whylen);
    if (rc < 0) {
      free(o);
      goto out_leave;
    }
  }
  o->event_id = event_id;
  o->stamp = ++cc->clock;
  tb__hash_oom = 0;
  HASH_ADD(hh, cc->opened, event_id, sizeof(o->event_id), o);
  if (tb__hash_oom) {
    if (!o->own)
      tb__cuda_event_destroy(o->ev);
    free(o);
    rc = TB_ENOMEM;
    goto out_leave;
  }
  cc->n_opened++;
  *out = o->ev;
  rc = 0;
out_leave:
  tb__cuda_device_leave(&dc);
  return rc;
}

/* Open the event and make s wait for it, under the connection lock.
 * complete: the work the event marks had finished when it was published
 * (Publish.ready_complete); then only a capturing s waits, so that the graph
 * waits, when it runs, for the producer's latest publish from that stream
 * (the event's latest record); otherwise the event is not even opened. */
static int wait_event(struct tb__conn *k, uint64_t event_id,
                      const uint8_t *handle, const uint8_t *uuid,
                      int complete, const struct tb__cuda_stream *s,
                      char *why, size_t whylen) {
  tb_cu_event ev;
  int rc;

  if (complete) {
    rc = tb__cuda_capturing(s, "waiting for the producer's event", why,
                            whylen);
    if (rc <= 0)
      return rc;
  }
  pthread_mutex_lock(&k->lock);
  rc = open_event_locked(k, event_id, handle, uuid, &ev, why, whylen);
  if (rc == 0)
    rc = tb__cuda_wait(s, ev, why, whylen);
  pthread_mutex_unlock(&k->lock);
  return rc;
}

int tb__cuda_wait_done(struct tb_client *c, const struct tb__freed *f,
                       void *stream) {
  struct tb__cuda_client *cc = NULL;
  struct tb__cuda_stream s;
  char why[256] = "";
  int rc;

  rc = cuda_client(c, &cc);
  if (rc < 0)
    return rc;
  rc = tb__cuda_stream_resolve(c->conn->contract, stream, &s, why,
                               sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  if (s.no_sync)
    return 0; /* -1: the caller orders the reuse itself */
  for (size_t i = 0; i < f->n_done; i++) {
    rc = wait_event(c->conn, f->done[i].event_id, f->done[i].handle,
                    f->done[i].uuid, 0, &s, why, sizeof(why));
    if (rc < 0)
      return tb__set_error(c, rc, "%s", why);
  }
  return 0;
}

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

int tb__cuda_map_open(struct tb_client *c,
                      const Tensorbroker__V1__BufferInfo *bi,
                      struct tb__cuda_map **out) {
  struct tb__cuda_client *cc = NULL;
  struct tb__cuda_map *m;
  char why[256] = "";
  int rc, ordinal;

  rc = cuda_client(c, &cc);
  if (rc < 0)
    return rc;
  if (bi->cuda_ipc_handle.len != TB__CUDA_IPC_HANDLE_SIZE ||
      bi->device == NULL || bi->device->uuid.len != TB__UUID_SIZE ||
      bi->size == 0 || bi->size > SIZE_MAX)
    return tb__set_error(c, TB_EPROTO, "CUDA buffer without handle or uuid");
  rc = tb__cuda_find_uuid(bi->device->uuid.data, &ordinal, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  m = calloc(1, sizeof(*m));
  if (m == NULL)
    return TB_ENOMEM;
  m->m.buffer_id = bi->buffer_id;
  m->m.generation = bi->generation;
  m->m.ops = &tb__kind_cuda_ipc;
  m->m.writable = bi->writable != 0;
  m->device = ordinal;
  memcpy(m->uuid, bi->device->uuid.data, TB__UUID_SIZE);
  memcpy(m->handle, bi->cuda_ipc_handle.data, TB__CUDA_IPC_HANDLE_SIZE);
  m->m.size = (size_t)bi->size;
  *out = m;
  return 0;
}

void tb__cuda_map_close(struct tb__cuda_map *m) {
  struct tb__cuda_view *v, *tmp;

  LL_FOREACH_SAFE(m->views, v, tmp) {
    LL_DELETE(m->views, v);
    if (!v->local)
      (void)tb__cuda_close_mem_in(v->ctx, v->p);
    free(v);
  }
}

/* The view of m for device dev, whose context ctx is current, opened
 * there on first use (cuIpcOpenMemHandle with lazy peer access: dev may be
 * another device than the memory's). */
static int view_in(struct tb_client *c, struct tb__cuda_map *m, int dev,
                   tb_cu_context ctx, struct tb__cuda_view **out) {
  struct tb__cuda_view *v;
  char why[256] = "";
  int rc;

  LL_FOREACH(m->views, v) {
    if (v->device == dev) {
      *out = v;
      return 0;
    }
  }
  v = calloc(1, sizeof(*v));
  if (v == NULL)
    return TB_ENOMEM;
  rc = tb__cuda_open_mem_here(m->handle, m->device, m->m.size, &v->p,
                              &v->local,
                              why, sizeof(why));
  if (rc < 0) {
    free(v);
    return tb__set_error(c, rc, "%s", why);
  }
  v->device = dev;
  v->ctx = ctx;
  LL_PREPEND(m->views, v);
  *out = v;
  return 0;
}

/* view_in for the current context's device. */
static int view_here(struct tb_client *c, struct tb__cuda_map *m,
                     struct tb__cuda_view **out) {
  tb_cu_context ctx = NULL;
  char why[256] = "";
  int rc, dev;

  rc = tb__cuda_current_device(&dev, &ctx, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  return view_in(c, m, dev, ctx, out);
}

/* Work done ahead (opening ahead, Ready at connect) is quiet: the caller's
 * last error (tb_client_last_error) is kept across it. */
struct kept_error {
  char text[TB__LAST_ERROR_MAX];
  size_t len;
};

static void error_keep(const struct tb_client *c, struct kept_error *ke) {
  memcpy(ke->text, c->last_error, sizeof(ke->text));
  ke->len = c->last_error_len;
}

static void error_restore(struct tb_client *c, const struct kept_error *ke) {
  memcpy(c->last_error, ke->text, sizeof(ke->text));
  c->last_error_len = ke->len;
}

static void prefetch(struct tb_client *c,
                     const Tensorbroker__V1__BufferInfo *bi,
                     const Tensorbroker__V1__EventInfo *ready) {
  struct tb__conn *k = c->conn;
  struct tb__cuda_view *v;
  struct tb__cuda_map *cm;
  struct tb__map *m;
  tb_cu_context ctx = NULL;
  tb_cu_event ev;
  struct kept_error ke;
  char why[256] = "";
  int dev, rc;

  /* never the first to load the driver or to make a context current */
  if (bi->kind != TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC ||
      !tb__cuda_loaded() ||
      tb__cuda_current_device(&dev, &ctx, why, sizeof(why)) < 0)
    return;
  m = tb__map_get(k, bi->buffer_id, bi->generation);
  if (m != NULL) {
    pthread_mutex_lock(&k->lock);
    tb__map_put_locked(k, m);
    pthread_mutex_unlock(&k->lock);
    return;
  }
  error_keep(c, &ke);
  /* the mapping an acquire on this thread's device would make (view_in,
   * as acquire_default does), kept in the cache without a lease */
  rc = tb__cuda_map_open(c, bi, &cm);
  if (rc == 0) {
    rc = view_in(c, cm, dev, ctx, &v);
    if (rc < 0) {
      tb__map_release_memory(&cm->m);
    } else {
      tb__map_insert(k, &cm->m);
      pthread_mutex_lock(&k->lock);
      tb__map_put_locked(k, &cm->m);
      pthread_mutex_unlock(&k->lock);
    }
  }
  /* a finished version's event is never opened by its acquire either */
  if (rc == 0 && ready != NULL && ready->event_id != 0 && !ready->complete &&
      ready->cuda_ipc_event_handle.len == TB__CUDA_IPC_HANDLE_SIZE) {
    const uint8_t *uuid = bi->device->uuid.data;
    if (ready->device != NULL && ready->device->uuid.len == TB__UUID_SIZE)
      uuid = ready->device->uuid.data;
    pthread_mutex_lock(&k->lock);
    (void)open_event_locked(k, ready->event_id,
                            ready->cuda_ipc_event_handle.data, uuid, &ev, why,
                            sizeof(why));
    pthread_mutex_unlock(&k->lock);
  }
  /* a failure is met again, and reported, by the acquire that needs it */
  error_restore(c, &ke);
}

/* tb__cuda_prefetch, timed for tb__acquire_counters (prefetch_ns). */
void tb__cuda_prefetch(struct tb_client *c,
                       const Tensorbroker__V1__BufferInfo *bi,
                       const Tensorbroker__V1__EventInfo *ready) {
  uint64_t t0 = tb__stat_now();

  prefetch(c, bi, ready);
  tb__stat_prefetch(t0);
}

/* The consumer's done event for a device, created in a context of that
 * device and registered while we hold the call lock, so that deleters
 * (which may not take it) find it ready. The registration is sent here
 * and its reply read by done_event_finish, so that the caller can open
 * memory meanwhile (a new client's first acquire then costs one round
 * trip to the daemon, not two). Nothing else may be sent in between. */
static int done_event_begin(struct tb_client *c, int device,
                            struct done_pending *pd) {
  struct tb__conn *k = c->conn;
  uint8_t handle[TB__CUDA_IPC_HANDLE_SIZE], uuid[TB__UUID_SIZE];
  struct tb__cuda_devctx dc;
  struct tb__cuda_ev *e;
  char why[256] = "";
  int rc, found = 0;

  pd->e = NULL;
  pthread_mutex_lock(&k->lock);
  if (K_CUDA(k) == NULL)
    k->kind[TB_MEMORY_CUDA_IPC] = calloc(1, sizeof(struct tb__cuda_conn));
  if (K_CUDA(k) != NULL) {
    LL_FOREACH(K_CUDA(k)->done, e) {
      if (e->device == device)
        found = 1;
    }
  }
  pthread_mutex_unlock(&k->lock);
  if (K_CUDA(k) == NULL)
    return TB_ENOMEM;
  if (found)
    return 0;
  rc = tb__cuda_device_uuid(device, uuid, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  e = calloc(1, sizeof(*e));
  if (e == NULL)
    return TB_ENOMEM;
  if (C_CUDA(c) != NULL && C_CUDA(c)->spare.ev != NULL &&
      C_CUDA(c)->spare.device == device) {
    /* made while this acquire's request was in flight */
    e->ev = C_CUDA(c)->spare.ev;
    memcpy(handle, C_CUDA(c)->spare.handle, sizeof(handle));
    C_CUDA(c)->spare.ev = NULL;
  } else {
    rc = tb__cuda_device_enter(device, &dc, why, sizeof(why));
    if (rc < 0) {
      free(e);
      return tb__set_error(c, rc, "%s", why);
    }
    rc = own_event_create(&e->ev, handle, why, sizeof(why));
    tb__cuda_device_leave(&dc);
    if (rc < 0) {
      free(e);
      return tb__set_error(c, rc, "%s", why);
    }
  }
  rc = event_register_send(c, handle, device, uuid, &pd->request_id);
  if (rc < 0) {
    own_event_destroy(e->ev);
    free(e);
    return rc;
  }
  e->device = device;
  pd->e = e;
  return 0;
}

void tb__cuda_acquire_early(struct tb_client *c) {
  struct tb__cuda_client *cc;
  char why[256] = "";
  int dev;

  /* only a client without any done event yet: a warm acquire pays nothing
   * (another device's done event is made by the acquire that needs it) */
  if (C_CUDA(c) != NULL && (C_CUDA(c)->has_done || C_CUDA(c)->spare.ev != NULL))
    return;
  /* never the first to load the driver, nor to make a context current */
  if (!tb__cuda_loaded() ||
      tb__cuda_current_device(&dev, NULL, why, sizeof(why)) < 0)
    return;
  if (C_CUDA(c) == NULL &&
      (c->kind[TB_MEMORY_CUDA_IPC] =
           calloc(1, sizeof(struct tb__cuda_client))) == NULL)
    return;
  cc = C_CUDA(c);
  /* a failure here is met again, and reported, by the acquire itself */
  if (own_event_create(&cc->spare.ev, cc->spare.handle, why, sizeof(why)) < 0)
    cc->spare.ev = NULL;
  else
    cc->spare.device = dev;
}

static int done_event_finish(struct tb_client *c, struct done_pending *pd) {
  struct tb__conn *k = c->conn;
  struct tb__cuda_ev *e = pd->e;
  int rc;

  if (e == NULL)
    return 0;
  pd->e = NULL;
  rc = event_register_reply(c, pd->request_id, &e->event_id);
  if (rc < 0) {
    own_event_destroy(e->ev);
    free(e);
    return rc;
  }
  pthread_mutex_lock(&k->lock);
  LL_PREPEND(K_CUDA(k)->done, e);
  pthread_mutex_unlock(&k->lock);
  if (C_CUDA(c) != NULL)
    C_CUDA(c)->has_done = 1;
  return 0;
}

static int done_event_ensure(struct tb_client *c, int device) {
  struct done_pending pd;
  int rc;

  rc = done_event_begin(c, device, &pd);
  if (rc < 0)
    return rc;
  return done_event_finish(c, &pd);
}

void tb__cuda_connect_begin(struct tb_client *c) {
  struct tb__cuda_client *cc = NULL;
  struct kept_error ke;
  char why[256] = "";
  int dev;

  /* never the first to load the driver, nor to make a context current:
   * only when the application has one current on this thread */
  if (!c->prefetch || !tb__cuda_context_current() ||
      tb__cuda_current_device(&dev, NULL, why, sizeof(why)) < 0)
    return;
  /* best effort: a failure is met again, and reported, by the acquire
   * that needs the event; the last error stays what it was */
  error_keep(c, &ke);
  if (cuda_client(c, &cc) == 0)
    (void)done_event_begin(c, dev, &cc->connect);
  error_restore(c, &ke);
}

void tb__cuda_connect_end(struct tb_client *c, int hello_ok) {
  struct done_pending pd;
  struct kept_error ke;

  if (C_CUDA(c) == NULL || C_CUDA(c)->connect.e == NULL)
    return;
  pd = C_CUDA(c)->connect;
  C_CUDA(c)->connect.e = NULL;
  if (!hello_ok) { /* the connection is being given up: no reply to read */
    own_event_destroy(pd.e->ev);
    free(pd.e);
    return;
  }
  error_keep(c, &ke);
  (void)done_event_finish(c, &pd); /* sets has_done: no spare made later */
  error_restore(c, &ke);
}

/* Remember s (resolved) as a stream that reads the lease a, unless it is
 * no-sync or remembered already; room: how many a may hold. */
static int lease_stream_add(struct tb__cuda_acq *a,
                            const struct tb__cuda_stream *s, unsigned room,
                            char *why, size_t whylen) {
  struct tb__lease_stream e;
  tb_cu_context ctx = NULL;
  int rc;

  if (s->no_sync)
    return 0;
  memset(&e, 0, sizeof(e));
  rc = tb__cuda_stream_ident(s, &ctx, &e.device, why, whylen);
  if (rc < 0)
    return rc;
  e.stream = s->stream;
  e.ctx = ctx;
  e.thread = pthread_self();
  for (unsigned i = 0; i < a->n_streams; i++) {
    const struct tb__lease_stream *o = &a->streams[i];
    if (o->stream == e.stream && o->ctx == e.ctx &&
        (e.stream != TB_CU_STREAM_PER_THREAD ||
         pthread_equal(o->thread, e.thread)))
      return 0;
  }
  if (a->n_streams >= room) {
    if (why != NULL)
      snprintf(why, whylen, "a lease remembers at most %d streams that "
               "read it", TB__LEASE_STREAMS);
    return TB_ELIMIT;
  }
  a->streams[a->n_streams++] = e;
  return 0;
}

/* Make s wait for the version's ready event (none, or a no-sync s: 0). */
static int wait_ready(struct tb_client *c, const struct tb__cuda_map *m,
                      const Tensorbroker__V1__EventInfo *ready,
                      const struct tb__cuda_stream *s) {
  const uint8_t *uuid = m->uuid;
  char why[256] = "";
  int rc;

  if (ready == NULL || ready->event_id == 0 || s->no_sync)
    return 0;
  if (ready->cuda_ipc_event_handle.len != TB__CUDA_IPC_HANDLE_SIZE)
    return tb__set_error(c, TB_EPROTO, "ready event without a handle");
  if (ready->device != NULL && ready->device->uuid.len == TB__UUID_SIZE)
    uuid = ready->device->uuid.data;
  rc = wait_event(c->conn, ready->event_id, ready->cuda_ipc_event_handle.data,
                  uuid, ready->complete, s, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  return 0;
}

/* Record the done event of device on s, under the connection lock. */
static int record_done(struct tb__conn *k, int device,
                       const struct tb__cuda_stream *s, uint64_t *id) {
  struct tb__cuda_ev *e, *found = NULL;
  int rc = 0;

  *id = 0;
  pthread_mutex_lock(&k->lock);
  if (K_CUDA(k) != NULL) {
    LL_FOREACH(K_CUDA(k)->done, e) {
      if (e->device == device)
        found = e;
    }
  }
  if (found != NULL) {
    int complete = 0;
    rc = tb__cuda_record(found->ev, s, 1, &complete, NULL, NULL, 0);
    if (rc == 0 && !complete)
      *id = found->event_id;
  }
  pthread_mutex_unlock(&k->lock);
  return rc;
}

/* The default path (device -1), as before cross-GPU support: the memory's
 * device is made current when no context is (a current context on another
 * device is used as it is, through peer access), the mapping is the one
 * of the current context's device. */
static int acquire_default(struct tb_client *c, struct tb__cuda_map *m,
                           const Tensorbroker__V1__EventInfo *ready,
                           const struct tb__cuda_stream *s,
                           struct tb__cuda_acq *out) {
  struct tb__cuda_view *v = NULL;
  struct done_pending pd;
  tb_cu_context ctx = NULL;
  char why[256] = "";
  int rc, rc2, ordinal, dev;

  rc = tb__cuda_device_by_uuid(m->uuid, &ordinal, &dev, &ctx, why,
                               sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  /* the mapping is that of the current device, and so is the done event:
   * its registration travels while the memory opens */
  rc = done_event_begin(c, dev, &pd);
  if (rc < 0)
    return rc;
  rc = view_in(c, m, dev, ctx, &v);
  rc2 = done_event_finish(c, &pd);
  if (rc < 0)
    return rc;
  if (rc2 < 0)
    return rc2;
  rc = wait_ready(c, m, ready, s);
  if (rc < 0)
    return rc;
  out->base = v->p;
  out->done_device = v->device;
  out->enter = 0;
  return 0;
}

/* COPY_TO_DEVICE across devices; the consumer device's context is
 * current. can: the consumer's device can reach the memory's by peer
 * access (then the source is read through the consumer's own mapping,
 * else through a mapping in the memory device's context). */
static int acquire_copy(struct tb_client *c, struct tb__cuda_map *m,
                        const Tensorbroker__V1__EventInfo *ready,
                        const struct tb__cuda_stream *s, int device, int can,
                        uint64_t lo, uint64_t hi, struct tb__cuda_acq *out) {
  struct tb__cuda_stream cs = *s;
  struct tb__cuda_view *v = NULL;
  struct tb__cuda_devctx dc;
  tb_cu_deviceptr dst = 0;
  tb_cu_context dctx = NULL;
  tb_cu_event copied = NULL;
  uint64_t done = 0;
  char why[256] = "";
  int rc, pooled = 0;

  if (can) {
    rc = view_here(c, m, &v);
  } else {
    rc = tb__cuda_device_enter(m->device, &dc, why, sizeof(why));
    if (rc < 0)
      return tb__set_error(c, rc, "%s", why);
    rc = view_here(c, m, &v);
    tb__cuda_device_leave(&dc);
  }
  if (rc < 0)
    return rc;
  /* -1: nothing is waited for (the caller says the data is ready), the
   * copy goes on the consumer device's legacy stream. */
  if (cs.no_sync) {
    cs.no_sync = 0;
    cs.stream = TB_CU_STREAM_LEGACY;
  } else {
    rc = wait_ready(c, m, ready, s);
    if (rc < 0)
      return rc;
  }
  rc = tb__cuda_copy_peer(&cs, v->p + lo, v->ctx, (size_t)(hi - lo), &dst,
                          &dctx, &pooled, &copied, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  /* The producer may reuse its memory once the copy has read it. */
  rc = record_done(c->conn, device, &cs, &done);
  if (rc < 0) {
    (void)tb__cuda_free_copy(dst, dctx, pooled, &cs);
    tb__cuda_event_destroy(copied);
    return tb__set_error(c, rc, "cannot record the done event after the "
                         "copy");
  }
  out->base = dst - lo;
  out->copy = dst;
  out->copy_ctx = dctx;
  out->copy_pooled = pooled;
  out->copy_event = copied;
  out->done_event_id = done;
  return 0;
}

int tb__cuda_acquire(struct tb_client *c, struct tb__cuda_map *m,
                     const Tensorbroker__V1__EventInfo *ready, void *stream,
                     int device, unsigned flags, uint64_t lo, uint64_t hi,
                     struct tb__cuda_acq *out) {
  struct tb__cuda_client *cc = NULL;
  struct tb__cuda_acq a;
  struct tb__cuda_stream s;
  struct tb__cuda_devctx dc;
  struct tb__cuda_view *v = NULL;
  uint8_t cuuid[TB__UUID_SIZE];
  char why[256] = "";
  int rc, can = 1, plan = TB__XDEV_SAME, sdev;

  rc = cuda_client(c, &cc);
  if (rc < 0)
    return rc;
  memset(&a, 0, sizeof(a));
  rc = tb__cuda_stream_resolve(c->conn->contract, stream, &s, why,
                               sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  a.implicit = s.implicit;
  if (device < 0) {
    rc = acquire_default(c, m, ready, &s, &a);
    if (rc == 0)
      rc = lease_stream_add(&a, &s, TB__LEASE_STREAMS, why, sizeof(why));
    if (rc < 0)
      return rc == TB_ESTREAM ? tb__set_error(c, rc, "%s", why) : rc;
    *out = a;
    return 0;
  }

  rc = tb__cuda_device_uuid(device, cuuid, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  if (device != m->device) {
    rc = tb__cuda_can_access_peer(device, m->device, &can, why, sizeof(why));
    if (rc < 0)
      return tb__set_error(c, rc, "%s", why);
  }
  rc = tb__cuda_xdev_plan(m->device, device, flags, can, m->uuid, cuuid,
                          &plan, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  rc = tb__cuda_device_enter(device, &dc, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  if (!s.no_sync) {
    rc = tb__cuda_stream_device(&s, &sdev, why, sizeof(why));
    if (rc < 0) {
      rc = tb__set_error(c, rc, "%s", why);
      goto out_leave;
    }
    if (sdev != device) {
      rc = tb__set_error(c, TB_ESTREAM,
                         "the stream runs on device %d, not on the "
                         "consumer's device %d (opts.device)",
                         sdev, device);
      goto out_leave;
    }
  }
  a.done_device = device;
  a.enter = 1;
  if (plan == TB__XDEV_COPY) {
    rc = done_event_ensure(c, device); /* the copy records it */
    if (rc == 0)
      rc = acquire_copy(c, m, ready, &s, device, can, lo, hi, &a);
  } else {
    /* SAME or PEER: the mapping of the consumer's device (for PEER opened
     * with lazy peer access); the stream waits on the ready event, which
     * may have been recorded on another device. The done event registers
     * while the memory opens. */
    struct done_pending pd;
    int rc2;
    rc = done_event_begin(c, device, &pd);
    if (rc < 0)
      goto out_leave;
    rc = view_here(c, m, &v);
    rc2 = done_event_finish(c, &pd);
    if (rc == 0)
      rc = rc2;
    if (rc == 0)
      rc = wait_ready(c, m, ready, &s);
    if (rc == 0)
      a.base = v->p;
  }
  if (rc == 0) {
    rc = lease_stream_add(&a, &s, TB__LEASE_STREAMS, why, sizeof(why));
    if (rc < 0)
      rc = tb__set_error(c, rc, "%s", why);
  }
  if (rc == 0)
    *out = a;
out_leave:
  tb__cuda_device_leave(&dc);
  return rc;
}

/* The stream to use for a remembered one, from the thread at hand: a
 * per-thread default stream of another thread cannot be named here, but
 * the legacy stream of the same context waits for it (per-thread default
 * streams are blocking streams). */
static struct tb__cuda_stream lease_stream_of(const struct tb__lease_stream *e) {
  struct tb__cuda_stream s = {(tb_cu_stream)e->stream, 0, 0,
                              (tb_cu_context)e->ctx};

  if (s.stream == TB_CU_STREAM_PER_THREAD &&
      !pthread_equal(e->thread, pthread_self()))
    s.stream = TB_CU_STREAM_LEGACY;
  return s;
}

/* The join stream for device, created on first use. Caller holds k->lock. */
static int join_get_locked(struct tb__cuda_conn *cc, int device,
                           struct tb__cuda_join **out, char *why,
                           size_t whylen) {
  struct tb__cuda_devctx dc;
  struct tb__cuda_join *j;
  int rc;

  LL_FOREACH(cc->joins, j) {
    if (j->device == device) {
      *out = j;
      return 0;
    }
  }
  j = calloc(1, sizeof(*j));
  if (j == NULL)
    return TB_ENOMEM;
  rc = tb__cuda_device_enter(device, &dc, why, whylen);
  if (rc == 0) {
    rc = tb__cuda_stream_create(dc.ctx, &j->stream, why, whylen);
    j->ctx = dc.ctx;
    tb__cuda_device_leave(&dc);
  }
  if (rc < 0) {
    free(j);
    return rc;
  }
  j->device = device;
  LL_PREPEND(cc->joins, j);
  *out = j;
  return 0;
}

/* The plain event that joins streams of ctx. Caller holds k->lock. */
static int join_ev_get_locked(struct tb__cuda_conn *cc, tb_cu_context ctx,
                              tb_cu_event *out, char *why, size_t whylen) {
  struct tb__cuda_join_ev *je;
  int rc;

  LL_FOREACH(cc->join_evs, je) {
    if (je->ctx == ctx) {
      *out = je->ev;
      return 0;
    }
  }
  je = calloc(1, sizeof(*je));
  if (je == NULL)
    return TB_ENOMEM;
  rc = tb__cuda_plain_event_create(ctx, &je->ev, why, whylen);
  if (rc < 0) {
    free(je);
    return rc;
  }
  je->ctx = ctx;
  LL_PREPEND(cc->join_evs, je);
  *out = je->ev;
  return 0;
}

/* Where the end of a lease is ordered: the one stream it remembers (when
 * it runs on the done event's device), or the join stream of that device
 * after it waited for every remembered stream. *target is no_sync when
 * nothing is remembered. TB__LEASE_LATER when a stream captures (or the
 * legacy stream cannot be touched because one does). The streams must
 * still exist: CUDA cannot tell a destroyed stream's handle from a live
 * one (docs/cuda.md, "When a lease ends"). Caller holds k->lock. */
static int lease_target_locked(struct tb__conn *k, struct tb__cuda_acq *a,
                               struct tb__cuda_stream *target, char *why,
                               size_t whylen) {
  struct tb__cuda_conn *cc;
  struct tb__cuda_join *j;
  unsigned i;
  int rc;

  target->no_sync = 1;
  for (i = 0; i < a->n_streams; i++) {
    struct tb__cuda_stream s = lease_stream_of(&a->streams[i]);
    /* Nothing records after a capturing stream's real work until the
     * capture ends: an event recorded into the capture would mark the
     * graph's future launches, not the reads already queued. */
    if (tb__cuda_capturing(&s, "recording the done event", why, whylen) != 0)
      return TB__LEASE_LATER;
  }
  if (a->n_streams == 0)
    return 0;
  if (a->n_streams == 1 && a->streams[0].device == a->done_device) {
    *target = lease_stream_of(&a->streams[0]);
    return 0;
  }
  cc = conn_cuda_locked(k);
  if (cc == NULL)
    return TB_ENOMEM;
  rc = join_get_locked(cc, a->done_device, &j, why, whylen);
  if (rc < 0)
    return rc;
  target->stream = j->stream;
  target->ctx = j->ctx;
  target->no_sync = 0;
  target->implicit = 0;
  for (i = 0; i < a->n_streams && rc == 0; i++) {
    struct tb__cuda_stream s = lease_stream_of(&a->streams[i]);
    tb_cu_event ev;
    rc = join_ev_get_locked(cc, s.ctx, &ev, why, whylen);
    if (rc == 0)
      rc = tb__cuda_record(ev, &s, 0, NULL, NULL, why, whylen);
    if (rc == 0)
      rc = tb__cuda_wait(target, ev, why, whylen);
  }
  return rc;
}

/* The release's own stream joins the remembered ones: an explicit one
 * always (1 more than the declared maximum fits), NULL only when the lease
 * remembers none (the contract's default then). */
static int lease_release_stream(struct tb__conn *k, struct tb__cuda_acq *a,
                                void *stream, int *implicit, char *why,
                                size_t whylen) {
  struct tb__cuda_stream s;
  int rc;

  if (stream == NULL && a->n_streams > 0)
    return 0;
  rc = tb__cuda_stream_resolve(k->contract, stream, &s, why, whylen);
  if (rc < 0)
    return rc;
  *implicit = s.implicit;
  return lease_stream_add(a, &s, TB__LEASE_STREAMS + 1, why, whylen);
}

int tb__cuda_lease_end_locked(struct tb__conn *k, struct tb__cuda_acq *a,
                              void *stream, uint64_t *done_event_id,
                              int *implicit) {
  struct tb__cuda_stream target;
  struct tb__cuda_ev *e, *found = NULL;
  char why[256] = "";
  int rc, complete = 0;

  *done_event_id = 0;
  *implicit = 0;
  rc = lease_release_stream(k, a, stream, implicit, why, sizeof(why));
  if (rc < 0 || a->n_streams == 0 || K_CUDA(k) == NULL)
    return rc;
  LL_FOREACH(K_CUDA(k)->done, e) {
    if (e->device == a->done_device)
      found = e;
  }
  if (found == NULL)
    return 0;
  rc = lease_target_locked(k, a, &target, why, sizeof(why));
  if (rc != 0 || target.no_sync)
    return rc;
  /* One done event per device, re-recorded for every release: a producer
   * that waits on it after a later re-record waits for later work, which
   * is later than needed but never too early. When the consumer's work
   * had already finished (its stream idle) the release carries no done
   * event: the producer has nothing to wait for. */
  rc = tb__cuda_record(found->ev, &target, 1, &complete, NULL, why,
                       sizeof(why));
  if (rc < 0)
    return rc;
  if (!complete)
    *done_event_id = found->event_id;
  return 0;
}

int tb__cuda_lease_use_locked(struct tb__conn *k, struct tb__cuda_acq *a,
                              void *stream) {
  struct tb__cuda_stream s;
  struct tb__cuda_devctx dc;
  int rc;

  rc = tb__cuda_stream_resolve(k->contract, stream, &s, NULL, 0);
  if (rc < 0 || s.no_sync)
    return rc;
  /* a consumer device was given: the default streams are that device's */
  if (a->enter) {
    rc = tb__cuda_device_enter(a->done_device, &dc, NULL, 0);
    if (rc < 0)
      return rc;
  }
  rc = lease_stream_add(a, &s, TB__LEASE_STREAMS, NULL, 0);
  if (a->enter)
    tb__cuda_device_leave(&dc);
  return rc;
}

int tb__cuda_copy_free(struct tb__conn *k, struct tb__cuda_acq *a,
                       void *stream) {
  struct tb__cuda_stream target = {TB_CU_STREAM_LEGACY, 0, 0, NULL};
  int rc, frc, imp = 0;

  pthread_mutex_lock(&k->lock);
  rc = lease_release_stream(k, a, stream, &imp, NULL, 0);
  if (rc == 0 && a->n_streams > 0) {
    rc = lease_target_locked(k, a, &target, NULL, 0);
    if (rc == TB__LEASE_LATER) {
      /* a capture is under way: free_copy frees in relaxed mode */
      target = lease_stream_of(&a->streams[0]);
      rc = 0;
    }
  }
  pthread_mutex_unlock(&k->lock);
  if (target.no_sync) /* nothing to order after: the copy's legacy stream */
    target = (struct tb__cuda_stream){TB_CU_STREAM_LEGACY, 0, 0, NULL};
  frc = tb__cuda_free_copy(a->copy, (tb_cu_context)a->copy_ctx,
                           a->copy_pooled, rc < 0 ? NULL : &target);
  tb__cuda_event_destroy((tb_cu_event)a->copy_event);
  return rc < 0 ? rc : frc;
}

int tb__cuda_copy_wait(struct tb__conn *k, struct tb__cuda_acq *a, int device,
                       void *stream) {
  const struct tb_cuda *cu;
  struct tb__cuda_stream s;
  struct tb__cuda_devctx dc;
  int rc;

  if (tb__cuda_load(&cu) != 0)
    return TB_ENOCUDA;
  rc = tb__cuda_stream_resolve(k->contract, stream, &s, NULL, 0);
  if (rc < 0 || s.no_sync)
    return rc;
  rc = tb__cuda_device_enter(device, &dc, NULL, 0);
  if (rc < 0)
    return rc;
  pthread_mutex_lock(&k->lock);
  rc = lease_stream_add(a, &s, TB__LEASE_STREAMS, NULL, 0);
  pthread_mutex_unlock(&k->lock);
  if (rc == 0)
    rc = tb__cuda_wait(&s, (tb_cu_event)a->copy_event, NULL, 0);
  tb__cuda_device_leave(&dc);
  return rc;
}

/* ---- teardown ---- */

void tb__cuda_client_free(struct tb_client *c) {
  struct tb__cuda_client *cc = C_CUDA(c);
  struct tb__cuda_reg *reg, *rtmp;
  struct tb__cuda_ev *e, *etmp;

  if (cc == NULL)
    return;
  HASH_ITER(hh, cc->regs, reg, rtmp) {
    HASH_DEL(cc->regs, reg);
    tb__cuda_unexport_mem(reg->base);
    free(reg);
  }
  LL_FOREACH_SAFE(cc->ready, e, etmp) {
    LL_DELETE(cc->ready, e);
    own_event_destroy(e->ev);
    free(e);
  }
  if (cc->spare.ev != NULL)
    own_event_destroy(cc->spare.ev);
  free(cc);
  c->kind[TB_MEMORY_CUDA_IPC] = NULL;
}

void tb__cuda_conn_free(struct tb__cuda_conn *cc) {
  struct tb__cuda_ev *e, *etmp;
  struct tb__cuda_open_ev *o, *otmp;
  struct tb__cuda_join *j, *jtmp;
  struct tb__cuda_join_ev *je, *jetmp;

  if (cc == NULL)
    return;
  LL_FOREACH_SAFE(cc->joins, j, jtmp) {
    LL_DELETE(cc->joins, j);
    tb__cuda_stream_destroy(j->stream);
    free(j);
  }
  LL_FOREACH_SAFE(cc->join_evs, je, jetmp) {
    LL_DELETE(cc->join_evs, je);
    tb__cuda_event_destroy(je->ev);
    free(je);
  }
  LL_FOREACH_SAFE(cc->done, e, etmp) {
    LL_DELETE(cc->done, e);
    own_event_destroy(e->ev);
    free(e);
  }
  HASH_ITER(hh, cc->opened, o, otmp) {
    HASH_DEL(cc->opened, o);
    if (!o->own)
      tb__cuda_event_destroy(o->ev);
    free(o);
  }
  free(cc);
}

int tb__cuda_lease_wait(struct tb__conn *k, struct tb__cuda_acq *a,
                        uint64_t event_id, const uint8_t *handle,
                        const uint8_t *uuid, int complete, void *stream) {
  const struct tb_cuda *cu;
  struct tb__cuda_stream s;
  struct tb__cuda_devctx dc;
  char why[256] = "";
  int rc;

  if (tb__cuda_load(&cu) != 0)
    return TB_ENOCUDA;
  rc = tb__cuda_stream_resolve(k->contract, stream, &s, why, sizeof(why));
  if (rc < 0 || s.no_sync)
    return rc;
  /* a consumer device was given: the default streams are that device's */
  if (a->enter) {
    rc = tb__cuda_device_enter(a->done_device, &dc, why, sizeof(why));
    if (rc < 0)
      return rc;
  }
  pthread_mutex_lock(&k->lock);
  rc = lease_stream_add(a, &s, TB__LEASE_STREAMS, why, sizeof(why));
  pthread_mutex_unlock(&k->lock);
  if (rc == 0 && event_id != 0)
    rc = wait_event(k, event_id, handle, uuid, complete, &s, why,
                    sizeof(why));
  if (a->enter)
    tb__cuda_device_leave(&dc);
  return rc;
}

/* ---- the kind's table (kind.h) ---- */

_Static_assert(sizeof(struct tb__cuda_lease) <= TB__KIND_LEASE_STATE,
               "a lease has no room for the CUDA kind's state");

static int ipc_map(struct tb_client *c, const Tensorbroker__V1__BufferInfo *bi,
                   const int *fds, int nfds, struct tb__map **out) {
  struct tb__cuda_map *m = NULL;
  int rc = tb__cuda_map_open(c, bi, &m);

  if (rc == 0)
    *out = &m->m;
  return rc;
}

static void ipc_unmap(struct tb__map *m) {
  tb__cuda_map_close((struct tb__cuda_map *)m);
  free(m);
}

static int ipc_acquire(struct tb_client *c, struct tb__map *map,
                       const Tensorbroker__V1__AcquireReply *ar,
                       const struct tb_acquire_options *o, void *state,
                       struct tb__kind_acq *out) {
  struct tb__cuda_map *m = (struct tb__cuda_map *)map;
  struct tb__cuda_lease *l = state;
  const Tensorbroker__V1__EventInfo *re = ar->ready_event;
  uint64_t lo = 0, hi = 0;
  int rc;

  if (o->flags & TB_ACQUIRE_COPY_TO_DEVICE) {
    /* the bytes of the buffer the tensor touches: what a copy copies */
    const Tensorbroker__V1__Layout *lay = ar->layout;
    uint64_t elem_bits = 0;
    char why[160];
    rc = tb__dtype_check(lay->dtype_code, lay->dtype_bits, lay->dtype_lanes,
                         &elem_bits);
    if (rc == 0)
      rc = tb__layout_extent((int32_t)lay->n_shape, lay->shape,
                             lay->n_strides == lay->n_shape ? lay->strides
                                                            : NULL,
                             elem_bits, lay->flags, lay->byte_offset, &lo,
                             &hi, why, sizeof(why));
    if (rc < 0)
      return tb__set_error(c, TB_EPROTO, "daemon sent a bad layout");
  }
  rc = tb__cuda_acquire(c, m, re, o->stream, o->device, o->flags, lo, hi,
                        &l->acq);
  if (rc < 0)
    return rc;
  if (re != NULL && re->event_id != 0 &&
      re->cuda_ipc_event_handle.len == TB__CUDA_IPC_HANDLE_SIZE) {
    l->ready_event_id = re->event_id;
    l->ready_complete = re->complete != 0;
    memcpy(l->ready_handle, re->cuda_ipc_event_handle.data,
           TB__CUDA_IPC_HANDLE_SIZE);
    if (re->device != NULL && re->device->uuid.len == TB__UUID_SIZE)
      memcpy(l->ready_uuid, re->device->uuid.data, TB__UUID_SIZE);
    else
      memcpy(l->ready_uuid, m->uuid, TB__UUID_SIZE);
  }
  /* a peer mapping keeps the memory device's ordinal (where the data
   * lives, as this process numbers it); a copy is on the consumer's */
  out->base = l->acq.base;
  out->device.device_type = kDLCUDA;
  out->device.device_id = l->acq.copy != 0 ? o->device : m->device;
  out->implicit = l->acq.implicit;
  out->copied = l->acq.copy != 0;
  out->done_event_id = l->acq.done_event_id;
  return 0;
}

static int ipc_ready_wait(struct tb__conn *k, void *state, const DLTensor *t,
                          void *stream) {
  struct tb__cuda_lease *l = state;

  if (l->acq.copy != 0) /* the copy is what the stream must wait for */
    return tb__cuda_copy_wait(k, &l->acq, t->device.device_id, stream);
  return tb__cuda_lease_wait(k, &l->acq, l->ready_event_id, l->ready_handle,
                             l->ready_uuid, l->ready_complete, stream);
}

static int ipc_use_locked(struct tb__conn *k, void *state, void *stream) {
  return tb__cuda_lease_use_locked(k, &((struct tb__cuda_lease *)state)->acq,
                                   stream);
}

static int ipc_done_record_locked(struct tb__conn *k, void *state,
                                  void *stream, uint64_t *done_event_id,
                                  int *implicit) {
  return tb__cuda_lease_end_locked(k, &((struct tb__cuda_lease *)state)->acq,
                                   stream, done_event_id, implicit);
}

static int ipc_copy_free(struct tb__conn *k, void *state, void *stream) {
  return tb__cuda_copy_free(k, &((struct tb__cuda_lease *)state)->acq, stream);
}

static void ipc_conn_free(struct tb__conn *k) {
  tb__cuda_conn_free(K_CUDA(k));
  k->kind[TB_MEMORY_CUDA_IPC] = NULL;
}

const struct tb__kind_ops tb__kind_cuda_ipc = {
    .name = "cuda-ipc",
    .kind = TB_MEMORY_CUDA_IPC,
    .dl_device = kDLCUDA,
    .lease_state = sizeof(struct tb__cuda_lease),
    .publish = ipc_publish,
    .done_wait = tb__cuda_wait_done,
    .map = ipc_map,
    .unmap = ipc_unmap,
    .acquire = ipc_acquire,
    .ready_wait = ipc_ready_wait,
    .use_locked = ipc_use_locked,
    .done_record_locked = ipc_done_record_locked,
    .copy_free = ipc_copy_free,
    .prefetch = tb__cuda_prefetch,
    .acquire_early = tb__cuda_acquire_early,
    .connect_begin = tb__cuda_connect_begin,
    .connect_end = tb__cuda_connect_end,
    .client_free = tb__cuda_client_free,
    .conn_free = ipc_conn_free,
};
