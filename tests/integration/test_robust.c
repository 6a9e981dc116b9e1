/* SPDX-License-Identifier: Apache-2.0 */
/* Bad and slow clients speaking the wire directly: the daemon answers
 * protocol errors by closing that connection and keeps serving everyone
 * else. After each abuse a normal client makes a full round trip. */
#include "tb_test.h"

#include <fcntl.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "raw_wire.h"

/* After a protocol error: at most one Reply{TB_EPROTO}, then end of stream. */
static void expect_closed_with_eproto(int fd) {
  tb__server_message *m = raw_recv(fd);

  if (m != NULL) {
    assert_int_equal(m->body_case, TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY);
    assert_int_equal(m->reply->status, TB_EPROTO);
    tb__server_message_free(m);
    assert_null(raw_recv(fd));
  }
  close(fd);
}

/* A normal client: connect, publish, acquire, release, status. */
static void round_trip(const struct tbt_daemon *d, struct tb_status *out) {
  tb_client *c;
  tb_buffer *b;
  int64_t shape[1] = {16};
  DLTensor t;
  DLManagedTensorVersioned *r = NULL;
  struct tb_acquire_options o;

  assert_tb_ok(tbt_connect(d, "witness", &c));
  assert_tb_ok(tb_host_buffer_create(c, 4096, 0, &b));
  memset(&t, 0, sizeof(t));
  t.data = tb_buffer_data(b);
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype = (DLDataType){kDLUInt, 8, 1};
  t.shape = shape;
  ((uint8_t *)tb_buffer_data(b))[3] = 0x42;
  assert_tb_ok(tb_publish(c, "witness", &t, NULL, NULL));
  tb_acquire_options_init(&o);
  o.timeout_ms = 0;
  assert_tb_ok(tb_acquire(c, "witness", &o, &r));
  assert_int_equal(((uint8_t *)r->dl_tensor.data)[3], 0x42);
  assert_tb_ok(tb_release(r, NULL));
  assert_tb_ok(tb_daemon_status(c, out));
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(c);
}

static void test_garbage(void **state) {
  struct tbt_daemon *d = *state;
  static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x07, 0x00, 0x13};
  struct tb_status st;
  int fd;

  /* before Hello */
  fd = raw_connect(d);
  assert_int_equal(tb__wire_send(fd, junk, sizeof(junk), NULL, 0, 0), 0);
  expect_closed_with_eproto(fd);
  round_trip(d, &st);
  assert_true(st.bad_messages >= 1);
  /* after Hello */
  fd = raw_connect(d);
  raw_hello(fd);
  assert_int_equal(tb__wire_send(fd, junk, sizeof(junk), NULL, 0, 0), 0);
  expect_closed_with_eproto(fd);
  round_trip(d, &st);
  assert_true(st.bad_messages >= 2);
  /* an empty datagram */
  fd = raw_connect(d);
  raw_hello(fd);
  assert_int_equal(tb__wire_send(fd, "", 0, NULL, 0, 0), 0);
  expect_closed_with_eproto(fd);
  round_trip(d, &st);
}

static void test_truncated(void **state) {
  struct tbt_daemon *d = *state;
  Tensorbroker__V1__Subscribe s = TENSORBROKER__V1__SUBSCRIBE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  uint8_t buf[256];
  struct tb_status st;
  long n;
  int fd;

  s.channel = "a/rather/long/channel/name/to/cut";
  r.request_id = 2;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_SUBSCRIBE;
  r.subscribe = &s;
  n = tb__request_encode(&r, buf, sizeof(buf));
  assert_true(n > 10);
  fd = raw_connect(d);
  raw_hello(fd);
  assert_int_equal(tb__wire_send(fd, buf, (size_t)n / 2, NULL, 0, 0), 0);
  expect_closed_with_eproto(fd);
  round_trip(d, &st);
}

static void test_oversized(void **state) {
  struct tbt_daemon *d = *state;
  static uint8_t big[70000];
  struct tb_status st;
  int fd;

  memset(big, 0x0a, sizeof(big));
  fd = raw_connect(d);
  raw_hello(fd);
  assert_int_equal(tb__wire_send(fd, big, sizeof(big), NULL, 0, 0), 0);
  expect_closed_with_eproto(fd);
  round_trip(d, &st);
  assert_true(st.bad_messages >= 1);
}

