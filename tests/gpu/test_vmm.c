/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: CUDA VMM buffers (docs/cuda.md, "VMM buffers" and "Signals").
 *
 * vmm_exchange: a producer fills a tb_buffer_create_cuda buffer with a
 * kernel on its stream and publishes it; a consumer process acquires it on
 * its own stream with exactly one import (the driver counters), checks the
 * lease says cuda-vmm and counts no word wrong, then acquires a second
 * version from the same buffer with no second import and no legacy IPC
 * open, and reads it right.
 *
 * vmm_producer_sigkill: the producer publishes a finished version and is
 * SIGKILLed; only then does a new consumer process start, acquire the
 * latest version (the one published) and read it right (the daemon's
 * descriptor keeps the memory; legacy IPC memory dies with its producer:
 * docs/cuda.md, "What happens on a crash"); NEXT after it with timeout 0
 * is TB_ECLOSED.
 *
 * vmm_ring: a producer ring of three slots (tb_ring_create_cuda,
 * tb_ring_next, tb_ring_publish) publishes eight versions written by
 * kernels; each reads right in the consumer, as cuda-vmm.
 *
 * vmm_pid_namespaces (root; skipped otherwise): producer and consumer each
 * in a new PID namespace with their own /proc, as `unshare --pid --fork
 * --mount-proc` makes them, sharing /dev/shm. Interprocess events do not
 * reach across, so the buffers' signals order the exchange, checked on the
 * data both ways:
 *  - done signal: the consumer reads version 1 (published finished) with a
 *    1 s kernel queued on its stream and releases at once; the producer
 *    publishes another buffer, tb_wait_free(v1) on its stream must succeed,
 *    and it rewrites version 1's buffer on that stream: the consumer's read
 *    must count 0 words rewritten;
 *  - ready signal: that rewrite (a 500 ms kernel) is published as version
 *    2 with its work in flight; the consumer's acquire must succeed and its
 *    stream's read count 0 words wrong.
 *
 * vmm_containers: the same with a /dev/shm of its own in each namespace,
 * as containers without the host's IPC namespace have. */

#include <dlfcn.h>
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu_common.h"

#define N (1u << 20) /* 4 MiB of words: two granules on an H200 */
#define VAL 41u
#define VAL2 42u
#define VAL3 43u

static struct tbt_daemon daemon_;

/* A VMM buffer of N words filled with v on s, published (history 1). */
static uint64_t publish_vmm(tb_client *c, struct tbg_gpu *g, tb_buffer **b,
                            tb_cu_stream s, unsigned v, const char *ch) {
  if (*b == NULL)
    TBG_OK(c, tb_buffer_create_cuda(c, N * 4ull, g->ordinal, 0, b));
  tb_cu_deviceptr p = (tb_cu_deviceptr)(uintptr_t)tb_buffer_data(*b);
  tbg_fill(g, p, v, N, s);
  return tbg_publish(c, g, ch, p, N, s, 1);
}

/* Checks the lease is of a VMM buffer; returns its version. */
static uint64_t check_kind(tb_client *c, DLManagedTensorVersioned *t) {
  struct tb_lease_info li;
  TBG_OK(c, tb_lease_get_info(t, sizeof(li), &li));
  if (li.memory_kind != TB_MEMORY_CUDA_VMM)
    TBG_FAIL("memory kind %s, expected cuda-vmm",
             tb_memory_kind_name(li.memory_kind));
  return li.version;
}

/* ---- exchange ---- */

static int ex_producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  tb_buffer *b = NULL;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  uint64_t v = publish_vmm(c, &g, &b, s, VAL, "gpu/vmm");
  tbg_child_say(ch, "published %llu", (unsigned long long)v);
  tbg_child_hear(ch, "again", NULL, 0);
  TBG_CU(g.cu->cuStreamSynchronize(s)); /* the consumer released v */
  v = publish_vmm(c, &g, &b, s, VAL2, "gpu/vmm");
  tbg_child_say(ch, "published %llu", (unsigned long long)v);
  tbg_child_hear(ch, "done", NULL, 0);
  TBG_OK(c, tb_buffer_destroy(b));
  tb_client_disconnect(c);
  return 0;
}

