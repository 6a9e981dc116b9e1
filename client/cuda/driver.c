/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA driver API, loaded at run time (see driver.h).
 *
 * libcuda.so.1 is opened once per process with dlopen. Each member of
 * struct tb_cuda is resolved with cuGetProcAddress_v2 for the CUDA 12.0 API,
 * so the driver picks the ABI-compatible versioned entry point (cuMemAlloc ->
 * cuMemAlloc_v2, cuStreamBeginCapture -> its _v2, cuStreamGetCtx -> the
 * 12.0 one, not the 12.5 _v2 that takes a green context). Where
 * cuGetProcAddress_v2 is absent or refuses a symbol we fall back to dlsym
 * with the versioned name cuda.h would have bound at compile time.
 *
 * A few members go through counting (and, for the costly ones, timing)
 * trampolines, so tests can show that a cache hit made no driver call and
 * tb-bench can say where a cold acquire's time went. A trampoline costs two
 * clock reads (~50 ns) on calls that take microseconds. */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <tensorbroker/tensorbroker.h>

#include "cuda.h"

/* cuGetProcAddress_v2 (CUDA 12.0+), cuda.h:
 *   CUresult cuGetProcAddress_v2(const char *symbol, void **pfn,
 *       int cudaVersion, cuuint64_t flags,
 *       CUdriverProcAddressQueryResult *symbolStatus); */
typedef tb_cu_result (*tb_cu_get_proc_fn)(const char *symbol, void **pfn,
                                          int cuda_version, uint64_t flags,
                                          int *status);
/* CU_GET_PROC_ADDRESS_LEGACY_STREAM: the entry points without _ptsz/_ptds,
 * the same ones dlsym of the plain names gives. (DEFAULT means the same for
 * code not built with per-thread default streams; we say it explicitly so
 * the choice never depends on how the caller was compiled.) We never pass
 * the NULL stream anyway: TB_CU_STREAM_LEGACY and TB_CU_STREAM_PER_THREAD
 * are explicit handles. */
#define TB_CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define TB_CU_GET_PROC_ADDRESS_SUCCESS 0

struct tb_cuda_sym {
  size_t off;        /* offset of the member in struct tb_cuda */
  const char *base;  /* name for cuGetProcAddress (no version suffix) */
  const char *dlsym; /* versioned name for the dlsym fallback */
};

#define SYM(member, base, versioned) \
  { offsetof(struct tb_cuda, member), base, versioned }
#define SYM1(member) SYM(member, #member, #member)

