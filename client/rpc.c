/* SPDX-License-Identifier: Apache-2.0 */
/* The RPC core: the connection's socket once open (and closed in a
 * forked child), the Hello, requests and replies matched by request_id,
 * one-way sends, reading datagrams with timeouts (SO_RCVTIMEO, poll, busy
 * polling), the last-error text and why a connection died. It knows no
 * feature: a notice, or a reply nobody waits for, is handed up through the
 * client's hooks (struct tb__rpc_hooks, client.c). */
#include "client_internal.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <utlist.h>

#include "stats.h"

/* ---- the socket across fork() ----
 *
 * fork() hands the child a copy of every connection: the same socket, so
 * the same session. Were the child to use it, its requests and its parent's
 * would share one session and one stream of replies, each reading the
 * other's; were it only to keep the socket open, the daemon would not see
 * the parent's session end while the child lives (a killed producer's
 * consumers would never hear of it). So:
 *  - pthread_atfork() counts the forks of this process; a connection made
 *    under another count was inherited (tb__conn_forked);
 *  - the child closes the sockets of the connections it inherited, at once,
 *    in the fork handler;
 *  - every call on an inherited client fails with TB_EFORKED before it takes
 *    a lock (a parent's thread may have held one at the fork, and it is not
 *    in the child to let go), and an inherited tensor's end lets go of
 *    nothing of the parent's: the child sends nothing and records nothing,
 *    and its copy of the mapping stays until it exits.
 * A connection's socket is made and tracked in one step under the lock
 * that the fork handlers take (tb__fork_socket), so no child inherits an
 * untracked one. */

/* The connections with an open socket (under fork_lock), and the forks so
 * far. */
static pthread_mutex_t fork_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tb__conn *fork_conns;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
unsigned tb__fork_generation;

/* Stop tracking k and close its socket; fork_lock held. */
static void fork_untrack_close_locked(struct tb__conn *k) {
  if (k->fork_tracked) {
    DL_DELETE2(fork_conns, k, fork_prev, fork_next);
    k->fork_tracked = 0;
  }
  if (k->fd >= 0)
    close(k->fd);
  k->fd = -1;
}

static void before_fork(void) { pthread_mutex_lock(&fork_lock); }

static void after_fork_parent(void) { pthread_mutex_unlock(&fork_lock); }

/* Only close(): the child runs this before anything else, with only the
 * forking thread. */
static void after_fork_child(void) {
  struct tb__conn *k, *tmp;

  __atomic_add_fetch(&tb__fork_generation, 1, __ATOMIC_RELEASE);
  DL_FOREACH_SAFE2(fork_conns, k, tmp, fork_next)
    fork_untrack_close_locked(k);
  pthread_mutex_unlock(&fork_lock);
}

