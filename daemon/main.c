/* SPDX-License-Identifier: Apache-2.0 */
/* tensorbrokerd: options, the listening socket, signals, the loop. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <uv.h>

#include <tensorbroker/tensorbroker.h>

#include "acl.h"
#include "config.h"
#include "log.h"
#include "sd.h"
#include "server.h"

#define SYSTEM_SOCKET "/run/tensorbroker/tensorbroker.sock"
#define OPT_LIMIT_BASE 1000

enum {
  OPT_SOCKET = 's',
  OPT_HELP = 'h',
  OPT_VERSION = 'V',
  OPT_SOCKET_MODE = 256,
  OPT_LOG_LEVEL,
  OPT_READY_FD,
  OPT_EXEMPT_ROOT,
};

struct options {
  char socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
  int socket_is_system_default;
  int activated;              /* the socket came from systemd */
  unsigned mode;
  enum tbd_log_level level;
  int ready_fd;
  int done_events_set; /* --max-done-events given */
  struct tbd_limits lim;
};

static void usage(FILE *f) {
  fprintf(f,
          "Usage: tensorbrokerd [OPTION]...\n"
          "Broker zero-copy DLPack tensor exchange between processes.\n\n"
          "  -s, --socket PATH      listening socket (default "
          "$TENSORBROKER_SOCKET,\n"
          "                         else $XDG_RUNTIME_DIR/tensorbroker.sock, "
          "else\n"
          "                         " SYSTEM_SOCKET ")\n"
          "      --socket-mode OCTAL  permissions of the socket (default "
          "0660)\n"
          "      --log-level LEVEL  error, warn, info or debug (default "
          "info)\n"
          "      --ready-fd N       write \"READY\\n\" to descriptor N once "
          "listening,\n"
          "                         then close it (default: none)\n"
          "      --exempt-root      per-uid limits do not apply to uid 0 "
          "(default: they do)\n");
  for (unsigned i = 0; i < tbd_limit_count; i++) {
    const struct tbd_limit_desc *d = &tbd_limit_table[i];
    char flag[48];
    snprintf(flag, sizeof(flag), "--%s N", d->flag);
    fprintf(f, "      %-21s %s (default %u, %u..%u)\n", flag, d->help, d->def,
            d->min, d->max);
  }
  fprintf(f, "  -h, --help             this text\n"
             "  -V, --version          print the version\n\n"
             "SIGTERM or SIGINT: tell clients, close everything, remove the "
             "socket, exit 0.\n");
}

static int parse_u32(const char *s, int base, unsigned long min,
                     unsigned long max, uint32_t *out) {
  char *end;
  unsigned long v;

  if (s == NULL || *s == '\0' || *s == '-' || *s == '+')
    return -1;
  errno = 0;
  v = strtoul(s, &end, base);
  if (errno != 0 || *end != '\0' || v < min || v > max)
    return -1;
  *out = (uint32_t)v;
  return 0;
}

static int default_socket(struct options *o) {
  const char *env = getenv("TENSORBROKER_SOCKET");
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  int n;

  if (env != NULL && *env != '\0')
    n = snprintf(o->socket, sizeof(o->socket), "%s", env);
  else if (xdg != NULL && *xdg != '\0')
    n = snprintf(o->socket, sizeof(o->socket), "%s/tensorbroker.sock", xdg);
  else {
    n = snprintf(o->socket, sizeof(o->socket), "%s", SYSTEM_SOCKET);
    o->socket_is_system_default = 1;
  }
  return n < 0 || (size_t)n >= sizeof(o->socket) ? -1 : 0;
}

