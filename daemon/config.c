/* SPDX-License-Identifier: Apache-2.0 */
/* Limits and their defaults. */
#include "config.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>

#include "tb_proto.h"

#define LIMIT(name, def, min, max, help)                                     \
  {"max-" #name, offsetof(struct tbd_limits, max_##name), def, min, max, help}
#define ROW(flag, name, def, min, max, help)                                 \
  {flag, offsetof(struct tbd_limits, max_##name), def, min, max, help}

const struct tbd_limit_desc tbd_limit_table[] = {
    LIMIT(message, TB__DEFAULT_MAX_MESSAGE, 4096, TB__MAX_MESSAGE_HARD,
          "bytes in one datagram"),
    LIMIT(ndim, TB__DEFAULT_MAX_NDIM, 1, TB__MAX_NDIM_HARD,
          "dimensions of a tensor"),
    LIMIT(name, TB__DEFAULT_MAX_NAME, 1, TB__DEFAULT_MAX_NAME,
          "bytes in a channel name"),
    LIMIT(metadata, TB__DEFAULT_MAX_METADATA, 0, TB__MAX_MESSAGE_HARD - 4096,
          "bytes of user metadata per version"),
    LIMIT(channels, 4096, 1, 1u << 20, "channels in the daemon"),
    LIMIT(sessions, 4096, 1, 1u << 20, "sessions (connections that said Hello)"),
    LIMIT(buffers, 1024, 1, 1u << 20, "buffers per session"),
    LIMIT(events, 1024, 1, 1u << 20, "events per session"),
    LIMIT(leases, 4096, 1, 1u << 20, "leases per session"),
    LIMIT(subscriptions, 1024, 1, 1u << 20, "subscriptions per session"),
    LIMIT(waits, 64, 1, 1u << 16,
          "parked requests per session (acquires waiting for a version, "
          "WaitFree)"),
    LIMIT(history, 64, 1, 1u << 16, "history depth of a channel"),
    LIMIT(outq, 1u << 20, 4096, 1u << 30,
          "bytes queued for a slow session before it is dropped"),
    /* per uid and in total: docs/limits.md */
    ROW("max-sessions-per-uid", sessions_uid, 1024, 1, 1u << 20,
        "sessions of one uid"),
    ROW("max-channels-per-session", channels_session, 1024, 1, 1u << 20,
        "channels one session publishes"),
    ROW("max-channels-per-uid", channels_uid, 1024, 1, 1u << 20,
        "channels of one uid (its sessions', and those closed last by it)"),
    ROW("max-buffers-per-uid", buffers_uid, 4096, 1, 1u << 20,
        "buffers of one uid (retired ones still used count)"),
    ROW("max-buffers-total", buffers_total, 16384, 1, 1u << 22,
        "buffers in the daemon"),
    ROW("max-events-per-uid", events_uid, 4096, 1, 1u << 20,
        "events of one uid"),
    ROW("max-events-total", events_total, 16384, 1, 1u << 22,
        "events in the daemon"),
    ROW("max-leases-per-uid", leases_uid, 16384, 1, 1u << 22,
        "leases of one uid"),
    ROW("max-leases-total", leases_total, 65536, 1, 1u << 24,
        "leases in the daemon"),
    ROW("max-subscriptions-per-uid", subscriptions_uid, 4096, 1, 1u << 20,
        "subscriptions of one uid"),
    ROW("max-subscriptions-total", subscriptions_total, 16384, 1, 1u << 22,
        "subscriptions in the daemon"),
    ROW("max-outq-per-uid", outq_uid, 16u << 20, 4096, 1u << 31,
        "bytes queued for one uid's slow sessions; past it the largest "
        "queue's session is dropped"),
    ROW("max-outq-total", outq_total, 64u << 20, 4096, 1u << 31,
        "bytes queued for all slow sessions; past it the largest queue's "
        "session is dropped"),
    ROW("max-done-events", done_events, 128, 1, 8000,
        "distinct done events one version keeps; more are dropped and its "
        "producer told"),
    {"closed-history", offsetof(struct tbd_limits, closed_history), 1, 0,
     1u << 16,
     "versions a channel keeps once its producer ended (memory that "
     "outlives it; 0: none)"},
    {"max-fds", offsetof(struct tbd_limits, max_fds), 0, 0, 1u << 24,
     "file descriptors the daemon may use (0: raise the soft limit to the "
     "hard RLIMIT_NOFILE)"},
    {"fd-reserve", offsetof(struct tbd_limits, fd_reserve), 64, 8, 65536,
     "descriptors kept for new connections, so that they are answered "
     "TB_ELIMIT instead of refused"},
    {"operator-sessions", offsetof(struct tbd_limits, operator_sessions), 8,
     0, 1024,
     "sessions beyond the session limits for root and the daemon's uid"},
    {"hello-timeout", offsetof(struct tbd_limits, hello_timeout_ms), 10000, 0,
     3600000, "milliseconds a new connection has to say Hello (0: no limit)"},
    {"busy-poll", offsetof(struct tbd_limits, busy_poll_us), TB__POLL_AUTO_US,
     0, 1000000,
     "microseconds the daemon keeps polling after a request before it "
     "sleeps (0: sleep at once; spends CPU for latency); the default, also "
     "'auto', polls only while the daemon may use 4 or more CPUs"},
};

const unsigned tbd_limit_count =
    sizeof(tbd_limit_table) / sizeof(tbd_limit_table[0]);

uint32_t *tbd_limit_field(struct tbd_limits *l,
                          const struct tbd_limit_desc *d) {
  return (uint32_t *)((char *)l + d->offset);
}

void tbd_limits_default(struct tbd_limits *l) {
  for (unsigned i = 0; i < tbd_limit_count; i++)
    *tbd_limit_field(l, &tbd_limit_table[i]) = tbd_limit_table[i].def;
  l->busy_poll_auto = 1;
}

int tbd_limit_needs_restart(const struct tbd_limit_desc *d) {
  switch (d->offset) {
  case offsetof(struct tbd_limits, max_message):
  case offsetof(struct tbd_limits, max_ndim):
  case offsetof(struct tbd_limits, max_name):
  case offsetof(struct tbd_limits, max_metadata):
  case offsetof(struct tbd_limits, max_fds):
  case offsetof(struct tbd_limits, fd_reserve):
    return 1;
  default:
    return 0;
  }
}

int tbd_parse_u32(const char *s, int base, uint32_t min, uint32_t max,
                  uint32_t *out) {
  char *end;
  unsigned long v;

  if (s == NULL || *s < '0' || *s > '9')
    return -1;
  errno = 0;
  v = strtoul(s, &end, base);
  if (errno != 0 || *end != '\0' || v < min || v > max)
    return -1;
  *out = (uint32_t)v;
  return 0;
}
