/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: a lease ends on the streams the consumer declared (docs/cuda.md,
 * "When a lease ends"), in the corners a single tb_release(t, s) never
 * meets. Each case: the producer publishes version 1 from buffer A (all
 * ONE), the consumer acquires it and queues a 300 ms spinning read of it
 * on non-blocking streams, then lets the lease end in the way the case
 * names; the producer publishes version 2 from buffer B, waits in
 * tb_wait_free(v1) with its stream, and at once rewrites A with TWO. The
 * consumer's reads must count no word != ONE: they only can if the done
 * event the producer waited for was recorded after them. Recorded on a
 * stream the consumer did not use (the legacy stream, as before the
 * stream-true lease end), the rewrite lands inside the 300 ms spin and
 * the counts are non-zero.
 *
 *  - joined: acquired on s1, tb_lease_wait(t, s2), reads on both, plain
 *    deleter: the done event must follow both streams;
 *  - two leases: a second lease of version 1, acquired on s2 and read
 *    briefly there, ends after the first (whose done event was recorded
 *    behind the 300 ms read on s1): the consumer's one done event is then
 *    re-recorded, and the producer, waiting for its latest record only,
 *    must still wait for s1's read (recorded on s2 alone, it would not);
 *  - capture: a read on s, then s begins a graph capture (global mode) and
 *    the deleter runs inside it: the capture must stay valid, the lease
 *    must stay held (the producer's tb_wait_free(v1, 0) is TB_EBUSY) until
 *    the capture has ended and the next call on the client ends it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_common.h"

#define N (4u << 20)
#define SPIN_MS 300
#define ONE 0x11111111u
#define TWO 0x22222222u
#define CH "gpu/lease_end"

enum lease_case { CASE_JOINED, CASE_TWO_LEASES, CASE_CAPTURE };

static struct tbt_daemon daemon_;

static int producer(struct tbt_chan *ch, void *arg) {
  const enum lease_case *lc = arg;
  struct tbg_gpu g;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr a = tbg_alloc(&g, N * 4ull), b = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, a, ONE, N, s);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  uint64_t v1 = tbg_publish(c, &g, CH, a, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v1);
  tbg_child_hear(ch, "next", NULL, 0);
  tbg_fill(&g, b, ONE, N, s);
  (void)tbg_publish(c, &g, CH, b, N, s, 1);
  if (*lc == CASE_CAPTURE) {
    /* the consumer's deleter ran inside its capture: still leased */
    TBG_RC(c, tb_wait_free(c, CH, v1, 0, s), TB_EBUSY);
    tbg_child_say(ch, "busy");
    tbg_child_hear(ch, "captured", NULL, 0);
  }
  /* the ring's reuse: wait for the consumers' done events, rewrite */
  TBG_OK(c, tb_wait_free(c, CH, v1, TBT_TIMEOUT_MS, s));
  tbg_fill(&g, a, TWO, N, s);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  tbg_child_say(ch, "rewritten");
  tbg_child_hear(ch, "done", NULL, 0);
  tb_client_disconnect(c);
  return 0;
}

static int consumer(struct tbt_chan *ch, void *arg) {
  const enum lease_case *lc = arg;
  struct tbg_gpu g;
  DLManagedTensorVersioned *t = NULL;
  unsigned bad1 = 0, bad2 = 0;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream s1 = tbg_stream(&g, 1), s2 = tbg_stream(&g, 1);
  tb_cu_deviceptr k1 = tbg_alloc(&g, 4), k2 = tbg_alloc(&g, 4);
  uint64_t v1 = tbg_child_hear_version(ch);

  TBG_OK(c, tbg_acquire(c, CH, TB_ACQUIRE_EXACT, v1, s1, &t));
  tb_cu_deviceptr p = tbg_tensor_ptr(t, N);
  tbg_spin_count_async(&g, p, ONE, N, SPIN_MS, k1, s1);
  if (*lc == CASE_JOINED) {
    TBG_OK(c, tb_lease_wait(t, s2));
    tbg_spin_count_async(&g, p, ONE, N, SPIN_MS, k2, s2);
    t->deleter(t);
  } else if (*lc == CASE_TWO_LEASES) {
    DLManagedTensorVersioned *t2 = NULL;
    TBG_OK(c, tbg_acquire(c, CH, TB_ACQUIRE_EXACT, v1, s2, &t2));
    t->deleter(t); /* its done event behind the long read on s1 */
    tbg_spin_count_async(&g, tbg_tensor_ptr(t2, N), ONE, N, 1, k2, s2);
    t2->deleter(t2); /* re-recorded after s2's short read */
  } else if (*lc == CASE_CAPTURE) {
    void *graph = NULL;
    TBG_CU(g.cu->cuStreamBeginCapture(s1, TB_CU_STREAM_CAPTURE_MODE_GLOBAL));
    tbg_fill(&g, k2, 0, 1, s1); /* some captured work */
    t->deleter(t);              /* the lease ends while s1 captures */
    TBG_CU(g.cu->cuStreamEndCapture(s1, &graph));
    if (graph == NULL)
      TBG_FAIL("the capture was invalidated by the lease's end");
    TBG_CU(g.cu->cuGraphDestroy(graph));
    tbg_child_say(ch, "in capture");
    tbg_child_hear(ch, "checked", NULL, 0);
    /* any call on the client ends the lease, now that nothing captures */
    struct tb_notice n;
    TBG_RC(c, tb_client_poll_notice(c, &n, 0), TB_EAGAIN);
  }
  tbg_child_say(ch, "ended");
  tbg_child_hear(ch, "rewritten", NULL, 0);
  /* the reads ran on streams that finished before the rewrite, or not */
  TBG_CU(g.cu->cuCtxSynchronize());
  TBG_CU(g.cu->cuMemcpyDtoH(&bad1, k1, 4));
  if (*lc != CASE_CAPTURE)
    TBG_CU(g.cu->cuMemcpyDtoH(&bad2, k2, 4));
  fprintf(stderr, "consumer: %u and %u of %u words overwritten under the "
          "reads\n", bad1, bad2, N);
  if (bad1 != 0 || bad2 != 0)
    TBG_FAIL("the producer rewrote the buffer while the consumer read it");
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void run(enum lease_case lc) {
  struct tbt_child p, c;
  tbg_start(&daemon_, &p, producer, &lc, &c, consumer, &lc);
  tbg_relay(&p, "producer", "published", &c, "v");
  if (lc == CASE_CAPTURE) {
    tbg_hear(&c, "consumer", "in capture", NULL, 0);
    tbg_say(&p, "next");
    tbg_hear(&p, "producer", "busy", NULL, 0);
    tbg_say(&c, "checked");
    tbg_hear(&c, "consumer", "ended", NULL, 0);
    tbg_say(&p, "captured");
  } else {
    tbg_hear(&c, "consumer", "ended", NULL, 0);
    tbg_say(&p, "next");
  }
  tbg_pass(&p, "producer", "rewritten", &c);
  tbg_hear(&c, "consumer", "ok", NULL, 0);
  tbg_say(&p, "done");
  tbg_reap(&c, "consumer");
  tbg_reap(&p, "producer");
  tbg_daemon_down(&daemon_);
}

static void joined(void **state) {
  (void)state;
  run(CASE_JOINED);
}

static void two_leases(void **state) {
  (void)state;
  run(CASE_TWO_LEASES);
}

static void capture(void **state) {
  (void)state;
  run(CASE_CAPTURE);
}

TBG_MAIN(cmocka_unit_test(joined), cmocka_unit_test(two_leases),
         cmocka_unit_test(capture))
