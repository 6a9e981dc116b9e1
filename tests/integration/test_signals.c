/* SPDX-License-Identifier: Apache-2.0 */
/* Signals and the waits that can last (tb_connect_options.interruptible):
 * a handler that interrupts a parked acquire, a wait_free or a notice poll
 * of an interruptible client ends it with TB_EINTR, and the daemon forgets
 * the parked request (only that one, where a client has several parked);
 * a client that did not ask goes on waiting. */
#include "tb_test.h"

#include <errno.h>
#include <linux/sockios.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

/* signals handled so far; __atomic (lock-free: safe in a handler) */
static int usr1_seen;

static void on_usr1(int sig) {
  (void)sig;
  __atomic_add_fetch(&usr1_seen, 1, __ATOMIC_RELAXED);
}

static int usr1_count(void) {
  return __atomic_load_n(&usr1_seen, __ATOMIC_RELAXED);
}

/* SIGUSR1 runs on_usr1, without SA_RESTART (as Python installs its
 * handlers). */
static void catch_usr1(void) {
  struct sigaction sa;

  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  assert_int_equal(sigaction(SIGUSR1, &sa, NULL), 0);
}

static int connect_intr(const struct tbt_daemon *d, const char *name,
                        int interruptible, tb_client **out) {
  struct tb_connect_options o;

  tb_connect_options_init(&o);
  o.socket_path = d->sock;
  o.client_name = name;
  o.timeout_ms = TBT_TIMEOUT_MS;
  o.interruptible = interruptible;
  return tb_client_connect(&o, out);
}

enum waiter_call { WAIT_ACQUIRE, WAIT_FREE, WAIT_NOTICE };

struct waiter {
  tb_client *c;
  enum waiter_call call;
  const char *channel; /* NULL: "intr" */
  uint64_t version; /* WAIT_FREE's */
  int rc;
  int done; /* __atomic */
  uint8_t first; /* WAIT_ACQUIRE: byte 0 of what it got */
};

static void *waiter_main(void *arg) {
  struct waiter *w = arg;
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;
  struct tb_notice n;

  switch (w->call) {
  case WAIT_ACQUIRE:
    tb_acquire_options_init(&o);
    o.mode = TB_ACQUIRE_NEXT;
    o.version = 0;
    o.timeout_ms = -1;
    w->rc = tb_lease_acquire(w->c, w->channel ? w->channel : "intr", &o, &t);
    if (w->rc == 0) {
      w->first = *(uint8_t *)t->dl_tensor.data;
      w->rc = tb_lease_release(t, NULL);
    }
    break;
  case WAIT_FREE:
    w->rc = tb_channel_wait_free(w->c, "intr", w->version, -1, NULL);
    break;
  case WAIT_NOTICE:
    w->rc = tb_notice_poll(w->c, sizeof(n), &n, -1);
    break;
  }
  __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Start w on a thread and return once the daemon has its request (a
 * notice poll sends none: then at once). */
static void start_parked(tb_client *watch, struct waiter *w, pthread_t *th) {
  if (w->call == WAIT_NOTICE)
    assert_int_equal(pthread_create(th, NULL, waiter_main, w), 0);
  else
    assert_tb_ok(tbt_start_request(watch, w->c, waiter_main, w, th));
}

/* Signal th until w's call returns, at most ~10 s. A signal that comes
 * before the thread is inside its wait is not seen by it, so one is not
 * enough; the pause only spaces them out. Returns whether it returned. */
static int interrupt(pthread_t th, struct waiter *w) {
  struct timespec gap = {0, 5 * 1000 * 1000};

  for (int i = 0; i < 2000; i++) {
    if (__atomic_load_n(&w->done, __ATOMIC_ACQUIRE))
      return 1;
    pthread_kill(th, SIGUSR1);
    nanosleep(&gap, NULL);
  }
  return __atomic_load_n(&w->done, __ATOMIC_ACQUIRE);
}

static void publish_on(tb_client *p, tb_buffer *b, const char *channel,
                       uint8_t value, uint64_t *v) {
  int64_t shape[1] = {64};
  DLTensor t;

  memset(tb_buffer_data(b), value, 64);
  tbt_u8_tensor(&t, b, shape, 64);
  assert_tb_ok(tb_channel_publish(p, channel, &t, NULL, v));
}

static void publish_byte(tb_client *p, tb_buffer *b, uint8_t value,
                         uint64_t *v) {
  publish_on(p, b, "intr", value, v);
}

/* The operator's view lists no parked request of c's session. */
static void assert_no_waits(tb_client *watch, tb_client *c) {
  size_t n = 1;

  assert_tb_ok(tbt_parked(watch, tb_client_session_id(c), &n));
  assert_int_equal(n, 0);
}

static void test_interrupted_acquire(void **state) {
  struct tbt_daemon *d = *state;
  struct waiter w = {.call = WAIT_ACQUIRE};
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;
  tb_client *p, *watch;
  tb_buffer *b;
  pthread_t th;
  char why[256];
  int returned;

  catch_usr1();
  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "watch", &watch));
  assert_tb_ok(connect_intr(d, "consumer", 1, &w.c));
  assert_tb_ok(tb_buffer_create_host(p, 64, 0, &b));

  start_parked(watch, &w, &th);
  returned = interrupt(th, &w);
  if (!returned)
    publish_byte(p, b, 1, NULL); /* let the thread go before failing */
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_true(returned);
  assert_int_equal(w.rc, TB_EINTR);
  assert_true(usr1_count() > 0);
  tb_client_last_error(w.c, why, sizeof(why));
  assert_non_null(strstr(why, "signal"));

  /* The daemon forgot the parked acquire: the operator's view shows no
   * wait of the session, which may park another that times out. */
  assert_no_waits(watch, w.c);
  tb_acquire_options_init(&o);
  o.mode = TB_ACQUIRE_NEXT;
  o.timeout_ms = 50;
  assert_int_equal(tb_lease_acquire(w.c, "intr", &o, &t), TB_ETIMEDOUT);

  /* and the same call, made again, gets the next version */
  w.done = 0;
  start_parked(watch, &w, &th);
  publish_byte(p, b, 42, NULL);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_tb_ok(w.rc);
  assert_int_equal(w.first, 42);

  tb_buffer_destroy(b);
  tb_client_disconnect(w.c);
  tb_client_disconnect(watch);
  tb_client_disconnect(p);
}

