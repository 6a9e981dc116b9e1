/* SPDX-License-Identifier: Apache-2.0 */
/* Scenario 1: control-plane round trip with host memory.
 *
 * tensorbroker: a consumer process times tb_lease_acquire(LATEST) +
 * tb_lease_release() of a small host tensor that a producer process published
 * once. Baseline: two processes ping-pong datagrams of the same sizes over an
 * AF_UNIX SOCK_SEQPACKET socketpair (request = an encoded Acquire, reply =
 * an encoded AcquireReply), the floor for any request/reply over a Unix
 * socket. A second baseline adds the one-way Release datagram, which is
 * exactly the traffic of acquire + release. A second tensorbroker row has
 * each acquire release the previous lease in the same request
 * (tb_acquire_options.release), the traffic of the plain ping-pong. Both
 * sides are pinned the same
 * way: the consumer and the daemon (or the two raw processes) on one core,
 * then on two different cores. */
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tb_proto.h"

#define RTT_CHANNEL "bench/rtt"
#define RTT_ELEMS 64

struct msg_sizes {
  size_t req, reply, release, req_releasing;
};

/* Encoded sizes of the datagrams acquire + release exchange, built with the
 * project's codec from the same values the run uses. */
static void wire_sizes(struct msg_sizes *out) {
  uint8_t buf[4096];
  Tensorbroker__V1__Acquire acq = TENSORBROKER__V1__ACQUIRE__INIT;
  acq.channel = (char *)RTT_CHANNEL;
  acq.timeout_ms = -1;
  Tensorbroker__V1__Request req = TENSORBROKER__V1__REQUEST__INIT;
  req.request_id = 12345;
  req.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  req.acquire = &acq;
  long n = tb__request_encode(&req, buf, sizeof(buf));
  out->req = n > 0 ? (size_t)n : 32;
  acq.release_lease_id = 12345; /* an Acquire that releases the last lease */
  n = tb__request_encode(&req, buf, sizeof(buf));
  out->req_releasing = n > 0 ? (size_t)n : 32;
  acq.release_lease_id = 0;

  Tensorbroker__V1__Release rel = TENSORBROKER__V1__RELEASE__INIT;
  rel.lease_id = 12345;
  Tensorbroker__V1__Request rreq = TENSORBROKER__V1__REQUEST__INIT;
  rreq.body_case = TENSORBROKER__V1__REQUEST__BODY_RELEASE;
  rreq.release = &rel;
  n = tb__request_encode(&rreq, buf, sizeof(buf));
  out->release = n > 0 ? (size_t)n : 8;

  int64_t shape[1] = {RTT_ELEMS};
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;
  dev.type = 1; /* kDLCPU */
  Tensorbroker__V1__Layout lay = TENSORBROKER__V1__LAYOUT__INIT;
  lay.device = &dev;
  lay.dtype_code = 2;
  lay.dtype_bits = 32;
  lay.dtype_lanes = 1;
  lay.n_shape = 1;
  lay.shape = shape;
  lay.flags = 1;
  Tensorbroker__V1__Device bdev = TENSORBROKER__V1__DEVICE__INIT;
  bdev.type = 1;
  Tensorbroker__V1__BufferInfo bi = TENSORBROKER__V1__BUFFER_INFO__INIT;
  bi.buffer_id = 1;
  bi.generation = 1;
  bi.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
  bi.size = 4096;
  bi.device = &bdev;
  bi.producer_pid = 123456;
  Tensorbroker__V1__AcquireReply ar = TENSORBROKER__V1__ACQUIRE_REPLY__INIT;
  ar.lease_id = 12345;
  ar.version = 1;
  ar.layout = &lay;
  ar.buffer = &bi;
  ar.channel = (char *)RTT_CHANNEL;
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  rep.request_id = 12345;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_ACQUIRE;
  rep.acquire = &ar;
  Tensorbroker__V1__ServerMessage sm = TENSORBROKER__V1__SERVER_MESSAGE__INIT;
  sm.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY;
  sm.reply = &rep;
  n = tb__server_message_encode(&sm, buf, sizeof(buf));
  out->reply = n > 0 ? (size_t)n : 64;
}

