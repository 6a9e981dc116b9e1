/* SPDX-License-Identifier: Apache-2.0 */
/* Request dispatch: session state checks (Hello first, descriptors only
 * where expected), validation of every field, and the replies. State
 * changes themselves are in the registry's files (registry_impl.h). */
#include "registry_impl.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <dlpack/dlpack.h>
#include <tensorbroker/tensorbroker.h>

#include "kinds.h"
#include "log.h"

#define BODY(x) TENSORBROKER__V1__REQUEST__BODY_##x

static void close_fds(int *fds, int nfds) {
  for (int i = 0; i < nfds; i++) {
    if (fds[i] >= 0)
      close(fds[i]);
    fds[i] = -1;
  }
}

void tbd_session_protocol_error(struct tbd_registry *r, struct tbd_session *s,
                                uint64_t request_id, const char *why) {
  r->stats.bad_messages++;
  r->stats.sessions_dropped++;
  tbd_log_with(TBD_LOG_WARN,
               &(struct tbd_log_fields){(long long)s->id, (long long)s->pid,
                                        (long long)s->uid, NULL},
               "session %llu (pid %d uid %u '%s'): protocol error: %s",
               (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid,
               s->name, why);
  tbd__reply_status(r, s, request_id, TB_EPROTO, "protocol error: %s", why);
}

static int proto_error(struct tbd_registry *r, struct tbd_session *s,
                       uint64_t request_id, const char *why) {
  tbd_session_protocol_error(r, s, request_id, why);
  return TB_EPROTO;
}

static int name_bad(struct tbd_registry *r, struct tbd_session *s,
                    uint64_t id, const char *name) {
  if (name == NULL || tb__name_check(name, r->lim.max_name) < 0) {
    tbd__reply_status(r, s, id, TB_ENAME,
                      "invalid channel name (1..%u bytes of [A-Za-z0-9._-/], "
                      "no empty, '.' or '..' component)",
                      r->lim.max_name);
    return 1;
  }
  return 0;
}

static int client_name_ok(const char *name) {
  size_t n = strlen(name);

  if (n > 63)
    return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)name[i];
    if (c < 0x20 || c > 0x7e)
      return 0;
  }
  return 1;
}

/* HelloReply.latest: the newest version of each channel the Hello names
 * that may be granted (tbd__channel_newest: not one whose memory died with
 * its producer), where it is in a buffer sent with a prefetch (kinds.h,
 * prefetch_with_notice) that this session may be sent, as long as the reply stays well inside one datagram; a name
 * given twice gets one entry (its buffer is recorded as sent the first
 * time). */
static void hello_latest(struct tbd_registry *r, struct tbd_session *s,
                         const Tensorbroker__V1__Hello *h,
                         Tensorbroker__V1__HelloReply *hr,
                         struct tbd_new_version *latest,
                         Tensorbroker__V1__NewVersion **ptrs) {
  size_t room = (size_t)r->lim.max_message - 1024, used = 0, n = 0;

  for (size_t i = 0; i < h->n_channels && i < TB_CONNECT_CHANNELS_MAX; i++) {
    struct tbd_channel *ch = tbd__channel_find(r, h->channels[i]);
    struct tbd_version *v = ch != NULL ? tbd__channel_newest(ch) : NULL;
    /* at most: the channel, the buffer and the ready event */
    size_t most = strlen(h->channels[i]) + sizeof(latest[n].bibuf) + 256;

    if (v == NULL || used + most > room)
      continue;
    /* what s may not acquire is left out, as a channel that is not there */
    if (!tbd__access_quiet(r, s, TBD_ACL_ACQUIRE, ch->name, ch))
      continue;
    if (!tbd__new_version_fill(r, s, v, &latest[n]))
      continue;
    ptrs[n] = &latest[n].nv;
    used += most;
    n++;
  }
  hr->n_latest = n;
  hr->latest = ptrs;
}

