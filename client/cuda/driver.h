/* SPDX-License-Identifier: Apache-2.0 */
/* Internal: the CUDA driver API, reached through dlopen("libcuda.so.1").
 *
 * libtensorbroker never links CUDA: it declares the few driver types it needs
 * here (from the driver API's published ABI, cuda.h of CUDA 12/13) and looks
 * the functions up at run time, so the same library runs on machines with and
 * without a GPU. tests/unit checks these declarations against cuda.h where
 * the toolkit is installed (tests/gpu/cuda_decls_check.c, a build-time
 * check). */
#ifndef TB_CUDA_DRIVER_H
#define TB_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

typedef int tb_cu_result;                 /* CUresult; 0 = CUDA_SUCCESS */
typedef int tb_cu_device;                 /* CUdevice */
typedef unsigned long long tb_cu_deviceptr; /* CUdeviceptr */
typedef struct tb_cu_ctx_st *tb_cu_context;  /* CUcontext */
typedef struct tb_cu_stream_st *tb_cu_stream; /* CUstream */
typedef struct tb_cu_event_st *tb_cu_event;   /* CUevent */
typedef struct tb_cu_mod_st *tb_cu_module;    /* CUmodule */
typedef struct tb_cu_func_st *tb_cu_function; /* CUfunction */

typedef struct {
  char reserved[64];
} tb_cu_ipc_mem_handle; /* CUipcMemHandle */
typedef struct {
  char reserved[64];
} tb_cu_ipc_event_handle; /* CUipcEventHandle */
typedef struct {
  char bytes[16];
} tb_cu_uuid; /* CUuuid */

/* Constants, with cuda.h's values. */
#define TB_CU_STREAM_LEGACY ((tb_cu_stream)0x1)
#define TB_CU_STREAM_PER_THREAD ((tb_cu_stream)0x2)
#define TB_CU_EVENT_DISABLE_TIMING 0x2
#define TB_CU_EVENT_INTERPROCESS 0x4
#define TB_CU_EVENT_WAIT_DEFAULT 0x0
#define TB_CU_EVENT_WAIT_EXTERNAL 0x1
#define TB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
#define TB_CU_STREAM_CAPTURE_STATUS_NONE 0
#define TB_CU_STREAM_CAPTURE_STATUS_ACTIVE 1
#define TB_CU_STREAM_CAPTURE_STATUS_INVALIDATED 2
#define TB_CU_POINTER_ATTRIBUTE_CONTEXT 1
#define TB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define TB_CU_POINTER_ATTRIBUTE_BUFFER_ID 7
#define TB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define TB_CU_MEMORYTYPE_HOST 1
#define TB_CU_MEMORYTYPE_DEVICE 2
#define TB_CU_EVENT_RECORD_DEFAULT 0x0
#define TB_CU_EVENT_RECORD_EXTERNAL 0x1
#define TB_CU_STREAM_DEFAULT 0x0
#define TB_CU_STREAM_NON_BLOCKING 0x1
#define TB_CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define TB_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define TB_CU_STREAM_CAPTURE_MODE_RELAXED 2
#define TB_CU_MEMORYTYPE_ARRAY 3
#define TB_CU_MEMORYTYPE_UNIFIED 4
/* pinned host memory (kind_pinned.c) */
#define TB_CU_MEMHOSTREGISTER_PORTABLE 0x01
#define TB_CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define TB_CU_MEMHOSTREGISTER_READ_ONLY 0x08
#define TB_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define TB_CU_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define TB_CUDA_SUCCESS 0
#define TB_CUDA_ERROR_INVALID_VALUE 1
#define TB_CUDA_ERROR_NO_DEVICE 100
#define TB_CUDA_ERROR_INVALID_CONTEXT 201
#define TB_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED 217
#define TB_CUDA_ERROR_INVALID_HANDLE 400
#define TB_CUDA_ERROR_NOT_READY 600
#define TB_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED 704
#define TB_CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED 115
#define TB_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define TB_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define TB_CUDA_ERROR_STREAM_CAPTURE_IMPLICIT 906
/* VMM (issue 25): cuMemCreate memory exported as a POSIX descriptor. */
typedef unsigned long long tb_cu_mem_handle; /* CUmemGenericAllocationHandle */
typedef struct {
  int type; /* CUmemLocationType */
  int id;
} tb_cu_mem_location; /* CUmemLocation */
typedef struct {
  int type;                    /* CUmemAllocationType */
  int requested_handle_types;  /* CUmemAllocationHandleType */
  tb_cu_mem_location location;
  void *win32_metadata;
  struct {
    unsigned char compression_type;
    unsigned char gpu_direct_rdma_capable;
    unsigned short usage;
    unsigned char reserved[4];
  } alloc_flags;
} tb_cu_mem_prop; /* CUmemAllocationProp */
typedef struct {
  tb_cu_mem_location location;
  int flags; /* CUmemAccess_flags */
} tb_cu_mem_access; /* CUmemAccessDesc */
#define TB_CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define TB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
#define TB_CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define TB_CU_MEM_ACCESS_FLAGS_PROT_READ 0x1
#define TB_CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define TB_CU_MEM_ALLOC_GRANULARITY_MINIMUM 0x0
#define TB_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 103
/* Signals: 64-bit stream memory operations (client/cuda/signal.c). */
#define TB_CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS 122
#define TB_CU_STREAM_WAIT_VALUE_GEQ 0x0
#define TB_CU_STREAM_WRITE_VALUE_DEFAULT 0x0

