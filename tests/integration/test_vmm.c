/* SPDX-License-Identifier: Apache-2.0 */
/* CUDA VMM buffers (docs/cuda.md, "VMM buffers") through the real daemon
 * with the fake CUDA driver (tests/fakecuda), whose call log names every
 * import, map and unmap by the allocation's creator and number (mP.N).
 *
 * A producer process (forked) makes VMM buffers with
 * tb_buffer_create_cuda, fills them and publishes; this process's
 * consumers acquire and read them back (cuMemcpyDtoH through the fake's
 * memory). Checked: the descriptor the daemon sends is imported once per
 * consumer connection and buffer (a second acquire reuses the mapping);
 * a buffer the daemon retires is unmapped once; after the producer is
 * SIGKILLed a new consumer still imports and reads the last version, and
 * TB_ECLOSED comes only for a version that is not kept, and the buffers
 * view lists the buffer (cuda-vmm, retired, its producer's pid);
 * vmm_producer_restart: a producer killed and started again on its
 * channel, its consumers carrying on (a held version still whole, the
 * next one the new producer's, the last one readable in between); a
 * consumer whose
 * driver cannot import POSIX descriptors gets TB_ENOTSUP naming the kind;
 * a producer gets TB_ENOTSUP from a daemon without FEATURE_CUDA_VMM.
 * vmm_ring: the producer ring (tb_ring_*). vmm_pid_namespace (root): a
 * consumer started by `unshare --pid --fork --mount-proc` reads a VMM
 * version, while its legacy IPC open fails (CUDA_ERROR_INVALID_HANDLE). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_internal.h" /* tb__client_set_features */
#include "cuda/driver.h"
#include "fake_libcuda.h"
#include "harness.h"

#define CH "vmm/frames"
#define NWORDS 4096
#define VMM_SIZE ((size_t)2 << 20) /* the fake's granularity */

static const struct tb_cuda *cu;
static const struct fakecuda_hooks *fk;
static struct tbt_daemon daemon_;
static tb_cu_context ctx;
static pid_t producer = -1;
static int to_prod[2], from_prod[2];

static void show_log(void) {
  static char text[1 << 16];
  fk->log_read(text, sizeof(text));
  fprintf(stderr, "---- fake CUDA log ----\n%s----\n", text);
}

static size_t log_count(const char *fmt, ...) {
  char body[160];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(body, sizeof(body), fmt, ap);
  va_end(ap);
  return fk->log_count(body);
}

/* Lines of this process's log whose body starts with prefix. */
static size_t log_prefixed(const char *prefix) {
  static char text[1 << 16];

  fk->log_read(text, sizeof(text));
  return fakecuda_text_prefixed(text, 0, prefix);
}

static uint32_t word(int buffer, uint32_t i) {
  return 0xa5000000u + ((uint32_t)buffer << 20) + i;
}

/* ---- the producer process ---- */

static void prod_fill(tb_buffer *b, int which) {
  static uint32_t host[NWORDS];
  for (uint32_t i = 0; i < NWORDS; i++)
    host[i] = word(which, i);
  if (cu->cuMemcpyHtoD((tb_cu_deviceptr)(uintptr_t)tb_buffer_data(b), host,
                       sizeof(host)) != 0)
    _exit(3);
}

static void prod_publish(tb_client *c, const char *ch, tb_buffer *b) {
  struct tb_publish_options po;
  int64_t shape[1] = {NWORDS};
  DLTensor t;

  memset(&t, 0, sizeof(t));
  t.data = tb_buffer_data(b);
  t.device.device_type = kDLCUDA;
  t.ndim = 1;
  t.dtype.code = kDLUInt;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  tb_publish_options_init(&po);
  po.history_depth = 1;
  po.stream = (void *)(uintptr_t)1; /* the legacy stream */
  if (tb_channel_publish(c, ch, &t, &po, NULL) != 0)
    _exit(4);
}

/* Buffer 1, version 1; on 'b': buffer 2, version 2, buffer 1 destroyed;
 * then waits to be killed. */
static void producer_main(void) {
  tb_buffer *a = NULL, *b = NULL;
  tb_client *c = NULL;
  char cmd;

  if (tbt_connect(&daemon_, "vmm-producer", &c) != 0 ||
      tb_buffer_create_cuda(c, NWORDS * 4, 0, 0, &a) != 0 ||
      tb_buffer_size(a) < NWORDS * 4 ||
      tb_buffer_size(a) > VMM_SIZE - 4096) /* the signal area after it */
    _exit(2);
  prod_fill(a, 1);
  prod_publish(c, CH, a);
  if (write(from_prod[1], "r", 1) != 1 || read(to_prod[0], &cmd, 1) != 1)
    _exit(5);
  /* the second buffer through the alias the VMM design named */
  if (tb_cuda_buffer_create(c, NWORDS * 4, 0, 0, &b) != 0)
    _exit(6);
  prod_fill(b, 2);
  prod_publish(c, CH, b);
  if (tb_buffer_destroy(a) != 0)
    _exit(7);
  if (write(from_prod[1], "r", 1) != 1)
    _exit(8);
  for (;;)
    pause();
}

static void await_producer(void) {
  char r;
  assert_int_equal(read(from_prod[0], &r, 1), 1);
}

