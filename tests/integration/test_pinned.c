/* SPDX-License-Identifier: Apache-2.0 */
/* Pinned host memory (TB_BUFFER_PINNED, memory kind cuda-host; docs/cuda.md,
 * "Pinned host memory") on a CPU, with the real daemon.
 *
 * Built twice from this file. integration_pinned runs with the fake CUDA
 * driver (tests/fakecuda), whose call log shows every cuMemHostRegister and
 * cuMemHostUnregister: the producer registers its mapping once, each
 * consumer its own mapping once per buffer (read-only unless granted write),
 * each unregisters before it unmaps, acquired tensors are kDLCUDAHost, and a
 * driver that refuses is an error naming the kind with nothing changed.
 * integration_pinned_nodriver (argument "nodriver") runs where no driver
 * loads: the same buffers are plain host memory, kDLCPU, the same pages and
 * not a copy. done_events and ring_of_pinned_slots show a consumer's GPU
 * reads of pinned memory ordered before the producer rewrites it. One
 * process holds the producer and consumer clients; each client maps the
 * memfd for itself, as separate processes do. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "cuda/driver.h"
#include "fake_libcuda.h"
#include "harness.h"

#define CH "pinned/frames"

static const struct fakecuda_hooks *fk; /* NULL: the no-driver run */

/* client/rpc.c: pretend the daemon said these features (an older one) */
void tb__client_set_features(tb_client *c, uint32_t features);

static void show_log(void) {
  char text[8192];
  fk->log_read(text, sizeof(text));
  fprintf(stderr, "---- fake CUDA log ----\n%s----\n", text);
}

/* Lines of the log with this body, e.g. "host-register 0x7f.. size 4096
 * portable devicemap". */
