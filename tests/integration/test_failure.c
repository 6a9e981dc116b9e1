/* SPDX-License-Identifier: Apache-2.0 */
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
#include "raw_wire.h"

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
    struct tb_acquire_options ol = acq_opts(TB_ACQUIRE_LATEST, 0, 200);
    struct tb_acquire_options on = acq_opts(TB_ACQUIRE_NEXT, 1, 0);
    struct tb_lease_info li;
    char why[256];
    assert_tb_ok(tb_acquire(c, "orphan", &oe, &t2));
    assert_int_equal(((const uint8_t *)t2->dl_tensor.data +
                      t2->dl_tensor.byte_offset)[100],
                     tbt_pattern(100, 99));
    t2->deleter(t2);
    assert_tb_ok(tb_acquire(c, "orphan", &ol, &t2));
    assert_tb_ok(tb_lease_info(t2, &li));
    assert_int_equal(li.version, 1);
    assert_int_equal(((const uint8_t *)t2->dl_tensor.data)[7],
                     tbt_pattern(7, 99));
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

/* A watcher subscribed to channel, and a producer child running fn that
 * says "published" once it has published there. */
static void watch_producer(struct tbt_daemon *d, const char *channel,
                           tbt_child_fn fn, tb_client **watcher,
                           struct tbt_child *prod) {
  char line[64];

  assert_tb_ok(tbt_connect(d, "watcher", watcher));
  assert_tb_ok(tb_channel_subscribe(*watcher, channel));
  assert_tb_ok(tbt_child_start(prod, fn, d->sock));
  assert_tb_ok(tbt_recv(prod->rd, line, sizeof(line), TBT_TIMEOUT_MS));
  assert_string_equal(line, "published");
}

static void test_forked_child_disconnects(void **state) {
  struct tbt_daemon *d = *state;
  struct tbt_child prod;
  tb_client *c;
  struct tb_notice n;

  watch_producer(d, "forked", forking_producer, &c, &prod);
  tbt_child_kill(&prod);
  assert_tb_ok(tbt_expect_notice(c, TB_NOTICE_CHANNEL_CLOSED, "forked", 0,
                                 TBT_TIMEOUT_MS, &n));
  assert_string_equal(n.reason, "publisher ended without closing its session");
  tb_client_disconnect(c);
}

/* A child forked from a consumer that holds a lease cannot use the client
 * it inherited: every call fails with TB_EFORKED before it sends anything
 * (the parent's session, its replies and its lease are the parent's), the
 * inherited socket is closed, and letting go of the inherited tensor ends
 * nothing. The child reads the same version through a client of its own.
 * Returns the child's exit code. */
static int inheriting_child(const char *sock, tb_client *c,
                            DLManagedTensorVersioned *t, uint64_t v) {
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_EXACT, v, 0);
  DLManagedTensorVersioned *t2 = NULL;
  struct tb_notice n;
  struct tb_status st;
  int64_t shape[1] = {8};
  DLTensor x;
  uint64_t w;
  char why[512];
  tb_client *own;

  memset(&x, 0, sizeof(x));
  x.data = t->dl_tensor.data;
  x.device.device_type = kDLCPU;
  x.ndim = 1;
  x.dtype = (DLDataType){kDLUInt, 8, 1};
  x.shape = shape;
  TBT_CHECK_RC(tb_acquire(c, "inherited", &o, &t2), TB_EFORKED);
  TBT_CHECK(t2 == NULL);
  TBT_CHECK_RC(tb_channel_subscribe(c, "inherited"), TB_EFORKED);
  TBT_CHECK_RC(tb_notice_poll(c, sizeof(n), &n, 0), TB_EFORKED);
  TBT_CHECK_RC(tb_daemon_get_status(c, sizeof(st), &st), TB_EFORKED);
  TBT_CHECK_RC(tb_channel_publish_copy(c, "inherited-by-child", &x, NULL, &w),
               TB_EFORKED);
  TBT_CHECK_RC(tb_lease_wait(t, NULL), TB_EFORKED);
  TBT_CHECK(tb_client_fd(c) == -1);
  TBT_CHECK(tb_client_last_error(c, why, sizeof(why)) > 0);
  TBT_CHECK(strstr(why, "is a fork of it") != NULL);
  /* this process's copy of the mapping stays readable */
  for (size_t i = 0; i < 256; i++)
    TBT_CHECK(((uint8_t *)t->dl_tensor.data)[i] == tbt_pattern(i, 5));
  TBT_CHECK_OK(tb_lease_release(t, NULL)); /* the child's copy only */
  tb_client_disconnect(c);

  TBT_CHECK_OK(connect_child(sock, "forked-own", &own));
  TBT_CHECK_OK(tb_acquire(own, "inherited", &o, &t2));
  for (size_t i = 0; i < 256; i++)
    TBT_CHECK(((uint8_t *)t2->dl_tensor.data)[i] == tbt_pattern(i, 5));
  TBT_CHECK_OK(tb_lease_release(t2, NULL));
  tb_client_disconnect(own);
  return 0;
}

