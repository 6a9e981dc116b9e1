/* SPDX-License-Identifier: Apache-2.0 */
/* Errors that help (issue 24): a connect that fails says which socket and
 * why (tb_connect_error), and a client whose daemon went away says that the
 * daemon closed the connection, and that it restarted when it did. */
#include "tb_test.h"

#include <errno.h>
#include <grp.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "tb_proto.h"

static char g_why[512];

static int connect_at(const char *sock, tb_client **out) {
  struct tb_connect_options o;
  tb_connect_options_init(&o);
  o.socket_path = sock;
  o.client_name = "connect-errors";
  return tb_client_connect(&o, out);
}

/* tb_connect_error's text must name sock and contain reason. */
static void expect_connect_error(const char *sock, const char *reason) {
  size_t n = tb_connect_error(g_why, sizeof(g_why));
  assert_int_equal(n, strlen(g_why));
  if (strstr(g_why, sock) == NULL || strstr(g_why, reason) == NULL)
    fail_msg("tb_connect_error: '%s' does not name %s and '%s'", g_why, sock,
             reason);
}

static void temp_dir(char *dir, size_t len) {
  snprintf(dir, len, "/tmp/tbtest.XXXXXX");
  assert_non_null(mkdtemp(dir));
}

static void test_no_such_file(void **state) {
  char dir[64], sock[108];
  tb_client *c = NULL;
  (void)state;

  temp_dir(dir, sizeof(dir));
  snprintf(sock, sizeof(sock), "%s/nobody.sock", dir);
  assert_tb_err(connect_at(sock, &c), TB_ECONNECT);
  assert_null(c);
  expect_connect_error(sock, "no such file (is tensorbrokerd running?");
  expect_connect_error(sock, "$TENSORBROKER_SOCKET");
  /* a short buffer gets a truncated, terminated copy and the full length */
  {
    char small[8];
    size_t full = strlen(g_why);
    assert_int_equal(tb_connect_error(small, sizeof(small)), full);
    assert_int_equal(strlen(small), sizeof(small) - 1);
    assert_int_equal(tb_connect_error(NULL, 0), full);
  }
  rmdir(dir);
}

/* a socket file nobody listens on, as a killed daemon leaves it */
static void test_stale_socket(void **state) {
  char dir[64], sock[108];
  struct sockaddr_un a;
  tb_client *c = NULL;
  int fd;
  (void)state;

  temp_dir(dir, sizeof(dir));
  snprintf(sock, sizeof(sock), "%s/stale.sock", dir);
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  close(fd);
  assert_tb_err(connect_at(sock, &c), TB_ECONNECT);
  expect_connect_error(sock, "connection refused (a stale socket: the daemon "
                             "is not running)");
  unlink(sock);
  rmdir(dir);
}

static void *connect_error_elsewhere(void *arg) {
  char buf[16] = "x";
  (void)arg;
  /* this thread never connected: its text is its own, empty */
  return tb_connect_error(buf, sizeof(buf)) == 0 && buf[0] == '\0'
             ? (void *)1
             : NULL;
}

static void test_thread_local_and_cleared(void **state) {
  struct tbt_daemon *d = *state;
  char sock[128];
  tb_client *c = NULL;
  pthread_t t;
  void *ok = NULL;

  snprintf(sock, sizeof(sock), "%s.none", d->sock);
  assert_tb_err(connect_at(sock, &c), TB_ECONNECT);
  assert_int_not_equal(tb_connect_error(NULL, 0), 0);
  assert_int_equal(pthread_create(&t, NULL, connect_error_elsewhere, NULL), 0);
  assert_int_equal(pthread_join(t, &ok), 0);
  assert_non_null(ok);
  /* a successful connect empties it */
  assert_tb_ok(connect_at(d->sock, &c));
  assert_int_equal(tb_connect_error(g_why, sizeof(g_why)), 0);
  assert_string_equal(g_why, "");
  tb_client_disconnect(c);
}

/* The client part runs as uid/gid 65534 in a forked child; the socket is
 * root's, mode 0600. */
static int connect_as_nobody(const char *sock) {
  tb_client *c = NULL;
  int rc;

  if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
    return 3;
  rc = connect_at(sock, &c);
  if (rc != TB_ECONNECT) {
    fprintf(stderr, "connect as 65534: %s\n", tb_err_name(rc));
    return 2;
  }
  tb_connect_error(g_why, sizeof(g_why));
  if (strstr(g_why, sock) == NULL ||
      strstr(g_why, "permission denied (the socket is mode 0600, group ") ==
          NULL ||
      strstr(g_why, "is this user in it?)") == NULL) {
    fprintf(stderr, "connect as 65534: '%s'\n", g_why);
    return 2;
  }
  return 0;
}

static void test_permission_denied(void **state) {
  struct tbt_daemon *d = *state;
  pid_t pid;

  if (getuid() != 0)
    skip(); /* needs root to act as another user */
  /* the directory open to all, the socket to its owner only */
  assert_int_equal(chmod(d->dir, 0711), 0);
  assert_int_equal(chmod(d->sock, 0600), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0)
    _exit(connect_as_nobody(d->sock));
  assert_int_equal(tbt_wait_pid(pid, TBT_TIMEOUT_MS), 0);
}

/* The daemon refuses the Hello: its reason, naming the limit, reaches the
 * caller. */
