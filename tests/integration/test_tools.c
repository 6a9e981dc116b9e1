/* SPDX-License-Identifier: Apache-2.0 */
/* The command lines: tensorbrokerd's options and socket handling, and
 * tbctl's status/channels/sessions (text and --json). */
#include "tb_test.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cjson/cJSON.h>

#include "harness.h"

static char g_out[1 << 16];

static int run_daemon(const char *a1, const char *a2) {
  const char *argv[] = {getenv("TB_DAEMON"), a1, a2, NULL};
  assert_non_null(argv[0]);
  return tbt_run(argv, g_out, sizeof(g_out));
}

static void test_daemon_cli(void **state) {
  (void)state;
  assert_int_equal(run_daemon("--help", NULL), 0);
  assert_non_null(strstr(g_out, "--socket"));
  assert_int_equal(run_daemon("-h", NULL), 0);
  assert_int_equal(run_daemon("--version", NULL), 0);
  assert_non_null(strstr(g_out, TB_VERSION_STRING));
  assert_int_not_equal(run_daemon("--no-such-option", NULL), 0);
  assert_int_not_equal(run_daemon("--max-ndim", "0"), 0);
  assert_int_not_equal(run_daemon("--max-ndim", "65"), 0);
  assert_int_not_equal(run_daemon("--max-message", "12abc"), 0);
  assert_int_not_equal(run_daemon("--log-level", "loud"), 0);
  assert_int_not_equal(run_daemon("--socket", NULL), 0);
  assert_int_not_equal(run_daemon("extra-argument", NULL), 0);
}

static void quick_round_trip(const struct tbt_daemon *d) {
  tb_client *c;
  struct tb_status st;
  assert_tb_ok(tbt_connect(d, "probe", &c));
  assert_tb_ok(tb_daemon_status(c, &st));
  assert_int_equal(st.pid, d->pid);
  tb_client_disconnect(c);
}

static void test_second_daemon_refused(void **state) {
  struct tbt_daemon *d = *state, d2;
  int code = 0;

  memset(&d2, 0, sizeof(d2));
  assert_true(tbt_daemon_start_at(&d2, d->sock, NULL, &code) < 0);
  assert_int_not_equal(code, 0);
  assert_int_equal(d2.pid, 0);
  /* the first one still owns its socket */
  quick_round_trip(d);
}

