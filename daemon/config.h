/* The daemon's limits and settings, with their defaults (docs/protocol.md's
 * limits table). */
#ifndef TBD_CONFIG_H
#define TBD_CONFIG_H

#include <stddef.h>
#include <stdint.h>

struct tbd_limits {
  uint32_t max_message;       /* bytes in one datagram */
  uint32_t max_ndim;
  uint32_t max_name;
  uint32_t max_metadata;      /* bytes */
  uint32_t max_channels;
  uint32_t max_sessions;
  uint32_t max_buffers;       /* per session */
  uint32_t max_events;        /* per session */
  uint32_t max_leases;        /* per session */
  uint32_t max_subscriptions; /* per session */
  uint32_t max_history;
  uint32_t max_outq;          /* bytes queued per session */
  uint32_t hello_timeout_ms;  /* a new connection's time to say Hello; 0: none */
  uint32_t busy_poll_us;      /* keep polling this long after activity; 0: off */
  /* not in the table: */
  uint32_t busy_poll_auto; /* 1 (default, or --busy-poll auto): poll only
                              while the daemon may run on
                              TB__POLL_AUTO_CPUS CPUs or more */
};

/* One row per limit: flag name, field, default, smallest and largest value
 * accepted. main.c builds its options and --help from this table. */
struct tbd_limit_desc {
  const char *flag;
  size_t offset;
  uint32_t def;
  uint32_t min;
  uint32_t max;
  const char *help;
};

extern const struct tbd_limit_desc tbd_limit_table[];
extern const unsigned tbd_limit_count;

void tbd_limits_default(struct tbd_limits *l);
uint32_t *tbd_limit_field(struct tbd_limits *l, const struct tbd_limit_desc *d);

#endif /* TBD_CONFIG_H */
