/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: cross-GPU exchange on one node (producer and consumer on different
 * GPUs). Needs 2 GPUs; exits 77 ("skipped: needs 2 GPUs") with fewer.
 *
 *  both_directions  GPU 0 -> GPU 1 and GPU 1 -> GPU 0: the consumer names
 *                   its device (opts.device), the tensor is mapped there by
 *                   peer access, a kernel on the consumer's GPU reads every
 *                   word correctly; the DLTensor keeps the memory's ordinal;
 *                   a stream of the wrong device is TB_ESTREAM, a device
 *                   out of range TB_EDEVICE.
 *  slow_producer    a 300 ms kernel on GPU 0 writes NEW and publishes at
 *                   once; the consumer's kernel on GPU 1 reads NEW only
 *                   because its stream waits for the IPC event: the same
 *                   read acquired with -1 is stale (so the test can fail).
 *  visible_devices  producer with CUDA_VISIBLE_DEVICES=a,b and consumer with
 *                   b,a: the consumer's tensor says its own ordinal 1, whose
 *                   UUID is the producer's ordinal 0's; both read it.
 *  consumer_kill    a consumer on GPU 1 SIGKILLed while its kernel reads the
 *                   GPU 0 tensor: the producer gets the version back.
 *  copy_flag        TB_ACQUIRE_COPY_TO_DEVICE: a writable IS_COPIED tensor on
 *                   GPU 1 with the right data (also after a slow producer:
 *                   the copy waits for the ready event), the lease ended at
 *                   once (the producer gets the version back while the copy
 *                   is held), and on the same device the flag changes
 *                   nothing (zero-copy).
 * The no-P2P error path cannot be produced on a machine whose GPUs reach
 * each other; its decision is tested in test_cuda_unit.c (xdev_plan). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_common.h"

#define N (4u << 20)
#define SPIN_MS 300
#define OLD 0x01D01D01u
#define NEW 0x0E30E30Eu

static struct tbt_daemon daemon_;
static char vis_ab[64], vis_ba[64]; /* CUDA_VISIBLE_DEVICES orderings */

/* ---- helpers ---- */

static int count_child(struct tbt_chan *ch, void *arg) {
  const struct tb_cuda *cu;
  int n = 0;
  (void)arg;
  if (tb__cuda_load(&cu) != 0 || cu->cuDeviceGetCount(&n) != 0)
    n = 0;
  tbt_send(ch->wr, "%d", n);
  return 0;
}

static void skip_without_two_gpus(void) {
  struct tbt_child c;
  char line[32] = "";
  tbg_skip_without_gpu();
  if (tbt_child_start(&c, count_child, NULL) != 0) {
    fprintf(stderr, "cannot fork the device-count probe\n");
    exit(1);
  }
  tbt_recv(c.rd, line, sizeof line, TBT_TIMEOUT_MS);
  tbt_child_wait(&c, TBT_TIMEOUT_MS);
  if (atoi(line) < 2) {
    printf("skipped: needs 2 GPUs (%s visible)\n", line);
    exit(77);
  }
}

/* Make g's context current (kernels and allocations go to its device). */
static void use(struct tbg_gpu *g) { TBG_CU(g->cu->cuCtxSetCurrent(g->ctx)); }

static void uuid_text(const uint8_t u[16], char *buf, size_t len) {
  snprintf(buf, len,
           "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x"
           "%02x",
           u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
           u[11], u[12], u[13], u[14], u[15]);
}