static void test_stale_socket_replaced(void **state) {
  (void)state;
  struct tbt_daemon d;
  struct sockaddr_un a;
  char sock[108];
  int fd;

  memset(&d, 0, sizeof(d));
  snprintf(d.dir, sizeof(d.dir), "/tmp/tbtest.XXXXXX");
  assert_non_null(mkdtemp(d.dir));
  snprintf(sock, sizeof(sock), "%s/stale.sock", d.dir);
  /* a socket file nobody listens on, as a killed daemon leaves it */
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  close(fd);
  assert_int_equal(access(sock, F_OK), 0);
  assert_int_equal(tbt_daemon_start_at(&d, sock, NULL, NULL), 0);
  quick_round_trip(&d);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

/* A killed daemon leaves its socket; the next one starts on it. */
static void test_restart_after_kill(void **state) {
  struct tbt_daemon *d = *state;
  char sock[108];

  snprintf(sock, sizeof(sock), "%s", d->sock);
  tbt_daemon_kill(d);
  assert_int_equal(access(sock, F_OK), 0);
  assert_int_equal(tbt_daemon_start_at(d, sock, NULL, NULL), 0);
  quick_round_trip(d);
}

/* ---- tbctl ---- */

static int run_tbctl(const struct tbt_daemon *d, const char *cmd,
                     const char *opt) {
  const char *argv[] = {getenv("TB_TBCTL"), cmd, opt, NULL};
  if (argv[0] == NULL)
    fail_msg("TB_TBCTL not set");
  setenv("TENSORBROKER_SOCKET", d->sock, 1);
  return tbt_run(argv, g_out, sizeof(g_out));
}

/* The first of names that item has, or NULL. */
static cJSON *field(const cJSON *item, const char *const *names) {
  for (int i = 0; names[i] != NULL; i++) {
    cJSON *f = cJSON_GetObjectItemCaseSensitive(item, names[i]);
    if (f != NULL)
      return f;
  }
  return NULL;
}

/* A list reply: a top-level array, or an object holding one under key. */
static cJSON *list_of(cJSON *root, const char *key) {
  if (cJSON_IsArray(root))
    return root;
  return cJSON_GetObjectItemCaseSensitive(root, key);
}

static void test_tbctl(void **state) {
  struct tbt_daemon *d = *state;
  static const char *const k_name[] = {"name", NULL};
  static const char *const k_pid[] = {"pid", NULL};
  static const char *const k_uid[] = {"uid", NULL};
  static const char *const k_leases[] = {"leases", NULL};
  static const char *const k_contract[] = {"stream_contract", "contract", NULL};
  static const char *const k_implicit[] = {"implicit_stream_calls",
                                           "implicit_stream", "implicit", NULL};
  static const char *const k_latest[] = {"latest_version", "latest", NULL};
  static const char *const k_closed[] = {"closed", NULL};
  static const char *const k_sessions[] = {"sessions", NULL};
  static const char *const k_channels[] = {"channels", NULL};
  static const char *const k_version[] = {"daemon_version", "version", NULL};
  tb_client *p, *c;
  tb_buffer *b;
  int64_t shape[1] = {8};
  DLTensor t;
  DLManagedTensorVersioned *r = NULL;
  struct tb_acquire_options o;
  cJSON *root, *list, *f;
  int found;

  assert_tb_ok(tbt_connect(d, "tbctl-producer", &p));
  assert_tb_ok(tbt_connect_contract(d, "tbctl-consumer", TB_CONTRACT_NO_SYNC, &c));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b));
  memset(&t, 0, sizeof(t));
  t.data = tb_buffer_data(b);
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype = (DLDataType){kDLFloat, 32, 1};
  t.shape = shape;
  assert_tb_ok(tb_publish(p, "cam/frames", &t, NULL, NULL));
  assert_tb_ok(tb_publish(p, "cam/frames", &t, NULL, NULL));
  tb_acquire_options_init(&o);
  o.timeout_ms = 0;
  assert_tb_ok(tb_acquire(c, "cam/frames", &o, &r));

  /* text forms */
  assert_int_equal(run_tbctl(d, "status", NULL), 0);
  assert_true(strlen(g_out) > 0);
  assert_int_equal(run_tbctl(d, "channels", NULL), 0);
  assert_non_null(strstr(g_out, "cam/frames"));
  assert_int_equal(run_tbctl(d, "sessions", NULL), 0);
  assert_non_null(strstr(g_out, "tbctl-consumer"));
  assert_non_null(strstr(g_out, "no_sync"));

  /* status --json */
  assert_int_equal(run_tbctl(d, "status", "--json"), 0);
  root = cJSON_Parse(g_out);
  if (root == NULL)
    fail_msg("tbctl status --json is not JSON: %s", g_out);
  f = field(root, k_pid);
  assert_true(cJSON_IsNumber(f));
  assert_int_equal((int)f->valuedouble, d->pid);
  f = field(root, k_sessions);
  assert_true(cJSON_IsNumber(f));
  assert_true(f->valuedouble >= 2); /* ours, and tbctl's own */
  f = field(root, k_channels);
  assert_true(cJSON_IsNumber(f));
  assert_int_equal((int)f->valuedouble, 1);
  f = field(root, k_leases);
  assert_true(cJSON_IsNumber(f));
  assert_int_equal((int)f->valuedouble, 1);
  f = field(root, k_version);
  assert_true(cJSON_IsString(f));
  cJSON_Delete(root);

  /* channels --json */
  assert_int_equal(run_tbctl(d, "channels", "--json"), 0);
  root = cJSON_Parse(g_out);
  if (root == NULL)
    fail_msg("tbctl channels --json is not JSON: %s", g_out);
  list = list_of(root, "channels");
  assert_true(cJSON_IsArray(list));
  assert_int_equal(cJSON_GetArraySize(list), 1);
  {
    cJSON *ch = cJSON_GetArrayItem(list, 0);
    f = field(ch, k_name);
    assert_true(cJSON_IsString(f));
    assert_string_equal(f->valuestring, "cam/frames");
    f = field(ch, k_latest);
    assert_true(cJSON_IsNumber(f));
    assert_int_equal((int)f->valuedouble, 2);
    f = field(ch, k_leases);
    assert_true(cJSON_IsNumber(f));
    assert_int_equal((int)f->valuedouble, 1);
    f = field(ch, k_closed);
    assert_true(cJSON_IsBool(f));
    assert_true(cJSON_IsFalse(f));
  }
  cJSON_Delete(root);

  /* sessions --json */
  assert_int_equal(run_tbctl(d, "sessions", "--json"), 0);
  root = cJSON_Parse(g_out);
  if (root == NULL)
    fail_msg("tbctl sessions --json is not JSON: %s", g_out);
  list = list_of(root, "sessions");
  assert_true(cJSON_IsArray(list));
  assert_true(cJSON_GetArraySize(list) >= 2);
  found = 0;
  for (int i = 0; i < cJSON_GetArraySize(list); i++) {
    cJSON *s = cJSON_GetArrayItem(list, i);
    f = field(s, k_name);
    assert_true(cJSON_IsString(f));
    assert_true(cJSON_IsNumber(field(s, k_pid)));
    assert_true(cJSON_IsNumber(field(s, k_uid)));
    assert_true(cJSON_IsNumber(field(s, k_implicit)));
    assert_non_null(field(s, k_contract));
    if (strcmp(f->valuestring, "tbctl-consumer") == 0) {
      cJSON *ct = field(s, k_contract);
      found = 1;
      assert_int_equal((int)field(s, k_pid)->valuedouble, getpid());
      assert_int_equal((int)field(s, k_uid)->valuedouble, (int)getuid());
      assert_int_equal((int)field(s, k_leases)->valuedouble, 1);
      if (cJSON_IsString(ct))
        assert_string_equal(ct->valuestring, "no_sync");
      else
        assert_int_equal((int)ct->valuedouble, TB_CONTRACT_NO_SYNC);
    }
  }
  assert_true(found);
  cJSON_Delete(root);

  /* a bad command is refused */
  assert_int_not_equal(run_tbctl(d, "no-such-command", NULL), 0);

  assert_tb_ok(tb_release(r, NULL));
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

