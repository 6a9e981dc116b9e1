/* SPDX-License-Identifier: Apache-2.0 */
/* tb-bench helpers: statistics, result table and JSON, child processes,
 * pinning, the daemon under test and /proc readings. */
#include "bench.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct tbb_opts tbb_opt;

long tbb_scale(long full, long quick, long smoke) {
  if (tbb_opt.smoke)
    return smoke;
  if (tbb_opt.quick)
    return quick;
  return full;
}

uint64_t tbb_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static double quantile_us(const uint64_t *ns, size_t n, double q) {
  size_t i = (size_t)(q * (double)n);
  if (i >= n)
    i = n - 1;
  return (double)ns[i] / 1e3;
}

void tbb_summarise(uint64_t *ns, size_t n, struct tbb_summary *out) {
  memset(out, 0, sizeof(*out));
  if (n == 0)
    return;
  qsort(ns, n, sizeof(*ns), cmp_u64);
  long double sum = 0;
  for (size_t i = 0; i < n; i++)
    sum += ns[i];
  out->n = n;
  out->min_us = (double)ns[0] / 1e3;
  out->max_us = (double)ns[n - 1] / 1e3;
  out->p50_us = quantile_us(ns, n, 0.50);
  out->p99_us = quantile_us(ns, n, 0.99);
  out->p999_us = quantile_us(ns, n, 0.999);
  out->mean_us = (double)(sum / n) / 1e3;
}

/* ---- results ---- */

static cJSON *g_sections;
static cJSON *g_cur;      /* current section */
static cJSON *g_cur_rows;

static cJSON *sections(void) {
  if (!g_sections)
    g_sections = cJSON_CreateArray();
  return g_sections;
}

void tbb_section(const char *id, const char *title, const char *how) {
  printf("\n== %s: %s\n", id, title);
  if (how && *how)
    printf("   (%s)\n", how);
  g_cur = cJSON_CreateObject();
  cJSON_AddStringToObject(g_cur, "id", id);
  cJSON_AddStringToObject(g_cur, "title", title);
  cJSON_AddStringToObject(g_cur, "how", how ? how : "");
  g_cur_rows = cJSON_AddArrayToObject(g_cur, "rows");
  cJSON_AddArrayToObject(g_cur, "notes");
  cJSON_AddItemToArray(sections(), g_cur);
  fflush(stdout);
}

static cJSON *find_row(const char *name) {
  cJSON *r;
  cJSON_ArrayForEach(r, g_cur_rows) {
    cJSON *nm = cJSON_GetObjectItem(r, "name");
    if (cJSON_IsString(nm) && strcmp(nm->valuestring, name) == 0)
      return r;
  }
  return NULL;
}

void tbb_row_latency(const char *name, uint64_t *ns, size_t n,
                     const char *ratio_to) {
  struct tbb_summary s;
  tbb_summarise(ns, n, &s);
  double ratio = 0;
  if (ratio_to) {
    cJSON *base = g_cur_rows ? find_row(ratio_to) : NULL;
    cJSON *bp = base ? cJSON_GetObjectItem(base, "p50_us") : NULL;
    if (cJSON_IsNumber(bp) && bp->valuedouble > 0)
      ratio = s.p50_us / bp->valuedouble;
  }
  printf("   %-46s n=%-7zu p50 %9.2f  p99 %9.2f  p99.9 %9.2f  max %9.1f us",
         name, s.n, s.p50_us, s.p99_us, s.p999_us, s.max_us);
  if (ratio > 0)
    printf("  %5.2fx", ratio);
  printf("\n");
  fflush(stdout);
  if (!g_cur_rows)
    return;
  cJSON *r = cJSON_CreateObject();
  cJSON_AddStringToObject(r, "name", name);
  cJSON_AddNumberToObject(r, "n", (double)s.n);
  cJSON_AddNumberToObject(r, "min_us", s.min_us);
  cJSON_AddNumberToObject(r, "p50_us", s.p50_us);
  cJSON_AddNumberToObject(r, "p99_us", s.p99_us);
  cJSON_AddNumberToObject(r, "p999_us", s.p999_us);
  cJSON_AddNumberToObject(r, "max_us", s.max_us);
  cJSON_AddNumberToObject(r, "mean_us", s.mean_us);
  if (ratio > 0) {
    cJSON_AddStringToObject(r, "ratio_to", ratio_to);
    cJSON_AddNumberToObject(r, "ratio_p50", ratio);
  }
  /* The distribution, for plots: quantile → microseconds. */
  if (n > 0) {
    cJSON *cdf = cJSON_AddArrayToObject(r, "cdf");
    static const double tail[] = {0.995, 0.999, 0.9995, 0.9999, 1.0};
    for (int i = 0; i < 104; i++) {
      double q = i < 99 ? (i + 1) / 100.0 : tail[i - 99];
      cJSON *pt = cJSON_CreateArray();
      cJSON_AddItemToArray(pt, cJSON_CreateNumber(q));
      cJSON_AddItemToArray(
          pt, cJSON_CreateNumber(q >= 1.0 ? s.max_us : quantile_us(ns, n, q)));
      cJSON_AddItemToArray(cdf, pt);
    }
  }
  cJSON_AddItemToArray(g_cur_rows, r);
}

