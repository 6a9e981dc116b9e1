/* Processes die: a consumer holding leases, a producer, the daemon itself.
 * Everyone else must be told and keep working; nothing may hang. */
#include "tb_test.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static struct tb_acquire_options acq_opts(int mode, uint64_t version,
                                          int timeout_ms) {
  struct tb_acquire_options o;
  tb_acquire_options_init(&o);
  o.mode = mode;
  o.version = version;
  o.timeout_ms = timeout_ms;
  return o;
}

static void publish_at(tb_client *p, tb_buffer *b, size_t off, const char *ch,
                       uint32_t depth, uint64_t *v) {
  int64_t shape[1] = {256};
  struct tb_publish_options po;
  DLTensor t;

  memset(&t, 0, sizeof(t));
  t.data = (uint8_t *)tb_buffer_data(b) + off;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype = (DLDataType){kDLUInt, 8, 1};
  t.shape = shape;
  tb_publish_options_init(&po);
  po.history_depth = depth;
  assert_tb_ok(tb_publish(p, ch, &t, &po, v));
}

static int connect_child(const char *sock, const char *name, tb_client **c) {
  struct tbt_daemon d;
  memset(&d, 0, sizeof(d));
  snprintf(d.sock, sizeof(d.sock), "%s", sock);
  return tbt_connect(&d, name, c);
}

/* ---- a consumer killed while holding leases ---- */

static int lease_holder(struct tbt_chan *ch, void *arg) {
  tb_client *c;
  DLManagedTensorVersioned *t[3];
  char line[16];

  TBT_CHECK_OK(connect_child(arg, "holder", &c));
  for (uint64_t v = 1; v <= 3; v++) {
    struct tb_acquire_options o = acq_opts(TB_ACQUIRE_EXACT, v, 0);
    TBT_CHECK_OK(tb_acquire(c, "held", &o, &t[v - 1]));
  }
  TBT_CHECK_OK(tbt_send(ch->wr, "holding"));
  /* wait to be killed; the parent never answers */
  tbt_recv(ch->rd, line, sizeof(line), -1);
  return 0;
}

static void test_consumer_killed(void **state) {
  struct tbt_daemon *d = *state;
  struct tbt_child ch;
  tb_client *p;
  tb_buffer *b;
  struct tb_session_info si;
  struct tb_channel_info ci;
  struct tb_status st;
  char line[32];
  uint64_t v;
  int freed[7] = {0};

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tb_host_buffer_create(p, 6 * 256, 0, &b));
  for (int i = 0; i < 3; i++)
    publish_at(p, b, (size_t)i * 256, "held", 3, &v);
  assert_tb_ok(tbt_child_start(&ch, lease_holder, d->sock));
  assert_tb_ok(tbt_recv(ch.rd, line, sizeof(line), TBT_TIMEOUT_MS));
  assert_string_equal(line, "holding");
  assert_tb_ok(tbt_find_session_pid(p, ch.pid, &si));
  assert_int_equal(si.leases, 3);
  assert_string_equal(si.name, "holder");
  /* push versions 1..3 out of the history: only the leases keep them */
  for (int i = 3; i < 6; i++)
    publish_at(p, b, (size_t)i * 256, "held", 3, &v);
  assert_tb_ok(tbt_find_channel(p, "held", &ci));
  assert_int_equal(ci.leases, 3);
  assert_tb_err(tb_wait_free(p, "held", 1, 0, NULL), TB_EBUSY);

  tbt_child_kill(&ch);

  /* the producer is told, one notice per version */
  for (int k = 0; k < 3; k++) {
    struct tb_notice n;
    assert_tb_ok(tbt_expect_notice(p, TB_NOTICE_VERSION_FREE, "held", 0,
                                   TBT_TIMEOUT_MS, &n));
    assert_true(n.version >= 1 && n.version <= 3);
    assert_false(freed[n.version]);
    freed[n.version] = 1;
    assert_int_equal(n.buffer_id, tb_buffer_id(b));
  }
  for (uint64_t k = 1; k <= 3; k++)
    assert_tb_ok(tb_wait_free(p, "held", k, TBT_TIMEOUT_MS, NULL));
  assert_tb_err(tbt_find_session_pid(p, ch.pid, &si), TB_ENOTFOUND);
  assert_tb_ok(tbt_find_channel(p, "held", &ci));
  assert_int_equal(ci.leases, 0);
  assert_int_equal(ci.versions_held, 3);
  assert_tb_ok(tb_daemon_status(p, &st));
  assert_int_equal(st.leases, 0);
  assert_int_equal(st.sessions, 1);
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(p);
}

