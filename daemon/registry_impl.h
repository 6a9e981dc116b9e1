/* SPDX-License-Identifier: Apache-2.0 */
/* Internal to the registry and its request handlers (handlers.c): the
 * objects and the state transitions. The registry is one file per object:
 * registry.c (the registry itself and emitting), session.c, channel.c
 * (channels and versions), lease.c, buffer.c (buffers and events), wait.c
 * (parked waits) and subscription.c; docs/internals.md, "The registry's
 * files". */
#ifndef TBD_REGISTRY_IMPL_H
#define TBD_REGISTRY_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "acl.h"
#include "hash.h"
#include "quota.h"
#include "heap.h"
#include "registry.h"
#include "vindex.h"

/* An event as handed to peers; versions keep copies, so an event may be
 * unregistered while versions still name it. */
struct tbd_evinfo {
  uint64_t id;
  uint8_t handle[TB__CUDA_IPC_HANDLE_SIZE];
  int32_t dev_type, dev_id;
  uint8_t uuid[TB__UUID_SIZE];
  size_t uuid_len;
  uint32_t pid;
  bool complete; /* a version's ready event: finished at publish */
  bool owner_died; /* a version's ready event: its producer hung up
                    * without its Goodbye (EventInfo.owner_died) */
  uint64_t shm_id; /* its session's Hello.shm_id (EventInfo.owner_shm_id) */
  uint64_t pidns_id; /* its session's Hello.pidns_id
                      * (EventInfo.owner_pidns_id) */
  /* The signal that stands for it where it cannot be opened (another
   * /dev/shm or PID namespace): a ready event's Publish.ready_signal
   * (slot 0, the buffer's ready word), a done event's largest
   * Release.done_signal in the releasing session's done slot. 0: none. */
  uint64_t signal_value;
  uint32_t signal_slot;
  uint64_t session; /* the session that registered it (it may be gone, or
                     * have unregistered it: versions keep copies) */
};

struct tbd_buffer {
  uint64_t id;
  uint32_t generation;
  struct tbd_session *owner; /* NULL once retired */
  struct tbd_uid *u;         /* counted against it until freed */
  uint32_t owner_pid;
  uint64_t owner_id;         /* that session's id: the buffers view names
                                it while the session lives, retired or
                                not (a copy's buffer is retired at once) */
  int kind;                  /* TENSORBROKER__V1__MEMORY_KIND__*: its row
                                in kinds.h decides what differs by kind */
  uint64_t size;
  /* BufferRegister.signal_offset: the signal area is [signal_offset, size),
   * word 0 the producer's ready counter, word N the done counter of the
   * consumer session given done slot N (tbd_sent.slot); 0: none */
  uint64_t signal_offset;
  uint64_t next_slot;        /* the next done slot to give (from 1): a
                                slot is never given twice, so that its
                                counter only grows, even when a dead
                                session's queued write lands late */
  bool slots_warned;         /* running out of slots was logged */
  /* its producer's Hello.shm_id and pidns_id, kept since the session may
   * be gone when a consumer acquires: who is told to use signals */
  uint64_t owner_shm_id, owner_pidns_id;
  int fd;                    /* the daemon's own descriptor (kinds that
                                carry one: HOST_MEMFD), or -1 */
  int rofd;                  /* consumers-may-write HOST_MEMFD: a read-only
                                one for consumers not granted write, or -1 */
  int32_t dev_type, dev_id;
  uint8_t uuid[TB__UUID_SIZE];
  size_t uuid_len;
  uint8_t handle[TB__CUDA_IPC_HANDLE_SIZE];
  size_t handle_len;
  bool writable;
  bool retired;              /* no new publish; freed with its last version */
  uint8_t *info;             /* its BufferInfo packed with fd_attached false
                                (built at the first acquire), or NULL */
  size_t info_len;
  uint8_t *info_ro;          /* the same with writable false, for consumers
                                not granted write (writable buffers only) */
  size_t info_ro_len;
  uint32_t nversions;        /* live versions that refer to it */
  uint32_t nleases;          /* leases of those versions (the buffers
                                view: counted here, not looked for) */
  UT_hash_handle hh;         /* registry->buffers, by id */
  struct tbd_buffer *snext, *sprev; /* owner->buffers */
};