void tbb_row_values(const char *name, int count, const char *const *keys,
                    const double *vals) {
  printf("   %-46s", name);
  for (int i = 0; i < count; i++)
    printf(" %s=%.6g", keys[i], vals[i]);
  printf("\n");
  fflush(stdout);
  if (!g_cur_rows)
    return;
  cJSON *r = cJSON_CreateObject();
  cJSON_AddStringToObject(r, "name", name);
  for (int i = 0; i < count; i++)
    cJSON_AddNumberToObject(r, keys[i], vals[i]);
  cJSON_AddItemToArray(g_cur_rows, r);
}

void tbb_note(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  printf("   note: %s\n", buf);
  fflush(stdout);
  if (g_cur)
    cJSON_AddItemToArray(cJSON_GetObjectItem(g_cur, "notes"),
                         cJSON_CreateString(buf));
}

void tbb_skip(const char *why) {
  printf("   skipped: %s\n", why);
  fflush(stdout);
  if (g_cur)
    cJSON_AddStringToObject(g_cur, "skipped", why);
}

int tbb_failures;

void tbb_failed(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  printf("   FAILED: %s\n", buf);
  fflush(stdout);
  tbb_failures++;
  if (g_cur)
    cJSON_AddItemToArray(cJSON_GetObjectItem(g_cur, "notes"),
                         cJSON_CreateString(buf));
}

static void add_machine(cJSON *root) {
  cJSON *m = cJSON_AddObjectToObject(root, "machine");
  struct utsname u;
  if (uname(&u) == 0) {
    cJSON_AddStringToObject(m, "kernel", u.release);
    cJSON_AddStringToObject(m, "hostname", u.nodename);
  }
  cJSON_AddNumberToObject(m, "cpus_online", (double)sysconf(_SC_NPROCESSORS_ONLN));
  cJSON_AddNumberToObject(m, "cpus_allowed", tbb_opt.ncpus);
  FILE *f = fopen("/proc/cpuinfo", "re");
  if (f) {
    char line[256];
    while (fgets(line, sizeof(line), f)) {
      if (strncmp(line, "model name", 10) == 0) {
        char *p = strchr(line, ':');
        if (p) {
          p += 2;
          p[strcspn(p, "\n")] = 0;
          cJSON_AddStringToObject(m, "cpu", p);
        }
        break;
      }
    }
    fclose(f);
  }
}

void tbb_results_free(void) {
  cJSON_Delete(g_sections);
  g_sections = g_cur = g_cur_rows = NULL;
}

int tbb_write_json(const char *path, int argc, char **argv) {
  cJSON *root = cJSON_CreateObject();
  char date[64];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &tm);
  cJSON_AddStringToObject(root, "date", date);
  cJSON_AddStringToObject(root, "library_version", tb_version());
  cJSON *cmd = cJSON_AddArrayToObject(root, "command");
  for (int i = 0; i < argc; i++)
    cJSON_AddItemToArray(cmd, cJSON_CreateString(argv[i]));
  add_machine(root);
  cJSON_AddItemReferenceToObject(root, "sections", sections());
  char *text = cJSON_Print(root);
  int rc = -1;
  if (text) {
    FILE *f = fopen(path, "we");
    if (f) {
      rc = fputs(text, f) < 0 ? -1 : 0;
      if (fclose(f) != 0)
        rc = -1;
    }
    free(text);
  }
  cJSON_Delete(root);
  return rc;
}

