/* SPDX-License-Identifier: Apache-2.0 */
/* Scenario 9: a consumer's cold open of a CUDA VMM buffer against a legacy
 * IPC buffer of the same size. A producer process publishes a 64 MiB
 * tensor from each (a tb_buffer_create_cuda buffer, and a cuMemAlloc'ed
 * allocation), both finished at publish so that no event is opened; the
 * consumer then, each iteration, connects a new client and times its first
 * acquire of each channel: the round trip to the daemon plus, for legacy
 * IPC, cuIpcOpenMemHandle, and for VMM, receiving the descriptor and
 * cuMemImportFromShareableHandle + reserve + map + set access. The
 * figures measured are in docs/benchmarks.md. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "gpu.h"

#define VMM_BYTES (64u << 20)

struct vmm_shared {
  char sock[128];
  int iters;
  int ready[2], stop[2];
  int failed;
  uint64_t ipc_ns[1000], vmm_ns[1000];
};

static int publish_dev(tb_client *c, const char *ch, tb_cu_deviceptr p) {
  struct tb_publish_options o;
  int64_t shape = VMM_BYTES / 4;
  DLTensor t;

  memset(&t, 0, sizeof(t));
  t.data = (void *)(uintptr_t)p;
  t.device.device_type = kDLCUDA;
  t.ndim = 1;
  t.shape = &shape;
  t.dtype.code = kDLUInt;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  tb_publish_options_init(&o);
  o.stream = (void *)(uintptr_t)1; /* the legacy stream, idle: complete */
  return tb_channel_publish(c, ch, &t, &o, NULL);
}

static int vmm_producer(void *arg) {
  struct vmm_shared *sh = arg;
  struct tbb_gpu g;
  tb_client *c = NULL;
  tb_buffer *b = NULL;
  tb_cu_deviceptr p = 0;
  char x;
  int ret = 1;

  if (tbb_gpu_init(&g) < 0)
    return 2;
  if (tbb_connect(sh->sock, "bench-vmm-producer", TB_CONTRACT_SPEC, &c) < 0)
    goto out;
  if (g.cu->cuMemAlloc(&p, VMM_BYTES) != 0 ||
      tb_buffer_create_cuda(c, VMM_BYTES, 0, 0, &b) < 0 ||
      g.cu->cuCtxSynchronize() != 0 ||
      publish_dev(c, "bench/ipc", p) < 0 ||
      publish_dev(c, "bench/vmm",
                  (tb_cu_deviceptr)(uintptr_t)tb_buffer_data(b)) < 0) {
    char why[256];
    tb_client_last_error(c, why, sizeof(why));
    fprintf(stderr, "vmm producer: %s\n", why);
    goto out;
  }
  tbb_write_byte(sh->ready[1], 'r');
  tbb_read_byte(sh->stop[0], &x);
  ret = 0;
out:
  tbb_write_byte(sh->ready[1], ret ? 'f' : 'd');
  if (b != NULL)
    tb_buffer_destroy(b);
  tb_client_disconnect(c);
  if (p != 0)
    g.cu->cuMemFree(p);
  tbb_gpu_fini(&g);
  return ret;
}

/* A new client's first acquire of ch, timed; its release and disconnect
 * (which unmaps) are not. */
static int cold_acquire(struct vmm_shared *sh, const char *ch, uint64_t *ns) {
  struct tb_connect_options co;
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;
  tb_client *c = NULL;
  uint64_t t0;
  int rc;

  tbb_connect_options(&co, sh->sock, "bench-vmm-consumer", TB_CONTRACT_SPEC);
  co.no_prefetch = 1;
  rc = tb_client_connect(&co, &c);
  if (rc < 0)
    return rc;
  tb_acquire_options_init(&o);
  o.timeout_ms = 10000;
  o.stream = (void *)(uintptr_t)1;
  t0 = tbb_now_ns();
  rc = tb_lease_acquire(c, ch, &o, &t);
  *ns = tbb_now_ns() - t0;
  if (rc == 0)
    rc = tb_lease_release(t, (void *)(uintptr_t)1);
  tb_client_disconnect(c);
  return rc;
}

static int vmm_consumer(void *arg) {
  struct vmm_shared *sh = arg;
  struct tbb_gpu g;

  if (tbb_gpu_init(&g) < 0)
    return 2;
  for (int i = 0; i < sh->iters; i++)
    if (cold_acquire(sh, "bench/ipc", &sh->ipc_ns[i]) < 0 ||
        cold_acquire(sh, "bench/vmm", &sh->vmm_ns[i]) < 0) {
      sh->failed = 1;
      break;
    }
  tbb_gpu_fini(&g);
  return sh->failed;
}

void tbb_scenario_vmm_import(void) {
  struct vmm_shared *sh;
  struct tbb_daemon d;
  pid_t prod, cons;
  char x = 0;

  tbb_section("9", "Cold open: CUDA VMM buffer vs legacy IPC, 64 MiB",
              "a new client's first acquire of a version finished at "
              "publish: legacy IPC (cuIpcOpenMemHandle) vs a VMM buffer "
              "(descriptor by SCM_RIGHTS, cuMemImportFromShareableHandle, "
              "reserve, map, set access); unpinned");
  if (tbb_opt.host_only || !tbb_gpu_present()) {
    tbb_skip("no GPU");
    return;
  }
  sh = tbb_shared_alloc(sizeof(*sh));
  sh->iters = (int)tbb_scale(1000, 200, 20);
  if (tbb_daemon_start(&d, NULL) < 0) {
    tbb_failed("daemon did not start");
    tbb_shared_free(sh, sizeof(*sh));
    return;
  }
  snprintf(sh->sock, sizeof(sh->sock), "%s", d.sock);
  if (tbb_pipe(sh->ready) < 0 || tbb_pipe(sh->stop) < 0) {
    tbb_failed("pipe");
    goto out_daemon;
  }
  prod = tbb_spawn(vmm_producer, sh);
  if (tbb_read_byte(sh->ready[0], &x) < 0 || x != 'r') {
    tbb_failed("the VMM producer did not publish");
    tbb_reap(prod);
    goto out_daemon;
  }
  cons = tbb_spawn(vmm_consumer, sh);
  if (tbb_reap(cons) != 0) {
    tbb_failed("the cold-open consumer failed");
  } else {
    tbb_row_latency("legacy IPC: new client's first acquire", sh->ipc_ns,
                    (size_t)sh->iters, NULL);
    tbb_row_latency("VMM buffer: new client's first acquire", sh->vmm_ns,
                    (size_t)sh->iters,
                    "legacy IPC: new client's first acquire");
  }
  tbb_write_byte(sh->stop[1], 's');
  tbb_reap(prod);
out_daemon:
  tbb_daemon_stop(&d);
  tbb_shared_free(sh, sizeof(*sh));
}