/* The device ordinal the driver says p lives on. */
static int ptr_device(struct tbg_gpu *g, tb_cu_deviceptr p) {
  int ord = -1;
  TBG_CU(g->cu->cuPointerGetAttribute(
      &ord, TB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
  return ord;
}

/* ---- both directions ---- */

struct dir {
  int src, dst;
  unsigned value;
  const char *channel;
};

static int dir_producer(struct tbt_chan *ch, void *arg) {
  const struct dir *d = arg;
  struct tbg_gpu g;
  tbg_gpu_init(&g, d->src);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr p = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, p, d->value, N, s);
  uint64_t v = tbg_publish(c, &g, d->channel, p, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v);
  tbg_child_hear(ch, "done", NULL, 0);
  tb_client_disconnect(c);
  return 0;
}

static int dir_consumer(struct tbt_chan *ch, void *arg) {
  const struct dir *d = arg;
  struct tbg_gpu gs, gd;
  DLManagedTensorVersioned *t = NULL;
  tbg_gpu_init(&gs, d->src);
  tb_cu_stream wrong = tbg_stream(&gs, 1);
  tbg_gpu_init(&gd, d->dst); /* the consumer's device is current */
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&gd, 1);
  uint64_t v = tbg_child_hear_version(ch);

  /* a stream of another device than opts.device */
  TBG_RC(c, tbg_acquire_on(c, d->channel, TB_ACQUIRE_EXACT, v, wrong, d->dst,
                           0, &t), TB_ESTREAM);
  /* a device this process does not have */
  TBG_RC(c, tbg_acquire_on(c, d->channel, TB_ACQUIRE_EXACT, v, s, 99, 0, &t),
         TB_EDEVICE);

  TBG_OK(c, tbg_acquire_on(c, d->channel, TB_ACQUIRE_EXACT, v, s, d->dst, 0,
                           &t));
  if (t->dl_tensor.device.device_id != d->src)
    TBG_FAIL("peer-mapped tensor says device %d; the memory is on %d",
             (int)t->dl_tensor.device.device_id, d->src);
  if (t->flags & TB_DLPACK_FLAG_BITMASK_IS_COPIED)
    TBG_FAIL("peer mapping flagged as a copy");
  tb_cu_deviceptr p = tbg_tensor_ptr(t, N);
  use(&gd);
  unsigned bad = tbg_count(&gd, p, d->value, N, s);
  if (bad != 0)
    TBG_FAIL("GPU %d read %u wrong words of GPU %d's tensor", d->dst, bad,
             d->src);
  /* a second acquire reuses the device's mapping: no IPC open */
  struct tb_cuda_counters before, after;
  DLManagedTensorVersioned *t2 = NULL;
  tb__cuda_counters(&before);
  TBG_OK(c, tbg_acquire_on(c, d->channel, TB_ACQUIRE_EXACT, v, s, d->dst, 0,
                           &t2));
  tb__cuda_counters(&after);
  if (after.ipc_open_mem != before.ipc_open_mem)
    TBG_FAIL("second acquire on device %d opened the handle again", d->dst);
  if (tbg_tensor_ptr(t2, N) != p)
    TBG_FAIL("second acquire mapped elsewhere");
  TBG_OK(c, tb_release(t2, s));
  TBG_OK(c, tb_release(t, s));
  tb_client_disconnect(c);
  fprintf(stderr, "GPU %d -> GPU %d: %u words read correctly by peer access\n",
          d->src, d->dst, N);
  tbg_child_say(ch, "ok");
  return 0;
}

static void both_directions(void **state) {
  static const struct dir dirs[2] = {{0, 1, 0xA0B1C2D3u, "xgpu/0to1"},
                                     {1, 0, 0x1F2E3D4Cu, "xgpu/1to0"}};
  (void)state;
  tbg_daemon_up(&daemon_);
  for (int i = 0; i < 2; i++) {
    struct tbt_child p, c;
    tbg_spawn(&p, dir_producer, (void *)&dirs[i]);
    tbg_spawn(&c, dir_consumer, (void *)&dirs[i]);
    tbg_relay(&p, "producer", "published", &c, "v");
    tbg_hear(&c, "consumer", "ok", NULL, 0);
    tbg_say(&p, "done");
    tbg_reap(&c, "consumer");
    tbg_reap(&p, "producer");
  }
  tbg_daemon_down(&daemon_);
}

/* ---- slow producer on GPU 0, consumer on GPU 1 ---- */

static const struct tbg_slow slow = {
    .daemon = &daemon_,
    .channel = "xgpu/slow",
    .n = N,
    .old_value = OLD,
    .new_value = NEW,
    .spin_ms = SPIN_MS,
    .producer_ordinal = 0,
    .consumer_ordinal = 1,
    .consumer_device = 1,
    .consumer_label = "GPU 1 reading GPU 0",
};

static void slow_producer(void **state) {
  (void)state;
  tbg_slow_run(&slow);
}

/* ---- CUDA_VISIBLE_DEVICES a,b against b,a ---- */

