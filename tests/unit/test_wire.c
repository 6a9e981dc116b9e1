/* SPDX-License-Identifier: Apache-2.0 */
/* Datagrams with descriptors over a SOCK_SEQPACKET socketpair. */
#include "tb_test.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fd_count.h"
#include "tb_proto.h"

static int g_sv[2];

static int setup(void **state) {
  (void)state;
  return socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, g_sv);
}

static int teardown(void **state) {
  (void)state;
  close(g_sv[0]);
  close(g_sv[1]);
  return 0;
}

/* Send nfds pipe write ends; the receiver writes through each received fd
 * and the sender reads it back from the matching read end: the received
 * descriptors are real and usable. */
static void test_round_trip_fds(void **state) {
  (void)state;
  for (int nfds = 0; nfds <= TB__MAX_FDS; nfds++) {
    int rd[TB__MAX_FDS], wr[TB__MAX_FDS], got[TB__MAX_FDS];
    int ngot = -1, before = tbt_count_fds();
    char msg[32], buf[64];
    long n;

    for (int i = 0; i < nfds; i++) {
      int p[2];
      assert_int_equal(pipe2(p, O_CLOEXEC), 0);
      rd[i] = p[0];
      wr[i] = p[1];
    }
    snprintf(msg, sizeof(msg), "datagram with %d fds", nfds);
    assert_tb_ok(tb__wire_send(g_sv[0], msg, strlen(msg), wr, nfds, 0));
    n = tb__wire_recv(g_sv[1], buf, sizeof(buf), got, &ngot, 0);
    assert_int_equal(n, (long)strlen(msg));
    assert_memory_equal(buf, msg, (size_t)n);
    assert_int_equal(ngot, nfds);
    for (int i = 0; i < nfds; i++) {
      char c = (char)('A' + i), r = 0;
      assert_int_not_equal(got[i], wr[i]); /* a new descriptor */
      assert_true(fcntl(got[i], F_GETFD) & FD_CLOEXEC);
      close(wr[i]); /* only the received copy remains */
      assert_int_equal(write(got[i], &c, 1), 1);
      close(got[i]);
      assert_int_equal(read(rd[i], &r, 1), 1);
      assert_int_equal(r, c);
      assert_int_equal(read(rd[i], &r, 1), 0); /* no writer left */
      close(rd[i]);
    }
    assert_int_equal(tbt_count_fds(), before);
  }
}

static void test_five_fds_rejected_on_send(void **state) {
  (void)state;
  int fds[5];
  int before = tbt_count_fds();

  for (int i = 0; i < 5; i++)
    fds[i] = 0;
  assert_int_equal(tb__wire_send(g_sv[0], "x", 1, fds, 5, 0), -EINVAL);
  assert_int_equal(tb__wire_send(g_sv[0], "x", 1, fds, -1, 0), -EINVAL);
  assert_int_equal(tbt_count_fds(), before);
  /* nothing was sent */
  {
    char b[4];
    int got[TB__MAX_FDS], ngot = 0;
    assert_int_equal(tb__wire_recv(g_sv[1], b, sizeof(b), got, &ngot,
                                   MSG_DONTWAIT),
                     -EAGAIN);
  }
}

/* A peer that does not use our library attaches 5 descriptors: the receiver
 * reports -EMSGSIZE and keeps none of them. */
static void test_five_fds_rejected_on_recv(void **state) {
  (void)state;
  int fds[5], got[TB__MAX_FDS], ngot = -1;
  union {
    char buf[CMSG_SPACE(sizeof(int) * 5)];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {.iov_base = "five", .iov_len = 4};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                       .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
  struct cmsghdr *c;
  char buf[16];
  int before;

  for (int i = 0; i < 5; i++) {
    fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(fds[i] >= 0);
  }
  memset(&ctl, 0, sizeof(ctl));
  c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * 5);
  memcpy(CMSG_DATA(c), fds, sizeof(fds));
  assert_int_equal(sendmsg(g_sv[0], &msg, 0), 4);
  for (int i = 0; i < 5; i++)
    close(fds[i]);
  before = tbt_count_fds();
  assert_int_equal(tb__wire_recv(g_sv[1], buf, sizeof(buf), got, &ngot, 0),
                   -EMSGSIZE);
  assert_int_equal(ngot, 0);
  assert_int_equal(tbt_count_fds(), before); /* no descriptor leaked */
}

/* A datagram longer than the receive buffer: -EMSGSIZE, the attached
 * descriptors are closed, and the next datagram is read intact. */
