/* SPDX-License-Identifier: Apache-2.0 */
/* Leases: answering an Acquire (grant, park or refuse), the AcquireReply
 * with its buffer and descriptor, and Release with its done event. */
#include "registry_impl.h"

#include <stdio.h>
#include <string.h>

#include <tensorbroker/tensorbroker.h>

#include "kinds.h"
#include "log.h"

/* TB_ECLOSED for an acquire that finds nothing to grant on ch, whose
 * producer is gone (ch->publisher NULL): sent at once for timeout 0, else
 * when the wait runs out. after: NEXT's version, else 0. */
int tbd__reply_no_producer(struct tbd_registry *r, struct tbd_session *s,
                           uint64_t request_id, const struct tbd_channel *ch,
                           int mode, uint64_t after) {
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
  struct tbd_version *v = tbd__version_find(ch, version);
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

/* Whether s is in another domain than b's producer, where the producer's
 * interprocess events cannot be opened and s's cannot be opened by the
 * producer: another /dev/shm or another PID namespace (CUDA IPC events
 * reach neither, measured: docs/cuda.md). 0 is unknown: an older client
 * says nothing, and is taken to share the producer's. */
static bool domain_foreign(const struct tbd_session *s,
                           const struct tbd_buffer *b) {
  return (s->shm_id != 0 && b->owner_shm_id != 0 &&
          s->shm_id != b->owner_shm_id) ||
         (s->pidns_id != 0 && b->owner_pidns_id != 0 &&
          s->pidns_id != b->owner_pidns_id);
}

/* The next done slot of b's signal area, or 0 once they ran out (said
 * once per buffer): words 1.. after the ready word. Slots are never given
 * again, not even a closed session's: a write its stream queued may land
 * after it is gone, and a counter must only grow. */
static uint32_t done_slot_take(struct tbd_buffer *b) {
  uint64_t cap = (b->size - b->signal_offset) / 8 - 1;

  if (b->next_slot <= cap && b->next_slot <= UINT32_MAX)
    return (uint32_t)b->next_slot++;
  if (!b->slots_warned) {
    b->slots_warned = true;
    tbd_warn("buffer %llu (pid %u): all %llu done slots of its signal area "
             "are given; consumers in another /dev/shm or PID namespace "
             "get none from now on, and their reads of it cannot be waited "
             "for",
             (unsigned long long)b->id, (unsigned)b->owner_pid,
             (unsigned long long)cap);
  }
  return 0;
}

/* Create a lease on v for s and emit the AcquireReply; write: s may
 * write v's buffer (it is writable and the rules grant write), else it
 * gets the read-only descriptor and BufferInfo.writable false. A session
 * that holds a descriptor of the buffer already keeps what it was sent
 * until it forgets the buffer. A session in another domain than the
 * producer (domain_foreign) is given a done slot in a buffer with a signal
 * area, once. Nothing changes on failure (TB_ENOMEM). */
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
  const struct tbd_kind *k = tbd_kind_find(b->kind);
  struct tbd_lease *l;
  struct tbd_sent *sent, *newsent = NULL;
  bool attach;
  int fd = -1;

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
  if (tbd__buffer_info_pack(b, write) < 0)
    goto out_free_sent;
  /* room for tbd__buffer_info_field */
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
  v->buf->nleases++;
  v->ch->nleases++;
  r->nleases++;
  r->stats.acquires++;
  attach = k->carries_fd && !sent->fd_current &&
           (fd = k->attach_fd(b, write)) >= 0;
  sent->write = write;
  if (k->carries_fd)
    sent->fd_current = true;
  if (sent->slot == 0 && b->signal_offset != 0 && domain_foreign(s, b))
    sent->slot = done_slot_take(b);

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
  pre[1].len = tbd__buffer_info_field(b, write, attach, bibuf);
  pre[1].data = bibuf;
  ar.base.n_unknown_fields = 2;
  ar.base.unknown_fields = pre;
  ar.metadata.data = v->meta;
  ar.metadata.len = v->meta_len;
  ar.channel = v->ch->name;
  ar.done_slot = sent->slot;
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

int tbd__acquire_judge(struct tbd_registry *r, struct tbd_session *s,
                       uint64_t request_id, const char *channel,
                       const struct tbd_channel *ch) {
  char msg[512];

  if (tbd__access(r, s, TBD_ACL_ACQUIRE, "acquire", channel, ch, msg,
                  sizeof(msg)) < 0)
    return tbd__reply_status(r, s, request_id, TB_EPERM, "%s", msg);
  return 0;
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
    char why[160];
    if (tbd__limit_check(r, s, s->u, TBD_RES_LEASES, TBD_SCOPE_ALL, why,
                         sizeof(why), NULL) < 0)
      return tbd__reply_status(r, s, request_id, TB_ELIMIT, "%s", why);
  }
  v = tbd__version_match(ch, mode, version);
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
      return tbd__reply_no_producer(r, s, request_id, ch, mode, version);
    return tbd__reply_status(r, s, request_id, TB_EAGAIN,
                             "no version of '%s' yet", channel);
  }
  /* Also on a channel whose producer is gone: a new one may take it over
   * within the timeout, and its versions carry on the numbering. */
  return tbd__acquire_park(r, s, request_id, channel, ch, mode, version,
                           timeout_ms);
}

int tbd__lease_release(struct tbd_registry *r, struct tbd_lease *l,
                       const struct tbd_event *done, uint32_t slot,
                       uint64_t signal) {
  struct tbd_version *v = l->v;
  struct tbd_session *s = l->s;

  if (done != NULL) {
    struct tbd_evinfo *seen = NULL;
    for (size_t i = 0; i < v->ndone && seen == NULL; i++)
      if (v->done[i].id == done->info.id)
        seen = &v->done[i];
    if (seen == NULL && v->ndone >= r->lim.max_done_events) {
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
    } else if (seen == NULL) {
      struct tbd_evinfo *d = tbd_malloc((v->ndone + 1) * sizeof(*d));
      if (d == NULL)
        return TB_ENOMEM;
      if (v->ndone > 0)
        memcpy(d, v->done, v->ndone * sizeof(*d));
      d[v->ndone] = done->info;
      tbd_free(v->done);
      v->done = d;
      seen = &v->done[v->ndone++];
    }
    /* The producer waits until the slot's word reaches the largest value
     * the session's releases of this version named: a session writes its
     * slot with values that only grow, so one wait covers them all. */
    if (seen != NULL && signal != 0) {
      seen->signal_slot = slot;
      if (signal > seen->signal_value)
        seen->signal_value = signal;
    }
  }
  HASH_DEL(r->leases, l);
  DL_DELETE2(s->leases, l, sprev, snext);
  DL_DELETE2(v->leases, l, vprev, vnext);
  s->nleases--;
  s->u->n[TBD_RES_LEASES]--;
  v->nleases--;
  v->buf->nleases--;
  v->ch->nleases--;
  r->nleases--;
  lease_free(r, l);
  tbd__version_maybe_free(r, v);
  return 0;
}

