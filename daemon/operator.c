/* SPDX-License-Identifier: Apache-2.0 */
/* The operator's view: every lease, every parked request and every
 * buffer, as `tbctl leases`, `tbctl waits` and `tbctl buffers` show them,
 * and dropping a closed channel (docs/deploy.md, "Operating and
 * debugging"). */
#include "registry_impl.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <tensorbroker/tensorbroker.h>

#include "kinds.h"
#include "log.h"

static uint64_t age_of(struct tbd_registry *r, uint64_t since) {
  uint64_t now = tbd__now(r);

  return now > since ? now - since : 0;
}

/* ---- list pages ---- */

int tbd__list_page(struct tbd_registry *r, const void *rows, size_t nrows,
                   size_t row_size, size_t info_size,
                   void (*fill)(struct tbd_registry *r, const void *row,
                                void *info),
                   struct tbd_list_page *out) {
  size_t used = 0;

  memset(out, 0, sizeof(*out));
  out->infos = tbd_calloc(nrows + 1, info_size);
  out->ptrs = tbd_calloc(nrows + 1, sizeof(*out->ptrs));
  if (out->infos == NULL || out->ptrs == NULL) {
    tbd__list_page_free(out);
    return TB_ENOMEM;
  }
  for (size_t k = 0; k < nrows; k++) {
    void *info = (char *)out->infos + out->n * info_size;

    fill(r, (const char *)rows + k * row_size, info);
    used += protobuf_c_message_get_packed_size(info) + 8;
    if (used > TBD_LIST_ROOM(r)) {
      out->more = true;
      break;
    }
    out->ptrs[out->n++] = info;
  }
  return 0;
}

void tbd__list_page_free(struct tbd_list_page *p) {
  tbd_free(p->infos);
  tbd_free(p->ptrs);
  p->infos = NULL;
  p->ptrs = NULL;
}

/* ---- leases ---- */

