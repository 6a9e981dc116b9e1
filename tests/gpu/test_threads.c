/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: two threads of one consumer client wait at once for CUDA versions
 * (FEATURE_MULTI_WAIT), each on its own channel and its own non-blocking
 * stream, as a stage with one input thread per camera does.
 *
 * Both acquires park at the daemon before anything is published. The
 * producer then publishes channel b while a 300 ms kernel still writes it:
 * thread B's acquire returns while thread A's still waits, and B's stream,
 * made to wait on the version's ready event whichever of the two threads
 * read the reply, counts 0 words that are not the producer's. Then channel
 * a, the same way, for thread A. A read that skipped the wait would count
 * stale words (gpu_slow_producer shows the window is real); a library that
 * sent one waiting call at a time would never have both parked. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "gpu_common.h"

#define N (4u << 20)
#define SPIN_MS 300
#define OLD 0x0BAD0BADu
#define VA 0xAAAA0001u
#define VB 0xBBBB0002u

static struct tbt_daemon daemon_;

static int producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr pa = tbg_alloc(&g, N * 4ull), pb = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, pa, OLD, N, s);
  tbg_fill(&g, pb, OLD, N, s);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  tbg_child_hear(ch, "go b", NULL, 0);
  tbg_spin_fill(&g, pb, VB, N, SPIN_MS, s); /* still running at publish */
  tbg_publish(c, &g, "gpu/thr/b", pb, N, s, 1);
  tbg_child_say(ch, "published");
  tbg_child_hear(ch, "go a", NULL, 0);
  tbg_spin_fill(&g, pa, VA, N, SPIN_MS, s);
  tbg_publish(c, &g, "gpu/thr/a", pa, N, s, 1);
  tbg_child_say(ch, "published");
  tbg_child_hear(ch, "done", NULL, 0);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  tb_client_disconnect(c);
  return 0;
}

/* One input thread of the consumer: its own stream, one acquire of the
 * latest version of its channel (which does not exist yet: it parks). */
struct reader {
  tb_client *c;
  struct tbg_gpu *g;
  const char *channel;
  unsigned expect;
  unsigned wrong;
  int done; /* __atomic: the acquire has returned */
};

static void *reader_main(void *arg) {
  struct reader *r = arg;
  DLManagedTensorVersioned *t = NULL;

  TBG_CU(r->g->cu->cuCtxSetCurrent(r->g->ctx));
  tb_cu_stream s = tbg_stream(r->g, 1);
  TBG_OK(r->c, tbg_acquire(r->c, r->channel, TB_ACQUIRE_LATEST, 0, s, &t));
  __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
  r->wrong = tbg_count(r->g, tbg_tensor_ptr(t, N), r->expect, N, s);
  TBG_OK(r->c, tb_lease_release(t, s));
  TBG_CU(r->g->cu->cuStreamSynchronize(s));
  TBG_CU(r->g->cu->cuStreamDestroy(s));
  return NULL;
}

static size_t parked(tb_client *watch, tb_client *c) {
  size_t n = 0;

  TBG_OK(watch, tbt_parked(watch, tb_client_session_id(c), &n));
  return n;
}

static void reader_join(struct reader *r, pthread_t th, const char *who) {
  if (pthread_join(th, NULL) != 0)
    TBG_FAIL("pthread_join failed");
  fprintf(stderr, "consumer: thread %s read %u of %u words wrong\n", who,
          r->wrong, N);
  if (r->wrong != 0)
    TBG_FAIL("thread %s read %u words the producer had not written yet",
             who, r->wrong);
}

static int consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  struct reader a = {.g = &g, .channel = "gpu/thr/a", .expect = VA};
  struct reader b = {.g = &g, .channel = "gpu/thr/b", .expect = VB};
  pthread_t tha, thb;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "stage", TB_CONTRACT_SPEC);
  tb_client *watch = tbg_connect(&daemon_, "watch", TB_CONTRACT_SPEC);
  a.c = b.c = c;

  /* each acquire parks at the daemon: nothing is published yet */
  TBG_OK(watch, tbt_start_request(watch, c, reader_main, &a, &tha));
  TBG_OK(watch, tbt_start_request(watch, c, reader_main, &b, &thb));
  if (parked(watch, c) != 2)
    TBG_FAIL("%zu of the stage's acquires parked at the daemon, expected "
             "both", parked(watch, c));
  tbg_child_say(ch, "go b");
  reader_join(&b, thb, "b");
  if (__atomic_load_n(&a.done, __ATOMIC_ACQUIRE))
    TBG_FAIL("thread a returned before anything was published on its "
             "channel");
  if (parked(watch, c) != 1)
    TBG_FAIL("thread a's acquire is no longer parked");
  tbg_child_say(ch, "go a");
  reader_join(&a, tha, "a");
  tb_client_disconnect(watch);
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void two_threads_wait_at_once(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_start(&daemon_, &p, producer, NULL, &c, consumer, NULL);
  tbg_pass(&c, "consumer", "go b", &p);
  tbg_hear(&p, "producer", "published", NULL, 0);
  tbg_pass(&c, "consumer", "go a", &p);
  tbg_hear(&p, "producer", "published", NULL, 0);
  tbg_finish(&p, &c, &daemon_);
}

TBG_MAIN(cmocka_unit_test(two_threads_wait_at_once))