/* ---- consumers ---- */

/* t's data is buffer which's (read back through the fake's memory). */
static void check_words(const DLManagedTensorVersioned *t, int which) {
  static uint32_t host[NWORDS];

  assert_int_equal(t->dl_tensor.device.device_type, kDLCUDA);
  assert_int_equal(cu->cuMemcpyDtoH(
                       host, (tb_cu_deviceptr)(uintptr_t)t->dl_tensor.data +
                                 t->dl_tensor.byte_offset,
                       sizeof(host)),
                   0);
  for (uint32_t i = 0; i < NWORDS; i++)
    if (host[i] != word(which, i))
      fail_msg("word %u: %#x, want %#x", i, host[i], word(which, i));
}

/* Acquire (mode, after) on ch and check its data is buffer which's;
 * keep: the lease is not released but stored there. */
static uint64_t read_check_on(tb_client *c, const char *ch, int mode,
                              uint64_t after, int which,
                              DLManagedTensorVersioned **keep) {
  struct tb_acquire_options ao;
  DLManagedTensorVersioned *t = NULL;
  uint64_t v;
  int rc;

  tb_acquire_options_init(&ao);
  ao.mode = mode;
  ao.version = after;
  ao.timeout_ms = TBT_TIMEOUT_MS;
  rc = tb_acquire(c, ch, &ao, &t);
  if (rc != 0) {
    char why[256];
    tb_client_last_error(c, why, sizeof(why));
    show_log();
    fail_msg("acquire: %d (%s)", rc, why);
  }
  check_words(t, which);
  {
    struct tb_lease_info li;
    assert_int_equal(tb_lease_get_info(t, sizeof(li), &li), 0);
    assert_int_equal(li.memory_kind, TB_MEMORY_CUDA_VMM);
    assert_string_equal(tb_memory_kind_name(li.memory_kind), "cuda-vmm");
    v = li.version;
  }
  if (keep != NULL)
    *keep = t;
  else
    assert_int_equal(tb_release(t, NULL), 0);
  return v;
}

static uint64_t read_check(tb_client *c, int mode, uint64_t after,
                           int which) {
  return read_check_on(c, CH, mode, after, which, NULL);
}

static int group_setup(void **state) {
  tb_cu_device dev;
  (void)state;
  fk = fakecuda();
  if (fk == NULL || tb_cuda_available() != 0) {
    fprintf(stderr, "the fake CUDA driver is not what libcuda.so.1 loads "
            "here: skipped\n");
    exit(77);
  }
  assert_int_equal(tb__cuda_load(&cu), 0);
  assert_int_equal(cu->cuDeviceGet(&dev, 0), 0);
  assert_int_equal(cu->cuDevicePrimaryCtxRetain(&ctx, dev), 0);
  assert_int_equal(cu->cuCtxSetCurrent(ctx), 0);
  if (tbt_daemon_start(&daemon_, NULL) != 0)
    fail_msg("daemon did not start");
  assert_int_equal(pipe(to_prod), 0);
  assert_int_equal(pipe(from_prod), 0);
  producer = fork();
  assert_true(producer >= 0);
  if (producer == 0) {
    assert_int_equal(cu->cuCtxSetCurrent(ctx), 0);
    producer_main();
  }
  await_producer();
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  if (producer > 0) {
    kill(producer, SIGKILL);
    waitpid(producer, NULL, 0);
  }
  tbt_daemon_cleanup(&daemon_);
  return 0;
}