static void test_forked_child_inherits_lease(void **state) {
  struct tbt_daemon *d = *state;
  DLManagedTensorVersioned *t;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  struct tb_status st;
  tb_client *p, *c;
  tb_buffer *b;
  uint64_t v, w;
  pid_t kid;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "consumer", &c));
  assert_tb_ok(tb_buffer_create_host(p, 512, 0, &b));
  tbt_fill(tb_buffer_data(b), 256, 5);
  publish_at(p, b, 0, "inherited", 1, &v);
  assert_tb_ok(tb_acquire(c, "inherited", &o, &t));

  kid = fork();
  assert_true(kid >= 0);
  if (kid == 0)
    _exit(inheriting_child(d->sock, c, t, v));
  assert_int_equal(tbt_wait_pid(kid, TBT_TIMEOUT_MS), 0);

  /* the parent's lease still holds the version, out of the channel's
   * history now, its bytes unchanged */
  publish_at(p, b, 256, "inherited", 1, &w);
  assert_int_equal(tb_channel_wait_free(p, "inherited", v, 0, NULL),
                   TB_EBUSY);
  for (size_t i = 0; i < 256; i++)
    assert_int_equal(((uint8_t *)t->dl_tensor.data)[i], tbt_pattern(i, 5));
  /* and its client answers its own calls */
  assert_tb_ok(tb_daemon_get_status(c, sizeof(st), &st));
  assert_true(tb_client_fd(c) >= 0);
  assert_tb_ok(tb_lease_release(t, NULL));
  assert_tb_ok(tb_channel_wait_free(p, "inherited", v, TBT_TIMEOUT_MS, NULL));
  tb_client_disconnect(c);
  tb_buffer_destroy(b);
  tb_client_disconnect(p);
}

/* A thread parked in a call holds the client's call lock; a fork then
 * leaves that lock held in the child, where no thread will let go of it.
 * The child's calls on the inherited client must fail with TB_EFORKED
 * without waiting for it, and its disconnect must return. */
struct parked {
  tb_client *c;
  int rc;
};

static void *parked_acquire(void *arg) {
  struct parked *w = arg;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, TBT_TIMEOUT_MS);
  DLManagedTensorVersioned *t = NULL;

  w->rc = tb_acquire(w->c, "parked", &o, &t);
  if (w->rc == 0)
    w->rc = tb_lease_release(t, NULL);
  return NULL;
}

static void test_fork_while_a_call_waits(void **state) {
  struct tbt_daemon *d = *state;
  struct parked w = {NULL, -1};
  tb_client *p, *watch;
  tb_buffer *b;
  pthread_t th;
  uint64_t n;
  int code;
  pid_t kid;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "watch", &watch));
  assert_tb_ok(tbt_connect(d, "parked", &w.c));
  assert_tb_ok(tbt_own_requests(w.c, &n));
  assert_int_equal(pthread_create(&th, NULL, parked_acquire, &w), 0);
  assert_tb_ok(tbt_wait_requests(watch, tb_client_session_id(w.c), n + 1));

  kid = fork();
  assert_true(kid >= 0);
  if (kid == 0) {
    struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
    DLManagedTensorVersioned *t = NULL;
    char why[512];

    TBT_CHECK_RC(tb_acquire(w.c, "parked", &o, &t), TB_EFORKED);
    TBT_CHECK(tb_client_last_error(w.c, why, sizeof(why)) > 0);
    TBT_CHECK(strstr(why, "is a fork of it") != NULL);
    tb_client_disconnect(w.c);
    _exit(0);
  }
  code = tbt_wait_pid(kid, TBT_TIMEOUT_MS);
  if (code == -ETIMEDOUT) {
    kill(kid, SIGKILL);
    tbt_wait_pid(kid, TBT_TIMEOUT_MS);
  }
  assert_int_equal(code, 0);

  /* the parent's parked call is answered as if nothing happened */
  assert_tb_ok(tb_buffer_create_host(p, 256, 0, &b));
  publish_at(p, b, 0, "parked", 1, NULL);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_tb_ok(w.rc);
  tb_client_disconnect(w.c);
  tb_client_disconnect(watch);
  tb_buffer_destroy(b);
  tb_client_disconnect(p);
}

