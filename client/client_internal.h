/* SPDX-License-Identifier: Apache-2.0 */
/* Internal: the objects libtensorbroker's files share.
 *
 * Two objects carry a connection:
 *  - struct tb_client (the public handle) holds what only request/reply needs:
 *    the call lock, request ids, the receive buffer, queued notices, the
 *    version-free table, the producer's buffers and the last error. Only the
 *    holder of call_lock reads the socket.
 *  - struct tb__conn is refcounted and shared with every acquired tensor. It
 *    holds the socket (for one-way sends), the consumer mapping cache and the
 *    memory kinds' consumer state, under its own small lock. A tensor deleter
 *    only ever takes conn->lock, never call_lock, so it may run on any thread,
 *    also while another thread is parked in a long tb_acquire(), and after
 *    tb_client_disconnect() (then it sends nothing and only unmaps).
 *
 * A call holds call_lock while it sends, reads and works on a reply, never
 * while it sleeps for one the daemon may take long to send (rpc.c, "Waits
 * without the call lock"): a request the daemon may park (an Acquire or a
 * WaitFree with a timeout) is waited for in poll() on the socket and the
 * waiter's own eventfd with call_lock let go, so the other threads' calls
 * go on meanwhile; whichever thread reads a parked request's reply keeps
 * it for its waiter (c->waiters, by request id) and wakes that one. Several
 * threads may wait so at once, each for its own request, where the daemon
 * parks several per session (FEATURE_MULTI_WAIT); with an older daemon,
 * which parks one, the calls that may park take park_lock first and wait
 * for each other (tb__park_serial). tb_client_poll_notice waits in the
 * same way behind notice_lock.
 * Lock order: park_lock or notice_lock (never both), then call_lock, then
 * conn->lock; nothing blocks on the daemon while holding conn->lock except
 * a one-way sendmsg. */
#ifndef TB_CLIENT_INTERNAL_H
#define TB_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <tensorbroker/tensorbroker.h>
/* A library never exits: when uthash cannot allocate while adding, the
 * table stays as it was and tb__hash_oom is set (per thread) for the
 * caller to see. Usage: tb__hash_oom = 0; HASH_ADD(...); if (tb__hash_oom)
 * <not added>. */
extern _Thread_local int tb__hash_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj)                                             \
  do {                                                                       \
    (void)(obj);                                                             \
    tb__hash_oom = 1;                                                        \
  } while (0)
#include "tb_uthash.h" /* <uthash.h>, cheaper for 8-byte keys */

#include "tb_proto.h"

#define TB__NOTICE_QUEUE_MAX 4096 /* queued notices; oldest dropped first */
#define TB__FREED_TABLE_MAX 1024  /* remembered VersionFree notices */
#define TB__FORGOT_MAX 256        /* versions whose done events were
                                   * forgotten to make room (publish.c) */
#define TB__MAPCACHE_MAX 256      /* cached buffer mappings per connection */
#define TB__LAST_ERROR_MAX 512
#define TB__DEFAULT_TIMEOUT_MS 30000
#define TB__SPIN_US_MAX 1000000 /* tb_connect_options.spin_us */
#define TB__RECV_CAP TB__MAX_MESSAGE_HARD
#define TB__ARENAS 3        /* decoded messages alive at once without malloc */
#define TB__ARENA_SIZE 4096 /* first block of each */

/* Room for each memory kind's state in a client and a connection, indexed
 * by enum tb_memory_kind (kind.c checks its table fits). */
#define TB__KINDS 8

struct tb__map;
struct tb__lease;
struct tb__kind_ops;
struct tb__waiter;

#define TB__WAKE_SPARE 8 /* eventfds kept for the next waiters (rpc.c) */