/* The driver API version libtensorbroker is written against (CUDA 12.0). */
#define TB_CUDA_API_VERSION 12000

/* The driver functions libtensorbroker (and its GPU tests) use. Each member
 * is resolved with cuGetProcAddress for CUDA 12.0 semantics, so versioned
 * entry points (_v2, _ptsz) are chosen by the driver, not by us. */
struct tb_cuda {
  tb_cu_result (*cuInit)(unsigned flags);
  tb_cu_result (*cuDriverGetVersion)(int *v);
  tb_cu_result (*cuGetErrorName)(tb_cu_result r, const char **s);
  tb_cu_result (*cuGetErrorString)(tb_cu_result r, const char **s);
  tb_cu_result (*cuDeviceGetCount)(int *n);
  tb_cu_result (*cuDeviceGet)(tb_cu_device *d, int ordinal);
  tb_cu_result (*cuDeviceGetUuid)(tb_cu_uuid *u, tb_cu_device d);
  tb_cu_result (*cuDeviceGetAttribute)(int *v, int attr, tb_cu_device d);
  tb_cu_result (*cuDeviceCanAccessPeer)(int *can, tb_cu_device a,
                                        tb_cu_device b);
  tb_cu_result (*cuDevicePrimaryCtxRetain)(tb_cu_context *c, tb_cu_device d);
  tb_cu_result (*cuDevicePrimaryCtxRelease)(tb_cu_device d);
  tb_cu_result (*cuCtxGetCurrent)(tb_cu_context *c);
  tb_cu_result (*cuCtxSetCurrent)(tb_cu_context c);
  tb_cu_result (*cuCtxGetDevice)(tb_cu_device *d);
  tb_cu_result (*cuCtxSynchronize)(void);
  tb_cu_result (*cuPointerGetAttribute)(void *data, int attr,
                                        tb_cu_deviceptr p);
  tb_cu_result (*cuMemGetAddressRange)(tb_cu_deviceptr *base, size_t *size,
                                       tb_cu_deviceptr p);
  tb_cu_result (*cuMemAlloc)(tb_cu_deviceptr *p, size_t size);
  tb_cu_result (*cuMemFree)(tb_cu_deviceptr p);
  tb_cu_result (*cuMemcpyHtoD)(tb_cu_deviceptr dst, const void *src,
                               size_t n);
  tb_cu_result (*cuMemcpyDtoH)(void *dst, tb_cu_deviceptr src, size_t n);
  tb_cu_result (*cuMemcpyDtoDAsync)(tb_cu_deviceptr dst, tb_cu_deviceptr src,
                                    size_t n, tb_cu_stream s);
  tb_cu_result (*cuMemsetD32Async)(tb_cu_deviceptr p, unsigned v, size_t n,
                                   tb_cu_stream s);
  tb_cu_result (*cuIpcGetMemHandle)(tb_cu_ipc_mem_handle *h,
                                    tb_cu_deviceptr p);
  tb_cu_result (*cuIpcOpenMemHandle)(tb_cu_deviceptr *p,
                                     tb_cu_ipc_mem_handle h, unsigned flags);
  tb_cu_result (*cuIpcCloseMemHandle)(tb_cu_deviceptr p);
  tb_cu_result (*cuIpcGetEventHandle)(tb_cu_ipc_event_handle *h,
                                      tb_cu_event e);
  tb_cu_result (*cuIpcOpenEventHandle)(tb_cu_event *e,
                                       tb_cu_ipc_event_handle h);
  tb_cu_result (*cuEventCreate)(tb_cu_event *e, unsigned flags);
  tb_cu_result (*cuEventDestroy)(tb_cu_event e);
  tb_cu_result (*cuEventRecord)(tb_cu_event e, tb_cu_stream s);
  tb_cu_result (*cuEventRecordWithFlags)(tb_cu_event e, tb_cu_stream s,
                                         unsigned flags);
  tb_cu_result (*cuEventQuery)(tb_cu_event e);
  tb_cu_result (*cuEventSynchronize)(tb_cu_event e);
  tb_cu_result (*cuStreamCreate)(tb_cu_stream *s, unsigned flags);
  tb_cu_result (*cuStreamDestroy)(tb_cu_stream s);
  tb_cu_result (*cuStreamSynchronize)(tb_cu_stream s);
  tb_cu_result (*cuStreamWaitEvent)(tb_cu_stream s, tb_cu_event e,
                                    unsigned flags);
  tb_cu_result (*cuStreamIsCapturing)(tb_cu_stream s, int *status);
  tb_cu_result (*cuStreamGetCtx)(tb_cu_stream s, tb_cu_context *c);
  tb_cu_result (*cuStreamBeginCapture)(tb_cu_stream s, int mode);
  tb_cu_result (*cuStreamEndCapture)(tb_cu_stream s, void **graph);
  tb_cu_result (*cuGraphInstantiate)(void **exec, void *graph,
                                     unsigned long long flags);
  tb_cu_result (*cuGraphLaunch)(void *exec, tb_cu_stream s);
  tb_cu_result (*cuGraphExecDestroy)(void *exec);
  tb_cu_result (*cuGraphDestroy)(void *graph);
  tb_cu_result (*cuModuleLoadData)(tb_cu_module *m, const void *image);
  tb_cu_result (*cuModuleGetFunction)(tb_cu_function *f, tb_cu_module m,
                                      const char *name);
  tb_cu_result (*cuLaunchKernel)(tb_cu_function f, unsigned gx, unsigned gy,
                                 unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shmem, tb_cu_stream s,
                                 void **params, void **extra);
  /* Added with the implementation (cuda_driver.c). */
  tb_cu_result (*cuThreadExchangeStreamCaptureMode)(int *mode);
  tb_cu_result (*cuModuleUnload)(tb_cu_module m);
  tb_cu_result (*cuDeviceGetName)(char *name, int len, tb_cu_device d);
  tb_cu_result (*cuStreamQuery)(tb_cu_stream s);
  tb_cu_result (*cuStreamGetFlags)(tb_cu_stream s, unsigned *flags);
  /* Cross-GPU exchange (issue 6). */
  tb_cu_result (*cuCtxEnablePeerAccess)(tb_cu_context peer, unsigned flags);
  tb_cu_result (*cuMemcpyPeerAsync)(tb_cu_deviceptr dst, tb_cu_context dctx,
                                    tb_cu_deviceptr src, tb_cu_context sctx,
                                    size_t n, tb_cu_stream s);
  tb_cu_result (*cuMemAllocAsync)(tb_cu_deviceptr *p, size_t size,
                                  tb_cu_stream s);
  tb_cu_result (*cuMemFreeAsync)(tb_cu_deviceptr p, tb_cu_stream s);
  /* VMM buffers (issue 25, client/cuda/vmm.c). */
  tb_cu_result (*cuMemGetAllocationGranularity)(size_t *g,
                                                const tb_cu_mem_prop *prop,
                                                int option);
  tb_cu_result (*cuMemCreate)(tb_cu_mem_handle *h, size_t size,
                              const tb_cu_mem_prop *prop,
                              unsigned long long flags);
  tb_cu_result (*cuMemRelease)(tb_cu_mem_handle h);
  tb_cu_result (*cuMemExportToShareableHandle)(void *out, tb_cu_mem_handle h,
                                               int type,
                                               unsigned long long flags);
  tb_cu_result (*cuMemImportFromShareableHandle)(tb_cu_mem_handle *h,
                                                 void *os_handle, int type);
  tb_cu_result (*cuMemAddressReserve)(tb_cu_deviceptr *p, size_t size,
                                      size_t align, tb_cu_deviceptr addr,
                                      unsigned long long flags);
  tb_cu_result (*cuMemAddressFree)(tb_cu_deviceptr p, size_t size);
  tb_cu_result (*cuMemMap)(tb_cu_deviceptr p, size_t size, size_t offset,
                           tb_cu_mem_handle h, unsigned long long flags);
  tb_cu_result (*cuMemUnmap)(tb_cu_deviceptr p, size_t size);
  tb_cu_result (*cuMemSetAccess)(tb_cu_deviceptr p, size_t size,
                                 const tb_cu_mem_access *desc, size_t count);
  /* ---- pinned host memory (issue 25, step 2: kind_pinned.c) ---- */
  tb_cu_result (*cuMemHostRegister)(void *p, size_t size, unsigned flags);
  tb_cu_result (*cuMemHostUnregister)(void *p);
  /* ---- signals (issue 25: client/cuda/signal.c) ---- */
  tb_cu_result (*cuStreamWriteValue64)(tb_cu_stream s, tb_cu_deviceptr p,
                                       uint64_t value, unsigned flags);
  tb_cu_result (*cuStreamWaitValue64)(tb_cu_stream s, tb_cu_deviceptr p,
                                      uint64_t value, unsigned flags);
};

