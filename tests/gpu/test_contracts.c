/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: what stream=NULL does under each connection contract.
 *
 * For each contract a producer (contract SPEC) rewrites a buffer holding
 * OLD with a slow kernel (300 ms) on the legacy stream and publishes with
 * stream=NULL, so its ready event is recorded on the legacy stream after
 * the kernel. A consumer connected with the contract acquires with
 * stream=NULL and counts words != NEW on the stream the contract names:
 *  SPEC       -> the legacy stream waited: 0 wrong words
 *  PER_THREAD -> the per-thread stream waited: 0 wrong words
 *  NO_SYNC    -> nothing waited: the legacy-stream read is stale (> 0)
 *  EXPLICIT   -> acquire and publish with NULL fail with TB_ESTREAM; with a
 *                stream they work (0 wrong words).
 *
 * per_thread_producers: under PER_THREAD two threads of one producer
 * publish with NULL, each on its own per-thread default stream: thread 1
 * after a 300 ms rewrite of buffer A, thread 2 (while thread 1 lives) at
 * once from buffer B. A consumer that then acquires thread 1's version must
 * wait for thread 1's rewrite: 0 wrong words. One ready event shared by the
 * two streams would have its latest record on thread 2's stream, and the
 * read would overtake the rewrite. */
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

static struct tbt_daemon daemon_;

static int producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  for (unsigned r = 0; r < 4; r++) {
    tb_cu_deviceptr p = tbg_alloc(&g, N * 4ull);
    tbg_fill(&g, p, OLD, N, TB_CU_STREAM_LEGACY);
    TBG_CU(g.cu->cuStreamSynchronize(TB_CU_STREAM_LEGACY));
    tbg_child_hear(ch, "go", NULL, 0);
    tbg_spin_fill(&g, p, 0x600D0000u + r, N, SPIN_MS, TB_CU_STREAM_LEGACY);
    uint64_t v = tbg_publish(c, &g, "gpu/contracts", p, N, NULL, 4);
    tbg_child_say(ch, "published %llu %u", (unsigned long long)v,
                  0x600D0000u + r);
  }
  tbg_child_hear(ch, "done", NULL, 0);
  tb_client_disconnect(c);
  return 0;
}

static int consumer(struct tbt_chan *ch, void *arg) {
  int contract = *(const int *)arg;
  struct tbg_gpu g;
  char line[100], *end;
  DLManagedTensorVersioned *t = NULL;

  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, tb_contract_name(contract), contract);
  tb_cu_stream mine = tbg_stream(&g, 1);
  tb_cu_deviceptr spare = tbg_alloc(&g, 4096);
  tbg_child_say(ch, "ready");
  tbg_child_hear(ch, "v", line, sizeof line);
  unsigned long long ver = strtoull(line, &end, 10);
  unsigned val = (unsigned)strtoul(end, NULL, 10);
  unsigned bad;

  switch (contract) {
  case TB_CONTRACT_SPEC:
  case TB_CONTRACT_PER_THREAD: {
    tb_cu_stream s = contract == TB_CONTRACT_SPEC ? TB_CU_STREAM_LEGACY
                                                  : TB_CU_STREAM_PER_THREAD;
    TBG_OK(c, tbg_acquire(c, "gpu/contracts", TB_ACQUIRE_EXACT, ver, NULL,
                          &t));
    bad = tbg_count(&g, tbg_tensor_ptr(t, N), val, N, s);
    if (bad != 0)
      TBG_FAIL("%s: %u words wrong on the stream NULL stands for",
               tb_contract_name(contract), bad);
    TBG_OK(c, tb_release(t, NULL));
    /* the daemon counted the calls that relied on the default */
    struct tb_session_info *ss = NULL;
    size_t n = 0, i;
    TBG_OK(c, tb_list_sessions(c, &ss, &n));
    for (i = 0; i < n && ss[i].session_id != tb_client_session_id(c); i++) {
    }
    if (i == n || ss[i].implicit_stream_calls < 1)
      TBG_FAIL("implicit stream calls not counted for this session");
    tb_free(ss);
    break;
  }
  case TB_CONTRACT_NO_SYNC:
    TBG_OK(c, tbg_acquire(c, "gpu/contracts", TB_ACQUIRE_EXACT, ver, NULL,
                          &t));
    bad = tbg_count(&g, tbg_tensor_ptr(t, N), val, N, TB_CU_STREAM_LEGACY);
    if (bad == 0)
      TBG_FAIL("no_sync: the read without a wait saw no stale data; either "
               "NULL waited or the window closed too early");
    TBG_OK(c, tb_release(t, NULL));
    break;
  case TB_CONTRACT_EXPLICIT:
    TBG_RC(c, tbg_acquire(c, "gpu/contracts", TB_ACQUIRE_EXACT, ver, NULL, &t),
           TB_ESTREAM);
    TBG_RC(c, tbg_publish_rc(c, &g, "gpu/contracts-explicit", spare, 16, NULL),
           TB_ESTREAM);
    TBG_OK(c, tbg_acquire(c, "gpu/contracts", TB_ACQUIRE_EXACT, ver, mine,
                          &t));
    bad = tbg_count(&g, tbg_tensor_ptr(t, N), val, N, mine);
    if (bad != 0)
      TBG_FAIL("explicit: %u words wrong on the passed stream", bad);
    /* NULL: the stream the lease remembers (mine), not the contract */
    TBG_OK(c, tb_release(t, NULL));
    /* a lease that remembers no stream has nothing for NULL to mean */
    TBG_OK(c, tbg_acquire(c, "gpu/contracts", TB_ACQUIRE_EXACT, ver,
                          TB_STREAM_NO_SYNC, &t));
    TBG_RC(c, tb_release(t, NULL), TB_ESTREAM);
    break;
  }
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