static const struct tb_cuda_sym tb_cuda_syms[] = {
    SYM1(cuInit),
    SYM1(cuDriverGetVersion),
    SYM1(cuGetErrorName),
    SYM1(cuGetErrorString),
    SYM1(cuDeviceGetCount),
    SYM1(cuDeviceGet),
    SYM(cuDeviceGetUuid, "cuDeviceGetUuid", "cuDeviceGetUuid_v2"),
    SYM1(cuDeviceGetAttribute),
    SYM1(cuDeviceCanAccessPeer),
    SYM1(cuDevicePrimaryCtxRetain),
    SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease",
        "cuDevicePrimaryCtxRelease_v2"),
    SYM1(cuCtxGetCurrent),
    SYM1(cuCtxSetCurrent),
    SYM1(cuCtxGetDevice),
    SYM1(cuCtxSynchronize),
    SYM1(cuPointerGetAttribute),
    SYM(cuMemGetAddressRange, "cuMemGetAddressRange",
        "cuMemGetAddressRange_v2"),
    SYM(cuMemAlloc, "cuMemAlloc", "cuMemAlloc_v2"),
    SYM(cuMemFree, "cuMemFree", "cuMemFree_v2"),
    SYM(cuMemcpyHtoD, "cuMemcpyHtoD", "cuMemcpyHtoD_v2"),
    SYM(cuMemcpyDtoH, "cuMemcpyDtoH", "cuMemcpyDtoH_v2"),
    SYM(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync", "cuMemcpyDtoDAsync_v2"),
    SYM1(cuMemsetD32Async),
    SYM1(cuIpcGetMemHandle),
    SYM(cuIpcOpenMemHandle, "cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2"),
    SYM1(cuIpcCloseMemHandle),
    SYM1(cuIpcGetEventHandle),
    SYM1(cuIpcOpenEventHandle),
    SYM1(cuEventCreate),
    SYM(cuEventDestroy, "cuEventDestroy", "cuEventDestroy_v2"),
    SYM1(cuEventRecord),
    SYM1(cuEventRecordWithFlags),
    SYM1(cuEventQuery),
    SYM1(cuEventSynchronize),
    SYM1(cuStreamCreate),
    SYM(cuStreamDestroy, "cuStreamDestroy", "cuStreamDestroy_v2"),
    SYM1(cuStreamSynchronize),
    SYM1(cuStreamWaitEvent),
    SYM1(cuStreamIsCapturing),
    SYM1(cuStreamGetCtx),
    SYM(cuStreamBeginCapture, "cuStreamBeginCapture",
        "cuStreamBeginCapture_v2"),
    SYM1(cuStreamEndCapture),
    /* cuda.h maps cuGraphInstantiate to cuGraphInstantiateWithFlags (the
     * 12.0 signature); ask for that one by its own name. */
    SYM(cuGraphInstantiate, "cuGraphInstantiateWithFlags",
        "cuGraphInstantiateWithFlags"),
    SYM1(cuGraphLaunch),
    SYM1(cuGraphExecDestroy),
    SYM1(cuGraphDestroy),
    SYM1(cuModuleLoadData),
    SYM1(cuModuleGetFunction),
    SYM1(cuLaunchKernel),
    SYM1(cuThreadExchangeStreamCaptureMode),
    SYM1(cuModuleUnload),
    SYM1(cuDeviceGetName),
    SYM1(cuStreamQuery),
    SYM1(cuStreamGetFlags),
    SYM1(cuCtxEnablePeerAccess),
    SYM1(cuMemcpyPeerAsync),
    SYM1(cuMemAllocAsync),
    SYM1(cuMemFreeAsync),
    /* VMM buffers (issue 25) */
    SYM1(cuMemGetAllocationGranularity),
    SYM1(cuMemCreate),
    SYM1(cuMemRelease),
    SYM1(cuMemExportToShareableHandle),
    SYM1(cuMemImportFromShareableHandle),
    SYM1(cuMemAddressReserve),
    SYM1(cuMemAddressFree),
    SYM1(cuMemMap),
    SYM1(cuMemUnmap),
    SYM1(cuMemSetAccess),
    /* pinned host memory (issue 25, step 2: kind_pinned.c) */
    SYM(cuMemHostRegister, "cuMemHostRegister", "cuMemHostRegister_v2"),
    SYM1(cuMemHostUnregister),
    /* signals (issue 25: signal.c) */
    SYM(cuStreamWriteValue64, "cuStreamWriteValue64",
        "cuStreamWriteValue64_v2"),
    SYM(cuStreamWaitValue64, "cuStreamWaitValue64", "cuStreamWaitValue64_v2"),
};

static pthread_once_t tb_cuda_once = PTHREAD_ONCE_INIT;
static int tb_cuda_rc = TB_ENOCUDA;
static atomic_int tb_cuda_up; /* 1 once a load has succeeded */
static char tb_cuda_reason[256] = "CUDA driver not loaded yet";
static struct tb_cuda tb_cuda_real; /* what the driver gave us */
static struct tb_cuda tb_cuda_tab;  /* what callers get: real + trampolines */

static atomic_ulong tb_cnt_open_mem, tb_cnt_close_mem, tb_cnt_open_event,
    tb_cnt_get_mem, tb_cnt_event_create, tb_cnt_stream_wait,
    tb_cnt_event_record;
static atomic_ullong tb_ns_open_mem, tb_ns_open_event, tb_ns_stream_wait,
    tb_ns_event_create, tb_ns_event_record;