/* A producer forks a child that outlives it and never touches the client:
 * the child closed its copy of the socket at the fork, so the producer's
 * death still ends its session and its consumers are told. */
static int producer_with_long_child(struct tbt_chan *ch, void *arg) {
  tb_client *p;
  tb_buffer *b;
  int64_t shape[1] = {64};
  DLTensor t;
  char line[16];
  pid_t kid;

  TBT_CHECK_OK(connect_child(arg, "parent", &p));
  TBT_CHECK_OK(tb_buffer_create_host(p, 64, 0, &b));
  tbt_u8_tensor(&t, b, shape, 64);
  TBT_CHECK_OK(tb_channel_publish(p, "outlived", &t, NULL, NULL));
  kid = fork();
  TBT_CHECK(kid >= 0);
  if (kid == 0) {
    /* lives until the test closes the pipe, long after its parent */
    while (tbt_recv(ch->rd, line, sizeof(line), -1) == 0)
      ;
    _exit(0);
  }
  TBT_CHECK_OK(tbt_send(ch->wr, "published"));
  tbt_recv(ch->rd, line, sizeof(line), -1); /* killed here */
  return 0;
}

static void test_forked_child_outlives_producer(void **state) {
  struct tbt_daemon *d = *state;
  struct tbt_child prod;
  tb_client *c;
  struct tb_notice n;

  watch_producer(d, "outlived", producer_with_long_child, &c, &prod);
  /* the producer dies; its child lives on, holding the pipe open */
  kill(prod.pid, SIGKILL);
  assert_int_equal(tbt_wait_pid(prod.pid, TBT_TIMEOUT_MS), 128 + SIGKILL);
  prod.pid = 0;
  assert_tb_ok(tbt_expect_notice(c, TB_NOTICE_CHANNEL_CLOSED, "outlived", 0,
                                 TBT_TIMEOUT_MS, &n));
  assert_string_equal(n.reason, "publisher ended without closing its session");
  tbt_child_kill(&prod); /* closes the pipe: the child exits */
  tb_client_disconnect(c);
}

/* ---- a CUDA IPC producer's death and restart ----
 *
 * The producers and the consumers that are granted CUDA versions speak the
 * wire (raw_wire.h): through the library a CUDA publish needs a GPU, and
 * the daemon never opens the made-up handles. Consumers that must not be
 * granted anything use the library, which would fail with TB_ENOCUDA (or
 * TB_EDEVICE on a GPU machine) if they were. */

#define CAM "gpu/cam0"

struct cuda_prod {
  const struct tbt_daemon *d;
  int versions; /* how many to publish, history depth 3 */
  uint8_t tag;  /* the made-up handle's first byte */
};

/* Publishes, says "published V" with its last version, then on "bye"
 * closes its session as tb_client_disconnect does (Goodbye first), or is
 * killed while it waits. */
static int cuda_producer(struct tbt_chan *ch, void *arg) {
  const struct cuda_prod *cp = arg;
  uint64_t b, v = 0;
  char line[16];
  int fd;

  raw_child();
  fd = raw_connect(cp->d);
  raw_hello_as(fd, true, true);
  b = raw_cuda_buffer(fd, 2, cp->tag);
  for (int i = 0; i < cp->versions; i++)
    v = raw_publish_depth(fd, 3 + (uint64_t)i, CAM, b, 0, 3);
  TBT_CHECK_OK(tbt_send(ch->wr, "published %llu", (unsigned long long)v));
  TBT_CHECK_OK(tbt_recv(ch->rd, line, sizeof(line), -1));
  TBT_CHECK(strcmp(line, "bye") == 0);
  raw_goodbye(fd);
  close(fd);
  return 0;
}

