/* SPDX-License-Identifier: Apache-2.0 */
/* Scenario 2: acquire/release throughput.
 *
 * (a) P consumer processes cycle acquire(LATEST) + release on one channel
 *     for a fixed time; (b) C channels, each consumed by exactly one
 *     consumer: one consumer process cycles round-robin over all C
 *     channels, so the channel count is the only thing that changes.
 * The daemon's CPU time comes from /proc/<pid>/stat (utime + stime) over
 * the measured window, its peak RSS from VmHWM after resetting it
 * (clear_refs 5) before the window. */
#include "bench.h"
#include "producer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SAMPLES_TOTAL 400000

struct cons_slot {
  uint64_t cycles;
  uint64_t ns;
  uint64_t nsamples;
  int failed;
};

struct cons_arg {
  const char *sock;
  const char *prefix;
  long first, step, nchan; /* channels first, first+step, ... < nchan */
  int releasing; /* each acquire releases the previous lease */
  int ready_wr;
  struct tbb_gate *gate;
  volatile uint64_t *deadline; /* shared, set before the gate opens */
  struct cons_slot *slot;
  uint64_t *lat;
  size_t cap;
};

static int consumer_main(void *p) {
  struct cons_arg *a = p;
  tb_client *c;
  int rc = tbb_connect(a->sock, "bench-tp-consumer", TB_CONTRACT_SPEC, &c);
  if (rc < 0) {
    fprintf(stderr, "consumer: connect: %s\n", tb_strerror(rc));
    tbb_write_byte(a->ready_wr, 'x');
    return 2;
  }
  long nmine = (a->nchan - a->first + a->step - 1) / a->step;
  char(*names)[64] = calloc((size_t)nmine, sizeof(*names));
  if (!names)
    return 3;
  for (long i = 0; i < nmine; i++)
    snprintf(names[i], sizeof(names[i]), "%s/%ld", a->prefix,
             a->first + i * a->step);
  struct tb_acquire_options o;
  tb_acquire_options_init(&o);
  tbb_write_byte(a->ready_wr, 'c');
  tbb_gate_wait(a->gate);
  uint64_t end = *a->deadline;
  uint64_t start = tbb_now_ns(), t1 = start, n = 0;
  long k = 0;
  DLManagedTensorVersioned *prev = NULL;
  while (t1 < end) {
    DLManagedTensorVersioned *t;
    uint64_t t0 = t1;
    o.release = prev; /* NULL unless a->releasing */
    prev = NULL;
    rc = tb_lease_acquire(c, names[k], &o, &t);
    if (rc == 0 && a->releasing)
      prev = t;
    else if (rc == 0)
      rc = tb_lease_release(t, NULL);
    t1 = tbb_now_ns();
    if (rc < 0) {
      fprintf(stderr, "consumer: %s: %s\n", names[k], tb_strerror(rc));
      a->slot->failed = 1;
      break;
    }
    a->lat[n % a->cap] = t1 - t0;
    n++;
    if (++k == nmine)
      k = 0;
  }
  if (prev != NULL)
    tb_lease_release(prev, NULL);
  a->slot->cycles = n;
  a->slot->ns = t1 - start;
  a->slot->nsamples = n < a->cap ? n : a->cap;
  free(names);
  tb_client_disconnect(c);
  return a->slot->failed ? 4 : 0;
}

