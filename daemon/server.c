/* SPDX-License-Identifier: Apache-2.0 */
/* Sockets and the loop. The daemon reads every session socket itself
 * (uv_poll_t + recvmsg) because libuv pipes cannot carry arbitrary
 * descriptors, and never blocks on a client: sends use MSG_DONTWAIT, what
 * does not go out waits in a bounded per-session queue flushed when the
 * socket turns writable, and a session whose queue overflows is dropped. */
#include "server.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <tensorbroker/errors.h>

#include "alloc.h"
#include "log.h"
#include "tb_proto.h"

/* Connections accepted per readable event of the listening socket. */
#define ACCEPT_BUDGET 32
/* Datagrams read from a hung-up session per call, before looking again. */
#define READ_BUDGET 32
/* Connections allowed beyond --max-sessions that have not said Hello. */
#define EXTRA_CONNS 64
/* Descriptors the daemon keeps for itself beyond those open at start (the
 * signal pipe, the accept-and-close spare, a file opened for a moment). */
#define FD_SLACK 16
/* Queued bytes freed before the memory is handed back to the system. */
#define TRIM_BYTES (1u << 20)

struct tbd_outmsg {
  struct tbd_outmsg *next;
  size_t len;
  size_t charge;  /* what it counts against the queue limits */
  int fds[TB__MAX_FDS];
  int nfds;
  uint8_t data[];
};

struct tbd_conn {
  struct tbd_server *srv;
  int fd;
  uv_poll_t poll;
  struct tbd_session *s;
  struct tbd_outmsg *outq, *outq_tail;
  size_t outq_bytes;            /* charged: see TBD_QUEUED_MSG_OVERHEAD */
  bool outq_counted;            /* also in its uid's and the total count */
  bool refused;                 /* in the reserve, to be refused at Hello */
  int events;
  int doomed;
  int pending;                  /* on srv->pending: read in the check phase */
  uint64_t hello_deadline;      /* ms; 0: none (said Hello, or no limit) */
  struct tbd_conn *pnext;
  struct tbd_conn *next, *prev; /* srv->conns */
  struct tbd_conn *dnext;       /* srv->doomed */
};

static void outmsg_free(struct tbd_server *srv, struct tbd_outmsg *m) {
  for (int i = 0; i < m->nfds; i++)
    close(m->fds[i]);
  if (m->nfds > 0)
    tbd_registry_fds_give(srv->reg, (uint32_t)m->nfds);
  srv->trim_bytes += m->charge;
  free(m);
}

/* glibc keeps freed small blocks in its heap, and a heap once grown by
 * queues stays grown: hand the free pages back once a megabyte of queued
 * messages went, so that what a dropped slow session took is returned. */
static void trim_memory(struct tbd_server *srv) {
  if (srv->trim_bytes < TRIM_BYTES)
    return;
#ifdef __GLIBC__
  malloc_trim(0);
#endif
  srv->trim_bytes = 0;
}

/* c's queued bytes leave its uid's and the server's count. */
static void outq_uncount(struct tbd_conn *c, size_t n) {
  if (!c->outq_counted || n == 0)
    return;
  *tbd_session_uid_outq(c->s) -= n;
  c->srv->outq_total -= n;
}

static void on_conn_poll(uv_poll_t *h, int status, int events);

static void conn_set_events(struct tbd_conn *c, int events) {
  if (c->doomed || events == c->events)
    return;
  c->events = events;
  uv_poll_start(&c->poll, events, on_conn_poll);
}

static void conn_doom(struct tbd_conn *c) {
  if (c->doomed)
    return;
  c->doomed = 1;
  /* what it had queued no longer counts against the others */
  outq_uncount(c, c->outq_bytes);
  c->outq_counted = false;
  tbd_session_mute(c->s);
  c->dnext = c->srv->doomed;
  c->srv->doomed = c;
}

/* A send failed with rc: a peer that closed its end (EPIPE, ECONNRESET)
 * hung up, as an end of stream read from it says, so that a death first
 * met by a send counts as one (tbd_session_abrupt). */
static void send_failed(struct tbd_conn *c, int rc) {
  if (rc == -EPIPE || rc == -ECONNRESET)
    tbd_session_hung_up(c->s);
}

/* Send what is queued; 0 when the queue is empty, 1 when the socket is
 * full, -1 when the connection failed. */
