/* SPDX-License-Identifier: Apache-2.0 */
#include "gpu_common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "kernels_ptx.h"

static int probe_child(struct tbt_chan *ch, void *arg) {
  const struct tb_cuda *cu;
  (void)arg;
  if (tb__cuda_load(&cu) != 0) {
    tbt_send(ch->wr, "%s", tb__cuda_why());
    return 77;
  }
  tbt_send(ch->wr, "ok");
  return 0;
}

void tbg_skip_without_gpu(void) {
  struct tbt_child c;
  char why[256] = "";
  if (tbt_child_start(&c, probe_child, NULL) != 0) {
    fprintf(stderr, "cannot fork the CUDA probe\n");
    exit(1);
  }
  tbt_recv(c.rd, why, sizeof why, TBT_TIMEOUT_MS);
  int code = tbt_child_wait(&c, TBT_TIMEOUT_MS);
  if (code == 77) {
    printf("skipped: no CUDA driver/GPU (%s)\n", why);
    exit(77);
  }
  if (code != 0) {
    fprintf(stderr, "CUDA probe child failed (%d)\n", code);
    exit(1);
  }
}

void tbg_gpu_init(struct tbg_gpu *g, int ordinal) {
  tb_cu_uuid u;
  memset(g, 0, sizeof *g);
  if (tb__cuda_load(&g->cu) != 0)
    TBG_FAIL("CUDA not available: %s", tb__cuda_why());
  const struct tb_cuda *cu = g->cu;
  g->ordinal = ordinal;
  TBG_CU(cu->cuDeviceGet(&g->dev, ordinal));
  TBG_CU(cu->cuDevicePrimaryCtxRetain(&g->ctx, g->dev));
  TBG_CU(cu->cuCtxSetCurrent(g->ctx));
  TBG_CU(cu->cuDeviceGetUuid(&u, g->dev));
  memcpy(g->uuid, u.bytes, 16);
  TBG_CU(cu->cuModuleLoadData(&g->mod, tb_kernels_ptx));
  TBG_CU(cu->cuModuleGetFunction(&g->fill, g->mod, "tb_fill_u32"));
  TBG_CU(cu->cuModuleGetFunction(&g->spin_fill, g->mod, "tb_spin_fill_u32"));
  TBG_CU(cu->cuModuleGetFunction(&g->spin_count, g->mod, "tb_spin_count_u32"));
  TBG_CU(cu->cuModuleGetFunction(&g->count, g->mod, "tb_count_u32"));
  TBG_CU(cu->cuModuleGetFunction(&g->copy, g->mod, "tb_copy_u32"));
}

tb_cu_deviceptr tbg_alloc(struct tbg_gpu *g, size_t bytes) {
  tb_cu_deviceptr p = 0;
  TBG_CU(g->cu->cuMemAlloc(&p, bytes));
  return p;
}

tb_cu_stream tbg_stream(struct tbg_gpu *g, int nonblocking) {
  tb_cu_stream s = NULL;
  TBG_CU(g->cu->cuStreamCreate(&s, nonblocking ? TB_CU_STREAM_NON_BLOCKING
                                               : TB_CU_STREAM_DEFAULT));
  return s;
}

static unsigned blocks_for(size_t n) {
  size_t b = (n + 255) / 256;
  if (b < 1)
    b = 1;
  return b > 1024 ? 1024u : (unsigned)b;
}

static void launch(struct tbg_gpu *g, tb_cu_function f, size_t n,
                   tb_cu_stream s, void **params) {
  TBG_CU(g->cu->cuLaunchKernel(f, blocks_for(n), 1, 1, 256, 1, 1, 0, s,
                               params, NULL));
}

void tbg_fill(struct tbg_gpu *g, tb_cu_deviceptr p, unsigned v, size_t n,
              tb_cu_stream s) {
  unsigned long long nn = n;
  void *params[] = {&p, &v, &nn};
  launch(g, g->fill, n, s, params);
}

void tbg_spin_fill(struct tbg_gpu *g, tb_cu_deviceptr p, unsigned v, size_t n,
                   unsigned ms, tb_cu_stream s) {
  unsigned long long nn = n, ns = (unsigned long long)ms * 1000000ull;
  void *params[] = {&p, &v, &nn, &ns};
  launch(g, g->spin_fill, n, s, params);
}

void tbg_count_async(struct tbg_gpu *g, tb_cu_deviceptr p, unsigned expect,
                     size_t n, tb_cu_deviceptr cnt, tb_cu_stream s) {
  unsigned long long nn = n;
  void *params[] = {&p, &expect, &nn, &cnt};
  TBG_CU(g->cu->cuMemsetD32Async(cnt, 0, 1, s));
  launch(g, g->count, n, s, params);
}

