/* SPDX-License-Identifier: Apache-2.0 */
/* Threads sharing one client: a call that waits for the daemon (an acquire
 * parked until a version comes, a notice poll with a timeout) does not hold
 * up the other threads' calls; the reply of a parked acquire read by
 * another thread's call reaches the parked thread; a notice read by another
 * thread wakes the one that polls; a producer publishes while its
 * wait-free waits; calls that may park wait at once, each for its own
 * answer, in whatever order the answers come (acquires on two channels, a
 * wait-free beside an acquire), up to the daemon's --max-waits, and a
 * session that ends with several parked leaves none; with a daemon that
 * parks one request per session, a second call that may park waits for
 * the first instead of failing with TB_EBUSY; each thread reads its own
 * last error.
 *
 * Every waiting thread is given a bounded timeout, so that on a library
 * that holds other threads up the test fails (the waiter times out first)
 * instead of hanging. */
#include "tb_test.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

/* rpc.c: replies kept for a parked call by another thread, and notices
 * queued for a sleeping poll (the static library exports them) */
void tb__client_handoffs(const tb_client *c, uint64_t *stashed,
                         uint64_t *notice_wakes);
/* rpc.c: pretend the daemon said these HelloReply.features */
void tb__client_set_features(tb_client *c, uint32_t features);

enum waiter_call { WAIT_ACQUIRE, WAIT_FREE, WAIT_NOTICE };

/* Each test's waiters are static: after a failed assertion their thread
 * may still run, and must not write into a stack frame that is gone. */
struct waiter {
  tb_client *c;
  enum waiter_call call;
  const char *channel;
  uint64_t version; /* WAIT_FREE's */
  int rc;
  uint8_t first;          /* WAIT_ACQUIRE: byte 0 of the tensor */
  int64_t len;            /* WAIT_ACQUIRE: its shape[0] */
  struct tb_notice notice; /* WAIT_NOTICE's */
  int timeout_ms;         /* 0: TBT_TIMEOUT_MS */
  pid_t tid;              /* __atomic; 0 until the thread runs */
  int done;               /* __atomic */
};

