/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers for the GPU tests: CUDA in child processes only, kernels from
 * kernels_ptx.h launched through the library's driver table, and thin
 * wrappers over the public API that fail the child with a clear message.
 *
 * CUDA does not survive fork, so the parent of every GPU test never
 * initialises CUDA: it starts the daemon (tests/common/harness.h), forks its
 * producers and consumers, and only the children load the driver. Whether
 * a GPU is present is itself asked in a forked child (tbg_skip_without_gpu).
 *
 * Children report over the harness's line pipes; every wait is bounded. */
#ifndef TB_TESTS_GPU_COMMON_H
#define TB_TESTS_GPU_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include <tensorbroker/tensorbroker.h>

#include "cuda/driver.h"
#include "harness.h"

/* Exit 77 (ctest: skipped) unless a child process can load CUDA and see a
 * device. Call first in main(), before any other fork. */
void tbg_skip_without_gpu(void);

/* In a child: fail with a message (exit 2). */
#define TBG_FAIL(...)                                                        \
  do {                                                                       \
    fprintf(stderr, "[child %d] %s:%d: ", (int)getpid(), __FILE__,          \
            __LINE__);                                                       \
    fprintf(stderr, __VA_ARGS__);                                            \
    fputc('\n', stderr);                                                     \
    _exit(2);                                                                \
  } while (0)