static void fork_handlers(void) {
  (void)pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

int tb__fork_socket(struct tb__conn *k, int domain, int type, int protocol) {
  int fd;

  (void)pthread_once(&fork_once, fork_handlers);
  k->pid = getpid();
  /* made and listed in one step: no fork in between */
  pthread_mutex_lock(&fork_lock);
  k->fork_gen = __atomic_load_n(&tb__fork_generation, __ATOMIC_ACQUIRE);
  fd = socket(domain, type, protocol);
  if (fd >= 0) {
    k->fd = fd;
    DL_APPEND2(fork_conns, k, fork_prev, fork_next);
    k->fork_tracked = 1;
  }
  pthread_mutex_unlock(&fork_lock);
  return fd < 0 ? -1 : 0;
}

void tb__fork_close(struct tb__conn *k) {
  /* closed under the lock: a fork either saw the socket listed, and the
   * child closed it, or finds it closed */
  pthread_mutex_lock(&fork_lock);
  fork_untrack_close_locked(k);
  pthread_mutex_unlock(&fork_lock);
}

/* ---- errors ---- */

/* Each call's explanation (empty when it succeeded) goes to its client
 * (under call_lock) and to its thread: tb_client_last_error gives a thread
 * what its own last call on that client said, so a thread reading it after
 * its call failed is not told of another thread's failure meanwhile. One
 * slot a thread, for the client of its last call, by serial (never
 * reused); a thread whose last call was on another client reads the
 * client's, the last said by any thread. */
static _Thread_local struct {
  uint64_t client; /* that client's serial; 0: none */
  size_t len;
  char msg[TB__LAST_ERROR_MAX];
} mine;

static uint64_t client_serials;

void tb__client_serial(struct tb_client *c) {
  c->serial = __atomic_add_fetch(&client_serials, 1, __ATOMIC_RELAXED);
}

int tb__set_error(struct tb_client *c, int err, const char *fmt, ...) {
  va_list ap;
  int n;

  va_start(ap, fmt);
  n = vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
  va_end(ap);
  c->last_error_len = n < 0 ? 0 : (size_t)n;
  mine.client = c->serial;
  mine.len = c->last_error_len;
  memcpy(mine.msg, c->last_error, sizeof(mine.msg));
  return err;
}

void tb__clear_error(struct tb_client *c) {
  c->last_error[0] = '\0';
  c->last_error_len = 0;
  mine.client = c->serial; /* this thread's last call on c: no error */
  mine.len = 0;
  mine.msg[0] = '\0';
}

static size_t copy_error(const char *msg, size_t full, size_t cap, char *buf,
                         size_t len) {
  if (buf != NULL && len > 0) {
    size_t k = strnlen(msg, cap);
    if (k >= len)
      k = len - 1;
    memcpy(buf, msg, k);
    buf[k] = '\0';
  }
  return full;
}

size_t tb_client_last_error(tb_client *c, char *buf, size_t len) {
  size_t n;

  if (c == NULL)
    return 0;
  if (tb__conn_forked(c->conn)) {
    /* said without the call lock, which a thread the fork left behind
     * may hold */
    char why[TB__LAST_ERROR_MAX];
    int w = snprintf(why, sizeof(why),
                     "this client was connected by process %ld and process "
                     "%ld is a fork of it: a forked child cannot use its "
                     "parent's session; connect a client of its own in the "
                     "child (tb_client_connect, or a new tensorbroker.Client)",
                     (long)c->conn->pid, (long)getpid());
    if (buf != NULL && len > 0)
      snprintf(buf, len, "%s", why);
    return w > 0 ? (size_t)w : 0;
  }
  if (mine.client == c->serial) /* serials start at 1 */
    return copy_error(mine.msg, mine.len, sizeof(mine.msg), buf, len);
  pthread_mutex_lock(&c->call_lock);
  n = copy_error(c->last_error, c->last_error_len, sizeof(c->last_error), buf,
                 len);
  pthread_mutex_unlock(&c->call_lock);
  return n;
}

int tb__conn_send_oneway_locked(struct tb__conn *k, const tb__request *r) {
  uint8_t buf[512];
  long n;
  int rc;

  if (k->closed || k->fd < 0)
    return 0;
  if (__atomic_load_n(&k->dead, __ATOMIC_ACQUIRE))
    return TB_EDISCONNECTED;
  n = tb__request_encode(r, buf, sizeof(buf));
  if (n < 0)
    return (int)n;
  rc = tb__wire_send(k->fd, buf, (size_t)n, NULL, 0, 0);
  if (rc < 0) {
    __atomic_store_n(&k->dead, 1, __ATOMIC_RELEASE);
    return TB_EDISCONNECTED;
  }
  return 0;
}

static void close_fds(int *fds, int n) {
  for (int i = 0; i < n; i++)
    close(fds[i]);
}

/* Why the connection died, said once and kept for every later call: the
 * daemon closed it (what the socket path holds now tells a daemon that
 * stopped from one that restarted), or why (a protocol error). */
static void describe_loss(struct tb_client *c, const char *why, int closed) {
  struct stat st;
  const char *p = c->sock_path;

  if (!closed) {
    snprintf(c->lost_why, sizeof(c->lost_why), "%s", why);
    return;
  }
  if (p[0] == '\0')
    snprintf(c->lost_why, sizeof(c->lost_why),
             "the daemon closed the connection");
  else if (stat(p, &st) < 0)
    snprintf(c->lost_why, sizeof(c->lost_why),
             "the daemon closed the connection and %s is gone (the daemon "
             "stopped)", p);
  else if (st.st_dev != c->sock_dev || st.st_ino != c->sock_ino ||
           st.st_ctim.tv_sec != c->sock_ctime.tv_sec ||
           st.st_ctim.tv_nsec != c->sock_ctime.tv_nsec)
    snprintf(c->lost_why, sizeof(c->lost_why),
             "the daemon closed the connection and restarted (%s is a new "
             "daemon's socket): reconnect with a new client", p);
  else
    snprintf(c->lost_why, sizeof(c->lost_why),
             "the daemon closed the connection (it stopped or was killed)");
}

static int lost_earlier(struct tb_client *c) {
  if (c->lost_why[0] == '\0')
    describe_loss(c, "", 1); /* a deleter saw it die first */
  return tb__set_error(c, TB_EDISCONNECTED,
                       "connection to the daemon lost earlier: %s",
                       c->lost_why);
}

static int mark_dead(struct tb_client *c, const char *why, int closed) {
  pthread_mutex_lock(&c->conn->lock);
  __atomic_store_n(&c->conn->dead, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&c->conn->lock);
  describe_loss(c, why, closed);
  return tb__set_error(c, TB_EDISCONNECTED, "connection to the daemon lost: %s",
                       c->lost_why);
}

/* Decode the datagram in c->rbuf into a free arena (or with malloc when
 * all are in use). */
static int msg_decode(struct tb_client *c, size_t n, tb__server_message **out) {
  for (int i = 0; i < TB__ARENAS; i++) {
    int rc;
    if (c->arena_msg[i] != NULL || c->arena[i].base == NULL)
      continue;
    rc = tb__server_message_decode_in(&c->arena[i], c->rbuf, n, out);
    if (rc < 0) {
      tb__arena_reset(&c->arena[i]);
      return rc;
    }
    c->arena_msg[i] = *out;
    return 0;
  }
  return tb__server_message_decode(c->rbuf, n, out);
}

void tb__msg_free(struct tb_client *c, tb__server_message *m) {
  if (m == NULL)
    return;
  for (int i = 0; i < TB__ARENAS; i++) {
    if (c->arena_msg[i] == m) {
      c->arena_msg[i] = NULL;
      tb__arena_reset(&c->arena[i]);
      return;
    }
  }
  tb__server_message_free(m);
}

/* Make a blocking recv on the socket return by deadline (UINT64_MAX:
 * never), changing SO_RCVTIMEO only when needed: a timeout shorter than
 * what is left just wakes us early (the caller goes round), one a little
 * longer is kept (at most ~3 % late), so a run of calls with the same
 * timeout costs no setsockopt. Returns the recv flags to use (0 or
 * MSG_DONTWAIT when the deadline has passed), or -1 when SO_RCVTIMEO could
 * not be set (wait with poll instead). */
static int arm_recv_timeout(struct tb_client *c, uint64_t deadline) {
  uint64_t now, left;
  struct timeval tv;

  if (c->rcvtimeo_ms < 0)
    return -1;
  if (deadline == UINT64_MAX)
    return 0; /* any timeout set only means an early wake-up */
  now = tb__now_ms();
  if (now >= deadline)
    return MSG_DONTWAIT;
  left = deadline - now;
  if (left > INT32_MAX / 2)
    left = INT32_MAX / 2;
  if (c->rcvtimeo_ms != 0 &&
      (uint64_t)c->rcvtimeo_ms <= left + 1 + left / 32)
    return 0;
  tv.tv_sec = (time_t)(left / 1000);
  tv.tv_usec = (suseconds_t)(left % 1000) * 1000;
  if (setsockopt(c->conn->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0) {
    c->rcvtimeo_ms = -1;
    return -1;
  }
  c->rcvtimeo_ms = (int)left;
  return 0;
}

/* poll() until the socket is readable or deadline passes: the fallback
 * when SO_RCVTIMEO is not available. Returns 1 readable, 0 timeout, or an
 * error. */
static int poll_readable(struct tb_client *c, uint64_t deadline) {
  struct pollfd p = {.fd = c->conn->fd, .events = POLLIN};
  int rc;

  for (;;) {
    int wait;
    if (deadline == UINT64_MAX) {
      wait = -1;
    } else {
      uint64_t now = tb__now_ms();
      wait = now >= deadline ? 0
             : deadline - now > INT32_MAX ? INT32_MAX
                                          : (int)(deadline - now);
    }
    rc = poll(&p, 1, wait);
    if (rc < 0 && errno == EINTR && c->intr_wait)
      return tb__set_error(c, TB_EINTR, "a signal interrupted the wait for "
                                        "the daemon");
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc < 0)
      return tb__set_error(c, TB_ESYS, "poll: %s", strerror(errno));
    return rc > 0;
  }
}

/* Busy polling (spin_us): read without sleeping until a datagram arrives,
 * spin_ns pass from now or the deadline comes. Returns what the last recv
 * returned: a length, or -EAGAIN when nothing came. */
static long spin_recv(struct tb_client *c, uint64_t now, uint64_t deadline,
                      int intr, int *fds, int *got) {
  /* a signal that comes while polling is not seen (no call is
   * interrupted): an interruptible wait polls for a millisecond at most */
  uint64_t spin = intr && c->spin_ns > 1000000u ? 1000000u : c->spin_ns;
  uint64_t end = now + spin;
  long n;

  if (deadline != UINT64_MAX && deadline * 1000000u < end)
    end = deadline * 1000000u;
  do {
    n = tb__wire_recv(c->conn->fd, c->rbuf, TB__RECV_CAP, fds, got,
                      MSG_DONTWAIT);
    if (n != -EAGAIN && n != -EWOULDBLOCK)
      return n;
    /* let whatever else wants this CPU run (the daemon, another client):
     * on an idle CPU this returns at once */
    TB__STAT_READ(0);
    sched_yield();
    now = tb__now_ns();
  } while (now < end);
  return -EAGAIN;
}

/* Whether a wait busy-polls first: the default window only while the
 * process may use enough CPUs; a window the caller chose always. */
static int spin_on(struct tb_client *c) {
  return c->spin_ns != 0 &&
         (!c->spin_auto || tb__poll_cpus_ok(&c->spin_cpus));
}

uint64_t tb__client_polled_waits(const struct tb_client *c) {
  return c->polled_waits;
}

void tb__client_handoffs(const struct tb_client *c, uint64_t *stashed,
                         uint64_t *notice_wakes) {
  *stashed = c->stashed;
  *notice_wakes = c->notice_wakes;
}

void tb__client_set_features(struct tb_client *c, uint32_t features) {
  c->features = features;
}

/* A call waiting without call_lock for its parked request's reply ("waits
 * without the call lock", below): on c->waiters while it waits, under
 * call_lock. */
struct tb__waiter {
  uint64_t id;               /* the request */
  int wake;                  /* its eventfd, written to wake it */
  int written;               /* wake was written: read it empty at the end */
  tb__server_message *reply; /* its reply, read and kept by another thread */
  int fds[TB__MAX_FDS];      /* with its descriptors */
  int nfds;
  int err;                   /* or why that reply could not be taken (< 0) */
  struct tb__waiter *prev, *next;
};

static struct tb__waiter *waiter_find(struct tb_client *c, uint64_t id);
static int route_reply(struct tb_client *c, tb__server_message *m, int *fds,
                       int got);

/* A reply's descriptor could not be received. */
static int out_of_fds(struct tb_client *c) {
  return tb__set_error(c, TB_ESYS, "a descriptor the daemon sent could not "
                                   "be received: this process is out of "
                                   "file descriptors (EMFILE)");
}

/* Decode and dispatch the datagram of n bytes (or recv's error) just read
 * into c->rbuf with got descriptors in fds: recv_one's return values. */
static int handle_datagram(struct tb_client *c, long n, int got,
                           tb__server_message **out, int *fds, int *nfds) {
  tb__server_message *m;
  int rc;

  if (n == 0)
    return mark_dead(c, "", 1);
  if (n == -EMSGSIZE)
    return mark_dead(c, "oversized message from the daemon", 0);
  if (n == -ECONNRESET)
    return mark_dead(c, "", 1);
  if (n < 0)
    return mark_dead(c, strerror((int)-n), 0);
  rc = msg_decode(c, (size_t)n, &m);
  if (rc < 0) {
    close_fds(fds, got);
    return mark_dead(c, "undecodable message from the daemon", 0);
  }
  if (got < 0) {
    /* the daemon attached a descriptor (a buffer's memfd) this process
     * could not take: it is out of descriptors. An acquire's lease is
     * ended and the buffer forgotten (as for a late reply), so that the
     * daemon attaches it again next time. A parked request's waiter is
     * told, not this one. */
    struct tb__waiter *w =
        m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY
            ? waiter_find(c, m->reply->request_id)
            : NULL;
    if (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY)
      c->hooks->stale_reply(c, m->reply);
    tb__msg_free(c, m);
    if (w != NULL) {
      w->err = TB_ESYS;
      w->written = 1;
      tb__wake(w->wake);
      return 2;
    }
    return out_of_fds(c);
  }
  if (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE) {
    close_fds(fds, got); /* notices carry no descriptors */
    c->hooks->notice(c, m->notice);
    tb__msg_free(c, m);
    TB__STAT_NOTICE_DONE();
    return 2;
  }
  *out = m;
  *nfds = got;
  return 1;
}

/* Wait for one datagram until deadline (UINT64_MAX: forever), read and
 * decode it. Notices are handled here; a reply is returned in *out with its
 * fds. Returns 1 with *out set (a reply), 2 for a handled notice or a wake-
 * up with nothing read (the caller goes round), 0 on timeout, or an error.
 * The wait is the recvmsg itself (blocking, bounded by SO_RCVTIMEO): one
 * system call per datagram. */
static int recv_one(struct tb_client *c, uint64_t deadline,
                    tb__server_message **out, int *fds, int *nfds) {
  long n;
  int rc, got = 0, flags;

  if (__atomic_load_n(&c->conn->dead, __ATOMIC_ACQUIRE))
    return lost_earlier(c);
  if (spin_on(c)) {
    c->polled_waits++;
    n = spin_recv(c, tb__now_ns(), deadline, c->intr_wait, fds, &got);
    if (n != -EAGAIN && n != -EWOULDBLOCK)
      goto received;
  }
  TB__STAT_READ(1);
  /* a blocking recv goes on after a signal; poll tells us of it */
  flags = c->intr_wait ? -1 : arm_recv_timeout(c, deadline);
  if (flags == 0) {
    n = tb__wire_recv(c->conn->fd, c->rbuf, TB__RECV_CAP, fds, &got, 0);
    if (n == -EAGAIN || n == -EWOULDBLOCK) {
      /* SO_RCVTIMEO woke us early, or someone made the socket
       * non-blocking: wait with poll this time */
      if (deadline != UINT64_MAX && tb__now_ms() >= deadline)
        return 0;
      flags = -1;
    }
  }
  if (flags != 0) {
    if (flags < 0) {
      rc = poll_readable(c, deadline);
      if (rc <= 0)
        return rc;
    }
    n = tb__wire_recv(c->conn->fd, c->rbuf, TB__RECV_CAP, fds, &got,
                      MSG_DONTWAIT);
    if (n == -EAGAIN || n == -EWOULDBLOCK)
      return deadline != UINT64_MAX && tb__now_ms() >= deadline ? 0 : 2;
  }
received:
  return handle_datagram(c, n, got, out, fds, nfds);
}

int tb__pump(struct tb_client *c, int timeout_ms) {
  uint64_t deadline =
      timeout_ms < 0 ? UINT64_MAX : tb__now_ms() + (uint64_t)timeout_ms;
  tb__server_message *m = NULL;
  int fds[TB__MAX_FDS], nfds = 0, rc;

  rc = recv_one(c, deadline, &m, fds, &nfds);
  if (rc == 1) {
    /* A reply outside any call: the parked request's (another thread
     * waits for it), stale (its call timed out), or the best-effort error
     * reply to a one-way request. */
    if (m->reply->request_id == 0 && m->reply->status < 0) {
      tb__set_error(c, m->reply->status, "%s",
                    m->reply->message ? m->reply->message : "");
      close_fds(fds, nfds);
      tb__msg_free(c, m);
    } else {
      route_reply(c, m, fds, nfds);
    }
  }
  return rc < 0 ? rc : rc > 0;
}

int tb__send_request(struct tb_client *c, tb__request *r, const int *send_fds,
                     int n_send_fds, uint64_t *id) {
  long n;
  int rc;

  if (tb__conn_forked(c->conn))
    return TB_EFORKED; /* the public calls refuse before locking */
  if (__atomic_load_n(&c->conn->dead, __ATOMIC_ACQUIRE))
    return lost_earlier(c);
  *id = c->next_request_id++;
  if (c->next_request_id == 0)
    c->next_request_id = 1;
  r->request_id = *id;
  n = tb__request_encode(r, c->sbuf, c->max_message);
  if (n < 0)
    return tb__set_error(c, TB_ELIMIT,
                         "request larger than %u bytes, the most this "
                         "connection can send (the daemon's --max-message, "
                         "or less where the socket's send buffer cannot "
                         "hold it: net.core.wmem_max)",
                         (unsigned)c->max_message);
  rc = tb__wire_send(c->conn->fd, c->sbuf, (size_t)n, send_fds, n_send_fds, 0);
  if (rc == -EPIPE || rc == -ECONNRESET || rc == -ENOTCONN)
    return mark_dead(c, "", 1);
  if (rc == -EMSGSIZE)
    return tb__set_error(c, TB_ELIMIT,
                         "request of %ld bytes does not fit the socket's "
                         "send buffer (net.core.wmem_max)", n);
  if (rc < 0)
    return tb__set_error(c, TB_ESYS, "send: %s", strerror(-rc));
  return 0;
}

int tb__call(struct tb_client *c, tb__request *r, const int *send_fds,
             int n_send_fds, long extra_ms, tb__server_message **out,
             int *fds, int *nfds) {
  uint64_t id = 0;
  int rc;

  rc = tb__send_request(c, r, send_fds, n_send_fds, &id);
  if (rc < 0)
    return rc;
  return tb__await_reply(c, id, extra_ms, out, fds, nfds);
}

/* The reply to the caller's request, m with got descriptors in fds: into
 * *out and *nfds, or its negative status (kept as the last error). */
static int reply_taken(struct tb_client *c, tb__server_message *m, int *fds,
                       int got, tb__server_message **out, int *nfds) {
  if (m->reply->status != 0) {
    int st = m->reply->status;
    if (st > 0 || st <= TB__ERR_LAST)
      st = TB_EPROTO;
    tb__set_error(c, st, "%s",
                  m->reply->message && m->reply->message[0]
                      ? m->reply->message
                      : tb_strerror(st));
    close_fds(fds, got);
    tb__msg_free(c, m);
    return st;
  }
  *out = m;
  *nfds = got;
  return 0;
}

/* When a reply is late: extra_ms (the wait the call asked for; <0
 * forever) and the client's timeout from now. */
static uint64_t reply_deadline(const struct tb_client *c, long extra_ms) {
  return extra_ms < 0 ? UINT64_MAX
                      : tb__now_ms() + (uint64_t)extra_ms +
                            (uint64_t)c->timeout_ms;
}

int tb__await_reply(struct tb_client *c, uint64_t id, long extra_ms,
                    tb__server_message **out, int *fds, int *nfds) {
  uint64_t deadline = reply_deadline(c, extra_ms);
  int rc;

  for (;;) {
    tb__server_message *m = NULL;
    int got = 0;
    rc = recv_one(c, deadline, &m, fds, &got);
    if (rc < 0)
      return rc;
    if (rc == 0)
      return tb__set_error(c, TB_ETIMEDOUT, "no reply from the daemon in time");
    if (rc == 2)
      continue;
    if (m->reply->request_id != id) {
      /* request_id 0: the daemon refused a one-way message (it closes the
       * connection next); the parked request's: kept for its thread; any
       * other id: a stale reply */
      route_reply(c, m, fds, got);
      continue;
    }
    return reply_taken(c, m, fds, got, out, nfds);
  }
}

/* ---- waits without the call lock ----
 *
 * A parked request (an Acquire waiting for a version, a WaitFree for the
 * readers) may wait for seconds. Its thread lets call_lock go while it
 * sleeps, so that the other threads' calls on the client go on:
 *  - it puts a waiter on c->waiters (its request id, room for its reply,
 *    an eventfd of its own), then polls the socket and that eventfd
 *    without the lock; woken, it takes the lock again and reads what is
 *    there without blocking;
 *  - a thread that reads a reply not its own (in its own call, a notice
 *    poll, a wait_free's pump, another waiter's look) keeps it, with its
 *    descriptors, in the waiter of that request id and writes that
 *    waiter's eventfd: it is neither taken for the reader's reply nor
 *    released as a stale one. A reply no call waits for is stale;
 *  - notices are queued by whoever reads them, and a thread that waits in
 *    tb_client_poll_notice sleeps the same way on notice_wake, which
 *    tb__notice_push writes.
 * Each eventfd has one sleeper, which alone reads it, so no wake-up is
 * lost: it is written under call_lock, after its sleeper let the lock go
 * or before it looks again, and its count stays until read. All sleepers
 * poll the socket too: a datagram wakes them all, one reads it, the others
 * find nothing (or their reply kept) and sleep again.
 * Where the daemon parks several requests per session (FEATURE_MULTI_WAIT)
 * several threads wait so at once, each for its own; an older daemon
 * parks one, and the calls that may park then take park_lock first
 * (tb__park_serial), as they did before: one waiter at most.
 * The eventfds are kept for the next waiters (c->wake_spare), so a wait
 * makes none. A short busy-polling window (spin_us) is still spent with
 * the lock held, before the first sleep: the hot path (the version comes
 * within it) pays no lock hand-over. */

void tb__wake(int fd) {
  uint64_t one = 1;

  if (fd >= 0)
    (void)!write(fd, &one, sizeof(one));
}

/* The eventfd in *fd, made on first use; -1 when none can be made (the
 * caller then waits with the lock held, as before). */
static int wake_fd(int *fd) {
  if (*fd < 0)
    *fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return *fd;
}

/* An eventfd for a waiter, kept or new; -1 when none can be made. Back
 * with wake_put, read empty. */
static int wake_take(struct tb_client *c) {
  if (c->nwake_spare > 0)
    return c->wake_spare[--c->nwake_spare];
  return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

static void wake_put(struct tb_client *c, int fd) {
  if (c->nwake_spare < TB__WAKE_SPARE)
    c->wake_spare[c->nwake_spare++] = fd;
  else
    close(fd);
}

void tb__client_wake_free(struct tb_client *c) {
  while (c->nwake_spare > 0)
    close(c->wake_spare[--c->nwake_spare]);
  if (c->notice_wake >= 0)
    close(c->notice_wake);
  c->notice_wake = -1;
}

/* The waiter of request id that has nothing kept yet, or NULL. */
static struct tb__waiter *waiter_find(struct tb_client *c, uint64_t id) {
  struct tb__waiter *w;

  DL_FOREACH(c->waiters, w) {
    if (w->id == id)
      return w->reply == NULL && w->err == 0 ? w : NULL;
  }
  return NULL;
}

/* A reply that is not the reader's own: a parked request's is kept for
 * the thread that waits for it, which is woken; any other is stale. */
static int route_reply(struct tb_client *c, tb__server_message *m, int *fds,
                       int got) {
  struct tb__waiter *w = waiter_find(c, m->reply->request_id);

  if (w != NULL) {
    w->reply = m;
    memcpy(w->fds, fds, (size_t)got * sizeof(int));
    w->nfds = got;
    w->written = 1;
    c->stashed++;
    tb__wake(w->wake);
    return 0;
  }
  c->hooks->stale_reply(c, m->reply);
  close_fds(fds, got);
  tb__msg_free(c, m);
  return 0;
}

/* Milliseconds from now to deadline for poll(): -1 forever, 0 passed. */
static int ms_left(uint64_t deadline) {
  uint64_t now;

  if (deadline == UINT64_MAX)
    return -1;
  now = tb__now_ms();
  return now >= deadline              ? 0
         : deadline - now > INT32_MAX ? INT32_MAX
                                      : (int)(deadline - now);
}

/* Sleep without call_lock (held on entry and again on return) until the
 * socket is readable, the eventfd wake is written or deadline passes; the
 * eventfd is read empty. Returns 0 (go round and look), TB_EINTR (intr,
 * and a signal handler ran) or an error. */
static int sleep_unlocked(struct tb_client *c, int wake, uint64_t deadline,
                          int intr) {
  struct pollfd p[2] = {{.fd = c->conn->fd, .events = POLLIN},
                        {.fd = wake, .events = POLLIN}};
  int rc, err;

  TB__STAT_READ(1);
  pthread_mutex_unlock(&c->call_lock);
  rc = poll(p, 2, ms_left(deadline));
  err = errno;
  pthread_mutex_lock(&c->call_lock);
  if (rc > 0 && (p[1].revents & POLLIN)) {
    uint64_t v;
    (void)!read(wake, &v, sizeof(v));
  }
  if (rc < 0 && err == EINTR)
    return intr ? tb__set_error(c, TB_EINTR, "a signal interrupted the wait "
                                             "for the daemon")
                : 0;
  if (rc < 0)
    return tb__set_error(c, TB_ESYS, "poll: %s", strerror(err));
  return 0;
}

/* Read one datagram if one is there, after busy polling when spin (the
 * client's window, as recv_one spends it): recv_one's return values, and 0
 * when nothing came. */
static int recv_now(struct tb_client *c, uint64_t deadline, int spin, int intr,
                    tb__server_message **out, int *fds, int *nfds) {
  long n;
  int got = 0;

  if (__atomic_load_n(&c->conn->dead, __ATOMIC_ACQUIRE))
    return lost_earlier(c);
  if (spin && spin_on(c)) {
    c->polled_waits++;
    n = spin_recv(c, tb__now_ns(), deadline, intr, fds, &got);
  } else {
    n = tb__wire_recv(c->conn->fd, c->rbuf, TB__RECV_CAP, fds, &got,
                      MSG_DONTWAIT);
  }
  if (n == -EAGAIN || n == -EWOULDBLOCK)
    return 0;
  return handle_datagram(c, n, got, out, fds, nfds);
}

/* tb__await_reply for parked request id, sleeping without call_lock on
 * eventfd wake. */
static int await_unlocked(struct tb_client *c, uint64_t id, uint64_t deadline,
                          int intr, int wake, tb__server_message **out,
                          int *fds, int *nfds) {
  struct tb__waiter w = {.id = id, .wake = wake};
  tb__server_message *m;
  int rc, spin = 1, look;

  /* without busy polling the first look is poll()'s: a reply is seldom
   * here the moment the request has gone */
  look = spin_on(c);
  DL_APPEND(c->waiters, &w);
  c->conn->parked++;
  for (;;) {
    int got = 0;
    m = NULL;
    if (w.reply != NULL) {
      m = w.reply;
      got = w.nfds;
      memcpy(fds, w.fds, (size_t)got * sizeof(int));
      w.reply = NULL;
      rc = reply_taken(c, m, fds, got, out, nfds);
      break;
    }
    if (w.err < 0) {
      rc = out_of_fds(c);
      break;
    }
    rc = look ? recv_now(c, deadline, spin, intr, &m, fds, &got) : 0;
    look = 1;
    if (rc < 0)
      break;
    if (rc == 1) {
      if (m->reply->request_id == id) {
        rc = reply_taken(c, m, fds, got, out, nfds);
        break;
      }
      route_reply(c, m, fds, got); /* another waiter's, or stale */
    }
    if (rc > 0) {
      spin = 1; /* as recv_one does after each datagram */
      continue;
    }
    if (deadline != UINT64_MAX && tb__now_ms() >= deadline) {
      rc = tb__set_error(c, TB_ETIMEDOUT, "no reply from the daemon in time");
      break;
    }
    rc = sleep_unlocked(c, wake, deadline, intr);
    if (rc < 0)
      break;
    spin = 0; /* woken: whatever came is read at once */
  }
  DL_DELETE(c->waiters, &w);
  c->conn->parked--;
  if (w.reply != NULL) {
    /* kept by another thread while this one was interrupted: late now */
    route_reply(c, w.reply, w.fds, w.nfds);
  }
  if (w.written) {
    /* a wake it did not sleep for: not for the eventfd's next waiter */
    uint64_t v;
    (void)!read(wake, &v, sizeof(v));
  }
  return rc;
}

int tb__wait_notice(struct tb_client *c, uint64_t deadline, int intr) {
  int rc, spin = 1;

  for (;;) {
    tb__server_message *m = NULL;
    int fds[TB__MAX_FDS], got = 0;
    if (c->nq_len > 0)
      return 1;
    rc = recv_now(c, deadline, spin, intr, &m, fds, &got);
    if (rc < 0)
      return rc;
    if (rc == 1)
      route_reply(c, m, fds, got);
    if (rc > 0) {
      spin = 1;
      continue;
    }
    if (deadline != UINT64_MAX && tb__now_ms() >= deadline)
      return 0;
    if (wake_fd(&c->notice_wake) < 0) {
      /* no eventfd: wait for the socket with the lock held, as before */
      c->intr_wait = intr;
      rc = tb__pump(c, ms_left(deadline));
      c->intr_wait = 0;
      if (rc < 0)
        return rc;
      continue;
    }
    c->notice_waiting = 1;
    rc = sleep_unlocked(c, c->notice_wake, deadline, intr);
    c->notice_waiting = 0;
    if (rc < 0)
      return rc;
    spin = 0;
  }
}

int tb__await_parked(struct tb_client *c, uint64_t id, long extra_ms,
                     tb__server_message **out, int *fds, int *nfds) {
  Tensorbroker__V1__Cancel cancel = TENSORBROKER__V1__CANCEL__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  int rc, crc, intr, wake;
  char why[TB__LAST_ERROR_MAX];

  /* timeout 0 asks and does not wait: nothing to interrupt, and the
   * daemon answers at once */
  if (extra_ms == 0)
    return tb__await_reply(c, id, extra_ms, out, fds, nfds);
  intr = c->interruptible &&
         (c->features & TENSORBROKER__V1__FEATURE__FEATURE_CANCEL);
  wake = wake_take(c);
  if (wake >= 0) {
    rc = await_unlocked(c, id, reply_deadline(c, extra_ms), intr, wake, out,
                        fds, nfds);
    wake_put(c, wake);
  } else {
    /* no eventfd (out of descriptors): wait with the lock held */
    c->intr_wait = intr;
    rc = tb__await_reply(c, id, extra_ms, out, fds, nfds);
    c->intr_wait = 0;
  }
  if (!intr || rc != TB_EINTR)
    return rc;
  /* Cancel it and read up to the daemon's answer to the Cancel (not
   * interruptible, bounded by the client's timeout): an answer to the
   * request that came first is read as a late one on the way (a lease
   * given back), so nothing is left held when this returns. */
  snprintf(why, sizeof(why), "%s", c->last_error);
  cancel.request_id = id;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_CANCEL;
  r.cancel = &cancel;
  crc = tb__call_simple(c, &r);
  if (crc < 0 && crc != TB_ETIMEDOUT)
    return crc; /* the connection died meanwhile: that is what to say */
  return tb__set_error(c, TB_EINTR, "%s", why);
}

int tb__call_simple(struct tb_client *c, tb__request *r) {
  tb__server_message *m = NULL;
  int fds[TB__MAX_FDS], nfds = 0, rc;

  rc = tb__call(c, r, NULL, 0, 0, &m, fds, &nfds);
  if (rc < 0)
    return rc;
  close_fds(fds, nfds);
  tb__msg_free(c, m);
  return 0;
}

static uint64_t shm_id;

static void shm_id_find(void) {
  struct stat st;

  if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode))
    shm_id = (uint64_t)st.st_dev;
}