static size_t log_count(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static size_t log_count(const char *fmt, ...) {
  char body[256];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(body, sizeof(body), fmt, ap);
  va_end(ap);
  return fk->log_count(body);
}

/* How many log lines start with prefix. */
static size_t log_prefixed(const char *prefix) {
  char text[16384];

  fk->log_read(text, sizeof(text));
  return fakecuda_text_prefixed(text, 0, prefix);
}

static void expect_lines(size_t got, size_t want, const char *what) {
  if (got != want) {
    show_log();
    fail_msg("%s: %zu lines, expected %zu", what, got, want);
  }
}

static unsigned long host_registered(void) {
  struct fakecuda_counts n = {.struct_size = sizeof(n)};
  fk->counts(&n);
  return n.host_registered;
}

static struct tb_acquire_options latest(void) {
  struct tb_acquire_options o;
  tb_acquire_options_init(&o);
  o.mode = TB_ACQUIRE_LATEST;
  o.timeout_ms = TBT_TIMEOUT_MS;
  return o;
}

static uint64_t publish(tb_client *p, tb_buffer *b, int64_t n, int dev_type,
                        uint64_t seed) {
  struct tb_publish_options po;
  int64_t shape[1];
  DLTensor t;
  uint64_t v = 0;

  tbt_fill(tb_buffer_data(b), (size_t)n, seed);
  tbt_u8_tensor(&t, b, shape, n);
  t.device.device_type = dev_type;
  tb_publish_options_init(&po);
  assert_int_equal(tb_publish(p, CH, &t, &po, &v), 0);
  return v;
}

static void check_bytes(const DLManagedTensorVersioned *t, int64_t n,
                        uint64_t seed) {
  const uint8_t *px = (const uint8_t *)t->dl_tensor.data;
  for (int64_t i = 0; i < n; i++)
    if (px[i] != tbt_pattern((uint64_t)i, seed))
      fail_msg("byte %lld is %u, expected %u", (long long)i, px[i],
               tbt_pattern((uint64_t)i, seed));
}

/* tbctl --json CMD (TB_TBCTL) against daemon d: its stdout into out. */
static void tbctl(const struct tbt_daemon *d, const char *cmd, char *out,
                  size_t len) {
  const char *argv[] = {getenv("TB_TBCTL"), "--json", cmd, NULL};

  if (argv[0] == NULL)
    fail_msg("TB_TBCTL not set");
  setenv("TENSORBROKER_SOCKET", d->sock, 1);
  assert_int_equal(tbt_run(argv, out, len), 0);
}

static unsigned long addr(const void *p) { return (unsigned long)(uintptr_t)p; }

/* The registered length: whole pages. */
static size_t pages(size_t n) { return (n + 4095) / 4096 * 4096; }

/* The producer's buffer is registered once, read-write; each consumer's
 * mapping once per buffer, read-only; tensors are kDLCUDAHost device 0 and
 * carry the producer's bytes; lease info says cuda-host. */
static void exchange(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_acquire_options o = latest();
  struct tb_lease_info li;
  tb_client *p, *c1, *c2;
  tb_buffer *b;
  DLManagedTensorVersioned *t1 = NULL, *t2 = NULL, *t3 = NULL;
  const size_t n = 10000;
  unsigned long pa, ca1, ca2;

  assert_int_equal(tbt_connect(d, "producer", &p), 0);
  assert_int_equal(tbt_connect(d, "consumer1", &c1), 0);
  assert_int_equal(tbt_connect(d, "consumer2", &c2), 0);
  fk->log_clear();
  assert_int_equal(tb_buffer_create_host(p, n, TB_BUFFER_PINNED, &b), 0);
  assert_int_equal(tb_buffer_pinned(b), 1);
  pa = addr(tb_buffer_data(b));
  expect_lines(log_count("host-register %#lx size %zu portable devicemap",
                         pa, pages(n)),
               1, "the producer's registration");
  expect_lines(log_prefixed("host-register "), 1, "registrations");

  publish(p, b, (int64_t)n, kDLCPU, 7);
  assert_int_equal(tb_acquire(c1, CH, &o, &t1), 0);
  ca1 = addr(t1->dl_tensor.data);
  assert_int_equal(t1->dl_tensor.device.device_type, kDLCUDAHost);
  assert_int_equal(t1->dl_tensor.device.device_id, 0);
  assert_true(t1->flags & TB_DLPACK_FLAG_BITMASK_READ_ONLY);
  check_bytes(t1, (int64_t)n, 7);
  assert_int_equal(tb_lease_get_info(t1, sizeof(li), &li), 0);
  assert_int_equal(li.memory_kind, TB_MEMORY_CUDA_HOST);
  assert_string_equal(tb_memory_kind_name(li.memory_kind), "cuda-host");
  expect_lines(log_count("host-register %#lx size %zu portable devicemap "
                         "read-only",
                         ca1, pages(n)),
               1, "consumer 1's read-only registration");

  /* a second acquire of the same buffer maps and registers nothing new */
  assert_int_equal(tb_release(t1, NULL), 0);
  publish(p, b, (int64_t)n, kDLCUDAHost, 8); /* kDLCUDAHost is accepted too */
  assert_int_equal(tb_acquire(c1, CH, &o, &t2), 0);
  check_bytes(t2, (int64_t)n, 8);
  assert_int_equal(t2->dl_tensor.device.device_type, kDLCUDAHost);
  expect_lines(log_prefixed("host-register "), 2, "registrations (cached)");

  /* another consumer registers its own mapping, once */
  assert_int_equal(addr(t2->dl_tensor.data), ca1); /* the cached mapping */
  assert_int_equal(tb_acquire(c2, CH, &o, &t3), 0);
  check_bytes(t3, (int64_t)n, 8);
  ca2 = addr(t3->dl_tensor.data);
  assert_int_not_equal(ca2, ca1);
  expect_lines(log_count("host-register %#lx size %zu portable devicemap "
                         "read-only",
                         ca2, pages(n)),
               1, "consumer 2's registration");
  expect_lines(log_prefixed("host-register "), 3, "registrations");
  expect_lines(log_prefixed("host-unregister "), 0, "unregistrations");
  assert_int_equal(host_registered(), 3);

  /* the operator sees the kind: tbctl leases, and the metrics */
  {
    char out[8192], *text = NULL;
    size_t len = 0;

    cJSON *a, *e;

    tbctl(d, "leases", out, sizeof(out));
    if (strstr(out, "\"memory_kind\"") == NULL ||
        strstr(out, "\"cuda-host\"") == NULL)
      fail_msg("tbctl leases --json does not say cuda-host:\n%s", out);
    /* tbctl buffers: the one buffer, pinned, version 2 leased twice */
    tbctl(d, "buffers", out, sizeof(out));
    a = cJSON_Parse(out);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 1)
      fail_msg("tbctl buffers --json: not one buffer:\n%s", out);
    e = cJSON_GetArrayItem(a, 0);
    if (cJSON_GetNumberValue(cJSON_GetObjectItem(e, "buffer_id")) !=
            (double)tb_buffer_id(b) ||
        strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "memory_kind")),
               "cuda-host") != 0 ||
        strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "device")),
               "cuda-host") != 0 ||
        cJSON_GetNumberValue(cJSON_GetObjectItem(e, "size")) != (double)n ||
        cJSON_GetNumberValue(cJSON_GetObjectItem(e, "versions")) != 1 ||
        cJSON_GetNumberValue(cJSON_GetObjectItem(e, "leases")) != 2)
      fail_msg("tbctl buffers --json: not the pinned buffer:\n%s", out);
    cJSON_Delete(a);
    assert_int_equal(tb_daemon_get_metrics(p, &text, &len), 0);
    /* by kind, named as tbctl names it */
    if (strstr(text, "\ntensorbroker_buffers_by_kind{kind=\"cuda-host\"} 1\n") ==
            NULL ||
        strstr(text, "\ntensorbroker_buffers_by_kind{kind=\"host\"} 0\n") ==
            NULL)
      fail_msg("metrics without the buffer's kind:\n%s", text);
    tb_free(text);
  }

  assert_int_equal(tb_release(t2, NULL), 0);
  assert_int_equal(tb_release(t3, NULL), 0);
  assert_int_equal(tb_buffer_destroy(b), 0);
  tb_client_disconnect(c2);
  tb_client_disconnect(c1);
  tb_client_disconnect(p);
  /* every mapping unregistered once, each while still mapped (an
   * unregistration after the munmap would end in "(unmapped)") */
  expect_lines(log_prefixed("host-unregister "), 3, "unregistrations");
  expect_lines(log_count("host-unregister %#lx", pa), 1, "the producer's");
  expect_lines(log_count("host-unregister %#lx", ca1), 1, "consumer 1's");
  expect_lines(log_count("host-unregister %#lx", ca2), 1, "consumer 2's");
  assert_int_equal(host_registered(), 0);
}

