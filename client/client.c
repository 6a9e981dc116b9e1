/* SPDX-License-Identifier: Apache-2.0 */
/* A client: connect (options, the socket path, errors in words, the Hello
 * with the memory kinds' work around it), disconnect, and the features
 * above the RPC core's hooks: notices dispatched to the mapping cache,
 * version-free table, channels named at connect and memory kinds, then
 * queued for tb_client_poll_notice; a late acquire reply's lease ended;
 * subscriptions. */
#include "client_internal.h"

#include <errno.h>
#include <grp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "kind.h"

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
  if (c->notice_waiting) {
    /* it sleeps without call_lock (rpc.c) */
    c->notice_wakes++;
    tb__wake(c->notice_wake);
  }
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
  case TENSORBROKER__V1__NOTICE__BODY_EVENTS_GONE:
    /* the library's own bookkeeping: nothing for the application */
    tb__freed_events_gone(c, no->events_gone->event_ids,
                          no->events_gone->n_event_ids);
    return;
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

static const struct tb__rpc_hooks client_hooks = {
    .notice = handle_notice,
    .stale_reply = handle_stale_reply,
};

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

/* Open k's socket (tracked from the start: a child forked meanwhile
 * closes its copy) and connect it to path; on failure k has none. */
static int open_socket(const char *path, struct tb__conn *k) {
  struct sockaddr_un sa;
  size_t len = strlen(path);
  int err;

  if (len == 0 || len >= sizeof(sa.sun_path))
    return connect_fail(TB_EINVAL, "socket path '%s' is empty or longer "
                                   "than %zu bytes", path,
                        sizeof(sa.sun_path) - 1);
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, len + 1);
  if (tb__fork_socket(k, AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0) < 0)
    return connect_fail(TB_ESYS, "cannot connect to %s: socket: %s", path,
                        strerror(errno));
  if (connect(k->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    err = errno;
    tb__fork_close(k);
    return connect_refused(path, err);
  }
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

static int client_connect(const struct tb_connect_options *opts,
                          tb_client **out) {
  struct tb_connect_options o;
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  const char *name;
  struct tb_client *c;
  struct tb__conn *k;
  uint64_t hello_id = 0;
  size_t n_channels = 0;
  int rc, spin_auto = 0;

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

  c = calloc(1, sizeof(*c));
  if (c == NULL)
    return TB_ENOMEM;
  tb__client_serial(c);
  c->notice_wake = -1;
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
  k->fd = -1;
  rc = open_socket(path, k);
  if (rc < 0)
    goto out_free_conn;
  {
    /* Bound every send: a daemon that stops reading must not hang a
     * deleter (which sends while holding the connection's small lock). */
    int ms = o.timeout_ms > 0 ? o.timeout_ms : TB__DEFAULT_TIMEOUT_MS;
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    (void)setsockopt(k->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  pthread_mutex_init(&k->lock, NULL);
  pthread_mutex_init(&c->call_lock, NULL);
  pthread_mutex_init(&c->park_lock, NULL);
  pthread_mutex_init(&c->notice_lock, NULL);
  k->refs = 1;
  k->contract = o.stream_contract;
  c->conn = k;
  c->next_request_id = 1;
  c->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : TB__DEFAULT_TIMEOUT_MS;
  c->spin_ns = (uint64_t)o.spin_us * 1000;
  c->spin_auto = spin_auto;
  c->prefetch = !o.no_prefetch;
  c->interruptible = o.interruptible != 0;
  c->max_message = TB__DEFAULT_MAX_MESSAGE;
  c->max_ndim = TB__DEFAULT_MAX_NDIM;
  c->max_metadata = TB__DEFAULT_MAX_METADATA;

  c->hooks = &client_hooks;
  /* The kinds are advertised without probing a driver, so that a host-only
   * client never loads CUDA; a CUDA acquire without a driver fails with
   * TB_ENOCUDA. */
  rc = tb__hello_send(c, name, o.stream_contract, o.channels, n_channels,
                      tb__kinds_mask(), &hello_id);
  if (rc == 0) {
    tb__server_message *m = NULL;
    tb__kinds_connect_begin(c); /* their requests follow the Hello */
    rc = tb__hello_reply(c, hello_id, &m);
    if (rc == 0) {
      if (c->prefetch)
        tb__hints_keep(c, m->reply->hello);
      tb__msg_free(c, m);
    }
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

/* The client's own memory (not its connection's). */
static void client_free(struct tb_client *c) {
  tb__client_wake_free(c);
  free(c->notices);
  free(c->rbuf);
  free(c->sbuf);
  for (int i = 0; i < TB__ARENAS; i++) {
    tb__arena_fini(&c->arena[i]);
    tb__keep_fini(&c->keep[i]);
  }
  free(c);
}

void tb_client_disconnect(tb_client *c) {
  struct tb__conn *k;

  if (c == NULL)
    return;
  k = c->conn;
  tb__hints_free(c);
  tb__freed_free_all(c);
  if (tb__conn_forked(k)) {
    /* inherited across fork(): the socket is closed already (rpc.c); the
     * parent's session, buffers, leases and locks are left as they are,
     * and this process's copies of the mappings stay until it exits */
    client_free(c);
    return;
  }
  tb__buffers_free_all(c);
  tb__kinds_client_free(c);
  pthread_mutex_lock(&k->lock);
  tb__leases_end_all_locked(k);
  if ((c->features & TENSORBROKER__V1__FEATURE__FEATURE_GOODBYE) &&
      !k->closed && k->fd >= 0 &&
      !__atomic_load_n(&k->dead, __ATOMIC_ACQUIRE)) {
    /* closing on purpose: a session that ends without this one crashed
     * or was killed, and its consumers are told so. Never waits: a daemon
     * that does not read gets no Goodbye. */
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
  tb__fork_close(k);
  pthread_mutex_unlock(&k->lock);
  tb__conn_unref(k);
  pthread_mutex_destroy(&c->call_lock);
  pthread_mutex_destroy(&c->park_lock);
  pthread_mutex_destroy(&c->notice_lock);
  client_free(c);
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
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  tb__leases_retry(c->conn);
  /* one waiting poll at a time (it sleeps without call_lock: rpc.c); a
   * poll that does not wait goes by it */
  if (timeout_ms != 0)
    pthread_mutex_lock(&c->notice_lock);
  pthread_mutex_lock(&c->call_lock);
  if (c->nq_len == 0) {
    if (timeout_ms == 0) {
      while (c->nq_len == 0 && (rc = tb__pump(c, 0)) > 0) {
      }
    } else {
      rc = tb__wait_notice(c, deadline, c->interruptible);
    }
  }
  if (c->nq_len > 0) {
    *out = c->notices[c->nq_head];
    c->nq_head = (c->nq_head + 1) % c->nq_cap;
    c->nq_len--;
    rc = 0;
  } else if (rc >= 0) {
    rc = TB_EAGAIN;
  }
  pthread_mutex_unlock(&c->call_lock);
  if (timeout_ms != 0)
    pthread_mutex_unlock(&c->notice_lock);
  return rc;
}

static int sub_call(tb_client *c, const char *channel, int subscribe) {
  Tensorbroker__V1__Subscribe s = TENSORBROKER__V1__SUBSCRIBE__INIT;
  Tensorbroker__V1__Unsubscribe u = TENSORBROKER__V1__UNSUBSCRIBE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  int rc;

  if (c == NULL)
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
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
  rc = tb__call_simple(c, &r);
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
