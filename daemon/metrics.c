/* SPDX-License-Identifier: Apache-2.0 */
/* The Prometheus text exposition (format 0.0.4) of the registry's sizes and
 * counters, and the paging of it over the protocol. docs/deploy.md,
 * "Metrics", lists every metric; keep the two in step. */
#include "metrics.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tensorbroker/tensorbroker.h>

#include "kinds.h"
#include "registry_impl.h"

const uint64_t tbd_latency_bounds_ns[TBD_LATENCY_BUCKETS] = {
    1000,     2500,     5000,      10000,     25000,    50000,     100000,
    250000,   500000,   1000000,   2500000,   10000000, 100000000, 1000000000};

/* The same bounds as the le label writes them, in seconds. */
static const char *const latency_le[TBD_LATENCY_BUCKETS] = {
    "1e-06",  "2.5e-06", "5e-06", "1e-05", "2.5e-05", "5e-05", "0.0001",
    "0.00025", "0.0005", "0.001", "0.0025", "0.01",   "0.1",   "1"};

/* Request.body cases by the label value tensorbroker_requests_total gives
 * them; the rest count as "unknown". */
static const struct {
  int body_case;
  const char *name;
} request_types[] = {
#define T(c, n) {TENSORBROKER__V1__REQUEST__BODY_##c, n}
    T(HELLO, "hello"),
    T(BUFFER_REGISTER, "buffer_register"),
    T(BUFFER_UNREGISTER, "buffer_unregister"),
    T(EVENT_REGISTER, "event_register"),
    T(EVENT_UNREGISTER, "event_unregister"),
    T(PUBLISH, "publish"),
    T(ACQUIRE, "acquire"),
    T(RELEASE, "release"),
    T(SUBSCRIBE, "subscribe"),
    T(UNSUBSCRIBE, "unsubscribe"),
    T(LIST_CHANNELS, "list_channels"),
    T(LIST_SESSIONS, "list_sessions"),
    T(STATUS, "status"),
    T(FORGET, "forget"),
    T(WAIT_FREE, "wait_free"),
    T(GOODBYE, "goodbye"),
    T(METRICS, "metrics"),
    T(LIST_LEASES, "list_leases"),
    T(LIST_WAITS, "list_waits"),
    T(DROP_CHANNEL, "drop_channel"),
    T(LIST_BUFFERS, "list_buffers"),
    T(CANCEL, "cancel"),
#undef T
};
_Static_assert(TENSORBROKER__V1__REQUEST__BODY_CANCEL < TBD_REQUEST_TYPES,
               "a Request.body case beyond tensorbroker_requests_total's "
               "counters: raise TBD_REQUEST_TYPES");

struct tbd_metrics_name {
  char name[64];
  uint64_t calls;
  UT_hash_handle hh;
};

struct tbd_metrics_snap {
  struct tbd_session *s;
  char *text;
  size_t len;
  struct tbd_metrics_snap *next, *prev; /* metrics.snaps, oldest first */
};

