/* SPDX-License-Identifier: Apache-2.0 */
/* Events: interprocess events (create, export, open, destroy), plain
 * ones, and recording and waiting, capture-aware (cuda.h). */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensorbroker/tensorbroker.h>

#include "cuda.h"

int tb__cuda_record(tb_cu_event ev, const struct tb__cuda_stream *s,
                    int may_skip, int *complete, int *skipped, char *why,
                    size_t whylen) {
  const struct tb_cuda *cu;
  struct tb__cu_ctx_saved saved;
  tb_cu_result r;
  int rc, idle = 0, mode;

  if (complete != NULL)
    *complete = 0;
  if (skipped != NULL)
    *skipped = 0;
  if (s->no_sync)
    return 0;
  rc = tb__cu_stream_enter(s, "recording the event", &cu, &saved, why, whylen);
  if (rc < 0)
    return rc;
  if (rc == 1) {
    /* Inside a capture a plain record would become an internal node that
     * no other process can observe; EXTERNAL makes the graph record the
     * interprocess event each time it runs. */
    r = cu->cuEventRecordWithFlags(ev, s->stream, TB_CU_EVENT_RECORD_EXTERNAL);
    rc = r == 0 ? 0 : tb__cu_fail(why, whylen, "cuEventRecordWithFlags", r);
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
  mode = complete != NULL ? tb__cu_relaxed_enter(cu) : -1;
  if (complete != NULL)
    idle = tb__cu_stream_idle(cu, s->stream);
  if (idle && may_skip) {
    *complete = 1;
    if (skipped != NULL)
      *skipped = 1;
    rc = 0;
  } else {
    r = cu->cuEventRecord(ev, s->stream);
    rc = r == 0 ? 0 : tb__cu_fail(why, whylen, "cuEventRecord", r);
    if (rc == 0 && complete != NULL)
      *complete = idle || cu->cuEventQuery(ev) == TB_CUDA_SUCCESS;
  }
  tb__cu_relaxed_leave(cu, mode);
out_leave:
  tb__cu_ctx_leave(cu, &saved);
  return rc;
}

int tb__cuda_event_done(tb_cu_event ev, tb_cu_context ctx) {
  const struct tb_cuda *cu;
  struct tb__cu_ctx_saved saved;
  int done, mode;

  if (tb__cuda_load(&cu) != 0 ||
      tb__cu_ctx_enter(cu, ctx, &saved, NULL, 0) != 0)
    return 0;
  mode = tb__cu_relaxed_enter(cu);
  done = cu->cuEventQuery(ev) == TB_CUDA_SUCCESS;
  tb__cu_relaxed_leave(cu, mode);
  tb__cu_ctx_leave(cu, &saved);
  return done;
}

int tb__cuda_wait(const struct tb__cuda_stream *s, tb_cu_event ev, char *why,
                  size_t whylen) {
  const struct tb_cuda *cu;
  struct tb__cu_ctx_saved saved;
  tb_cu_result r;
  int rc;

  if (s->no_sync)
    return 0;
  rc = tb__cu_stream_enter(s, "waiting for the producer's event", &cu, &saved,
                       why, whylen);
  if (rc < 0)
    return rc;
  /* Capturing: a plain wait on an event recorded outside the capture is
   * refused and invalidates it (measured); the EXTERNAL wait becomes a
   * node that waits for the event's latest record when the graph runs. */
  r = cu->cuStreamWaitEvent(s->stream, ev,
                            rc == 1 ? TB_CU_EVENT_WAIT_EXTERNAL
                                    : TB_CU_EVENT_WAIT_DEFAULT);
  rc = r == 0 ? 0 : tb__cu_fail(why, whylen, "cuStreamWaitEvent", r);
  tb__cu_ctx_leave(cu, &saved);
  return rc;
}

/* ---- events ------------------------------------------------------------- */

int tb__cu_need_ctx(const struct tb_cuda *cu, const char *what, char *why,
                       size_t whylen) {
  tb_cu_context cur = NULL;
  tb_cu_result r = cu->cuCtxGetCurrent(&cur);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuCtxGetCurrent", r);
  if (cur == NULL) {
    tb__cu_why(why, whylen, "%s needs a current CUDA context on this thread",
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

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb__cu_need_ctx(cu, "creating an interprocess event", why, whylen);
  if (rc != 0)
    return rc;
  mode = tb__cu_relaxed_enter(cu);
  r = cu->cuEventCreate(&ev,
                        TB_CU_EVENT_INTERPROCESS | TB_CU_EVENT_DISABLE_TIMING);
  if (r != 0) {
    rc = tb__cu_fail(why, whylen, "cuEventCreate", r);
    goto out_mode;
  }
  r = cu->cuIpcGetEventHandle(&h, ev);
  if (r != 0) {
    rc = tb__cu_fail(why, whylen, "cuIpcGetEventHandle", r);
    goto out_destroy;
  }
  tb__cu_relaxed_leave(cu, mode);
  memcpy(handle, h.reserved, 64);
  *out = ev;
  return 0;

out_destroy:
  cu->cuEventDestroy(ev);
out_mode:
  tb__cu_relaxed_leave(cu, mode);
  return rc;
}

int tb__cuda_event_open(const uint8_t handle[64], tb_cu_event *out, char *why,
                        size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_ipc_event_handle h;
  tb_cu_event ev = NULL;
  tb_cu_result r;
  int rc, mode;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb__cu_need_ctx(cu, "opening an interprocess event", why, whylen);
  if (rc != 0)
    return rc;
  memcpy(h.reserved, handle, 64);
  mode = tb__cu_relaxed_enter(cu);
  r = cu->cuIpcOpenEventHandle(&ev, h);
  tb__cu_relaxed_leave(cu, mode);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuIpcOpenEventHandle", r);
  *out = ev;
  return 0;
}

void tb__cuda_event_destroy(tb_cu_event e) {
  const struct tb_cuda *cu;
  if (e == NULL || tb__cuda_load(&cu) != 0)
    return;
  int mode = tb__cu_relaxed_enter(cu);
  cu->cuEventDestroy(e);
  tb__cu_relaxed_leave(cu, mode);
}

int tb__cuda_plain_event_create(tb_cu_context ctx, tb_cu_event *out,
                                char *why, size_t whylen) {
  return tb__cu_create_in(ctx, NULL, out, why, whylen);
}