static int conn_flush(struct tbd_conn *c) {
  while (c->outq != NULL) {
    struct tbd_outmsg *m = c->outq;
    int rc = tb__wire_send(c->fd, m->data, m->len, m->fds, m->nfds,
                           MSG_DONTWAIT);
    if (rc == -EAGAIN || rc == -EWOULDBLOCK)
      return 1;
    if (rc < 0) {
      send_failed(c, rc);
      return -1;
    }
    c->outq = m->next;
    if (c->outq == NULL)
      c->outq_tail = NULL;
    c->outq_bytes -= m->charge;
    outq_uncount(c, m->charge);
    outmsg_free(c->srv, m);
  }
  return 0;
}

static void drop_slow(struct tbd_conn *c, const char *limit) {
  struct tbd_session *s = c->s;

  tbd_warn("session %llu (pid %d uid %u '%s'): %zu bytes unread (%s); "
           "dropping it",
           (unsigned long long)tbd_session_id(s), (int)tbd_session_pid(s),
           (unsigned)tbd_session_uid(s), tbd_session_name(s), c->outq_bytes,
           limit);
  tbd_registry_stats(c->srv->reg)->sessions_dropped++;
  conn_doom(c);
  /* its socket is full: what waited for it would never go, and other
   * sessions' messages may be queued before it is closed */
  while (c->outq != NULL) {
    struct tbd_outmsg *m = c->outq;
    c->outq = m->next;
    outmsg_free(c->srv, m);
  }
  c->outq_tail = NULL;
  c->outq_bytes = 0;
}

/* The live connection with the most bytes queued, of uid's sessions when
 * one_uid is set; NULL when none has any. */
static struct tbd_conn *largest_queue(struct tbd_server *srv, bool one_uid,
                                      uid_t uid) {
  struct tbd_conn *best = NULL;

  for (struct tbd_conn *k = srv->conns; k != NULL; k = k->next) {
    if (k->doomed || !k->outq_counted || k->outq_bytes == 0)
      continue;
    if (one_uid && tbd_session_uid(k->s) != uid)
      continue;
    if (best == NULL || k->outq_bytes > best->outq_bytes)
      best = k;
  }
  return best;
}

/* Make room for charge more bytes queued for c. Past --max-outq, c is
 * dropped; past the per-uid or the total limit, the session with the most
 * bytes queued (of that uid, or of all) is dropped, until the message fits
 * or c itself was dropped. Returns whether c may queue it. */
static bool outq_room(struct tbd_server *srv, struct tbd_conn *c,
                      size_t charge) {
  uint64_t *uq = tbd_session_uid_outq(c->s);
  bool per_uid = tbd_session_uid_limited(srv->reg, c->s);
  uid_t uid = tbd_session_uid(c->s);

  if (c->outq_bytes + charge > srv->lim.max_outq) {
    drop_slow(c, "--max-outq");
    return false;
  }
  for (;;) {
    struct tbd_conn *victim;
    const char *limit;

    if (per_uid && *uq + charge > srv->lim.max_outq_uid) {
      victim = largest_queue(srv, true, uid);
      limit = "--max-outq-per-uid";
    } else if (srv->outq_total + charge > srv->lim.max_outq_total) {
      victim = largest_queue(srv, false, 0);
      limit = "--max-outq-total";
    } else {
      return true;
    }
    if (victim == NULL || victim->outq_bytes < c->outq_bytes)
      victim = c;
    drop_slow(victim, limit);
    if (victim == c)
      return false;
  }
}

