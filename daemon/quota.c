/* SPDX-License-Identifier: Apache-2.0 */
/* Limits per session, per uid and in total (docs/limits.md): the per-uid
 * counts, the checks that name the limit reached, the descriptor budget,
 * operator sessions, and freeing closed channels when a table is full. */
#include "registry_impl.h"

#include <stdio.h>
#include <string.h>

#include <tensorbroker/errors.h>

#include "log.h"

/* ---- per uid ---- */

struct tbd_uid *tbd__uid_get(struct tbd_registry *r, uid_t uid) {
  struct tbd_uid *u;

  HASH_FIND(hh, r->uids, &uid, sizeof(uid), u);
  if (u != NULL)
    return u;
  u = tbd_calloc(1, sizeof(*u));
  if (u == NULL)
    return NULL;
  u->uid = uid;
  tbd_hash_oom = 0;
  HASH_ADD(hh, r->uids, uid, sizeof(u->uid), u);
  if (tbd_hash_oom) {
    tbd_free(u);
    return NULL;
  }
  return u;
}

void tbd__uid_put(struct tbd_registry *r, struct tbd_uid *u) {
  if (u == NULL || u->conns > 0 || u->outq > 0)
    return;
  for (int i = 0; i < TBD_RES_COUNT; i++)
    if (u->n[i] > 0)
      return;
  HASH_DEL(r->uids, u);
  tbd_free(u);
}

bool tbd__uid_limited(const struct tbd_registry *r, const struct tbd_uid *u) {
  return !(r->lim.exempt_root && u->uid == 0);
}

uint64_t *tbd_session_uid_outq(struct tbd_session *s) { return &s->u->outq; }

bool tbd_session_uid_limited(const struct tbd_registry *r,
                             const struct tbd_session *s) {
  return tbd__uid_limited(r, s->u);
}

/* ---- the checks ---- */

static const char *const res_name[TBD_RES_COUNT] = {
    "sessions", "channels", "buffers", "events", "leases", "subscriptions",
};

int tbd__limit_check(const struct tbd_registry *r,
                     const struct tbd_session *s, const struct tbd_uid *u,
                     enum tbd_res res, unsigned scopes, char *why,
                     size_t len, unsigned *hit) {
  const struct tbd_limits *l = &r->lim;
  uint32_t have_s = 0, max_s = UINT32_MAX, max_u, have_t, max_t;
  const char *flag_s = NULL, *flag_u, *flag_t;

  switch (res) {
  case TBD_RES_SESSIONS:
    max_u = l->max_sessions_uid, flag_u = "max-sessions-per-uid";
    have_t = r->nhello, max_t = l->max_sessions, flag_t = "max-sessions";
    break;
  case TBD_RES_CHANNELS:
    if (s != NULL)
      have_s = s->nchannels, max_s = l->max_channels_session;
    flag_s = "max-channels-per-session";
    max_u = l->max_channels_uid, flag_u = "max-channels-per-uid";
    have_t = r->nchannels, max_t = l->max_channels, flag_t = "max-channels";
    break;
  case TBD_RES_BUFFERS:
    if (s != NULL)
      have_s = s->nbuffers, max_s = l->max_buffers;
    flag_s = "max-buffers";
    max_u = l->max_buffers_uid, flag_u = "max-buffers-per-uid";
    have_t = r->nbuffers, max_t = l->max_buffers_total;
    flag_t = "max-buffers-total";
    break;
  case TBD_RES_EVENTS:
    if (s != NULL)
      have_s = s->nevents, max_s = l->max_events;
    flag_s = "max-events";
    max_u = l->max_events_uid, flag_u = "max-events-per-uid";
    have_t = r->nevents, max_t = l->max_events_total;
    flag_t = "max-events-total";
    break;
  case TBD_RES_LEASES:
    if (s != NULL)
      have_s = s->nleases, max_s = l->max_leases;
    flag_s = "max-leases";
    max_u = l->max_leases_uid, flag_u = "max-leases-per-uid";
    have_t = r->nleases, max_t = l->max_leases_total;
    flag_t = "max-leases-total";
    break;
  default: /* TBD_RES_SUBS */
    if (s != NULL)
      have_s = s->nsubs, max_s = l->max_subscriptions;
    flag_s = "max-subscriptions";
    max_u = l->max_subscriptions_uid, flag_u = "max-subscriptions-per-uid";
    have_t = r->nsubs, max_t = l->max_subscriptions_total;
    flag_t = "max-subscriptions-total";
    break;
  }
  if ((scopes & TBD_SCOPE_SESSION) && s != NULL && flag_s != NULL &&
      have_s >= max_s) {
    snprintf(why, len, "session has %u %s (--%s)", have_s, res_name[res],
             flag_s);
    if (hit != NULL)
      *hit = TBD_SCOPE_SESSION;
    return TB_ELIMIT;
  }
  if ((scopes & TBD_SCOPE_UID) && u != NULL && tbd__uid_limited(r, u) &&
      u->n[res] >= max_u) {
    snprintf(why, len, "uid %u has %u %s (--%s)", (unsigned)u->uid,
             u->n[res], res_name[res], flag_u);
    if (hit != NULL)
      *hit = TBD_SCOPE_UID;
    return TB_ELIMIT;
  }
  if ((scopes & TBD_SCOPE_TOTAL) && have_t >= max_t) {
    snprintf(why, len, "the daemon has %u %s (--%s)", have_t, res_name[res],
             flag_t);
    if (hit != NULL)
      *hit = TBD_SCOPE_TOTAL;
    return TB_ELIMIT;
  }
  return 0;
}

