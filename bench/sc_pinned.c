/* SPDX-License-Identifier: Apache-2.0 */
/* Scenario 10: host-to-device copies from pinned broker memory
 * (TB_BUFFER_PINNED, kDLCUDAHost) against the same bytes in pageable
 * memory, in one consumer process (docs/benchmarks.md). A producer
 * publishes a 256 MiB pinned buffer; the consumer acquires it (its own
 * registered mapping) and times synchronous cuMemcpyHtoD of the whole
 * tensor to device memory, then of a malloc'd copy of it: the median of
 * repeated copies each, and the device bytes checked after each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "gpu.h"

#define PN_BYTES ((size_t)256 << 20)
#define PN_CH "bench/pinned"

struct pn_shared {
  double ms_pinned, ms_pageable; /* medians, one copy of PN_BYTES */
  int pinned_here;               /* the consumer's tensor was kDLCUDAHost */
};

struct pn_arg {
  const char *sock;
  int ready_wr;
  struct tbb_gate *gate;
  struct pn_shared *sh;
};

static int pn_producer(void *p) {
  struct pn_arg *a = p;
  struct tb_publish_options po;
  tb_client *c = NULL;
  tb_buffer *b = NULL;
  int ret = 2, rc;

  if (tbb_connect(a->sock, "bench-pinned-producer", TB_CONTRACT_SPEC, &c) < 0)
    goto out;
  rc = tb_buffer_create_host(c, PN_BYTES, TB_BUFFER_PINNED, &b);
  if (rc < 0) {
    char m[256];
    tb_client_last_error(c, m, sizeof(m));
    fprintf(stderr, "pinned producer: %s: %s\n", tb_strerror(rc), m);
    goto out;
  }
  for (size_t i = 0; i < PN_BYTES; i++)
    ((unsigned char *)tb_buffer_data(b))[i] = (unsigned char)(i * 7 + 1);
  int64_t shape[1] = {(int64_t)PN_BYTES};
  DLTensor t = {.data = tb_buffer_data(b), .device = {kDLCUDAHost, 0},
                .ndim = 1, .dtype = {kDLUInt, 8, 1}, .shape = shape};
  tb_publish_options_init(&po);
  if ((rc = tb_channel_publish(c, PN_CH, &t, &po, NULL)) < 0) {
    fprintf(stderr, "pinned producer: publish: %s\n", tb_strerror(rc));
    goto out;
  }
  tbb_write_byte(a->ready_wr, 'p');
  tbb_gate_wait(a->gate);
  ret = 0;
out:
  if (ret)
    tbb_write_byte(a->ready_wr, 'x');
  tb_buffer_destroy(b);
  tb_client_disconnect(c);
  return ret;
}

static int dbl_cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* Median ms of n synchronous copies of src to d, after one warm-up; then
 * the device bytes must be the producer's pattern. -1 on failure. */
static double pn_time(struct tbb_gpu *g, tb_cu_deviceptr d, const void *src,
                      unsigned char *scratch, int n) {
  double ms[32];
  tb_cu_result r;

  if (n > 32)
    n = 32;
  if ((r = g->cu->cuMemcpyHtoD(d, src, PN_BYTES)))
    return tbb_cu_fail(g, "cuMemcpyHtoD", r);
  for (int i = 0; i < n; i++) {
    uint64_t t0 = tbb_now_ns();
    if ((r = g->cu->cuMemcpyHtoD(d, src, PN_BYTES)))
      return tbb_cu_fail(g, "cuMemcpyHtoD", r);
    ms[i] = (double)(tbb_now_ns() - t0) / 1e6;
  }
  memset(scratch, 0, PN_BYTES);
  if ((r = g->cu->cuMemcpyDtoH(scratch, d, PN_BYTES)))
    return tbb_cu_fail(g, "cuMemcpyDtoH", r);
  for (size_t i = 0; i < PN_BYTES; i++)
    if (scratch[i] != (unsigned char)(i * 7 + 1)) {
      fprintf(stderr, "pinned consumer: device byte %zu wrong\n", i);
      return -1;
    }
  qsort(ms, (size_t)n, sizeof(ms[0]), dbl_cmp);
  return ms[n / 2];
}

