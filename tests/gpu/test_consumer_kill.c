/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: a consumer SIGKILLed while its kernel reads a version.
 * Consumers K (to be killed) and O (other) lease version 1. O releases.
 * The producer publishes version 2, so version 1 leaves the history; it is
 * still leased by K, so tb_wait_free(v1, 0) is TB_EBUSY. K starts a kernel
 * that reads version 1 for 2 s and is SIGKILLed meanwhile. Then the
 * producer's tb_wait_free(v1) must succeed, O must still acquire and read
 * version 2 correctly, and the daemon must answer.
 *
 * killed_after_release: consumer K acquires version 1, queues a 2 s read
 * of it, releases it on that stream (its done event recorded behind the
 * read) and is SIGKILLed. The producer had published version 2 before the
 * kill, so it holds version 1's VersionFree naming K's done event. A dead
 * process's event never completes (measured for a producer's ready event),
 * so a producer stream made to wait on it would stall for good: once K's
 * session is gone, tb_wait_free(v1) must leave the producer's stream free
 * to run (it must finish within 10 s) and the buffer must take a rewrite. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "gpu_common.h"

#define N (4u << 20)

static struct tbt_daemon daemon_;

/* Both producers: version 1 from a (all val), said; on "next", version 2
 * from b (all val + 1), so that version 1 leaves the history. */
static uint64_t publish_two(struct tbt_chan *ch, struct tbg_gpu *g,
                            tb_client *c, tb_cu_stream s, const char *chan,
                            tb_cu_deviceptr a, tb_cu_deviceptr b,
                            unsigned val, uint64_t *v2) {
  tbg_fill(g, a, val, N, s);
  uint64_t v1 = tbg_publish(c, g, chan, a, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v1);
  tbg_child_hear(ch, "next", NULL, 0);
  tbg_fill(g, b, val + 1, N, s);
  *v2 = tbg_publish(c, g, chan, b, N, s, 1);
  return v1;
}

static int producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr a = tbg_alloc(&g, N * 4ull), b = tbg_alloc(&g, N * 4ull);
  uint64_t v2;
  uint64_t v1 = publish_two(ch, &g, c, s, "gpu/ckill", a, b, 21, &v2);
  TBG_RC(c, tb_wait_free(c, "gpu/ckill", v1, 0, s), TB_EBUSY);
  tbg_child_say(ch, "published %llu", (unsigned long long)v2);
  tbg_child_hear(ch, "killed", NULL, 0);
  TBG_OK(c, tb_wait_free(c, "gpu/ckill", v1, TBT_TIMEOUT_MS, s));
  /* the buffer is ours again: rewrite and check it */
  tbg_fill(&g, a, 23, N, s);
  if (tbg_count(&g, a, 23, N, s) != 0)
    TBG_FAIL("cannot rewrite the freed buffer");
  tbg_child_say(ch, "free");
  tbg_child_hear(ch, "done", NULL, 0);
  tb_client_disconnect(c);
  return 0;
}

static int consumer(struct tbt_chan *ch, void *arg) {
  int doomed = *(const int *)arg;
  struct tbg_gpu g;
  DLManagedTensorVersioned *t = NULL;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, doomed ? "doomed" : "other",
                             TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  uint64_t v1 = tbg_child_hear_version(ch);
  TBG_OK(c, tbg_acquire(c, "gpu/ckill", TB_ACQUIRE_EXACT, v1, s, &t));
  if (tbg_count(&g, tbg_tensor_ptr(t, N), 21, N, s) != 0)
    TBG_FAIL("version 1 reads wrong");
  if (doomed) {
    tb_cu_deviceptr cnt = tbg_alloc(&g, 4);
    tbg_spin_count_async(&g, tbg_tensor_ptr(t, N), 21, N, 2000, cnt, s);
    if (g.cu->cuStreamQuery(s) != TB_CUDA_ERROR_NOT_READY)
      TBG_FAIL("the 2 s reading kernel is not running any more");
    tbg_child_say(ch, "reading");
    tbg_child_hear(ch, "never", NULL, 0); /* killed here */
    return 3;
  }
  TBG_OK(c, tb_release(t, s));
  tbg_child_say(ch, "released");
  uint64_t v2 = tbg_child_hear_version(ch);
  TBG_OK(c, tbg_acquire(c, "gpu/ckill", TB_ACQUIRE_EXACT, v2, s, &t));
  if (tbg_count(&g, tbg_tensor_ptr(t, N), 22, N, s) != 0)
    TBG_FAIL("version 2 reads wrong after the other consumer died");
  TBG_OK(c, tb_release(t, s));
  struct tb_status st;
  TBG_OK(c, tb_daemon_status(c, &st));
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static int gone_producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr a = tbg_alloc(&g, N * 4ull), b = tbg_alloc(&g, N * 4ull);
  uint64_t v2; /* v1 is freed by it */
  uint64_t v1 = publish_two(ch, &g, c, s, "gpu/ckill2", a, b, 31, &v2);
  tbg_child_say(ch, "published");
  tbg_child_hear(ch, "killed", NULL, 0);
  /* until the daemon has ended the dead consumer's session */
  if (tbt_wait_session_name_gone(c, "doomed") != 0)
    TBG_FAIL("the killed consumer's session did not end");
  TBG_OK(c, tb_wait_free(c, "gpu/ckill2", v1, TBT_TIMEOUT_MS, s));
  tbg_fill(&g, a, 33, N, s);
  uint64_t deadline = tbt_now_ms() + 10000;
  tb_cu_result q;
  while ((q = g.cu->cuStreamQuery(s)) == TB_CUDA_ERROR_NOT_READY &&
         tbt_now_ms() < deadline) {
    struct tb_notice no;
    (void)tb_client_poll_notice(c, &no, 10);
  }
  if (q != TB_CUDA_SUCCESS)
    TBG_FAIL("the producer's stream still waits 10 s after the rewrite was "
             "queued: it waits for good on the killed consumer's done event");
  if (tbg_count(&g, a, 33, N, s) != 0)
    TBG_FAIL("cannot rewrite the freed buffer");
  tbg_child_say(ch, "free");
  tbg_child_hear(ch, "done", NULL, 0);
  tb_client_disconnect(c);
  return 0;
}

