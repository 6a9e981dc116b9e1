/* SPDX-License-Identifier: Apache-2.0 */
/* The fake CUDA driver (tests/fakecuda), proved through libtensorbroker.
 *
 * The test runs with the fake's folder as LD_LIBRARY_PATH, so the library's
 * dlopen("libcuda.so.1") gets the fake. The test's own driver calls go to
 * the same loaded copy, by the versioned names cuda.h binds.
 *
 * loads_through_library: before any cuInit, cuCtxGetCurrent answers
 * CUDA_ERROR_NOT_INITIALIZED; tb_cuda_available() then loads the fake, and
 * cuGetProcAddress_v2 gave the library the versioned entry points; a
 * process's own IPC memory handle is refused (CUDA_ERROR_INVALID_CONTEXT).
 *
 * exchange_through_daemon: a forked producer fills fake device memory and
 * publishes it on a stream of its own; the test process, as consumer,
 * acquires it on its own stream, reads the bytes back (they crossed
 * processes through the memfd), and releases it. Busy mode is on, so the
 * library never takes the streams for idle. The shared log must show: the
 * consumer's stream waited on the producer's ready event (one name in both
 * processes), the consumer recorded its done event on its stream at
 * release, and the producer's tb_wait_free made the producer's stream wait
 * on that same event. Then, once the consumer has disconnected and the
 * producer is killed, opening the producer's memory handle directly gives
 * CUDA_ERROR_INVALID_HANDLE, as the real driver does for a dead exporter.
 *
 * driver_semantics: the fake's own rules that tests will lean on, through
 * the library's driver table (so through cuGetProcAddress_v2): stream ids
 * and names, calls on a destroyed stream, busy mode, the capture rules
 * (legacy stream, unsafe calls, a plain wait on an uncaptured event) and
 * the log lines fake_libcuda.h documents. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cuda/driver.h"
#include "fake_libcuda.h"
#include "harness.h"

#define N 65536 /* bytes published */
#define SEED 41
#define CH "fake/exchange"
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define CUDA_ERROR_STREAM_CAPTURE_ISOLATION 905

/* The driver calls the test makes itself. */
struct drv {
  tb_cu_result (*cuInit)(unsigned flags);
  tb_cu_result (*cuCtxGetCurrent)(tb_cu_context *c);
  tb_cu_result (*cuCtxSetCurrent)(tb_cu_context c);
  tb_cu_result (*cuDevicePrimaryCtxRetain)(tb_cu_context *c, tb_cu_device d);
  tb_cu_result (*cuMemAlloc)(tb_cu_deviceptr *p, size_t size);
  tb_cu_result (*cuMemFree)(tb_cu_deviceptr p);
  tb_cu_result (*cuMemcpyHtoD)(tb_cu_deviceptr dst, const void *src,
                               size_t n);
  tb_cu_result (*cuMemcpyDtoH)(void *dst, tb_cu_deviceptr src, size_t n);
  tb_cu_result (*cuStreamCreate)(tb_cu_stream *s, unsigned flags);
  tb_cu_result (*cuStreamDestroy)(tb_cu_stream s);
  tb_cu_result (*cuIpcGetMemHandle)(tb_cu_ipc_mem_handle *h,
                                    tb_cu_deviceptr p);
  tb_cu_result (*cuIpcOpenMemHandle)(tb_cu_deviceptr *p,
                                     tb_cu_ipc_mem_handle h, unsigned flags);
  tb_cu_result (*cuIpcCloseMemHandle)(tb_cu_deviceptr p);
};

#define DRV_SYM(member, name) {offsetof(struct drv, member), name}
static const struct {
  size_t off;
  const char *name;
} drv_syms[] = {
    DRV_SYM(cuInit, "cuInit"),
    DRV_SYM(cuCtxGetCurrent, "cuCtxGetCurrent"),
    DRV_SYM(cuCtxSetCurrent, "cuCtxSetCurrent"),
    DRV_SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    DRV_SYM(cuMemAlloc, "cuMemAlloc_v2"),
    DRV_SYM(cuMemFree, "cuMemFree_v2"),
    DRV_SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
    DRV_SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
    DRV_SYM(cuStreamCreate, "cuStreamCreate"),
    DRV_SYM(cuStreamDestroy, "cuStreamDestroy_v2"),
    DRV_SYM(cuIpcGetMemHandle, "cuIpcGetMemHandle"),
    DRV_SYM(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2"),
    DRV_SYM(cuIpcCloseMemHandle, "cuIpcCloseMemHandle"),
};

/* Resolve every member from libcuda.so.1 (the copy already loaded, if
 * any). NULL, or the name that is missing. */
static const char *drv_load(struct drv *k) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL)
    return "libcuda.so.1";
  for (size_t i = 0; i < sizeof(drv_syms) / sizeof(drv_syms[0]); i++) {
    void *fn = dlsym(lib, drv_syms[i].name);
    if (fn == NULL)
      return drv_syms[i].name;
    memcpy((char *)k + drv_syms[i].off, &fn, sizeof(fn));
  }
  return NULL;
}

