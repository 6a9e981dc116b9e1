/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: acquire inside CUDA graph capture.
 *
 * The consumer captures, on a blocking stream in GLOBAL mode:
 *  - acquire with stream=NULL (contract SPEC: legacy stream) and with
 *    stream=1: both must fail with TB_ECAPTURE and leave the capture active;
 *  - acquire of version 1 on the capturing stream (an external event-wait
 *    node), then a kernel counting words != 2 into a counter.
 * The capture must end cleanly and instantiate. After it the producer
 * rewrites the same buffer with 2 by a slow kernel (300 ms) and publishes
 * version 2 (re-recording its ready event). The consumer then launches the
 * graph: the captured wait waits for the event's latest record at launch,
 * so the count must be 0. A second graph captured without the wait,
 * launched first, must count stale words, showing the window was real. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "gpu_common.h"

#define N (4u << 20)
#define SPIN_MS 300

static struct tbt_daemon daemon_;

static int producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr p = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, p, 1, N, s);
  uint64_t v1 = tbg_publish(c, &g, "gpu/graph", p, N, s, 2);
  tbg_child_say(ch, "published %llu", (unsigned long long)v1);
  tbg_child_hear(ch, "republish", NULL, 0);
  tbg_spin_fill(&g, p, 2, N, SPIN_MS, s);
  uint64_t v2 = tbg_publish(c, &g, "gpu/graph", p, N, s, 2);
  tbg_child_say(ch, "published %llu", (unsigned long long)v2);
  tbg_child_hear(ch, "done", NULL, 0);
  tb_client_disconnect(c);
  return 0;
}

static int consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  DLManagedTensorVersioned *t = NULL, *t2 = NULL;
  void *graph = NULL, *exec = NULL, *graph0 = NULL, *exec0 = NULL;
  int st = -1;
  (void)arg;

  tbg_gpu_init(&g, 0);
  const struct tb_cuda *cu = g.cu;
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream cs = tbg_stream(&g, 0), cs0 = tbg_stream(&g, 0);
  tb_cu_deviceptr cnt = tbg_alloc(&g, 4), cnt0 = tbg_alloc(&g, 4);
  uint64_t v1 = tbg_child_hear_version(ch);

  TBG_CU(cu->cuStreamBeginCapture(cs, TB_CU_STREAM_CAPTURE_MODE_GLOBAL));
  TBG_RC(c, tbg_acquire(c, "gpu/graph", TB_ACQUIRE_EXACT, v1, NULL, &t),
         TB_ECAPTURE);
  TBG_RC(c, tbg_acquire(c, "gpu/graph", TB_ACQUIRE_EXACT, v1,
                        TB_STREAM_LEGACY, &t),
         TB_ECAPTURE);
  char msg[256] = "";
  tb_client_last_error(c, msg, sizeof msg);
  fprintf(stderr, "consumer: legacy acquire in capture: %s\n", msg);
  TBG_CU(cu->cuStreamIsCapturing(cs, &st));
  if (st != TB_CU_STREAM_CAPTURE_STATUS_ACTIVE)
    TBG_FAIL("the refused legacy acquire changed the capture (status %d)", st);
  /* first acquire of this buffer: the IPC opens happen inside the capture */
  TBG_OK(c, tbg_acquire(c, "gpu/graph", TB_ACQUIRE_EXACT, v1, cs, &t));
  tb_cu_deviceptr p = tbg_tensor_ptr(t, N);
  tbg_count_async(&g, p, 2, N, cnt, cs);
  TBG_CU(cu->cuStreamEndCapture(cs, &graph));
  TBG_CU(cu->cuGraphInstantiate(&exec, graph, 0));

  /* the same read without the wait */
  TBG_CU(cu->cuStreamBeginCapture(cs0, TB_CU_STREAM_CAPTURE_MODE_GLOBAL));
  tbg_count_async(&g, p, 2, N, cnt0, cs0);
  TBG_CU(cu->cuStreamEndCapture(cs0, &graph0));
  TBG_CU(cu->cuGraphInstantiate(&exec0, graph0, 0));
  TBG_OK(c, tb_release(t, TB_STREAM_NO_SYNC));

  tbg_child_say(ch, "captured");
  uint64_t v2 = tbg_child_hear_version(ch);
  TBG_OK(c, tbg_acquire(c, "gpu/graph", TB_ACQUIRE_EXACT, v2,
                        TB_STREAM_NO_SYNC, &t2));
  if (tbg_tensor_ptr(t2, N) != p)
    TBG_FAIL("version 2 maps to another address than version 1: the graph "
             "reads the old mapping, the test would prove nothing");
  TBG_CU(cu->cuGraphLaunch(exec0, cs0));
  TBG_CU(cu->cuGraphLaunch(exec, cs));
  unsigned stale = tbg_counter_read(&g, cnt0, cs0);
  unsigned waited = tbg_counter_read(&g, cnt, cs);
  fprintf(stderr, "consumer: replay without wait %u stale words, with the "
          "captured wait %u\n", stale, waited);
  if (stale == 0)
    TBG_FAIL("the graph without the wait read no stale data: the window "
             "closed too early, so this run proves nothing");
  if (waited != 0)
    TBG_FAIL("replay read %u old words: the captured wait did not wait for "
             "the later publish", waited);
  TBG_OK(c, tb_release(t2, TB_STREAM_NO_SYNC));
  TBG_CU(cu->cuGraphExecDestroy(exec));
  TBG_CU(cu->cuGraphExecDestroy(exec0));
  TBG_CU(cu->cuGraphDestroy(graph));
  TBG_CU(cu->cuGraphDestroy(graph0));
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void graph_capture(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_start(&daemon_, &p, producer, NULL, &c, consumer, NULL);
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_hear(&c, "consumer", "captured", NULL, 0);
  tbg_say(&p, "republish");
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_finish(&p, &c, &daemon_);
}

TBG_MAIN(cmocka_unit_test(graph_capture))