void tbd_server_emit(void *ud, struct tbd_session *s,
                     const tb__server_message *m, const int *fds, int nfds) {
  struct tbd_server *srv = ud;
  struct tbd_conn *c = tbd_session_conn(s);
  struct tbd_outmsg *q;
  size_t charge;
  long len;
  int rc;

  if (c->doomed)
    return;
  len = tb__server_message_encode(m, srv->txbuf, TB__MAX_MESSAGE_HARD);
  if (len < 0) {
    tbd_error("session %llu: message too large to encode; dropping session",
              (unsigned long long)tbd_session_id(s));
    conn_doom(c);
    return;
  }
  if (c->outq == NULL) {
    rc = tb__wire_send(c->fd, srv->txbuf, (size_t)len, fds, nfds,
                       MSG_DONTWAIT);
    if (rc == 0)
      return;
    if (rc != -EAGAIN && rc != -EWOULDBLOCK) {
      tbd_debug("session %llu: send: %s", (unsigned long long)tbd_session_id(s),
                strerror(-rc));
      send_failed(c, rc);
      conn_doom(c);
      return;
    }
  }
  charge = (size_t)len + TBD_QUEUED_MSG_OVERHEAD +
           (size_t)nfds * TBD_QUEUED_FD_BYTES;
  if (!outq_room(srv, c, charge))
    return;
  /* a queued descriptor is one more the daemon holds */
  if (nfds > 0 && tbd_registry_fds_take(srv->reg, (uint32_t)nfds, false) < 0) {
    tbd_warn("session %llu (pid %d '%s'): cannot queue a descriptor: the "
             "daemon is out of descriptors; dropping it",
             (unsigned long long)tbd_session_id(s), (int)tbd_session_pid(s),
             tbd_session_name(s));
    tbd_registry_stats(srv->reg)->sessions_dropped++;
    conn_doom(c);
    return;
  }
  q = malloc(sizeof(*q) + (size_t)len);
  if (q == NULL) {
    if (nfds > 0)
      tbd_registry_fds_give(srv->reg, (uint32_t)nfds);
    goto out_drop;
  }
  q->next = NULL;
  q->len = (size_t)len;
  q->charge = charge;
  q->nfds = 0;
  memcpy(q->data, srv->txbuf, (size_t)len);
  /* The registry's descriptors may be closed before the queue drains. */
  for (int i = 0; i < nfds; i++) {
    q->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0);
    if (q->fds[i] < 0) {
      tbd_registry_fds_give(srv->reg, (uint32_t)(nfds - q->nfds));
      q->charge = 0;
      outmsg_free(srv, q);
      goto out_drop;
    }
    q->nfds++;
  }
  if (c->outq_tail != NULL)
    c->outq_tail->next = q;
  else
    c->outq = q;
  c->outq_tail = q;
  c->outq_bytes += charge;
  c->outq_counted = true;
  *tbd_session_uid_outq(s) += charge;
  srv->outq_total += charge;
  conn_set_events(c, UV_READABLE | UV_DISCONNECT | UV_WRITABLE);
  return;

out_drop:
  tbd_error("session %llu: cannot queue a message (%s); dropping it",
            (unsigned long long)tbd_session_id(s), strerror(errno));
  tbd_registry_stats(srv->reg)->sessions_dropped++;
  conn_doom(c);
}

static void on_conn_closed(uv_handle_t *h) {
  struct tbd_conn *c = h->data;
  struct tbd_server *srv = c->srv;

  /* counted nowhere any more (conn_doom), only freed */
  while (c->outq != NULL) {
    struct tbd_outmsg *m = c->outq;
    c->outq = m->next;
    outmsg_free(srv, m);
  }
  close(c->fd);
  tbd_registry_fds_give(srv->reg, 1);
  if (c->refused)
    srv->nrefused--;
  free(c);
  trim_memory(srv);
}

/* Close doomed connections. Closing a session may notify others, whose
 * queues may overflow in turn, so this runs until nothing is left. */
static void reap(struct tbd_server *srv) {
  while (srv->doomed != NULL) {
    struct tbd_conn *c = srv->doomed;
    struct tbd_session *s = c->s;

    srv->doomed = c->dnext;
    conn_flush(c); /* best effort: an EPROTO reply, DaemonClosing */
    tbd_log_with(tbd_session_log_level(s),
                 &(struct tbd_log_fields){(long long)tbd_session_id(s),
                                          (long long)tbd_session_pid(s),
                                          (long long)tbd_session_uid(s), NULL},
                 "session %llu %s: pid %d uid %u name '%s'",
                 (unsigned long long)tbd_session_id(s),
                 tbd_session_abrupt(s) ? "ended without closing" : "closed",
                 (int)tbd_session_pid(s), (unsigned)tbd_session_uid(s),
                 tbd_session_name(s));
    tbd_session_close(srv->reg, s);
    if (c->next != NULL)
      c->next->prev = c->prev;
    if (c->prev != NULL)
      c->prev->next = c->next;
    else
      srv->conns = c->next;
    srv->nconns--;
    uv_poll_stop(&c->poll);
    uv_close((uv_handle_t *)&c->poll, on_conn_closed);
  }
}

static void on_timer(uv_timer_t *t);

