/* SPDX-License-Identifier: Apache-2.0 */
/* The real tensorbrokerd on a socket in a fresh temporary directory, driven
 * with raw datagrams (no client library): start-up rules, protocol errors,
 * a client that never reads, a memfd handed to a consumer, shutdown.
 * Readiness comes from --ready-fd and every wait is on a real event
 * (poll on a socket, waitpid), never a sleep. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tb_test.h"

#include "tb_proto.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1; older C libraries lack it */
#endif

typedef Tensorbroker__V1__Request req_t;
typedef Tensorbroker__V1__ServerMessage msg_t;

#define POLL_MS 10000 /* generous: only a broken daemon takes this long */

static char dir[256], sock[300];
static uint64_t next_id = 1;
static pid_t live_pid; /* killed by teardown if a test failed midway */

/* Start the daemon with extra arguments; waits for READY. Returns its pid,
 * or -(exit status) when it exited before becoming ready. */
static pid_t daemon_start(const char *const *extra) {
  const char *bin = getenv("TB_DAEMON");
  const char *argv[32];
  int p[2], n = 0, status;
  char buf[16] = "";
  pid_t pid;
  ssize_t got;

  assert_non_null(bin);
  assert_int_equal(pipe2(p, O_CLOEXEC), 0);
  argv[n++] = bin;
  argv[n++] = "--socket";
  argv[n++] = sock;
  argv[n++] = "--ready-fd";
  argv[n++] = "3";
  argv[n++] = "--log-level";
  argv[n++] = "error";
  for (int i = 0; extra != NULL && extra[i] != NULL; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(p[1], 3); /* dup2 clears O_CLOEXEC on the copy */
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  got = read(p[0], buf, sizeof(buf) - 1);
  close(p[0]);
  if (got == 6 && strcmp(buf, "READY\n") == 0) {
    live_pid = pid;
    return pid;
  }
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  return -WEXITSTATUS(status);
}

static int daemon_stop(pid_t pid, int sig) {
  int status;

  assert_int_equal(kill(pid, sig), 0);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  live_pid = 0;
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int connect_sock(void) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

  assert_true(fd >= 0);
  memcpy(sa.sun_path, sock, strlen(sock));
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  return fd;
}

static void send_req(int fd, req_t *q, int *fds, int nfds) {
  static uint8_t buf[1 << 16];
  long n;

  if (q->request_id == 0)
    q->request_id = next_id++;
  n = tb__request_encode(q, buf, sizeof(buf));
  assert_true(n > 0);
  assert_int_equal(tb__wire_send(fd, buf, (size_t)n, fds, nfds, 0), 0);
}

/* Next datagram, or NULL at end of stream. */
static msg_t *recv_msg(int fd, int *fd_out) {
  static uint8_t buf[TB__MAX_MESSAGE_HARD];
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int fds[TB__MAX_FDS], nfds = 0;
  msg_t *m;
  long n;

  assert_int_equal(poll(&p, 1, POLL_MS), 1);
  n = tb__wire_recv(fd, buf, sizeof(buf), fds, &nfds, 0);
  if (n == 0 || n == -ECONNRESET)
    return NULL;
  assert_true(n > 0);
  assert_tb_ok(tb__server_message_decode(buf, (size_t)n, &m));
  for (int i = 0; i < nfds; i++) {
    if (i == 0 && fd_out != NULL)
      *fd_out = fds[0];
    else
      close(fds[i]);
  }
  return m;
}

/* The reply to the last request, skipping notices. */
static msg_t *recv_reply(int fd, int *fd_out) {
  for (;;) {
    msg_t *m = recv_msg(fd, fd_out);
    assert_non_null(m);
    if (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY)
      return m;
    tb__server_message_free(m);
  }
}

static int reply_status(int fd) {
  msg_t *m = recv_reply(fd, NULL);
  int st = m->reply->status;
  tb__server_message_free(m);
  return st;
}

/* Say Hello; the daemon's reply. */
static msg_t *hello_reply(int fd) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Hello h = TENSORBROKER__V1__HELLO__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
  q.hello = &h;
  h.protocol_version = 1;
  h.client_name = "test_server";
  send_req(fd, &q, NULL, 0);
  return recv_reply(fd, NULL);
}