struct tbd_event {
  struct tbd_evinfo info;
  struct tbd_session *owner;
  UT_hash_handle hh;         /* registry->events, by info.id */
  struct tbd_event *snext, *sprev;
};

struct tbd_lease;
struct tbd_wait;

struct tbd_version {
  struct tbd_channel *ch;
  uint64_t number;
  struct tbd_buffer *buf;
  uint64_t publisher_id;     /* session id; it may have gone */
  uint8_t *layout;           /* packed Layout behind its varint length, as
                                the value of AcquireReply.layout is sent */
  size_t layout_len;         /* prefix included */
  uint8_t *meta;
  size_t meta_len;
  bool has_ready;
  struct tbd_evinfo ready;
  struct tbd_evinfo *done;   /* consumers' done events, each once */
  size_t ndone;              /* at most --max-done-events */
  uint32_t done_dropped;     /* distinct events past it, not kept */
  bool in_history;            /* in ch->history */
  bool died;                 /* its memory died with its producer (out of
                                history, kept while leased): never
                                granted again */
  uint32_t nleases;
  struct tbd_lease *leases;  /* vnext/vprev */
  struct tbd_wait *free_waits; /* its WaitFree waits, in arrival order */
  struct tbd_version *next, *prev; /* ch->versions, oldest first */
  struct tbd_version *hnext, *hprev; /* ch->history, oldest first */
};

/* The history versions of a channel that died with the last producer
 * that ended with any (of one kind): numbers first..last, where those not
 * held any more died, so that EXACT can say so after they were freed. */
struct tbd_died {
  uint64_t first, last;      /* last 0, or first > last: none */
  int kind;
  uint32_t pid;              /* their producer's */
};

/* A channel stays while the daemon runs, once created: its version numbers
 * continue across producers (docs/daemon.md, "When a producer ends"). */
struct tbd_channel {
  char *name;
  UT_hash_handle hh;         /* registry->channels, by name */
  uid_t owner;               /* the uid that first published it (acl.h) */
  struct tbd_session *publisher; /* NULL: closed */
  bool closed;
  struct tbd_uid *u;         /* counted against its (last) publisher's uid */
  bool on_closed_list;
  struct tbd_channel *cnext, *cprev; /* registry->closed, oldest first */
  /* its last publisher, once it ended: for the TB_ECLOSED of an acquire
   * that finds nothing to grant */
  uint32_t ended_pid;
  bool ended_abrupt;         /* without the Goodbye it promised */
  struct tbd_died died;
  uint64_t latest;
  uint32_t depth;
  uint64_t publishes;
  uint32_t nversions;
  uint32_t nleases;
  /* every live version: in the history, or out of it but leased */
  struct tbd_version *versions;
  struct tbd_vindex index;   /* the same, by number */
  /* those in the history (nhistory of them): a publish trims the oldest */
  struct tbd_version *history;
  uint32_t nhistory;
};

struct tbd_lease {
  uint64_t id;
  struct tbd_session *s;
  struct tbd_version *v;
  uint64_t since;            /* clock ms at the grant */
  UT_hash_handle hh;         /* registry->leases, by id */
  struct tbd_lease *snext, *sprev, *vnext, *vprev;
};

struct tbd_subgroup;

struct tbd_sub {
  char *name;
  struct tbd_session *s;
  struct tbd_subgroup *g;
  UT_hash_handle hh;         /* s->subs, by name */
  struct tbd_sub *gnext, *gprev;
};

/* All subscriptions to one name, so a publish finds its subscribers. */
struct tbd_subgroup {
  char *name;
  UT_hash_handle hh;         /* registry->subgroups, by name */
  struct tbd_sub *members;
};