/* Start a producer; returns its last version. */
static uint64_t cuda_producer_start(struct tbt_child *c, struct cuda_prod *cp) {
  unsigned long long v = 0;
  char line[64];

  assert_tb_ok(tbt_child_start(c, cuda_producer, cp));
  assert_tb_ok(tbt_recv(c->rd, line, sizeof(line), TBT_TIMEOUT_MS));
  assert_int_equal(sscanf(line, "published %llu", &v), 1);
  return v;
}

/* How the producer ends: its ChannelClosed reason. */
static const char *cuda_producer_reason(bool bye) {
  return bye ? "publisher disconnected"
             : "publisher ended without closing its session";
}

/* End the producer, with its Goodbye (bye) or by SIGKILL, and wait until
 * the daemon has closed its channel: watcher, subscribed to CAM, hears. */
static void cuda_producer_end(struct tbt_child *c, bool bye,
                              tb_client *watcher) {
  struct tb_notice n;

  if (bye) {
    assert_tb_ok(tbt_send(c->wr, "bye"));
    assert_int_equal(tbt_child_wait(c, TBT_TIMEOUT_MS), 0);
  } else {
    tbt_child_kill(c);
  }
  assert_tb_ok(tbt_expect_notice(watcher, TB_NOTICE_CHANNEL_CLOSED, CAM, 0,
                                 TBT_TIMEOUT_MS, &n));
  assert_string_equal(n.reason, cuda_producer_reason(bye));
}

/* A raw CUDA consumer's HelloReply entries for CAM named at connect. */
static size_t named_latest(const struct tbt_daemon *d) {
  const char *names[] = {CAM};
  struct raw_hello_opts o = {.cuda = true, .prefetch = true,
                             .channels = names, .n_channels = 1};
  int fd = raw_connect(d);
  tb__server_message *m = raw_hello_reply(fd, &o);
  size_t n = m->reply->hello->n_latest;

  tb__server_message_free(m);
  close(fd);
  return n;
}

/* tb_acquire on CAM must fail with TB_ECLOSED and this message. */
static void expect_closed(tb_client *c, int mode, uint64_t version,
                          int timeout_ms, const char *want) {
  struct tb_acquire_options o = acq_opts(mode, version, timeout_ms);
  DLManagedTensorVersioned *t = NULL;
  char why[256];

  assert_tb_err(tb_acquire(c, CAM, &o, &t), TB_ECLOSED);
  assert_null(t);
  tb_client_last_error(c, why, sizeof(why));
  assert_string_equal(why, want);
}

/* A CUDA IPC producer publishes 1..3 and ends: nothing of it is granted
 * to a new consumer, who is told the producer is gone (after its timeout,
 * or at once with timeout 0), never a timeout or a CUDA failure; EXACT of
 * a version that died says so; a consumer naming the channel at connect
 * is sent no dead buffer. The channel stays, closed, numbered up to 3. */