/* ---- a producer killed ---- */

static int doomed_producer(struct tbt_chan *ch, void *arg) {
  tb_client *p;
  tb_buffer *b;
  int64_t shape[1] = {4096};
  DLTensor t;
  char line[16];

  TBT_CHECK_OK(connect_child(arg, "doomed", &p));
  TBT_CHECK_OK(tb_host_buffer_create(p, 4096, 0, &b));
  tbt_fill(tb_buffer_data(b), 4096, 99);
  tbt_u8_tensor(&t, b, shape, 4096);
  TBT_CHECK_OK(tb_publish(p, "orphan", &t, NULL, NULL));
  TBT_CHECK_OK(tbt_send(ch->wr, "published"));
  tbt_recv(ch->rd, line, sizeof(line), -1);
  return 0;
}

/* Parks a NEXT acquire after version 1, which outlives the producer's
 * death and is granted the next producer's version 2 (seed 5). */
static int parked_consumer(struct tbt_chan *ch, void *arg) {
  tb_client *c;
  DLManagedTensorVersioned *t = NULL;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_NEXT, 1, TBT_TIMEOUT_MS);
  struct tb_lease_info li;
  uint64_t n = 0;

  TBT_CHECK_OK(connect_child(arg, "parked", &c));
  TBT_CHECK_OK(tbt_own_requests(c, &n));
  TBT_CHECK_OK(tbt_send(ch->wr, "session %llu %llu",
                        (unsigned long long)tb_client_session_id(c),
                        (unsigned long long)n));
  TBT_CHECK_OK(tb_acquire(c, "orphan", &o, &t));
  TBT_CHECK_OK(tb_lease_info(t, &li));
  TBT_CHECK(li.version == 2);
  TBT_CHECK(((const uint8_t *)t->dl_tensor.data)[9] == tbt_pattern(9, 5));
  TBT_CHECK_OK(tb_release(t, NULL));
  tb_client_disconnect(c);
  return 0;
}

static void test_producer_killed(void **state) {
  struct tbt_daemon *d = *state;
  struct tbt_child prod, parked;
  tb_client *c;
  DLManagedTensorVersioned *t = NULL;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  struct tb_channel_info ci;
  struct tb_session_info si;
  struct tb_notice n;
  char line[64];
  unsigned long long sid = 0, nreq = 0;
  const uint8_t *px;

  assert_tb_ok(tbt_connect(d, "survivor", &c));
  assert_tb_ok(tb_subscribe(c, "orphan"));
  assert_tb_ok(tbt_child_start(&prod, doomed_producer, d->sock));
  assert_tb_ok(tbt_recv(prod.rd, line, sizeof(line), TBT_TIMEOUT_MS));
  assert_string_equal(line, "published");
  assert_tb_ok(tb_acquire(c, "orphan", &o, &t));

  /* a second consumer parks an acquire for version 2 */
  assert_tb_ok(tbt_child_start(&parked, parked_consumer, d->sock));
  assert_tb_ok(tbt_recv(parked.rd, line, sizeof(line), TBT_TIMEOUT_MS));
  assert_int_equal(sscanf(line, "session %llu %llu", &sid, &nreq), 2);
  assert_tb_ok(tbt_wait_requests(c, sid, nreq + 1));
  assert_tb_ok(tbt_find_session_id(c, sid, &si));

  tbt_child_kill(&prod);

  assert_tb_ok(tbt_expect_notice(c, TB_NOTICE_CHANNEL_CLOSED, "orphan", 0,
                                 TBT_TIMEOUT_MS, &n));
  /* no Goodbye came: the reason says the session ended otherwise; host
   * memory has no GPU work to lose */
  assert_string_equal(n.reason, "publisher ended without closing its session");
  assert_int_equal(n.version, 0);
  /* the bytes are still there: the daemon and we hold the memfd */
  px = (const uint8_t *)t->dl_tensor.data + t->dl_tensor.byte_offset;
  for (size_t i = 0; i < 4096; i++)
    assert_int_equal(px[i], tbt_pattern(i, 99));
  assert_tb_ok(tbt_find_channel(c, "orphan", &ci));
  assert_true(ci.closed);
  assert_int_equal(ci.publisher_session, 0);
  assert_int_equal(ci.latest_version, 1);
  /* what was published stays acquirable (host memory outlives its
   * producer); asking for more without waiting fails at once */
  {
    DLManagedTensorVersioned *t2 = NULL;
    struct tb_acquire_options oe = acq_opts(TB_ACQUIRE_EXACT, 1, 0);
    struct tb_acquire_options on = acq_opts(TB_ACQUIRE_NEXT, 1, 0);
    char why[256];
    assert_tb_ok(tb_acquire(c, "orphan", &oe, &t2));
    assert_int_equal(((const uint8_t *)t2->dl_tensor.data +
                      t2->dl_tensor.byte_offset)[100],
                     tbt_pattern(100, 99));
    t2->deleter(t2);
    assert_tb_err(tb_acquire(c, "orphan", &on, &t2), TB_ECLOSED);
    tb_client_last_error(c, why, sizeof(why));
    assert_non_null(strstr(why, "channel 'orphan' has no producer: its "
                                "publisher ended (pid "));
    assert_non_null(strstr(why, ": publisher ended without closing its "
                                "session) and no version after 1 is left "
                                "that can be granted"));
  }
  /* the parked acquire waited on: a new producer takes the channel over
   * and its first version, 2, goes to it */
  {
    tb_buffer *b2;
    DLTensor t2;
    int64_t shape[1] = {64};
    uint64_t v2 = 0;
    assert_tb_ok(tb_host_buffer_create(c, 4096, 0, &b2));
    tbt_fill(tb_buffer_data(b2), 64, 5);
    tbt_u8_tensor(&t2, b2, shape, 64);
    assert_tb_ok(tb_publish(c, "orphan", &t2, NULL, &v2));
    assert_int_equal(v2, 2);
    assert_int_equal(tbt_child_wait(&parked, TBT_TIMEOUT_MS), 0);
    assert_tb_ok(tbt_find_channel(c, "orphan", &ci));
    assert_false(ci.closed);
    assert_int_equal(ci.publisher_session, tb_client_session_id(c));
    assert_tb_ok(tb_buffer_destroy(b2));
  }
  assert_tb_ok(tb_release(t, NULL));
  tb_client_disconnect(c);
}

