/* SPDX-License-Identifier: Apache-2.0 */
/* Introspection: tb_list_channels, tb_list_sessions, tb_daemon_status, and
 * the operator's view: tb_list_leases, tb_list_waits, tb_buffer_list,
 * tb_channel_drop. */
#include "client_internal.h"

#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void copy_str(char *dst, size_t cap, const char *src) {
  size_t n = src ? strnlen(src, cap - 1) : 0;
  if (n > 0)
    memcpy(dst, src, n);
  dst[n] = '\0';
}

/* Send a body-less introspection request and check the reply's body. */
static int ask(struct tb_client *c, tb__request *r, int want,
               tb__server_message **out) {
  int fds[TB__MAX_FDS], nfds = 0, rc;

  rc = tb__call(c, r, NULL, 0, 0, out, fds, &nfds);
  if (rc < 0)
    return rc;
  for (int i = 0; i < nfds; i++)
    close(fds[i]);
  if ((int)(*out)->reply->body_case != want) {
    tb__msg_free(c, *out);
    return tb__set_error(c, TB_EPROTO, "reply of the wrong kind");
  }
  return 0;
}

/* A page of got entries arrived (more: the daemon has another): grow *a
 * (of *cap elements of size sz, n used) to hold them too. A page that is
 * empty but claims more would loop forever: TB_EPROTO. */
static int page_room(struct tb_client *c, size_t got, int more, void **a,
                     size_t *cap, size_t n, size_t sz) {
  size_t need = n + got + 1, m = *cap ? *cap : 16;
  void *p;
  if (more && got == 0)
    return tb__set_error(c, TB_EPROTO, "empty list page that claims more");
  if (need <= *cap)
    return 0;
  while (m < need)
    m *= 2;
  if (m > SIZE_MAX / sz)
    return tb__set_error(c, TB_ENOMEM, "a list of %zu entries of %zu bytes "
                         "does not fit in memory", m, sz);
  p = realloc(*a, m * sz);
  if (p == NULL)
    return TB_ENOMEM;
  *a = p;
  *cap = m;
  return 0;
}

/* Hand the list out (never NULL, also when empty) or free it. */
static int list_done(int rc, void **a, size_t sz, void **out, size_t *count,
                     size_t n) {
  if (rc == 0 && *a == NULL && (*a = calloc(1, sz)) == NULL)
    rc = TB_ENOMEM;
  if (rc < 0) {
    free(*a);
    return rc;
  }
  *out = *a;
  *count = n;
  return 0;
}

/* Entry n of an array of entries stride bytes apart, set to the first
 * stride bytes of x (size bytes; zero past them). */
static void entry_put(void *a, size_t stride, size_t n, const void *x,
                      size_t size) {
  char *e = (char *)a + n * stride;

  memset(e, 0, stride);
  memcpy(e, x, size < stride ? size : stride);
}

/* A caller's entry size: at least the first version, aligned, and at most
 * TB_STRUCT_SIZE_MAX, so that the array's size cannot overflow. */
static int stride_ok(size_t struct_size, size_t min, size_t align) {
  return struct_size >= min && struct_size <= TB_STRUCT_SIZE_MAX &&
         struct_size % align == 0;
}

/* A list the daemon pages by the id of the last entry it sent (sessions,
 * leases, waits): where the request keeps that cursor, and how a reply's
 * page reads. */
struct id_pages {
  int reply_case;
  uint64_t *after; /* the request's cursor */
  /* the page in rep: how many entries, whether more follow */
  size_t (*page)(const Tensorbroker__V1__Reply *rep, int *more);
  /* entry i of the page into x (entry_size bytes, zeroed past the fields
   * set); returns its id, the next cursor */
  uint64_t (*entry)(const Tensorbroker__V1__Reply *rep, size_t i, void *x);
  size_t entry_size;
  /* a list paged by two ids (waits: session, then request), or NULL: the
   * request's second cursor, and entry i's second id */
  uint64_t *after_sub;
  uint64_t (*sub)(const Tensorbroker__V1__Reply *rep, size_t i);
};