/* ---- the refcounted connection (conn.c; its socket: rpc.c) ---- */
struct tb__conn {
  pthread_mutex_t lock; /* fd use for one-way sends, closed, maps, kinds */
  int refs;             /* under lock: the client plus one per tensor */
  int fd;
  int closed; /* disconnected by the application: send nothing more */
  int dead;   /* the daemon went away: calls fail with TB_EDISCONNECTED;
               * read and written with __atomic (a deleter may set it) */
  int contract;
  /* The parked requests waited for without the client's call_lock (under
   * it): the mapping cache evicts nothing while there are any
   * (mapcache.c), as a reply may name a buffer the daemon takes for mapped
   * here, and another thread's Forget would leave the acquire without it.
   * Read by tb__map_insert, whose callers hold call_lock. */
  int parked;
  struct tb__map *maps; /* mapcache.c, uthash by buffer id */
  size_t nmaps;
  uint64_t map_clock; /* LRU stamps for the mapping cache */
  /* each memory kind's state of the connection (its conn_free frees it),
   * by enum tb_memory_kind; NULL until the kind is used */
  void *kind[TB__KINDS];
  /* One ended lease's memory kept for the next acquire (lease.c), taken
   * and put back with __atomic_exchange_n; freed with the connection. */
  void *spare_lease;
  /* lease.c, under lock: the leases handed out and not ended (their done
   * events are recorded at disconnect), and those whose end waits for a
   * capture to finish (TB__LEASE_LATER; read unlocked with __atomic as a
   * hint that there is something to retry). */
  struct tb__lease *leases;
  struct tb__lease *later;
  /* rpc.c: the process that connected, the fork count then (another
   * count: this process is a forked child that inherited the connection),
   * and the list of open sockets a child closes (under rpc.c's fork_lock) */
  pid_t pid;
  unsigned fork_gen;
  int fork_tracked;
  struct tb__conn *fork_prev, *fork_next;
};

/* rpc.c, "the socket across fork()". Make k's socket (socket(2) with
 * these arguments, into k->fd) and track it, so that a forked child closes
 * its copy: 0, or -1 with errno; close it and stop tracking it. */
int tb__fork_socket(struct tb__conn *k, int domain, int type, int protocol);
void tb__fork_close(struct tb__conn *k);
extern unsigned tb__fork_generation; /* __atomic; the child's handler adds 1 */

/* Nonzero when k was inherited across fork(): nothing may be sent, locked,
 * recorded or waited for on it (rpc.c says why). */
static inline int tb__conn_forked(const struct tb__conn *k) {
  return k->fork_gen !=
         __atomic_load_n(&tb__fork_generation, __ATOMIC_ACQUIRE);
}

/* Take / drop a reference. The last drop frees the mapping cache and the
 * kinds' state; the socket was closed by tb_client_disconnect(). */
void tb__conn_ref(struct tb__conn *k);
void tb__conn_unref(struct tb__conn *k);
/* The same drop with k->lock held: returns 1 when it was the last, and
 * then the caller, after unlocking, calls tb__conn_free(k). */
int tb__conn_unref_locked(struct tb__conn *k);
void tb__conn_free(struct tb__conn *k);

/* rpc.c: send a one-way request (request_id 0) without the call lock. Returns 0,
 * TB_EDISCONNECTED, or 0 silently when the client was disconnected (the
 * daemon already ended everything the message could end). Caller holds
 * k->lock. */
int tb__conn_send_oneway_locked(struct tb__conn *k, const tb__request *r);

/* ---- a freed version, remembered for tb_wait_free (publish.c) ---- */
struct tb__done_event {
  uint64_t event_id;
  uint8_t handle[TB__CUDA_IPC_HANDLE_SIZE];
  uint8_t uuid[TB__UUID_SIZE];
  uint32_t owner_pid;
  uint64_t owner_shm_id; /* EventInfo.owner_shm_id */
  uint64_t owner_pidns_id; /* EventInfo.owner_pidns_id */
  uint64_t signal_value; /* EventInfo.signal_value: 0 none */
  uint32_t signal_slot;  /* EventInfo.signal_slot */
};

struct tb__freed {
  char *channel;
  uint64_t version;
  uint64_t buffer_id; /* the producer's buffer it was published from */
  size_t n_done;
  struct tb__done_event *done;
  /* consumers' done events the daemon did not keep (--max-done-events):
   * the version cannot be known free */
  uint32_t dropped;
  int waited; /* tb_wait_free waited on its done events at least once */
};