static void *waiter_main(void *arg) {
  struct waiter *w = arg;
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;
  int timeout = w->timeout_ms != 0 ? w->timeout_ms : TBT_TIMEOUT_MS;

  __atomic_store_n(&w->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
  switch (w->call) {
  case WAIT_ACQUIRE:
    tb_acquire_options_init(&o);
    o.mode = TB_ACQUIRE_NEXT;
    o.timeout_ms = timeout;
    w->rc = tb_lease_acquire(w->c, w->channel, &o, &t);
    if (w->rc == 0) {
      w->first = *(uint8_t *)t->dl_tensor.data;
      w->len = t->dl_tensor.shape[0];
      w->rc = tb_lease_release(t, NULL);
    }
    break;
  case WAIT_FREE:
    w->rc = tb_channel_wait_free(w->c, w->channel, w->version, timeout,
                                 NULL);
    break;
  case WAIT_NOTICE:
    w->rc = tb_notice_poll(w->c, sizeof(w->notice), &w->notice,
                           TBT_TIMEOUT_MS);
    break;
  }
  __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static int is_done(struct waiter *w) {
  return __atomic_load_n(&w->done, __ATOMIC_ACQUIRE);
}

/* A client that never busy-polls: its waits go to sleep at once. */
static int connect_sleeper(const struct tbt_daemon *d, const char *name,
                           tb_client **out) {
  struct tb_connect_options o;

  tb_connect_options_init(&o);
  o.socket_path = d->sock;
  o.client_name = name;
  o.timeout_ms = TBT_TIMEOUT_MS;
  o.spin_us = -1;
  return tb_client_connect(&o, out);
}

/* Start w's call on a thread. An acquire or a wait-free: return once the
 * daemon has its request (counted by watch). */
static void start(tb_client *watch, struct waiter *w, pthread_t *th) {
  if (w->call == WAIT_NOTICE)
    assert_int_equal(pthread_create(th, NULL, waiter_main, w), 0);
  else
    assert_tb_ok(tbt_start_request(watch, w->c, waiter_main, w, th));
}

/* How many requests of c's session the daemon has parked (its operator's
 * view, asked on watch). */
static size_t waits_of(tb_client *watch, tb_client *c) {
  size_t n = 0;

  assert_tb_ok(tbt_parked(watch, tb_client_session_id(c), &n));
  return n;
}

/* The state letter of thread tid (/proc/self/task/TID/stat), or 0. */
static char thread_state(pid_t tid) {
  char path[64], buf[256], *p;
  FILE *f;
  size_t n;

  snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
  f = fopen(path, "re");
  if (f == NULL)
    return 0;
  n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  p = strrchr(buf, ')'); /* after the command name */
  return p != NULL && p[1] == ' ' ? p[2] : 0;
}

/* Wait (bounded) until w's thread sleeps in the kernel (a poll, a lock),
 * or its call returned. Observed, not assumed: a pause only spaces the
 * looks at /proc out. */
static void wait_asleep(struct waiter *w) {
  struct timespec gap = {0, 1000 * 1000};
  uint64_t end = tbt_now_ms() + TBT_TIMEOUT_MS;
  pid_t tid;

  while ((tid = __atomic_load_n(&w->tid, __ATOMIC_ACQUIRE)) == 0 &&
         tbt_now_ms() < end)
    nanosleep(&gap, NULL);
  assert_int_not_equal(tid, 0);
  while (!is_done(w) && thread_state(tid) != 'S' && tbt_now_ms() < end)
    nanosleep(&gap, NULL);
}

static void publish_bytes(tb_client *p, tb_buffer *b, const char *channel,
                          uint8_t value, int64_t len) {
  int64_t shape[1] = {len};
  DLTensor t;

  memset(tb_buffer_data(b), value, (size_t)len);
  tbt_u8_tensor(&t, b, shape, len);
  assert_tb_ok(tb_channel_publish(p, channel, &t, NULL, NULL));
}

/* A producer, a client that watches the daemon, and a stage: a client
 * that never busy-polls, whose threads wait. */
struct stage {
  tb_client *p, *watch, *c;
  tb_buffer *pb; /* the producer's */
};

static void stage_open(const struct tbt_daemon *d, struct stage *s) {
  assert_tb_ok(tbt_connect(d, "producer", &s->p));
  assert_tb_ok(tbt_connect(d, "watch", &s->watch));
  assert_tb_ok(connect_sleeper(d, "stage", &s->c));
  assert_tb_ok(tb_buffer_create_host(s->p, 64, 0, &s->pb));
}

static void stage_close(struct stage *s) {
  tb_buffer_destroy(s->pb);
  tb_client_disconnect(s->c);
  tb_client_disconnect(s->watch);
  tb_client_disconnect(s->p);
}

/* The producer publishes len bytes of value on w's channel: w's acquire,
 * on thread th, returns with them. */
static void answer(struct stage *s, struct waiter *w, pthread_t th,
                   uint8_t value, int64_t len) {
  publish_bytes(s->p, s->pb, w->channel, value, len);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_tb_ok(w->rc);
  assert_int_equal(w->first, value);
  assert_int_equal(w->len, len);
}

/* Thread A waits in an acquire of the next version of "in"; meanwhile the
 * main thread, on the same client, publishes, lists channels and acquires
 * a version that exists with timeout 0: all return while A still waits,
 * and A then gets the version published for it. */
static void test_calls_go_on_while_an_acquire_waits(void **state) {
  struct tbt_daemon *d = *state;
  static struct waiter a;
  a = (struct waiter){.call = WAIT_ACQUIRE, .channel = "in"};
  struct tb_acquire_options o;
  struct tb_channel_info *chs = NULL;
  DLManagedTensorVersioned *t = NULL;
  tb_client *p, *watch;
  tb_buffer *pb, *cb;
  pthread_t th;
  size_t n = 0;
  uint64_t t0;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "watch", &watch));
  assert_tb_ok(connect_sleeper(d, "stage", &a.c));
  assert_tb_ok(tb_buffer_create_host(p, 64, 0, &pb));
  assert_tb_ok(tb_buffer_create_host(a.c, 64, 0, &cb));
  publish_bytes(p, pb, "ready", 5, 16);

  start(watch, &a, &th);
  t0 = tbt_now_ms();
  publish_bytes(a.c, cb, "out", 9, 32);
  assert_tb_ok(tb_channel_list(a.c, sizeof(*chs), &chs, &n));
  assert_true(n >= 2);
  tb_free(chs);
  tb_acquire_options_init(&o);
  o.timeout_ms = 0;
  assert_tb_ok(tb_lease_acquire(a.c, "ready", &o, &t));
  assert_int_equal(*(uint8_t *)t->dl_tensor.data, 5);
  assert_tb_ok(tb_lease_release(t, NULL));
  /* all of that while A waits */
  assert_false(is_done(&a));
  print_message("three calls while another thread waits: %llu ms\n",
                (unsigned long long)(tbt_now_ms() - t0));

  publish_bytes(p, pb, "in", 42, 48);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_tb_ok(a.rc);
  assert_int_equal(a.first, 42);
  assert_int_equal(a.len, 48);

  tb_buffer_destroy(cb);
  tb_buffer_destroy(pb);
  tb_client_disconnect(a.c);
  tb_client_disconnect(watch);
  tb_client_disconnect(p);
}