uint64_t tb__shm_id(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;

  pthread_once(&once, shm_id_find);
  return shm_id;
}

static uint64_t pidns_id;

static void pidns_id_find(void) {
  struct stat st;

  if (stat("/proc/self/ns/pid", &st) == 0)
    pidns_id = (uint64_t)st.st_ino;
}

uint64_t tb__pidns_id(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;

  pthread_once(&once, pidns_id_find);
  return pidns_id;
}

int tb__hello_send(struct tb_client *c, const char *name, int contract,
                   const char *const *channels, size_t n_channels,
                   uint32_t memory_kinds, uint64_t *id) {
  Tensorbroker__V1__Hello h = TENSORBROKER__V1__HELLO__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;

  h.protocol_version = TB_PROTOCOL_VERSION;
  h.client_name = (char *)name;
  h.stream_contract = (Tensorbroker__V1__StreamContract)contract;
  h.memory_kinds = memory_kinds;
  h.library_version = (char *)TB_VERSION_STRING;
  h.prefetch = c->prefetch != 0;
  h.says_goodbye = 1; /* tb_client_disconnect says it */
  h.shm_id = tb__shm_id();
  h.pidns_id = tb__pidns_id();
  if (c->prefetch) {
    h.channels = (char **)channels;
    h.n_channels = n_channels;
  }
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
  r.hello = &h;
  return tb__send_request(c, &r, NULL, 0, id);
}

