/* SPDX-License-Identifier: Apache-2.0 */
/* The stream contract: what a DLPack stream value means under a
 * connection contract, a stream's context and device, its capture state,
 * and the streams of our own (cuda.h says what each does). */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensorbroker/tensorbroker.h>

#include "cuda.h"

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
      tb__cu_why(why, whylen,
             "this connection's contract is 'explicit': pass the CUstream "
             "that produces or reads the data (or 1 legacy, 2 per-thread, "
             "-1 no sync) instead of NULL");
      return TB_ESTREAM;
    default:
      tb__cu_why(why, whylen, "unknown stream contract %d", contract);
      return TB_EINVAL;
    }
  } else if (v == -1) {
    s.no_sync = 1;
  } else if (v == 1) {
    s.stream = TB_CU_STREAM_LEGACY;
  } else if (v == 2) {
    s.stream = TB_CU_STREAM_PER_THREAD;
  } else if (v < 0) {
    tb__cu_why(why, whylen,
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
      return tb__cu_fail(why, whylen, "cuCtxGetCurrent", r);
    if (ctx == NULL) {
      tb__cu_why(why, whylen,
             "the %s default stream needs a current CUDA context on this "
             "thread; make the device current or pass a CUstream",
             s == TB_CU_STREAM_LEGACY ? "legacy" : "per-thread");
      return TB_ESTREAM;
    }
  } else {
    r = cu->cuStreamGetCtx(s, &ctx);
    if (r != 0) {
      tb__cu_why(why, whylen, "cuStreamGetCtx on the given stream failed: %s "
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
    tb__cu_why(why, whylen,
           "a stream is being captured into a CUDA graph, and %s on the "
           "legacy default stream would invalidate the capture: pass the "
           "capturing stream, or -1 and order the work yourself",
           what);
    return TB_ECAPTURE;
  }
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuStreamIsCapturing", r);
  if (st == TB_CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
    tb__cu_why(why, whylen,
           "the stream's graph capture is already invalidated; end it with "
           "cuStreamEndCapture before %s",
           what);
    return TB_ECAPTURE;
  }
  return st == TB_CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

/* Makes s's context current (saved puts the thread's back): tb__cu_get,
 * tb_stream_ctx and tb__cu_ctx_enter in one. With what, also returns s's
 * capture state as tb_capture_state does (0 or 1), leaving the context
 * again on its error. */
int tb__cu_stream_enter(const struct tb__cuda_stream *s, const char *what,
                           const struct tb_cuda **cu,
                           struct tb__cu_ctx_saved *saved, char *why,
                           size_t whylen) {
  tb_cu_context ctx = NULL;
  int rc;

  rc = tb__cu_get(cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb_stream_ctx(*cu, s, &ctx, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb__cu_ctx_enter(*cu, ctx, saved, why, whylen);
  if (rc != 0 || what == NULL)
    return rc;
  rc = tb_capture_state(*cu, s->stream, what, why, whylen);
  if (rc < 0)
    tb__cu_ctx_leave(*cu, saved);
  return rc;
}

/* Has every operation enqueued on s finished? Only asked of streams
 * created non-blocking: those take no implicit dependency on the legacy
 * stream, so an event recorded on them now would mark exactly this work.
 * The legacy and per-thread streams, and blocking streams, are left to the
 * event's own query after the record. */
int tb__cu_stream_idle(const struct tb_cuda *cu, tb_cu_stream s) {
  unsigned flags = 0;
  if (s == TB_CU_STREAM_LEGACY || s == TB_CU_STREAM_PER_THREAD || s == NULL)
    return 0;
  if (cu->cuStreamGetFlags(s, &flags) != 0 ||
      !(flags & TB_CU_STREAM_NON_BLOCKING))
    return 0;
  return cu->cuStreamQuery(s) == TB_CUDA_SUCCESS;
}

int tb__cuda_capturing(const struct tb__cuda_stream *s, const char *what,
                       char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb__cu_ctx_saved saved;
  int rc;

  if (s->no_sync)
    return 0;
  rc = tb__cu_stream_enter(s, what, &cu, &saved, why, whylen);
  if (rc >= 0)
    tb__cu_ctx_leave(cu, &saved);
  return rc;
}

/* ---- streams a lease remembers ------------------------------------------ */

int tb__cuda_stream_ident(const struct tb__cuda_stream *s, tb_cu_context *ctx,
                          int *device, char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb__cu_ctx_saved saved;
  tb_cu_context cur = NULL;
  tb_cu_device d;
  tb_cu_result r;
  int rc;

  /* No cuStreamGetId: on a capturing stream the driver refuses it and
   * invalidates the capture (measured on the H200), and on a destroyed
   * one it crashed. */
  rc = tb__cu_stream_enter(s, NULL, &cu, &saved, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuCtxGetCurrent(&cur);
  if (r == 0)
    r = cu->cuCtxGetDevice(&d);
  tb__cu_ctx_leave(cu, &saved);
  if (r != 0)
    return tb__cu_fail(why, whylen, "identifying the stream's device", r);
  *ctx = cur;
  *device = d;
  return 0;
}

/* Create, in ctx, a non-blocking stream (stream not NULL) or else a plain
 * event (timing disabled). Relaxed capture mode: allowed while the
 * application captures a graph. */
int tb__cu_create_in(tb_cu_context ctx, tb_cu_stream *stream,
                        tb_cu_event *event, char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb__cu_ctx_saved saved;
  tb_cu_result r;
  int rc, mode;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb__cu_ctx_enter(cu, ctx, &saved, why, whylen);
  if (rc != 0)
    return rc;
  mode = tb__cu_relaxed_enter(cu);
  if (stream != NULL)
    r = cu->cuStreamCreate(stream, TB_CU_STREAM_NON_BLOCKING);
  else
    r = cu->cuEventCreate(event, TB_CU_EVENT_DISABLE_TIMING);
  tb__cu_relaxed_leave(cu, mode);
  tb__cu_ctx_leave(cu, &saved);
  if (r != 0)
    return tb__cu_fail(why, whylen,
                      stream != NULL ? "cuStreamCreate" : "cuEventCreate", r);
  return 0;
}

int tb__cuda_stream_create(tb_cu_context ctx, tb_cu_stream *out, char *why,
                           size_t whylen) {
  return tb__cu_create_in(ctx, out, NULL, why, whylen);
}

void tb__cuda_stream_destroy(tb_cu_stream s) {
  const struct tb_cuda *cu;
  int mode;

  if (s == NULL || tb__cuda_load(&cu) != 0)
    return;
  mode = tb__cu_relaxed_enter(cu);
  (void)cu->cuStreamDestroy(s);
  tb__cu_relaxed_leave(cu, mode);
}