static int hello(int fd) {
  msg_t *m = hello_reply(fd);
  int st = m->reply->status;

  tb__server_message_free(m);
  return st;
}

/* Expect Reply{TB_EPROTO} with a message, then end of stream. */
static void expect_eproto_and_close(int fd) {
  msg_t *m = recv_msg(fd, NULL);

  assert_non_null(m);
  assert_int_equal(m->body_case, TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY);
  assert_int_equal(m->reply->status, TB_EPROTO);
  assert_true(strlen(m->reply->message) > 0);
  tb__server_message_free(m);
  assert_null(recv_msg(fd, NULL));
  close(fd);
}

/* Descriptors the daemon holds open. */
static int daemon_fds(pid_t pid) {
  char path[64];
  DIR *d;
  struct dirent *e;
  int n = 0;

  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  d = opendir(path);
  assert_non_null(d);
  while ((e = readdir(d)) != NULL)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static Tensorbroker__V1__StatusReply *status(int fd, msg_t **keep) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Status st = TENSORBROKER__V1__STATUS__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
  q.status = &st;
  send_req(fd, &q, NULL, 0);
  *keep = recv_reply(fd, NULL);
  assert_int_equal((*keep)->reply->status, 0);
  return (*keep)->reply->status_info;
}

static uint64_t register_memfd(int fd, const char *text) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__BufferRegister b =
      TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  int mfd = memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  uint64_t id;
  char *p;
  msg_t *m;

  assert_true(mfd >= 0);
  assert_int_equal(ftruncate(mfd, 4096), 0);
  p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  assert_true(p != MAP_FAILED);
  snprintf(p, 4096, "%s", text);
  munmap(p, 4096);
  /* what the daemon wants of a read-only buffer */
  assert_int_equal(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW |
                                               F_SEAL_FUTURE_WRITE),
                   0);
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  q.buffer_register = &b;
  b.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
  b.size = 4096;
  send_req(fd, &q, &mfd, 1);
  close(mfd);
  m = recv_reply(fd, NULL);
  assert_int_equal(m->reply->status, 0);
  id = m->reply->buffer_register->buffer_id;
  tb__server_message_free(m);
  return id;
}

static void publish(int fd, const char *ch, uint64_t buffer_id) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Publish p = TENSORBROKER__V1__PUBLISH__INIT;
  Tensorbroker__V1__Layout l = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__Device d = TENSORBROKER__V1__DEVICE__INIT;
  int64_t shape[1] = {16};

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_PUBLISH;
  q.publish = &p;
  p.channel = (char *)ch;
  p.buffer_id = buffer_id;
  p.layout = &l;
  l.device = &d;
  d.type = 1; /* kDLCPU */
  l.dtype_code = 2;
  l.dtype_bits = 32;
  l.dtype_lanes = 1;
  l.shape = shape;
  l.n_shape = 1;
  send_req(fd, &q, NULL, 0);
  assert_int_equal(reply_status(fd), 0);
}

static int subscribe(int fd, const char *ch) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Subscribe s = TENSORBROKER__V1__SUBSCRIBE__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_SUBSCRIBE;
  q.subscribe = &s;
  s.channel = (char *)ch;
  send_req(fd, &q, NULL, 0);
  return reply_status(fd);
}

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof(dir), "%s/tbd-test-XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  assert_non_null(mkdtemp(dir));
  snprintf(sock, sizeof(sock), "%s/tb.sock", dir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  if (live_pid > 0) {
    kill(live_pid, SIGKILL);
    waitpid(live_pid, NULL, 0);
    live_pid = 0;
  }
  unlink(sock);
  rmdir(dir);
  return 0;
}

