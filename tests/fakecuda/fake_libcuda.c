/* SPDX-License-Identifier: Apache-2.0 */
/* A fake CUDA driver, libcuda.so.1, for CPU tests (see fake_libcuda.h for
 * what it models, its log and its hooks).
 *
 * It implements the driver API libtensorbroker resolves (client/
 * cuda_driver.c's table), under the names dlsym finds (cuMemAlloc_v2, ...)
 * and through cuGetProcAddress_v2 by base name, plus cuStreamGetId.
 *
 * The types and constants below are cuda.h's, written out so that the fake
 * builds without the toolkit. Where cuda.h is installed, fake_decls_check.c
 * compiles this file again after cuda.h (FAKECUDA_DECLS_CHECK): every
 * exported definition is then checked against the real prototype, and every
 * constant against the real value, at build time.
 *
 * One mutex guards all state; calls never block on anything else, so
 * holding it across a whole call (copies included) is simple and safe. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_libcuda.h"

/* ---- cuda.h's types and constants ------------------------------------- */

#ifndef FAKECUDA_DECLS_CHECK
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUipcMemHandle_st {
  char reserved[64];
} CUipcMemHandle;
typedef struct CUipcEventHandle_st {
  char reserved[64];
} CUipcEventHandle;
typedef struct CUuuid_st {
  char bytes[16];
} CUuuid;
typedef int CUdevice_attribute;
typedef int CUpointer_attribute;
typedef int CUstreamCaptureStatus;
typedef int CUstreamCaptureMode;
typedef int CUdriverProcAddressQueryResult;
typedef uint64_t cuuint64_t;
#endif

#define FK_SUCCESS 0
#define FK_ERROR_INVALID_VALUE 1
#define FK_ERROR_OUT_OF_MEMORY 2
#define FK_ERROR_NOT_INITIALIZED 3
#define FK_ERROR_NO_DEVICE 100
#define FK_ERROR_INVALID_DEVICE 101
#define FK_ERROR_INVALID_CONTEXT 201
#define FK_ERROR_PEER_ACCESS_UNSUPPORTED 217
#define FK_ERROR_INVALID_HANDLE 400
#define FK_ERROR_ILLEGAL_STATE 401
#define FK_ERROR_NOT_FOUND 500
#define FK_ERROR_NOT_READY 600
#define FK_ERROR_PEER_ACCESS_ALREADY_ENABLED 704
#define FK_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712 /* pinned host memory */
#define FK_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define FK_ERROR_NOT_SUPPORTED 801
#define FK_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define FK_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define FK_ERROR_STREAM_CAPTURE_MERGE 902
#define FK_ERROR_STREAM_CAPTURE_UNMATCHED 903
#define FK_ERROR_STREAM_CAPTURE_UNJOINED 904
#define FK_ERROR_STREAM_CAPTURE_ISOLATION 905
#define FK_ERROR_STREAM_CAPTURE_IMPLICIT 906
#define FK_ERROR_CAPTURED_EVENT 907
#define FK_ERROR_STREAM_CAPTURE_WRONG_THREAD 908
#define FK_ERROR_UNKNOWN 999

#define FK_STREAM_LEGACY ((CUstream)0x1)
#define FK_STREAM_PER_THREAD ((CUstream)0x2)
#define FK_STREAM_NON_BLOCKING 0x1u
#define FK_EVENT_BLOCKING_SYNC 0x1u
#define FK_EVENT_DISABLE_TIMING 0x2u
#define FK_EVENT_INTERPROCESS 0x4u
#define FK_EVENT_RECORD_EXTERNAL 0x1u
#define FK_EVENT_WAIT_EXTERNAL 0x1u
#define FK_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1u
#define FK_CAPTURE_STATUS_NONE 0
#define FK_CAPTURE_STATUS_ACTIVE 1
#define FK_CAPTURE_STATUS_INVALIDATED 2
#define FK_CAPTURE_MODE_GLOBAL 0
#define FK_CAPTURE_MODE_THREAD_LOCAL 1
#define FK_CAPTURE_MODE_RELAXED 2
#define FK_POINTER_ATTRIBUTE_CONTEXT 1
#define FK_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define FK_POINTER_ATTRIBUTE_DEVICE_POINTER 3
#define FK_POINTER_ATTRIBUTE_BUFFER_ID 7
#define FK_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define FK_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define FK_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define FK_MEMORYTYPE_DEVICE 2
#define FK_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED 115
#define FK_GET_PROC_ADDRESS_SUCCESS 0
#define FK_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1