/* Returns -1 to continue, else the exit status. */
static int parse_options(int argc, char **argv, struct options *o) {
  struct option longopts[8 + 64];
  unsigned n = 0;
  int c, have_socket = 0;

  longopts[n++] = (struct option){"socket", required_argument, NULL, 's'};
  longopts[n++] =
      (struct option){"socket-mode", required_argument, NULL, OPT_SOCKET_MODE};
  longopts[n++] =
      (struct option){"log-level", required_argument, NULL, OPT_LOG_LEVEL};
  longopts[n++] =
      (struct option){"ready-fd", required_argument, NULL, OPT_READY_FD};
  longopts[n++] =
      (struct option){"exempt-root", no_argument, NULL, OPT_EXEMPT_ROOT};
  longopts[n++] = (struct option){"help", no_argument, NULL, 'h'};
  longopts[n++] = (struct option){"version", no_argument, NULL, 'V'};
  for (unsigned i = 0; i < tbd_limit_count; i++)
    longopts[n++] = (struct option){tbd_limit_table[i].flag,
                                    required_argument, NULL,
                                    OPT_LIMIT_BASE + (int)i};
  longopts[n] = (struct option){NULL, 0, NULL, 0};

  if (tbd_limit_count + 8 > sizeof(longopts) / sizeof(longopts[0])) {
    fprintf(stderr, "tensorbrokerd: too many options for the table\n");
    return 1;
  }
  memset(o, 0, sizeof(*o));
  o->mode = 0660;
  o->level = TBD_LOG_INFO;
  o->ready_fd = -1;
  tbd_limits_default(&o->lim);

  while ((c = getopt_long(argc, argv, "s:hV", longopts, NULL)) != -1) {
    uint32_t v;

    switch (c) {
    case 's':
      if (strlen(optarg) == 0 || strlen(optarg) >= sizeof(o->socket)) {
        fprintf(stderr, "tensorbrokerd: --socket: path must be 1..%zu "
                        "bytes\n", sizeof(o->socket) - 1);
        return 2;
      }
      snprintf(o->socket, sizeof(o->socket), "%s", optarg);
      have_socket = 1;
      break;
    case OPT_SOCKET_MODE:
      if (parse_u32(optarg, 8, 0, 0777, &v) < 0) {
        fprintf(stderr, "tensorbrokerd: --socket-mode: '%s' is not an octal "
                        "mode 0..0777\n", optarg);
        return 2;
      }
      o->mode = v;
      break;
    case OPT_LOG_LEVEL:
      if (tbd_log_parse_level(optarg, &o->level) < 0) {
        fprintf(stderr, "tensorbrokerd: --log-level: '%s' is not one of "
                        "error, warn, info, debug\n", optarg);
        return 2;
      }
      break;
    case OPT_READY_FD:
      if (parse_u32(optarg, 10, 0, INT_MAX, &v) < 0) {
        fprintf(stderr, "tensorbrokerd: --ready-fd: '%s' is not a "
                        "descriptor number\n", optarg);
        return 2;
      }
      o->ready_fd = (int)v;
      break;
    case OPT_EXEMPT_ROOT:
      o->lim.exempt_root = 1;
      break;
    case 'h':
      usage(stdout);
      return 0;
    case 'V':
      printf("tensorbrokerd %s (protocol %d)\n", TB_VERSION_STRING,
             TB_PROTOCOL_VERSION);
      return 0;
    default:
      if (c >= OPT_LIMIT_BASE && c < OPT_LIMIT_BASE + (int)tbd_limit_count) {
        const struct tbd_limit_desc *d = &tbd_limit_table[c - OPT_LIMIT_BASE];
        int busy_poll = d->offset == offsetof(struct tbd_limits, busy_poll_us);
        if (busy_poll && strcmp(optarg, "auto") == 0) {
          o->lim.busy_poll_us = d->def;
          o->lim.busy_poll_auto = 1;
          break;
        }
        if (busy_poll)
          o->lim.busy_poll_auto = 0;
        if (parse_u32(optarg, 10, d->min, d->max, &v) < 0) {
          fprintf(stderr, "tensorbrokerd: --%s: '%s' is not a number in "
                          "%u..%u%s\n", d->flag, optarg, d->min, d->max,
                  busy_poll ? " or 'auto'" : "");
          return 2;
        }
        *tbd_limit_field(&o->lim, d) = v;
        if (d->offset == offsetof(struct tbd_limits, max_done_events))
          o->done_events_set = 1;
        break;
      }
      fprintf(stderr, "Try 'tensorbrokerd --help'.\n");
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "tensorbrokerd: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (o->lim.max_metadata + 4096 > o->lim.max_message) {
    fprintf(stderr, "tensorbrokerd: --max-metadata %u leaves no room in "
                    "--max-message %u (need 4096 bytes more)\n",
            o->lim.max_metadata, o->lim.max_message);
    return 2;
  }
  /* the default fits itself to a smaller --max-message; a number given
   * must fit */
  if (!o->done_events_set &&
      (uint64_t)o->lim.max_done_events * TBD_DONE_EVENT_BYTES +
              TBD_VERSION_FREE_BASE >
          o->lim.max_message)
    o->lim.max_done_events = (o->lim.max_message - TBD_VERSION_FREE_BASE) /
                             TBD_DONE_EVENT_BYTES;
  if ((uint64_t)o->lim.max_done_events * TBD_DONE_EVENT_BYTES +
          TBD_VERSION_FREE_BASE >
      o->lim.max_message) {
    fprintf(stderr, "tensorbrokerd: --max-done-events %u needs %llu bytes "
                    "in a message; --max-message is %u\n",
            o->lim.max_done_events,
            (unsigned long long)o->lim.max_done_events *
                    TBD_DONE_EVENT_BYTES + TBD_VERSION_FREE_BASE,
            o->lim.max_message);
    return 2;
  }
  if (!have_socket && default_socket(o) < 0) {
    fprintf(stderr, "tensorbrokerd: default socket path too long; use "
                    "--socket\n");
    return 2;
  }
  return -1;
}

/* Make the socket path ours: refuse if a daemon answers there or the path
 * is not a socket, remove a stale socket file. */
static int claim_path(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  struct stat st;
  int fd, rc;

  if (lstat(path, &st) < 0) {
    if (errno == ENOENT)
      return 0;
    tbd_error("%s: %s", path, strerror(errno));
    return -1;
  }
  if (!S_ISSOCK(st.st_mode)) {
    tbd_error("%s exists and is not a socket; not replacing it", path);
    return -1;
  }
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    tbd_error("socket: %s", strerror(errno));
    return -1;
  }
  memcpy(sa.sun_path, path, strlen(path));
  rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
  close(fd);
  if (rc == 0) {
    tbd_error("another daemon is listening on %s; not starting", path);
    return -1;
  }
  if (errno != ECONNREFUSED) {
    tbd_error("cannot check %s: %s", path, strerror(errno));
    return -1;
  }
  tbd_info("removing stale socket %s", path);
  if (unlink(path) < 0 && errno != ENOENT) {
    tbd_error("unlink %s: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

static int listen_on(const struct options *o) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  mode_t old;
  int fd;

  if (o->socket_is_system_default &&
      mkdir("/run/tensorbroker", 0755) < 0 && errno != EEXIST) {
    tbd_error("mkdir /run/tensorbroker: %s", strerror(errno));
    return -1;
  }
  if (claim_path(o->socket) < 0)
    return -1;
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    tbd_error("socket: %s", strerror(errno));
    return -1;
  }
  memcpy(sa.sun_path, o->socket, strlen(o->socket));
  /* no window in which the socket is more open than asked */
  old = umask(0777 & ~o->mode);
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    tbd_error("bind %s: %s", o->socket, strerror(errno));
    umask(old);
    goto out_close;
  }
  umask(old);
  if (chmod(o->socket, o->mode) < 0) {
    tbd_error("chmod %s: %s", o->socket, strerror(errno));
    goto out_unlink;
  }
  if (listen(fd, 128) < 0) {
    tbd_error("listen %s: %s", o->socket, strerror(errno));
    goto out_unlink;
  }
  return fd;

out_unlink:
  unlink(o->socket);
out_close:
  close(fd);
  return -1;
}