/* ---- the public handle ---- */
struct tb_buffer {
  struct tb_client *c;
  /* the kind whose buffer_destroy frees it (kind.h); NULL: a host buffer,
   * on c->buffers */
  const struct tb__kind_ops *ops;
  struct tb_buffer *prev, *next; /* utlist, c->buffers or the kind's list */
  void *data;
  size_t size;
  uint64_t id;
  int kind;   /* TB_MEMORY_HOST, TB_MEMORY_CUDA_HOST (TB_BUFFER_PINNED) or
               * TB_MEMORY_CUDA_VMM (tb_buffer_create_cuda) */
  int pinned; /* this mapping is cuMemHostRegister'ed (kind_pinned.c) */
};

struct tb_client {
  pthread_mutex_t call_lock; /* serialises request/reply and socket reads */
  pthread_mutex_t park_lock; /* a call that may park, where the daemon
                              * parks one per session (tb__park_serial) */
  pthread_mutex_t notice_lock; /* a tb_client_poll_notice that waits */
  /* rpc.c, "Waits without the call lock", all under call_lock: the calls
   * waiting unlocked for their parked request's reply (each with its
   * eventfd), eventfds kept for the next ones, and the eventfd (-1 until a
   * wait first needs one) of the thread waiting for a notice. */
  struct tb__waiter *waiters;
  int wake_spare[TB__WAKE_SPARE];
  int nwake_spare;
  int notice_wake;
  int notice_waiting; /* a notice poll waits unlocked: wake it */
  uint64_t stashed, notice_wakes; /* hand-overs so far (tests read them) */
  const struct tb__rpc_hooks *hooks; /* client.c's, set at connect */
  struct tb__conn *conn;
  uint64_t next_request_id;
  uint64_t session_id;
  int timeout_ms;
  int rcvtimeo_ms; /* SO_RCVTIMEO now set on the socket; 0: none (forever),
                      -1: unknown (setsockopt failed: use poll) */
  uint64_t spin_ns; /* poll this long before sleeping in a wait; 0: never */
  int spin_auto;    /* the default window: only while CPUs are to spare */
  struct tb__poll_cpus spin_cpus; /* auto: CPUs to spare? */
  uint64_t polled_waits; /* waits that polled first (tests read it) */
  int prefetch;     /* Hello.prefetch (tb_connect_options.no_prefetch) */
  uint32_t max_message;
  uint32_t max_ndim;
  uint32_t max_metadata;
  uint32_t features; /* HelloReply.features: what the daemon implements */
  int interruptible; /* tb_connect_options.interruptible */
  int intr_wait;     /* under call_lock: the wait in progress (a locked
                      * one) ends with TB_EINTR when a signal handler
                      * interrupts it */
  uint8_t *rbuf; /* TB__RECV_CAP bytes */
  uint8_t *sbuf; /* TB__RECV_CAP bytes */
  /* Replies are decoded into one of these (a call made while a reply is
   * still in use, e.g. registering an event during an acquire, takes the
   * next); msg[i] is the message alive in arena[i], NULL when free. */
  struct tb__arena arena[TB__ARENAS];
  tb__server_message *arena_msg[TB__ARENAS];
  struct tb__keep keep[TB__ARENAS]; /* arena[i].keep: sub-messages kept */
  char name_ok[64]; /* the last channel name tb_acquire checked, or "" */

  struct tb_notice *notices; /* ring */
  size_t nq_head, nq_len, nq_cap;

  struct tb__freed freed[TB__FREED_TABLE_MAX]; /* ring */
  size_t fr_head, fr_len;
  /* (channel, version) of entries with done events dropped from the full
   * table: tb_wait_free says they cannot be known free, rather than ask
   * the daemon, which no longer knows them (ring, oldest overwritten) */
  struct {
    char *channel;
    uint64_t version;
  } forgot[TB__FORGOT_MAX];
  size_t fg_next;