static void rearm_timer(struct tbd_server *srv) {
  uint64_t deadline = tbd_registry_next_deadline(srv->reg), now;

  if (srv->stopping)
    return;
  if (deadline == UINT64_MAX) {
    uv_timer_stop(&srv->timer);
    return;
  }
  now = tb__now_ms();
  uv_timer_start(&srv->timer, on_timer, deadline > now ? deadline - now : 0,
                 0);
}

/* --busy-poll: while the idle handle is active, libuv polls without
 * sleeping; it stops once nothing has happened for busy_poll_us. */
static void on_spin(uv_idle_t *h) {
  struct tbd_server *srv = h->data;
  uint64_t now = tb__now_ns();

  if (now >= srv->spin_until_ns) {
    uv_idle_stop(h);
    tbd_registry_stats(srv->reg)->busy_poll_ns += now - srv->spin_began_ns;
  } else {
    sched_yield(); /* a client waiting for this CPU runs first */
  }
}

/* A request was read: poll for busy_poll_us from now (--busy-poll; by
 * default only with CPUs to spare). */
static void busy(struct tbd_server *srv) {
  uint64_t now;

  if (srv->lim.busy_poll_us == 0 || srv->stopping)
    return;
  if (srv->lim.busy_poll_auto && !tb__poll_cpus_ok(&srv->spin_cpus))
    return;
  now = tb__now_ns();
  srv->spin_until_ns = now + (uint64_t)srv->lim.busy_poll_us * 1000;
  if (!uv_is_active((uv_handle_t *)&srv->spin)) {
    uv_idle_start(&srv->spin, on_spin);
    srv->spin_began_ns = now;
    tbd_registry_stats(srv->reg)->busy_polls++;
  }
}

/* Every callback ends here: close what died, re-arm the wait timer. */
static void after(struct tbd_server *srv) {
  reap(srv);
  rearm_timer(srv);
}

static void on_timer(uv_timer_t *t) {
  struct tbd_server *srv = t->data;

  tbd_registry_expire(srv->reg);
  after(srv);
}

/* Read and handle up to budget datagrams. Returns 1 when the budget ran
 * out with more perhaps waiting, else 0. */
static int conn_read(struct tbd_conn *c, int budget) {
  struct tbd_server *srv = c->srv;
  int fds[TB__MAX_FDS];

  for (int i = 0; i < budget && !c->doomed; i++) {
    tb__request *req;
    int nfds = 0, rc;
    uint64_t t0;
    long n = tb__wire_recv(c->fd, srv->rxbuf, srv->lim.max_message, fds,
                           &nfds, MSG_DONTWAIT);

    if (n == -EAGAIN || n == -EWOULDBLOCK)
      return 0;
    if (n == 0) { /* end of stream (or an empty datagram: same thing) */
      tbd_session_hung_up(c->s);
      conn_doom(c);
      return 0;
    }
    if (n == -EMSGSIZE) {
      tbd_session_protocol_error(srv->reg, c->s, 0,
                                 "datagram larger than --max-message or "
                                 "with too many descriptors");
      conn_doom(c);
      return 0;
    }
    if (n < 0) {
      tbd_debug("session %llu: recv: %s",
                (unsigned long long)tbd_session_id(c->s), strerror((int)-n));
      tbd_session_hung_up(c->s); /* ECONNRESET and the like */
      conn_doom(c);
      return 0;
    }
    t0 = tb__now_ns(); /* the latency histogram: decoding and handling */
    if (tb__request_decode_in(&srv->arena, srv->rxbuf, (size_t)n, &req) < 0) {
      tb__arena_reset(&srv->arena);
      for (int k = 0; k < nfds; k++)
        close(fds[k]);
      tbd_session_protocol_error(srv->reg, c->s, 0, "undecodable datagram");
      conn_doom(c);
      return 0;
    }
    if (nfds < 0) {
      /* the kernel could not give us the descriptors it carried: say so
       * to that request, not "too large" (the datagram was fine) */
      tbd_session_fds_lost(srv->reg, c->s, req);
      tb__arena_reset(&srv->arena);
      continue;
    }
    rc = tbd_session_request(srv->reg, c->s, req, fds, nfds);
    tb__arena_reset(&srv->arena); /* frees req */
    tbd_latency_observe(srv->latency, tb__now_ns() - t0);
    if (rc < 0)
      conn_doom(c);
  }
  return !c->doomed;
}