/* ---- raw socketpair ping-pong ---- */

struct raw_arg {
  int sock;
  int cpu;
  long iters, warmup;
  int with_release;
  struct msg_sizes sz;
  uint64_t *lat; /* shared: iters samples */
};

static int raw_echo(void *p) {
  struct raw_arg *a = p;
  char buf[4096];
  memset(buf, 'r', sizeof(buf));
  if (a->cpu >= 0)
    tbb_pin(0, a->cpu);
  for (long i = 0; i < a->iters + a->warmup; i++) {
    if (recv(a->sock, buf, sizeof(buf), 0) <= 0)
      return 2;
    if (send(a->sock, buf, a->sz.reply, MSG_NOSIGNAL) < 0)
      return 3;
    if (a->with_release && recv(a->sock, buf, sizeof(buf), 0) <= 0)
      return 4;
  }
  return 0;
}

static int raw_client(void *p) {
  struct raw_arg *a = p;
  char buf[4096];
  memset(buf, 'q', sizeof(buf));
  if (a->cpu >= 0)
    tbb_pin(0, a->cpu);
  for (long i = 0; i < a->iters + a->warmup; i++) {
    uint64_t t0 = tbb_now_ns();
    if (send(a->sock, buf, a->sz.req, MSG_NOSIGNAL) < 0)
      return 2;
    if (recv(a->sock, buf, sizeof(buf), 0) <= 0)
      return 3;
    if (a->with_release &&
        send(a->sock, buf, a->sz.release, MSG_NOSIGNAL) < 0)
      return 4;
    uint64_t t1 = tbb_now_ns();
    if (i >= a->warmup)
      a->lat[i - a->warmup] = t1 - t0;
  }
  return 0;
}

/* Run the raw ping-pong with the client on cpu_c and the echo on cpu_s. */
static int run_raw(int cpu_c, int cpu_s, long iters, int with_release,
                   const struct msg_sizes *sz, uint64_t *lat) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
    return -1;
  struct raw_arg e = {.sock = sv[1], .cpu = cpu_s, .iters = iters,
                      .warmup = iters / 10 + 100, .with_release = with_release,
                      .sz = *sz};
  struct raw_arg c = e;
  c.sock = sv[0];
  c.cpu = cpu_c;
  c.lat = lat;
  pid_t pe = tbb_spawn(raw_echo, &e);
  pid_t pc = tbb_spawn(raw_client, &c);
  close(sv[0]);
  close(sv[1]);
  int rc1 = tbb_reap(pc), rc2 = tbb_reap(pe);
  return rc1 || rc2 ? -1 : 0;
}

/* ---- tensorbroker acquire + release ---- */

struct tb_arg {
  const char *sock;
  int cpu;
  long iters, warmup;
  int releasing; /* each acquire releases the previous lease */
  int ready_wr;
  struct tbb_gate *gate;
  uint64_t *lat;
};

static int tb_producer(void *p) {
  struct tb_arg *a = p;
  tb_client *c;
  tb_buffer *b;
  int rc = tbb_connect(a->sock, "bench-rtt-producer", TB_CONTRACT_SPEC, &c);
  if (rc < 0) {
    fprintf(stderr, "rtt producer: connect: %s\n", tb_strerror(rc));
    return 2;
  }
  rc = tb_buffer_create_host(c, 4096, 0, &b);
  if (rc < 0) {
    fprintf(stderr, "rtt producer: buffer: %s\n", tb_strerror(rc));
    return 3;
  }
  float *x = tb_buffer_data(b);
  for (int i = 0; i < RTT_ELEMS; i++)
    x[i] = (float)i;
  int64_t shape[1] = {RTT_ELEMS};
  DLTensor t = {.data = x, .device = {kDLCPU, 0}, .ndim = 1,
                .dtype = {kDLFloat, 32, 1}, .shape = shape};
  rc = tb_channel_publish(c, RTT_CHANNEL, &t, NULL, NULL);
  if (rc < 0) {
    fprintf(stderr, "rtt producer: publish: %s\n", tb_strerror(rc));
    return 4;
  }
  tbb_write_byte(a->ready_wr, 'p');
  tbb_gate_wait(a->gate); /* until the parent is done measuring */
  tb_buffer_destroy(b);
  tb_client_disconnect(c);
  return 0;
}

