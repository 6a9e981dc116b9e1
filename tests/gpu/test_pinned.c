/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: pinned host memory (TB_BUFFER_PINNED; docs/cuda.md, "Pinned host
 * memory") between two processes, and what it buys: host-to-device copy
 * bandwidth from the consumer's pinned mapping against a pageable copy of
 * the same bytes, in the same run.
 *
 * The producer creates a 256 MiB pinned buffer (its mapping registered,
 * tb_buffer_pinned 1), writes a byte pattern and publishes it. The consumer
 * acquires it: a kDLCUDAHost tensor (device 0) over its own read-only,
 * registered mapping, with the producer's bytes. It copies it to the GPU
 * with cuMemcpyHtoD (synchronous, best of REPS after a warm-up), then a
 * malloc'd copy of it the same way, checks the device bytes of both copies
 * against the pattern, and reports both rates. The pinned copy must be at
 * least 1.5 times as fast (the figures measured are in
 * docs/gpu-validation.md). A driver that cannot register a
 * read-only mapping (no CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_
 * SUPPORTED) fails the acquire with TB_ECUDA naming the kind: the test
 * fails then, printing it.
 *
 * pinned_gpu_reader: the consumer's GPU reads pinned pages later than the
 * release. A CPU producer writes RFRAMES frames through a ring of two
 * pinned slots (tb_ring_create_host, TB_BUFFER_PINNED); for each, the
 * consumer enqueues on a non-blocking stream a kernel that spins 50 ms and
 * then counts, reading the pinned pages in place, the words that are not
 * the frame's value, releases the lease on that stream at once, and lets
 * the producer go on. The producer's return to a slot (tb_ring_next, no
 * stream) must wait on the host for the done event of that release: every
 * count must be 0. Without the done event, the producer rewrites the slot
 * while the kernel still spins and the counts are not 0. */
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

#define SIZE ((size_t)256 << 20)
#define REPS 5
#define SEED 77
#define CH "gpu/pinned"

static struct tbt_daemon daemon_;

static int producer(struct tbt_chan *ch, void *arg) {
  struct tb_publish_options po;
  struct tbg_gpu g;
  tb_buffer *b = NULL;
  int64_t shape[1];
  DLTensor t;
  uint64_t v = 0;
  (void)arg;

  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  TBG_OK(c, tb_buffer_create_host(c, SIZE, TB_BUFFER_PINNED, &b));
  if (tb_buffer_pinned(b) != 1)
    TBG_FAIL("the producer's mapping is not pinned");
  tbt_fill(tb_buffer_data(b), SIZE, SEED);
  tbt_u8_tensor(&t, b, shape, (int64_t)SIZE);
  t.device.device_type = kDLCUDAHost;
  tb_publish_options_init(&po);
  TBG_OK(c, tb_publish(c, CH, &t, &po, &v));
  tbg_child_say(ch, "published %llu", (unsigned long long)v);
  tbg_child_hear(ch, "done", NULL, 0);
  TBG_OK(c, tb_buffer_destroy(b));
  tb_client_disconnect(c);
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Best of REPS synchronous copies of SIZE bytes from src to d, in GB/s
 * (after one warm-up copy). */
static double htod_rate(struct tbg_gpu *g, tb_cu_deviceptr d,
                        const void *src) {
  double best = 0;

  TBG_CU(g->cu->cuMemcpyHtoD(d, src, SIZE));
  for (int i = 0; i < REPS; i++) {
    double t0 = now_s(), dt;
    TBG_CU(g->cu->cuMemcpyHtoD(d, src, SIZE));
    dt = now_s() - t0;
    if (dt > 0 && (double)SIZE / dt / 1e9 > best)
      best = (double)SIZE / dt / 1e9;
  }
  return best;
}

/* The device bytes at d are the pattern. */
static void check_device(struct tbg_gpu *g, tb_cu_deviceptr d,
                         uint8_t *scratch, const char *what) {
  memset(scratch, 0, SIZE);
  TBG_CU(g->cu->cuMemcpyDtoH(scratch, d, SIZE));
  for (size_t i = 0; i < SIZE; i++)
    if (scratch[i] != tbt_pattern(i, SEED))
      TBG_FAIL("%s: device byte %zu is %u, expected %u", what, i, scratch[i],
               tbt_pattern(i, SEED));
}

static int consumer(struct tbt_chan *ch, void *arg) {
  struct tb_lease_info li;
  struct tbg_gpu g;
  DLManagedTensorVersioned *t = NULL;
  uint8_t *pageable, *scratch;
  double pinned_gbs, pageable_gbs;
  (void)arg;

  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  uint64_t v = tbg_child_hear_version(ch);
  TBG_OK(c, tbg_acquire(c, CH, TB_ACQUIRE_EXACT, v, NULL, &t));
  if (t->dl_tensor.device.device_type != kDLCUDAHost ||
      t->dl_tensor.device.device_id != 0)
    TBG_FAIL("the tensor is on device (%d, %d), not kDLCUDAHost 0",
             (int)t->dl_tensor.device.device_type,
             (int)t->dl_tensor.device.device_id);
  TBG_OK(c, tb_lease_get_info(t, sizeof(li), &li));
  if (li.memory_kind != TB_MEMORY_CUDA_HOST)
    TBG_FAIL("memory kind %d, not cuda-host", li.memory_kind);
  const uint8_t *src = t->dl_tensor.data;
  for (size_t i = 0; i < SIZE; i++)
    if (src[i] != tbt_pattern(i, SEED))
      TBG_FAIL("host byte %zu is %u, expected %u", i, src[i],
               tbt_pattern(i, SEED));

  pageable = malloc(SIZE);
  scratch = malloc(SIZE);
  if (pageable == NULL || scratch == NULL)
    TBG_FAIL("out of memory");
  memcpy(pageable, src, SIZE);
  tb_cu_deviceptr d = tbg_alloc(&g, SIZE);
  pinned_gbs = htod_rate(&g, d, src);
  check_device(&g, d, scratch, "from pinned broker memory");
  TBG_CU(g.cu->cuMemsetD32Async(d, 0, SIZE / 4, TB_CU_STREAM_LEGACY));
  pageable_gbs = htod_rate(&g, d, pageable);
  check_device(&g, d, scratch, "from pageable memory");
  fprintf(stderr, "consumer: H2D of %zu MiB: pinned broker memory %.1f "
          "GB/s, pageable %.1f GB/s (best of %d)\n", SIZE >> 20, pinned_gbs,
          pageable_gbs, REPS);
  if (pinned_gbs < 1.5 * pageable_gbs)
    TBG_FAIL("pinned (%.1f GB/s) is not faster than pageable (%.1f GB/s): "
             "the mapping is not pinned", pinned_gbs, pageable_gbs);
  TBG_CU(g.cu->cuMemFree(d));
  free(scratch);
  free(pageable);
  TBG_OK(c, tb_release(t, NULL));
  tbg_child_say(ch, "ok");
  tb_client_disconnect(c);
  return 0;
}

static void pinned_bandwidth(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_start(&daemon_, &p, producer, NULL, &c, consumer, NULL);
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_finish(&p, &c, &daemon_);
}

#define RSLOT ((size_t)4 << 20)
#define RFRAMES 6u
#define RCH "gpu/pinned-ring"

static int ring_producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  tb_ring *r = NULL;
  int64_t shape[1];
  DLTensor t;
  uint64_t v = 0;
  void *slot;
  (void)arg;

  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "ring-producer", TB_CONTRACT_SPEC);
  TBG_OK(c, tb_ring_create_host(c, RCH, RSLOT, 2, TB_BUFFER_PINNED, &r));
  for (unsigned f = 0; f < RFRAMES; f++) {
    /* the slot's last reader is done: the host waited for its GPU */
    TBG_OK(c, tb_ring_next(r, TBT_TIMEOUT_MS, NULL, &slot));
    uint32_t *w = slot;
    for (size_t i = 0; i < RSLOT / 4; i++)
      w[i] = f + 1;
    memset(&t, 0, sizeof(t));
    shape[0] = (int64_t)(RSLOT / 4);
    t.data = slot;
    t.device.device_type = kDLCUDAHost;
    t.ndim = 1;
    t.dtype = (DLDataType){kDLUInt, 32, 1};
    t.shape = shape;
    TBG_OK(c, tb_ring_publish(r, &t, NULL, &v));
    tbg_child_say(ch, "published %llu", (unsigned long long)v);
    tbg_child_hear(ch, "released", NULL, 0);
  }
  tbg_child_hear(ch, "done", NULL, 0);
  TBG_OK(c, tb_ring_destroy(r));
  tb_client_disconnect(c);
  return 0;
}