/* Load and initialise the driver once per process (thread-safe). On success
 * *out points to the process-wide table. TB_ENOCUDA when libcuda.so.1 is
 * missing, a required symbol is absent, the driver is older than the CUDA
 * 12.0 API, cuInit fails, or no device exists; the reason is kept for
 * tb__cuda_why(). The result is decided once: a process that forked after a
 * successful load must exec before using CUDA (CUDA does not survive fork). */
int tb__cuda_load(const struct tb_cuda **out);

/* 1 when a tb__cuda_load has succeeded in this process; never loads. */
int tb__cuda_loaded(void);

/* 1 when this thread has a CUDA context current, found without being the
 * first to load or initialise the driver: either tb__cuda_load has
 * succeeded, or the application has libcuda.so.1 loaded and a context
 * current (cuCtxGetCurrent, which initialises nothing), in which case the
 * table is loaded now (its cuInit then changes nothing). Else 0. */
int tb__cuda_context_current(void);

/* Why the last load failed (static text), or "" after success. */
const char *tb__cuda_why(void);

/* Name of a CUresult, e.g. "CUDA_ERROR_INVALID_VALUE" (never NULL). */
const char *tb__cuda_err_name(tb_cu_result r);

/* Test and benchmark hook: calls made through selected members, so tests can
 * show that a cache hit made no cuIpcOpenMemHandle call or that a finished
 * version made no cuStreamWaitEvent, and tb-bench can say where a cold
 * acquire's time went (the _ns members: total time inside those calls,
 * CLOCK_MONOTONIC; measured only in the TB_STATS build, stats.h, else 0). */
struct tb_cuda_counters {
  unsigned long ipc_open_mem;
  unsigned long ipc_close_mem;
  unsigned long ipc_open_event;
  unsigned long ipc_get_mem;
  unsigned long event_create;
  unsigned long stream_wait;
  unsigned long event_record;
  unsigned long long ipc_open_mem_ns;
  unsigned long long ipc_open_event_ns;
  unsigned long long stream_wait_ns;
  unsigned long long event_create_ns;
  unsigned long long event_record_ns;
  unsigned long vmm_import; /* cuMemImportFromShareableHandle (issue 25) */
};
void tb__cuda_counters(struct tb_cuda_counters *out);

#endif /* TB_CUDA_DRIVER_H */
