/* SPDX-License-Identifier: Apache-2.0 */
/* Lifetimes of buffers, leases and tensors across destroy, disconnect and
 * threads. */
#include "tb_test.h"

#include <pthread.h>
#include <string.h>

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

static void publish_buf(tb_client *p, tb_buffer *b, const char *ch,
                        uint64_t seed, uint64_t *v) {
  int64_t shape[1] = {(int64_t)tb_buffer_size(b)};
  DLTensor t;

  tbt_fill(tb_buffer_data(b), tb_buffer_size(b), seed);
  memset(&t, 0, sizeof(t));
  t.data = tb_buffer_data(b);
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype = (DLDataType){kDLUInt, 8, 1};
  t.shape = shape;
  assert_tb_ok(tb_publish(p, ch, &t, NULL, v));
}

static void check_bytes(const DLManagedTensorVersioned *t, uint64_t seed) {
  const uint8_t *px =
      (const uint8_t *)t->dl_tensor.data + t->dl_tensor.byte_offset;
  for (int64_t i = 0; i < t->dl_tensor.shape[0]; i++)
    if (px[i] != tbt_pattern((uint64_t)i, seed))
      fail_msg("byte %lld is %u, expected %u", (long long)i, px[i],
               tbt_pattern((uint64_t)i, seed));
}

/* The producer destroys the buffer while a consumer holds a lease on a
 * version in it: still readable; once the version is freed the consumer is
 * told the buffer is retired. */
static void test_destroy_while_leased(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *p, *c;
  tb_buffer *b1, *b2;
  DLManagedTensorVersioned *t = NULL;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  struct tb_notice n;
  uint64_t v, id1;
  struct tb_status st;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "consumer", &c));
  assert_tb_ok(tb_host_buffer_create(p, 8192, 0, &b1));
  assert_tb_ok(tb_host_buffer_create(p, 8192, 0, &b2));
  id1 = tb_buffer_id(b1);
  publish_buf(p, b1, "d", 5, &v);
  assert_tb_ok(tb_acquire(c, "d", &o, &t));
  assert_tb_ok(tb_buffer_destroy(b1));
  check_bytes(t, 5);
  /* a newer version pushes version 1 out of the history; the lease keeps it */
  publish_buf(p, b2, "d", 6, &v);
  assert_int_equal(v, 2);
  check_bytes(t, 5);
  assert_tb_err(tb_wait_free(p, "d", 1, 0, NULL), TB_EBUSY);
  assert_tb_ok(tb_release(t, NULL));
  assert_tb_ok(tb_wait_free(p, "d", 1, TBT_TIMEOUT_MS, NULL));
  assert_tb_ok(tbt_expect_notice(c, TB_NOTICE_BUFFER_RETIRED, NULL, 0,
                                 TBT_TIMEOUT_MS, &n));
  assert_int_equal(n.buffer_id, id1);
  /* version 2 from the other buffer is unaffected */
  assert_tb_ok(tb_acquire(c, "d", &o, &t));
  check_bytes(t, 6);
  assert_tb_ok(tb_release(t, NULL));
  assert_tb_ok(tb_daemon_status(p, &st));
  assert_int_equal(st.buffers, 1);
  assert_tb_ok(tb_buffer_destroy(b2));
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

/* Tensors outlive their client: readable after tb_client_disconnect, and
 * the deleter is safe then. The daemon ended the lease with the session. */
static void test_deleter_after_disconnect(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *p, *c;
  tb_buffer *b;
  DLManagedTensorVersioned *t1 = NULL, *t2 = NULL;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  struct tb_channel_info ci;
  uint64_t v, cid;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "consumer", &c));
  cid = tb_client_session_id(c);
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b));
  publish_buf(p, b, "dd", 8, &v);
  assert_tb_ok(tb_acquire(c, "dd", &o, &t1));
  assert_tb_ok(tb_acquire(c, "dd", &o, &t2));
  assert_tb_ok(tbt_find_channel(p, "dd", &ci));
  assert_int_equal(ci.leases, 2);
  tb_client_disconnect(c);
  check_bytes(t1, 8);
  t1->deleter(t1);
  check_bytes(t2, 8);
  {
    int rc = tb_release(t2, NULL); /* frees t2 whatever it returns */
    assert_true(rc == 0 || rc == TB_EDISCONNECTED);
  }
  /* the session's end released both leases */
  assert_tb_ok(tbt_wait_session_gone(p, cid));
  assert_tb_ok(tbt_find_channel(p, "dd", &ci));
  assert_int_equal(ci.leases, 0);
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(p);
}