/* tbctl without a daemon: a clear failure, not a hang. */
/* Lists longer than one datagram come whole, in order: a daemon with
 * small datagrams (--max-message 8192: ~30 long channel names or ~80
 * sessions a page) lists 120 channels and 161 sessions across pages, and
 * tbctl shows every one. */
static int name_cmp(const void *a, const void *b) {
  return strcmp((const char *)a, (const char *)b);
}

static void test_list_pages(void **state) {
  static const char *const extra[] = {"--max-message", "8192",
                                      "--max-metadata", "1024", NULL};
  struct tbt_daemon d;
  enum { NCH = 120, NSESS = 160 };
  static char names[NCH][220];
  tb_client *p, *cl[NSESS];
  tb_buffer *b;
  struct tb_channel_info *ch = NULL;
  struct tb_session_info *ss = NULL;
  size_t nch = 0, nss = 0;
  int64_t shape[1] = {4};
  (void)state;

  memset(&d, 0, sizeof(d));
  assert_int_equal(tbt_daemon_start(&d, extra), 0);
  assert_tb_ok(tbt_connect(&d, "pages-producer", &p));
  assert_tb_ok(tb_host_buffer_create(p, 16, 0, &b));
  for (int i = 0; i < NCH; i++) {
    DLTensor t;
    /* long names, created in an order unlike their sorted order */
    int k = (i * 37) % NCH;
    snprintf(names[i], sizeof(names[i]), "pages/%03d-", k);
    memset(names[i] + 10, 'x', 200);
    names[i][210] = '\0';
    memset(&t, 0, sizeof(t));
    t.data = tb_buffer_data(b);
    t.device.device_type = kDLCPU;
    t.ndim = 1;
    t.dtype.code = kDLFloat;
    t.dtype.bits = 32;
    t.dtype.lanes = 1;
    t.shape = shape;
    assert_tb_ok(tb_publish(p, names[i], &t, NULL, NULL));
  }
  for (int i = 0; i < NSESS; i++) {
    char nm[64];
    snprintf(nm, sizeof(nm), "pages-client-%03d-with-a-long-name-to-fill", i);
    assert_tb_ok(tbt_connect(&d, nm, &cl[i]));
  }

  assert_tb_ok(tb_list_channels(p, &ch, &nch));
  assert_int_equal(nch, NCH);
  qsort(names, NCH, sizeof(names[0]), name_cmp);
  for (size_t i = 0; i < nch; i++)
    assert_string_equal(ch[i].name, names[i]); /* all, sorted, once */
  tb_free(ch);

  assert_tb_ok(tb_list_sessions(p, &ss, &nss));
  assert_int_equal(nss, NSESS + 1);
  for (size_t i = 1; i < nss; i++)
    assert_true(ss[i].session_id > ss[i - 1].session_id);
  tb_free(ss);

  /* tbctl: one line per session after its header */
  assert_int_equal(run_tbctl(&d, "sessions", NULL), 0);
  size_t lines = 0;
  for (const char *q = g_out; (q = strstr(q, "pages-client-")) != NULL; q++)
    lines++;
  assert_int_equal(lines, NSESS);

  for (int i = 0; i < NSESS; i++)
    tb_client_disconnect(cl[i]);
  (void)b; /* freed with the producer's session */
  tb_client_disconnect(p);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

/* tbctl's stderr (and stdout) for `tbctl status` on d's socket. */
static int run_tbctl_stderr(const struct tbt_daemon *d) {
  const char *argv[] = {"/bin/sh", "-c", "exec \"$0\" status 2>&1",
                        getenv("TB_TBCTL"), NULL};
  if (argv[3] == NULL)
    fail_msg("TB_TBCTL not set");
  setenv("TENSORBROKER_SOCKET", d->sock, 1);
  return tbt_run(argv, g_out, sizeof(g_out));
}

/* tbctl without a daemon: it names the socket and why it cannot connect. */
static void test_tbctl_no_daemon(void **state) {
  struct tbt_daemon *d = *state;
  tbt_daemon_kill(d);
  assert_int_not_equal(run_tbctl(d, "status", NULL), 0);
  /* the killed daemon's socket file is left: nobody listens on it */
  assert_int_not_equal(run_tbctl_stderr(d), 0);
  if (strstr(g_out, d->sock) == NULL ||
      strstr(g_out, "connection refused (a stale socket") == NULL)
    fail_msg("tbctl's stderr does not name the socket and the reason: %s",
             g_out);
  assert_int_equal(unlink(d->sock), 0);
  assert_int_not_equal(run_tbctl_stderr(d), 0);
  if (strstr(g_out, d->sock) == NULL ||
      strstr(g_out, "no such file (is tensorbrokerd running?") == NULL)
    fail_msg("tbctl's stderr does not name the socket and the reason: %s",
             g_out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_daemon_cli),
      cmocka_unit_test_setup_teardown(test_second_daemon_refused, tbt_setup, tbt_teardown),
      cmocka_unit_test(test_stale_socket_replaced),
      cmocka_unit_test_setup_teardown(test_restart_after_kill, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_tbctl, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_tbctl_no_daemon, tbt_setup, tbt_teardown),
      cmocka_unit_test(test_list_pages),
  };
  return cmocka_run_group_tests_name("tools", tests, NULL, NULL);
}