static int ring_consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  tb_cu_deviceptr cnt[RFRAMES];
  tb_cu_stream s;
  (void)arg;

  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "ring-consumer", TB_CONTRACT_SPEC);
  s = tbg_stream(&g, 1);
  for (unsigned f = 0; f < RFRAMES; f++)
    cnt[f] = tbg_alloc(&g, 4);
  for (unsigned f = 0; f < RFRAMES; f++) {
    DLManagedTensorVersioned *t = NULL;
    uint64_t v = tbg_child_hear_version(ch);
    TBG_OK(c, tbg_acquire(c, RCH, TB_ACQUIRE_EXACT, v, NULL, &t));
    if (t->dl_tensor.device.device_type != kDLCUDAHost)
      TBG_FAIL("frame %u is on device type %d, not kDLCUDAHost", f,
               (int)t->dl_tensor.device.device_type);
    /* registered pages: the kernel reads them in place, 50 ms from now */
    tbg_spin_count_async(&g, (tb_cu_deviceptr)(uintptr_t)t->dl_tensor.data,
                         f + 1, RSLOT / 4, 50, cnt[f], s);
    TBG_OK(c, tb_release(t, s));
    tbg_child_say(ch, "released");
  }
  for (unsigned f = 0; f < RFRAMES; f++) {
    unsigned bad = tbg_counter_read(&g, cnt[f], s);
    if (bad != 0)
      TBG_FAIL("frame %u: %u of %zu words were rewritten before the GPU "
               "read them", f, bad, RSLOT / 4);
  }
  fprintf(stderr, "consumer: %u frames read on the GPU after their "
          "release, none rewritten first\n", RFRAMES);
  tbg_child_say(ch, "ok");
  tb_client_disconnect(c);
  return 0;
}

static void pinned_gpu_reader(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_start(&daemon_, &p, ring_producer, NULL, &c, ring_consumer, NULL);
  for (unsigned f = 0; f < RFRAMES; f++) {
    tbg_relay(&p, "producer", "published", &c, "v");
    tbg_pass(&c, "consumer", "released", &p);
  }
  tbg_finish(&p, &c, &daemon_);
}

TBG_MAIN(cmocka_unit_test(pinned_bandwidth),
         cmocka_unit_test(pinned_gpu_reader))
