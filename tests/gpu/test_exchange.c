/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: data equality across processes, two consumers on their own streams,
 * and devices named by UUID.
 *
 * A producer publishes three versions, each written by a slow kernel
 * (200 ms) into its own allocation; two consumers in other processes
 * acquire each version on their own non-blocking streams and count, on the
 * GPU, the words that differ from the expected value. They must find none:
 * the kernels run before the producer's finish unless the library made the
 * consumer's stream wait on the producer's event. The consumers also check
 * that the tensor's device is the local ordinal whose UUID is the
 * producer's device UUID. With two or more GPUs, the producer uses the last
 * one and a consumer that sees only that GPU (CUDA_VISIBLE_DEVICES) must
 * find it as its ordinal 0, while a consumer that sees only another GPU
 * gets TB_EDEVICE. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_common.h"

#define N (4u << 20) /* words: 16 MiB */
#define ROUNDS 3
#define SPIN_MS 200

static struct tbt_daemon daemon_;

static void hex16(const uint8_t u[16], char out[33]) {
  for (int i = 0; i < 16; i++)
    snprintf(out + 2 * i, 3, "%02x", u[i]);
}

struct prod_arg {
  int last_device; /* use the highest ordinal */
};

static int producer(struct tbt_chan *ch, void *arg) {
  const struct prod_arg *pa = arg;
  const struct tb_cuda *cu;
  struct tbg_gpu g;
  int count = 0;
  char uuid[33];

  if (tb__cuda_load(&cu) != 0)
    TBG_FAIL("no CUDA: %s", tb__cuda_why());
  TBG_CU(cu->cuDeviceGetCount(&count));
  tbg_gpu_init(&g, pa->last_device ? count - 1 : 0);
  hex16(g.uuid, uuid);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tbg_child_say(ch, "device %d %d %s", count, g.ordinal, uuid);
  for (unsigned r = 1; r <= ROUNDS; r++) {
    tb_cu_deviceptr p = tbg_alloc(&g, N * 4ull);
    tbg_fill(&g, p, 0, N, s);
    TBG_CU(cu->cuStreamSynchronize(s));
    tbg_spin_fill(&g, p, 0xC0DE0000u + r, N, SPIN_MS, s);
    uint64_t v = tbg_publish(c, &g, "gpu/exchange", p, N, s, ROUNDS);
    tbg_child_say(ch, "published %llu %u", (unsigned long long)v,
                  0xC0DE0000u + r);
    tbg_child_hear(ch, "next", NULL, 0);
  }
  tbg_child_hear(ch, "done", NULL, 0);
  tb_client_disconnect(c);
  return 0;
}

struct cons_arg {
  const char *visible; /* CUDA_VISIBLE_DEVICES, or NULL to leave it */
  int expect_edevice;
};