/* The calls are counted in every build (tests read the counts); their
 * time only in the TB_STATS build tb-bench links (stats.h): elsewhere no
 * clock is read around a driver call. */
#ifdef TB_STATS
static unsigned long long tb_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (unsigned long long)ts.tv_sec * 1000000000ull +
         (unsigned long long)ts.tv_nsec;
}

/* Count a call and add the time since t0 (taken before it) to *ns. */
static tb_cu_result tb_timed(atomic_ulong *cnt, atomic_ullong *ns,
                             unsigned long long t0, tb_cu_result r) {
  atomic_fetch_add(ns, tb_now_ns() - t0);
  atomic_fetch_add(cnt, 1);
  return r;
}
#else
static unsigned long long tb_now_ns(void) { return 0; }

static tb_cu_result tb_timed(atomic_ulong *cnt, atomic_ullong *ns,
                             unsigned long long t0, tb_cu_result r) {
  (void)ns, (void)t0;
  atomic_fetch_add(cnt, 1);
  return r;
}
#endif

static tb_cu_result tb_tr_ipc_open_mem(tb_cu_deviceptr *p,
                                       tb_cu_ipc_mem_handle h,
                                       unsigned flags) {
  unsigned long long t0 = tb_now_ns();
  return tb_timed(&tb_cnt_open_mem, &tb_ns_open_mem, t0,
                  tb_cuda_real.cuIpcOpenMemHandle(p, h, flags));
}

/* VMM buffers (issue 25): imports counted, as IPC opens are. */
static atomic_ulong tb_cnt_vmm_import;

static tb_cu_result tb_tr_vmm_import(tb_cu_mem_handle *h, void *os_handle,
                                     int type) {
  atomic_fetch_add(&tb_cnt_vmm_import, 1);
  return tb_cuda_real.cuMemImportFromShareableHandle(h, os_handle, type);
}

static tb_cu_result tb_tr_ipc_close_mem(tb_cu_deviceptr p) {
  atomic_fetch_add(&tb_cnt_close_mem, 1);
  return tb_cuda_real.cuIpcCloseMemHandle(p);
}

static tb_cu_result tb_tr_ipc_open_event(tb_cu_event *e,
                                         tb_cu_ipc_event_handle h) {
  unsigned long long t0 = tb_now_ns();
  return tb_timed(&tb_cnt_open_event, &tb_ns_open_event, t0,
                  tb_cuda_real.cuIpcOpenEventHandle(e, h));
}

static tb_cu_result tb_tr_stream_wait(tb_cu_stream s, tb_cu_event e,
                                      unsigned flags) {
  unsigned long long t0 = tb_now_ns();
  return tb_timed(&tb_cnt_stream_wait, &tb_ns_stream_wait, t0,
                  tb_cuda_real.cuStreamWaitEvent(s, e, flags));
}

static tb_cu_result tb_tr_event_record(tb_cu_event e, tb_cu_stream s) {
  unsigned long long t0 = tb_now_ns();
  return tb_timed(&tb_cnt_event_record, &tb_ns_event_record, t0,
                  tb_cuda_real.cuEventRecord(e, s));
}

static tb_cu_result tb_tr_ipc_get_mem(tb_cu_ipc_mem_handle *h,
                                      tb_cu_deviceptr p) {
  atomic_fetch_add(&tb_cnt_get_mem, 1);
  return tb_cuda_real.cuIpcGetMemHandle(h, p);
}

static tb_cu_result tb_tr_event_create(tb_cu_event *e, unsigned flags) {
  unsigned long long t0 = tb_now_ns();
  return tb_timed(&tb_cnt_event_create, &tb_ns_event_create, t0,
                  tb_cuda_real.cuEventCreate(e, flags));
}

__attribute__((format(printf, 1, 2))) static void
tb_cuda_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tb_cuda_reason, sizeof tb_cuda_reason, fmt, ap);
  va_end(ap);
}

