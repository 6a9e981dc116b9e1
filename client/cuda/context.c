/* SPDX-License-Identifier: Apache-2.0 */
/* Contexts and capture mode: making a context current for a call and
 * restoring the previous one, RELAXED capture mode around calls that are not
 * stream work, primary contexts, devices by ordinal and by UUID, and the
 * cross-GPU decision (cuda.h says what each does). */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensorbroker/tensorbroker.h>

#include "cuda.h"

/* ---- current-context switching ------------------------------------------ */

int tb__cu_ctx_enter(const struct tb_cuda *cu, tb_cu_context want,
                        struct tb__cu_ctx_saved *saved, char *why,
                        size_t whylen) {
  tb_cu_context cur = NULL;
  tb_cu_result r = cu->cuCtxGetCurrent(&cur);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuCtxGetCurrent", r);
  saved->prev = cur;
  saved->switched = 0;
  if (want == NULL || want == cur)
    return 0;
  r = cu->cuCtxSetCurrent(want);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuCtxSetCurrent", r);
  saved->switched = 1;
  return 0;
}

void tb__cu_ctx_leave(const struct tb_cuda *cu,
                         const struct tb__cu_ctx_saved *saved) {
  if (saved->switched)
    cu->cuCtxSetCurrent(saved->prev);
}

/* ---- capture mode ------------------------------------------------------- */

int tb__cu_relaxed_enter(const struct tb_cuda *cu) {
  int mode = TB_CU_STREAM_CAPTURE_MODE_RELAXED;
  if (cu->cuThreadExchangeStreamCaptureMode(&mode) != 0)
    return -1;
  return mode;
}

void tb__cu_relaxed_leave(const struct tb_cuda *cu, int saved) {
  if (saved >= 0)
    cu->cuThreadExchangeStreamCaptureMode(&saved);
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
      return tb__cu_fail(why, whylen, "cuDevicePrimaryCtxRetain", r);
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
    return tb__cu_fail(why, whylen, "cuDeviceGetCount", r);
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

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = tb__cuda_find_uuid(uuid, &found, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuDeviceGet(&dev, found);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuDeviceGet", r);

  r = cu->cuCtxGetCurrent(&cur);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuCtxGetCurrent", r);
  if (cur == NULL) {
    rc = tb_primary_ctx(cu, dev, &ctx, why, whylen);
    if (rc != 0)
      return rc;
    r = cu->cuCtxSetCurrent(ctx);
    if (r != 0)
      return tb__cu_fail(why, whylen, "cuCtxSetCurrent", r);
    cur = ctx;
    cur_dev = dev;
  } else {
    /* The mapping goes into the current context; its device must be able
     * to reach the memory's device. */
    r = cu->cuCtxGetDevice(&cur_dev);
    if (r != 0)
      return tb__cu_fail(why, whylen, "cuCtxGetDevice", r);
    if (cur_dev != dev) {
      int can = 0;
      r = cu->cuDeviceCanAccessPeer(&can, cur_dev, dev);
      if (r != 0)
        return tb__cu_fail(why, whylen, "cuDeviceCanAccessPeer", r);
      if (!can) {
        tb_uuid_text(uuid, text, sizeof text);
        tb__cu_why(why, whylen,
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

/* ---- cross-GPU exchange ------------------------------------------------- */

void tb__cuda_uuid_text(const uint8_t uuid[16], char *buf, size_t len) {
  tb_uuid_text(uuid, buf, len);
}

int tb__cuda_find_uuid(const uint8_t uuid[16], int *ordinal, char *why,
                       size_t whylen) {
  const struct tb_cuda *cu;
  char text[48];
  int n = 0, found = -1, rc;

  rc = tb__cu_get(&cu, why, whylen);
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
  tb__cu_why(why, whylen,
         "the tensor lives on %s, which is not among this process's %d "
         "visible CUDA devices (check CUDA_VISIBLE_DEVICES)",
         text, n);
  return TB_EDEVICE;
}

/* 0 when ordinal names one of this process's visible devices, else
 * TB_EDEVICE (or the driver's failure) with why. */
static int ordinal_visible(const struct tb_cuda *cu, int ordinal, char *why,
                           size_t whylen) {
  tb_cu_result r;
  int n = 0;

  r = cu->cuDeviceGetCount(&n);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuDeviceGetCount", r);
  if (ordinal < 0 || ordinal >= n) {
    tb__cu_why(why, whylen,
           "device %d is not among this process's %d visible CUDA devices",
           ordinal, n);
    return TB_EDEVICE;
  }
  return 0;
}

int tb__cuda_device_uuid(int ordinal, uint8_t uuid[16], char *why,
                         size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_device dev;
  tb_cu_uuid u;
  tb_cu_result r;
  int n = 0, rc;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  pthread_mutex_lock(&tb_uuid_lock);
  n = tb_uuid_count;
  if (ordinal >= 0 && ordinal < n)
    memcpy(uuid, tb_uuid_tab[ordinal], 16);
  pthread_mutex_unlock(&tb_uuid_lock);
  if (ordinal >= 0 && ordinal < n)
    return 0;
  rc = ordinal_visible(cu, ordinal, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuDeviceGet(&dev, ordinal);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuDeviceGet", r);
  r = cu->cuDeviceGetUuid(&u, dev);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuDeviceGetUuid", r);
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
  tb__cu_why(why, whylen,
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

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuDeviceGet(&a, consumer);
  if (r == 0)
    r = cu->cuDeviceGet(&b, owner);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuDeviceGet", r);
  r = cu->cuDeviceCanAccessPeer(&v, a, b);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuDeviceCanAccessPeer", r);
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

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuCtxGetCurrent(&cur);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuCtxGetCurrent", r);
  if (cur == NULL) {
    tb__cu_why(why, whylen, "no CUDA context is current on this thread");
    return TB_EDEVICE;
  }
  r = cu->cuCtxGetDevice(&d);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuCtxGetDevice", r);
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
  int rc;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  rc = ordinal_visible(cu, ordinal, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuCtxGetCurrent(&cur);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuCtxGetCurrent", r);
  if (cur != NULL) {
    r = cu->cuCtxGetDevice(&cur_dev);
    if (r != 0)
      return tb__cu_fail(why, whylen, "cuCtxGetDevice", r);
    if (cur_dev == ordinal) {
      d->ctx = cur;
      d->prev = cur;
      d->switched = 0;
      return 0;
    }
  }
  r = cu->cuDeviceGet(&dev, ordinal);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuDeviceGet", r);
  rc = tb_primary_ctx(cu, dev, &ctx, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuCtxSetCurrent(ctx);
  if (r != 0)
    return tb__cu_fail(why, whylen, "cuCtxSetCurrent", r);
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