static int ex_consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  DLManagedTensorVersioned *t = NULL;
  struct tb_cuda_counters before, after;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  uint64_t v = tbg_child_hear_version(ch);
  tb__cuda_counters(&before);
  TBG_OK(c, tbg_acquire(c, "gpu/vmm", TB_ACQUIRE_EXACT, v, s, &t));
  tb__cuda_counters(&after);
  if (after.vmm_import != before.vmm_import + 1)
    TBG_FAIL("%lu imports for the first acquire of the buffer, expected 1",
             after.vmm_import - before.vmm_import);
  check_kind(c, t);
  if (tbg_count(&g, tbg_tensor_ptr(t, N), VAL, N, s) != 0)
    TBG_FAIL("version %llu reads wrong", (unsigned long long)v);
  TBG_OK(c, tb_release(t, s));
  tbg_child_say(ch, "released");
  v = tbg_child_hear_version(ch);
  tb__cuda_counters(&before);
  TBG_OK(c, tbg_acquire(c, "gpu/vmm", TB_ACQUIRE_EXACT, v, s, &t));
  tb__cuda_counters(&after);
  if (after.ipc_open_mem != before.ipc_open_mem)
    TBG_FAIL("a VMM acquire opened legacy IPC memory");
  if (after.vmm_import != before.vmm_import)
    TBG_FAIL("the second acquire of the buffer imported it again");
  if (tbg_count(&g, tbg_tensor_ptr(t, N), VAL2, N, s) != 0)
    TBG_FAIL("version %llu reads wrong", (unsigned long long)v);
  TBG_OK(c, tb_release(t, s));
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void vmm_exchange(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_start(&daemon_, &p, ex_producer, NULL, &c, ex_consumer, NULL);
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_hear(&c, "consumer", "released", NULL, 0);
  tbg_say(&p, "again");
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_hear(&c, "consumer", "ok", NULL, 0);
  tbg_say(&p, "done");
  tbg_reap(&p, "producer");
  tbg_reap(&c, "consumer");
  tbg_daemon_down(&daemon_);
}

/* ---- producer SIGKILL ---- */

static int kill_producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  tb_buffer *b = NULL;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  uint64_t v = publish_vmm(c, &g, &b, s, VAL, "gpu/vmm-kill");
  TBG_CU(g.cu->cuStreamSynchronize(s)); /* written before the kill */
  tbg_child_say(ch, "published %llu", (unsigned long long)v);
  tbg_child_hear(ch, "never", NULL, 0); /* killed here */
  return 3;
}

static int late_consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  DLManagedTensorVersioned *t = NULL, *t2 = NULL;
  struct tb_acquire_options o;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "late-consumer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  uint64_t v = tbg_child_hear_version(ch);
  TBG_OK(c, tbg_acquire(c, "gpu/vmm-kill", TB_ACQUIRE_LATEST, 0, s, &t));
  uint64_t got = check_kind(c, t);
  if (got != v)
    TBG_FAIL("got version %llu, expected %llu", (unsigned long long)got,
             (unsigned long long)v);
  if (tbg_count(&g, tbg_tensor_ptr(t, N), VAL, N, s) != 0)
    TBG_FAIL("the dead producer's last version reads wrong");
  tb_acquire_options_init(&o);
  o.mode = TB_ACQUIRE_NEXT;
  o.version = v;
  o.timeout_ms = 0;
  o.stream = s;
  TBG_RC(c, tb_acquire(c, "gpu/vmm-kill", &o, &t2), TB_ECLOSED);
  TBG_OK(c, tb_release(t, s));
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void vmm_producer_sigkill(void **state) {
  struct tbt_child p, c;
  char v[32];
  (void)state;
  tbg_daemon_up(&daemon_);
  tbg_spawn(&p, kill_producer, NULL);
  tbg_hear(&p, "producer", "published", v, sizeof v);
  kill(p.pid, SIGKILL);
  assert_int_equal(tbt_child_wait(&p, TBT_TIMEOUT_MS), 128 + SIGKILL);
  tbg_spawn(&c, late_consumer, NULL); /* starts after the producer died */
  tbg_say(&c, "v %s", v);
  tbg_hear(&c, "consumer", "ok", NULL, 0);
  tbg_reap(&c, "consumer");
  tbg_daemon_down(&daemon_);
}

/* ---- a producer ring ---- */

#define RING_VERSIONS 8