static void test_request_before_hello(void **state) {
  struct tbt_daemon *d = *state;
  Tensorbroker__V1__Status s = TENSORBROKER__V1__STATUS__INIT;
  Tensorbroker__V1__Hello h = TENSORBROKER__V1__HELLO__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  struct tb_status st;
  int fd;

  fd = raw_connect(d);
  r.request_id = 5;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
  r.status = &s;
  raw_send_req(fd, &r);
  expect_closed_with_eproto(fd);
  round_trip(d, &st);

  /* a second Hello */
  fd = raw_connect(d);
  raw_hello(fd);
  h.protocol_version = 1;
  r.request_id = 6;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
  r.hello = &h;
  raw_send_req(fd, &r);
  expect_closed_with_eproto(fd);
  round_trip(d, &st);

  /* a Hello of another protocol version: refused, not a crash */
  fd = raw_connect(d);
  h.protocol_version = 2;
  r.request_id = 7;
  raw_send_req(fd, &r);
  {
    tb__server_message *m = raw_recv(fd);
    if (m != NULL) {
      assert_int_equal(m->reply->status, TB_EVERSION);
      tb__server_message_free(m);
    }
  }
  close(fd);
  round_trip(d, &st);
}

static void test_unexpected_fds(void **state) {
  struct tbt_daemon *d = *state;
  Tensorbroker__V1__Status s = TENSORBROKER__V1__STATUS__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  uint8_t buf[64];
  struct tb_status st;
  int fd, devnull;
  long n;

  r.request_id = 9;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
  r.status = &s;
  n = tb__request_encode(&r, buf, sizeof(buf));
  devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  fd = raw_connect(d);
  raw_hello(fd);
  assert_int_equal(tb__wire_send(fd, buf, (size_t)n, &devnull, 1, 0), 0);
  close(devnull);
  expect_closed_with_eproto(fd);
  round_trip(d, &st);
}

/* Connects and says nothing; or sends half a Hello's worth of nothing. The
 * daemon serves others meanwhile and drops nobody. */
static void test_silent_clients(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_status st;
  int fds[8];

  for (int i = 0; i < 8; i++)
    fds[i] = raw_connect(d);
  round_trip(d, &st);
  round_trip(d, &st);
  /* a session that said Hello and then nothing */
  raw_hello(fds[0]);
  round_trip(d, &st);
  for (int i = 0; i < 8; i++)
    close(fds[i]);
  round_trip(d, &st);
}

/* A subscriber that never reads while thousands of versions are published:
 * publishing never blocks, the daemon drops that session once its queue
 * overflows, and everyone else is served. */
static void test_never_reads(void **state) {
  struct tbt_daemon *d = *state;
  Tensorbroker__V1__Subscribe s = TENSORBROKER__V1__SUBSCRIBE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  tb_client *p;
  tb_buffer *b;
  int64_t shape[1] = {64};
  DLTensor t;
  struct tb_status st;
  struct tb_channel_info ci;
  int fd, eof = 0;

  fd = raw_connect(d);
  raw_hello(fd);
  s.channel = "flood";
  r.request_id = 2;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_SUBSCRIBE;
  r.subscribe = &s;
  raw_send_req(fd, &r); /* its reply is never read either */

  assert_tb_ok(tbt_connect(d, "flooder", &p));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b));
  memset(&t, 0, sizeof(t));
  t.data = tb_buffer_data(b);
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype = (DLDataType){kDLUInt, 8, 1};
  t.shape = shape;
  for (int i = 0; i < 5000; i++)
    assert_tb_ok(tb_publish(p, "flood", &t, NULL, NULL));
  assert_tb_ok(tbt_find_channel(p, "flood", &ci));
  assert_int_equal(ci.latest_version, 5000);
  round_trip(d, &st);
  assert_true(st.sessions_dropped >= 1);
  /* the slow session was closed: what it can still read ends in EOF */
  for (int i = 0; i < 100000 && !eof; i++) {
    tb__server_message *m = raw_recv(fd);
    if (m == NULL)
      eof = 1;
    else
      tb__server_message_free(m);
  }
  assert_true(eof);
  close(fd);
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(p);
}

/* Opening ahead without a GPU: a CUDA buffer arrives in the new-version
 * notices of a subscribed client (the default, prefetch) and the library
 * reads them as usual (no CUDA context here: nothing is opened); the
 * buffer then counts as sent to that session, which is told when it
 * retires. A client with
 * no_prefetch gets plain notices and no retirement. The producer speaks
 * the wire (a CUDA publish through the library needs a GPU). */
