/* SPDX-License-Identifier: Apache-2.0 */
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
  uint32_t max_waits;         /* parked requests per session */
  uint32_t max_history;
  uint32_t max_outq;          /* bytes queued per session */
  uint32_t hello_timeout_ms;  /* a new connection's time to say Hello; 0: none */
  uint32_t busy_poll_us;      /* keep polling this long after activity; 0: off */
  /* Per uid and in total (docs/limits.md); the per-session ones above. */
  uint32_t max_sessions_uid;
  uint32_t max_channels_session; /* channels a session publishes */
  uint32_t max_channels_uid;
  uint32_t max_buffers_uid;   /* registered, or retired but still used */
  uint32_t max_buffers_total;
  uint32_t max_events_uid;
  uint32_t max_events_total;
  uint32_t max_leases_uid;
  uint32_t max_leases_total;
  uint32_t max_subscriptions_uid;
  uint32_t max_subscriptions_total;
  uint32_t max_outq_uid;      /* bytes queued for one uid's sessions */
  uint32_t max_outq_total;    /* bytes queued for all sessions */
  uint32_t max_done_events;   /* distinct done events one version keeps */
  uint32_t closed_history;    /* versions a closed channel keeps */
  uint32_t max_fds;           /* descriptors; 0: the hard RLIMIT_NOFILE */
  uint32_t fd_reserve;        /* descriptors kept for new connections */
  uint32_t operator_sessions; /* sessions past the limits for root and the
                                 daemon's own uid */
  /* not in the table: */
  uint32_t busy_poll_auto; /* 1 (default, or --busy-poll auto): poll only
                              while the daemon may run on
                              TB__POLL_AUTO_CPUS CPUs or more */
  uint32_t exempt_root;    /* --exempt-root: per-uid limits spare uid 0 */
};

/* The most bytes one done event takes in a VersionFree or WaitFreeReply
 * (an EventInfo with every field at its longest, and the field's tag and
 * length), and what such a message needs besides its events. --max-message
 * must hold --max-done-events of them (checked at start). */
#define TBD_DONE_EVENT_BYTES 171
#define TBD_VERSION_FREE_BASE 512

/* A message queued for a session costs its bytes, this much more for the
 * queue entry and the allocator, and TBD_QUEUED_FD_BYTES for each descriptor
 * it carries (a descriptor the daemon holds until the message goes). */
#define TBD_QUEUED_MSG_OVERHEAD 96
#define TBD_QUEUED_FD_BYTES 16384

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
/* Whether a change of d takes effect only at the next start, not at
 * SIGHUP: what clients are told at Hello (max-message, max-ndim, max-name,
 * max-metadata) and the descriptor budget (max-fds, fd-reserve). */
int tbd_limit_needs_restart(const struct tbd_limit_desc *d);

/* A number in base (8, 10) in [min, max] from all of s, which must start
 * with a digit (no sign, no space): 0, or -1 with *out untouched. Options,
 * access rules and listen addresses read their numbers with it. */
int tbd_parse_u32(const char *s, int base, uint32_t min, uint32_t max,
                  uint32_t *out);

#endif /* TBD_CONFIG_H */