/* Buffers this session has been sent; fd_current: it holds a mapping (no
 * Forget since the descriptor was last attached). */
/* A session that was sent some done events of another (VersionFree,
 * WaitFreeReply): told of them again when that one dies (EventsGone). */
struct tbd_told {
  uint64_t session_id;
  UT_hash_handle hh;
};

struct tbd_sent {
  uint64_t buffer_id;
  bool fd_current;
  bool write;                /* the descriptor last attached was the
                                read-write one (write granted) */
  uint32_t slot;             /* its done slot in the buffer's signal area
                                (AcquireReply.done_slot), 0: none; kept
                                as long as the record */
  UT_hash_handle hh;
};

enum tbd_wait_kind { TBD_WAIT_ACQUIRE = 1, TBD_WAIT_FREE = 2 };

/* The acquires parked on one channel name (which may not exist yet), so
 * that a publish looks at those it answers and no others. */
struct tbd_waitq {
  char *name;
  UT_hash_handle hh;         /* registry->waitqs, by name */
  /* LATEST, and NEXT after a number already published: the next publish
   * answers them all, in arrival order */
  struct tbd_wait *ready;
  /* NEXT after a number not yet published, by (version, seq): the
   * publish of version + 1 answers them */
  struct tbd_heap later;
  uint32_t n;                /* both together */
};

struct tbd_wait {
  enum tbd_wait_kind kind;
  struct tbd_session *s;
  uint64_t request_id;
  int mode;
  uint64_t version;
  uint64_t deadline;         /* UINT64_MAX: none */
  uint64_t since;            /* clock ms when it was parked */
  uint64_t seq;              /* arrival order */
  struct tbd_heap_node by_deadline; /* registry->deadlines, unless none */
  struct tbd_heap_node by_version;  /* q->later, or not in a heap */
  struct tbd_waitq *q;       /* ACQUIRE */
  struct tbd_version *v;     /* FREE: the version waited for */
  struct tbd_wait *next, *prev; /* q->ready, or v->free_waits */
  struct tbd_wait *snext, *sprev; /* s->waits */
};

struct tbd_session {
  uint64_t id;
  UT_hash_handle hh;         /* registry->sessions, by id */
  void *conn;
  pid_t pid;
  uid_t uid;
  gid_t gid;
  gid_t *groups;              /* supplementary, from SO_PEERGROUPS */
  size_t ngroups;
  bool denied;                /* a denial of it was logged at warn */
  char name[64];
  bool hello;
  bool muted;
  uint64_t mark;              /* to notify each session once */
  /* The channel of this session's last acquire, while registry's
   * channel_frees is recent_frees (tbd__channel_recent). */
  struct tbd_channel *recent;
  uint64_t recent_frees;
  int contract;
  uint32_t memory_kinds;
  bool prefetch;              /* Hello.prefetch: buffers in NewVersion */
  bool says_goodbye;          /* Hello.says_goodbye */
  uint64_t shm_id;            /* Hello.shm_id */
  uint64_t pidns_id;          /* Hello.pidns_id */
  bool said_goodbye;          /* its Goodbye came: closing on purpose */
  bool hung_up;               /* the peer ended the connection */
  bool operator_slot;         /* admitted past the limits (quota.c) */
  char refuse[256];           /* the server refuses it: why ("": not) */
  struct tbd_uid *u;          /* its uid's counts */
  uint32_t nleases, nbuffers, nevents, nsubs;
  uint32_t nchannels;         /* channels it publishes */
  uint64_t implicit_stream_calls;
  uint64_t requests;
  struct tbd_lease *leases;
  struct tbd_buffer *buffers;
  struct tbd_event *events;
  struct tbd_sub *subs;
  struct tbd_sent *sent;
  struct tbd_told *told;      /* sessions sent its done events */
  struct tbd_wait *waits;    /* its parked requests, in arrival order */
  uint32_t nwaits;           /* at most --max-waits */
  struct tbd_metrics_snap *metrics_snap; /* Metrics being paged out */
};