/* A producer's thread waits until a version it published is free (a
 * consumer holds it); meanwhile the producer's main thread publishes on
 * another channel of the same client, and acquires nothing. The wait ends
 * when the consumer lets go. */
static void test_publish_while_a_wait_free_waits(void **state) {
  struct tbt_daemon *d = *state;
  static struct waiter w;
  w = (struct waiter){.call = WAIT_FREE, .channel = "frames"};
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;
  tb_client *q, *watch;
  tb_buffer *b1, *b2;
  pthread_t th;
  uint64_t v = 0;
  int64_t shape[1] = {16};
  DLTensor dt;

  assert_tb_ok(tbt_connect(d, "consumer", &q));
  assert_tb_ok(tbt_connect(d, "watch", &watch));
  assert_tb_ok(connect_sleeper(d, "producer", &w.c));
  assert_tb_ok(tb_buffer_create_host(w.c, 64, 0, &b1));
  assert_tb_ok(tb_buffer_create_host(w.c, 64, 0, &b2));
  memset(tb_buffer_data(b1), 4, 16);
  tbt_u8_tensor(&dt, b1, shape, 16);
  assert_tb_ok(tb_channel_publish(w.c, "frames", &dt, NULL, &v));
  tb_acquire_options_init(&o);
  o.timeout_ms = 0;
  assert_tb_ok(tb_lease_acquire(q, "frames", &o, &t));
  publish_bytes(w.c, b2, "frames", 5, 16); /* v leaves the history */

  w.version = v;
  start(watch, &w, &th);
  publish_bytes(w.c, b2, "results", 6, 16);
  publish_bytes(w.c, b2, "results", 7, 16);
  assert_false(is_done(&w));
  assert_tb_ok(tb_lease_release(t, NULL));
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_tb_ok(w.rc);

  tb_buffer_destroy(b2);
  tb_buffer_destroy(b1);
  tb_client_disconnect(w.c);
  tb_client_disconnect(watch);
  tb_client_disconnect(q);
}

/* The reply to A's parked acquire is read by the main thread: the main
 * thread publishes the version A waits for on the same client, and the
 * daemon answers A before it answers the Publish, while the main thread
 * holds the call lock and reads. The reply is kept for A, not taken as a
 * stale one (which would end its lease). */
static void test_parked_reply_read_by_another_call(void **state) {
  struct tbt_daemon *d = *state;
  static struct waiter a;
  a = (struct waiter){.call = WAIT_ACQUIRE, .channel = "loop"};
  DLManagedTensorVersioned *t = NULL;
  struct tb_acquire_options o;
  tb_client *watch;
  tb_buffer *b;
  pthread_t th;
  uint64_t stashed = 0, woken = 0;

  assert_tb_ok(tbt_connect(d, "watch", &watch));
  assert_tb_ok(connect_sleeper(d, "loop", &a.c));
  assert_tb_ok(tb_buffer_create_host(a.c, 64, 0, &b));

  start(watch, &a, &th);
  wait_asleep(&a);
  assert_false(is_done(&a));
  publish_bytes(a.c, b, "loop", 77, 24);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_tb_ok(a.rc);
  assert_int_equal(a.first, 77);
  assert_int_equal(a.len, 24);
  tb__client_handoffs(a.c, &stashed, &woken);
  assert_int_equal(stashed, 1);

  /* the lease was A's to end (it did): the version is not held, and the
   * client goes on */
  tb_acquire_options_init(&o);
  o.timeout_ms = 0;
  assert_tb_ok(tb_lease_acquire(a.c, "loop", &o, &t));
  assert_int_equal(*(uint8_t *)t->dl_tensor.data, 77);
  assert_tb_ok(tb_lease_release(t, NULL));

  tb_buffer_destroy(b);
  tb_client_disconnect(a.c);
  tb_client_disconnect(watch);
}

