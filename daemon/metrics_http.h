/* SPDX-License-Identifier: Apache-2.0 */
/* --metrics-listen: the metrics (metrics.c) over HTTP for a Prometheus
 * scraper, on a Unix stream socket or a loopback TCP port. Only
 * GET /metrics (or /): one request per connection, answered and closed.
 * Every connection is bounded in bytes, time and number, and served
 * without blocking the loop (docs/deploy.md, "Metrics"). */
#ifndef TBD_METRICS_HTTP_H
#define TBD_METRICS_HTTP_H

#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <uv.h>

struct tbd_registry;

/* The longest request (line and headers) read, the time a connection has
 * to send it, then to take the answer, and the connections served at
 * once (more are answered 503 and closed). */
#define TBD_HTTP_REQUEST_MAX 8192
#define TBD_HTTP_TIMEOUT_MS 5000
#define TBD_HTTP_CONNS_MAX 16

enum tbd_http_kind { TBD_HTTP_UNIX = 1, TBD_HTTP_TCP = 2 };

struct tbd_http_addr {
  enum tbd_http_kind kind;
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* UNIX */
  struct sockaddr_storage sa;                              /* TCP */
};

/* Parse "unix:/path", "tcp:127.0.0.1:PORT" (any 127.0.0.0/8 address) or
 * "tcp:[::1]:PORT" (PORT 0: one the kernel picks). Anything else, a
 * non-loopback address above all, is refused: 0, or -1 with why filled. */
int tbd_http_addr_parse(const char *s, struct tbd_http_addr *a, char *why,
                        size_t whylen);

struct tbd_http_conn;

struct tbd_http {
  uv_loop_t *loop;
  struct tbd_registry *reg;
  struct tbd_http_addr addr;
  union {
    uv_handle_t h;
    uv_stream_t s;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  } listener;
  int listening;
  struct tbd_http_conn *conns;
  unsigned nconns;
  char where[128]; /* the address served, for the log */
};

/* Listen on a (a Unix socket gets mode and replaces a stale socket file)
 * and serve reg's metrics on loop. 0, or -1 after logging why. */
int tbd_http_start(struct tbd_http *h, uv_loop_t *loop,
                   struct tbd_registry *reg, const struct tbd_http_addr *a,
                   unsigned mode);
/* Close the listener and every connection (their handles close in the
 * loop), remove a Unix socket file. Safe to call when not started. */
void tbd_http_stop(struct tbd_http *h);

#endif /* TBD_METRICS_HTTP_H */