/* A buffer the daemon retires (the producer destroyed it, its last version
 * freed): the consumer unregisters its mapping, then unmaps it. */
static void retire_unregisters(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_acquire_options o = latest();
  struct tb_notice nt;
  tb_client *p, *c;
  tb_buffer *b1, *b2;
  DLManagedTensorVersioned *t = NULL;
  unsigned long mapped, pa1;
  uint64_t v;

  assert_int_equal(tbt_connect(d, "producer", &p), 0);
  assert_int_equal(tbt_connect(d, "consumer", &c), 0);
  assert_int_equal(tb_buffer_create_host(p, 4096, TB_BUFFER_PINNED, &b1), 0);
  assert_int_equal(tb_buffer_create_host(p, 4096, TB_BUFFER_PINNED, &b2), 0);
  v = publish(p, b1, 4096, kDLCPU, 1);
  assert_int_equal(tb_acquire(c, CH, &o, &t), 0);
  mapped = addr(t->dl_tensor.data);
  assert_int_equal(tb_release(t, NULL), 0);
  pa1 = addr(tb_buffer_data(b1));
  fk->log_clear();
  assert_int_equal(tb_buffer_destroy(b1), 0);
  expect_lines(log_count("host-unregister %#lx", pa1), 1,
               "the producer's, at destroy, before its munmap");
  expect_lines(log_prefixed("host-unregister "), 1,
               "unregistrations (the consumer still maps b1)");
  (void)publish(p, b2, 4096, kDLCPU, 2); /* pushes v out of the history */
  assert_int_equal(tb_wait_free(p, CH, v, TBT_TIMEOUT_MS, NULL), 0);
  assert_int_equal(tbt_expect_notice(c, TB_NOTICE_BUFFER_RETIRED, NULL, 0,
                                     TBT_TIMEOUT_MS, &nt),
                   0);
  expect_lines(log_count("host-unregister %#lx", mapped), 1,
               "the consumer's unregistration, before its munmap");
  expect_lines(log_prefixed("host-unregister "), 2,
               "unregistrations (producer's b1, consumer's b1)");
  assert_int_equal(tb_buffer_destroy(b2), 0);
  tb_client_disconnect(c);
  tb_client_disconnect(p);
  assert_int_equal(host_registered(), 0);
}

