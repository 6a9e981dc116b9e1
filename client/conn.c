/* SPDX-License-Identifier: Apache-2.0 */
/* The connection: socket, Hello, request/reply matching by request_id,
 * notices, last-error text, and timeouts via poll(). */
#include "kind.h"

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- errors ---- */

int tb__set_error(struct tb_client *c, int err, const char *fmt, ...) {
  va_list ap;
  int n;

  va_start(ap, fmt);
  n = vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
  va_end(ap);
  c->last_error_len = n < 0 ? 0 : (size_t)n;
  return err;
}

void tb__clear_error(struct tb_client *c) {
  c->last_error[0] = '\0';
  c->last_error_len = 0;
}

size_t tb_client_last_error(tb_client *c, char *buf, size_t len) {
  size_t n;

  if (c == NULL)
    return 0;
  pthread_mutex_lock(&c->call_lock);
  n = c->last_error_len;
  if (buf != NULL && len > 0) {
    size_t k = strnlen(c->last_error, sizeof(c->last_error));
    if (k >= len)
      k = len - 1;
    memcpy(buf, c->last_error, k);
    buf[k] = '\0';
  }
  pthread_mutex_unlock(&c->call_lock);
  return n;
}

/* The calling thread's last tb_client_connect() failure: there is no client
 * to hold it. Thread-local, so that threads connecting at once each read
 * their own. */
static _Thread_local char connect_err[TB__LAST_ERROR_MAX];
static _Thread_local size_t connect_err_len;