static void test_startup_rules(void **state) {
  const char *bad_level[] = {"--log-level", "loud", NULL};
  const char *bad_limit[] = {"--max-leases", "0", NULL};
  const char *bad_mode[] = {"--socket-mode", "888", NULL};
  struct stat st;
  pid_t pid;
  int fd;

  (void)state;
  assert_int_equal(daemon_start(bad_level), -2);
  assert_int_equal(daemon_start(bad_limit), -2);
  assert_int_equal(daemon_start(bad_mode), -2);
  /* a stale socket file is replaced */
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, sock, strlen(sock));
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  }
  close(fd);
  pid = daemon_start(NULL);
  assert_true(pid > 0);
  assert_int_equal(stat(sock, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0660);
  /* a second daemon on the same path refuses to start */
  assert_int_equal(daemon_start(NULL), -1);
  assert_int_equal(daemon_stop(pid, SIGINT), 0);
  assert_int_equal(stat(sock, &st), -1); /* removed */
  /* a path that is not a socket is never replaced */
  fd = open(sock, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  close(fd);
  assert_int_equal(daemon_start(NULL), -1);
}

static void test_protocol_errors_close(void **state) {
  static char big[TB__DEFAULT_MAX_MESSAGE + 100];
  pid_t pid = daemon_start(NULL);
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Status st = TENSORBROKER__V1__STATUS__INIT;
  Tensorbroker__V1__StatusReply *sr;
  int fd, mfd, good, fds_before;
  msg_t *m;

  (void)state;
  assert_true(pid > 0);
  good = connect_sock();
  assert_int_equal(hello(good), 0);
  fds_before = daemon_fds(pid);
  /* garbage bytes */
  fd = connect_sock();
  assert_int_equal(send(fd, "\xff\xff\xff\xff garbage", 13, 0), 13);
  expect_eproto_and_close(fd);
  /* an oversized datagram */
  fd = connect_sock();
  memset(big, 0x01, sizeof(big));
  assert_int_equal(send(fd, big, sizeof(big), 0), (ssize_t)sizeof(big));
  expect_eproto_and_close(fd);
  /* truncated protobuf after Hello */
  fd = connect_sock();
  assert_int_equal(hello(fd), 0);
  assert_int_equal(send(fd, "\x08\x01\x52\x05\x0a", 5, 0), 5);
  expect_eproto_and_close(fd);
  /* a request before Hello, with an unexpected descriptor */
  fd = connect_sock();
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
  q.status = &st;
  mfd = memfd_create("x", MFD_CLOEXEC);
  send_req(fd, &q, &mfd, 1);
  close(mfd);
  expect_eproto_and_close(fd);
  /* a client that connects and sends nothing does not disturb anyone */
  fd = connect_sock();
  sr = status(good, &m);
  assert_int_equal(sr->bad_messages, 4);
  assert_int_equal(sr->sessions, 1);
  tb__server_message_free(m);
  close(fd);
  /* two round trips: a closed connection's descriptor is released at the
   * end of the loop iteration that handled it */
  tb__server_message_free((status(good, &m), m));
  tb__server_message_free((status(good, &m), m));
  assert_int_equal(daemon_fds(pid), fds_before); /* nothing leaked */
  close(good);
  assert_int_equal(daemon_stop(pid, SIGTERM), 0);
}

/* --hello-timeout: connections that say nothing are closed once their time
 * is up (end of stream, no reply, not before the time); a session that said
 * Hello before, and one that says Hello at once beside a silent companion,
 * outlive that companion's deadline. */
static void test_hello_timeout(void **state) {
  static const char *const extra[] = {"--hello-timeout", "300", NULL};
  pid_t pid = daemon_start(extra);
  Tensorbroker__V1__StatusReply *sr;
  struct pollfd p;
  uint64_t t0, waited;
  int good, silent, late;
  msg_t *m;

  (void)state;
  assert_true(pid > 0);
  good = connect_sock();
  assert_int_equal(hello(good), 0);
  t0 = now_ms();
  silent = connect_sock();
  late = connect_sock();
  /* the silent one: end of stream, within a bounded wait */
  assert_null(recv_msg(silent, NULL));
  waited = now_ms() - t0;
  assert_true(waited >= 250); /* not before its time (clock slack: 50 ms) */
  close(silent);
  /* the second silent one's deadline is past as well: closed too */
  assert_null(recv_msg(late, NULL));
  close(late);
  /* the one that said Hello is untouched */
  sr = status(good, &m);
  assert_int_equal(sr->sessions, 1);
  tb__server_message_free(m);
  /* a Hello in time keeps the connection past the deadline: say Hello at
   * once, wait until a silent companion accepted with it is closed, then
   * ask for the status */
  late = connect_sock();
  silent = connect_sock();
  assert_int_equal(hello(late), 0);
  assert_null(recv_msg(silent, NULL));
  close(silent);
  sr = status(late, &m);
  assert_int_equal(sr->sessions, 2);
  tb__server_message_free(m);
  p.fd = late;
  p.events = POLLIN;
  assert_int_equal(poll(&p, 1, 0), 0); /* nothing pending: not closed */
  close(late);
  close(good);
  assert_int_equal(daemon_stop(pid, SIGTERM), 0);
}

static void test_slow_reader_dropped(void **state) {
  const char *args[] = {"--max-outq", "16384", NULL};
  pid_t pid = daemon_start(args);
  int p, c, slow, fd = -1, dropped = 0;
  Tensorbroker__V1__StatusReply *sr;
  uint64_t b;
  msg_t *m;

  (void)state;
  assert_true(pid > 0);
  p = connect_sock();
  c = connect_sock();
  slow = connect_sock();
  assert_int_equal(hello(p), 0);
  assert_int_equal(hello(c), 0);
  assert_int_equal(hello(slow), 0);
  assert_int_equal(subscribe(slow, "fast/ch"), 0);
  b = register_memfd(p, "payload");
  /* publish until the daemon gives up on the client that never reads;
   * every publish is answered meanwhile */
  for (int i = 0; i < 200000 && !dropped; i++) {
    publish(p, "fast/ch", b);
    if (i % 500 == 0) {
      sr = status(c, &m);
      dropped = sr->sessions_dropped == 1;
      tb__server_message_free(m);
    }
  }
  assert_true(dropped);
  /* the consumer is served: the memfd arrives and holds the bytes */
  {
    req_t q = TENSORBROKER__V1__REQUEST__INIT;
    Tensorbroker__V1__Acquire a = TENSORBROKER__V1__ACQUIRE__INIT;
    char *data;

    q.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
    q.acquire = &a;
    a.channel = "fast/ch";
    send_req(c, &q, NULL, 0);
    m = recv_reply(c, &fd);
    assert_int_equal(m->reply->status, 0);
    assert_true(m->reply->acquire->buffer->fd_attached);
    assert_true(fd >= 0);
    data = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(data != MAP_FAILED);
    assert_string_equal(data, "payload");
    munmap(data, 4096);
    close(fd);
    tb__server_message_free(m);
  }
  /* the slow one finds its connection closed once it reads */
  for (;;) {
    m = recv_msg(slow, NULL);
    if (m == NULL)
      break;
    tb__server_message_free(m);
  }
  close(slow);
  close(p);
  close(c);
  assert_int_equal(daemon_stop(pid, SIGTERM), 0);
}

static void test_shutdown_notice(void **state) {
  pid_t pid = daemon_start(NULL);
  int fd, status;
  msg_t *m;

  (void)state;
  assert_true(pid > 0);
  fd = connect_sock();
  assert_int_equal(hello(fd), 0);
  assert_int_equal(kill(pid, SIGTERM), 0);
  live_pid = 0; /* waited for below */
  m = recv_msg(fd, NULL);
  assert_non_null(m);
  assert_int_equal(m->body_case, TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE);
  assert_int_equal(m->notice->body_case,
                   TENSORBROKER__V1__NOTICE__BODY_DAEMON_CLOSING);
  tb__server_message_free(m);
  assert_null(recv_msg(fd, NULL));
  close(fd);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(access(sock, F_OK), -1);
}

/* Acquire with release_lease_id: the HelloReply advertises the feature;
 * the lease rides with the acquire; a release the daemon cannot make (no
 * such lease, another session's lease, a done event the session does not
 * own) refuses the whole request with EINVAL and changes nothing. */
static msg_t *acquire_releasing(int fd, uint64_t release, uint64_t done) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Acquire a = TENSORBROKER__V1__ACQUIRE__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  q.acquire = &a;
  a.channel = "rel/ch";
  a.release_lease_id = release;
  a.release_done_event_id = done;
  send_req(fd, &q, NULL, 0);
  return recv_reply(fd, NULL);
}

