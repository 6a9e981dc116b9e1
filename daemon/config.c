/* Limits and their defaults. */
#include "config.h"

#include <stddef.h>

#include "tb_proto.h"

#define LIMIT(name, def, min, max, help)                                     \
  {"max-" #name, offsetof(struct tbd_limits, max_##name), def, min, max, help}

const struct tbd_limit_desc tbd_limit_table[] = {
    LIMIT(message, TB__DEFAULT_MAX_MESSAGE, 4096, TB__MAX_MESSAGE_HARD,
          "bytes in one datagram"),
    LIMIT(ndim, TB__DEFAULT_MAX_NDIM, 1, TB__MAX_NDIM_HARD,
          "dimensions of a tensor"),
    LIMIT(name, TB__DEFAULT_MAX_NAME, 1, TB__DEFAULT_MAX_NAME,
          "bytes in a channel name"),
    LIMIT(metadata, TB__DEFAULT_MAX_METADATA, 0, TB__MAX_MESSAGE_HARD / 2,
          "bytes of user metadata per version"),
    LIMIT(channels, 4096, 1, 1u << 20, "channels"),
    LIMIT(sessions, 4096, 1, 1u << 20, "sessions"),
    LIMIT(buffers, 1024, 1, 1u << 20, "buffers per session"),
    LIMIT(events, 1024, 1, 1u << 20, "events per session"),
    LIMIT(leases, 4096, 1, 1u << 20, "leases per session"),
    LIMIT(subscriptions, 1024, 1, 1u << 20, "subscriptions per session"),
    LIMIT(history, 64, 1, 1u << 16, "history depth of a channel"),
    LIMIT(outq, 1u << 20, 4096, 1u << 30,
          "bytes queued for a slow session before it is dropped"),
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
