/* SPDX-License-Identifier: Apache-2.0 */
/* Scenario 3: many idle sessions. One process holds N connected tb_clients
 * (Hello done, then nothing); we read the daemon's RSS and time an active
 * client's acquire + release with and without them. */
#include "bench.h"
#include "producer.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct idle_arg {
  const char *sock;
  long n;
  int ready_wr;
  struct tbb_gate *gate;
};

static int idle_holder(void *p) {
  struct idle_arg *a = p;
  tb_client **cs = calloc((size_t)a->n, sizeof(*cs));
  if (!cs)
    return 2;
  tbb_raise_nofile(a->n + 64);
  long i;
  int rc = 0;
  for (i = 0; i < a->n; i++) {
    rc = tbb_connect(a->sock, "bench-idle", TB_CONTRACT_SPEC, &cs[i]);
    if (rc < 0)
      break;
  }
  if (rc < 0)
    fprintf(stderr, "idle holder: connection %ld: %s\n", i, tb_strerror(rc));
  tbb_write_byte(a->ready_wr, rc < 0 ? 'x' : 'i');
  tbb_gate_wait(a->gate);
  for (long j = 0; j < i; j++)
    tb_client_disconnect(cs[j]);
  free(cs);
  return rc < 0 ? 3 : 0;
}

struct active_arg {
  const char *sock;
  long iters;
  uint64_t *lat;
};

static int active_client(void *p) {
  struct active_arg *a = p;
  tb_client *c;
  int rc = tbb_connect(a->sock, "bench-active", TB_CONTRACT_SPEC, &c);
  if (rc < 0)
    return 2;
  struct tb_acquire_options o;
  tb_acquire_options_init(&o);
  long warm = a->iters / 10 + 100;
  for (long i = 0; i < a->iters + warm; i++) {
    DLManagedTensorVersioned *t;
    uint64_t t0 = tbb_now_ns();
    rc = tb_lease_acquire(c, "bench/idle/0", &o, &t);
    if (rc == 0)
      rc = tb_lease_release(t, NULL);
    uint64_t t1 = tbb_now_ns();
    if (rc < 0) {
      fprintf(stderr, "active client: %s\n", tb_strerror(rc));
      tb_client_disconnect(c);
      return 3;
    }
    if (i >= warm)
      a->lat[i - warm] = t1 - t0;
  }
  tb_client_disconnect(c);
  return 0;
}

static long daemon_sessions(const char *sock) {
  tb_client *c;
  struct tb_status st;
  if (tbb_connect(sock, "bench-status", TB_CONTRACT_SPEC, &c) < 0)
    return -1;
  long n = tb_daemon_get_status(c, sizeof(st), &st) == 0 ? (long)st.sessions - 1
                                                         : -1;
  tb_client_disconnect(c);
  return n;
}

void tbb_scenario_idle(void) {
  long nidle = tbb_scale(1000, 1000, 100);
  char how[256];
  snprintf(how, sizeof(how),
           "%ld idle connected sessions held by one process; the active "
           "client times acquire(LATEST)+release, unpinned; RSS = daemon "
           "VmRSS",
           nidle);
  tbb_section("3", "many idle sessions", how);
  long lim = tbb_raise_nofile(nidle + 256);
  if (lim < nidle + 64) {
    tbb_skip("RLIMIT_NOFILE too low");
    return;
  }
  char maxs[32];
  snprintf(maxs, sizeof(maxs), "%ld", nidle * 2 + 64);
  const char *extra[] = {"--max-sessions", maxs, NULL};
  struct tbb_daemon d;
  if (tbb_daemon_start(&d, extra) < 0) {
    tbb_failed("daemon did not start");
    return;
  }
  struct tbb_producer prod;
  if (tbb_producer_start(&prod, d.sock, "bench/idle", 1) < 0) {
    tbb_failed("producer failed");
    tbb_daemon_stop(&d);
    return;
  }
  long iters = tbb_scale(30000, 5000, 300);
  uint64_t *lat = tbb_shared_alloc(sizeof(uint64_t) * (size_t)iters);
  struct active_arg aa = {.sock = d.sock, .iters = iters, .lat = lat};

  long rss0 = tbb_proc_kib(d.pid, "VmRSS");
  int ok = tbb_reap(tbb_spawn(active_client, &aa)) == 0;
  if (ok)
    tbb_row_latency("active client, no idle sessions", lat, (size_t)iters,
                    NULL);
  else
    tbb_failed("active client, no idle sessions");

  struct tbb_gate gate;
  int ready[2];
  if (tbb_gate_init(&gate) == 0 && tbb_pipe(ready) == 0) {
    struct idle_arg ia = {.sock = d.sock, .n = nidle, .ready_wr = ready[1],
                          .gate = &gate};
    pid_t holder = tbb_spawn(idle_holder, &ia);
    close(ready[1]);
    char b = 0;
    tbb_read_byte(ready[0], &b);
    close(ready[0]);
    if (b == 'i') {
      long rss1 = tbb_proc_kib(d.pid, "VmRSS");
      long seen = daemon_sessions(d.sock);
      char name[96];
      snprintf(name, sizeof(name), "active client, %ld idle sessions", nidle);
      if (tbb_reap(tbb_spawn(active_client, &aa)) == 0)
        tbb_row_latency(name, lat, (size_t)iters,
                        "active client, no idle sessions");
      else
        tbb_failed("%s", name);
      const char *keys[] = {"idle_sessions", "daemon_sessions_seen",
                            "daemon_rss_kib_before", "daemon_rss_kib_after",
                            "kib_per_session"};
      double vals[] = {(double)nidle, (double)seen, (double)rss0,
                       (double)rss1, (double)(rss1 - rss0) / (double)nidle};
      tbb_row_values("daemon memory", 5, keys, vals);
    } else {
      tbb_failed("the idle holder could not open %ld sessions", nidle);
    }
    tbb_gate_open(&gate);
    tbb_reap(holder);
    tbb_gate_close(&gate);
  }
  tbb_producer_stop(&prod);
  tbb_daemon_stop(&d);
  tbb_shared_free(lat, sizeof(uint64_t) * (size_t)iters);
}
