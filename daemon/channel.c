/* SPDX-License-Identifier: Apache-2.0 */
/* Channels and their versions: publish, the history and its trim, version
 * lifetimes and their VersionFree notices, and a channel's close when its
 * publisher ends (what died with it). */
#include "registry_impl.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include <tensorbroker/tensorbroker.h>

#include "kinds.h"
#include "log.h"

static void history_leave(struct tbd_channel *ch, struct tbd_version *v);

struct tbd_channel *tbd__channel_find(struct tbd_registry *r,
                                      const char *name) {
  struct tbd_channel *ch;

  HASH_FIND_STR(r->channels, name, ch);
  return ch;
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
      tbd__waitq_find(r, ch->name) != NULL)
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
    tbd__version_maybe_free(r, v);
  }
  channel_free(r, ch);
}

/* to was sent v's done events: each owner that dies tells it (EventsGone).
 * Out of memory, that one is not told (it waits on the event as before). */
static void told(struct tbd_registry *r, const struct tbd_version *v,
                 const struct tbd_session *to) {
  for (size_t i = 0; i < v->ndone; i++) {
    struct tbd_session *owner = tbd__session_find(r, v->done[i].session);
    struct tbd_told *t;
    if (owner == NULL || owner == to)
      continue;
    HASH_FIND(hh, owner->told, &to->id, sizeof(to->id), t);
    if (t != NULL || (t = tbd_calloc(1, sizeof(*t))) == NULL)
      continue;
    t->session_id = to->id;
    tbd_hash_oom = 0;
    HASH_ADD(hh, owner->told, session_id, sizeof(t->session_id), t);
    if (tbd_hash_oom)
      tbd_free(t);
  }
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
    if (nev > 0)
      told(r, v, pub);
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
    wf.buffer_id = v->buf->id;
    wf.n_done_events = nev;
    wf.done_events = evp;
    wf.done_events_dropped = dropped;
    tbd__wait_remove(r, w);
    r->stats.wait_frees++;
    tbd__send_reply(r, s, &rep, NULL, 0);
    if (nev > 0)
      told(r, v, s);
  }
  tbd_free(evs);
  tbd_free(devs);
  tbd_free(evp);
}

/* A version is freed once it left the history and its last lease ended. */
void tbd__version_maybe_free(struct tbd_registry *r, struct tbd_version *v) {
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
  tbd__buffer_maybe_free(r, b);
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
    tbd__version_maybe_free(r, v);
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
    tbd__version_maybe_free(r, v);
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


struct tbd_version *tbd__channel_newest(struct tbd_channel *ch) {
  struct tbd_version *v = ch->versions != NULL ? ch->versions->prev : NULL;

  /* from the tail back: only versions that died and are still leased are
   * skipped, so this is one step but after a producer's death */
  while (v != NULL && v->died)
    v = v == ch->versions ? NULL : v->prev;
  return v;
}


int tbd__publish(struct tbd_registry *r, struct tbd_session *s,
                 const char *channel, struct tbd_buffer *b,
                 const Tensorbroker__V1__Layout *layout,
                 const struct tbd_event *ready, bool ready_complete,
                 uint64_t ready_signal, const uint8_t *meta,
                 size_t meta_len, uint32_t depth, uint64_t *version,
                 char *why, size_t whylen) {
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
    v->ready.signal_value = ready_signal; /* the ready word: slot 0 */
    v->ready.signal_slot = 0;
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
  q = tbd__waitq_find(r, channel);
  if (q != NULL)
    tbd__waitq_publish(r, q, ch);
  HASH_FIND_STR(r->subgroups, channel, g);
  if (g != NULL) {
    DL_FOREACH2(g->members, sub, gnext) {
      tbd__new_version_notify(r, sub->s, v);
    }
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


/* Version number of ch, granted or not, or NULL. */
struct tbd_version *tbd__version_find(struct tbd_channel *ch, uint64_t number) {
  return tbd_vindex_find(&ch->index, number);
}

/* The version an acquire is granted now, or NULL: never one whose memory
 * died with its producer. */
struct tbd_version *tbd__version_match(struct tbd_channel *ch, int mode,
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
    v = tbd__version_find(ch, version);
    return v != NULL && !v->died ? v : NULL;
  }
}

struct tbd_channel *tbd__channel_recent(struct tbd_registry *r,
                                        struct tbd_session *s,
                                        const char *name) {
  if (s->recent != NULL && name != NULL &&
      s->recent_frees == r->channel_frees && strcmp(s->recent->name, name) == 0)
    return s->recent;
  return NULL;
}