static int on_hello(struct tbd_registry *r, struct tbd_session *s,
                    uint64_t id, const Tensorbroker__V1__Hello *h) {
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Tensorbroker__V1__HelloReply hr = TENSORBROKER__V1__HELLO_REPLY__INIT;
  const char *name = h->client_name ? h->client_name : "";
  struct tbd_new_version latest[TB_CONNECT_CHANNELS_MAX];
  Tensorbroker__V1__NewVersion *ptrs[TB_CONNECT_CHANNELS_MAX];

  if (h->protocol_version != TB_PROTOCOL_VERSION)
    return tbd__reply_status(r, s, id, TB_EVERSION,
                             "protocol version %u not supported (this daemon "
                             "speaks %d)",
                             h->protocol_version, TB_PROTOCOL_VERSION);
  if (!client_name_ok(name))
    return tbd__reply_status(r, s, id, TB_ENAME,
                             "client name must be at most 63 printable bytes");
  if ((unsigned)h->stream_contract > TB_CONTRACT_EXPLICIT)
    return tbd__reply_status(r, s, id, TB_EINVAL, "unknown stream contract %d",
                             (int)h->stream_contract);
  if (h->n_channels > TB_CONNECT_CHANNELS_MAX)
    return tbd__reply_status(r, s, id, TB_ELIMIT,
                             "Hello names %zu channels (at most %d)",
                             h->n_channels, TB_CONNECT_CHANNELS_MAX);
  for (size_t i = 0; i < h->n_channels; i++)
    if (name_bad(r, s, id, h->channels[i]))
      return TB_ENAME;
  {
    char why[256];
    if (tbd__session_admit(r, s, why, sizeof(why)) < 0) {
      tbd__reply_status(r, s, id, TB_ELIMIT, "%s", why);
      return TB_ELIMIT;
    }
  }
  snprintf(s->name, sizeof(s->name), "%s", name);
  s->contract = (int)h->stream_contract;
  s->memory_kinds = h->memory_kinds;
  s->prefetch = h->prefetch;
  s->says_goodbye = h->says_goodbye;
  s->shm_id = h->shm_id;
  s->pidns_id = h->pidns_id;
  s->hello = true; /* counted by tbd__session_admit */
  tbd_log_with(tbd_session_log_level(s),
               &(struct tbd_log_fields){(long long)s->id, (long long)s->pid,
                                        (long long)s->uid, NULL},
               "session %llu open: pid %d uid %u gid %u name '%s' contract %s",
               (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid,
               (unsigned)s->gid, s->name, tb_contract_name(s->contract));
  rep.request_id = id;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_HELLO;
  rep.hello = &hr;
  hr.protocol_version = TB_PROTOCOL_VERSION;
  hr.session_id = s->id;
  hr.daemon_version = (char *)TB_VERSION_STRING;
  hr.max_message = r->lim.max_message;
  hr.max_ndim = r->lim.max_ndim;
  hr.max_metadata = r->lim.max_metadata;
  hr.features = TENSORBROKER__V1__FEATURE__FEATURE_ACQUIRE_RELEASE |
                TENSORBROKER__V1__FEATURE__FEATURE_GOODBYE |
                TENSORBROKER__V1__FEATURE__FEATURE_OPERATOR_VIEW |
                TENSORBROKER__V1__FEATURE__FEATURE_METRICS |
                TENSORBROKER__V1__FEATURE__FEATURE_CUDA_VMM |
                TENSORBROKER__V1__FEATURE__FEATURE_CUDA_HOST |
                TENSORBROKER__V1__FEATURE__FEATURE_BUFFER_LIST |
                TENSORBROKER__V1__FEATURE__FEATURE_CANCEL |
                TENSORBROKER__V1__FEATURE__FEATURE_MULTI_WAIT;
  hr.max_name = r->lim.max_name;
  hello_latest(r, s, h, &hr, latest, ptrs);
  tbd__send_reply(r, s, &rep, NULL, 0);
  return 0;
}

/* A request's device, when it names one: a uuid of 0 or 16 bytes and an
 * ordinal that is not negative. TB_EINVAL with the reason in why. */
static int copy_device(const Tensorbroker__V1__Device *d, int32_t *type,
                       int32_t *devid, uint8_t *uuid, size_t *uuid_len,
                       char *why, size_t whylen) {
  if (d == NULL)
    return 0;
  if (d->uuid.len != 0 && d->uuid.len != TB__UUID_SIZE) {
    snprintf(why, whylen, "device uuid must be %d bytes, not %zu",
             TB__UUID_SIZE, d->uuid.len);
    return TB_EINVAL;
  }
  if (d->id < 0) {
    snprintf(why, whylen, "device id %d is negative", (int)d->id);
    return TB_EINVAL;
  }
  *type = d->type;
  *devid = d->id;
  if (d->uuid.len > 0)
    memcpy(uuid, d->uuid.data, d->uuid.len);
  *uuid_len = d->uuid.len;
  return 0;
}

static int on_buffer_register(struct tbd_registry *r, struct tbd_session *s,
                              uint64_t id,
                              const Tensorbroker__V1__BufferRegister *m,
                              int *fds, int nfds) {
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Tensorbroker__V1__BufferRegisterReply br =
      TENSORBROKER__V1__BUFFER_REGISTER_REPLY__INIT;
  const struct tbd_kind *k = tbd_kind_find(m->kind);
  struct tbd_buffer *b;
  char why[256];
  int rc;

  if (k == NULL)
    return tbd__reply_status(r, s, id, TB_EINVAL, "unknown memory kind %d",
                             (int)m->kind);
  rc = k->validate_register(m, fds, nfds, why, sizeof(why));
  if (rc == TB_EPROTO)
    return proto_error(r, s, id, why);
  if (rc < 0)
    return tbd__reply_status(r, s, id, rc, "%s", why);
  if (m->signal_offset != 0 && !k->signals)
    return tbd__reply_status(r, s, id, TB_EINVAL,
                             "signal_offset is for CUDA_VMM_FD buffers "
                             "(this one is %s)", k->name);
  {
    char lwhy[256];
    uint32_t keep = k->fds_held != NULL ? k->fds_held(m) : 0;
    if (tbd__buffer_admit(r, s, keep, lwhy, sizeof(lwhy)) < 0)
      return tbd__reply_status(r, s, id, TB_ELIMIT, "%s", lwhy);
  }
  b = tbd_calloc(1, sizeof(*b));
  if (b == NULL)
    return tbd__reply_status(r, s, id, TB_ENOMEM, "out of memory");
  b->kind = m->kind;
  b->size = m->size;
  b->signal_offset = m->signal_offset; /* the kind checked it */
  b->writable = m->consumers_may_write;
  b->fd = -1;
  b->rofd = -1;
  b->dev_type = kDLCPU;
  if (copy_device(m->device, &b->dev_type, &b->dev_id, b->uuid,
                  &b->uuid_len, why, sizeof(why)) < 0) {
    tbd_free(b);
    return tbd__reply_status(r, s, id, TB_EINVAL, "%s", why);
  }
  b->dev_type = k->dev_type; /* validate_register checked a given one */
  if (m->cuda_ipc_handle.len == TB__CUDA_IPC_HANDLE_SIZE) {
    memcpy(b->handle, m->cuda_ipc_handle.data, TB__CUDA_IPC_HANDLE_SIZE);
    b->handle_len = TB__CUDA_IPC_HANDLE_SIZE;
  }
  rc = tbd__buffer_add(r, s, b);
  if (rc < 0) {
    tbd_free(b);
    return tbd__reply_status(r, s, id, rc, "out of memory");
  }
  if (k->adopt != NULL)
    k->adopt(b, fds, nfds);
  if (b->fd >= 0) /* admitted above: within the budget */
    (void)tbd_registry_fds_take(r, 1, true);
  if (b->rofd >= 0)
    (void)tbd_registry_fds_take(r, 1, true);
  rep.request_id = id;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_BUFFER_REGISTER;
  rep.buffer_register = &br;
  br.buffer_id = b->id;
  br.generation = b->generation;
  tbd__send_reply(r, s, &rep, NULL, 0);
  return 0;
}

static int on_buffer_unregister(struct tbd_registry *r, struct tbd_session *s,
                                uint64_t id, uint64_t buffer_id) {
  struct tbd_buffer *b;

  HASH_FIND(hh, r->buffers, &buffer_id, sizeof(buffer_id), b);
  if (b == NULL)
    return tbd__reply_status(r, s, id, TB_ENOTFOUND, "no buffer %llu",
                             (unsigned long long)buffer_id);
  if (b->owner != s)
    return tbd__reply_status(r, s, id, b->retired ? TB_ENOTFOUND : TB_EPERM,
                             "buffer %llu is not registered by this session",
                             (unsigned long long)buffer_id);
  tbd__buffer_retire(r, b);
  return tbd__reply_status(r, s, id, 0, NULL);
}

static int on_event_register(struct tbd_registry *r, struct tbd_session *s,
                             uint64_t id,
                             const Tensorbroker__V1__EventRegister *m) {
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Tensorbroker__V1__EventRegisterReply er =
      TENSORBROKER__V1__EVENT_REGISTER_REPLY__INIT;
  struct tbd_event *e;
  char why[160];
  int rc;

  if (m->cuda_ipc_event_handle.len != TB__CUDA_IPC_HANDLE_SIZE)
    return tbd__reply_status(r, s, id, TB_EINVAL,
                             "cuda_ipc_event_handle must be %d bytes",
                             TB__CUDA_IPC_HANDLE_SIZE);
  if (m->device != NULL && m->device->type != kDLCUDA)
    return tbd__reply_status(r, s, id, TB_EINVAL, "an interprocess event "
                             "on device type %d: CUDA events are on "
                             "kDLCUDA (2)", (int)m->device->type);
  if (tbd__limit_check(r, s, s->u, TBD_RES_EVENTS, TBD_SCOPE_ALL, why,
                       sizeof(why), NULL) < 0)
    return tbd__reply_status(r, s, id, TB_ELIMIT, "%s", why);
  e = tbd_calloc(1, sizeof(*e));
  if (e == NULL)
    return tbd__reply_status(r, s, id, TB_ENOMEM, "out of memory");
  memcpy(e->info.handle, m->cuda_ipc_event_handle.data,
         TB__CUDA_IPC_HANDLE_SIZE);
  e->info.dev_type = kDLCUDA;
  e->info.shm_id = s->shm_id;
  e->info.pidns_id = s->pidns_id;
  if (copy_device(m->device, &e->info.dev_type, &e->info.dev_id,
                  e->info.uuid, &e->info.uuid_len, why, sizeof(why)) < 0) {
    tbd_free(e);
    return tbd__reply_status(r, s, id, TB_EINVAL, "%s", why);
  }
  rc = tbd__event_add(r, s, e);
  if (rc < 0) {
    tbd_free(e);
    return tbd__reply_status(r, s, id, rc, "out of memory");
  }
  rep.request_id = id;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_EVENT_REGISTER;
  rep.event_register = &er;
  er.event_id = e->info.id;
  tbd__send_reply(r, s, &rep, NULL, 0);
  return 0;
}

/* An event id named in a request: 0 (none) or one of this session's. */
static int own_event(struct tbd_registry *r, struct tbd_session *s,
                     uint64_t event_id, struct tbd_event **out) {
  struct tbd_event *e = NULL;

  if (event_id != 0) {
    HASH_FIND(hh, r->events, &event_id, sizeof(event_id), e);
    if (e == NULL)
      return TB_ENOTFOUND;
    if (e->owner != s)
      return TB_EPERM;
  }
  *out = e;
  return 0;
}

static int on_event_unregister(struct tbd_registry *r, struct tbd_session *s,
                               uint64_t id, uint64_t event_id) {
  struct tbd_event *e;
  int rc = event_id == 0 ? TB_ENOTFOUND : own_event(r, s, event_id, &e);

  if (rc < 0)
    return tbd__reply_status(r, s, id, rc, "event %llu is not registered by "
                             "this session", (unsigned long long)event_id);
  tbd__event_remove(r, e);
  return tbd__reply_status(r, s, id, 0, NULL);
}

static int on_publish(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t id, const Tensorbroker__V1__Publish *m) {
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Tensorbroker__V1__PublishReply pr = TENSORBROKER__V1__PUBLISH_REPLY__INIT;
  struct tbd_buffer *b;
  struct tbd_event *ready;
  char why[160] = "";
  uint64_t version, end;
  int rc, want_dev;

  if (name_bad(r, s, id, m->channel))
    return TB_ENAME;
  {
    char msg[512];
    if (tbd__access(r, s, TBD_ACL_PUBLISH, "publish", m->channel,
                    tbd__channel_find(r, m->channel), msg, sizeof(msg)) < 0)
      return tbd__reply_status(r, s, id, TB_EPERM, "%s", msg);
  }
  HASH_FIND(hh, r->buffers, &m->buffer_id, sizeof(m->buffer_id), b);
  if (b == NULL)
    return tbd__reply_status(r, s, id, TB_ENOTFOUND, "no buffer %llu",
                             (unsigned long long)m->buffer_id);
  if (b->retired)
    return tbd__reply_status(r, s, id, TB_ENOTFOUND,
                             "buffer %llu was unregistered",
                             (unsigned long long)m->buffer_id);
  if (b->owner != s)
    return tbd__reply_status(r, s, id, TB_EPERM,
                             "buffer %llu belongs to another session",
                             (unsigned long long)m->buffer_id);
  rc = tb__layout_check_end(m->layout, b->size, r->lim.max_ndim, &end, why,
                            sizeof(why));
  if (rc < 0)
    return tbd__reply_status(r, s, id, rc, "%s", why);
  /* The signal area is written by streams while consumers read the
   * tensor: a tensor in it would be torn by them, and would tear them. */
  if (b->signal_offset != 0 && end > b->signal_offset)
    return tbd__reply_status(r, s, id, TB_EINVAL,
                             "the tensor ends at byte %llu: it overlaps "
                             "the buffer's signal area from byte %llu",
                             (unsigned long long)end,
                             (unsigned long long)b->signal_offset);
  want_dev = tbd_kind_find(b->kind)->dev_type; /* registered: known */
  if (m->layout->device == NULL || m->layout->device->type != want_dev)
    return tbd__reply_status(r, s, id, TB_EDEVICE,
                             "layout device type %d does not match the "
                             "buffer's (%d)",
                             m->layout->device ? (int)m->layout->device->type
                                               : -1,
                             want_dev);
  if (m->metadata.len > r->lim.max_metadata)
    return tbd__reply_status(r, s, id, TB_ELIMIT,
                             "metadata of %zu bytes (--max-metadata %u)",
                             m->metadata.len, r->lim.max_metadata);
  if (m->history_depth > r->lim.max_history)
    return tbd__reply_status(r, s, id, TB_ELIMIT,
                             "history depth %u (--max-history %u)",
                             m->history_depth, r->lim.max_history);
  rc = own_event(r, s, m->ready_event_id, &ready);
  if (rc < 0)
    return tbd__reply_status(r, s, id, rc, "ready event %llu is not "
                             "registered by this session",
                             (unsigned long long)m->ready_event_id);
  /* The ready signal stands for the ready event where the event cannot be
   * opened: a consumer that can open it waits on the event, so the two
   * must come together. */
  if (m->ready_signal != 0 && ready == NULL)
    return tbd__reply_status(r, s, id, TB_EINVAL,
                             "a ready signal comes with the ready event it "
                             "stands for");
  if (m->ready_signal != 0 && b->signal_offset == 0)
    return tbd__reply_status(r, s, id, TB_EINVAL,
                             "ready signal for buffer %llu, which has no "
                             "signal area",
                             (unsigned long long)m->buffer_id);
  rc = tbd__publish(r, s, m->channel, b, m->layout, ready, m->ready_complete,
                    m->ready_signal, m->metadata.data, m->metadata.len,
                    m->history_depth, &version, why, sizeof(why));
  if (rc < 0)
    return tbd__reply_status(r, s, id, rc, "%s", why);
  rep.request_id = id;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_PUBLISH;
  rep.publish = &pr;
  pr.version = version;
  tbd__send_reply(r, s, &rep, NULL, 0);
  return 0;
}

/* End lease_id of session s with an optional done event and done signal,
 * as a Release does. On an error nothing changed and *what says why (for
 * the reply). */
static int release_lease(struct tbd_registry *r, struct tbd_session *s,
                         uint64_t lease_id, uint64_t done_event_id,
                         uint64_t done_signal, const char **what) {
  struct tbd_lease *l;
  struct tbd_event *done;
  struct tbd_sent *sent = NULL;
  int rc;

  HASH_FIND(hh, r->leases, &lease_id, sizeof(lease_id), l);
  if (l == NULL || l == &r->anchor) {
    *what = "no such lease";
    return TB_ENOTFOUND;
  }
  if (l->s != s) {
    *what = "the lease belongs to another session";
    return TB_EPERM;
  }
  rc = own_event(r, s, done_event_id, &done);
  if (rc < 0) {
    *what = "its done event is not registered by this session";
    return rc;
  }
  /* The done signal stands for the done event where the producer cannot
   * open it, in this session's slot of the buffer: a producer that can
   * open the event waits on it, so the two come together. */
  if (done_signal != 0 && done == NULL) {
    *what = "a done signal comes with the done event it stands for";
    return TB_EINVAL;
  }
  if (done_signal != 0)
    HASH_FIND(hh, s->sent, &l->v->buf->id, sizeof(l->v->buf->id), sent);
  if (done_signal != 0 && (sent == NULL || sent->slot == 0)) {
    *what = "a done signal, but this session has no done slot in the "
            "lease's buffer (its AcquireReply.done_slot was 0)";
    return TB_EINVAL;
  }
  rc = tbd__lease_release(r, l, done, sent != NULL ? sent->slot : 0,
                          done_signal);
  if (rc < 0)
    *what = "out of memory";
  else
    r->stats.releases++;
  return rc;
}

static int on_acquire(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t id, const Tensorbroker__V1__Acquire *m) {
  struct tbd_channel *ch = tbd__channel_recent(r, s, m->channel);
  const char *what = NULL;
  int rc;

  /* a name this session acquired last is valid (tbd__acquire looks it up
   * again after the release below, which may free the channel) */
  if (ch == NULL && name_bad(r, s, id, m->channel))
    return TB_ENAME;
  if ((unsigned)m->mode > TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_EXACT)
    return tbd__reply_status(r, s, id, TB_EINVAL, "unknown acquire mode %d",
                             (int)m->mode);
  /* judged before the release that may ride along: a denied request
   * changes nothing */
  if (ch == NULL)
    ch = tbd__channel_find(r, m->channel);
  rc = tbd__acquire_judge(r, s, id, m->channel, ch);
  if (rc < 0)
    return rc;
  if (m->release_lease_id != 0) {
    /* the consumer's previous lease rides with this acquire */
    rc = release_lease(r, s, m->release_lease_id, m->release_done_event_id,
                       m->release_done_signal, &what);
    if (rc < 0)
      return tbd__reply_status(r, s, id, TB_EINVAL,
                               "cannot release lease %llu with this acquire: "
                               "%s",
                               (unsigned long long)m->release_lease_id, what);
    if (m->release_implicit_stream)
      s->implicit_stream_calls++;
  }
  if (m->implicit_stream)
    s->implicit_stream_calls++;
  return tbd__acquire(r, s, id, m->channel, (int)m->mode, m->version,
                      m->timeout_ms);
}

static int on_release(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t id, const Tensorbroker__V1__Release *m) {
  uint64_t rid = m->want_reply ? id : 0;
  const char *what = NULL;
  int rc;

  if (m->implicit_stream)
    s->implicit_stream_calls++;
  rc = release_lease(r, s, m->lease_id, m->done_event_id, m->done_signal,
                     &what);
  if (rc < 0)
    return tbd__reply_status(r, s, rid, rc, "lease %llu: %s",
                             (unsigned long long)m->lease_id, what);
  return tbd__reply_status(r, s, rid, 0, NULL);
}

static int on_subscribe(struct tbd_registry *r, struct tbd_session *s,
                        uint64_t id, const char *name, bool sub) {
  int rc;

  if (name_bad(r, s, id, name))
    return TB_ENAME;
  if (sub) {
    struct tbd_sub *have;
    char why[160], msg[512];
    /* a name not published yet may be subscribed to: its notices are
     * judged as they go (new_version_notify) */
    if (tbd__access(r, s, TBD_ACL_ACQUIRE, "subscribe to", name,
                    tbd__channel_find(r, name), msg, sizeof(msg)) < 0)
      return tbd__reply_status(r, s, id, TB_EPERM, "%s", msg);
    HASH_FIND_STR(s->subs, name, have);
    if (have == NULL &&
        tbd__limit_check(r, s, s->u, TBD_RES_SUBS, TBD_SCOPE_ALL, why,
                         sizeof(why), NULL) < 0)
      return tbd__reply_status(r, s, id, TB_ELIMIT, "%s", why);
  }
  rc = sub ? tbd__subscribe(r, s, name) : tbd__unsubscribe(r, s, name);
  if (rc == TB_ELIMIT)
    return tbd__reply_status(r, s, id, rc,
                             "session has %u subscriptions "
                             "(--max-subscriptions)",
                             r->lim.max_subscriptions);
  if (rc == TB_ENOTFOUND)
    return tbd__reply_status(r, s, id, rc, "not subscribed to '%s'", name);
  if (rc < 0)
    return tbd__reply_status(r, s, id, rc, "out of memory");
  return tbd__reply_status(r, s, id, 0, NULL);
}

/* A row of ListChannels: a channel, or (ch NULL) a name that only has
 * parked acquires. */
struct channel_row {
  const char *name;
  struct tbd_channel *ch;
};

static int channel_row_cmp(const void *a, const void *b) {
  const struct channel_row *x = a, *y = b;
  return strcmp(x->name, y->name);
}

/* tbd__list_page's fill: row is a struct channel_row. */
static void channel_info_fill(struct tbd_registry *r, const void *rowp,
                              void *info) {
  const struct channel_row *row = rowp;
  Tensorbroker__V1__ChannelInfo *ci = info;
  struct tbd_channel *ch = row->ch;
  struct tbd_subgroup *g;
  struct tbd_sub *sub;
  uint32_t nsub = 0;

  tensorbroker__v1__channel_info__init(ci);
  ci->name = (char *)row->name;
  ci->waiters = tbd__waiters(r, row->name);
  if (ch == NULL) {
    ci->waiting = true;
    return;
  }
  ci->latest_version = ch->latest;
  {
    struct tbd_version *nv = tbd__channel_newest(ch);
    if (nv != NULL && nv->buf != NULL)
      ci->memory_kind = nv->buf->kind;
  }
  ci->history_depth = ch->depth;
  ci->publisher_session = ch->publisher ? ch->publisher->id : 0;
  ci->versions_held = ch->nversions;
  ci->leases = ch->nleases;
  HASH_FIND_STR(r->subgroups, ch->name, g);
  if (g != NULL)
    DL_FOREACH2(g->members, sub, gnext) { nsub++; }
  ci->subscribers = nsub;
  ci->closed = ch->closed;
  ci->publishes = ch->publishes;
}

static int on_list_channels(struct tbd_registry *r, struct tbd_session *s,
                            uint64_t id,
                            const Tensorbroker__V1__ListChannels *q) {
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Tensorbroker__V1__ListChannelsReply lr =
      TENSORBROKER__V1__LIST_CHANNELS_REPLY__INIT;
  struct tbd_list_page page;
  struct tbd_channel *ch;
  struct tbd_waitq *wq;
  struct channel_row *all;
  const char *after = q != NULL && q->after != NULL ? q->after : "";
  bool waiting = q != NULL && q->waiting;
  size_t most = r->nchannels + (waiting ? HASH_COUNT(r->waitqs) : 0) + 1;
  size_t nall = 0;

  all = tbd_calloc(most, sizeof(*all));
  if (all == NULL)
    return tbd__reply_status(r, s, id, TB_ENOMEM, "out of memory");
  /* a channel s may not list is left out: s must not learn its name; so
   * is a name only waited for, unless a session of s's uid waits for it */
  for (ch = r->channels; ch != NULL && nall < most; ch = ch->hh.next)
    if (strcmp(ch->name, after) > 0 &&
        tbd__access_quiet(r, s, TBD_ACL_LIST, ch->name, ch))
      all[nall++] = (struct channel_row){ch->name, ch};
  for (wq = waiting ? r->waitqs : NULL; wq != NULL && nall < most;
       wq = wq->hh.next)
    if (strcmp(wq->name, after) > 0 && tbd__channel_find(r, wq->name) == NULL &&
        tbd__access_waiting(r, s, wq))
      all[nall++] = (struct channel_row){wq->name, NULL};
  qsort(all, nall, sizeof(*all), channel_row_cmp);
  if (tbd__list_page(r, all, nall, sizeof(*all),
                     sizeof(Tensorbroker__V1__ChannelInfo), channel_info_fill,
                     &page) < 0) {
    tbd_free(all);
    return tbd__reply_status(r, s, id, TB_ENOMEM, "out of memory");
  }
  rep.request_id = id;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_LIST_CHANNELS;
  rep.list_channels = &lr;
  lr.n_channels = page.n;
  lr.channels = (Tensorbroker__V1__ChannelInfo **)page.ptrs;
  lr.more = page.more;
  tbd__send_reply(r, s, &rep, NULL, 0);
  tbd__list_page_free(&page);
  tbd_free(all);
  return 0;
}

/* qsort order of an array of sessions by id. */
static int session_ptr_cmp(const void *a, const void *b) {
  const struct tbd_session *x = *(const struct tbd_session *const *)a;
  const struct tbd_session *y = *(const struct tbd_session *const *)b;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* tbd__list_page's fill: row is a struct tbd_session *. */
static void session_info_fill(struct tbd_registry *r, const void *row,
                              void *info) {
  const struct tbd_session *t = *(struct tbd_session *const *)row;
  Tensorbroker__V1__SessionInfo *si = info;

  (void)r;
  tensorbroker__v1__session_info__init(si);
  si->session_id = t->id;
  si->pid = (uint32_t)t->pid;
  si->uid = t->uid;
  si->gid = t->gid;
  si->name = (char *)t->name;
  si->stream_contract = t->contract;
  si->leases = t->nleases;
  si->buffers = t->nbuffers;
  si->implicit_stream_calls = t->implicit_stream_calls;
  si->requests = t->requests;
  si->subscriptions = t->nsubs;
}

static int on_list_sessions(struct tbd_registry *r, struct tbd_session *s,
                            uint64_t id,
                            const Tensorbroker__V1__ListSessions *q) {
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Tensorbroker__V1__ListSessionsReply lr =
      TENSORBROKER__V1__LIST_SESSIONS_REPLY__INIT;
  struct tbd_list_page page;
  struct tbd_session *t, **all;
  uint64_t after = q != NULL ? q->after_session_id : 0;
  size_t nall = 0;

  all = tbd_calloc(r->nsessions + 1, sizeof(*all));
  if (all == NULL)
    return tbd__reply_status(r, s, id, TB_ENOMEM, "out of memory");
  /* under default = owner, a session other than an operator's sees only
   * the sessions of its own uid */
  bool everyone = tbd__access_all_sessions(r, s);
  for (t = r->sessions; t != NULL && nall < r->nsessions; t = t->hh.next)
    if (t->hello && t->id > after && (everyone || t->uid == s->uid))
      all[nall++] = t;
  qsort(all, nall, sizeof(*all), session_ptr_cmp);
  if (tbd__list_page(r, all, nall, sizeof(*all),
                     sizeof(Tensorbroker__V1__SessionInfo), session_info_fill,
                     &page) < 0) {
    tbd_free(all);
    return tbd__reply_status(r, s, id, TB_ENOMEM, "out of memory");
  }
  rep.request_id = id;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_LIST_SESSIONS;
  rep.list_sessions = &lr;
  lr.n_sessions = page.n;
  lr.sessions = (Tensorbroker__V1__SessionInfo **)page.ptrs;
  lr.more = page.more;
  tbd__send_reply(r, s, &rep, NULL, 0);
  tbd__list_page_free(&page);
  tbd_free(all);
  return 0;
}

static int on_status(struct tbd_registry *r, struct tbd_session *s,
                     uint64_t id) {
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Tensorbroker__V1__StatusReply st = TENSORBROKER__V1__STATUS_REPLY__INIT;

  rep.request_id = id;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_STATUS_INFO;
  rep.status_info = &st;
  st.daemon_version = (char *)TB_VERSION_STRING;
  st.pid = (uint32_t)getpid();
  st.uptime_ms = tbd__now(r) - r->start_ms;
  st.sessions = r->nhello + r->noperators;
  st.channels = r->nchannels;
  st.buffers = r->nbuffers;
  st.leases = r->nleases;
  st.requests = r->stats.requests;
  st.bad_messages = r->stats.bad_messages;
  st.sessions_dropped = r->stats.sessions_dropped;
  st.socket_path = (char *)r->socket_path;
  tbd__send_reply(r, s, &rep, NULL, 0);
  return 0;
}

static int on_forget(struct tbd_registry *r, struct tbd_session *s,
                     uint64_t buffer_id) {
  struct tbd_sent *e;

  (void)r;
  HASH_FIND(hh, s->sent, &buffer_id, sizeof(buffer_id), e);
  if (e != NULL)
    e->fd_current = false;
  return 0;
}

static int dispatch(struct tbd_registry *r, struct tbd_session *s,
                    const tb__request *q, int *fds, int nfds) {
  uint64_t id = q->request_id;

  if (q->body_case != BODY(HELLO) && !s->hello)
    return proto_error(r, s, id, "first request must be Hello");
  if (nfds > 0 && q->body_case != BODY(BUFFER_REGISTER))
    return proto_error(r, s, id, "unexpected descriptors");
  switch (q->body_case) {
  case BODY(HELLO):
    if (s->hello)
      return proto_error(r, s, id, "second Hello");
    return on_hello(r, s, id, q->hello) == TB_ELIMIT ? TB_ELIMIT : 0;
  case BODY(BUFFER_REGISTER):
    return on_buffer_register(r, s, id, q->buffer_register, fds, nfds);
  case BODY(BUFFER_UNREGISTER):
    return on_buffer_unregister(r, s, id, q->buffer_unregister->buffer_id);
  case BODY(EVENT_REGISTER):
    return on_event_register(r, s, id, q->event_register);
  case BODY(EVENT_UNREGISTER):
    return on_event_unregister(r, s, id, q->event_unregister->event_id);
  case BODY(PUBLISH):
    return on_publish(r, s, id, q->publish);
  case BODY(ACQUIRE):
    return on_acquire(r, s, id, q->acquire);
  case BODY(RELEASE):
    return on_release(r, s, id, q->release);
  case BODY(SUBSCRIBE):
    return on_subscribe(r, s, id, q->subscribe->channel, true);
  case BODY(UNSUBSCRIBE):
    return on_subscribe(r, s, id, q->unsubscribe->channel, false);
  case BODY(LIST_CHANNELS):
    return on_list_channels(r, s, id, q->list_channels);
  case BODY(LIST_SESSIONS):
    return on_list_sessions(r, s, id, q->list_sessions);
  case BODY(STATUS):
    return on_status(r, s, id);
  case BODY(LIST_LEASES):
    return tbd__list_leases(r, s, id, q->list_leases);
  case BODY(LIST_WAITS):
    return tbd__list_waits(r, s, id, q->list_waits);
  case BODY(LIST_BUFFERS):
    return tbd__list_buffers(r, s, id, q->list_buffers);
  case BODY(DROP_CHANNEL):
    if (name_bad(r, s, id, q->drop_channel->channel))
      return 0;
    return tbd__drop_channel(r, s, id, q->drop_channel->channel);
  case BODY(FORGET):
    return on_forget(r, s, q->forget->buffer_id);
  case BODY(GOODBYE):
    s->said_goodbye = true; /* one-way: the connection closes next */
    return 0;
  case BODY(CANCEL):
    /* a wait already answered (or never parked) is left alone; the reply
     * comes after that answer, which the client then takes as late */
    tbd__wait_cancel(r, s, q->cancel->request_id);
    return tbd__reply_status(r, s, id, 0, NULL);
  case BODY(METRICS):
    return tbd_metrics_request(r, s, id, q->metrics->offset);
  case BODY(WAIT_FREE):
    if (name_bad(r, s, id, q->wait_free->channel))
      return 0;
    return tbd__wait_free(r, s, id, q->wait_free->channel,
                          q->wait_free->version, q->wait_free->timeout_ms);
  default:
    return proto_error(r, s, id, "unknown request");
  }
}

int tbd_session_request(struct tbd_registry *r, struct tbd_session *s,
                        const tb__request *req, int *fds, int nfds) {
  int rc;

  r->stats.requests++;
  r->stats.by_type[(unsigned)req->body_case < TBD_REQUEST_TYPES
                       ? (unsigned)req->body_case
                       : 0]++;
  s->requests++;
  rc = dispatch(r, s, req, fds, nfds);
  close_fds(fds, nfds); /* whatever was not kept */
  /* Only these end the session; any other status was a reply. */
  if (rc == TB_EPROTO || (rc == TB_ELIMIT && !s->hello))
    return rc;
  return 0;
}