struct waiter {
  tb_client *c;
  int rc;
  uint64_t version;
};

static void *wait_next(void *arg) {
  struct waiter *w = arg;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_NEXT, 1, TBT_TIMEOUT_MS);
  DLManagedTensorVersioned *t = NULL;
  struct tb_lease_info li;

  w->rc = tb_acquire(w->c, "thr", &o, &t);
  if (w->rc == 0) {
    if (tb_lease_info(t, &li) == 0)
      w->version = li.version;
    t->deleter(t);
  }
  return NULL;
}

/* One thread is blocked in tb_acquire on a client; another runs the
 * deleter of a tensor of the same client. The deleter must not wait for the
 * blocked call: we publish the version the blocked call waits for only
 * after the deleter has returned, so a deleter that waited would leave the
 * acquire to time out. */
static void test_deleter_other_thread(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *p, *c;
  tb_buffer *b1, *b2;
  DLManagedTensorVersioned *t = NULL;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  struct tb_session_info si;
  struct waiter w = {0};
  pthread_t th;
  uint64_t v;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "consumer", &c));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b1));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b2));
  publish_buf(p, b1, "thr", 1, &v);
  assert_tb_ok(tb_acquire(c, "thr", &o, &t));
  assert_tb_ok(tbt_find_session_id(p, tb_client_session_id(c), &si));
  w.c = c;
  assert_int_equal(pthread_create(&th, NULL, wait_next, &w), 0);
  /* the acquire has reached the daemon and is parked there */
  assert_tb_ok(tbt_wait_requests(p, tb_client_session_id(c), si.requests + 1));
  t->deleter(t);
  publish_buf(p, b2, "thr", 2, &v);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_tb_ok(w.rc);
  assert_int_equal(w.version, 2);
  /* the lease on version 1 was really released */
  assert_tb_ok(tb_wait_free(p, "thr", 1, TBT_TIMEOUT_MS, NULL));
  assert_tb_ok(tb_buffer_destroy(b1));
  assert_tb_ok(tb_buffer_destroy(b2));
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

/* Consumers map read-only unless the producer allowed writes. */
static void test_writable_flag(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *p, *c;
  tb_buffer *b;
  DLManagedTensorVersioned *t = NULL;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  uint64_t v;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "consumer", &c));
  assert_tb_ok(tb_host_buffer_create(p, 4096, TB_BUFFER_CONSUMERS_MAY_WRITE, &b));
  publish_buf(p, b, "w", 3, &v);
  assert_tb_ok(tb_acquire(c, "w", &o, &t));
  assert_false(t->flags & TB_DLPACK_FLAG_BITMASK_READ_ONLY);
  ((uint8_t *)t->dl_tensor.data)[0] = 0xee; /* mapped writable */
  assert_int_equal(((uint8_t *)tb_buffer_data(b))[0], 0xee); /* shared */
  assert_tb_ok(tb_release(t, NULL));
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

/* Library internals for tests (client_internal.h). */
void tb__client_set_features(tb_client *c, uint32_t features);

static uint64_t own_requests(tb_client *c) {
  uint64_t n = 0;
  assert_tb_ok(tbt_own_requests(c, &n));
  return n;
}

static uint32_t channel_leases(tb_client *c, const char *ch) {
  struct tb_channel_info ci;
  assert_tb_ok(tbt_find_channel(c, ch, &ci));
  return ci.leases;
}

static void not_a_lease(DLManagedTensorVersioned *self) { (void)self; }

/* tb_acquire_options.release: the previous lease ends in the same request
 * as the next acquire (one request where tb_release + tb_acquire make two),
 * also when the acquire then times out; refused arguments release nothing;
 * with a daemon that lacks the feature the Release goes first on its own. */