/* The socket systemd passed: its path, for the logs and Status (--socket
 * and --socket-mode do not apply: the .socket unit decides). */
static void activated_path(int fd, struct options *o) {
  struct sockaddr_un sa;
  socklen_t len = sizeof(sa);

  o->activated = 1;
  memset(&sa, 0, sizeof(sa));
  if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0 &&
      len > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0] != '\0')
    snprintf(o->socket, sizeof(o->socket), "%.*s",
             (int)(len - offsetof(struct sockaddr_un, sun_path)),
             sa.sun_path);
  else
    snprintf(o->socket, sizeof(o->socket), "(socket passed by systemd)");
}

/* Raise the soft RLIMIT_NOFILE to the hard limit, or to --max-fds when
 * that is set (and lower), so that the daemon's descriptor budget is what
 * the operator allowed, not the login default (often 1024). */
static void raise_nofile(uint32_t max_fds) {
  struct rlimit rl;
  rlim_t want;

  if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
    tbd_warn("getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
    return;
  }
  want = rl.rlim_max;
  if (max_fds != 0 && (want == RLIM_INFINITY || max_fds < want))
    want = max_fds;
  else if (max_fds != 0 && max_fds > want)
    tbd_warn("--max-fds %u: the hard RLIMIT_NOFILE is %llu; using that",
             max_fds, (unsigned long long)want);
  if (want == RLIM_INFINITY || want > (1u << 24))
    want = 1u << 24;
  if (want == rl.rlim_cur)
    return;
  rl.rlim_cur = want;
  if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
    tbd_warn("setrlimit(RLIMIT_NOFILE, %llu): %s", (unsigned long long)want,
             strerror(errno));
}