/* The whole life of two buffers, in order (one producer process). */
static void vmm_lifecycle(void **state) {
  struct fakecuda_counts n = {.struct_size = sizeof(n)};
  tb_client *c1 = NULL, *c2 = NULL, *c3 = NULL;
  DLManagedTensorVersioned *t = NULL;
  struct tb_acquire_options ao;
  char why[256];
  long p = (long)producer;

  (void)state;
  fk->log_clear();
  assert_int_equal(tbt_connect(&daemon_, "c1", &c1), 0);
  /* the descriptor imported once for two acquires of the buffer (the
   * library's own count, as the GPU test reads it, and the fake's log) */
  struct tb_cuda_counters k0, k1;
  tb__cuda_counters(&k0);
  assert_int_equal(read_check(c1, TB_ACQUIRE_LATEST, 0, 1), 1);
  assert_int_equal(read_check(c1, TB_ACQUIRE_LATEST, 0, 1), 1);
  tb__cuda_counters(&k1);
  assert_int_equal(k1.vmm_import - k0.vmm_import, 1);
  if (log_count("vmm-import m%ld.1 size %zu", p, VMM_SIZE) != 1 ||
      log_count("vmm-map m%ld.1 size %zu", p, VMM_SIZE) != 1 ||
      log_count("vmm-access m%ld.1 r", p) != 1) {
    show_log();
    fail_msg("want one import, map and read-only access of m%ld.1", p);
  }

  /* buffer 1 destroyed by the producer and its version trimmed: the
   * daemon retires it and c1 unmaps it, once */
  assert_int_equal(write(to_prod[1], "b", 1), 1);
  await_producer();
  assert_int_equal(read_check(c1, TB_ACQUIRE_NEXT, 1, 2), 2);
  if (log_count("vmm-unmap m%ld.1", p) != 1 ||
      log_count("vmm-release m%ld.1", p) != 1 ||
      log_count("vmm-import m%ld.2 size %zu", p, VMM_SIZE) != 1) {
    show_log();
    fail_msg("want m%ld.1 unmapped and released once, m%ld.2 imported", p,
             p);
  }

  /* the channel's newest version is in VMM memory, and says so */
  {
    struct tb_channel_info *ci = NULL;
    size_t nc = 0;
    assert_int_equal(tb_channel_list(c1, sizeof(*ci), &ci, &nc), 0);
    assert_int_equal(nc, 1);
    assert_int_equal(ci[0].memory_kind, TB_MEMORY_CUDA_VMM);
    tb_free(ci);
  }

  /* the producer killed: a new consumer still imports the last version
   * and reads it; nothing after it is kept. c1 subscribed hears the
   * channel close, so the daemon has seen the producer go. */
  assert_int_equal(tb_channel_subscribe(c1, CH), 0);
  kill(producer, SIGKILL);
  assert_int_equal(waitpid(producer, NULL, 0), producer);
  producer = -1;
  for (;;) {
    struct tb_notice nt;
    assert_int_equal(tb_notice_poll(c1, sizeof(nt), &nt, TBT_TIMEOUT_MS), 0);
    if (nt.type == TB_NOTICE_CHANNEL_CLOSED)
      break;
  }
  assert_int_equal(tbt_connect(&daemon_, "c2", &c2), 0);
  assert_int_equal(read_check(c2, TB_ACQUIRE_LATEST, 0, 2), 2);
  assert_int_equal(log_count("vmm-import m%ld.2 size %zu", p, VMM_SIZE), 2);
  tb_acquire_options_init(&ao);
  ao.mode = TB_ACQUIRE_NEXT;
  ao.version = 2;
  ao.timeout_ms = 0;
  assert_int_equal(tb_acquire(c2, CH, &ao, &t), TB_ECLOSED);

  /* the buffers view: buffer 2 outlived its producer, retired, with the
   * producer's pid, its signal area and version 2 (buffer 1 is gone) */
  {
    struct tb_buffer_entry *be = NULL;
    size_t nb = 0;
    assert_int_equal(tb_buffer_list(c2, sizeof(*be), &be, &nb), 0);
    assert_int_equal(nb, 1);
    assert_int_equal(be[0].memory_kind, TB_MEMORY_CUDA_VMM);
    assert_string_equal(tb_memory_kind_name(be[0].memory_kind), "cuda-vmm");
    assert_int_equal(be[0].size, VMM_SIZE);
    assert_int_equal(be[0].device_type, kDLCUDA);
    assert_int_equal(be[0].device_id, 0);
    assert_true(be[0].retired);
    assert_true(be[0].survives_producer);
    assert_int_equal(be[0].session_id, 0);
    assert_int_equal(be[0].pid, p);
    assert_int_equal(be[0].versions, 1);
    assert_int_equal(be[0].leases, 0); /* c2's released (a round trip ago) */
    assert_true(be[0].signal_offset > 0 && be[0].signal_offset < VMM_SIZE);
    tb_free(be);
  }

  /* a consumer whose driver cannot import POSIX descriptors: told so,
   * naming the kind, and nothing mapped */
  fk->counts(&n);
  unsigned long maps = n.vmm_mappings;
  assert_int_equal(setenv("FAKECUDA_NO_VMM", "1", 1), 0);
  assert_int_equal(tbt_connect(&daemon_, "c3", &c3), 0);
  tb_acquire_options_init(&ao);
  ao.timeout_ms = TBT_TIMEOUT_MS;
  assert_int_equal(tb_acquire(c3, CH, &ao, &t), TB_ENOTSUP);
  tb_client_last_error(c3, why, sizeof(why));
  assert_non_null(strstr(why, "cannot map a cuda-vmm buffer"));
  assert_non_null(strstr(why, "POSIX"));
  /* and a producer is refused the buffer as plainly */
  tb_buffer *b = NULL;
  assert_int_equal(tb_buffer_create_cuda(c3, 4096, 0, 0, &b), TB_ENOTSUP);
  tb_client_last_error(c3, why, sizeof(why));
  assert_non_null(strstr(why, "cannot create a cuda-vmm buffer"));
  assert_int_equal(unsetenv("FAKECUDA_NO_VMM"), 0);
  fk->counts(&n);
  assert_int_equal(n.vmm_mappings, maps);

  /* a daemon without FEATURE_CUDA_VMM: refused before any driver call */
  tb__client_set_features(c3, 0);
  fk->log_clear();
  assert_int_equal(tb_buffer_create_cuda(c3, 4096, 0, 0, &b), TB_ENOTSUP);
  tb_client_last_error(c3, why, sizeof(why));
  assert_non_null(strstr(why, "does not accept CUDA VMM buffers"));
  assert_int_equal(log_count("vmm-create size %zu", VMM_SIZE), 0);

  /* the consumers' mappings go with their connections */
  tb_client_disconnect(c3);
  tb_client_disconnect(c2);
  tb_client_disconnect(c1);
  fk->counts(&n);
  assert_int_equal(n.vmm_mappings, 0);
  assert_int_equal(n.vmm_handles, 0);
}