static int ring_producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  struct tb_publish_options po;
  tb_ring *r = NULL;
  int64_t shape = N;
  DLTensor t;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "ring-producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  TBG_OK(c, tb_ring_create_cuda(c, "gpu/vmm-ring", N * 4ull, 3, 0, 0, &r));
  for (unsigned i = 1; i <= RING_VERSIONS; i++) {
    void *p = NULL;
    uint64_t v = 0;
    /* the slot's last version is free: s waits for its readers */
    TBG_OK(c, tb_ring_next(r, TBT_TIMEOUT_MS, s, &p));
    tbg_fill(&g, (tb_cu_deviceptr)(uintptr_t)p, 100 + i, N, s);
    memset(&t, 0, sizeof(t));
    t.data = p;
    t.device.device_type = kDLCUDA;
    t.ndim = 1;
    t.shape = &shape;
    t.dtype.code = kDLUInt;
    t.dtype.bits = 32;
    t.dtype.lanes = 1;
    tb_publish_options_init(&po);
    po.stream = s;
    TBG_OK(c, tb_ring_publish(r, &t, &po, &v));
    tbg_child_say(ch, "published %llu", (unsigned long long)v);
    tbg_child_hear(ch, "read", NULL, 0);
  }
  TBG_OK(c, tb_ring_destroy(r));
  tb_client_disconnect(c);
  return 0;
}

static int ring_consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "ring-consumer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  for (unsigned i = 1; i <= RING_VERSIONS; i++) {
    DLManagedTensorVersioned *t = NULL;
    uint64_t v = tbg_child_hear_version(ch);
    TBG_OK(c, tbg_acquire(c, "gpu/vmm-ring", TB_ACQUIRE_EXACT, v, s, &t));
    check_kind(c, t);
    if (tbg_count(&g, tbg_tensor_ptr(t, N), 100 + i, N, s) != 0)
      TBG_FAIL("ring version %llu reads wrong", (unsigned long long)v);
    TBG_OK(c, tb_release(t, s));
    tbg_child_say(ch, "read");
  }
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void vmm_ring(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_start(&daemon_, &p, ring_producer, NULL, &c, ring_consumer, NULL);
  for (unsigned i = 1; i <= RING_VERSIONS; i++) {
    tbg_relay(&p, "producer", "published", &c, "v");
    tbg_hear(&c, "consumer", "read", NULL, 0);
    tbg_say(&p, "read");
  }
  tbg_hear(&c, "consumer", "ok", NULL, 0);
  tbg_reap(&p, "producer");
  tbg_reap(&c, "consumer");
  tbg_daemon_down(&daemon_);
}

/* ---- PID namespaces ---- */

/* Run fn in a new PID namespace with its own /proc (unshare --pid --fork
 * --mount-proc), and with private_shm a /dev/shm of its own, as a container
 * without the host's IPC namespace has: returns fn's exit status, or -1. */
static int in_pid_namespace(int (*fn)(struct tbt_chan *, void *),
                            struct tbt_chan *ch, int private_shm) {
  pid_t pid;
  int st;

  if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0)
    TBG_FAIL("unshare(CLONE_NEWPID | CLONE_NEWNS) failed");
  pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              NULL) != 0)
      TBG_FAIL("cannot mount /proc in the new PID namespace");
    if (getpid() != 1)
      TBG_FAIL("pid %d in the new namespace, expected 1", (int)getpid());
    if (private_shm &&
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, NULL) != 0)
      TBG_FAIL("cannot mount a private /dev/shm");
    _exit(fn(ch, NULL));
  }
  if (waitpid(pid, &st, 0) != pid)
    return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int ns_producer_body(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  tb_buffer *b = NULL, *other = NULL;
  char why[300] = "";
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "ns-producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  TBG_OK(c, tb_buffer_create_cuda(c, N * 4ull, 0, 0, &b));
  TBG_OK(c, tb_buffer_create_cuda(c, N * 4ull, 0, 0, &other));
  tb_cu_deviceptr p = (tb_cu_deviceptr)(uintptr_t)tb_buffer_data(b);
  tb_cu_deviceptr q = (tb_cu_deviceptr)(uintptr_t)tb_buffer_data(other);
  /* version 1: finished at publish */
  tbg_fill(&g, p, VAL, N, s);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  uint64_t v1 = tbg_publish(c, &g, "gpu/vmm-ns", p, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v1);
  /* the consumer reads it for 1 s on its stream and releases it at once */
  tbg_child_hear(ch, "read1", NULL, 0);
  tbg_fill(&g, q, VAL3, N, s);
  (void)tbg_publish(c, &g, "gpu/vmm-ns", q, N, s, 1); /* v1 leaves */
  /* before p is rewritten: the consumer's done signal (its done event
   * does not reach here) */
  int rc = tb_wait_free(c, "gpu/vmm-ns", v1, TBT_TIMEOUT_MS, s);
  if (rc < 0) {
    tb_client_last_error(c, why, sizeof(why));
    TBG_FAIL("tb_wait_free across namespaces: %s (%s)", tb_err_name(rc),
             why);
  }
  /* version 2 with its GPU work in flight at publish (0.5 s): the
   * consumer's stream must wait for the ready signal */
  tbg_spin_fill(&g, p, VAL2, N, 500, s);
  uint64_t v2 = tbg_publish(c, &g, "gpu/vmm-ns", p, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v2);
  tbg_child_hear(ch, "done", NULL, 0);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  tb_client_disconnect(c);
  return 0;
}

