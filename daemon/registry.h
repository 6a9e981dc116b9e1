/* SPDX-License-Identifier: Apache-2.0 */
/* The broker's state: sessions, channels, versions, buffers, events, leases,
 * subscriptions and parked waits. Sans-I/O: it never touches a socket. It
 * talks back through an emit callback (one ServerMessage, plus descriptors,
 * for one session) and reads time through a clock callback, so that the
 * unit tests drive it with decoded requests and a fake clock.
 *
 * One thread: every function is called from the daemon's loop thread. */
#ifndef TBD_REGISTRY_H
#define TBD_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"
#include "log.h"
#include "metrics.h"
#include "tb_proto.h"

struct tbd_registry;
struct tbd_session;

/* Deliver m to session s with nfds descriptors attached. The descriptors
 * still belong to the registry: the callee must dup them if it keeps them
 * past its return. m is only valid during the call. */
typedef void (*tbd_emit_fn)(void *ud, struct tbd_session *s,
                            const tb__server_message *m, const int *fds,
                            int nfds);
typedef uint64_t (*tbd_clock_fn)(void *ud);

/* Counters since the daemon started (Status, metrics.c). */
struct tbd_stats {
  uint64_t requests;
  uint64_t bad_messages;
  uint64_t sessions_dropped;
  uint64_t sessions_died; /* hung up without the Goodbye they promised */
  uint64_t denials; /* requests refused by access control */
  uint64_t publishes;  /* versions published */
  uint64_t acquires;   /* leases granted */
  uint64_t releases;   /* leases ended by Release (or riding on Acquire) */
  uint64_t wait_frees; /* WaitFree answered: the version was freed */
  uint64_t by_type[TBD_REQUEST_TYPES]; /* requests by Request.body case */
  struct tbd_latency latency; /* request handling, timed by the server */
  /* --busy-poll, timed by the server: how many polling periods began,
   * and the wall time of those that ended (not the CPU time they took) */
  uint64_t busy_polls;
  uint64_t busy_poll_ns;
};

/* Sizes of everything the registry holds (tests and Status). */
struct tbd_counts {
  uint32_t sessions; /* open connections, with or without Hello */
  uint32_t channels;
  uint32_t versions;
  uint32_t buffers;  /* registered or retired but still used */
  uint32_t events;
  uint32_t leases;
  uint32_t subscriptions;
  uint32_t waits;
};

/* Create a registry. limits is copied. Returns 0 or TB_ENOMEM. */
int tbd_registry_new(const struct tbd_limits *limits, tbd_emit_fn emit,
                     void *emit_ud, struct tbd_registry **out);
/* Close every session without notices and free everything. NULL is fine. */
void tbd_registry_free(struct tbd_registry *r);
/* Replace the clock (default: tb__now_ms). */
void tbd_registry_set_clock(struct tbd_registry *r, tbd_clock_fn now,
                            void *ud);
/* Borrowed; reported by Status. */
void tbd_registry_set_socket_path(struct tbd_registry *r, const char *path);
/* New limits (SIGHUP). What exists stays: a session, channel or lease over
 * a lowered limit is kept, and the next request that would add one is
 * refused. The caller keeps what needs a restart unchanged
 * (tbd_limit_needs_restart). */
void tbd_registry_set_limits(struct tbd_registry *r,
                             const struct tbd_limits *limits);
struct tbd_stats *tbd_registry_stats(struct tbd_registry *r);
void tbd_registry_counts(const struct tbd_registry *r, struct tbd_counts *c);

/* A new connection with the peer's credentials. conn is the caller's. */
int tbd_session_open(struct tbd_registry *r, pid_t pid, uid_t uid, gid_t gid,
                     void *conn, struct tbd_session **out);
/* The peer's supplementary groups (SO_PEERGROUPS, taken at accept; n may
 * be 0), copied. 0 or TB_ENOMEM (the session then has none). */
int tbd_session_set_groups(struct tbd_session *s, const gid_t *groups,
                           size_t n);

/* Install access rules (acl.h): the registry owns acl from now on and
 * frees the rules it had. Sessions stay; each later request is judged by
 * the new rules; leases, subscriptions and descriptors already granted
 * stay. Until the first call the rules are an empty set (default =
 * owner). */
struct tbd_acl;
void tbd_registry_set_acl(struct tbd_registry *r, struct tbd_acl *acl);
/* End a session for any reason: release its leases, drop subscriptions and
 * waits, retire its buffers and events, close the channels it published,
 * and notify everyone affected. s is freed. */
void tbd_session_close(struct tbd_registry *r, struct tbd_session *s);
/* Tell the registry not to emit anything to s any more (its connection is
 * going away); the session stays until tbd_session_close(). */
