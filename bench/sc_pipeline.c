/* SPDX-License-Identifier: Apache-2.0 */
/* Scenario 6: a producer feeding two consumers, 1 MiB and 64 MiB frames.
 *
 * The producer cycles through a ring of 4 frame buffers: before it rewrites
 * a slot it waits until the version last published from it is free
 * (tb_wait_free), writes a small frame header (host: the frame number in the
 * first bytes; GPU: a 64-byte cuMemsetD32Async on its stream), and
 * publishes with history depth 1 and its CLOCK_MONOTONIC timestamp in the
 * metadata. Frame bodies are not rewritten, so the figures measure the
 * hand-off, not memory bandwidth. Each consumer acquires NEXT after the last
 * version it saw (so it skips frames only when it falls behind), host: reads
 * the header; GPU: passes its stream and synchronises it, then takes the
 * end-to-end latency = now - the producer's timestamp, and releases. */
#include "bench.h"
#include "gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RING 4
#define LAT_CAP 200000

struct frame_meta {
  uint64_t t_ns;
  uint64_t frame;
  uint32_t end;
};

struct pipe_shared {
  uint64_t deadline;
  uint64_t produced, prod_ns;
  struct {
    uint64_t frames, skipped, ns, nlat;
    int bad;
  } cons[2];
  uint64_t lat[2][LAT_CAP];
};

struct pipe_arg {
  const char *sock;
  const char *channel;
  size_t frame;
  int gpu;
  int idx;
  int ready_wr;
  struct tbb_gate *go, *done;
  struct pipe_shared *sh;
};

static int pipe_producer(void *p) {
  struct pipe_arg *a = p;
  struct tbb_gpu g = {0};
  tb_client *c = NULL;
  tb_buffer *hb[RING] = {0};
  tb_cu_deviceptr db[RING] = {0};
  void *data[RING];
  void *stream = NULL;
  int rc, ret = 2;
  if (a->gpu) {
    if (tbb_gpu_init(&g) < 0)
      goto out;
    stream = g.stream;
  }
  rc = tbb_connect(a->sock, "bench-pipe-producer", TB_CONTRACT_SPEC, &c);
  if (rc < 0) {
    fprintf(stderr, "pipeline producer: connect: %s\n", tb_strerror(rc));
    goto out;
  }
  for (int i = 0; i < RING; i++) {
    if (a->gpu) {
      tb_cu_result r = g.cu->cuMemAlloc(&db[i], a->frame);
      if (r) {
        tbb_cu_fail(&g, "cuMemAlloc", r);
        goto out;
      }
      g.cu->cuMemsetD32Async(db[i], 0, a->frame / 4, g.stream);
      data[i] = (void *)(uintptr_t)db[i];
    } else {
      rc = tb_buffer_create_host(c, a->frame, 0, &hb[i]);
      if (rc < 0) {
        fprintf(stderr, "pipeline producer: buffer: %s\n", tb_strerror(rc));
        goto out;
      }
      data[i] = tb_buffer_data(hb[i]);
      memset(data[i], 0, a->frame);
    }
  }
  int64_t shape[1] = {(int64_t)(a->frame / 4)};
  uint64_t ver[RING] = {0};
  struct tb_publish_options po;
  tb_publish_options_init(&po);
  po.history_depth = 1;
  po.stream = stream;
  tbb_write_byte(a->ready_wr, 'p');
  tbb_gate_wait(a->go);
  uint64_t start = tbb_now_ns(), f = 0;
  for (int end = 0; !end; f++) {
    int s = (int)(f % RING);
    end = tbb_now_ns() >= a->sh->deadline;
    if (ver[s]) {
      rc = tb_channel_wait_free(c, a->channel, ver[s], 30000, stream);
      if (rc < 0) {
        fprintf(stderr, "pipeline producer: wait_free: %s\n", tb_strerror(rc));
        goto out;
      }
    }
    if (a->gpu)
      g.cu->cuMemsetD32Async(db[s], (unsigned)f, 16, g.stream);
    else
      memcpy(data[s], &f, sizeof(f));
    struct frame_meta m = {.t_ns = tbb_now_ns(), .frame = f,
                           .end = (uint32_t)end};
    po.metadata = &m;
    po.metadata_len = sizeof(m);
    DLTensor t = {.data = data[s],
                  .device = {a->gpu ? kDLCUDA : kDLCPU, 0},
                  .ndim = 1, .dtype = {kDLFloat, 32, 1}, .shape = shape};
    rc = tb_channel_publish(c, a->channel, &t, &po, &ver[s]);
    if (rc < 0) {
      fprintf(stderr, "pipeline producer: publish: %s\n", tb_strerror(rc));
      goto out;
    }
  }
  a->sh->produced = f;
  a->sh->prod_ns = tbb_now_ns() - start;
  /* Stay connected until the consumers have seen the end frame. */
  tbb_gate_wait(a->done);
  ret = 0;
out:
  if (ret)
    tbb_write_byte(a->ready_wr, 'x');
  for (int i = 0; i < RING; i++)
    tb_buffer_destroy(hb[i]);
  tb_client_disconnect(c);
  if (a->gpu && g.cu) {
    g.cu->cuStreamSynchronize(g.stream);
    for (int i = 0; i < RING; i++)
      if (db[i])
        g.cu->cuMemFree(db[i]);
    tbb_gpu_fini(&g);
  }
  return ret;
}

