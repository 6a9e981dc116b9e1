/* SPDX-License-Identifier: Apache-2.0 */
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

#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
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

/* ---- cmocka fixtures and library helpers ---- */

/* setup: start a daemon (default options) into *state; teardown: stop it
 * with SIGTERM, fail unless it exits 0 (a test that killed it on purpose
 * leaves pid 0), and clean up. */
int tbt_setup(void **state);
int tbt_teardown(void **state);

/* Byte p of a test buffer holds this value, so a reader can check any byte
 * knowing only its position in the buffer and the seed. */
static inline uint8_t tbt_pattern(uint64_t pos, uint64_t seed) {
  return (uint8_t)((pos * 131u + seed * 7u + 17u) & 0xffu);
}
void tbt_fill(void *buf, size_t len, uint64_t seed);

/* *t = a 1-d uint8 host tensor over the first n bytes of b (shape[0] = n,
 * shape must outlive t). */
void tbt_u8_tensor(DLTensor *t, tb_buffer *b, int64_t *shape, int64_t n);

/* The entry of tb_list_sessions for pid / session id; 0 or TB_ENOTFOUND. */
int tbt_find_session_pid(tb_client *c, pid_t pid, struct tb_session_info *out);
int tbt_find_session_id(tb_client *c, uint64_t id, struct tb_session_info *out);
/* The entry of tb_list_channels for name; 0 or TB_ENOTFOUND. */
int tbt_find_channel(tb_client *c, const char *name, struct tb_channel_info *out);

/* The number of requests the daemon has counted from c's own session,
 * this call's ListSessions included: the next request c sends is number
 * *n + 1. */
int tbt_own_requests(tb_client *c, uint64_t *n);

/* Wait until the daemon has counted at least min requests from session id
 * (so a request the session sent has reached it). Bounded by
 * TBT_TIMEOUT_MS; 0 or TB_ETIMEDOUT. */
int tbt_wait_requests(tb_client *c, uint64_t id, uint64_t min);

/* Start thread *th running fn(arg), which sends c one request that waits
 * at the daemon (an acquire of a version to come, say), and return once
 * the daemon has counted it (asked on watch), so that it is parked there.
 * 0, TB_ESYS (no thread), or tbt_wait_requests' error. */
int tbt_start_request(tb_client *watch, tb_client *c, void *(*fn)(void *),
                      void *arg, pthread_t *th);

/* How many requests of session id the daemon has parked now (ListWaits,
 * asked on c) into *n; 0 or the listing's error. */
int tbt_parked(tb_client *c, uint64_t id, size_t *n);

/* Wait until session id is no longer listed (its connection closed and the
 * daemon cleaned up after it). Bounded; 0 or TB_ETIMEDOUT. */
int tbt_wait_session_gone(tb_client *c, uint64_t id);
/* The same for the session named name (none listed: 0 at once). */
int tbt_wait_session_name_gone(tb_client *c, const char *name);

/* Take notices until one of type (and, when channel is not NULL, of that
 * channel and version, version 0 matching any) arrives; others are
 * skipped. 0 and *out (may be NULL), or the poll's error. */
int tbt_expect_notice(tb_client *c, int type, const char *channel,
                      uint64_t version, int timeout_ms, struct tb_notice *out);

/* Monotonic milliseconds. */
uint64_t tbt_now_ms(void);

/* Run argv (argv[0] a path) with stdout captured into out (NUL-terminated,
 * truncated to len) and stderr inherited; bounded. Returns the exit code as
 * tbt_wait_pid, or a negative errno. */
int tbt_run(const char *const *argv, char *out, size_t len);