void tbg_spin_count_async(struct tbg_gpu *g, tb_cu_deviceptr p,
                          unsigned expect, size_t n, unsigned ms,
                          tb_cu_deviceptr cnt, tb_cu_stream s) {
  unsigned long long nn = n, ns = (unsigned long long)ms * 1000000ull;
  void *params[] = {&p, &expect, &nn, &ns, &cnt};
  TBG_CU(g->cu->cuMemsetD32Async(cnt, 0, 1, s));
  launch(g, g->spin_count, n, s, params);
}

void tbg_spin_count_us_async(struct tbg_gpu *g, tb_cu_deviceptr p,
                             unsigned expect, size_t n, unsigned us,
                             tb_cu_deviceptr cnt, tb_cu_stream s) {
  unsigned long long nn = n, ns = (unsigned long long)us * 1000ull;
  void *params[] = {&p, &expect, &nn, &ns, &cnt};
  TBG_CU(g->cu->cuMemsetD32Async(cnt, 0, 1, s));
  launch(g, g->spin_count, n, s, params);
}

unsigned tbg_counter_read(struct tbg_gpu *g, tb_cu_deviceptr cnt,
                          tb_cu_stream s) {
  unsigned v = 0;
  TBG_CU(g->cu->cuStreamSynchronize(s));
  TBG_CU(g->cu->cuMemcpyDtoH(&v, cnt, sizeof v));
  return v;
}

unsigned tbg_count(struct tbg_gpu *g, tb_cu_deviceptr p, unsigned expect,
                   size_t n, tb_cu_stream s) {
  tb_cu_deviceptr cnt = tbg_alloc(g, sizeof(unsigned));
  tbg_count_async(g, p, expect, n, cnt, s);
  unsigned v = tbg_counter_read(g, cnt, s);
  TBG_CU(g->cu->cuMemFree(cnt));
  return v;
}

tb_client *tbg_connect(const struct tbt_daemon *d, const char *name,
                       int contract) {
  tb_client *c = NULL;
  int rc = tbt_connect_contract(d, name, contract, &c);
  if (rc != 0)
    TBG_FAIL("connect %s: %s", name, tb_err_name(rc));
  return c;
}

static void u32_tensor(DLTensor *t, int64_t *shape, const struct tbg_gpu *g,
                       tb_cu_deviceptr p, size_t n) {
  memset(t, 0, sizeof *t);
  *shape = (int64_t)n;
  t->data = (void *)(uintptr_t)p;
  t->device.device_type = kDLCUDA;
  t->device.device_id = g->ordinal;
  t->ndim = 1;
  t->dtype.code = kDLUInt;
  t->dtype.bits = 32;
  t->dtype.lanes = 1;
  t->shape = shape;
  t->strides = NULL;
  t->byte_offset = 0;
}

int tbg_publish_rc(tb_client *c, const struct tbg_gpu *g, const char *channel,
                   tb_cu_deviceptr p, size_t n, void *stream) {
  struct tb_publish_options o;
  DLTensor t;
  int64_t shape;
  u32_tensor(&t, &shape, g, p, n);
  tb_publish_options_init(&o);
  o.stream = stream;
  return tb_publish(c, channel, &t, &o, NULL);
}

uint64_t tbg_publish(tb_client *c, const struct tbg_gpu *g, const char *channel,
                     tb_cu_deviceptr p, size_t n, void *stream,
                     uint32_t history_depth) {
  struct tb_publish_options o;
  DLTensor t;
  int64_t shape;
  uint64_t v = 0;
  u32_tensor(&t, &shape, g, p, n);
  tb_publish_options_init(&o);
  o.stream = stream;
  o.history_depth = history_depth;
  TBG_OK(c, tb_publish(c, channel, &t, &o, &v));
  return v;
}

int tbg_acquire_on(tb_client *c, const char *channel, int mode,
                   uint64_t version, void *stream, int device, unsigned flags,
                   DLManagedTensorVersioned **out) {
  struct tb_acquire_options o;
  tb_acquire_options_init(&o);
  o.mode = mode;
  o.version = version;
  o.timeout_ms = TBT_TIMEOUT_MS;
  o.stream = stream;
  o.device = device;
  o.flags = flags;
  return tb_acquire(c, channel, &o, out);
}

int tbg_acquire(tb_client *c, const char *channel, int mode, uint64_t version,
                void *stream, DLManagedTensorVersioned **out) {
  return tbg_acquire_on(c, channel, mode, version, stream, -1, 0, out);
}

