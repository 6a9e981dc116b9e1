/* SPDX-License-Identifier: Apache-2.0 */
/* A very small HTTP/1.x server for one resource, on libuv streams so that
 * nothing it does can block the loop: a scraper that sends nothing, sends
 * too much or reads slowly only holds its own connection, until
 * TBD_HTTP_TIMEOUT_MS closes it. No HTTP library: Debian 12's small ones
 * (libmicrohttpd) bring their own threads or event loop, and one request
 * line is all there is to parse. */
#include "metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tensorbroker/errors.h>

#include "alloc.h"
#include "config.h"
#include "log.h"
#include "metrics.h"
#include "registry.h"
#include "server.h"

enum conn_state { READING, WRITING, DRAINING };

struct tbd_http_conn {
  struct tbd_http *h;
  union {
    uv_handle_t h;
    uv_stream_t s;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  } u;
  uv_timer_t timer;
  uv_write_t wr;
  uv_shutdown_t sd;
  enum conn_state state;
  bool closing;
  bool fd_counted;   /* counted in the registry's descriptors */
  int open_handles;  /* stream and timer: freed when both closed */
  size_t reqlen;
  char *body;        /* the answer's body (tbd_metrics_render's, or NULL) */
  char head[256];
  char req[TBD_HTTP_REQUEST_MAX];
  struct tbd_http_conn *next, *prev;
};

/* ---- the address ---- */


static int parse_tcp(const char *s, struct tbd_http_addr *a, char *why,
                     size_t whylen) {
  char host[64];
  const char *colon;
  uint32_t port;
  size_t n;

  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (close == NULL || close[1] != ':')
      goto out_form;
    n = (size_t)(close - s - 1);
    colon = close + 1;
    s++;
  } else {
    colon = strrchr(s, ':');
    if (colon == NULL)
      goto out_form;
    n = (size_t)(colon - s);
  }
  if (n == 0 || n >= sizeof(host) ||
      tbd_parse_u32(colon + 1, 10, 0, 65535, &port) < 0)
    goto out_form;
  memcpy(host, s, n);
  host[n] = '\0';
  memset(&a->sa, 0, sizeof(a->sa));
  if (strchr(host, ':') == NULL) {
    struct sockaddr_in *in = (struct sockaddr_in *)&a->sa;
    if (inet_pton(AF_INET, host, &in->sin_addr) != 1)
      goto out_form;
    if ((ntohl(in->sin_addr.s_addr) >> 24) != 127)
      goto out_remote;
    in->sin_family = AF_INET;
    in->sin_port = htons((uint16_t)port);
  } else {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&a->sa;
    if (inet_pton(AF_INET6, host, &in6->sin6_addr) != 1)
      goto out_form;
    if (!IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
      goto out_remote;
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)port);
  }
  a->kind = TBD_HTTP_TCP;
  return 0;

out_remote:
  snprintf(why, whylen, "%s is not a loopback address: the metrics are "
           "served on 127.0.0.0/8 or [::1] only (no authentication); put a "
           "proxy in front to serve them further",
           host);
  return -1;
out_form:
  snprintf(why, whylen, "'tcp:%s' is not tcp:127.0.0.1:PORT or "
           "tcp:[::1]:PORT (a numeric loopback address, a port 0..65535)",
           s[-1] == '[' ? s - 1 : s);
  return -1;
}

int tbd_http_addr_parse(const char *s, struct tbd_http_addr *a, char *why,
                        size_t whylen) {
  memset(a, 0, sizeof(*a));
  if (strncmp(s, "unix:", 5) == 0) {
    size_t n = strlen(s + 5);
    if (n == 0 || n >= sizeof(a->path)) {
      snprintf(why, whylen, "the path of unix:PATH must be 1..%zu bytes",
               sizeof(a->path) - 1);
      return -1;
    }
    memcpy(a->path, s + 5, n + 1);
    a->kind = TBD_HTTP_UNIX;
    return 0;
  }
  if (strncmp(s, "tcp:", 4) == 0)
    return parse_tcp(s + 4, a, why, whylen);
  snprintf(why, whylen, "'%s' is neither unix:PATH nor tcp:127.0.0.1:PORT "
           "nor tcp:[::1]:PORT", s);
  return -1;
}

/* ---- connections ---- */

