/* SPDX-License-Identifier: Apache-2.0 */
/* Build-time check of cuda_loader.h against the real cuda.h, compiled only
 * where the CUDA toolkit's headers are installed (examples/CMakeLists.txt).
 * A mismatch is a compile error; nothing here runs.
 *
 * Each signature is written once as a shape with its types as parameters
 * and instantiated twice: with cuda.h's types it must be exactly the type
 * of the versioned symbol cuda_loader.c resolves, with ours exactly the
 * type of the struct cudl member. The types used in the same positions are
 * checked for equal size and alignment, so the two are ABI-identical. */
#include <stddef.h>

#include <cuda.h>

#include "cuda_loader.h"

#define SAME(a, b)                                                          \
  _Static_assert(sizeof(a) == sizeof(b) && _Alignof(a) == _Alignof(b),     \
                 #a " and " #b " differ")
#define IS(t, u) __builtin_types_compatible_p(t, u)
#define CHECK(member, sym, shape, cu_args, our_args)                        \
  _Static_assert(IS(__typeof__(&sym), shape cu_args),                       \
                 "cuda.h: " #sym " is not " #shape);                        \
  _Static_assert(IS(__typeof__(((struct cudl *)0)->member), shape our_args), \
                 "cuda_loader.h: member " #member " is not " #shape)

SAME(CUresult, cudl_result);
SAME(CUdevice, cudl_device);
SAME(CUdeviceptr, cudl_deviceptr);
SAME(CUcontext, cudl_context);
SAME(CUstream, cudl_stream);
_Static_assert(CUDA_SUCCESS == CUDL_SUCCESS, "CUDA_SUCCESS");
_Static_assert(CU_STREAM_NON_BLOCKING == CUDL_STREAM_NON_BLOCKING,
               "CU_STREAM_NON_BLOCKING");
_Static_assert(CUDA_VERSION >= 12000, "checked against a CUDA 12+ cuda.h");

/* R result, D device, P device pointer, C context, S stream */
#define S_INIT(R, D, P, C, S) R (*)(unsigned int)
#define S_COUNT(R, D, P, C, S) R (*)(int *)
#define S_DEVGET(R, D, P, C, S) R (*)(D *, int)
#define S_RETAIN(R, D, P, C, S) R (*)(C *, D)
#define S_RELEASE(R, D, P, C, S) R (*)(D)
#define S_SETCUR(R, D, P, C, S) R (*)(C)
#define S_SCREATE(R, D, P, C, S) R (*)(S *, unsigned int)
#define S_STREAM(R, D, P, C, S) R (*)(S)
#define S_ALLOC(R, D, P, C, S) R (*)(P *, size_t)
#define S_FREE(R, D, P, C, S) R (*)(P)
#define S_HTOD(R, D, P, C, S) R (*)(P, const void *, size_t, S)
#define S_DTOH(R, D, P, C, S) R (*)(void *, P, size_t, S)
#define S_ERRNAME(R, D, P, C, S) R (*)(R, const char **)

#define CU (CUresult, CUdevice, CUdeviceptr, CUcontext, CUstream)
#define OURS (cudl_result, cudl_device, cudl_deviceptr, cudl_context, cudl_stream)

CHECK(init, cuInit, S_INIT, CU, OURS);
CHECK(device_get_count, cuDeviceGetCount, S_COUNT, CU, OURS);
CHECK(device_get, cuDeviceGet, S_DEVGET, CU, OURS);
CHECK(primary_ctx_retain, cuDevicePrimaryCtxRetain, S_RETAIN, CU, OURS);
CHECK(primary_ctx_release, cuDevicePrimaryCtxRelease_v2, S_RELEASE, CU, OURS);
CHECK(ctx_set_current, cuCtxSetCurrent, S_SETCUR, CU, OURS);
CHECK(stream_create, cuStreamCreate, S_SCREATE, CU, OURS);
CHECK(stream_synchronize, cuStreamSynchronize, S_STREAM, CU, OURS);
CHECK(stream_destroy, cuStreamDestroy_v2, S_STREAM, CU, OURS);
CHECK(mem_alloc, cuMemAlloc_v2, S_ALLOC, CU, OURS);
CHECK(mem_free, cuMemFree_v2, S_FREE, CU, OURS);
CHECK(memcpy_htod_async, cuMemcpyHtoDAsync_v2, S_HTOD, CU, OURS);
CHECK(memcpy_dtoh_async, cuMemcpyDtoHAsync_v2, S_DTOH, CU, OURS);
CHECK(get_error_name, cuGetErrorName, S_ERRNAME, CU, OURS);

/* An object file needs something in it. */
int cudl_check_done(void);
int cudl_check_done(void) { return 0; }