static void cuda_producer_gone(const struct tbt_daemon *d, bool bye) {
  struct cuda_prod cp = {.d = d, .versions = 3, .tag = 0x11};
  struct tbt_child prod;
  struct tb_channel_info ci;
  tb_client *w, *late;
  char gone[256], gone_next[256], died[256];
  uint64_t t0, ms;

  assert_tb_ok(tbt_connect(d, "watcher", &w));
  assert_tb_ok(tb_subscribe(w, CAM));
  assert_int_equal(cuda_producer_start(&prod, &cp), 3);
  assert_int_equal(named_latest(d), 1); /* while it lives */
  snprintf(gone, sizeof(gone),
           "channel '" CAM "' has no producer: its publisher ended (pid %d: "
           "%s) and no version is left that can be granted",
           (int)prod.pid, cuda_producer_reason(bye));
  snprintf(gone_next, sizeof(gone_next),
           "channel '" CAM "' has no producer: its publisher ended (pid %d: "
           "%s) and no version after 0 is left that can be granted",
           (int)prod.pid, cuda_producer_reason(bye));
  snprintf(died, sizeof(died),
           "version 3 of '" CAM "' is gone: its CUDA IPC memory died with "
           "its producer (pid %d)",
           (int)prod.pid);
  cuda_producer_end(&prod, bye, w);

  assert_tb_ok(tbt_connect(d, "late", &late));
  t0 = tbt_now_ms();
  expect_closed(late, TB_ACQUIRE_LATEST, 0, 200, gone);
  ms = tbt_now_ms() - t0;
  assert_true(ms >= 190); /* it waited for a new producer */
  expect_closed(late, TB_ACQUIRE_LATEST, 0, 0, gone);
  expect_closed(late, TB_ACQUIRE_NEXT, 0, 0, gone_next);
  expect_closed(late, TB_ACQUIRE_EXACT, 3, 0, died);
  assert_int_equal(named_latest(d), 0);
  assert_tb_ok(tbt_find_channel(w, CAM, &ci));
  assert_true(ci.closed);
  assert_int_equal(ci.publisher_session, 0);
  assert_int_equal(ci.latest_version, 3);
  assert_int_equal(ci.versions_held, 0);
  tb_client_disconnect(late);
  tb_client_disconnect(w);
}

static void test_cuda_producer_exits(void **state) {
  cuda_producer_gone(*state, true);
}

static void test_cuda_producer_killed(void **state) {
  cuda_producer_gone(*state, false);
}

/* A raw consumer's reply to its parked acquire (request 2): a lease on
 * version v in the buffer whose handle starts with tag. */
static void expect_granted(int fd, uint64_t v, uint8_t tag) {
  tb__server_message *m = raw_recv(fd);

  assert_non_null(m);
  assert_int_equal(m->body_case, TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY);
  assert_int_equal(m->reply->request_id, 2);
  assert_int_equal(m->reply->status, 0);
  assert_int_equal(m->reply->body_case, TENSORBROKER__V1__REPLY__BODY_ACQUIRE);
  assert_int_equal(m->reply->acquire->version, v);
  assert_int_equal(m->reply->acquire->buffer->cuda_ipc_handle.data[0], tag);
  tb__server_message_free(m);
}

/* Consumers wait through a producer's death and are granted the next
 * producer's first version, numbered after the dead one's: one parked in
 * NEXT after 3 before the kill, one parked in LATEST after it. */
static void test_cuda_producer_restarts(void **state) {
  const struct tbt_daemon *d = *state;
  struct cuda_prod first = {.d = d, .versions = 3, .tag = 0x11};
  struct cuda_prod second = {.d = d, .versions = 1, .tag = 0x22};
  struct tbt_child prod;
  struct tb_channel_info ci;
  tb_client *w;
  uint64_t sid_next, sid_latest;
  int next, latest;

  assert_tb_ok(tbt_connect(d, "watcher", &w));
  assert_tb_ok(tb_subscribe(w, CAM));
  assert_int_equal(cuda_producer_start(&prod, &first), 3);
  next = raw_connect(d);
  sid_next = raw_hello_as(next, false, true);
  raw_send_acquire(next, 2, CAM, TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_NEXT,
                   3, TBT_TIMEOUT_MS);
  assert_tb_ok(tbt_wait_requests(w, sid_next, 2)); /* Hello, Acquire */

  cuda_producer_end(&prod, false, w);
  /* the daemon answered nothing: it would have before its notice */
  assert_false(raw_pending(next));
  latest = raw_connect(d);
  sid_latest = raw_hello_as(latest, false, true);
  raw_send_acquire(latest, 2, CAM,
                   TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_LATEST, 0,
                   TBT_TIMEOUT_MS);
  assert_tb_ok(tbt_wait_requests(w, sid_latest, 2));
  assert_false(raw_pending(latest)); /* parked: nothing left to grant */

  assert_int_equal(cuda_producer_start(&prod, &second), 4);
  expect_granted(next, 4, 0x22);
  expect_granted(latest, 4, 0x22);
  assert_tb_ok(tbt_find_channel(w, CAM, &ci));
  assert_false(ci.closed);
  assert_int_equal(ci.latest_version, 4);
  assert_int_equal(ci.leases, 2);
  close(next);
  close(latest);
  cuda_producer_end(&prod, true, w);
  tb_client_disconnect(w);
}

