/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: versions whose work had finished at publish ("ready_complete") cost
 * the consumer no event open and no stream wait, and the shortcut is never
 * taken when work is still in flight. Counted at the driver
 * (tb__cuda_counters), data checked by a kernel.
 *
 *  1. the producer fills buffer 1 on a non-blocking stream, synchronises
 *     it and publishes: the consumer's acquire makes no cuStreamWaitEvent
 *     and no cuIpcOpenEventHandle, and reads the data; its release after
 *     synchronising carries no done event (and records none: no
 *     cuEventRecord), so the producer's tb_wait_free on that version makes
 *     no cuStreamWaitEvent either;
 *  2. the same version acquired on a stream that is being captured: the
 *     capture still gets its (external) wait, so the graph waits for the
 *     producer's later publishes when it runs;
 *  3. a slow kernel (300 ms) writes buffer 2 on that stream and the version
 *     is published at once: the consumer waits (one cuStreamWaitEvent) and
 *     reads new data; it releases while its own slow read is in flight, so
 *     the producer's tb_wait_free does wait on the done event;
 *  4. the slow kernel writes buffer 3 on the *legacy* stream and the
 *     version is published from an idle *blocking* stream: an event recorded
 *     there waits for the legacy stream's work, so the version must not be
 *     called complete. The consumer waits and reads new data, and a read of
 *     the same version with stream -1 reads stale data (the window is
 *     real);
 *  5. a publish from the stream of 1 and 3, idle again, makes no
 *     cuEventRecord (the event's earlier records have all completed). */
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
#define V3 0x33333333u
#define OLD 0x0BAD0BADu
#define CH "gpu/complete"

static struct tbt_daemon daemon_;

static int producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  struct tb_cuda_counters k0, k1;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1), bs = tbg_stream(&g, 0);
  tb_cu_deviceptr p1 = tbg_alloc(&g, N * 4ull), p2 = tbg_alloc(&g, N * 4ull),
                  p3 = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, p2, OLD, N, s);
  tbg_fill(&g, p3, OLD, N, s);

  /* 1: finished before publish */
  tbg_fill(&g, p1, V1, N, s);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  uint64_t v1 = tbg_publish(c, &g, CH, p1, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v1);
  tbg_child_hear(ch, "next", NULL, 0);

  /* 3: in flight on the publishing stream */
  tbg_spin_fill(&g, p2, V2, N, SPIN_MS, s);
  uint64_t v2 = tbg_publish(c, &g, CH, p2, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v2);
  tbg_child_hear(ch, "next", NULL, 0);

  /* 4: in flight on the legacy stream, published from an idle blocking
   * stream */
  tbg_spin_fill(&g, p3, V3, N, SPIN_MS, TB_CU_STREAM_LEGACY);
  uint64_t v3 = tbg_publish(c, &g, CH, p3, N, bs, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v3);
  tbg_child_hear(ch, "released", NULL, 0);

  /* v1 and v2 have left the history (depth 1) and are released */
  tb__cuda_counters(&k0);
  TBG_OK(c, tb_wait_free(c, CH, v1, 20000, s));
  tb__cuda_counters(&k1);
  if (k1.stream_wait != k0.stream_wait)
    TBG_FAIL("wait_free of a version released on an idle stream made %lu "
             "cuStreamWaitEvent calls, expected 0",
             k1.stream_wait - k0.stream_wait);
  TBG_OK(c, tb_wait_free(c, CH, v2, 20000, s));
  tb__cuda_counters(&k0);
  if (k0.stream_wait - k1.stream_wait != 1)
    TBG_FAIL("wait_free of a version released with work in flight made %lu "
             "cuStreamWaitEvent calls, expected 1",
             k0.stream_wait - k1.stream_wait);
  /* 5: s has published (and recorded its ready event) before and is idle
   * now: publishing from it records nothing */
  TBG_CU(g.cu->cuStreamSynchronize(s));
  tb__cuda_counters(&k0);
  (void)tbg_publish(c, &g, CH, p1, N, s, 1);
  tb__cuda_counters(&k1);
  if (k1.event_record != k0.event_record)
    TBG_FAIL("publish from an idle stream that had recorded before made %lu "
             "cuEventRecord calls, expected 0",
             k1.event_record - k0.event_record);
  tbg_child_say(ch, "freed");
  tbg_child_hear(ch, "done", NULL, 0);
  tb_client_disconnect(c);
  return 0;
}

/* Acquire version ver with stream s and check how many stream waits and
 * event opens the library made. */
static DLManagedTensorVersioned *acquire_counted(tb_client *c, uint64_t ver,
                                                 void *s, unsigned long waits,
                                                 unsigned long opens,
                                                 const char *what) {
  struct tb_cuda_counters k0, k1;
  DLManagedTensorVersioned *t = NULL;
  tb__cuda_counters(&k0);
  TBG_OK(c, tbg_acquire(c, CH, TB_ACQUIRE_EXACT, ver, s, &t));
  tb__cuda_counters(&k1);
  fprintf(stderr, "consumer: %s: %lu stream waits, %lu event opens\n", what,
          k1.stream_wait - k0.stream_wait,
          k1.ipc_open_event - k0.ipc_open_event);
  if (k1.stream_wait - k0.stream_wait != waits)
    TBG_FAIL("%s: %lu cuStreamWaitEvent calls, expected %lu", what,
             k1.stream_wait - k0.stream_wait, waits);
  if (k1.ipc_open_event - k0.ipc_open_event != opens)
    TBG_FAIL("%s: %lu cuIpcOpenEventHandle calls, expected %lu", what,
             k1.ipc_open_event - k0.ipc_open_event, opens);
  return t;
}