#ifdef FAKECUDA_DECLS_CHECK
#define FK_SAME(ours, theirs) \
  _Static_assert((ours) == (theirs), #ours " differs from cuda.h")
FK_SAME(FK_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE);
FK_SAME(FK_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY);
FK_SAME(FK_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED);
FK_SAME(FK_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE);
FK_SAME(FK_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE);
FK_SAME(FK_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT);
FK_SAME(FK_ERROR_PEER_ACCESS_UNSUPPORTED, CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
FK_SAME(FK_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE);
FK_SAME(FK_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
FK_SAME(FK_ERROR_HOST_MEMORY_NOT_REGISTERED,
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
FK_SAME(FK_ERROR_ILLEGAL_STATE, CUDA_ERROR_ILLEGAL_STATE);
FK_SAME(FK_ERROR_NOT_FOUND, CUDA_ERROR_NOT_FOUND);
FK_SAME(FK_ERROR_NOT_READY, CUDA_ERROR_NOT_READY);
FK_SAME(FK_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
FK_SAME(FK_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED);
FK_SAME(FK_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
FK_SAME(FK_ERROR_STREAM_CAPTURE_INVALIDATED,
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
FK_SAME(FK_ERROR_STREAM_CAPTURE_MERGE, CUDA_ERROR_STREAM_CAPTURE_MERGE);
FK_SAME(FK_ERROR_STREAM_CAPTURE_UNMATCHED,
        CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
FK_SAME(FK_ERROR_STREAM_CAPTURE_UNJOINED, CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
FK_SAME(FK_ERROR_STREAM_CAPTURE_ISOLATION,
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
FK_SAME(FK_ERROR_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
FK_SAME(FK_ERROR_CAPTURED_EVENT, CUDA_ERROR_CAPTURED_EVENT);
FK_SAME(FK_ERROR_STREAM_CAPTURE_WRONG_THREAD,
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
FK_SAME(FK_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN);
FK_SAME(FK_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING);
FK_SAME(FK_EVENT_BLOCKING_SYNC, CU_EVENT_BLOCKING_SYNC);
FK_SAME(FK_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING);
FK_SAME(FK_EVENT_INTERPROCESS, CU_EVENT_INTERPROCESS);
FK_SAME(FK_EVENT_RECORD_EXTERNAL, CU_EVENT_RECORD_EXTERNAL);
FK_SAME(FK_EVENT_WAIT_EXTERNAL, CU_EVENT_WAIT_EXTERNAL);
FK_SAME(FK_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
        CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
FK_SAME(FK_CAPTURE_STATUS_NONE, CU_STREAM_CAPTURE_STATUS_NONE);
FK_SAME(FK_CAPTURE_STATUS_ACTIVE, CU_STREAM_CAPTURE_STATUS_ACTIVE);
FK_SAME(FK_CAPTURE_STATUS_INVALIDATED, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
FK_SAME(FK_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL);
FK_SAME(FK_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
FK_SAME(FK_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_RELAXED);
FK_SAME(FK_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_CONTEXT);
FK_SAME(FK_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
FK_SAME(FK_POINTER_ATTRIBUTE_DEVICE_POINTER,
        CU_POINTER_ATTRIBUTE_DEVICE_POINTER);
FK_SAME(FK_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_BUFFER_ID);
FK_SAME(FK_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
FK_SAME(FK_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
FK_SAME(FK_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_RANGE_SIZE);
FK_SAME(FK_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE);
FK_SAME(FK_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
FK_SAME(FK_GET_PROC_ADDRESS_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS);
FK_SAME(FK_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
        CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
_Static_assert(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle size");
_Static_assert(sizeof(CUipcEventHandle) == 64, "CUipcEventHandle size");
_Static_assert(sizeof(CUdeviceptr) == sizeof(unsigned long long),
               "CUdeviceptr size");
#endif

#define FK_EXPORT __attribute__((visibility("default")))

/* cuDriverGetVersion: CUDA 12.8, newer than the 12.0 API the library needs */
#define FK_DRIVER_VERSION 12080
#define FK_DEVICE_NAME "Fake CUDA device"
#define FK_LEGACY_ID 1ull
#define FK_PER_THREAD_ID 2ull
#define FK_MEMLOG_MAX (16u << 20)
#define FK_LINE_MAX 400

/* ---- objects ------------------------------------------------------------ */

/* Every handle the fake gives out points at one of these; the magic tells a
 * stream from an event (or from garbage) before anything else is read. */
#define FK_MAGIC_CTX 0x66637478u   /* "fctx" */
#define FK_MAGIC_STREAM 0x66737472u /* "fstr" */
#define FK_MAGIC_EVENT 0x66657674u  /* "fevt" */
#define FK_MAGIC_GRAPH 0x66677068u  /* "fgph" */
#define FK_MAGIC_EXEC 0x66657863u   /* "fexc" */

struct CUctx_st {
  uint32_t magic;
  unsigned retained; /* cuDevicePrimaryCtxRetain minus Release */
};

/* Never freed (on the fk_streams list for good), so that a call on a
 * destroyed stream is answered, not a use-after-free. */
struct CUstream_st {
  uint32_t magic;
  int destroyed;
  struct CUstream_st *next;
  unsigned long long id;
  unsigned flags;
  int capture;                  /* FK_CAPTURE_STATUS_* */
  int capture_mode;             /* of the capture, as begun */
  int capture_origin;           /* began it (1), or joined it by a wait (0) */
  unsigned long long capture_id;
  pthread_t capture_thread;     /* the thread that began it */
  char name[24];
};

/* Never freed either. An event opened from an IPC handle is a new object
 * that carries its exporter's pid and number, so it prints the same name. */
struct CUevent_st {
  uint32_t magic;
  int destroyed;
  struct CUevent_st *next;
  long pid;
  unsigned long long id;
  unsigned flags;
  int opened;
  /* the capture its latest record was captured into, 0 for none */
  unsigned long long capture_id;
  char name[48];
  char recorded_on[24];
  /* busy mode: its latest record has been waited for by the host
   * (cuEventSynchronize, or a synchronize of its stream or context), so
   * cuEventQuery says it completed; a new record clears it */
  int synced;
};

struct CUgraph_st {
  uint32_t magic;
  int destroyed;
  struct CUgraph_st *next;
  unsigned long long id;
};

struct CUgraphExec_st {
  uint32_t magic;
  int destroyed;
  struct CUgraphExec_st *next;
  unsigned long long graph_id;
};

/* Device memory: an allocation of ours (a memfd mapped here), or another
 * process's allocation mapped from its IPC handle. */
struct fk_mem {
  struct fk_mem *next;
  CUdeviceptr base;
  size_t size;   /* as allocated: what cuMemGetAddressRange reports */
  size_t maplen; /* size rounded up to pages */
  int fd;        /* own allocations: the memfd; mappings: -1 */
  int opened;    /* an IPC mapping */
  unsigned refs; /* mappings: opens not yet closed */
  long pid;      /* the allocating process and its allocation id: the */
  unsigned long long alloc_id; /*  name mP.N */
  long export_pid;               /* mappings: whose handle was opened */
  unsigned long long buffer_id;  /* CU_POINTER_ATTRIBUTE_BUFFER_ID here */
  struct fk_vmm *vmm;            /* a VMM mapping (cuMemMap): its allocation */
  int access;                    /* VMM: PROT_* set by cuMemSetAccess */
};

/* IPC handles: 64 bytes, this layout, the rest zero. */
#define FK_MEM_MAGIC "FKCUMEM1"
#define FK_EVENT_MAGIC "FKCUEVT1"
struct fk_mem_handle {
  char magic[8];
  int32_t export_pid; /* whose fd table holds fd */
  int32_t fd;
  uint64_t size;
  uint64_t alloc_id;
  int32_t alloc_pid;
};
struct fk_event_handle {
  char magic[8];
  int32_t pid; /* the creating process */
  int32_t pad;
  uint64_t id;
};
_Static_assert(sizeof(struct fk_mem_handle) <= 64, "mem handle fits");
_Static_assert(sizeof(struct fk_event_handle) <= 64, "event handle fits");

/* ---- state -------------------------------------------------------------- */

static pthread_mutex_t fk_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int fk_inited;
static atomic_int fk_busy_on;
static int fk_env_read;
static unsigned char fk_uuid[16] = {0xfa, 0xce, 0xc0, 0xda, 0x00, 0x00,
                                    0x40, 0x00, 0x80, 0x00, 0x00, 0x00,
                                    0x00, 0x00, 0x00, 0x01};
static struct CUctx_st fk_primary = {FK_MAGIC_CTX, 0};
static _Thread_local CUcontext fk_current;
static _Thread_local int fk_thread_mode = FK_CAPTURE_MODE_GLOBAL;

/* ids: never reused in a process (1 and 2 are the default streams) */
static unsigned long long fk_stream_ids = FK_PER_THREAD_ID;
static unsigned long long fk_event_ids, fk_buffer_ids, fk_graph_ids,
    fk_capture_ids;

static struct CUstream_st *fk_streams;
static struct CUevent_st *fk_events;
static void fk_events_synced(const char *on);
static struct CUgraph_st *fk_graphs;
static struct CUgraphExec_st *fk_execs;
static struct fk_mem *fk_mems;
struct fk_vmm;

static char *fk_memlog;
static size_t fk_memlog_len, fk_memlog_cap;
static unsigned long fk_log_dropped, fk_log_errors;

/* ---- error names -------------------------------------------------------- */

static const struct {
  int code;
  const char *name, *text;
} fk_errors[] = {
    {FK_SUCCESS, "CUDA_SUCCESS", "no error"},
    {FK_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {FK_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {FK_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED",
     "initialization error"},
    {FK_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE",
     "no CUDA-capable device is detected"},
    {FK_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE",
     "invalid device ordinal"},
    {FK_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT",
     "invalid device context"},
    {FK_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
     "peer access is not supported between these two devices"},
    {FK_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE",
     "invalid resource handle"},
    {FK_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
     "the operation cannot be performed in the present state"},
    {FK_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {FK_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {FK_ERROR_PEER_ACCESS_ALREADY_ENABLED,
     "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
     "peer access is already enabled"},
    {FK_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
     "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {FK_ERROR_HOST_MEMORY_NOT_REGISTERED,
     "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {FK_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
     "operation not supported"},
    {FK_ERROR_STREAM_CAPTURE_UNSUPPORTED,
     "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {FK_ERROR_STREAM_CAPTURE_INVALIDATED,
     "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {FK_ERROR_STREAM_CAPTURE_MERGE, "CUDA_ERROR_STREAM_CAPTURE_MERGE",
     "operation would result in a merge of separate capture sequences"},
    {FK_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
     "capture was not ended in the same stream as it began"},
    {FK_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
     "capturing stream has unjoined work"},
    {FK_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
     "dependency created on uncaptured work in another stream"},
    {FK_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
     "operation would make the legacy stream depend on a capturing blocking "
     "stream"},
    {FK_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
     "operation not permitted on an event last recorded in a capturing "
     "stream"},
    {FK_ERROR_STREAM_CAPTURE_WRONG_THREAD,
     "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another "
     "thread"},
    {FK_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const char *fk_err_name(int r) {
  for (size_t i = 0; i < sizeof(fk_errors) / sizeof(fk_errors[0]); i++)
    if (fk_errors[i].code == r)
      return fk_errors[i].name;
  return "CUDA_ERROR_UNKNOWN_CODE";
}

/* ---- the log (call with fk_lock held) ----------------------------------- */

struct fk_line {
  char text[FK_LINE_MAX];
  size_t len; /* always < FK_LINE_MAX - 1: room for the newline */
};

static void fk_line_vadd(struct fk_line *l, const char *fmt, va_list ap) {
  size_t room = sizeof(l->text) - 1 - l->len;
  int n = vsnprintf(l->text + l->len, room + 1, fmt, ap);
  if (n > 0)
    l->len += (size_t)n < room ? (size_t)n : room;
}

__attribute__((format(printf, 2, 3))) static void
fk_line_add(struct fk_line *l, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fk_line_vadd(l, fmt, ap);
  va_end(ap);
}

static void fk_memlog_append(const char *text, size_t len) {
  if (fk_memlog_len + len + 1 > FK_MEMLOG_MAX) {
    fk_log_dropped++;
    return;
  }
  if (fk_memlog_len + len + 1 > fk_memlog_cap) {
    size_t cap = fk_memlog_cap != 0 ? fk_memlog_cap : 4096;
    while (cap < fk_memlog_len + len + 1)
      cap *= 2;
    char *p = realloc(fk_memlog, cap);
    if (p == NULL) {
      fk_log_dropped++;
      return;
    }
    fk_memlog = p;
    fk_memlog_cap = cap;
  }
  memcpy(fk_memlog + fk_memlog_len, text, len);
  fk_memlog_len += len;
  fk_memlog[fk_memlog_len] = '\0';
}

/* FAKECUDA_LOG is opened for each line, with O_APPEND and one write, so
 * that processes sharing the file never interleave inside a line and a
 * test may change the variable between calls. */
static void fk_file_append(const char *text, size_t len) {
  const char *path = getenv("FAKECUDA_LOG");
  int fd;

  if (path == NULL || path[0] == '\0')
    return;
  fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    fk_log_errors++;
    return;
  }
  if (write(fd, text, len) != (ssize_t)len)
    fk_log_errors++;
  close(fd);
}

/* One log line: "<pid> <body>[ -> CUDA_ERROR_NAME]\n". */
__attribute__((format(printf, 2, 3))) static void fk_log(CUresult r,
                                                         const char *fmt,
                                                         ...) {
  struct fk_line l = {.len = 0};
  va_list ap;

  fk_line_add(&l, "%ld ", (long)getpid());
  va_start(ap, fmt);
  fk_line_vadd(&l, fmt, ap);
  va_end(ap);
  if (r != FK_SUCCESS)
    fk_line_add(&l, " -> %s", fk_err_name(r));
  l.text[l.len++] = '\n';
  fk_memlog_append(l.text, l.len);
  fk_file_append(l.text, l.len);
}

/* ---- names (fk_lock held) ----------------------------------------------- */

static int fk_is_legacy(CUstream s) {
  return s == NULL || s == FK_STREAM_LEGACY;
}

static int fk_is_default(CUstream s) {
  return fk_is_legacy(s) || s == FK_STREAM_PER_THREAD;
}

/* For handles the caller gave us: they point at our objects or the call
 * is wrong anyway (the real driver would crash or refuse them too). */
static int fk_stream_obj(CUstream s) {
  return !fk_is_default(s) && s->magic == FK_MAGIC_STREAM;
}

static int fk_event_obj(CUevent e) {
  return e != NULL && e->magic == FK_MAGIC_EVENT;
}

static const char *fk_stream_label(CUstream s) {
  if (s == NULL)
    return "null";
  if (s == FK_STREAM_LEGACY)
    return "legacy";
  if (s == FK_STREAM_PER_THREAD)
    return "ptds";
  return fk_stream_obj(s) ? s->name : "invalid";
}

static const char *fk_event_label(CUevent e) {
  return fk_event_obj(e) ? e->name : "invalid";
}

/* ---- calls' common checks (fk_lock held) -------------------------------- */

static CUresult fk_need_init(void) {
  return atomic_load(&fk_inited) ? FK_SUCCESS : FK_ERROR_NOT_INITIALIZED;
}

static CUresult fk_need_ctx(void) {
  CUresult r = fk_need_init();
  if (r == FK_SUCCESS && fk_current == NULL)
    r = FK_ERROR_INVALID_CONTEXT;
  return r;
}

/* A stream argument: our live stream, or a default stream, which means the
 * current context's and so needs one. *out: the object, NULL for the
 * default streams. */
static CUresult fk_stream_get(CUstream s, struct CUstream_st **out) {
  CUresult r = fk_need_init();
  *out = NULL;
  if (r != FK_SUCCESS)
    return r;
  if (fk_is_default(s))
    return fk_current != NULL ? FK_SUCCESS : FK_ERROR_INVALID_CONTEXT;
  if (!fk_stream_obj(s) || s->destroyed)
    return FK_ERROR_INVALID_HANDLE;
  *out = s;
  return FK_SUCCESS;
}

static CUresult fk_event_get(CUevent e) {
  CUresult r = fk_need_init();
  if (r == FK_SUCCESS && (!fk_event_obj(e) || e->destroyed))
    r = FK_ERROR_INVALID_HANDLE;
  return r;
}

/* ---- captures (fk_lock held) -------------------------------------------- */

static int fk_capture_live(unsigned long long id) {
  if (id == 0)
    return 0;
  for (struct CUstream_st *s = fk_streams; s != NULL; s = s->next)
    if (s->capture != FK_CAPTURE_STATUS_NONE && s->capture_id == id)
      return 1;
  return 0;
}

static struct CUstream_st *fk_capture_origin(unsigned long long id) {
  for (struct CUstream_st *s = fk_streams; s != NULL; s = s->next)
    if (s->capture != FK_CAPTURE_STATUS_NONE && s->capture_id == id &&
        s->capture_origin)
      return s;
  return NULL;
}

static void fk_capture_invalidate(unsigned long long id, const char *call) {
  for (struct CUstream_st *s = fk_streams; s != NULL; s = s->next) {
    if (s->capture == FK_CAPTURE_STATUS_ACTIVE && s->capture_id == id) {
      s->capture = FK_CAPTURE_STATUS_INVALIDATED;
      fk_log(FK_SUCCESS, "capture-invalidate %s by %s", s->name, call);
    }
  }
}

/* Does the calling thread capture in GLOBAL or THREAD_LOCAL mode? Then the
 * legacy stream is off limits: it synchronises with blocking streams, so
 * work on it would join the capture implicitly (measured: cuStreamIsCapturing
 * of the legacy stream answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). */
static unsigned long long fk_thread_strict_capture(void) {
  for (struct CUstream_st *s = fk_streams; s != NULL; s = s->next)
    if (s->capture != FK_CAPTURE_STATUS_NONE &&
        s->capture_mode != FK_CAPTURE_MODE_RELAXED &&
        pthread_equal(s->capture_thread, pthread_self()))
      return s->capture_id;
  return 0;
}

/* A "potentially unsafe" call (the CUDA programming guide's term: memory
 * allocation and free, synchronous copies, queries and synchronisation)
 * while a capture forbids it: the call fails with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the captures that
 * forbade it. The calling thread's mode (cuThreadExchangeStreamCaptureMode)
 * decides: RELAXED allows all; THREAD_LOCAL forbids during this thread's own
 * non-relaxed captures; GLOBAL also during another thread's GLOBAL capture.
 * This is why the library switches to RELAXED around such calls. */
static CUresult fk_unsafe(const char *call) {
  int forbid = 0;

  if (fk_thread_mode == FK_CAPTURE_MODE_RELAXED)
    return FK_SUCCESS;
  for (struct CUstream_st *s = fk_streams; s != NULL; s = s->next) {
    if (s->capture == FK_CAPTURE_STATUS_NONE || !s->capture_origin ||
        s->capture_mode == FK_CAPTURE_MODE_RELAXED)
      continue;
    if (pthread_equal(s->capture_thread, pthread_self()) ||
        (fk_thread_mode == FK_CAPTURE_MODE_GLOBAL &&
         s->capture_mode == FK_CAPTURE_MODE_GLOBAL)) {
      forbid = 1;
      fk_capture_invalidate(s->capture_id, call);
    }
  }
  return forbid ? FK_ERROR_STREAM_CAPTURE_UNSUPPORTED : FK_SUCCESS;
}

/* Work enqueued on s (record, wait, async copy, launch): the legacy stream
 * while this thread captures strictly is refused and invalidates that
 * capture; a stream whose capture was invalidated refuses work until the
 * capture ends. */
static CUresult fk_stream_work(CUstream s, struct CUstream_st **out,
                               const char *call) {
  unsigned long long id;
  CUresult r = fk_stream_get(s, out);

  if (r != FK_SUCCESS)
    return r;
  if (fk_is_legacy(s) && (id = fk_thread_strict_capture()) != 0) {
    fk_capture_invalidate(id, call);
    return FK_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  if (*out != NULL && (*out)->capture == FK_CAPTURE_STATUS_INVALIDATED)
    return FK_ERROR_STREAM_CAPTURE_INVALIDATED;
  return FK_SUCCESS;
}

static const char *fk_capturing_suffix(const struct CUstream_st *st) {
  return st != NULL && st->capture != FK_CAPTURE_STATUS_NONE ? " (capturing)"
                                                             : "";
}

/* ---- memory (fk_lock held) ---------------------------------------------- */

static struct fk_mem *fk_mem_holding(CUdeviceptr p) {
  for (struct fk_mem *m = fk_mems; m != NULL; m = m->next)
    if (p >= m->base && p - m->base < m->size)
      return m;
  return NULL;
}

/* [p, p + n) inside one allocation or mapping: its host address. */
static void *fk_mem_range(CUdeviceptr p, size_t n) {
  struct fk_mem *m = fk_mem_holding(p);
  if (m == NULL || n > m->size - (size_t)(p - m->base) ||
      (m->vmm != NULL && m->access == 0))
    return NULL;
  return (void *)(uintptr_t)p;
}

static void fk_mem_unlink(struct fk_mem *m) {
  struct fk_mem **pp = &fk_mems;
  while (*pp != m)
    pp = &(*pp)->next;
  *pp = m->next;
}

static size_t fk_page_round(size_t n) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (n > SIZE_MAX - (page - 1))
    return 0;
  return (n + page - 1) / page * page;
}

static CUresult fk_mem_new(size_t size, struct fk_mem **out) {
  char name[48];
  struct fk_mem *m;
  size_t maplen = fk_page_round(size);
  void *p;
  int fd;

  if (maplen == 0 || maplen > (size_t)INT64_MAX)
    return FK_ERROR_OUT_OF_MEMORY;
  m = calloc(1, sizeof(*m));
  if (m == NULL)
    return FK_ERROR_OUT_OF_MEMORY;
  m->alloc_id = ++fk_buffer_ids;
  /* the name lets an opener check that the fd is still this allocation */
  snprintf(name, sizeof(name), "fakecuda-alloc-%llu", m->alloc_id);
  fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0)
    goto out_free;
  if (ftruncate(fd, (off_t)maplen) < 0)
    goto out_close;
  p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    goto out_close;
  m->base = (CUdeviceptr)(uintptr_t)p;
  m->size = size;
  m->maplen = maplen;
  m->fd = fd;
  m->pid = (long)getpid();
  m->buffer_id = m->alloc_id;
  m->next = fk_mems;
  fk_mems = m;
  *out = m;
  return FK_SUCCESS;

out_close:
  close(fd);
out_free:
  free(m);
  return FK_ERROR_OUT_OF_MEMORY;
}

/* Is /proc/<pid>/fd/<fd> still the memfd of allocation id? A freed
 * allocation's fd number may have been reused by another file. */
static int fk_fd_is_alloc(long pid, int fd, unsigned long long id) {
  char path[64], link[128], want[64];
  ssize_t n;
  size_t wl;

  snprintf(path, sizeof(path), "/proc/%ld/fd/%d", pid, fd);
  n = readlink(path, link, sizeof(link) - 1);
  if (n < 0)
    return 0;
  link[n] = '\0';
  wl = (size_t)snprintf(want, sizeof(want), "/memfd:fakecuda-alloc-%llu", id);
  return strncmp(link, want, wl) == 0 &&
         (link[wl] == '\0' || link[wl] == ' ');
}

/* ---- initialisation, versions, errors ----------------------------------- */

static void fk_read_env(void) {
  const char *v;
  char *end;
  long n;

  v = getenv("FAKECUDA_BUSY");
  if (v != NULL && strcmp(v, "1") == 0)
    atomic_store(&fk_busy_on, 1);
  v = getenv("FAKECUDA_UUID_BYTE");
  if (v != NULL && v[0] != '\0') {
    errno = 0;
    n = strtol(v, &end, 0);
    if (errno == 0 && *end == '\0' && n >= 0 && n <= 255)
      fk_uuid[0] = (unsigned char)n;
  }
}

FK_EXPORT CUresult cuInit(unsigned int Flags) {
  if (Flags != 0)
    return FK_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk_lock);
  /* the environment once: a later cuInit (the library's, after a test's)
   * must not undo a hook's set_busy */
  if (!fk_env_read) {
    fk_read_env();
    fk_env_read = 1;
  }
  atomic_store(&fk_inited, 1);
  pthread_mutex_unlock(&fk_lock);
  return FK_SUCCESS;
}

FK_EXPORT CUresult cuDriverGetVersion(int *driverVersion) {
  if (driverVersion == NULL)
    return FK_ERROR_INVALID_VALUE;
  *driverVersion = FK_DRIVER_VERSION;
  return FK_SUCCESS;
}

/* The name (want_text 0) or text of a CUresult, as cuGetErrorName and
 * cuGetErrorString give them. */
static CUresult fk_error_lookup(CUresult error, int want_text,
                                const char **pStr) {
  if (pStr == NULL)
    return FK_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof(fk_errors) / sizeof(fk_errors[0]); i++) {
    if (fk_errors[i].code == (int)error) {
      *pStr = want_text ? fk_errors[i].text : fk_errors[i].name;
      return FK_SUCCESS;
    }
  }
  *pStr = NULL;
  return FK_ERROR_INVALID_VALUE;
}

FK_EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr) {
  return fk_error_lookup(error, 0, pStr);
}

FK_EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr) {
  return fk_error_lookup(error, 1, pStr);
}

/* ---- devices ------------------------------------------------------------ */

static CUresult fk_device_ok(CUdevice dev) {
  CUresult r = fk_need_init();
  if (r == FK_SUCCESS && dev != 0)
    r = FK_ERROR_INVALID_DEVICE;
  return r;
}

FK_EXPORT CUresult cuDeviceGetCount(int *count) {
  CUresult r = fk_need_init();
  if (r != FK_SUCCESS)
    return r;
  if (count == NULL)
    return FK_ERROR_INVALID_VALUE;
  *count = 1;
  return FK_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  CUresult r = fk_need_init();
  if (r != FK_SUCCESS)
    return r;
  if (device == NULL)
    return FK_ERROR_INVALID_VALUE;
  if (ordinal != 0)
    return FK_ERROR_INVALID_DEVICE;
  *device = 0;
  return FK_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
  CUresult r = fk_device_ok(dev);
  if (r != FK_SUCCESS)
    return r;
  if (uuid == NULL)
    return FK_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk_lock);
  memcpy(uuid->bytes, fk_uuid, sizeof(uuid->bytes));
  pthread_mutex_unlock(&fk_lock);
  return FK_SUCCESS;
}

/* VMM with POSIX descriptors: 1 unless FAKECUDA_NO_VMM=1 (the VMM block
 * below). */
static int fk_vmm_attribute(CUdevice_attribute attrib);

/* Every attribute but VMM's is 0: in particular no memory pools, so the
 * library copies with cuMemAlloc, never cuMemAllocAsync. */
FK_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib,
                                        CUdevice dev) {
  CUresult r = fk_device_ok(dev);
  if (r != FK_SUCCESS)
    return r;
  if (pi == NULL)
    return FK_ERROR_INVALID_VALUE;
  *pi = fk_vmm_attribute(attrib);
  return FK_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  CUresult r = fk_device_ok(dev);
  if (r != FK_SUCCESS)
    return r;
  if (name == NULL || len <= 0)
    return FK_ERROR_INVALID_VALUE;
  snprintf(name, (size_t)len, "%s", FK_DEVICE_NAME);
  return FK_SUCCESS;
}

/* One device: never a peer of itself (the real driver answers 0 for a
 * device and itself too). */
FK_EXPORT CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev,
                                         CUdevice peerDev) {
  CUresult r = fk_device_ok(dev);
  if (r == FK_SUCCESS)
    r = fk_device_ok(peerDev);
  if (r != FK_SUCCESS)
    return r;
  if (canAccessPeer == NULL)
    return FK_ERROR_INVALID_VALUE;
  *canAccessPeer = 0;
  return FK_SUCCESS;
}

/* ---- contexts ----------------------------------------------------------- */

FK_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  CUresult r = fk_device_ok(dev);
  if (r != FK_SUCCESS)
    return r;
  if (pctx == NULL)
    return FK_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk_lock);
  fk_primary.retained++;
  pthread_mutex_unlock(&fk_lock);
  *pctx = &fk_primary;
  return FK_SUCCESS;
}

FK_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  CUresult r = fk_device_ok(dev);
  if (r != FK_SUCCESS)
    return r;
  pthread_mutex_lock(&fk_lock);
  if (fk_primary.retained == 0)
    r = FK_ERROR_INVALID_CONTEXT;
  else
    fk_primary.retained--;
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* Before cuInit: CUDA_ERROR_NOT_INITIALIZED, as the real driver answers
 * (the library relies on it: asking initialises nothing). */
FK_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
  CUresult r = fk_need_init();
  if (r != FK_SUCCESS)
    return r;
  if (pctx == NULL)
    return FK_ERROR_INVALID_VALUE;
  *pctx = fk_current;
  return FK_SUCCESS;
}

FK_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  CUresult r = fk_need_init();
  if (r != FK_SUCCESS)
    return r;
  if (ctx != NULL && ctx != &fk_primary)
    return FK_ERROR_INVALID_CONTEXT;
  fk_current = ctx;
  return FK_SUCCESS;
}

FK_EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
  CUresult r = fk_need_ctx();
  if (r != FK_SUCCESS)
    return r;
  if (device == NULL)
    return FK_ERROR_INVALID_VALUE;
  *device = 0;
  return FK_SUCCESS;
}

FK_EXPORT CUresult cuCtxSynchronize(void) {
  CUresult r;
  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  if (r == FK_SUCCESS)
    r = fk_unsafe("cuCtxSynchronize");
  if (r == FK_SUCCESS)
    fk_events_synced(NULL);
  fk_log(r, "ctx-synchronize");
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* The only other context is the current one, and a device is no peer of
 * itself. */
FK_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peerContext,
                                         unsigned int Flags) {
  CUresult r = fk_need_ctx();
  if (r != FK_SUCCESS)
    return r;
  if (Flags != 0 || peerContext != &fk_primary)
    return FK_ERROR_INVALID_VALUE;
  return FK_ERROR_INVALID_DEVICE;
}

/* ---- memory ------------------------------------------------------------- */

FK_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
  struct fk_mem *m = NULL;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  if (r == FK_SUCCESS && (dptr == NULL || bytesize == 0))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS)
    r = fk_unsafe("cuMemAlloc");
  if (r == FK_SUCCESS)
    r = fk_mem_new(bytesize, &m);
  if (r == FK_SUCCESS) {
    *dptr = m->base;
    fk_log(r, "mem-alloc m%ld.%llu size %zu", m->pid, m->alloc_id, bytesize);
  } else {
    fk_log(r, "mem-alloc size %zu", bytesize);
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  struct fk_mem *m;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_init();
  m = fk_mem_holding(dptr);
  if (r == FK_SUCCESS &&
      (m == NULL || m->opened || m->vmm != NULL || m->base != dptr))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS)
    r = fk_unsafe("cuMemFree");
  if (r == FK_SUCCESS) {
    fk_log(r, "mem-free m%ld.%llu", m->pid, m->alloc_id);
    munmap((void *)(uintptr_t)m->base, m->maplen);
    close(m->fd);
    fk_mem_unlink(m);
    free(m);
  } else if (m != NULL && !m->opened && m->base == dptr) {
    fk_log(r, "mem-free m%ld.%llu", m->pid, m->alloc_id);
  } else {
    fk_log(r, "mem-free invalid");
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize,
                                           CUdeviceptr dptr) {
  struct fk_mem *m;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_init();
  m = fk_mem_holding(dptr);
  if (r == FK_SUCCESS && m == NULL)
    r = FK_ERROR_NOT_FOUND;
  if (r == FK_SUCCESS) {
    if (pbase != NULL)
      *pbase = m->base;
    if (psize != NULL)
      *psize = m->size;
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* Host memory, and anything else the fake did not allocate or map, is
 * CUDA_ERROR_INVALID_VALUE for every attribute, as the real driver answers
 * for pageable host memory (the library then says "not memory CUDA
 * knows"). Each attribute writes its own type: CUcontext, unsigned int
 * (CUmemorytype), unsigned long long, int, a pointer or size_t. */
FK_EXPORT CUresult cuPointerGetAttribute(void *data,
                                         CUpointer_attribute attribute,
                                         CUdeviceptr ptr) {
  struct fk_mem *m;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_init();
  m = fk_mem_holding(ptr);
  if (r == FK_SUCCESS && (m == NULL || data == NULL))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS) {
    switch ((int)attribute) {
    case FK_POINTER_ATTRIBUTE_CONTEXT:
      *(CUcontext *)data = &fk_primary;
      break;
    case FK_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *(unsigned int *)data = FK_MEMORYTYPE_DEVICE;
      break;
    case FK_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *(CUdeviceptr *)data = ptr;
      break;
    case FK_POINTER_ATTRIBUTE_BUFFER_ID:
      *(unsigned long long *)data = m->buffer_id;
      break;
    case FK_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *(int *)data = 0;
      break;
    case FK_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *(void **)data = (void *)(uintptr_t)m->base;
      break;
    case FK_POINTER_ATTRIBUTE_RANGE_SIZE:
      *(size_t *)data = m->size;
      break;
    default:
      r = FK_ERROR_INVALID_VALUE;
      break;
    }
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* Synchronous copies run on the legacy stream: they need a context and are
 * "potentially unsafe" during a capture. */
static CUresult fk_copy_sync(CUdeviceptr dev, void *host, size_t n,
                             int to_device, const char *call) {
  void *d;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  if (r == FK_SUCCESS)
    r = fk_unsafe(call);
  d = fk_mem_range(dev, n);
  if (r == FK_SUCCESS && n != 0 && (d == NULL || host == NULL))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS && n != 0)
    memmove(to_device ? d : host, to_device ? host : d, n);
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost,
                                   size_t ByteCount) {
  return fk_copy_sync(dstDevice, (void *)(uintptr_t)srcHost, ByteCount, 1,
                      "cuMemcpyHtoD");
}

FK_EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice,
                                   size_t ByteCount) {
  return fk_copy_sync(srcDevice, dstHost, ByteCount, 0, "cuMemcpyDtoH");
}

/* Asynchronous copies and sets run at once: the fake GPU is never behind. */
static CUresult fk_copy_async(CUdeviceptr dst, CUdeviceptr src, size_t n,
                              CUstream s, const char *call) {
  struct CUstream_st *st;
  void *d, *v;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_stream_work(s, &st, call);
  d = fk_mem_range(dst, n);
  v = fk_mem_range(src, n);
  if (r == FK_SUCCESS && n != 0 && (d == NULL || v == NULL))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS && n != 0)
    memmove(d, v, n);
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice,
                                        CUdeviceptr srcDevice,
                                        size_t ByteCount, CUstream hStream) {
  return fk_copy_async(dstDevice, srcDevice, ByteCount, hStream,
                       "cuMemcpyDtoDAsync");
}

FK_EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice,
                                     CUcontext dstContext,
                                     CUdeviceptr srcDevice,
                                     CUcontext srcContext, size_t ByteCount,
                                     CUstream hStream) {
  if (dstContext != &fk_primary || srcContext != &fk_primary)
    return FK_ERROR_INVALID_CONTEXT;
  return fk_copy_async(dstDevice, srcDevice, ByteCount, hStream,
                       "cuMemcpyPeerAsync");
}

FK_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui,
                                    size_t N, CUstream hStream) {
  struct CUstream_st *st;
  unsigned char *d;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_stream_work(hStream, &st, "cuMemsetD32Async");
  d = N > SIZE_MAX / 4 ? NULL : fk_mem_range(dstDevice, N * 4);
  if (r == FK_SUCCESS && N != 0 && (d == NULL || dstDevice % 4 != 0))
    r = FK_ERROR_INVALID_VALUE;
  for (size_t i = 0; r == FK_SUCCESS && i < N; i++)
    memcpy(d + i * 4, &ui, 4);
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* No memory pools (attribute MEMORY_POOLS_SUPPORTED is 0). */
FK_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize,
                                   CUstream hStream) {
  (void)dptr;
  (void)bytesize;
  (void)hStream;
  return FK_ERROR_NOT_SUPPORTED;
}

FK_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  (void)dptr;
  (void)hStream;
  return FK_ERROR_NOT_SUPPORTED;
}

/* ---- pinned host memory (issue 25, step 2) ------------------------------
 * cuMemHostRegister records the range (nothing is locked). What it checks,
 * as the real driver does: a context current, a mapped range, flags it
 * knows, no overlap with a registered range (712), and a range the CPU
 * maps read-only needs CU_MEMHOSTREGISTER_READ_ONLY (the driver docs: "on
 * platforms without ..._USES_HOST_PAGE_TABLES this flag is required in
 * order to register memory mapped to the CPU as read-only"). Env
 * FAKECUDA_HOST_REGISTER_MAX (bytes, read at every call; default 16 GiB)
 * plays the memlock limit: a larger range is CUDA_ERROR_OUT_OF_MEMORY, and
 * 0 refuses every registration. */

#define FK_HOSTREG_PORTABLE 0x01
#define FK_HOSTREG_DEVICEMAP 0x02
#define FK_HOSTREG_IOMEMORY 0x04
#define FK_HOSTREG_READ_ONLY 0x08

struct fk_hostreg {
  struct fk_hostreg *next;
  uintptr_t lo, hi;
};
static struct fk_hostreg *fk_hostregs; /* fk_lock */

/* 1 when [lo, hi) lies in mappings of this process, all writable when
 * want_write; from /proc/self/maps. */
static int fk_range_mapped(uintptr_t lo, uintptr_t hi, int want_write) {
  FILE *f = fopen("/proc/self/maps", "re");
  unsigned long a, b;
  char perms[8];
  uintptr_t at = lo;

  if (f == NULL)
    return 0;
  while (at < hi && fscanf(f, "%lx-%lx %7s%*[^\n]", &a, &b, perms) == 3) {
    if (a <= at && at < b) {
      if (want_write && perms[1] != 'w')
        break;
      at = b;
    }
  }
  fclose(f);
  return at >= hi;
}

static size_t fk_hostreg_max(void) {
  const char *e = getenv("FAKECUDA_HOST_REGISTER_MAX");
  return e != NULL && *e != '\0' ? (size_t)strtoull(e, NULL, 0)
                                 : (size_t)16 << 30;
}

static void fk_hostreg_flags(unsigned flags, char *buf, size_t len) {
  snprintf(buf, len, "%s%s%s%s", flags & FK_HOSTREG_PORTABLE ? " portable" : "",
           flags & FK_HOSTREG_DEVICEMAP ? " devicemap" : "",
           flags & FK_HOSTREG_IOMEMORY ? " iomemory" : "",
           flags & FK_HOSTREG_READ_ONLY ? " read-only" : "");
  if (buf[0] == '\0')
    snprintf(buf, len, " default");
}

FK_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize,
                                        unsigned int Flags) {
  uintptr_t lo = (uintptr_t)p, hi = lo + bytesize;
  struct fk_hostreg *h;
  char words[64];
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  if (r == FK_SUCCESS &&
      (p == NULL || bytesize == 0 || hi < lo ||
       (Flags & ~(unsigned)(FK_HOSTREG_PORTABLE | FK_HOSTREG_DEVICEMAP |
                            FK_HOSTREG_IOMEMORY | FK_HOSTREG_READ_ONLY))))
    r = FK_ERROR_INVALID_VALUE;
  for (h = fk_hostregs; r == FK_SUCCESS && h != NULL; h = h->next)
    if (lo < h->hi && h->lo < hi)
      r = FK_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (r == FK_SUCCESS &&
      !fk_range_mapped(lo, hi, !(Flags & FK_HOSTREG_READ_ONLY)))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS && bytesize > fk_hostreg_max())
    r = FK_ERROR_OUT_OF_MEMORY;
  if (r == FK_SUCCESS) {
    h = calloc(1, sizeof(*h));
    if (h == NULL) {
      r = FK_ERROR_OUT_OF_MEMORY;
    } else {
      h->lo = lo;
      h->hi = hi;
      h->next = fk_hostregs;
      fk_hostregs = h;
    }
  }
  fk_hostreg_flags(Flags, words, sizeof(words));
  fk_log(r, "host-register %#lx size %zu%s", (unsigned long)lo, bytesize,
         words);
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuMemHostUnregister(void *p) {
  struct fk_hostreg **pp, *h = NULL;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  for (pp = &fk_hostregs; r == FK_SUCCESS && *pp != NULL; pp = &(*pp)->next)
    if ((*pp)->lo == (uintptr_t)p) {
      h = *pp;
      *pp = h->next;
      break;
    }
  if (r == FK_SUCCESS && h == NULL)
    r = FK_ERROR_HOST_MEMORY_NOT_REGISTERED;
  /* CUDA wants a range unregistered before it is unmapped: say when not */
  fk_log(r, "host-unregister %#lx%s", (unsigned long)(uintptr_t)p,
         h != NULL && !fk_range_mapped(h->lo, h->hi, 0) ? " (unmapped)" : "");
  free(h);
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* ---- IPC memory --------------------------------------------------------- */

FK_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle,
                                     CUdeviceptr dptr) {
  struct fk_mem_handle h;
  struct fk_mem *m;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_init();
  m = fk_mem_holding(dptr);
  if (r == FK_SUCCESS &&
      (pHandle == NULL || m == NULL || m->opened || m->vmm != NULL))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS) {
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, FK_MEM_MAGIC, sizeof(h.magic));
    h.export_pid = (int32_t)getpid();
    h.fd = m->fd;
    h.size = m->size;
    h.alloc_id = m->alloc_id;
    h.alloc_pid = (int32_t)m->pid;
    memset(pHandle->reserved, 0, sizeof(pHandle->reserved));
    memcpy(pHandle->reserved, &h, sizeof(h));
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

static struct fk_mem *fk_mapping_find(long export_pid,
                                      unsigned long long alloc_id) {
  for (struct fk_mem *m = fk_mems; m != NULL; m = m->next)
    if (m->opened && m->export_pid == export_pid && m->alloc_id == alloc_id)
      return m;
  return NULL;
}

/* Map the exporter's memfd through /proc/<pid>/fd/<fd>. */
static CUresult fk_mapping_new(const struct fk_mem_handle *h,
                               struct fk_mem **out) {
  char path[64];
  struct fk_mem *m;
  size_t maplen = fk_page_round(h->size);
  struct stat st;
  void *p;
  int fd;

  /* the exporter has exited (or closed the memory): as the real driver
   * answers for a dead exporter's handle (measured) */
  snprintf(path, sizeof(path), "/proc/%ld/fd/%d", (long)h->export_pid, h->fd);
  fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return FK_ERROR_INVALID_HANDLE;
  if (!fk_fd_is_alloc(h->export_pid, h->fd, h->alloc_id) ||
      fstat(fd, &st) < 0 || maplen == 0 || (uint64_t)st.st_size < maplen) {
    close(fd);
    return FK_ERROR_INVALID_HANDLE;
  }
  m = calloc(1, sizeof(*m));
  if (m == NULL) {
    close(fd);
    return FK_ERROR_OUT_OF_MEMORY;
  }
  p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd); /* the mapping keeps the memfd alive */
  if (p == MAP_FAILED) {
    free(m);
    return FK_ERROR_OUT_OF_MEMORY;
  }
  m->base = (CUdeviceptr)(uintptr_t)p;
  m->size = (size_t)h->size;
  m->maplen = maplen;
  m->fd = -1;
  m->opened = 1;
  m->refs = 1;
  m->pid = h->alloc_pid;
  m->alloc_id = h->alloc_id;
  m->export_pid = h->export_pid;
  m->buffer_id = ++fk_buffer_ids;
  m->next = fk_mems;
  fk_mems = m;
  *out = m;
  return FK_SUCCESS;
}

FK_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr,
                                         CUipcMemHandle handle,
                                         unsigned int Flags) {
  struct fk_mem_handle h;
  struct fk_mem *m = NULL;
  char name[48] = "invalid";
  CUresult r;

  memcpy(&h, handle.reserved, sizeof(h));
  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  if (r == FK_SUCCESS &&
      (pdptr == NULL || (Flags & ~FK_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0 ||
       memcmp(h.magic, FK_MEM_MAGIC, sizeof(h.magic)) != 0))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS)
    snprintf(name, sizeof(name), "m%ld.%llu", (long)h.alloc_pid,
             (unsigned long long)h.alloc_id);
  /* one's own memory: refused, as the real driver does (measured:
   * "invalid device context") */
  if (r == FK_SUCCESS && h.export_pid == (int32_t)getpid())
    r = FK_ERROR_INVALID_CONTEXT;
  if (r == FK_SUCCESS)
    r = fk_unsafe("cuIpcOpenMemHandle");
  if (r == FK_SUCCESS) {
    /* opened again: the same pointer, counted (real driver behaviour) */
    m = fk_mapping_find(h.export_pid, h.alloc_id);
    if (m != NULL)
      m->refs++;
    else
      r = fk_mapping_new(&h, &m);
  }
  if (r == FK_SUCCESS) {
    *pdptr = m->base;
    if (m->refs > 1)
      fk_log(r, "ipc-open-mem %s at 0x%llx size %zu (refs %u)", name, m->base,
             m->size, m->refs);
    else
      fk_log(r, "ipc-open-mem %s at 0x%llx size %zu", name, m->base, m->size);
  } else {
    fk_log(r, "ipc-open-mem %s", name);
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  struct fk_mem *m;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_init();
  m = fk_mem_holding(dptr);
  if (r == FK_SUCCESS && (m == NULL || !m->opened || m->base != dptr))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS)
    r = fk_unsafe("cuIpcCloseMemHandle");
  if (r != FK_SUCCESS) {
    fk_log(r, "ipc-close-mem invalid");
  } else if (--m->refs > 0) {
    fk_log(r, "ipc-close-mem m%ld.%llu (refs %u)", m->pid, m->alloc_id,
           m->refs);
  } else {
    fk_log(r, "ipc-close-mem m%ld.%llu", m->pid, m->alloc_id);
    munmap((void *)(uintptr_t)m->base, m->maplen);
    fk_mem_unlink(m);
    free(m);
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* ---- VMM: cuMemCreate and POSIX file descriptors (issue 25) -------------
 * An allocation is a memfd named "fakecuda-vmm-<pid>-<id>"; its handle a
 * struct fk_vmm. Export dups the memfd (the descriptor keeps the memory
 * alive, as the real driver's does, measured); import dups the descriptor
 * it is given and names the allocation from the memfd's name; map maps the
 * memfd over a reservation (PROT_NONE until cuMemSetAccess), which joins
 * fk_mems so that copies and cuMemGetAddressRange see it. FAKECUDA_NO_VMM=1
 * answers 0 for the POSIX-descriptor attribute and refuses cuMemCreate and
 * cuMemImportFromShareableHandle with CUDA_ERROR_NOT_SUPPORTED. */

#ifndef FAKECUDA_DECLS_CHECK
typedef unsigned long long CUmemGenericAllocationHandle;
typedef int CUmemAllocationHandleType;
typedef int CUmemAllocationGranularity_flags;
typedef struct CUmemLocation_st {
  int type;
  int id;
} CUmemLocation;
typedef struct CUmemAllocationProp_st {
  int type;
  CUmemAllocationHandleType requestedHandleTypes;
  CUmemLocation location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;
typedef struct CUmemAccessDesc_st {
  CUmemLocation location;
  int flags;
} CUmemAccessDesc;
#endif

#define FK_MEM_ALLOCATION_TYPE_PINNED 1
#define FK_MEM_HANDLE_TYPE_NONE 0
#define FK_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1
#define FK_MEM_LOCATION_TYPE_DEVICE 1
#define FK_MEM_ACCESS_FLAGS_PROT_READ 1
#define FK_MEM_ACCESS_FLAGS_PROT_READWRITE 3
#define FK_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define FK_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS 122
#define FK_STREAM_WAIT_VALUE_GEQ 0x0
#define FK_STREAM_WRITE_VALUE_DEFAULT 0x0
#define FK_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 103
#define FK_VMM_GRANULARITY ((size_t)2 << 20) /* the H200's, measured */
#ifdef FAKECUDA_DECLS_CHECK
FK_SAME(FK_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_ALLOCATION_TYPE_PINNED);
FK_SAME(FK_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
FK_SAME(FK_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE);
FK_SAME(FK_MEM_ACCESS_FLAGS_PROT_READ, CU_MEM_ACCESS_FLAGS_PROT_READ);
FK_SAME(FK_MEM_ACCESS_FLAGS_PROT_READWRITE,
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
FK_SAME(FK_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
        CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS);
FK_SAME(FK_STREAM_WAIT_VALUE_GEQ, CU_STREAM_WAIT_VALUE_GEQ);
FK_SAME(FK_STREAM_WRITE_VALUE_DEFAULT, CU_STREAM_WRITE_VALUE_DEFAULT);
FK_SAME(FK_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
FK_SAME(FK_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
#endif

struct fk_vmm {
  struct fk_vmm *next;
  int fd;          /* the memfd (created or imported: our own dup) */
  size_t size;
  long pid;        /* the creating process and its id: the name mP.N */
  unsigned long long id;
  int exportable;  /* created with the POSIX descriptor handle type */
  int imported;
  int released;    /* cuMemRelease'd: freed when its last map goes */
  unsigned maps;
};

/* A reserved range of addresses (cuMemAddressReserve). */
struct fk_va {
  struct fk_va *next;
  CUdeviceptr base;
  size_t size;
};

static struct fk_vmm *fk_vmms;
static struct fk_va *fk_vas;
static unsigned long long fk_vmm_ids;
/* read at every call, so that a test may turn it on for one client */
static int fk_vmm_off(void) {
  const char *v = getenv("FAKECUDA_NO_VMM");
  return v != NULL && strcmp(v, "1") == 0;
}

/* ---- stream memory operations (64-bit) ----
 * cuStreamWriteValue64 stores at once, or in busy mode (work in flight)
 * when the stream is next synchronised (cuStreamSynchronize of it, or
 * cuCtxSynchronize): a producer killed in between never wrote it, as on a
 * GPU. cuStreamWaitValue64 cannot block: it logs whether the value was
 * there when the wait was queued ("(unmet)" when not). Log lines:
 *   write-value S M+0xOFF V [(deferred)|(capturing)]
 *   wait-value S M+0xOFF >= V [(unmet)|(capturing)]
 * FAKECUDA_NO_MEMOPS=1 (read at each call): the attribute
 * CAN_USE_64_BIT_STREAM_MEM_OPS is 0 and both calls fail with
 * CUDA_ERROR_NOT_SUPPORTED. */
static int fk_memops_off(void) {
  const char *v = getenv("FAKECUDA_NO_MEMOPS");
  return v != NULL && strcmp(v, "1") == 0;
}

struct fk_write {
  struct fk_write *next;
  CUdeviceptr p;
  cuuint64_t value;
  char on[32]; /* the stream's label */
};
static struct fk_write *fk_writes;

/* The deferred writes of stream on (NULL: every stream), done now. */
static void fk_writes_flush(const char *on) {
  struct fk_write **pw = &fk_writes;
  while (*pw != NULL) {
    struct fk_write *w = *pw;
    if (on != NULL && strcmp(w->on, on) != 0) {
      pw = &w->next;
      continue;
    }
    *pw = w->next;
    void *d = fk_mem_range(w->p, 8);
    if (d != NULL)
      memcpy(d, &w->value, 8);
    free(w);
  }
}

/* "mP.N+0xOFF" for device pointer p, or "invalid". */
static void fk_mem_at(CUdeviceptr p, char *buf, size_t len) {
  struct fk_mem *m = fk_mem_holding(p);
  if (m == NULL)
    snprintf(buf, len, "invalid");
  else
    snprintf(buf, len, "m%ld.%llu+0x%llx", m->pid, m->alloc_id,
             (unsigned long long)(p - m->base));
}

/* What both memory operations check first (fk_lock held): the stream,
 * the word (8-aligned in device memory: *d its host address) and flags. */
static CUresult fk_memop_check(CUstream stream, CUdeviceptr addr,
                               unsigned flags, const char *call,
                               struct CUstream_st **st, void **d) {
  CUresult r = fk_memops_off() ? FK_ERROR_NOT_SUPPORTED
                               : fk_stream_work(stream, st, call);
  *d = fk_mem_range(addr, 8);
  if (r == FK_SUCCESS && (*d == NULL || addr % 8 != 0 || flags != 0))
    r = FK_ERROR_INVALID_VALUE;
  return r;
}

FK_EXPORT CUresult cuStreamWriteValue64_v2(CUstream stream, CUdeviceptr addr,
                                           cuuint64_t value,
                                           unsigned int flags) {
  struct CUstream_st *st = NULL;
  const char *how = "";
  char at[64];
  void *d;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  /* FK_STREAM_WRITE_VALUE_DEFAULT, the only flags modelled, is 0 */
  r = fk_memop_check(stream, addr, flags, "cuStreamWriteValue64", &st, &d);
  if (r == FK_SUCCESS && st != NULL && st->capture == FK_CAPTURE_STATUS_ACTIVE) {
    how = " (capturing)"; /* a node of the graph: written when it runs */
  } else if (r == FK_SUCCESS && atomic_load(&fk_busy_on)) {
    struct fk_write *w = calloc(1, sizeof(*w));
    if (w == NULL) {
      r = FK_ERROR_OUT_OF_MEMORY;
    } else {
      w->p = addr;
      w->value = value;
      snprintf(w->on, sizeof(w->on), "%s", fk_stream_label(stream));
      w->next = fk_writes;
      fk_writes = w;
      how = " (deferred)";
    }
  } else if (r == FK_SUCCESS) {
    memcpy(d, &value, 8);
  }
  fk_mem_at(addr, at, sizeof(at));
  fk_log(r, "write-value %s %s %llu%s", fk_stream_label(stream), at,
         (unsigned long long)value, how);
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuStreamWaitValue64_v2(CUstream stream, CUdeviceptr addr,
                                          cuuint64_t value,
                                          unsigned int flags) {
  struct CUstream_st *st = NULL;
  const char *how = "";
  cuuint64_t now = 0;
  char at[64];
  void *d;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  /* FK_STREAM_WAIT_VALUE_GEQ, the only flags modelled, is 0 */
  r = fk_memop_check(stream, addr, flags, "cuStreamWaitValue64", &st, &d);
  if (r == FK_SUCCESS) {
    memcpy(&now, d, 8);
    if (st != NULL && st->capture == FK_CAPTURE_STATUS_ACTIVE)
      how = " (capturing)";
    else if ((int64_t)(now - value) < 0)
      how = " (unmet)";
  }
  fk_mem_at(addr, at, sizeof(at));
  fk_log(r, "wait-value %s %s >= %llu%s", fk_stream_label(stream), at,
         (unsigned long long)value, how);
  pthread_mutex_unlock(&fk_lock);
  return r;
}

static struct fk_vmm *fk_vmm_get(CUmemGenericAllocationHandle h) {
  for (struct fk_vmm *v = fk_vmms; v != NULL; v = v->next)
    if ((CUmemGenericAllocationHandle)(uintptr_t)v == h && !v->released)
      return v;
  return NULL;
}

static void fk_vmm_free_if_done(struct fk_vmm *v) {
  struct fk_vmm **pp = &fk_vmms;

  if (!v->released || v->maps > 0)
    return;
  close(v->fd);
  while (*pp != v)
    pp = &(*pp)->next;
  *pp = v->next;
  free(v);
}

static struct fk_va *fk_va_holding(CUdeviceptr p, size_t n) {
  for (struct fk_va *a = fk_vas; a != NULL; a = a->next)
    if (p >= a->base && p - a->base <= a->size && n <= a->size - (p - a->base))
      return a;
  return NULL;
}

static CUresult fk_vmm_prop_ok(const CUmemAllocationProp *prop) {
  if (prop == NULL || prop->type != FK_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != FK_MEM_LOCATION_TYPE_DEVICE)
    return FK_ERROR_INVALID_VALUE;
  return prop->location.id == 0 ? FK_SUCCESS : FK_ERROR_INVALID_DEVICE;
}

FK_EXPORT CUresult cuMemGetAllocationGranularity(
    size_t *granularity, const CUmemAllocationProp *prop,
    CUmemAllocationGranularity_flags option) {
  CUresult r = fk_need_init();

  if (r == FK_SUCCESS && (granularity == NULL || option < 0 || option > 1))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS)
    r = fk_vmm_prop_ok(prop);
  if (r == FK_SUCCESS)
    *granularity = FK_VMM_GRANULARITY;
  return r;
}

FK_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle,
                               size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
  struct fk_vmm *v = NULL;
  char name[64];
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  if (r == FK_SUCCESS && fk_vmm_off())
    r = FK_ERROR_NOT_SUPPORTED;
  if (r == FK_SUCCESS && (handle == NULL || flags != 0 || size == 0 ||
                          size % FK_VMM_GRANULARITY != 0))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS)
    r = fk_vmm_prop_ok(prop);
  if (r == FK_SUCCESS &&
      (prop->requestedHandleTypes & ~FK_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    r = FK_ERROR_NOT_SUPPORTED;
  if (r == FK_SUCCESS && (v = calloc(1, sizeof(*v))) == NULL)
    r = FK_ERROR_OUT_OF_MEMORY;
  if (r == FK_SUCCESS) {
    v->id = ++fk_vmm_ids;
    v->pid = (long)getpid();
    snprintf(name, sizeof(name), "fakecuda-vmm-%ld-%llu", v->pid, v->id);
    v->fd = memfd_create(name, MFD_CLOEXEC);
    if (v->fd < 0 || ftruncate(v->fd, (off_t)size) < 0) {
      if (v->fd >= 0)
        close(v->fd);
      free(v);
      v = NULL;
      r = FK_ERROR_OUT_OF_MEMORY;
    }
  }
  if (r == FK_SUCCESS) {
    v->size = size;
    v->exportable = prop->requestedHandleTypes != 0;
    v->next = fk_vmms;
    fk_vmms = v;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
    fk_log(r, "vmm-create m%ld.%llu size %zu", v->pid, v->id, size);
  } else {
    fk_log(r, "vmm-create size %zu", size);
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  struct fk_vmm *v;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_init();
  v = fk_vmm_get(handle);
  if (r == FK_SUCCESS && v == NULL)
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS) {
    fk_log(r, "vmm-release m%ld.%llu", v->pid, v->id);
    v->released = 1;
    fk_vmm_free_if_done(v);
  } else {
    fk_log(r, "vmm-release invalid");
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuMemExportToShareableHandle(
    void *shareableHandle, CUmemGenericAllocationHandle handle,
    CUmemAllocationHandleType handleType, unsigned long long flags) {
  struct fk_vmm *v;
  CUresult r;
  int fd = -1;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_init();
  v = fk_vmm_get(handle);
  if (r == FK_SUCCESS &&
      (v == NULL || shareableHandle == NULL || flags != 0 ||
       handleType != FK_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS && !v->exportable)
    r = FK_ERROR_NOT_SUPPORTED;
  if (r == FK_SUCCESS && (fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0)) < 0)
    r = FK_ERROR_OUT_OF_MEMORY;
  if (r == FK_SUCCESS) {
    memcpy(shareableHandle, &fd, sizeof(fd));
    fk_log(r, "vmm-export m%ld.%llu", v->pid, v->id);
  } else {
    fk_log(r, "vmm-export invalid");
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* pid and id of a fake VMM memfd from its name, or 0. */
static int fk_vmm_fd_name(int fd, long *pid, unsigned long long *id) {
  char path[64], link[128];
  ssize_t n;

  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  n = readlink(path, link, sizeof(link) - 1);
  if (n < 0)
    return 0;
  link[n] = '\0';
  return sscanf(link, "/memfd:fakecuda-vmm-%ld-%llu", pid, id) == 2;
}

FK_EXPORT CUresult cuMemImportFromShareableHandle(
    CUmemGenericAllocationHandle *handle, void *osHandle,
    CUmemAllocationHandleType shHandleType) {
  int fd = (int)(intptr_t)osHandle, dup = -1;
  struct fk_vmm *v = NULL;
  unsigned long long id = 0;
  struct stat st;
  long pid = 0;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  if (r == FK_SUCCESS && fk_vmm_off())
    r = FK_ERROR_NOT_SUPPORTED;
  if (r == FK_SUCCESS &&
      (handle == NULL ||
       shHandleType != FK_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS &&
      (!fk_vmm_fd_name(fd, &pid, &id) || fstat(fd, &st) < 0))
    r = FK_ERROR_INVALID_HANDLE;
  if (r == FK_SUCCESS && ((v = calloc(1, sizeof(*v))) == NULL ||
                          (dup = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)) {
    free(v);
    r = FK_ERROR_OUT_OF_MEMORY;
  }
  if (r == FK_SUCCESS) {
    v->fd = dup;
    v->size = (size_t)st.st_size;
    v->pid = pid;
    v->id = id;
    v->imported = 1;
    v->next = fk_vmms;
    fk_vmms = v;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
    fk_log(r, "vmm-import m%ld.%llu size %zu", pid, id, v->size);
  } else {
    fk_log(r, "vmm-import fd");
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size,
                                       size_t alignment, CUdeviceptr addr,
                                       unsigned long long flags) {
  struct fk_va *a = NULL;
  void *p = MAP_FAILED;
  CUresult r;

  (void)addr; /* a hint */
  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  if (r == FK_SUCCESS && (ptr == NULL || size == 0 || flags != 0 ||
                          size % FK_VMM_GRANULARITY != 0 ||
                          (alignment != 0 && alignment > FK_VMM_GRANULARITY)))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS) {
    p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS |
             MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED || (a = calloc(1, sizeof(*a))) == NULL) {
      if (p != MAP_FAILED)
        munmap(p, size);
      r = FK_ERROR_OUT_OF_MEMORY;
    }
  }
  if (r == FK_SUCCESS) {
    a->base = (CUdeviceptr)(uintptr_t)p;
    a->size = size;
    a->next = fk_vas;
    fk_vas = a;
    *ptr = a->base;
  }
  fk_log(r, "vmm-reserve size %zu", size);
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  struct fk_va **pp = &fk_vas, *a;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_init();
  while (*pp != NULL && ((*pp)->base != ptr || (*pp)->size != size))
    pp = &(*pp)->next;
  a = *pp;
  if (r == FK_SUCCESS && a == NULL)
    r = FK_ERROR_INVALID_VALUE;
  /* still mapped: the real driver refuses too */
  for (struct fk_mem *m = fk_mems; r == FK_SUCCESS && m != NULL; m = m->next)
    if (m->vmm && m->base >= ptr && m->base - ptr < size)
      r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS) {
    *pp = a->next;
    munmap((void *)(uintptr_t)a->base, a->size);
    free(a);
  }
  fk_log(r, "vmm-address-free size %zu", size);
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle,
                            unsigned long long flags) {
  struct fk_mem *m = NULL;
  struct fk_vmm *v;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  v = fk_vmm_get(handle);
  if (r == FK_SUCCESS &&
      (v == NULL || flags != 0 || offset != 0 || size == 0 ||
       size > v->size || fk_va_holding(ptr, size) == NULL ||
       fk_mem_holding(ptr) != NULL))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS && (m = calloc(1, sizeof(*m))) == NULL)
    r = FK_ERROR_OUT_OF_MEMORY;
  if (r == FK_SUCCESS &&
      mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED,
           v->fd, 0) == MAP_FAILED) {
    free(m);
    r = FK_ERROR_OUT_OF_MEMORY;
  }
  if (r == FK_SUCCESS) {
    m->base = ptr;
    m->size = size;
    m->maplen = size;
    m->fd = -1;
    m->vmm = v;
    m->pid = v->pid;
    m->alloc_id = v->id;
    m->buffer_id = ++fk_buffer_ids;
    m->next = fk_mems;
    fk_mems = m;
    v->maps++;
    fk_log(r, "vmm-map m%ld.%llu size %zu", v->pid, v->id, size);
  } else {
    fk_log(r, "vmm-map invalid");
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                  const CUmemAccessDesc *desc, size_t count) {
  struct fk_mem *m;
  CUresult r;
  int prot = 0;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  m = fk_mem_holding(ptr);
  if (r == FK_SUCCESS &&
      (m == NULL || m->vmm == NULL || m->base != ptr || m->size != size ||
       desc == NULL || count != 1 ||
       desc[0].location.type != FK_MEM_LOCATION_TYPE_DEVICE))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS && desc[0].location.id != 0)
    r = FK_ERROR_INVALID_DEVICE;
  if (r == FK_SUCCESS) {
    if (desc[0].flags == FK_MEM_ACCESS_FLAGS_PROT_READWRITE)
      prot = PROT_READ | PROT_WRITE;
    else if (desc[0].flags == FK_MEM_ACCESS_FLAGS_PROT_READ)
      prot = PROT_READ;
    else
      r = FK_ERROR_INVALID_VALUE;
  }
  if (r == FK_SUCCESS &&
      mprotect((void *)(uintptr_t)ptr, size, prot) < 0)
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS) {
    m->access = prot;
    fk_log(r, "vmm-access m%ld.%llu %s", m->pid, m->alloc_id,
           prot & PROT_WRITE ? "rw" : "r");
  } else {
    fk_log(r, "vmm-access invalid");
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  struct fk_mem *m;
  struct fk_vmm *v;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_init();
  m = fk_mem_holding(ptr);
  if (r == FK_SUCCESS &&
      (m == NULL || m->vmm == NULL || m->base != ptr || m->size != size))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS) {
    v = m->vmm;
    fk_log(r, "vmm-unmap m%ld.%llu", m->pid, m->alloc_id);
    /* the addresses go back to the reservation */
    (void)mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    fk_mem_unlink(m);
    free(m);
    v->maps--;
    fk_vmm_free_if_done(v);
  } else {
    fk_log(r, "vmm-unmap invalid");
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}
static int fk_vmm_attribute(CUdevice_attribute attrib) {
  if (attrib == FK_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)
    return !fk_memops_off();
  if (attrib != FK_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED &&
      attrib != FK_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
    return 0;
  return !fk_vmm_off();
}
/* ---- end of VMM ---------------------------------------------------------- */

/* ---- events ------------------------------------------------------------- */

static struct CUevent_st *fk_event_new(long pid, unsigned long long id,
                                       unsigned flags, int opened) {
  struct CUevent_st *e = calloc(1, sizeof(*e));
  if (e == NULL)
    return NULL;
  e->magic = FK_MAGIC_EVENT;
  e->pid = pid;
  e->id = id;
  e->flags = flags;
  e->opened = opened;
  snprintf(e->name, sizeof(e->name), "e%ld.%llu", pid, id);
  e->next = fk_events;
  fk_events = e;
  return e;
}

FK_EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
  const unsigned known = FK_EVENT_BLOCKING_SYNC | FK_EVENT_DISABLE_TIMING |
                         FK_EVENT_INTERPROCESS;
  struct CUevent_st *e = NULL;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  /* interprocess events must not time (the real driver refuses them) */
  if (r == FK_SUCCESS &&
      (phEvent == NULL || (Flags & ~known) != 0 ||
       ((Flags & FK_EVENT_INTERPROCESS) &&
        !(Flags & FK_EVENT_DISABLE_TIMING))))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS) {
    e = fk_event_new((long)getpid(), fk_event_ids + 1, Flags, 0);
    if (e == NULL)
      r = FK_ERROR_OUT_OF_MEMORY;
  }
  if (r == FK_SUCCESS) {
    fk_event_ids++;
    *phEvent = e;
    fk_log(r, "event-create %s%s%s%s%s", e->name, Flags == 0 ? " default" : "",
           Flags & FK_EVENT_BLOCKING_SYNC ? " blocking-sync" : "",
           Flags & FK_EVENT_DISABLE_TIMING ? " disable-timing" : "",
           Flags & FK_EVENT_INTERPROCESS ? " interprocess" : "");
  } else {
    fk_log(r, "event-create invalid");
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) {
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_event_get(hEvent);
  if (r == FK_SUCCESS)
    hEvent->destroyed = 1;
  fk_log(r, "event-destroy %s", fk_event_label(hEvent));
  pthread_mutex_unlock(&fk_lock);
  return r;
}

static CUresult fk_record(CUevent e, CUstream s, unsigned flags) {
  struct CUstream_st *st = NULL;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_event_get(e);
  if (r == FK_SUCCESS && (flags & ~FK_EVENT_RECORD_EXTERNAL) != 0)
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS)
    r = fk_stream_work(s, &st, "cuEventRecord");
  if (r == FK_SUCCESS) {
    if (st != NULL && st->capture == FK_CAPTURE_STATUS_ACTIVE) {
      /* a plain record becomes a node inside the graph; an external one
       * records the event itself each time the graph runs */
      e->capture_id = (flags & FK_EVENT_RECORD_EXTERNAL) ? 0 : st->capture_id;
    } else {
      e->capture_id = 0;
      e->synced = 0;
      snprintf(e->recorded_on, sizeof(e->recorded_on), "%s",
               fk_stream_label(s));
    }
  }
  fk_log(r, "%s %s on %s%s",
         flags & FK_EVENT_RECORD_EXTERNAL ? "record-external" : "record",
         fk_event_label(e), fk_stream_label(s), fk_capturing_suffix(st));
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  return fk_record(hEvent, hStream, 0);
}

FK_EXPORT CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream,
                                          unsigned int flags) {
  return fk_record(hEvent, hStream, flags);
}

/* An event whose latest record was captured into a live capture has no
 * state of its own yet. */
static CUresult fk_event_settled(CUevent e) {
  return fk_capture_live(e->capture_id) ? FK_ERROR_CAPTURED_EVENT
                                        : FK_SUCCESS;
}

FK_EXPORT CUresult cuEventQuery(CUevent hEvent) {
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_event_get(hEvent);
  if (r == FK_SUCCESS)
    r = fk_event_settled(hEvent);
  if (r == FK_SUCCESS)
    r = fk_unsafe("cuEventQuery");
  if (r == FK_SUCCESS && atomic_load(&fk_busy_on) && !hEvent->synced)
    r = FK_ERROR_NOT_READY;
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* Busy mode: the host has waited for the latest record of every event
 * recorded on the stream labelled on (NULL: on any stream). */
static void fk_writes_flush(const char *on);

static void fk_events_synced(const char *on) {
  fk_writes_flush(on);
  for (struct CUevent_st *e = fk_events; e != NULL; e = e->next) {
    if (!e->destroyed && e->capture_id == 0 && e->recorded_on[0] != '\0' &&
        (on == NULL || strcmp(e->recorded_on, on) == 0))
      e->synced = 1;
  }
}

FK_EXPORT CUresult cuEventSynchronize(CUevent hEvent) {
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_event_get(hEvent);
  if (r == FK_SUCCESS)
    r = fk_event_settled(hEvent);
  if (r == FK_SUCCESS)
    r = fk_unsafe("cuEventSynchronize");
  if (r == FK_SUCCESS)
    hEvent->synced = 1;
  fk_log(r, "event-synchronize %s", fk_event_label(hEvent));
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle *pHandle,
                                       CUevent event) {
  struct fk_event_handle h;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_event_get(event);
  if (r == FK_SUCCESS &&
      (pHandle == NULL || !(event->flags & FK_EVENT_INTERPROCESS)))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS) {
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, FK_EVENT_MAGIC, sizeof(h.magic));
    h.pid = (int32_t)event->pid;
    h.id = event->id;
    memset(pHandle->reserved, 0, sizeof(pHandle->reserved));
    memcpy(pHandle->reserved, &h, sizeof(h));
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* A new local object each time, named as in its creator. Whether the
 * creator is still alive is not checked (not measured on the real one). */
FK_EXPORT CUresult cuIpcOpenEventHandle(CUevent *phEvent,
                                        CUipcEventHandle handle) {
  struct fk_event_handle h;
  struct CUevent_st *e = NULL;
  CUresult r;

  memcpy(&h, handle.reserved, sizeof(h));
  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  if (r == FK_SUCCESS &&
      (phEvent == NULL ||
       memcmp(h.magic, FK_EVENT_MAGIC, sizeof(h.magic)) != 0))
    r = FK_ERROR_INVALID_VALUE;
  /* one's own event: refused like one's own memory (the library never
   * asks; not measured for events) */
  if (r == FK_SUCCESS && h.pid == (int32_t)getpid())
    r = FK_ERROR_INVALID_CONTEXT;
  if (r == FK_SUCCESS) {
    e = fk_event_new((long)h.pid, (unsigned long long)h.id,
                     FK_EVENT_DISABLE_TIMING | FK_EVENT_INTERPROCESS, 1);
    if (e == NULL)
      r = FK_ERROR_OUT_OF_MEMORY;
  }
  if (r == FK_SUCCESS) {
    *phEvent = e;
    fk_log(r, "ipc-open-event %s", e->name);
  } else if (memcmp(h.magic, FK_EVENT_MAGIC, sizeof(h.magic)) == 0) {
    fk_log(r, "ipc-open-event e%ld.%llu", (long)h.pid,
           (unsigned long long)h.id);
  } else {
    fk_log(r, "ipc-open-event invalid");
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* ---- streams ------------------------------------------------------------ */

FK_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  struct CUstream_st *s = NULL;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_ctx();
  if (r == FK_SUCCESS &&
      (phStream == NULL || (Flags & ~FK_STREAM_NON_BLOCKING) != 0))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS && (s = calloc(1, sizeof(*s))) == NULL)
    r = FK_ERROR_OUT_OF_MEMORY;
  if (r == FK_SUCCESS) {
    s->magic = FK_MAGIC_STREAM;
    s->id = ++fk_stream_ids;
    s->flags = Flags;
    snprintf(s->name, sizeof(s->name), "s%llu", s->id);
    s->next = fk_streams;
    fk_streams = s;
    *phStream = s;
    fk_log(r, "stream-create %s %s", s->name,
           Flags & FK_STREAM_NON_BLOCKING ? "nonblocking" : "default");
  } else {
    fk_log(r, "stream-create invalid");
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  struct CUstream_st *st;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_stream_get(hStream, &st);
  if (r == FK_SUCCESS && st == NULL)
    r = FK_ERROR_INVALID_HANDLE; /* the default streams are not ours */
  if (r == FK_SUCCESS) {
    st->destroyed = 1;
    st->capture = FK_CAPTURE_STATUS_NONE;
  }
  fk_log(r, "stream-destroy %s", fk_stream_label(hStream));
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags) {
  struct CUstream_st *st;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_stream_get(hStream, &st);
  if (r == FK_SUCCESS && flags == NULL)
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS)
    *flags = st != NULL ? st->flags : 0;
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx) {
  struct CUstream_st *st;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_stream_get(hStream, &st);
  if (r == FK_SUCCESS && pctx == NULL)
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS)
    *pctx = &fk_primary;
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* Unique in the process and never reused; the NULL stream is the legacy
 * stream (entry points resolved for legacy default-stream semantics). */
FK_EXPORT CUresult cuStreamGetId(CUstream hStream,
                                 unsigned long long *streamId) {
  struct CUstream_st *st;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_stream_get(hStream, &st);
  if (r == FK_SUCCESS && streamId == NULL)
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS)
    *streamId = st != NULL                         ? st->id
                : hStream == FK_STREAM_PER_THREAD ? FK_PER_THREAD_ID
                                                   : FK_LEGACY_ID;
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* Querying or synchronising a capturing stream is not allowed, in any
 * mode, and invalidates its capture. */
static CUresult fk_stream_settled(struct CUstream_st *st, const char *call) {
  if (st == NULL || st->capture == FK_CAPTURE_STATUS_NONE)
    return FK_SUCCESS;
  fk_capture_invalidate(st->capture_id, call);
  return FK_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

FK_EXPORT CUresult cuStreamQuery(CUstream hStream) {
  struct CUstream_st *st;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_stream_get(hStream, &st);
  if (r == FK_SUCCESS)
    r = fk_stream_settled(st, "cuStreamQuery");
  if (r == FK_SUCCESS)
    r = fk_unsafe("cuStreamQuery");
  if (r == FK_SUCCESS && atomic_load(&fk_busy_on))
    r = FK_ERROR_NOT_READY;
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
  struct CUstream_st *st;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_stream_get(hStream, &st);
  if (r == FK_SUCCESS)
    r = fk_stream_settled(st, "cuStreamSynchronize");
  if (r == FK_SUCCESS)
    r = fk_unsafe("cuStreamSynchronize");
  if (r == FK_SUCCESS)
    fk_events_synced(fk_stream_label(hStream));
  fk_log(r, "stream-synchronize %s", fk_stream_label(hStream));
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* Inside a capture a plain wait may only join work captured in the same
 * capture; on an event recorded outside it the real driver refuses the
 * wait and invalidates the capture (measured; CUDA_ERROR_STREAM_CAPTURE_
 * ISOLATION is our guess at the code), and on one captured elsewhere it
 * would merge two captures. A stream that is not capturing and waits on an
 * event captured in a live capture joins that capture (a fork). The
 * external wait is a node that waits for the event when the graph runs. */
FK_EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent,
                                     unsigned int Flags) {
  struct CUstream_st *st = NULL, *origin;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_event_get(hEvent);
  if (r == FK_SUCCESS && (Flags & ~FK_EVENT_WAIT_EXTERNAL) != 0)
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS)
    r = fk_stream_work(hStream, &st, "cuStreamWaitEvent");
  if (r == FK_SUCCESS && st != NULL && !(Flags & FK_EVENT_WAIT_EXTERNAL)) {
    int event_live = fk_capture_live(hEvent->capture_id);
    if (st->capture == FK_CAPTURE_STATUS_ACTIVE &&
        hEvent->capture_id != st->capture_id) {
      r = event_live ? FK_ERROR_STREAM_CAPTURE_MERGE
                     : FK_ERROR_STREAM_CAPTURE_ISOLATION;
      fk_capture_invalidate(st->capture_id, "cuStreamWaitEvent");
    } else if (st->capture == FK_CAPTURE_STATUS_NONE && event_live &&
               (origin = fk_capture_origin(hEvent->capture_id)) != NULL) {
      st->capture = origin->capture;
      st->capture_mode = origin->capture_mode;
      st->capture_thread = origin->capture_thread;
      st->capture_id = origin->capture_id;
      st->capture_origin = 0;
    }
  }
  fk_log(r, "%s %s on %s%s",
         Flags & FK_EVENT_WAIT_EXTERNAL ? "wait-external" : "wait",
         fk_stream_label(hStream), fk_event_label(hEvent),
         fk_capturing_suffix(st));
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* ---- capture and graphs ------------------------------------------------- */

FK_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  int m;
  if (mode == NULL || (int)*mode < FK_CAPTURE_MODE_GLOBAL ||
      (int)*mode > FK_CAPTURE_MODE_RELAXED)
    return FK_ERROR_INVALID_VALUE;
  m = fk_thread_mode;
  fk_thread_mode = (int)*mode;
  *mode = m;
  return FK_SUCCESS;
}

/* The legacy stream cannot be captured; the per-thread stream can be on a
 * real GPU but is not modelled here (CUDA_ERROR_NOT_SUPPORTED). */
FK_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream,
                                           CUstreamCaptureMode mode) {
  static const char *const names[] = {"global", "thread-local", "relaxed"};
  struct CUstream_st *st;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_stream_get(hStream, &st);
  if (r == FK_SUCCESS && ((int)mode < FK_CAPTURE_MODE_GLOBAL ||
                          (int)mode > FK_CAPTURE_MODE_RELAXED))
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS && st == NULL)
    r = fk_is_legacy(hStream) ? FK_ERROR_STREAM_CAPTURE_UNSUPPORTED
                              : FK_ERROR_NOT_SUPPORTED;
  if (r == FK_SUCCESS && st->capture != FK_CAPTURE_STATUS_NONE)
    r = FK_ERROR_ILLEGAL_STATE;
  if (r == FK_SUCCESS) {
    st->capture = FK_CAPTURE_STATUS_ACTIVE;
    st->capture_mode = (int)mode;
    st->capture_origin = 1;
    st->capture_id = ++fk_capture_ids;
    st->capture_thread = pthread_self();
  }
  fk_log(r, "capture-begin %s %s", fk_stream_label(hStream),
         (int)mode >= 0 && (int)mode <= 2 ? names[(int)mode] : "invalid");
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuStreamIsCapturing(CUstream hStream,
                                       CUstreamCaptureStatus *captureStatus) {
  struct CUstream_st *st;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_stream_get(hStream, &st);
  if (r == FK_SUCCESS && captureStatus == NULL)
    r = FK_ERROR_INVALID_VALUE;
  /* measured: asking about the legacy stream while this thread captures */
  if (r == FK_SUCCESS && fk_is_legacy(hStream) && fk_thread_strict_capture())
    r = FK_ERROR_STREAM_CAPTURE_IMPLICIT;
  if (r == FK_SUCCESS)
    *captureStatus = st != NULL ? st->capture : FK_CAPTURE_STATUS_NONE;
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
  struct CUstream_st *st;
  struct CUgraph_st *g = NULL;
  unsigned long long id = 0;
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_stream_get(hStream, &st);
  if (r == FK_SUCCESS && phGraph == NULL)
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS && (st == NULL || st->capture == FK_CAPTURE_STATUS_NONE))
    r = FK_ERROR_ILLEGAL_STATE;
  if (r == FK_SUCCESS && !st->capture_origin)
    r = FK_ERROR_STREAM_CAPTURE_UNMATCHED;
  if (r == FK_SUCCESS && st->capture_mode != FK_CAPTURE_MODE_RELAXED &&
      !pthread_equal(st->capture_thread, pthread_self()))
    r = FK_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  if (r == FK_SUCCESS) {
    id = st->capture_id;
    if (st->capture == FK_CAPTURE_STATUS_INVALIDATED)
      r = FK_ERROR_STREAM_CAPTURE_INVALIDATED;
    /* the capture ends for every stream that joined it */
    for (struct CUstream_st *s = fk_streams; s != NULL; s = s->next)
      if (s->capture != FK_CAPTURE_STATUS_NONE && s->capture_id == id)
        s->capture = FK_CAPTURE_STATUS_NONE;
    *phGraph = NULL;
  }
  if (r == FK_SUCCESS && (g = calloc(1, sizeof(*g))) == NULL)
    r = FK_ERROR_OUT_OF_MEMORY;
  if (r == FK_SUCCESS) {
    g->magic = FK_MAGIC_GRAPH;
    g->id = ++fk_graph_ids;
    g->next = fk_graphs;
    fk_graphs = g;
    *phGraph = g;
    fk_log(r, "capture-end %s g%llu", fk_stream_label(hStream), g->id);
  } else {
    fk_log(r, "capture-end %s", fk_stream_label(hStream));
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec,
                                               CUgraph hGraph,
                                               unsigned long long flags) {
  struct CUgraphExec_st *x = NULL;
  CUresult r;

  (void)flags;
  pthread_mutex_lock(&fk_lock);
  r = fk_need_init();
  if (r == FK_SUCCESS && phGraphExec == NULL)
    r = FK_ERROR_INVALID_VALUE;
  if (r == FK_SUCCESS &&
      (hGraph == NULL || hGraph->magic != FK_MAGIC_GRAPH || hGraph->destroyed))
    r = FK_ERROR_INVALID_HANDLE;
  if (r == FK_SUCCESS && (x = calloc(1, sizeof(*x))) == NULL)
    r = FK_ERROR_OUT_OF_MEMORY;
  if (r == FK_SUCCESS) {
    x->magic = FK_MAGIC_EXEC;
    x->graph_id = hGraph->id;
    x->next = fk_execs;
    fk_execs = x;
    *phGraphExec = x;
    fk_log(r, "graph-instantiate g%llu", x->graph_id);
  } else {
    fk_log(r, "graph-instantiate invalid");
  }
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* Logged only: the nodes a capture recorded are not kept, so a launch does
 * not replay them. */
FK_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  struct CUstream_st *st = NULL;
  char graph[32] = "invalid";
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_init();
  if (r == FK_SUCCESS &&
      (hGraphExec == NULL || hGraphExec->magic != FK_MAGIC_EXEC ||
       hGraphExec->destroyed))
    r = FK_ERROR_INVALID_HANDLE;
  if (r == FK_SUCCESS) {
    snprintf(graph, sizeof(graph), "g%llu", hGraphExec->graph_id);
    r = fk_stream_work(hStream, &st, "cuGraphLaunch");
  }
  fk_log(r, "graph-launch %s on %s%s", graph, fk_stream_label(hStream),
         fk_capturing_suffix(st));
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_init();
  if (r == FK_SUCCESS &&
      (hGraphExec == NULL || hGraphExec->magic != FK_MAGIC_EXEC ||
       hGraphExec->destroyed))
    r = FK_ERROR_INVALID_HANDLE;
  if (r == FK_SUCCESS)
    hGraphExec->destroyed = 1;
  pthread_mutex_unlock(&fk_lock);
  return r;
}

FK_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
  CUresult r;

  pthread_mutex_lock(&fk_lock);
  r = fk_need_init();
  if (r == FK_SUCCESS &&
      (hGraph == NULL || hGraph->magic != FK_MAGIC_GRAPH || hGraph->destroyed))
    r = FK_ERROR_INVALID_HANDLE;
  if (r == FK_SUCCESS)
    hGraph->destroyed = 1;
  pthread_mutex_unlock(&fk_lock);
  return r;
}

/* ---- kernels: not supported --------------------------------------------- */

FK_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  (void)module;
  (void)image;
  return FK_ERROR_NOT_SUPPORTED;
}

/* No module can exist, so every module or function handle is invalid. */
FK_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod,
                                       const char *name) {
  (void)hfunc;
  (void)hmod;
  (void)name;
  return FK_ERROR_INVALID_HANDLE;
}

FK_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
  (void)hmod;
  return FK_ERROR_INVALID_HANDLE;
}

FK_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX,
                                  unsigned int gridDimY, unsigned int gridDimZ,
                                  unsigned int blockDimX,
                                  unsigned int blockDimY,
                                  unsigned int blockDimZ,
                                  unsigned int sharedMemBytes,
                                  CUstream hStream, void **kernelParams,
                                  void **extra) {
  (void)f;
  (void)gridDimX;
  (void)gridDimY;
  (void)gridDimZ;
  (void)blockDimX;
  (void)blockDimY;
  (void)blockDimZ;
  (void)sharedMemBytes;
  (void)hStream;
  (void)kernelParams;
  (void)extra;
  return FK_ERROR_INVALID_HANDLE;
}

/* ---- cuGetProcAddress --------------------------------------------------- */

/* GCC exempts casts to void (*)(void) from -Wcast-function-type. */
typedef void (*fk_fn)(void);
#define FK_PROC(base, fn) {base, (fk_fn)fn}

FK_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn,
                                       int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult
                                           *symbolStatus);

/* By base name, for every cudaVersion and flags: each name gets the ABI
 * the CUDA 12.0 API gives it (the one libtensorbroker asks for), and the
 * NULL stream is always the legacy one. */
static const struct {
  const char *base;
  fk_fn fn;
} fk_procs[] = {
    FK_PROC("cuInit", cuInit),
    FK_PROC("cuDriverGetVersion", cuDriverGetVersion),
    FK_PROC("cuGetErrorName", cuGetErrorName),
    FK_PROC("cuGetErrorString", cuGetErrorString),
    FK_PROC("cuGetProcAddress", cuGetProcAddress_v2),
    FK_PROC("cuDeviceGetCount", cuDeviceGetCount),
    FK_PROC("cuDeviceGet", cuDeviceGet),
    FK_PROC("cuDeviceGetUuid", cuDeviceGetUuid_v2),
    FK_PROC("cuDeviceGetAttribute", cuDeviceGetAttribute),
    FK_PROC("cuDeviceGetName", cuDeviceGetName),
    FK_PROC("cuDeviceCanAccessPeer", cuDeviceCanAccessPeer),
    FK_PROC("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain),
    FK_PROC("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2),
    FK_PROC("cuCtxGetCurrent", cuCtxGetCurrent),
    FK_PROC("cuCtxSetCurrent", cuCtxSetCurrent),
    FK_PROC("cuCtxGetDevice", cuCtxGetDevice),
    FK_PROC("cuCtxSynchronize", cuCtxSynchronize),
    FK_PROC("cuCtxEnablePeerAccess", cuCtxEnablePeerAccess),
    FK_PROC("cuPointerGetAttribute", cuPointerGetAttribute),
    FK_PROC("cuMemGetAddressRange", cuMemGetAddressRange_v2),
    FK_PROC("cuMemAlloc", cuMemAlloc_v2),
    FK_PROC("cuMemFree", cuMemFree_v2),
    FK_PROC("cuMemcpyHtoD", cuMemcpyHtoD_v2),
    FK_PROC("cuMemcpyDtoH", cuMemcpyDtoH_v2),
    FK_PROC("cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2),
    FK_PROC("cuMemcpyPeerAsync", cuMemcpyPeerAsync),
    FK_PROC("cuMemsetD32Async", cuMemsetD32Async),
    FK_PROC("cuMemAllocAsync", cuMemAllocAsync),
    FK_PROC("cuMemFreeAsync", cuMemFreeAsync),
    /* pinned host memory (issue 25, step 2) */
    FK_PROC("cuMemHostRegister", cuMemHostRegister_v2),
    FK_PROC("cuMemHostUnregister", cuMemHostUnregister),
    FK_PROC("cuStreamWriteValue64", cuStreamWriteValue64_v2),
    FK_PROC("cuStreamWaitValue64", cuStreamWaitValue64_v2),
    FK_PROC("cuIpcGetMemHandle", cuIpcGetMemHandle),
    FK_PROC("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2),
    FK_PROC("cuIpcCloseMemHandle", cuIpcCloseMemHandle),
    FK_PROC("cuIpcGetEventHandle", cuIpcGetEventHandle),
    FK_PROC("cuIpcOpenEventHandle", cuIpcOpenEventHandle),
    FK_PROC("cuEventCreate", cuEventCreate),
    FK_PROC("cuEventDestroy", cuEventDestroy_v2),
    FK_PROC("cuEventRecord", cuEventRecord),
    FK_PROC("cuEventRecordWithFlags", cuEventRecordWithFlags),
    FK_PROC("cuEventQuery", cuEventQuery),
    FK_PROC("cuEventSynchronize", cuEventSynchronize),
    FK_PROC("cuStreamCreate", cuStreamCreate),
    FK_PROC("cuStreamDestroy", cuStreamDestroy_v2),
    FK_PROC("cuStreamGetFlags", cuStreamGetFlags),
    FK_PROC("cuStreamGetCtx", cuStreamGetCtx),
    FK_PROC("cuStreamGetId", cuStreamGetId),
    FK_PROC("cuStreamQuery", cuStreamQuery),
    FK_PROC("cuStreamSynchronize", cuStreamSynchronize),
    FK_PROC("cuStreamWaitEvent", cuStreamWaitEvent),
    FK_PROC("cuStreamIsCapturing", cuStreamIsCapturing),
    FK_PROC("cuStreamBeginCapture", cuStreamBeginCapture_v2),
    FK_PROC("cuStreamEndCapture", cuStreamEndCapture),
    FK_PROC("cuThreadExchangeStreamCaptureMode",
            cuThreadExchangeStreamCaptureMode),
    /* CUDA 12 maps cuGraphInstantiate to the WithFlags signature */
    FK_PROC("cuGraphInstantiate", cuGraphInstantiateWithFlags),
    FK_PROC("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags),
    FK_PROC("cuGraphLaunch", cuGraphLaunch),
    FK_PROC("cuGraphExecDestroy", cuGraphExecDestroy),
    FK_PROC("cuGraphDestroy", cuGraphDestroy),
    FK_PROC("cuModuleLoadData", cuModuleLoadData),
    FK_PROC("cuModuleGetFunction", cuModuleGetFunction),
    FK_PROC("cuModuleUnload", cuModuleUnload),
    FK_PROC("cuLaunchKernel", cuLaunchKernel),
    /* VMM (issue 25) */
    FK_PROC("cuMemGetAllocationGranularity", cuMemGetAllocationGranularity),
    FK_PROC("cuMemCreate", cuMemCreate),
    FK_PROC("cuMemRelease", cuMemRelease),
    FK_PROC("cuMemExportToShareableHandle", cuMemExportToShareableHandle),
    FK_PROC("cuMemImportFromShareableHandle", cuMemImportFromShareableHandle),
    FK_PROC("cuMemAddressReserve", cuMemAddressReserve),
    FK_PROC("cuMemAddressFree", cuMemAddressFree),
    FK_PROC("cuMemMap", cuMemMap),
    FK_PROC("cuMemUnmap", cuMemUnmap),
    FK_PROC("cuMemSetAccess", cuMemSetAccess),
};

FK_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn,
                                       int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult
                                           *symbolStatus) {
  (void)cudaVersion;
  (void)flags;
  if (symbol == NULL || pfn == NULL)
    return FK_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof(fk_procs) / sizeof(fk_procs[0]); i++) {
    if (strcmp(fk_procs[i].base, symbol) == 0) {
      void *p;
      memcpy(&p, &fk_procs[i].fn, sizeof(p));
      *pfn = p;
      if (symbolStatus != NULL)
        *symbolStatus = FK_GET_PROC_ADDRESS_SUCCESS;
      return FK_SUCCESS;
    }
  }
  *pfn = NULL;
  if (symbolStatus != NULL)
    *symbolStatus = FK_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return FK_ERROR_NOT_FOUND;
}

/* ---- test hooks ----------------------------------------------------------- */

FK_EXPORT size_t fakecuda_log_read(char *buf, size_t len) {
  size_t n;

  pthread_mutex_lock(&fk_lock);
  n = fk_memlog_len;
  if (len > 0) {
    size_t c = n < len - 1 ? n : len - 1;
    if (c > 0)
      memcpy(buf, fk_memlog, c);
    buf[c] = '\0';
  }
  pthread_mutex_unlock(&fk_lock);
  return n;
}

FK_EXPORT void fakecuda_log_clear(void) {
  pthread_mutex_lock(&fk_lock);
  fk_memlog_len = 0;
  if (fk_memlog != NULL)
    fk_memlog[0] = '\0';
  pthread_mutex_unlock(&fk_lock);
}

FK_EXPORT size_t fakecuda_log_count(const char *body) {
  size_t n;

  if (body == NULL)
    return 0;
  pthread_mutex_lock(&fk_lock);
  n = fk_memlog != NULL ? fakecuda_text_count(fk_memlog, 0, body) : 0;
  pthread_mutex_unlock(&fk_lock);
  return n;
}

FK_EXPORT void fakecuda_set_busy(int on) { atomic_store(&fk_busy_on, on != 0); }

FK_EXPORT int fakecuda_busy(void) { return atomic_load(&fk_busy_on); }

/* The hooks take any pointer, so they look it up among the objects rather
 * than reading through it. */
FK_EXPORT const char *fakecuda_stream_name(const void *stream) {
  const char *name = "invalid";
  CUstream s = (CUstream)(uintptr_t)stream;

  if (fk_is_default(s))
    return fk_stream_label(s);
  pthread_mutex_lock(&fk_lock);
  for (struct CUstream_st *x = fk_streams; x != NULL; x = x->next)
    if (x == s)
      name = x->name;
  pthread_mutex_unlock(&fk_lock);
  return name;
}

static struct CUevent_st *fk_event_lookup(const void *event) {
  for (struct CUevent_st *x = fk_events; x != NULL; x = x->next)
    if ((const void *)x == event)
      return x;
  return NULL;
}

FK_EXPORT const char *fakecuda_event_name(const void *event) {
  struct CUevent_st *e;
  const char *name;

  pthread_mutex_lock(&fk_lock);
  e = fk_event_lookup(event);
  name = e != NULL ? e->name : "invalid";
  pthread_mutex_unlock(&fk_lock);
  return name;
}

FK_EXPORT const char *fakecuda_event_recorded_on(const void *event) {
  struct CUevent_st *e;
  const char *on;

  pthread_mutex_lock(&fk_lock);
  e = fk_event_lookup(event);
  on = e != NULL ? e->recorded_on : "";
  pthread_mutex_unlock(&fk_lock);
  return on;
}

FK_EXPORT int fakecuda_mem_name(unsigned long long p, char *buf, size_t len) {
  struct fk_mem *m;

  pthread_mutex_lock(&fk_lock);
  m = fk_mem_holding(p);
  if (len > 0) {
    if (m != NULL)
      snprintf(buf, len, "m%ld.%llu", m->pid, m->alloc_id);
    else
      buf[0] = '\0';
  }
  pthread_mutex_unlock(&fk_lock);
  return m != NULL ? 0 : -1;
}

FK_EXPORT void fakecuda_counts(struct fakecuda_counts *out) {
  struct fakecuda_counts c;
  size_t n;

  if (out == NULL)
    return;
  memset(&c, 0, sizeof(c));
  c.struct_size = sizeof(c);
  pthread_mutex_lock(&fk_lock);
  for (struct CUstream_st *s = fk_streams; s != NULL; s = s->next) {
    c.streams += !s->destroyed;
    c.capturing += s->capture != FK_CAPTURE_STATUS_NONE;
  }
  for (struct CUevent_st *e = fk_events; e != NULL; e = e->next) {
    c.events += !e->destroyed;
    c.events_opened += !e->destroyed && e->opened;
  }
  for (struct fk_mem *m = fk_mems; m != NULL; m = m->next) {
    c.allocations += !m->opened && m->vmm == NULL;
    c.vmm_mappings += m->vmm != NULL;
    c.ipc_mappings += m->opened != 0;
    c.ipc_mapping_refs += m->opened ? m->refs : 0;
  }
  for (struct fk_vmm *v = fk_vmms; v != NULL; v = v->next)
    c.vmm_handles += !v->released;
  for (struct CUgraph_st *g = fk_graphs; g != NULL; g = g->next)
    c.graphs += !g->destroyed;
  for (struct CUgraphExec_st *x = fk_execs; x != NULL; x = x->next)
    c.graph_execs += !x->destroyed;
  c.log_dropped = fk_log_dropped;
  for (struct fk_hostreg *h = fk_hostregs; h != NULL; h = h->next)
    c.host_registered++;
  c.log_write_errors = fk_log_errors;
  pthread_mutex_unlock(&fk_lock);
  /* a caller built against an older, shorter struct gets its part */
  n = out->struct_size < sizeof(c) ? out->struct_size : sizeof(c);
  if (n > sizeof(c.struct_size))
    memcpy((char *)out + sizeof(c.struct_size),
           (const char *)&c + sizeof(c.struct_size), n - sizeof(c.struct_size));
}

static const struct fakecuda_hooks fk_hooks = {
    .struct_size = sizeof(struct fakecuda_hooks),
    .log_read = fakecuda_log_read,
    .log_clear = fakecuda_log_clear,
    .log_count = fakecuda_log_count,
    .set_busy = fakecuda_set_busy,
    .busy = fakecuda_busy,
    .stream_name = fakecuda_stream_name,
    .event_name = fakecuda_event_name,
    .event_recorded_on = fakecuda_event_recorded_on,
    .mem_name = fakecuda_mem_name,
    .counts = fakecuda_counts,
};

FK_EXPORT const struct fakecuda_hooks *fakecuda_hooks(void) {
  return &fk_hooks;
}

/* ---- fork --------------------------------------------------------------- */

/* The real driver does not survive fork; the fake does, so that a test may
 * fork producers after loading it. The lock is held across fork so the
 * child never inherits it mid-update; the child's log starts empty (the
 * lines were the parent's). */
static void fk_fork_prepare(void) { pthread_mutex_lock(&fk_lock); }

static void fk_fork_parent(void) { pthread_mutex_unlock(&fk_lock); }

static void fk_fork_child(void) {
  fk_memlog_len = 0;
  if (fk_memlog != NULL)
    fk_memlog[0] = '\0';
  pthread_mutex_unlock(&fk_lock);
}

__attribute__((constructor)) static void fk_setup(void) {
  pthread_atfork(fk_fork_prepare, fk_fork_parent, fk_fork_child);
}