static long read_long(const char *path) {
  FILE *f = fopen(path, "re");
  long v = -1;

  if (f != NULL) {
    if (fscanf(f, "%ld", &v) != 1)
      v = -1;
    fclose(f);
  }
  return v;
}

/* Whether a datagram of len bytes fits the send buffer an unprivileged
 * socket may have here (SO_SNDBUF, bounded by net.core.wmem_max): the
 * daemon's replies and the library's requests both need it, and the
 * library sizes its socket the same way (client/conn.c). */
static int check_send_buffer(uint32_t len) {
  int sv[2], val = (int)len + 4096, rc = 0;
  uint8_t *buf;
  ssize_t n;

  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
    tbd_error("socketpair: %s", strerror(errno));
    return -1;
  }
  buf = calloc(1, len);
  if (buf == NULL) {
    close(sv[0]);
    close(sv[1]);
    return -1;
  }
  (void)setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &val, sizeof(val));
  n = send(sv[0], buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n != (ssize_t)len) {
    tbd_error("--max-message %u: a datagram that long does not fit the "
              "send buffer of a socket here (%s; net.core.wmem_max is %ld, "
              "and a socket's buffer may be twice that): lower "
              "--max-message or raise net.core.wmem_max",
              len, n < 0 ? strerror(errno) : "short send",
              read_long("/proc/sys/net/core/wmem_max"));
    rc = -1;
  }
  free(buf);
  close(sv[0]);
  close(sv[1]);
  return rc;
}

/* With a service manager listening ($NOTIFY_SOCKET), the STATUS= line is
 * looked at this often and sent when it changed. */
#define STATUS_INTERVAL_MS 1000

/* TEMPORARY, until the configuration file (inih) lands: access rules from
 * the file $TBD_ACCESS_FILE names, in the configuration file's syntax
 * ([access] and [access "PREFIX"] sections of key = value lines), read at
 * start and at SIGHUP. Dropped when the loader calls tbd_acl_set itself. */
static int access_file_load(const char *path, struct tbd_acl **out) {
  FILE *f = fopen(path, "re");
  struct tbd_acl *a = NULL;
  char line[1024], prefix[300], err[400];
  bool in_access = false, have_prefix = false;
  int lineno = 0;

  if (f == NULL) {
    tbd_error("%s: %s", path, strerror(errno));
    return -1;
  }
  if (tbd_acl_new(&a) < 0)
    goto out_fail;
  while (fgets(line, sizeof(line), f) != NULL) {
    char *p = line, *eq, *end;
    lineno++;
    line[strcspn(line, "\r\n")] = '\0';
    while (*p == ' ' || *p == '\t')
      p++;
    if (*p == '\0' || *p == '#' || *p == ';')
      continue;
    if (*p == '[') {
      in_access = strncmp(p, "[access]", 8) == 0;
      have_prefix = false;
      if (strncmp(p, "[access \"", 9) == 0 &&
          (end = strchr(p + 9, '"')) != NULL) {
        snprintf(prefix, sizeof(prefix), "%.*s", (int)(end - p - 9), p + 9);
        in_access = have_prefix = true;
      }
      continue;
    }
    eq = strchr(p, '=');
    if (!in_access || eq == NULL)
      continue;
    end = eq;
    while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
      end--;
    *end = '\0';
    for (eq++; *eq == ' ' || *eq == '\t'; eq++)
      ;
    if (tbd_acl_set(a, have_prefix ? prefix : NULL, p, eq, err,
                    sizeof(err)) < 0) {
      tbd_error("%s:%d: %s", path, lineno, err);
      goto out_fail;
    }
  }
  fclose(f);
  *out = a;
  return 0;

out_fail:
  tbd_acl_free(a);
  fclose(f);
  return -1;
}