/* A producer that publishes one VMM version on ch from a buffer filled
 * as buffer which, says 'r' on from_prod and waits to be killed. */
static pid_t start_producer(const char *name, const char *ch, int which) {
  pid_t pid = fork();

  assert_true(pid >= 0);
  if (pid == 0) {
    tb_client *c = NULL;
    tb_buffer *b = NULL;
    if (cu->cuCtxSetCurrent(ctx) != 0 || tbt_connect(&daemon_, name, &c) != 0 ||
        tb_buffer_create_cuda(c, NWORDS * 4, 0, 0, &b) != 0)
      _exit(2);
    prod_fill(b, which);
    prod_publish(c, ch, b);
    if (write(from_prod[1], "r", 1) != 1)
      _exit(8);
    for (;;)
      pause();
  }
  await_producer();
  return pid;
}

/* A producer killed and restarted on its channel: its consumers lose
 * nothing. A consumer holding the dead producer's version keeps reading
 * it; one waiting for the next version across the restart gets the new
 * producer's, without an error; a consumer that connects between the
 * death and the restart reads the last version (VMM memory outlives its
 * producer: with legacy IPC that acquire is TB_ECLOSED). */
static void vmm_producer_restart(void **state) {
  const char *ch = "vmm/restart";
  DLManagedTensorVersioned *held = NULL;
  tb_client *c1 = NULL, *c2 = NULL;
  uint64_t v1, v2;
  pid_t p1, p2;

  (void)state;
  p1 = start_producer("first-producer", ch, 5);
  assert_int_equal(tbt_connect(&daemon_, "steady", &c1), 0);
  assert_int_equal(tb_channel_subscribe(c1, ch), 0);
  v1 = read_check_on(c1, ch, TB_ACQUIRE_LATEST, 0, 5, &held);
  kill(p1, SIGKILL);
  assert_int_equal(waitpid(p1, NULL, 0), p1);
  for (;;) {
    struct tb_notice nt;
    assert_int_equal(tb_notice_poll(c1, sizeof(nt), &nt, TBT_TIMEOUT_MS), 0);
    if (nt.type == TB_NOTICE_CHANNEL_CLOSED)
      break;
  }
  /* between the death and the restart */
  assert_int_equal(tbt_connect(&daemon_, "in-between", &c2), 0);
  assert_int_equal(read_check_on(c2, ch, TB_ACQUIRE_LATEST, 0, 5, NULL), v1);
  check_words(held, 5);

  p2 = start_producer("second-producer", ch, 6);
  v2 = read_check_on(c1, ch, TB_ACQUIRE_NEXT, v1, 6, NULL);
  assert_true(v2 > v1);
  assert_int_equal(read_check_on(c2, ch, TB_ACQUIRE_LATEST, 0, 6, NULL), v2);
  check_words(held, 5); /* the first producer's version, still whole */
  assert_int_equal(tb_release(held, NULL), 0);
  kill(p2, SIGKILL);
  assert_int_equal(waitpid(p2, NULL, 0), p2);
  tb_client_disconnect(c2);
  tb_client_disconnect(c1);
}

/* One ring slot's words: slot s of version v. */
static void ring_fill(void *p, uint32_t v) {
  static uint32_t host[NWORDS];
  for (uint32_t i = 0; i < NWORDS; i++)
    host[i] = 0xb0000000u + (v << 16) + i;
  assert_int_equal(cu->cuMemcpyHtoD((tb_cu_deviceptr)(uintptr_t)p, host,
                                    sizeof(host)),
                   0);
}

static void ring_tensor(DLTensor *t, int64_t *shape, void *p) {
  memset(t, 0, sizeof(*t));
  *shape = NWORDS;
  t->data = p;
  t->device.device_type = kDLCUDA;
  t->ndim = 1;
  t->dtype.code = kDLUInt;
  t->dtype.bits = 32;
  t->dtype.lanes = 1;
  t->shape = shape;
}

/* The producer's ring: three slots in one VMM buffer. A slot comes back
 * only when the version last published from it is free (TB_EBUSY with
 * timeout 0 while a consumer holds it); each version reads its own data;
 * a tensor outside the slot, or a history as deep as the ring, is refused
 * and publishes nothing. */
struct ring_pub {
  tb_ring *r;
  void *slot;
  int rc;
};
static void *ring_publish_ptds(void *arg) {
  struct ring_pub *a = arg;
  struct tb_publish_options po;
  int64_t shape;
  DLTensor dt;
  tb_publish_options_init(&po);
  po.stream = TB_STREAM_PER_THREAD;
  ring_tensor(&dt, &shape, a->slot);
  a->rc = tb_ring_publish(a->r, &dt, &po, NULL);
  return NULL;
}