static void test_hello_refused(void **state) {
  /* root's sessions would be admitted beyond the limit as operators' */
  const char *const extra[] = {"--max-sessions", "1", "--operator-sessions",
                               "0", NULL};
  struct tbt_daemon d;
  tb_client *c1, *c2 = NULL;

  (void)state;
  memset(&d, 0, sizeof(d));
  assert_int_equal(tbt_daemon_start(&d, extra), 0);
  assert_tb_ok(connect_at(d.sock, &c1));
  assert_tb_err(connect_at(d.sock, &c2), TB_ELIMIT);
  expect_connect_error(d.sock, "refused the session");
  expect_connect_error(d.sock, "(--max-sessions)");
  tb_client_disconnect(c1);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

/* A daemon that speaks another protocol: a thread answers the Hello with
 * protocol_version TB_PROTOCOL_VERSION + 1, then closes. */
static void *other_protocol_daemon(void *arg) {
  int lfd = *(int *)arg, fd, fds[TB__MAX_FDS], nfds = 0;
  uint8_t buf[4096];
  tb__request *r = NULL;
  long n;

  fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0)
    return NULL;
  n = tb__wire_recv(fd, buf, sizeof(buf), fds, &nfds, 0);
  if (n > 0 && tb__request_decode(buf, (size_t)n, &r) == 0) {
    Tensorbroker__V1__HelloReply hr = TENSORBROKER__V1__HELLO_REPLY__INIT;
    Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
    tb__server_message m = TENSORBROKER__V1__SERVER_MESSAGE__INIT;
    hr.protocol_version = TB_PROTOCOL_VERSION + 1;
    rep.request_id = r->request_id;
    rep.body_case = TENSORBROKER__V1__REPLY__BODY_HELLO;
    rep.hello = &hr;
    m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY;
    m.reply = &rep;
    n = tb__server_message_encode(&m, buf, sizeof(buf));
    if (n > 0)
      (void)tb__wire_send(fd, buf, (size_t)n, NULL, 0, 0);
    tb__request_free(r);
  }
  close(fd);
  return NULL;
}

static void test_other_protocol(void **state) {
  char dir[64], sock[108];
  struct sockaddr_un a;
  tb_client *c = NULL;
  pthread_t t;
  int lfd;
  (void)state;

  temp_dir(dir, sizeof(dir));
  snprintf(sock, sizeof(sock), "%s/other.sock", dir);
  lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  assert_true(lfd >= 0);
  memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
  assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(listen(lfd, 4), 0);
  assert_int_equal(pthread_create(&t, NULL, other_protocol_daemon, &lfd), 0);
  assert_tb_err(connect_at(sock, &c), TB_EVERSION);
  assert_int_equal(pthread_join(t, NULL), 0);
  expect_connect_error(sock, "another protocol: daemon speaks protocol 2, "
                             "we speak 1");
  close(lfd);
  unlink(sock);
  rmdir(dir);
}

/* The daemon killed and a new one started on the same path: the old client
 * is told the daemon closed the connection and restarted; a new client
 * works. */
static void test_daemon_restarted(void **state) {
  struct tbt_daemon *d = *state;
  char sock[108], err[512];
  struct tb_status st;
  tb_client *old, *c;

  snprintf(sock, sizeof(sock), "%s", d->sock);
  assert_tb_ok(connect_at(sock, &old));
  tbt_daemon_kill(d);
  assert_int_equal(tbt_daemon_start_at(d, sock, NULL, NULL), 0);
  assert_tb_err(tb_daemon_status(old, &st), TB_EDISCONNECTED);
  tb_client_last_error(old, err, sizeof(err));
  if (strstr(err, "the daemon closed the connection and restarted") == NULL ||
      strstr(err, sock) == NULL)
    fail_msg("last error after a restart: '%s'", err);
  /* later calls say the same */
  assert_tb_err(tb_daemon_status(old, &st), TB_EDISCONNECTED);
  tb_client_last_error(old, err, sizeof(err));
  assert_non_null(strstr(err, "lost earlier"));
  assert_non_null(strstr(err, "restarted"));
  tb_client_disconnect(old);
  /* reconnecting is a new client */
  assert_tb_ok(connect_at(sock, &c));
  assert_tb_ok(tb_daemon_status(c, &st));
  assert_int_equal(st.pid, d->pid);
  tb_client_disconnect(c);
}

/* The daemon stopped (its socket removed) and not started again. */
static void test_daemon_stopped(void **state) {
  struct tbt_daemon *d = *state;
  char err[512];
  struct tb_status st;
  struct tb_notice n;
  tb_client *old;
  int rc;

  assert_tb_ok(connect_at(d->sock, &old));
  assert_int_equal(tbt_daemon_stop(d), 0);
  /* the DaemonClosing notice may come first */
  rc = tb_client_poll_notice(old, &n, TBT_TIMEOUT_MS);
  if (rc == 0)
    assert_int_equal(n.type, TB_NOTICE_DAEMON_CLOSING);
  rc = tb_daemon_status(old, &st);
  assert_true(rc == TB_EDISCONNECTED || rc == TB_ESHUTDOWN);
  if (rc == TB_EDISCONNECTED) {
    tb_client_last_error(old, err, sizeof(err));
    if (strstr(err, "the daemon closed the connection") == NULL ||
        strstr(err, "the daemon stopped") == NULL)
      fail_msg("last error after a stop: '%s'", err);
  }
  tb_client_disconnect(old);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_such_file),
      cmocka_unit_test(test_stale_socket),
      cmocka_unit_test_setup_teardown(test_thread_local_and_cleared, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(test_permission_denied, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test(test_hello_refused),
      cmocka_unit_test(test_other_protocol),
      cmocka_unit_test_setup_teardown(test_daemon_restarted, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(test_daemon_stopped, tbt_setup,
                                      tbt_teardown),
  };
  return cmocka_run_group_tests_name("connect_errors", tests, NULL, NULL);
}