static int vis_producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  char u[40];
  (void)arg;
  setenv("CUDA_VISIBLE_DEVICES", vis_ab, 1); /* before CUDA loads */
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr p = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, p, 0x5EE5EE5Eu, N, s);
  uint64_t v = tbg_publish(c, &g, "xgpu/vis", p, N, s, 1);
  uuid_text(g.uuid, u, sizeof u);
  tbg_child_say(ch, "published %llu %s", (unsigned long long)v, u);
  tbg_child_hear(ch, "done", NULL, 0);
  tb_client_disconnect(c);
  return 0;
}

static int vis_consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g0, g1;
  char u[40];
  DLManagedTensorVersioned *t = NULL, *t0 = NULL;
  (void)arg;
  setenv("CUDA_VISIBLE_DEVICES", vis_ba, 1);
  tbg_gpu_init(&g0, 0);
  tbg_gpu_init(&g1, 1);
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream s1 = tbg_stream(&g1, 1);
  use(&g0);
  tb_cu_stream s0 = tbg_stream(&g0, 1);
  uint64_t v = tbg_child_hear_version(ch);
  /* default device (-1): where the memory is, by UUID: our ordinal 1 */
  use(&g1);
  TBG_OK(c, tbg_acquire_on(c, "xgpu/vis", TB_ACQUIRE_EXACT, v, s1, -1, 0,
                           &t));
  int id = t->dl_tensor.device.device_id;
  if (id != 1)
    TBG_FAIL("with CUDA_VISIBLE_DEVICES=%s the tensor says device %d; the "
             "producer's device 0 is our device 1", vis_ba, id);
  if (tbg_count(&g1, tbg_tensor_ptr(t, N), 0x5EE5EE5Eu, N, s1) != 0)
    TBG_FAIL("reading on our device 1 (the same GPU) is wrong");
  /* and from our device 0 (the other GPU) by peer access */
  use(&g0);
  TBG_OK(c, tbg_acquire_on(c, "xgpu/vis", TB_ACQUIRE_EXACT, v, s0, 0, 0,
                           &t0));
  if (t0->dl_tensor.device.device_id != 1)
    TBG_FAIL("peer-mapped tensor says device %d, not 1",
             (int)t0->dl_tensor.device.device_id);
  if (tbg_count(&g0, tbg_tensor_ptr(t0, N), 0x5EE5EE5Eu, N, s0) != 0)
    TBG_FAIL("reading on our device 0 by peer access is wrong");
  TBG_OK(c, tb_release(t0, s0));
  TBG_OK(c, tb_release(t, s1));
  uint8_t uu[16];
  tb_cu_device dev;
  tb_cu_uuid cu_u;
  TBG_CU(g1.cu->cuDeviceGet(&dev, id));
  TBG_CU(g1.cu->cuDeviceGetUuid(&cu_u, dev));
  memcpy(uu, cu_u.bytes, 16);
  uuid_text(uu, u, sizeof u);
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok %s", u);
  return 0;
}

static void visible_devices(void **state) {
  struct tbt_child p, c;
  char line[100], vline[40], puuid[48];
  unsigned long long v = 0;
  (void)state;
  tbg_daemon_up(&daemon_);
  tbg_spawn(&p, vis_producer, NULL);
  tbg_spawn(&c, vis_consumer, NULL);
  tbg_hear(&p, "producer", "published", line, sizeof line);
  assert_int_equal(sscanf(line, "%llu %47s", &v, puuid), 2);
  snprintf(vline, sizeof vline, "%llu", v);
  tbg_say(&c, "v %s", vline);
  tbg_hear(&c, "consumer", "ok", line, sizeof line);
  printf("producer (CUDA_VISIBLE_DEVICES=%s) device 0 = GPU-%s; consumer "
         "(CUDA_VISIBLE_DEVICES=%s) sees the tensor on its device 1 = GPU-%s\n",
         vis_ab, puuid, vis_ba, line);
  assert_string_equal(line, puuid);
  tbg_say(&p, "done");
  tbg_reap(&c, "consumer");
  tbg_reap(&p, "producer");
  tbg_daemon_down(&daemon_);
}

/* ---- consumer on GPU 1 SIGKILLed while reading GPU 0's tensor ---- */

