/* SPDX-License-Identifier: Apache-2.0 */
/* Interprocess events of the CUDA IPC kind: the process-wide table of
 * events this process created, the connection's cache of opened foreign
 * events, the consumer's done events (one per device, registered ahead
 * where it can: at connect, while an acquire is in flight) and the
 * producer's wait for them (tb_wait_free).
 * (kind_ipc.h) */
#include "kind_ipc.h"
#include "signal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utlist.h>

#include "cuda.h"

static pthread_mutex_t own_lock = PTHREAD_MUTEX_INITIALIZER;

static struct tb__own_ev *own_events;

int tb__ci_own_event_create(tb_cu_event *ev, uint8_t *handle, char *why,
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

void tb__ci_own_event_destroy(tb_cu_event ev) {
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

struct tb__cuda_ev *tb__ci_done_event_locked(struct tb__conn *k, int device) {
  struct tb__cuda_ev *e;

  if (K_CUDA(k) == NULL)
    return NULL;
  LL_FOREACH(K_CUDA(k)->done, e) {
    if (e->device == device)
      return e;
  }
  return NULL;
}

/* The connection's CUDA state, created on first use. Caller holds k->lock. */
struct tb__cuda_conn *tb__ci_conn_cuda_locked(struct tb__conn *k) {
  if (K_CUDA(k) == NULL)
    k->kind[TB_MEMORY_CUDA_IPC] = calloc(1, sizeof(struct tb__cuda_conn));
  return K_CUDA(k);
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

/* The client's CUDA state, created on first use; TB_ENOCUDA without a
 * driver. */
int tb__ci_cuda_client(struct tb_client *c, struct tb__cuda_client **out) {
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

int tb__ci_register_event(struct tb_client *c, const uint8_t *handle,
                          int device, const uint8_t *uuid, uint64_t *id) {
  uint64_t request_id = 0;
  int rc;

  rc = event_register_send(c, handle, device, uuid, &request_id);
  if (rc < 0)
    return rc;
  return event_register_reply(c, request_id, id);
}

/* ---- opened events (consumer ready events, producer done events) ---- */

/* Open (or find) another process's event in the connection's cache.
 * Caller holds k->lock; the event stays valid while the lock is held (an
 * evicted event is destroyed, which is safe with waits already enqueued). */
int tb__ci_open_event_locked(struct tb__conn *k, uint64_t event_id,
                             const uint8_t *handle, const uint8_t *uuid,
                             tb_cu_event *out, char *why, size_t whylen) {
  struct tb__cuda_conn *cc = tb__ci_conn_cuda_locked(k);
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
int tb__ci_wait_event(struct tb__conn *k, uint64_t event_id,
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
  rc = tb__ci_open_event_locked(k, event_id, handle, uuid, &ev, why, whylen);
  if (rc == 0)
    rc = tb__cuda_wait(s, ev, why, whylen);
  pthread_mutex_unlock(&k->lock);
  return rc;
}

int tb__ci_done_unreachable(struct tb_client *c, const struct tb__freed *f) {
  size_t foreign = 0;

  /* CUDA interprocess events do not reach a process in another PID
   * namespace or with another /dev/shm: a wait on one may never end. A
   * consumer there that was given a done slot wrote a done signal
   * instead (docs/cuda.md, "Signals"); one without cannot be waited for.
   * The freed entry stays, so that asking again says the same. */
  for (size_t i = 0; i < f->n_done; i++)
    foreign += tb__events_foreign(f->done[i].owner_shm_id,
                                  f->done[i].owner_pidns_id) &&
               f->done[i].signal_value == 0;
  if (foreign == 0)
    return 0;
  return tb__set_error(c, TB_ENOTSUP,
                       "version %llu of '%s' was released with GPU work "
                       "still queued by %zu consumer(s) in another PID "
                       "namespace or with another /dev/shm (another "
                       "container) and without a done signal: CUDA "
                       "interprocess events do not reach across, so their "
                       "reads cannot be waited for and this buffer must "
                       "not be rewritten (a buffer of "
                       "tb_buffer_create_cuda carries signals where the "
                       "device supports 64-bit stream memory operations; "
                       "else such a consumer must finish its reads before "
                       "it releases: synchronise, then release with stream "
                       "-1) (docs/cuda.md, \"Signals\")",
                       (unsigned long long)f->version, f->channel, foreign);
}

int tb__cuda_wait_done_signals(struct tb_client *c, const struct tb__freed *f,
                               void *stream, tb__signal_word_fn *word_of) {
  struct tb__cuda_client *cc = NULL;
  struct tb__cuda_stream s;
  char why[256] = "";
  int rc;

  rc = tb__ci_done_unreachable(c, f);
  if (rc < 0)
    return rc;
  rc = tb__ci_cuda_client(c, &cc);
  if (rc < 0)
    return rc;
  rc = tb__cuda_stream_resolve(c->conn->contract, stream, &s, why,
                               sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  if (s.no_sync)
    return 0; /* -1: the caller orders the reuse itself */
  for (size_t i = 0; i < f->n_done; i++) {
    const struct tb__done_event *d = &f->done[i];
    if (tb__events_foreign(d->owner_shm_id, d->owner_pidns_id)) {
      /* its event does not reach here: its done signal (checked above:
       * each has one) in the buffer's signal area; without word_of
       * (cuda-ipc's wait, asked for buffers c has no signals of) the
       * buffer that had them is gone */
      tb_cu_deviceptr word;
      rc = word_of != NULL ? word_of(c, f->buffer_id, d->signal_slot, &word,
                                     why, sizeof(why))
                           : 1;
      if (rc == 1)
        continue; /* the buffer is gone: nothing left to rewrite */
      if (rc == 0)
        rc = tb__signal_wait(&s, word, d->signal_value, why, sizeof(why));
    } else {
      rc = tb__ci_wait_event(c->conn, d->event_id, d->handle, d->uuid, 0, &s,
                             why, sizeof(why));
    }
    if (rc < 0)
      return tb__set_error(c, rc, "%s", why);
  }
  return 0;
}

int tb__cuda_wait_done(struct tb_client *c, const struct tb__freed *f,
                       void *stream) {
  return tb__cuda_wait_done_signals(c, f, stream, NULL);
}

void tb__ci_error_keep(const struct tb_client *c, struct kept_error *ke) {
  memcpy(ke->text, c->last_error, sizeof(ke->text));
  ke->len = c->last_error_len;
}

void tb__ci_error_restore(struct tb_client *c, const struct kept_error *ke) {
  memcpy(c->last_error, ke->text, sizeof(ke->text));
  c->last_error_len = ke->len;
}

/* The consumer's done event for a device, created in a context of that
 * device and registered while we hold the call lock, so that deleters
 * (which may not take it) find it ready. The registration is sent here
 * and its reply read by tb__ci_done_event_finish, so that the caller can open
 * memory meanwhile (a new client's first acquire then costs one round
 * trip to the daemon, not two). Nothing else may be sent in between. */
int tb__ci_done_event_begin(struct tb_client *c, int device,
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
  found = tb__ci_done_event_locked(k, device) != NULL;
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
    rc = tb__ci_own_event_create(&e->ev, handle, why, sizeof(why));
    tb__cuda_device_leave(&dc);
    if (rc < 0) {
      free(e);
      return tb__set_error(c, rc, "%s", why);
    }
  }
  rc = event_register_send(c, handle, device, uuid, &pd->request_id);
  if (rc < 0) {
    tb__ci_own_event_destroy(e->ev);
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
  if (tb__ci_own_event_create(&cc->spare.ev, cc->spare.handle, why, sizeof(why)) < 0)
    cc->spare.ev = NULL;
  else
    cc->spare.device = dev;
}

int tb__ci_done_event_finish(struct tb_client *c, struct done_pending *pd) {
  struct tb__conn *k = c->conn;
  struct tb__cuda_ev *e = pd->e;
  int rc;

  if (e == NULL)
    return 0;
  pd->e = NULL;
  rc = event_register_reply(c, pd->request_id, &e->event_id);
  if (rc < 0) {
    tb__ci_own_event_destroy(e->ev);
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

int tb__ci_done_event_ensure(struct tb_client *c, int device) {
  struct done_pending pd;
  int rc;

  rc = tb__ci_done_event_begin(c, device, &pd);
  if (rc < 0)
    return rc;
  return tb__ci_done_event_finish(c, &pd);
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
  tb__ci_error_keep(c, &ke);
  if (tb__ci_cuda_client(c, &cc) == 0)
    (void)tb__ci_done_event_begin(c, dev, &cc->connect);
  tb__ci_error_restore(c, &ke);
}

void tb__cuda_connect_end(struct tb_client *c, int hello_ok) {
  struct done_pending pd;
  struct kept_error ke;

  if (C_CUDA(c) == NULL || C_CUDA(c)->connect.e == NULL)
    return;
  pd = C_CUDA(c)->connect;
  C_CUDA(c)->connect.e = NULL;
  if (!hello_ok) { /* the connection is being given up: no reply to read */
    tb__ci_own_event_destroy(pd.e->ev);
    free(pd.e);
    return;
  }
  tb__ci_error_keep(c, &ke);
  (void)tb__ci_done_event_finish(c, &pd); /* sets has_done: no spare made later */
  tb__ci_error_restore(c, &ke);
}

/* The ready event of a producer that died (EventInfo.owner_died), not
 * complete at publish: a stream made to wait on it would never run again
 * if the work it marks died with the process. Whether that work finished
 * is read from the buffer's ready signal, written after it by the
 * producer's stream: 1 when it did (nothing to wait for, now or later),
 * else TB_ECLOSED, set on c. An event cannot answer: one opened after its
 * process died queries as complete whatever its work did (measured on an
 * H200, docs/gpu-validation.md), so without a signal the version is
 * TB_ECLOSED too. The device's context is current. */
static int ready_of_dead_producer(struct tb_client *c,
                                  const struct tb__cuda_map *m,
                                  const Tensorbroker__V1__EventInfo *ready) {
  uint64_t now = 0;
  char why[256] = "";
  int rc;

  if (ready->signal_value == 0 || m->signal == 0)
    return tb__set_error(c, TB_ECLOSED,
                         "the producer of this version died with its GPU "
                         "work on it still queued at publish, and its buffer "
                         "has no ready signal to say whether that work "
                         "finished: its data may be incomplete");
  rc = tb__signal_read(m->signal, &now, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, TB_ECLOSED,
                         "the producer of this version died, and whether its "
                         "GPU work on it finished cannot be read: %s", why);
  if (now < ready->signal_value)
    return tb__set_error(c, TB_ECLOSED,
                         "the producer of this version died before its GPU "
                         "work on it finished (its ready signal is %llu, "
                         "not %llu): its data is incomplete",
                         (unsigned long long)now,
                         (unsigned long long)ready->signal_value);
  return 1;
}

int tb__ci_wait_ready(struct tb_client *c, const struct tb__cuda_map *m,
                      const Tensorbroker__V1__EventInfo *ready,
                      const struct tb__cuda_stream *s) {
  const uint8_t *uuid = m->uuid;
  char why[256] = "";
  int rc;

  if (ready == NULL || ready->event_id == 0)
    return 0;
  if (ready->cuda_ipc_event_handle.len != TB__CUDA_IPC_HANDLE_SIZE)
    return tb__set_error(c, TB_EPROTO, "ready event without a handle");
  if (ready->device != NULL && ready->device->uuid.len == TB__UUID_SIZE)
    uuid = ready->device->uuid.data;
  if (ready->owner_died && !ready->complete)
    return ready_of_dead_producer(c, m, ready);
  if (tb__events_foreign(ready->owner_shm_id, ready->owner_pidns_id)) {
    /* CUDA interprocess events do not reach a process in another PID
     * namespace or with another /dev/shm: never opened, never waited on
     * (a wait might never end). The ready signal stands for it. */
    if (ready->complete)
      return 1;
    if (ready->signal_value == 0 || m->signal == 0)
      return tb__set_error(c, TB_ENOTSUP,
                           "this version was published with its GPU work "
                           "still in flight by a producer in another PID "
                           "namespace or with another /dev/shm (another "
                           "container), from a buffer without a ready "
                           "signal: CUDA interprocess events do not reach "
                           "across, so its readiness cannot be waited for; "
                           "the producer must publish from a "
                           "tb_buffer_create_cuda buffer on a device with "
                           "64-bit stream memory operations, or publish "
                           "finished work (docs/cuda.md, \"Signals\")");
    rc = tb__signal_wait(s, m->signal, ready->signal_value, why,
                         sizeof(why));
    if (rc < 0)
      return tb__set_error(c, rc, "%s", why);
    return 0;
  }
  if (s->no_sync)
    return 0;
  rc = tb__ci_wait_event(c->conn, ready->event_id, ready->cuda_ipc_event_handle.data,
                  uuid, ready->complete, s, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  return 0;
}