static int pipe_consumer(void *p) {
  struct pipe_arg *a = p;
  struct tbb_gpu g = {0};
  tb_client *c = NULL;
  int rc, ret = 2;
  if (a->gpu && tbb_gpu_init(&g) < 0)
    goto out;
  rc = tbb_connect(a->sock, "bench-pipe-consumer", TB_CONTRACT_SPEC, &c);
  if (rc < 0) {
    fprintf(stderr, "pipeline consumer: connect: %s\n", tb_strerror(rc));
    goto out;
  }
  struct tb_acquire_options o;
  tb_acquire_options_init(&o);
  o.mode = TB_ACQUIRE_NEXT;
  o.timeout_ms = 30000;
  o.stream = a->gpu ? (void *)g.stream : NULL;
  tbb_write_byte(a->ready_wr, 'c');
  tbb_gate_wait(a->go);
  uint64_t start = tbb_now_ns(), last = 0, n = 0, skipped = 0, nl = 0;
  for (;;) {
    DLManagedTensorVersioned *t;
    o.version = last;
    rc = tb_lease_acquire(c, a->channel, &o, &t);
    if (rc < 0) {
      fprintf(stderr, "pipeline consumer: acquire: %s\n", tb_strerror(rc));
      goto out;
    }
    struct tb_lease_info li;
    struct frame_meta m = {0};
    if (tb_lease_get_info(t, sizeof(li), &li) == 0 &&
        li.metadata_len == sizeof(m))
      memcpy(&m, li.metadata, sizeof(m));
    if (a->gpu) {
      g.cu->cuStreamSynchronize(g.stream);
    } else {
      uint64_t hdr;
      memcpy(&hdr, (const char *)t->dl_tensor.data + t->dl_tensor.byte_offset,
             sizeof(hdr));
      if (hdr != m.frame)
        a->sh->cons[a->idx].bad++;
    }
    uint64_t now = tbb_now_ns();
    if (last && li.version > last + 1)
      skipped += li.version - last - 1;
    last = li.version;
    if (!m.end) {
      a->sh->lat[a->idx][nl % LAT_CAP] = now - m.t_ns;
      nl++;
      n++;
    }
    rc = tb_lease_release(t, a->gpu ? (void *)g.stream : NULL);
    if (rc < 0) {
      fprintf(stderr, "pipeline consumer: release: %s\n", tb_strerror(rc));
      goto out;
    }
    if (m.end)
      break;
  }
  a->sh->cons[a->idx].frames = n;
  a->sh->cons[a->idx].skipped = skipped;
  a->sh->cons[a->idx].ns = tbb_now_ns() - start;
  a->sh->cons[a->idx].nlat = nl < LAT_CAP ? nl : LAT_CAP;
  ret = 0;
out:
  if (ret)
    tbb_write_byte(a->ready_wr, 'x');
  tb_client_disconnect(c);
  if (a->gpu && g.cu)
    tbb_gpu_fini(&g);
  return ret;
}