/* Ask for r's pages until the daemon says there is no more; the entries go
 * stride bytes apart into a new array (list_done). A page whose ids do not
 * go past the cursor is TB_EPROTO. Caller holds call_lock. */
static int id_pages_get(struct tb_client *c, tb__request *r,
                        const struct id_pages *p, size_t stride, void **out,
                        size_t *count) {
  union {
    struct tb_session_info s;
    struct tb_lease_entry l;
    struct tb_wait_entry w;
    struct tb_buffer_entry b;
  } x;
  void *a = NULL;
  size_t n = 0, cap = 0;
  int rc = 0, more = 1;

  while (rc == 0 && more) {
    tb__server_message *m = NULL;
    uint64_t last = 0, last_sub = 0;
    size_t got;

    rc = ask(c, r, p->reply_case, &m);
    if (rc < 0)
      break;
    got = p->page(m->reply, &more);
    rc = page_room(c, got, more, &a, &cap, n, stride);
    for (size_t i = 0; rc == 0 && i < got; i++) {
      last = p->entry(m->reply, i, &x);
      entry_put(a, stride, n++, &x, p->entry_size);
    }
    if (rc == 0 && got > 0) {
      if (p->sub != NULL)
        last_sub = p->sub(m->reply, got - 1);
      if (last < *p->after ||
          (last == *p->after &&
           (p->sub == NULL || last_sub <= *p->after_sub)))
        rc = tb__set_error(c, TB_EPROTO, "list page out of order");
      *p->after = last;
      if (p->sub != NULL)
        *p->after_sub = last_sub;
    }
    tb__msg_free(c, m);
  }
  return list_done(rc, &a, stride, out, count, n);
}

/* The first version of struct tb_channel_info, as 0.1.0 had it. */
#define CHANNEL_INFO_V0 offsetof(struct tb_channel_info, waiters)

/* The first version of an entry struct t, which ended with field f,
 * padded as the struct is: the smallest struct_size its list takes,
 * however the struct grows. */
#define ENTRY_V0(t, f)                                                         \
  ((offsetof(t, f) + sizeof(((t *)0)->f) + alignof(t) - 1) &                  \
   ~(alignof(t) - 1))
#define LEASE_ENTRY_V0 ENTRY_V0(struct tb_lease_entry, died)
#define WAIT_ENTRY_V0 ENTRY_V0(struct tb_wait_entry, in_history)
#define BUFFER_ENTRY_V0 ENTRY_V0(struct tb_buffer_entry, survives_producer)

/* The daemon answers in pages that fit one datagram; ask for the next page
 * after the last entry until it says there is no more. waiting: also the
 * names only acquires wait on (ListChannels.waiting). */
