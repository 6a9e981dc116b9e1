/* SPDX-License-Identifier: Apache-2.0 */
/* The few CUDA driver functions the examples use, loaded at run time with
 * dlopen("libcuda.so.1"), so the examples build without the CUDA toolkit
 * and run (host memory) on machines without a GPU. This is application
 * code, as a user of tensorbroker would write it; it does not use the
 * library's internal headers.
 *
 * The types below stand in for cuda.h's, with the same sizes and meaning
 * (cuda_loader_check.c compares them with cuda.h where it is installed). */
#ifndef TB_EXAMPLE_CUDA_LOADER_H
#define TB_EXAMPLE_CUDA_LOADER_H

#include <stddef.h>

typedef int cudl_result;                      /* CUresult; 0 = CUDA_SUCCESS */
typedef int cudl_device;                      /* CUdevice */
typedef unsigned long long cudl_deviceptr;    /* CUdeviceptr */
typedef struct cudl_ctx_st *cudl_context;     /* CUcontext (opaque) */
typedef struct cudl_stream_st *cudl_stream;   /* CUstream (opaque) */

#define CUDL_SUCCESS 0
#define CUDL_STREAM_NON_BLOCKING 0x1u        /* CU_STREAM_NON_BLOCKING */

/* Driver entry points, resolved by their versioned symbol names (the ones
 * cuda.h's macros select for the CUDA 12 API with the legacy default
 * stream). */
struct cudl {
  void *lib; /* dlopen handle; NULL until cudl_open() succeeded */
  cudl_device device;
  cudl_context ctx; /* the device's primary context, retained */

  cudl_result (*init)(unsigned int flags);                     /* cuInit */
  cudl_result (*device_get_count)(int *count);       /* cuDeviceGetCount */
  cudl_result (*device_get)(cudl_device *dev, int ordinal); /* cuDeviceGet */
  cudl_result (*primary_ctx_retain)(cudl_context *ctx,
                                    cudl_device dev); /* cuDevicePrimaryCtxRetain */
  cudl_result (*primary_ctx_release)(cudl_device dev);
                                              /* cuDevicePrimaryCtxRelease_v2 */
  cudl_result (*ctx_set_current)(cudl_context ctx);   /* cuCtxSetCurrent */
  cudl_result (*stream_create)(cudl_stream *stream,
                               unsigned int flags);    /* cuStreamCreate */
  cudl_result (*stream_synchronize)(cudl_stream s); /* cuStreamSynchronize */
  cudl_result (*stream_destroy)(cudl_stream s);     /* cuStreamDestroy_v2 */
  cudl_result (*mem_alloc)(cudl_deviceptr *dptr, size_t bytes);
                                                     /* cuMemAlloc_v2 */
  cudl_result (*mem_free)(cudl_deviceptr dptr);     /* cuMemFree_v2 */
  cudl_result (*memcpy_htod_async)(cudl_deviceptr dst, const void *src,
                                   size_t bytes, cudl_stream s);
                                                /* cuMemcpyHtoDAsync_v2 */
  cudl_result (*memcpy_dtoh_async)(void *dst, cudl_deviceptr src,
                                   size_t bytes, cudl_stream s);
                                                /* cuMemcpyDtoHAsync_v2 */
  cudl_result (*get_error_name)(cudl_result err,
                                const char **name); /* cuGetErrorName */
};

/* Load the driver, resolve the functions above, cuInit(0), and make the
 * primary context of device ordinal `device` current on the calling
 * thread. Returns 0, or -1 with the reason ("libcuda.so.1: cannot open
 * shared object file...", "cuInit: CUDA_ERROR_NO_DEVICE") written into
 * why (NUL-terminated, truncated to len); *cu is then left unloaded. */
int cudl_open(struct cudl *cu, int device, char *why, size_t len);

/* Release the primary context retained by cudl_open(). The driver library
 * stays loaded (unloading libcuda while others in the process may still use
 * it is not safe). Accepts a struct never opened or already closed. */
void cudl_close(struct cudl *cu);

/* "CUDA_ERROR_OUT_OF_MEMORY" for err; "unknown CUDA error" when the driver
 * is not loaded or does not know the code. Static storage. */
const char *cudl_error_name(const struct cudl *cu, cudl_result err);

#endif