struct daemon {
  struct tbd_server srv;
  uv_signal_t sighup; /* TEMPORARY: re-reads $TBD_ACCESS_FILE */
  uv_signal_t sigterm, sigint;
  uv_timer_t watchdog;   /* WATCHDOG=1 at half of $WATCHDOG_USEC */
  uv_timer_t status;     /* STATUS= when sessions or channels change */
  int have_watchdog, have_status;
  char last_status[128];
};

static void status_line(struct daemon *d, char *buf, size_t len) {
  struct tbd_counts c;

  tbd_registry_counts(d->srv.reg, &c);
  snprintf(buf, len, "%u sessions, %u channels", c.sessions, c.channels);
}

static void on_status_timer(uv_timer_t *t) {
  struct daemon *d = t->data;
  char line[sizeof(d->last_status)];

  status_line(d, line, sizeof(line));
  if (strcmp(line, d->last_status) == 0)
    return;
  memcpy(d->last_status, line, sizeof(line));
  tbd_sd_status(line);
}

/* Answered from the loop, so that a loop stuck in a handler stops the
 * pings and the service manager restarts the daemon. */
static void on_watchdog_timer(uv_timer_t *t) {
  (void)t;
  tbd_sd_watchdog_ping();
}

static void notify_start(struct daemon *d, uv_loop_t *loop) {
  uint64_t usec = tbd_sd_watchdog_usec();

  if (usec != 0) {
    uint64_t ms = usec / 2000 > 0 ? usec / 2000 : 1;

    uv_timer_init(loop, &d->watchdog);
    d->watchdog.data = d;
    uv_timer_start(&d->watchdog, on_watchdog_timer, ms, ms);
    d->have_watchdog = 1;
    tbd_info("watchdog: %llu ms, answered every %llu ms",
             (unsigned long long)(usec / 1000), (unsigned long long)ms);
  }
  if (getenv("NOTIFY_SOCKET") != NULL) {
    uv_timer_init(loop, &d->status);
    d->status.data = d;
    uv_timer_start(&d->status, on_status_timer, STATUS_INTERVAL_MS,
                   STATUS_INTERVAL_MS);
    d->have_status = 1;
  }
  status_line(d, d->last_status, sizeof(d->last_status));
  tbd_sd_ready(d->last_status);
}

static void on_signal(uv_signal_t *h, int signum) {
  struct daemon *d = h->data;
  char reason[64];

  snprintf(reason, sizeof(reason), "daemon received %s",
           signum == SIGTERM ? "SIGTERM" : "SIGINT");
  tbd_sd_stopping();
  tbd_server_shutdown(&d->srv, reason);
  uv_close((uv_handle_t *)&d->sigterm, NULL);
  uv_close((uv_handle_t *)&d->sigint, NULL);
  uv_close((uv_handle_t *)&d->sighup, NULL);
  if (d->have_watchdog)
    uv_close((uv_handle_t *)&d->watchdog, NULL);
  if (d->have_status)
    uv_close((uv_handle_t *)&d->status, NULL);
}

/* TEMPORARY (access_file_load): new rules replace the old only when the
 * whole file is valid. */
static void on_sighup(uv_signal_t *h, int signum) {
  struct daemon *d = h->data;
  const char *path = getenv("TBD_ACCESS_FILE");
  struct tbd_acl *a;

  (void)signum;
  if (path == NULL || *path == '\0')
    return;
  if (access_file_load(path, &a) < 0) {
    tbd_error("SIGHUP: %s not applied; the access rules stay as they were",
              path);
    return;
  }
  tbd_registry_set_acl(d->srv.reg, a);
}