/* ---- processes ---- */

void *tbb_shared_alloc(size_t size) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) {
    perror("tb-bench: mmap");
    exit(1);
  }
  return p;
}

void tbb_shared_free(void *p, size_t size) {
  if (p)
    munmap(p, size);
}

pid_t tbb_spawn(int (*fn)(void *), void *arg) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    perror("tb-bench: fork");
    exit(1);
  }
  if (pid == 0) {
    /* Die with the parent rather than linger holding sockets. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int rc = fn(arg);
    fflush(stdout);
    fflush(stderr);
    _exit(rc);
  }
  return pid;
}

int tbb_reap(pid_t pid) {
  int st;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR)
      return -1;
  }
  if (WIFEXITED(st))
    return WEXITSTATUS(st);
  if (WIFSIGNALED(st))
    return 128 + WTERMSIG(st);
  return -1;
}

int tbb_pin(pid_t pid, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (cpu < 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < n && i < CPU_SETSIZE; i++)
      CPU_SET((int)i, &set);
  } else {
    CPU_SET(cpu, &set);
  }
  return sched_setaffinity(pid, sizeof(set), &set);
}

int tbb_pipe(int fds[2]) { return pipe2(fds, O_CLOEXEC); }

int tbb_write_byte(int fd, char b) {
  for (;;) {
    ssize_t r = write(fd, &b, 1);
    if (r == 1)
      return 0;
    if (r < 0 && errno == EINTR)
      continue;
    return -1;
  }
}

int tbb_read_byte(int fd, char *b) {
  for (;;) {
    ssize_t r = read(fd, b, 1);
    if (r == 1)
      return 0;
    if (r < 0 && errno == EINTR)
      continue;
    return -1; /* EOF or error */
  }
}

int tbb_gate_init(struct tbb_gate *g) {
  int fds[2];
  if (tbb_pipe(fds) < 0)
    return -1;
  g->rd = fds[0];
  g->wr = fds[1];
  return 0;
}

void tbb_gate_wait(struct tbb_gate *g) {
  char b;
  close(g->wr); /* our copy; the parent's closing is the signal */
  g->wr = -1;
  (void)tbb_read_byte(g->rd, &b);
}

void tbb_gate_open(struct tbb_gate *g) {
  if (g->wr >= 0)
    close(g->wr);
  g->wr = -1;
}

void tbb_gate_close(struct tbb_gate *g) {
  if (g->rd >= 0)
    close(g->rd);
  if (g->wr >= 0)
    close(g->wr);
  g->rd = g->wr = -1;
}

/* ---- the daemon ---- */