/* Make the primary context current on this thread. */
static int drv_ctx(const struct drv *k) {
  tb_cu_context ctx = NULL;
  if (k->cuInit(0) != 0 || k->cuDevicePrimaryCtxRetain(&ctx, 0) != 0)
    return -1;
  return k->cuCtxSetCurrent(ctx) == 0 ? 0 : -1;
}

static void hex_encode(const void *p, size_t n, char *out) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static int hex_decode(const char *s, void *p, size_t n) {
  unsigned char *b = p;
  for (size_t i = 0; i < n; i++) {
    char byte[3] = {s[2 * i], s[2 * i] != '\0' ? s[2 * i + 1] : '\0', '\0'};
    char *end;
    unsigned long v = strtoul(byte, &end, 16);
    if (byte[0] == '\0' || *end != '\0')
      return -1;
    b[i] = (unsigned char)v;
  }
  return s[2 * n] == '\0' ? 0 : -1;
}

/* The whole file (NUL-terminated, malloc'ed), or NULL. */
static char *read_file(const char *path) {
  FILE *f = fopen(path, "re");
  char *buf = NULL;
  size_t len = 0, cap = 0, n;

  if (f == NULL)
    return NULL;
  do {
    if (cap - len < 4096) {
      char *p = realloc(buf, cap + 65536);
      if (p == NULL) {
        free(buf);
        fclose(f);
        return NULL;
      }
      buf = p;
      cap += 65536;
    }
    n = fread(buf + len, 1, cap - len - 1, f);
    len += n;
  } while (n > 0);
  fclose(f);
  buf[len] = '\0';
  return buf;
}

/* This process's in-memory log (malloc'ed). */
static char *own_log(void) {
  const struct fakecuda_hooks *fk = fakecuda();
  size_t len = fk->log_read(NULL, 0);
  char *buf = malloc(len + 1);
  assert_non_null(buf);
  fk->log_read(buf, len + 1);
  return buf;
}

