/* SPDX-License-Identifier: Apache-2.0 */
/* Build-time check: client/cuda/driver.h declares by hand the few driver
 * types, constants and function signatures libtensorbroker uses (it must
 * build without the CUDA toolkit). Where cuda.h is installed, this file
 * checks them against it; a mismatch is a compile error.
 *
 * Each signature is written once as a "shape" macro with its types as
 * parameters, and instantiated twice: with cuda.h's types it must be exactly
 * the type of the function cuda.h declares (the versioned symbol the library
 * resolves), with ours exactly the type of the struct tb_cuda member. The
 * type pairs used in the same positions are checked for equal size and
 * alignment below, so the two signatures are ABI-identical. */
#include <stdint.h>

#include <cuda.h>

#include "cuda/driver.h"

#define SAME(a, b)                                                           \
  _Static_assert(sizeof(a) == sizeof(b) && _Alignof(a) == _Alignof(b),      \
                 #a " and " #b " differ")
#define EQ(a, b) _Static_assert((a) == (b), #a " != " #b)
#define IS(t, u) __builtin_types_compatible_p(t, u)
#define CHECK(member, sym, shape, cu_args, tb_args)                          \
  _Static_assert(IS(__typeof__(&sym), shape cu_args),                        \
                 "cuda.h: " #sym " is not " #shape);                         \
  _Static_assert(IS(__typeof__(((struct tb_cuda *)0)->member), shape tb_args), \
                 "cuda/driver.h: member " #member " is not " #shape)

/* Types used in the same positions. */
SAME(CUresult, tb_cu_result);
SAME(CUdevice, tb_cu_device);
SAME(CUdeviceptr, tb_cu_deviceptr);
SAME(CUcontext, tb_cu_context);
SAME(CUstream, tb_cu_stream);
SAME(CUevent, tb_cu_event);
SAME(CUmodule, tb_cu_module);
SAME(CUfunction, tb_cu_function);
SAME(CUgraph, void *);
SAME(CUgraphExec, void *);
SAME(CUipcMemHandle, tb_cu_ipc_mem_handle);
SAME(CUipcEventHandle, tb_cu_ipc_event_handle);
SAME(CUuuid, tb_cu_uuid);
SAME(CUdevice_attribute, int);
SAME(CUpointer_attribute, int);
SAME(CUstreamCaptureStatus, int);
SAME(CUstreamCaptureMode, int);
SAME(CUmemorytype, unsigned);
SAME(cuuint64_t, uint64_t);
SAME(CUdriverProcAddressQueryResult, int);
_Static_assert(CU_IPC_HANDLE_SIZE == 64, "IPC handle size");
_Static_assert(sizeof(tb_cu_ipc_mem_handle) == CU_IPC_HANDLE_SIZE, "mem h");
_Static_assert(sizeof(tb_cu_ipc_event_handle) == CU_IPC_HANDLE_SIZE, "ev h");

/* Constants. */
EQ(TB_CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING);
EQ(TB_CU_EVENT_INTERPROCESS, CU_EVENT_INTERPROCESS);
EQ(TB_CU_EVENT_WAIT_DEFAULT, CU_EVENT_WAIT_DEFAULT);
EQ(TB_CU_EVENT_WAIT_EXTERNAL, CU_EVENT_WAIT_EXTERNAL);
EQ(TB_CU_EVENT_RECORD_DEFAULT, CU_EVENT_RECORD_DEFAULT);
EQ(TB_CU_EVENT_RECORD_EXTERNAL, CU_EVENT_RECORD_EXTERNAL);
EQ(TB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
EQ(TB_CU_STREAM_DEFAULT, CU_STREAM_DEFAULT);
EQ(TB_CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING);
EQ(TB_CU_STREAM_CAPTURE_STATUS_NONE, CU_STREAM_CAPTURE_STATUS_NONE);
EQ(TB_CU_STREAM_CAPTURE_STATUS_ACTIVE, CU_STREAM_CAPTURE_STATUS_ACTIVE);
EQ(TB_CU_STREAM_CAPTURE_STATUS_INVALIDATED,
   CU_STREAM_CAPTURE_STATUS_INVALIDATED);
EQ(TB_CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL);
EQ(TB_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
EQ(TB_CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_RELAXED);
EQ(TB_CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_CONTEXT);
EQ(TB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
EQ(TB_CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_BUFFER_ID);
EQ(TB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
EQ(TB_CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_HOST);
EQ(TB_CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE);
EQ(TB_CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_ARRAY);
EQ(TB_CU_MEMORYTYPE_UNIFIED, CU_MEMORYTYPE_UNIFIED);
EQ(TB_CUDA_SUCCESS, CUDA_SUCCESS);
EQ(TB_CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE);
EQ(TB_CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE);
EQ(TB_CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT);
EQ(TB_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
EQ(TB_CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE);
EQ(TB_CUDA_ERROR_NOT_READY, CUDA_ERROR_NOT_READY);
EQ(TB_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
   CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
EQ(TB_CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
   CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
EQ(TB_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
EQ(TB_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
EQ(TB_CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
EQ(TB_CUDA_API_VERSION, 12000);

/* Signatures: shape(R, ...) with cuda.h types, then ours. */
#define S_i(R, A) R (*)(A)
#define S_p(R, A) R (*)(A *)
#define S_v(R) R (*)(void)
#define S_pv(R, A, B) R (*)(A *, B)
#define S_vv(R, A, B) R (*)(A, B)
#define S_vvv(R, A, B, C) R (*)(A, B, C)
#define S_vvvv(R, A, B, C, D) R (*)(A, B, C, D)
#define S_pvv(R, A, B, C) R (*)(A *, B, C)
#define S_errname(R, A) R (*)(A, const char **)
#define S_ptrattr(R, A, D) R (*)(void *, A, D)
#define S_range(R, D) R (*)(D *, size_t *, D)
#define S_alloc(R, D) R (*)(D *, size_t)
#define S_htod(R, D) R (*)(D, const void *, size_t)
#define S_dtoh(R, D) R (*)(void *, D, size_t)
#define S_dtod(R, D, S) R (*)(D, D, size_t, S)
#define S_memset(R, D, S) R (*)(D, unsigned int, size_t, S)
#define S_modget(R, F, M) R (*)(F *, M, const char *)
#define S_name(R, D) R (*)(char *, int, D)
#define S_launch(R, F, S)                                                    \
  R (*)(F, unsigned int, unsigned int, unsigned int, unsigned int,           \
        unsigned int, unsigned int, unsigned int, S, void **, void **)
#define S_inst(R, E, G) R (*)(E *, G, unsigned long long)
#define S_peer(R, D, C, S) R (*)(D, C, D, C, size_t, S)
#define S_allocasync(R, D, S) R (*)(D *, size_t, S)

#define CU(...) (CUresult, __VA_ARGS__)
#define TB(...) (tb_cu_result, __VA_ARGS__)

CHECK(cuInit, cuInit, S_i, CU(unsigned int), TB(unsigned));
CHECK(cuDriverGetVersion, cuDriverGetVersion, S_p, CU(int), TB(int));
CHECK(cuGetErrorName, cuGetErrorName, S_errname, CU(CUresult),
      TB(tb_cu_result));
CHECK(cuGetErrorString, cuGetErrorString, S_errname, CU(CUresult),
      TB(tb_cu_result));
CHECK(cuDeviceGetCount, cuDeviceGetCount, S_p, CU(int), TB(int));
CHECK(cuDeviceGet, cuDeviceGet, S_pv, CU(CUdevice, int),
      TB(tb_cu_device, int));
CHECK(cuDeviceGetUuid, cuDeviceGetUuid_v2, S_pv, CU(CUuuid, CUdevice),
      TB(tb_cu_uuid, tb_cu_device));
CHECK(cuDeviceGetAttribute, cuDeviceGetAttribute, S_pvv,
      CU(int, CUdevice_attribute, CUdevice), TB(int, int, tb_cu_device));
CHECK(cuDeviceCanAccessPeer, cuDeviceCanAccessPeer, S_pvv,
      CU(int, CUdevice, CUdevice), TB(int, tb_cu_device, tb_cu_device));
CHECK(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, S_pv,
      CU(CUcontext, CUdevice), TB(tb_cu_context, tb_cu_device));
CHECK(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, S_i,
      CU(CUdevice), TB(tb_cu_device));
CHECK(cuCtxGetCurrent, cuCtxGetCurrent, S_p, CU(CUcontext),
      TB(tb_cu_context));
CHECK(cuCtxSetCurrent, cuCtxSetCurrent, S_i, CU(CUcontext),
      TB(tb_cu_context));
CHECK(cuCtxGetDevice, cuCtxGetDevice, S_p, CU(CUdevice), TB(tb_cu_device));
CHECK(cuCtxSynchronize, cuCtxSynchronize, S_v, (CUresult), (tb_cu_result));
CHECK(cuPointerGetAttribute, cuPointerGetAttribute, S_ptrattr,
      CU(CUpointer_attribute, CUdeviceptr), TB(int, tb_cu_deviceptr));
CHECK(cuMemGetAddressRange, cuMemGetAddressRange_v2, S_range, CU(CUdeviceptr),
      TB(tb_cu_deviceptr));
CHECK(cuMemAlloc, cuMemAlloc_v2, S_alloc, CU(CUdeviceptr),
      TB(tb_cu_deviceptr));
CHECK(cuMemFree, cuMemFree_v2, S_i, CU(CUdeviceptr), TB(tb_cu_deviceptr));
CHECK(cuMemcpyHtoD, cuMemcpyHtoD_v2, S_htod, CU(CUdeviceptr),
      TB(tb_cu_deviceptr));
CHECK(cuMemcpyDtoH, cuMemcpyDtoH_v2, S_dtoh, CU(CUdeviceptr),
      TB(tb_cu_deviceptr));
CHECK(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2, S_dtod,
      CU(CUdeviceptr, CUstream), TB(tb_cu_deviceptr, tb_cu_stream));
CHECK(cuMemsetD32Async, cuMemsetD32Async, S_memset, CU(CUdeviceptr, CUstream),
      TB(tb_cu_deviceptr, tb_cu_stream));
CHECK(cuIpcGetMemHandle, cuIpcGetMemHandle, S_pv,
      CU(CUipcMemHandle, CUdeviceptr),
      TB(tb_cu_ipc_mem_handle, tb_cu_deviceptr));
CHECK(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2, S_pvv,
      CU(CUdeviceptr, CUipcMemHandle, unsigned int),
      TB(tb_cu_deviceptr, tb_cu_ipc_mem_handle, unsigned));
CHECK(cuIpcCloseMemHandle, cuIpcCloseMemHandle, S_i, CU(CUdeviceptr),
      TB(tb_cu_deviceptr));
CHECK(cuIpcGetEventHandle, cuIpcGetEventHandle, S_pv,
      CU(CUipcEventHandle, CUevent), TB(tb_cu_ipc_event_handle, tb_cu_event));
CHECK(cuIpcOpenEventHandle, cuIpcOpenEventHandle, S_pv,
      CU(CUevent, CUipcEventHandle), TB(tb_cu_event, tb_cu_ipc_event_handle));
CHECK(cuEventCreate, cuEventCreate, S_pv, CU(CUevent, unsigned int),
      TB(tb_cu_event, unsigned));
CHECK(cuEventDestroy, cuEventDestroy_v2, S_i, CU(CUevent), TB(tb_cu_event));
CHECK(cuEventRecord, cuEventRecord, S_vv, CU(CUevent, CUstream),
      TB(tb_cu_event, tb_cu_stream));
CHECK(cuEventRecordWithFlags, cuEventRecordWithFlags, S_vvv,
      CU(CUevent, CUstream, unsigned int),
      TB(tb_cu_event, tb_cu_stream, unsigned));
CHECK(cuEventQuery, cuEventQuery, S_i, CU(CUevent), TB(tb_cu_event));
CHECK(cuEventSynchronize, cuEventSynchronize, S_i, CU(CUevent),
      TB(tb_cu_event));
CHECK(cuStreamCreate, cuStreamCreate, S_pv, CU(CUstream, unsigned int),
      TB(tb_cu_stream, unsigned));
CHECK(cuStreamDestroy, cuStreamDestroy_v2, S_i, CU(CUstream),
      TB(tb_cu_stream));
CHECK(cuStreamSynchronize, cuStreamSynchronize, S_i, CU(CUstream),
      TB(tb_cu_stream));
CHECK(cuStreamWaitEvent, cuStreamWaitEvent, S_vvv,
      CU(CUstream, CUevent, unsigned int),
      TB(tb_cu_stream, tb_cu_event, unsigned));
CHECK(cuStreamIsCapturing, cuStreamIsCapturing, S_vv,
      CU(CUstream, CUstreamCaptureStatus *), TB(tb_cu_stream, int *));
CHECK(cuStreamGetCtx, cuStreamGetCtx, S_vv, CU(CUstream, CUcontext *),
      TB(tb_cu_stream, tb_cu_context *));
CHECK(cuStreamBeginCapture, cuStreamBeginCapture_v2, S_vv,
      CU(CUstream, CUstreamCaptureMode), TB(tb_cu_stream, int));
CHECK(cuStreamEndCapture, cuStreamEndCapture, S_vv, CU(CUstream, CUgraph *),
      TB(tb_cu_stream, void **));
CHECK(cuGraphInstantiate, cuGraphInstantiateWithFlags, S_inst,
      CU(CUgraphExec, CUgraph), TB(void *, void *));
CHECK(cuGraphLaunch, cuGraphLaunch, S_vv, CU(CUgraphExec, CUstream),
      TB(void *, tb_cu_stream));
CHECK(cuGraphExecDestroy, cuGraphExecDestroy, S_i, CU(CUgraphExec),
      TB(void *));
CHECK(cuGraphDestroy, cuGraphDestroy, S_i, CU(CUgraph), TB(void *));
CHECK(cuModuleLoadData, cuModuleLoadData, S_pv, CU(CUmodule, const void *),
      TB(tb_cu_module, const void *));
CHECK(cuModuleGetFunction, cuModuleGetFunction, S_modget,
      CU(CUfunction, CUmodule), TB(tb_cu_function, tb_cu_module));
CHECK(cuLaunchKernel, cuLaunchKernel, S_launch, CU(CUfunction, CUstream),
      TB(tb_cu_function, tb_cu_stream));
CHECK(cuThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode,
      S_p, CU(CUstreamCaptureMode), TB(int));
CHECK(cuModuleUnload, cuModuleUnload, S_i, CU(CUmodule), TB(tb_cu_module));
CHECK(cuDeviceGetName, cuDeviceGetName, S_name, CU(CUdevice),
      TB(tb_cu_device));
CHECK(cuStreamQuery, cuStreamQuery, S_i, CU(CUstream), TB(tb_cu_stream));
CHECK(cuStreamGetFlags, cuStreamGetFlags, S_vv, CU(CUstream, unsigned int *),
      TB(tb_cu_stream, unsigned *));
CHECK(cuCtxEnablePeerAccess, cuCtxEnablePeerAccess, S_vv,
      CU(CUcontext, unsigned int), TB(tb_cu_context, unsigned));
CHECK(cuMemcpyPeerAsync, cuMemcpyPeerAsync, S_peer,
      CU(CUdeviceptr, CUcontext, CUstream),
      TB(tb_cu_deviceptr, tb_cu_context, tb_cu_stream));
CHECK(cuMemAllocAsync, cuMemAllocAsync, S_allocasync,
      CU(CUdeviceptr, CUstream), TB(tb_cu_deviceptr, tb_cu_stream));
CHECK(cuMemFreeAsync, cuMemFreeAsync, S_vv, CU(CUdeviceptr, CUstream),
      TB(tb_cu_deviceptr, tb_cu_stream));
/* pinned host memory (issue 25, step 2: kind_pinned.c) */
CHECK(cuMemHostRegister, cuMemHostRegister, S_vvv,
      CU(void *, size_t, unsigned int), TB(void *, size_t, unsigned));
CHECK(cuMemHostUnregister, cuMemHostUnregister, S_i, CU(void *),
      TB(void *));
/* signals (issue 25: signal.c) */
CHECK(cuStreamWriteValue64, cuStreamWriteValue64_v2, S_vvvv,
      CU(CUstream, CUdeviceptr, cuuint64_t, unsigned int),
      TB(tb_cu_stream, tb_cu_deviceptr, uint64_t, unsigned));
CHECK(cuStreamWaitValue64, cuStreamWaitValue64_v2, S_vvvv,
      CU(CUstream, CUdeviceptr, cuuint64_t, unsigned int),
      TB(tb_cu_stream, tb_cu_deviceptr, uint64_t, unsigned));
EQ(TB_CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
   CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS);
EQ(TB_CU_STREAM_WAIT_VALUE_GEQ, CU_STREAM_WAIT_VALUE_GEQ);
EQ(TB_CU_STREAM_WRITE_VALUE_DEFAULT, CU_STREAM_WRITE_VALUE_DEFAULT);
EQ(TB_CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_PORTABLE);
EQ(TB_CU_MEMHOSTREGISTER_DEVICEMAP, CU_MEMHOSTREGISTER_DEVICEMAP);
EQ(TB_CU_MEMHOSTREGISTER_READ_ONLY, CU_MEMHOSTREGISTER_READ_ONLY);
EQ(TB_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
   CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
EQ(TB_CU_ERROR_HOST_MEMORY_NOT_REGISTERED,
   CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);

/* VMM buffers (issue 25): the structs by layout, the constants, the
 * entry points. */
#include <stddef.h>
SAME(CUmemGenericAllocationHandle, tb_cu_mem_handle);
SAME(CUmemLocation, tb_cu_mem_location);
SAME(CUmemAllocationProp, tb_cu_mem_prop);
SAME(CUmemAccessDesc, tb_cu_mem_access);
EQ(offsetof(CUmemAllocationProp, requestedHandleTypes),
   offsetof(tb_cu_mem_prop, requested_handle_types));
EQ(offsetof(CUmemAllocationProp, location), offsetof(tb_cu_mem_prop, location));
EQ(offsetof(CUmemAllocationProp, allocFlags),
   offsetof(tb_cu_mem_prop, alloc_flags));
EQ(offsetof(CUmemAccessDesc, flags), offsetof(tb_cu_mem_access, flags));
EQ(TB_CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_ALLOCATION_TYPE_PINNED);
EQ(TB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
EQ(TB_CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE);
EQ(TB_CU_MEM_ACCESS_FLAGS_PROT_READ, CU_MEM_ACCESS_FLAGS_PROT_READ);
EQ(TB_CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
EQ(TB_CU_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
EQ(TB_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
   CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
#define S_granul(R, P, O) R (*)(size_t *, const P *, O)
#define S_memcreate(R, H, P) R (*)(H *, size_t, const P *, unsigned long long)
#define S_export(R, H, T) R (*)(void *, H, T, unsigned long long)
#define S_import(R, H, T) R (*)(H *, void *, T)
#define S_reserve(R, D)                                                      \
  R (*)(D *, size_t, size_t, D, unsigned long long)
#define S_memmap(R, D, H) R (*)(D, size_t, size_t, H, unsigned long long)
#define S_access(R, D, A) R (*)(D, size_t, const A *, size_t)
CHECK(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity,
      S_granul, CU(CUmemAllocationProp, CUmemAllocationGranularity_flags),
      TB(tb_cu_mem_prop, int));
CHECK(cuMemCreate, cuMemCreate, S_memcreate,
      CU(CUmemGenericAllocationHandle, CUmemAllocationProp),
      TB(tb_cu_mem_handle, tb_cu_mem_prop));
CHECK(cuMemRelease, cuMemRelease, S_i, CU(CUmemGenericAllocationHandle),
      TB(tb_cu_mem_handle));
CHECK(cuMemExportToShareableHandle, cuMemExportToShareableHandle, S_export,
      CU(CUmemGenericAllocationHandle, CUmemAllocationHandleType),
      TB(tb_cu_mem_handle, int));
CHECK(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle,
      S_import, CU(CUmemGenericAllocationHandle, CUmemAllocationHandleType),
      TB(tb_cu_mem_handle, int));
CHECK(cuMemAddressReserve, cuMemAddressReserve, S_reserve, CU(CUdeviceptr),
      TB(tb_cu_deviceptr));
CHECK(cuMemAddressFree, cuMemAddressFree, S_vv, CU(CUdeviceptr, size_t),
      TB(tb_cu_deviceptr, size_t));
CHECK(cuMemMap, cuMemMap, S_memmap,
      CU(CUdeviceptr, CUmemGenericAllocationHandle),
      TB(tb_cu_deviceptr, tb_cu_mem_handle));
CHECK(cuMemUnmap, cuMemUnmap, S_vv, CU(CUdeviceptr, size_t),
      TB(tb_cu_deviceptr, size_t));
CHECK(cuMemSetAccess, cuMemSetAccess, S_access,
      CU(CUdeviceptr, CUmemAccessDesc), TB(tb_cu_deviceptr, tb_cu_mem_access));

/* cuGetProcAddress_v2, which cuda_driver.c declares privately. */
_Static_assert(IS(__typeof__(&cuGetProcAddress_v2),
                  CUresult (*)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *)),
               "cuGetProcAddress_v2");
EQ(CU_GET_PROC_ADDRESS_LEGACY_STREAM, 1);
EQ(CU_GET_PROC_ADDRESS_SUCCESS, 0);

int main(void) {
  /* Pointer-valued constants are not integer constant expressions. */
  if ((uintptr_t)TB_CU_STREAM_LEGACY != (uintptr_t)CU_STREAM_LEGACY ||
      (uintptr_t)TB_CU_STREAM_PER_THREAD != (uintptr_t)CU_STREAM_PER_THREAD)
    return 1;
  return 0;
}