static int consumer(struct tbt_chan *ch, void *arg) {
  const struct cons_arg *ca = arg;
  struct tbg_gpu g;
  char line[200], want_uuid[33], got_uuid[33];

  if (ca->visible != NULL)
    setenv("CUDA_VISIBLE_DEVICES", ca->visible, 1);
  tbg_child_hear(ch, "uuid", want_uuid, sizeof want_uuid);
  if (ca->expect_edevice) {
    /* A GPU is visible (another one): the library loads, and must refuse
     * the tensor by its device UUID. */
    tbg_gpu_init(&g, 0);
    tb_client *c = tbg_connect(&daemon_, "blind", TB_CONTRACT_SPEC);
    DLManagedTensorVersioned *t = NULL;
    tbg_child_hear(ch, "v", line, sizeof line);
    unsigned long long ver = strtoull(line, NULL, 10);
    TBG_RC(c, tbg_acquire(c, "gpu/exchange", TB_ACQUIRE_EXACT, ver,
                          TB_STREAM_NO_SYNC, &t),
           TB_EDEVICE);
    tbg_child_say(ch, "ok");
    tb_client_disconnect(c);
    return 0;
  }
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  for (int r = 1; r <= ROUNDS; r++) {
    DLManagedTensorVersioned *t = NULL;
    tbg_child_hear(ch, "v", line, sizeof line);
    char *end;
    unsigned long long ver = strtoull(line, &end, 10);
    unsigned val = (unsigned)strtoul(end, NULL, 10);
    TBG_OK(c, tbg_acquire(c, "gpu/exchange", TB_ACQUIRE_EXACT, ver, s, &t));
    tb_cu_deviceptr p = tbg_tensor_ptr(t, N);
    /* the tensor's device is the local ordinal with the producer's UUID */
    tb_cu_device d;
    tb_cu_uuid u;
    TBG_CU(g.cu->cuDeviceGet(&d, t->dl_tensor.device.device_id));
    TBG_CU(g.cu->cuDeviceGetUuid(&u, d));
    hex16((const uint8_t *)u.bytes, got_uuid);
    if (strcmp(got_uuid, want_uuid) != 0)
      TBG_FAIL("tensor device %d has UUID %s, producer's is %s",
               t->dl_tensor.device.device_id, got_uuid, want_uuid);
    unsigned bad = tbg_count(&g, p, val, N, s);
    if (bad != 0)
      TBG_FAIL("version %llu: %u of %u words differ from 0x%x", ver, bad, N,
               val);
    TBG_OK(c, tb_release(t, s));
    tbg_child_say(ch, "ok");
  }
  tb_client_disconnect(c);
  return 0;
}

static void run(int last_device, int want_multi) {
  struct tbt_child p, c1, c2;
  struct prod_arg pa = {last_device};
  char line[200], uuid[33];
  int count = 0, ord = 0;

  tbg_daemon_up(&daemon_);
  tbg_spawn(&p, producer, &pa);
  tbg_hear(&p, "producer", "device", line, sizeof line);
  if (sscanf(line, "%d %d %32s", &count, &ord, uuid) != 3)
    fail_msg("bad device line '%s'", line);
  if (want_multi && count < 2) {
    tbg_say(&p, "next"); /* let it finish its rounds without consumers */
    tbt_child_kill(&p);
    tbt_daemon_cleanup(&daemon_);
    skip();
  }
  char vis[16];
  snprintf(vis, sizeof vis, "%d", ord);
  struct cons_arg a1 = {want_multi ? vis : NULL, 0};
  struct cons_arg a2 = {want_multi ? (ord == 0 ? "1" : "0") : NULL,
                        want_multi};
  tbg_spawn(&c1, consumer, &a1);
  tbg_spawn(&c2, consumer, &a2);
  tbg_say(&c1, "uuid %s", uuid);
  tbg_say(&c2, "uuid %s", uuid);
  for (int r = 1; r <= ROUNDS; r++) {
    tbg_hear(&p, "producer", "published", line, sizeof line);
    unsigned long long ver;
    unsigned val;
    if (sscanf(line, "%llu %u", &ver, &val) != 2)
      fail_msg("bad publish line '%s'", line);
    tbg_say(&c1, "v %llu %u", ver, val);
    if (!want_multi || r == 1)
      tbg_say(&c2, "v %llu %u", ver, val);
    tbg_hear(&c1, "consumer 1", "ok", NULL, 0);
    if (!want_multi || r == 1)
      tbg_hear(&c2, "consumer 2", "ok", NULL, 0);
    tbg_say(&p, "next");
  }
  tbg_say(&p, "done");
  tbg_reap(&c1, "consumer 1");
  tbg_reap(&c2, "consumer 2");
  tbg_reap(&p, "producer");
  tbg_daemon_down(&daemon_);
}

/* two consumers, own streams, correct data, device by UUID */
static void two_consumers(void **state) {
  (void)state;
  run(0, 0);
}

/* needs 2 GPUs: devices named by UUID under different CUDA_VISIBLE_DEVICES */
static void visible_devices(void **state) {
  (void)state;
  run(1, 1);
}

TBG_MAIN(cmocka_unit_test(two_consumers),
      cmocka_unit_test(visible_devices))