/* Thread N polls for a notice; the main thread's call on the same client
 * reads it (a publish on a channel the client subscribes to: the daemon
 * sends the NewVersion before the Publish's reply) and N returns it. */
static void test_notice_read_by_another_call_wakes_the_poll(void **state) {
  struct tbt_daemon *d = *state;
  static struct waiter np;
  np = (struct waiter){.call = WAIT_NOTICE};
  tb_client *c;
  tb_buffer *b;
  pthread_t th;
  uint64_t stashed = 0, woken = 0;

  assert_tb_ok(connect_sleeper(d, "noticer", &c));
  assert_tb_ok(tb_channel_subscribe(c, "news"));
  assert_tb_ok(tb_buffer_create_host(c, 64, 0, &b));
  np.c = c;

  start(NULL, &np, &th);
  wait_asleep(&np);
  assert_false(is_done(&np));
  publish_bytes(c, b, "news", 3, 8);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_tb_ok(np.rc);
  assert_int_equal(np.notice.type, TB_NOTICE_NEW_VERSION);
  assert_string_equal(np.notice.channel, "news");
  assert_int_equal(np.notice.version, 1);
  tb__client_handoffs(c, &stashed, &woken);
  assert_int_equal(woken, 1);

  tb_buffer_destroy(b);
  tb_client_disconnect(c);
}

/* With a daemon that parks one request per session (no
 * FEATURE_MULTI_WAIT: pretended here), a second call that may park, on
 * another thread of the same client, waits until the first has its answer
 * (sent meanwhile, it would be refused with TB_EBUSY): it does not reach
 * the daemon while the first waits. Then it parks in its turn and gets its
 * own version. */
static void test_second_waiter_waits_for_an_old_daemon(void **state) {
  struct tbt_daemon *d = *state;
  static struct waiter a;
  a = (struct waiter){.call = WAIT_ACQUIRE, .channel = "first"};
  static struct waiter b2;
  b2 = (struct waiter){.call = WAIT_ACQUIRE, .channel = "second"};
  struct tb_session_info si;
  tb_client *p, *watch;
  tb_buffer *pb;
  pthread_t th_a, th_b;
  uint64_t n = 0;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "watch", &watch));
  assert_tb_ok(connect_sleeper(d, "consumer", &a.c));
  tb__client_set_features(a.c, 0); /* a daemon from before the features */
  b2.c = a.c;
  assert_tb_ok(tb_buffer_create_host(p, 64, 0, &pb));

  start(watch, &a, &th_a);
  /* a call that does not wait goes by A; the second acquire is request
   * number n + 1 */
  assert_tb_ok(tbt_own_requests(a.c, &n));
  assert_int_equal(pthread_create(&th_b, NULL, waiter_main, &b2), 0);
  wait_asleep(&b2);
  assert_false(is_done(&b2));
  assert_false(is_done(&a));
  /* asleep without sending it */
  assert_tb_ok(tbt_find_session_id(watch, tb_client_session_id(a.c), &si));
  assert_int_equal(si.requests, n);
  assert_int_equal(waits_of(watch, a.c), 1);

  publish_bytes(p, pb, "first", 1, 16);
  assert_int_equal(pthread_join(th_a, NULL), 0);
  assert_tb_ok(a.rc);
  assert_int_equal(a.first, 1);
  /* the second acquire reaches the daemon only now, and parks */
  assert_tb_ok(tbt_wait_requests(watch, tb_client_session_id(a.c), n + 1));
  assert_false(is_done(&b2));
  publish_bytes(p, pb, "second", 2, 16);
  assert_int_equal(pthread_join(th_b, NULL), 0);
  assert_tb_ok(b2.rc);
  assert_int_equal(b2.first, 2);

  tb_buffer_destroy(pb);
  tb_client_disconnect(a.c);
  tb_client_disconnect(watch);
  tb_client_disconnect(p);
}