static int connect_fail(int err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int connect_fail(int err, const char *fmt, ...) {
  va_list ap;
  int n;

  va_start(ap, fmt);
  n = vsnprintf(connect_err, sizeof(connect_err), fmt, ap);
  va_end(ap);
  connect_err_len = n < 0 ? 0 : (size_t)n;
  return err;
}

size_t tb_connect_error(char *buf, size_t len) {
  if (buf != NULL && len > 0) {
    size_t k = strnlen(connect_err, sizeof(connect_err));
    if (k >= len)
      k = len - 1;
    memcpy(buf, connect_err, k);
    buf[k] = '\0';
  }
  return connect_err_len;
}

/* ---- options and defaults ---- */

void tb_connect_options_init(struct tb_connect_options *opts) {
  if (opts == NULL)
    return;
  memset(opts, 0, sizeof(*opts));
  opts->struct_size = sizeof(*opts);
  opts->stream_contract = TB_CONTRACT_SPEC;
  opts->timeout_ms = TB__DEFAULT_TIMEOUT_MS;
}

static int copy_path(char *buf, size_t len, const char *a, const char *b) {
  int n = snprintf(buf, len, "%s%s", a, b);
  if (n < 0 || (size_t)n >= len)
    return TB_ELIMIT;
  return 0;
}

int tb_default_socket_path(char *buf, size_t len) {
  const char *s;

  if (buf == NULL || len == 0)
    return TB_ELIMIT;
  s = getenv("TENSORBROKER_SOCKET");
  if (s != NULL && s[0] != '\0')
    return copy_path(buf, len, s, "");
  s = getenv("XDG_RUNTIME_DIR");
  if (s != NULL && s[0] != '\0')
    return copy_path(buf, len, s, "/tensorbroker.sock");
  return copy_path(buf, len, "/run/tensorbroker/tensorbroker.sock", "");
}

void tb_free(void *p) { free(p); }

/* ---- the refcounted connection ---- */

void tb__conn_ref(struct tb__conn *k) {
  pthread_mutex_lock(&k->lock);
  k->refs++;
  pthread_mutex_unlock(&k->lock);
}

int tb__conn_unref_locked(struct tb__conn *k) {
  if (--k->refs != 0)
    return 0;
  tb__map_drop_unused_locked(k);
  return 1;
}

void tb__conn_unref(struct tb__conn *k) {
  int last;

  if (k == NULL)
    return;
  pthread_mutex_lock(&k->lock);
  last = tb__conn_unref_locked(k);
  pthread_mutex_unlock(&k->lock);
  if (last)
    tb__conn_free(k);
}

void tb__conn_free(struct tb__conn *k) {
  free(k->spare_lease);
  tb__kinds_conn_free(k);
  if (k->fd >= 0)
    close(k->fd);
  pthread_mutex_destroy(&k->lock);
  free(k);
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

/* ---- notices ---- */

void tb__notice_push(struct tb_client *c, const struct tb_notice *n) {
  if (c->nq_len == c->nq_cap) {
    if (c->nq_cap < TB__NOTICE_QUEUE_MAX) {
      size_t ncap = c->nq_cap ? c->nq_cap * 2 : 16;
      struct tb_notice *q = malloc(ncap * sizeof(*q));
      if (q != NULL) {
        for (size_t i = 0; i < c->nq_len; i++)
          q[i] = c->notices[(c->nq_head + i) % c->nq_cap];
        free(c->notices);
        c->notices = q;
        c->nq_cap = ncap;
        c->nq_head = 0;
      }
    }
    if (c->nq_len == c->nq_cap) {
      if (c->nq_cap == 0)
        return; /* out of memory: the notice is lost, like an overflow */
      /* full: drop the oldest */
      c->nq_head = (c->nq_head + 1) % c->nq_cap;
      c->nq_len--;
    }
  }
  c->notices[(c->nq_head + c->nq_len) % c->nq_cap] = *n;
  c->nq_len++;
}

static void copy_str(char *dst, size_t cap, const char *src) {
  size_t n = src ? strnlen(src, cap - 1) : 0;
  if (n > 0)
    memcpy(dst, src, n);
  dst[n] = '\0';
}

static void handle_notice(struct tb_client *c,
                          const Tensorbroker__V1__Notice *no) {
  struct tb_notice n;

  memset(&n, 0, sizeof(n));
  switch (no->body_case) {
  case TENSORBROKER__V1__NOTICE__BODY_NEW_VERSION:
    n.type = TB_NOTICE_NEW_VERSION;
    copy_str(n.channel, sizeof(n.channel), no->new_version->channel);
    n.version = no->new_version->version;
    if (no->new_version->buffer != NULL)
      tb__kind_prefetch(c, no->new_version->buffer,
                        no->new_version->ready_event);
    break;
  case TENSORBROKER__V1__NOTICE__BODY_VERSION_FREE:
    n.type = TB_NOTICE_VERSION_FREE;
    copy_str(n.channel, sizeof(n.channel), no->version_free->channel);
    n.version = no->version_free->version;
    n.buffer_id = no->version_free->buffer_id;
    tb__freed_add(c, no->version_free);
    break;
  case TENSORBROKER__V1__NOTICE__BODY_BUFFER_RETIRED:
    n.type = TB_NOTICE_BUFFER_RETIRED;
    n.buffer_id = no->buffer_retired->buffer_id;
    tb__map_retire(c->conn, no->buffer_retired->buffer_id,
                   no->buffer_retired->generation);
    if (c->n_hints > 0)
      tb__hints_retire(c, no->buffer_retired->buffer_id,
                       no->buffer_retired->generation);
    break;
  case TENSORBROKER__V1__NOTICE__BODY_CHANNEL_CLOSED:
    n.type = TB_NOTICE_CHANNEL_CLOSED;
    copy_str(n.channel, sizeof(n.channel), no->channel_closed->channel);
    copy_str(n.reason, sizeof(n.reason), no->channel_closed->reason);
    n.version = no->channel_closed->unfinished_version;
    break;
  case TENSORBROKER__V1__NOTICE__BODY_DAEMON_CLOSING:
    n.type = TB_NOTICE_DAEMON_CLOSING;
    copy_str(n.reason, sizeof(n.reason), no->daemon_closing->reason);
    break;
  default:
    return; /* a notice kind from a newer daemon: ignore */
  }
  tb__notice_push(c, &n);
}

/* A reply nobody waits for any more (its call timed out on our side). An
 * acquire that succeeded late would hold a lease forever: end it, and tell
 * the daemon we never kept the memfd it attached. */
static void handle_stale_reply(struct tb_client *c,
                               const Tensorbroker__V1__Reply *rep) {
  struct tb__conn *k = c->conn;

  if (rep->status != 0 ||
      rep->body_case != TENSORBROKER__V1__REPLY__BODY_ACQUIRE ||
      rep->acquire == NULL)
    return;
  pthread_mutex_lock(&k->lock);
  {
    Tensorbroker__V1__Release rel = TENSORBROKER__V1__RELEASE__INIT;
    tb__request r = TENSORBROKER__V1__REQUEST__INIT;
    rel.lease_id = rep->acquire->lease_id;
    r.body_case = TENSORBROKER__V1__REQUEST__BODY_RELEASE;
    r.release = &rel;
    (void)tb__conn_send_oneway_locked(k, &r);
  }
  if (rep->acquire->buffer != NULL && rep->acquire->buffer->fd_attached) {
    Tensorbroker__V1__Forget fg = TENSORBROKER__V1__FORGET__INIT;
    tb__request r = TENSORBROKER__V1__REQUEST__INIT;
    fg.buffer_id = rep->acquire->buffer->buffer_id;
    r.body_case = TENSORBROKER__V1__REQUEST__BODY_FORGET;
    r.forget = &fg;
    (void)tb__conn_send_oneway_locked(k, &r);
  }
  pthread_mutex_unlock(&k->lock);
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
                      int *fds, int *got) {
  uint64_t end = now + c->spin_ns;
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
    if (tb__acq_waiting)
      tb__count_read(0);
    sched_yield();
    now = tb__now_ns();
  } while (now < end);
  return -EAGAIN;
}

uint64_t tb__client_polled_waits(const struct tb_client *c) {
  return c->polled_waits;
}

void tb__client_set_features(struct tb_client *c, uint32_t features) {
  c->features = features;
}

/* Wait for one datagram until deadline (UINT64_MAX: forever), read and
 * decode it. Notices are handled here; a reply is returned in *out with its
 * fds. Returns 1 with *out set (a reply), 2 for a handled notice or a wake-
 * up with nothing read (the caller goes round), 0 on timeout, or an error.
 * The wait is the recvmsg itself (blocking, bounded by SO_RCVTIMEO): one
 * system call per datagram. */
static int recv_one(struct tb_client *c, uint64_t deadline,
                    tb__server_message **out, int *fds, int *nfds) {
  tb__server_message *m;
  long n;
  int rc, got = 0, flags;

  if (__atomic_load_n(&c->conn->dead, __ATOMIC_ACQUIRE))
    return lost_earlier(c);
  /* the default window only while the process may use enough CPUs; a
   * window the caller chose always */
  if (c->spin_ns != 0 &&
      (!c->spin_auto || tb__poll_cpus_ok(&c->spin_cpus))) {
    c->polled_waits++;
    n = spin_recv(c, tb__now_ns(), deadline, fds, &got);
    if (n != -EAGAIN && n != -EWOULDBLOCK)
      goto received;
  }
  if (tb__acq_waiting)
    tb__count_read(1);
  flags = arm_recv_timeout(c, deadline);
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
     * daemon attaches it again next time. */
    if (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY)
      handle_stale_reply(c, m->reply);
    tb__msg_free(c, m);
    return tb__set_error(c, TB_ESYS, "a descriptor the daemon sent could "
                                     "not be received: this process is out "
                                     "of file descriptors (EMFILE)");
  }
  if (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE) {
    close_fds(fds, got); /* notices carry no descriptors */
    handle_notice(c, m->notice);
    tb__msg_free(c, m);
    if (tb__acq_waiting)
      tb__count_notice_done();
    return 2;
  }
  *out = m;
  *nfds = got;
  return 1;
}