/* Two threads of one interruptible client wait in acquires of their own
 * channels, both parked. A signal to the first ends its wait (TB_EINTR)
 * and cancels its request alone: the other stays parked and listed, and
 * gets its version when it comes; a version for the cancelled one is
 * granted to nobody. */
static void test_interrupt_one_of_two_waits(void **state) {
  struct tbt_daemon *d = *state;
  static struct waiter a, b;
  a = (struct waiter){.call = WAIT_ACQUIRE, .channel = "two/a"};
  b = (struct waiter){.call = WAIT_ACQUIRE, .channel = "two/b"};
  struct tb_wait_entry *we;
  struct tb_channel_info ci;
  tb_client *p, *watch, *c;
  tb_buffer *buf;
  pthread_t th_a, th_b;
  size_t n;
  int returned;

  catch_usr1();
  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "watch", &watch));
  assert_tb_ok(connect_intr(d, "stage", 1, &c));
  a.c = b.c = c;
  assert_tb_ok(tb_buffer_create_host(p, 64, 0, &buf));

  start_parked(watch, &a, &th_a);
  start_parked(watch, &b, &th_b);
  returned = interrupt(th_a, &a);
  if (!returned)
    publish_on(p, buf, "two/a", 1, NULL); /* let it go before failing */
  assert_int_equal(pthread_join(th_a, NULL), 0);
  assert_true(returned);
  assert_int_equal(a.rc, TB_EINTR);
  /* the Cancel went before the call returned: b's wait alone is left */
  assert_false(__atomic_load_n(&b.done, __ATOMIC_ACQUIRE));
  assert_tb_ok(tb_wait_list(watch, sizeof(*we), &we, &n));
  assert_int_equal(n, 1);
  assert_int_equal(we[0].session_id, tb_client_session_id(c));
  assert_string_equal(we[0].channel, "two/b");
  tb_free(we);

  publish_on(p, buf, "two/a", 7, NULL);
  publish_on(p, buf, "two/b", 9, NULL);
  assert_int_equal(pthread_join(th_b, NULL), 0);
  assert_tb_ok(b.rc);
  assert_int_equal(b.first, 9);
  /* nothing was granted for the cancelled acquire */
  assert_tb_ok(tbt_find_channel(watch, "two/a", &ci));
  assert_int_equal(ci.leases, 0);

  tb_buffer_destroy(buf);
  tb_client_disconnect(c);
  tb_client_disconnect(watch);
  tb_client_disconnect(p);
}