struct tbd_registry {
  struct tbd_limits lim;
  tbd_emit_fn emit;
  void *emit_ud;
  tbd_clock_fn now;
  void *now_ud;
  const char *socket_path;
  uint64_t start_ms;
  struct tbd_stats stats;
  struct tbd_metrics metrics;
  struct tbd_session *sessions;
  uint32_t nsessions, nhello;
  struct tbd_channel *channels;
  uint32_t nchannels, nversions;
  uint64_t channel_frees; /* channels freed so far */
  struct tbd_buffer *buffers;
  uint32_t nbuffers;
  struct tbd_event *events;
  uint32_t nevents;
  struct tbd_lease *leases;
  uint32_t nleases;
  /* In leases from creation to free, never handed out (id 0, no session):
   * uthash frees a table whose last entry goes and allocates it again
   * for the next, which a session that releases its one lease as it
   * acquires the next (Acquire.release_lease_id) did on every request.
   * Whoever finds a lease by id must not take this one. */
  struct tbd_lease anchor;
  struct tbd_lease *spare; /* freed leases kept for reuse, by snext */
  uint32_t nspare;
  struct tbd_subgroup *subgroups;
  uint32_t nsubs;
  struct tbd_waitq *waitqs;
  struct tbd_heap deadlines; /* waits with a deadline, soonest first */
  uint32_t nwaits;
  uint64_t wait_seq;
  uint64_t mark_seq;
  /* quota.c */
  struct tbd_uid *uids;
  struct tbd_channel *closed; /* closed channels, oldest first */
  uint32_t noperators;
  bool has_operators;
  uid_t operator_uid[2];
  uint32_t fds_held, fd_capacity, fd_all, fd_nofile, fd_reserve;
  uint64_t next_session_id, next_buffer_id, next_event_id, next_lease_id;
  struct tbd_acl *acl;       /* access rules (access.c), never NULL */
};

/* ---- access control (access.c) ---- */

/* Whether s may do act on channel name (ch: it, or NULL when it was never
 * published). 0, or TB_EPERM with msg ("uid 1001 may not acquire
 * \"cam/front\": rule [access \"cam/\"] acquire = group:video", verb
 * saying what was asked), counted in stats.denials and logged: at warn the
 * session's first time, then at debug. */
int tbd__access(struct tbd_registry *r, struct tbd_session *s,
                enum tbd_acl_action act, const char *verb, const char *name,
                const struct tbd_channel *ch, char *msg, size_t len);
/* The same without counting or logging: for filters (lists, notices,
 * Hello's latest versions) that leave out what s may not see. */
bool tbd__access_quiet(struct tbd_registry *r, struct tbd_session *s,
                       enum tbd_acl_action act, const char *name,
                       const struct tbd_channel *ch);
/* Whether s is an operator (root, the daemon's uid, `operators`). */
bool tbd__access_operator(struct tbd_registry *r, struct tbd_session *s);
/* Whether s may see sessions of other uids in ListSessions. */
bool tbd__access_all_sessions(struct tbd_registry *r, struct tbd_session *s);
/* Whether s is shown a name only waited for (ListChannels{waiting}): an
 * operator, under default = open, or when a session of its uid waits. */
bool tbd__access_waiting(struct tbd_registry *r, struct tbd_session *s,
                         const struct tbd_waitq *q);
/* Whether s is shown a lease or a parked request of session holder on
 * channel ch (NULL: a name not published yet): its own uid's, an
 * operator, under default = open, and on a channel s may list. */
bool tbd__access_sees(struct tbd_registry *r, struct tbd_session *s,
                      const struct tbd_session *holder,
                      const struct tbd_channel *ch);
/* The same for what a session of uid made or holds that outlives it, or
 * that no one channel names (a buffer: its producer's uid). */
