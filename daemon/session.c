/* SPDX-License-Identifier: Apache-2.0 */
/* Sessions: one per connection. Opening records the peer's credentials;
 * closing, for whatever reason, gives back everything the session held and
 * tells the sessions affected (docs/protocol.md, "Session"). */
#include "registry_impl.h"

#include <stdio.h>
#include <string.h>

#include <tensorbroker/errors.h>

#include "log.h"

int tbd_session_open(struct tbd_registry *r, pid_t pid, uid_t uid, gid_t gid,
                     void *conn, struct tbd_session **out) {
  struct tbd_session *s = tbd_calloc(1, sizeof(*s));

  if (s == NULL)
    return TB_ENOMEM;
  s->id = r->next_session_id;
  s->pid = pid;
  s->uid = uid;
  s->gid = gid;
  s->conn = conn;
  s->u = tbd__uid_get(r, uid);
  if (s->u == NULL) {
    tbd_free(s);
    return TB_ENOMEM;
  }
  tbd_hash_oom = 0;
  HASH_ADD(hh, r->sessions, id, sizeof(s->id), s);
  if (tbd_hash_oom) {
    tbd__uid_put(r, s->u);
    tbd_free(s);
    return TB_ENOMEM;
  }
  s->u->conns++;
  r->next_session_id++;
  r->nsessions++;
  *out = s;
  return 0;
}

void tbd_session_mute(struct tbd_session *s) { s->muted = true; }
void *tbd_session_conn(const struct tbd_session *s) { return s->conn; }
uint64_t tbd_session_id(const struct tbd_session *s) { return s->id; }
const char *tbd_session_name(const struct tbd_session *s) { return s->name; }
pid_t tbd_session_pid(const struct tbd_session *s) { return s->pid; }
uid_t tbd_session_uid(const struct tbd_session *s) { return s->uid; }
int tbd_session_hello(const struct tbd_session *s) { return s->hello; }
enum tbd_log_level tbd_session_log_level(const struct tbd_session *s) {
  if (!s->hello || strcmp(s->name, "tbctl") == 0)
    return TBD_LOG_DEBUG;
  return TBD_LOG_INFO;
}
void tbd_session_hung_up(struct tbd_session *s) { s->hung_up = true; }
int tbd_session_abrupt(const struct tbd_session *s) {
  return s->hung_up && s->says_goodbye && !s->said_goodbye;
}

struct tbd_session *tbd_registry_first_session(struct tbd_registry *r) {
  return r->sessions;
}

struct tbd_session *tbd_session_next(struct tbd_session *s) {
  return s->hh.next;
}

struct tbd_session *tbd__session_find(struct tbd_registry *r, uint64_t id) {
  struct tbd_session *s;

  HASH_FIND(hh, r->sessions, &id, sizeof(id), s);
  return s;
}


/* Why ch closes as its publisher s leaves (buf holds it when needed). A
 * session that promised a Goodbye and hung up without one crashed, was
 * killed or exited without closing: a leased version it published with
 * GPU work in flight may then never become ready, and a stream waiting on
 * its ready event never completes (docs/cuda.md, "What happens on a
 * crash"). Consumers read that in the reason; the log says it too. */
static const char *close_reason(const struct tbd_session *s,
                                const struct tbd_channel *ch, char *buf,
                                size_t len, uint64_t *unfinished) {
  const struct tbd_version *v, *pending = NULL;
  unsigned n = 0;

  *unfinished = 0;
  if (!tbd_session_abrupt(s))
    return "publisher disconnected";
  DL_FOREACH(ch->versions, v) {
    if (v->has_ready && !v->ready.complete && v->nleases > 0) {
      pending = v; /* oldest first: the last one is the newest */
      n++;
    }
  }
  if (pending == NULL)
    return "publisher ended without closing its session";
  tbd_log_with(TBD_LOG_WARN,
               &(struct tbd_log_fields){(long long)s->id, (long long)s->pid,
                                        (long long)s->uid, ch->name},
               "session %llu (pid %d '%s') ended without closing: channel "
               "'%s' has %u leased version(s) published with GPU work in "
               "flight, the newest %llu; streams waiting on their ready "
               "events never complete if that work died with the process",
               (unsigned long long)s->id, (int)s->pid, s->name, ch->name, n,
               (unsigned long long)pending->number);
  snprintf(buf, len, "publisher ended without closing its session; GPU "
                     "work of version %llu may never finish",
           (unsigned long long)pending->number);
  *unfinished = pending->number;
  return buf;
}