/* A producer that disconnects on purpose says Goodbye first: its
 * consumers read "publisher disconnected", not a crash. */
static void test_producer_closes(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *p, *c;
  tb_buffer *b;
  int64_t shape[1] = {64};
  DLTensor t;
  struct tb_notice n;

  assert_tb_ok(tbt_connect(d, "tidy-producer", &p));
  assert_tb_ok(tbt_connect(d, "watcher", &c));
  assert_tb_ok(tb_subscribe(c, "tidy"));
  assert_tb_ok(tb_host_buffer_create(p, 64, 0, &b));
  tbt_u8_tensor(&t, b, shape, 64);
  assert_tb_ok(tb_publish(p, "tidy", &t, NULL, NULL));
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(p);
  assert_tb_ok(tbt_expect_notice(c, TB_NOTICE_CHANNEL_CLOSED, "tidy", 0,
                                 TBT_TIMEOUT_MS, &n));
  assert_string_equal(n.reason, "publisher disconnected");
  tb_client_disconnect(c);
}

/* A child forked from a producer lets go of its inherited copy of the
 * client: that is no Goodbye for the producer's session, so when the
 * producer is killed afterwards its consumers still read that it ended
 * without closing. */
static int forking_producer(struct tbt_chan *ch, void *arg) {
  tb_client *p;
  tb_buffer *b;
  int64_t shape[1] = {64};
  DLTensor t;
  char line[16];
  int st = 0;
  pid_t kid;

  TBT_CHECK_OK(connect_child(arg, "forking", &p));
  TBT_CHECK_OK(tb_host_buffer_create(p, 64, 0, &b));
  tbt_u8_tensor(&t, b, shape, 64);
  TBT_CHECK_OK(tb_publish(p, "forked", &t, NULL, NULL));
  kid = fork();
  if (kid == 0) {
    tb_client_disconnect(p);
    _exit(0);
  }
  if (kid < 0 || waitpid(kid, &st, 0) != kid || !WIFEXITED(st) ||
      WEXITSTATUS(st) != 0)
    return 1;
  TBT_CHECK_OK(tb_publish(p, "forked", &t, NULL, NULL)); /* still ours */
  TBT_CHECK_OK(tbt_send(ch->wr, "published"));
  tbt_recv(ch->rd, line, sizeof(line), -1); /* killed here */
  return 0;
}