bool tbd__access_sees_uid(struct tbd_registry *r, struct tbd_session *s,
                          uid_t uid, const struct tbd_channel *ch);

/* ---- helpers shared by the registry's files and handlers.c ---- */

uint64_t tbd__now(struct tbd_registry *r);
void tbd__emit(struct tbd_registry *r, struct tbd_session *s,
               Tensorbroker__V1__ServerMessage *m, const int *fds, int nfds);
void tbd__send_reply(struct tbd_registry *r, struct tbd_session *s,
                     Tensorbroker__V1__Reply *rep, const int *fds, int nfds);
/* Reply {request_id, status, message}; returns status. Nothing is sent
 * for request_id 0 (one-way) unless status is TB_EPROTO. */
int tbd__reply_status(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t request_id, int status, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

void tbd__emit_notice(struct tbd_registry *r, struct tbd_session *s,
                      Tensorbroker__V1__Notice *n);
void tbd__wait_remove(struct tbd_registry *r, struct tbd_wait *w);
/* s, the publisher of ch, ended: notify subscribers and lease holders
 * (ChannelClosed with reason; unfinished: ChannelClosed.unfinished_version,
 * 0 for none), then drop from the history the versions whose memory died
 * with s (tbd_kind_survives_producer), freeing those nobody leases.
 * Acquires waiting on ch stay parked: a new producer may take it over. */
void tbd__channel_close(struct tbd_registry *r, struct tbd_channel *ch,
                        const struct tbd_session *s, const char *reason,
                        uint64_t unfinished);

struct tbd_channel *tbd__channel_find(struct tbd_registry *r,
                                      const char *name);
/* Whether closed channel ch may be freed: nobody leases any of its
 * versions or waits on it (an acquire, or a WaitFree on a version). */
bool tbd__channel_idle(struct tbd_registry *r, const struct tbd_channel *ch);
/* Free idle closed channel ch with its versions (quota.c reclaims). */
void tbd__channel_drop(struct tbd_registry *r, struct tbd_channel *ch);
struct tbd_session *tbd__session_find(struct tbd_registry *r, uint64_t id);
void tbd__evinfo_to_pb(const struct tbd_evinfo *e,
                       Tensorbroker__V1__EventInfo *pb,
                       Tensorbroker__V1__Device *dev);

/* A NewVersion and the storage it points into. */
struct tbd_new_version {
  Tensorbroker__V1__NewVersion nv;
  Tensorbroker__V1__EventInfo ei;
  Tensorbroker__V1__Device edev;
  ProtobufCMessageUnknownField uf;
  uint8_t bibuf[256]; /* a BufferInfo is < 170 bytes */
};

/* Fill out with v's NewVersion as s is to hear of it. A session that asked
 * for prefetch (Hello.prefetch) and maps the buffer's kind also gets the
 * version's buffer, if its kind is sent with a prefetch (CUDA IPC:
 * kinds.h, prefetch_with_notice), the first time it hears of it, and the
 * ready event with it: it may open both before it acquires. The buffer is
 * then recorded as sent, so that its BufferRetired reaches the session.
 * Returns whether the buffer went in (not for other kinds, a buffer sent
 * before, or out of memory: the
 * acquire brings it then, as without prefetch). out must outlive the
 * message's packing. */
bool tbd__new_version_fill(struct tbd_registry *r, struct tbd_session *s,
                           struct tbd_version *v,
                           struct tbd_new_version *out);
/* The channel's newest version that may be granted (its memory did not
 * die with its producer), or NULL. */
struct tbd_version *tbd__channel_newest(struct tbd_channel *ch);

/* Buffers and events. */
int tbd__buffer_add(struct tbd_registry *r, struct tbd_session *s,
                    struct tbd_buffer *b);
void tbd__buffer_retire(struct tbd_registry *r, struct tbd_buffer *b);
int tbd__event_add(struct tbd_registry *r, struct tbd_session *s,
                   struct tbd_event *e);
void tbd__event_remove(struct tbd_registry *r, struct tbd_event *e);

/* Publish a validated version; on success writes its number. ready_signal
 * (0: none) is the value of the buffer's ready word that stands for ready,
 * sent on as its EventInfo.signal_value. Nothing changes on failure
 * (TB_ENOMEM, TB_ELIMIT, TB_EBUSY). */
int tbd__publish(struct tbd_registry *r, struct tbd_session *s,
                 const char *channel, struct tbd_buffer *b,
                 const Tensorbroker__V1__Layout *layout,
                 const struct tbd_event *ready, bool ready_complete,
                 uint64_t ready_signal, const uint8_t *meta,
                 size_t meta_len, uint32_t depth, uint64_t *version,
                 char *why, size_t whylen);
/* The channel named name when it is the one of s's last acquire (no
 * lookup, and its name is known to be valid), else NULL. */
struct tbd_channel *tbd__channel_recent(struct tbd_registry *r,
                                        struct tbd_session *s,
                                        const char *name);
/* Whether the access rules let s acquire channel (ch: it, or NULL when it
 * does not exist): 0, or TB_EPERM replied to request_id (counted and
 * logged). Every caller of tbd__acquire judges first, once. */
int tbd__acquire_judge(struct tbd_registry *r, struct tbd_session *s,
                       uint64_t request_id, const char *channel,
                       const struct tbd_channel *ch);
/* Answer an Acquire now, park it, or fail: the reply is always emitted
 * (or the wait parked). Returns the status sent (0 when parked). */
int tbd__acquire(struct tbd_registry *r, struct tbd_session *s,
                 uint64_t request_id, const char *channel, int mode,
                 uint64_t version, int64_t timeout_ms);
/* End a lease; done may be NULL. With done, signal (0: none) is the done
 * signal its stream writes to done slot slot of the lease's buffer: the
 * version's entry for done keeps the slot and the largest signal of its
 * releases. TB_ENOMEM leaves the lease. */
int tbd__lease_release(struct tbd_registry *r, struct tbd_lease *l,
                       const struct tbd_event *done, uint32_t slot,
                       uint64_t signal);
int tbd__subscribe(struct tbd_registry *r, struct tbd_session *s,
                   const char *name);
int tbd__unsubscribe(struct tbd_registry *r, struct tbd_session *s,
                     const char *name);
int tbd__wait_free(struct tbd_registry *r, struct tbd_session *s,
                   uint64_t request_id, const char *channel, uint64_t version,
                   int64_t timeout_ms);

/* ---- between the registry's files ---- */

/* channel.c: free v once it left the history and its last lease ended
 * (its VersionFree goes out; its buffer goes with its last version once
 * retired). */
void tbd__version_maybe_free(struct tbd_registry *r, struct tbd_version *v);
/* channel.c: version number of ch, granted or not, or NULL. */
struct tbd_version *tbd__version_find(struct tbd_channel *ch,
                                      uint64_t number);
/* channel.c: the version an acquire is granted now, or NULL: never one
 * whose memory died with its producer. */
struct tbd_version *tbd__version_match(struct tbd_channel *ch, int mode,
                                       uint64_t version);

/* buffer.c: free retired b once no version uses it (BufferRetired to the
 * sessions it was sent to). */
void tbd__buffer_maybe_free(struct tbd_registry *r, struct tbd_buffer *b);
/* buffer.c: pack b's BufferInfo once (write: as registered, else with
 * writable false). 0 or TB_ENOMEM. */
int tbd__buffer_info_pack(struct tbd_buffer *b, bool write);
/* buffer.c: that BufferInfo as a length-delimited field value (with
 * fd_attached when attach) into out, which has room for b->info_len + 16
 * bytes. Returns the length. */
size_t tbd__buffer_info_field(const struct tbd_buffer *b, bool write,
                              bool attach, uint8_t *out);

/* lease.c: TB_ECLOSED for an acquire that finds nothing to grant on ch,
 * whose producer is gone. after: NEXT's version, else 0. */
int tbd__reply_no_producer(struct tbd_registry *r, struct tbd_session *s,
                           uint64_t request_id, const struct tbd_channel *ch,
                           int mode, uint64_t after);

/* wait.c: the order of registry->deadlines (soonest, then arrival). */
bool tbd__wait_deadline_less(const struct tbd_heap_node *a,
                             const struct tbd_heap_node *b);
/* wait.c: the acquires parked on name, or NULL. */
struct tbd_waitq *tbd__waitq_find(struct tbd_registry *r, const char *name);
/* wait.c: park an acquire on channel (ch: it, or NULL when it does not
 * exist yet), or reply why not (TB_ELIMIT: the session has --max-waits
 * parked; TB_ENOMEM), changing nothing. Returns the status sent (0:
 * parked). */
int tbd__acquire_park(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t request_id, const char *channel,
                      const struct tbd_channel *ch, int mode, uint64_t after,
                      int64_t timeout_ms);
/* wait.c: Cancel{request_id}: drop s's parked requests of that id (one,
 * unless the client reused the id) without a reply; nothing when there is
 * none (answered already). */
void tbd__wait_cancel(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t request_id);
/* wait.c: answer the acquires parked on q that ch's new version
 * satisfies, in arrival order; q is freed with its last wait. */
void tbd__waitq_publish(struct tbd_registry *r, struct tbd_waitq *q,
                        struct tbd_channel *ch);

/* subscription.c: s's NewVersion notice of v, unless s may not acquire
 * from v's channel. */
void tbd__new_version_notify(struct tbd_registry *r, struct tbd_session *s,
                             struct tbd_version *v);

/* ---- the operator's view (operator.c) ---- */

/* Lists come in pages that fit one datagram (the room left for entries),
 * sorted, after a cursor; the reply says when entries were left out. */
#define TBD_LIST_ROOM(r) ((size_t)(r)->lim.max_message - 512)

/* A page of a list reply: entries (protobuf-c messages of one type) made
 * from rows, as many as fit one datagram, and pointers to them. */
struct tbd_list_page {
  void *infos;  /* the entries */
  void **ptrs;  /* ptrs[i] = entry i, for the reply's repeated field */
  size_t n;     /* entries that fit */
  bool more;    /* rows were left out: the client asks again after the
                 * last one */
};
/* Make the page of nrows rows (row_size bytes apart, sorted, after the
 * cursor): fill(r, row, info) makes the entry (info_size bytes) of each
 * row in turn until they no longer fit TBD_LIST_ROOM. 0, or TB_ENOMEM
 * with nothing allocated. Free with tbd__list_page_free after sending. */
int tbd__list_page(struct tbd_registry *r, const void *rows, size_t nrows,
                   size_t row_size, size_t info_size,
                   void (*fill)(struct tbd_registry *r, const void *row,
                                void *info),
                   struct tbd_list_page *out);
void tbd__list_page_free(struct tbd_list_page *p);

/* The acquires parked on name (0 when none). */
uint32_t tbd__waiters(struct tbd_registry *r, const char *name);
/* Answer ListLeases, ListWaits, ListBuffers and DropChannel (always with
 * a reply); return the status sent. */
int tbd__list_leases(struct tbd_registry *r, struct tbd_session *s,
                     uint64_t request_id,
                     const Tensorbroker__V1__ListLeases *q);
int tbd__list_waits(struct tbd_registry *r, struct tbd_session *s,
                    uint64_t request_id, const Tensorbroker__V1__ListWaits *q);
int tbd__list_buffers(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t request_id,
                      const Tensorbroker__V1__ListBuffers *q);
int tbd__drop_channel(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t request_id, const char *name);

#endif /* TBD_REGISTRY_IMPL_H */