/* s hung up without the Goodbye it promised: a process that crashed, was
 * killed or exited. Its GPU work died with it, and a stream made to wait
 * on one of its events would never complete (docs/cuda.md, "What happens
 * on a crash"). Its done events leave every version's list, so that no
 * VersionFree or WaitFreeReply names them from now on, and every other
 * session hears which events are gone (EventsGone), so that a producer
 * holding them from an earlier one drops them as well. The versions whose
 * ready event is its own are marked (EventInfo.owner_died), so that a
 * consumer asks the event whether it finished rather than wait on it. */
#define EVENTS_GONE_PIECE 256

static int id_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Append id to the growing list *ids (*n of *cap used); -1 out of memory
 * (the list is left as it was). */
static int ids_push(uint64_t **ids, size_t *n, size_t *cap, uint64_t id) {
  if (*n == *cap) {
    size_t ncap = *cap ? *cap * 2 : 64;
    uint64_t *p = tbd_malloc(ncap * sizeof(*p));
    if (p == NULL)
      return -1;
    if (*n > 0)
      memcpy(p, *ids, *n * sizeof(*p));
    tbd_free(*ids);
    *ids = p;
    *cap = ncap;
  }
  (*ids)[(*n)++] = id;
  return 0;
}

static void events_gone(struct tbd_registry *r, struct tbd_session *s) {
  Tensorbroker__V1__Notice n = TENSORBROKER__V1__NOTICE__INIT;
  Tensorbroker__V1__EventsGone eg = TENSORBROKER__V1__EVENTS_GONE__INIT;
  struct tbd_channel *ch, *chtmp;
  struct tbd_told *t, *ttmp;
  struct tbd_event *e;
  struct tbd_version *v;
  uint64_t *ids = NULL;
  size_t nids = 0, cap = 0, stripped = 0;

  /* Its events are known by the session that registered them, not by the
   * registry's table: one it unregistered after a release still has
   * copies in versions. */
  HASH_ITER(hh, r->channels, ch, chtmp) {
    DL_FOREACH(ch->versions, v) {
      size_t keep = 0;
      if (v->has_ready && v->ready.session == s->id)
        v->ready.owner_died = true;
      for (size_t i = 0; i < v->ndone; i++) {
        if (v->done[i].session != s->id) {
          v->done[keep++] = v->done[i];
          continue;
        }
        stripped++;
        /* out of memory it is not named: only those told wait on it */
        (void)ids_push(&ids, &nids, &cap, v->done[i].id);
      }
      v->ndone = keep;
    }
  }
  tbd_log_with(TBD_LOG_INFO,
               &(struct tbd_log_fields){(long long)s->id, (long long)s->pid,
                                        (long long)s->uid, NULL},
               "session %llu (pid %d '%s') ended without closing: its %u "
               "event(s) are gone, %zu done event(s) of leased versions no "
               "longer waited for",
               (unsigned long long)s->id, (int)s->pid, s->name,
               (unsigned)s->nevents, stripped);
  if (s->told == NULL) {
    tbd_free(ids);
    return;
  }
  /* Those it was sent may hold any of its events, unregistered ones too:
   * the registered ones and those just stripped, each once. */
  DL_FOREACH2(s->events, e, snext) {
    if (ids_push(&ids, &nids, &cap, e->info.id) < 0)
      break;
  }
  if (nids > 1)
    qsort(ids, nids, sizeof(*ids), id_cmp);
  {
    size_t u = 0;
    for (size_t i = 0; i < nids; i++)
      if (u == 0 || ids[u - 1] != ids[i])
        ids[u++] = ids[i];
    nids = u;
  }
  n.body_case = TENSORBROKER__V1__NOTICE__BODY_EVENTS_GONE;
  n.events_gone = &eg;
  eg.session_id = s->id;
  for (size_t at = 0; at < nids; at += EVENTS_GONE_PIECE) {
    eg.event_ids = ids + at;
    eg.n_event_ids = nids - at < EVENTS_GONE_PIECE ? nids - at
                                                   : EVENTS_GONE_PIECE;
    HASH_ITER(hh, s->told, t, ttmp) {
      struct tbd_session *o = tbd__session_find(r, t->session_id);
      if (o != NULL && o != s && tbd_session_hello(o))
        tbd__emit_notice(r, o, &n);
    }
  }
  tbd_free(ids);
}