static int consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  DLManagedTensorVersioned *t, *t2;
  void *graph = NULL;
  int st = -1;
  (void)arg;
  tbg_gpu_init(&g, 0);
  const struct tb_cuda *cu = g.cu;
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream cs = tbg_stream(&g, 1), cap = tbg_stream(&g, 1),
               sb = tbg_stream(&g, 1);
  tb_cu_deviceptr cnt = tbg_alloc(&g, 4), cntb = tbg_alloc(&g, 4);
  tbg_child_say(ch, "ready");

  /* 1 */
  uint64_t v1 = tbg_child_hear_version(ch);
  t = acquire_counted(c, v1, cs, 0, 0, "finished version");
  if (tbg_count(&g, tbg_tensor_ptr(t, N), V1, N, cs) != 0)
    TBG_FAIL("finished version: wrong data");
  /* 2: the same version inside a capture still gets its wait */
  TBG_CU(cu->cuStreamBeginCapture(cap, TB_CU_STREAM_CAPTURE_MODE_GLOBAL));
  t2 = acquire_counted(c, v1, cap, 1, 1, "finished version, capturing");
  tbg_count_async(&g, tbg_tensor_ptr(t2, N), V1, N, cnt, cap);
  TBG_CU(cu->cuStreamIsCapturing(cap, &st));
  if (st != TB_CU_STREAM_CAPTURE_STATUS_ACTIVE)
    TBG_FAIL("the capture was invalidated (status %d)", st);
  TBG_CU(cu->cuStreamEndCapture(cap, &graph));
  TBG_CU(cu->cuGraphDestroy(graph));
  TBG_OK(c, tb_release(t2, TB_STREAM_NO_SYNC));
  {
    /* cs is idle: no done event, and not even a record of it */
    struct tb_cuda_counters k0, k1;
    tb__cuda_counters(&k0);
    TBG_OK(c, tb_release(t, cs));
    tb__cuda_counters(&k1);
    if (k1.event_record != k0.event_record)
      TBG_FAIL("release on an idle stream made %lu cuEventRecord calls, "
               "expected 0", k1.event_record - k0.event_record);
  }
  tbg_child_say(ch, "ok");

  /* 3 */
  uint64_t v2 = tbg_child_hear_version(ch);
  t = acquire_counted(c, v2, cs, 1, 0, "version in flight"); /* event opened in 2 */
  tbg_spin_count_async(&g, tbg_tensor_ptr(t, N), V2, N, SPIN_MS, cnt, cs);
  TBG_OK(c, tb_release(t, cs)); /* our read is in flight: a done event */
  if (tbg_counter_read(&g, cnt, cs) != 0)
    TBG_FAIL("version in flight: wrong data although the stream waited");
  tbg_child_say(ch, "ok");

  /* 4 */
  uint64_t v3 = tbg_child_hear_version(ch);
  t = acquire_counted(c, v3, cs, 1, 1,
                      "legacy-stream work, published from a blocking stream");
  tbg_count_async(&g, tbg_tensor_ptr(t, N), V3, N, cnt, cs);
  t2 = acquire_counted(c, v3, TB_STREAM_NO_SYNC, 0, 0, "the same with -1");
  tbg_count_async(&g, tbg_tensor_ptr(t2, N), V3, N, cntb, sb);
  unsigned stale = tbg_counter_read(&g, cntb, sb);
  unsigned waited = tbg_counter_read(&g, cnt, cs);
  fprintf(stderr, "consumer: legacy-stream work: without wait %u of %u words "
          "stale; with wait %u\n", stale, N, waited);
  if (stale == 0)
    TBG_FAIL("the read without a wait saw no stale data: the producer's "
             "kernel finished too early, so this case proves nothing");
  if (waited != 0)
    TBG_FAIL("%u words wrong although the stream waited", waited);
  TBG_OK(c, tb_release(t, cs));
  TBG_OK(c, tb_release(t2, TB_STREAM_NO_SYNC));
  tbg_child_say(ch, "released");
  tbg_child_hear(ch, "done", NULL, 0);
  tb_client_disconnect(c);
  return 0;
}

static void ready_complete(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_start(&daemon_, &p, producer, NULL, &c, consumer, NULL);
  tbg_hear(&c, "consumer", "ready", NULL, 0);
  for (int i = 0; i < 3; i++) {
    tbg_relay(&p, "producer", "published", &c, "v");
    if (i < 2) {
      tbg_hear(&c, "consumer", "ok", NULL, 0);
      tbg_say(&p, "next");
    }
  }
  tbg_pass(&c, "consumer", "released", &p);
  tbg_hear(&p, "producer", "freed", NULL, 0);
  tbg_say(&p, "done");
  tbg_say(&c, "done");
  tbg_reap(&c, "consumer");
  tbg_reap(&p, "producer");
  tbg_daemon_down(&daemon_);
}

TBG_MAIN(cmocka_unit_test(ready_complete))
