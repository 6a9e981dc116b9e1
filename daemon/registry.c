/* SPDX-License-Identifier: Apache-2.0 */
/* The broker's state and its transitions: lease accounting, version and
 * buffer lifetimes, notices, parked waits, session teardown. */
#include "registry_impl.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tensorbroker/tensorbroker.h>

#include "kinds.h"
#include "log.h"

static void version_maybe_free(struct tbd_registry *r,
                               struct tbd_version *v);
static void channel_free(struct tbd_registry *r, struct tbd_channel *ch);
static void history_leave(struct tbd_channel *ch, struct tbd_version *v);
static bool deadline_less(const struct tbd_heap_node *a,
                          const struct tbd_heap_node *b);
static int reply_no_producer(struct tbd_registry *r, struct tbd_session *s,
                             uint64_t request_id,
                             const struct tbd_channel *ch, int mode,
                             uint64_t after);

static uint64_t default_clock(void *ud) {
  (void)ud;
  return tb__now_ms();
}

uint64_t tbd__now(struct tbd_registry *r) { return r->now(r->now_ud); }

int tbd_registry_new(const struct tbd_limits *limits, tbd_emit_fn emit,
                     void *emit_ud, struct tbd_registry **out) {
  struct tbd_registry *r = tbd_calloc(1, sizeof(*r));

  if (r == NULL)
    return TB_ENOMEM;
  r->lim = *limits;
  r->emit = emit;
  r->emit_ud = emit_ud;
  r->now = default_clock;
  r->start_ms = tbd__now(r);
  tbd_metrics_init(&r->metrics);
  r->socket_path = "";
  r->next_session_id = r->next_buffer_id = r->next_event_id = 1;
  r->next_lease_id = 1;
  tbd_heap_init(&r->deadlines, deadline_less);
  if (tbd_acl_new(&r->acl) < 0) {
    tbd_free(r);
    return TB_ENOMEM;
  }
  tbd_hash_oom = 0;
  HASH_ADD(hh, r->leases, id, sizeof(r->anchor.id), &r->anchor);
  if (tbd_hash_oom) {
    tbd_acl_free(r->acl);
    tbd_free(r);
    return TB_ENOMEM;
  }
  *out = r;
  return 0;
}

void tbd_registry_set_clock(struct tbd_registry *r, tbd_clock_fn now,
                            void *ud) {
  r->now = now;
  r->now_ud = ud;
  r->start_ms = tbd__now(r);
}

void tbd_registry_set_socket_path(struct tbd_registry *r, const char *path) {
  r->socket_path = path;
}

void tbd_registry_set_limits(struct tbd_registry *r,
                             const struct tbd_limits *limits) {
  r->lim = *limits;
}

struct tbd_stats *tbd_registry_stats(struct tbd_registry *r) {
  return &r->stats;
}

void tbd_registry_counts(const struct tbd_registry *r, struct tbd_counts *c) {
  c->sessions = r->nsessions;
  c->channels = r->nchannels;
  c->versions = r->nversions;
  c->buffers = r->nbuffers;
  c->events = r->nevents;
  c->leases = r->nleases;
  c->subscriptions = r->nsubs;
  c->waits = r->nwaits;
}

void tbd_registry_free(struct tbd_registry *r) {
  struct tbd_session *s, *stmp;

  if (r == NULL)
    return;
  HASH_ITER(hh, r->sessions, s, stmp) { s->muted = true; }
  while (r->sessions != NULL)
    tbd_session_close(r, r->sessions);
  /* What is left: closed channels, with the history the daemon kept for
   * consumers. With no session left, nothing leases it. */
  while (r->channels != NULL) {
    struct tbd_channel *ch = r->channels;

    while (ch->versions != NULL) {
      struct tbd_version *v = ch->versions;
      assert(v->nleases == 0);
      history_leave(ch, v);
      version_maybe_free(r, v);
    }
    channel_free(r, ch);
  }
  assert(r->waitqs == NULL && r->deadlines.n == 0);
  assert(r->uids == NULL); /* every count went with its object */
  tbd_heap_free(&r->deadlines);
  tbd_metrics_fini(&r->metrics);
  HASH_DEL(r->leases, &r->anchor);
  while (r->spare != NULL) {
    struct tbd_lease *l = r->spare;
    r->spare = l->snext;
    tbd_free(l);
  }
  tbd_acl_free(r->acl);
  tbd_free(r);
}

/* ---- emitting ---- */

void tbd__emit(struct tbd_registry *r, struct tbd_session *s,
               Tensorbroker__V1__ServerMessage *m, const int *fds, int nfds) {
  if (s->muted)
    return;
  r->emit(r->emit_ud, s, m, fds, nfds);
}

void tbd__send_reply(struct tbd_registry *r, struct tbd_session *s,
                     Tensorbroker__V1__Reply *rep, const int *fds, int nfds) {
  Tensorbroker__V1__ServerMessage m = TENSORBROKER__V1__SERVER_MESSAGE__INIT;

  m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY;
  m.reply = rep;
  tbd__emit(r, s, &m, fds, nfds);
}

int tbd__reply_status(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t request_id, int status, const char *fmt, ...) {
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  char msg[256] = "";
  va_list ap;

  if (fmt != NULL) {
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
  }
  if (status < 0)
    tbd_debug("session %llu: request %llu: %s: %s",
              (unsigned long long)s->id, (unsigned long long)request_id,
              tb_err_name(status), msg);
  if (request_id == 0 && status != TB_EPROTO)
    return status;
  rep.request_id = request_id;
  rep.status = status;
  rep.message = msg;
  tbd__send_reply(r, s, &rep, NULL, 0);
  return status;
}

void tbd__emit_notice(struct tbd_registry *r, struct tbd_session *s,
                      Tensorbroker__V1__Notice *n) {
  Tensorbroker__V1__ServerMessage m = TENSORBROKER__V1__SERVER_MESSAGE__INIT;

  m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE;
  m.notice = n;
  tbd__emit(r, s, &m, NULL, 0);
}

void tbd__evinfo_to_pb(const struct tbd_evinfo *e,
                       Tensorbroker__V1__EventInfo *pb,
                       Tensorbroker__V1__Device *dev) {
  tensorbroker__v1__event_info__init(pb);
  tensorbroker__v1__device__init(dev);
  pb->event_id = e->id;
  pb->cuda_ipc_event_handle.data = (uint8_t *)e->handle;
  pb->cuda_ipc_event_handle.len = sizeof(e->handle);
  dev->type = e->dev_type;
  dev->id = e->dev_id;
  dev->uuid.data = (uint8_t *)e->uuid;
  dev->uuid.len = e->uuid_len;
  pb->device = dev;
  pb->owner_pid = e->pid;
  pb->complete = e->complete;
}

/* ---- lookups ---- */

struct tbd_channel *tbd__channel_find(struct tbd_registry *r,
                                      const char *name) {
  struct tbd_channel *ch;

  HASH_FIND_STR(r->channels, name, ch);
  return ch;
}

struct tbd_session *tbd__session_find(struct tbd_registry *r, uint64_t id) {
  struct tbd_session *s;

  HASH_FIND(hh, r->sessions, &id, sizeof(id), s);
  return s;
}

/* ---- waits ----
 *
 * A parked acquire sits in the queue of its channel's name (tbd_waitq), a
 * WaitFree in its version's list, and either, when it has a deadline, in
 * the registry's deadline heap: the loop's timer reads the heap's top, a
 * publish looks at its own channel's queue, a freed version at its own
 * list, and a wait leaves all of them in O(log n). */