int tbb_daemon_start(struct tbb_daemon *d, const char *const *extra) {
  memset(d, 0, sizeof(*d));
  snprintf(d->dir, sizeof(d->dir), "/tmp/tb-bench.XXXXXX");
  if (!mkdtemp(d->dir)) {
    perror("tb-bench: mkdtemp");
    return -1;
  }
  snprintf(d->sock, sizeof(d->sock), "%s/tb.sock", d->dir);
  int rp[2];
  if (pipe(rp) < 0) /* the write end must survive exec */
    return -1;
  fcntl(rp[0], F_SETFD, FD_CLOEXEC);
  char fdarg[16];
  snprintf(fdarg, sizeof(fdarg), "%d", rp[1]);
  const char *argv[64];
  int n = 0;
  argv[n++] = tbb_opt.daemon_path;
  argv[n++] = "--socket";
  argv[n++] = d->sock;
  argv[n++] = "--ready-fd";
  argv[n++] = fdarg;
  argv[n++] = "--log-level";
  argv[n++] = "error";
  for (int i = 0; extra && extra[i] && n < 63; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    close(rp[0]);
    close(rp[1]);
    return -1;
  }
  if (pid == 0) {
    close(rp[0]);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "tb-bench: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(rp[1]);
  char line[16] = {0};
  size_t got = 0;
  while (got < 6) {
    ssize_t r = read(rp[0], line + got, 6 - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    got += (size_t)r;
  }
  close(rp[0]);
  if (got != 6 || memcmp(line, "READY\n", 6) != 0) {
    fprintf(stderr, "tb-bench: %s did not become ready\n", argv[0]);
    kill(pid, SIGKILL);
    tbb_reap(pid);
    rmdir(d->dir);
    return -1;
  }
  d->pid = pid;
  return 0;
}

void tbb_daemon_stop(struct tbb_daemon *d) {
  if (d->pid > 0) {
    kill(d->pid, SIGTERM);
    tbb_reap(d->pid);
    d->pid = 0;
  }
  unlink(d->sock);
  rmdir(d->dir);
}

int tbb_spin_us;
int tbb_busy_poll_us = TBB_BUSY_POLL_US;

int tbb_daemon_start_polling(struct tbb_daemon *d, enum tbb_polling p) {
  char us[16];
  const char *extra[] = {"--busy-poll", us, NULL};

  snprintf(us, sizeof(us), "%d", p == TBB_POLL_BUSY ? tbb_busy_poll_us : 0);
  if (tbb_daemon_start(d, p == TBB_POLL_DEFAULT ? NULL : extra) < 0) {
    tbb_failed("daemon%s did not start",
               p == TBB_POLL_DEFAULT ? "" : p == TBB_POLL_NONE
                                                 ? " with --busy-poll 0"
                                                 : " with --busy-poll");
    return -1;
  }
  return 0;
}

int tbb_polling_spin_us(enum tbb_polling p) {
  return p == TBB_POLL_BUSY ? tbb_busy_poll_us : p == TBB_POLL_NONE ? -1 : 0;
}

void tbb_connect_options(struct tb_connect_options *o, const char *sock,
                         const char *name, int contract) {
  tb_connect_options_init(o);
  o->spin_us = tbb_spin_us;
  o->socket_path = sock;
  o->client_name = name;
  o->stream_contract = contract;
}

int tbb_connect(const char *sock, const char *name, int contract,
                tb_client **out) {
  struct tb_connect_options o;
  tbb_connect_options(&o, sock, name, contract);
  return tb_client_connect(&o, out);
}

int64_t tbb_proc_cpu_ns(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  ssize_t r = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (r <= 0)
    return -1;
  buf[r] = 0;
  /* Fields after the parenthesised command name; utime and stime are the
   * 14th and 15th fields overall, i.e. the 12th and 13th after ')'. */
  char *p = strrchr(buf, ')');
  if (!p)
    return -1;
  p++;
  unsigned long long ut = 0, st = 0;
  for (int field = 3; field <= 15; field++) {
    while (*p == ' ')
      p++;
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (field == 14)
      ut = v;
    if (field == 15)
      st = v;
    p = strchr(p, ' ');
    if (!p && field < 15)
      return -1;
    if (!p)
      break;
  }
  long hz = sysconf(_SC_CLK_TCK);
  return (int64_t)((ut + st) * (1000000000ull / (unsigned long long)hz));
}

long tbb_proc_kib(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f)
    return -1;
  size_t fl = strlen(field);
  long v = -1;
  while (fgets(line, sizeof(line), f)) {
    if (strncmp(line, field, fl) == 0 && line[fl] == ':') {
      v = strtol(line + fl + 1, NULL, 10);
      break;
    }
  }
  fclose(f);
  return v;
}

int tbb_proc_reset_hwm(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/clear_refs", (int)pid);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  ssize_t r = write(fd, "5", 1);
  close(fd);
  return r == 1 ? 0 : -1;
}

long tbb_raise_nofile(long want) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
    return -1;
  if ((long)rl.rlim_cur < want) {
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || (long)rl.rlim_max > want
                      ? (rlim_t)want
                      : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  return (long)rl.rlim_cur;
}

static int gpu_probe(void *arg) {
  (void)arg;
  return tb_cuda_available() == 0 ? 0 : 1;
}

int tbb_gpu_present(void) {
  static int cached = -1;
  if (cached < 0)
    cached = tbb_reap(tbb_spawn(gpu_probe, NULL)) == 0;
  return cached;
}