static void test_acquire_releases_previous(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *p, *c, *c2;
  tb_buffer *b[3];
  DLManagedTensorVersioned *t1 = NULL, *t2 = NULL, *t3 = NULL, *t4 = NULL,
                           *t5 = NULL, fake;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  struct tb_lease_info li;
  uint64_t v, n0;
  char why[256];

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "consumer", &c));
  assert_tb_ok(tbt_connect(d, "other", &c2));
  for (int i = 0; i < 3; i++)
    assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b[i]));
  publish_buf(p, b[0], "rp", 1, &v);
  assert_tb_ok(tb_acquire(c, "rp", &o, &t1));
  publish_buf(p, b[1], "rp", 2, &v);

  n0 = own_requests(c);
  o = acq_opts(TB_ACQUIRE_NEXT, 1, TBT_TIMEOUT_MS);
  o.release = t1;
  assert_tb_ok(tb_acquire(c, "rp", &o, &t2));
  check_bytes(t2, 2);
  assert_tb_ok(tb_lease_info(t2, &li));
  assert_int_equal(li.version, 2);
  /* the Acquire carried the Release: one request (+ the listing's own) */
  assert_int_equal(own_requests(c) - n0, 2);
  assert_tb_ok(tb_wait_free(p, "rp", 1, 0, NULL));
  assert_int_equal(channel_leases(p, "rp"), 1);

  /* the acquire times out; the release happened all the same */
  o = acq_opts(TB_ACQUIRE_NEXT, 2, 0);
  o.release = t2;
  assert_tb_err(tb_acquire(c, "rp", &o, &t3), TB_EAGAIN);
  assert_null(t3);
  assert_int_equal(channel_leases(p, "rp"), 0);

  /* refused arguments: nothing is released, the tensors stay usable */
  o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  assert_tb_ok(tb_acquire(c, "rp", &o, &t3));
  assert_tb_ok(tb_acquire(c2, "rp", &o, &t4));
  o.release = t4; /* another client's tensor */
  assert_tb_err(tb_acquire(c, "rp", &o, &t5), TB_EINVAL);
  tb_client_last_error(c, why, sizeof(why));
  assert_non_null(strstr(why, "not acquired on this client"));
  memset(&fake, 0, sizeof(fake));
  fake.deleter = not_a_lease;
  o.release = &fake;
  assert_tb_err(tb_acquire(c, "rp", &o, &t5), TB_EINVAL);
  o.release = t3;
  assert_tb_err(tb_acquire(c, "rp/../x", &o, &t5), TB_ENAME);
  /* names are checked after a good one too (the library remembers the
   * last name it checked) */
  assert_tb_err(tb_acquire(c, "", &o, &t5), TB_ENAME);
  {
    tb_client *fresh; /* which has checked no name yet */
    assert_tb_ok(tbt_connect(d, "fresh", &fresh));
    assert_tb_err(tb_acquire(fresh, "", &o, &t5), TB_ENAME);
    tb_client_disconnect(fresh);
  }
  assert_tb_err(tb_acquire(c, "rp/", &o, &t5), TB_ENAME);
  assert_tb_err(tb_acquire(c, NULL, &o, &t5), TB_ENAME);
  o.mode = 7;
  assert_tb_err(tb_acquire(c, "rp", &o, &t5), TB_EINVAL);
  assert_null(t5);
  assert_int_equal(channel_leases(p, "rp"), 2);
  check_bytes(t3, 2);
  check_bytes(t4, 2);

  /* a daemon without FEATURE_ACQUIRE_RELEASE: Release, then Acquire */
  tb__client_set_features(c, 0);
  publish_buf(p, b[2], "rp", 3, &v);
  n0 = own_requests(c);
  o = acq_opts(TB_ACQUIRE_NEXT, 2, TBT_TIMEOUT_MS);
  o.release = t3;
  assert_tb_ok(tb_acquire(c, "rp", &o, &t5));
  check_bytes(t5, 3);
  assert_int_equal(own_requests(c) - n0, 3);
  assert_int_equal(channel_leases(p, "rp"), 2); /* t4 and t5 */

  assert_tb_ok(tb_release(t4, NULL));
  assert_tb_ok(tb_release(t5, NULL));
  for (int i = 0; i < 3; i++)
    assert_tb_ok(tb_buffer_destroy(b[i]));
  tb_client_disconnect(c2);
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_destroy_while_leased, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_deleter_after_disconnect, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_deleter_other_thread, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_writable_flag, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_acquire_releases_previous, tbt_setup, tbt_teardown),
  };
  return cmocka_run_group_tests_name("lifetime", tests, NULL, NULL);
}