/* In a child: a driver call must succeed. */
#define TBG_CU(call)                                                         \
  do {                                                                       \
    tb_cu_result tbg_r_ = (call);                                            \
    if (tbg_r_ != 0)                                                         \
      TBG_FAIL("%s = %s", #call, tb__cuda_err_name(tbg_r_));               \
  } while (0)

/* In a child: a library call must return want; prints the client's last
 * error text when c is not NULL. */
#define TBG_RC(c, expr, want)                                                \
  do {                                                                       \
    int tbg_rc_ = (expr);                                                    \
    if (tbg_rc_ != (want)) {                                                 \
      char tbg_m_[256] = "";                                                 \
      if ((c) != NULL)                                                       \
        tb_client_last_error((c), tbg_m_, sizeof tbg_m_);                    \
      TBG_FAIL("%s = %s (%s), expected %s", #expr, tb_err_name(tbg_rc_),    \
               tbg_m_, tb_err_name(want));                                   \
    }                                                                        \
  } while (0)
#define TBG_OK(c, expr) TBG_RC(c, expr, 0)

struct tbg_gpu {
  const struct tb_cuda *cu;
  tb_cu_device dev;
  int ordinal;
  tb_cu_context ctx;
  tb_cu_module mod;
  tb_cu_function fill, spin_fill, spin_count, count, copy;
  uint8_t uuid[16];
};

/* Load the driver, make device ordinal's primary context current on this
 * thread and load the kernels. Fails the child on any error. */
void tbg_gpu_init(struct tbg_gpu *g, int ordinal);

tb_cu_deviceptr tbg_alloc(struct tbg_gpu *g, size_t bytes);
tb_cu_stream tbg_stream(struct tbg_gpu *g, int nonblocking);

/* Kernels on stream s over n 32-bit words at p. */
void tbg_fill(struct tbg_gpu *g, tb_cu_deviceptr p, unsigned v, size_t n,
              tb_cu_stream s);
void tbg_spin_fill(struct tbg_gpu *g, tb_cu_deviceptr p, unsigned v, size_t n,
                   unsigned ms, tb_cu_stream s);
/* Enqueue a count of words != expect into the 4-byte counter cnt (reset
 * first, on the same stream). Read it with tbg_counter_read. */
void tbg_count_async(struct tbg_gpu *g, tb_cu_deviceptr p, unsigned expect,
                     size_t n, tb_cu_deviceptr cnt, tb_cu_stream s);
void tbg_spin_count_async(struct tbg_gpu *g, tb_cu_deviceptr p,
                          unsigned expect, size_t n, unsigned ms,
                          tb_cu_deviceptr cnt, tb_cu_stream s);
/* The same with the spin in microseconds: for consumers that must lag a
 * fraction of a millisecond behind a producer (gpu_ring). */
void tbg_spin_count_us_async(struct tbg_gpu *g, tb_cu_deviceptr p,
                             unsigned expect, size_t n, unsigned us,
                             tb_cu_deviceptr cnt, tb_cu_stream s);
/* Synchronise s, then read the counter. */
unsigned tbg_counter_read(struct tbg_gpu *g, tb_cu_deviceptr cnt,
                          tb_cu_stream s);
/* Count synchronously (async + read). */
unsigned tbg_count(struct tbg_gpu *g, tb_cu_deviceptr p, unsigned expect,
                   size_t n, tb_cu_stream s);

/* Client helpers (children). */
tb_client *tbg_connect(const struct tbt_daemon *d, const char *name,
                       int contract);
/* Publish n u32 words at p (device g->ordinal) to channel; returns the
 * version. stream as tb_publish_options.stream. */
uint64_t tbg_publish(tb_client *c, const struct tbg_gpu *g, const char *channel,
                     tb_cu_deviceptr p, size_t n, void *stream,
                     uint32_t history_depth);
int tbg_publish_rc(tb_client *c, const struct tbg_gpu *g, const char *channel,
                   tb_cu_deviceptr p, size_t n, void *stream);
/* Acquire (mode, version) waiting at most 20 s, with stream. */
int tbg_acquire(tb_client *c, const char *channel, int mode, uint64_t version,
                void *stream, DLManagedTensorVersioned **out);
/* The same with tb_acquire_options.device and .flags (tbg_acquire is this
 * with -1 and 0, their defaults). */
int tbg_acquire_on(tb_client *c, const char *channel, int mode,
                   uint64_t version, void *stream, int device, unsigned flags,
                   DLManagedTensorVersioned **out);
/* Check t is a 1-d u32 CUDA tensor of n words; returns its data pointer. */
tb_cu_deviceptr tbg_tensor_ptr(const DLManagedTensorVersioned *t, size_t n);
/* tb_wait_free(c, channel, version, 0, s), which must make exactly one
 * cuStreamWaitEvent: the wait on the consumer's done event, named by
 * done_event in the failure message. */
void tbg_wait_free_one_wait(tb_client *c, const char *channel,
                            uint64_t version, tb_cu_stream s,
                            const char *done_event);
/* Wait (bounded) for a notice of type, discarding others. */
void tbg_wait_notice(tb_client *c, int type, struct tb_notice *out);

/* Line protocol between parent and children (harness pipes): send a line,
 * or wait for one that must equal want. Children fail, the parent asserts. */
void tbg_child_say(struct tbt_chan *ch, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void tbg_child_hear(struct tbt_chan *ch, const char *want, char *rest,
                    size_t restlen);
/* Wait for "v VERSION" from the parent (a relayed version); returns
 * VERSION. */
uint64_t tbg_child_hear_version(struct tbt_chan *ch);

/* A slow producer and the consumer that shows it can tell (gpu_slow_producer,
 * and gpu_cross_gpu's slow_producer across two GPUs). Both children take a
 * struct tbg_slow as their argument.
 *
 * tbg_slow_producer: on producer_ordinal, fills its buffer of n words with
 * old_value and synchronises; on "go" a kernel spinning spin_ms writes
 * new_value and the version is published at once on that kernel's stream
 * (history depth 1), said as "published V". Then, unless wait_for_kill, it
 * waits for "done", checks its own view (all new_value) and disconnects;
 * with wait_for_kill it waits for "never" (the parent kills it there, its
 * kernel still running) and exits 3.
 *
 * tbg_slow_consumer: on consumer_ordinal, says "ready", hears "v V", and
 * acquires V twice at once (opts.device consumer_device): on a stream the
 * library makes wait on the producer's event, and with stream -1 (no
 * wait); on both it counts words != new_value. The -1 count must be
 * non-zero (the read was stale: the window is real), the waited one zero.
 * Reports the counts on stderr as "consumer_label: ...", says "ok". */
struct tbg_slow {
  struct tbt_daemon *daemon;
  const char *channel;
  size_t n;
  unsigned old_value, new_value;
  unsigned spin_ms;
  int producer_ordinal;
  int wait_for_kill;
  int consumer_ordinal, consumer_device;
  const char *consumer_label;
};
int tbg_slow_producer(struct tbt_chan *ch, void *slow);
int tbg_slow_consumer(struct tbt_chan *ch, void *slow);


/* ---- parent side (cmocka assertions) ---- */

/* Start the daemon or fail the test. */
void tbg_daemon_up(struct tbt_daemon *d);
/* Fork a child running fn(ch, arg) or fail. */
void tbg_spawn(struct tbt_child *c, tbt_child_fn fn, void *arg);
/* The usual start of a producer/consumer test: start the daemon, fork
 * producer(parg) as p, then consumer(carg) as c. */
void tbg_start(struct tbt_daemon *d, struct tbt_child *p, tbt_child_fn producer,
               void *parg, struct tbt_child *c, tbt_child_fn consumer,
               void *carg);
/* For a producer that waits until the consumer is set up: hear the
 * consumer's "ready", then say "go" to the producer. */
void tbg_ready_go(struct tbt_child *p, struct tbt_child *c);
/* Wait for a line from child c starting with want; the rest goes to rest. */
void tbg_hear(struct tbt_child *c, const char *who, const char *want,
              char *rest, size_t restlen);
void tbg_say(struct tbt_child *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The child must exit 0. */
void tbg_reap(struct tbt_child *c, const char *who);
/* Hear a line "want REST" from child from (named who), and say
 * "prefix REST" to child to: the parent relays a version number. */
void tbg_relay(struct tbt_child *from, const char *who, const char *want,
               struct tbt_child *to, const char *prefix);
/* Hear the line word from child from (named who) and say word to child
 * to: one child tells the other, through the parent, that it may go on. */
void tbg_pass(struct tbt_child *from, const char *who, const char *word,
              struct tbt_child *to);
/* Stop the daemon (it must exit 0) and remove its files. */
void tbg_daemon_down(struct tbt_daemon *d);
/* The usual end of a producer/consumer test: hear the consumer's "ok",
 * say "done" to the producer, reap both (each must exit 0) and stop the
 * daemon. */
void tbg_finish(struct tbt_child *p, struct tbt_child *c, struct tbt_daemon *d);
/* A whole slow-producer test: tbg_start with tbg_slow_producer and
 * tbg_slow_consumer on slow->daemon, tbg_ready_go, relay the producer's
 * "published V" as "v V", tbg_finish. */
void tbg_slow_run(const struct tbg_slow *slow);

/* main() of a GPU test: skipped (exit 77) without a GPU, else the cmocka
 * tests given. */
#define TBG_MAIN(...)                                                        \
  int main(void) {                                                           \
    tbg_skip_without_gpu();                                                  \
    const struct CMUnitTest tests[] = {__VA_ARGS__};                         \
    return cmocka_run_group_tests(tests, NULL, NULL);                        \
  }

#endif /* TB_TESTS_GPU_COMMON_H */