static int list_channels(tb_client *c, size_t stride, int waiting,
                         struct tb_channel_info **out, size_t *count) {
  Tensorbroker__V1__ListChannels lc = TENSORBROKER__V1__LIST_CHANNELS__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  void *a = NULL;
  char after[TB_NAME_MAX + 1] = "";
  size_t n = 0, cap = 0;
  int rc = 0, more = 1;

  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_CHANNELS;
  r.list_channels = &lc;
  lc.waiting = waiting != 0;
  while (rc == 0 && more) {
    const Tensorbroker__V1__ListChannelsReply *lr;
    tb__server_message *m = NULL;
    size_t got;

    lc.after = after;
    rc = ask(c, &r, TENSORBROKER__V1__REPLY__BODY_LIST_CHANNELS, &m);
    if (rc < 0)
      break;
    lr = m->reply->list_channels;
    got = lr ? lr->n_channels : 0;
    more = lr && lr->more;
    rc = page_room(c, got, more, &a, &cap, n, stride);
    for (size_t i = 0; rc == 0 && i < got; i++) {
      const Tensorbroker__V1__ChannelInfo *ci = lr->channels[i];
      struct tb_channel_info x;
      memset(&x, 0, sizeof(x));
      copy_str(x.name, sizeof(x.name), ci->name);
      x.latest_version = ci->latest_version;
      x.history_depth = ci->history_depth;
      x.publisher_session = ci->publisher_session;
      x.versions_held = ci->versions_held;
      x.leases = ci->leases;
      x.subscribers = ci->subscribers;
      x.closed = ci->closed != 0;
      x.publishes = ci->publishes;
      x.waiters = ci->waiters;
      x.waiting = ci->waiting != 0;
      x.memory_kind = (int)ci->memory_kind;
      entry_put(a, stride, n++, &x, sizeof(x));
    }
    if (rc == 0 && got > 0) {
      /* the cursor is the full name, not the copy (names are < 256 bytes,
       * the struct's field too; a longer one cannot be a cursor) */
      const char *last = lr->channels[got - 1]->name;
      if (last == NULL || strlen(last) >= sizeof(after))
        rc = tb__set_error(c, TB_EPROTO, "channel name too long for a cursor");
      else
        memcpy(after, last, strlen(last) + 1);
    }
    tb__msg_free(c, m);
  }
  rc = list_done(rc, &a, stride, (void **)out, count, n);
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

int tb_list_channels_sized(tb_client *c, size_t struct_size,
                           struct tb_channel_info **out, size_t *count) {
  if (c == NULL || out == NULL || count == NULL ||
      !stride_ok(struct_size, CHANNEL_INFO_V0, sizeof(uint64_t)))
    return TB_EINVAL;
  return list_channels(c, struct_size, 1, out, count);
}

/* The 0.1.0 symbol (the header's macro of the same name calls the sized
 * one): its callers index the array with 0.1.0's struct. */
#undef tb_list_channels
int tb_list_channels(tb_client *c, struct tb_channel_info **out,
                     size_t *count) {
  if (c == NULL || out == NULL || count == NULL)
    return TB_EINVAL;
  return list_channels(c, CHANNEL_INFO_V0, 0, out, count);
}

static size_t sessions_page(const Tensorbroker__V1__Reply *rep, int *more) {
  const Tensorbroker__V1__ListSessionsReply *lr = rep->list_sessions;

  *more = lr != NULL && lr->more;
  return lr != NULL ? lr->n_sessions : 0;
}

static uint64_t session_entry(const Tensorbroker__V1__Reply *rep, size_t i,
                              void *out) {
  const Tensorbroker__V1__SessionInfo *si = rep->list_sessions->sessions[i];
  struct tb_session_info *x = out;

  memset(x, 0, sizeof(*x));
  x->session_id = si->session_id;
  x->pid = si->pid;
  x->uid = si->uid;
  x->gid = si->gid;
  copy_str(x->name, sizeof(x->name), si->name);
  x->stream_contract = (int)si->stream_contract;
  x->leases = si->leases;
  x->buffers = si->buffers;
  x->subscriptions = si->subscriptions;
  x->implicit_stream_calls = si->implicit_stream_calls;
  x->requests = si->requests;
  return si->session_id;
}

int tb_list_sessions(tb_client *c, struct tb_session_info **out,
                     size_t *count) {
  Tensorbroker__V1__ListSessions ls = TENSORBROKER__V1__LIST_SESSIONS__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  const struct id_pages p = {TENSORBROKER__V1__REPLY__BODY_LIST_SESSIONS,
                             &ls.after_session_id, sessions_page,
                             session_entry, sizeof(struct tb_session_info),
                             NULL, NULL};
  int rc;

  if (c == NULL || out == NULL || count == NULL)
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_SESSIONS;
  r.list_sessions = &ls;
  rc = id_pages_get(c, &r, &p, sizeof(**out), (void **)out, count);
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

int tb_daemon_status(tb_client *c, struct tb_status *out) {
  Tensorbroker__V1__Status st = TENSORBROKER__V1__STATUS__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  const Tensorbroker__V1__StatusReply *sr;
  tb__server_message *m = NULL;
  int rc;

  if (c == NULL || out == NULL)
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
  r.status = &st;
  rc = ask(c, &r, TENSORBROKER__V1__REPLY__BODY_STATUS_INFO, &m);
  if (rc < 0)
    goto out_unlock;
  sr = m->reply->status_info;
  if (sr == NULL) {
    rc = tb__set_error(c, TB_EPROTO, "empty status reply");
    goto out_free;
  }
  memset(out, 0, sizeof(*out));
  copy_str(out->daemon_version, sizeof(out->daemon_version),
           sr->daemon_version);
  out->pid = sr->pid;
  out->uptime_ms = sr->uptime_ms;
  out->sessions = sr->sessions;
  out->channels = sr->channels;
  out->buffers = sr->buffers;
  out->leases = sr->leases;
  out->requests = sr->requests;
  out->bad_messages = sr->bad_messages;
  out->sessions_dropped = sr->sessions_dropped;
  copy_str(out->socket_path, sizeof(out->socket_path), sr->socket_path);
out_free:
  tb__msg_free(c, m);
out_unlock:
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

/* ---- the operator's view ---- */

/* TB_ENOTSUP, with why, unless the daemon said it has the operator's
 * view. */
static int need_operator_view(struct tb_client *c, const char *what) {
  if (c->features & TENSORBROKER__V1__FEATURE__FEATURE_OPERATOR_VIEW)
    return 0;
  return tb__set_error(c, TB_ENOTSUP,
                       "the daemon cannot %s: it is older than the "
                       "operator's view (no FEATURE_OPERATOR_VIEW)",
                       what);
}

static size_t leases_page(const Tensorbroker__V1__Reply *rep, int *more) {
  const Tensorbroker__V1__ListLeasesReply *lr = rep->list_leases;

  *more = lr != NULL && lr->more;
  return lr != NULL ? lr->n_leases : 0;
}

static uint64_t lease_entry(const Tensorbroker__V1__Reply *rep, size_t i,
                            void *out) {
  const Tensorbroker__V1__LeaseInfo *li = rep->list_leases->leases[i];
  struct tb_lease_entry *x = out;

  memset(x, 0, sizeof(*x));
  x->lease_id = li->lease_id;
  x->session_id = li->session_id;
  x->pid = li->pid;
  x->uid = li->uid;
  copy_str(x->session_name, sizeof(x->session_name), li->session_name);
  copy_str(x->channel, sizeof(x->channel), li->channel);
  x->version = li->version;
  x->bytes = li->bytes;
  x->memory_kind = (int)li->kind;
  x->age_ms = li->age_ms;
  x->buffer_id = li->buffer_id;
  x->ready_event = li->ready_event != 0;
  x->done_events = li->done_events;
  x->died = li->died != 0;
  return li->lease_id;
}

int tb_list_leases(tb_client *c, size_t struct_size,
                   struct tb_lease_entry **out, size_t *count) {
  Tensorbroker__V1__ListLeases ll = TENSORBROKER__V1__LIST_LEASES__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  const struct id_pages p = {TENSORBROKER__V1__REPLY__BODY_LIST_LEASES,
                             &ll.after_lease_id, leases_page, lease_entry,
                             sizeof(struct tb_lease_entry), NULL, NULL};
  int rc;

  if (c == NULL || out == NULL || count == NULL ||
      !stride_ok(struct_size, LEASE_ENTRY_V0, sizeof(uint64_t)))
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  rc = need_operator_view(c, "list leases");
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_LEASES;
  r.list_leases = &ll;
  if (rc == 0)
    rc = id_pages_get(c, &r, &p, struct_size, (void **)out, count);
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

static size_t waits_page(const Tensorbroker__V1__Reply *rep, int *more) {
  const Tensorbroker__V1__ListWaitsReply *lr = rep->list_waits;

  *more = lr != NULL && lr->more;
  return lr != NULL ? lr->n_waits : 0;
}

static uint64_t wait_entry(const Tensorbroker__V1__Reply *rep, size_t i,
                           void *out) {
  const Tensorbroker__V1__WaitInfo *wi = rep->list_waits->waits[i];
  struct tb_wait_entry *x = out;

  memset(x, 0, sizeof(*x));
  x->session_id = wi->session_id;
  x->pid = wi->pid;
  x->uid = wi->uid;
  copy_str(x->session_name, sizeof(x->session_name), wi->session_name);
  x->what = (int)wi->what;
  copy_str(x->channel, sizeof(x->channel), wi->channel);
  x->version = wi->version;
  x->age_ms = wi->age_ms;
  x->timeout_ms = wi->timeout_ms;
  x->leases = wi->leases;
  x->in_history = wi->in_history != 0;
  return wi->session_id;
}

static uint64_t wait_request(const Tensorbroker__V1__Reply *rep, size_t i) {
  return rep->list_waits->waits[i]->request_id;
}

int tb_list_waits(tb_client *c, size_t struct_size,
                  struct tb_wait_entry **out, size_t *count) {
  Tensorbroker__V1__ListWaits lw = TENSORBROKER__V1__LIST_WAITS__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  const struct id_pages p = {TENSORBROKER__V1__REPLY__BODY_LIST_WAITS,
                             &lw.after_session_id, waits_page, wait_entry,
                             sizeof(struct tb_wait_entry),
                             &lw.after_request_id, wait_request};
  int rc;

  if (c == NULL || out == NULL || count == NULL ||
      !stride_ok(struct_size, WAIT_ENTRY_V0, sizeof(uint64_t)))
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  rc = need_operator_view(c, "list waits");
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_WAITS;
  r.list_waits = &lw;
  if (rc == 0)
    rc = id_pages_get(c, &r, &p, struct_size, (void **)out, count);
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

static size_t buffers_page(const Tensorbroker__V1__Reply *rep, int *more) {
  const Tensorbroker__V1__ListBuffersReply *lr = rep->list_buffers;

  *more = lr != NULL && lr->more;
  return lr != NULL ? lr->n_buffers : 0;
}

static uint64_t buffer_entry(const Tensorbroker__V1__Reply *rep, size_t i,
                             void *out) {
  const Tensorbroker__V1__BufferEntryInfo *bi = rep->list_buffers->buffers[i];
  const Tensorbroker__V1__Device *d = bi->device;
  struct tb_buffer_entry *x = out;

  memset(x, 0, sizeof(*x));
  x->buffer_id = bi->buffer_id;
  x->memory_kind = (int)bi->kind;
  x->size = bi->size;
  if (d != NULL) {
    x->device_type = d->type;
    x->device_id = d->id;
    /* a uuid of another length than a CUDA device's is no uuid */
    if (d->uuid.len == sizeof(x->device_uuid))
      memcpy(x->device_uuid, d->uuid.data, sizeof(x->device_uuid));
  }
  x->session_id = bi->session_id;
  x->pid = bi->pid;
  x->uid = bi->uid;
  copy_str(x->session_name, sizeof(x->session_name), bi->session_name);
  x->retired = bi->retired != 0;
  x->versions = bi->versions;
  x->leases = bi->leases;
  x->writable = bi->writable != 0;
  x->signal_offset = bi->signal_offset;
  x->survives_producer = bi->survives_producer != 0;
  return bi->buffer_id;
}

int tb_buffer_list(tb_client *c, size_t struct_size,
                   struct tb_buffer_entry **out, size_t *count) {
  Tensorbroker__V1__ListBuffers lb = TENSORBROKER__V1__LIST_BUFFERS__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  const struct id_pages p = {TENSORBROKER__V1__REPLY__BODY_LIST_BUFFERS,
                             &lb.after_buffer_id, buffers_page, buffer_entry,
                             sizeof(struct tb_buffer_entry), NULL, NULL};
  int rc = 0;

  if (c == NULL || out == NULL || count == NULL ||
      !stride_ok(struct_size, BUFFER_ENTRY_V0, sizeof(uint64_t)))
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  /* an older daemon would take the request for a protocol error and end
   * the session */
  if (!(c->features & TENSORBROKER__V1__FEATURE__FEATURE_BUFFER_LIST))
    rc = tb__set_error(c, TB_ENOTSUP,
                       "the daemon does not list buffers: it is older than "
                       "the buffers view (no FEATURE_BUFFER_LIST)");
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_BUFFERS;
  r.list_buffers = &lb;
  if (rc == 0)
    rc = id_pages_get(c, &r, &p, struct_size, (void **)out, count);
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

int tb_channel_drop(tb_client *c, const char *channel) {
  Tensorbroker__V1__DropChannel dc = TENSORBROKER__V1__DROP_CHANNEL__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  tb__server_message *m = NULL;
  int fds[TB__MAX_FDS], nfds = 0, rc;

  if (c == NULL)
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  if (tb__name_check(channel, TB_NAME_MAX) < 0) {
    rc = tb__set_error(c, TB_ENAME, "invalid channel name");
    goto out_unlock;
  }
  rc = need_operator_view(c, "drop channels");
  if (rc < 0)
    goto out_unlock;
  dc.channel = (char *)channel;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_DROP_CHANNEL;
  r.drop_channel = &dc;
  rc = tb__call(c, &r, NULL, 0, 0, &m, fds, &nfds);
  if (rc < 0)
    goto out_unlock;
  for (int i = 0; i < nfds; i++)
    close(fds[i]);
  tb__msg_free(c, m);
out_unlock:
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

/* Pages of one snapshot: each continues where the last ended, and all
 * must agree on the total. A daemon that dropped the snapshot meanwhile
 * (TB_ESTALE: too many held, docs/protocol.md) is asked for a new one. */
static int metrics_pages(struct tb_client *c, char **text, size_t *len) {
  Tensorbroker__V1__Metrics mq = TENSORBROKER__V1__METRICS__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  char *buf = NULL;
  uint64_t total = 0;
  int rc = 0, more = 1;

  r.body_case = TENSORBROKER__V1__REQUEST__BODY_METRICS;
  r.metrics = &mq;
  mq.offset = 0;
  while (rc == 0 && more) {
    const Tensorbroker__V1__MetricsReply *mr;
    tb__server_message *m = NULL;

    rc = ask(c, &r, TENSORBROKER__V1__REPLY__BODY_METRICS, &m);
    if (rc < 0)
      break;
    mr = m->reply->metrics;
    if (mr == NULL || mr->offset != mq.offset ||
        (mq.offset == 0 ? mr->total > SIZE_MAX - 1 : mr->total != total) ||
        mr->text.len > mr->total - mq.offset ||
        (mr->more && mr->text.len == 0) ||
        (!mr->more && mq.offset + mr->text.len != mr->total)) {
      rc = tb__set_error(c, TB_EPROTO, "metrics page out of step with its "
                                       "snapshot");
    } else {
      if (mq.offset == 0) {
        total = mr->total;
        free(buf);
        buf = malloc((size_t)total + 1);
        if (buf == NULL)
          rc = TB_ENOMEM;
      }
      if (rc == 0 && mr->text.len > 0)
        memcpy(buf + mq.offset, mr->text.data, mr->text.len);
      mq.offset += mr->text.len;
      more = mr->more;
    }
    tb__msg_free(c, m);
  }
  if (rc < 0) {
    free(buf);
    return rc;
  }
  buf[total] = '\0';
  *text = buf;
  *len = (size_t)total;
  return 0;
}

int tb_daemon_metrics(tb_client *c, char **text, size_t *len) {
  char *t = NULL;
  size_t n = 0;
  int rc = TB_ESTALE;

  if (c == NULL || text == NULL)
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  if (!(c->features & TENSORBROKER__V1__FEATURE__FEATURE_METRICS)) {
    /* an older daemon would take the request for a protocol error */
    rc = tb__set_error(c, TB_ENOTSUP, "the daemon does not serve metrics "
                                      "(it is older than this library)");
    goto out_unlock;
  }
  for (int attempt = 0; attempt < 3 && rc == TB_ESTALE; attempt++)
    rc = metrics_pages(c, &t, &n);
  if (rc == 0) {
    *text = t;
    if (len != NULL)
      *len = n;
  }
out_unlock:
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}