static int tb_consumer(void *p) {
  struct tb_arg *a = p;
  tb_client *c;
  if (a->cpu >= 0)
    tbb_pin(0, a->cpu);
  int rc = tbb_connect(a->sock, "bench-rtt-consumer", TB_CONTRACT_SPEC, &c);
  if (rc < 0) {
    fprintf(stderr, "rtt consumer: connect: %s\n", tb_strerror(rc));
    return 2;
  }
  struct tb_acquire_options o;
  tb_acquire_options_init(&o);
  o.mode = TB_ACQUIRE_LATEST;
  DLManagedTensorVersioned *prev = NULL;
  for (long i = 0; i < a->iters + a->warmup; i++) {
    DLManagedTensorVersioned *t;
    uint64_t t0 = tbb_now_ns();
    o.release = prev; /* NULL unless a->releasing */
    prev = NULL;
    rc = tb_lease_acquire(c, RTT_CHANNEL, &o, &t);
    if (rc == 0 && a->releasing)
      prev = t;
    else if (rc == 0)
      rc = tb_lease_release(t, NULL);
    uint64_t t1 = tbb_now_ns();
    if (rc < 0) {
      fprintf(stderr, "rtt consumer: acquire/release: %s\n", tb_strerror(rc));
      tb_client_disconnect(c);
      return 3;
    }
    if (i >= a->warmup)
      a->lat[i - a->warmup] = t1 - t0;
  }
  if (prev != NULL)
    tb_lease_release(prev, NULL);
  tb_client_disconnect(c);
  return 0;
}

static int run_tb(const struct tbb_daemon *d, int cpu_c, int cpu_s, long iters,
                  int releasing, uint64_t *lat) {
  struct tbb_gate gate;
  int ready[2];
  if (tbb_gate_init(&gate) < 0 || tbb_pipe(ready) < 0)
    return -1;
  struct tb_arg a = {.sock = d->sock, .cpu = cpu_c, .iters = iters,
                     .warmup = iters / 10 + 100, .releasing = releasing,
                     .ready_wr = ready[1],
                     .gate = &gate, .lat = lat};
  tbb_pin(d->pid, cpu_s);
  pid_t pp = tbb_spawn(tb_producer, &a);
  close(ready[1]);
  char b;
  int rc = -1;
  if (tbb_read_byte(ready[0], &b) == 0) {
    pid_t pc = tbb_spawn(tb_consumer, &a);
    rc = tbb_reap(pc) == 0 ? 0 : -1;
  }
  tbb_gate_open(&gate);
  if (tbb_reap(pp) != 0)
    rc = -1;
  tbb_gate_close(&gate);
  close(ready[0]);
  tbb_pin(d->pid, -1);
  return rc;
}

