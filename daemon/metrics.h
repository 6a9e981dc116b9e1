/* SPDX-License-Identifier: Apache-2.0 */
/* The daemon's metrics (docs/deploy.md, "Metrics"): the counters that are
 * not the registry's own sizes (the request-handling latency histogram,
 * the implicit-stream calls of sessions that ended, by name), the
 * snapshots a session is being sent in pages, and the rendering of it all
 * in the Prometheus text exposition format 0.0.4.
 *
 * The counters are plain integers bumped where the events happen
 * (registry.c, handlers.c, server.c); nothing here runs on the acquire and
 * release path but tbd_latency_observe(). One thread, as the registry. */
#ifndef TBD_METRICS_H
#define TBD_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct tbd_registry;
struct tbd_session;

/* Upper bounds (nanoseconds, inclusive) of the latency histogram's
 * buckets; a last one, +Inf, takes the rest. */
#define TBD_LATENCY_BUCKETS 14
extern const uint64_t tbd_latency_bounds_ns[TBD_LATENCY_BUCKETS];

struct tbd_latency {
  uint64_t count[TBD_LATENCY_BUCKETS + 1]; /* per bucket, not cumulative */
  uint64_t sum_ns;
};

/* Count one request handled in ns nanoseconds. */
static inline void tbd_latency_observe(struct tbd_latency *h, uint64_t ns) {
  unsigned i = 0;

  while (i < TBD_LATENCY_BUCKETS && ns > tbd_latency_bounds_ns[i])
    i++;
  h->count[i]++;
  h->sum_ns += ns;
}

/* Request types by Request.body case (10..26 today); 0 counts the rest
 * (a request without a known body). */
#define TBD_REQUEST_TYPES 32

/* Implicit-stream calls of ended sessions are kept for this many distinct
 * client names; those of further names are only summed (the metric
 * tensorbroker_implicit_stream_calls_unlisted_total). */
#define TBD_METRICS_NAMES 1024
/* Snapshots held for sessions paging through Metrics, all together: past
 * it the oldest is dropped (its session is told to start again). */
#define TBD_METRICS_HELD_MAX (64u << 20)

struct tbd_metrics_name;
struct tbd_metrics_snap;

struct tbd_metrics {
  int64_t start_unix_ms;          /* wall clock when the registry started */
  struct tbd_metrics_name *names; /* ended sessions' implicit-stream calls */
  uint32_t nnames;
  uint64_t names_unlisted;        /* calls of names past TBD_METRICS_NAMES */
  struct tbd_metrics_snap *snaps; /* held snapshots, oldest first */
  size_t snap_bytes;
};

void tbd_metrics_init(struct tbd_metrics *m);
/* Free the names and every snapshot. */
void tbd_metrics_fini(struct tbd_metrics *m);

/* Session s is ending: keep its implicit-stream calls under its name and
 * drop the snapshot it was being sent. */
void tbd_metrics_session_closed(struct tbd_registry *r, struct tbd_session *s);

/* The whole exposition, rendered now: *text (malloc'ed, NUL-terminated,
 * the caller frees it) and its length. 0 or TB_ENOMEM. viewer: the session
 * that asks, whose access rules leave out the channels it may not list
 * and other uids' client names; NULL (the HTTP endpoint, which the
 * operator opened): everything. */
int tbd_metrics_render(struct tbd_registry *r, struct tbd_session *viewer,
                       char **text, size_t *len);

/* Answer Metrics{offset} from s (docs/protocol.md, "Introspection"):
 * offset 0 takes a new snapshot, any other continues the one held for s.
 * Returns the status sent. */
int tbd_metrics_request(struct tbd_registry *r, struct tbd_session *s,
                        uint64_t request_id, uint64_t offset);

#endif /* TBD_METRICS_H */