struct ptds_producer {
  struct tbg_gpu *g;
  tb_client *c;
  tb_cu_deviceptr p;
  unsigned val, ms;
  pthread_barrier_t *published, *leave; /* NULL: none */
  uint64_t v;
};

static void *publish_on_ptds(void *arg) {
  struct ptds_producer *a = arg;
  TBG_CU(a->g->cu->cuCtxSetCurrent(a->g->ctx));
  if (a->ms > 0)
    tbg_spin_fill(a->g, a->p, a->val, N, a->ms, TB_CU_STREAM_PER_THREAD);
  else
    tbg_fill(a->g, a->p, a->val, N, TB_CU_STREAM_PER_THREAD);
  a->v = tbg_publish(a->c, a->g, "gpu/ptds", a->p, N, NULL, 4);
  /* live on while the other thread publishes: an ended thread's
   * per-thread stream and pthread_t may pass to the next thread */
  if (a->published != NULL) {
    pthread_barrier_wait(a->published);
    pthread_barrier_wait(a->leave);
  }
  return NULL;
}

static int ptds_producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  pthread_barrier_t published, leave;
  pthread_t th[2];
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_PER_THREAD);
  tb_cu_deviceptr a = tbg_alloc(&g, N * 4ull), b = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, a, OLD, N, TB_CU_STREAM_LEGACY);
  TBG_CU(g.cu->cuStreamSynchronize(TB_CU_STREAM_LEGACY));
  struct ptds_producer t1 = {&g, c, a, 0x600D0001u, SPIN_MS, &published,
                             &leave, 0};
  struct ptds_producer t2 = {&g, c, b, 0x600D0002u, 0, NULL, NULL, 0};
  pthread_barrier_init(&published, NULL, 2);
  pthread_barrier_init(&leave, NULL, 2);
  tbg_child_hear(ch, "go", NULL, 0);
  if (pthread_create(&th[0], NULL, publish_on_ptds, &t1) != 0)
    TBG_FAIL("pthread_create");
  pthread_barrier_wait(&published);
  if (pthread_create(&th[1], NULL, publish_on_ptds, &t2) != 0)
    TBG_FAIL("pthread_create");
  pthread_join(th[1], NULL);
  tbg_child_say(ch, "published %llu %u", (unsigned long long)t1.v, t1.val);
  tbg_child_hear(ch, "done", NULL, 0);
  pthread_barrier_wait(&leave);
  pthread_join(th[0], NULL);
  tb_client_disconnect(c);
  return 0;
}

static int ptds_consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  char line[100], *end;
  DLManagedTensorVersioned *t = NULL;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream mine = tbg_stream(&g, 1);
  tbg_child_say(ch, "ready");
  tbg_child_hear(ch, "v", line, sizeof line);
  unsigned long long ver = strtoull(line, &end, 10);
  unsigned val = (unsigned)strtoul(end, NULL, 10);
  TBG_OK(c, tbg_acquire(c, "gpu/ptds", TB_ACQUIRE_EXACT, ver, mine, &t));
  unsigned bad = tbg_count(&g, tbg_tensor_ptr(t, N), val, N, mine);
  fprintf(stderr, "consumer: %u of %u words read before thread 1's rewrite "
          "finished\n", bad, N);
  if (bad != 0)
    TBG_FAIL("the wait did not follow the publishing thread's stream");
  TBG_OK(c, tb_release(t, NULL));
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void per_thread_producers(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_daemon_up(&daemon_);
  tbg_spawn(&p, ptds_producer, NULL);
  tbg_spawn(&c, ptds_consumer, NULL);
  tbg_hear(&c, "consumer", "ready", NULL, 0);
  tbg_say(&p, "go");
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_hear(&c, "consumer", "ok", NULL, 0);
  tbg_reap(&c, "consumer");
  tbg_say(&p, "done");
  tbg_reap(&p, "producer");
  tbg_daemon_down(&daemon_);
}

static void contracts(void **state) {
  static const int order[4] = {TB_CONTRACT_SPEC, TB_CONTRACT_PER_THREAD,
                               TB_CONTRACT_NO_SYNC, TB_CONTRACT_EXPLICIT};
  struct tbt_child p, c;
  (void)state;
  tbg_daemon_up(&daemon_);
  tbg_spawn(&p, producer, NULL);
  for (int r = 0; r < 4; r++) {
    tbg_spawn(&c, consumer, (void *)&order[r]);
    tbg_hear(&c, tb_contract_name(order[r]), "ready", NULL, 0);
    tbg_say(&p, "go");
    tbg_relay(&p, "producer", "published", &c, "v");
    tbg_hear(&c, tb_contract_name(order[r]), "ok", NULL, 0);
    tbg_reap(&c, tb_contract_name(order[r]));
  }
  tbg_say(&p, "done");
  tbg_reap(&p, "producer");
  tbg_daemon_down(&daemon_);
}

TBG_MAIN(cmocka_unit_test(contracts), cmocka_unit_test(per_thread_producers))
