/* SPDX-License-Identifier: Apache-2.0 */
/* Scenario 7: scenario 4's hand-off protocol with host memory, on any
 * machine. It separates what the hand-off costs without a GPU (system calls,
 * process wake-ups, the daemon hop) from what CUDA adds.
 *
 * tb: the producer publishes a small host tensor (one buffer, rewritten each
 * round), the consumer acquires NEXT, releases and acks through a pipe-like
 * socketpair; the producer times publish -> ack. Baselines: the same two
 * processes ping-ponging 64 B (what a program without a broker does), and a
 * three-process relay (producer -> relay -> consumer -> ack), the floor of
 * any design that routes the hand-off through a third process. Every row is
 * run with all processes on one CPU and unpinned. */
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HO_CHANNEL "bench/handoff"
#define HO_MSG 64

struct ho_shared {
  long iters, warm;
  uint64_t *rt;     /* producer: publish (or send) -> ack */
  uint64_t *oneway; /* consumer: publish -> acquire returned */
  uint64_t *pub;    /* producer: time in tb_publish */
};

struct ho_arg {
  struct ho_shared *sh;
  const char *sock;
  const char *channel; /* tb: one per run, so that NEXT starts afresh */
  int cpu;
  int in, out;  /* raw: read from in, write to out */
  int ack;      /* producer reads / consumer writes the ack */
  int spin;     /* raw: poll with MSG_DONTWAIT instead of sleeping */
};

/* recv, or with spin a busy loop of non-blocking recvs */
static ssize_t ho_recv(const struct ho_arg *a, int fd, void *buf, size_t n) {
  if (!a->spin)
    return recv(fd, buf, n, 0);
  for (;;) {
    ssize_t r = recv(fd, buf, n, MSG_DONTWAIT);
    if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
      return r;
  }
}

/* ---- raw ---- */

static int raw_producer(void *p) {
  struct ho_arg *a = p;
  char buf[HO_MSG] = {0};
  if (a->cpu >= 0)
    tbb_pin(0, a->cpu);
  for (long i = 0; i < a->sh->warm + a->sh->iters; i++) {
    uint64_t t0 = tbb_now_ns();
    memcpy(buf, &t0, sizeof(t0));
    if (send(a->out, buf, sizeof(buf), MSG_NOSIGNAL) != sizeof(buf) ||
        ho_recv(a, a->ack, buf, sizeof(buf)) <= 0)
      return 2;
    if (i >= a->sh->warm)
      a->sh->rt[i - a->sh->warm] = tbb_now_ns() - t0;
  }
  return 0;
}

/* Relay: forward what arrives on in to out. Consumer: answer on ack. */
static int raw_forward(void *p) {
  struct ho_arg *a = p;
  char buf[HO_MSG];
  if (a->cpu >= 0)
    tbb_pin(0, a->cpu);
  for (long i = 0; i < a->sh->warm + a->sh->iters; i++) {
    if (ho_recv(a, a->in, buf, sizeof(buf)) != sizeof(buf))
      return 2;
    if (send(a->out, buf, sizeof(buf), MSG_NOSIGNAL) != sizeof(buf))
      return 3;
  }
  return 0;
}

/* relay 0: producer <-> consumer; 1: producer -> relay -> consumer. */
static int run_raw(struct ho_shared *sh, int cpu, int relay, int spin) {
  int pc[2], rc2[2], ack[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pc) < 0)
    return -1;
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, rc2) < 0) {
    close(pc[0]);
    close(pc[1]);
    return -1;
  }
  /* ack: consumer -> producer; without relay it is the same pair */
  ack[0] = relay ? rc2[0] : pc[0];
  ack[1] = relay ? rc2[1] : pc[1];
  struct ho_arg pa = {.sh = sh, .cpu = cpu, .out = pc[0], .ack = ack[0],
                      .spin = spin};
  struct ho_arg ra = {.sh = sh, .cpu = cpu, .in = pc[1], .spin = spin};
  struct ho_arg ca = {.sh = sh, .cpu = cpu, .in = pc[1], .out = ack[1],
                      .spin = spin};
  int socks[2];
  pid_t pr = -1;
  if (relay) {
    /* producer -pc-> relay -x-> consumer -rc2-> producer */
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, socks) < 0)
      return -1;
    ra.out = socks[0];
    ca.in = socks[1];
    pr = tbb_spawn(raw_forward, &ra);
  }
  pid_t pcn = tbb_spawn(raw_forward, &ca);
  pid_t pp = tbb_spawn(raw_producer, &pa);
  close(pc[0]);
  close(pc[1]);
  close(rc2[0]);
  close(rc2[1]);
  if (relay) {
    close(socks[0]);
    close(socks[1]);
  }
  int r = tbb_reap(pp);
  r |= tbb_reap(pcn);
  if (relay)
    r |= tbb_reap(pr);
  return r ? -1 : 0;
}