/* Two threads of one client each wait in an acquire of its own channel,
 * both parked at the daemon at once. The version of the second channel
 * comes first: the second thread returns with it while the first still
 * waits, and the first then gets its own. */
static void test_two_acquires_wait_at_once(void **state) {
  static struct waiter a, b;
  a = (struct waiter){.call = WAIT_ACQUIRE, .channel = "in/a"};
  b = (struct waiter){.call = WAIT_ACQUIRE, .channel = "in/b"};
  struct stage s;
  pthread_t th_a, th_b;

  stage_open(*state, &s);
  a.c = b.c = s.c;
  start(s.watch, &a, &th_a);
  start(s.watch, &b, &th_b);
  assert_int_equal(waits_of(s.watch, s.c), 2);

  answer(&s, &b, th_b, 22, 20);
  assert_false(is_done(&a));
  assert_int_equal(waits_of(s.watch, s.c), 1);
  answer(&s, &a, th_a, 11, 30);
  stage_close(&s);
}

/* A producer's thread waits until a version it published is free while
 * another thread of the same client waits for a frame on a control
 * channel: both parked. The consumer lets the version go: the wait-free
 * returns while the acquire still waits, which then gets its frame. */
static void test_wait_free_beside_an_acquire(void **state) {
  static struct waiter w, a;
  w = (struct waiter){.call = WAIT_FREE, .channel = "frames", .version = 1};
  a = (struct waiter){.call = WAIT_ACQUIRE, .channel = "ctl"};
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;
  struct stage s;
  tb_buffer *b1, *b2;
  pthread_t th_w, th_a;

  /* the stage publishes the frames; the other client reads one */
  stage_open(*state, &s);
  w.c = a.c = s.c;
  assert_tb_ok(tb_buffer_create_host(s.c, 64, 0, &b1));
  assert_tb_ok(tb_buffer_create_host(s.c, 64, 0, &b2));
  publish_bytes(s.c, b1, "frames", 4, 16);
  tb_acquire_options_init(&o);
  o.timeout_ms = 0;
  assert_tb_ok(tb_lease_acquire(s.p, "frames", &o, &t));
  publish_bytes(s.c, b2, "frames", 5, 16); /* 1 leaves the history */

  start(s.watch, &w, &th_w);
  start(s.watch, &a, &th_a);
  assert_int_equal(waits_of(s.watch, s.c), 2);

  assert_tb_ok(tb_lease_release(t, NULL));
  assert_int_equal(pthread_join(th_w, NULL), 0);
  assert_tb_ok(w.rc);
  assert_false(is_done(&a));
  answer(&s, &a, th_a, 8, 12);

  tb_buffer_destroy(b2);
  tb_buffer_destroy(b1);
  stage_close(&s);
}

/* Of two parked acquires of one client, the one with the short timeout
 * times out while the other stays parked, and is answered later. */
static void test_one_of_two_times_out(void **state) {
  static struct waiter a, b;
  a = (struct waiter){.call = WAIT_ACQUIRE, .channel = "long"};
  b = (struct waiter){.call = WAIT_ACQUIRE, .channel = "short",
                      .timeout_ms = 200};
  struct stage s;
  pthread_t th_a, th_b;

  stage_open(*state, &s);
  a.c = b.c = s.c;
  start(s.watch, &a, &th_a);
  start(s.watch, &b, &th_b);
  assert_int_equal(pthread_join(th_b, NULL), 0);
  assert_int_equal(b.rc, TB_ETIMEDOUT);
  assert_false(is_done(&a));
  assert_int_equal(waits_of(s.watch, s.c), 1);

  answer(&s, &a, th_a, 3, 8);
  stage_close(&s);
}

/* The daemon started with --max-waits 2: with two acquires of a client
 * parked, a third call that would wait is refused with TB_ELIMIT naming
 * the flag, and one that does not wait is answered; the two waiters still
 * get their versions. */