static int kill_producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr a = tbg_alloc(&g, N * 4ull), b = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, a, 31, N, s);
  uint64_t v1 = tbg_publish(c, &g, "xgpu/kill", a, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v1);
  tbg_child_hear(ch, "next", NULL, 0);
  tbg_fill(&g, b, 32, N, s);
  (void)tbg_publish(c, &g, "xgpu/kill", b, N, s, 1);
  TBG_RC(c, tb_wait_free(c, "xgpu/kill", v1, 0, s), TB_EBUSY);
  tbg_child_say(ch, "busy");
  tbg_child_hear(ch, "killed", NULL, 0);
  TBG_OK(c, tb_wait_free(c, "xgpu/kill", v1, TBT_TIMEOUT_MS, s));
  tbg_fill(&g, a, 33, N, s);
  if (tbg_count(&g, a, 33, N, s) != 0)
    TBG_FAIL("cannot rewrite the freed buffer");
  tbg_child_say(ch, "free");
  tbg_child_hear(ch, "done", NULL, 0);
  tb_client_disconnect(c);
  return 0;
}

static int kill_consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  DLManagedTensorVersioned *t = NULL;
  (void)arg;
  tbg_gpu_init(&g, 1);
  tb_client *c = tbg_connect(&daemon_, "doomed", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  uint64_t v1 = tbg_child_hear_version(ch);
  TBG_OK(c, tbg_acquire_on(c, "xgpu/kill", TB_ACQUIRE_EXACT, v1, s, 1, 0,
                           &t));
  tb_cu_deviceptr cnt = tbg_alloc(&g, 4);
  tbg_spin_count_async(&g, tbg_tensor_ptr(t, N), 31, N, 2000, cnt, s);
  if (g.cu->cuStreamQuery(s) != TB_CUDA_ERROR_NOT_READY)
    TBG_FAIL("the 2 s reading kernel is not running any more");
  tbg_child_say(ch, "reading");
  tbg_child_hear(ch, "never", NULL, 0); /* killed here */
  return 3;
}

static void consumer_kill(void **state) {
  struct tbt_child p, k;
  (void)state;
  tbg_start(&daemon_, &p, kill_producer, NULL, &k, kill_consumer, NULL);
  tbg_relay(&p, "producer", "published", &k, "v");
  tbg_hear(&k, "doomed", "reading", NULL, 0);
  tbg_say(&p, "next");
  tbg_hear(&p, "producer", "busy", NULL, 0);
  kill(k.pid, SIGKILL);
  assert_int_equal(tbt_child_wait(&k, TBT_TIMEOUT_MS), 128 + SIGKILL);
  tbg_say(&p, "killed");
  tbg_hear(&p, "producer", "free", NULL, 0);
  tbg_say(&p, "done");
  tbg_reap(&p, "producer");
  tbg_daemon_down(&daemon_);
}

/* ---- TB_ACQUIRE_COPY_TO_DEVICE ---- */

static int copy_producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr a = tbg_alloc(&g, N * 4ull), b = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, a, OLD, N, s);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  tbg_child_hear(ch, "go", NULL, 0);
  /* slow: the copy is right only if it waited for this kernel */
  tbg_spin_fill(&g, a, NEW, N, SPIN_MS, s);
  uint64_t v1 = tbg_publish(c, &g, "xgpu/copy", a, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v1);
  tbg_child_hear(ch, "copied", NULL, 0);
  /* the copy's lease ended at acquire: once a newer version pushes v1 out
   * of the history, it is free although the consumer holds its copy */
  tbg_fill(&g, b, 7, N, s);
  (void)tbg_publish(c, &g, "xgpu/copy", b, N, s, 1);
  TBG_OK(c, tb_wait_free(c, "xgpu/copy", v1, TBT_TIMEOUT_MS, s));
  tbg_child_say(ch, "free");
  tbg_child_hear(ch, "done", NULL, 0);
  tb_client_disconnect(c);
  return 0;
}

