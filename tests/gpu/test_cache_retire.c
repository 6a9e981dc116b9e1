/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: the consumer's handle cache and buffer retirement, counted at the
 * driver (tb__cuda_counters).
 *  - producer: two publishes from one allocation A (different offsets) make
 *    one cuIpcGetMemHandle;
 *  - consumer: acquiring both versions makes one cuIpcOpenMemHandle;
 *    a version from allocation B makes a second;
 *  - the producer disconnects: A (no version left) is retired and the
 *    consumer closes it (one cuIpcCloseMemHandle), B stays mapped while its
 *    version is leased and still reads correctly;
 *  - a consumer that connected before it had a CUDA context (so connect
 *    prepared no done event: "Ready at connect", tested by
 *    gpu_connect_early) makes its done event while its first acquire's
 *    request is in flight (one cuEventCreate during an acquire of a
 *    channel that does not exist), and its first CUDA acquire uses it (no
 *    second one);
 *  - opening ahead: the consumer (subscribed) opens each new buffer as it
 *    reads the new-version notice, before it acquires; the acquires then
 *    open no memory and no event. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "gpu_common.h"

#define N (1u << 20)

static struct tbt_daemon daemon_;

static int producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  struct tb_cuda_counters k0, k1;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr a = tbg_alloc(&g, 2 * N * 4ull), b = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, a, 11, N, s);
  tbg_fill(&g, a + N * 4ull, 12, N, s);
  tbg_fill(&g, b, 13, N, s);
  tb__cuda_counters(&k0);
  tbg_publish(c, &g, "gpu/cache", a, N, s, 1);
  tbg_child_say(ch, "published");
  tbg_child_hear(ch, "next", NULL, 0);
  tbg_publish(c, &g, "gpu/cache", a + N * 4ull, N, s, 1);
  tb__cuda_counters(&k1);
  if (k1.ipc_get_mem - k0.ipc_get_mem != 1)
    TBG_FAIL("two publishes from one allocation made %lu cuIpcGetMemHandle "
             "calls, expected 1", k1.ipc_get_mem - k0.ipc_get_mem);
  tbg_child_say(ch, "published");
  tbg_child_hear(ch, "next", NULL, 0);
  tbg_publish(c, &g, "gpu/cache", b, N, s, 1);
  tbg_child_say(ch, "published");
  tbg_child_hear(ch, "leave", NULL, 0);
  tb_client_disconnect(c);
  tbg_child_say(ch, "left");
  tbg_child_hear(ch, "done", NULL, 0);
  return 0;
}

static int consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  struct tb_cuda_counters k0, k;
  DLManagedTensorVersioned *t = NULL;
  uint64_t ver = 0;
  (void)arg;
  /* connected before CUDA is initialised in this process: connect makes
   * no done event */
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tbg_gpu_init(&g, 0);
  tb_cu_stream s = tbg_stream(&g, 1);
  TBG_OK(c, tb_subscribe(c, "gpu/cache"));
  /* no reply for this acquire is CUDA, yet the done event is made while
   * its request travels (a context is current) */
  struct tb_acquire_options none;
  tb_acquire_options_init(&none);
  none.timeout_ms = 0;
  tb__cuda_counters(&k0);
  TBG_RC(c, tb_acquire(c, "gpu/cache-none", &none, &t), TB_ENOTFOUND);
  tb__cuda_counters(&k);
  if (k.event_create - k0.event_create != 1)
    TBG_FAIL("%lu cuEventCreate calls while an acquire's request was in "
             "flight, expected 1 (the done event made ahead)",
             k.event_create - k0.event_create);
  tbg_child_say(ch, "ready");
  tb__cuda_counters(&k0);
  for (unsigned r = 0; r < 3; r++) {
    struct tb_lease_info li;
    struct tb_notice nt;
    struct tb_cuda_counters kn;
    unsigned long want = r < 2 ? 1 : 2;
    tbg_child_hear(ch, "go", NULL, 0);
    tbg_wait_notice(c, TB_NOTICE_NEW_VERSION, &nt);
    if (nt.version != r + 1)
      TBG_FAIL("notice of version %llu, expected %u",
               (unsigned long long)nt.version, r + 1);
    tb__cuda_counters(&kn);
    if (kn.ipc_open_mem - k0.ipc_open_mem != want)
      TBG_FAIL("after %u new-version notices: %lu cuIpcOpenMemHandle calls, "
               "expected %lu (a new buffer opened as its notice is read)",
               r + 1, kn.ipc_open_mem - k0.ipc_open_mem, want);
    TBG_OK(c, tbg_acquire(c, "gpu/cache", TB_ACQUIRE_NEXT, ver, s, &t));
    TBG_OK(c, tb_lease_info(t, &li));
    ver = li.version;
    if (tbg_count(&g, tbg_tensor_ptr(t, N), 11 + r, N, s) != 0)
      TBG_FAIL("version %llu: wrong data", (unsigned long long)ver);
    tb__cuda_counters(&k);
    if (k.ipc_open_event != kn.ipc_open_event)
      TBG_FAIL("acquire %u opened %lu events after the notice (expected 0: "
               "opened ahead, or finished and never opened)",
               r + 1, k.ipc_open_event - kn.ipc_open_event);
    if (k.ipc_open_mem - k0.ipc_open_mem != want)
      TBG_FAIL("after %u acquires: %lu cuIpcOpenMemHandle calls, expected "
               "%lu", r + 1, k.ipc_open_mem - k0.ipc_open_mem, want);
    if (k.event_create != k0.event_create)
      TBG_FAIL("after %u acquires: %lu cuEventCreate calls, expected 0 (the "
               "done event made ahead is the one used)",
               r + 1, k.event_create - k0.event_create);
    if (r < 2)
      TBG_OK(c, tb_release(t, s)); /* the last one stays leased */
    tbg_child_say(ch, "ok");
  }
  /* the producer leaves: the channel closes, A is retired */
  tbg_wait_notice(c, TB_NOTICE_CHANNEL_CLOSED, NULL);
  struct tb_status st;
  TBG_OK(c, tb_daemon_status(c, &st)); /* everything before it is read */
  struct tb_notice n;
  while (tb_client_poll_notice(c, &n, 0) == 0) {
  }
  tb__cuda_counters(&k);
  if (k.ipc_close_mem - k0.ipc_close_mem != 1)
    TBG_FAIL("%lu cuIpcCloseMemHandle calls after the retirement, expected 1"
             " (A closed, B still leased)", k.ipc_close_mem - k0.ipc_close_mem);
  if (tbg_count(&g, tbg_tensor_ptr(t, N), 13, N, s) != 0)
    TBG_FAIL("the leased version no longer reads correctly");
  TBG_OK(c, tb_release(t, s));
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void cache_retire(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_daemon_up(&daemon_);
  tbg_spawn(&c, consumer, NULL);
  tbg_hear(&c, "consumer", "ready", NULL, 0);
  tbg_spawn(&p, producer, NULL);
  for (int r = 0; r < 3; r++) {
    tbg_hear(&p, "producer", "published", NULL, 0);
    tbg_say(&c, "go");
    tbg_hear(&c, "consumer", "ok", NULL, 0);
    if (r < 2)
      tbg_say(&p, "next");
  }
  tbg_say(&p, "leave");
  tbg_hear(&p, "producer", "left", NULL, 0);
  tbg_finish(&p, &c, &daemon_);
}

TBG_MAIN(cmocka_unit_test(cache_retire))