/* A lease taken before the producer died keeps working: its holder is
 * told the channel closed, nobody else is granted the version, the
 * release succeeds, and then the version and its buffer are freed (the
 * holder hears the buffer retire). */
static void test_cuda_lease_outlives_producer(void **state) {
  const struct tbt_daemon *d = *state;
  struct cuda_prod cp = {.d = d, .versions = 3, .tag = 0x11};
  Tensorbroker__V1__Acquire aq = TENSORBROKER__V1__ACQUIRE__INIT;
  Tensorbroker__V1__Release rl = TENSORBROKER__V1__RELEASE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  struct tbt_child prod;
  struct tb_channel_info ci;
  struct tb_status st;
  tb__server_message *m;
  tb_client *w;
  uint64_t lease, bid;
  int fd;

  assert_tb_ok(tbt_connect(d, "watcher", &w));
  assert_tb_ok(tb_subscribe(w, CAM));
  assert_int_equal(cuda_producer_start(&prod, &cp), 3);
  fd = raw_connect(d);
  raw_hello_as(fd, false, true);
  aq.channel = CAM;
  aq.mode = TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_EXACT;
  aq.version = 3;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  r.acquire = &aq;
  m = raw_ok(fd, &r, 2);
  lease = m->reply->acquire->lease_id;
  bid = m->reply->acquire->buffer->buffer_id;
  tb__server_message_free(m);

  cuda_producer_end(&prod, false, w);
  m = raw_recv(fd); /* the lease holder is told too */
  assert_non_null(m);
  assert_int_equal(m->body_case,
                   TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE);
  assert_int_equal(m->notice->body_case,
                   TENSORBROKER__V1__NOTICE__BODY_CHANNEL_CLOSED);
  tb__server_message_free(m);
  assert_tb_ok(tbt_find_channel(w, CAM, &ci));
  assert_int_equal(ci.versions_held, 1); /* the leased one, only */
  assert_int_equal(ci.leases, 1);
  assert_tb_ok(tb_daemon_status(w, &st));
  assert_int_equal(st.buffers, 1);
  {
    struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
    DLManagedTensorVersioned *t = NULL;
    assert_tb_err(tb_acquire(w, CAM, &o, &t), TB_ECLOSED);
  }

  rl.lease_id = lease;
  rl.want_reply = true;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_RELEASE;
  r.release = &rl;
  r.request_id = 3;
  raw_send_req(fd, &r);
  m = raw_recv(fd); /* the buffer goes with the version, before the reply */
  assert_non_null(m);
  assert_int_equal(m->body_case,
                   TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE);
  assert_int_equal(m->notice->body_case,
                   TENSORBROKER__V1__NOTICE__BODY_BUFFER_RETIRED);
  assert_int_equal(m->notice->buffer_retired->buffer_id, bid);
  tb__server_message_free(m);
  m = raw_recv(fd);
  assert_non_null(m);
  assert_int_equal(m->body_case, TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY);
  assert_int_equal(m->reply->request_id, 3);
  assert_int_equal(m->reply->status, 0);
  tb__server_message_free(m);
  assert_tb_ok(tbt_find_channel(w, CAM, &ci));
  assert_int_equal(ci.versions_held, 0);
  assert_int_equal(ci.leases, 0);
  assert_tb_ok(tb_daemon_status(w, &st));
  assert_int_equal(st.buffers, 0);
  assert_int_equal(st.leases, 0);
  close(fd);
  tb_client_disconnect(w);
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
      cmocka_unit_test_setup_teardown(test_forked_child_inherits_lease, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(test_fork_while_a_call_waits, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(test_forked_child_outlives_producer,
                                      tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_forked_child_disconnects, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(test_cuda_producer_exits, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(test_cuda_producer_killed, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(test_cuda_producer_restarts, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(test_cuda_lease_outlives_producer,
                                      tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_daemon_killed, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_sigterm, tbt_setup, tbt_teardown),
  };
  return cmocka_run_group_tests_name("failure", tests, NULL, NULL);
}
