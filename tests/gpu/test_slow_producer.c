/* GPU: a consumer reads correct data only because its stream waits for the
 * producer's event, and the test shows it can tell.
 *
 * The producer's buffer holds OLD (written and synchronised). A slow
 * kernel (300 ms) then writes NEW, and the version is published on that
 * kernel's stream at once. The consumer acquires the version twice, at
 * once: on stream A (the library makes A wait on the producer's event) and
 * with stream -1 (no wait), and on both streams launches a kernel counting
 * words != NEW. Stream -1's count must be non-zero (it ran while the
 * producer's kernel was still spinning: the read is stale, so the timing
 * window is real), stream A's must be zero. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "gpu_common.h"

#define N (4u << 20)
#define SPIN_MS 300
#define OLD 0x01D01D01u
#define NEW 0x0E30E30Eu

static struct tbt_daemon daemon_;

static int producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr p = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, p, OLD, N, s);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  tbg_child_hear(ch, "go", NULL, 0);
  tbg_spin_fill(&g, p, NEW, N, SPIN_MS, s);
  uint64_t v = tbg_publish(c, &g, "gpu/slow", p, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v);
  tbg_child_hear(ch, "done", NULL, 0);
  /* the producer's own view, after its kernel: all NEW */
  if (tbg_count(&g, p, NEW, N, s) != 0)
    TBG_FAIL("producer's buffer is not NEW after its kernel");
  tb_client_disconnect(c);
  return 0;
}

static int consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  char line[100];
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream sa = tbg_stream(&g, 1), sb = tbg_stream(&g, 1);
  tb_cu_deviceptr ca = tbg_alloc(&g, 4), cb = tbg_alloc(&g, 4);
  DLManagedTensorVersioned *ta = NULL, *tb = NULL;
  tbg_child_say(ch, "ready");
  tbg_child_hear(ch, "v", line, sizeof line);
  unsigned long long ver = strtoull(line, NULL, 10);

  TBG_OK(c, tbg_acquire(c, "gpu/slow", TB_ACQUIRE_EXACT, ver, sa, &ta));
  tbg_count_async(&g, tbg_tensor_ptr(ta, N), NEW, N, ca, sa);
  TBG_OK(c, tbg_acquire(c, "gpu/slow", TB_ACQUIRE_EXACT, ver,
                        TB_STREAM_NO_SYNC, &tb));
  tbg_count_async(&g, tbg_tensor_ptr(tb, N), NEW, N, cb, sb);
  unsigned stale = tbg_counter_read(&g, cb, sb);
  unsigned waited = tbg_counter_read(&g, ca, sa);
  fprintf(stderr, "consumer: without wait %u of %u words stale; with wait %u\n",
          stale, N, waited);
  if (stale == 0)
    TBG_FAIL("the unsynchronised read saw no stale data: the producer's "
             "kernel finished too early, so this run proves nothing");
  if (waited != 0)
    TBG_FAIL("%u words wrong although the stream waited on the event",
             waited);
  TBG_OK(c, tb_release(ta, sa));
  TBG_OK(c, tb_release(tb, TB_STREAM_NO_SYNC));
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void slow_producer(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_daemon_up(&daemon_);
  tbg_spawn(&p, producer, NULL);
  tbg_spawn(&c, consumer, NULL);
  tbg_hear(&c, "consumer", "ready", NULL, 0);
  tbg_say(&p, "go");
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_finish(&p, &c, &daemon_);
}

TBG_MAIN(cmocka_unit_test(slow_producer))