int tb__pump(struct tb_client *c, int timeout_ms) {
  uint64_t deadline =
      timeout_ms < 0 ? UINT64_MAX : tb__now_ms() + (uint64_t)timeout_ms;
  tb__server_message *m = NULL;
  int fds[TB__MAX_FDS], nfds = 0, rc;

  rc = recv_one(c, deadline, &m, fds, &nfds);
  if (rc == 1) {
    /* A reply outside any call: stale (its call timed out), or the
     * best-effort error reply to a one-way request. */
    if (m->reply->request_id == 0 && m->reply->status < 0)
      tb__set_error(c, m->reply->status, "%s",
                    m->reply->message ? m->reply->message : "");
    else
      handle_stale_reply(c, m->reply);
    close_fds(fds, nfds);
    tb__msg_free(c, m);
  }
  return rc < 0 ? rc : rc > 0;
}

int tb__send_request(struct tb_client *c, tb__request *r, const int *send_fds,
                     int n_send_fds, uint64_t *id) {
  long n;
  int rc;

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

int tb__await_reply(struct tb_client *c, uint64_t id, long extra_ms,
                    tb__server_message **out, int *fds, int *nfds) {
  uint64_t deadline;
  int rc;

  deadline = extra_ms < 0 ? UINT64_MAX
                          : tb__now_ms() + (uint64_t)extra_ms +
                                (uint64_t)c->timeout_ms;
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
       * connection next); any other id: a stale reply */
      handle_stale_reply(c, m->reply);
      close_fds(fds, got);
      tb__msg_free(c, m);
      continue;
    }
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
}