static int gone_consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  DLManagedTensorVersioned *t = NULL;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "doomed", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr cnt = tbg_alloc(&g, 4);
  uint64_t v1 = tbg_child_hear_version(ch);
  TBG_OK(c, tbg_acquire(c, "gpu/ckill2", TB_ACQUIRE_EXACT, v1, s, &t));
  tbg_spin_count_async(&g, tbg_tensor_ptr(t, N), 31, N, 2000, cnt, s);
  TBG_OK(c, tb_release(t, s)); /* the done event behind the 2 s read */
  if (g.cu->cuStreamQuery(s) != TB_CUDA_ERROR_NOT_READY)
    TBG_FAIL("the 2 s reading kernel is not running any more");
  tbg_child_say(ch, "released");
  tbg_child_hear(ch, "never", NULL, 0); /* killed here */
  return 3;
}

static void killed_after_release(void **state) {
  struct tbt_child p, k;
  char line[100];
  (void)state;
  tbg_start(&daemon_, &p, gone_producer, NULL, &k, gone_consumer, NULL);
  tbg_hear(&p, "producer", "published", line, sizeof line);
  tbg_say(&k, "v %s", line);
  tbg_hear(&k, "doomed", "released", NULL, 0);
  tbg_say(&p, "next");
  tbg_hear(&p, "producer", "published", NULL, 0);
  kill(k.pid, SIGKILL);
  assert_int_equal(tbt_child_wait(&k, TBT_TIMEOUT_MS), 128 + SIGKILL);
  tbg_say(&p, "killed");
  tbg_hear(&p, "producer", "free", NULL, 0);
  tbg_say(&p, "done");
  tbg_reap(&p, "producer");
  tbg_daemon_down(&daemon_);
}

static void consumer_kill(void **state) {
  static const int doomed = 1, other = 0;
  struct tbt_child p, k, o;
  char line[100];
  (void)state;
  tbg_start(&daemon_, &p, producer, NULL, &k, consumer, (void *)&doomed);
  tbg_spawn(&o, consumer, (void *)&other);
  tbg_hear(&p, "producer", "published", line, sizeof line);
  tbg_say(&k, "v %s", line);
  tbg_say(&o, "v %s", line);
  tbg_hear(&o, "other", "released", NULL, 0);
  tbg_hear(&k, "doomed", "reading", NULL, 0);
  tbg_say(&p, "next");
  tbg_hear(&p, "producer", "published", line, sizeof line);
  kill(k.pid, SIGKILL);
  assert_int_equal(tbt_child_wait(&k, TBT_TIMEOUT_MS), 128 + SIGKILL);
  tbg_say(&p, "killed");
  tbg_hear(&p, "producer", "free", NULL, 0);
  tbg_say(&o, "v %s", line);
  tbg_hear(&o, "other", "ok", NULL, 0);
  tbg_say(&p, "done");
  tbg_reap(&o, "other");
  tbg_reap(&p, "producer");
  tbg_daemon_down(&daemon_);
}

TBG_MAIN(cmocka_unit_test(consumer_kill),
         cmocka_unit_test(killed_after_release))
