/* SPDX-License-Identifier: Apache-2.0 */
/* Scenarios 4 (GPU hand-off) and 5 (zero copy), and the CUDA helpers.
 *
 * Every CUDA user is a forked child that initialises the driver itself; the
 * parent never does (CUDA does not survive fork). The raw baselines use the
 * driver API through the project's table (client/cuda/driver.h) and skip the
 * daemon: handles go over a socketpair once, then readiness is an IPC event
 * recorded by the producer and waited on by the consumer, with a 64-byte
 * message through the socket each way. */
#include "bench.h"
#include "stats.h" /* tb__acquire_counters */
#include "gpu.h"
#include "kernels_ptx.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef TBB_SOURCE_DIR
#define TBB_SOURCE_DIR "."
#endif

#define HANDOFF_BYTES ((size_t)4 << 20)
#define COLD_BYTES ((size_t)64 << 20)
#define ZC_BYTES ((size_t)1 << 30)

/* ---- helpers ---- */

int tbb_cu_fail(const struct tbb_gpu *g, const char *what, tb_cu_result r) {
  const char *name = "?";
  if (g && g->cu)
    g->cu->cuGetErrorName(r, &name);
  fprintf(stderr, "tb-bench: %s: %s (%d)\n", what, name ? name : "?", r);
  return -1;
}

int tbb_gpu_init(struct tbb_gpu *g) {
  memset(g, 0, sizeof(*g));
  int rc = tb__cuda_load(&g->cu);
  if (rc < 0) {
    fprintf(stderr, "tb-bench: CUDA: %s\n", tb__cuda_why());
    g->cu = NULL;
    return -1;
  }
  tb_cu_result r;
  if ((r = g->cu->cuDeviceGet(&g->dev, 0)) ||
      (r = g->cu->cuDevicePrimaryCtxRetain(&g->ctx, g->dev)) ||
      (r = g->cu->cuCtxSetCurrent(g->ctx)) ||
      (r = g->cu->cuStreamCreate(&g->stream, 0x1 /* NON_BLOCKING */)))
    return tbb_cu_fail(g, "CUDA context/stream", r);
  /* Calls the project's table does not carry. The library is already
   * loaded; this only takes another reference. */
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib) {
    *(void **)&g->memAllocHost = dlsym(lib, "cuMemAllocHost_v2");
    *(void **)&g->memFreeHost = dlsym(lib, "cuMemFreeHost");
    *(void **)&g->memcpyHtoDAsync = dlsym(lib, "cuMemcpyHtoDAsync_v2");
    *(void **)&g->memcpyDtoHAsync = dlsym(lib, "cuMemcpyDtoHAsync_v2");
    *(void **)&g->eventElapsedTime = dlsym(lib, "cuEventElapsedTime");
    if (!g->eventElapsedTime)
      *(void **)&g->eventElapsedTime = dlsym(lib, "cuEventElapsedTime_v2");
  }
  return 0;
}

void tbb_gpu_fini(struct tbb_gpu *g) {
  if (!g->cu)
    return;
  if (g->stream) {
    g->cu->cuStreamSynchronize(g->stream);
    g->cu->cuStreamDestroy(g->stream);
  }
  if (g->ctx)
    g->cu->cuDevicePrimaryCtxRelease(g->dev);
  g->cu = NULL;
}