/* ---- sessions ---- */

void tbd_registry_set_operators(struct tbd_registry *r, uid_t a, uid_t b) {
  r->operator_uid[0] = a;
  r->operator_uid[1] = b;
  r->has_operators = true;
}

static bool is_operator(const struct tbd_registry *r,
                        const struct tbd_session *s) {
  return r->has_operators &&
         (s->uid == r->operator_uid[0] || s->uid == r->operator_uid[1]);
}

void tbd_session_refuse(struct tbd_session *s, const char *why) {
  snprintf(s->refuse, sizeof(s->refuse), "%s", why);
}

int tbd__session_admit(struct tbd_registry *r, struct tbd_session *s,
                       char *why, size_t len) {
  int rc = 0;

  if (s->refuse[0] != '\0') {
    snprintf(why, len, "%s", s->refuse);
    rc = TB_ELIMIT;
  } else {
    rc = tbd__limit_check(r, NULL, s->u, TBD_RES_SESSIONS, TBD_SCOPE_ALL, why,
                          len, NULL);
  }
  if (rc == 0) {
    r->nhello++;
    s->u->n[TBD_RES_SESSIONS]++;
    return 0;
  }
  if (is_operator(r, s) && r->noperators < r->lim.operator_sessions) {
    tbd_warn("session %llu (pid %d uid %u): %s; admitted as one of %u "
             "operator sessions (--operator-sessions)",
             (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid, why,
             r->lim.operator_sessions);
    s->operator_slot = true;
    r->noperators++;
    return 0;
  }
  tbd_warn("refusing session from pid %d uid %u: %s", (int)s->pid,
           (unsigned)s->uid, why);
  return rc;
}

void tbd__session_uncount(struct tbd_registry *r, struct tbd_session *s) {
  if (s->operator_slot) {
    r->noperators--;
    return;
  }
  r->nhello--;
  s->u->n[TBD_RES_SESSIONS]--;
}

/* ---- descriptors ---- */

void tbd_registry_set_fds(struct tbd_registry *r, uint32_t capacity,
                          uint32_t all, uint32_t nofile, uint32_t reserve) {
  r->fd_capacity = capacity;
  r->fd_all = all;
  r->fd_nofile = nofile;
  r->fd_reserve = reserve;
}

uint32_t tbd_registry_fds_held(const struct tbd_registry *r) {
  return r->fds_held;
}

int tbd_registry_fds_take(struct tbd_registry *r, uint32_t n, bool reserve) {
  uint32_t cap = reserve ? r->fd_all : r->fd_capacity;

  if (r->fd_all == 0) /* no budget set (the unit tests) */
    cap = UINT32_MAX;
  if (r->fds_held > cap || n > cap - r->fds_held)
    return -1;
  r->fds_held += n;
  return 0;
}

void tbd_registry_fds_give(struct tbd_registry *r, uint32_t n) {
  r->fds_held = n > r->fds_held ? 0 : r->fds_held - n;
}

void tbd_registry_fds_why(const struct tbd_registry *r, char *buf,
                          size_t len) {
  snprintf(buf, len,
           "the daemon holds %u descriptors for clients, all it may (its "
           "RLIMIT_NOFILE is %u, of which it keeps %u for new connections "
           "(--fd-reserve) and some for itself; --max-fds)",
           r->fds_held, r->fd_nofile, r->fd_reserve);
}

void tbd_session_fds_lost(struct tbd_registry *r, struct tbd_session *s,
                          const tb__request *req) {
  tbd_warn("session %llu (pid %d uid %u): the descriptors of a request "
           "could not be received (the daemon is out of descriptors: %u "
           "held)",
           (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid,
           r->fds_held);
  tbd__reply_status(r, s, req->request_id, TB_ELIMIT,
                    "the descriptor sent with this request could not be "
                    "received: the daemon is out of file descriptors");
}

/* ---- buffers ---- */

int tbd__buffer_admit(struct tbd_registry *r, struct tbd_session *s,
                      uint32_t nfds, char *why, size_t len) {
  for (;;) {
    unsigned hit = 0;
    int rc = tbd__limit_check(r, s, s->u, TBD_RES_BUFFERS, TBD_SCOPE_ALL,
                              why, len, &hit);

    if (rc == 0 && nfds > 0 && r->fd_all != 0 &&
        r->fds_held + nfds > r->fd_capacity) {
      tbd_registry_fds_why(r, why, len);
      rc = TB_ELIMIT;
      hit = TBD_SCOPE_TOTAL;
    }
    if (rc == 0)
      return 0;
    /* the session's own registered buffers: nothing to free for it */
    if (hit == TBD_SCOPE_SESSION ||
        !tbd__channel_reclaim(r, hit == TBD_SCOPE_UID ? s->u : NULL, true,
                              NULL))
      return rc;
  }
}

/* ---- channels ---- */

int tbd__channel_admit(struct tbd_registry *r, struct tbd_session *s,
                       struct tbd_channel *ch, char *why, size_t len) {
  unsigned scopes = TBD_SCOPE_SESSION;

  if (ch != NULL && ch->publisher == s)
    return 0;
  /* a closed channel taken over is counted already, for its last
   * publisher's uid */
  if (ch == NULL || ch->u != s->u)
    scopes |= TBD_SCOPE_UID;
  if (ch == NULL)
    scopes |= TBD_SCOPE_TOTAL;
  for (;;) {
    unsigned hit = 0;
    int rc = tbd__limit_check(r, s, s->u, TBD_RES_CHANNELS, scopes, why, len,
                              &hit);

    if (rc == 0)
      return 0;
    if (hit == TBD_SCOPE_SESSION ||
        !tbd__channel_reclaim(r, hit == TBD_SCOPE_UID ? s->u : NULL, false,
                              ch))
      return rc;
  }
}

void tbd__channel_taken(struct tbd_registry *r, struct tbd_channel *ch,
                        struct tbd_session *s) {
  if (ch->on_closed_list) {
    DL_DELETE2(r->closed, ch, cprev, cnext);
    ch->on_closed_list = false;
  }
  if (ch->u != s->u) {
    struct tbd_uid *old = ch->u;
    if (old != NULL)
      old->n[TBD_RES_CHANNELS]--;
    ch->u = s->u;
    ch->u->n[TBD_RES_CHANNELS]++;
    tbd__uid_put(r, old);
  }
  s->nchannels++;
}

void tbd__channel_left(struct tbd_registry *r, struct tbd_channel *ch,
                       struct tbd_session *s) {
  s->nchannels--;
  if (!ch->on_closed_list) {
    DL_APPEND2(r->closed, ch, cprev, cnext);
    ch->on_closed_list = true;
  }
}

void tbd__channel_gone(struct tbd_registry *r, struct tbd_channel *ch) {
  if (ch->on_closed_list) {
    DL_DELETE2(r->closed, ch, cprev, cnext);
    ch->on_closed_list = false;
  }
  if (ch->u != NULL) {
    ch->u->n[TBD_RES_CHANNELS]--;
    tbd__uid_put(r, ch->u);
    ch->u = NULL;
  }
}

/* Whether ch's versions hold a retired buffer (of u, when not NULL): one
 * that freeing ch may free. */
static bool holds_retired_buffer(const struct tbd_channel *ch,
                                 const struct tbd_uid *u) {
  const struct tbd_version *v;

  DL_FOREACH(ch->versions, v) {
    if (v->buf->retired && (u == NULL || v->buf->u == u))
      return true;
  }
  return false;
}

bool tbd__channel_reclaim(struct tbd_registry *r, const struct tbd_uid *u,
                          bool for_buffer, const struct tbd_channel *keep) {
  struct tbd_channel *ch;

  DL_FOREACH2(r->closed, ch, cnext) {
    if (ch == keep || !tbd__channel_idle(r, ch))
      continue;
    if (for_buffer ? !holds_retired_buffer(ch, u) : u != NULL && ch->u != u)
      continue;
    tbd_log_with(TBD_LOG_INFO, &(struct tbd_log_fields){-1, -1, -1, ch->name},
                 "freeing closed channel '%s' (latest version %llu, %u kept) "
                 "to make room for %s; it starts again at version 1 if "
                 "published again",
                 ch->name, (unsigned long long)ch->latest, ch->nversions,
                 for_buffer ? "a buffer" : "a channel");
    tbd__channel_drop(r, ch);
    return true;
  }
  return false;
}