static void test_waits_limit(void **state) {
  struct tbt_daemon d;
  static struct waiter a, b;
  a = (struct waiter){.call = WAIT_ACQUIRE, .channel = "lim/a"};
  b = (struct waiter){.call = WAIT_ACQUIRE, .channel = "lim/b"};
  const char *const extra[] = {"--max-waits", "2", NULL};
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;
  struct stage s;
  pthread_t th_a, th_b;
  char why[256];

  (void)state;
  assert_int_equal(tbt_daemon_start(&d, extra), 0);
  stage_open(&d, &s);
  a.c = b.c = s.c;
  publish_bytes(s.p, s.pb, "lim/c", 1, 8);

  start(s.watch, &a, &th_a);
  start(s.watch, &b, &th_b);
  tb_acquire_options_init(&o);
  o.mode = TB_ACQUIRE_NEXT;
  o.version = 1;
  o.timeout_ms = TBT_TIMEOUT_MS;
  assert_tb_err(tb_lease_acquire(s.c, "lim/c", &o, &t), TB_ELIMIT);
  tb_client_last_error(s.c, why, sizeof(why));
  assert_string_equal(why, "session has 2 parked requests (--max-waits)");
  assert_tb_err(tb_channel_wait_free(s.c, "lim/c", 1, TBT_TIMEOUT_MS, NULL),
                TB_ELIMIT);
  o.version = 0;
  o.timeout_ms = 0;
  assert_tb_ok(tb_lease_acquire(s.c, "lim/c", &o, &t));
  assert_tb_ok(tb_lease_release(t, NULL));

  /* one buffer: each read before the next publish writes it */
  answer(&s, &a, th_a, 5, 8);
  answer(&s, &b, th_b, 6, 8);
  stage_close(&s);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

/* A child process whose client has three threads parked (two acquires, a
 * wait-free) is killed: the daemon drops all three with the session, and
 * the channels they waited on go on. */
static int parked_child(struct tbt_chan *ch, void *arg) {
  static struct waiter w[3];
  const char *sock = arg;
  struct tb_connect_options o;
  pthread_t th[3];
  tb_buffer *b;
  uint64_t v = 0;
  int64_t shape[1] = {8};
  DLTensor dt;
  tb_client *c;
  char line[16];

  tb_connect_options_init(&o);
  o.socket_path = sock;
  o.client_name = "doomed";
  o.timeout_ms = TBT_TIMEOUT_MS;
  TBT_CHECK_OK(tb_client_connect(&o, &c));
  TBT_CHECK_OK(tb_buffer_create_host(c, 64, 0, &b));
  tbt_u8_tensor(&dt, b, shape, 8);
  TBT_CHECK_OK(tb_channel_publish(c, "end/held", &dt, NULL, &v));
  w[0] = (struct waiter){.c = c, .call = WAIT_ACQUIRE, .channel = "end/a"};
  w[1] = (struct waiter){.c = c, .call = WAIT_ACQUIRE, .channel = "end/b"};
  w[2] = (struct waiter){.c = c, .call = WAIT_FREE, .channel = "end/held",
                         .version = v};
  for (int i = 0; i < 3; i++)
    TBT_CHECK(pthread_create(&th[i], NULL, waiter_main, &w[i]) == 0);
  TBT_CHECK_OK(tbt_send(ch->wr, "%llu",
                        (unsigned long long)tb_client_session_id(c)));
  (void)tbt_recv(ch->rd, line, sizeof(line), TBT_TIMEOUT_MS); /* killed */
  return 3;
}

static void test_session_ends_with_several_parked(void **state) {
  struct tbt_daemon *d = *state;
  struct tbt_child child;
  tb_client *p, *watch;
  tb_buffer *pb;
  char line[32];
  uint64_t sid, end;
  struct tb_wait_entry *we = NULL;
  size_t n = 0, mine = 0;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "watch", &watch));
  assert_tb_ok(tb_buffer_create_host(p, 64, 0, &pb));
  assert_int_equal(tbt_child_start(&child, parked_child, d->sock), 0);
  assert_int_equal(tbt_recv(child.rd, line, sizeof(line), TBT_TIMEOUT_MS), 0);
  sid = strtoull(line, NULL, 10);
  /* all three parked (the version waited for is in the history) */
  end = tbt_now_ms() + TBT_TIMEOUT_MS;
  while (mine < 3 && tbt_now_ms() < end)
    assert_tb_ok(tbt_parked(watch, sid, &mine));
  assert_int_equal(mine, 3);

  tbt_child_kill(&child);
  assert_tb_ok(tbt_wait_session_gone(watch, sid));
  assert_tb_ok(tb_wait_list(watch, sizeof(*we), &we, &n));
  assert_int_equal(n, 0);
  tb_free(we);
  /* the names they waited on go on */
  publish_bytes(p, pb, "end/a", 1, 8);
  publish_bytes(p, pb, "end/b", 2, 8);

  tb_buffer_destroy(pb);
  tb_client_disconnect(watch);
  tb_client_disconnect(p);
}