void tbd_session_mute(struct tbd_session *s);
void *tbd_session_conn(const struct tbd_session *s);
uint64_t tbd_session_id(const struct tbd_session *s);
const char *tbd_session_name(const struct tbd_session *s);
pid_t tbd_session_pid(const struct tbd_session *s);
uid_t tbd_session_uid(const struct tbd_session *s);
/* Whether the session said Hello successfully. */
int tbd_session_hello(const struct tbd_session *s);
/* The level its open and close are logged at: info, but debug for
 * connections that never said Hello (probes) and for tbctl's short calls,
 * which would otherwise fill the log of a daemon someone watches. */
enum tbd_log_level tbd_session_log_level(const struct tbd_session *s);
/* The peer hung up (end of stream, or the socket failed), as opposed to
 * the daemon dropping the session (shutdown, a protocol error, a full
 * queue). */
void tbd_session_hung_up(struct tbd_session *s);
/* The peer hung up without the Goodbye it promised (Hello.says_goodbye):
 * it crashed, was killed or exited without closing. */
int tbd_session_abrupt(const struct tbd_session *s);
struct tbd_session *tbd_registry_first_session(struct tbd_registry *r);
struct tbd_session *tbd_session_next(struct tbd_session *s);

/* Handle one decoded request from s. fds (nfds of them) now belong to the
 * registry: it keeps or closes each. The reply, if any, has been emitted
 * when this returns. Returns 0, or a negative code when the session must
 * now be closed: TB_EPROTO for a protocol error (a best-effort reply was
 * emitted), TB_ELIMIT when the daemon is full. */
int tbd_session_request(struct tbd_registry *r, struct tbd_session *s,
                        const tb__request *req, int *fds, int nfds);

/* Emit a Reply{request_id, status=TB_EPROTO, message} and count a bad
 * message (the server calls it for datagrams that do not decode). */
void tbd_session_protocol_error(struct tbd_registry *r, struct tbd_session *s,
                                uint64_t request_id, const char *why);

/* ---- limits (quota.c, docs/limits.md) ---- */

/* The descriptor budget: the registry counts the descriptors held for
 * clients (the server's connections and queued descriptors, the memfds of
 * buffers) against capacity; all is capacity plus the reserve that only
 * new connections may use; nofile and reserve are for messages. Until this
 * is called there is no budget. */
void tbd_registry_set_fds(struct tbd_registry *r, uint32_t capacity,
                          uint32_t all, uint32_t nofile, uint32_t reserve);
uint32_t tbd_registry_fds_held(const struct tbd_registry *r);
/* Count n more held descriptors if they fit the capacity (or, with
 * reserve, the reserve too): 0, or -1 with nothing counted. */
int tbd_registry_fds_take(struct tbd_registry *r, uint32_t n, bool reserve);
void tbd_registry_fds_give(struct tbd_registry *r, uint32_t n);
/* Why no descriptor is left ("the daemon holds N descriptors ..."). */
void tbd_registry_fds_why(const struct tbd_registry *r, char *buf,
                          size_t len);
/* Sessions of uids a and b (root and the daemon's own) may take one of
 * --operator-sessions when every other session would be refused. Without
 * this call, no uid may. */
void tbd_registry_set_operators(struct tbd_registry *r, uid_t a, uid_t b);
/* The bytes queued for the sessions of s's uid: the server's count, kept
 * with the uid's other counts. */
uint64_t *tbd_session_uid_outq(struct tbd_session *s);
/* Whether per-uid limits apply to s (not to root with --exempt-root). */
bool tbd_session_uid_limited(const struct tbd_registry *r,
                             const struct tbd_session *s);
/* s came past a limit the server checks (why says which): its Hello is
 * answered TB_ELIMIT with why, unless it may use an operator session. */
void tbd_session_refuse(struct tbd_session *s, const char *why);
/* The descriptors req carried could not be received: answer it TB_ELIMIT
 * (the session goes on). */
void tbd_session_fds_lost(struct tbd_registry *r, struct tbd_session *s,
                          const tb__request *req);

/* Earliest deadline of a parked wait (clock milliseconds), or UINT64_MAX. */
uint64_t tbd_registry_next_deadline(const struct tbd_registry *r);
/* Answer TB_ETIMEDOUT to every parked wait whose deadline has passed. */
void tbd_registry_expire(struct tbd_registry *r);

/* Send Notice{DaemonClosing} to every session. */
void tbd_registry_broadcast_closing(struct tbd_registry *r,
                                    const char *reason);

#endif /* TBD_REGISTRY_H */
