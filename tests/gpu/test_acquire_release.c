/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: tb_acquire_options.release with CUDA tensors. The lease that rides
 * with the next acquire hands the producer a done event recorded on
 * release_stream, like tb_release(t, stream) does.
 *
 * The producer publishes version 1 (V1, finished at publish) and, once the
 * consumer has it, version 2 (V2). The consumer starts a slow read of
 * version 1 (a 300 ms spin, then a count of the words that are not V1) on
 * its stream and, while that read is in flight, acquires version 2 with
 * release = version 1 and release_stream = that stream: one cuEventRecord.
 * The producer then waits for version 1 to be free with tb_wait_free on its
 * stream (one cuStreamWaitEvent: the done event) and overwrites its memory
 * on that stream at once. The consumer's slow read must still count 0
 * wrong words: without the done event the overwrite would land during the
 * spin. Version 2 reads V2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "gpu_common.h"

#define N (4u << 20)
#define SPIN_MS 300
#define V1 0x11111111u
#define V2 0x22222222u
#define OLD 0x0BAD0BADu
#define CH "gpu/acqrel"

static struct tbt_daemon daemon_;

static int producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr p1 = tbg_alloc(&g, N * 4ull), p2 = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, p1, V1, N, s);
  tbg_fill(&g, p2, V2, N, s);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  uint64_t v1 = tbg_publish(c, &g, CH, p1, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v1);
  tbg_child_hear(ch, "next", NULL, 0);
  uint64_t v2 = tbg_publish(c, &g, CH, p2, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v2);
  tbg_child_hear(ch, "released", NULL, 0);
  /* version 1 left the history with version 2 and its lease has ended:
   * free at once, with the consumer's done event to wait on */
  tbg_wait_free_one_wait(c, CH, v1, s,
                         "the done event that rode with the acquire");
  tbg_fill(&g, p1, OLD, N, s); /* after the consumer's read, on the GPU */
  tbg_child_say(ch, "overwritten");
  tbg_child_hear(ch, "done", NULL, 0);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  tb_client_disconnect(c);
  return 0;
}

static int consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  struct tb_cuda_counters k0, k1;
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t1 = NULL, *t2 = NULL;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream cs = tbg_stream(&g, 1);
  tb_cu_deviceptr cnt = tbg_alloc(&g, 4);

  uint64_t v1 = tbg_child_hear_version(ch);
  TBG_OK(c, tbg_acquire(c, CH, TB_ACQUIRE_EXACT, v1, cs, &t1));
  tbg_child_say(ch, "ok");
  uint64_t v2 = tbg_child_hear_version(ch);
  /* a slow read of version 1 in flight on cs */
  tbg_spin_count_async(&g, tbg_tensor_ptr(t1, N), V1, N, SPIN_MS, cnt, cs);
  tb_acquire_options_init(&o);
  o.mode = TB_ACQUIRE_EXACT;
  o.version = v2;
  o.timeout_ms = 20000;
  o.stream = cs;
  o.release = t1;
  o.release_stream = cs;
  tb__cuda_counters(&k0);
  TBG_OK(c, tb_acquire(c, CH, &o, &t2));
  tb__cuda_counters(&k1);
  if (k1.event_record - k0.event_record != 1)
    TBG_FAIL("the acquire that released version 1 made %lu cuEventRecord "
             "calls, expected 1 (the done event on the busy stream)",
             k1.event_record - k0.event_record);
  tbg_child_say(ch, "released");
  tbg_child_hear(ch, "overwritten", NULL, 0);
  unsigned wrong = tbg_counter_read(&g, cnt, cs);
  fprintf(stderr, "consumer: slow read of the released version: %u of %u "
          "words wrong\n", wrong, N);
  if (wrong != 0)
    TBG_FAIL("the producer overwrote version 1 while the consumer still "
             "read it (%u words)", wrong);
  if (tbg_count(&g, tbg_tensor_ptr(t2, N), V2, N, cs) != 0)
    TBG_FAIL("version 2: wrong data");
  TBG_OK(c, tb_release(t2, cs));
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void acquire_releases_cuda(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_start(&daemon_, &p, producer, NULL, &c, consumer, NULL);
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_hear(&c, "consumer", "ok", NULL, 0);
  tbg_say(&p, "next");
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_pass(&c, "consumer", "released", &p);
  tbg_pass(&p, "producer", "overwritten", &c);
  tbg_finish(&p, &c, &daemon_);
}

TBG_MAIN(cmocka_unit_test(acquire_releases_cuda))