/* Send a request whose reply carries no data and no descriptors. */
static int call_simple(struct tb_client *c, tb__request *r) {
  tb__server_message *m = NULL;
  int fds[TB__MAX_FDS], nfds = 0, rc;

  rc = tb__call(c, r, NULL, 0, 0, &m, fds, &nfds);
  if (rc < 0)
    return rc;
  close_fds(fds, nfds);
  tb__msg_free(c, m);
  return 0;
}

/* ---- connect / disconnect ---- */

static const char *program_name(void) {
  extern char *program_invocation_short_name;
  return program_invocation_short_name;
}

static int name_ok(const char *s) {
  size_t n = strnlen(s, 64);
  if (n > 63)
    return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] == 0x7f)
      return 0;
  return 1;
}

/* Why connect(2) to path failed, in words that point at the fix. */
static int connect_refused(const char *path, int err) {
  struct stat st;

  switch (err) {
  case ENOENT:
    return connect_fail(TB_ECONNECT,
                        "cannot connect to %s: no such file (is tensorbrokerd "
                        "running? The path comes from $TENSORBROKER_SOCKET, "
                        "else $XDG_RUNTIME_DIR/tensorbroker.sock, else "
                        "/run/tensorbroker/tensorbroker.sock)",
                        path);
  case ECONNREFUSED:
    return connect_fail(TB_ECONNECT,
                        "cannot connect to %s: connection refused (a stale "
                        "socket: the daemon is not running)",
                        path);
  case EACCES:
  case EPERM:
    if (stat(path, &st) == 0) {
      char buf[1024], gname[64];
      struct group g, *gp = NULL;
      if (getgrgid_r(st.st_gid, &g, buf, sizeof(buf), &gp) == 0 && gp)
        snprintf(gname, sizeof(gname), "%s", gp->gr_name);
      else
        snprintf(gname, sizeof(gname), "%u", (unsigned)st.st_gid);
      return connect_fail(TB_ECONNECT,
                          "cannot connect to %s: permission denied (the "
                          "socket is mode %04o, group %s: is this user in "
                          "it?)",
                          path, (unsigned)(st.st_mode & 07777), gname);
    }
    return connect_fail(TB_ECONNECT,
                        "cannot connect to %s: permission denied (a directory "
                        "on the path is closed to this user)",
                        path);
  default:
    return connect_fail(TB_ECONNECT, "cannot connect to %s: %s", path,
                        strerror(err));
  }
}

static int open_socket(const char *path, int *out) {
  struct sockaddr_un sa;
  size_t len = strlen(path);
  int fd, err;

  if (len == 0 || len >= sizeof(sa.sun_path))
    return connect_fail(TB_EINVAL, "socket path '%s' is empty or longer "
                                   "than %zu bytes", path,
                        sizeof(sa.sun_path) - 1);
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, len + 1);
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return connect_fail(TB_ESYS, "cannot connect to %s: socket: %s", path,
                        strerror(errno));
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    err = errno;
    close(fd);
    return connect_refused(path, err);
  }
  *out = fd;
  return 0;
}

