/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: a ring of three buffers, streamed the way producers stream frames,
 * and a slow consumer that ends each lease with the plain deleter (issue
 * 20).
 *
 * The producer (a child process) cycles frames f = 1..FRAMES through three
 * cuMemAlloc buffers: for frame f it takes buffer f % 3, calls
 * tb_wait_free(version last published from it, its stream s), so that s
 * waits for every consumer's done event, fills the buffer with f on s
 * (tb_fill_u32) and publishes it on s with the metadata "f", one frame per
 * PERIOD_US. The consumer (another child) takes the version after the last
 * one it read (the newest: the channel keeps one), with TB_STREAM_NO_SYNC,
 * then names its own non-blocking stream with tb_lease_wait(t, cs) and
 * enqueues on cs a kernel that spins SPIN_US and then counts the words that
 * are not f into a counter of its own per frame. It ends the lease at once
 * with the plain deleter t->deleter(t), its kernel still queued: the done
 * event must cover cs, the stream tb_lease_wait declared, or the
 * producer's fill of frame f + 3 overtakes the read. It keeps at most two
 * frames in flight (it waits for the previous frame's kernel, never for
 * the current one before the lease ends) and reads the counters back at
 * the end.
 *
 *  - ring_wait_free: FRAMES >= 1000 produced, at least MIN_READ read, and
 *    no wrong frame.
 *  - ring_without_wait_free_control: the same producer without
 *    tb_wait_free must show wrong frames: the consumer lags far enough for
 *    the check to fire.
 *
 * Figures (frames produced, read, wrong) go to stderr. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "gpu_common.h"

#define N (1u << 20) /* words per buffer: 4 MiB */
#define RING 3
#define FRAMES 1200u
#define PERIOD_US 150u /* the producer publishes a frame every 150 us */
#define SPIN_US 500u   /* the consumer's kernel spins this long, then reads */
#define MIN_READ 100u
#define EMPTY 0xFFFFFFFFu /* no frame has this number */

static struct tbt_daemon daemon_;

