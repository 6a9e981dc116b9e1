/* SPDX-License-Identifier: Apache-2.0 */
/* The streams of a CUDA IPC lease: those the consumer declared (acquire,
 * tb_lease_wait, tb_lease_use, tb_release), joined on a stream of ours when
 * there are several, and the done event recorded after them when the
 * lease ends; the copy of TB_ACQUIRE_COPY_TO_DEVICE freed after them.
 * (kind_ipc.h) */
#include "kind_ipc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utlist.h>

#include "cuda.h"
#include "signal.h"

/* Remember s (resolved) as a stream that reads the lease a, unless it is
 * no-sync or remembered already; room: how many a may hold. */
int tb__ci_lease_stream_add(struct tb__cuda_acq *a,
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
  e.thread = tb__thread_id();
  for (unsigned i = 0; i < a->n_streams; i++) {
    const struct tb__lease_stream *o = &a->streams[i];
    if (o->stream == e.stream && o->ctx == e.ctx &&
        (e.stream != TB_CU_STREAM_PER_THREAD ||
         o->thread == e.thread))
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

/* The stream to use for a remembered one, from the thread at hand: a
 * per-thread default stream of another thread cannot be named here, but
 * the legacy stream of the same context waits for it (per-thread default
 * streams are blocking streams). */
static struct tb__cuda_stream lease_stream_of(const struct tb__lease_stream *e) {
  struct tb__cuda_stream s = {(tb_cu_stream)e->stream, 0, 0,
                              (tb_cu_context)e->ctx};

  if (s.stream == TB_CU_STREAM_PER_THREAD &&
      e->thread != tb__thread_id())
    s.stream = TB_CU_STREAM_LEGACY;
  return s;
}

/* The join stream for device, created on first use, as a resolved stream.
 * Caller holds k->lock. */
static int join_get_locked(struct tb__cuda_conn *cc, int device,
                           struct tb__cuda_stream *out, char *why,
                           size_t whylen) {
  struct tb__cuda_devctx dc;
  struct tb__cuda_join *j;
  int rc;

  LL_FOREACH(cc->joins, j) {
    if (j->device == device)
      break;
  }
  if (j != NULL) {
    *out = (struct tb__cuda_stream){j->stream, 0, 0, j->ctx};
    return 0;
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
  *out = (struct tb__cuda_stream){j->stream, 0, 0, j->ctx};
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

/* Make js wait for the work queued on t so far (resolved, its context
 * known; nothing when t is js). Caller holds k->lock. */
static int join_wait_for_locked(struct tb__cuda_conn *cc,
                                const struct tb__cuda_stream *js,
                                const struct tb__cuda_stream *t, char *why,
                                size_t whylen) {
  tb_cu_event ev;
  int rc;

  if (t->stream == js->stream && t->ctx == js->ctx)
    return 0;
  rc = join_ev_get_locked(cc, t->ctx, &ev, why, whylen);
  if (rc == 0)
    rc = tb__cuda_record(ev, t, 0, NULL, NULL, why, whylen);
  if (rc == 0)
    rc = tb__cuda_wait(js, ev, why, whylen);
  return rc;
}

/* Whether s (resolved, its context known) is last, the stream of an
 * earlier record or write made on thread: the same handle in the same
 * context, and for a per-thread default stream the same thread. */
static int same_stream(const struct tb__cuda_stream *last, uint64_t thread,
                       const struct tb__cuda_stream *s) {
  return last->stream == s->stream && last->ctx == s->ctx &&
         (s->stream != TB_CU_STREAM_PER_THREAD ||
          thread == tb__thread_id());
}

/* ---- signals' writers (signal.h) ---- */

int tb__signal_write_locked(struct tb__conn *k, struct tb__signal *sg,
                            tb_cu_deviceptr word, int device,
                            const struct tb__cuda_stream *t, uint64_t *value,
                            char *why, size_t whylen) {
  struct tb__cuda_stream w = *t;
  int rc, dev;

  if (w.ctx == NULL) {
    rc = tb__cuda_stream_ident(&w, &w.ctx, &dev, why, whylen);
    if (rc < 0)
      return rc;
  }
  if (sg->value != 0 && !same_stream(&sg->last, sg->thread, &w)) {
    /* Another stream: its value must not land before the previous one,
     * still queued perhaps on the stream that wrote it. The join stream
     * waits for t's work and for the previous value, then writes. */
    struct tb__cuda_conn *cc = tb__ci_conn_cuda_locked(k);
    struct tb__cuda_stream js;

    if (cc == NULL)
      return TB_ENOMEM;
    rc = join_get_locked(cc, device, &js, why, whylen);
    if (rc == 0)
      rc = join_wait_for_locked(cc, &js, &w, why, whylen);
    if (rc == 0)
      rc = tb__signal_wait(&js, word, sg->value, why, whylen);
    if (rc < 0)
      return rc;
    w = js;
  }
  rc = tb__signal_write(&w, word, sg->value + 1, why, whylen);
  if (rc < 0)
    return rc;
  sg->value++;
  sg->last = w;
  sg->thread = tb__thread_id();
  *value = sg->value;
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
  cc = tb__ci_conn_cuda_locked(k);
  if (cc == NULL)
    return TB_ENOMEM;
  rc = join_get_locked(cc, a->done_device, target, why, whylen);
  for (i = 0; i < a->n_streams && rc == 0; i++) {
    struct tb__cuda_stream s = lease_stream_of(&a->streams[i]);
    rc = join_wait_for_locked(cc, target, &s, why, whylen);
  }
  return rc;
}

int tb__ci_done_record_locked(struct tb__conn *k, struct tb__cuda_ev *e,
                              const struct tb__cuda_stream *target,
                              int *complete, char *why, size_t whylen) {
  struct tb__cuda_stream t = *target;
  struct tb__cuda_conn *cc;
  int device, skipped = 0, rc;

  *complete = 0;
  if (t.no_sync)
    return 0;
  if (t.ctx == NULL) {
    rc = tb__cuda_stream_ident(&t, &t.ctx, &device, why, whylen);
    if (rc < 0)
      return rc;
  }
  /* CUDA waits for an event's latest record only. Records on one stream
   * are ordered, so there the latest covers the earlier ones; one on
   * another stream would not, and a producer waiting after it could
   * rewrite a version whose reads still run where the event was recorded
   * before. Unless that earlier record has completed (nothing is left to
   * cover), the record goes on the join stream, after a wait for the
   * event's previous record and for target's work. A capturing target
   * records into its capture, as before (the copy of
   * TB_ACQUIRE_COPY_TO_DEVICE; lease ends wait for captures to end). */
  if (e->last.stream != NULL && !same_stream(&e->last, e->last_thread, &t) &&
      !tb__cuda_event_done(e->ev, e->last.ctx) &&
      tb__cuda_capturing(&t, "recording the done event", NULL, 0) == 0) {
    struct tb__cuda_stream js;

    cc = tb__ci_conn_cuda_locked(k);
    if (cc == NULL)
      return TB_ENOMEM;
    rc = join_get_locked(cc, e->device, &js, why, whylen);
    if (rc == 0)
      rc = tb__cuda_wait(&js, e->ev, why, whylen);
    if (rc == 0)
      rc = join_wait_for_locked(cc, &js, &t, why, whylen);
    if (rc < 0)
      return rc;
    t = js;
  }
  rc = tb__cuda_record(e->ev, &t, 1, complete, &skipped, why, whylen);
  if (rc == 0 && !skipped) {
    e->last = t;
    e->last_thread = tb__thread_id();
  }
  return rc;
}

/* Record the done event of device on s, under the connection lock. */
int tb__ci_record_done(struct tb__conn *k, int device,
                       const struct tb__cuda_stream *s, uint64_t *id) {
  struct tb__cuda_ev *found;
  int rc = 0;

  *id = 0;
  pthread_mutex_lock(&k->lock);
  found = tb__ci_done_event_locked(k, device);
  if (found != NULL) {
    int complete = 0;
    rc = tb__ci_done_record_locked(k, found, s, &complete, NULL, 0);
    if (rc == 0 && !complete)
      *id = found->event_id;
  }
  pthread_mutex_unlock(&k->lock);
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
  return tb__ci_lease_stream_add(a, &s, TB__LEASE_STREAMS + 1, why, whylen);
}

/* Whether this thread has no CUDA context current. */
static int no_context_here(void) {
  const struct tb_cuda *cu;
  tb_cu_context cur = NULL;

  return tb__cuda_load(&cu) == 0 && cu->cuCtxGetCurrent(&cur) == 0 &&
         cur == NULL;
}

/* The done signal after a lease's reads on target (where its done event
 * was just recorded, not complete), when its mapping has a done slot: a
 * producer that cannot open the done event waits for this instead. */
static int done_signal_locked(struct tb__conn *k, struct tb__cuda_acq *a,
                              const struct tb__cuda_stream *target,
                              uint64_t *value, char *why, size_t whylen) {
  struct tb__cuda_map *m = a->map;

  if (m == NULL || m->signal_rw == 0 || m->done_slot == 0)
    return 0;
  return tb__signal_write_locked(k, &m->done,
                                 m->signal_rw + 8ull * m->done_slot,
                                 m->device, target, value, why, whylen);
}

int tb__cuda_lease_end_locked(struct tb__conn *k, struct tb__cuda_acq *a,
                              void *stream, struct tb__lease_done *done) {
  struct tb__cuda_stream target;
  struct tb__cuda_ev *found;
  struct tb__cuda_devctx dc;
  char why[256] = "";
  int rc, err, complete = 0, entered = 0;
  int *implicit = &done->implicit;

  memset(done, 0, sizeof(*done));
  /* The default streams of a lease acquired for a device (a->enter) are
   * that device's, and so are those named on a thread with no context
   * current (a worker's, a deleter's), where they would name nothing. */
  if (a->enter || no_context_here())
    entered = tb__cuda_device_enter(a->done_device, &dc, NULL, 0) == 0;
  err = lease_release_stream(k, a, stream, implicit, why, sizeof(why));
  if (entered)
    tb__cuda_device_leave(&dc);
  /* A release stream that cannot be named is the caller's error, but the
   * streams the lease remembers still get their done event: the lease
   * ends either way, and without it the producer would rewrite the memory
   * under their reads. */
  if (a->n_streams == 0)
    return err;
  found = tb__ci_done_event_locked(k, a->done_device);
  if (found == NULL)
    return err;
  rc = lease_target_locked(k, a, &target, why, sizeof(why));
  if (rc != 0 || target.no_sync)
    return rc != 0 ? rc : err;
  /* One done event per device, re-recorded for every release, so that a
   * producer waiting on it after a later re-record waits for later work
   * too (tb__ci_done_record_locked). When the consumer's work had already
   * finished (its stream idle) the release carries no done event: the
   * producer has nothing to wait for. */
  rc = tb__ci_done_record_locked(k, found, &target, &complete, why,
                                 sizeof(why));
  if (rc < 0)
    return rc;
  if (!complete) {
    done->event_id = found->event_id;
    /* a signal that cannot be written leaves the event alone: a producer
     * that needed the signal is told its reads cannot be waited for */
    (void)done_signal_locked(k, a, &target, &done->signal, why,
                             sizeof(why));
  }
  if (err < 0)
    return err;
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
  rc = tb__ci_lease_stream_add(a, &s, TB__LEASE_STREAMS, NULL, 0);
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
  rc = tb__ci_lease_stream_add(a, &s, TB__LEASE_STREAMS, NULL, 0);
  pthread_mutex_unlock(&k->lock);
  if (rc == 0)
    rc = tb__cuda_wait(&s, (tb_cu_event)a->copy_event, NULL, 0);
  tb__cuda_device_leave(&dc);
  return rc;
}

int tb__cuda_lease_wait(struct tb__conn *k, struct tb__cuda_acq *a,
                        uint64_t event_id, const uint8_t *handle,
                        const uint8_t *uuid, int complete,
                        uint64_t signal_value, void *stream) {
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
  rc = tb__ci_lease_stream_add(a, &s, TB__LEASE_STREAMS, why, sizeof(why));
  pthread_mutex_unlock(&k->lock);
  if (rc == 0 && signal_value != 0) /* the event does not reach here */
    rc = tb__signal_wait(&s, a->map->signal, signal_value, why, sizeof(why));
  else if (rc == 0 && event_id != 0)
    rc = tb__ci_wait_event(k, event_id, handle, uuid, complete, &s, why,
                    sizeof(why));
  if (a->enter)
    tb__cuda_device_leave(&dc);
  return rc;
}
