/* SPDX-License-Identifier: Apache-2.0 */
/* Deleters on other threads, for ThreadSanitizer (tests/run.sh part 4):
 * one thread acquires on a client without pause while another ends those
 * leases (the tensor's deleter, or tb_release) as they arrive, and a
 * third publishes new versions through another client. The library's
 * shared state (the connection's references, the mapping cache, the lease
 * table) is then touched from two threads at once, which is what the
 * public header promises callers may do. Afterwards the daemon holds no
 * lease. The other builds run it too: there it checks that nothing is
 * lost or refused. Knob: TB_THREADS_ACQUIRES (default 3000). */
#include "tb_test.h"

#include <pthread.h>
#include <string.h>

#include "harness.h"
#include "stress.h"

#define QCAP 64

static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  DLManagedTensorVersioned *q[QCAP];
  unsigned head, tail;
  int done;
} g_q = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, 0, 0, 0};

static long g_ended, g_publishes;
static int g_stop_publishing;
static pthread_mutex_t g_stop_lock = PTHREAD_MUTEX_INITIALIZER;

static void push(DLManagedTensorVersioned *t) {
  pthread_mutex_lock(&g_q.lock);
  while (g_q.tail - g_q.head == QCAP)
    pthread_cond_wait(&g_q.cond, &g_q.lock);
  g_q.q[g_q.tail++ % QCAP] = t;
  pthread_cond_broadcast(&g_q.cond);
  pthread_mutex_unlock(&g_q.lock);
}

/* Ends each lease as it comes, two ways in turn. */
static void *ender(void *arg) {
  (void)arg;
  for (;;) {
    DLManagedTensorVersioned *t;
    pthread_mutex_lock(&g_q.lock);
    while (g_q.head == g_q.tail && !g_q.done)
      pthread_cond_wait(&g_q.cond, &g_q.lock);
    if (g_q.head == g_q.tail) {
      pthread_mutex_unlock(&g_q.lock);
      return NULL;
    }
    t = g_q.q[g_q.head++ % QCAP];
    pthread_cond_broadcast(&g_q.cond);
    pthread_mutex_unlock(&g_q.lock);
    if (g_ended++ % 2 == 0)
      t->deleter(t);
    else if (tb_release(t, NULL) != 0)
      return (void *)1;
  }
}

struct pub {
  tb_client *c;
  tb_buffer *b;
};

static int publish_one(struct pub *p) {
  int64_t shape[1];
  DLTensor t;

  tbt_u8_tensor(&t, p->b, shape, 4096);
  return tb_publish(p->c, "threads", &t, NULL, NULL);
}

static void *publisher(void *arg) {
  struct pub *p = arg;

  for (;;) {
    int stop;
    pthread_mutex_lock(&g_stop_lock);
    stop = g_stop_publishing;
    pthread_mutex_unlock(&g_stop_lock);
    if (stop)
      return NULL;
    if (publish_one(p) != 0)
      return (void *)1;
    g_publishes++;
  }
}

static void test_deleters_on_other_threads(void **state) {
  struct tbt_daemon *d = *state;
  long n = st_env("TB_THREADS_ACQUIRES", 3000), got = 0;
  struct pub p;
  tb_client *c;
  pthread_t te, tp;
  void *re, *rp;
  struct tb_status st;

  assert_tb_ok(tbt_connect(d, "threads-producer", &p.c));
  assert_tb_ok(tb_host_buffer_create(p.c, 1 << 16, 0, &p.b));
  assert_tb_ok(publish_one(&p));
  assert_tb_ok(tbt_connect(d, "threads-consumer", &c));
  assert_int_equal(pthread_create(&te, NULL, ender, NULL), 0);
  assert_int_equal(pthread_create(&tp, NULL, publisher, &p), 0);
  for (long i = 0; i < n; i++) {
    struct tb_acquire_options o;
    DLManagedTensorVersioned *t = NULL;
    tb_acquire_options_init(&o);
    o.timeout_ms = 0;
    assert_tb_ok(tb_acquire(c, "threads", &o, &t));
    /* mapped and readable (the publisher may be rewriting it) */
    assert_true(t->dl_tensor.shape[0] == 4096 &&
                ((volatile const uint8_t *)t->dl_tensor.data)[4095] <= 0xff);
    push(t);
    got++;
  }
  pthread_mutex_lock(&g_q.lock);
  g_q.done = 1;
  pthread_cond_broadcast(&g_q.cond);
  pthread_mutex_unlock(&g_q.lock);
  pthread_mutex_lock(&g_stop_lock);
  g_stop_publishing = 1;
  pthread_mutex_unlock(&g_stop_lock);
  assert_int_equal(pthread_join(te, &re), 0);
  assert_int_equal(pthread_join(tp, &rp), 0);
  assert_null(re);
  assert_null(rp);
  assert_int_equal(g_ended, got);
  assert_tb_ok(tb_daemon_status(c, &st));
  assert_int_equal(st.leases, 0);
  printf("threads: %ld leases acquired on one thread and ended on another, "
         "%ld publishes meanwhile\n", got, g_publishes);
  tb_client_disconnect(c);
  assert_tb_ok(tb_buffer_destroy(p.b));
  tb_client_disconnect(p.c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_deleters_on_other_threads,
                                      tbt_setup, tbt_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