struct ring_args {
  int wait_free;
  const char *channel;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sleep until the monotonic time t (ns): pacing, not synchronisation. */
static void sleep_until_ns(uint64_t t) {
  struct timespec ts = {(time_t)(t / 1000000000ull),
                        (long)(t % 1000000000ull)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

/* Publish n u32 words at p on stream s with text metadata; the version. */
static uint64_t publish_meta(tb_client *c, const struct tbg_gpu *g,
                             const char *channel, tb_cu_deviceptr p, size_t n,
                             tb_cu_stream s, const char *meta) {
  struct tb_publish_options o;
  DLTensor t;
  int64_t shape = (int64_t)n;
  uint64_t v = 0;
  memset(&t, 0, sizeof t);
  t.data = (void *)(uintptr_t)p;
  t.device.device_type = kDLCUDA;
  t.device.device_id = g->ordinal;
  t.ndim = 1;
  t.dtype.code = kDLUInt;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = &shape;
  tb_publish_options_init(&o);
  o.stream = s;
  o.metadata = meta;
  o.metadata_len = strlen(meta);
  TBG_OK(c, tb_publish(c, channel, &t, &o, &v));
  return v;
}

static int producer(struct tbt_chan *ch, void *arg) {
  const struct ring_args *a = arg;
  struct tbg_gpu g;
  tb_cu_deviceptr buf[RING], endbuf;
  uint64_t last[RING] = {0};
  unsigned waits = 0;
  char meta[32];

  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "ring-producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  for (int i = 0; i < RING; i++) {
    buf[i] = tbg_alloc(&g, N * 4ull);
    tbg_fill(&g, buf[i], EMPTY, N, s);
  }
  endbuf = tbg_alloc(&g, 4);
  tbg_fill(&g, endbuf, 0, 1, s);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  tbg_child_say(ch, "ready");
  tbg_child_hear(ch, "go", NULL, 0);

  uint64_t t0 = now_ns();
  for (unsigned f = 1; f <= FRAMES; f++) {
    unsigned slot = f % RING;
    sleep_until_ns(t0 + (uint64_t)(f - 1) * PERIOD_US * 1000ull);
    if (last[slot] != 0 && a->wait_free) {
      /* the version from this buffer left the history (depth 1) two
       * frames ago: wait until no lease holds it, with s made to wait on
       * the consumers' done events, before the fill overwrites it */
      TBG_OK(c, tb_wait_free(c, a->channel, last[slot], 30000, s));
      waits++;
    }
    tbg_fill(&g, buf[slot], f, N, s);
    snprintf(meta, sizeof meta, "%u", f);
    last[slot] = publish_meta(c, &g, a->channel, buf[slot], N, s, meta);
  }
  unsigned ms = (unsigned)((now_ns() - t0) / 1000000u);
  publish_meta(c, &g, a->channel, endbuf, 1, s, "end");
  tbg_child_say(ch, "published %u %u %u", FRAMES, waits, ms);
  tbg_child_hear(ch, "done", NULL, 0);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  tb_client_disconnect(c);
  return 0;
}

static int consumer(struct tbt_chan *ch, void *arg) {
  const struct ring_args *a = arg;
  static unsigned counts[FRAMES + 1];
  struct tbg_gpu g;
  tb_cu_event ev[2];
  uint64_t last = 0;
  unsigned read = 0, first_f = 0, last_f = 0;

  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "ring-consumer", TB_CONTRACT_SPEC);
  tb_cu_stream cs = tbg_stream(&g, 1); /* CU_STREAM_NON_BLOCKING */
  tb_cu_deviceptr cnt = tbg_alloc(&g, (FRAMES + 1) * 4ull);
  for (int i = 0; i < 2; i++)
    TBG_CU(g.cu->cuEventCreate(&ev[i], TB_CU_EVENT_DISABLE_TIMING));
  tbg_child_say(ch, "ready");

  for (;;) {
    DLManagedTensorVersioned *t = NULL;
    struct tb_lease_info info;
    char meta[32];
    TBG_OK(c, tbg_acquire(c, a->channel, TB_ACQUIRE_NEXT, last,
                          TB_STREAM_NO_SYNC, &t));
    TBG_OK(c, tb_lease_info(t, &info));
    if (info.version <= last)
      TBG_FAIL("acquire after %llu gave version %llu",
               (unsigned long long)last, (unsigned long long)info.version);
    last = info.version;
    size_t ml = info.metadata_len < sizeof meta - 1 ? info.metadata_len
                                                    : sizeof meta - 1;
    memcpy(meta, info.metadata, ml);
    meta[ml] = '\0';
    if (strcmp(meta, "end") == 0) {
      t->deleter(t);
      break;
    }
    char *endp;
    unsigned long f = strtoul(meta, &endp, 10);
    if (endp == meta || *endp != '\0' || f == 0 || f > FRAMES || f <= last_f)
      TBG_FAIL("bad frame metadata '%s' after frame %u", meta, last_f);
    if (read >= FRAMES)
      TBG_FAIL("read more frames than were produced");
    /* the consumer names its stream now: cs waits for the ready event,
     * and the lease remembers cs for its done event */
    TBG_OK(c, tb_lease_wait(t, cs));
    tbg_spin_count_us_async(&g, tbg_tensor_ptr(t, N), (unsigned)f, N,
                            SPIN_US, cnt + 4ull * read, cs);
    TBG_CU(g.cu->cuEventRecord(ev[read % 2], cs));
    t->deleter(t); /* the lease ends; the kernel above has not run yet */
    if (read > 0)
      TBG_CU(g.cu->cuEventSynchronize(ev[(read - 1) % 2]));
    if (read == 0)
      first_f = (unsigned)f;
    last_f = (unsigned)f;
    read++;
  }
  TBG_CU(g.cu->cuStreamSynchronize(cs));
  if (read > 0)
    TBG_CU(g.cu->cuMemcpyDtoH(counts, cnt, read * 4ull));
  unsigned wrong = 0, words = 0;
  for (unsigned i = 0; i < read; i++) {
    wrong += counts[i] != 0;
    words += counts[i];
  }
  fprintf(stderr, "consumer (%s): read %u frames (%u..%u), %u wrong "
          "(%u words)\n", a->channel, read, first_f, last_f, wrong, words);
  tbg_child_say(ch, "result %u %u", read, wrong);
  tb_client_disconnect(c);
  return 0;
}

struct ring_result {
  unsigned produced, waits, ms, read, wrong;
};

static void run_ring(const struct ring_args *a, struct ring_result *r) {
  struct tbt_child p, c;
  char line[100];
  tbg_start(&daemon_, &p, producer, (void *)a, &c, consumer, (void *)a);
  tbg_hear(&p, "producer", "ready", NULL, 0);
  tbg_hear(&c, "consumer", "ready", NULL, 0);
  tbg_say(&p, "go");
  tbg_hear(&p, "producer", "published", line, sizeof line);
  if (sscanf(line, "%u %u %u", &r->produced, &r->waits, &r->ms) != 3)
    fail_msg("producer said 'published %s'", line);
  tbg_hear(&c, "consumer", "result", line, sizeof line);
  if (sscanf(line, "%u %u", &r->read, &r->wrong) != 2)
    fail_msg("consumer said 'result %s'", line);
  tbg_say(&p, "done");
  tbg_reap(&c, "consumer");
  tbg_reap(&p, "producer");
  tbg_daemon_down(&daemon_);
  fprintf(stderr,
          "ring %s: produced %u frames in %u ms (%u wait_frees); consumer "
          "read %u, wrong %u\n",
          a->wait_free ? "with wait_free" : "WITHOUT wait_free (control)",
          r->produced, r->ms, r->waits, r->read, r->wrong);
}

static void ring_wait_free(void **state) {
  static const struct ring_args a = {1, "gpu/ring"};
  struct ring_result r;
  (void)state;
  run_ring(&a, &r);
  assert_true(r.produced >= 1000);
  if (r.read < MIN_READ)
    fail_msg("the consumer read only %u frames (want >= %u): it proves "
             "too little", r.read, MIN_READ);
  if (r.wrong != 0)
    fail_msg("%u of %u frames read held another frame's data: the "
             "producer rewrote buffers the consumer still read",
             r.wrong, r.read);
}

static void ring_without_wait_free_control(void **state) {
  static const struct ring_args a = {0, "gpu/ring-nowait"};
  struct ring_result r;
  (void)state;
  run_ring(&a, &r);
  if (r.read < MIN_READ)
    fail_msg("the consumer read only %u frames (want >= %u)", r.read,
             MIN_READ);
  if (r.wrong == 0)
    fail_msg("without wait_free no frame of %u read was overwritten: the "
             "consumer does not lag enough for the check to fire (raise "
             "SPIN_US)", r.read);
}

TBG_MAIN(cmocka_unit_test(ring_wait_free),
         cmocka_unit_test(ring_without_wait_free_control))