void tbd_session_close(struct tbd_registry *r, struct tbd_session *s) {
  struct tbd_lease *l, *ltmp;
  struct tbd_sub *sub, *subtmp;
  struct tbd_channel *ch, *chtmp;
  struct tbd_event *e, *etmp;
  struct tbd_buffer *b, *btmp;
  struct tbd_sent *se, *setmp;
  struct tbd_told *tl, *tltmp;

  /* Nothing more goes to the closing session itself. */
  s->muted = true;
  if (tbd_session_abrupt(s)) {
    r->stats.sessions_died++;
    events_gone(r, s);
  }
  while (s->waits != NULL)
    tbd__wait_remove(r, s->waits);
  DL_FOREACH_SAFE2(s->leases, l, ltmp, snext) {
    /* no done events: a crashed consumer leaves nothing to wait on */
    tbd__lease_release(r, l, NULL, 0, 0);
  }
  HASH_ITER(hh, s->subs, sub, subtmp) {
    tbd__unsubscribe(r, s, sub->name);
  }
  HASH_ITER(hh, r->channels, ch, chtmp) {
    if (ch->publisher != s)
      continue;
    char why[128];
    uint64_t unfinished;
    const char *reason = close_reason(s, ch, why, sizeof(why), &unfinished);
    tbd__channel_close(r, ch, s, reason, unfinished);
    tbd__channel_left(r, ch, s);
  }
  DL_FOREACH_SAFE2(s->events, e, etmp, snext) { tbd__event_remove(r, e); }
  DL_FOREACH_SAFE2(s->buffers, b, btmp, snext) { tbd__buffer_retire(r, b); }
  HASH_ITER(hh, s->sent, se, setmp) {
    HASH_DEL(s->sent, se);
    tbd_free(se);
  }
  HASH_ITER(hh, s->told, tl, tltmp) {
    HASH_DEL(s->told, tl);
    tbd_free(tl);
  }
  if (s->hello)
    tbd__session_uncount(r, s);
  tbd_metrics_session_closed(r, s);
  HASH_DEL(r->sessions, s);
  r->nsessions--;
  s->u->conns--;
  tbd__uid_put(r, s->u);
  tbd_free(s->groups);
  tbd_free(s);
}

void tbd_registry_broadcast_closing(struct tbd_registry *r,
                                    const char *reason) {
  Tensorbroker__V1__Notice n = TENSORBROKER__V1__NOTICE__INIT;
  Tensorbroker__V1__DaemonClosing dc = TENSORBROKER__V1__DAEMON_CLOSING__INIT;
  struct tbd_session *s, *stmp;

  n.body_case = TENSORBROKER__V1__NOTICE__BODY_DAEMON_CLOSING;
  n.daemon_closing = &dc;
  dc.reason = (char *)reason;
  HASH_ITER(hh, r->sessions, s, stmp) { tbd__emit_notice(r, s, &n); }
}

