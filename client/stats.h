/* SPDX-License-Identifier: Apache-2.0 */
/* Internal: the counters tb-bench reads to say where a cold acquire's time
 * goes, kept out of the library's hot paths: they exist only in the
 * library built with TB_STATS (CMake target tensorbroker_stats, which
 * tb-bench and the GPU test gpu_connect_early link). In every other build
 * the hooks below are empty inline functions and macros, and the acquire
 * path reads no clock for them. stats.c holds the counters. */
#ifndef TB_STATS_H
#define TB_STATS_H

#include <stdint.h>

#include "tb_proto.h" /* tb__now_ns */

/* The calling thread's (CLOCK_MONOTONIC nanoseconds). Counting starts in a
 * thread when it first reads the counters (before that they stay 0 and
 * acquires read no clock for them). */
struct tb_acquire_counters {
  unsigned long calls;            /* tb_acquire calls that sent a request */
  unsigned long long wait_ns;     /* from sending it to holding the decoded
                                     reply, less the kinds' acquire_early
                                     work meanwhile (notices read in the
                                     wait, and their prefetch, and the open
                                     of a buffer named at connect,
                                     included) */
  unsigned long long after_ns;    /* successful ones: from the reply to the
                                     return */
  unsigned long long prefetch_ns; /* in tb__cuda_prefetch (any call) */
  unsigned long long send_ns;     /* sending the Acquire (in wait_ns) */
  unsigned long long reply_ns;    /* from the last notice handled in the
                                     wait (or the send) to holding the
                                     reply (in wait_ns) */
  unsigned long long empty_reads; /* polling reads in the wait that found
                                     nothing */
  unsigned long long blocking;    /* blocking reads in the wait (after
                                     polling found nothing, or without
                                     polling) */
};
/* TB_STATS builds only (tb-bench, gpu_connect_early). */
void tb__acquire_counters(struct tb_acquire_counters *out);

#ifdef TB_STATS
extern _Thread_local struct tb_acquire_counters tb__acq;
extern _Thread_local int tb__acq_on;      /* this thread counts */
extern _Thread_local int tb__acq_waiting; /* in a counted acquire's wait */
extern _Thread_local uint64_t tb__acq_mark; /* the last notice handled */

/* A clock reading for the counters, 0 when this thread does not count. */
static inline uint64_t tb__stat_now(void) {
  return tb__acq_on ? tb__now_ns() : 0;
}
/* An acquire's wait for its reply begins (mark: now) and ends. */
static inline void tb__stat_wait_begin(uint64_t mark) {
  tb__acq_mark = mark;
  tb__acq_waiting = tb__acq_on;
}
/* t0 before sending, t1 sent, t2 after the work done while the daemon
 * answers (not counted as waiting), t3 the reply held. */
static inline void tb__stat_wait_end(uint64_t t0, uint64_t t1, uint64_t t2,
                                     uint64_t t3) {
  tb__acq_waiting = 0;
  tb__acq.calls++;
  tb__acq.wait_ns += (t1 - t0) + (t3 - t2);
  tb__acq.send_ns += t1 - t0;
  tb__acq.reply_ns += t3 - tb__acq_mark;
}
static inline void tb__stat_after(uint64_t t3) {
  tb__acq.after_ns += tb__stat_now() - t3;
}
static inline void tb__stat_prefetch(uint64_t t0) {
  if (t0 != 0)
    tb__acq.prefetch_ns += tb__now_ns() - t0;
}
/* In a counted wait: a polling read found nothing (blocking 0) or a
 * blocking read was made (1); a notice was handled. */
#define TB__STAT_READ(b)                                                     \
  do {                                                                       \
    if (tb__acq_waiting) {                                                   \
      if (b)                                                                 \
        tb__acq.blocking++;                                                  \
      else                                                                   \
        tb__acq.empty_reads++;                                               \
    }                                                                        \
  } while (0)
#define TB__STAT_NOTICE_DONE()                                               \
  do {                                                                       \
    if (tb__acq_waiting)                                                     \
      tb__acq_mark = tb__now_ns();                                           \
  } while (0)
#else
static inline uint64_t tb__stat_now(void) { return 0; }
static inline void tb__stat_wait_begin(uint64_t mark) { (void)mark; }
static inline void tb__stat_wait_end(uint64_t t0, uint64_t t1, uint64_t t2,
                                     uint64_t t3) {
  (void)t0, (void)t1, (void)t2, (void)t3;
}
static inline void tb__stat_after(uint64_t t3) { (void)t3; }
static inline void tb__stat_prefetch(uint64_t t0) { (void)t0; }
#define TB__STAT_READ(b) ((void)0)
#define TB__STAT_NOTICE_DONE() ((void)0)
#endif

#endif /* TB_STATS_H */
