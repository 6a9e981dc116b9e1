/* SPDX-License-Identifier: Apache-2.0 */
/* tb-bench: shared helpers (timing, statistics, results, daemon control,
 * child processes, pinning, /proc readings). Not part of the library. */
#ifndef TB_BENCH_H
#define TB_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <tensorbroker/tensorbroker.h>

/* ---- options ---- */

struct tbb_opts {
  const char *daemon_path;
  const char *json_path;
  int quick;      /* scale counts and durations down */
  int smoke;      /* a few seconds in all: host scenarios, tiny counts */
  int gpu_only;   /* scenarios 4, 5 and the GPU half of 6 */
  int host_only;  /* skip GPU work even when a GPU is there */
  int pin;        /* enum tbb_pin_mode */
  unsigned scenarios; /* bitmask, 1 << n for scenario n */
  int ncpus;      /* CPUs this process may run on */
  int cpu_a, cpu_b; /* the two CPUs used for pinning */
};

enum tbb_pin_mode { TBB_PIN_BOTH = 0, TBB_PIN_SAME, TBB_PIN_SPLIT, TBB_PIN_NONE };

extern struct tbb_opts tbb_opt;

/* Scale a count or a duration for --quick / --smoke. */
long tbb_scale(long full, long quick, long smoke);

/* ---- time and statistics ---- */

uint64_t tbb_now_ns(void);

struct tbb_summary {
  size_t n;
  double min_us, p50_us, p99_us, p999_us, max_us, mean_us;
};

/* Sort ns[0..n) in place and summarise it. */
void tbb_summarise(uint64_t *ns, size_t n, struct tbb_summary *out);

/* ---- results: table on stdout, JSON in memory ---- */

void tbb_section(const char *id, const char *title, const char *how);
/* A latency row. ratio_to: NULL, or the row name (in this section) it is
 * compared with; the ratio of p50s is printed and recorded. ns is sorted. */
void tbb_row_latency(const char *name, uint64_t *ns, size_t n,
                     const char *ratio_to);
/* A row of named numbers: keys[i] = vals[i], units in the key. */
void tbb_row_values(const char *name, int count, const char *const *keys,
                    const double *vals);
void tbb_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tbb_skip(const char *why);
/* Something that should have worked did not: printed as FAILED, recorded,
 * and tb-bench exits 1 at the end. */
void tbb_failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
extern int tbb_failures;
int tbb_write_json(const char *path, int argc, char **argv);
void tbb_results_free(void);

/* ---- processes ---- */

/* Shared anonymous memory visible to children forked afterwards. */
void *tbb_shared_alloc(size_t size);
void tbb_shared_free(void *p, size_t size);

/* Fork a child that runs fn(arg) and exits with its return value. */
pid_t tbb_spawn(int (*fn)(void *), void *arg);
/* Wait for a child; returns its exit status (or 128 + signal). */
int tbb_reap(pid_t pid);

/* Pin pid (0: this process) to one CPU; cpu < 0: every CPU. */
int tbb_pin(pid_t pid, int cpu);

/* A one-shot gate: many children wait, the parent opens it. */
struct tbb_gate {
  int rd, wr;
};
int tbb_gate_init(struct tbb_gate *g);
void tbb_gate_wait(struct tbb_gate *g);   /* in a child */
void tbb_gate_open(struct tbb_gate *g);   /* in the parent */
void tbb_gate_close(struct tbb_gate *g);

/* A pipe for "I am ready" bytes. */
int tbb_pipe(int fds[2]);
int tbb_write_byte(int fd, char b);
int tbb_read_byte(int fd, char *b);

/* ---- the daemon ---- */

struct tbb_daemon {
  pid_t pid;
  char dir[64];
  char sock[128];
};

/* Start tensorbrokerd on a socket in a fresh temporary directory, with extra
 * arguments (NULL-terminated, may be NULL), and wait for its READY line. */
int tbb_daemon_start(struct tbb_daemon *d, const char *const *extra);
void tbb_daemon_stop(struct tbb_daemon *d);

/* The options tbb_connect uses, for a caller that changes some. */
void tbb_connect_options(struct tb_connect_options *o, const char *sock,
                         const char *name, int contract);
int tbb_connect(const char *sock, const char *name, int contract,
                tb_client **out);
/* tb_connect_options.spin_us for the clients tbb_connect makes (children
 * forked after it is set). 0: the library's default (50 us with 4 or more
 * CPUs, else none); -1: none. */
extern int tbb_spin_us;
/* Busy polling in the "busy polling" rows: daemon --busy-poll and the
 * clients' spin_us, in microseconds (tb-bench --busy-poll-us changes it). */
#define TBB_BUSY_POLL_US 200
extern int tbb_busy_poll_us; /* TBB_BUSY_POLL_US, or --busy-poll-us */

/* How a row's processes wait: the defaults (the daemon's --busy-poll auto,
 * the clients' spin_us 0), no polling at all (--busy-poll 0, spin_us -1),
 * or busy polling (tbb_busy_poll_us for both). */
enum tbb_polling { TBB_POLL_DEFAULT, TBB_POLL_NONE, TBB_POLL_BUSY };
/* Start a daemon for rows of that kind (reports a failure itself). */
int tbb_daemon_start_polling(struct tbb_daemon *d, enum tbb_polling p);
/* The spin_us that goes with it. */
int tbb_polling_spin_us(enum tbb_polling p);

/* utime + stime of pid in nanoseconds, or -1. */
int64_t tbb_proc_cpu_ns(pid_t pid);
/* A "Vm..." field of /proc/pid/status in KiB, or -1. */
long tbb_proc_kib(pid_t pid, const char *field);
/* Reset pid's VmHWM (writes 5 to clear_refs); 0 or -1. */
int tbb_proc_reset_hwm(pid_t pid);

/* Raise RLIMIT_NOFILE's soft limit towards want (capped at the hard limit).
 * Returns the new soft limit. */
long tbb_raise_nofile(long want);

/* 1 when a CUDA device can be used (checked in a child, so that this process
 * never initialises CUDA and may still fork CUDA users). */
int tbb_gpu_present(void);

/* ---- scenarios ---- */

void tbb_scenario_rtt(void);        /* 1 */
void tbb_scenario_throughput(void); /* 2 */
void tbb_scenario_idle(void);       /* 3 */
void tbb_scenario_gpu_handoff(void);/* 4 */
void tbb_scenario_zero_copy(void);  /* 5 */
void tbb_scenario_pipeline(int gpu);/* 6 */
void tbb_scenario_handoff(void);    /* 7 */
void tbb_scenario_flat(void);       /* 8 */
void tbb_scenario_vmm_import(void); /* 9: VMM cold import vs legacy IPC */
void tbb_scenario_pinned(void);     /* 10: H2D from pinned broker memory */

#endif /* TB_BENCH_H */