/* What a failed Hello tells the caller: the daemon's own reason. */
static int hello_failed(struct tb_client *c, const char *path, int rc) {
  switch (rc) {
  case TB_EDISCONNECTED:
    return connect_fail(TB_ECONNECT,
                        "cannot connect to %s: the daemon closed the "
                        "connection before answering the Hello",
                        path);
  case TB_ETIMEDOUT:
    return connect_fail(rc, "cannot connect to %s: the daemon did not answer "
                            "the Hello within %d ms",
                        path, c->timeout_ms);
  case TB_EVERSION:
    return connect_fail(rc, "cannot connect to %s: another protocol: %s", path,
                        c->last_error);
  default:
    return connect_fail(rc, "cannot connect to %s: the daemon refused the "
                            "session: %s",
                        path, c->last_error[0] ? c->last_error : tb_strerror(rc));
  }
}

/* The Hello in two halves, so that connect can send the done event's
 * registration before it waits (tb__cuda_connect_begin). */
static int hello_send(struct tb_client *c, const char *name, int contract,
                      const char *const *channels, size_t n_channels,
                      uint64_t *id) {
  Tensorbroker__V1__Hello h = TENSORBROKER__V1__HELLO__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;

  h.protocol_version = TB_PROTOCOL_VERSION;
  h.client_name = (char *)name;
  h.stream_contract = (Tensorbroker__V1__StreamContract)contract;
  /* Advertised without probing the driver, so that a host-only client never
   * loads CUDA; a CUDA acquire without a driver fails with TB_ENOCUDA. */
  h.memory_kinds = tb__kinds_mask();
  h.library_version = (char *)TB_VERSION_STRING;
  h.prefetch = c->prefetch != 0;
  h.says_goodbye = 1; /* tb_client_disconnect says it */
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

static int hello_reply(struct tb_client *c, uint64_t id) {
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
  c->pid = getpid();
  if (c->prefetch)
    tb__hints_keep(c, m->reply->hello);
  tb__msg_free(c, m);
  return 0;
}

static int client_connect(const struct tb_connect_options *opts,
                          tb_client **out) {
  struct tb_connect_options o;
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  const char *name;
  struct tb_client *c;
  struct tb__conn *k;
  uint64_t hello_id = 0;
  size_t n_channels = 0;
  int rc, fd = -1, spin_auto = 0;

  if (out == NULL)
    return TB_EINVAL;
  tb_connect_options_init(&o);
  if (opts != NULL) {
    size_t n = opts->struct_size < sizeof(o) ? opts->struct_size : sizeof(o);
    if (n < sizeof(size_t))
      return TB_EINVAL;
    memcpy(&o, opts, n);
  }
  if (o.stream_contract < TB_CONTRACT_SPEC ||
      o.stream_contract > TB_CONTRACT_EXPLICIT)
    return TB_EINVAL;
  if (o.spin_us < -1 || o.spin_us > TB__SPIN_US_MAX)
    return TB_EINVAL;
  if (o.spin_us == 0) {
    const char *e = getenv("TENSORBROKER_SPIN_US");
    if (e != NULL && *e) {
      char *end;
      long v = strtol(e, &end, 10);
      if (*end || v < 0 || v > TB__SPIN_US_MAX)
        return TB_EINVAL;
      o.spin_us = (int)v;
    } else {
      spin_auto = 1;
      o.spin_us = TB__POLL_AUTO_US;
    }
  } else if (o.spin_us < 0) {
    o.spin_us = 0; /* -1: never */
  }
  name = o.client_name != NULL ? o.client_name : program_name();
  if (name == NULL)
    name = "";
  if (!name_ok(name)) {
    if (o.client_name != NULL)
      return TB_ENAME;
    name = ""; /* an odd program name is not the caller's fault */
  }
  for (; o.channels != NULL && o.channels[n_channels] != NULL; n_channels++) {
    if (n_channels == TB_CONNECT_CHANNELS_MAX)
      return TB_ELIMIT;
    if (tb__name_check(o.channels[n_channels], TB_NAME_MAX) < 0)
      return TB_ENAME;
  }
  if (o.socket_path != NULL) {
    if (strlen(o.socket_path) >= sizeof(path))
      return TB_EINVAL;
    memcpy(path, o.socket_path, strlen(o.socket_path) + 1);
  } else if (tb_default_socket_path(path, sizeof(path)) < 0) {
    return TB_EINVAL;
  }

  rc = open_socket(path, &fd);
  if (rc < 0)
    return rc;
  {
    /* Bound every send: a daemon that stops reading must not hang a
     * deleter (which sends while holding the connection's small lock). */
    int ms = o.timeout_ms > 0 ? o.timeout_ms : TB__DEFAULT_TIMEOUT_MS;
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }

  c = calloc(1, sizeof(*c));
  if (c == NULL) {
    rc = TB_ENOMEM;
    goto out_close;
  }
  k = calloc(1, sizeof(*k));
  if (k == NULL) {
    rc = TB_ENOMEM;
    goto out_free_client;
  }
  c->rbuf = malloc(TB__RECV_CAP);
  c->sbuf = malloc(TB__RECV_CAP);
  if (c->rbuf == NULL || c->sbuf == NULL) {
    rc = TB_ENOMEM;
    goto out_free_conn;
  }
  for (int i = 0; i < TB__ARENAS; i++) {
    /* else malloc, and decoded in full each time */
    if (tb__arena_init(&c->arena[i], TB__ARENA_SIZE) == 0 &&
        tb__keep_init(&c->keep[i]) == 0)
      c->arena[i].keep = &c->keep[i];
  }
  pthread_mutex_init(&k->lock, NULL);
  pthread_mutex_init(&c->call_lock, NULL);
  k->refs = 1;
  k->fd = fd;
  k->contract = o.stream_contract;
  c->conn = k;
  c->next_request_id = 1;
  c->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : TB__DEFAULT_TIMEOUT_MS;
  c->spin_ns = (uint64_t)o.spin_us * 1000;
  c->spin_auto = spin_auto;
  c->prefetch = !o.no_prefetch;
  c->max_message = TB__DEFAULT_MAX_MESSAGE;
  c->max_ndim = TB__DEFAULT_MAX_NDIM;
  c->max_metadata = TB__DEFAULT_MAX_METADATA;

  rc = hello_send(c, name, o.stream_contract, o.channels, n_channels,
                  &hello_id);
  if (rc == 0) {
    tb__kinds_connect_begin(c); /* their requests follow the Hello */
    rc = hello_reply(c, hello_id);
    tb__kinds_connect_end(c, rc == 0);
  }
  if (rc < 0) {
    /* closed before saying hello (TB_EDISCONNECTED): TB_ECONNECT */
    rc = hello_failed(c, path, rc);
    tb_client_disconnect(c);
    return rc;
  }
  {
    /* without it, a lost connection is only "closed", never "restarted" */
    struct stat st;
    if (stat(path, &st) == 0) {
      memcpy(c->sock_path, path, sizeof(c->sock_path));
      c->sock_dev = st.st_dev;
      c->sock_ino = st.st_ino;
      c->sock_ctime = st.st_ctim;
    }
  }
  *out = c;
  return 0;

out_free_conn:
  free(c->rbuf);
  free(c->sbuf);
  for (int i = 0; i < TB__ARENAS; i++) {
    tb__arena_fini(&c->arena[i]);
    tb__keep_fini(&c->keep[i]);
  }
  free(k);
out_free_client:
  free(c);
out_close:
  close(fd);
  return rc;
}

int tb_client_connect(const struct tb_connect_options *opts, tb_client **out) {
  int rc;

  connect_err[0] = '\0';
  connect_err_len = 0;
  rc = client_connect(opts, out);
  if (rc < 0 && connect_err_len == 0)
    connect_fail(rc, "cannot connect: %s (%s)", tb_strerror(rc),
                 tb_err_name(rc));
  return rc;
}

void tb_client_disconnect(tb_client *c) {
  struct tb__conn *k;

  if (c == NULL)
    return;
  k = c->conn;
  tb__buffers_free_all(c);
  tb__kinds_client_free(c);
  tb__hints_free(c);
  tb__freed_free_all(c);
  pthread_mutex_lock(&k->lock);
  if (c->pid == getpid())
    tb__leases_end_all_locked(k);
  if ((c->features & TENSORBROKER__V1__FEATURE__FEATURE_GOODBYE) &&
      c->pid == getpid() && !k->closed && k->fd >= 0 &&
      !__atomic_load_n(&k->dead, __ATOMIC_ACQUIRE)) {
    /* closing on purpose: a session that ends without this one crashed
     * or was killed, and its consumers are told so (not from a forked
     * child, which only lets go of its copy of the socket). Never waits:
     * a daemon that does not read gets no Goodbye. */
    Tensorbroker__V1__Goodbye gb = TENSORBROKER__V1__GOODBYE__INIT;
    tb__request r = TENSORBROKER__V1__REQUEST__INIT;
    uint8_t buf[16];
    long n;
    r.body_case = TENSORBROKER__V1__REQUEST__BODY_GOODBYE;
    r.goodbye = &gb;
    n = tb__request_encode(&r, buf, sizeof(buf));
    if (n > 0)
      (void)tb__wire_send(k->fd, buf, (size_t)n, NULL, 0, MSG_DONTWAIT);
  }
  k->closed = 1;
  tb__map_drop_unused_locked(k);
  /* Closing the socket ends the session: the daemon releases its leases.
   * Deleters that run later see closed and send nothing. */
  if (k->fd >= 0) {
    close(k->fd);
    k->fd = -1;
  }
  pthread_mutex_unlock(&k->lock);
  tb__conn_unref(k);
  pthread_mutex_destroy(&c->call_lock);
  free(c->notices);
  free(c->rbuf);
  free(c->sbuf);
  for (int i = 0; i < TB__ARENAS; i++) {
    tb__arena_fini(&c->arena[i]);
    tb__keep_fini(&c->keep[i]);
  }
  free(c);
}

int tb_client_fd(const tb_client *c) { return c ? c->conn->fd : -1; }

uint64_t tb_client_session_id(const tb_client *c) {
  return c ? c->session_id : 0;
}

int tb_client_contract(const tb_client *c) {
  return c ? c->conn->contract : TB_EINVAL;
}

/* ---- notices and subscriptions ---- */

int tb_client_poll_notice(tb_client *c, struct tb_notice *out,
                          int timeout_ms) {
  uint64_t deadline;
  int rc = 0;

  if (c == NULL || out == NULL)
    return TB_EINVAL;
  deadline = timeout_ms < 0 ? UINT64_MAX : tb__now_ms() + (uint64_t)timeout_ms;
  tb__leases_retry(c->conn);
  pthread_mutex_lock(&c->call_lock);
  for (;;) {
    uint64_t now;
    int wait;
    if (c->nq_len > 0) {
      *out = c->notices[c->nq_head];
      c->nq_head = (c->nq_head + 1) % c->nq_cap;
      c->nq_len--;
      rc = 0;
      break;
    }
    now = tb__now_ms();
    wait = deadline == UINT64_MAX ? -1
           : now >= deadline      ? 0
           : deadline - now > INT32_MAX ? INT32_MAX
                                        : (int)(deadline - now);
    rc = tb__pump(c, wait);
    if (rc < 0)
      break;
    if (rc == 0) {
      rc = TB_EAGAIN;
      break;
    }
  }
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

static int sub_call(tb_client *c, const char *channel, int subscribe) {
  Tensorbroker__V1__Subscribe s = TENSORBROKER__V1__SUBSCRIBE__INIT;
  Tensorbroker__V1__Unsubscribe u = TENSORBROKER__V1__UNSUBSCRIBE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  int rc;

  if (c == NULL)
    return TB_EINVAL;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  if (tb__name_check(channel, TB_NAME_MAX) < 0) {
    rc = tb__set_error(c, TB_ENAME, "invalid channel name");
    goto out_unlock;
  }
  if (subscribe) {
    s.channel = (char *)channel;
    r.body_case = TENSORBROKER__V1__REQUEST__BODY_SUBSCRIBE;
    r.subscribe = &s;
  } else {
    u.channel = (char *)channel;
    r.body_case = TENSORBROKER__V1__REQUEST__BODY_UNSUBSCRIBE;
    r.unsubscribe = &u;
  }
  rc = call_simple(c, &r);
out_unlock:
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

int tb_subscribe(tb_client *c, const char *channel) {
  return sub_call(c, channel, 1);
}

int tb_unsubscribe(tb_client *c, const char *channel) {
  return sub_call(c, channel, 0);
}