void tbb_scenario_rtt(void) {
  struct msg_sizes sz;
  wire_sizes(&sz);
  char how[512];
  snprintf(how, sizeof(how),
           "tb: acquire(LATEST)+release of float32[%d] in host memory, timed "
           "in the consumer; raw: SOCK_SEQPACKET socketpair ping-pong, "
           "request %zu B, reply %zu B (+ one-way %zu B release in the "
           "3-datagram row); \"releasing the last\": each acquire carries "
           "the previous lease's release (request %zu B); ratio = p50 / raw "
           "ping-pong p50",
           RTT_ELEMS, sz.req, sz.reply, sz.release, sz.req_releasing);
  tbb_section("1", "control-plane round trip, host memory", how);

  long iters = tbb_scale(50000, 10000, 500);
  /* The four rows of a pinning run in turns, ROUNDS blocks each, so that
   * the hypervisor's slow and fast minutes fall on all of them alike. */
  enum { ROWS = 4, ROUNDS = 5 };
  long rounds = iters >= 10000 ? ROUNDS : 1, per = iters / rounds;
  iters = per * rounds;
  uint64_t *lat = tbb_shared_alloc(sizeof(uint64_t) * (size_t)iters * ROWS);

  struct {
    const char *label;
    int mode;
    int cpu_c, cpu_s;
  } modes[] = {
      {"one core", TBB_PIN_SAME, tbb_opt.cpu_a, tbb_opt.cpu_a},
      {"two cores", TBB_PIN_SPLIT, tbb_opt.cpu_a, tbb_opt.cpu_b},
      {"unpinned", TBB_PIN_NONE, -1, -1},
  };
  for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
    int want = tbb_opt.pin == modes[m].mode ||
               (tbb_opt.pin == TBB_PIN_BOTH && modes[m].mode != TBB_PIN_NONE);
    if (!want)
      continue;
    if (modes[m].mode == TBB_PIN_SPLIT && tbb_opt.ncpus < 2) {
      tbb_note("two cores: skipped, only one CPU allowed");
      continue;
    }
    if (modes[m].mode == TBB_PIN_NONE)
      tbb_note("unpinned: the scheduler places every process");
    else
      tbb_note("%s: consumer (or raw client) on CPU %d, daemon (or raw echo) "
               "on CPU %d, via sched_setaffinity",
               modes[m].label, modes[m].cpu_c, modes[m].cpu_s);
    if (rounds > 1)
      tbb_note("%s: the four rows run in turns, %ld blocks of %ld round "
               "trips each (after %ld warm-up ones per block)",
               modes[m].label, rounds, per, per / 10 + 100);
    /* a daemon for each pinning: it reads its CPUs at its first request
     * (the default polling window needs 4 or more), and then once a second */
    struct tbb_daemon d;
    if (tbb_daemon_start(&d, NULL) < 0) {
      tbb_failed("daemon did not start");
      continue;
    }
    int failed[ROWS] = {0};
    for (long b = 0; b < rounds; b++) {
      uint64_t *at[ROWS];
      for (int row = 0; row < ROWS; row++)
        at[row] = lat + (size_t)row * (size_t)iters + (size_t)(b * per);
      failed[0] |= run_raw(modes[m].cpu_c, modes[m].cpu_s, per, 0, &sz, at[0]);
      failed[1] |= run_raw(modes[m].cpu_c, modes[m].cpu_s, per, 1, &sz, at[1]);
      failed[2] |= run_tb(&d, modes[m].cpu_c, modes[m].cpu_s, per, 0, at[2]);
      failed[3] |= run_tb(&d, modes[m].cpu_c, modes[m].cpu_s, per, 1, at[3]);
    }
    tbb_daemon_stop(&d);
    static const char *const rows[ROWS] = {
        "raw ping-pong", "raw 3 datagrams", "tb acquire+release",
        "tb acquire releasing the last"};
    char base[96], name[96];
    snprintf(base, sizeof(base), "%s [%s]", rows[0], modes[m].label);
    for (int row = 0; row < ROWS; row++) {
      snprintf(name, sizeof(name), "%s [%s]", rows[row], modes[m].label);
      if (failed[row])
        tbb_failed("%s", name);
      else
        tbb_row_latency(name, lat + (size_t)row * (size_t)iters,
                        (size_t)iters, row == 0 ? NULL : base);
    }
  }
  tbb_shared_free(lat, sizeof(uint64_t) * (size_t)iters * ROWS);
}