static void on_conn_handle_closed(uv_handle_t *handle) {
  struct tbd_http_conn *c = handle->data;
  struct tbd_http *h = c->h;

  if (--c->open_handles > 0)
    return;
  if (c->fd_counted)
    tbd_registry_fds_give(h->reg, 1);
  if (c->next != NULL)
    c->next->prev = c->prev;
  if (c->prev != NULL)
    c->prev->next = c->next;
  else
    h->conns = c->next;
  tbd_free(c->body);
  free(c);
}

static void conn_close(struct tbd_http_conn *c) {
  if (c->closing)
    return;
  c->closing = true;
  /* not open any more for the cap: its handles close in a later turn of
   * the loop, after the peer may already have seen its end and connected
   * again */
  c->h->nconns--;
  uv_timer_stop(&c->timer);
  uv_close(&c->u.h, on_conn_handle_closed);
  uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

static void on_timeout(uv_timer_t *t) {
  struct tbd_http_conn *c = t->data;

  tbd_debug("metrics: %s connection timed out (%s)", c->h->where,
            c->state == READING ? "no whole request" : "answer not taken");
  conn_close(c);
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  struct tbd_http_conn *c = handle->data;

  (void)suggested;
  if (c->state == READING)
    *buf = uv_buf_init(c->req + c->reqlen,
                       (unsigned)(sizeof(c->req) - c->reqlen));
  else /* what comes after the request is read and dropped */
    *buf = uv_buf_init(c->req, (unsigned)sizeof(c->req));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* The answer went out and our side is shut: read until the client closes
 * (closing with its bytes unread would reset the connection, and could
 * discard the answer before the client read it). */
static void on_shutdown(uv_shutdown_t *req, int status) {
  struct tbd_http_conn *c = req->data;

  if (status < 0 || c->closing) {
    conn_close(c);
    return;
  }
  c->state = DRAINING;
  if (uv_read_start(&c->u.s, on_alloc, on_read) < 0)
    conn_close(c);
}

static void on_written(uv_write_t *req, int status) {
  struct tbd_http_conn *c = req->data;

  if (status < 0 || c->closing) {
    conn_close(c);
    return;
  }
  c->sd.data = c;
  if (uv_shutdown(&c->sd, &c->u.s, on_shutdown) < 0)
    conn_close(c);
}

static const char *reason(int code) {
  switch (code) {
  case 200: return "OK";
  case 400: return "Bad Request";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 500: return "Internal Server Error";
  default:  return "Service Unavailable";
  }
}

/* Send code with body (len bytes; c keeps a malloc'ed body in c->body),
 * then close. */
static void respond(struct tbd_http_conn *c, int code, const char *body,
                    size_t len) {
  uv_buf_t bufs[2];
  int n;

  if (c->state != READING)
    return;
  uv_read_stop(&c->u.s);
  c->state = WRITING;
  n = snprintf(c->head, sizeof(c->head),
               "HTTP/1.1 %d %s\r\n"
               "Content-Type: %s\r\n"
               "Content-Length: %zu\r\n"
               "%s"
               "Connection: close\r\n\r\n",
               code, reason(code),
               code == 200 ? "text/plain; version=0.0.4; charset=utf-8"
                           : "text/plain; charset=utf-8",
               len, code == 405 ? "Allow: GET\r\n" : "");
  bufs[0] = uv_buf_init(c->head, (unsigned)n);
  bufs[1] = uv_buf_init((char *)body, (unsigned)len);
  c->wr.data = c;
  uv_timer_start(&c->timer, on_timeout, TBD_HTTP_TIMEOUT_MS, 0);
  if (uv_write(&c->wr, &c->u.s, bufs, 2, on_written) < 0)
    conn_close(c);
}

static void respond_text(struct tbd_http_conn *c, int code, const char *msg) {
  respond(c, code, msg, strlen(msg));
}

/* The request line: METHOD SP TARGET SP HTTP/1.x, of printable ASCII. */
static int check_request_line(const char *line, size_t len,
                              const char **target, size_t *tlen) {
  const char *sp1, *sp2, *end = line + len;

  for (size_t i = 0; i < len; i++)
    if ((unsigned char)line[i] < 0x20 || (unsigned char)line[i] > 0x7e)
      return 400;
  sp1 = memchr(line, ' ', len);
  if (sp1 == NULL || sp1 == line)
    return 400;
  sp2 = memchr(sp1 + 1, ' ', (size_t)(end - sp1 - 1));
  if (sp2 == NULL || sp2 == sp1 + 1 || sp1[1] != '/' ||
      memchr(sp2 + 1, ' ', (size_t)(end - sp2 - 1)) != NULL)
    return 400;
  if (!((size_t)(end - sp2 - 1) == 8 &&
        (memcmp(sp2 + 1, "HTTP/1.0", 8) == 0 ||
         memcmp(sp2 + 1, "HTTP/1.1", 8) == 0)))
    return 400;
  if (sp1 - line != 3 || memcmp(line, "GET", 3) != 0)
    return 405;
  *target = sp1 + 1;
  *tlen = (size_t)(sp2 - sp1 - 1);
  return 0;
}

/* A whole request (line and headers) is in c->req: answer it. */
static void handle_request(struct tbd_http_conn *c) {
  const char *nl = memchr(c->req, '\n', c->reqlen), *target, *q;
  size_t len = (size_t)(nl - c->req), tlen;
  char *text;
  int code;

  if (len > 0 && c->req[len - 1] == '\r')
    len--;
  code = check_request_line(c->req, len, &target, &tlen);
  if (code == 400) {
    respond_text(c, 400, "bad request: GET /metrics HTTP/1.1 expected\n");
    return;
  }
  if (code == 405) {
    respond_text(c, 405, "only GET is served here\n");
    return;
  }
  q = memchr(target, '?', tlen);
  if (q != NULL)
    tlen = (size_t)(q - target);
  if (!((tlen == 8 && memcmp(target, "/metrics", 8) == 0) || tlen == 1)) {
    respond_text(c, 404, "not found: the metrics are at /metrics\n");
    return;
  }
  if (tbd_metrics_render(c->h->reg, NULL, &text, &len) < 0) {
    respond_text(c, 500, "out of memory\n");
    return;
  }
  c->body = text; /* freed with the connection */
  respond(c, 200, text, len);
}

/* The request ends at its first empty line. */
static bool request_whole(const struct tbd_http_conn *c) {
  for (size_t i = 1; i < c->reqlen; i++)
    if (c->req[i] == '\n' &&
        (c->req[i - 1] == '\n' ||
         (i >= 2 && c->req[i - 1] == '\r' && c->req[i - 2] == '\n')))
      return true;
  return false;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  struct tbd_http_conn *c = s->data;

  (void)buf;
  if (nread < 0) { /* the end, or an error: nothing more to do */
    conn_close(c);
    return;
  }
  if (c->state != READING)
    return;
  if (memchr(c->req + c->reqlen, '\0', (size_t)nread) != NULL) {
    respond_text(c, 400, "bad request: a NUL byte\n");
    return;
  }
  c->reqlen += (size_t)nread;
  if (request_whole(c))
    handle_request(c);
  else if (c->reqlen == sizeof(c->req))
    respond_text(c, 400, "bad request: longer than 8192 bytes\n");
}

static void on_connection(uv_stream_t *server, int status) {
  struct tbd_http *h = server->data;
  struct tbd_http_conn *c;
  int rc;

  if (status < 0) {
    tbd_warn("metrics: %s: %s", h->where, uv_strerror(status));
    return;
  }
  c = calloc(1, sizeof(*c));
  if (c == NULL) {
    tbd_error("metrics: out of memory; a connection waits in the backlog");
    return;
  }
  c->h = h;
  if (h->addr.kind == TBD_HTTP_TCP)
    rc = uv_tcp_init(h->loop, &c->u.tcp);
  else
    rc = uv_pipe_init(h->loop, &c->u.pipe, 0);
  if (rc < 0) {
    free(c);
    return;
  }
  c->u.h.data = c;
  uv_timer_init(h->loop, &c->timer);
  c->timer.data = c;
  c->open_handles = 2;
  c->next = h->conns;
  if (h->conns != NULL)
    h->conns->prev = c;
  h->conns = c;
  h->nconns++;
  if (uv_accept(server, &c->u.s) < 0) {
    conn_close(c);
    return;
  }
  uv_timer_start(&c->timer, on_timeout, TBD_HTTP_TIMEOUT_MS, 0);
  /* a connection is a descriptor like a client's (docs/limits.md) */
  c->fd_counted = h->nconns <= TBD_HTTP_CONNS_MAX &&
                  tbd_registry_fds_take(h->reg, 1, false) == 0;
  if (!c->fd_counted) {
    tbd_warn("metrics: %s: %u connections open or no descriptor to spare; "
             "answering 503", h->where, h->nconns - 1);
    respond_text(c, 503, "too many scrapes at once\n");
    return;
  }
  if (uv_read_start(&c->u.s, on_alloc, on_read) < 0)
    conn_close(c);
}

/* ---- the listener ---- */

static int listen_unix(struct tbd_http *h, unsigned mode) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  const char *path = h->addr.path;
  mode_t old;
  bool stale;
  int fd, rc = tbd_socket_path_claim(path, SOCK_STREAM, &stale);

  if (rc < 0) {
    tbd_error("--metrics-listen unix:%s: %s", path,
              rc == -EEXIST       ? "exists and is not a socket"
              : rc == -EADDRINUSE ? "another process listens there"
                                  : strerror(-rc));
    return -1;
  }
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    tbd_error("--metrics-listen: socket: %s", strerror(errno));
    return -1;
  }
  memcpy(sa.sun_path, path, strlen(path));
  old = umask(0777 & ~mode); /* never more open than asked */
  rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
  umask(old);
  if (rc < 0 || chmod(path, mode) < 0) {
    tbd_error("--metrics-listen unix:%s: %s", path, strerror(errno));
    if (rc == 0)
      unlink(path);
    close(fd);
    return -1;
  }
  /* from here tbd_http_stop() removes the file */
  snprintf(h->where, sizeof(h->where), "unix:%s", path);
  uv_pipe_init(h->loop, &h->listener.pipe, 0);
  h->listening = 1;
  rc = uv_pipe_open(&h->listener.pipe, fd);
  if (rc < 0)
    close(fd); /* not the handle's */
  else
    rc = uv_listen(&h->listener.s, 64, on_connection);
  if (rc < 0) {
    tbd_error("--metrics-listen unix:%s: %s", path, uv_strerror(rc));
    return -1;
  }
  return 0;
}

