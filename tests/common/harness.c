/* Integration-test harness; see harness.h. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/wait.h>

#include <tensorbroker/tensorbroker.h>

/* Close every descriptor from lowest up, except keep (may be -1). */
static void close_from(int lowest) { close_range((unsigned)lowest, ~0u, 0); }

static int status_code(int st) {
  if (WIFEXITED(st))
    return WEXITSTATUS(st);
  if (WIFSIGNALED(st))
    return 128 + WTERMSIG(st);
  return -EINVAL;
}

int tbt_wait_pid(pid_t pid, int timeout_ms) {
  struct pollfd p;
  int pfd, st, rc;

  pfd = pidfd_open(pid, 0);
  if (pfd < 0)
    return -errno;
  p.fd = pfd;
  p.events = POLLIN;
  do {
    rc = poll(&p, 1, timeout_ms);
  } while (rc < 0 && errno == EINTR);
  close(pfd);
  if (rc == 0)
    return -ETIMEDOUT;
  if (rc < 0)
    return -errno;
  do {
    rc = waitpid(pid, &st, 0);
  } while (rc < 0 && errno == EINTR);
  if (rc < 0)
    return -errno;
  return status_code(st);
}

static int read_ready(int fd, int timeout_ms) {
  char buf[16];
  size_t got = 0;

  while (got < 6) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int rc = poll(&p, 1, timeout_ms);
    ssize_t n;
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc == 0)
      return -ETIMEDOUT;
    if (rc < 0)
      return -errno;
    n = read(fd, buf + got, sizeof(buf) - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return -errno;
    if (n == 0)
      return -ECHILD; /* exited (or closed the fd) without saying READY */
    got += (size_t)n;
  }
  return memcmp(buf, "READY\n", 6) == 0 ? 0 : -EPROTO;
}

