/* SPDX-License-Identifier: Apache-2.0 */
/* Internal to the registry: what each uid holds, and the checks that bound
 * every resource per session, per uid and in total (docs/limits.md). The
 * objects carry the counts' owners: a session its uid's entry, a buffer and
 * a channel theirs (they may outlive the session that made them). */
#ifndef TBD_QUOTA_H
#define TBD_QUOTA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "hash.h"

struct tbd_registry;
struct tbd_session;
struct tbd_channel;

/* Resources counted per uid. Waits are not here: a session has at most
 * one, so the session limits bound them. */
enum tbd_res {
  TBD_RES_SESSIONS, /* sessions that said Hello (not operator ones) */
  TBD_RES_CHANNELS, /* channels published, or closed last, by the uid */
  TBD_RES_BUFFERS,  /* registered, or retired and still used */
  TBD_RES_EVENTS,
  TBD_RES_LEASES,
  TBD_RES_SUBS,
  TBD_RES_COUNT
};

/* Which limits a check looks at, and which one was reached. */
enum {
  TBD_SCOPE_SESSION = 1,
  TBD_SCOPE_UID = 2,
  TBD_SCOPE_TOTAL = 4,
  TBD_SCOPE_ALL = 7
};

struct tbd_uid {
  uid_t uid;
  uint32_t conns;             /* sessions open, with or without Hello */
  uint32_t n[TBD_RES_COUNT];
  uint64_t outq;              /* bytes queued for its sessions (server) */
  UT_hash_handle hh;          /* registry->uids, by uid */
};

/* uid's entry, made if there is none; NULL when out of memory. */
struct tbd_uid *tbd__uid_get(struct tbd_registry *r, uid_t uid);
/* Free u once nothing counts against it any more. NULL is fine. */
void tbd__uid_put(struct tbd_registry *r, struct tbd_uid *u);
bool tbd__uid_limited(const struct tbd_registry *r, const struct tbd_uid *u);

/* Whether one more of res fits s (may be NULL: no session limit), its uid
 * u (NULL: no uid limit) and the daemon, looking at the limits in scopes.
 * 0, or TB_ELIMIT with why naming the limit ("uid 1000 has 4096 buffers
 * (--max-buffers-per-uid)") and *hit (may be NULL) the scope reached. */
int tbd__limit_check(const struct tbd_registry *r,
                     const struct tbd_session *s, const struct tbd_uid *u,
                     enum tbd_res res, unsigned scopes, char *why,
                     size_t len, unsigned *hit);

/* At Hello: 0 when s may become a session (counted), else TB_ELIMIT with
 * why. Past a session limit, or refused by the server, root and the
 * daemon's uid get one of --operator-sessions. */
int tbd__session_admit(struct tbd_registry *r, struct tbd_session *s,
                       char *why, size_t len);
/* s, which said Hello, ends: its count goes. */
void tbd__session_uncount(struct tbd_registry *r, struct tbd_session *s);

/* Before s registers a buffer that brings nfds descriptors to keep (a
 * memfd: 1, or 2 when consumers may write it): 0, or TB_ELIMIT with why.
 * A full uid, daemon or descriptor budget first frees closed channels that
 * hold retired buffers, oldest first. */
int tbd__buffer_admit(struct tbd_registry *r, struct tbd_session *s,
                      uint32_t nfds, char *why, size_t len);

/* Before s becomes the publisher of channel ch (NULL: a new channel): 0,
 * or TB_ELIMIT with why. A full channel table (the daemon's or the uid's)
 * first frees the oldest closed channel nobody leases from or waits on. */
int tbd__channel_admit(struct tbd_registry *r, struct tbd_session *s,
                       struct tbd_channel *ch, char *why, size_t len);
/* s became ch's publisher: counted for s and its uid, off the closed list. */
void tbd__channel_taken(struct tbd_registry *r, struct tbd_channel *ch,
                        struct tbd_session *s);
/* ch's publisher s ended: onto the closed list, oldest first. */
void tbd__channel_left(struct tbd_registry *r, struct tbd_channel *ch,
                       struct tbd_session *s);
/* ch is being freed: its counts go. */
void tbd__channel_gone(struct tbd_registry *r, struct tbd_channel *ch);

/* Free the oldest closed channel, other than keep, that nobody leases from
 * or waits on: of uid u (NULL: any), and when for_buffer, one that holds a
 * retired buffer (of u). Returns whether one was freed. */
bool tbd__channel_reclaim(struct tbd_registry *r, const struct tbd_uid *u,
                          bool for_buffer, const struct tbd_channel *keep);

#endif /* TBD_QUOTA_H */