/* Requests are read in the check phase, after every poll callback of this
 * loop iteration has run, while hang-ups are handled at once. So when a
 * client disconnects and then another client asks something, the daemon
 * has ended the first session before it answers the second, even if both
 * events come out of the same epoll_wait in the other order. (tbctl right
 * after a client died, tests that disconnect one client and ask another.) */
static void on_conn_poll(uv_poll_t *h, int status, int events) {
  struct tbd_conn *c = h->data;
  struct tbd_server *srv = c->srv;

  if (status == 0 && events == UV_READABLE) {
    /* the usual case: a request to read in the check phase; nothing
     * changed here, so nothing to reap or re-arm */
    if (!c->doomed && !c->pending) {
      c->pending = 1;
      c->pnext = srv->pending;
      srv->pending = c;
    }
    return;
  }
  if (status < 0) {
    tbd_session_hung_up(c->s); /* the socket failed: its peer is gone */
    conn_doom(c);
  } else {
    if ((events & UV_WRITABLE) && !c->doomed) {
      int rc = conn_flush(c);
      if (rc < 0)
        conn_doom(c);
      else if (rc == 0)
        conn_set_events(c, UV_READABLE | UV_DISCONNECT);
    }
    if ((events & UV_DISCONNECT) && !c->doomed) {
      /* what it sent before hanging up still counts, then end of stream */
      while (!c->doomed && conn_read(c, READ_BUDGET))
        ;
    } else if ((events & UV_READABLE) && !c->doomed && !c->pending) {
      c->pending = 1;
      c->pnext = srv->pending;
      srv->pending = c;
    }
  }
  after(srv);
}

static void on_check(uv_check_t *h) {
  struct tbd_server *srv = h->data;

  if (srv->pending != NULL)
    busy(srv);
  while (srv->pending != NULL) {
    struct tbd_conn *c = srv->pending;
    srv->pending = c->pnext;
    c->pending = 0;
    /* One datagram per session and iteration: a synchronous client's next
     * request then goes through epoll_wait again, together with any
     * hang-up that happened before it was sent. (Doomed sessions are freed
     * only in the closing phase, after this one.) */
    if (!c->doomed)
      conn_read(c, 1);
  }
  after(srv);
}

/* Close the connections whose Hello is overdue, re-arm for the next. The
 * sweep is linear, and runs only while a connection is waiting for its
 * Hello. */
static void hello_rearm(struct tbd_server *srv);

static void on_hello_timer(uv_timer_t *t) {
  struct tbd_server *srv = t->data;
  uint64_t now = tb__now_ms();

  for (struct tbd_conn *c = srv->conns; c != NULL; c = c->next) {
    if (c->doomed || c->hello_deadline == 0)
      continue;
    if (tbd_session_hello(c->s)) {
      c->hello_deadline = 0;
    } else if (c->hello_deadline <= now) {
      tbd_info("session %llu (pid %d): no Hello within %u ms; closing it",
               (unsigned long long)tbd_session_id(c->s),
               (int)tbd_session_pid(c->s), srv->lim.hello_timeout_ms);
      c->hello_deadline = 0;
      conn_doom(c);
    }
  }
  hello_rearm(srv);
  after(srv);
}

static void hello_rearm(struct tbd_server *srv) {
  uint64_t next = UINT64_MAX, now = tb__now_ms();

  if (srv->stopping)
    return;
  for (struct tbd_conn *c = srv->conns; c != NULL; c = c->next)
    if (!c->doomed && c->hello_deadline != 0 && c->hello_deadline < next)
      next = c->hello_deadline;
  if (next == UINT64_MAX)
    uv_timer_stop(&srv->hello_timer);
  else
    uv_timer_start(&srv->hello_timer, on_hello_timer,
                   next > now ? next - now : 0, 0);
}

/* Why a new connection cannot become a session ("" when it can): the
 * daemon is at its descriptor capacity (room: no descriptor but the
 * reserve's), or has as many connections as it takes. */
static void admission(struct tbd_server *srv, bool room, char *why,
                      size_t len) {
  why[0] = '\0';
  if (!room)
    tbd_registry_fds_why(srv->reg, why, len);
  else if (srv->nconns >= srv->lim.max_sessions + EXTRA_CONNS)
    snprintf(why, len, "the daemon has %u connections (--max-sessions %u, "
             "and %d more before Hello)",
             srv->nconns, srv->lim.max_sessions, EXTRA_CONNS);
}

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59 /* Linux 4.13; older C libraries lack it */
#endif