int tbt_daemon_start_at(struct tbt_daemon *d, const char *sock,
                        const char *const *extra, int *exit_status) {
  const char *bin = getenv("TB_DAEMON");
  const char *argv[64];
  int p[2], n = 0, rc;
  pid_t pid;

  if (bin == NULL || bin[0] == '\0')
    return -ENOENT;
  if (strlen(sock) >= sizeof(d->sock))
    return -ENAMETOOLONG;
  snprintf(d->sock, sizeof(d->sock), "%s", sock);
  argv[n++] = bin;
  argv[n++] = "--socket";
  argv[n++] = d->sock;
  argv[n++] = "--ready-fd";
  argv[n++] = "3";
  for (int i = 0; extra != NULL && extra[i] != NULL && n < 62; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;

  if (pipe2(p, O_CLOEXEC) < 0)
    return -errno;
  fflush(NULL);
  pid = fork();
  if (pid < 0) {
    rc = -errno;
    close(p[0]);
    close(p[1]);
    return rc;
  }
  if (pid == 0) {
    /* the ready pipe becomes fd 3 without O_CLOEXEC; nothing else of the
     * test (client sockets!) may leak into the daemon */
    if (p[1] == 3) {
      fcntl(3, F_SETFD, 0);
    } else if (dup2(p[1], 3) < 0) {
      _exit(126);
    }
    close_from(4);
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  rc = read_ready(p[0], TBT_TIMEOUT_MS);
  close(p[0]);
  if (rc < 0) {
    int code = tbt_wait_pid(pid, rc == -ECHILD ? TBT_TIMEOUT_MS : 0);
    if (code == -ETIMEDOUT) {
      kill(pid, SIGKILL);
      code = tbt_wait_pid(pid, TBT_TIMEOUT_MS);
    }
    if (exit_status != NULL)
      *exit_status = code;
    d->pid = 0;
    return rc;
  }
  d->pid = pid;
  return 0;
}

int tbt_daemon_start(struct tbt_daemon *d, const char *const *extra) {
  char sock[108];
  int rc;

  memset(d, 0, sizeof(*d));
  snprintf(d->dir, sizeof(d->dir), "/tmp/tbtest.XXXXXX");
  if (mkdtemp(d->dir) == NULL) {
    d->dir[0] = '\0';
    return -errno;
  }
  snprintf(sock, sizeof(sock), "%s/tb.sock", d->dir);
  rc = tbt_daemon_start_at(d, sock, extra, NULL);
  if (rc < 0)
    fprintf(stderr, "tensorbrokerd did not start: %s\n", strerror(-rc));
  return rc;
}

int tbt_daemon_stop(struct tbt_daemon *d) {
  int code;

  if (d->pid <= 0)
    return -ECHILD;
  kill(d->pid, SIGTERM);
  code = tbt_wait_pid(d->pid, TBT_TIMEOUT_MS);
  if (code == -ETIMEDOUT) {
    kill(d->pid, SIGKILL);
    tbt_wait_pid(d->pid, TBT_TIMEOUT_MS);
  }
  d->pid = 0;
  return code;
}

void tbt_daemon_kill(struct tbt_daemon *d) {
  if (d->pid <= 0)
    return;
  kill(d->pid, SIGKILL);
  tbt_wait_pid(d->pid, TBT_TIMEOUT_MS);
  d->pid = 0;
}

void tbt_daemon_cleanup(struct tbt_daemon *d) {
  char path[160];

  tbt_daemon_kill(d);
  if (d->dir[0] != '\0') {
    /* the daemon may have left its socket (killed) or made nothing else */
    unlink(d->sock);
    snprintf(path, sizeof(path), "%s/stale.sock", d->dir);
    unlink(path);
    rmdir(d->dir);
    d->dir[0] = '\0';
  }
}

int tbt_connect_contract(const struct tbt_daemon *d, const char *name,
                         int contract, tb_client **out) {
  struct tb_connect_options o;

  tb_connect_options_init(&o);
  o.socket_path = d->sock;
  o.client_name = name;
  o.stream_contract = contract;
  o.timeout_ms = TBT_TIMEOUT_MS;
  return tb_client_connect(&o, out);
}

int tbt_connect(const struct tbt_daemon *d, const char *name, tb_client **out) {
  return tbt_connect_contract(d, name, TB_CONTRACT_SPEC, out);
}

/* ---- children ---- */

int tbt_child_start(struct tbt_child *c, tbt_child_fn fn, void *arg) {
  int down[2], up[2], rc;
  pid_t pid;

  if (pipe2(down, O_CLOEXEC) < 0)
    return -errno;
  if (pipe2(up, O_CLOEXEC) < 0) {
    rc = -errno;
    close(down[0]);
    close(down[1]);
    return rc;
  }
  fflush(NULL);
  pid = fork();
  if (pid < 0) {
    rc = -errno;
    close(down[0]);
    close(down[1]);
    close(up[0]);
    close(up[1]);
    return rc;
  }
  if (pid == 0) {
    struct tbt_chan ch;
    /* move our ends to 3 and 4 and drop everything else the test had open
     * (its client sockets would keep its sessions alive otherwise) */
    int r = fcntl(down[0], F_DUPFD_CLOEXEC, 10);
    int w = fcntl(up[1], F_DUPFD_CLOEXEC, 10);
    if (r < 0 || w < 0 || dup3(r, 3, O_CLOEXEC) < 0 ||
        dup3(w, 4, O_CLOEXEC) < 0)
      _exit(126);
    close_from(5);
    ch.rd = 3;
    ch.wr = 4;
    _exit(fn(&ch, arg));
  }
  close(down[0]);
  close(up[1]);
  c->pid = pid;
  c->rd = up[0];
  c->wr = down[1];
  return 0;
}

static void child_close(struct tbt_child *c) {
  if (c->rd >= 0)
    close(c->rd);
  if (c->wr >= 0)
    close(c->wr);
  c->rd = c->wr = -1;
}

int tbt_child_wait(struct tbt_child *c, int timeout_ms) {
  int code = tbt_wait_pid(c->pid, timeout_ms);

  if (code == -ETIMEDOUT) {
    kill(c->pid, SIGKILL);
    tbt_wait_pid(c->pid, TBT_TIMEOUT_MS);
  }
  c->pid = 0;
  child_close(c);
  return code;
}

void tbt_child_kill(struct tbt_child *c) {
  if (c->pid > 0) {
    kill(c->pid, SIGKILL);
    tbt_wait_pid(c->pid, TBT_TIMEOUT_MS);
    c->pid = 0;
  }
  child_close(c);
}

int tbt_send(int fd, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  int n;
  size_t off = 0;

  va_start(ap, fmt);
  n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof(buf) - 1)
    return -EINVAL;
  buf[n++] = '\n';
  while (off < (size_t)n) {
    ssize_t k = write(fd, buf + off, (size_t)n - off);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0)
      return -errno;
    off += (size_t)k;
  }
  return 0;
}

int tbt_recv(int fd, char *buf, size_t len, int timeout_ms) {
  size_t got = 0;

  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int rc = poll(&p, 1, timeout_ms);
    char ch;
    ssize_t n;
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc < 0)
      return -errno;
    if (rc == 0)
      return -ETIMEDOUT;
    n = read(fd, &ch, 1);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return -errno;
    if (n == 0)
      return -EPIPE;
    if (ch == '\n') {
      if (len > 0)
        buf[got < len ? got : len - 1] = '\0';
      return 0;
    }
    if (got + 1 < len)
      buf[got++] = ch;
  }
}
