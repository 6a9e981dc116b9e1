/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: a producer SIGKILLed while a consumer holds its version. The
 * consumer must get ChannelClosed, its tensor must stay readable until it
 * releases it (CUDA keeps the mapping; measured, though CUDA calls it
 * undefined), an acquire of anything newer must fail with TB_ECLOSED
 * (no producer), and the release must still succeed.
 *
 * producer_kill_pending: the producer is killed while the kernel that
 * writes the version still runs, after a consumer's stream was made to
 * wait on the version's ready event. Measured on the H200 (driver
 * 580.159.04): that stream never completes (still waiting 20 s later; the
 * dead process's event stays not ready, and recording it again from the
 * consumer does not release it), while the consumer's other streams run;
 * anything that synchronises the whole device then never returns (GPU run
 * 33: the consumer hung in a clean-up that read a counter back and freed
 * a buffer). The test checks what still holds (ChannelClosed, the
 * consumer's other kernels, the daemon, the release, the process's exit)
 * without calling anything that synchronises the device, and reports the
 * waiting stream's fate; docs/cuda.md, "What happens on a crash". */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "gpu_common.h"

#define N (4u << 20)
#define OLD 31u
#define NEW 32u
#define SPIN_MS 4000u /* the producer's kernel writes NEW after this */
/* How long the consumer watches its stream: twice the producer's kernel,
 * so that "still waiting" says the wait outlived the work it waited for
 * (a watch shorter than the kernel proves nothing either way). */
#define PATIENCE_MS (2u * SPIN_MS)

static struct tbt_daemon daemon_;

static int producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr a = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, a, 31, N, s);
  uint64_t v1 = tbg_publish(c, &g, "gpu/pkill", a, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v1);
  tbg_child_hear(ch, "never", NULL, 0); /* killed here */
  return 3;
}

static int consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  DLManagedTensorVersioned *t = NULL, *t2 = NULL;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  TBG_OK(c, tb_subscribe(c, "gpu/pkill"));
  uint64_t v1 = tbg_child_hear_version(ch);
  TBG_OK(c, tbg_acquire(c, "gpu/pkill", TB_ACQUIRE_EXACT, v1, s, &t));
  if (tbg_count(&g, tbg_tensor_ptr(t, N), 31, N, s) != 0)
    TBG_FAIL("version 1 reads wrong");
  tbg_child_say(ch, "leased");
  tbg_wait_notice(c, TB_NOTICE_CHANNEL_CLOSED, NULL);
  if (tbg_count(&g, tbg_tensor_ptr(t, N), 31, N, s) != 0)
    TBG_FAIL("the leased tensor no longer reads correctly after the "
             "producer died");
  {
    /* no producer, and nothing newer: TB_ECLOSED at once with timeout 0
     * (a longer timeout waits that long for a new producer) */
    struct tb_acquire_options o;
    tb_acquire_options_init(&o);
    o.mode = TB_ACQUIRE_NEXT;
    o.version = v1;
    o.timeout_ms = 0;
    o.stream = s;
    TBG_RC(c, tb_acquire(c, "gpu/pkill", &o, &t2), TB_ECLOSED);
  }
  TBG_OK(c, tb_release(t, s));
  struct tb_status st;
  TBG_OK(c, tb_daemon_status(c, &st));
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

/* The pending case's producer: OLD, then on "go" a kernel writing NEW after
 * SPIN_MS, published at once; it is killed while that kernel runs. */
static const struct tbg_slow pending = {
    .daemon = &daemon_,
    .channel = "gpu/pkill2",
    .n = N,
    .old_value = OLD,
    .new_value = NEW,
    .spin_ms = SPIN_MS,
    .producer_ordinal = 0,
    .wait_for_kill = 1,
};