/* The supplementary groups of fd's peer, as the kernel recorded them at
 * connect (SO_PEERGROUPS), into s for access control: never from the
 * client. Where the kernel lacks it (before 4.13), the groups the uid has
 * in the group database now (getgrouplist), with a note in the log: those
 * may differ from the process's own. */
static void peer_groups(int fd, struct tbd_session *s, uid_t uid, gid_t gid) {
  static bool noted;
  gid_t stack[64], *g = stack;
  socklen_t len = sizeof(stack);
  int n = 0;

  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) == 0) {
    n = (int)(len / sizeof(gid_t));
  } else if (errno == ERANGE) { /* len now says how much it needs */
    g = malloc(len);
    if (g == NULL || getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) {
      tbd_warn("session %llu: cannot read its supplementary groups; judged "
               "by its uid and gid alone",
               (unsigned long long)tbd_session_id(s));
      free(g);
      return;
    }
    n = (int)(len / sizeof(gid_t));
  } else {
    struct passwd pw, *res = NULL;
    char buf[4096];

    if (!noted) {
      noted = true;
      tbd_info("SO_PEERGROUPS: %s; supplementary groups come from the "
               "group database (getgrouplist) instead",
               strerror(errno));
    }
    n = (int)(sizeof(stack) / sizeof(stack[0]));
    if (getpwuid_r(uid, &pw, buf, sizeof(buf), &res) != 0 || res == NULL ||
        getgrouplist(pw.pw_name, gid, stack, &n) < 0)
      n = 0;
  }
  if (tbd_session_set_groups(s, g, (size_t)n) < 0)
    tbd_warn("session %llu: out of memory for its groups; judged by its "
             "uid and gid alone", (unsigned long long)tbd_session_id(s));
  if (g != stack)
    free(g);
}

static void conn_accepted(struct tbd_server *srv, int fd) {
  struct ucred cred;
  socklen_t clen = sizeof(cred);
  struct tbd_conn *c;
  int sndbuf = (int)(2 * srv->lim.max_message + 65536);
  char why[256];
  bool room;

  /* A connection past the limits is still accepted while the reserve
   * lasts, so that its Hello is answered TB_ELIMIT naming the limit (and
   * root or the daemon's uid may still get in: --operator-sessions). */
  room = tbd_registry_fds_take(srv->reg, 1, false) == 0;
  if (!room && tbd_registry_fds_take(srv->reg, 1, true) < 0) {
    tbd_warn("out of descriptors, the reserve too (%u held); refusing a "
             "connection", tbd_registry_fds_held(srv->reg));
    close(fd);
    return;
  }
  admission(srv, room, why, sizeof(why));
  if (why[0] != '\0' && srv->nrefused >= srv->lim.fd_reserve) {
    tbd_warn("%s, and %u connections wait to be told so (--fd-reserve); "
             "refusing one", why, srv->nrefused);
    tbd_registry_fds_give(srv->reg, 1);
    close(fd);
    return;
  }
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
    tbd_warn("SO_PEERCRED: %s; refusing connection", strerror(errno));
    tbd_registry_fds_give(srv->reg, 1);
    close(fd);
    return;
  }
  /* a reply must fit in the send buffer as one datagram; best effort */
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  c = calloc(1, sizeof(*c));
  if (c == NULL)
    goto out_close;
  c->srv = srv;
  c->fd = fd;
  if (tbd_session_open(srv->reg, cred.pid, cred.uid, cred.gid, c, &c->s) < 0)
    goto out_free;
  peer_groups(fd, c->s, cred.uid, cred.gid);
  if (uv_poll_init(srv->loop, &c->poll, fd) < 0) {
    tbd_session_close(srv->reg, c->s);
    goto out_free;
  }
  c->poll.data = c;
  c->events = UV_READABLE | UV_DISCONNECT;
  uv_poll_start(&c->poll, c->events, on_conn_poll);
  if (why[0] != '\0') {
    c->refused = true;
    srv->nrefused++;
    tbd_session_refuse(c->s, why);
  }
  c->next = srv->conns;
  if (srv->conns != NULL)
    srv->conns->prev = c;
  srv->conns = c;
  srv->nconns++;
  if (srv->lim.hello_timeout_ms != 0) {
    c->hello_deadline = tb__now_ms() + srv->lim.hello_timeout_ms;
    if (!uv_is_active((uv_handle_t *)&srv->hello_timer))
      uv_timer_start(&srv->hello_timer, on_hello_timer,
                     srv->lim.hello_timeout_ms, 0);
  }
  tbd_debug("connection from pid %d uid %u gid %u (session %llu)",
            (int)cred.pid, (unsigned)cred.uid, (unsigned)cred.gid,
            (unsigned long long)tbd_session_id(c->s));
  return;

