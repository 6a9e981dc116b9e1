/* SPDX-License-Identifier: Apache-2.0 */
/* Copies across devices (TB_ACQUIRE_COPY_TO_DEVICE): the stream-ordered
 * copy and its free (cuda.h). */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensorbroker/tensorbroker.h>

#include "cuda.h"

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

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb__cuda_capturing(s, "copying the tensor", why, whylen);
  if (rc < 0)
    return rc;
  if (rc == 1) {
    tb__cu_why(why, whylen,
           "TB_ACQUIRE_COPY_TO_DEVICE cannot copy inside a CUDA graph "
           "capture (the copy would belong to the graph); acquire before "
           "capturing, or map the tensor by peer access");
    return TB_ECAPTURE;
  }
  r = cu->cuCtxGetCurrent(&cur);
  if (r != 0 || cur == NULL)
    return tb__cu_fail(why, whylen, "cuCtxGetCurrent",
                      r != 0 ? r : TB_CUDA_ERROR_INVALID_CONTEXT);
  r = cu->cuCtxGetDevice(&dev);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuCtxGetDevice", r);
  if (cu->cuDeviceGetAttribute(&pools,
                               TB_CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
                               dev) != 0)
    pools = 0;
  /* event create and allocation are not stream work */
  mode = tb__cu_relaxed_enter(cu);
  r = cu->cuEventCreate(&ev, TB_CU_EVENT_DISABLE_TIMING);
  tb__cu_relaxed_leave(cu, mode);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuEventCreate", r);
  if (pools) {
    r = cu->cuMemAllocAsync(&p, n, s->stream);
  } else {
    mode = tb__cu_relaxed_enter(cu);
    r = cu->cuMemAlloc(&p, n);
    tb__cu_relaxed_leave(cu, mode);
  }
  if (r != 0) {
    rc = tb__cu_fail(why, whylen, pools ? "cuMemAllocAsync" : "cuMemAlloc", r);
    goto out_event;
  }
  r = cu->cuMemcpyPeerAsync(p, cur, src, sctx, n, s->stream);
  if (r != 0) {
    rc = tb__cu_fail(why, whylen, "cuMemcpyPeerAsync", r);
    goto out_free;
  }
  r = cu->cuEventRecord(ev, s->stream);
  if (r != 0) {
    rc = tb__cu_fail(why, whylen, "cuEventRecord", r);
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
  struct tb__cu_ctx_saved saved;
  struct tb__cuda_stream legacy = {TB_CU_STREAM_LEGACY, 0, 0, NULL};
  const struct tb__cuda_stream *use = s;
  tb_cu_result r;
  int cap, mode;

  if (p == 0)
    return 0;
  if (tb__cuda_load(&cu) != 0)
    return TB_ENOCUDA;
  if (tb__cu_ctx_enter(cu, ctx, &saved, NULL, 0) != 0)
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
    mode = tb__cu_relaxed_enter(cu);
    r = cu->cuMemFree(p);
    tb__cu_relaxed_leave(cu, mode);
  }
  tb__cu_ctx_leave(cu, &saved);
  return r == 0 ? 0 : TB_ECUDA;
}