static void tb_cuda_load_once(void) {
  /* RTLD_LOCAL: the driver's symbols must not leak into the global
   * namespace of an application that may load its own libcuda users. The
   * handle is never closed: the driver cannot be unloaded safely. */
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    const char *e = dlerror();
    tb_cuda_fail("cannot load libcuda.so.1 (%s)", e != NULL ? e : "not found");
    return;
  }
  tb_cu_get_proc_fn get_proc =
      (tb_cu_get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");

  for (size_t i = 0; i < sizeof tb_cuda_syms / sizeof tb_cuda_syms[0]; i++) {
    const struct tb_cuda_sym *sym = &tb_cuda_syms[i];
    void *fn = NULL;
    if (get_proc != NULL) {
      int status = -1;
      tb_cu_result r =
          get_proc(sym->base, &fn, TB_CUDA_API_VERSION,
                   TB_CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status);
      if (r != 0 || status != TB_CU_GET_PROC_ADDRESS_SUCCESS)
        fn = NULL;
    }
    if (fn == NULL)
      fn = dlsym(lib, sym->dlsym);
    if (fn == NULL) {
      tb_cuda_fail("libcuda.so.1 lacks %s: driver too old (need the CUDA "
                   "12.0 driver API)",
                   sym->dlsym);
      return;
    }
    /* POSIX guarantees void * and function pointers convert both ways. */
    memcpy((char *)&tb_cuda_real + sym->off, &fn, sizeof fn);
  }

  tb_cu_result r = tb_cuda_real.cuInit(0);
  if (r != 0) {
    const char *name = NULL;
    if (tb_cuda_real.cuGetErrorName(r, &name) != 0 || name == NULL)
      name = "unknown error";
    tb_cuda_fail("cuInit failed: %s (%d)", name, r);
    return;
  }
  int version = 0;
  r = tb_cuda_real.cuDriverGetVersion(&version);
  if (r != 0 || version < TB_CUDA_API_VERSION) {
    tb_cuda_fail("CUDA driver API version %d is older than 12.0", version);
    return;
  }
  int count = 0;
  r = tb_cuda_real.cuDeviceGetCount(&count);
  if (r != 0 || count < 1) {
    tb_cuda_fail("no CUDA device visible (cuDeviceGetCount: %s, %d devices; "
                 "check CUDA_VISIBLE_DEVICES)",
                 r == 0 ? "ok" : "failed", count);
    return;
  }

  tb_cuda_tab = tb_cuda_real;
  tb_cuda_tab.cuIpcOpenMemHandle = tb_tr_ipc_open_mem;
  tb_cuda_tab.cuIpcCloseMemHandle = tb_tr_ipc_close_mem;
  tb_cuda_tab.cuIpcOpenEventHandle = tb_tr_ipc_open_event;
  tb_cuda_tab.cuIpcGetMemHandle = tb_tr_ipc_get_mem;
  tb_cuda_tab.cuEventCreate = tb_tr_event_create;
  tb_cuda_tab.cuStreamWaitEvent = tb_tr_stream_wait;
  tb_cuda_tab.cuEventRecord = tb_tr_event_record;
  tb_cuda_tab.cuMemImportFromShareableHandle = tb_tr_vmm_import;
  tb_cuda_reason[0] = '\0';
  tb_cuda_rc = 0;
  atomic_store(&tb_cuda_up, 1);
}

int tb__cuda_load(const struct tb_cuda **out) {
  pthread_once(&tb_cuda_once, tb_cuda_load_once);
  if (tb_cuda_rc != 0)
    return tb_cuda_rc;
  *out = &tb_cuda_tab;
  return 0;
}

int tb__cuda_loaded(void) { return atomic_load(&tb_cuda_up); }

/* dl_iterate_phdr callback: is an object named libcuda.so* loaded? */
static int tb_libcuda_seen(struct dl_phdr_info *info, size_t size, void *arg) {
  const char *name = info->dlpi_name, *slash;
  (void)size;
  if (name == NULL)
    return 0;
  slash = strrchr(name, '/');
  if (strncmp(slash != NULL ? slash + 1 : name, "libcuda.so", 10) == 0) {
    *(int *)arg = 1;
    return 1; /* stop */
  }
  return 0;
}

