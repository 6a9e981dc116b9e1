/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA half of the legacy-IPC transport (see cuda_ipc.h).
 *
 * Everything here talks only to the driver. Three habits hold throughout:
 *  - Work happens in the context the object belongs to: a pointer's context
 *    (CU_POINTER_ATTRIBUTE_CONTEXT), an explicit stream's (cuStreamGetCtx).
 *    When that is not the calling thread's current context we make it current
 *    for the call and restore the previous one before returning.
 *  - Driver calls that are not stream work (IPC open/close, event create)
 *    run with the thread's capture mode exchanged to RELAXED, so that they
 *    are allowed while the application captures a graph in GLOBAL mode (as
 *    PyTorch does around cudaMalloc during capture).
 *  - Nothing here synchronises the host with the GPU. */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensorbroker/tensorbroker.h>

#include "cuda_ipc.h"

__attribute__((format(printf, 3, 4))) static void
tb_why(char *why, size_t whylen, const char *fmt, ...) {
  if (why == NULL || whylen == 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, whylen, fmt, ap);
  va_end(ap);
}

/* A failed driver call: TB_ECUDA with "call: CUDA_ERROR_NAME". */
static int tb_cu_fail(char *why, size_t whylen, const char *call,
                      tb_cu_result r) {
  tb_why(why, whylen, "%s failed: %s", call, tb__cuda_err_name(r));
  return TB_ECUDA;
}

static int tb_cu_get(const struct tb_cuda **cu, char *why, size_t whylen) {
  int rc = tb__cuda_load(cu);
  if (rc != 0)
    tb_why(why, whylen, "%s", tb__cuda_why());
  return rc;
}

/* ---- current-context switching ------------------------------------------ */

struct tb_ctx_saved {
  tb_cu_context prev;
  int switched;
};

static int tb_ctx_enter(const struct tb_cuda *cu, tb_cu_context want,
                        struct tb_ctx_saved *saved, char *why,
                        size_t whylen) {
  tb_cu_context cur = NULL;
  tb_cu_result r = cu->cuCtxGetCurrent(&cur);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuCtxGetCurrent", r);
  saved->prev = cur;
  saved->switched = 0;
  if (want == NULL || want == cur)
    return 0;
  r = cu->cuCtxSetCurrent(want);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuCtxSetCurrent", r);
  saved->switched = 1;
  return 0;
}

static void tb_ctx_leave(const struct tb_cuda *cu,
                         const struct tb_ctx_saved *saved) {
  if (saved->switched)
    cu->cuCtxSetCurrent(saved->prev);
}

/* ---- capture mode ------------------------------------------------------- */

static int tb_relaxed_enter(const struct tb_cuda *cu) {
  int mode = TB_CU_STREAM_CAPTURE_MODE_RELAXED;
  if (cu->cuThreadExchangeStreamCaptureMode(&mode) != 0)
    return -1;
  return mode;
}

static void tb_relaxed_leave(const struct tb_cuda *cu, int saved) {
  if (saved >= 0)
    cu->cuThreadExchangeStreamCaptureMode(&saved);
}

/* ---- streams ------------------------------------------------------------ */

int tb__cuda_stream_resolve(int contract, void *stream,
                            struct tb__cuda_stream *out, char *why,
                            size_t whylen) {
  struct tb__cuda_stream s = {NULL, 0, 0, NULL};
  intptr_t v = (intptr_t)stream;

  if (stream == NULL) {
    s.implicit = 1;
    switch (contract) {
    case TB_CONTRACT_SPEC:
      s.stream = TB_CU_STREAM_LEGACY;
      break;
    case TB_CONTRACT_NO_SYNC:
      s.no_sync = 1;
      break;
    case TB_CONTRACT_PER_THREAD:
      s.stream = TB_CU_STREAM_PER_THREAD;
      break;
    case TB_CONTRACT_EXPLICIT:
      tb_why(why, whylen,
             "this connection's contract is 'explicit': pass the CUstream "
             "that produces or reads the data (or 1 legacy, 2 per-thread, "
             "-1 no sync) instead of NULL");
      return TB_ESTREAM;
    default:
      tb_why(why, whylen, "unknown stream contract %d", contract);
      return TB_EINVAL;
    }
  } else if (v == -1) {
    s.no_sync = 1;
  } else if (v == 1) {
    s.stream = TB_CU_STREAM_LEGACY;
  } else if (v == 2) {
    s.stream = TB_CU_STREAM_PER_THREAD;
  } else if (v < 0) {
    tb_why(why, whylen,
           "stream value %" PRIdPTR " is not a DLPack stream (use -1, 1, 2 "
           "or a CUstream)",
           v);
    return TB_ESTREAM;
  } else {
    s.stream = (tb_cu_stream)stream;
  }
  *out = s;
  return 0;
}

/* The context stream work must run in: an explicit stream's own context,
 * or for the default streams the thread's current one (which must exist). */
static int tb_stream_ctx(const struct tb_cuda *cu,
                         const struct tb__cuda_stream *st, tb_cu_context *out,
                         char *why, size_t whylen) {
  tb_cu_stream s = st->stream;
  tb_cu_context ctx = NULL;
  tb_cu_result r;
  if (st->ctx != NULL) {
    ctx = st->ctx;
  } else if (s == TB_CU_STREAM_LEGACY || s == TB_CU_STREAM_PER_THREAD) {
    r = cu->cuCtxGetCurrent(&ctx);
    if (r != 0)
      return tb_cu_fail(why, whylen, "cuCtxGetCurrent", r);
    if (ctx == NULL) {
      tb_why(why, whylen,
             "the %s default stream needs a current CUDA context on this "
             "thread; make the device current or pass a CUstream",
             s == TB_CU_STREAM_LEGACY ? "legacy" : "per-thread");
      return TB_ESTREAM;
    }
  } else {
    r = cu->cuStreamGetCtx(s, &ctx);
    if (r != 0) {
      tb_why(why, whylen, "cuStreamGetCtx on the given stream failed: %s "
             "(not a live CUstream?)", tb__cuda_err_name(r));
      return TB_ESTREAM;
    }
  }
  *out = ctx;
  return 0;
}