static void test_prefetch_notices_without_gpu(void **state) {
  const struct tbt_daemon *d = *state;
  Tensorbroker__V1__BufferUnregister u =
      TENSORBROKER__V1__BUFFER_UNREGISTER__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  struct tb_connect_options o;
  struct tb_status st;
  struct tb_notice n;
  tb_client *ahead, *plain;
  uint64_t b1, b2;
  int fd, retired = 0;

  assert_tb_ok(tbt_connect(d, "ahead", &ahead));
  tb_connect_options_init(&o);
  o.socket_path = d->sock;
  o.client_name = "plain";
  o.timeout_ms = TBT_TIMEOUT_MS;
  o.no_prefetch = 1;
  assert_tb_ok(tb_client_connect(&o, &plain));
  assert_tb_ok(tb_subscribe(ahead, "pf/x"));
  assert_tb_ok(tb_subscribe(plain, "pf/x"));
  fd = raw_connect(d);
  raw_hello(fd);
  b1 = raw_cuda_buffer(fd, 2, 0x11);
  b2 = raw_cuda_buffer(fd, 3, 0x22);
  raw_publish(fd, 4, "pf/x", b1, 0);
  raw_publish(fd, 5, "pf/x", b2, 0); /* b1's version leaves the history */
  u.buffer_id = b1;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_UNREGISTER;
  r.buffer_unregister = &u;
  tb__server_message_free(raw_ok(fd, &r, 6)); /* b1 retires now */
  for (int i = 1; i <= 2; i++) {
    assert_tb_ok(tb_client_poll_notice(ahead, &n, TBT_TIMEOUT_MS));
    assert_int_equal(n.type, TB_NOTICE_NEW_VERSION);
    assert_int_equal(n.version, (uint64_t)i);
    assert_tb_ok(tb_client_poll_notice(plain, &n, TBT_TIMEOUT_MS));
    assert_int_equal(n.type, TB_NOTICE_NEW_VERSION);
    assert_int_equal(n.version, (uint64_t)i);
  }
  assert_tb_ok(tb_client_poll_notice(ahead, &n, TBT_TIMEOUT_MS));
  assert_int_equal(n.type, TB_NOTICE_BUFFER_RETIRED);
  assert_int_equal(n.buffer_id, b1);
  /* everything the daemon sent before this reply has been read */
  assert_tb_ok(tb_daemon_status(plain, &st));
  while (tb_client_poll_notice(plain, &n, 0) == 0)
    retired += n.type == TB_NOTICE_BUFFER_RETIRED;
  assert_int_equal(retired, 0);
  close(fd);
  tb_client_disconnect(plain);
  tb_client_disconnect(ahead);
}

/* Channels named at connect, without a GPU: bad lists fail the connect
 * before anything is sent; a good one connects, the daemon counts the
 * named CUDA buffer as sent (its retirement reaches the client, which
 * never acquired it), and acquires work as before: a host channel's
 * tensor, and for the CUDA channel the plain TB_ENOCUDA of a machine
 * without CUDA (the kept buffer is not opened: no driver loaded), or on a
 * GPU machine TB_EDEVICE (its device is made up). */
static void test_channels_named_without_gpu(void **state) {
  const struct tbt_daemon *d = *state;
  Tensorbroker__V1__BufferUnregister u =
      TENSORBROKER__V1__BUFFER_UNREGISTER__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  const char *names[] = {"nc/h", "nc/none", "nc/x", NULL};
  const char *bad[] = {"nc/x", "nc/../x", NULL};
  const char *many[TB_CONNECT_CHANNELS_MAX + 2];
  struct tb_connect_options o;
  struct tb_notice n;
  tb_client *prod, *c = NULL;
  tb_buffer *hb;
  DLManagedTensorVersioned *t;
  DLTensor ht;
  int64_t shape[1];
  uint64_t b1, b2;
  int fd;

  assert_tb_ok(tbt_connect(d, "host-producer", &prod));
  assert_tb_ok(tb_host_buffer_create(prod, 4096, 0, &hb));
  tbt_fill(tb_buffer_data(hb), 64, 7);
  tbt_u8_tensor(&ht, hb, shape, 64);
  assert_tb_ok(tb_publish(prod, "nc/h", &ht, NULL, NULL));
  fd = raw_connect(d);
  raw_hello(fd);
  b1 = raw_cuda_buffer(fd, 2, 0x11);
  b2 = raw_cuda_buffer(fd, 3, 0x22);
  raw_publish(fd, 4, "nc/x", b1, 0);

  tb_connect_options_init(&o);
  o.socket_path = d->sock;
  o.timeout_ms = TBT_TIMEOUT_MS;
  for (int i = 0; i < TB_CONNECT_CHANNELS_MAX + 1; i++)
    many[i] = "nc/x";
  many[TB_CONNECT_CHANNELS_MAX + 1] = NULL;
  o.channels = many;
  assert_int_equal(tb_client_connect(&o, &c), TB_ELIMIT);
  assert_null(c);
  o.channels = bad;
  assert_int_equal(tb_client_connect(&o, &c), TB_ENAME);
  assert_null(c);
  many[TB_CONNECT_CHANNELS_MAX] = NULL; /* sixteen: allowed */
  o.channels = many;
  assert_tb_ok(tb_client_connect(&o, &c));
  tb_client_disconnect(c);
  o.channels = names;
  assert_tb_ok(tb_client_connect(&o, &c));

  /* b1 leaves the history and is unregistered: the client is told */
  raw_publish(fd, 5, "nc/x", b2, 0);
  u.buffer_id = b1;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_UNREGISTER;
  r.buffer_unregister = &u;
  tb__server_message_free(raw_ok(fd, &r, 6));
  assert_tb_ok(tb_client_poll_notice(c, &n, TBT_TIMEOUT_MS));
  assert_int_equal(n.type, TB_NOTICE_BUFFER_RETIRED);
  assert_int_equal(n.buffer_id, b1);

  assert_tb_ok(tb_acquire(c, "nc/h", NULL, &t));
  assert_int_equal(t->dl_tensor.shape[0], 64);
  assert_int_equal(((uint8_t *)t->dl_tensor.data)[5], tbt_pattern(5, 7));
  t->deleter(t);
  /* the fake buffer's device is no device of this machine's; the error
   * names the memory kind the consumer could not map */
  assert_int_equal(tb_acquire(c, "nc/x", NULL, &t),
                   tb_cuda_available() == 0 ? TB_EDEVICE : TB_ENOCUDA);
  {
    char why[512];
    tb_client_last_error(c, why, sizeof(why));
    if (strstr(why, "cannot map a cuda-ipc buffer: ") != why)
      fail_msg("the error does not name the kind: %s", why);
  }
  tb_client_disconnect(c);
  close(fd);
  tb_buffer_destroy(hb);
  tb_client_disconnect(prod);
}