static uint64_t ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int consumer_pending(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  DLManagedTensorVersioned *t = NULL;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr cnt = tbg_alloc(&g, sizeof(unsigned));
  TBG_OK(c, tb_subscribe(c, "gpu/pkill2"));
  tbg_child_say(ch, "ready");
  uint64_t v = tbg_child_hear_version(ch);
  TBG_OK(c, tbg_acquire(c, "gpu/pkill2", TB_ACQUIRE_EXACT, v, s, &t));
  tbg_count_async(&g, tbg_tensor_ptr(t, N), NEW, N, cnt, s);
  if (g.cu->cuStreamQuery(s) == 0)
    TBG_FAIL("the stream did not wait: the producer's kernel finished "
             "before the kill, so this run proves nothing");
  tbg_child_say(ch, "leased");
  tbg_wait_notice(c, TB_NOTICE_CHANNEL_CLOSED, NULL);
  /* a bounded wait for the stream, polled, so a stream stuck on the dead
   * producer's event is reported instead of hanging the test */
  uint64_t t0 = ms_now(), waited;
  tb_cu_result r;
  for (;;) {
    struct timespec tick = {0, 1000000};
    r = g.cu->cuStreamQuery(s);
    waited = ms_now() - t0;
    if (r != TB_CUDA_ERROR_NOT_READY || waited > PATIENCE_MS)
      break;
    nanosleep(&tick, NULL);
  }
  char outcome[160];
  if (r == TB_CUDA_ERROR_NOT_READY) {
    snprintf(outcome, sizeof outcome, "still waiting %llu ms after "
             "ChannelClosed", (unsigned long long)waited);
  } else if (r != 0) {
    snprintf(outcome, sizeof outcome, "failed with %s after %llu ms",
             tb__cuda_err_name(r), (unsigned long long)waited);
  } else {
    unsigned bad = tbg_counter_read(&g, cnt, s);
    snprintf(outcome, sizeof outcome, "completed %llu ms after "
             "ChannelClosed; %u of %u words read were not the producer's "
             "last write", (unsigned long long)waited, bad, N);
  }
  /* whatever became of that stream, the consumer's other streams run
   * (polled: a synchronising call could wait for the stuck one) */
  tb_cu_stream s2 = tbg_stream(&g, 1);
  tb_cu_deviceptr own = tbg_alloc(&g, 1024 * 4);
  tbg_fill(&g, own, 7, 1024, s2);
  t0 = ms_now();
  while ((r = g.cu->cuStreamQuery(s2)) == TB_CUDA_ERROR_NOT_READY &&
         ms_now() - t0 < PATIENCE_MS) {
    struct timespec tick = {0, 1000000};
    nanosleep(&tick, NULL);
  }
  if (r != 0)
    TBG_FAIL("the consumer's other stream did not finish after the "
             "producer died: %s", tb__cuda_err_name(r));
  /* the daemon still answers, and still counts the lease */
  struct tb_status st;
  TBG_OK(c, tb_daemon_status(c, &st));
  if (st.leases != 1)
    TBG_FAIL("%llu leases, expected the consumer's one",
             (unsigned long long)st.leases);
  tbg_child_say(ch, "outcome %s", outcome);
  /* The release closes the dead producer's mapping, which a kernel behind
   * the stuck wait still uses: reported by the parent, not asserted. No
   * tb_client_disconnect, no cuMemFree after it; exiting tears the
   * context down, stuck stream and all. */
  TBG_OK(c, tb_release(t, s));
  tbg_child_say(ch, "released");
  return 0;
}

static void producer_kill_pending(void **state) {
  struct tbt_child p, c;
  char outcome[200];
  (void)state;
  tbg_start(&daemon_, &p, tbg_slow_producer, (void *)&pending, &c,
            consumer_pending, NULL);
  tbg_ready_go(&p, &c);
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_hear(&c, "consumer", "leased", NULL, 0);
  kill(p.pid, SIGKILL);
  assert_int_equal(tbt_child_wait(&p, TBT_TIMEOUT_MS), 128 + SIGKILL);
  tbg_hear(&c, "consumer", "outcome", outcome, sizeof outcome);
  fprintf(stderr, "producer killed during its write; the consumer's stream "
                  "that waits on the version's ready event: %s\n",
          outcome);
  char line[100];
  if (tbt_recv(c.rd, line, sizeof line, 5000) == 0 &&
      strcmp(line, "released") == 0) {
    fprintf(stderr, "then tb_release returned\n");
    tbg_reap(&c, "consumer");
  } else {
    fprintf(stderr, "then tb_release did not return within 5 s (it "
                    "unmaps the dead producer's buffer); consumer killed\n");
    tbt_child_kill(&c);
  }
  tbg_daemon_down(&daemon_);
}

static void producer_kill(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_start(&daemon_, &p, producer, NULL, &c, consumer, NULL);
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_hear(&c, "consumer", "leased", NULL, 0);
  kill(p.pid, SIGKILL);
  assert_int_equal(tbt_child_wait(&p, TBT_TIMEOUT_MS), 128 + SIGKILL);
  tbg_hear(&c, "consumer", "ok", NULL, 0);
  tbg_reap(&c, "consumer");
  tbg_daemon_down(&daemon_);
}

TBG_MAIN(cmocka_unit_test(producer_kill),
         cmocka_unit_test(producer_kill_pending))