static void vmm_ring(void **state) {
  tb_client *p = NULL, *c = NULL;
  DLManagedTensorVersioned *held = NULL, *t = NULL;
  struct tb_acquire_options ao;
  struct tb_publish_options po;
  static uint32_t host[NWORDS];
  int64_t shape;
  DLTensor dt;
  tb_ring *r = NULL;
  void *slot[4];
  uint64_t v = 0;

  (void)state;
  assert_int_equal(tbt_connect(&daemon_, "ring-producer", &p), 0);
  assert_int_equal(tbt_connect(&daemon_, "ring-consumer", &c), 0);
  assert_int_equal(tb_ring_create_cuda(p, "vmm/ring", NWORDS * 4, 3, 0, 0, &r),
                   0);
  for (uint32_t i = 0; i < 3; i++) {
    assert_int_equal(tb_ring_next(r, 0, (void *)(uintptr_t)1, &slot[i]), 0);
    assert_ptr_equal(slot[i], (char *)tb_buffer_data(tb_ring_buffer(r)) +
                                  i * NWORDS * 4);
    ring_fill(slot[i], i + 1);
    ring_tensor(&dt, &shape, slot[i]);
    assert_int_equal(tb_ring_publish(r, &dt, NULL, &v), 0);
    assert_int_equal(v, i + 1);
    if (i == 0) { /* a consumer holds version 1 (slot 0) */
      tb_acquire_options_init(&ao);
      ao.mode = TB_ACQUIRE_EXACT;
      ao.version = 1;
      ao.timeout_ms = TBT_TIMEOUT_MS;
      assert_int_equal(tb_acquire(c, "vmm/ring", &ao, &held), 0);
    }
  }
  /* slot 0 is still read: not handed out */
  assert_int_equal(tb_ring_next(r, 0, (void *)(uintptr_t)1, &slot[3]),
                   TB_EBUSY);
  /* released (the Release travels on the consumer's connection): the
   * slot comes back within a bounded wait */
  assert_int_equal(tb_release(held, NULL), 0);
  assert_int_equal(
      tb_ring_next(r, TBT_TIMEOUT_MS, (void *)(uintptr_t)1, &slot[3]), 0);
  assert_ptr_equal(slot[3], slot[0]);
  /* refused, nothing published: a tensor in another slot, a deep history */
  ring_tensor(&dt, &shape, slot[1]);
  assert_int_equal(tb_ring_publish(r, &dt, NULL, &v), TB_EINVAL);
  ring_tensor(&dt, &shape, (char *)slot[0] + 8); /* runs past the slot */
  assert_int_equal(tb_ring_publish(r, &dt, NULL, &v), TB_EINVAL);
  tb_publish_options_init(&po);
  po.history_depth = 3;
  ring_tensor(&dt, &shape, slot[0]);
  assert_int_equal(tb_ring_publish(r, &dt, &po, &v), TB_EINVAL);
  /* and on another stream than the one the slot's reuse was ordered on
   * (tb_ring_next's, the legacy stream): a side stream's writes could
   * overtake the consumers' reads */
  tb_cu_stream side = NULL;
  assert_int_equal(cu->cuStreamCreate(&side, TB_CU_STREAM_NON_BLOCKING), 0);
  tb_publish_options_init(&po);
  po.stream = side;
  assert_int_equal(tb_ring_publish(r, &dt, &po, &v), TB_ESTREAM);
  /* asked for again before it is published: for the same stream only */
  void *again = NULL;
  assert_int_equal(tb_ring_next(r, 0, side, &again), TB_ESTREAM);
  assert_int_equal(tb_ring_next(r, 0, TB_STREAM_LEGACY, &again), 0);
  assert_ptr_equal(again, slot[0]);
  po.stream = TB_STREAM_LEGACY; /* what NULL stands for under spec */
  ring_fill(slot[0], 4);
  assert_int_equal(tb_ring_publish(r, &dt, &po, &v), 0);
  assert_int_equal(v, 4); /* nothing was published in between */
  /* each kept version reads its own slot */
  tb_acquire_options_init(&ao);
  ao.timeout_ms = TBT_TIMEOUT_MS;
  assert_int_equal(tb_acquire(c, "vmm/ring", &ao, &t), 0);
  assert_int_equal(cu->cuMemcpyDtoH(host,
                                    (tb_cu_deviceptr)(uintptr_t)t->dl_tensor.data +
                                        t->dl_tensor.byte_offset,
                                    sizeof(host)),
                   0);
  assert_int_equal(host[0], 0xb0000000u + (4u << 16));
  assert_int_equal(host[NWORDS - 1], 0xb0000000u + (4u << 16) + NWORDS - 1);
  assert_int_equal(tb_release(t, NULL), 0);
  /* a per-thread stream is its thread's: the slot's reuse ordered on this
   * thread's is not ordered on another thread's "per-thread stream" */
  struct ring_pub rp = {r, slot[1], 0};
  pthread_t th;
  assert_int_equal(tb_ring_next(r, TBT_TIMEOUT_MS, TB_STREAM_PER_THREAD,
                                &slot[1]),
                   0);
  rp.slot = slot[1];
  assert_int_equal(pthread_create(&th, NULL, ring_publish_ptds, &rp), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_int_equal(rp.rc, TB_ESTREAM);
  assert_int_equal(tb_ring_destroy(r), 0);
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

/* ---- across PID namespaces ---- */

#define NS_FILL 0xc0de0000u

/* The consumer, run by `unshare --pid --fork --mount-proc` as a fresh
 * process (this binary, argv "ns-consumer SOCKET"): pid 1 in its own PID
 * namespace with its own /proc, so the producer's process is not visible.
 * The VMM version must read right; the legacy IPC one must fail, as the
 * real driver's open needs the exporter's process (the fake opens
 * /proc/PID/fd of it). Exit 0, or a code saying what went wrong. */
static int ns_consumer(const char *sock) {
  static uint32_t host[NWORDS];
  struct tbt_daemon d = {.pid = 0};
  struct tb_acquire_options ao;
  DLManagedTensorVersioned *t = NULL;
  tb_client *c = NULL;
  tb_cu_device dev;
  char why[256] = "";
  int rc;

  if (getpid() != 1)
    return 10;
  if (tb__cuda_load(&cu) != 0 || cu->cuDeviceGet(&dev, 0) != 0 ||
      cu->cuDevicePrimaryCtxRetain(&ctx, dev) != 0 ||
      cu->cuCtxSetCurrent(ctx) != 0)
    return 11;
  snprintf(d.sock, sizeof(d.sock), "%s", sock);
  if (tbt_connect(&d, "ns-consumer", &c) != 0)
    return 12;
  tb_acquire_options_init(&ao);
  ao.timeout_ms = TBT_TIMEOUT_MS;
  rc = tb_acquire(c, "vmm/ns", &ao, &t);
  if (rc != 0) {
    tb_client_last_error(c, why, sizeof(why));
    fprintf(stderr, "ns-consumer: VMM acquire: %s (%s)\n", tb_err_name(rc),
            why);
    return 13;
  }
  if (cu->cuMemcpyDtoH(host,
                       (tb_cu_deviceptr)(uintptr_t)t->dl_tensor.data +
                           t->dl_tensor.byte_offset,
                       sizeof(host)) != 0)
    return 14;
  for (uint32_t i = 0; i < NWORDS; i++)
    if (host[i] != NS_FILL + i)
      return 15;
  if (tb_release(t, NULL) != 0)
    return 16;
  rc = tb_acquire(c, "vmm/ns-ipc", &ao, &t);
  tb_client_last_error(c, why, sizeof(why));
  fprintf(stderr, "ns-consumer: legacy IPC acquire: %s (%s)\n",
          tb_err_name(rc), why);
  /* the error names the kind, the cause and the way out */
  if (rc != TB_ECUDA || strstr(why, "CUDA_ERROR_INVALID_HANDLE") == NULL ||
      strstr(why, "cannot map a cuda-ipc buffer") == NULL ||
      strstr(why, "PID namespace") == NULL || strstr(why, "cuda-vmm") == NULL)
    return 17;
  tb_client_disconnect(c);
  return 0;
}

/* Whether the in-memory log has a line "PREFIX X SUFFIX" (X not empty). */
static int log_has(const char *prefix, const char *suffix) {
  static char text[1 << 16];
  char x[64];

  fk->log_read(text, sizeof(text));
  return fakecuda_text_find(text, 0, prefix, suffix, x, sizeof(x));
}

/* The consumer of vmm_other_shm, run like ns_consumer (argv "shm-consumer
 * SOCKET"): in its own PID namespace, and it first mounts a /dev/shm of
 * its own, as a container without the host's IPC namespace has. Exit 0,
 * or a code. */
static int shm_consumer(const char *sock) {
  struct tbt_daemon d = {.pid = 0};
  struct tb_acquire_options ao;
  DLManagedTensorVersioned *t = NULL;
  tb_client *c = NULL;
  tb_cu_device dev;
  tb_cu_stream s = NULL;
  struct stat before, after;
  char why[512] = "", at[80];
  int rc;

  if (stat("/dev/shm", &before) != 0 ||
      mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, NULL) != 0 ||
      stat("/dev/shm", &after) != 0 || after.st_dev == before.st_dev)
    return 20;
  if (tb__cuda_load(&cu) != 0 || cu->cuDeviceGet(&dev, 0) != 0 ||
      cu->cuDevicePrimaryCtxRetain(&ctx, dev) != 0 ||
      cu->cuCtxSetCurrent(ctx) != 0 ||
      cu->cuStreamCreate(&s, TB_CU_STREAM_NON_BLOCKING) != 0)
    return 21;
  fk = fakecuda();
  if (fk == NULL)
    return 22;
  fk->set_busy(1); /* the reads below are still queued at the release */
  snprintf(d.sock, sizeof(d.sock), "%s", sock);
  if (tbt_connect(&d, "shm-consumer", &c) != 0)
    return 23;
  tb_acquire_options_init(&ao);
  ao.timeout_ms = TBT_TIMEOUT_MS;
  ao.stream = s;
  fk->log_clear();
  /* in flight at publish: the producer's event cannot be waited for from
   * here and is not opened; the stream waits for the buffer's ready
   * signal, which the producer's stream has not written yet */
  rc = tb_acquire(c, "vmm/shm-pending", &ao, &t);
  if (rc != 0) {
    tb_client_last_error(c, why, sizeof(why));
    fprintf(stderr, "shm-consumer: pending version: %s (%s)\n",
            tb_err_name(rc), why);
    return 24;
  }
  snprintf(at, sizeof(at), "wait-value %s ", fk->stream_name(s));
  if (!log_has(at, " >= 1 (unmet)") || log_prefixed("ipc-open-event ") != 0)
    return 25;
  if (tb_release(t, TB_STREAM_NO_SYNC) != 0)
    return 26;
  /* the same from a buffer without a signal area: TB_ENOTSUP */
  rc = tb_acquire(c, "vmm/shm-nosignal", &ao, &t);
  tb_client_last_error(c, why, sizeof(why));
  fprintf(stderr, "shm-consumer: pending version without a signal: %s (%s)\n",
          tb_err_name(rc), why);
  if (rc != TB_ENOTSUP || strstr(why, "without a ready signal") == NULL)
    return 27;
  /* finished at publish: nothing to wait for, so it reads; released with
   * its read queued, the done signal goes into this session's done slot
   * after the read (written when the stream is synchronised: the fake) */
  fk->log_clear();
  rc = tb_acquire(c, "vmm/shm-done", &ao, &t);
  if (rc != 0)
    return 28;
  if (log_prefixed("ipc-open-event ") != 0 || log_prefixed("wait") != 0)
    return 29;
  if (tb_release(t, s) != 0)
    return 30;
  snprintf(at, sizeof(at), "write-value %s ", fk->stream_name(s));
  if (!log_has(at, " 1 (deferred)"))
    return 31;
  if (cu->cuStreamSynchronize(s) != 0)
    return 32;
  /* finished at publish from the buffer without a signal area, released
   * with its read queued: a done event the producer cannot wait for, and
   * no done signal to stand for it */
  rc = tb_acquire(c, "vmm/shm-nosignal-done", &ao, &t);
  if (rc != 0)
    return 33;
  if (tb_release(t, s) != 0)
    return 34;
  tb_client_disconnect(c);
  return 0;
}

/* Run this test binary as "MODE SOCKET" under `unshare --pid --fork
 * --mount-proc`; its wait status. */
static int run_self_in_namespace(const char *mode) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  pid_t pid;
  int st = -1;

  assert_true(n > 0);
  self[n] = '\0';
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    execlp("unshare", "unshare", "--pid", "--fork", "--mount-proc", self,
           mode, daemon_.sock, (char *)NULL);
    _exit(127);
  }
  assert_int_equal(waitpid(pid, &st, 0), pid);
  return st;
}