#define WAIT_OF(node, field)                                                 \
  ((struct tbd_wait *)(void *)((char *)(node) -                              \
                               offsetof(struct tbd_wait, field)))

/* Ties go by arrival, as the single list of waits served them before. */
static bool deadline_less(const struct tbd_heap_node *a,
                          const struct tbd_heap_node *b) {
  const struct tbd_wait *x = WAIT_OF(a, by_deadline);
  const struct tbd_wait *y = WAIT_OF(b, by_deadline);

  return x->deadline < y->deadline ||
         (x->deadline == y->deadline && x->seq < y->seq);
}

static bool version_less(const struct tbd_heap_node *a,
                         const struct tbd_heap_node *b) {
  const struct tbd_wait *x = WAIT_OF(a, by_version);
  const struct tbd_wait *y = WAIT_OF(b, by_version);

  return x->version < y->version ||
         (x->version == y->version && x->seq < y->seq);
}

static int seq_cmp(const struct tbd_wait *a, const struct tbd_wait *b) {
  return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static struct tbd_waitq *waitq_find(struct tbd_registry *r,
                                    const char *name) {
  struct tbd_waitq *q;

  HASH_FIND_STR(r->waitqs, name, q);
  return q;
}

uint32_t tbd__waiters(struct tbd_registry *r, const char *name) {
  struct tbd_waitq *q = waitq_find(r, name);

  return q != NULL ? q->n : 0;
}

static void waitq_free(struct tbd_registry *r, struct tbd_waitq *q) {
  HASH_DEL(r->waitqs, q);
  tbd_heap_free(&q->later);
  tbd_free(q->name);
  tbd_free(q);
}

void tbd__wait_remove(struct tbd_registry *r, struct tbd_wait *w) {
  struct tbd_waitq *q = w->q;

  if (w->by_deadline.slot != TBD_HEAP_NONE)
    tbd_heap_remove(&r->deadlines, &w->by_deadline);
  if (w->kind == TBD_WAIT_FREE) {
    DL_DELETE(w->v->free_waits, w);
  } else {
    if (w->by_version.slot != TBD_HEAP_NONE)
      tbd_heap_remove(&q->later, &w->by_version);
    else
      DL_DELETE(q->ready, w);
    if (--q->n == 0)
      waitq_free(r, q);
  }
  r->nwaits--;
  w->s->wait = NULL;
  tbd_free(w);
}

/* A wait not linked anywhere yet, with room for it in the deadline heap,
 * or NULL (out of memory). */
static struct tbd_wait *wait_new(struct tbd_registry *r, struct tbd_session *s,
                                 enum tbd_wait_kind kind, uint64_t request_id,
                                 int mode, uint64_t version,
                                 int64_t timeout_ms) {
  struct tbd_wait *w = tbd_calloc(1, sizeof(*w));

  if (w == NULL)
    return NULL;
  w->kind = kind;
  w->s = s;
  w->request_id = request_id;
  w->mode = mode;
  w->version = version;
  w->by_deadline.slot = w->by_version.slot = TBD_HEAP_NONE;
  w->since = tbd__now(r);
  if (timeout_ms < 0 || (uint64_t)timeout_ms > UINT64_MAX / 2)
    w->deadline = UINT64_MAX;
  else
    w->deadline = w->since + (uint64_t)timeout_ms;
  if (w->deadline != UINT64_MAX && tbd_heap_reserve(&r->deadlines) < 0) {
    tbd_free(w);
    return NULL;
  }
  return w;
}

/* Commit w: nothing fails from here. */
static void wait_commit(struct tbd_registry *r, struct tbd_wait *w) {
  w->seq = ++r->wait_seq;
  if (w->deadline != UINT64_MAX)
    tbd_heap_push(&r->deadlines, &w->by_deadline);
  r->nwaits++;
  w->s->wait = w;
}

/* Park an acquire on channel (ch: it, or NULL when it does not exist
 * yet). Nothing changes on failure (TB_EBUSY, TB_ENOMEM). */
static int acquire_park(struct tbd_registry *r, struct tbd_session *s,
                        uint64_t request_id, const char *channel,
                        const struct tbd_channel *ch, int mode,
                        uint64_t after, int64_t timeout_ms) {
  struct tbd_waitq *q, *newq = NULL;
  struct tbd_wait *w;
  /* answered by the next publish, or only by the publish of after + 1 */
  bool later = mode == TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_NEXT &&
               after > (ch != NULL ? ch->latest : 0);

  if (s->wait != NULL)
    return TB_EBUSY;
  w = wait_new(r, s, TBD_WAIT_ACQUIRE, request_id, mode, after, timeout_ms);
  if (w == NULL)
    return TB_ENOMEM;
  q = waitq_find(r, channel);
  if (q == NULL) {
    newq = tbd_calloc(1, sizeof(*newq));
    if (newq == NULL)
      goto out_free_wait;
    newq->name = tbd_strdup(channel);
    if (newq->name == NULL)
      goto out_free_queue;
    tbd_heap_init(&newq->later, version_less);
    tbd_hash_oom = 0;
    HASH_ADD_KEYPTR(hh, r->waitqs, newq->name, strlen(newq->name), newq);
    if (tbd_hash_oom)
      goto out_free_queue;
    q = newq;
  }
  if (later && tbd_heap_reserve(&q->later) < 0)
    goto out_unlink_queue;

  w->q = q;
  q->n++;
  wait_commit(r, w);
  if (later)
    tbd_heap_push(&q->later, &w->by_version);
  else
    DL_APPEND(q->ready, w);
  return 0;

out_unlink_queue:
  if (newq != NULL)
    HASH_DEL(r->waitqs, newq);
out_free_queue:
  if (newq != NULL)
    tbd_free(newq->name);
  tbd_free(newq);
out_free_wait:
  tbd_free(w);
  return TB_ENOMEM;
}

/* Park a WaitFree on v. Nothing changes on failure (TB_EBUSY,
 * TB_ENOMEM). */
static int free_park(struct tbd_registry *r, struct tbd_session *s,
                     uint64_t request_id, struct tbd_version *v,
                     int64_t timeout_ms) {
  struct tbd_wait *w;

  if (s->wait != NULL)
    return TB_EBUSY;
  w = wait_new(r, s, TBD_WAIT_FREE, request_id, 0, v->number, timeout_ms);
  if (w == NULL)
    return TB_ENOMEM;
  w->v = v;
  wait_commit(r, w);
  DL_APPEND(v->free_waits, w);
  return 0;
}

uint64_t tbd_registry_next_deadline(const struct tbd_registry *r) {
  const struct tbd_heap_node *top = tbd_heap_top(&r->deadlines);

  return top != NULL ? WAIT_OF(top, by_deadline)->deadline : UINT64_MAX;
}

void tbd_registry_expire(struct tbd_registry *r) {
  uint64_t now = tbd__now(r);
  struct tbd_heap_node *top;

  /* soonest first; among equal deadlines, in arrival order */
  while ((top = tbd_heap_top(&r->deadlines)) != NULL) {
    struct tbd_wait *w = WAIT_OF(top, by_deadline);
    if (w->deadline > now)
      break;
    struct tbd_session *s = w->s;
    uint64_t id = w->request_id;
    bool acquire = w->kind == TBD_WAIT_ACQUIRE;
    const char *what = acquire ? "acquire" : "wait-free";
    struct tbd_channel *ch = acquire ? tbd__channel_find(r, w->q->name)
                                     : NULL;
    int mode = w->mode;
    uint64_t after = w->version;
    char name[TB__DEFAULT_MAX_NAME + 1];
    snprintf(name, sizeof(name), "%s", acquire ? w->q->name : w->v->ch->name);
    tbd__wait_remove(r, w);
    /* an acquire that waited in vain for a new producer is told that the
     * producer is gone, not that time ran out */
    if (ch != NULL && ch->publisher == NULL)
      reply_no_producer(r, s, id, ch, mode, after);
    else
      tbd__reply_status(r, s, id, TB_ETIMEDOUT, "%s on '%s' timed out",
                        what, name);
  }
}

/* ---- version, buffer and channel lifetimes ---- */

static void buffer_unlink_owner(struct tbd_buffer *b) {
  if (b->owner == NULL)
    return;
  DL_DELETE2(b->owner->buffers, b, sprev, snext);
  b->owner->nbuffers--;
  b->owner = NULL;
}

static void buffer_maybe_free(struct tbd_registry *r, struct tbd_buffer *b) {
  Tensorbroker__V1__Notice n = TENSORBROKER__V1__NOTICE__INIT;
  Tensorbroker__V1__BufferRetired br = TENSORBROKER__V1__BUFFER_RETIRED__INIT;
  struct tbd_session *s, *stmp;

  if (!b->retired || b->nversions > 0)
    return;
  n.body_case = TENSORBROKER__V1__NOTICE__BODY_BUFFER_RETIRED;
  n.buffer_retired = &br;
  br.buffer_id = b->id;
  br.generation = b->generation;
  HASH_ITER(hh, r->sessions, s, stmp) {
    struct tbd_sent *e;
    HASH_FIND(hh, s->sent, &b->id, sizeof(b->id), e);
    if (e == NULL)
      continue;
    HASH_DEL(s->sent, e);
    tbd_free(e);
    tbd__emit_notice(r, s, &n);
  }
  if (b->fd >= 0) {
    close(b->fd);
    tbd_registry_fds_give(r, 1);
  }
  if (b->rofd >= 0) {
    close(b->rofd);
    tbd_registry_fds_give(r, 1);
  }
  HASH_DEL(r->buffers, b);
  r->nbuffers--;
  b->u->n[TBD_RES_BUFFERS]--;
  tbd__uid_put(r, b->u);
  tbd_free(b->info);
  tbd_free(b->info_ro);
  tbd_free(b);
}

void tbd__buffer_retire(struct tbd_registry *r, struct tbd_buffer *b) {
  buffer_unlink_owner(b);
  b->retired = true;
  buffer_maybe_free(r, b);
}

/* As the registry is freed, or to make room (tbd__channel_drop): a channel
 * otherwise stays, so that its version numbers continue across
 * producers. */
static void channel_free(struct tbd_registry *r, struct tbd_channel *ch) {
  tbd__channel_gone(r, ch);
  HASH_DEL(r->channels, ch);
  r->nchannels--;
  r->channel_frees++;
  tbd_vindex_free(&ch->index);
  tbd_free(ch->name);
  tbd_free(ch);
}

bool tbd__channel_idle(struct tbd_registry *r, const struct tbd_channel *ch) {
  const struct tbd_version *v;

  if (ch->publisher != NULL || ch->nleases > 0 ||
      waitq_find(r, ch->name) != NULL)
    return false;
  DL_FOREACH(ch->versions, v) {
    if (v->free_waits != NULL)
      return false;
  }
  return true;
}

void tbd__channel_drop(struct tbd_registry *r, struct tbd_channel *ch) {
  while (ch->versions != NULL) {
    struct tbd_version *v = ch->versions;
    assert(v->nleases == 0);
    history_leave(ch, v);
    version_maybe_free(r, v);
  }
  channel_free(r, ch);
}

static void version_free_notify(struct tbd_registry *r, struct tbd_version *v) {
  Tensorbroker__V1__Notice n = TENSORBROKER__V1__NOTICE__INIT;
  Tensorbroker__V1__VersionFree vf = TENSORBROKER__V1__VERSION_FREE__INIT;
  Tensorbroker__V1__EventInfo *evs = NULL, **evp = NULL;
  Tensorbroker__V1__Device *devs = NULL;
  struct tbd_session *pub = tbd__session_find(r, v->publisher_id);
  struct tbd_wait *w;
  size_t nev = v->ndone;
  uint32_t dropped = v->done_dropped;

  if (nev > 0) {
    /* Without memory for the event list the notice still goes out, without
     * its events: a lost notice would leave the producer waiting forever. */
    evs = tbd_calloc(nev, sizeof(*evs));
    devs = tbd_calloc(nev, sizeof(*devs));
    evp = tbd_calloc(nev, sizeof(*evp));
    if (evs == NULL || devs == NULL || evp == NULL) {
      tbd_warn("out of memory: VersionFree for %s@%llu sent without events",
               v->ch->name, (unsigned long long)v->number);
      /* ... saying so: the producer must not take it as free */
      dropped += (uint32_t)nev;
      nev = 0;
    }
    for (size_t i = 0; i < nev; i++) {
      tbd__evinfo_to_pb(&v->done[i], &evs[i], &devs[i]);
      evp[i] = &evs[i];
    }
  }
  if (pub != NULL) {
    n.body_case = TENSORBROKER__V1__NOTICE__BODY_VERSION_FREE;
    n.version_free = &vf;
    vf.channel = v->ch->name;
    vf.version = v->number;
    vf.buffer_id = v->buf->id;
    vf.n_done_events = nev;
    vf.done_events = evp;
    vf.done_events_dropped = dropped;
    tbd__emit_notice(r, pub, &n);
  }
  while ((w = v->free_waits) != NULL) {
    Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
    Tensorbroker__V1__WaitFreeReply wf =
        TENSORBROKER__V1__WAIT_FREE_REPLY__INIT;
    struct tbd_session *s = w->s;

    rep.request_id = w->request_id;
    rep.body_case = TENSORBROKER__V1__REPLY__BODY_WAIT_FREE;
    rep.wait_free = &wf;
    wf.version = v->number;
    wf.n_done_events = nev;
    wf.done_events = evp;
    wf.done_events_dropped = dropped;
    tbd__wait_remove(r, w);
    r->stats.wait_frees++;
    tbd__send_reply(r, s, &rep, NULL, 0);
  }
  tbd_free(evs);
  tbd_free(devs);
  tbd_free(evp);
}

/* A version is freed once it left the history and its last lease ended. */
static void version_maybe_free(struct tbd_registry *r, struct tbd_version *v) {
  struct tbd_channel *ch = v->ch;
  struct tbd_buffer *b = v->buf;

  if (v->in_history || v->nleases > 0)
    return;
  /* A version that outlived its producer among ones that died leaves the
   * history: the versions that died before it are now merely gone (EXACT:
   * TB_ENOTFOUND), as they would be had they lived. */
  if (!v->died && v->number >= ch->died.first && v->number <= ch->died.last)
    ch->died.first = v->number + 1;
  version_free_notify(r, v);
  DL_DELETE(ch->versions, v);
  tbd_vindex_remove(&ch->index, v);
  ch->nversions--;
  r->nversions--;
  b->nversions--;
  tbd_free(v->layout);
  tbd_free(v->meta);
  tbd_free(v->done);
  tbd_free(v);
  buffer_maybe_free(r, b);
}

/* v leaves the history for good (trimmed, died, or the registry ends). */
static void history_leave(struct tbd_channel *ch, struct tbd_version *v) {
  if (!v->in_history)
    return;
  v->in_history = false;
  DL_DELETE2(ch->history, v, hprev, hnext);
  ch->nhistory--;
}

/* Keep the newest ch->depth versions in history: the others are the
 * oldest, and only they are looked at. They go newest first (their
 * VersionFree notices in that order, as before). */
static void channel_trim(struct tbd_registry *r, struct tbd_channel *ch) {
  struct tbd_version *v, *prev;
  uint32_t excess;

  if (ch->nhistory <= ch->depth)
    return;
  excess = ch->nhistory - ch->depth;
  for (v = ch->history; excess > 1; excess--)
    v = v->hnext;
  for (; v != NULL; v = prev) {
    prev = v == ch->history ? NULL : v->hprev;
    history_leave(ch, v);
    version_maybe_free(r, v);
  }
}

/* ---- channels ---- */

/* Whether v's memory died with s, the session that published it. */
static bool version_dies_with(const struct tbd_version *v,
                              const struct tbd_session *s) {
  return v->publisher_id == s->id &&
         !tbd_kind_survives_producer(v->buf->kind);
}

/* s ended: the versions of ch whose memory died with it leave the history
 * for good (freed now unless leased; a lease held keeps its version until
 * it ends, but the version is never granted again). ch->died records the
 * numbers of the history versions that died (those of one kind, the
 * newest's), so that EXACT tells them from versions that merely left the
 * history; versions that survived among them are still held. */
static void channel_drop_died(struct tbd_registry *r, struct tbd_channel *ch,
                              const struct tbd_session *s) {
  struct tbd_version *v, *prev, *first = NULL, *last = NULL;

  /* newest first; prev of the head is the tail */
  for (v = ch->versions ? ch->versions->prev : NULL; v != NULL; v = prev) {
    prev = v == ch->versions ? NULL : v->prev;
    if (!v->in_history || !version_dies_with(v, s))
      continue;
    if (last != NULL && v->buf->kind != last->buf->kind)
      break;
    if (last == NULL)
      last = v;
    first = v;
  }
  if (last != NULL) {
    ch->died.first = first->number;
    ch->died.last = last->number;
    ch->died.kind = last->buf->kind;
    ch->died.pid = last->buf->owner_pid;
  }
  for (v = ch->versions ? ch->versions->prev : NULL; v != NULL; v = prev) {
    prev = v == ch->versions ? NULL : v->prev;
    if (!version_dies_with(v, s))
      continue;
    v->died = true;
    history_leave(ch, v);
    version_maybe_free(r, v);
  }
}

void tbd__channel_close(struct tbd_registry *r, struct tbd_channel *ch,
                        const struct tbd_session *s, const char *reason,
                        uint64_t unfinished) {
  Tensorbroker__V1__Notice n = TENSORBROKER__V1__NOTICE__INIT;
  Tensorbroker__V1__ChannelClosed cc = TENSORBROKER__V1__CHANNEL_CLOSED__INIT;
  struct tbd_subgroup *g;
  struct tbd_sub *sub;
  struct tbd_version *v;
  struct tbd_lease *l;
  uint64_t stamp;

  ch->publisher = NULL;
  ch->closed = true;
  ch->ended_pid = (uint32_t)s->pid;
  ch->ended_abrupt = tbd_session_abrupt(s);
  n.body_case = TENSORBROKER__V1__NOTICE__BODY_CHANNEL_CLOSED;
  n.channel_closed = &cc;
  cc.channel = ch->name;
  cc.reason = (char *)reason;
  cc.unfinished_version = unfinished;
  /* each session once, whether it subscribed, holds leases, or both */
  stamp = ++r->mark_seq;
  HASH_FIND_STR(r->subgroups, ch->name, g);
  if (g != NULL) {
    DL_FOREACH2(g->members, sub, gnext) {
      /* nor a ChannelClosed for one that may not see the channel */
      if (!tbd__access_quiet(r, sub->s, TBD_ACL_ACQUIRE, ch->name, ch))
        continue;
      sub->s->mark = stamp;
      tbd__emit_notice(r, sub->s, &n);
    }
  }
  DL_FOREACH(ch->versions, v) {
    DL_FOREACH2(v->leases, l, vnext) {
      if (l->s->mark == stamp)
        continue;
      l->s->mark = stamp;
      tbd__emit_notice(r, l->s, &n);
    }
  }
  channel_drop_died(r, ch, s);
  /* What survived its producer stays, but only the newest
   * --closed-history versions of it (docs/limits.md); the channel's own
   * depth comes back for its next producer. */
  if (ch->depth > r->lim.closed_history) {
    uint32_t depth = ch->depth;
    ch->depth = r->lim.closed_history;
    channel_trim(r, ch);
    ch->depth = depth;
  }
}

/* ---- buffers and events ---- */

int tbd__buffer_add(struct tbd_registry *r, struct tbd_session *s,
                    struct tbd_buffer *b) {
  if (s->nbuffers >= r->lim.max_buffers)
    return TB_ELIMIT;
  b->id = r->next_buffer_id;
  b->generation = 1;
  tbd_hash_oom = 0;
  HASH_ADD(hh, r->buffers, id, sizeof(b->id), b);
  if (tbd_hash_oom)
    return TB_ENOMEM;
  r->next_buffer_id++;
  r->nbuffers++;
  b->u = s->u;
  b->u->n[TBD_RES_BUFFERS]++;
  b->owner = s;
  b->owner_pid = (uint32_t)s->pid;
  DL_APPEND2(s->buffers, b, sprev, snext);
  s->nbuffers++;
  return 0;
}

int tbd__event_add(struct tbd_registry *r, struct tbd_session *s,
                   struct tbd_event *e) {
  if (s->nevents >= r->lim.max_events)
    return TB_ELIMIT;
  e->info.id = r->next_event_id;
  e->info.pid = (uint32_t)s->pid;
  tbd_hash_oom = 0;
  HASH_ADD(hh, r->events, info.id, sizeof(e->info.id), e);
  if (tbd_hash_oom)
    return TB_ENOMEM;
  r->next_event_id++;
  r->nevents++;
  s->u->n[TBD_RES_EVENTS]++;
  e->owner = s;
  DL_APPEND2(s->events, e, sprev, snext);
  s->nevents++;
  return 0;
}

void tbd__event_remove(struct tbd_registry *r, struct tbd_event *e) {
  DL_DELETE2(e->owner->events, e, sprev, snext);
  e->owner->nevents--;
  e->owner->u->n[TBD_RES_EVENTS]--;
  HASH_DEL(r->events, e);
  r->nevents--;
  tbd_free(e);
}

/* ---- publish ---- */

static struct tbd_version *find_match(struct tbd_channel *ch, int mode,
                                      uint64_t version);
static int buffer_info_pack(struct tbd_buffer *b, bool write);

/* b's packed BufferInfo (write: as registered, else with writable false;
 * buffer_info_pack made it) as the value of a length-delimited field (the
 * length, then the bytes, then fd_attached = true when attach), into out,
 * which has room for b->info_len + 16 bytes. Returns the length. Replies
 * and notices carry it as an "unknown" field, which protobuf-c copies
 * verbatim: no unpack, re-pack or re-size per message. */
static size_t buffer_info_field(const struct tbd_buffer *b, bool write,
                                bool attach, uint8_t *out) {
  const uint8_t *info = write || !b->writable ? b->info : b->info_ro;
  size_t info_len = write || !b->writable ? b->info_len : b->info_ro_len;
  size_t len = tb__put_varint(out, info_len + (attach ? 2 : 0));

  memcpy(out + len, info, info_len);
  len += info_len;
  if (attach) { /* BufferInfo.fd_attached = 8, varint true */
    out[len++] = 8u << 3;
    out[len++] = 1;
  }
  return len;
}

/* NewVersion of v for s; see registry_impl.h. */
bool tbd__new_version_fill(struct tbd_registry *r, struct tbd_session *s,
                           struct tbd_version *v,
                           struct tbd_new_version *out) {
  Tensorbroker__V1__NewVersion nv = TENSORBROKER__V1__NEW_VERSION__INIT;
  struct tbd_buffer *b = v->buf;
  struct tbd_sent *sent = NULL;
  bool write;

  out->nv = nv;
  out->nv.channel = v->ch->name;
  out->nv.version = v->number;
  if (!s->prefetch ||
      b->kind != TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC ||
      !(s->memory_kinds &
        (1u << TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC)))
    return false;
  HASH_FIND(hh, s->sent, &b->id, sizeof(b->id), sent);
  write = b->writable &&
          tbd__access_quiet(r, s, TBD_ACL_WRITE, v->ch->name, v->ch);
  if (sent != NULL || buffer_info_pack(b, write) < 0 ||
      b->info_len + 16 > sizeof(out->bibuf))
    return false;
  sent = tbd_calloc(1, sizeof(*sent));
  if (sent == NULL)
    return false;
  sent->buffer_id = b->id;
  sent->write = write;
  tbd_hash_oom = 0;
  HASH_ADD(hh, s->sent, buffer_id, sizeof(sent->buffer_id), sent);
  if (tbd_hash_oom) {
    tbd_free(sent);
    return false;
  }
  out->uf.tag = 3; /* NewVersion.buffer */
  out->uf.wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
  out->uf.len = buffer_info_field(b, write, false, out->bibuf);
  out->uf.data = out->bibuf;
  out->nv.base.n_unknown_fields = 1;
  out->nv.base.unknown_fields = &out->uf;
  if (v->has_ready) {
    tbd__evinfo_to_pb(&v->ready, &out->ei, &out->edev);
    out->nv.ready_event = &out->ei;
  }
  return true;
}

struct tbd_version *tbd__channel_newest(struct tbd_channel *ch) {
  struct tbd_version *v = ch->versions != NULL ? ch->versions->prev : NULL;

  /* from the tail back: only versions that died and are still leased are
   * skipped, so this is one step but after a producer's death */
  while (v != NULL && v->died)
    v = v == ch->versions ? NULL : v->prev;
  return v;
}

/* A subscriber's NewVersion notice (with the buffer, for prefetch); none
 * for a subscriber that may not acquire from the channel (it subscribed
 * before the channel was published, or the rules changed). */
static void new_version_notify(struct tbd_registry *r, struct tbd_session *s,
                               struct tbd_version *v) {
  Tensorbroker__V1__Notice n = TENSORBROKER__V1__NOTICE__INIT;
  struct tbd_new_version nv;

  if (!tbd__access_quiet(r, s, TBD_ACL_ACQUIRE, v->ch->name, v->ch))
    return;
  (void)tbd__new_version_fill(r, s, v, &nv);
  n.body_case = TENSORBROKER__V1__NOTICE__BODY_NEW_VERSION;
  n.new_version = &nv.nv;
  tbd__emit_notice(r, s, &n);
}

/* Answer the acquires parked on q that ch's new version (ch->latest)
 * satisfies, in arrival order: the ready ones, and NEXT after the number
 * before it. q is freed with its last wait. */
static void waitq_publish(struct tbd_registry *r, struct tbd_waitq *q,
                          struct tbd_channel *ch) {
  struct tbd_heap_node *top;
  struct tbd_wait *w, *next, *due = NULL;

  while ((top = tbd_heap_top(&q->later)) != NULL &&
         WAIT_OF(top, by_version)->version < ch->latest) {
    w = WAIT_OF(top, by_version);
    tbd_heap_remove(&q->later, top);
    DL_APPEND(due, w);
  }
  if (due != NULL) {
    DL_CONCAT(q->ready, due);
    DL_SORT(q->ready, seq_cmp);
  }
  for (w = q->ready; w != NULL; w = next) {
    struct tbd_session *ws = w->s;
    uint64_t id = w->request_id;
    int mode = w->mode;
    uint64_t after = w->version;

    next = w->next;
    if (find_match(ch, mode, after) == NULL)
      continue; /* not for a ready wait: see acquire_park */
    tbd__wait_remove(r, w);
    /* cannot park again: a version now exists that matches */
    tbd__acquire(r, ws, id, ch->name, mode, after, 0);
  }
}

int tbd__publish(struct tbd_registry *r, struct tbd_session *s,
                 const char *channel, struct tbd_buffer *b,
                 const Tensorbroker__V1__Layout *layout,
                 const struct tbd_event *ready, bool ready_complete,
                 const uint8_t *meta, size_t meta_len, uint32_t depth,
                 uint64_t *version, char *why, size_t whylen) {
  struct tbd_channel *ch = tbd__channel_find(r, channel), *newch = NULL;
  struct tbd_version *v;
  struct tbd_subgroup *g;
  struct tbd_sub *sub;
  struct tbd_waitq *q;
  int rc = TB_ENOMEM;

  if (ch != NULL && ch->publisher != NULL && ch->publisher != s) {
    snprintf(why, whylen, "channel '%s' has another publisher (session %llu)",
             channel, (unsigned long long)ch->publisher->id);
    return TB_EBUSY;
  }
  rc = tbd__channel_admit(r, s, ch, why, whylen);
  if (rc < 0)
    return rc;
  rc = TB_ENOMEM;
  /* Allocate everything first so that a failure changes nothing. */
  v = tbd_calloc(1, sizeof(*v));
  if (v == NULL)
    goto out_nomem;
  {
    /* Packed once, with its length prefix: every AcquireReply carries these
     * bytes as they are (lease_grant). Without the producer's unknown
     * fields: protobuf-c accepts a field 0 written in two bytes, packs it
     * back in one and then refuses its own output, so one bad publish
     * would make every acquire of the version undecodable (found by the
     * request fuzzer). */
    Tensorbroker__V1__Layout known = *layout;
    known.base.n_unknown_fields = 0;
    known.base.unknown_fields = NULL;
    size_t len = tensorbroker__v1__layout__get_packed_size(&known);
    size_t pre = tb__varint_size(len);
    v->layout_len = pre + len;
    v->layout = tbd_malloc(v->layout_len);
    if (v->layout == NULL)
      goto out_free_version;
    tb__put_varint(v->layout, len);
    tensorbroker__v1__layout__pack(&known, v->layout + pre);
  }
  v->meta_len = meta_len;
  v->meta = tbd_memdup(meta, meta_len);
  if (v->meta == NULL)
    goto out_free_version;
  if (ch != NULL && tbd_vindex_reserve(&ch->index) < 0)
    goto out_free_version;
  if (ch == NULL) {
    newch = tbd_calloc(1, sizeof(*newch));
    if (newch == NULL)
      goto out_free_version;
    newch->name = tbd_strdup(channel);
    if (newch->name == NULL)
      goto out_free_channel;
    newch->depth = 1;
    newch->closed = true;
    if (tbd_vindex_reserve(&newch->index) < 0)
      goto out_free_channel;
    tbd_hash_oom = 0;
    HASH_ADD_KEYPTR(hh, r->channels, newch->name, strlen(newch->name), newch);
    if (tbd_hash_oom)
      goto out_free_channel;
    r->nchannels++;
    ch = newch;
  }

  /* Commit: nothing below fails. */
  if (newch != NULL)
    ch->owner = s->uid; /* the first publisher's, for good (acl.h) */
  if (ch->publisher == NULL) {
    ch->publisher = s;
    ch->closed = false;
    tbd__channel_taken(r, ch, s);
  }
  if (depth != 0)
    ch->depth = depth;
  v->ch = ch;
  v->number = ++ch->latest;
  v->buf = b;
  v->publisher_id = s->id;
  v->in_history = true;
  if (ready != NULL) {
    v->has_ready = true;
    v->ready = ready->info;
    v->ready.complete = ready_complete;
  }
  DL_APPEND(ch->versions, v);
  tbd_vindex_append(&ch->index, v);
  DL_APPEND2(ch->history, v, hprev, hnext);
  ch->nhistory++;
  ch->nversions++;
  ch->publishes++;
  r->stats.publishes++;
  r->nversions++;
  b->nversions++;
  *version = v->number;

  /* Parked acquires that the new version satisfies are answered first:
   * they are the hand-off someone is waiting for. Then the subscribers'
   * notices, the history trim (and its VersionFree notices), and the
   * publisher's own reply (the caller sends it). A parked acquire only
   * ever matches the new version (it would not have parked otherwise),
   * which the trim never removes. */
  q = waitq_find(r, channel);
  if (q != NULL)
    waitq_publish(r, q, ch);
  HASH_FIND_STR(r->subgroups, channel, g);
  if (g != NULL) {
    DL_FOREACH2(g->members, sub, gnext) { new_version_notify(r, sub->s, v); }
  }
  channel_trim(r, ch);
  return 0;

out_free_channel:
  tbd_vindex_free(&newch->index);
  tbd_free(newch->name);
  tbd_free(newch);
out_free_version:
  tbd_free(v->meta);
  tbd_free(v->layout);
  tbd_free(v);
out_nomem:
  snprintf(why, whylen, "out of memory");
  return rc;
}

/* ---- acquire and release ---- */

/* Version number of ch, granted or not, or NULL. */
static struct tbd_version *version_find(struct tbd_channel *ch,
                                        uint64_t number) {
  return tbd_vindex_find(&ch->index, number);
}

/* The version an acquire is granted now, or NULL: never one whose memory
 * died with its producer. */
static struct tbd_version *find_match(struct tbd_channel *ch, int mode,
                                      uint64_t version) {
  struct tbd_version *v;

  if (ch == NULL || ch->versions == NULL)
    return NULL;
  switch (mode) {
  case TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_LATEST:
    return tbd__channel_newest(ch);
  case TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_NEXT:
    if (version == UINT64_MAX)
      return NULL;
    /* died versions are skipped: only those still leased are there */
    for (uint32_t i = tbd_vindex_lower(&ch->index, version + 1);
         i < ch->index.end; i++) {
      if (!ch->index.a[i]->died)
        return ch->index.a[i];
    }
    return NULL;
  default:
    v = version_find(ch, version);
    return v != NULL && !v->died ? v : NULL;
  }
}

/* TB_ECLOSED for an acquire that finds nothing to grant on ch, whose
 * producer is gone (ch->publisher NULL): sent at once for timeout 0, else
 * when the wait runs out. after: NEXT's version, else 0. */
static int reply_no_producer(struct tbd_registry *r, struct tbd_session *s,
                             uint64_t request_id,
                             const struct tbd_channel *ch, int mode,
                             uint64_t after) {
  char which[40] = "";

  if (mode == TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_NEXT)
    snprintf(which, sizeof(which), " after %llu", (unsigned long long)after);
  return tbd__reply_status(
      r, s, request_id, TB_ECLOSED,
      "channel '%s' has no producer: its publisher ended (pid %u: %s) and "
      "no version%s is left that can be granted",
      ch->name, (unsigned)ch->ended_pid,
      ch->ended_abrupt ? "publisher ended without closing its session"
                       : "publisher disconnected",
      which);
}

/* TB_ECLOSED for EXACT of a version of ch whose memory died with its
 * producer, or 0 when it did not (never published, or gone from the
 * history: TB_ENOTFOUND as before). */
static int reply_died(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t request_id, struct tbd_channel *ch,
                      uint64_t version) {
  struct tbd_version *v = version_find(ch, version);
  int kind = ch->died.kind;
  uint32_t pid = ch->died.pid;

  if (v != NULL && v->died) { /* still leased by someone */
    kind = v->buf->kind;
    pid = v->buf->owner_pid;
  } else if (v != NULL || ch->died.last == 0 || version < ch->died.first ||
             version > ch->died.last) {
    return 0;
  }
  return tbd__reply_status(r, s, request_id, TB_ECLOSED,
                           "version %llu of '%s' is gone: its %s memory "
                           "died with its producer (pid %u)",
                           (unsigned long long)version, ch->name,
                           tbd_kind_name(kind), (unsigned)pid);
}

/* The BufferInfo of b as every AcquireReply sends it, packed once: all of
 * it is fixed at registration except fd_attached, which lease_grant
 * appends when true, and, for a buffer consumers may write, writable,
 * which is false for a consumer not granted write (!write: b->info_ro).
 * 0 or TB_ENOMEM. */
static int buffer_info_pack(struct tbd_buffer *b, bool write) {
  Tensorbroker__V1__BufferInfo bi = TENSORBROKER__V1__BUFFER_INFO__INIT;
  Tensorbroker__V1__Device bdev = TENSORBROKER__V1__DEVICE__INIT;
  bool ro = b->writable && !write;
  uint8_t **info = ro ? &b->info_ro : &b->info;
  size_t *info_len = ro ? &b->info_ro_len : &b->info_len;

  if (*info != NULL)
    return 0;
  bi.buffer_id = b->id;
  bi.generation = b->generation;
  bi.kind = b->kind;
  bi.size = b->size;
  bi.device = &bdev;
  bdev.type = b->dev_type;
  bdev.id = b->dev_id;
  bdev.uuid.data = b->uuid;
  bdev.uuid.len = b->uuid_len;
  bi.cuda_ipc_handle.data = b->handle;
  bi.cuda_ipc_handle.len = b->handle_len;
  bi.writable = b->writable && !ro;
  bi.producer_pid = b->owner_pid;
  *info_len = tensorbroker__v1__buffer_info__get_packed_size(&bi);
  *info = tbd_malloc(*info_len);
  if (*info == NULL)
    return TB_ENOMEM;
  tensorbroker__v1__buffer_info__pack(&bi, *info);
  return 0;
}


void tbd__memfd_restrict(int fd, bool warn) {
  static bool warned;
  struct stat st;

  if (fstat(fd, &st) < 0 || (st.st_mode & 077) == 0 ||
      fchmod(fd, st.st_mode & 0700) == 0 || !warn || warned)
    return;
  warned = true;
  tbd_warn("a consumers-may-write memfd is mode %04o and the daemon cannot "
           "make it owner-only (fchmod: %s): consumers of other uids not "
           "granted write can re-open it read-write through /proc (the "
           "library makes its memfds 0600; this producer did not)",
           (unsigned)(st.st_mode & 07777), strerror(errno));
}

/* A lease's memory, kept for the next grant (up to a few dozen). */
#define SPARE_LEASES_MAX 64

static void lease_free(struct tbd_registry *r, struct tbd_lease *l) {
  if (r->nspare >= SPARE_LEASES_MAX) {
    tbd_free(l);
    return;
  }
  l->snext = r->spare;
  r->spare = l;
  r->nspare++;
}

/* Create a lease on v for s and emit the AcquireReply; write: s may
 * write v's buffer (it is writable and the rules grant write), else it
 * gets the read-only descriptor and BufferInfo.writable false. A session
 * that holds a descriptor of the buffer already keeps what it was sent
 * until it forgets the buffer. Nothing changes on failure (TB_ENOMEM). */
static int lease_grant(struct tbd_registry *r, struct tbd_session *s,
                       uint64_t request_id, struct tbd_version *v,
                       bool write) {
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Tensorbroker__V1__AcquireReply ar = TENSORBROKER__V1__ACQUIRE_REPLY__INIT;
  Tensorbroker__V1__EventInfo ei;
  Tensorbroker__V1__Device edev;
  ProtobufCMessageUnknownField pre[2];
  uint8_t bistack[256], *bibuf = bistack; /* a BufferInfo is < 170 bytes */
  struct tbd_buffer *b = v->buf;
  struct tbd_lease *l;
  struct tbd_sent *sent, *newsent = NULL;
  bool attach;
  int fd;

  if (r->spare != NULL) {
    l = r->spare;
    r->spare = l->snext;
    r->nspare--;
    memset(l, 0, sizeof(*l));
  } else {
    l = tbd_calloc(1, sizeof(*l));
    if (l == NULL)
      goto out_nomem;
  }
  l->id = r->next_lease_id;
  HASH_FIND(hh, s->sent, &b->id, sizeof(b->id), sent);
  if (sent == NULL) {
    newsent = tbd_calloc(1, sizeof(*newsent));
    if (newsent == NULL)
      goto out_free_lease;
    newsent->buffer_id = b->id;
  }
  if (sent != NULL && sent->fd_current)
    write = sent->write;
  if (buffer_info_pack(b, write) < 0)
    goto out_free_sent;
  /* room for buffer_info_field */
  if (b->info_len + 16 > sizeof(bistack)) {
    bibuf = tbd_malloc(b->info_len + 16);
    if (bibuf == NULL)
      goto out_free_sent;
  }
  tbd_hash_oom = 0;
  HASH_ADD(hh, r->leases, id, sizeof(l->id), l);
  if (tbd_hash_oom)
    goto out_free_bibuf;
  tbd_hash_oom = 0;
  if (newsent != NULL)
    HASH_ADD(hh, s->sent, buffer_id, sizeof(newsent->buffer_id), newsent);
  if (tbd_hash_oom) {
    HASH_DEL(r->leases, l);
    goto out_free_bibuf;
  }
  if (newsent != NULL)
    sent = newsent;

  /* Commit. */
  r->next_lease_id++;
  l->s = s;
  l->v = v;
  l->since = tbd__now(r);
  DL_APPEND2(s->leases, l, sprev, snext);
  DL_APPEND2(v->leases, l, vprev, vnext);
  s->nleases++;
  s->u->n[TBD_RES_LEASES]++;
  v->nleases++;
  v->ch->nleases++;
  r->nleases++;
  r->stats.acquires++;
  fd = b->writable && !write ? b->rofd : b->fd;
  attach = b->kind == TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD &&
           !sent->fd_current && fd >= 0;
  if (attach && fd == b->rofd)
    tbd__memfd_restrict(b->fd, true);
  sent->write = write;
  if (b->kind == TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD)
    sent->fd_current = true;

  rep.request_id = request_id;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_ACQUIRE;
  rep.acquire = &ar;
  ar.lease_id = l->id;
  ar.version = v->number;
  /* The layout (packed at publish) and the buffer (packed at its first
   * acquire) go out as "unknown" fields, which protobuf-c copies verbatim
   * (tag, then the length-prefixed value): no unpack, re-pack or re-size
   * per acquire. Receivers see fields 3 and 4 as usual. */
  pre[0].tag = 3; /* AcquireReply.layout */
  pre[0].wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
  pre[0].len = v->layout_len;
  pre[0].data = v->layout;
  pre[1].tag = 4; /* AcquireReply.buffer */
  pre[1].wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
  pre[1].len = buffer_info_field(b, write, attach, bibuf);
  pre[1].data = bibuf;
  ar.base.n_unknown_fields = 2;
  ar.base.unknown_fields = pre;
  ar.metadata.data = v->meta;
  ar.metadata.len = v->meta_len;
  ar.channel = v->ch->name;
  if (v->has_ready) {
    tbd__evinfo_to_pb(&v->ready, &ei, &edev);
    ar.ready_event = &ei;
  }
  tbd__send_reply(r, s, &rep, attach ? &fd : NULL, attach ? 1 : 0);
  if (bibuf != bistack)
    tbd_free(bibuf);
  return 0;

out_free_bibuf:
  if (bibuf != bistack)
    tbd_free(bibuf);
out_free_sent:
  tbd_free(newsent);
out_free_lease:
  lease_free(r, l);
out_nomem:
  return TB_ENOMEM;
}

struct tbd_channel *tbd__channel_recent(struct tbd_registry *r,
                                        struct tbd_session *s,
                                        const char *name) {
  if (s->recent != NULL && name != NULL &&
      s->recent_frees == r->channel_frees && strcmp(s->recent->name, name) == 0)
    return s->recent;
  return NULL;
}

/* Whether s may write v's buffer: it is writable and the rules grant
 * write. TB_ESYS when s may not but the daemon has no read-only
 * descriptor to send it instead (it could not re-open the memfd). */
static int acquire_write(struct tbd_registry *r, struct tbd_session *s,
                         struct tbd_version *v, bool *write) {
  struct tbd_buffer *b = v->buf;
  struct tbd_sent *sent;

  *write = b->writable &&
           tbd__access_quiet(r, s, TBD_ACL_WRITE, v->ch->name, v->ch);
  if (*write || !b->writable || b->fd < 0 || b->rofd >= 0)
    return 0;
  HASH_FIND(hh, s->sent, &b->id, sizeof(b->id), sent);
  if (sent != NULL && sent->fd_current)
    return 0;
  return TB_ESYS;
}

int tbd__acquire(struct tbd_registry *r, struct tbd_session *s,
                 uint64_t request_id, const char *channel, int mode,
                 uint64_t version, int64_t timeout_ms) {
  struct tbd_channel *ch = tbd__channel_recent(r, s, channel);
  struct tbd_version *v;
  bool write;
  int rc;

  if (ch == NULL) {
    ch = tbd__channel_find(r, channel);
    s->recent = ch;
    s->recent_frees = r->channel_frees;
  }
  {
    /* also for a parked acquire answered by the first publish: the
     * channel has an owner now */
    char msg[512];
    if (tbd__access(r, s, TBD_ACL_ACQUIRE, "acquire", channel, ch, msg,
                    sizeof(msg)) < 0)
      return tbd__reply_status(r, s, request_id, TB_EPERM, "%s", msg);
  }

  {
    char why[160];
    if (tbd__limit_check(r, s, s->u, TBD_RES_LEASES, TBD_SCOPE_ALL, why,
                         sizeof(why), NULL) < 0)
      return tbd__reply_status(r, s, request_id, TB_ELIMIT, "%s", why);
  }
  v = find_match(ch, mode, version);
  if (v != NULL) {
    if (acquire_write(r, s, v, &write) < 0)
      return tbd__reply_status(r, s, request_id, TB_ESYS,
                               "buffer %llu: this session may not write it "
                               "and the daemon has no read-only descriptor "
                               "of it (it could not re-open the memfd "
                               "through /proc)",
                               (unsigned long long)v->buf->id);
    rc = lease_grant(r, s, request_id, v, write);
    if (rc < 0)
      return tbd__reply_status(r, s, request_id, rc, "out of memory");
    return 0;
  }
  if (mode == TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_EXACT) {
    if (ch != NULL && (rc = reply_died(r, s, request_id, ch, version)) < 0)
      return rc;
    return tbd__reply_status(r, s, request_id, TB_ENOTFOUND,
                             "version %llu of '%s' is not held",
                             (unsigned long long)version, channel);
  }
  if (timeout_ms == 0) {
    if (ch == NULL)
      return tbd__reply_status(r, s, request_id, TB_ENOTFOUND,
                               "no channel '%s'", channel);
    if (ch->publisher == NULL)
      return reply_no_producer(r, s, request_id, ch, mode, version);
    return tbd__reply_status(r, s, request_id, TB_EAGAIN,
                             "no version of '%s' yet", channel);
  }
  /* Also on a channel whose producer is gone: a new one may take it over
   * within the timeout, and its versions carry on the numbering. */
  rc = acquire_park(r, s, request_id, channel, ch, mode, version, timeout_ms);
  if (rc == TB_EBUSY)
    return tbd__reply_status(r, s, request_id, rc,
                             "another request of this session is waiting");
  if (rc < 0)
    return tbd__reply_status(r, s, request_id, rc, "out of memory");
  return 0;
}

int tbd__lease_release(struct tbd_registry *r, struct tbd_lease *l,
                       const struct tbd_event *done) {
  struct tbd_version *v = l->v;
  struct tbd_session *s = l->s;

  if (done != NULL) {
    bool seen = false;
    for (size_t i = 0; i < v->ndone; i++)
      seen = seen || v->done[i].id == done->info.id;
    if (!seen && v->ndone >= r->lim.max_done_events) {
      /* Past --max-done-events the event is not kept, so that no
       * VersionFree outgrows a message; the producer is told how many
       * went (VersionFree.done_events_dropped) and must not rewrite the
       * buffer on the strength of the events it got (docs/limits.md). */
      if (v->done_dropped++ == 0)
        tbd_warn("version %llu of '%s': more than %u distinct done events "
                 "(--max-done-events); those past it are dropped and its "
                 "producer told",
                 (unsigned long long)v->number, v->ch->name,
                 r->lim.max_done_events);
    } else if (!seen) {
      struct tbd_evinfo *d = tbd_malloc((v->ndone + 1) * sizeof(*d));
      if (d == NULL)
        return TB_ENOMEM;
      if (v->ndone > 0)
        memcpy(d, v->done, v->ndone * sizeof(*d));
      d[v->ndone] = done->info;
      tbd_free(v->done);
      v->done = d;
      v->ndone++;
    }
  }
  HASH_DEL(r->leases, l);
  DL_DELETE2(s->leases, l, sprev, snext);
  DL_DELETE2(v->leases, l, vprev, vnext);
  s->nleases--;
  s->u->n[TBD_RES_LEASES]--;
  v->nleases--;
  v->ch->nleases--;
  r->nleases--;
  lease_free(r, l);
  version_maybe_free(r, v);
  return 0;
}

/* ---- subscriptions ---- */

int tbd__subscribe(struct tbd_registry *r, struct tbd_session *s,
                   const char *name) {
  struct tbd_sub *sub;
  struct tbd_subgroup *g, *newg = NULL;

  HASH_FIND_STR(s->subs, name, sub);
  if (sub != NULL)
    return 0;
  if (s->nsubs >= r->lim.max_subscriptions)
    return TB_ELIMIT;
  sub = tbd_calloc(1, sizeof(*sub));
  if (sub == NULL)
    return TB_ENOMEM;
  sub->name = tbd_strdup(name);
  if (sub->name == NULL)
    goto out_free_sub;
  HASH_FIND_STR(r->subgroups, name, g);
  if (g == NULL) {
    newg = tbd_calloc(1, sizeof(*newg));
    if (newg == NULL)
      goto out_free_sub;
    newg->name = tbd_strdup(name);
    if (newg->name == NULL)
      goto out_free_group;
    tbd_hash_oom = 0;
    HASH_ADD_KEYPTR(hh, r->subgroups, newg->name, strlen(newg->name), newg);
    if (tbd_hash_oom)
      goto out_free_group;
    g = newg;
  }
  tbd_hash_oom = 0;
  HASH_ADD_KEYPTR(hh, s->subs, sub->name, strlen(sub->name), sub);
  if (tbd_hash_oom) {
    if (newg != NULL)
      HASH_DEL(r->subgroups, newg);
    goto out_free_group;
  }
  sub->s = s;
  sub->g = g;
  DL_APPEND2(g->members, sub, gprev, gnext);
  s->nsubs++;
  s->u->n[TBD_RES_SUBS]++;
  r->nsubs++;
  return 0;

out_free_group:
  if (newg != NULL)
    tbd_free(newg->name);
  tbd_free(newg);
out_free_sub:
  tbd_free(sub->name);
  tbd_free(sub);
  return TB_ENOMEM;
}

int tbd__unsubscribe(struct tbd_registry *r, struct tbd_session *s,
                     const char *name) {
  struct tbd_sub *sub;
  struct tbd_subgroup *g;

  HASH_FIND_STR(s->subs, name, sub);
  if (sub == NULL)
    return TB_ENOTFOUND;
  g = sub->g;
  DL_DELETE2(g->members, sub, gprev, gnext);
  if (g->members == NULL) {
    HASH_DEL(r->subgroups, g);
    tbd_free(g->name);
    tbd_free(g);
  }
  HASH_DEL(s->subs, sub);
  s->nsubs--;
  s->u->n[TBD_RES_SUBS]--;
  r->nsubs--;
  tbd_free(sub->name);
  tbd_free(sub);
  return 0;
}

/* ---- wait free ---- */

int tbd__wait_free(struct tbd_registry *r, struct tbd_session *s,
                   uint64_t request_id, const char *channel, uint64_t version,
                   int64_t timeout_ms) {
  struct tbd_channel *ch = tbd__channel_find(r, channel);
  struct tbd_version *v;
  char msg[512];
  int rc;

  /* the producer waits for its versions; a consumer may too */
  if (ch != NULL &&
      !tbd__access_quiet(r, s, TBD_ACL_PUBLISH, channel, ch) &&
      tbd__access(r, s, TBD_ACL_ACQUIRE, "wait on", channel, ch, msg,
                  sizeof(msg)) < 0)
    return tbd__reply_status(r, s, request_id, TB_EPERM, "%s", msg);
  if (ch == NULL || version == 0 || version > ch->latest)
    return tbd__reply_status(r, s, request_id, TB_ENOTFOUND,
                             "version %llu of '%s' was never published",
                             (unsigned long long)version, channel);
  /* a version that died with its producer is freed like any other: once
   * its last lease ends */
  v = version_find(ch, version);
  if (v == NULL) {
    Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
    Tensorbroker__V1__WaitFreeReply wf =
        TENSORBROKER__V1__WAIT_FREE_REPLY__INIT;
    /* already freed: its VersionFree notice went out before this reply */
    rep.request_id = request_id;
    rep.body_case = TENSORBROKER__V1__REPLY__BODY_WAIT_FREE;
    rep.wait_free = &wf;
    wf.version = version;
    r->stats.wait_frees++;
    tbd__send_reply(r, s, &rep, NULL, 0);
    return 0;
  }
  if (timeout_ms == 0)
    return tbd__reply_status(r, s, request_id, TB_EBUSY,
                             "version %llu of '%s' is %s",
                             (unsigned long long)version, channel,
                             v->nleases > 0 ? "leased" : "in history");
  rc = free_park(r, s, request_id, v, timeout_ms);
  if (rc == TB_EBUSY)
    return tbd__reply_status(r, s, request_id, rc,
                             "another request of this session is waiting");
  if (rc < 0)
    return tbd__reply_status(r, s, request_id, rc, "out of memory");
  return 0;
}