static int lease_cmp(const void *a, const void *b) {
  const struct tbd_lease *x = *(const struct tbd_lease *const *)a;
  const struct tbd_lease *y = *(const struct tbd_lease *const *)b;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* tbd__list_page's fill: row is a struct tbd_lease *. */
static void lease_info_fill(struct tbd_registry *r, const void *row,
                            void *info) {
  const struct tbd_lease *l = *(struct tbd_lease *const *)row;
  const struct tbd_version *v = l->v;
  Tensorbroker__V1__LeaseInfo *li = info;

  tensorbroker__v1__lease_info__init(li);
  li->lease_id = l->id;
  li->session_id = l->s->id;
  li->pid = (uint32_t)l->s->pid;
  li->uid = l->s->uid;
  li->session_name = (char *)l->s->name;
  li->channel = v->ch->name;
  li->version = v->number;
  li->bytes = v->buf->size;
  li->kind = v->buf->kind;
  li->age_ms = age_of(r, l->since);
  li->buffer_id = v->buf->id;
  li->ready_event = v->has_ready;
  li->done_events = (uint32_t)v->ndone + v->done_dropped;
  li->died = v->died;
}

int tbd__list_leases(struct tbd_registry *r, struct tbd_session *s,
                     uint64_t id, const Tensorbroker__V1__ListLeases *q) {
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Tensorbroker__V1__ListLeasesReply lr =
      TENSORBROKER__V1__LIST_LEASES_REPLY__INIT;
  struct tbd_list_page page;
  struct tbd_lease *l, **all;
  uint64_t after = q != NULL ? q->after_lease_id : 0;
  size_t nall = 0;

  all = tbd_calloc(r->nleases + 1, sizeof(*all));
  if (all == NULL)
    return tbd__reply_status(r, s, id, TB_ENOMEM, "out of memory");
  /* r->leases holds the anchor too (id 0, no session) */
  /* access control: leases on channels s may not list, of other uids,
   * are left out */
  for (l = r->leases; l != NULL && nall < r->nleases; l = l->hh.next)
    if (l != &r->anchor && l->id > after &&
        tbd__access_sees(r, s, l->s, l->v->ch))
      all[nall++] = l;
  qsort(all, nall, sizeof(*all), lease_cmp);
  if (tbd__list_page(r, all, nall, sizeof(*all),
                     sizeof(Tensorbroker__V1__LeaseInfo), lease_info_fill,
                     &page) < 0) {
    tbd_free(all);
    return tbd__reply_status(r, s, id, TB_ENOMEM, "out of memory");
  }
  rep.request_id = id;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_LIST_LEASES;
  rep.list_leases = &lr;
  lr.n_leases = page.n;
  lr.leases = (Tensorbroker__V1__LeaseInfo **)page.ptrs;
  lr.more = page.more;
  tbd__send_reply(r, s, &rep, NULL, 0);
  tbd__list_page_free(&page);
  tbd_free(all);
  return 0;
}

/* ---- waits ---- */

/* By session id, then request id: the order ListWaits pages by. */
static int wait_cmp(const void *a, const void *b) {
  const struct tbd_wait *x = *(const struct tbd_wait *const *)a;
  const struct tbd_wait *y = *(const struct tbd_wait *const *)b;

  if (x->s->id != y->s->id)
    return x->s->id < y->s->id ? -1 : 1;
  return x->request_id < y->request_id ? -1 : x->request_id > y->request_id;
}

/* tbd__list_page's fill: row is a struct tbd_wait *. */
static void wait_info_fill(struct tbd_registry *r, const void *row,
                           void *info) {
  const struct tbd_wait *w = *(struct tbd_wait *const *)row;
  Tensorbroker__V1__WaitInfo *wi = info;
  uint64_t now = tbd__now(r);

  tensorbroker__v1__wait_info__init(wi);
  wi->session_id = w->s->id;
  wi->request_id = w->request_id;
  wi->pid = (uint32_t)w->s->pid;
  wi->uid = w->s->uid;
  wi->session_name = (char *)w->s->name;
  wi->age_ms = age_of(r, w->since);
  if (w->deadline == UINT64_MAX)
    wi->timeout_ms = -1;
  else
    wi->timeout_ms = w->deadline > now ? (int64_t)(w->deadline - now) : 0;
  wi->version = w->version;
  if (w->kind == TBD_WAIT_FREE) {
    wi->what = TENSORBROKER__V1__WAIT_WHAT__WAIT_FREE;
    wi->channel = w->v->ch->name;
    wi->leases = w->v->nleases;
    wi->in_history = w->v->in_history;
    return;
  }
  wi->channel = w->q->name;
  switch (w->mode) {
  case TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_NEXT:
    wi->what = TENSORBROKER__V1__WAIT_WHAT__WAIT_ACQUIRE_NEXT;
    break;
  case TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_EXACT:
    wi->what = TENSORBROKER__V1__WAIT_WHAT__WAIT_ACQUIRE_EXACT;
    break;
  default:
    wi->what = TENSORBROKER__V1__WAIT_WHAT__WAIT_ACQUIRE_LATEST;
    wi->version = 0;
    break;
  }
}

int tbd__list_waits(struct tbd_registry *r, struct tbd_session *s,
                    uint64_t id, const Tensorbroker__V1__ListWaits *q) {
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Tensorbroker__V1__ListWaitsReply lr =
      TENSORBROKER__V1__LIST_WAITS_REPLY__INIT;
  struct tbd_list_page page;
  struct tbd_session *t;
  struct tbd_wait *w, **all;
  uint64_t after = q != NULL ? q->after_session_id : 0;
  uint64_t after_req = q != NULL ? q->after_request_id : 0;
  size_t nall = 0;

  all = tbd_calloc(r->nwaits + 1, sizeof(*all));
  if (all == NULL)
    return tbd__reply_status(r, s, id, TB_ENOMEM, "out of memory");
  for (t = r->sessions; t != NULL && nall < r->nwaits; t = t->hh.next) {
    if (t->id < after || (t->id == after && after_req == 0))
      continue;
    DL_FOREACH2(t->waits, w, snext) {
      if ((t->id > after || w->request_id > after_req) && nall < r->nwaits &&
          tbd__access_sees(r, s, t,
                           w->kind == TBD_WAIT_FREE
                               ? w->v->ch
                               : tbd__channel_find(r, w->q->name)))
        all[nall++] = w;
    }
  }
  qsort(all, nall, sizeof(*all), wait_cmp);
  if (tbd__list_page(r, all, nall, sizeof(*all),
                     sizeof(Tensorbroker__V1__WaitInfo), wait_info_fill,
                     &page) < 0) {
    tbd_free(all);
    return tbd__reply_status(r, s, id, TB_ENOMEM, "out of memory");
  }
  rep.request_id = id;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_LIST_WAITS;
  rep.list_waits = &lr;
  lr.n_waits = page.n;
  lr.waits = (Tensorbroker__V1__WaitInfo **)page.ptrs;
  lr.more = page.more;
  tbd__send_reply(r, s, &rep, NULL, 0);
  tbd__list_page_free(&page);
  tbd_free(all);
  return 0;
}

/* ---- buffers ---- */

static int buffer_cmp(const void *a, const void *b) {
  const struct tbd_buffer *x = *(const struct tbd_buffer *const *)a;
  const struct tbd_buffer *y = *(const struct tbd_buffer *const *)b;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* A BufferEntryInfo and the Device it points to. */
struct buffer_row {
  Tensorbroker__V1__BufferEntryInfo bi;
  Tensorbroker__V1__Device dev;
};

/* tbd__list_page's fill: row is a struct tbd_buffer *, info a struct
 * buffer_row (its BufferEntryInfo first). */
static void buffer_info_fill(struct tbd_registry *r, const void *row,
                             void *info) {
  struct tbd_buffer *b = *(struct tbd_buffer *const *)row;
  struct buffer_row *br = info;
  Tensorbroker__V1__BufferEntryInfo *bi = &br->bi;
  /* retirement unlinks the owner; the session may live on (it destroyed
   * the buffer, or published a copy from it) */
  struct tbd_session *owner =
      b->owner != NULL ? b->owner : tbd__session_find(r, b->owner_id);

  tensorbroker__v1__buffer_entry_info__init(bi);
  tensorbroker__v1__device__init(&br->dev);
  bi->buffer_id = b->id;
  bi->kind = b->kind;
  bi->size = b->size;
  bi->device = &br->dev;
  br->dev.type = b->dev_type;
  br->dev.id = b->dev_id;
  br->dev.uuid.data = b->uuid;
  br->dev.uuid.len = b->uuid_len;
  /* its pid and uid stay on the buffer once the session ended */
  if (owner != NULL) {
    bi->session_id = owner->id;
    bi->session_name = owner->name;
  }
  bi->pid = b->owner_pid;
  bi->uid = b->u->uid;
  bi->retired = b->retired;
  bi->versions = b->nversions;
  bi->leases = b->nleases;
  bi->writable = b->writable;
  bi->signal_offset = b->signal_offset;
  bi->survives_producer = tbd_kind_survives_producer(b->kind);
}

int tbd__list_buffers(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t id, const Tensorbroker__V1__ListBuffers *q) {
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Tensorbroker__V1__ListBuffersReply lr =
      TENSORBROKER__V1__LIST_BUFFERS_REPLY__INIT;
  struct tbd_list_page page;
  struct tbd_buffer *b, **all;
  uint64_t after = q != NULL ? q->after_buffer_id : 0;
  size_t nall = 0;

  all = tbd_calloc(r->nbuffers + 1, sizeof(*all));
  if (all == NULL)
    return tbd__reply_status(r, s, id, TB_ENOMEM, "out of memory");
  /* access control: a buffer belongs to no one channel; buffers of other
   * uids are left out unless s sees every session */
  for (b = r->buffers; b != NULL && nall < r->nbuffers; b = b->hh.next)
    if (b->id > after && tbd__access_sees_uid(r, s, b->u->uid, NULL))
      all[nall++] = b;
  qsort(all, nall, sizeof(*all), buffer_cmp);
  /* each entry's Device lies beside it (struct buffer_row), so the page
   * holds rows; the reply's pointers go to their first member */
  if (tbd__list_page(r, all, nall, sizeof(*all), sizeof(struct buffer_row),
                     buffer_info_fill, &page) < 0) {
    tbd_free(all);
    return tbd__reply_status(r, s, id, TB_ENOMEM, "out of memory");
  }
  rep.request_id = id;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_LIST_BUFFERS;
  rep.list_buffers = &lr;
  lr.n_buffers = page.n;
  lr.buffers = (Tensorbroker__V1__BufferEntryInfo **)page.ptrs;
  lr.more = page.more;
  tbd__send_reply(r, s, &rep, NULL, 0);
  tbd__list_page_free(&page);
  tbd_free(all);
  return 0;
}

/* ---- drop ---- */


/* "lease 7 (session 3 pid 120 'viewer') on version 4" for the first few
 * leases of ch, into buf. */
static void leases_why(const struct tbd_channel *ch, char *buf, size_t len) {
  const struct tbd_version *v;
  const struct tbd_lease *l;
  size_t used = 0;
  unsigned shown = 0;

  buf[0] = '\0';
  DL_FOREACH(ch->versions, v) {
    DL_FOREACH2(v->leases, l, vnext) {
      int k;
      if (shown == 3) {
        snprintf(buf + used, len - used, ", ...");
        return;
      }
      k = snprintf(buf + used, len - used,
                   "%slease %llu (session %llu pid %d '%s') on version %llu",
                   shown > 0 ? ", " : "", (unsigned long long)l->id,
                   (unsigned long long)l->s->id, (int)l->s->pid, l->s->name,
                   (unsigned long long)v->number);
      if (k < 0 || (size_t)k >= len - used)
        return;
      used += (size_t)k;
      shown++;
    }
  }
}

int tbd__drop_channel(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t id, const char *name) {
  struct tbd_channel *ch = tbd__channel_find(r, name);
  const struct tbd_version *v;
  uint32_t nversions;
  uint64_t latest, bytes = 0;
  char why[512];

  if (ch == NULL) {
    uint32_t w = tbd__waiters(r, name);
    if (w > 0)
      return tbd__reply_status(r, s, id, TB_ENOTFOUND,
                               "no channel '%s' to drop: it was never "
                               "published (or was dropped); %u session%s "
                               "wait for it",
                               name, w, w == 1 ? "" : "s");
    return tbd__reply_status(r, s, id, TB_ENOTFOUND, "no channel '%s'",
                             name);
  }
  /* whoever may publish onto it (access control: by default its owner,
   * root, the daemon's uid and the operators) */
  if (tbd__access(r, s, TBD_ACL_PUBLISH, "drop", name, ch, why,
                  sizeof(why)) < 0)
    return tbd__reply_status(r, s, id, TB_EPERM, "%s", why);
  if (ch->publisher != NULL)
    return tbd__reply_status(r, s, id, TB_EBUSY,
                             "channel '%s' is open: session %llu (pid %d) "
                             "publishes it; only a closed channel may be "
                             "dropped",
                             name, (unsigned long long)ch->publisher->id,
                             (int)ch->publisher->pid);
  if (ch->nleases > 0) {
    leases_why(ch, why, sizeof(why));
    return tbd__reply_status(r, s, id, TB_EBUSY,
                             "channel '%s' has %u lease%s: %s", name,
                             ch->nleases, ch->nleases == 1 ? "" : "s", why);
  }
  DL_FOREACH(ch->versions, v) { bytes += v->buf->size; }
  nversions = ch->nversions;
  latest = ch->latest;
  tbd_log_with(TBD_LOG_INFO,
               &(struct tbd_log_fields){(long long)s->id, (long long)s->pid,
                                        (long long)s->uid, name},
               "channel '%s' dropped by session %llu (pid %d uid %u): "
               "latest version %llu, %u version%s of %llu bytes freed; it "
               "starts again at version 1 if published again",
               name, (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid,
               (unsigned long long)latest, nversions,
               nversions == 1 ? "" : "s", (unsigned long long)bytes);
  /* WaitFree on its versions are answered as the versions go; acquires
   * parked on the name stay, for a producer that publishes it again */
  tbd__channel_drop(r, ch);
  return tbd__reply_status(r, s, id, 0, NULL);
}