/* A publisher that promised a Goodbye hangs up without it while a leased
 * CUDA version it published still had its ready event pending: a
 * subscriber's ChannelClosed names that version, in the reason and in
 * tb_notice.version. The producer and the lease holder speak the wire (a
 * CUDA publish or acquire through the library needs a GPU). */
static void test_unfinished_version_named(void **state) {
  const struct tbt_daemon *d = *state;
  Tensorbroker__V1__EventRegister er = TENSORBROKER__V1__EVENT_REGISTER__INIT;
  Tensorbroker__V1__Acquire aq = TENSORBROKER__V1__ACQUIRE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  uint8_t handle[64] = {9};
  tb__server_message *m;
  struct tb_notice n;
  tb_client *c;
  uint64_t b, e;
  int prod, cons;

  assert_tb_ok(tbt_connect(d, "watcher", &c));
  assert_tb_ok(tb_subscribe(c, "gw/x"));
  prod = raw_connect(d);
  raw_hello_as(prod, true, true);
  b = raw_cuda_buffer(prod, 2, 0x33);
  er.cuda_ipc_event_handle.data = handle;
  er.cuda_ipc_event_handle.len = sizeof(handle);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_EVENT_REGISTER;
  r.event_register = &er;
  m = raw_ok(prod, &r, 3);
  e = m->reply->event_register->event_id;
  tb__server_message_free(m);
  raw_publish(prod, 4, "gw/x", b, e); /* its work still runs */
  cons = raw_connect(d);
  raw_hello_as(cons, false, true);
  aq.channel = "gw/x";
  aq.mode = TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_EXACT;
  aq.version = 1;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  r.acquire = &aq;
  tb__server_message_free(raw_ok(cons, &r, 2)); /* the lease is held */
  close(prod); /* no Goodbye */
  assert_tb_ok(tbt_expect_notice(c, TB_NOTICE_CHANNEL_CLOSED, "gw/x", 0,
                                 TBT_TIMEOUT_MS, &n));
  assert_string_equal(n.reason, "publisher ended without closing its "
                                "session; GPU work of version 1 may never "
                                "finish");
  assert_int_equal(n.version, 1);
  close(cons);
  tb_client_disconnect(c);
}

static int setup_small_outq(void **state) {
  static const char *const extra[] = {"--max-outq", "4096", NULL};
  struct tbt_daemon *d = calloc(1, sizeof(*d));

  if (d == NULL || tbt_daemon_start(d, extra) < 0) {
    if (d != NULL)
      tbt_daemon_cleanup(d);
    free(d);
    return -1;
  }
  *state = d;
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_garbage, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_truncated, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_oversized, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_request_before_hello, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_unexpected_fds, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_silent_clients, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_never_reads, setup_small_outq, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_prefetch_notices_without_gpu, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(test_unfinished_version_named, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(test_channels_named_without_gpu, tbt_setup,
                                      tbt_teardown),
  };
  return cmocka_run_group_tests_name("robust", tests, NULL, NULL);
}
