/* Integration-test harness: start the real tensorbrokerd on a socket in a
 * fresh temporary directory, stop or kill it, and fork child processes that
 * act as producers or consumers and report back over pipes.
 *
 * Nothing here sleeps to synchronise: daemon readiness is its --ready-fd
 * pipe, children report over pipes, exits are waited for with pidfds. Every
 * wait is bounded (TBT_TIMEOUT_MS) so a broken daemon fails a test instead of
 * hanging it. */
#ifndef TB_TEST_HARNESS_H
#define TB_TEST_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include <tensorbroker/tensorbroker.h>

/* Longest wait for anything that should happen promptly. Generous: the
 * suite also runs under ASan on 2 cores. */
#define TBT_TIMEOUT_MS 20000

struct tbt_daemon {
  pid_t pid;       /* 0 once it has been reaped */
  char dir[64];    /* the temporary directory, removed by cleanup */
  char sock[108];  /* socket path */
};

/* Start the daemon (binary: $TB_DAEMON) on dir/tb.sock in a new mkdtemp
 * directory with --ready-fd, and wait until it writes "READY\n". extra is a
 * NULL-terminated list of further arguments (may be NULL). Returns 0, or a
 * negative errno (-ETIMEDOUT, -ECHILD when it exited before being ready). */
int tbt_daemon_start(struct tbt_daemon *d, const char *const *extra);

/* Same, on a socket path of the caller's choice (dir stays empty and is not
 * created). *exit_status gets the exit status when it exits before ready. */
int tbt_daemon_start_at(struct tbt_daemon *d, const char *sock,
                        const char *const *extra, int *exit_status);

/* SIGTERM, then wait (bounded). Returns the exit code (0..255), 128 + signal
 * when killed by a signal, or -ETIMEDOUT (it is then SIGKILLed). */
int tbt_daemon_stop(struct tbt_daemon *d);

/* SIGKILL and reap. */
void tbt_daemon_kill(struct tbt_daemon *d);

/* Kill the daemon if still running, remove the socket and the directory. */
void tbt_daemon_cleanup(struct tbt_daemon *d);

/* Connect to the daemon as a client named name. */
int tbt_connect(const struct tbt_daemon *d, const char *name, tb_client **out);
int tbt_connect_contract(const struct tbt_daemon *d, const char *name,
                         int contract, tb_client **out);

/* Wait for pid to exit, at most timeout_ms. Returns the exit code, 128 +
 * signal, or -ETIMEDOUT (the process is left running). */
int tbt_wait_pid(pid_t pid, int timeout_ms);

/* ---- child processes ---- */

/* A child's end of its pipes: rd receives the parent's lines, wr sends. */
struct tbt_chan {
  int rd, wr;
};

struct tbt_child {
  pid_t pid;
  int rd; /* lines from the child */
  int wr; /* lines to the child */
};

/* The child's body. Its return value is its exit code. It runs in a forked
 * copy of the test: it must not use cmocka assertions (use TBT_CHECK) and
 * must not touch the parent's tb_client objects. */
typedef int (*tbt_child_fn)(struct tbt_chan *ch, void *arg);

/* Fork a child running fn(ch, arg), with every descriptor but its two pipe
 * ends closed. Returns 0 or a negative errno. */
int tbt_child_start(struct tbt_child *c, tbt_child_fn fn, void *arg);

/* Wait for the child's exit (bounded); returns as tbt_wait_pid and closes
 * the parent's pipe ends. */
int tbt_child_wait(struct tbt_child *c, int timeout_ms);

/* SIGKILL the child and reap it. */
void tbt_child_kill(struct tbt_child *c);

/* Send one line (printf format, no newline needed). Returns 0 or -errno. */
int tbt_send(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Read one line into buf (without the newline), waiting at most timeout_ms.
 * Returns 0, -ETIMEDOUT, -EPIPE at end of file, or -errno. */
int tbt_recv(int fd, char *buf, size_t len, int timeout_ms);

/* Checks inside a child: print where and why, and exit the child with 2. */
#define TBT_CHECK(cond)                                                      \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "[child %d] %s:%d: check failed: %s\n", (int)getpid(), \
              __FILE__, __LINE__, #cond);                                    \
      _exit(2);                                                              \
    }                                                                        \
  } while (0)

#define TBT_CHECK_RC(expr, want)                                             \
  do {                                                                       \
    long tbt_c_ = (long)(expr);                                              \
    if (tbt_c_ != (long)(want)) {                                            \
      fprintf(stderr, "[child %d] %s:%d: %s = %ld %s (%s), expected %s\n",   \
              (int)getpid(), __FILE__, __LINE__, #expr, tbt_c_,              \
              tb_err_name((int)tbt_c_), tb_strerror((int)tbt_c_),            \
              tb_err_name((int)(want)));                                     \
      _exit(2);                                                              \
    }                                                                        \
  } while (0)

#define TBT_CHECK_OK(expr) TBT_CHECK_RC(expr, 0)

#endif /* TB_TEST_HARNESS_H */