  struct tb_buffer *buffers;
  /* each memory kind's state of the client (its client_free frees it), by
   * enum tb_memory_kind; NULL until the kind is used */
  void *kind[TB__KINDS];
  /* hint.c: channels named at connect, their HelloReply entries */
  Tensorbroker__V1__NewVersion **hints;
  size_t n_hints;

  char last_error[TB__LAST_ERROR_MAX];
  size_t last_error_len; /* full length, may exceed the buffer */
  /* this client among all the process has connected (rpc.c, "errors"):
   * a thread's own last error names it, never a freed client's address */
  uint64_t serial;

  /* The socket connected to, and its file's identity then: when the daemon
   * goes away, a socket file with another identity at the same path means
   * it restarted (rpc.c, describe_loss()). sock_path is "" when the
   * socket could not be stat()ed. */
  char sock_path[108];
  dev_t sock_dev;
  ino_t sock_ino;      /* reused at once by ext4: the change time too */
  struct timespec sock_ctime;
  char lost_why[256]; /* why the connection died, "" while it lives */
};

/* ---- the RPC core (rpc.c); all with c->call_lock held ---- */

/* What the RPC core hands up (client.c fills them): a notice read while
 * waiting, and a reply nobody waits for any more (its call timed out) or
 * a one-way request's refusal. */
struct tb__rpc_hooks {
  void (*notice)(struct tb_client *c, const Tensorbroker__V1__Notice *no);
  void (*stale_reply)(struct tb_client *c,
                      const Tensorbroker__V1__Reply *rep);
};

/* This thread's number (thread.c): never 0, and never given to another
 * thread of the process, where a pthread_t is reused by the next thread
 * once its thread has been joined. Names whose per-thread default stream
 * a record, a write or a ring slot was made on. */
uint64_t tb__thread_id(void);

