/* SPDX-License-Identifier: Apache-2.0 */
/* tb-bench: tensorbroker against the baselines users would pick instead,
 * side by side in one run. See docs/benchmarks.md. */
#include "bench.h"

#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef TBB_DEFAULT_DAEMON
#define TBB_DEFAULT_DAEMON "tensorbrokerd"
#endif

static void usage(FILE *f) {
  fprintf(f,
          "usage: tb-bench [options]\n"
          "  --json FILE        also write the results as JSON\n"
          "  --quick            smaller counts and shorter runs\n"
          "  --smoke            a few seconds of the host scenarios (tests)\n"
          "  --gpu-only         only the GPU scenarios (4, 5, GPU half of 6, 9,\n"
          "                     10) and 7 (scenario 4's protocol in host memory)\n"
          "  --host-only        never touch a GPU\n"
          "  --scenarios LIST   e.g. 1,3,6 (default: all, 1-10)\n"
          "  --pin MODE         scenario 1: both (one core, then two cores;\n"
          "                     default), same, split, none\n"
          "  --cpus A,B         the CPUs used for pinning (default: the first\n"
          "                     two this process may use)\n"
          "  --daemon PATH      tensorbrokerd to start (default: $TB_DAEMON,\n"
          "                     else the one built with tb-bench)\n"
          "  --busy-poll-us N   the window of the \"busy polling\" rows (daemon\n"
          "                     --busy-poll and clients' spin_us; default 200)\n");
}

static int parse_long(const char *s, long *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end)
    return -1;
  *out = v;
  return 0;
}

static int parse_scenarios(const char *s, unsigned *out) {
  unsigned m = 0;
  const char *p = s;
  while (*p) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 1 || v > 10)
      return -1;
    m |= 1u << v;
    p = end;
    if (*p == ',')
      p++;
    else if (*p)
      return -1;
  }
  *out = m;
  return m ? 0 : -1;
}

int main(int argc, char **argv) {
  const char *env = getenv("TB_DAEMON");
  tbb_opt.daemon_path = env && *env ? env : TBB_DEFAULT_DAEMON;
  tbb_opt.scenarios = 0x7feu;
  tbb_opt.pin = TBB_PIN_BOTH;
  tbb_opt.cpu_a = tbb_opt.cpu_b = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json") && v) {
      tbb_opt.json_path = v;
      i++;
    } else if (!strcmp(a, "--quick")) {
      tbb_opt.quick = 1;
    } else if (!strcmp(a, "--smoke")) {
      tbb_opt.smoke = 1;
    } else if (!strcmp(a, "--gpu-only")) {
      tbb_opt.gpu_only = 1;
    } else if (!strcmp(a, "--host-only")) {
      tbb_opt.host_only = 1;
    } else if (!strcmp(a, "--daemon") && v) {
      tbb_opt.daemon_path = v;
      i++;
    } else if (!strcmp(a, "--scenarios") && v) {
      if (parse_scenarios(v, &tbb_opt.scenarios) < 0) {
        fprintf(stderr, "tb-bench: bad --scenarios '%s' (numbers 1-8, 10)\n", v);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--pin") && v) {
      if (!strcmp(v, "both"))
        tbb_opt.pin = TBB_PIN_BOTH;
      else if (!strcmp(v, "same"))
        tbb_opt.pin = TBB_PIN_SAME;
      else if (!strcmp(v, "split"))
        tbb_opt.pin = TBB_PIN_SPLIT;
      else if (!strcmp(v, "none"))
        tbb_opt.pin = TBB_PIN_NONE;
      else {
        fprintf(stderr, "tb-bench: bad --pin '%s'\n", v);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--busy-poll-us") && v) {
      long x;
      if (parse_long(v, &x) < 0 || x < 1 || x > 1000000) {
        fprintf(stderr, "tb-bench: bad --busy-poll-us '%s' (1..1000000)\n",
                v);
        return 2;
      }
      tbb_busy_poll_us = (int)x;
      i++;
    } else if (!strcmp(a, "--cpus") && v) {
      long x, y;
      char buf[64];
      snprintf(buf, sizeof(buf), "%s", v);
      char *comma = strchr(buf, ',');
      if (!comma) {
        fprintf(stderr, "tb-bench: --cpus wants A,B\n");
        return 2;
      }
      *comma = 0;
      if (parse_long(buf, &x) < 0 || parse_long(comma + 1, &y) < 0 || x < 0 ||
          y < 0 || x >= CPU_SETSIZE || y >= CPU_SETSIZE) {
        fprintf(stderr, "tb-bench: bad --cpus '%s'\n", v);
        return 2;
      }
      tbb_opt.cpu_a = (int)x;
      tbb_opt.cpu_b = (int)y;
      i++;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "tb-bench: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (tbb_opt.gpu_only && tbb_opt.host_only) {
    fprintf(stderr, "tb-bench: --gpu-only and --host-only exclude each other\n");
    return 2;
  }
  if (tbb_opt.smoke)
    tbb_opt.host_only = 1;

  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  tbb_opt.ncpus = CPU_COUNT(&set);
  if (tbb_opt.cpu_a < 0) {
    int found = 0;
    for (int c = 0; c < CPU_SETSIZE && found < 2; c++) {
      if (CPU_ISSET(c, &set)) {
        if (found++ == 0)
          tbb_opt.cpu_a = tbb_opt.cpu_b = c;
        else
          tbb_opt.cpu_b = c;
      }
    }
  }
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);

  char date[64];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", &tm);
  printf("tb-bench %s, %s, %d CPU(s) allowed, daemon %s%s%s\n", tb_version(),
         date, tbb_opt.ncpus, tbb_opt.daemon_path,
         tbb_opt.smoke ? ", smoke" : tbb_opt.quick ? ", quick" : "",
         tbb_opt.gpu_only ? ", GPU only" : "");
  printf("latencies in microseconds; ratio = p50 / baseline p50\n");

  unsigned sc = tbb_opt.scenarios;
  int gpu = !tbb_opt.host_only && tbb_gpu_present();
  if (!tbb_opt.gpu_only) {
    if (sc & (1u << 1))
      tbb_scenario_rtt();
    if (sc & (1u << 2))
      tbb_scenario_throughput();
    if (sc & (1u << 3))
      tbb_scenario_idle();
  }
  if (sc & (1u << 4))
    tbb_scenario_gpu_handoff();
  if (sc & (1u << 5))
    tbb_scenario_zero_copy();
  if (sc & (1u << 7))
    tbb_scenario_handoff();
  if (sc & (1u << 6)) {
    if (!tbb_opt.gpu_only)
      tbb_scenario_pipeline(0);
    if (gpu || tbb_opt.gpu_only)
      tbb_scenario_pipeline(1);
  }
  if ((sc & (1u << 8)) && !tbb_opt.gpu_only)
    tbb_scenario_flat();
  if (sc & (1u << 9))
    tbb_scenario_vmm_import();
  if (sc & (1u << 10))
    tbb_scenario_pinned();
  if (tbb_opt.json_path) {
    if (tbb_write_json(tbb_opt.json_path, argc, argv) < 0) {
      fprintf(stderr, "tb-bench: cannot write %s\n", tbb_opt.json_path);
      tbb_results_free();
      return 1;
    }
    printf("\nwrote %s\n", tbb_opt.json_path);
  }
  tbb_results_free();
  if (tbb_failures) {
    printf("\n%d part(s) FAILED\n", tbb_failures);
    return 1;
  }
  return 0;
}
