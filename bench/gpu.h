/* SPDX-License-Identifier: Apache-2.0 */
/* tb-bench: CUDA through the project's driver table (client/cuda/driver.h),
 * plus the few driver calls that table does not carry, looked up here.
 * Only ever called in child processes: the parent never initialises CUDA,
 * so it can keep forking CUDA users. */
#ifndef TB_BENCH_GPU_H
#define TB_BENCH_GPU_H

#include "cuda/driver.h"

struct tbb_gpu {
  const struct tb_cuda *cu;
  tb_cu_device dev;
  tb_cu_context ctx;
  tb_cu_stream stream;
  /* Looked up with dlsym; NULL when the driver lacks them. */
  tb_cu_result (*memAllocHost)(void **p, size_t n);
  tb_cu_result (*memFreeHost)(void *p);
  tb_cu_result (*memcpyHtoDAsync)(tb_cu_deviceptr d, const void *s, size_t n,
                                  tb_cu_stream st);
  tb_cu_result (*memcpyDtoHAsync)(void *d, tb_cu_deviceptr s, size_t n,
                                  tb_cu_stream st);
  tb_cu_result (*eventElapsedTime)(float *ms, tb_cu_event a, tb_cu_event b);
};

/* Load the driver, make device 0's primary context current and create a
 * stream. 0 or -1 (with a message on stderr). */
int tbb_gpu_init(struct tbb_gpu *g);
void tbb_gpu_fini(struct tbb_gpu *g);

/* Report a failed driver call on stderr; returns -1. */
int tbb_cu_fail(const struct tbb_gpu *g, const char *what, tb_cu_result r);

#endif