out_free:
  free(c);
out_close:
  tbd_error("out of memory; refusing connection");
  tbd_registry_fds_give(srv->reg, 1);
  close(fd);
}

static void on_listen_poll(uv_poll_t *h, int status, int events) {
  struct tbd_server *srv = h->data;

  (void)events;
  if (status < 0) {
    tbd_error("listening socket: %s", uv_strerror(status));
    return;
  }
  for (int i = 0; i < ACCEPT_BUDGET; i++) {
    int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

    if (fd >= 0) {
      conn_accepted(srv, fd);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED)
      continue;
    if ((errno == EMFILE || errno == ENFILE) && srv->reserve_fd >= 0) {
      /* Out of descriptors: accept and close, or the listening socket
       * would stay readable and spin the loop. */
      tbd_warn("out of file descriptors; refusing a connection");
      close(srv->reserve_fd);
      fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
      if (fd >= 0)
        close(fd);
      srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      tbd_warn("accept: %s", strerror(errno));
    break;
  }
  after(srv);
}

/* Descriptors this process has open now. */
static uint32_t fds_open(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  uint32_t n = 0;

  if (d == NULL)
    return 64; /* no /proc: a guess on the safe side */
  while ((e = readdir(d)) != NULL)
    n += e->d_name[0] != '.';
  closedir(d);
  return n > 0 ? n - 1 : 0; /* not the directory's own */
}

/* The descriptor budget: RLIMIT_NOFILE (main raised it), less what the
 * daemon holds itself and FD_SLACK; of the rest, --fd-reserve is kept for
 * connections that come when the daemon is full. */
static int fd_budget(struct tbd_server *srv) {
  struct rlimit rl;
  uint64_t nofile = 1024, base = fds_open() + FD_SLACK;

  if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
    nofile = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (1u << 24)
                 ? 1u << 24
                 : rl.rlim_cur;
  if (nofile < base + srv->lim.fd_reserve + 8) {
    tbd_error("RLIMIT_NOFILE %llu leaves no descriptors for clients (the "
              "daemon holds %llu, --fd-reserve %u): raise it, or --max-fds",
              (unsigned long long)nofile, (unsigned long long)base,
              srv->lim.fd_reserve);
    return TB_ELIMIT;
  }
  srv->fd_all = (uint32_t)(nofile - base);
  tbd_registry_set_fds(srv->reg, srv->fd_all - srv->lim.fd_reserve,
                       srv->fd_all, (uint32_t)nofile, srv->lim.fd_reserve);
  tbd_info("descriptors: %llu (RLIMIT_NOFILE), %u for clients, %u of them "
           "kept for connections that come when the daemon is full "
           "(--fd-reserve)",
           (unsigned long long)nofile, srv->fd_all, srv->lim.fd_reserve);
  return 0;
}

int tbd_server_init(struct tbd_server *srv, uv_loop_t *loop,
                    const struct tbd_limits *lim, int listen_fd,
                    const char *socket_path) {
  int rc;

  memset(srv, 0, sizeof(*srv));
  srv->loop = loop;
  srv->lim = *lim;
  srv->socket_path = socket_path;
  srv->listen_fd = listen_fd;
  srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  srv->rxbuf = malloc(lim->max_message);
  srv->txbuf = malloc(TB__MAX_MESSAGE_HARD);
  if (srv->rxbuf == NULL || srv->txbuf == NULL ||
      tb__arena_init(&srv->arena, 16384) < 0) {
    rc = TB_ENOMEM;
    goto out_free;
  }
  rc = tbd_registry_new(lim, tbd_server_emit, srv, &srv->reg);
  if (rc < 0)
    goto out_free;
  rc = fd_budget(srv);
  if (rc < 0) {
    tbd_registry_free(srv->reg);
    srv->reg = NULL;
    goto out_free;
  }
  tbd_registry_set_socket_path(srv->reg, socket_path);
  srv->latency = &tbd_registry_stats(srv->reg)->latency;
  /* an operator can always get in: root and the daemon's own uid */
  tbd_registry_set_operators(srv->reg, 0, geteuid());
  uv_timer_init(loop, &srv->timer);
  srv->timer.data = srv;
  uv_timer_init(loop, &srv->hello_timer);
  srv->hello_timer.data = srv;
  uv_check_init(loop, &srv->check);
  srv->check.data = srv;
  uv_check_start(&srv->check, on_check);
  uv_idle_init(loop, &srv->spin);
  srv->spin.data = srv;
  rc = uv_poll_init(loop, &srv->listen_poll, listen_fd);
  if (rc < 0) {
    tbd_error("uv_poll_init: %s", uv_strerror(rc));
    uv_close((uv_handle_t *)&srv->timer, NULL);
    uv_close((uv_handle_t *)&srv->hello_timer, NULL);
    uv_close((uv_handle_t *)&srv->check, NULL);
    uv_close((uv_handle_t *)&srv->spin, NULL);
    tbd_registry_free(srv->reg);
    srv->reg = NULL;
    rc = TB_ESYS;
    goto out_free;
  }
  srv->listen_poll.data = srv;
  uv_poll_start(&srv->listen_poll, UV_READABLE, on_listen_poll);
  return 0;

out_free:
  free(srv->rxbuf);
  free(srv->txbuf);
  srv->rxbuf = srv->txbuf = NULL;
  tb__arena_fini(&srv->arena);
  if (srv->reserve_fd >= 0)
    close(srv->reserve_fd);
  return rc;
}

void tbd_server_set_limits(struct tbd_server *srv,
                           const struct tbd_limits *lim) {
  srv->lim = *lim;
  tbd_registry_set_limits(srv->reg, lim);
}

static void on_listen_closed(uv_handle_t *h) {
  struct tbd_server *srv = h->data;

  close(srv->listen_fd);
  srv->listen_fd = -1;
}

void tbd_server_shutdown(struct tbd_server *srv, const char *reason) {
  struct tbd_conn *c;

  if (srv->stopping)
    return;
  srv->stopping = 1;
  tbd_info("shutting down: %s", reason);
  tbd_registry_broadcast_closing(srv->reg, reason);
  /* mute everyone first: nobody needs ChannelClosed now */
  for (c = srv->conns; c != NULL; c = c->next)
    conn_doom(c);
  reap(srv);
  uv_timer_stop(&srv->timer);
  uv_close((uv_handle_t *)&srv->timer, NULL);
  uv_timer_stop(&srv->hello_timer);
  uv_close((uv_handle_t *)&srv->hello_timer, NULL);
  uv_close((uv_handle_t *)&srv->check, NULL);
  uv_idle_stop(&srv->spin);
  uv_close((uv_handle_t *)&srv->spin, NULL);
  uv_poll_stop(&srv->listen_poll);
  uv_close((uv_handle_t *)&srv->listen_poll, on_listen_closed);
  if (srv->socket_path != NULL && !srv->keep_socket_file &&
      unlink(srv->socket_path) < 0 &&
      errno != ENOENT)
    tbd_warn("unlink %s: %s", srv->socket_path, strerror(errno));
}

void tbd_server_free(struct tbd_server *srv) {
  tbd_registry_free(srv->reg);
  srv->reg = NULL;
  free(srv->rxbuf);
  free(srv->txbuf);
  srv->rxbuf = srv->txbuf = NULL;
  tb__arena_fini(&srv->arena);
  if (srv->reserve_fd >= 0)
    close(srv->reserve_fd);
  srv->reserve_fd = -1;
}

int tbd_socket_path_claim(const char *path, int type, bool *stale) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  struct stat st;
  int fd, rc;

  *stale = false;
  if (strlen(path) >= sizeof(sa.sun_path))
    return -ENAMETOOLONG;
  if (lstat(path, &st) < 0)
    return errno == ENOENT ? 0 : -errno;
  if (!S_ISSOCK(st.st_mode))
    return -EEXIST;
  fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  memcpy(sa.sun_path, path, strlen(path));
  rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
  close(fd);
  if (rc == 0)
    return -EADDRINUSE;
  if (errno != ECONNREFUSED)
    return -errno;
  if (unlink(path) < 0 && errno != ENOENT)
    return -errno;
  *stale = true;
  return 0;
}