static void test_interrupted_wait_free_and_notice_poll(void **state) {
  struct tbt_daemon *d = *state;
  struct waiter wf = {.call = WAIT_FREE}, np = {.call = WAIT_NOTICE};
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;
  tb_client *c, *watch;
  tb_buffer *b;
  pthread_t th;
  uint64_t v;
  int returned;

  catch_usr1();
  assert_tb_ok(tbt_connect(d, "watch", &watch));
  assert_tb_ok(tbt_connect(d, "consumer", &c));
  assert_tb_ok(connect_intr(d, "producer", 1, &wf.c));
  assert_tb_ok(connect_intr(d, "noticer", 1, &np.c));
  assert_tb_ok(tb_channel_subscribe(np.c, "intr"));
  assert_tb_ok(tb_buffer_create_host(wf.c, 64, 0, &b));
  publish_byte(wf.c, b, 7, &v);
  tb_acquire_options_init(&o);
  o.timeout_ms = TBT_TIMEOUT_MS;
  assert_tb_ok(tb_lease_acquire(c, "intr", &o, &t));
  publish_byte(wf.c, b, 8, NULL); /* v leaves history, still leased */

  wf.version = v;
  start_parked(watch, &wf, &th);
  returned = interrupt(th, &wf);
  if (!returned)
    assert_tb_ok(tb_lease_release(t, NULL));
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_true(returned);
  assert_int_equal(wf.rc, TB_EINTR);
  /* forgotten by the daemon: no wait of the session is listed; another
   * parks, times out, and is answered once the lease ends */
  assert_no_waits(watch, wf.c);
  assert_int_equal(tb_channel_wait_free(wf.c, "intr", v, 50, NULL),
                   TB_ETIMEDOUT);
  wf.done = 0;
  start_parked(watch, &wf, &th);
  assert_tb_ok(tb_lease_release(t, NULL));
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_tb_ok(wf.rc);

  {
    struct tb_notice n;
    while (tb_notice_poll(np.c, sizeof(n), &n, 0) == 0)
      ; /* the notices of the versions above */
  }
  start_parked(watch, &np, &th);
  returned = interrupt(th, &np);
  if (!returned)
    publish_byte(wf.c, b, 9, NULL); /* a notice lets the thread go */
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_true(returned);
  assert_int_equal(np.rc, TB_EINTR);

  tb_buffer_destroy(b);
  tb_client_disconnect(np.c);
  tb_client_disconnect(wf.c);
  tb_client_disconnect(c);
  tb_client_disconnect(watch);
}

/* Bytes c has sent that the daemon has not read yet. */
static int unread(tb_client *c) {
  int n = 0;

  if (ioctl(tb_client_fd(c), SIOCOUTQ, &n) < 0)
    return -1;
  return n;
}

struct publisher {
  tb_client *p;
  const char *channel;
  tb_buffer *b;
  uint64_t v;
  int rc;
};

static void *publisher_main(void *arg) {
  struct publisher *pb = arg;
  int64_t shape[1] = {64};
  DLTensor t;

  memset(tb_buffer_data(pb->b), 5, 64);
  tbt_u8_tensor(&t, pb->b, shape, 64);
  pb->rc = tb_channel_publish(pb->p, pb->channel, &t, NULL, &pb->v);
  return NULL;
}

/* What on_usr1_resume does: let the stopped daemon go on, and return once
 * its answer to the interrupted wait is there to read (async-signal-safe
 * calls only). */
static pid_t resume_pid;
static int resume_fd = -1;

static void on_usr1_resume(int sig) {
  struct pollfd p = {.fd = resume_fd, .events = POLLIN};

  (void)sig;
  kill(resume_pid, SIGCONT);
  (void)poll(&p, 1, TBT_TIMEOUT_MS);
}

/* The daemon grants the parked acquire after the signal interrupted the
 * wait and before it reads the Cancel: the interrupted call reads that
 * answer as a late one and gives the lease back before it returns, so the
 * version is free at once. The daemon is stopped while the publish queues
 * up; the handler, run inside the interrupted wait, lets it go and waits
 * for the grant. A signal that comes before the wait starts lets the
 * acquire succeed instead: then again, up to 20 times. */