void tbd_metrics_init(struct tbd_metrics *m) {
  struct timespec ts;

  memset(m, 0, sizeof(*m));
  if (clock_gettime(CLOCK_REALTIME, &ts) == 0)
    m->start_unix_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void snap_drop(struct tbd_metrics *m, struct tbd_metrics_snap *sn) {
  DL_DELETE(m->snaps, sn);
  m->snap_bytes -= sn->len;
  sn->s->metrics_snap = NULL;
  tbd_free(sn->text);
  tbd_free(sn);
}

void tbd_metrics_fini(struct tbd_metrics *m) {
  struct tbd_metrics_name *n, *tmp;

  while (m->snaps != NULL)
    snap_drop(m, m->snaps);
  HASH_ITER(hh, m->names, n, tmp) {
    HASH_DEL(m->names, n);
    tbd_free(n);
  }
  m->nnames = 0;
}

/* Add calls to name's count in table *h (of *n entries, at most max; the
 * calls of a name that does not fit go to *unlisted). */
static void name_add(struct tbd_metrics_name **h, uint32_t *n, uint32_t max,
                     const char *name, uint64_t calls, uint64_t *unlisted) {
  struct tbd_metrics_name *e;

  HASH_FIND_STR(*h, name, e);
  if (e == NULL && *n < max && (e = tbd_calloc(1, sizeof(*e))) != NULL) {
    snprintf(e->name, sizeof(e->name), "%s", name);
    tbd_hash_oom = 0;
    HASH_ADD_STR(*h, name, e);
    if (tbd_hash_oom) {
      tbd_free(e);
      e = NULL;
    } else {
      (*n)++;
    }
  }
  if (e != NULL)
    e->calls += calls;
  else
    *unlisted += calls;
}

void tbd_metrics_session_closed(struct tbd_registry *r,
                                struct tbd_session *s) {
  struct tbd_metrics *m = &r->metrics;

  if (s->metrics_snap != NULL)
    snap_drop(m, s->metrics_snap);
  if (s->hello && s->implicit_stream_calls > 0)
    name_add(&m->names, &m->nnames, TBD_METRICS_NAMES, s->name,
             s->implicit_stream_calls, &m->names_unlisted);
}

/* ---- rendering ---- */

/* The text being rendered; failed once an allocation failed. */
struct out {
  char *p;
  size_t len, cap;
  bool failed;
};

static bool out_room(struct out *o, size_t more) {
  size_t cap = o->cap ? o->cap : 16384;
  char *p;

  if (o->failed)
    return false;
  if (o->len + more + 1 <= o->cap)
    return true;
  while (cap < o->len + more + 1)
    cap *= 2;
  p = tbd_malloc(cap);
  if (p == NULL) {
    o->failed = true;
    return false;
  }
  if (o->len > 0)
    memcpy(p, o->p, o->len);
  tbd_free(o->p);
  o->p = p;
  o->cap = cap;
  return true;
}

static void put(struct out *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void put(struct out *o, const char *fmt, ...) {
  va_list ap;
  int n;

  va_start(ap, fmt);
  n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || !out_room(o, (size_t)n))
    return;
  va_start(ap, fmt);
  vsnprintf(o->p + o->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  o->len += (size_t)n;
}

/* A label value, escaped as the format asks: backslash, double quote and
 * line feed. (Channel and client names are printable ASCII already.) */
static void put_value(struct out *o, const char *v) {
  for (; *v != '\0'; v++) {
    if (!out_room(o, 2))
      return;
    if (*v == '\\' || *v == '"')
      o->p[o->len++] = '\\';
    if (*v == '\n') {
      o->p[o->len++] = '\\';
      o->p[o->len++] = 'n';
      continue;
    }
    o->p[o->len++] = *v;
  }
}

static void family(struct out *o, const char *name, const char *type,
                   const char *help) {
  put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metric(struct out *o, const char *name, const char *type,
                   const char *help, uint64_t value) {
  family(o, name, type, help);
  put(o, "%s %llu\n", name, (unsigned long long)value);
}

/* name{label="value"} n */
static void labelled(struct out *o, const char *name, const char *label,
                     const char *value, uint64_t n) {
  put(o, "%s{%s=\"", name, label);
  put_value(o, value);
  put(o, "\"} %llu\n", (unsigned long long)n);
}

static void render_info(struct out *o, struct tbd_registry *r) {
  family(o, "tensorbroker_build_info", "gauge",
         "The daemon's version and protocol; the value is 1.");
  put(o, "tensorbroker_build_info{version=\"");
  put_value(o, TB_VERSION_STRING);
  put(o, "\",protocol=\"%d\"} 1\n", TB_PROTOCOL_VERSION);
  family(o, "tensorbroker_start_time_seconds", "gauge",
         "When the daemon started, in seconds since the Unix epoch.");
  put(o, "tensorbroker_start_time_seconds %lld.%03lld\n",
      (long long)(r->metrics.start_unix_ms / 1000),
      (long long)(r->metrics.start_unix_ms % 1000));
}

/* tensorbroker_buffers, and their bytes, by memory kind: one line per
 * row of the kind table, labelled as the library and tbctl name the kind
 * (kind="host", "cuda-ipc", "cuda-vmm", "cuda-host"), 0 included. */
static void render_buffer_kinds(struct out *o, struct tbd_registry *r) {
  static const struct {
    const char *family, *help;
  } fam[2] = {
      {"tensorbroker_buffers_by_kind", "tensorbroker_buffers by memory kind."},
      {"tensorbroker_buffer_bytes_by_kind",
       "Bytes of those buffers by memory kind, as registered."},
  };
  struct tbd_buffer *b, *tmp;

  for (int f = 0; f < 2; f++) {
    family(o, fam[f].family, "gauge", fam[f].help);
    for (size_t i = 0; i < tbd_kind_count(); i++) {
      const struct tbd_kind *k = tbd_kind_at(i);
      uint64_t v = 0;
      HASH_ITER(hh, r->buffers, b, tmp) {
        if (b->kind == k->kind)
          v += f == 0 ? 1 : b->size;
      }
      labelled(o, fam[f].family, "kind", k->label, v);
    }
  }
}

static void render_sizes(struct out *o, struct tbd_registry *r) {
  struct tbd_counts c;

  tbd_registry_counts(r, &c);
  metric(o, "tensorbroker_sessions", "gauge", "Sessions that said Hello.",
         r->nhello + r->noperators);
  metric(o, "tensorbroker_connections", "gauge",
         "Open connections, with or without Hello.", c.sessions);
  metric(o, "tensorbroker_channels", "gauge",
         "Channels, open or closed, the daemon keeps.", c.channels);
  metric(o, "tensorbroker_versions", "gauge",
         "Versions held: in a channel's history, or out of it but leased.",
         c.versions);
  metric(o, "tensorbroker_leases", "gauge", "Leases held by consumers.",
         c.leases);
  metric(o, "tensorbroker_buffers", "gauge",
         "Buffers registered, or retired but still used by a version.",
         c.buffers);
  render_buffer_kinds(o, r);
  metric(o, "tensorbroker_events", "gauge", "CUDA events registered.",
         c.events);
  metric(o, "tensorbroker_subscriptions", "gauge", "Subscriptions.",
         c.subscriptions);
  metric(o, "tensorbroker_waits", "gauge",
         "Requests parked: acquires waiting for a version, WaitFree for a "
         "free.",
         c.waits);
  metric(o, "tensorbroker_descriptors", "gauge",
         "Descriptors held for clients (connections, memfds, queued).",
         r->fds_held);
}

static void render_counters(struct out *o, struct tbd_registry *r) {
  const struct tbd_stats *st = &r->stats;
  uint64_t known = 0;

  metric(o, "tensorbroker_publishes_total", "counter", "Versions published.",
         st->publishes);
  metric(o, "tensorbroker_acquires_total", "counter", "Leases granted.",
         st->acquires);
  metric(o, "tensorbroker_releases_total", "counter",
         "Leases ended by their holder's Release (also one riding on an "
         "Acquire); not those of sessions that ended.",
         st->releases);
  metric(o, "tensorbroker_wait_frees_total", "counter",
         "WaitFree requests answered that their version was freed.",
         st->wait_frees);
  metric(o, "tensorbroker_denials_total", "counter",
         "Requests refused by access control.", st->denials);
  family(o, "tensorbroker_requests_total", "counter",
         "Requests handled, by type.");
  for (size_t i = 0; i < sizeof(request_types) / sizeof(request_types[0]);
       i++) {
    uint64_t n = st->by_type[request_types[i].body_case];
    known += n;
    labelled(o, "tensorbroker_requests_total", "type", request_types[i].name,
             n);
  }
  labelled(o, "tensorbroker_requests_total", "type", "unknown",
           st->requests - known);
  metric(o, "tensorbroker_bad_messages_total", "counter",
         "Protocol errors: datagrams that did not decode or broke the "
         "protocol's rules (the session was closed).",
         st->bad_messages);
  metric(o, "tensorbroker_sessions_dropped_total", "counter",
         "Sessions the daemon closed: protocol errors, full queues.",
         st->sessions_dropped);
  metric(o, "tensorbroker_sessions_died_total", "counter",
         "Sessions that hung up without the Goodbye they promised (a "
         "crash, a kill, an exit without closing); their done events are "
         "not waited for.",
         st->sessions_died);
  metric(o, "tensorbroker_busy_polls_total", "counter",
         "Periods of busy polling after a request (--busy-poll).",
         st->busy_polls);
  family(o, "tensorbroker_busy_poll_seconds_total", "counter",
         "Wall time of the busy-polling periods that ended, in seconds "
         "(the CPU they took is at most this).");
  put(o, "tensorbroker_busy_poll_seconds_total %llu.%09llu\n",
      (unsigned long long)(st->busy_poll_ns / 1000000000u),
      (unsigned long long)(st->busy_poll_ns % 1000000000u));
}

static void render_latency(struct out *o, struct tbd_registry *r) {
  const struct tbd_latency *h = &r->stats.latency;
  const char *name = "tensorbroker_request_duration_seconds";
  uint64_t cum = 0;

  family(o, name, "histogram",
         "Time the daemon took to decode and handle a request, in seconds "
         "(a request that parks: until it parked).");
  for (unsigned i = 0; i < TBD_LATENCY_BUCKETS; i++) {
    cum += h->count[i];
    put(o, "%s_bucket{le=\"%s\"} %llu\n", name, latency_le[i],
        (unsigned long long)cum);
  }
  cum += h->count[TBD_LATENCY_BUCKETS];
  put(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
  put(o, "%s_sum %llu.%09llu\n", name,
      (unsigned long long)(h->sum_ns / 1000000000u),
      (unsigned long long)(h->sum_ns % 1000000000u));
  put(o, "%s_count %llu\n", name, (unsigned long long)cum);
}

static int ptr_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a;
  uintptr_t y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

/* Bytes of the distinct buffers ch's versions are in (bufs: room for
 * ch->nversions pointers). */
static uint64_t channel_bytes(const struct tbd_channel *ch,
                              struct tbd_buffer **bufs) {
  struct tbd_version *v;
  uint64_t sum = 0;
  size_t n = 0;

  DL_FOREACH(ch->versions, v) {
    if (n < ch->nversions)
      bufs[n++] = v->buf;
  }
  qsort(bufs, n, sizeof(*bufs), ptr_cmp);
  for (size_t i = 0; i < n; i++)
    if (i == 0 || bufs[i] != bufs[i - 1])
      sum += bufs[i]->size;
  return sum;
}

static int channel_cmp(const void *a, const void *b) {
  const struct tbd_channel *x = *(const struct tbd_channel *const *)a;
  const struct tbd_channel *y = *(const struct tbd_channel *const *)b;
  return strcmp(x->name, y->name);
}

/* One family with a line per channel of all (n of them). */
enum channel_value { CH_VERSIONS, CH_LEASES, CH_BYTES, CH_PUBLISHES,
                     CH_PUBLISHER };

static void channel_family(struct out *o, struct tbd_channel **all, size_t n,
                           const uint64_t *bytes, enum channel_value what) {
  static const char *const names[] = {
      "tensorbroker_channel_versions", "tensorbroker_channel_leases",
      "tensorbroker_channel_bytes", "tensorbroker_channel_publishes_total",
      "tensorbroker_channel_publisher_connected"};
  static const char *const helps[] = {
      "Versions the channel holds (history, and leased ones out of it).",
      "Leases on the channel's versions.",
      "Bytes of the distinct buffers the channel's held versions are in.",
      "Versions published to the channel since the daemon created it.",
      "1 while the channel's publisher is connected, else 0 (closed)."};

  family(o, names[what], what == CH_PUBLISHES ? "counter" : "gauge",
         helps[what]);
  for (size_t i = 0; i < n; i++) {
    const struct tbd_channel *ch = all[i];
    uint64_t v = what == CH_VERSIONS  ? ch->nversions
                 : what == CH_LEASES  ? ch->nleases
                 : what == CH_BYTES   ? bytes[i]
                 : what == CH_PUBLISHES ? ch->publishes
                                        : ch->publisher != NULL;
    labelled(o, names[what], "channel", ch->name, v);
  }
}

static int render_channels(struct out *o, struct tbd_registry *r,
                           struct tbd_session *viewer) {
  struct tbd_channel **all, *ch;
  struct tbd_buffer **bufs = NULL;
  uint64_t *bytes;
  size_t n = 0, most = 0;
  int rc = 0;

  all = tbd_calloc(r->nchannels + 1, sizeof(*all));
  bytes = tbd_calloc(r->nchannels + 1, sizeof(*bytes));
  if (all == NULL || bytes == NULL) {
    rc = TB_ENOMEM;
    goto out_free;
  }
  for (ch = r->channels; ch != NULL && n < r->nchannels; ch = ch->hh.next) {
    /* a channel the viewer may not list is left out (access control) */
    if (viewer != NULL &&
        !tbd__access_quiet(r, viewer, TBD_ACL_LIST, ch->name, ch))
      continue;
    all[n++] = ch;
    if (ch->nversions > most)
      most = ch->nversions;
  }
  qsort(all, n, sizeof(*all), channel_cmp);
  bufs = tbd_calloc(most + 1, sizeof(*bufs));
  if (bufs == NULL) {
    rc = TB_ENOMEM;
    goto out_free;
  }
  for (size_t i = 0; i < n; i++)
    bytes[i] = channel_bytes(all[i], bufs);
  for (enum channel_value w = CH_VERSIONS; w <= CH_PUBLISHER; w++)
    channel_family(o, all, n, bytes, w);
out_free:
  tbd_free(bufs);
  tbd_free(bytes);
  tbd_free(all);
  return rc;
}

static int name_cmp(const void *a, const void *b) {
  const struct tbd_metrics_name *x = *(const struct tbd_metrics_name *const *)a;
  const struct tbd_metrics_name *y = *(const struct tbd_metrics_name *const *)b;
  return strcmp(x->name, y->name);
}

/* Implicit-stream calls by client name: the ended sessions' kept counts
 * plus the live sessions', summed in a table made for this rendering. */
static int render_implicit(struct out *o, struct tbd_registry *r,
                           struct tbd_session *viewer) {
  const struct tbd_metrics *m = &r->metrics;
  struct tbd_metrics_name *h = NULL, *e, *tmp, **sorted = NULL;
  uint64_t unlisted = m->names_unlisted, lost = 0;
  uint32_t n = 0;
  size_t k = 0;
  struct tbd_session *s;
  /* a viewer that may not see other uids' sessions gets its own uid's
   * live sessions' names only (ended ones are kept by name alone) */
  bool all = viewer == NULL || tbd__access_all_sessions(r, viewer);
  int rc = 0;

  for (e = all ? m->names : NULL; e != NULL; e = e->hh.next)
    name_add(&h, &n, UINT32_MAX, e->name, e->calls, &lost);
  for (s = r->sessions; s != NULL; s = s->hh.next)
    if (s->hello && s->implicit_stream_calls > 0 &&
        (all || s->uid == viewer->uid))
      name_add(&h, &n, UINT32_MAX, s->name, s->implicit_stream_calls, &lost);
  if (lost > 0) { /* a table entry could not be allocated */
    rc = TB_ENOMEM;
    goto out_free;
  }
  sorted = tbd_calloc(n + 1, sizeof(*sorted));
  if (sorted == NULL) {
    rc = TB_ENOMEM;
    goto out_free;
  }
  for (e = h; e != NULL; e = e->hh.next)
    sorted[k++] = e;
  qsort(sorted, k, sizeof(*sorted), name_cmp);
  family(o, "tensorbroker_implicit_stream_calls_total", "counter",
         "Calls that relied on the stream contract's default stream, by "
         "client name, summed over the sessions of that name, ended ones "
         "included.");
  for (size_t i = 0; i < k; i++)
    labelled(o, "tensorbroker_implicit_stream_calls_total", "name",
             sorted[i]->name, sorted[i]->calls);
  metric(o, "tensorbroker_implicit_stream_calls_unlisted_total", "counter",
         "Implicit-stream calls of ended sessions whose names did not fit "
         "the daemon's table of 1024 names.",
         unlisted);
out_free:
  tbd_free(sorted);
  HASH_ITER(hh, h, e, tmp) {
    HASH_DEL(h, e);
    tbd_free(e);
  }
  return rc;
}

int tbd_metrics_render(struct tbd_registry *r, struct tbd_session *viewer,
                       char **text, size_t *len) {
  struct out o = {0};
  int rc;

  render_info(&o, r);
  render_sizes(&o, r);
  render_counters(&o, r);
  render_latency(&o, r);
  rc = render_channels(&o, r, viewer);
  if (rc == 0)
    rc = render_implicit(&o, r, viewer);
  if (rc == 0 && (o.failed || !out_room(&o, 0)))
    rc = TB_ENOMEM;
  if (rc < 0) {
    tbd_free(o.p);
    return rc;
  }
  o.p[o.len] = '\0';
  *text = o.p;
  *len = o.len;
  return 0;
}

/* ---- paging over the protocol ---- */

/* Replace s's snapshot with a new one. Held snapshots past
 * TBD_METRICS_HELD_MAX are dropped, oldest first. */
static int snap_take(struct tbd_registry *r, struct tbd_session *s) {
  struct tbd_metrics *m = &r->metrics;
  struct tbd_metrics_snap *sn;
  int rc;

  if (s->metrics_snap != NULL)
    snap_drop(m, s->metrics_snap);
  sn = tbd_calloc(1, sizeof(*sn));
  if (sn == NULL)
    return TB_ENOMEM;
  rc = tbd_metrics_render(r, s, &sn->text, &sn->len);
  if (rc < 0) {
    tbd_free(sn);
    return rc;
  }
  while (m->snaps != NULL && m->snap_bytes + sn->len > TBD_METRICS_HELD_MAX)
    snap_drop(m, m->snaps);
  sn->s = s;
  s->metrics_snap = sn;
  DL_APPEND(m->snaps, sn);
  m->snap_bytes += sn->len;
  return 0;
}

int tbd_metrics_request(struct tbd_registry *r, struct tbd_session *s,
                        uint64_t request_id, uint64_t offset) {
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Tensorbroker__V1__MetricsReply mr = TENSORBROKER__V1__METRICS_REPLY__INIT;
  /* as the lists: a page leaves room for the reply around it */
  size_t room = (size_t)r->lim.max_message - 512, n;
  struct tbd_metrics_snap *sn;
  int rc;

  if (offset == 0) {
    rc = snap_take(r, s);
    if (rc < 0)
      return tbd__reply_status(r, s, request_id, rc, "out of memory");
  }
  sn = s->metrics_snap;
  if (sn == NULL || offset > sn->len)
    return tbd__reply_status(r, s, request_id, TB_ESTALE,
                             "no metrics snapshot to continue at offset %llu "
                             "(it was sent whole, replaced or dropped): ask "
                             "again from offset 0",
                             (unsigned long long)offset);
  n = sn->len - offset < room ? sn->len - offset : room;
  rep.request_id = request_id;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_METRICS;
  rep.metrics = &mr;
  mr.text.data = (uint8_t *)sn->text + offset;
  mr.text.len = n;
  mr.offset = offset;
  mr.total = sn->len;
  mr.more = offset + n < sn->len;
  tbd__send_reply(r, s, &rep, NULL, 0);
  if (!mr.more)
    snap_drop(&r->metrics, sn);
  return 0;
}