static int listen_tcp(struct tbd_http *h) {
  const struct sockaddr *sa = (const struct sockaddr *)&h->addr.sa;
  struct sockaddr_storage got;
  int len = sizeof(got), rc;
  char host[INET6_ADDRSTRLEN];
  uint16_t port;

  rc = uv_tcp_init_ex(h->loop, &h->listener.tcp, sa->sa_family);
  if (rc < 0) {
    tbd_error("--metrics-listen: a TCP socket: %s%s", uv_strerror(rc),
              rc == UV_EAFNOSUPPORT
                  ? " (a systemd unit's RestrictAddressFamilies= may forbid "
                    "it: docs/deploy.md, \"Metrics\")"
                  : "");
    return -1;
  }
  h->listening = 1;
  rc = uv_tcp_bind(&h->listener.tcp, sa, 0);
  if (rc == 0)
    rc = uv_listen(&h->listener.s, 64, on_connection);
  if (rc == 0)
    rc = uv_tcp_getsockname(&h->listener.tcp, (struct sockaddr *)&got, &len);
  if (rc < 0) {
    tbd_error("--metrics-listen: %s", uv_strerror(rc));
    return -1;
  }
  if (got.ss_family == AF_INET6) {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&got;
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    snprintf(h->where, sizeof(h->where), "tcp:[%s]:%u", host, port);
  } else {
    struct sockaddr_in *in = (struct sockaddr_in *)&got;
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    snprintf(h->where, sizeof(h->where), "tcp:%s:%u", host, port);
  }
  return 0;
}

int tbd_http_start(struct tbd_http *h, uv_loop_t *loop,
                   struct tbd_registry *reg, const struct tbd_http_addr *a,
                   unsigned mode) {
  int rc;

  memset(h, 0, sizeof(*h));
  h->loop = loop;
  h->reg = reg;
  h->addr = *a;
  h->listener.h.data = h;
  rc = a->kind == TBD_HTTP_UNIX ? listen_unix(h, mode) : listen_tcp(h);
  h->listener.h.data = h;
  if (rc < 0) {
    tbd_http_stop(h);
    return -1;
  }
  tbd_info("metrics: serving GET /metrics on %s", h->where);
  return 0;
}

void tbd_http_stop(struct tbd_http *h) {
  struct tbd_http_conn *c;

  if (!h->listening)
    return;
  h->listening = 0;
  uv_close(&h->listener.h, NULL);
  for (c = h->conns; c != NULL; c = c->next)
    conn_close(c);
  if (h->addr.kind == TBD_HTTP_UNIX && h->where[0] != '\0' &&
      unlink(h->addr.path) < 0 && errno != ENOENT)
    tbd_warn("unlink %s: %s", h->addr.path, strerror(errno));
}