static void test_forked_child_disconnects(void **state) {
  struct tbt_daemon *d = *state;
  struct tbt_child prod;
  tb_client *c;
  struct tb_notice n;
  char line[64];

  assert_tb_ok(tbt_connect(d, "watcher", &c));
  assert_tb_ok(tb_subscribe(c, "forked"));
  assert_tb_ok(tbt_child_start(&prod, forking_producer, d->sock));
  assert_tb_ok(tbt_recv(prod.rd, line, sizeof(line), TBT_TIMEOUT_MS));
  assert_string_equal(line, "published");
  tbt_child_kill(&prod);
  assert_tb_ok(tbt_expect_notice(c, TB_NOTICE_CHANNEL_CLOSED, "forked", 0,
                                 TBT_TIMEOUT_MS, &n));
  assert_string_equal(n.reason, "publisher ended without closing its session");
  tb_client_disconnect(c);
}

/* ---- the daemon killed ---- */

struct blocked {
  tb_client *c;
  int rc;
  uint64_t ms;
};

static void *blocked_acquire(void *arg) {
  struct blocked *bl = arg;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, TBT_TIMEOUT_MS);
  DLManagedTensorVersioned *t = NULL;
  uint64_t t0 = tbt_now_ms();

  bl->rc = tb_acquire(bl->c, "never", &o, &t);
  bl->ms = tbt_now_ms() - t0;
  return NULL;
}

static void test_daemon_killed(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *p, *c;
  tb_buffer *b;
  struct tb_session_info si;
  struct tb_status st;
  struct blocked bl = {0};
  pthread_t th;
  DLManagedTensorVersioned *t = NULL;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  uint64_t v = 0;
  int rc;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "consumer", &c));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b));
  publish_at(p, b, 0, "alive", 1, &v);
  assert_tb_ok(tb_acquire(c, "alive", &o, &t));

  bl.c = c;
  assert_tb_ok(tbt_find_session_id(p, tb_client_session_id(c), &si));
  assert_int_equal(pthread_create(&th, NULL, blocked_acquire, &bl), 0);
  assert_tb_ok(tbt_wait_requests(p, tb_client_session_id(c), si.requests + 1));

  tbt_daemon_kill(d);

  assert_int_equal(pthread_join(th, NULL), 0);
  if (bl.rc >= 0 || bl.rc == TB_ETIMEDOUT)
    fail_msg("blocked acquire returned %s after %llu ms", tb_err_name(bl.rc),
             (unsigned long long)bl.ms);
  assert_true(bl.ms < TBT_TIMEOUT_MS);
  /* every later call fails clearly and promptly */
  assert_tb_err(tb_daemon_status(p, &st), TB_EDISCONNECTED);
  assert_tb_err(tb_daemon_status(c, &st), TB_EDISCONNECTED);
  rc = tb_wait_free(p, "alive", 1, TBT_TIMEOUT_MS, NULL);
  assert_true(rc < 0 && rc != TB_ETIMEDOUT);
  {
    DLManagedTensorVersioned *t2 = NULL;
    rc = tb_acquire(c, "alive", &o, &t2);
    assert_true(rc < 0 && rc != TB_ETIMEDOUT);
    assert_null(t2);
  }
  /* the tensor we hold stays readable; its deleter is safe */
  assert_int_equal(((const uint8_t *)t->dl_tensor.data)[0],
                   ((const uint8_t *)tb_buffer_data(b))[0]);
  t->deleter(t);
  tb_buffer_destroy(b);
  tb_client_disconnect(c);
  tb_client_disconnect(p);
  /* nobody listens now */
  assert_tb_err(tbt_connect(d, "late", &c), TB_ECONNECT);
}

/* ---- SIGTERM: clients are told, the daemon exits 0 ---- */

static void test_sigterm(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *c;
  struct tb_notice n;
  struct tb_status st;
  int rc;

  assert_tb_ok(tbt_connect(d, "consumer", &c));
  assert_tb_ok(tb_subscribe(c, "x"));
  assert_int_equal(tbt_daemon_stop(d), 0);
  /* the socket file is gone */
  assert_int_equal(access(d->sock, F_OK), -1);
  assert_int_equal(errno, ENOENT);
  rc = tb_client_poll_notice(c, &n, TBT_TIMEOUT_MS);
  if (rc == 0)
    assert_int_equal(n.type, TB_NOTICE_DAEMON_CLOSING);
  else
    assert_int_equal(rc, TB_EDISCONNECTED);
  rc = tb_daemon_status(c, &st);
  assert_true(rc == TB_EDISCONNECTED || rc == TB_ESHUTDOWN);
  tb_client_disconnect(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_consumer_killed, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_producer_killed, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_producer_closes, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_forked_child_disconnects, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(test_daemon_killed, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_sigterm, tbt_setup, tbt_teardown),
  };
  return cmocka_run_group_tests_name("failure", tests, NULL, NULL);
}