/* Set the last-error text (printf-style), return err. */
int tb__set_error(struct tb_client *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void tb__clear_error(struct tb_client *c);
/* Give a new client its serial (rpc.c, "errors"). */
void tb__client_serial(struct tb_client *c);

/* Send r (its request_id is assigned here) with nfds descriptors, and wait
 * up to extra_ms (<0: forever) plus the client's timeout for its reply,
 * queueing notices read meanwhile. On success *out owns the decoded message
 * (free with tb__msg_free) and any descriptors attached to the
 * reply are in fds and *nfds (caller closes them). A reply with a negative
 * status is returned as that status, with its message kept as last error. */
int tb__call(struct tb_client *c, tb__request *r, const int *send_fds,
             int n_send_fds, long extra_ms, tb__server_message **out,
             int *fds, int *nfds);

/* buffer.c: BufferRegister br, passing fd along (-1: none); the daemon's
 * id for the buffer in *id. BufferUnregister of id. */
int tb__buffer_register(struct tb_client *c,
                        Tensorbroker__V1__BufferRegister *br, int fd,
                        uint64_t *id);
int tb__buffer_unregister(struct tb_client *c, uint64_t id);

/* tb__call in two halves, for a request whose reply is collected later
 * (the daemon answers a session's requests in order): send r and return its
 * id in *id; then wait for the reply with that id as tb__call does. No
 * other request may be sent in between. */
int tb__send_request(struct tb_client *c, tb__request *r, const int *send_fds,
                     int n_send_fds, uint64_t *id);
int tb__await_reply(struct tb_client *c, uint64_t id, long extra_ms,
                    tb__server_message **out, int *fds, int *nfds);
/* Whether the daemon parks one request per session (it lacks
 * FEATURE_MULTI_WAIT): a call that may park then takes park_lock before
 * call_lock, and so waits for the one parked now. */
static inline int tb__park_serial(const struct tb_client *c) {
  return !(c->features & TENSORBROKER__V1__FEATURE__FEATURE_MULTI_WAIT);
}

/* tb__await_reply for a request the daemon may park (Acquire, WaitFree;
 * caller holds park_lock when extra_ms != 0 and tb__park_serial): call_lock
 * is let go while it sleeps (the top comment), and held again when it
 * returns; other threads may wait so at once for their own. On an
 * interruptible client whose daemon takes Cancel, a signal handler
 * interrupting the wait ends it with TB_EINTR, and the request is
 * cancelled (a reply already on its way is handled as a late one). */
int tb__await_parked(struct tb_client *c, uint64_t id, long extra_ms,
                     tb__server_message **out, int *fds, int *nfds);


/* How many of c's waits polled before sleeping (spin_us): for tests. */
uint64_t tb__client_polled_waits(const struct tb_client *c);
/* Replies kept for a parked call by another thread, and notices queued
 * for a thread sleeping in tb_client_poll_notice: for tests. */
void tb__client_handoffs(const struct tb_client *c, uint64_t *stashed,
                         uint64_t *notice_wakes);
/* Pretend the daemon said HelloReply.features: for tests of older daemons. */
void tb__client_set_features(struct tb_client *c, uint32_t features);

/* tb__call for a request whose reply carries no data and no descriptors. */
int tb__call_simple(struct tb_client *c, tb__request *r);

/* The Hello in two halves, so that connect can send the memory kinds'
 * requests (a CUDA done event's registration) before it waits: send it
 * (memory_kinds: Hello.memory_kinds), then read the reply, keeping the
 * session's id, limits and features; the HelloReply in *out (free with
 * tb__msg_free). */
int tb__hello_send(struct tb_client *c, const char *name, int contract,
                   const char *const *channels, size_t n_channels,
                   uint32_t memory_kinds, uint64_t *id);
int tb__hello_reply(struct tb_client *c, uint64_t id,
                    tb__server_message **out);

/* Free a message that tb__call returned. */
void tb__msg_free(struct tb_client *c, tb__server_message *m);

/* Read and dispatch datagrams for up to timeout_ms (<0 forever), stopping
 * after the first one. Returns 1 if one was handled, 0 on timeout, or an
 * error. Used by tb_client_poll_notice. */
int tb__pump(struct tb_client *c, int timeout_ms);

/* The device number of the /dev/shm this process sees (0: none), and the
 * inode of its PID namespace (0: unknown), found once: CUDA interprocess
 * events reach only processes that share both (Hello.shm_id and pidns_id,
 * EventInfo.owner_shm_id and owner_pidns_id; docs/cuda.md, "Across
 * containers"). */
uint64_t tb__shm_id(void);
uint64_t tb__pidns_id(void);
/* Whether an event registered by a session with this Hello.shm_id and
 * pidns_id is out of this process's reach (either known on both sides,
 * and different). */
static inline int tb__events_foreign(uint64_t owner_shm_id,
                                     uint64_t owner_pidns_id) {
  return (owner_shm_id != 0 && tb__shm_id() != 0 &&
          owner_shm_id != tb__shm_id()) ||
         (owner_pidns_id != 0 && tb__pidns_id() != 0 &&
          owner_pidns_id != tb__pidns_id());
}

/* Queue a notice (oldest dropped beyond TB__NOTICE_QUEUE_MAX), waking a
 * thread that waits for one in tb_client_poll_notice. */
void tb__notice_push(struct tb_client *c, const struct tb_notice *n);

/* rpc.c, "Waits without the call lock". tb__wait_notice: wait up to
 * deadline (UINT64_MAX: forever) until a notice is queued, reading the
 * socket meanwhile, without call_lock while it sleeps; caller holds
 * notice_lock and call_lock. Returns 1 (one is queued), 0 (timeout),
 * TB_EINTR (intr: a signal handler interrupted it) or an error.
 * tb__wake: write eventfd fd (< 0: nothing). tb__client_wake_free: close
 * the eventfds (disconnect, when no call waits). */
int tb__wait_notice(struct tb_client *c, uint64_t deadline, int intr);
void tb__wake(int fd);
void tb__client_wake_free(struct tb_client *c);

/* ---- publish.c: the version-free table ---- */
void tb__freed_add(struct tb_client *c, const Tensorbroker__V1__VersionFree *vf);
/* The remembered entry for (channel, version), or NULL. It stays in the
 * table (call_lock held while it is used). */
struct tb__freed *tb__freed_find(struct tb_client *c, const char *channel,
                                 uint64_t version);
void tb__freed_clear(struct tb__freed *f);
void tb__freed_free_all(struct tb_client *c);
/* An EventsGone notice: drop these events (of a session whose process
 * died) from the remembered entries' done events. */
void tb__freed_events_gone(struct tb_client *c, const uint64_t *ids,
                           size_t n);

/* ---- kind_host.c: the producer's host buffers ---- */
/* The buffer of c whose mapping holds [p, p + len), or NULL. */
/* tb_buffer_destroy() with call_lock held, keeping the client's last
 * error (tb_publish_copy's temporary buffer goes after a refused publish
 * without losing the daemon's reason). */
int tb__buffer_destroy(struct tb_client *c, struct tb_buffer *b);
struct tb_buffer *tb__buffer_find(struct tb_client *c, const void *p,
                                  size_t len);
/* Unmap and free every buffer (disconnect: the daemon retires them). */
void tb__buffers_free_all(struct tb_client *c);

/* ---- mapcache.c: consumer mappings keyed by buffer id + generation ---- */
struct tb__map {
  uint64_t buffer_id; /* hash key */
  uint32_t generation;
  const struct tb__kind_ops *ops; /* the buffer's memory kind: its unmap
                                   * undoes the mapping and frees this
                                   * entry, which the kind may embed */
  int refs; /* leases using it, under conn->lock */
  int retired;
  int writable;
  size_t size;
  uint64_t stamp; /* last use, for eviction */
  UT_hash_handle hh;
};

/* Find the mapping of buffer (id, generation) and take a reference. Returns
 * the entry or NULL. An entry of an older generation is treated as retired. */
struct tb__map *tb__map_get(struct tb__conn *k, uint64_t id, uint32_t gen);
/* Insert a new mapping with one reference, evicting unused entries (and
 * sending Forget for them) beyond TB__MAPCACHE_MAX. Takes ownership of m. */
void tb__map_insert(struct tb__conn *k, struct tb__map *m);
/* Drop a reference; unmaps when the entry is retired or the connection
 * closed and nobody uses it. Caller holds k->lock. */
void tb__map_put_locked(struct tb__conn *k, struct tb__map *m);
/* The daemon retired (id, gen): unmap now if unused, else when unused. */
void tb__map_retire(struct tb__conn *k, uint64_t id, uint32_t gen);
/* Unmap everything unused (disconnect); caller holds k->lock. */
void tb__map_drop_unused_locked(struct tb__conn *k);
/* Undo a mapping and free the entry (its kind's unmap). */
void tb__map_release_memory(struct tb__map *m);

/* ---- lease.c ---- */
void tb__lease_deleter(DLManagedTensorVersioned *self);
/* End the leases whose end waited for a capture (TB__LEASE_LATER) where
 * it has finished. Cheap when there are none. Takes k->lock. */
void tb__leases_retry(struct tb__conn *k);
/* Disconnect: end every lease still held with its done event, as its
 * release would, before the session closes. Caller holds k->lock. */
void tb__leases_end_all_locked(struct tb__conn *k);

/* ---- hint.c: channels named at connect ----
 * tb__hints_keep: connect, keep the HelloReply's latest buffers of kinds
 * that open ahead (quiet on failure). tb__hint_open: an acquire on
 * channel, after its request went out: open that channel's kept buffer and
 * ready event (the kind's prefetch) and forget it.
 * tb__hints_retire: a BufferRetired notice; the buffer is not opened. */
void tb__hints_keep(struct tb_client *c,
                    const Tensorbroker__V1__HelloReply *hr);
void tb__hint_open(struct tb_client *c, const char *channel);
void tb__hints_retire(struct tb_client *c, uint64_t buffer_id,
                      uint32_t generation);
void tb__hints_free(struct tb_client *c);

/* A lease's end must wait (kind.h, done_record_locked): kept on
 * conn->later and asked again. */
#define TB__LEASE_LATER 1

#endif /* TB_CLIENT_INTERNAL_H */