static void signal_ready(int fd) {
  static const char msg[] = "READY\n";
  ssize_t n;

  if (fd < 0)
    return;
  do {
    n = write(fd, msg, sizeof(msg) - 1);
  } while (n < 0 && errno == EINTR);
  if (n != (ssize_t)sizeof(msg) - 1)
    tbd_warn("--ready-fd %d: %s", fd, n < 0 ? strerror(errno) : "short write");
  close(fd);
}

int main(int argc, char **argv) {
  struct options o;
  struct daemon d;
  uv_loop_t loop;
  int rc, fd;

  rc = parse_options(argc, argv, &o);
  if (rc >= 0)
    return rc;
  tbd_log_set_level(o.level);
  signal(SIGPIPE, SIG_IGN);
  if (check_send_buffer(o.lim.max_message) < 0)
    return 1;
  raise_nofile(o.lim.max_fds);

  if (tbd_sd_listen_fd(&fd) < 0)
    return 1;
  if (fd >= 0)
    activated_path(fd, &o);
  else
    fd = listen_on(&o);
  if (fd < 0)
    return 1;
  rc = uv_loop_init(&loop);
  if (rc < 0) {
    tbd_error("uv_loop_init: %s", uv_strerror(rc));
    if (!o.activated)
      unlink(o.socket);
    close(fd);
    return 1;
  }
  rc = tbd_server_init(&d.srv, &loop, &o.lim, fd, o.socket);
  if (rc < 0) {
    tbd_error("cannot start: %s", tb_strerror(rc));
    if (!o.activated)
      unlink(o.socket);
    close(fd);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return 1;
  }
  {
    const char *path = getenv("TBD_ACCESS_FILE"); /* TEMPORARY */
    struct tbd_acl *a;
    if (path != NULL && *path != '\0') {
      if (access_file_load(path, &a) < 0) {
        tbd_server_shutdown(&d.srv, "bad access rules");
        uv_run(&loop, UV_RUN_DEFAULT);
        tbd_server_free(&d.srv);
        uv_loop_close(&loop);
        return 1;
      }
      tbd_registry_set_acl(d.srv.reg, a);
    }
  }
  uv_signal_init(&loop, &d.sigterm);
  uv_signal_init(&loop, &d.sigint);
  uv_signal_init(&loop, &d.sighup);
  d.sigterm.data = d.sigint.data = d.sighup.data = &d;
  uv_signal_start(&d.sighup, on_sighup, SIGHUP);
  uv_signal_start(&d.sigterm, on_signal, SIGTERM);
  uv_signal_start(&d.sigint, on_signal, SIGINT);
  /* systemd made the socket and removes it; a new daemon it starts on the
   * same socket must find it there */
  d.srv.keep_socket_file = o.activated;

  if (o.activated)
    tbd_info("tensorbrokerd %s listening on %s (passed by systemd, pid %d)",
             TB_VERSION_STRING, o.socket, (int)getpid());
  else
    tbd_info("tensorbrokerd %s listening on %s (mode %04o, pid %d)",
             TB_VERSION_STRING, o.socket, o.mode, (int)getpid());
  if (o.lim.busy_poll_us == 0)
    tbd_info("busy polling off");
  else if (o.lim.busy_poll_auto)
    tbd_info("busy polling: %u us after each request while it may use %d "
             "or more CPUs (now %d)", o.lim.busy_poll_us, TB__POLL_AUTO_CPUS,
             tb__cpus_allowed());
  else
    tbd_info("busy polling: %u us after each request", o.lim.busy_poll_us);
  signal_ready(o.ready_fd);
  d.have_watchdog = d.have_status = 0;
  notify_start(&d, &loop);

  uv_run(&loop, UV_RUN_DEFAULT);
  tbd_server_free(&d.srv);
  rc = uv_loop_close(&loop);
  if (rc != 0) {
    tbd_error("uv_loop_close: %s (a handle was left open)", uv_strerror(rc));
    return 1;
  }
  tbd_info("stopped");
  return 0;
}