static void run_size(const struct tbb_daemon *d, size_t frame, int gpu,
                     uint64_t dur_ns) {
  char label[96], channel[64];
  snprintf(label, sizeof(label), "%s %zu MiB frames", gpu ? "GPU" : "host",
           frame >> 20);
  snprintf(channel, sizeof(channel), "bench/pipe/%s%zu", gpu ? "gpu" : "host",
           frame >> 20);
  struct pipe_shared *sh = tbb_shared_alloc(sizeof(*sh));
  struct tbb_gate go, done;
  int ready[2];
  if (tbb_gate_init(&go) < 0 || tbb_gate_init(&done) < 0 ||
      tbb_pipe(ready) < 0) {
    tbb_failed("%s: setup", label);
    tbb_shared_free(sh, sizeof(*sh));
    return;
  }
  struct pipe_arg a = {.sock = d->sock, .channel = channel, .frame = frame,
                       .gpu = gpu, .ready_wr = ready[1], .go = &go,
                       .done = &done, .sh = sh};
  pid_t prod = tbb_spawn(pipe_producer, &a);
  pid_t cons[2];
  for (int i = 0; i < 2; i++) {
    a.idx = i;
    cons[i] = tbb_spawn(pipe_consumer, &a);
  }
  close(ready[1]);
  int ok = 1;
  for (int i = 0; i < 3; i++) {
    char b;
    if (tbb_read_byte(ready[0], &b) < 0 || b == 'x')
      ok = 0;
    if (!ok)
      break;
  }
  sh->deadline = tbb_now_ns() + dur_ns;
  tbb_gate_open(&go);
  for (int i = 0; i < 2; i++)
    if (tbb_reap(cons[i]) != 0)
      ok = 0;
  tbb_gate_open(&done);
  if (tbb_reap(prod) != 0)
    ok = 0;
  close(ready[0]);
  tbb_gate_close(&go);
  tbb_gate_close(&done);
  if (!ok) {
    tbb_failed("%s", label);
  } else {
    double pfps = (double)sh->produced / ((double)sh->prod_ns / 1e9);
    const char *keys[] = {"producer_fps", "consumer0_fps", "consumer1_fps",
                          "consumer0_skipped", "consumer1_skipped",
                          "bad_headers"};
    double vals[6] = {pfps, 0, 0, (double)sh->cons[0].skipped,
                      (double)sh->cons[1].skipped,
                      (double)(sh->cons[0].bad + sh->cons[1].bad)};
    for (int i = 0; i < 2; i++)
      vals[1 + i] = (double)sh->cons[i].frames / ((double)sh->cons[i].ns / 1e9);
    tbb_row_values(label, 6, keys, vals);
    size_t n0 = sh->cons[0].nlat, n1 = sh->cons[1].nlat, n = n0;
    if (n0 + n1 <= LAT_CAP) { /* both consumers' samples in one row */
      memmove(&sh->lat[0][n0], sh->lat[1], n1 * sizeof(uint64_t));
      n = n0 + n1;
    }
    char lname[128];
    snprintf(lname, sizeof(lname), "%s end-to-end latency", label);
    tbb_row_latency(lname, sh->lat[0], n, NULL);
  }
  tbb_shared_free(sh, sizeof(*sh));
}

void tbb_scenario_pipeline(int gpu) {
  tbb_section(gpu ? "6-gpu" : "6-host",
              gpu ? "pipeline, producer -> 2 consumers, GPU memory"
                  : "pipeline, producer -> 2 consumers, host memory",
              "ring of 4 frames, wait_free before reuse, history depth 1, "
              "consumers acquire NEXT; latency = consumer's time after "
              "acquire (GPU: and stream sync) - producer's timestamp in the "
              "metadata; unpinned");
  if (gpu && !tbb_gpu_present()) {
    tbb_skip("no GPU");
    return;
  }
  struct tbb_daemon d;
  if (tbb_daemon_start(&d, NULL) < 0) {
    tbb_failed("daemon did not start");
    return;
  }
  uint64_t dur = (uint64_t)tbb_scale(3000, 1000, 200) * 1000000ull;
  run_size(&d, (size_t)1 << 20, gpu, dur);
  run_size(&d, (size_t)64 << 20, gpu, dur);
  tbb_daemon_stop(&d);
}