/* Run nproc consumers over nchan channels of the producer's prefix. */
static void run_point(const struct tbb_daemon *d, const char *prefix,
                      long nchan, int nproc, int releasing, uint64_t dur_ns,
                      const char *label) {
  size_t cap = SAMPLES_TOTAL / (size_t)nproc;
  size_t shsize = sizeof(uint64_t) + sizeof(struct cons_slot) * (size_t)nproc +
                  sizeof(uint64_t) * cap * (size_t)nproc;
  char *sh = tbb_shared_alloc(shsize);
  volatile uint64_t *deadline = (uint64_t *)sh;
  struct cons_slot *slots = (struct cons_slot *)(sh + sizeof(uint64_t));
  uint64_t *lat = (uint64_t *)(slots + nproc);
  struct tbb_gate gate;
  int ready[2];
  pid_t *pids = calloc((size_t)nproc, sizeof(pid_t));
  if (!pids || tbb_gate_init(&gate) < 0 || tbb_pipe(ready) < 0) {
    tbb_failed("%s: setup", label);
    free(pids);
    tbb_shared_free(sh, shsize);
    return;
  }
  for (int i = 0; i < nproc; i++) {
    struct cons_arg a = {.sock = d->sock, .prefix = prefix,
                         .first = nchan > 1 ? i : 0,
                         .step = nchan > 1 ? nproc : 1,
                         .nchan = nchan > 1 ? nchan : 1,
                         .releasing = releasing,
                         .ready_wr = ready[1], .gate = &gate,
                         .deadline = deadline, .slot = &slots[i],
                         .lat = lat + cap * (size_t)i, .cap = cap};
    pids[i] = tbb_spawn(consumer_main, &a);
  }
  close(ready[1]);
  int ok = 1;
  for (int i = 0; i < nproc; i++) {
    char b;
    if (tbb_read_byte(ready[0], &b) < 0 || b != 'c')
      ok = 0;
  }
  close(ready[0]);
  tbb_proc_reset_hwm(d->pid);
  int64_t cpu0 = tbb_proc_cpu_ns(d->pid);
  uint64_t w0 = tbb_now_ns();
  *deadline = w0 + dur_ns;
  tbb_gate_open(&gate);
  for (int i = 0; i < nproc; i++)
    if (tbb_reap(pids[i]) != 0)
      ok = 0;
  uint64_t wall = tbb_now_ns() - w0;
  int64_t cpu1 = tbb_proc_cpu_ns(d->pid);
  long hwm = tbb_proc_kib(d->pid, "VmHWM");
  tbb_gate_close(&gate);
  if (!ok) {
    tbb_failed("%s: a consumer failed", label);
  } else {
    double total = 0;
    size_t ns = 0;
    for (int i = 0; i < nproc; i++) {
      total += (double)slots[i].cycles / ((double)slots[i].ns / 1e9);
      /* pack the samples together */
      memmove(lat + ns, lat + cap * (size_t)i,
              sizeof(uint64_t) * slots[i].nsamples);
      ns += slots[i].nsamples;
    }
    double cpu_pct = cpu0 >= 0 && cpu1 >= 0
                         ? 100.0 * (double)(cpu1 - cpu0) / (double)wall
                         : -1;
    const char *keys[] = {"consumers", "channels", "cycles_per_s",
                          "daemon_cpu_pct", "daemon_cpu_us_per_cycle",
                          "daemon_peak_rss_kib"};
    double cycles = 0;
    for (int i = 0; i < nproc; i++)
      cycles += (double)slots[i].cycles;
    double vals[] = {nproc, (double)nchan, total, cpu_pct,
                     cycles > 0 ? (double)(cpu1 - cpu0) / 1e3 / cycles : 0,
                     (double)hwm};
    tbb_row_values(label, 6, keys, vals);
    char lname[128];
    snprintf(lname, sizeof(lname), "%s latency", label);
    tbb_row_latency(lname, lat, ns, NULL);
  }
  free(pids);
  tbb_shared_free(sh, shsize);
}

void tbb_scenario_throughput(void) {
  tbb_section("2", "acquire/release throughput",
              "consumer processes loop acquire(LATEST)+release for a fixed "
              "time, unpinned; daemon CPU from /proc/<pid>/stat, peak RSS from "
              "VmHWM reset before each point");
  uint64_t dur = (uint64_t)tbb_scale(3000, 1000, 200) * 1000000ull;
  /* one producer session publishes up to 10000 channels */
  const char *extra[] = {"--max-channels", "20000",
                         "--max-channels-per-uid", "20000",
                         "--max-channels-per-session", "20000",
                         "--max-sessions", "4096", NULL};
  struct tbb_daemon d;
  if (tbb_daemon_start(&d, extra) < 0) {
    tbb_failed("daemon did not start");
    return;
  }
  /* (a) many consumers, one channel */
  struct tbb_producer prod;
  if (tbb_producer_start(&prod, d.sock, "bench/tp1", 1) < 0) {
    tbb_failed("producer failed");
    tbb_daemon_stop(&d);
    return;
  }
  static const int consumers[] = {1, 4, 16, 64};
  int ncons = (int)tbb_scale(4, 3, 2);
  for (int i = 0; i < ncons; i++) {
    char label[96];
    snprintf(label, sizeof(label), "%d consumer(s), 1 channel", consumers[i]);
    run_point(&d, "bench/tp1", 1, consumers[i], 0, dur, label);
  }
  /* the same loop with each acquire releasing the previous lease
   * (tb_acquire_options.release): one request per cycle instead of two */
  static const int releasing[] = {1, 16};
  for (int i = 0; i < (int)tbb_scale(2, 1, 1); i++) {
    char label[96];
    snprintf(label, sizeof(label),
             "%d consumer(s), 1 channel, releasing the last", releasing[i]);
    run_point(&d, "bench/tp1", 1, releasing[i], 1, dur, label);
  }
  tbb_producer_stop(&prod);

  /* (b) one consumer, many channels */
  static const long channels[] = {1, 100, 10000};
  int nch = (int)tbb_scale(3, 3, 2);
  for (int i = 0; i < nch; i++) {
    long n = channels[i];
    if (tbb_opt.quick && n > 1000)
      n = 1000;
    char prefix[32], label[96];
    snprintf(prefix, sizeof(prefix), "bench/tpc%d", i);
    if (tbb_producer_start(&prod, d.sock, prefix, n) < 0) {
      tbb_failed("producer for %ld channels", n);
      continue;
    }
    snprintf(label, sizeof(label), "1 consumer, %ld channel(s) round-robin",
             n);
    run_point(&d, prefix, n, 1, 0, dur, label);
    tbb_producer_stop(&prod);
  }
  tbb_daemon_stop(&d);
}