/* Each thread reads its own last error: thread A's acquire of a channel
 * that does not exist fails; then the main thread's, of another channel,
 * fails on the same client; A still reads its own explanation, the main
 * thread its own, and a thread that made no call on the client reads the
 * client's last. A successful call empties the caller's. (Before, the
 * client kept one message: A read the main thread's.) */
struct misser {
  tb_client *c;
  sem_t failed, go, read;
  int rc;
  char why[256];
};

static int acquire_now(tb_client *c, const char *channel) {
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;

  tb_acquire_options_init(&o);
  o.timeout_ms = 0;
  return tb_lease_acquire(c, channel, &o, &t);
}

static void *misser_main(void *arg) {
  struct misser *m = arg;

  m->rc = acquire_now(m->c, "missing/a");
  sem_post(&m->failed);
  sem_wait(&m->go);
  tb_client_last_error(m->c, m->why, sizeof(m->why));
  sem_post(&m->read);
  return NULL;
}

static void *bystander_main(void *arg) {
  struct misser *m = arg;

  tb_client_last_error(m->c, m->why, sizeof(m->why));
  return NULL;
}

static void test_each_thread_reads_its_own_error(void **state) {
  static struct misser a, by;
  char why[256];
  struct tbt_daemon *d = *state;
  tb_client *c, *p;
  tb_buffer *pb;
  pthread_t th;

  assert_tb_ok(tbt_connect(d, "stage", &c));
  a = (struct misser){.c = c};
  by = (struct misser){.c = c};
  assert_int_equal(sem_init(&a.failed, 0, 0), 0);
  assert_int_equal(sem_init(&a.go, 0, 0), 0);
  assert_int_equal(sem_init(&a.read, 0, 0), 0);
  assert_int_equal(pthread_create(&th, NULL, misser_main, &a), 0);
  assert_int_equal(sem_wait(&a.failed), 0);
  assert_int_equal(a.rc, TB_ENOTFOUND);

  assert_int_equal(acquire_now(c, "missing/main"), TB_ENOTFOUND);
  sem_post(&a.go);
  assert_int_equal(sem_wait(&a.read), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_non_null(strstr(a.why, "missing/a"));
  tb_client_last_error(c, why, sizeof(why));
  assert_non_null(strstr(why, "missing/main"));
  assert_int_equal(pthread_create(&th, NULL, bystander_main, &by), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_non_null(strstr(by.why, "missing/main"));

  /* a successful call empties the caller's explanation */
  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tb_buffer_create_host(p, 64, 0, &pb));
  publish_bytes(p, pb, "there", 1, 16);
  {
    struct tb_acquire_options o;
    DLManagedTensorVersioned *t = NULL;
    tb_acquire_options_init(&o);
    o.timeout_ms = 0;
    assert_tb_ok(tb_lease_acquire(c, "there", &o, &t));
    assert_tb_ok(tb_lease_release(t, NULL));
  }
  assert_int_equal(tb_client_last_error(c, why, sizeof(why)), 0);
  assert_string_equal(why, "");

  sem_destroy(&a.failed);
  sem_destroy(&a.go);
  sem_destroy(&a.read);
  tb_buffer_destroy(pb);
  tb_client_disconnect(p);
  tb_client_disconnect(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_calls_go_on_while_an_acquire_waits,
                                      tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_publish_while_a_wait_free_waits,
                                      tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_parked_reply_read_by_another_call,
                                      tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(
          test_notice_read_by_another_call_wakes_the_poll, tbt_setup,
          tbt_teardown),
      cmocka_unit_test_setup_teardown(
          test_second_waiter_waits_for_an_old_daemon, tbt_setup,
          tbt_teardown),
      cmocka_unit_test_setup_teardown(test_two_acquires_wait_at_once,
                                      tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_wait_free_beside_an_acquire,
                                      tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_one_of_two_times_out, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test(test_waits_limit),
      cmocka_unit_test_setup_teardown(test_each_thread_reads_its_own_error,
                                      tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_session_ends_with_several_parked,
                                      tbt_setup, tbt_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