static void loads_through_library(void **state) {
  const struct tb_cuda *cu = NULL;
  tb_cu_context ctx = NULL;
  tb_cu_ipc_mem_handle h;
  tb_cu_deviceptr p = 0, q = 0;
  struct drv k;
  void *lib, *fn, *got;
  const char *missing;
  (void)state;

  missing = drv_load(&k);
  if (missing != NULL)
    fail_msg("the fake driver lacks %s (LD_LIBRARY_PATH=%s)", missing,
             getenv("LD_LIBRARY_PATH"));
  assert_non_null(fakecuda());
  /* nobody has called cuInit yet in this process */
  assert_int_equal(k.cuCtxGetCurrent(&ctx), CUDA_ERROR_NOT_INITIALIZED);

  if (tb_cuda_available() != 0)
    fail_msg("tb_cuda_available: %s", tb__cuda_why());
  assert_int_equal(tb__cuda_load(&cu), 0);
  assert_int_equal(k.cuCtxGetCurrent(&ctx), 0);
  /* the library asked cuGetProcAddress_v2 for "cuMemAlloc" and got the
   * _v2 entry point, the one dlsym finds by that name */
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(lib);
  fn = dlsym(lib, "cuMemAlloc_v2");
  memcpy(&got, &cu->cuMemAlloc, sizeof(got));
  assert_ptr_equal(got, fn);
  dlclose(lib);

  /* one's own IPC memory handle is refused, as by the real driver */
  assert_int_equal(drv_ctx(&k), 0);
  assert_int_equal(k.cuMemAlloc(&p, 4096), 0);
  assert_int_equal(k.cuIpcGetMemHandle(&h, p), 0);
  assert_int_equal(k.cuIpcOpenMemHandle(&q, h, TB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                   TB_CUDA_ERROR_INVALID_CONTEXT);
  assert_int_equal(k.cuMemFree(p), 0);
  assert_int_equal(k.cuCtxSetCurrent(NULL), 0);
}

/* ---- exchange ---- */

static void u8_cuda_tensor(DLTensor *t, int64_t *shape, tb_cu_deviceptr p) {
  memset(t, 0, sizeof(*t));
  *shape = N;
  t->data = (void *)(uintptr_t)p;
  t->device.device_type = kDLCUDA;
  t->device.device_id = 0;
  t->ndim = 1;
  t->dtype.code = kDLUInt;
  t->dtype.bits = 8;
  t->dtype.lanes = 1;
  t->shape = shape;
}

static uint64_t publish(tb_client *c, tb_cu_deviceptr p, tb_cu_stream s) {
  struct tb_publish_options o;
  DLTensor t;
  int64_t shape;
  uint64_t v = 0;

  u8_cuda_tensor(&t, &shape, p);
  tb_publish_options_init(&o);
  o.stream = s;
  o.history_depth = 1;
  TBT_CHECK_OK(tb_publish(c, CH, &t, &o, &v));
  return v;
}

/* The producer: fake device memory with the pattern, published on its own
 * non-blocking stream; after the consumer's release, a second version (so
 * the first leaves the history) and tb_wait_free of the first on the same
 * stream. Then it hands over its memory handle and waits to be killed. */
static int producer(struct tbt_chan *ch, void *arg) {
  const struct tbt_daemon *d = arg;
  static uint8_t host[N];
  char line[256], hex[2 * 64 + 1];
  tb_cu_ipc_mem_handle h;
  tb_cu_deviceptr p = 0;
  tb_cu_stream s = NULL;
  tb_client *c = NULL;
  struct drv k;
  uint64_t v1;

  TBT_CHECK(drv_load(&k) == NULL);
  TBT_CHECK(drv_ctx(&k) == 0);
  TBT_CHECK(k.cuMemAlloc(&p, N) == 0);
  tbt_fill(host, N, SEED);
  TBT_CHECK(k.cuMemcpyHtoD(p, host, N) == 0);
  TBT_CHECK(k.cuStreamCreate(&s, TB_CU_STREAM_NON_BLOCKING) == 0);
  TBT_CHECK_OK(tbt_connect(d, "producer", &c));

  v1 = publish(c, p, s);
  TBT_CHECK_OK(tbt_send(ch->wr, "published %llu %s", (unsigned long long)v1,
                        fakecuda()->stream_name(s)));
  TBT_CHECK_OK(tbt_recv(ch->rd, line, sizeof(line), TBT_TIMEOUT_MS));
  TBT_CHECK(strcmp(line, "released") == 0);
  (void)publish(c, p, s);
  TBT_CHECK_OK(tb_wait_free(c, CH, v1, TBT_TIMEOUT_MS, s));

  TBT_CHECK(k.cuIpcGetMemHandle(&h, p) == 0);
  hex_encode(h.reserved, sizeof(h.reserved), hex);
  TBT_CHECK_OK(tbt_send(ch->wr, "freed %s", hex));
  /* killed here, its client and memory still open */
  TBT_CHECK_OK(tbt_recv(ch->rd, line, sizeof(line), TBT_TIMEOUT_MS));
  return 3;
}

/* The consumer's read of the acquired bytes, through the fake. */
static void check_bytes(const struct drv *k, tb_cu_deviceptr p) {
  static uint8_t got[N];
  assert_int_equal(k->cuMemcpyDtoH(got, p, N), 0);
  for (size_t i = 0; i < N; i++)
    if (got[i] != tbt_pattern(i, SEED))
      fail_msg("byte %zu is %u, the producer wrote %u", i, got[i],
               tbt_pattern(i, SEED));
}

static void exchange_through_daemon(void **state) {
  const struct fakecuda_hooks *fk = fakecuda();
  struct fakecuda_counts counts = {.struct_size = sizeof(counts)};
  struct tb_acquire_options o;
  struct tbt_daemon d;
  struct tbt_child p;
  struct drv k;
  DLManagedTensorVersioned *t = NULL;
  tb_cu_ipc_mem_handle h;
  tb_cu_deviceptr q = 0;
  tb_cu_stream cs = NULL;
  tb_client *c = NULL;
  char log_path[128], line[400], ps[32], cs_name[32], ready[48], done[48],
      want[160], *log, *shared;
  unsigned long long v1;
  int n = 0;
  (void)state;

  assert_non_null(fk);
  assert_null(drv_load(&k));
  assert_int_equal(tbt_daemon_start(&d, NULL), 0);
  snprintf(log_path, sizeof(log_path), "%s/fakecuda.log", d.dir);
  assert_int_equal(setenv("FAKECUDA_LOG", log_path, 1), 0);
  fk->set_busy(1); /* the producer inherits it */
  fk->log_clear();
  assert_int_equal(tbt_child_start(&p, producer, &d), 0);

  assert_int_equal(drv_ctx(&k), 0);
  assert_int_equal(k.cuStreamCreate(&cs, TB_CU_STREAM_NON_BLOCKING), 0);
  snprintf(cs_name, sizeof(cs_name), "%s", fk->stream_name(cs));
  assert_int_equal(tbt_connect(&d, "consumer", &c), 0);

  assert_int_equal(tbt_recv(p.rd, line, sizeof(line), TBT_TIMEOUT_MS), 0);
  assert_int_equal(sscanf(line, "published %llu %31s%n", &v1, ps, &n), 2);
  assert_int_equal(line[n], '\0');
  tb_acquire_options_init(&o);
  o.mode = TB_ACQUIRE_EXACT;
  o.version = v1;
  o.timeout_ms = TBT_TIMEOUT_MS;
  o.stream = cs;
  assert_int_equal(tb_acquire(c, CH, &o, &t), 0);
  assert_int_equal(t->dl_tensor.device.device_type, kDLCUDA);
  assert_int_equal(t->dl_tensor.shape[0], N);
  check_bytes(&k, (tb_cu_deviceptr)(uintptr_t)t->dl_tensor.data);

  /* the consumer's stream waited on the producer's ready event */
  log = own_log();
  snprintf(want, sizeof(want), "wait %s on ", cs_name);
  if (!fakecuda_text_find(log, getpid(), want, "", ready, sizeof(ready)))
    fail_msg("no 'wait %s on E' in the consumer's log:\n%s", cs_name, log);
  free(log);
  snprintf(want, sizeof(want), "e%ld.", (long)p.pid);
  assert_memory_equal(ready, want, strlen(want));

  /* release on cs: the done event is recorded there (busy: not skipped) */
  assert_int_equal(tb_release(t, cs), 0);
  log = own_log();
  snprintf(want, sizeof(want), " on %s", cs_name);
  if (!fakecuda_text_find(log, getpid(), "record ", want, done, sizeof(done)))
    fail_msg("no 'record E on %s' in the consumer's log:\n%s", cs_name, log);
  free(log);
  snprintf(want, sizeof(want), "e%ld.", (long)getpid());
  assert_memory_equal(done, want, strlen(want));
  snprintf(want, sizeof(want), "record %s on %s", done, cs_name);
  assert_int_equal(fk->log_count(want), 1);

  /* the producer's tb_wait_free: its stream waits on that same event */
  assert_int_equal(tbt_send(p.wr, "released"), 0);
  assert_int_equal(tbt_recv(p.rd, line, sizeof(line), TBT_TIMEOUT_MS), 0);
  assert_int_equal(strncmp(line, "freed ", 6), 0);
  assert_int_equal(hex_decode(line + 6, h.reserved, sizeof(h.reserved)), 0);
  shared = read_file(log_path);
  assert_non_null(shared);
  snprintf(want, sizeof(want), "wait %s on %s", ps, done);
  if (fakecuda_text_count(shared, p.pid, want) != 1)
    fail_msg("expected one '%ld %s' in the shared log:\n%s", (long)p.pid,
             want, shared);
  /* the ready event has one name in both processes */
  snprintf(want, sizeof(want), "record %s on %s", ready, ps);
  assert_true(fakecuda_text_count(shared, p.pid, want) >= 1);
  snprintf(want, sizeof(want), "ipc-open-event %s", ready);
  assert_int_equal(fakecuda_text_count(shared, getpid(), want), 1);
  free(shared);

  /* the producer's memory, opened directly: its bytes, while it lives */
  assert_int_equal(
      k.cuIpcOpenMemHandle(&q, h, TB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), 0);
  check_bytes(&k, q);
  assert_int_equal(k.cuIpcCloseMemHandle(q), 0);

  /* the library closes its mappings at disconnect; then the producer dies
   * and its handle no longer opens */
  tb_client_disconnect(c);
  fk->counts(&counts);
  assert_int_equal(counts.ipc_mappings, 0);
  tbt_child_kill(&p);
  assert_int_equal(
      k.cuIpcOpenMemHandle(&q, h, TB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
      CUDA_ERROR_INVALID_HANDLE);

  assert_int_equal(k.cuStreamDestroy(cs), 0);
  fk->set_busy(0);
  unsetenv("FAKECUDA_LOG");
  unlink(log_path);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

/* ---- the fake's own rules ---- */

typedef tb_cu_result (*get_proc_fn)(const char *symbol, void **pfn,
                                    int cuda_version, uint64_t flags,
                                    int *status);
typedef tb_cu_result (*stream_id_fn)(tb_cu_stream s, unsigned long long *id);

/* cuStreamGetId, as the library will resolve it: by base name. */
static stream_id_fn get_stream_id(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), *sym, *fn = NULL,
       *none = &none;
  get_proc_fn get_proc;
  stream_id_fn id_fn;
  int status = -1;

  assert_non_null(lib);
  sym = dlsym(lib, "cuGetProcAddress_v2");
  assert_non_null(sym);
  memcpy(&get_proc, &sym, sizeof(sym));
  assert_int_equal(get_proc("cuStreamGetId", &fn, 12000, 1, &status), 0);
  assert_int_equal(status, 0);
  assert_non_null(fn);
  assert_int_not_equal(get_proc("cuNoSuchCall", &none, 12000, 1, &status), 0);
  assert_int_equal(status, 1); /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
  assert_null(none);
  dlclose(lib);
  memcpy(&id_fn, &fn, sizeof(fn));
  return id_fn;
}

/* The in-memory log has this line (body after the pid) exactly n times. */
static void expect_line(size_t n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void expect_line(size_t n, const char *fmt, ...) {
  char body[256], *log;
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(body, sizeof(body), fmt, ap);
  va_end(ap);
  if (fakecuda()->log_count(body) != n) {
    log = own_log();
    fail_msg("expected '%s' %zu times in the log:\n%s", body, n, log);
  }
}

static void driver_semantics(void **state) {
  const struct fakecuda_hooks *fk = fakecuda();
  struct fakecuda_counts c0 = {.struct_size = sizeof(c0)},
                         c1 = {.struct_size = sizeof(c1)};
  const struct tb_cuda *cu = NULL;
  stream_id_fn stream_id = get_stream_id();
  unsigned long long ia = 0, ib = 0, id = 0;
  tb_cu_stream a = NULL, b = NULL, o = NULL;
  tb_cu_event e = NULL, e2 = NULL, bad = NULL;
  tb_cu_ipc_event_handle eh;
  tb_cu_context ctx = NULL;
  void *graph = NULL, *exec = NULL;
  char an[32], bn[32], on[32], en[48], e2n[48], gn[32], want[64], *log;
  unsigned flags = 0;
  int st = -1, mode;
  struct drv k;
  (void)state;

  assert_null(drv_load(&k));
  assert_int_equal(tb__cuda_load(&cu), 0);
  assert_int_equal(drv_ctx(&k), 0);
  fk->log_clear();
  fk->counts(&c0);

  /* streams: ids unique and distinct from the default streams' */
  assert_int_equal(cu->cuStreamCreate(&a, TB_CU_STREAM_NON_BLOCKING), 0);
  assert_int_equal(cu->cuStreamCreate(&b, TB_CU_STREAM_DEFAULT), 0);
  assert_int_equal(cu->cuStreamCreate(&o, TB_CU_STREAM_NON_BLOCKING), 0);
  snprintf(an, sizeof(an), "%s", fk->stream_name(a));
  snprintf(bn, sizeof(bn), "%s", fk->stream_name(b));
  snprintf(on, sizeof(on), "%s", fk->stream_name(o));
  assert_int_equal(stream_id(a, &ia), 0);
  assert_int_equal(stream_id(b, &ib), 0);
  assert_true(ia > 2 && ib > 2 && ia != ib);
  assert_int_equal(stream_id(TB_CU_STREAM_LEGACY, &id), 0);
  assert_int_equal(id, 1);
  assert_int_equal(stream_id(NULL, &id), 0);
  assert_int_equal(id, 1);
  assert_int_equal(stream_id(TB_CU_STREAM_PER_THREAD, &id), 0);
  assert_int_equal(id, 2);
  assert_string_equal(fk->stream_name(TB_CU_STREAM_LEGACY), "legacy");
  assert_string_equal(fk->stream_name(TB_CU_STREAM_PER_THREAD), "ptds");
  assert_string_equal(fk->stream_name(NULL), "null");
  assert_string_equal(fk->stream_name(&k), "invalid");
  expect_line(1, "stream-create %s nonblocking", an);
  expect_line(1, "stream-create %s default", bn);
  assert_int_equal(cu->cuStreamGetFlags(a, &flags), 0);
  assert_int_equal(flags, TB_CU_STREAM_NON_BLOCKING);
  assert_int_equal(cu->cuStreamGetCtx(a, &ctx), 0);
  assert_non_null(ctx);

  /* events: interprocess ones must not time; only they have handles */
  assert_int_equal(cu->cuEventCreate(&bad, TB_CU_EVENT_INTERPROCESS),
                   TB_CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(cu->cuEventCreate(&e, 0), 0);
  assert_int_equal(cu->cuIpcGetEventHandle(&eh, e),
                   TB_CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(cu->cuEventCreate(&e2, TB_CU_EVENT_INTERPROCESS |
                                              TB_CU_EVENT_DISABLE_TIMING),
                   0);
  snprintf(en, sizeof(en), "%s", fk->event_name(e));
  snprintf(e2n, sizeof(e2n), "%s", fk->event_name(e2));
  expect_line(1, "event-create %s default", en);
  expect_line(1, "event-create %s disable-timing interprocess", e2n);

  /* a destroyed stream answers CUDA_ERROR_INVALID_HANDLE to everything */
  assert_int_equal(cu->cuStreamDestroy(b), 0);
  expect_line(1, "stream-destroy %s", bn);
  assert_int_equal(stream_id(b, &id), CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(cu->cuStreamGetCtx(b, &ctx), CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(cu->cuStreamDestroy(b), CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(cu->cuEventRecord(e, b), CUDA_ERROR_INVALID_HANDLE);
  expect_line(1, "record %s on %s -> CUDA_ERROR_INVALID_HANDLE", en, bn);

  /* busy mode: queries say the work is still running */
  assert_int_equal(cu->cuEventRecord(e2, o), 0);
  expect_line(1, "record %s on %s", e2n, on);
  assert_string_equal(fk->event_recorded_on(e2), on);
  fk->set_busy(1);
  assert_int_equal(cu->cuStreamQuery(o), TB_CUDA_ERROR_NOT_READY);
  assert_int_equal(cu->cuEventQuery(e2), TB_CUDA_ERROR_NOT_READY);
  fk->set_busy(0);
  assert_int_equal(cu->cuStreamQuery(o), 0);
  assert_int_equal(cu->cuEventQuery(e2), 0);

  /* a capture: the legacy stream is off limits; an external record is
   * fine; a plain wait on an event recorded outside refuses and
   * invalidates it, and its end says so */
  assert_int_equal(
      cu->cuStreamBeginCapture(a, TB_CU_STREAM_CAPTURE_MODE_GLOBAL), 0);
  expect_line(1, "capture-begin %s global", an);
  assert_int_equal(cu->cuStreamIsCapturing(a, &st), 0);
  assert_int_equal(st, TB_CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(cu->cuStreamIsCapturing(TB_CU_STREAM_LEGACY, &st),
                   TB_CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  assert_int_equal(cu->cuStreamIsCapturing(NULL, &st),
                   TB_CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  assert_int_equal(
      cu->cuEventRecordWithFlags(e2, a, TB_CU_EVENT_RECORD_EXTERNAL), 0);
  expect_line(1, "record-external %s on %s (capturing)", e2n, an);
  assert_string_equal(fk->event_recorded_on(e2), on);
  /* other streams may be asked about in relaxed mode, as the library does */
  mode = TB_CU_STREAM_CAPTURE_MODE_RELAXED;
  assert_int_equal(cu->cuThreadExchangeStreamCaptureMode(&mode), 0);
  assert_int_equal(mode, TB_CU_STREAM_CAPTURE_MODE_GLOBAL);
  assert_int_equal(cu->cuStreamQuery(o), 0);
  assert_int_equal(cu->cuThreadExchangeStreamCaptureMode(&mode), 0);
  assert_int_equal(mode, TB_CU_STREAM_CAPTURE_MODE_RELAXED);
  assert_int_equal(cu->cuStreamWaitEvent(a, e, 0),
                   CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  expect_line(1, "wait %s on %s (capturing) -> "
                 "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", an, en);
  expect_line(1, "capture-invalidate %s by cuStreamWaitEvent", an);
  assert_int_equal(cu->cuStreamIsCapturing(a, &st), 0);
  assert_int_equal(st, TB_CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  assert_int_equal(cu->cuStreamEndCapture(a, &graph),
                   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  assert_null(graph);
  assert_int_equal(cu->cuStreamIsCapturing(a, &st), 0);
  assert_int_equal(st, TB_CU_STREAM_CAPTURE_STATUS_NONE);

  /* in GLOBAL mode, a query of another stream during the capture is a
   * potentially unsafe call: refused, and the capture is invalidated */
  assert_int_equal(
      cu->cuStreamBeginCapture(a, TB_CU_STREAM_CAPTURE_MODE_GLOBAL), 0);
  assert_int_equal(cu->cuStreamQuery(o), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  expect_line(1, "capture-invalidate %s by cuStreamQuery", an);
  assert_int_equal(cu->cuStreamEndCapture(a, &graph),
                   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

  /* a clean capture: external record and wait, a graph launched */
  fk->log_clear();
  assert_int_equal(
      cu->cuStreamBeginCapture(a, TB_CU_STREAM_CAPTURE_MODE_GLOBAL), 0);
  assert_int_equal(cu->cuStreamWaitEvent(a, e2, TB_CU_EVENT_WAIT_EXTERNAL), 0);
  expect_line(1, "wait-external %s on %s (capturing)", an, e2n);
  assert_int_equal(cu->cuEventRecord(e, a), 0);
  expect_line(1, "record %s on %s (capturing)", en, an);
  /* an event recorded in a live capture has no state of its own yet */
  assert_int_equal(cu->cuEventQuery(e), 907); /* CUDA_ERROR_CAPTURED_EVENT */
  assert_int_equal(cu->cuStreamEndCapture(a, &graph), 0);
  assert_non_null(graph);
  log = own_log();
  snprintf(want, sizeof(want), "capture-end %s ", an);
  assert_true(fakecuda_text_find(log, getpid(), want, "", gn, sizeof(gn)));
  free(log);
  assert_int_equal(gn[0], 'g');
  assert_int_equal(cu->cuGraphInstantiate(&exec, graph, 0), 0);
  expect_line(1, "graph-instantiate %s", gn);
  assert_int_equal(cu->cuGraphLaunch(exec, o), 0);
  expect_line(1, "graph-launch %s on %s", gn, on);
  assert_int_equal(cu->cuGraphExecDestroy(exec), 0);
  assert_int_equal(cu->cuGraphExecDestroy(exec), CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(cu->cuGraphDestroy(graph), 0);

  /* everything made here is gone again */
  assert_int_equal(cu->cuEventDestroy(e), 0);
  assert_int_equal(cu->cuEventDestroy(e2), 0);
  expect_line(1, "event-destroy %s", en);
  expect_line(1, "event-destroy %s", e2n);
  assert_int_equal(cu->cuStreamDestroy(a), 0);
  assert_int_equal(cu->cuStreamDestroy(o), 0);
  fk->counts(&c1);
  assert_int_equal(c1.streams, c0.streams);
  assert_int_equal(c1.events, c0.events);
  assert_int_equal(c1.graphs, c0.graphs);
  assert_int_equal(c1.graph_execs, c0.graph_execs);
  assert_int_equal(c1.capturing, 0);
  assert_int_equal(cu->cuCtxSetCurrent(NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(loads_through_library),
      cmocka_unit_test(exchange_through_daemon),
      cmocka_unit_test(driver_semantics),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