static int ns_consumer_body(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  DLManagedTensorVersioned *t = NULL;
  char why[300] = "";
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "ns-consumer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1), s2 = tbg_stream(&g, 1);
  uint64_t v = tbg_child_hear_version(ch);
  TBG_OK(c, tbg_acquire(c, "gpu/vmm-ns", TB_ACQUIRE_EXACT, v, s, &t));
  check_kind(c, t);
  /* a read still queued at the release (1 s, then the count): the
   * producer rewrites the buffer after tb_wait_free, which must wait for
   * the done signal written after this read */
  tb_cu_deviceptr cnt1 = tbg_alloc(&g, 4);
  tbg_spin_count_async(&g, tbg_tensor_ptr(t, N), VAL, N, 1000, cnt1, s);
  TBG_OK(c, tb_release(t, s));
  tbg_child_say(ch, "read1");
  v = tbg_child_hear_version(ch);
  int rc = tbg_acquire(c, "gpu/vmm-ns", TB_ACQUIRE_EXACT, v, s2, &t);
  if (rc != 0) {
    tb_client_last_error(c, why, sizeof(why));
    TBG_FAIL("a version published with work in flight, across namespaces: "
             "%s (%s)", tb_err_name(rc), why);
  }
  unsigned bad2 = tbg_count(&g, tbg_tensor_ptr(t, N), VAL2, N, s2);
  TBG_OK(c, tb_release(t, s2));
  unsigned bad1 = tbg_counter_read(&g, cnt1, s);
  tbg_child_say(ch, "done %u %u", bad1, bad2);
  tb_client_disconnect(c);
  if (bad1 != 0)
    TBG_FAIL("%u of %u words of version 1 were rewritten under the read: "
             "tb_wait_free did not wait for the done signal", bad1, N);
  if (bad2 != 0)
    TBG_FAIL("%u of %u words of version 2 read before the producer's work "
             "finished: the acquire did not wait for the ready signal",
             bad2, N);
  return 0;
}

static int ns_producer(struct tbt_chan *ch, void *arg) {
  return in_pid_namespace(ns_producer_body, ch, *(const int *)arg);
}

static int ns_consumer(struct tbt_chan *ch, void *arg) {
  return in_pid_namespace(ns_consumer_body, ch, *(const int *)arg);
}

/* private_shm 0: the processes share /dev/shm (unshare --pid); 1: each has
 * its own, as containers without --ipc=host do. Either way interprocess
 * events do not reach across (docs/cuda.md, "Signals"): the buffers'
 * signals order the exchange in both directions, checked on the data. */
static void namespaces(int private_shm) {
  struct tbt_child p, c;
  char outcome[300];
  const char *how = private_shm ? "with private /dev/shm" : "sharing /dev/shm";
  if (geteuid() != 0) {
    fprintf(stderr, "vmm_pid_namespaces needs root (unshare): skipped\n");
    skip();
  }
  tbg_start(&daemon_, &p, ns_producer, &private_shm, &c, ns_consumer,
            &private_shm);
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_hear(&c, "consumer", "read1", NULL, 0);
  tbg_say(&p, "read1");
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_hear(&c, "consumer", "done", outcome, sizeof outcome);
  fprintf(stderr, "across PID namespaces %s: words wrong under the read, "
          "in the pending version: %s\n", how, outcome);
  tbg_say(&p, "done");
  tbg_reap(&p, "producer");
  tbg_reap(&c, "consumer");
  tbg_daemon_down(&daemon_);
}

static void vmm_pid_namespaces(void **state) {
  (void)state;
  namespaces(0);
}

static void vmm_containers(void **state) {
  (void)state;
  namespaces(1);
}

TBG_MAIN(cmocka_unit_test(vmm_exchange),
         cmocka_unit_test(vmm_producer_sigkill),
         cmocka_unit_test(vmm_ring),
         cmocka_unit_test(vmm_pid_namespaces),
         cmocka_unit_test(vmm_containers))