static int pn_consumer(void *p) {
  struct pn_arg *a = p;
  struct tb_acquire_options o;
  struct tbb_gpu g;
  tb_client *c = NULL;
  DLManagedTensorVersioned *t = NULL;
  unsigned char *pageable = NULL, *scratch = NULL;
  tb_cu_deviceptr d = 0;
  int ret = 2, n = (int)tbb_scale(11, 5, 3);
  tb_cu_result r;

  if (tbb_gpu_init(&g) < 0)
    goto out;
  if (tbb_connect(a->sock, "bench-pinned-consumer", TB_CONTRACT_SPEC, &c) < 0)
    goto out;
  tb_acquire_options_init(&o);
  o.mode = TB_ACQUIRE_LATEST;
  o.timeout_ms = 20000;
  if (tb_lease_acquire(c, PN_CH, &o, &t) < 0) {
    char m[256];
    tb_client_last_error(c, m, sizeof(m));
    fprintf(stderr, "pinned consumer: acquire: %s\n", m);
    goto out;
  }
  a->sh->pinned_here = t->dl_tensor.device.device_type == kDLCUDAHost;
  pageable = malloc(PN_BYTES);
  scratch = malloc(PN_BYTES);
  if (pageable == NULL || scratch == NULL)
    goto out;
  memcpy(pageable, t->dl_tensor.data, PN_BYTES);
  if ((r = g.cu->cuMemAlloc(&d, PN_BYTES))) {
    tbb_cu_fail(&g, "cuMemAlloc", r);
    goto out;
  }
  a->sh->ms_pinned = pn_time(&g, d, t->dl_tensor.data, scratch, n);
  a->sh->ms_pageable = pn_time(&g, d, pageable, scratch, n);
  if (a->sh->ms_pinned > 0 && a->sh->ms_pageable > 0)
    ret = 0;
out:
  if (t != NULL)
    tb_lease_release(t, NULL);
  if (d)
    g.cu->cuMemFree(d);
  free(scratch);
  free(pageable);
  tb_client_disconnect(c);
  if (g.cu)
    tbb_gpu_fini(&g);
  return ret;
}

void tbb_scenario_pinned(void) {
  tbb_section("10", "H2D from pinned broker memory, 256 MiB",
              "a TB_BUFFER_PINNED buffer (cuMemHostRegister in each process) "
              "acquired as kDLCUDAHost; synchronous cuMemcpyHtoD of the whole "
              "tensor vs of a malloc'd copy of it, median of repeated copies, "
              "device bytes checked");
  if (tbb_opt.host_only || !tbb_gpu_present()) {
    tbb_skip("no GPU");
    return;
  }
  struct tbb_daemon d;
  if (tbb_daemon_start(&d, NULL) < 0) {
    tbb_failed("daemon did not start");
    return;
  }
  struct pn_shared *sh = tbb_shared_alloc(sizeof(*sh));
  struct tbb_gate gate;
  int ready[2];
  if (sh == NULL || tbb_gate_init(&gate) < 0 || tbb_pipe(ready) < 0) {
    tbb_failed("setup");
    goto out;
  }
  struct pn_arg a = {.sock = d.sock, .ready_wr = ready[1], .gate = &gate,
                     .sh = sh};
  pid_t pp = tbb_spawn(pn_producer, &a);
  close(ready[1]);
  char b = 'x';
  tbb_read_byte(ready[0], &b);
  close(ready[0]);
  int ok = b == 'p' && tbb_reap(tbb_spawn(pn_consumer, &a)) == 0;
  tbb_gate_open(&gate);
  if (tbb_reap(pp) != 0)
    ok = 0;
  tbb_gate_close(&gate);
  if (!ok) {
    tbb_failed("pinned run");
    goto out;
  }
  const char *keys[] = {"ms", "GB_per_s", "speedup"};
  double gb = (double)PN_BYTES / 1e9;
  double v1[] = {sh->ms_pinned, gb / (sh->ms_pinned / 1e3),
                 sh->ms_pageable / sh->ms_pinned};
  double v2[] = {sh->ms_pageable, gb / (sh->ms_pageable / 1e3), 1.0};
  tbb_row_values("H2D from pinned broker memory (acquired)", 3, keys, v1);
  tbb_row_values("H2D from pageable memory (malloc copy)", 3, keys, v2);
  if (!sh->pinned_here)
    tbb_note("the consumer's tensor was kDLCPU: its mapping is not pinned");
out:
  if (sh != NULL)
    tbb_shared_free(sh, sizeof(*sh));
  tbb_daemon_stop(&d);
}
