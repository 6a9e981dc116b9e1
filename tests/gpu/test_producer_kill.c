/* GPU: a producer SIGKILLed while a consumer holds its version. The
 * consumer must get ChannelClosed, its tensor must stay readable until it
 * releases it (CUDA keeps the mapping; measured, though CUDA calls it
 * undefined), a waiting acquire must fail with TB_ECLOSED, and the
 * release must still succeed. */
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
  char line[100];
  DLManagedTensorVersioned *t = NULL, *t2 = NULL;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  TBG_OK(c, tb_subscribe(c, "gpu/pkill"));
  tbg_child_hear(ch, "v", line, sizeof line);
  unsigned long long v1 = strtoull(line, NULL, 10);
  TBG_OK(c, tbg_acquire(c, "gpu/pkill", TB_ACQUIRE_EXACT, v1, s, &t));
  if (tbg_count(&g, tbg_tensor_ptr(t, N), 31, N, s) != 0)
    TBG_FAIL("version 1 reads wrong");
  tbg_child_say(ch, "leased");
  tbg_wait_notice(c, TB_NOTICE_CHANNEL_CLOSED, NULL);
  if (tbg_count(&g, tbg_tensor_ptr(t, N), 31, N, s) != 0)
    TBG_FAIL("the leased tensor no longer reads correctly after the "
             "producer died");
  TBG_RC(c, tbg_acquire(c, "gpu/pkill", TB_ACQUIRE_NEXT, v1, s, &t2),
         TB_ECLOSED);
  TBG_OK(c, tb_release(t, s));
  struct tb_status st;
  TBG_OK(c, tb_daemon_status(c, &st));
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void producer_kill(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_daemon_up(&daemon_);
  tbg_spawn(&p, producer, NULL);
  tbg_spawn(&c, consumer, NULL);
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_hear(&c, "consumer", "leased", NULL, 0);
  kill(p.pid, SIGKILL);
  assert_int_equal(tbt_child_wait(&p, TBT_TIMEOUT_MS), 128 + SIGKILL);
  tbg_hear(&c, "consumer", "ok", NULL, 0);
  tbg_reap(&c, "consumer");
  tbg_daemon_down(&daemon_);
}

TBG_MAIN(cmocka_unit_test(producer_kill))