/* ---- tensorbroker ---- */

static int tb_producer(void *p) {
  struct ho_arg *a = p;
  tb_client *c = NULL;
  tb_buffer *b = NULL;
  int ret = 2;
  char x;
  if (a->cpu >= 0)
    tbb_pin(0, a->cpu);
  int rc = tbb_connect(a->sock, "bench-handoff-producer", TB_CONTRACT_SPEC, &c);
  if (rc < 0 || (rc = tb_buffer_create_host(c, 4096, 0, &b)) < 0) {
    fprintf(stderr, "handoff producer: %s\n", tb_strerror(rc));
    goto out;
  }
  uint64_t *data = tb_buffer_data(b);
  int64_t shape[1] = {HO_MSG / 8};
  DLTensor t = {.data = data, .device = {kDLCPU, 0}, .ndim = 1,
                .dtype = {kDLUInt, 64, 1}, .shape = shape};
  struct tb_publish_options po;
  tb_publish_options_init(&po);
  uint64_t ts;
  po.metadata = &ts;
  po.metadata_len = sizeof(ts);
  if (tbb_read_byte(a->ack, &x) < 0) /* the consumer is connected */
    goto out;
  for (long i = 0; i < a->sh->warm + a->sh->iters; i++) {
    data[0] = (uint64_t)i;
    uint64_t t0 = tbb_now_ns();
    ts = t0;
    rc = tb_channel_publish(c, a->channel, &t, &po, NULL);
    uint64_t t1 = tbb_now_ns();
    if (rc < 0) {
      fprintf(stderr, "handoff producer: publish: %s\n", tb_strerror(rc));
      goto out;
    }
    if (tbb_read_byte(a->ack, &x) < 0)
      goto out;
    if (i >= a->sh->warm) {
      a->sh->rt[i - a->sh->warm] = tbb_now_ns() - t0;
      a->sh->pub[i - a->sh->warm] = t1 - t0;
    }
    struct tb_notice n;
    while (tb_notice_poll(c, sizeof(n), &n, 0) == 0)
      ;
  }
  ret = 0;
out:
  tb_buffer_destroy(b);
  tb_client_disconnect(c);
  return ret;
}

static int tb_consumer(void *p) {
  struct ho_arg *a = p;
  tb_client *c = NULL;
  if (a->cpu >= 0)
    tbb_pin(0, a->cpu);
  int rc = tbb_connect(a->sock, "bench-handoff-consumer", TB_CONTRACT_SPEC, &c);
  if (rc < 0) {
    fprintf(stderr, "handoff consumer: connect: %s\n", tb_strerror(rc));
    return 2;
  }
  struct tb_acquire_options o;
  tb_acquire_options_init(&o);
  o.mode = TB_ACQUIRE_NEXT;
  o.timeout_ms = 30000;
  uint64_t last = 0;
  tbb_write_byte(a->out, 'c');
  for (long i = 0; i < a->sh->warm + a->sh->iters; i++) {
    DLManagedTensorVersioned *t;
    struct tb_lease_info li;
    o.version = last;
    rc = tb_lease_acquire(c, a->channel, &o, &t);
    uint64_t now = tbb_now_ns(), ts = 0;
    if (rc < 0) {
      fprintf(stderr, "handoff consumer: acquire: %s\n", tb_strerror(rc));
      tb_client_disconnect(c);
      return 3;
    }
    if (tb_lease_get_info(t, sizeof(li), &li) == 0) {
      last = li.version;
      if (li.metadata_len == sizeof(ts))
        memcpy(&ts, li.metadata, sizeof(ts));
    }
    const uint64_t *d = t->dl_tensor.data;
    int bad = d[0] != (uint64_t)i;
    if (i >= a->sh->warm)
      a->sh->oneway[i - a->sh->warm] = now - ts;
    rc = tb_lease_release(t, NULL);
    if (rc < 0 || bad || tbb_write_byte(a->out, 'a') < 0) {
      fprintf(stderr, "handoff consumer: %s\n",
              bad ? "wrong frame" : tb_strerror(rc));
      tb_client_disconnect(c);
      return 4;
    }
  }
  tb_client_disconnect(c);
  return 0;
}

