/* SPDX-License-Identifier: Apache-2.0 */
/* The daemon's sockets: the listening socket, one uv_poll_t per session,
 * datagram I/O with descriptors, per-session bounded out-queues, and the
 * timer that expires parked waits. All registry output arrives here. */
#ifndef TBD_SERVER_H
#define TBD_SERVER_H

#include <stdbool.h>
#include <uv.h>

#include "config.h"
#include "registry.h"

struct tbd_conn;

struct tbd_server {
  uv_loop_t *loop;
  struct tbd_registry *reg;
  struct tbd_latency *latency; /* the registry's request histogram */
  struct tbd_limits lim;
  const char *socket_path;
  int listen_fd;
  int reserve_fd;            /* spent on EMFILE to accept-and-close */
  uv_poll_t listen_poll;
  uv_timer_t timer;
  uv_timer_t hello_timer;    /* closes connections that never say Hello */
  uv_check_t check;          /* reads the sessions marked readable */
  uv_idle_t spin;            /* --busy-poll: active while the loop polls */
  uint64_t spin_until_ns;
  uint64_t spin_began_ns;    /* when the current polling period began */
  struct tb__poll_cpus spin_cpus; /* --busy-poll auto: CPUs to spare? */
  uint8_t *rxbuf;            /* lim.max_message bytes */
  uint8_t *txbuf;            /* TB__MAX_MESSAGE_HARD bytes */
  struct tb__arena arena;    /* the request being handled is decoded here */
  struct tbd_conn *conns;
  struct tbd_conn *doomed;
  struct tbd_conn *pending;  /* readable, to be read in the check phase */
  uint32_t nconns;
  uint32_t nrefused;         /* connections admitted to be refused (the
                                reserve: --fd-reserve) */
  uint32_t fd_all;           /* descriptors for clients, reserve included */
  uint64_t outq_total;       /* bytes queued for all sessions */
  uint64_t trim_bytes;       /* queued bytes freed since the last trim */
  int stopping;
  int keep_socket_file;      /* not ours (systemd's): never unlinked */
};

/* Start serving listen_fd (listening, non-blocking) on loop. The server
 * owns listen_fd from now on. Returns 0 or a negative TB_E* code. */
int tbd_server_init(struct tbd_server *srv, uv_loop_t *loop,
                    const struct tbd_limits *lim, int listen_fd,
                    const char *socket_path);
/* New limits (SIGHUP), for the server and its registry
 * (tbd_registry_set_limits). */
void tbd_server_set_limits(struct tbd_server *srv,
                           const struct tbd_limits *lim);
/* Send DaemonClosing to everyone, close every session and handle, remove
 * the socket file. The loop then runs out. */
void tbd_server_shutdown(struct tbd_server *srv, const char *reason);
/* After the loop has run out: free what is left (the registry). */
void tbd_server_free(struct tbd_server *srv);

/* The emit callback the registry uses (exposed for the tests). */
void tbd_server_emit(void *ud, struct tbd_session *s,
                     const tb__server_message *m, const int *fds, int nfds);

/* Make the Unix socket path ours for a listener of type (SOCK_SEQPACKET
 * for the daemon, SOCK_STREAM for the metrics): 0 when nothing is there,
 * or a stale socket file was (removed; *stale true); -EEXIST when the path
 * is not a socket, -EADDRINUSE when something answers there, else another
 * -errno. Nothing is ever replaced but a socket nobody listens on. */
int tbd_socket_path_claim(const char *path, int type, bool *stale);

#endif /* TBD_SERVER_H */