/* May this process make PID namespaces (root, or a user namespace)? */
static int can_unshare_pid(void) {
  pid_t pid = fork();
  int st;

  if (pid == 0)
    _exit(unshare(CLONE_NEWPID | CLONE_NEWNS) == 0 ? 0 : 1);
  return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) &&
         WEXITSTATUS(st) == 0;
}

static void fill_words(tb_cu_deviceptr p, uint32_t base) {
  static uint32_t host[NWORDS];
  for (uint32_t i = 0; i < NWORDS; i++)
    host[i] = base + i;
  assert_int_equal(cu->cuMemcpyHtoD(p, host, sizeof(host)), 0);
}

/* A producer here, a consumer in another PID namespace: the VMM version
 * crosses (its descriptor does), legacy IPC does not. The control path
 * only: the fake driver has no events that could fail to cross
 * (docs/cuda.md, "VMM buffers", says what is unmeasured). */
static void vmm_pid_namespace(void **state) {
  tb_client *p = NULL;
  tb_buffer *b = NULL;
  tb_cu_deviceptr ipc = 0;
  int64_t shape;
  DLTensor dt;
  int st;

  (void)state;
  if (!can_unshare_pid()) {
    fprintf(stderr, "no PID namespaces here (not root): skipped\n");
    skip();
  }
  assert_int_equal(tbt_connect(&daemon_, "ns-producer", &p), 0);
  assert_int_equal(tb_buffer_create_cuda(p, NWORDS * 4, 0, 0, &b), 0);
  fill_words((tb_cu_deviceptr)(uintptr_t)tb_buffer_data(b), NS_FILL);
  ring_tensor(&dt, &shape, tb_buffer_data(b));
  assert_int_equal(tb_channel_publish(p, "vmm/ns", &dt, NULL, NULL), 0);
  assert_int_equal(cu->cuMemAlloc(&ipc, NWORDS * 4), 0);
  fill_words(ipc, NS_FILL);
  ring_tensor(&dt, &shape, (void *)(uintptr_t)ipc);
  assert_int_equal(tb_channel_publish(p, "vmm/ns-ipc", &dt, NULL, NULL), 0);

  st = run_self_in_namespace("ns-consumer");
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail_msg("the consumer in its own PID namespace failed: status %#x "
             "(exit codes in ns_consumer)", st);
  assert_int_equal(tb_buffer_destroy(b), 0);
  tb_client_disconnect(p);
  assert_int_equal(cu->cuMemFree(ipc), 0);
}

