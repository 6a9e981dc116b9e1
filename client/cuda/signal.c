/* SPDX-License-Identifier: Apache-2.0 */
/* Signals (signal.h): 64-bit words written and waited for by streams, for
 * VMM buffers whose readers cannot open the writer's interprocess events.
 * docs/cuda.md, "Signals". */
#include "signal.h"

#include <string.h>

#include <tensorbroker/tensorbroker.h>

int tb__signal_supported(int device) {
  const struct tb_cuda *cu;
  tb_cu_device dev;
  char why[16];
  int v = 0;

  if (tb__cu_get(&cu, why, sizeof(why)) != 0 ||
      cu->cuDeviceGet(&dev, device) != 0 ||
      cu->cuDeviceGetAttribute(
          &v, TB_CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev) != 0)
    return 0;
  return v != 0;
}

/* Write value to word, or wait until it holds value or more, on s. */
static int memop(const struct tb__cuda_stream *s, tb_cu_deviceptr word,
                 uint64_t value, int wait, char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb__cu_ctx_saved saved;
  tb_cu_result r;
  int rc;

  if (s->no_sync)
    return 0;
  rc = tb__cu_stream_enter(s, wait ? "waiting for a signal" : NULL, &cu,
                           &saved, why, whylen);
  if (rc < 0)
    return rc;
  if (rc == 1) {
    tb__cu_ctx_leave(cu, &saved);
    tb__cu_why(why, whylen, "a stream that captures a CUDA graph cannot "
               "wait for a signal (the graph would wait for this value at "
               "every launch): across PID namespaces or containers, acquire "
               "outside the capture (docs/cuda.md, \"Signals\")");
    return TB_ENOTSUP;
  }
  r = wait ? cu->cuStreamWaitValue64(s->stream, word, value,
                                     TB_CU_STREAM_WAIT_VALUE_GEQ)
           : cu->cuStreamWriteValue64(s->stream, word, value,
                                      TB_CU_STREAM_WRITE_VALUE_DEFAULT);
  tb__cu_ctx_leave(cu, &saved);
  if (r != 0)
    return tb__cu_fail(why, whylen,
                       wait ? "cuStreamWaitValue64" : "cuStreamWriteValue64",
                       r);
  return 0;
}

int tb__signal_write(const struct tb__cuda_stream *s, tb_cu_deviceptr word,
                     uint64_t value, char *why, size_t whylen) {
  return memop(s, word, value, 0, why, whylen);
}

int tb__signal_wait(const struct tb__cuda_stream *s, tb_cu_deviceptr word,
                    uint64_t value, char *why, size_t whylen) {
  return memop(s, word, value, 1, why, whylen);
}

int tb__signal_read(tb_cu_deviceptr word, uint64_t *value, char *why,
                    size_t whylen) {
  const struct tb_cuda *cu;
  tb_cu_result r;
  int rc;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  r = cu->cuMemcpyDtoH(value, word, sizeof(*value));
  return r == 0 ? 0 : tb__cu_fail(why, whylen, "cuMemcpyDtoH", r);
}