/* Bytes a SEQPACKET datagram needs in the sender's buffer besides its
 * own (the kernel refuses len > SO_SNDBUF - 32). */
#define SNDBUF_SLACK 64

/* Size the socket's send buffer for the daemon's --max-message, so that
 * every request the daemon accepts can be sent: a datagram must fit the
 * send buffer whole, and the default (net.core.wmem_default) holds about
 * 208 KiB. Where the kernel allows less (net.core.wmem_max; the daemon
 * checks at start that it does not), requests are held to what fits and a
 * larger one fails with TB_ELIMIT before it is sent. */
static void fit_send_buffer(struct tb_client *c) {
  int fd = c->conn->fd, cur = 0, want = (int)c->max_message + 4096;
  socklen_t len = sizeof(cur);

  if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &cur, &len) == 0 &&
      (uint64_t)cur >= (uint64_t)c->max_message + SNDBUF_SLACK)
    return;
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want));
  len = sizeof(cur);
  if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &cur, &len) == 0 &&
      (uint64_t)cur < (uint64_t)c->max_message + SNDBUF_SLACK)
    c->max_message = cur > 1024 + SNDBUF_SLACK
                         ? (uint32_t)(cur - SNDBUF_SLACK)
                         : 1024;
}

int tb__hello_reply(struct tb_client *c, uint64_t id,
                    tb__server_message **out) {
  tb__server_message *m = NULL;
  int fds[TB__MAX_FDS], nfds = 0, rc;

  rc = tb__await_reply(c, id, 0, &m, fds, &nfds);
  if (rc < 0)
    return rc;
  close_fds(fds, nfds);
  if (m->reply->body_case != TENSORBROKER__V1__REPLY__BODY_HELLO ||
      m->reply->hello == NULL) {
    tb__msg_free(c, m);
    return tb__set_error(c, TB_EPROTO, "Hello answered without HelloReply");
  }
  if (m->reply->hello->protocol_version != TB_PROTOCOL_VERSION) {
    rc = tb__set_error(c, TB_EVERSION, "daemon speaks protocol %u, we speak %u",
                       (unsigned)m->reply->hello->protocol_version,
                       (unsigned)TB_PROTOCOL_VERSION);
    tb__msg_free(c, m);
    return rc;
  }
  c->session_id = m->reply->hello->session_id;
  if (m->reply->hello->max_message >= 1024 &&
      m->reply->hello->max_message <= TB__MAX_MESSAGE_HARD)
    c->max_message = m->reply->hello->max_message;
  fit_send_buffer(c);
  if (m->reply->hello->max_ndim > 0)
    c->max_ndim = m->reply->hello->max_ndim;
  if (m->reply->hello->max_metadata > 0)
    c->max_metadata = m->reply->hello->max_metadata;
  c->features = m->reply->hello->features;
  *out = m;
  return 0;
}

int tb_client_fd(const tb_client *c) { return c ? c->conn->fd : -1; }

uint64_t tb_client_session_id(const tb_client *c) {
  return c ? c->session_id : 0;
}