static int copy_consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g0, g1;
  DLManagedTensorVersioned *t = NULL, *same = NULL;
  (void)arg;
  tbg_gpu_init(&g0, 0);
  tb_cu_stream s0 = tbg_stream(&g0, 1);
  tbg_gpu_init(&g1, 1);
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream s1 = tbg_stream(&g1, 1);
  tbg_child_say(ch, "ready");
  uint64_t v = tbg_child_hear_version(ch);
  TBG_OK(c, tbg_acquire_on(c, "xgpu/copy", TB_ACQUIRE_EXACT, v, s1, 1,
                           TB_ACQUIRE_COPY_TO_DEVICE, &t));
  if (!(t->flags & TB_DLPACK_FLAG_BITMASK_IS_COPIED))
    TBG_FAIL("copied tensor lacks TB_DLPACK_FLAG_BITMASK_IS_COPIED");
  if (t->flags & TB_DLPACK_FLAG_BITMASK_READ_ONLY)
    TBG_FAIL("the consumer's own copy is flagged read-only");
  if (t->dl_tensor.device.device_id != 1)
    TBG_FAIL("copy says device %d, not the consumer's 1",
             (int)t->dl_tensor.device.device_id);
  tb_cu_deviceptr p = tbg_tensor_ptr(t, N);
  if (ptr_device(&g1, p) != 1)
    TBG_FAIL("the copy's memory is on device %d, not 1", ptr_device(&g1, p));
  unsigned bad = tbg_count(&g1, p, NEW, N, s1);
  if (bad != 0)
    TBG_FAIL("%u words of the copy wrong (did the copy wait for the slow "
             "producer?)", bad);
  tbg_child_say(ch, "copied");
  tbg_child_hear(ch, "free", NULL, 0);
  /* the producer may now rewrite its memory; our copy is ours: write it */
  tbg_fill(&g1, p, 0xFEEDu, N, s1);
  if (tbg_count(&g1, p, 0xFEEDu, N, s1) != 0)
    TBG_FAIL("cannot write the copy");
  struct tb_lease_info li;
  TBG_OK(c, tb_lease_info(t, &li));
  TBG_OK(c, tb_lease_wait(t, s1));
  TBG_OK(c, tb_release(t, s1));

  /* the same device with the flag: zero-copy, the memory's own mapping */
  use(&g0);
  TBG_OK(c, tbg_acquire_on(c, "xgpu/copy", TB_ACQUIRE_LATEST, 0, s0, 0,
                           TB_ACQUIRE_COPY_TO_DEVICE, &same));
  if (same->flags & TB_DLPACK_FLAG_BITMASK_IS_COPIED)
    TBG_FAIL("same-device acquire with the copy flag copied");
  if (same->dl_tensor.device.device_id != 0 ||
      ptr_device(&g0, tbg_tensor_ptr(same, N)) != 0)
    TBG_FAIL("same-device acquire is not on device 0");
  if (tbg_count(&g0, tbg_tensor_ptr(same, N), 7, N, s0) != 0)
    TBG_FAIL("same-device acquire reads wrong");
  TBG_OK(c, tb_release(same, s0));
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void copy_flag(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_start(&daemon_, &p, copy_producer, NULL, &c, copy_consumer, NULL);
  tbg_ready_go(&p, &c);
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_pass(&c, "consumer", "copied", &p);
  tbg_pass(&p, "producer", "free", &c);
  tbg_finish(&p, &c, &daemon_);
}

/* The two orderings of the first two visible GPUs: "0,1"/"1,0", or those
 * of the CUDA_VISIBLE_DEVICES this test was started with. */
static void orderings(void) {
  const char *env = getenv("CUDA_VISIBLE_DEVICES");
  char a[24] = "0", b[24] = "1";
  if (env != NULL && *env != '\0') {
    const char *comma = strchr(env, ',');
    if (comma != NULL) {
      size_t la = (size_t)(comma - env);
      const char *rest = comma + 1;
      size_t lb = strcspn(rest, ",");
      if (la < sizeof a && lb < sizeof b && la > 0 && lb > 0) {
        memcpy(a, env, la);
        a[la] = '\0';
        memcpy(b, rest, lb);
        b[lb] = '\0';
      }
    }
  }
  snprintf(vis_ab, sizeof vis_ab, "%s,%s", a, b);
  snprintf(vis_ba, sizeof vis_ba, "%s,%s", b, a);
}

int main(void) {
  skip_without_two_gpus();
  orderings();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(both_directions), cmocka_unit_test(slow_producer),
      cmocka_unit_test(visible_devices), cmocka_unit_test(consumer_kill),
      cmocka_unit_test(copy_flag),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