static int run_tb(struct ho_shared *sh, const struct tbb_daemon *d, int cpu,
                  const char *channel) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
    return -1;
  struct ho_arg pa = {.sh = sh, .sock = d->sock, .channel = channel,
                      .cpu = cpu, .ack = sv[0]};
  struct ho_arg ca = pa;
  ca.ack = -1;
  ca.out = sv[1];
  tbb_pin(d->pid, cpu);
  pid_t pc = tbb_spawn(tb_consumer, &ca);
  pid_t pp = tbb_spawn(tb_producer, &pa);
  close(sv[0]);
  close(sv[1]);
  int r = tbb_reap(pp);
  r |= tbb_reap(pc);
  tbb_pin(d->pid, -1);
  return r ? -1 : 0;
}

void tbb_scenario_handoff(void) {
  tbb_section("7", "hand-off ping-pong, host memory (scenario 4 without a GPU)",
              "tb: the producer publishes a uint64[8] host tensor, the "
              "consumer acquires NEXT, checks it, releases and acks through a "
              "socketpair; the producer times publish -> ack. raw: the same "
              "two processes ping-pong 64 B; raw relay: producer -> relay "
              "process -> consumer -> producer, the floor of any hand-off "
              "through a third process. 'one core': every process (and the "
              "daemon) pinned to the same CPU with sched_setaffinity");
  struct ho_shared *sh = tbb_shared_alloc(sizeof(*sh));
  long iters = tbb_scale(20000, 5000, 300);
  sh->iters = iters;
  sh->warm = iters / 10 + 100;
  size_t bytes = sizeof(uint64_t) * (size_t)iters;
  sh->rt = tbb_shared_alloc(bytes);
  sh->oneway = tbb_shared_alloc(bytes);
  sh->pub = tbb_shared_alloc(bytes);
  /* Busy polling only unpinned: processes spinning on one CPU would only
   * take it from each other. The defaults do not poll on one CPU (nor on
   * fewer than 4), so "one core" runs the defaults; "unpinned" too, and,
   * to show what the default window does, with no polling at all. */
  struct {
    const char *label;
    int cpu;
    enum tbb_polling poll;
  } modes[] = {{"one core", tbb_opt.cpu_a, TBB_POLL_DEFAULT},
               {"unpinned, no polling", -1, TBB_POLL_NONE},
               {"unpinned", -1, TBB_POLL_DEFAULT},
               {"unpinned, busy polling", -1, TBB_POLL_BUSY}};
  for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
    char base[96], name[96];
    int spin = modes[m].poll == TBB_POLL_BUSY;
    if (spin && tbb_opt.ncpus < 4) {
      tbb_note("busy polling: skipped, fewer than 4 CPUs (three processes "
               "spin)");
      continue;
    }
    if (spin)
      tbb_note("busy polling: raw processes poll with MSG_DONTWAIT; "
               "tensorbrokerd --busy-poll %d, clients' spin_us = %d",
               tbb_busy_poll_us, tbb_busy_poll_us);
    snprintf(base, sizeof(base), "raw ping-pong [%s]", modes[m].label);
    if (run_raw(sh, modes[m].cpu, 0, spin) == 0)
      tbb_row_latency(base, sh->rt, (size_t)iters, NULL);
    else
      tbb_failed("%s", base);
    snprintf(name, sizeof(name), "raw relay via a third process [%s]",
             modes[m].label);
    if (run_raw(sh, modes[m].cpu, 1, spin) == 0)
      tbb_row_latency(name, sh->rt, (size_t)iters, base);
    else
      tbb_failed("%s", name);
    char channel[64];
    snprintf(channel, sizeof(channel), HO_CHANNEL "/%zu", m);
    snprintf(name, sizeof(name), "tb hand-off [%s]", modes[m].label);
    /* a daemon for each row: it reads its CPUs at its first request (the
     * default polling window needs 4 or more), and then once a second */
    struct tbb_daemon d;
    if (tbb_daemon_start_polling(&d, modes[m].poll) < 0)
      continue;
    tbb_spin_us = tbb_polling_spin_us(modes[m].poll);
    int rc = run_tb(sh, &d, modes[m].cpu, channel);
    tbb_daemon_stop(&d);
    tbb_spin_us = 0;
    if (rc == 0) {
      tbb_row_latency(name, sh->rt, (size_t)iters, base);
      snprintf(name, sizeof(name), "tb one-way, publish -> acquired [%s]",
               modes[m].label);
      tbb_row_latency(name, sh->oneway, (size_t)iters, NULL);
      snprintf(name, sizeof(name), "tb time in tb_publish [%s]",
               modes[m].label);
      tbb_row_latency(name, sh->pub, (size_t)iters, NULL);
    } else {
      tbb_failed("%s", name);
    }
  }

  tbb_shared_free(sh->rt, bytes);
  tbb_shared_free(sh->oneway, bytes);
  tbb_shared_free(sh->pub, bytes);
  tbb_shared_free(sh, sizeof(*sh));
}