int tb__cuda_context_current(void) {
  const struct tb_cuda *cu;
  tb_cu_result (*get_current)(tb_cu_context *) = NULL;
  tb_cu_context cur = NULL;
  void *lib, *fn;
  int seen = 0;

  if (atomic_load(&tb_cuda_up))
    return 1;
  /* Only a driver the application has loaded and initialised itself: a
   * cuInit of ours in a process that forks later would leave its children
   * without CUDA. cuCtxGetCurrent initialises nothing (before any cuInit
   * it fails with CUDA_ERROR_NOT_INITIALIZED). The list of loaded objects
   * first: dlopen(RTLD_NOLOAD) of a library that is not loaded searches
   * the file system (~20 us), which every host-only connect would pay. */
  dl_iterate_phdr(tb_libcuda_seen, &seen);
  if (!seen)
    return 0;
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (lib == NULL)
    return 0;
  fn = dlsym(lib, "cuCtxGetCurrent");
  if (fn != NULL)
    memcpy(&get_current, &fn, sizeof(fn));
  if (get_current == NULL || get_current(&cur) != 0 || cur == NULL) {
    dlclose(lib);
    return 0;
  }
  dlclose(lib); /* still loaded: the application holds it */
  return tb__cuda_load(&cu) == 0;
}

const char *tb__cuda_why(void) {
  pthread_once(&tb_cuda_once, tb_cuda_load_once);
  return tb_cuda_reason;
}

const char *tb__cuda_err_name(tb_cu_result r) {
  const struct tb_cuda *cu;
  const char *name = NULL;
  if (tb__cuda_load(&cu) != 0)
    return "CUDA_ERROR (driver not loaded)";
  if (cu->cuGetErrorName(r, &name) != 0 || name == NULL)
    return "CUDA_ERROR_UNKNOWN_CODE";
  return name;
}

void tb__cuda_counters(struct tb_cuda_counters *out) {
  struct tb_cuda_counters c;
  c.ipc_open_mem = atomic_load(&tb_cnt_open_mem);
  c.ipc_close_mem = atomic_load(&tb_cnt_close_mem);
  c.ipc_open_event = atomic_load(&tb_cnt_open_event);
  c.ipc_get_mem = atomic_load(&tb_cnt_get_mem);
  c.event_create = atomic_load(&tb_cnt_event_create);
  c.stream_wait = atomic_load(&tb_cnt_stream_wait);
  c.event_record = atomic_load(&tb_cnt_event_record);
  c.ipc_open_mem_ns = atomic_load(&tb_ns_open_mem);
  c.ipc_open_event_ns = atomic_load(&tb_ns_open_event);
  c.stream_wait_ns = atomic_load(&tb_ns_stream_wait);
  c.event_create_ns = atomic_load(&tb_ns_event_create);
  c.event_record_ns = atomic_load(&tb_ns_event_record);
  c.vmm_import = atomic_load(&tb_cnt_vmm_import);
  *out = c;
}

TB_EXPORT int tb_cuda_available(void) {
  const struct tb_cuda *cu;
  return tb__cuda_load(&cu);
}

/* ---- error text shared by the files of client/cuda/ (cuda.h) ---- */

void tb__cu_why(char *why, size_t whylen, const char *fmt, ...) {
  if (why == NULL || whylen == 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, whylen, fmt, ap);
  va_end(ap);
}

/* A failed driver call: TB_ECUDA with "call: CUDA_ERROR_NAME". */
int tb__cu_fail(char *why, size_t whylen, const char *call, tb_cu_result r) {
  tb__cu_why(why, whylen, "%s failed: %s", call, tb__cuda_err_name(r));
  return TB_ECUDA;
}

int tb__cu_get(const struct tb_cuda **cu, char *why, size_t whylen) {
  int rc = tb__cuda_load(cu);
  if (rc != 0)
    tb__cu_why(why, whylen, "%s", tb__cuda_why());
  return rc;
}