/* How s captures: 0 not capturing, 1 capturing; TB_ECAPTURE when using s
 * would invalidate a capture or one is already invalidated. */
static int tb_capture_state(const struct tb_cuda *cu, tb_cu_stream s,
                            const char *what, char *why, size_t whylen) {
  int st = TB_CU_STREAM_CAPTURE_STATUS_NONE;
  tb_cu_result r = cu->cuStreamIsCapturing(s, &st);
  if (r == TB_CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
    tb_why(why, whylen,
           "a stream is being captured into a CUDA graph, and %s on the "
           "legacy default stream would invalidate the capture: pass the "
           "capturing stream, or -1 and order the work yourself",
           what);
    return TB_ECAPTURE;
  }
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuStreamIsCapturing", r);
  if (st == TB_CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
    tb_why(why, whylen,
           "the stream's graph capture is already invalidated; end it with "
           "cuStreamEndCapture before %s",
           what);
    return TB_ECAPTURE;
  }
  return st == TB_CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

/* Makes s's context current (saved puts the thread's back): tb_cu_get,
 * tb_stream_ctx and tb_ctx_enter in one. With what, also returns s's
 * capture state as tb_capture_state does (0 or 1), leaving the context
 * again on its error. */
static int tb_stream_enter(const struct tb__cuda_stream *s, const char *what,
                           const struct tb_cuda **cu,
                           struct tb_ctx_saved *saved, char *why,
                           size_t whylen) {
  tb_cu_context ctx;
  int rc;

  rc = tb_cu_get(cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb_stream_ctx(*cu, s, &ctx, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb_ctx_enter(*cu, ctx, saved, why, whylen);
  if (rc != 0 || what == NULL)
    return rc;
  rc = tb_capture_state(*cu, s->stream, what, why, whylen);
  if (rc < 0)
    tb_ctx_leave(*cu, saved);
  return rc;
}

/* Has every operation enqueued on s finished? Only asked of streams
 * created non-blocking: those take no implicit dependency on the legacy
 * stream, so an event recorded on them now would mark exactly this work.
 * The legacy and per-thread streams, and blocking streams, are left to the
 * event's own query after the record. */
static int tb_stream_idle(const struct tb_cuda *cu, tb_cu_stream s) {
  unsigned flags = 0;
  if (s == TB_CU_STREAM_LEGACY || s == TB_CU_STREAM_PER_THREAD || s == NULL)
    return 0;
  if (cu->cuStreamGetFlags(s, &flags) != 0 ||
      !(flags & TB_CU_STREAM_NON_BLOCKING))
    return 0;
  return cu->cuStreamQuery(s) == TB_CUDA_SUCCESS;
}

int tb__cuda_record(tb_cu_event ev, const struct tb__cuda_stream *s,
                    int may_skip, int *complete, int *skipped, char *why,
                    size_t whylen) {
  const struct tb_cuda *cu;
  struct tb_ctx_saved saved;
  tb_cu_result r;
  int rc, idle = 0, mode;

  if (complete != NULL)
    *complete = 0;
  if (skipped != NULL)
    *skipped = 0;
  if (s->no_sync)
    return 0;
  rc = tb_stream_enter(s, "recording the event", &cu, &saved, why, whylen);
  if (rc < 0)
    return rc;
  if (rc == 1) {
    /* Inside a capture a plain record would become an internal node that
     * no other process can observe; EXTERNAL makes the graph record the
     * interprocess event each time it runs. */
    r = cu->cuEventRecordWithFlags(ev, s->stream, TB_CU_EVENT_RECORD_EXTERNAL);
    rc = r == 0 ? 0 : tb_cu_fail(why, whylen, "cuEventRecordWithFlags", r);
    goto out_leave;
  }
  /* may_skip: a stream with no work left is not recorded on. Every
   * earlier record of the event (all on this stream) has completed too, so
   * whoever waits on the event's latest record, now or when a captured
   * graph runs later, waits for nothing, exactly as after a fresh record;
   * and a record is a submission to the GPU that costs the caller
   * microseconds. The queries run in relaxed capture mode: under another
   * capture in global mode (this thread's on another stream, or another
   * thread's) they are "potentially unsafe" calls and would invalidate it;
   * they touch neither the capturing stream nor its events. */
  mode = complete != NULL ? tb_relaxed_enter(cu) : -1;
  if (complete != NULL)
    idle = tb_stream_idle(cu, s->stream);
  if (idle && may_skip) {
    *complete = 1;
    if (skipped != NULL)
      *skipped = 1;
    rc = 0;
  } else {
    r = cu->cuEventRecord(ev, s->stream);
    rc = r == 0 ? 0 : tb_cu_fail(why, whylen, "cuEventRecord", r);
    if (rc == 0 && complete != NULL)
      *complete = idle || cu->cuEventQuery(ev) == TB_CUDA_SUCCESS;
  }
  tb_relaxed_leave(cu, mode);
out_leave:
  tb_ctx_leave(cu, &saved);
  return rc;
}

int tb__cuda_wait(const struct tb__cuda_stream *s, tb_cu_event ev, char *why,
                  size_t whylen) {
  const struct tb_cuda *cu;
  struct tb_ctx_saved saved;
  tb_cu_result r;
  int rc;

  if (s->no_sync)
    return 0;
  rc = tb_stream_enter(s, "waiting for the producer's event", &cu, &saved,
                       why, whylen);
  if (rc < 0)
    return rc;
  /* Capturing: a plain wait on an event recorded outside the capture is
   * refused and invalidates it (measured); the EXTERNAL wait becomes a
   * node that waits for the event's latest record when the graph runs. */
  r = cu->cuStreamWaitEvent(s->stream, ev,
                            rc == 1 ? TB_CU_EVENT_WAIT_EXTERNAL
                                    : TB_CU_EVENT_WAIT_DEFAULT);
  rc = r == 0 ? 0 : tb_cu_fail(why, whylen, "cuStreamWaitEvent", r);
  tb_ctx_leave(cu, &saved);
  return rc;
}

/* ---- memory ------------------------------------------------------------- */

static int tb_ptr_ctx(const struct tb_cuda *cu, tb_cu_deviceptr p,
                      tb_cu_context *out) {
  tb_cu_context ctx = NULL;
  if (cu->cuPointerGetAttribute(&ctx, TB_CU_POINTER_ATTRIBUTE_CONTEXT, p) != 0)
    return -1;
  *out = ctx;
  return 0;
}

int tb__cuda_locate(const void *ptr, size_t len, struct tb__cuda_alloc *out,
                    char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb__cuda_alloc a;
  struct tb_ctx_saved saved;
  tb_cu_deviceptr p = (tb_cu_deviceptr)(uintptr_t)ptr;
  tb_cu_context ctx = NULL;
  tb_cu_device dev;
  tb_cu_uuid uuid;
  unsigned memtype = 0;
  int ordinal = -1;
  tb_cu_result r;
  int rc;

  rc = tb_cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  if (ptr == NULL) {
    tb_why(why, whylen, "NULL data pointer");
    return TB_EINVAL;
  }
  r = cu->cuPointerGetAttribute(&memtype, TB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                p);
  if (r != 0) {
    tb_why(why, whylen,
           "%p is not memory CUDA knows (cuPointerGetAttribute: %s)", ptr,
           tb__cuda_err_name(r));
    return TB_EDEVICE;
  }
  if (memtype != TB_CU_MEMORYTYPE_DEVICE) {
    tb_why(why, whylen,
           "%p is CUDA memory of type %u, not device memory from "
           "cudaMalloc/cuMemAlloc",
           ptr, memtype);
    return TB_EDEVICE;
  }
  if (tb_ptr_ctx(cu, p, &ctx) != 0 ||
      cu->cuPointerGetAttribute(&ordinal,
                                TB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                p) != 0) {
    tb_why(why, whylen, "cannot tell the context or device of %p", ptr);
    return TB_EDEVICE;
  }
  rc = tb_ctx_enter(cu, ctx, &saved, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuMemGetAddressRange(&a.base, &a.size, p);
  tb_ctx_leave(cu, &saved);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuMemGetAddressRange", r);
  if (len > a.size || p - a.base > a.size - len) {
    tb_why(why, whylen,
           "tensor [%p, +%zu) leaves its allocation [0x%llx, +%zu)", ptr, len,
           a.base, a.size);
    return TB_ELAYOUT;
  }
  /* Tells a new allocation from a freed one at the same address and size;
   * a driver that cannot say leaves 0 (then only the size tells). */
  {
    unsigned long long id = 0;
    if (cu->cuPointerGetAttribute(&id, TB_CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                  p) == 0)
      a.alloc_id = id;
  }
  r = cu->cuDeviceGet(&dev, ordinal);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuDeviceGet", r);
  r = cu->cuDeviceGetUuid(&uuid, dev);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuDeviceGetUuid", r);
  a.device = ordinal;
  memcpy(a.uuid, uuid.bytes, sizeof a.uuid);
  *out = a;
  return 0;
}

int tb__cuda_alloc_alive(tb_cu_deviceptr base, uint64_t alloc_id) {
  const struct tb_cuda *cu;
  unsigned long long id = 0;

  if (tb__cuda_load(&cu) != 0)
    return 1; /* cannot tell: keep it */
  if (alloc_id != 0) /* a failed query: no allocation there any more */
    return cu->cuPointerGetAttribute(&id, TB_CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                     base) == 0 &&
           id == alloc_id;
  /* a driver without allocation ids (older than any we support): keep */
  return 1;
}

/* Allocations this process exported, so a same-process consumer can use the
 * pointer: cuIpcOpenMemHandle refuses one's own handles (measured: "invalid
 * device context"). A producer registers few allocations (the daemon caps
 * them per session), so a plain array searched linearly is enough. */
struct tb_export {
  tb_cu_deviceptr base;
  size_t size;
  uint8_t handle[64];
  unsigned refs;
};

static pthread_mutex_t tb_exports_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tb_export *tb_exports;
static size_t tb_exports_len, tb_exports_cap;

/* Call with tb_exports_lock held. */
static struct tb_export *tb_export_by_base(tb_cu_deviceptr base) {
  for (size_t i = 0; i < tb_exports_len; i++)
    if (tb_exports[i].base == base)
      return &tb_exports[i];
  return NULL;
}

static struct tb_export *tb_export_by_handle(const uint8_t handle[64]) {
  for (size_t i = 0; i < tb_exports_len; i++)
    if (memcmp(tb_exports[i].handle, handle, 64) == 0)
      return &tb_exports[i];
  return NULL;
}

int tb__cuda_export_mem(const struct tb__cuda_alloc *a, uint8_t handle[64],
                        char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb_ctx_saved saved;
  tb_cu_ipc_mem_handle h;
  tb_cu_context ctx = NULL;
  struct tb_export *e;
  tb_cu_result r;
  int rc, mode;

  rc = tb_cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  if (tb_ptr_ctx(cu, a->base, &ctx) != 0) {
    tb_why(why, whylen, "0x%llx is no longer CUDA memory", a->base);
    return TB_EDEVICE;
  }
  rc = tb_ctx_enter(cu, ctx, &saved, why, whylen);
  if (rc != 0)
    return rc;
  /* Always ask the driver: if the allocation was freed and another made at
   * the same address, its handle differs. */
  mode = tb_relaxed_enter(cu);
  r = cu->cuIpcGetMemHandle(&h, a->base);
  tb_relaxed_leave(cu, mode);
  tb_ctx_leave(cu, &saved);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuIpcGetMemHandle", r);

  pthread_mutex_lock(&tb_exports_lock);
  e = tb_export_by_base(a->base);
  if (e == NULL) {
    if (tb_exports_len == tb_exports_cap) {
      size_t cap = tb_exports_cap ? tb_exports_cap * 2 : 16;
      struct tb_export *n = realloc(tb_exports, cap * sizeof *n);
      if (n == NULL) {
        pthread_mutex_unlock(&tb_exports_lock);
        tb_why(why, whylen, "out of memory");
        return TB_ENOMEM;
      }
      tb_exports = n;
      tb_exports_cap = cap;
    }
    e = &tb_exports[tb_exports_len++];
    e->base = a->base;
    e->refs = 0;
  }
  e->size = a->size;
  memcpy(e->handle, h.reserved, 64);
  e->refs++;
  pthread_mutex_unlock(&tb_exports_lock);

  memcpy(handle, h.reserved, 64);
  return 0;
}

void tb__cuda_unexport_mem(tb_cu_deviceptr base) {
  pthread_mutex_lock(&tb_exports_lock);
  struct tb_export *e = tb_export_by_base(base);
  if (e != NULL && --e->refs == 0)
    *e = tb_exports[--tb_exports_len];
  pthread_mutex_unlock(&tb_exports_lock);
}

/* Primary contexts this library retained, one reference per device for the
 * life of the process (released never: the application may be using them). */
#define TB_MAX_RETAINED 64
static pthread_mutex_t tb_retain_lock = PTHREAD_MUTEX_INITIALIZER;
static tb_cu_context tb_retained[TB_MAX_RETAINED];

static int tb_primary_ctx(const struct tb_cuda *cu, tb_cu_device dev,
                          tb_cu_context *out, char *why, size_t whylen) {
  tb_cu_context ctx = NULL;
  tb_cu_result r;
  int slot = dev >= 0 && dev < TB_MAX_RETAINED ? dev : -1;

  pthread_mutex_lock(&tb_retain_lock);
  if (slot >= 0 && tb_retained[slot] != NULL) {
    ctx = tb_retained[slot];
  } else {
    r = cu->cuDevicePrimaryCtxRetain(&ctx, dev);
    if (r != 0) {
      pthread_mutex_unlock(&tb_retain_lock);
      return tb_cu_fail(why, whylen, "cuDevicePrimaryCtxRetain", r);
    }
    if (slot >= 0)
      tb_retained[slot] = ctx;
  }
  pthread_mutex_unlock(&tb_retain_lock);
  *out = ctx;
  return 0;
}

static void tb_uuid_text(const uint8_t u[16], char *buf, size_t len) {
  snprintf(buf, len,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
           "%02x%02x%02x%02x%02x%02x",
           u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
           u[11], u[12], u[13], u[14], u[15]);
}

/* The visible devices' UUIDs by ordinal, enumerated once per process: the
 * set of devices and their order are fixed when the driver initialises
 * (CUDA_VISIBLE_DEVICES is read then), so looking a UUID up needs no
 * driver call after the first time. An enumeration in which any device
 * failed to answer is not kept (the next lookup enumerates again). */
#define TB_UUID_CACHE_MAX 64
static pthread_mutex_t tb_uuid_lock = PTHREAD_MUTEX_INITIALIZER;
static int tb_uuid_count = -1; /* -1: not enumerated yet */
static uint8_t tb_uuid_tab[TB_UUID_CACHE_MAX][16];

/* *found: the ordinal of the device with this UUID, or -1; *count: how
 * many devices this process sees. Returns 0 or a driver error. */
static int tb_uuid_find(const struct tb_cuda *cu, const uint8_t uuid[16],
                        int *found, int *count, char *why, size_t whylen) {
  uint8_t tab[TB_UUID_CACHE_MAX][16];
  tb_cu_device dev;
  tb_cu_uuid u;
  tb_cu_result r;
  int n = 0, complete = 1;

  *found = -1;
  pthread_mutex_lock(&tb_uuid_lock);
  n = tb_uuid_count;
  for (int i = 0; i < n; i++) {
    if (memcmp(tb_uuid_tab[i], uuid, 16) == 0) {
      *found = i;
      break;
    }
  }
  pthread_mutex_unlock(&tb_uuid_lock);
  if (n >= 0) {
    *count = n;
    return 0;
  }
  r = cu->cuDeviceGetCount(&n);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuDeviceGetCount", r);
  for (int i = 0; i < n; i++) {
    if (cu->cuDeviceGet(&dev, i) != 0 || cu->cuDeviceGetUuid(&u, dev) != 0) {
      complete = 0;
      continue;
    }
    if (*found < 0 && memcmp(u.bytes, uuid, 16) == 0)
      *found = i;
    if (i < TB_UUID_CACHE_MAX)
      memcpy(tab[i], u.bytes, 16);
  }
  if (complete && n <= TB_UUID_CACHE_MAX) {
    pthread_mutex_lock(&tb_uuid_lock);
    memcpy(tb_uuid_tab, tab, (size_t)n * 16);
    tb_uuid_count = n;
    pthread_mutex_unlock(&tb_uuid_lock);
  }
  *count = n;
  return 0;
}

int tb__cuda_device_by_uuid(const uint8_t uuid[16], int *ordinal,
                            int *cur_ordinal, tb_cu_context *cur_ctx,
                            char *why, size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_context cur = NULL, ctx;
  tb_cu_device dev, cur_dev;
  tb_cu_result r;
  char text[48];
  int found = -1, rc;

  rc = tb_cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb__cuda_find_uuid(uuid, &found, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuDeviceGet(&dev, found);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuDeviceGet", r);

  r = cu->cuCtxGetCurrent(&cur);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuCtxGetCurrent", r);
  if (cur == NULL) {
    rc = tb_primary_ctx(cu, dev, &ctx, why, whylen);
    if (rc != 0)
      return rc;
    r = cu->cuCtxSetCurrent(ctx);
    if (r != 0)
      return tb_cu_fail(why, whylen, "cuCtxSetCurrent", r);
    cur = ctx;
    cur_dev = dev;
  } else {
    /* The mapping goes into the current context; its device must be able
     * to reach the memory's device. */
    r = cu->cuCtxGetDevice(&cur_dev);
    if (r != 0)
      return tb_cu_fail(why, whylen, "cuCtxGetDevice", r);
    if (cur_dev != dev) {
      int can = 0;
      r = cu->cuDeviceCanAccessPeer(&can, cur_dev, dev);
      if (r != 0)
        return tb_cu_fail(why, whylen, "cuDeviceCanAccessPeer", r);
      if (!can) {
        tb_uuid_text(uuid, text, sizeof text);
        tb_why(why, whylen,
               "the current device (ordinal %d) has no peer access to %s "
               "(ordinal %d) where the tensor lives; make that device "
               "current, or pass the consumer's device with "
               "TB_ACQUIRE_COPY_TO_DEVICE to copy",
               cur_dev, text, found);
        return TB_EDEVICE;
      }
    }
  }
  *ordinal = found;
  if (cur_ordinal != NULL)
    *cur_ordinal = (int)cur_dev;
  if (cur_ctx != NULL)
    *cur_ctx = cur;
  return 0;
}

/* ---- events ------------------------------------------------------------- */

static int tb_need_ctx(const struct tb_cuda *cu, const char *what, char *why,
                       size_t whylen) {
  tb_cu_context cur = NULL;
  tb_cu_result r = cu->cuCtxGetCurrent(&cur);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuCtxGetCurrent", r);
  if (cur == NULL) {
    tb_why(why, whylen, "%s needs a current CUDA context on this thread",
           what);
    return TB_EDEVICE;
  }
  return 0;
}

int tb__cuda_event_create(tb_cu_event *out, uint8_t handle[64], char *why,
                          size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_ipc_event_handle h;
  tb_cu_event ev = NULL;
  tb_cu_result r;
  int rc, mode;

  rc = tb_cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb_need_ctx(cu, "creating an interprocess event", why, whylen);
  if (rc != 0)
    return rc;
  mode = tb_relaxed_enter(cu);
  r = cu->cuEventCreate(&ev,
                        TB_CU_EVENT_INTERPROCESS | TB_CU_EVENT_DISABLE_TIMING);
  if (r != 0) {
    rc = tb_cu_fail(why, whylen, "cuEventCreate", r);
    goto out_mode;
  }
  r = cu->cuIpcGetEventHandle(&h, ev);
  if (r != 0) {
    rc = tb_cu_fail(why, whylen, "cuIpcGetEventHandle", r);
    goto out_destroy;
  }
  tb_relaxed_leave(cu, mode);
  memcpy(handle, h.reserved, 64);
  *out = ev;
  return 0;

out_destroy:
  cu->cuEventDestroy(ev);
out_mode:
  tb_relaxed_leave(cu, mode);
  return rc;
}

int tb__cuda_event_open(const uint8_t handle[64], tb_cu_event *out, char *why,
                        size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_ipc_event_handle h;
  tb_cu_event ev = NULL;
  tb_cu_result r;
  int rc, mode;

  rc = tb_cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb_need_ctx(cu, "opening an interprocess event", why, whylen);
  if (rc != 0)
    return rc;
  memcpy(h.reserved, handle, 64);
  mode = tb_relaxed_enter(cu);
  r = cu->cuIpcOpenEventHandle(&ev, h);
  tb_relaxed_leave(cu, mode);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuIpcOpenEventHandle", r);
  *out = ev;
  return 0;
}

void tb__cuda_event_destroy(tb_cu_event e) {
  const struct tb_cuda *cu;
  if (e == NULL || tb__cuda_load(&cu) != 0)
    return;
  int mode = tb_relaxed_enter(cu);
  cu->cuEventDestroy(e);
  tb_relaxed_leave(cu, mode);
}

/* ---- cross-GPU exchange ------------------------------------------------- */

void tb__cuda_uuid_text(const uint8_t uuid[16], char *buf, size_t len) {
  tb_uuid_text(uuid, buf, len);
}

int tb__cuda_find_uuid(const uint8_t uuid[16], int *ordinal, char *why,
                       size_t whylen) {
  const struct tb_cuda *cu;
  char text[48];
  int n = 0, found = -1, rc;

  rc = tb_cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb_uuid_find(cu, uuid, &found, &n, why, whylen);
  if (rc != 0)
    return rc;
  if (found >= 0) {
    *ordinal = found;
    return 0;
  }
  tb_uuid_text(uuid, text, sizeof text);
  tb_why(why, whylen,
         "the tensor lives on %s, which is not among this process's %d "
         "visible CUDA devices (check CUDA_VISIBLE_DEVICES)",
         text, n);
  return TB_EDEVICE;
}

int tb__cuda_device_uuid(int ordinal, uint8_t uuid[16], char *why,
                         size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_device dev;
  tb_cu_uuid u;
  tb_cu_result r;
  int n = 0, rc;

  rc = tb_cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  pthread_mutex_lock(&tb_uuid_lock);
  n = tb_uuid_count;
  if (ordinal >= 0 && ordinal < n)
    memcpy(uuid, tb_uuid_tab[ordinal], 16);
  pthread_mutex_unlock(&tb_uuid_lock);
  if (ordinal >= 0 && ordinal < n)
    return 0;
  r = cu->cuDeviceGetCount(&n);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuDeviceGetCount", r);
  if (ordinal < 0 || ordinal >= n) {
    tb_why(why, whylen,
           "device %d is not among this process's %d visible CUDA devices",
           ordinal, n);
    return TB_EDEVICE;
  }
  r = cu->cuDeviceGet(&dev, ordinal);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuDeviceGet", r);
  r = cu->cuDeviceGetUuid(&u, dev);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuDeviceGetUuid", r);
  memcpy(uuid, u.bytes, 16);
  return 0;
}

int tb__cuda_xdev_plan(int owner, int consumer, unsigned flags,
                       int can_access, const uint8_t owner_uuid[16],
                       const uint8_t consumer_uuid[16], int *plan, char *why,
                       size_t whylen) {
  char ot[48], ct[48];

  if (consumer < 0 || consumer == owner) {
    *plan = TB__XDEV_SAME;
    return 0;
  }
  if (flags & TB_ACQUIRE_COPY_TO_DEVICE) {
    *plan = TB__XDEV_COPY;
    return 0;
  }
  if (can_access) {
    *plan = TB__XDEV_PEER;
    return 0;
  }
  tb_uuid_text(consumer_uuid, ct, sizeof ct);
  tb_uuid_text(owner_uuid, ot, sizeof ot);
  tb_why(why, whylen,
         "%s (device %d) cannot reach %s (device %d, where the tensor "
         "lives) by peer access; pass TB_ACQUIRE_COPY_TO_DEVICE to copy",
         ct, consumer, ot, owner);
  return TB_EDEVICE;
}

int tb__cuda_can_access_peer(int consumer, int owner, int *can, char *why,
                             size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_device a, b;
  tb_cu_result r;
  int v = 0, rc;

  rc = tb_cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuDeviceGet(&a, consumer);
  if (r == 0)
    r = cu->cuDeviceGet(&b, owner);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuDeviceGet", r);
  r = cu->cuDeviceCanAccessPeer(&v, a, b);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuDeviceCanAccessPeer", r);
  *can = v != 0;
  return 0;
}

int tb__cuda_current_device(int *ordinal, tb_cu_context *ctx, char *why,
                            size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_context cur = NULL;
  tb_cu_device d;
  tb_cu_result r;
  int rc;

  rc = tb_cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuCtxGetCurrent(&cur);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuCtxGetCurrent", r);
  if (cur == NULL) {
    tb_why(why, whylen, "no CUDA context is current on this thread");
    return TB_EDEVICE;
  }
  r = cu->cuCtxGetDevice(&d);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuCtxGetDevice", r);
  *ordinal = d;
  if (ctx != NULL)
    *ctx = cur;
  return 0;
}

int tb__cuda_device_enter(int ordinal, struct tb__cuda_devctx *d, char *why,
                          size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_context cur = NULL, ctx;
  tb_cu_device dev, cur_dev;
  tb_cu_result r;
  int n = 0, rc;

  rc = tb_cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuDeviceGetCount(&n);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuDeviceGetCount", r);
  if (ordinal < 0 || ordinal >= n) {
    tb_why(why, whylen,
           "device %d is not among this process's %d visible CUDA devices",
           ordinal, n);
    return TB_EDEVICE;
  }
  r = cu->cuCtxGetCurrent(&cur);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuCtxGetCurrent", r);
  if (cur != NULL) {
    r = cu->cuCtxGetDevice(&cur_dev);
    if (r != 0)
      return tb_cu_fail(why, whylen, "cuCtxGetDevice", r);
    if (cur_dev == ordinal) {
      d->ctx = cur;
      d->prev = cur;
      d->switched = 0;
      return 0;
    }
  }
  r = cu->cuDeviceGet(&dev, ordinal);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuDeviceGet", r);
  rc = tb_primary_ctx(cu, dev, &ctx, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuCtxSetCurrent(ctx);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuCtxSetCurrent", r);
  d->ctx = ctx;
  d->prev = cur;
  /* Nothing was current: leave the device's context current, as the
   * default path does, so the legacy stream means this device later. */
  d->switched = cur != NULL;
  return 0;
}

void tb__cuda_device_leave(const struct tb__cuda_devctx *d) {
  const struct tb_cuda *cu;
  if (d->switched && tb__cuda_load(&cu) == 0)
    cu->cuCtxSetCurrent(d->prev);
}

int tb__cuda_open_mem_here(const uint8_t handle[64], int owner, size_t size,
                           tb_cu_deviceptr *out, int *local, char *why,
                           size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_ipc_mem_handle h;
  tb_cu_deviceptr p = 0, base = 0;
  tb_cu_context cur = NULL, own_ctx = NULL;
  tb_cu_device cur_dev = -1;
  size_t mapped = 0;
  struct tb_export *e;
  tb_cu_result r;
  int rc, mode;

  rc = tb_cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb_need_ctx(cu, "mapping another process's CUDA memory", why, whylen);
  if (rc != 0)
    return rc;
  pthread_mutex_lock(&tb_exports_lock);
  e = tb_export_by_handle(handle);
  if (e != NULL) {
    base = e->base;
    mapped = e->size;
  }
  pthread_mutex_unlock(&tb_exports_lock);
  if (base != 0) {
    if (mapped < size) {
      tb_why(why, whylen,
             "own allocation is %zu bytes, the buffer claims %zu", mapped,
             size);
      return TB_ELAYOUT;
    }
    /* Our own memory used from another device's context: IPC open is
     * refused in-process, so enable peer access to its context. */
    if (cu->cuCtxGetCurrent(&cur) != 0 || cu->cuCtxGetDevice(&cur_dev) != 0)
      return tb_cu_fail(why, whylen, "cuCtxGetDevice", TB_CUDA_ERROR_INVALID_CONTEXT);
    if (cur_dev != owner) {
      if (tb_ptr_ctx(cu, base, &own_ctx) != 0) {
        tb_why(why, whylen, "0x%llx is no longer CUDA memory", base);
        return TB_EDEVICE;
      }
      mode = tb_relaxed_enter(cu);
      r = cu->cuCtxEnablePeerAccess(own_ctx, 0);
      tb_relaxed_leave(cu, mode);
      if (r != 0 && r != TB_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
        if (r == TB_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED) {
          tb_why(why, whylen, "cuCtxEnablePeerAccess: %s: device %d cannot "
                 "reach device %d", tb__cuda_err_name(r), (int)cur_dev, owner);
          return TB_EDEVICE;
        }
        return tb_cu_fail(why, whylen, "cuCtxEnablePeerAccess", r);
      }
    }
    *out = base;
    *local = 1;
    return 0;
  }

  memcpy(h.reserved, handle, 64);
  mode = tb_relaxed_enter(cu);
  r = cu->cuIpcOpenMemHandle(&p, h, TB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  tb_relaxed_leave(cu, mode);
  if (r == TB_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED) {
    tb_why(why, whylen, "cuIpcOpenMemHandle: %s: this device cannot map "
           "memory of the tensor's device", tb__cuda_err_name(r));
    return TB_EDEVICE;
  }
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuIpcOpenMemHandle", r);
  r = cu->cuMemGetAddressRange(&base, &mapped, p);
  if (r != 0 || mapped < size) {
    if (r != 0)
      rc = tb_cu_fail(why, whylen, "cuMemGetAddressRange", r);
    else {
      tb_why(why, whylen, "mapped allocation is %zu bytes, the buffer "
             "claims %zu", mapped, size);
      rc = TB_ELAYOUT;
    }
    mode = tb_relaxed_enter(cu);
    cu->cuIpcCloseMemHandle(p);
    tb_relaxed_leave(cu, mode);
    return rc;
  }
  *out = p;
  *local = 0;
  return 0;
}

int tb__cuda_close_mem_in(tb_cu_context ctx, tb_cu_deviceptr p) {
  const struct tb_cuda *cu;
  struct tb_ctx_saved saved;
  tb_cu_result r;
  int own, mode;

  if (tb__cuda_load(&cu) != 0)
    return TB_ENOCUDA;
  pthread_mutex_lock(&tb_exports_lock);
  own = tb_export_by_base(p) != NULL;
  pthread_mutex_unlock(&tb_exports_lock);
  if (own)
    return 0;
  if (tb_ctx_enter(cu, ctx, &saved, NULL, 0) != 0)
    return TB_ECUDA;
  mode = tb_relaxed_enter(cu);
  r = cu->cuIpcCloseMemHandle(p);
  tb_relaxed_leave(cu, mode);
  tb_ctx_leave(cu, &saved);
  return r == 0 ? 0 : TB_ECUDA;
}

int tb__cuda_stream_device(const struct tb__cuda_stream *s, int *ordinal,
                           char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb_ctx_saved saved;
  tb_cu_device d;
  tb_cu_result r;
  int rc;

  rc = tb_stream_enter(s, NULL, &cu, &saved, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuCtxGetDevice(&d);
  tb_ctx_leave(cu, &saved);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuCtxGetDevice", r);
  *ordinal = d;
  return 0;
}

int tb__cuda_capturing(const struct tb__cuda_stream *s, const char *what,
                       char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb_ctx_saved saved;
  int rc;

  if (s->no_sync)
    return 0;
  rc = tb_stream_enter(s, what, &cu, &saved, why, whylen);
  if (rc >= 0)
    tb_ctx_leave(cu, &saved);
  return rc;
}

/* ---- streams a lease remembers ------------------------------------------ */

int tb__cuda_stream_ident(const struct tb__cuda_stream *s, tb_cu_context *ctx,
                          int *device, char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb_ctx_saved saved;
  tb_cu_context cur = NULL;
  tb_cu_device d;
  tb_cu_result r;
  int rc;

  /* No cuStreamGetId: on a capturing stream the driver refuses it and
   * invalidates the capture (measured on the H200), and on a destroyed
   * one it crashed. */
  rc = tb_stream_enter(s, NULL, &cu, &saved, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuCtxGetCurrent(&cur);
  if (r == 0)
    r = cu->cuCtxGetDevice(&d);
  tb_ctx_leave(cu, &saved);
  if (r != 0)
    return tb_cu_fail(why, whylen, "identifying the stream's device", r);
  *ctx = cur;
  *device = d;
  return 0;
}

/* Create, in ctx, a non-blocking stream (stream not NULL) or else a plain
 * event (timing disabled). Relaxed capture mode: allowed while the
 * application captures a graph. */
static int tb_create_in(tb_cu_context ctx, tb_cu_stream *stream,
                        tb_cu_event *event, char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb_ctx_saved saved;
  tb_cu_result r;
  int rc, mode;

  rc = tb_cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb_ctx_enter(cu, ctx, &saved, why, whylen);
  if (rc != 0)
    return rc;
  mode = tb_relaxed_enter(cu);
  if (stream != NULL)
    r = cu->cuStreamCreate(stream, TB_CU_STREAM_NON_BLOCKING);
  else
    r = cu->cuEventCreate(event, TB_CU_EVENT_DISABLE_TIMING);
  tb_relaxed_leave(cu, mode);
  tb_ctx_leave(cu, &saved);
  if (r != 0)
    return tb_cu_fail(why, whylen,
                      stream != NULL ? "cuStreamCreate" : "cuEventCreate", r);
  return 0;
}

int tb__cuda_stream_create(tb_cu_context ctx, tb_cu_stream *out, char *why,
                           size_t whylen) {
  return tb_create_in(ctx, out, NULL, why, whylen);
}

void tb__cuda_stream_destroy(tb_cu_stream s) {
  const struct tb_cuda *cu;
  int mode;

  if (s == NULL || tb__cuda_load(&cu) != 0)
    return;
  mode = tb_relaxed_enter(cu);
  (void)cu->cuStreamDestroy(s);
  tb_relaxed_leave(cu, mode);
}

int tb__cuda_plain_event_create(tb_cu_context ctx, tb_cu_event *out,
                                char *why, size_t whylen) {
  return tb_create_in(ctx, NULL, out, why, whylen);
}

int tb__cuda_copy_peer(const struct tb__cuda_stream *s, tb_cu_deviceptr src,
                       tb_cu_context sctx, size_t n, tb_cu_deviceptr *dst,
                       tb_cu_context *dctx, int *pooled, tb_cu_event *copied,
                       char *why, size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_context cur = NULL;
  tb_cu_device dev;
  tb_cu_deviceptr p = 0;
  tb_cu_event ev = NULL;
  tb_cu_result r;
  int pools = 0, rc, mode;

  rc = tb_cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb__cuda_capturing(s, "copying the tensor", why, whylen);
  if (rc < 0)
    return rc;
  if (rc == 1) {
    tb_why(why, whylen,
           "TB_ACQUIRE_COPY_TO_DEVICE cannot copy inside a CUDA graph "
           "capture (the copy would belong to the graph); acquire before "
           "capturing, or map the tensor by peer access");
    return TB_ECAPTURE;
  }
  r = cu->cuCtxGetCurrent(&cur);
  if (r != 0 || cur == NULL)
    return tb_cu_fail(why, whylen, "cuCtxGetCurrent",
                      r != 0 ? r : TB_CUDA_ERROR_INVALID_CONTEXT);
  r = cu->cuCtxGetDevice(&dev);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuCtxGetDevice", r);
  if (cu->cuDeviceGetAttribute(&pools,
                               TB_CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
                               dev) != 0)
    pools = 0;
  /* event create and allocation are not stream work */
  mode = tb_relaxed_enter(cu);
  r = cu->cuEventCreate(&ev, TB_CU_EVENT_DISABLE_TIMING);
  tb_relaxed_leave(cu, mode);
  if (r != 0)
    return tb_cu_fail(why, whylen, "cuEventCreate", r);
  if (pools) {
    r = cu->cuMemAllocAsync(&p, n, s->stream);
  } else {
    mode = tb_relaxed_enter(cu);
    r = cu->cuMemAlloc(&p, n);
    tb_relaxed_leave(cu, mode);
  }
  if (r != 0) {
    rc = tb_cu_fail(why, whylen, pools ? "cuMemAllocAsync" : "cuMemAlloc", r);
    goto out_event;
  }
  r = cu->cuMemcpyPeerAsync(p, cur, src, sctx, n, s->stream);
  if (r != 0) {
    rc = tb_cu_fail(why, whylen, "cuMemcpyPeerAsync", r);
    goto out_free;
  }
  r = cu->cuEventRecord(ev, s->stream);
  if (r != 0) {
    rc = tb_cu_fail(why, whylen, "cuEventRecord", r);
    goto out_free;
  }
  *dst = p;
  *dctx = cur;
  *pooled = pools;
  *copied = ev;
  return 0;

out_free:
  if (pools)
    cu->cuMemFreeAsync(p, s->stream);
  else
    cu->cuMemFree(p);
out_event:
  cu->cuEventDestroy(ev);
  return rc;
}

int tb__cuda_free_copy(tb_cu_deviceptr p, tb_cu_context ctx, int pooled,
                       const struct tb__cuda_stream *s) {
  const struct tb_cuda *cu;
  struct tb_ctx_saved saved;
  struct tb__cuda_stream legacy = {TB_CU_STREAM_LEGACY, 0, 0, NULL};
  const struct tb__cuda_stream *use = s;
  tb_cu_result r;
  int cap, mode;

  if (p == 0)
    return 0;
  if (tb__cuda_load(&cu) != 0)
    return TB_ENOCUDA;
  if (tb_ctx_enter(cu, ctx, &saved, NULL, 0) != 0)
    return TB_ECUDA;
  if (use == NULL || use->no_sync)
    use = &legacy;
  cap = pooled ? tb__cuda_capturing(use, "copying the tensor", NULL, 0) : 0;
  if (pooled && cap == 0) {
    r = cu->cuMemFreeAsync(p, use->stream);
  } else {
    /* not pooled, or the stream captures or may not be touched (a free
     * there would become a graph node or invalidate the capture): a plain
     * free, allowed during a capture in relaxed mode */
    mode = tb_relaxed_enter(cu);
    r = cu->cuMemFree(p);
    tb_relaxed_leave(cu, mode);
  }
  tb_ctx_leave(cu, &saved);
  return r == 0 ? 0 : TB_ECUDA;
}