static void test_interrupted_acquire_granted_meanwhile(void **state) {
  struct tbt_daemon *d = *state;
  struct waiter w = {.call = WAIT_ACQUIRE};
  struct timespec gap = {0, 1000 * 1000};
  struct sigaction sa;
  tb_client *watch;
  tb_buffer *b;
  int tries;

  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_usr1_resume;
  sigemptyset(&sa.sa_mask);
  assert_int_equal(sigaction(SIGUSR1, &sa, NULL), 0);
  assert_tb_ok(tbt_connect(d, "watch", &watch));
  assert_tb_ok(connect_intr(d, "consumer", 1, &w.c));
  resume_pid = d->pid;
  resume_fd = tb_client_fd(w.c);
  for (tries = 0; tries < 20; tries++) {
    struct publisher pb = {0};
    char channel[32];
    pthread_t th, pt;
    int64_t shape[1] = {64};
    DLTensor t;
    int queued = 0;

    snprintf(channel, sizeof(channel), "late/%d", tries);
    w.channel = pb.channel = channel;
    assert_tb_ok(tbt_connect(d, "producer", &pb.p));
    assert_tb_ok(tb_buffer_create_host(pb.p, 64, 0, &b));
    pb.b = b;
    w.done = 0;
    start_parked(watch, &w, &th);
    assert_int_equal(kill(d->pid, SIGSTOP), 0);
    assert_int_equal(pthread_create(&pt, NULL, publisher_main, &pb), 0);
    for (int i = 0; i < 10000 && !queued; i++) {
      queued = unread(pb.p) > 0; /* the Publish waits in line */
      if (!queued)
        nanosleep(&gap, NULL);
    }
    pthread_kill(th, SIGUSR1);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(pthread_join(pt, NULL), 0);
    assert_true(queued);
    assert_tb_ok(pb.rc);
    if (w.rc == TB_EINTR) {
      /* nothing of the interrupted call holds the version, once a
       * newer one has taken its place in the history */
      tbt_u8_tensor(&t, b, shape, 64);
      assert_tb_ok(tb_channel_publish(pb.p, channel, &t, NULL, NULL));
      assert_tb_ok(tb_channel_wait_free(pb.p, channel, pb.v, TBT_TIMEOUT_MS,
                                        NULL));
    } else {
      assert_tb_ok(w.rc); /* it came before the wait: got and released */
    }
    tb_buffer_destroy(b);
    tb_client_disconnect(pb.p);
    if (w.rc == TB_EINTR)
      break;
  }
  assert_true(tries < 20);
  tb_client_disconnect(w.c);
  tb_client_disconnect(watch);
}

/* Without interruptible, signals do not end the wait: the acquire returns
 * with the version published after them. */
static void test_signals_do_not_end_waits_by_default(void **state) {
  struct tbt_daemon *d = *state;
  struct waiter w = {.call = WAIT_ACQUIRE};
  struct timespec gap = {0, 5 * 1000 * 1000};
  tb_client *p, *watch;
  tb_buffer *b;
  pthread_t th;
  int seen;

  catch_usr1();
  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "watch", &watch));
  assert_tb_ok(connect_intr(d, "consumer", 0, &w.c));
  assert_tb_ok(tb_buffer_create_host(p, 64, 0, &b));
  start_parked(watch, &w, &th);
  seen = usr1_count();
  for (int i = 0; i < 40; i++) {
    pthread_kill(th, SIGUSR1);
    nanosleep(&gap, NULL);
  }
  assert_true(usr1_count() > seen);
  assert_false(__atomic_load_n(&w.done, __ATOMIC_ACQUIRE));
  publish_byte(p, b, 9, NULL);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_tb_ok(w.rc);
  assert_int_equal(w.first, 9);
  tb_buffer_destroy(b);
  tb_client_disconnect(w.c);
  tb_client_disconnect(watch);
  tb_client_disconnect(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_interrupted_acquire, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(
          test_interrupted_wait_free_and_notice_poll, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(
          test_interrupted_acquire_granted_meanwhile, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_interrupt_one_of_two_waits,
                                      tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_signals_do_not_end_waits_by_default,
                                      tbt_setup, tbt_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
