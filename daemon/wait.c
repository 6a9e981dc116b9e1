/* SPDX-License-Identifier: Apache-2.0 */
/* Parked requests: acquires waiting for a version, WaitFree waiting for a
 * version's end, their deadlines, and the publish that answers them. */
#include "registry_impl.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <tensorbroker/tensorbroker.h>

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
bool tbd__wait_deadline_less(const struct tbd_heap_node *a,
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

struct tbd_waitq *tbd__waitq_find(struct tbd_registry *r, const char *name) {
  struct tbd_waitq *q;

  HASH_FIND_STR(r->waitqs, name, q);
  return q;
}

uint32_t tbd__waiters(struct tbd_registry *r, const char *name) {
  struct tbd_waitq *q = tbd__waitq_find(r, name);

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
  DL_DELETE2(w->s->waits, w, sprev, snext);
  w->s->nwaits--;
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
  DL_APPEND2(w->s->waits, w, sprev, snext);
  w->s->nwaits++;
}

/* Why request_id could not park (rc: park_check's, or TB_ENOMEM), replied
 * to it; returns rc. */
static int park_refused(struct tbd_registry *r, struct tbd_session *s,
                        uint64_t request_id, int rc) {
  if (rc == TB_ELIMIT)
    return tbd__reply_status(r, s, request_id, rc,
                             "session has %u parked requests (--max-waits)",
                             s->nwaits);
  return tbd__reply_status(r, s, request_id, rc, "out of memory");
}

/* Whether s may park one more request: 0 or TB_ELIMIT. */
static int park_check(const struct tbd_registry *r,
                      const struct tbd_session *s) {
  return s->nwaits >= r->lim.max_waits ? TB_ELIMIT : 0;
}

void tbd__wait_cancel(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t request_id) {
  struct tbd_wait *w, *tmp;

  /* every one of that id: a client that reused an id while it waited is
   * answered for none of them after the Cancel */
  DL_FOREACH_SAFE2(s->waits, w, tmp, snext) {
    if (w->request_id == request_id)
      tbd__wait_remove(r, w);
  }
}

int tbd__acquire_park(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t request_id, const char *channel,
                      const struct tbd_channel *ch, int mode, uint64_t after,
                      int64_t timeout_ms) {
  struct tbd_waitq *q, *newq = NULL;
  struct tbd_wait *w;
  /* answered by the next publish, or only by the publish of after + 1 */
  bool later = mode == TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_NEXT &&
               after > (ch != NULL ? ch->latest : 0);

  if (park_check(r, s) < 0)
    return park_refused(r, s, request_id, TB_ELIMIT);
  w = wait_new(r, s, TBD_WAIT_ACQUIRE, request_id, mode, after, timeout_ms);
  if (w == NULL)
    return park_refused(r, s, request_id, TB_ENOMEM);
  q = tbd__waitq_find(r, channel);
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
  return park_refused(r, s, request_id, TB_ENOMEM);
}

/* Park a WaitFree on v, or reply why not, changing nothing (as
 * tbd__acquire_park). */
static int free_park(struct tbd_registry *r, struct tbd_session *s,
                     uint64_t request_id, struct tbd_version *v,
                     int64_t timeout_ms) {
  struct tbd_wait *w;

  if (park_check(r, s) < 0)
    return park_refused(r, s, request_id, TB_ELIMIT);
  w = wait_new(r, s, TBD_WAIT_FREE, request_id, 0, v->number, timeout_ms);
  if (w == NULL)
    return park_refused(r, s, request_id, TB_ENOMEM);
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
      tbd__reply_no_producer(r, s, id, ch, mode, after);
    else
      tbd__reply_status(r, s, id, TB_ETIMEDOUT, "%s on '%s' timed out",
                        what, name);
  }
}


/* Answer the acquires parked on q that ch's new version (ch->latest)
 * satisfies, in arrival order: the ready ones, and NEXT after the number
 * before it. q is freed with its last wait. */
void tbd__waitq_publish(struct tbd_registry *r, struct tbd_waitq *q,
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
    if (tbd__version_match(ch, mode, after) == NULL)
      continue; /* not for a ready wait: see tbd__acquire_park */
    tbd__wait_remove(r, w);
    /* judged again: the channel has an owner now; cannot park again: a
     * version now exists that matches */
    if (tbd__acquire_judge(r, ws, id, ch->name, ch) == 0)
      tbd__acquire(r, ws, id, ch->name, mode, after, 0);
  }
}

/* ---- wait free ---- */

int tbd__wait_free(struct tbd_registry *r, struct tbd_session *s,
                   uint64_t request_id, const char *channel, uint64_t version,
                   int64_t timeout_ms) {
  struct tbd_channel *ch = tbd__channel_find(r, channel);
  struct tbd_version *v;
  char msg[512];

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
  v = tbd__version_find(ch, version);
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
  return free_park(r, s, request_id, v, timeout_ms);
}
