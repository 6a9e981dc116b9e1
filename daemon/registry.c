/* SPDX-License-Identifier: Apache-2.0 */
/* The registry itself: creating and freeing it, its clock, limits and
 * counts, and emitting replies and notices to sessions. Its objects live
 * in their own files (registry_impl.h): session.c, channel.c (channels
 * and versions), lease.c, buffer.c (buffers and events), wait.c (parked
 * waits) and subscription.c. */
#include "registry_impl.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>

#include <tensorbroker/tensorbroker.h>

#include "log.h"

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
  tbd_heap_init(&r->deadlines, tbd__wait_deadline_less);
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
  while (r->channels != NULL)
    tbd__channel_drop(r, r->channels);
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
  pb->owner_died = e->owner_died;
  pb->owner_shm_id = e->shm_id;
  pb->owner_pidns_id = e->pidns_id;
  pb->signal_value = e->signal_value;
  pb->signal_slot = e->signal_slot;
}