/* A consumer in another PID namespace that sees another /dev/shm (a
 * container without the host's): CUDA interprocess events do not reach
 * across (measured for PID namespaces on an H200; for /dev/shm, public
 * reports), and a stream waiting on one might wait for good. So the
 * library neither opens nor waits on them, and signals in the VMM
 * buffers stand for them (docs/cuda.md, "Signals"): a version published
 * with its work in flight makes the consumer's stream wait for the
 * buffer's ready signal; one from a buffer without a signal area (a
 * driver without 64-bit stream memory operations) is TB_ENOTSUP; the
 * producer's tb_wait_free for a version that consumer released with its
 * read queued waits for the consumer's done signal, in the done slot the
 * daemon gave it, and opens no event; for a version of the buffer without
 * a signal area it is TB_ENOTSUP, saying why. */
static void vmm_other_shm(void **state) {
  char at[80];
  tb_client *p = NULL;
  tb_buffer *b[3] = {NULL, NULL, NULL};
  int64_t shape;
  DLTensor dt;
  uint64_t done_v = 0, nosig_v = 0;
  int st;

  (void)state;
  if (!can_unshare_pid()) {
    fprintf(stderr, "no mount namespaces here (not root): skipped\n");
    skip();
  }
  assert_int_equal(tbt_connect(&daemon_, "shm-producer", &p), 0);
  for (int i = 0; i < 3; i++) {
    if (i == 2) /* this one without a signal area */
      setenv("FAKECUDA_NO_MEMOPS", "1", 1);
    assert_int_equal(tb_buffer_create_cuda(p, NWORDS * 4, 0, 0, &b[i]), 0);
    unsetenv("FAKECUDA_NO_MEMOPS");
    fill_words((tb_cu_deviceptr)(uintptr_t)tb_buffer_data(b[i]), NS_FILL);
  }
  tb_cu_stream s = NULL;
  assert_int_equal(cu->cuStreamCreate(&s, TB_CU_STREAM_NON_BLOCKING), 0);
  struct tb_publish_options po;
  tb_publish_options_init(&po);
  po.stream = s;
  fk->set_busy(1); /* in flight at publish */
  fk->log_clear();
  ring_tensor(&dt, &shape, tb_buffer_data(b[0]));
  assert_int_equal(tb_channel_publish(p, "vmm/shm-pending", &dt, &po, NULL),
                   0);
  snprintf(at, sizeof(at), "write-value %s ", fk->stream_name(s));
  if (!log_has(at, " 1 (deferred)")) {
    show_log();
    fail_msg("no ready signal written after the publish's work");
  }
  ring_tensor(&dt, &shape, tb_buffer_data(b[2]));
  assert_int_equal(tb_channel_publish(p, "vmm/shm-nosignal", &dt, &po, NULL),
                   0);
  fk->set_busy(0); /* finished at publish */
  ring_tensor(&dt, &shape, tb_buffer_data(b[1]));
  assert_int_equal(tb_channel_publish(p, "vmm/shm-done", &dt, &po, &done_v),
                   0);
  ring_tensor(&dt, &shape, tb_buffer_data(b[2]));
  assert_int_equal(
      tb_channel_publish(p, "vmm/shm-nosignal-done", &dt, &po, &nosig_v), 0);

  st = run_self_in_namespace("shm-consumer");
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail_msg("the consumer with its own /dev/shm failed: status %#x (exit "
             "codes in shm_consumer)", st);
  /* the version it released with its read queued */
  assert_int_equal(tb_channel_publish(p, "vmm/shm-done", &dt, &po, NULL), 0);
  fk->log_clear();
  assert_int_equal(tb_wait_free(p, "vmm/shm-done", done_v, TBT_TIMEOUT_MS, s),
                   0);
  snprintf(at, sizeof(at), "wait-value %s ", fk->stream_name(s));
  if (!log_has(at, " >= 1") || log_has(at, " >= 1 (unmet)") ||
      log_prefixed("ipc-open-event ") != 0) {
    show_log();
    fail_msg("tb_wait_free did not wait for the consumer's done signal "
             "(alone, and written)");
  }
  /* the version read from the buffer without signals: its reader cannot
   * be waited for, said plainly (twice: the answer does not change), and
   * nothing is enqueued on the stream */
  ring_tensor(&dt, &shape, tb_buffer_data(b[2]));
  assert_int_equal(
      tb_channel_publish(p, "vmm/shm-nosignal-done", &dt, &po, NULL), 0);
  for (int k = 0; k < 2; k++) {
    char why[1024];
    fk->log_clear();
    assert_int_equal(tb_wait_free(p, "vmm/shm-nosignal-done", nosig_v,
                                  TBT_TIMEOUT_MS, s),
                     TB_ENOTSUP);
    tb_client_last_error(p, why, sizeof(why));
    if (strstr(why, "another PID namespace or with another /dev/shm") ==
            NULL ||
        strstr(why, "without a done signal") == NULL ||
        log_prefixed("wait") != 0 || log_prefixed("ipc-open-event ") != 0) {
      show_log();
      fail_msg("wait %d: %s", k, why);
    }
  }
  for (int i = 0; i < 3; i++)
    assert_int_equal(tb_buffer_destroy(b[i]), 0);
  tb_client_disconnect(p);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(vmm_lifecycle),
      cmocka_unit_test(vmm_producer_restart),
      cmocka_unit_test(vmm_ring),
      cmocka_unit_test(vmm_pid_namespace),
      cmocka_unit_test(vmm_other_shm),
  };
  if (argc == 3 && strcmp(argv[1], "ns-consumer") == 0)
    return ns_consumer(argv[2]);
  if (argc == 3 && strcmp(argv[1], "shm-consumer") == 0)
    return shm_consumer(argv[2]);
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