static void test_oversized_datagram(void **state) {
  (void)state;
  static uint8_t big[8192];
  int p[2], got[TB__MAX_FDS], ngot = -1, before;
  char buf[1024];

  memset(big, 'b', sizeof(big));
  assert_int_equal(pipe2(p, O_CLOEXEC), 0);
  assert_tb_ok(tb__wire_send(g_sv[0], big, sizeof(big), p, 2, 0));
  close(p[0]);
  close(p[1]);
  before = tbt_count_fds();
  assert_int_equal(tb__wire_recv(g_sv[1], buf, sizeof(buf), got, &ngot, 0),
                   -EMSGSIZE);
  assert_int_equal(ngot, 0);
  assert_int_equal(tbt_count_fds(), before);
  /* exactly cap bytes fits */
  assert_tb_ok(tb__wire_send(g_sv[0], big, sizeof(buf), NULL, 0, 0));
  assert_int_equal(tb__wire_recv(g_sv[1], buf, sizeof(buf), got, &ngot, 0),
                   (long)sizeof(buf));
  assert_int_equal(ngot, 0);
}

/* The receiver is out of descriptors: the datagram comes whole, with
 * *nfds -1 (its descriptors lost), not as -EMSGSIZE ("too large"), which
 * is how the daemon used to misreport it. */
static void test_descriptors_lost(void **state) {
  (void)state;
  int p[2], got[TB__MAX_FDS], ngot = 0, fill[1024], nfill = 0, before;
  struct rlimit old, tight;
  char buf[16];
  long n;

  assert_int_equal(pipe2(p, O_CLOEXEC), 0);
  assert_tb_ok(tb__wire_send(g_sv[0], "lost", 4, p, 2, 0));
  close(p[0]);
  close(p[1]);
  before = tbt_count_fds();
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
  /* no descriptor left: a limit just above the highest open one, and any
   * hole below it filled */
  tight = old;
  tight.rlim_cur = (rlim_t)fcntl(g_sv[1], F_DUPFD_CLOEXEC, 0);
  close((int)tight.rlim_cur);
  for (int fd = 0; fd < 1024; fd++)
    if (fcntl(fd, F_GETFD) >= 0 && (rlim_t)fd >= tight.rlim_cur)
      tight.rlim_cur = (rlim_t)fd + 1;
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &tight), 0);
  while (nfill < 1024 && (fill[nfill] = open("/dev/null", O_RDONLY |
                                                         O_CLOEXEC)) >= 0)
    nfill++;
  assert_true(nfill < 1024); /* open failed: no descriptor left */
  n = tb__wire_recv(g_sv[1], buf, sizeof(buf), got, &ngot, 0);
  for (int i = 0; i < nfill; i++)
    close(fill[i]);
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
  assert_int_equal(n, 4);
  assert_memory_equal(buf, "lost", 4);
  assert_int_equal(ngot, -1);
  assert_int_equal(tbt_count_fds(), before);
}

static void test_end_of_stream_and_errors(void **state) {
  (void)state;
  int got[TB__MAX_FDS], ngot = -1;
  char buf[16];

  /* empty socket, non-blocking: -EAGAIN */
  assert_int_equal(tb__wire_recv(g_sv[1], buf, sizeof(buf), got, &ngot,
                                 MSG_DONTWAIT),
                   -EAGAIN);
  /* peer closed: 0 */
  close(g_sv[0]);
  assert_int_equal(tb__wire_recv(g_sv[1], buf, sizeof(buf), got, &ngot, 0), 0);
  /* sending to a closed peer: -EPIPE, and no SIGPIPE kills us */
  assert_int_equal(tb__wire_send(g_sv[1], "x", 1, NULL, 0, 0), -EPIPE);
  g_sv[0] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0); /* for teardown */
  /* a bad descriptor */
  assert_int_equal(tb__wire_send(-1, "x", 1, NULL, 0, 0), -EBADF);
}

static void test_now_ms(void **state) {
  (void)state;
  uint64_t a = tb__now_ms(), b = tb__now_ms();
  assert_true(b >= a);
  assert_true(a > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_round_trip_fds, setup, teardown),
      cmocka_unit_test_setup_teardown(test_five_fds_rejected_on_send, setup, teardown),
      cmocka_unit_test_setup_teardown(test_five_fds_rejected_on_recv, setup, teardown),
      cmocka_unit_test_setup_teardown(test_oversized_datagram, setup, teardown),
      cmocka_unit_test_setup_teardown(test_descriptors_lost, setup, teardown),
      cmocka_unit_test_setup_teardown(test_end_of_stream_and_errors, setup, teardown),
      cmocka_unit_test(test_now_ms),
  };
  return cmocka_run_group_tests_name("wire", tests, NULL, NULL);
}
