/* SPDX-License-Identifier: Apache-2.0 */
/* tensorbrokerd: options, the listening socket, signals, the loop. */
#include <errno.h>
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
#include "metrics_http.h"
#include "options.h"
#include "sd.h"
#include "server.h"

/* Make the socket path ours: refuse if a daemon answers there or the path
 * is not a socket, remove a stale socket file. */
static int claim_path(const char *path) {
  bool stale;
  int rc = tbd_socket_path_claim(path, SOCK_SEQPACKET, &stale);

  if (rc == -EEXIST)
    tbd_error("%s exists and is not a socket; not replacing it", path);
  else if (rc == -EADDRINUSE)
    tbd_error("another daemon is listening on %s; not starting", path);
  else if (rc < 0)
    tbd_error("cannot claim %s: %s", path, strerror(-rc));
  else if (stale)
    tbd_info("removing stale socket %s", path);
  return rc < 0 ? -1 : 0;
}

static int listen_on(const struct tbd_options *o) {
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
static void activated_path(int fd, struct tbd_options *o) {
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
 * library sizes its socket the same way (client/rpc.c). */
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

struct daemon {
  struct tbd_server srv;
  struct tbd_http metrics; /* --metrics-listen */
  struct tbd_options opt; /* in effect */
  int argc;
  char **argv;
  uv_signal_t sigterm, sigint, sighup;
  struct tbd_acl *acl; /* the access rules read at start, until the
                          registry takes them */
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

/* The access sections of the configuration file, key by key, into the
 * rule set ud (acl.h): built whole before it replaces the running one. */
static int access_hook(void *ud, const char *prefix, const char *key,
                       const char *value, char *err, size_t errlen) {
  return tbd_acl_set(ud, prefix, key, value, err, errlen);
}

/* SIGHUP: build the settings again (defaults, the file, the command line);
 * if all is well, apply what can change live, log what cannot, and keep
 * every client. A file with an error changes nothing. */
static void reload(struct daemon *d) {
  struct tbd_options n;
  struct tbd_acl *acl;
  char err[1024];
  int rc, later;

  tbd_sd_reloading();
  if (tbd_acl_new(&acl) < 0) {
    tbd_error("reload: out of memory; the running configuration is kept");
    tbd_sd_ready(d->last_status);
    return;
  }
  rc = tbd_options_build(&n, d->argc, d->argv, 1, access_hook, acl, err,
                         sizeof(err));
  if (rc >= 0) {
    tbd_error("reload: %s; the running configuration is kept", err);
    tbd_acl_free(acl);
    tbd_sd_ready(d->last_status);
    return;
  }
  n.activated = d->opt.activated;
  n.ready_fd = -1;
  later = tbd_options_restart_only(&d->opt, &n);
  /* what needs a restart stays as it runs */
  memcpy(n.socket, d->opt.socket, sizeof(n.socket));
  n.metrics = d->opt.metrics;
  memcpy(n.metrics_listen, d->opt.metrics_listen, sizeof(n.metrics_listen));
  n.socket_is_system_default = d->opt.socket_is_system_default;
  n.mode = d->opt.mode;
  for (unsigned i = 0; i < tbd_limit_count; i++) {
    const struct tbd_limit_desc *ld = &tbd_limit_table[i];

    if (tbd_limit_needs_restart(ld))
      *tbd_limit_field(&n.lim, ld) = *tbd_limit_field(&d->opt.lim, ld);
  }
  if ((uint64_t)n.lim.max_done_events * TBD_DONE_EVENT_BYTES +
          TBD_VERSION_FREE_BASE > n.lim.max_message) {
    tbd_warn("reload: max-done-events %u does not fit max-message %u; "
             "keeping %u", n.lim.max_done_events, n.lim.max_message,
             d->opt.lim.max_done_events);
    n.lim.max_done_events = d->opt.lim.max_done_events;
  }
  tbd_log_set_level(n.level);
  tbd_server_set_limits(&d->srv, &n.lim);
  /* sessions stay; their next requests are judged by the new rules */
  tbd_registry_set_acl(d->srv.reg, acl);
  d->opt = n;
  tbd_info("reload: %s; log level %s, limits applied%s",
           n.config[0] != '\0' ? n.config : "no configuration file",
           tbd_log_level_name(n.level),
           later ? "; some changes wait for a restart (above)" : "");
  tbd_sd_ready(d->last_status);
}

static void close_timers(struct daemon *d) {
  if (d->have_watchdog)
    uv_close((uv_handle_t *)&d->watchdog, NULL);
  if (d->have_status)
    uv_close((uv_handle_t *)&d->status, NULL);
  d->have_watchdog = d->have_status = 0;
}

/* The first SIGTERM or SIGINT stops the daemon in order; the handlers stay
 * (unreferenced, so the loop can run out) and a second one while it stops
 * ends the process at once, having removed the socket file. */
static void on_signal(uv_signal_t *h, int signum) {
  struct daemon *d = h->data;
  const char *name = signum == SIGTERM ? "SIGTERM" : "SIGINT";
  char reason[64];

  if (d->srv.stopping) {
    tbd_warn("%s again while stopping: exiting now", name);
    if (!d->opt.activated)
      unlink(d->opt.socket);
    _exit(1);
  }
  snprintf(reason, sizeof(reason), "daemon received %s", name);
  tbd_sd_stopping();
  tbd_server_shutdown(&d->srv, reason);
  tbd_http_stop(&d->metrics);
  uv_unref((uv_handle_t *)&d->sigterm);
  uv_unref((uv_handle_t *)&d->sigint);
  uv_close((uv_handle_t *)&d->sighup, NULL);
  close_timers(d);
}

static void on_sighup(uv_signal_t *h, int signum) {
  struct daemon *d = h->data;

  (void)signum;
  if (!d->srv.stopping)
    reload(d);
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

/* --check-config and --print-config: report and exit. */
static int check_only(const struct tbd_options *o) {
  if (o->print_config)
    tbd_options_print(o, stdout);
  if (o->check_config)
    printf("tensorbrokerd: configuration OK (%s)\n",
           o->config[0] != '\0' ? o->config : "no configuration file");
  return 0;
}

int main(int argc, char **argv) {
  static struct daemon d;
  char err[1024];
  uv_loop_t loop;
  int rc, fd;

  if (tbd_acl_new(&d.acl) < 0) {
    fprintf(stderr, "tensorbrokerd: out of memory\n");
    return 1;
  }
  rc = tbd_options_build(&d.opt, argc, argv, 0, access_hook, d.acl, err,
                         sizeof(err));
  if (rc >= 0) {
    if (err[0] != '\0')
      fprintf(stderr, "tensorbrokerd: %s\n", err);
    return rc;
  }
  if (d.opt.check_config || d.opt.print_config)
    return check_only(&d.opt);
  d.argc = argc;
  d.argv = argv;
  tbd_log_set_level(d.opt.level);
  signal(SIGPIPE, SIG_IGN);
  if (check_send_buffer(d.opt.lim.max_message) < 0)
    return 1;
  raise_nofile(d.opt.lim.max_fds);

  if (tbd_sd_listen_fd(&fd) < 0)
    return 1;
  if (fd >= 0)
    activated_path(fd, &d.opt);
  else
    fd = listen_on(&d.opt);
  if (fd < 0)
    return 1;
  rc = uv_loop_init(&loop);
  if (rc < 0) {
    tbd_error("uv_loop_init: %s", uv_strerror(rc));
    if (!d.opt.activated)
      unlink(d.opt.socket);
    close(fd);
    return 1;
  }
  rc = tbd_server_init(&d.srv, &loop, &d.opt.lim, fd, d.opt.socket);
  if (rc < 0) {
    tbd_error("cannot start: %s", tb_strerror(rc));
    if (!d.opt.activated)
      unlink(d.opt.socket);
    close(fd);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return 1;
  }
  tbd_registry_set_acl(d.srv.reg, d.acl);
  d.acl = NULL;
  memset(&d.metrics, 0, sizeof(d.metrics));
  if (d.opt.metrics.kind != 0 &&
      tbd_http_start(&d.metrics, &loop, d.srv.reg, &d.opt.metrics,
                     d.opt.mode) < 0) {
    tbd_server_shutdown(&d.srv, "cannot serve the metrics");
    uv_run(&loop, UV_RUN_DEFAULT);
    tbd_server_free(&d.srv);
    uv_loop_close(&loop);
    return 1;
  }
  uv_signal_init(&loop, &d.sigterm);
  uv_signal_init(&loop, &d.sigint);
  uv_signal_init(&loop, &d.sighup);
  d.sigterm.data = d.sigint.data = d.sighup.data = &d;
  uv_signal_start(&d.sigterm, on_signal, SIGTERM);
  uv_signal_start(&d.sigint, on_signal, SIGINT);
  uv_signal_start(&d.sighup, on_sighup, SIGHUP);
  /* systemd made the socket and removes it; a new daemon it starts on the
   * same socket must find it there */
  d.srv.keep_socket_file = d.opt.activated;

  if (d.opt.activated)
    tbd_info("tensorbrokerd %s listening on %s (passed by systemd, pid %d)",
             TB_VERSION_STRING, d.opt.socket, (int)getpid());
  else
    tbd_info("tensorbrokerd %s listening on %s (mode %04o, pid %d)",
             TB_VERSION_STRING, d.opt.socket, d.opt.mode, (int)getpid());
  tbd_info("configuration: %s", d.opt.config[0] != '\0'
                                    ? d.opt.config
                                    : "none (embedded defaults)");
  if (d.opt.lim.busy_poll_us == 0)
    tbd_info("busy polling off");
  else if (d.opt.lim.busy_poll_auto)
    tbd_info("busy polling: %u us after each request while it may use %d "
             "or more CPUs (now %d)", d.opt.lim.busy_poll_us,
             TB__POLL_AUTO_CPUS, tb__cpus_allowed());
  else
    tbd_info("busy polling: %u us after each request",
             d.opt.lim.busy_poll_us);
  signal_ready(d.opt.ready_fd);
  d.have_watchdog = d.have_status = 0;
  notify_start(&d, &loop);

  uv_run(&loop, UV_RUN_DEFAULT);
  /* The handlers stayed for a second signal. Closing them restores the
   * default action, so block the signals first: one that comes now stays
   * pending and is dropped at exit, and the last steps still run. */
  {
    sigset_t set;

    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);
  }
  uv_close((uv_handle_t *)&d.sigterm, NULL);
  uv_close((uv_handle_t *)&d.sigint, NULL);
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