static int send_all(int fd, const void *b, size_t n) {
  return send(fd, b, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}
static int recv_some(int fd, void *b, size_t n) {
  return recv(fd, b, n, 0) > 0 ? 0 : -1;
}

/* ---- scenario 4: shared state ---- */

struct gpu_shared {
  long iters, warm;
  uint64_t rt[200000];     /* producer-side round trips */
  uint64_t oneway[200000]; /* consumer-side publish → data ready */
  /* raw new handles: reading a datagram that is already waiting, just
   * before the opens and just after them */
  uint64_t read_before[1024], read_after[1024];
  /* raw same handles: the memory open and the event open, each round */
  uint64_t open_mem_ns[1024], open_event_ns[1024];
  unsigned long opens_mem, opens_event; /* consumer's cold-open counters */
  /* consumer's driver time over the counted acquires (tb__cuda_counters) */
  unsigned long waits, counted;
  unsigned long long ns_open_mem, ns_open_event, ns_wait;
  unsigned long long ns_rt; /* acquires' daemon round trips */
  unsigned long long ns_after, ns_prefetch, ns_send; /* tb_acquire_counters */
  unsigned long long ns_reply, empty_reads, blocking;
  /* cold rows: the IPC opens (memory + event) inside each timed acquire,
   * from the driver counters read just outside its timed window */
  uint64_t opens_in[1024];
  uint64_t rt_in[1024]; /* the same acquires' times (rt[] gets sorted) */
  uint64_t connect_ns[1024]; /* new-client row: each client's connect */
  unsigned long records, creates; /* consumer's cuEventRecord/Create calls */
  unsigned long long ns_record, ns_create;
  unsigned long prod_records; /* producer's cuEventRecord calls, warm rows */
  unsigned long skipped_waits; /* raw, producer idle: rounds without a wait */
  int releasing; /* warm tb consumer: release with the next acquire */
};

/* The consumer's driver counters and its acquires' daemon round trips. */
struct counts {
  struct tb_cuda_counters k;
  struct tb_acquire_counters a;
};

static void counts_now(struct counts *c) {
  tb__cuda_counters(&c->k);
  tb__acquire_counters(&c->a);
}

/* Nanoseconds in cuIpcOpenMemHandle + cuIpcOpenEventHandle between two
 * readings of the counters. */
static uint64_t opens_between(const struct tb_cuda_counters *a,
                              const struct tb_cuda_counters *b) {
  return (b->ipc_open_mem_ns - a->ipc_open_mem_ns) +
         (b->ipc_open_event_ns - a->ipc_open_event_ns);
}

/* The consumer's counters over [c0, c1] for n acquires. */
static void note_counters(struct gpu_shared *sh, const struct counts *c0,
                          const struct counts *c1, long n) {
  const struct tb_cuda_counters *k0 = &c0->k, *k1 = &c1->k;
  sh->ns_rt = c1->a.wait_ns - c0->a.wait_ns;
  sh->ns_after = c1->a.after_ns - c0->a.after_ns;
  sh->ns_prefetch = c1->a.prefetch_ns - c0->a.prefetch_ns;
  sh->ns_send = c1->a.send_ns - c0->a.send_ns;
  sh->ns_reply = c1->a.reply_ns - c0->a.reply_ns;
  sh->empty_reads = c1->a.empty_reads - c0->a.empty_reads;
  sh->blocking = c1->a.blocking - c0->a.blocking;
  sh->opens_mem = k1->ipc_open_mem - k0->ipc_open_mem;
  sh->opens_event = k1->ipc_open_event - k0->ipc_open_event;
  sh->waits = k1->stream_wait - k0->stream_wait;
  sh->ns_open_mem = k1->ipc_open_mem_ns - k0->ipc_open_mem_ns;
  sh->ns_open_event = k1->ipc_open_event_ns - k0->ipc_open_event_ns;
  sh->ns_wait = k1->stream_wait_ns - k0->stream_wait_ns;
  sh->records = k1->event_record - k0->event_record;
  sh->creates = k1->event_create - k0->event_create;
  sh->ns_record = k1->event_record_ns - k0->event_record_ns;
  sh->ns_create = k1->event_create_ns - k0->event_create_ns;
  sh->counted = (unsigned long)n;
}

struct h_arg {
  const char *sock;
  int sv;           /* raw: socket; tb: ack pipe end */
  int ready_wr;
  struct tbb_gate *gate;
  struct gpu_shared *sh;
  size_t bytes;
  int cold;         /* 0 warm; 1 new client (raw: the same handles opened
                       again); 2 new buffer (raw: new handles each round);
                       tb only: 3 new buffer, subscribed; 4 new client
                       with no_prefetch (its done event registered by
                       its acquire, not by its connect); 5 new client
                       naming the channel at connect (its buffer comes
                       with the connect, opened by the acquire while the
                       daemon answers) */
  int idle;         /* warm: the producer's write is finished before timing
                       starts, as in the torch.multiprocessing baseline;
                       raw 2: the producer checks its stream is idle
                       (cuStreamQuery) and the consumer then skips the
                       event wait, as tensorbroker does */
  int go_rd, go_wr; /* cold 2: producer -> consumer, "published" */
};

/* raw producer: handles once, then record + message, wait for the ack. */
static int raw_producer(void *p) {
  struct h_arg *a = p;
  struct tbb_gpu g;
  tb_cu_deviceptr d = 0;
  tb_cu_event ev = NULL;
  tb_cu_result r;
  if (tbb_gpu_init(&g) < 0)
    return 2;
  struct {
    tb_cu_ipc_mem_handle m;
    tb_cu_ipc_event_handle e;
  } h;
  if ((r = g.cu->cuMemAlloc(&d, a->bytes)) ||
      (r = g.cu->cuMemsetD32Async(d, 1, a->bytes / 4, g.stream)) ||
      (r = g.cu->cuEventCreate(&ev, TB_CU_EVENT_INTERPROCESS |
                                        TB_CU_EVENT_DISABLE_TIMING)) ||
      (r = g.cu->cuIpcGetMemHandle(&h.m, d)) ||
      (r = g.cu->cuIpcGetEventHandle(&h.e, ev)))
    return tbb_cu_fail(&g, "raw producer setup", r) ? 3 : 3;
  g.cu->cuStreamSynchronize(g.stream);
  if (send_all(a->sv, &h, sizeof(h)) < 0)
    return 4;
  char msg[64] = {0};
  if (a->cold == 2) {
    /* each round a new allocation and a new event, exported, opened once */
    long n = a->sh->warm + a->sh->iters;
    tb_cu_deviceptr *bufs = calloc((size_t)n, sizeof(*bufs));
    tb_cu_event *evs = calloc((size_t)n, sizeof(*evs));
    long made = 0;
    int bad = bufs == NULL || evs == NULL;
    for (long i = 0; i < n && !bad; i++) {
      if ((r = g.cu->cuMemAlloc(&bufs[i], a->bytes)) ||
          (r = g.cu->cuEventCreate(&evs[i], TB_CU_EVENT_INTERPROCESS |
                                                TB_CU_EVENT_DISABLE_TIMING))) {
        tbb_cu_fail(&g, "raw producer new buffer", r);
        bad = 1;
        break;
      }
      made = i + 1;
      if ((r = g.cu->cuMemsetD32Async(bufs[i], 1, a->bytes / 4, g.stream)) ||
          (r = g.cu->cuEventRecord(evs[i], g.stream)) ||
          (r = g.cu->cuIpcGetMemHandle(&h.m, bufs[i])) ||
          (r = g.cu->cuIpcGetEventHandle(&h.e, evs[i]))) {
        tbb_cu_fail(&g, "raw producer export", r);
        bad = 1;
        break;
      }
      /* the handles, then two 64 B datagrams that the consumer reads
       * just before and just after its opens */
      if (send_all(a->sv, &h, sizeof(h)) < 0 ||
          send_all(a->sv, msg, sizeof(msg)) < 0 ||
          send_all(a->sv, msg, sizeof(msg)) < 0 ||
          recv_some(a->sv, msg, sizeof(msg)) < 0)
        bad = 1;
    }
    if (!bad) /* the consumer has closed everything */
      recv_some(a->sv, msg, sizeof(msg));
    g.cu->cuStreamSynchronize(g.stream);
    for (long i = 0; i < made; i++) {
      g.cu->cuEventDestroy(evs[i]);
      g.cu->cuMemFree(bufs[i]);
    }
    free(bufs);
    free(evs);
    if (bad)
      return 5;
  } else if (a->cold) { /* the consumer opens and closes; wait for its "done" */
    recv_some(a->sv, msg, sizeof(msg));
  } else {
    for (long i = 0; i < a->sh->warm + a->sh->iters; i++) {
      uint64_t t0 = tbb_now_ns();
      g.cu->cuMemsetD32Async(d, (unsigned)i, 16, g.stream);
      if (a->idle) {
        g.cu->cuStreamSynchronize(g.stream);
        t0 = tbb_now_ns();
      }
      /* msg[8]: 1 = the stream was idle, nothing to wait for */
      msg[8] = a->idle == 2 && g.cu->cuStreamQuery(g.stream) == 0;
      if (!msg[8])
        g.cu->cuEventRecord(ev, g.stream);
      memcpy(msg, &t0, sizeof(t0));
      if (send_all(a->sv, msg, sizeof(msg)) < 0 ||
          recv_some(a->sv, msg, sizeof(msg)) < 0)
        return 5;
      if (i >= a->sh->warm)
        a->sh->rt[i - a->sh->warm] = tbb_now_ns() - t0;
    }
  }
  g.cu->cuStreamSynchronize(g.stream);
  g.cu->cuEventDestroy(ev);
  g.cu->cuMemFree(d);
  tbb_gpu_fini(&g);
  return 0;
}

static int raw_consumer(void *p) {
  struct h_arg *a = p;
  struct tbb_gpu g;
  tb_cu_result r;
  if (tbb_gpu_init(&g) < 0)
    return 2;
  struct {
    tb_cu_ipc_mem_handle m;
    tb_cu_ipc_event_handle e;
  } h;
  if (recv(a->sv, &h, sizeof(h), 0) != (ssize_t)sizeof(h))
    return 3;
  tb_cu_deviceptr d;
  tb_cu_event ev;
  char msg[64] = {0};
  if (a->cold == 2) {
    long n = a->sh->warm + a->sh->iters, got = 0;
    tb_cu_deviceptr *ds = calloc((size_t)n, sizeof(*ds));
    tb_cu_event *es = calloc((size_t)n, sizeof(*es));
    int ret = ds == NULL || es == NULL ? 4 : 0;
    for (long i = 0; i < n && ret == 0; i++) {
      if (recv(a->sv, &h, sizeof(h), 0) != (ssize_t)sizeof(h)) {
        ret = 3;
        break;
      }
      uint64_t tr = tbb_now_ns();
      if (recv(a->sv, msg, sizeof(msg), 0) != (ssize_t)sizeof(msg)) {
        ret = 3;
        break;
      }
      uint64_t t0 = tbb_now_ns();
      if ((r = g.cu->cuIpcOpenMemHandle(&ds[i], h.m,
                                        TB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))) {
        ret = tbb_cu_fail(&g, "raw cold open (new handles)", r) ? 4 : 4;
        break;
      }
      if ((r = g.cu->cuIpcOpenEventHandle(&es[i], h.e))) {
        g.cu->cuIpcCloseMemHandle(ds[i]);
        ret = tbb_cu_fail(&g, "raw cold open (new handles)", r) ? 4 : 4;
        break;
      }
      uint64_t t1 = tbb_now_ns();
      got = i + 1;
      if (recv(a->sv, msg, sizeof(msg), 0) != (ssize_t)sizeof(msg)) {
        ret = 3;
        break;
      }
      uint64_t t2 = tbb_now_ns();
      if (i >= a->sh->warm) {
        long j = i - a->sh->warm;
        a->sh->rt[j] = t1 - t0;
        if (j < 1024) {
          a->sh->read_before[j] = t0 - tr;
          a->sh->read_after[j] = t2 - t1;
        }
      }
      if (send_all(a->sv, msg, sizeof(msg)) < 0)
        ret = 5;
    }
    for (long i = 0; i < got; i++) {
      g.cu->cuIpcCloseMemHandle(ds[i]);
      g.cu->cuEventDestroy(es[i]);
    }
    free(ds);
    free(es);
    send_all(a->sv, msg, sizeof(msg)); /* closed: the producer may free */
    tbb_gpu_fini(&g);
    return ret;
  }
  if (a->cold) {
    for (long i = 0; i < a->sh->warm + a->sh->iters; i++) {
      uint64_t t0 = tbb_now_ns(), tm;
      if ((r = g.cu->cuIpcOpenMemHandle(&d, h.m,
                                        TB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)))
        return tbb_cu_fail(&g, "raw cold open", r) ? 4 : 4;
      tm = tbb_now_ns();
      if ((r = g.cu->cuIpcOpenEventHandle(&ev, h.e)))
        return tbb_cu_fail(&g, "raw cold open", r) ? 4 : 4;
      uint64_t t1 = tbb_now_ns();
      g.cu->cuIpcCloseMemHandle(d);
      g.cu->cuEventDestroy(ev);
      if (i >= a->sh->warm) {
        long k = i - a->sh->warm;
        a->sh->rt[k] = t1 - t0;
        if (k < 1024) {
          a->sh->open_mem_ns[k] = tm - t0;
          a->sh->open_event_ns[k] = t1 - tm;
        }
      }
    }
    send_all(a->sv, msg, sizeof(msg));
  } else {
    if ((r = g.cu->cuIpcOpenMemHandle(&d, h.m,
                                      TB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) ||
        (r = g.cu->cuIpcOpenEventHandle(&ev, h.e)))
      return tbb_cu_fail(&g, "raw open", r) ? 4 : 4;
    a->sh->skipped_waits = 0;
    for (long i = 0; i < a->sh->warm + a->sh->iters; i++) {
      if (recv_some(a->sv, msg, sizeof(msg)) < 0)
        return 5;
      if (msg[8])
        a->sh->skipped_waits++;
      else
        g.cu->cuStreamWaitEvent(g.stream, ev, 0);
      g.cu->cuStreamSynchronize(g.stream);
      uint64_t t0;
      memcpy(&t0, msg, sizeof(t0));
      if (i >= a->sh->warm)
        a->sh->oneway[i - a->sh->warm] = tbb_now_ns() - t0;
      if (send_all(a->sv, msg, sizeof(msg)) < 0)
        return 6;
    }
    g.cu->cuIpcCloseMemHandle(d);
    g.cu->cuEventDestroy(ev);
  }
  tbb_gpu_fini(&g);
  return 0;
}

static int run_raw_pair(struct gpu_shared *sh, size_t bytes, int cold,
                        int idle) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
    return -1;
  struct h_arg pa = {.sv = sv[0], .sh = sh, .bytes = bytes, .cold = cold,
                     .idle = idle};
  struct h_arg ca = pa;
  ca.sv = sv[1];
  pid_t pp = tbb_spawn(raw_producer, &pa);
  pid_t pc = tbb_spawn(raw_consumer, &ca);
  close(sv[0]);
  close(sv[1]);
  int r1 = tbb_reap(pc), r2 = tbb_reap(pp);
  return r1 || r2 ? -1 : 0;
}

/* tb producer: publish, then wait for the consumer's ack on a pipe. */
static int tb_gpu_producer(void *p) {
  struct h_arg *a = p;
  struct tbb_gpu g;
  tb_client *c = NULL;
  tb_cu_deviceptr d = 0, *bufs = NULL;
  tb_cu_stream *streams = NULL;
  long nbufs = 0;
  tb_cu_result r;
  int rc, ret = 2;
  close(a->go_rd); /* the consumer's end */
  if (tbb_gpu_init(&g) < 0)
    goto out;
  if ((r = g.cu->cuMemAlloc(&d, a->bytes)) ||
      (r = g.cu->cuMemsetD32Async(d, 1, a->bytes / 4, g.stream))) {
    tbb_cu_fail(&g, "tb producer alloc", r);
    goto out;
  }
  rc = tbb_connect(a->sock, "bench-gpu-producer", TB_CONTRACT_SPEC, &c);
  if (rc < 0) {
    fprintf(stderr, "gpu producer: connect: %s\n", tb_strerror(rc));
    goto out;
  }
  int64_t shape[1] = {(int64_t)(a->bytes / 4)};
  DLTensor t = {.data = (void *)(uintptr_t)d, .device = {kDLCUDA, 0},
                .ndim = 1, .dtype = {kDLFloat, 32, 1}, .shape = shape};
  struct tb_publish_options po;
  tb_publish_options_init(&po);
  po.stream = g.stream;
  po.metadata_len = sizeof(uint64_t);
  uint64_t ts = tbb_now_ns();
  po.metadata = &ts;
  if (a->cold == 2 || a->cold == 3) {
    /* Every round a new allocation published from a new stream: the
     * consumer, connected all along, opens a new memory handle and a new
     * ready event (the library makes one event per producer stream).
     * Buffers stay allocated until the consumer has exited (freeing an
     * exported allocation that another process has open is undefined). */
    long n = a->sh->warm + a->sh->iters;
    bufs = calloc((size_t)n, sizeof(*bufs));
    streams = calloc((size_t)n, sizeof(*streams));
    if (bufs == NULL || streams == NULL)
      goto out;
    tbb_write_byte(a->ready_wr, 'p');
    for (long i = 0; i < n; i++) {
      char b;
      if ((r = g.cu->cuStreamCreate(&streams[i], 0x1 /* NON_BLOCKING */))) {
        tbb_cu_fail(&g, "tb producer stream", r);
        goto out;
      }
      nbufs = i + 1;
      if ((r = g.cu->cuMemAlloc(&bufs[i], a->bytes)) ||
          (r = g.cu->cuMemsetD32Async(bufs[i], 1, a->bytes / 4,
                                      streams[i]))) {
        tbb_cu_fail(&g, "tb producer alloc", r);
        goto out;
      }
      t.data = (void *)(uintptr_t)bufs[i];
      po.stream = streams[i];
      rc = tb_channel_publish(c, "bench/gpu/coldbuf", &t, &po, NULL);
      if (rc < 0) {
        fprintf(stderr, "gpu producer: publish: %s\n", tb_strerror(rc));
        goto out;
      }
      if (tbb_write_byte(a->go_wr, 'g') < 0 || tbb_read_byte(a->sv, &b) < 0)
        goto out;
      struct tb_notice nt;
      while (tb_notice_poll(c, sizeof(nt), &nt, 0) == 0)
        ;
    }
    tbb_gate_wait(a->gate); /* until the consumer has exited */
  } else if (a->cold) {
    rc = tb_channel_publish(c, "bench/gpu/cold", &t, &po, NULL);
    if (rc < 0) {
      fprintf(stderr, "gpu producer: publish: %s\n", tb_strerror(rc));
      goto out;
    }
    tbb_write_byte(a->ready_wr, 'p');
    tbb_gate_wait(a->gate);
  } else {
    struct tb_cuda_counters k0 = {0}, k1;
    tbb_write_byte(a->ready_wr, 'p');
    for (long i = 0; i < a->sh->warm + a->sh->iters; i++) {
      char b;
      if (i == a->sh->warm)
        tb__cuda_counters(&k0);
      uint64_t t0 = tbb_now_ns();
      g.cu->cuMemsetD32Async(d, (unsigned)i, 16, g.stream);
      if (a->idle) {
        g.cu->cuStreamSynchronize(g.stream);
        t0 = tbb_now_ns();
      }
      ts = t0;
      rc = tb_channel_publish(c, "bench/gpu/warm", &t, &po, NULL);
      if (rc < 0) {
        fprintf(stderr, "gpu producer: publish: %s\n", tb_strerror(rc));
        goto out;
      }
      if (tbb_read_byte(a->sv, &b) < 0)
        goto out;
      if (i >= a->sh->warm)
        a->sh->rt[i - a->sh->warm] = tbb_now_ns() - t0;
      /* Notices (version free) pile up otherwise; take what is there. */
      struct tb_notice n;
      while (tb_notice_poll(c, sizeof(n), &n, 0) == 0)
        ;
    }
    tb__cuda_counters(&k1);
    a->sh->prod_records = k1.event_record - k0.event_record;
  }
  ret = 0;
out:
  if (ret)
    tbb_write_byte(a->ready_wr, 'x');
  tb_client_disconnect(c);
  if (g.cu) {
    g.cu->cuStreamSynchronize(g.stream);
    if (d)
      g.cu->cuMemFree(d);
    for (long i = 0; i < nbufs; i++) {
      g.cu->cuStreamSynchronize(streams[i]);
      if (bufs[i])
        g.cu->cuMemFree(bufs[i]);
      g.cu->cuStreamDestroy(streams[i]);
    }
    tbb_gpu_fini(&g);
  }
  free(bufs);
  free(streams);
  return ret;
}

static int tb_gpu_consumer(void *p) {
  struct h_arg *a = p;
  struct tbb_gpu g;
  tb_client *c = NULL;
  int rc, ret = 2;
  if (tbb_gpu_init(&g) < 0)
    goto out;
  struct tb_acquire_options o;
  tb_acquire_options_init(&o);
  o.stream = g.stream;
  o.timeout_ms = 30000;
  close(a->go_wr); /* the producer's end: its exit ends our read */
  if (a->cold == 2 || a->cold == 3) {
    /* one client; each round a buffer it has never seen */
    struct counts k0 = {0}, k1;
    o.mode = TB_ACQUIRE_LATEST;
    rc = tbb_connect(a->sock, "bench-gpu-coldbuf", TB_CONTRACT_SPEC, &c);
    if (rc < 0)
      goto out;
    /* 3: subscribed, so that each new buffer comes with its notice and is
     * opened as the acquire reads that notice (opening ahead) */
    if (a->cold == 3 && (rc = tb_channel_subscribe(c, "bench/gpu/coldbuf")) < 0)
      goto out;
    for (long i = 0; i < a->sh->warm + a->sh->iters; i++) {
      DLManagedTensorVersioned *t;
      char b;
      if (i == a->sh->warm)
        counts_now(&k0);
      if (tbb_read_byte(a->go_rd, &b) < 0)
        goto out;
      struct tb_cuda_counters o0, o1;
      tb__cuda_counters(&o0);
      uint64_t t0 = tbb_now_ns();
      rc = tb_lease_acquire(c, "bench/gpu/coldbuf", &o, &t);
      uint64_t t1 = tbb_now_ns();
      tb__cuda_counters(&o1);
      if (rc < 0) {
        fprintf(stderr, "gpu consumer: new-buffer acquire: %s\n",
                tb_strerror(rc));
        goto out;
      }
      g.cu->cuStreamSynchronize(g.stream);
      tb_lease_release(t, g.stream);
      g.cu->cuStreamSynchronize(g.stream);
      /* take the queued notices, as a subscribed consumer does, before
       * the producer publishes again (so the next notice stays unread) */
      struct tb_notice nt;
      while (tb_notice_poll(c, sizeof(nt), &nt, 0) == 0)
        ;
      if (tbb_write_byte(a->sv, 'a') < 0)
        goto out;
      if (i >= a->sh->warm) {
        a->sh->rt[i - a->sh->warm] = t1 - t0;
        a->sh->opens_in[i - a->sh->warm] = opens_between(&o0, &o1);
        a->sh->rt_in[i - a->sh->warm] = t1 - t0;
      }
    }
    counts_now(&k1);
    note_counters(a->sh, &k0, &k1, a->sh->iters);
  } else if (a->cold) {
    static const char *const cold_named[] = {"bench/gpu/cold", NULL};
    o.mode = TB_ACQUIRE_LATEST;
    struct counts k0 = {0}, k1;
    for (long i = 0; i < a->sh->warm + a->sh->iters; i++) {
      DLManagedTensorVersioned *t;
      if (i == a->sh->warm) /* the first acquires of the process, not timed,
                               are not counted either */
        counts_now(&k0);
      struct tb_connect_options co;
      tbb_connect_options(&co, a->sock, "bench-gpu-cold", TB_CONTRACT_SPEC);
      co.no_prefetch = a->cold == 4;
      if (a->cold == 5)
        co.channels = cold_named;
      uint64_t tc = tbb_now_ns();
      rc = tb_client_connect(&co, &c);
      tc = tbb_now_ns() - tc;
      if (rc < 0)
        goto out;
      if (i >= a->sh->warm && i - a->sh->warm < 1024)
        a->sh->connect_ns[i - a->sh->warm] = tc;
      struct tb_cuda_counters o0, o1;
      tb__cuda_counters(&o0);
      uint64_t t0 = tbb_now_ns();
      rc = tb_lease_acquire(c, "bench/gpu/cold", &o, &t);
      uint64_t t1 = tbb_now_ns();
      tb__cuda_counters(&o1);
      if (rc < 0) {
        fprintf(stderr, "gpu consumer: cold acquire: %s\n", tb_strerror(rc));
        goto out;
      }
      g.cu->cuStreamSynchronize(g.stream);
      tb_lease_release(t, g.stream);
      g.cu->cuStreamSynchronize(g.stream);
      tb_client_disconnect(c);
      c = NULL;
      if (i >= a->sh->warm) {
        a->sh->rt[i - a->sh->warm] = t1 - t0;
        a->sh->opens_in[i - a->sh->warm] = opens_between(&o0, &o1);
        a->sh->rt_in[i - a->sh->warm] = t1 - t0;
      }
    }
    counts_now(&k1);
    note_counters(a->sh, &k0, &k1, a->sh->iters);
  } else {
    rc = tbb_connect(a->sock, "bench-gpu-warm", TB_CONTRACT_SPEC, &c);
    if (rc < 0)
      goto out;
    o.mode = TB_ACQUIRE_NEXT;
    uint64_t last = 0;
    struct counts k0 = {0}, k1;
    DLManagedTensorVersioned *prev = NULL; /* a->sh->releasing */
    for (long i = 0; i < a->sh->warm + a->sh->iters; i++) {
      DLManagedTensorVersioned *t;
      struct tb_lease_info li;
      if (i == a->sh->warm)
        counts_now(&k0);
      o.version = last;
      o.release = prev;
      o.release_stream = g.stream;
      prev = NULL;
      rc = tb_lease_acquire(c, "bench/gpu/warm", &o, &t);
      if (rc < 0) {
        fprintf(stderr, "gpu consumer: acquire: %s\n", tb_strerror(rc));
        goto out;
      }
      g.cu->cuStreamSynchronize(g.stream);
      uint64_t now = tbb_now_ns(), ts = 0;
      if (tb_lease_get_info(t, sizeof(li), &li) == 0) {
        last = li.version;
        if (li.metadata_len == sizeof(ts))
          memcpy(&ts, li.metadata, sizeof(ts));
      }
      if (i >= a->sh->warm)
        a->sh->oneway[i - a->sh->warm] = now - ts;
      if (a->sh->releasing)
        prev = t; /* released by the next acquire */
      else
        rc = tb_lease_release(t, g.stream);
      if (rc < 0 || tbb_write_byte(a->sv, 'a') < 0)
        goto out;
    }
    if (prev != NULL)
      tb_lease_release(prev, g.stream);
    counts_now(&k1);
    note_counters(a->sh, &k0, &k1, a->sh->iters);
  }
  ret = 0;
out:
  tb_client_disconnect(c);
  if (g.cu)
    tbb_gpu_fini(&g);
  return ret;
}

static int run_tb_pair(const struct tbb_daemon *d, struct gpu_shared *sh,
                       size_t bytes, int cold, int idle) {
  int ack[2], ready[2], go[2];
  struct tbb_gate gate;
  if (tbb_pipe(ack) < 0 || tbb_pipe(ready) < 0 || tbb_pipe(go) < 0 ||
      tbb_gate_init(&gate) < 0)
    return -1;
  struct h_arg pa = {.sock = d->sock, .sv = ack[0], .ready_wr = ready[1],
                     .gate = &gate, .sh = sh, .bytes = bytes, .cold = cold,
                     .idle = idle, .go_rd = go[0], .go_wr = go[1]};
  pid_t pp = tbb_spawn(tb_gpu_producer, &pa);
  close(ready[1]);
  char b = 'x';
  tbb_read_byte(ready[0], &b);
  close(ready[0]);
  int ok = b == 'p';
  if (ok) {
    struct h_arg ca = pa;
    ca.sv = ack[1];
    pid_t pc = tbb_spawn(tb_gpu_consumer, &ca);
    close(ack[1]);
    ack[1] = -1;
    /* only the children hold the go pipe: one's exit ends the other's read */
    close(go[0]);
    close(go[1]);
    go[0] = go[1] = -1;
    if (cold) {
      ok = tbb_reap(pc) == 0;
      tbb_gate_open(&gate);
    } else {
      ok = tbb_reap(pc) == 0;
    }
  }
  close(ack[0]);
  if (ack[1] >= 0)
    close(ack[1]);
  if (go[0] >= 0)
    close(go[0]);
  if (go[1] >= 0)
    close(go[1]);
  tbb_gate_open(&gate);
  if (!ok)
    kill(pp, SIGKILL); /* it may wait for an ack that will not come */
  if (tbb_reap(pp) != 0)
    ok = 0;
  tbb_gate_close(&gate);
  return ok ? 0 : -1;
}

/* torch.multiprocessing baseline: bench/torch_baseline.py writes one
 * round trip per line (nanoseconds) to a file. */
static size_t run_torch(uint64_t *out, size_t cap, long iters) {
  char dir[] = "/tmp/tb-bench-torch.XXXXXX";
  if (!mkdtemp(dir))
    return 0;
  char file[96], cmd[1024];
  /* The source tree's copy, else bench/ under the working directory (the
   * repository root on a machine the build was carried to). */
  const char *script = TBB_SOURCE_DIR "/torch_baseline.py";
  if (access(script, R_OK) != 0)
    script = "bench/torch_baseline.py";
  snprintf(file, sizeof(file), "%s/lat.txt", dir);
  snprintf(cmd, sizeof(cmd),
           "timeout 120 python3 %s --mib 4 --iters %ld "
           "--out %s >/dev/null 2>%s/err.txt",
           script, iters, file, dir);
  fflush(stdout);
  int rc = system(cmd);
  size_t n = 0;
  FILE *f = rc == 0 ? fopen(file, "re") : NULL;
  if (f) {
    unsigned long long v;
    while (n < cap && fscanf(f, "%llu", &v) == 1)
      out[n++] = v;
    fclose(f);
  } else {
    char ef[96];
    snprintf(ef, sizeof(ef), "%s/err.txt", dir);
    FILE *e = fopen(ef, "re");
    char line[256] = "";
    if (e) {
      while (fgets(line, sizeof(line), e)) /* the last line says why */
        ;
      fclose(e);
    }
    line[strcspn(line, "\n")] = 0;
    tbb_note("torch baseline not run (python3 with torch and a GPU needed): "
             "%s",
             line);
    unlink(ef);
  }
  unlink(file);
  rmdir(dir);
  return n;
}

/* A cold row's acquires against the opens they made themselves (the open
 * cost moves a lot from pass to pass and from buffer to buffer, so the
 * rows of the raw program, run before, are not the same opens): a row of
 * those opens, the ratio of the p50s, and the p50 of what each acquire
 * took beyond its own opens. */
static void cold_own_opens(struct gpu_shared *sh, size_t n, const char *row,
                           const char *tag) {
  static uint64_t total[1024], beyond[1024];
  struct tbb_summary st, sb;
  char name[96];

  if (n > 1024)
    n = 1024;
  for (size_t i = 0; i < n; i++) {
    total[i] = sh->rt_in[i];
    beyond[i] = sh->rt_in[i] > sh->opens_in[i]
                    ? sh->rt_in[i] - sh->opens_in[i]
                    : 0;
  }
  tbb_summarise(total, n, &st);
  tbb_summarise(beyond, n, &sb);
  snprintf(name, sizeof(name), "tb cold, %s: its IPC opens", tag);
  tbb_row_latency(name, sh->opens_in, n, NULL);
  {
    struct tbb_summary so;
    static uint64_t o2[1024];
    memcpy(o2, sh->opens_in, n * sizeof(*o2));
    tbb_summarise(o2, n, &so);
    tbb_note("%s: p50 %.1f us against p50 %.1f us of the IPC opens inside "
             "the same acquires (%.2fx); p50 of each acquire beyond its own "
             "opens %.1f us",
             row, st.p50_us, so.p50_us,
             so.p50_us > 0 ? st.p50_us / so.p50_us : 0, sb.p50_us);
  }
}

/* Where a cold acquire's time went, from the consumer's counters. */
static void cold_breakdown(const struct gpu_shared *sh, const char *what) {
  double n = sh->counted ? (double)sh->counted : 1, mean = 0;
  for (long i = 0; i < sh->iters; i++)
    mean += (double)sh->rt[i];
  mean /= sh->iters > 0 ? (double)sh->iters : 1;
  double om = (double)sh->ns_open_mem / n, oe = (double)sh->ns_open_event / n,
         w = (double)sh->ns_wait / n;
  double ec = (double)sh->ns_create / n, er = (double)sh->ns_record / n;
  double rt = (double)sh->ns_rt / n, pf = (double)sh->ns_prefetch / n,
         af = (double)sh->ns_after / n, sd = (double)sh->ns_send / n,
         rp = (double)sh->ns_reply / n;
  tbb_note("%s, mean per acquire: %.1f us in all = sending the Acquire and "
           "waiting for its reply %.1f (sending %.1f; opening ahead, while "
           "waiting, %.1f; from the last notice to the reply %.1f, with "
           "%.1f empty polling reads and %.2f blocking reads) "
           "+ after the reply %.1f + before sending %.1f; driver time in "
           "all: cuIpcOpenMemHandle %.1f, cuIpcOpenEventHandle %.1f, "
           "cuStreamWaitEvent %.1f (%lu calls), cuEventCreate %.1f (%lu "
           "calls), cuEventRecord %.1f (%lu calls)",
           what, mean / 1e3, rt / 1e3, sd / 1e3, pf / 1e3, rp / 1e3,
           (double)sh->empty_reads / n, (double)sh->blocking / n, af / 1e3,
           (mean - rt - af) / 1e3, om / 1e3, oe / 1e3, w / 1e3, sh->waits,
           ec / 1e3, sh->creates, er / 1e3, sh->records);
}

/* A cold row: the pair in mode cold on daemon d, its row against the raw
 * row named raw, its own opens and where its time went (tag). 0, or -1
 * after reporting the failure. */
static int cold_row(const struct tbb_daemon *d, struct gpu_shared *sh,
                    size_t n, int cold, const char *row, const char *raw,
                    const char *tag) {
  if (run_tb_pair(d, sh, COLD_BYTES, cold, 0) != 0) {
    tbb_failed("%s", row);
    return -1;
  }
  tbb_row_latency(row, sh->rt, n, raw);
  cold_own_opens(sh, n, row, tag);
  cold_breakdown(sh, tag);
  return 0;
}

void tbb_scenario_gpu_handoff(void) {
  tbb_section("4", "GPU hand-off, 4 MiB CUDA tensor",
              "warm: producer memsets 64 B + publishes on its stream, the "
              "consumer acquires NEXT with its stream (waits on the IPC "
              "event), synchronises it, releases, acks; round trip timed by "
              "the producer. raw: same through a socketpair with handles "
              "exchanged once and cuEventRecord/cuStreamWaitEvent. "
              "'producer idle': the producer synchronises before timing, as "
              "the torch baseline does. cold: a new client's first acquire "
              "of a 64 MiB buffer vs cuIpcOpenMemHandle + "
              "cuIpcOpenEventHandle of the same handles, and a connected "
              "client's first acquire of a new buffer published from a new "
              "stream vs opening a new buffer's and event's handles. "
              "unpinned");
  if (tbb_opt.host_only || !tbb_gpu_present()) {
    tbb_skip("no GPU");
    return;
  }
  struct gpu_shared *sh = tbb_shared_alloc(sizeof(*sh));
  sh->iters = tbb_scale(5000, 1000, 100);
  sh->warm = 200;
  struct tbb_daemon d;
  if (tbb_daemon_start(&d, NULL) < 0) {
    tbb_failed("daemon did not start");
    tbb_shared_free(sh, sizeof(*sh));
    return;
  }
  size_t n = (size_t)sh->iters;
  if (run_raw_pair(sh, HANDOFF_BYTES, 0, 0) == 0) {
    tbb_row_latency("raw CUDA IPC ping-pong (round trip)", sh->rt, n, NULL);
    tbb_row_latency("raw CUDA IPC one-way (record -> data ready)", sh->oneway,
                    n, NULL);
  } else {
    tbb_failed("raw CUDA IPC ping-pong");
  }
  uint64_t *tl = calloc(20000, sizeof(uint64_t));
  size_t tn = tl ? run_torch(tl, 20000, tbb_scale(1000, 300, 50)) : 0;
  if (tn)
    tbb_row_latency("torch.multiprocessing queue ping-pong", tl, tn, NULL);
  free(tl);
  if (run_tb_pair(&d, sh, HANDOFF_BYTES, 0, 0) == 0) {
    tbb_row_latency("tb warm hand-off (round trip)", sh->rt, n,
                    "raw CUDA IPC ping-pong (round trip)");
    tbb_row_latency("tb warm one-way (publish -> data ready)", sh->oneway, n,
                    "raw CUDA IPC one-way (record -> data ready)");
    tbb_note("producer's write in flight at publish: the consumer's stream "
             "waited on the ready event in %lu of %lu acquires",
             sh->waits, sh->counted);
  } else {
    tbb_failed("tb warm hand-off");
  }
  /* The torch baseline synchronises the producer before it times a
   * hand-off, so no GPU work is pending across the two processes. The same
   * protocol here isolates the hand-off itself from the cost of one GPU
   * context waiting on another's work (the rows above). */
  if (run_raw_pair(sh, HANDOFF_BYTES, 0, 1) == 0)
    tbb_row_latency("raw CUDA IPC ping-pong, producer idle", sh->rt, n, NULL);
  else
    tbb_failed("raw CUDA IPC ping-pong, producer idle");
  if (run_raw_pair(sh, HANDOFF_BYTES, 0, 2) == 0) {
    tbb_row_latency("raw CUDA IPC, producer idle, idle stream not waited on",
                    sh->rt, n, NULL);
    tbb_note("raw program that checks cuStreamQuery before recording and "
             "skips the consumer's cuStreamWaitEvent when the stream was "
             "idle (what tensorbroker does, docs/cuda.md): %lu of %ld rounds "
             "skipped the wait",
             sh->skipped_waits, sh->warm + sh->iters);
  } else {
    tbb_failed("raw CUDA IPC, producer idle, idle stream not waited on");
  }
  if (run_tb_pair(&d, sh, HANDOFF_BYTES, 0, 1) == 0) {
    tbb_row_latency("tb warm hand-off, producer idle", sh->rt, n,
                    tn ? "torch.multiprocessing queue ping-pong"
                       : "raw CUDA IPC ping-pong, producer idle");
    tbb_note("producer idle: the consumer's stream waited on the ready "
             "event in %lu of %lu acquires (a version whose work had "
             "finished at publish needs no wait outside a graph capture); "
             "event records: producer %lu, consumer %lu",
             sh->waits, sh->counted, sh->prod_records, sh->records);
    tbb_row_latency("tb one-way, producer idle (publish -> data ready)",
                    sh->oneway, n, NULL);
    if (tn)
      tbb_note("'producer idle' rows follow the torch baseline's protocol "
               "(producer synchronised before timing; consumer waits, syncs, "
               "answers); their ratio is tb p50 / torch p50 (target <= 1/15)");
  } else {
    tbb_failed("tb warm hand-off, producer idle");
  }
  /* The same with the consumer releasing each version with its next
   * acquire (tb_acquire_options.release): the release leaves the hand-off's
   * path, as torch's consumer drops its reference off it. */
  sh->releasing = 1;
  if (run_tb_pair(&d, sh, HANDOFF_BYTES, 0, 1) == 0) {
    tbb_row_latency("tb warm hand-off, producer idle, releasing with the next "
                    "acquire", sh->rt, n,
                    tn ? "torch.multiprocessing queue ping-pong"
                       : "raw CUDA IPC ping-pong, producer idle");
    tbb_note("releasing with the next acquire: %lu GPU waits in %lu "
             "acquires; event records: producer %lu, consumer %lu",
             sh->waits, sh->counted, sh->prod_records, sh->records);
  } else {
    tbb_failed("tb warm hand-off, producer idle, releasing with the next "
               "acquire");
  }
  sh->releasing = 0;
  /* The same with no polling at all (the daemon --busy-poll 0, the clients
   * spin_us -1: each hand-off wakes sleeping processes), and with busy
   * polling (--busy-poll and spin_us tbb_busy_poll_us, so that a hand-off
   * costs no process wake-up); the rows above run the defaults (a 50 us
   * window with 4 or more CPUs). */
  for (enum tbb_polling p = TBB_POLL_NONE; p <= TBB_POLL_BUSY; p++) {
    struct tbb_daemon ds;
    const char *tag = p == TBB_POLL_NONE ? "no polling" : "busy polling";
    char row[96], one[96];
    if (tbb_daemon_start_polling(&ds, p) < 0)
      continue;
    snprintf(row, sizeof(row), "tb warm hand-off, producer idle, %s", tag);
    snprintf(one, sizeof(one), "tb one-way, producer idle, %s", tag);
    tbb_spin_us = tbb_polling_spin_us(p);
    int rc = run_tb_pair(&ds, sh, HANDOFF_BYTES, 0, 1);
    tbb_spin_us = 0;
    if (rc == 0) {
      tbb_row_latency(row, sh->rt, n,
                      tn ? "torch.multiprocessing queue ping-pong"
                         : "raw CUDA IPC ping-pong, producer idle");
      tbb_row_latency(one, sh->oneway, n, NULL);
      tbb_note("%s: tensorbrokerd --busy-poll %d and both clients' spin_us "
               "= %d; %lu GPU waits in %lu acquires",
               tag, p == TBB_POLL_BUSY ? tbb_busy_poll_us : 0,
               tbb_polling_spin_us(p), sh->waits, sh->counted);
    } else {
      tbb_failed("%s", row);
    }
    tbb_daemon_stop(&ds);
  }

  sh->iters = tbb_scale(100, 30, 10);
  sh->warm = 2;
  n = (size_t)sh->iters;
  static const char raw_same[] = "raw cuIpcOpenMemHandle+cuIpcOpenEventHandle",
                    raw_new[] = "raw open of new handles (new buffer+event "
                                "each round)";
  if (run_raw_pair(sh, COLD_BYTES, 1, 0) == 0) {
    tbb_row_latency(raw_same, sh->rt, n, NULL);
    if (n <= 1024) {
      struct tbb_summary om, oe;
      tbb_summarise(sh->open_mem_ns, n, &om);
      tbb_summarise(sh->open_event_ns, n, &oe);
      tbb_note("of which cuIpcOpenMemHandle p50 %.1f us (mean %.1f), "
               "cuIpcOpenEventHandle p50 %.1f us (mean %.1f): a version "
               "whose work had finished at publish needs no event open in "
               "tensorbroker (docs/cuda.md, \"Finished work is not waited "
               "for\")",
               om.p50_us, om.mean_us, oe.p50_us, oe.mean_us);
    }
  } else {
    tbb_failed("raw cold open");
  }
  if (run_raw_pair(sh, COLD_BYTES, 2, 0) == 0) {
    tbb_row_latency(raw_new, sh->rt, n, NULL);
    if (n <= 1024) {
      struct tbb_summary rb, ra;
      tbb_summarise(sh->read_before, n, &rb);
      tbb_summarise(sh->read_after, n, &ra);
      tbb_note("the same raw consumer reading a 64 B datagram that is "
               "already waiting: just before its opens p50 %.1f us (mean "
               "%.1f), just after them p50 %.1f us (mean %.1f): what the "
               "first work after cuIpcOpenMemHandle costs any program",
               rb.p50_us, rb.mean_us, ra.p50_us, ra.mean_us);
    }
  } else
    tbb_failed("raw cold open of new handles");
  if (cold_row(&d, sh, n, 1, "tb cold acquire, new client", raw_same,
               "new client") == 0) {
    tbb_note("new-client cold acquires made %lu cuIpcOpenMemHandle and %lu "
             "cuIpcOpenEventHandle calls over %ld acquires (1 each = "
             "really cold; the same handles each time, as in the raw row "
             "above); each client's done event is made and registered by "
             "its connect (a context is current: docs/cuda.md, \"Ready at "
             "connect\"), so each acquire is one request to the daemon",
             sh->opens_mem, sh->opens_event, sh->iters);
    tbb_row_latency("tb connect of those new clients (not timed above)",
                    sh->connect_ns, n > 1024 ? 1024 : n, NULL);
  }
  /* the same, the channel named at connect: its buffer comes with the
   * HelloReply and the acquire opens it while the daemon answers */
  if (cold_row(&d, sh, n, 5,
               "tb cold acquire, new client, channel named at connect",
               raw_same, "new client, named") == 0)
    tbb_row_latency("tb connect of those new clients, channel named",
                    sh->connect_ns, n > 1024 ? 1024 : n, NULL);
  /* the same, the done event registered by the acquire (the library before
   * "Ready at connect"): what preparing it at connect saves */
  if (cold_row(&d, sh, n, 4,
               "tb cold acquire, new client, event registered by the acquire "
               "(no_prefetch)",
               raw_same, "new client, no_prefetch") == 0)
    tbb_row_latency("tb connect of those new clients, no_prefetch",
                    sh->connect_ns, n > 1024 ? 1024 : n, NULL);
  if (cold_row(&d, sh, n, 2,
               "tb cold acquire, new buffer+event, connected client", raw_new,
               "new buffer") == 0)
    tbb_note("the per-buffer cost of a long-running consumer: each round "
             "the producer publishes a new allocation from a new stream; "
             "the timed acquires made %lu cuIpcOpenMemHandle and %lu "
             "cuIpcOpenEventHandle calls over %ld acquires (1 each "
             "expected)",
             sh->opens_mem, sh->opens_event, sh->iters);
  if (cold_row(&d, sh, n, 3,
               "tb cold acquire, new buffer+event, subscribed client "
               "(opening ahead)",
               raw_new, "opening ahead") == 0)
    tbb_note("the same with the consumer subscribed: the new-version notice "
             "carries the new buffer and its ready event, and the library "
             "opens them as the acquire reads that notice, while the daemon "
             "answers the Acquire (docs/cuda.md, \"Opening ahead\"); the "
             "timed acquires made %lu cuIpcOpenMemHandle and %lu "
             "cuIpcOpenEventHandle calls over %ld acquires",
             sh->opens_mem, sh->opens_event, sh->iters);
  /* The cold rows again with no polling and with busy polling (daemon and
   * clients, as above). */
  for (enum tbb_polling p = TBB_POLL_NONE; p <= TBB_POLL_BUSY; p++) {
    struct tbb_daemon ds;
    const char *tag = p == TBB_POLL_NONE ? "no polling" : "busy polling";
    char row[3][128], what[3][64];
    if (tbb_daemon_start_polling(&ds, p) < 0)
      continue;
    snprintf(row[0], sizeof(row[0]), "tb cold acquire, new client, %s", tag);
    snprintf(row[1], sizeof(row[1]),
             "tb cold acquire, new buffer+event, connected client, %s", tag);
    snprintf(row[2], sizeof(row[2]),
             "tb cold acquire, new buffer+event, subscribed client (opening "
             "ahead), %s",
             tag);
    snprintf(what[0], sizeof(what[0]), "new client, %s", tag);
    snprintf(what[1], sizeof(what[1]), "new buffer, %s", tag);
    snprintf(what[2], sizeof(what[2]), "opening ahead, %s", tag);
    tbb_spin_us = tbb_polling_spin_us(p);
    for (int k = 0; k < 3; k++)
      cold_row(&ds, sh, n, k + 1, row[k], k == 0 ? raw_same : raw_new,
               what[k]);
    tbb_spin_us = 0;
    tbb_daemon_stop(&ds);
  }

  tbb_daemon_stop(&d);
  tbb_shared_free(sh, sizeof(*sh));
}

/* ---- scenario 5: zero copy ---- */

struct zc_shared {
  double ms_acquired, ms_local, ms_copy;
  int have_copy;
  /* cross-GPU: a consumer on GPU 1 reading GPU 0's tensor */
  double ms_peer, ms_local1, ms_p2p_copy;
  int have_peer, gpus;
};

struct zc_arg {
  const char *sock;
  int ready_wr;
  struct tbb_gate *gate;
  struct zc_shared *sh;
};

static int zc_producer(void *p) {
  struct zc_arg *a = p;
  struct tbb_gpu g;
  tb_client *c = NULL;
  tb_cu_deviceptr d = 0;
  int ret = 2, rc;
  tb_cu_result r;
  if (tbb_gpu_init(&g) < 0)
    goto out;
  if ((r = g.cu->cuMemAlloc(&d, ZC_BYTES)) ||
      (r = g.cu->cuMemsetD32Async(d, 0x01020304u, ZC_BYTES / 4, g.stream))) {
    tbb_cu_fail(&g, "zero-copy producer alloc", r);
    goto out;
  }
  if ((rc = tbb_connect(a->sock, "bench-zc-producer", TB_CONTRACT_SPEC, &c)) <
      0)
    goto out;
  int64_t shape[1] = {(int64_t)(ZC_BYTES / 4)};
  DLTensor t = {.data = (void *)(uintptr_t)d, .device = {kDLCUDA, 0},
                .ndim = 1, .dtype = {kDLFloat, 32, 1}, .shape = shape};
  struct tb_publish_options po;
  tb_publish_options_init(&po);
  po.stream = g.stream;
  if ((rc = tb_channel_publish(c, "bench/zc", &t, &po, NULL)) < 0) {
    fprintf(stderr, "zero-copy producer: publish: %s\n", tb_strerror(rc));
    goto out;
  }
  tbb_write_byte(a->ready_wr, 'p');
  tbb_gate_wait(a->gate);
  ret = 0;
out:
  if (ret)
    tbb_write_byte(a->ready_wr, 'x');
  tb_client_disconnect(c);
  if (g.cu) {
    g.cu->cuStreamSynchronize(g.stream);
    if (d)
      g.cu->cuMemFree(d);
    tbb_gpu_fini(&g);
  }
  return ret;
}

/* Median milliseconds of reps runs of the read kernel over src. */
static double time_read(struct tbb_gpu *g, tb_cu_function fn,
                        tb_cu_deviceptr src, tb_cu_deviceptr out, int reps) {
  int sms = 0;
  g->cu->cuDeviceGetAttribute(&sms, 16 /* MULTIPROCESSOR_COUNT */, g->dev);
  unsigned grid = (unsigned)(sms > 0 ? sms : 100) * 8;
  unsigned long long n16 = ZC_BYTES / 16;
  void *params[] = {&src, &n16, &out};
  tb_cu_event e0, e1;
  g->cu->cuEventCreate(&e0, 0);
  g->cu->cuEventCreate(&e1, 0);
  double best[64];
  if (reps > 64)
    reps = 64;
  for (int i = 0; i < reps; i++) {
    uint64_t h0 = tbb_now_ns();
    g->cu->cuEventRecord(e0, g->stream);
    tb_cu_result r = g->cu->cuLaunchKernel(fn, grid, 1, 1, 512, 1, 1, 0,
                                           g->stream, params, NULL);
    g->cu->cuEventRecord(e1, g->stream);
    g->cu->cuStreamSynchronize(g->stream);
    float ms = 0;
    if (r) {
      tbb_cu_fail(g, "cuLaunchKernel", r);
      return -1;
    }
    if (!g->eventElapsedTime || g->eventElapsedTime(&ms, e0, e1))
      ms = (float)((double)(tbb_now_ns() - h0) / 1e6);
    best[i] = ms;
  }
  g->cu->cuEventDestroy(e0);
  g->cu->cuEventDestroy(e1);
  for (int i = 1; i < reps; i++) /* insertion sort, reps is small */
    for (int j = i; j > 0 && best[j] < best[j - 1]; j--) {
      double x = best[j];
      best[j] = best[j - 1];
      best[j - 1] = x;
    }
  return best[reps / 2];
}

static int zc_consumer(void *p) {
  struct zc_arg *a = p;
  struct tbb_gpu g;
  tb_client *c = NULL;
  tb_cu_module mod;
  tb_cu_function fn;
  tb_cu_deviceptr local = 0, out = 0;
  void *pinned = NULL;
  DLManagedTensorVersioned *t = NULL;
  int ret = 2, rc;
  tb_cu_result r;
  if (tbb_gpu_init(&g) < 0)
    goto out;
  if ((r = g.cu->cuModuleLoadData(&mod, tb_bench_kernels_ptx)) ||
      (r = g.cu->cuModuleGetFunction(&fn, mod, "tb_bench_read")) ||
      (r = g.cu->cuMemAlloc(&out, 8)) ||
      (r = g.cu->cuMemAlloc(&local, ZC_BYTES)) ||
      (r = g.cu->cuMemsetD32Async(local, 0x01020304u, ZC_BYTES / 4,
                                  g.stream))) {
    tbb_cu_fail(&g, "zero-copy consumer setup", r);
    goto out;
  }
  if ((rc = tbb_connect(a->sock, "bench-zc-consumer", TB_CONTRACT_SPEC, &c)) <
      0)
    goto out;
  struct tb_acquire_options o;
  tb_acquire_options_init(&o);
  o.stream = g.stream;
  if ((rc = tb_lease_acquire(c, "bench/zc", &o, &t)) < 0) {
    fprintf(stderr, "zero-copy consumer: acquire: %s\n", tb_strerror(rc));
    goto out;
  }
  tb_cu_deviceptr src =
      (tb_cu_deviceptr)(uintptr_t)t->dl_tensor.data + t->dl_tensor.byte_offset;
  int reps = (int)tbb_scale(21, 11, 5);
  time_read(&g, fn, local, out, 3); /* warm the kernel */
  a->sh->ms_acquired = time_read(&g, fn, src, out, reps);
  a->sh->ms_local = time_read(&g, fn, local, out, reps);
  if (g.memAllocHost && g.memcpyDtoHAsync && g.memcpyHtoDAsync &&
      g.memAllocHost(&pinned, ZC_BYTES) == 0) {
    /* What a user without IPC does: device → pinned host → device, then
     * read. Here in one process, so it is a lower bound on that path. */
    double best = 1e30;
    for (int i = 0; i < 3; i++) {
      uint64_t t0 = tbb_now_ns();
      g.memcpyDtoHAsync(pinned, src, ZC_BYTES, g.stream);
      g.memcpyHtoDAsync(local, pinned, ZC_BYTES, g.stream);
      g.cu->cuStreamSynchronize(g.stream);
      double ms = (double)(tbb_now_ns() - t0) / 1e6 +
                  time_read(&g, fn, local, out, 1);
      if (ms < best)
        best = ms;
    }
    a->sh->ms_copy = best;
    a->sh->have_copy = 1;
  }
  ret = 0;
out:
  if (t)
    tb_lease_release(t, g.cu ? (void *)g.stream : NULL);
  tb_client_disconnect(c);
  if (g.cu) {
    g.cu->cuStreamSynchronize(g.stream);
    if (pinned && g.memFreeHost)
      g.memFreeHost(pinned);
    if (local)
      g.cu->cuMemFree(local);
    if (out)
      g.cu->cuMemFree(out);
    tbb_gpu_fini(&g);
  }
  return ret;
}

/* Cross-GPU: the same read kernel on GPU 1 over GPU 0's tensor (acquired
 * with opts.device = 1: a peer mapping), over a local GPU 1 tensor, and the
 * peer-to-peer copy of the tensor onto GPU 1, all in one run. */
static int zc_peer_consumer(void *p) {
  struct zc_arg *a = p;
  struct tbb_gpu g0, g1;
  tb_client *c = NULL;
  tb_cu_module mod;
  tb_cu_function fn;
  tb_cu_deviceptr local = 0, out = 0;
  DLManagedTensorVersioned *t = NULL;
  int ret = 2, rc, n = 0;
  tb_cu_result r;
  memset(&g1, 0, sizeof(g1));
  if (tbb_gpu_init(&g0) < 0)
    goto out;
  if (g0.cu->cuDeviceGetCount(&n) != 0 || n < 2) {
    a->sh->gpus = n;
    ret = 0;
    goto out;
  }
  a->sh->gpus = n;
  g1 = g0;
  g1.ctx = NULL;
  g1.stream = NULL;
  if ((r = g1.cu->cuDeviceGet(&g1.dev, 1)) ||
      (r = g1.cu->cuDevicePrimaryCtxRetain(&g1.ctx, g1.dev)) ||
      (r = g1.cu->cuCtxSetCurrent(g1.ctx)) ||
      (r = g1.cu->cuStreamCreate(&g1.stream, 0x1 /* NON_BLOCKING */)) ||
      (r = g1.cu->cuModuleLoadData(&mod, tb_bench_kernels_ptx)) ||
      (r = g1.cu->cuModuleGetFunction(&fn, mod, "tb_bench_read")) ||
      (r = g1.cu->cuMemAlloc(&out, 8)) ||
      (r = g1.cu->cuMemAlloc(&local, ZC_BYTES)) ||
      (r = g1.cu->cuMemsetD32Async(local, 0x01020304u, ZC_BYTES / 4,
                                   g1.stream))) {
    tbb_cu_fail(&g1, "cross-GPU consumer setup", r);
    goto out;
  }
  if ((rc = tbb_connect(a->sock, "bench-zc-peer", TB_CONTRACT_SPEC, &c)) < 0)
    goto out;
  struct tb_acquire_options o;
  tb_acquire_options_init(&o);
  o.stream = g1.stream;
  o.device = 1;
  if ((rc = tb_lease_acquire(c, "bench/zc", &o, &t)) < 0) {
    fprintf(stderr, "cross-GPU consumer: acquire: %s\n", tb_strerror(rc));
    goto out;
  }
  tb_cu_deviceptr src =
      (tb_cu_deviceptr)(uintptr_t)t->dl_tensor.data + t->dl_tensor.byte_offset;
  int reps = (int)tbb_scale(21, 11, 5);
  time_read(&g1, fn, local, out, 3); /* warm the kernel */
  a->sh->ms_peer = time_read(&g1, fn, src, out, reps);
  a->sh->ms_local1 = time_read(&g1, fn, local, out, reps);
  double best = 1e30;
  for (int i = 0; i < 3; i++) {
    uint64_t t0 = tbb_now_ns();
    if ((r = g1.cu->cuMemcpyDtoDAsync(local, src, ZC_BYTES, g1.stream)) ||
        (r = g1.cu->cuStreamSynchronize(g1.stream))) {
      tbb_cu_fail(&g1, "peer copy", r);
      goto out;
    }
    double ms = (double)(tbb_now_ns() - t0) / 1e6;
    if (ms < best)
      best = ms;
  }
  a->sh->ms_p2p_copy = best;
  a->sh->have_peer = 1;
  ret = 0;
out:
  if (t)
    tb_lease_release(t, g1.stream ? (void *)g1.stream : NULL);
  tb_client_disconnect(c);
  if (g1.ctx) {
    g1.cu->cuCtxSetCurrent(g1.ctx);
    if (g1.stream)
      g1.cu->cuStreamSynchronize(g1.stream);
    if (local)
      g1.cu->cuMemFree(local);
    if (out)
      g1.cu->cuMemFree(out);
    tbb_gpu_fini(&g1);
  }
  if (g0.cu) {
    g0.cu->cuCtxSetCurrent(g0.ctx);
    tbb_gpu_fini(&g0);
  }
  return ret;
}

void tbb_scenario_zero_copy(void) {
  tbb_section("5", "zero copy, 1 GiB CUDA tensor",
              "read kernel (PTX from bench/kernels.cu via cuModuleLoadData, "
              "16-byte loads, grid-stride) over the acquired tensor vs a "
              "local one, median of repeated runs timed with CUDA events; "
              "copy path: cuMemcpyDtoHAsync to pinned host + "
              "cuMemcpyHtoDAsync + the same read, in the consumer");
  if (tbb_opt.host_only || !tbb_gpu_present()) {
    tbb_skip("no GPU");
    return;
  }
  struct tbb_daemon d;
  if (tbb_daemon_start(&d, NULL) < 0) {
    tbb_failed("daemon did not start");
    return;
  }
  struct zc_shared *sh = tbb_shared_alloc(sizeof(*sh));
  struct tbb_gate gate;
  int ready[2];
  if (tbb_gate_init(&gate) < 0 || tbb_pipe(ready) < 0) {
    tbb_failed("setup");
    goto out;
  }
  struct zc_arg a = {.sock = d.sock, .ready_wr = ready[1], .gate = &gate,
                     .sh = sh};
  pid_t pp = tbb_spawn(zc_producer, &a);
  close(ready[1]);
  char b = 'x';
  tbb_read_byte(ready[0], &b);
  close(ready[0]);
  int ok = b == 'p' && tbb_reap(tbb_spawn(zc_consumer, &a)) == 0;
  int peer_ok = ok && tbb_reap(tbb_spawn(zc_peer_consumer, &a)) == 0;
  tbb_gate_open(&gate);
  if (tbb_reap(pp) != 0)
    ok = 0;
  tbb_gate_close(&gate);
  if (!ok) {
    tbb_failed("zero-copy run");
    goto out;
  }
  double gib = (double)ZC_BYTES / 1e9;
  const char *keys[] = {"ms", "GB_per_s", "fraction_of_local"};
  double v1[] = {sh->ms_acquired, gib / (sh->ms_acquired / 1e3),
                 sh->ms_local / sh->ms_acquired};
  double v2[] = {sh->ms_local, gib / (sh->ms_local / 1e3), 1.0};
  tbb_row_values("read acquired tensor (zero copy)", 3, keys, v1);
  tbb_row_values("read local tensor", 3, keys, v2);
  if (sh->have_copy) {
    double v3[] = {sh->ms_copy, gib / (sh->ms_copy / 1e3),
                   sh->ms_local / sh->ms_copy};
    tbb_row_values("copy via pinned host, then read", 3, keys, v3);
  } else {
    tbb_note("copy path skipped: driver lacks cuMemAllocHost/cuMemcpy*Async");
  }
  if (sh->have_peer) {
    double v4[] = {sh->ms_peer, gib / (sh->ms_peer / 1e3),
                   sh->ms_local1 / sh->ms_peer};
    double v5[] = {sh->ms_local1, gib / (sh->ms_local1 / 1e3), 1.0};
    double v6[] = {sh->ms_p2p_copy, gib / (sh->ms_p2p_copy / 1e3),
                   sh->ms_local1 / sh->ms_p2p_copy};
    tbb_row_values("GPU 1 reads GPU 0 tensor (peer mapping)", 3, keys, v4);
    tbb_row_values("GPU 1 reads local tensor", 3, keys, v5);
    tbb_row_values("peer-to-peer copy GPU 0 -> GPU 1", 3, keys, v6);
  } else if (!peer_ok) {
    tbb_failed("cross-GPU read");
  } else {
    tbb_note("cross-GPU rows skipped: needs 2 GPUs (%d visible)", sh->gpus);
  }
out:
  tbb_shared_free(sh, sizeof(*sh));
  tbb_daemon_stop(&d);
}