tb_cu_deviceptr tbg_tensor_ptr(const DLManagedTensorVersioned *t, size_t n) {
  const DLTensor *d = &t->dl_tensor;
  if (d->device.device_type != kDLCUDA)
    TBG_FAIL("acquired tensor has device type %d, not kDLCUDA",
             (int)d->device.device_type);
  if (d->ndim != 1 || d->shape[0] != (int64_t)n || d->dtype.code != kDLUInt ||
      d->dtype.bits != 32 || d->dtype.lanes != 1)
    TBG_FAIL("acquired tensor layout differs from the published one");
  return (tb_cu_deviceptr)(uintptr_t)d->data + d->byte_offset;
}

void tbg_wait_notice(tb_client *c, int type, struct tb_notice *out) {
  struct tb_notice n;
  for (;;) {
    int rc = tb_client_poll_notice(c, &n, TBT_TIMEOUT_MS);
    if (rc != 0)
      TBG_FAIL("waiting for notice %d: %s", type, tb_err_name(rc));
    if (n.type == type)
      break;
  }
  if (out != NULL)
    *out = n;
}

void tbg_child_say(struct tbt_chan *ch, const char *fmt, ...) {
  char buf[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (tbt_send(ch->wr, "%s", buf) != 0)
    TBG_FAIL("cannot send '%s' to the parent", buf);
}

void tbg_child_hear(struct tbt_chan *ch, const char *want, char *rest,
                    size_t restlen) {
  char buf[400];
  size_t wl = strlen(want);
  int rc = tbt_recv(ch->rd, buf, sizeof buf, 60000);
  if (rc != 0)
    TBG_FAIL("waiting for '%s' from the parent: %s", want, strerror(-rc));
  if (strncmp(buf, want, wl) != 0 || (buf[wl] != '\0' && buf[wl] != ' '))
    TBG_FAIL("expected '%s' from the parent, got '%s'", want, buf);
  if (rest != NULL && restlen > 0) {
    const char *r = buf[wl] == ' ' ? buf + wl + 1 : "";
    snprintf(rest, restlen, "%s", r);
  }
}

void tbg_wait_free_one_wait(tb_client *c, const char *channel,
                            uint64_t version, tb_cu_stream s,
                            const char *done_event) {
  struct tb_cuda_counters k0, k1;
  tb__cuda_counters(&k0);
  TBG_OK(c, tb_wait_free(c, channel, version, 0, s));
  tb__cuda_counters(&k1);
  if (k1.stream_wait - k0.stream_wait != 1)
    TBG_FAIL("wait_free made %lu cuStreamWaitEvent calls, expected 1 (%s)",
             k1.stream_wait - k0.stream_wait, done_event);
}

uint64_t tbg_child_hear_version(struct tbt_chan *ch) {
  char line[400], *end;
  tbg_child_hear(ch, "v", line, sizeof line);
  uint64_t v = strtoull(line, &end, 10);
  if (end == line || *end != '\0' || v == 0)
    TBG_FAIL("expected 'v VERSION' from the parent, got 'v %s'", line);
  return v;
}

int tbg_slow_producer(struct tbt_chan *ch, void *slow) {
  const struct tbg_slow *a = slow;
  struct tbg_gpu g;
  tbg_gpu_init(&g, a->producer_ordinal);
  tb_client *c = tbg_connect(a->daemon, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr p = tbg_alloc(&g, a->n * 4);
  tbg_fill(&g, p, a->old_value, a->n, s);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  tbg_child_hear(ch, "go", NULL, 0);
  tbg_spin_fill(&g, p, a->new_value, a->n, a->spin_ms, s);
  uint64_t v = tbg_publish(c, &g, a->channel, p, a->n, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v);
  if (a->wait_for_kill) {
    tbg_child_hear(ch, "never", NULL, 0); /* killed here, its kernel running */
    return 3;
  }
  tbg_child_hear(ch, "done", NULL, 0);
  /* the producer's own view, after its kernel: all new */
  if (tbg_count(&g, p, a->new_value, a->n, s) != 0)
    TBG_FAIL("producer's buffer is not NEW after its kernel");
  tb_client_disconnect(c);
  return 0;
}

int tbg_slow_consumer(struct tbt_chan *ch, void *slow) {
  const struct tbg_slow *a = slow;
  struct tbg_gpu g;
  tbg_gpu_init(&g, a->consumer_ordinal);
  tb_client *c = tbg_connect(a->daemon, "consumer", TB_CONTRACT_SPEC);
  tb_cu_stream sa = tbg_stream(&g, 1), sb = tbg_stream(&g, 1);
  tb_cu_deviceptr ca = tbg_alloc(&g, 4), cb = tbg_alloc(&g, 4);
  DLManagedTensorVersioned *ta = NULL, *tb = NULL;
  tbg_child_say(ch, "ready");
  uint64_t ver = tbg_child_hear_version(ch);

  TBG_OK(c, tbg_acquire_on(c, a->channel, TB_ACQUIRE_EXACT, ver, sa,
                           a->consumer_device, 0, &ta));
  tbg_count_async(&g, tbg_tensor_ptr(ta, a->n), a->new_value, a->n, ca, sa);
  TBG_OK(c, tbg_acquire_on(c, a->channel, TB_ACQUIRE_EXACT, ver,
                           TB_STREAM_NO_SYNC, a->consumer_device, 0, &tb));
  tbg_count_async(&g, tbg_tensor_ptr(tb, a->n), a->new_value, a->n, cb, sb);
  unsigned stale = tbg_counter_read(&g, cb, sb);
  unsigned waited = tbg_counter_read(&g, ca, sa);
  fprintf(stderr, "%s: without wait %u of %zu words stale; with wait %u\n",
          a->consumer_label, stale, a->n, waited);
  if (stale == 0)
    TBG_FAIL("the unsynchronised read saw no stale data: the producer's "
             "kernel finished too early, so this run proves nothing");
  if (waited != 0)
    TBG_FAIL("%s: %u words wrong although the stream waited on the "
             "producer's event", a->consumer_label, waited);
  TBG_OK(c, tb_release(ta, sa));
  TBG_OK(c, tb_release(tb, TB_STREAM_NO_SYNC));
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

/* ---- parent side ---- */

#include <setjmp.h>
#include <cmocka.h>

void tbg_daemon_up(struct tbt_daemon *d) {
  int rc = tbt_daemon_start(d, NULL);
  if (rc != 0)
    fail_msg("daemon did not start: %s", strerror(-rc));
}

void tbg_spawn(struct tbt_child *c, tbt_child_fn fn, void *arg) {
  int rc = tbt_child_start(c, fn, arg);
  if (rc != 0)
    fail_msg("fork: %s", strerror(-rc));
}

void tbg_start(struct tbt_daemon *d, struct tbt_child *p, tbt_child_fn producer,
               void *parg, struct tbt_child *c, tbt_child_fn consumer,
               void *carg) {
  tbg_daemon_up(d);
  tbg_spawn(p, producer, parg);
  tbg_spawn(c, consumer, carg);
}

void tbg_hear(struct tbt_child *c, const char *who, const char *want,
              char *rest, size_t restlen) {
  char buf[400];
  size_t wl = strlen(want);
  int rc = tbt_recv(c->rd, buf, sizeof buf, 60000);
  if (rc != 0) {
    int code = tbt_wait_pid(c->pid, 5000);
    fail_msg("%s: no '%s' (%s); child exit %d", who, want, strerror(-rc),
             code);
  }
  if (strncmp(buf, want, wl) != 0 || (buf[wl] != '\0' && buf[wl] != ' '))
    fail_msg("%s: expected '%s', got '%s'", who, want, buf);
  if (rest != NULL && restlen > 0)
    snprintf(rest, restlen, "%s", buf[wl] == ' ' ? buf + wl + 1 : "");
}

void tbg_say(struct tbt_child *c, const char *fmt, ...) {
  char buf[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (tbt_send(c->wr, "%s", buf) != 0)
    fail_msg("cannot send '%s' to a child", buf);
}

void tbg_reap(struct tbt_child *c, const char *who) {
  int code = tbt_child_wait(c, 60000);
  if (code != 0)
    fail_msg("%s exited with %d", who, code);
}

void tbg_ready_go(struct tbt_child *p, struct tbt_child *c) {
  tbg_hear(c, "consumer", "ready", NULL, 0);
  tbg_say(p, "go");
}

void tbg_relay(struct tbt_child *from, const char *who, const char *want,
               struct tbt_child *to, const char *prefix) {
  char line[100];
  tbg_hear(from, who, want, line, sizeof line);
  tbg_say(to, "%s %s", prefix, line);
}

void tbg_pass(struct tbt_child *from, const char *who, const char *word,
              struct tbt_child *to) {
  tbg_hear(from, who, word, NULL, 0);
  tbg_say(to, "%s", word);
}

void tbg_daemon_down(struct tbt_daemon *d) {
  assert_int_equal(tbt_daemon_stop(d), 0);
  tbt_daemon_cleanup(d);
}

void tbg_finish(struct tbt_child *p, struct tbt_child *c, struct tbt_daemon *d) {
  tbg_hear(c, "consumer", "ok", NULL, 0);
  tbg_say(p, "done");
  tbg_reap(c, "consumer");
  tbg_reap(p, "producer");
  tbg_daemon_down(d);
}

void tbg_slow_run(const struct tbg_slow *slow) {
  struct tbt_child p, c;
  tbg_start(slow->daemon, &p, tbg_slow_producer, (void *)slow, &c,
            tbg_slow_consumer, (void *)slow);
  tbg_ready_go(&p, &c);
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_finish(&p, &c, slow->daemon);
}