/* A consumer granted write registers without READ_ONLY. */
static void writable_consumer(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_acquire_options o = latest();
  tb_client *p, *c;
  tb_buffer *b;
  DLManagedTensorVersioned *t = NULL;
  int ro;

  assert_int_equal(tbt_connect(d, "producer", &p), 0);
  assert_int_equal(tbt_connect(d, "consumer", &c), 0);
  assert_int_equal(tb_buffer_create_host(p, 8192,
                                         TB_BUFFER_PINNED |
                                             TB_BUFFER_CONSUMERS_MAY_WRITE,
                                         &b),
                   0);
  publish(p, b, 8192, kDLCPU, 3);
  fk->log_clear();
  assert_int_equal(tb_acquire(c, CH, &o, &t), 0);
  ro = (t->flags & TB_DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
  expect_lines(log_count(ro ? "host-register %#lx size 8192 portable "
                              "devicemap read-only"
                            : "host-register %#lx size 8192 portable "
                              "devicemap",
                         addr(t->dl_tensor.data)),
               1, "the consumer's registration, as granted");
  assert_false(ro); /* the default rules grant the owner's uid write */
  check_bytes(t, 8192, 3);
  assert_int_equal(tb_release(t, NULL), 0);
  assert_int_equal(tb_buffer_destroy(b), 0);
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

/* The driver refuses (the memlock limit): the producer's create is
 * TB_ECUDA naming the kind, and the daemon has no new buffer; a consumer's
 * acquire is TB_ECUDA naming the kind, maps nothing, and works once the
 * driver agrees. A huge buffer is refused the same way; a one-byte one is
 * registered as its page. */
static void driver_refuses(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_acquire_options o = latest();
  struct tb_status st0, st;
  tb_client *p, *c;
  tb_buffer *b = NULL;
  DLManagedTensorVersioned *t = NULL;
  char err[512];

  assert_int_equal(tbt_connect(d, "producer", &p), 0);
  assert_int_equal(tbt_connect(d, "consumer", &c), 0);
  assert_int_equal(tb_daemon_status(p, &st0), 0);

  setenv("FAKECUDA_HOST_REGISTER_MAX", "0", 1);
  fk->log_clear();
  assert_int_equal(tb_buffer_create_host(p, 4096, TB_BUFFER_PINNED, &b),
                   TB_ECUDA);
  assert_null(b);
  tb_client_last_error(p, err, sizeof(err));
  assert_non_null(strstr(err, "pinned host memory (cuda-host)"));
  assert_non_null(strstr(err, "CUDA_ERROR_OUT_OF_MEMORY"));
  expect_lines(log_prefixed("host-register "), 1, "the refused attempt");
  assert_int_equal(host_registered(), 0);
  assert_int_equal(tb_daemon_status(p, &st), 0);
  assert_int_equal(st.buffers, st0.buffers);
  unsetenv("FAKECUDA_HOST_REGISTER_MAX");

  /* 32 GiB (sparse: nothing is touched) is over the fake's 16 GiB limit */
  assert_int_equal(tb_buffer_create_host(p, (size_t)32 << 30,
                                         TB_BUFFER_PINNED, &b),
                   TB_ECUDA);
  assert_int_equal(tb_daemon_status(p, &st), 0);
  assert_int_equal(st.buffers, st0.buffers);

  /* one byte: its page is registered, the byte goes across */
  assert_int_equal(tb_buffer_create_host(p, 1, TB_BUFFER_PINNED, &b), 0);
  expect_lines(log_count("host-register %#lx size 4096 portable devicemap",
                         addr(tb_buffer_data(b))),
               1, "a one-byte buffer's page");
  publish(p, b, 1, kDLCPU, 4);

  setenv("FAKECUDA_HOST_REGISTER_MAX", "0", 1);
  assert_int_equal(tb_acquire(c, CH, &o, &t), TB_ECUDA);
  assert_null(t);
  tb_client_last_error(c, err, sizeof(err));
  assert_non_null(strstr(err, "pinned host memory (cuda-host)"));
  assert_non_null(strstr(err, "read-only"));
  unsetenv("FAKECUDA_HOST_REGISTER_MAX");
  assert_int_equal(host_registered(), 1); /* the producer's only */
  /* the lease was given back (the one-way Release goes before this, on
   * the same connection), and nothing was cached: this maps again */
  assert_int_equal(tb_daemon_status(c, &st), 0);
  assert_int_equal(st.leases, 0);
  assert_int_equal(tb_acquire(c, CH, &o, &t), 0);
  check_bytes(t, 1, 4);
  assert_int_equal(t->dl_tensor.device.device_type, kDLCUDAHost);
  assert_int_equal(tb_release(t, NULL), 0);
  assert_int_equal(tb_buffer_destroy(b), 0);
  tb_client_disconnect(c);
  tb_client_disconnect(p);
  assert_int_equal(host_registered(), 0);
}

/* Bad input: a kDLCUDAHost tensor in a plain host buffer; unknown flags. A
 * plain buffer's versions stay kDLCPU and register nothing. */
static void bad_input(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_acquire_options o = latest();
  struct tb_publish_options po;
  tb_client *p, *c;
  tb_buffer *b = NULL;
  DLManagedTensorVersioned *t = NULL;
  int64_t shape[1];
  DLTensor dt;
  char err[512];
  uint64_t v = 0;

  assert_int_equal(tbt_connect(d, "producer", &p), 0);
  assert_int_equal(tbt_connect(d, "consumer", &c), 0);
  assert_int_equal(tb_buffer_create_host(p, 4096, 0x80, &b), TB_EINVAL);
  fk->log_clear();
  assert_int_equal(tb_buffer_create_host(p, 4096, 0, &b), 0);
  assert_int_equal(tb_buffer_pinned(b), 0);
  tbt_u8_tensor(&dt, b, shape, 4096);
  dt.device.device_type = kDLCUDAHost;
  tb_publish_options_init(&po);
  assert_int_equal(tb_publish(p, CH, &dt, &po, &v), TB_EDEVICE);
  tb_client_last_error(p, err, sizeof(err));
  assert_non_null(strstr(err, "pinned host memory (cuda-host)"));
  assert_non_null(strstr(err, "TB_BUFFER_PINNED"));
  publish(p, b, 4096, kDLCPU, 5);
  assert_int_equal(tb_acquire(c, CH, &o, &t), 0);
  assert_int_equal(t->dl_tensor.device.device_type, kDLCPU);
  check_bytes(t, 4096, 5);
  expect_lines(log_prefixed("host-"), 0, "registrations of plain memory");
  assert_int_equal(tb_release(t, NULL), 0);
  assert_int_equal(tb_buffer_destroy(b), 0);
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

/* A daemon without FEATURE_CUDA_HOST (older): TB_ENOTSUP naming the kind,
 * nothing registered anywhere. */
static void older_daemon(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *p;
  tb_buffer *b = NULL;
  char err[512];

  assert_int_equal(tbt_connect(d, "producer", &p), 0);
  tb__client_set_features(p, 0);
  if (fk != NULL)
    fk->log_clear();
  assert_int_equal(tb_buffer_create_host(p, 4096, TB_BUFFER_PINNED, &b),
                   TB_ENOTSUP);
  tb_client_last_error(p, err, sizeof(err));
  assert_non_null(strstr(err, "cuda-host"));
  assert_non_null(strstr(err, "FEATURE_CUDA_HOST"));
  if (fk != NULL)
    expect_lines(log_prefixed("host-"), 0, "registrations");
  tb_client_disconnect(p);
}

/* No driver: the buffer is made, unpinned; the consumer's tensor is kDLCPU
 * over the same pages (a later write by the producer shows through: not a
 * copy), and its lease info still says cuda-host. */
static void no_driver_fallback(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_acquire_options o = latest();
  struct tb_lease_info li;
  tb_client *p, *c;
  tb_buffer *b;
  DLManagedTensorVersioned *t = NULL;

  if (tb_cuda_available() == 0)
    skip(); /* a real driver loads here: integration_pinned's part */
  assert_int_equal(tbt_connect(d, "producer", &p), 0);
  assert_int_equal(tbt_connect(d, "consumer", &c), 0);
  assert_int_equal(tb_buffer_create_host(p, 4096, TB_BUFFER_PINNED, &b), 0);
  assert_int_equal(tb_buffer_pinned(b), 0);
  publish(p, b, 4096, kDLCUDAHost, 6);
  assert_int_equal(tb_acquire(c, CH, &o, &t), 0);
  assert_int_equal(t->dl_tensor.device.device_type, kDLCPU);
  assert_int_equal(tb_lease_get_info(t, sizeof(li), &li), 0);
  assert_int_equal(li.memory_kind, TB_MEMORY_CUDA_HOST);
  check_bytes(t, 4096, 6);
  tbt_fill(tb_buffer_data(b), 4096, 9); /* not what one should do; proof */
  check_bytes(t, 4096, 9);
  assert_int_equal(tb_release(t, NULL), 0);
  assert_int_equal(tb_buffer_destroy(b), 0);
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

/* The log's name of the event recorded on stream name (any process), or
 * fail. */
static void recorded_on(const char *stream, char *ev, size_t len) {
  char text[16384], suffix[64];

  fk->log_read(text, sizeof(text));
  snprintf(suffix, sizeof(suffix), " on %s", stream);
  if (!fakecuda_text_find(text, 0, "record ", suffix, ev, len)) {
    show_log();
    fail_msg("no event recorded on %s", stream);
  }
}

/* The producer publishes the next frame from b (seed), which frees
 * version v (history depth 1), and waits for v with stream ws (NULL: the
 * host), the fake's log holding only that wait. Returns the new version. */
static uint64_t next_frame_frees(tb_client *p, tb_buffer *b, uint64_t seed,
                                 uint64_t v, void *ws) {
  uint64_t nv = publish(p, b, 4096, kDLCUDAHost, seed);

  fk->log_clear();
  assert_int_equal(tb_wait_free(p, CH, v, TBT_TIMEOUT_MS, ws), 0);
  return nv;
}

/* A GPU reads pinned memory asynchronously (a non-blocking host-to-device
 * copy on a side stream), so a pinned lease ends as a CUDA lease does: the
 * consumer's done event is recorded after the stream it named, and the
 * producer's tb_wait_free with no stream (the host rewrites the buffer)
 * blocks on that event before it returns; with a stream, the stream waits
 * instead. Released with no stream, the event goes on the contract's
 * default stream (spec: legacy); under the explicit contract such a
 * consumer is a host reader and nothing is recorded or waited for. Busy
 * mode: every stream looks busy, so no record is skipped as idle. */
static void done_events(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_acquire_options o = latest();
  const struct tb_cuda *cu;
  tb_cu_stream s = NULL, sp = NULL;
  tb_client *p, *c, *x;
  tb_buffer *b[2];
  DLManagedTensorVersioned *t = NULL;
  char ev[64], sp_name[32];
  uint64_t v;

  assert_int_equal(tb__cuda_load(&cu), 0);
  fk->set_busy(1);
  assert_int_equal(tbt_connect(d, "producer", &p), 0);
  assert_int_equal(tbt_connect(d, "consumer", &c), 0);
  assert_int_equal(
      tbt_connect_contract(d, "explicit", TB_CONTRACT_EXPLICIT, &x), 0);
  for (int i = 0; i < 2; i++)
    assert_int_equal(tb_buffer_create_host(p, 4096, TB_BUFFER_PINNED, &b[i]),
                     0);
  assert_int_equal(cu->cuStreamCreate(&s, TB_CU_STREAM_NON_BLOCKING), 0);
  assert_int_equal(cu->cuStreamCreate(&sp, TB_CU_STREAM_NON_BLOCKING), 0);
  snprintf(sp_name, sizeof(sp_name), "%s", fk->stream_name(sp));

  /* named at release: recorded on s; the host producer blocks on it (the
   * acquire declares nothing: -1; with NULL it would declare the
   * contract's stream of its thread, which the done event then follows
   * too) */
  v = publish(p, b[0], 4096, kDLCUDAHost, 1);
  o.stream = TB_STREAM_NO_SYNC;
  assert_int_equal(tb_acquire(c, CH, &o, &t), 0);
  check_bytes(t, 4096, 1);
  fk->log_clear();
  assert_int_equal(tb_release(t, s), 0);
  recorded_on(fk->stream_name(s), ev, sizeof(ev));
  v = next_frame_frees(p, b[1], 2, v, NULL);
  expect_lines(log_count("event-synchronize %s", ev), 1,
               "the producer's host wait on the done event");

  /* declared with tb_lease_use, released with none: recorded on s; a
   * producer that writes with a stream makes it wait instead */
  assert_int_equal(tb_acquire(c, CH, &o, &t), 0);
  assert_int_equal(tb_lease_use(t, s), 0);
  fk->log_clear();
  assert_int_equal(tb_release(t, NULL), 0);
  recorded_on(fk->stream_name(s), ev, sizeof(ev));
  v = next_frame_frees(p, b[0], 3, v, sp);
  expect_lines(log_count("wait %s on %s", sp_name, ev), 1,
               "the producer stream's wait on the done event");
  expect_lines(log_prefixed("event-synchronize "), 0,
               "host waits when a stream was given");

  /* none named, spec contract: the legacy stream, as for a CUDA lease
   * (after the earlier reads are over: then the record goes straight
   * there, not on the join stream that would otherwise order it after
   * them) */
  assert_int_equal(cu->cuCtxSynchronize(), 0);
  o.stream = TB_STREAM_DEFAULT;
  assert_int_equal(tb_acquire(c, CH, &o, &t), 0);
  fk->log_clear();
  assert_int_equal(tb_release(t, NULL), 0);
  recorded_on("legacy", ev, sizeof(ev));
  v = next_frame_frees(p, b[1], 4, v, NULL);
  expect_lines(log_count("event-synchronize %s", ev), 1,
               "the host wait after a legacy-stream record");

  /* none named, explicit contract: a host reader, nothing recorded */
  assert_int_equal(tb_acquire(x, CH, &o, &t), 0);
  check_bytes(t, 4096, 4);
  fk->log_clear();
  assert_int_equal(tb_release(t, NULL), 0);
  expect_lines(log_prefixed("record "), 0, "records of a host reader");
  (void)next_frame_frees(p, b[0], 5, v, NULL);
  expect_lines(log_prefixed("event-synchronize "), 0,
               "host waits for a host reader");

  fk->set_busy(0);
  for (int i = 0; i < 2; i++)
    assert_int_equal(tb_buffer_destroy(b[i]), 0);
  tb_client_disconnect(x);
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

static void *release_here(void *t) {
  return (void *)(intptr_t)tb_release(t, NULL);
}

/* A lease of pinned memory dropped on a thread with no CUDA context (a CPU
 * stage's worker, a consumer library's deleter) ends without an error: the
 * contract's default stream is then device 0's, where the mapping was
 * registered. */
static void release_without_context(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_acquire_options o = latest();
  tb_client *p, *c;
  tb_buffer *b;
  DLManagedTensorVersioned *t = NULL;
  pthread_t th;
  void *rc = NULL;
  char ev[64];

  fk->set_busy(1);
  assert_int_equal(tbt_connect(d, "producer", &p), 0);
  assert_int_equal(tbt_connect(d, "consumer", &c), 0);
  assert_int_equal(tb_buffer_create_host(p, 4096, TB_BUFFER_PINNED, &b), 0);
  publish(p, b, 4096, kDLCUDAHost, 7);
  assert_int_equal(tb_acquire(c, CH, &o, &t), 0);
  check_bytes(t, 4096, 7);
  fk->log_clear();
  assert_int_equal(pthread_create(&th, NULL, release_here, t), 0);
  assert_int_equal(pthread_join(th, &rc), 0);
  if (rc != NULL) {
    show_log();
    fail_msg("tb_release on a thread without a context: %d",
             (int)(intptr_t)rc);
  }
  recorded_on("legacy", ev, sizeof(ev));
  fk->set_busy(0);
  assert_int_equal(tb_buffer_destroy(b), 0);
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

/* Under the per-thread contract a GPU stage acquires a pinned frame with
 * NULL (its thread's per-thread stream, where it copies the frame to the
 * device) and the tensor's deleter runs on another thread that has a
 * context: the done event must follow the acquiring thread's stream (from
 * another thread: the legacy stream of that context, which waits for it),
 * not the deleting thread's own per-thread stream. */
struct end_arg {
  DLManagedTensorVersioned *t;
  tb_cu_context ctx;
};
static void *end_with_context(void *p) {
  struct end_arg *a = p;
  const struct tb_cuda *cu = NULL;
  if (tb__cuda_load(&cu) == 0)
    (void)cu->cuCtxSetCurrent(a->ctx);
  a->t->deleter(a->t);
  return NULL;
}

static void per_thread_acquire_ends_elsewhere(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_acquire_options o = latest();
  const struct tb_cuda *cu;
  tb_client *p, *c;
  tb_buffer *b;
  struct end_arg a = {NULL, NULL};
  pthread_t th;
  char ev[64];

  assert_int_equal(tb__cuda_load(&cu), 0);
  assert_int_equal(cu->cuCtxGetCurrent(&a.ctx), 0);
  assert_non_null(a.ctx);
  fk->set_busy(1);
  assert_int_equal(tbt_connect(d, "producer", &p), 0);
  assert_int_equal(
      tbt_connect_contract(d, "gpu-stage", TB_CONTRACT_PER_THREAD, &c), 0);
  assert_int_equal(tb_buffer_create_host(p, 4096, TB_BUFFER_PINNED, &b), 0);
  publish(p, b, 4096, kDLCUDAHost, 9);
  assert_int_equal(tb_acquire(c, CH, &o, &a.t), 0); /* NULL: this thread's */
  fk->log_clear();
  assert_int_equal(pthread_create(&th, NULL, end_with_context, &a), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  recorded_on("legacy", ev, sizeof(ev));
  expect_lines(log_count("record %s on ptds", ev), 0,
               "records on the deleting thread's per-thread stream");
  fk->set_busy(0);
  assert_int_equal(tb_buffer_destroy(b), 0);
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

/* A CPU stage's ring of three pinned slots (tb_ring_create_host with
 * TB_BUFFER_PINNED): while a consumer holds the frame of slot 0, the
 * ring's return to it is TB_EBUSY (timeout 0) and the frame stays as
 * written; released, the slot comes back. With the fake driver the
 * consumer's release names a stream, and the return to the slot waits on
 * the host for its done event; without a driver the ring is plain host
 * memory and works the same. */
static void ring_of_pinned_slots(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_acquire_options o = latest();
  const struct tb_cuda *cu = NULL;
  tb_cu_stream s = NULL;
  tb_client *p, *c;
  tb_ring *r;
  DLManagedTensorVersioned *t = NULL, *held = NULL;
  DLTensor frame;
  int64_t shape[1];
  char ev[64] = "";
  void *slot;
  uint64_t v;

  if (fk != NULL) {
    assert_int_equal(tb__cuda_load(&cu), 0);
    fk->set_busy(1);
  }
  assert_int_equal(tbt_connect(d, "producer", &p), 0);
  assert_int_equal(tbt_connect(d, "consumer", &c), 0);
  if (cu != NULL)
    assert_int_equal(cu->cuStreamCreate(&s, TB_CU_STREAM_NON_BLOCKING), 0);
  assert_int_equal(tb_ring_create_host(p, CH, 4096, 3, TB_BUFFER_PINNED, &r),
                   0);
  /* pinned wherever a driver loads: the fake one, or a real one where the
   * no-driver run finds it (the GPU machine) */
  assert_int_equal(tb_buffer_pinned(tb_ring_buffer(r)),
                   tb_cuda_available() == 0);
  for (int f = 0; f < 5; f++) {
    if (f == 3) {
      void *again;
      assert_int_equal(tb_ring_next(r, 0, NULL, &again), TB_EBUSY);
      check_bytes(held, 4096, 0); /* slot 0 not handed out: unchanged */
      if (fk != NULL) {
        /* the other frames' reads are over: the record goes on s */
        assert_int_equal(cu->cuCtxSynchronize(), 0);
        fk->log_clear();
        assert_int_equal(tb_release(held, s), 0);
        recorded_on(fk->stream_name(s), ev, sizeof(ev));
        fk->log_clear();
      } else {
        assert_int_equal(tb_release(held, NULL), 0);
      }
    }
    assert_int_equal(tb_ring_next(r, TBT_TIMEOUT_MS, NULL, &slot), 0);
    if (f == 3 && fk != NULL)
      expect_lines(log_count("event-synchronize %s", ev), 1,
                   "the ring's host wait for the reader of slot 0");
    assert_ptr_equal(slot, (char *)tb_buffer_data(tb_ring_buffer(r)) +
                               (size_t)(f % 3) * 4096);
    tbt_fill(slot, 4096, (uint64_t)f);
    memset(&frame, 0, sizeof(frame));
    shape[0] = 4096;
    frame.data = slot;
    frame.device.device_type = kDLCPU;
    frame.ndim = 1;
    frame.dtype = (DLDataType){kDLUInt, 8, 1};
    frame.shape = shape;
    assert_int_equal(tb_ring_publish(r, &frame, NULL, &v), 0);
    o.mode = TB_ACQUIRE_EXACT;
    o.version = v;
    o.stream = TB_STREAM_NO_SYNC; /* the GPU reader names its stream later */
    assert_int_equal(tb_acquire(c, CH, &o, &t), 0);
    check_bytes(t, 4096, (uint64_t)f);
    if (f == 0)
      held = t; /* the consumer keeps frame 0 */
    else
      assert_int_equal(tb_release(t, NULL), 0);
  }
  if (fk != NULL)
    fk->set_busy(0);
  assert_int_equal(tb_ring_destroy(r), 0);
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

int main(int argc, char **argv) {
  const struct CMUnitTest fake[] = {
      cmocka_unit_test_setup_teardown(exchange, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(retire_unregisters, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(writable_consumer, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(driver_refuses, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(bad_input, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(older_daemon, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(done_events, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(per_thread_acquire_ends_elsewhere,
                                      tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(release_without_context, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(ring_of_pinned_slots, tbt_setup,
                                      tbt_teardown),
  };
  const struct CMUnitTest nodriver[] = {
      cmocka_unit_test_setup_teardown(no_driver_fallback, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(ring_of_pinned_slots, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(older_daemon, tbt_setup, tbt_teardown),
  };

  if (argc > 1 && strcmp(argv[1], "nodriver") == 0)
    return cmocka_run_group_tests(nodriver, NULL, NULL);
  fk = fakecuda();
  if (fk == NULL || tb_cuda_available() != 0) {
    fprintf(stderr, "the fake CUDA driver is not what libcuda.so.1 loads "
                    "here: skipped\n");
    return 77;
  }
  return cmocka_run_group_tests(fake, NULL, NULL);
}