static uint32_t daemon_leases(int fd) {
  msg_t *keep;
  uint32_t n = status(fd, &keep)->leases;

  tb__server_message_free(keep);
  return n;
}

static void test_acquire_release(void **state) {
  pid_t pid = daemon_start(NULL);
  uint64_t mine, theirs, next;
  int p, a, b;
  msg_t *m;

  (void)state;
  assert_true(pid > 0);
  p = connect_sock();
  a = connect_sock();
  b = connect_sock();
  m = hello_reply(a);
  assert_int_equal(m->reply->status, 0);
  assert_true(m->reply->hello->features &
              TENSORBROKER__V1__FEATURE__FEATURE_ACQUIRE_RELEASE);
  tb__server_message_free(m);
  assert_int_equal(hello(p), 0);
  assert_int_equal(hello(b), 0);
  publish(p, "rel/ch", register_memfd(p, "x"));

  m = acquire_releasing(a, 0, 0);
  assert_int_equal(m->reply->status, 0);
  mine = m->reply->acquire->lease_id;
  tb__server_message_free(m);
  assert_int_equal(daemon_leases(p), 1);
  m = acquire_releasing(b, 0, 0);
  assert_int_equal(m->reply->status, 0);
  theirs = m->reply->acquire->lease_id;
  tb__server_message_free(m);
  assert_int_equal(daemon_leases(p), 2);

  /* refused, nothing changes: no such lease, b's lease, a foreign event */
  m = acquire_releasing(a, mine + theirs + 100, 0);
  assert_int_equal(m->reply->status, TB_EINVAL);
  assert_non_null(strstr(m->reply->message, "no such lease"));
  tb__server_message_free(m);
  m = acquire_releasing(a, theirs, 0);
  assert_int_equal(m->reply->status, TB_EINVAL);
  assert_non_null(strstr(m->reply->message, "another session"));
  tb__server_message_free(m);
  m = acquire_releasing(a, mine, 12345);
  assert_int_equal(m->reply->status, TB_EINVAL);
  assert_non_null(strstr(m->reply->message, "done event"));
  tb__server_message_free(m);
  assert_int_equal(daemon_leases(p), 2);

  /* a's lease ends and a new one begins in one request */
  m = acquire_releasing(a, mine, 0);
  assert_int_equal(m->reply->status, 0);
  next = m->reply->acquire->lease_id;
  tb__server_message_free(m);
  assert_true(next != mine);
  assert_int_equal(daemon_leases(p), 2);
  /* the old lease is gone: releasing it again is refused */
  m = acquire_releasing(a, mine, 0);
  assert_int_equal(m->reply->status, TB_EINVAL);
  tb__server_message_free(m);
  assert_int_equal(daemon_leases(p), 2);
  close(a);
  close(b);
  close(p);
  assert_int_equal(daemon_stop(pid, SIGTERM), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
      T(test_startup_rules),
      T(test_protocol_errors_close),
      T(test_slow_reader_dropped),
      T(test_shutdown_notice),
      T(test_hello_timeout),
      T(test_acquire_release),
#undef T
  };
  signal(SIGPIPE, SIG_IGN);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
