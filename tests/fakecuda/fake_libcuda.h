/* SPDX-License-Identifier: Apache-2.0 */
/* The fake CUDA driver for CPU tests: its test hooks and its call log.
 *
 * tests/fakecuda builds libcuda.so.1 (target tb_fakecuda) into
 * TB_FAKECUDA_DIR. A test whose LD_LIBRARY_PATH starts with that folder
 * (tb_use_fakecuda() in tests/fakecuda/CMakeLists.txt) gets it instead of
 * the real driver, through libtensorbroker's dlopen("libcuda.so.1") and
 * cuGetProcAddress_v2 as much as through its own dlopen. Nothing links it.
 *
 * What it is: one device (ordinal 0, "Fake CUDA device", a fixed UUID whose
 * byte 0 FAKECUDA_UUID_BYTE=n overrides), driver version 12080, one primary
 * context per process. Device memory is a memfd mapped read-write, so a
 * CUdeviceptr is also a host address; an IPC memory handle names the
 * exporter's pid and fd, and cuIpcOpenMemHandle maps /proc/<pid>/fd/<fd>,
 * so bytes written by a producer really reach a consumer process. All work
 * runs at once on the calling thread (copies are memcpy). Streams, events,
 * graphs are heap objects that are never freed: a call on a destroyed one
 * fails with CUDA_ERROR_INVALID_HANDLE instead of touching freed memory.
 * Kernels are not supported (cuModuleLoadData: CUDA_ERROR_NOT_SUPPORTED),
 * nor are memory pools (attribute 0; cuMemAllocAsync: NOT_SUPPORTED).
 * cuMemHostRegister records ranges and checks them (fake_libcuda.c says
 * what); env FAKECUDA_HOST_REGISTER_MAX=bytes plays the memlock limit.
 * Unlike the real driver it survives fork: the child keeps the parent's
 * objects (its in-memory log starts empty).
 *
 * Measured behaviour it copies (see fake_libcuda.c for each): opening one's
 * own IPC memory handle is CUDA_ERROR_INVALID_CONTEXT (201); opening the
 * handle of a process that has exited is CUDA_ERROR_INVALID_HANDLE (400);
 * opening a handle again in one process returns the same pointer, counted,
 * and cuIpcCloseMemHandle drops one count; cuCtxGetCurrent before cuInit is
 * CUDA_ERROR_NOT_INITIALIZED (3); cuStreamIsCapturing on the legacy stream
 * while the calling thread captures in GLOBAL or THREAD_LOCAL mode is
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (906); a plain cuStreamWaitEvent on a
 * capturing stream for an event recorded outside the capture is refused
 * and invalidates the capture.
 *
 * Busy mode (env FAKECUDA_BUSY=1, read at the first cuInit, or set_busy):
 * cuStreamQuery and cuEventQuery answer CUDA_ERROR_NOT_READY, so the library
 * believes work is in flight: it never skips a done or ready event record
 * and never marks a version complete. Tests of event bookkeeping use it.
 * An event whose latest record the host has waited for (cuEventSynchronize,
 * or cuStreamSynchronize of the stream it was recorded on, or
 * cuCtxSynchronize) queries as complete until it is recorded again;
 * streams stay busy.
 *
 * ---- The call log ------------------------------------------------------
 *
 * Each line is "<pid> <body>\n", pid the process that made the call. It
 * goes to an in-memory buffer (this process's lines; read it with
 * log_read) and, when env FAKECUDA_LOG names a file (read at every logged
 * call), appended to that file with one write() of O_APPEND, so processes
 * can share one file and lines never interleave.
 *
 * Names, stable for the life of the object and across processes:
 *   streams  sN (N = cuStreamGetId, never reused in a process), "legacy"
 *            (CU_STREAM_LEGACY, id 1), "ptds" (CU_STREAM_PER_THREAD, id 2),
 *            "null" (the NULL stream, which is the legacy stream: id 1)
 *   events   eP.N   P the pid of the process that CREATED the event, N its
 *            number there: an IPC event opened in a consumer prints the
 *            same name as in its producer
 *   memory   mP.N   P the allocating process, N its allocation id there
 *            (CU_POINTER_ATTRIBUTE_BUFFER_ID in that process)
 *   graphs   gN
 * A handle that is not a live object of its kind prints as "invalid".
 *
 * Bodies (S a stream, E an event, M memory, G a graph):
 *   stream-create S default|nonblocking
 *   stream-destroy S
 *   stream-synchronize S
 *   event-create E FLAGS      FLAGS: "default", or the words of the flags
 *                             set, in this order: blocking-sync
 *                             disable-timing interprocess
 *   event-destroy E
 *   event-synchronize E
 *   ipc-open-event E          E: the exporter's name for it
 *   record E on S             cuEventRecord, cuEventRecordWithFlags(0)
 *   record-external E on S    cuEventRecordWithFlags(CU_EVENT_RECORD_EXTERNAL)
 *   wait S on E               cuStreamWaitEvent(S, E, 0)
 *   wait-external S on E      cuStreamWaitEvent(S, E, CU_EVENT_WAIT_EXTERNAL)
 *       record and wait lines end in " (capturing)" when S is capturing
 *       (after the call: a wait that forks a capture onto S says so too);
 *       a plain record there is a captured node, nobody outside sees it
 *   mem-alloc M size N        N: the bytes asked for
 *   mem-free M
 *   ipc-open-mem M at 0xADDR size N [(refs K)]   K > 1: opened K times
 *   ipc-close-mem M [(refs K)]                   K > 0: still open K times
 *   ctx-synchronize
 *   capture-begin S global|thread-local|relaxed
 *   capture-end S G
 *   capture-invalidate S by CALL   a capture invalidated by CALL
 *                                  (e.g. cuStreamQuery, cuMemAlloc)
 *   graph-instantiate G
 *   graph-launch G on S [(capturing)]
 *   VMM (cuMemCreate memory shared by POSIX descriptor; M names the
 *   allocation mP.N after its creating process, in every process):
 *   vmm-create M size N       N: rounded to the 2 MiB granularity
 *   vmm-export M
 *   vmm-import M size N       from the descriptor a test or the daemon sent
 *   vmm-reserve size N
 *   vmm-map M size N
 *   vmm-access M r|rw         cuMemSetAccess: read-only or read-write
 *   vmm-unmap M
 *   vmm-address-free size N
 *   vmm-release M
 *   FAKECUDA_NO_VMM=1 (read at each call): the POSIX-descriptor attribute
 *   is 0, and cuMemCreate and cuMemImportFromShareableHandle fail with
 *   CUDA_ERROR_NOT_SUPPORTED.
 *   Stream memory operations (64-bit; FAKECUDA_NO_MEMOPS=1, read at each
 *   call: the attribute CAN_USE_64_BIT_STREAM_MEM_OPS is 0 and both fail
 *   with CUDA_ERROR_NOT_SUPPORTED):
 *   write-value S M+0xOFF V [(deferred)|(capturing)]   cuStreamWriteValue64;
 *                             in busy mode deferred until S is synchronised
 *                             (cuStreamSynchronize of it, cuCtxSynchronize):
 *                             a process killed first never wrote it
 *   wait-value S M+0xOFF >= V [(unmet)|(capturing)]    cuStreamWaitValue64;
 *                             it cannot block: "(unmet)" when the word was
 *                             below V as the wait was queued
 *   host-register 0xADDR size N FLAGS   cuMemHostRegister; FLAGS: "default"
 *                             or the words of those set, in this order:
 *                             portable devicemap iomemory read-only
 *   host-unregister 0xADDR [(unmapped)]   cuMemHostUnregister; "(unmapped)":
 *                             the range was unmapped before it (a bug)
 * A call that fails still logs its line, ending in " -> CUDA_ERROR_NAME",
 * e.g. "record e12.3 on s4 -> CUDA_ERROR_INVALID_HANDLE" for a destroyed
 * stream. Where the failure leaves nothing to name, the line says
 * "invalid" (e.g. "ipc-open-mem invalid -> CUDA_ERROR_INVALID_VALUE").
 * Lines are not written for queries, copies, memsets or handle exports.
 *
 * ---- The hooks -----------------------------------------------------------
 *
 * The fake exports the functions below and fakecuda_hooks(), which returns
 * them all in one struct. Tests do not link the fake: fakecuda() (below)
 * finds the copy the process has loaded, or loads it, with dlopen by its
 * soname, which gives the same copy either way. All hooks are thread-safe
 * and work before cuInit. */
#ifndef TB_TESTS_FAKE_LIBCUDA_H
#define TB_TESTS_FAKE_LIBCUDA_H

#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define FAKECUDA_SONAME "libcuda.so.1"

/* Live objects in this process, for leak checks. */
struct fakecuda_counts {
  size_t struct_size;            /* sizeof(struct fakecuda_counts) */
  unsigned long streams;         /* created, not destroyed */
  unsigned long events;          /* created or opened, not destroyed */
  unsigned long events_opened;   /* of those, opened from an IPC handle */
  unsigned long allocations;     /* cuMemAlloc'ed, not freed */
  unsigned long ipc_mappings;    /* IPC memory mappings open */
  unsigned long ipc_mapping_refs;/* their opens not yet closed */
  unsigned long graphs;          /* graphs not destroyed */
  unsigned long graph_execs;     /* executable graphs not destroyed */
  unsigned long capturing;       /* streams in a capture (active or not) */
  unsigned long log_dropped;     /* lines not kept in memory (16 MiB cap) */
  unsigned long log_write_errors;/* FAKECUDA_LOG opens or writes failed */
  unsigned long vmm_handles;     /* cuMemCreate'd or imported, not released */
  unsigned long vmm_mappings;    /* cuMemMap'ped, not unmapped */
  unsigned long host_registered; /* cuMemHostRegister'ed ranges (pinned) */
};

/* Copy this process's in-memory log, NUL-terminated and cut to len - 1
 * bytes, into buf (len 0: nothing copied). Returns the log's full length,
 * so that a caller can size its buffer. */
size_t fakecuda_log_read(char *buf, size_t len);
/* Empty the in-memory log (the FAKECUDA_LOG file is left alone). */
void fakecuda_log_clear(void);
/* How many lines of the in-memory log have exactly this body (the line
 * without its "<pid> " prefix and newline). */
size_t fakecuda_log_count(const char *body);
/* Busy mode on (1) or off (0), for this process from now on. */
void fakecuda_set_busy(int on);
int fakecuda_busy(void);
/* Names as the log prints them. Any pointer is accepted (a CUstream or
 * tb_cu_stream, etc.); one that is not a stream (event) of this process
 * gives "invalid". The text stays valid for the life of the process. */
const char *fakecuda_stream_name(const void *stream);
const char *fakecuda_event_name(const void *event);
/* The stream of the event's latest record outside a capture ("" if none). */
const char *fakecuda_event_recorded_on(const void *event);
/* The name (mP.N) of the allocation or IPC mapping holding device pointer
 * p, into buf. 0, or -1 when p is in none (buf then ""). */
int fakecuda_mem_name(unsigned long long p, char *buf, size_t len);
/* Fill *out (out->struct_size must be set; fields beyond it are left). */
void fakecuda_counts(struct fakecuda_counts *out);

struct fakecuda_hooks {
  size_t struct_size; /* sizeof(struct fakecuda_hooks) of the fake */
  size_t (*log_read)(char *buf, size_t len);
  void (*log_clear)(void);
  size_t (*log_count)(const char *body);
  void (*set_busy)(int on);
  int (*busy)(void);
  const char *(*stream_name)(const void *stream);
  const char *(*event_name)(const void *event);
  const char *(*event_recorded_on)(const void *event);
  int (*mem_name)(unsigned long long p, char *buf, size_t len);
  void (*counts)(struct fakecuda_counts *out);
};

/* All hooks at once (static storage, never NULL). */
const struct fakecuda_hooks *fakecuda_hooks(void);

/* The hooks of the libcuda.so.1 this process has loaded or would load, or
 * NULL when that is not the fake (the real driver, or none found). The
 * handle stays open: the fake is never unloaded. Any thread. */
static inline const struct fakecuda_hooks *fakecuda(void) {
  static const struct fakecuda_hooks *_Atomic hooks;
  const struct fakecuda_hooks *(*get)(void) = NULL;
  const struct fakecuda_hooks *h = atomic_load(&hooks);
  void *lib, *sym;

  if (h != NULL)
    return h;
  lib = dlopen(FAKECUDA_SONAME, RTLD_NOW | RTLD_NOLOAD);
  if (lib == NULL)
    lib = dlopen(FAKECUDA_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL)
    return NULL;
  sym = dlsym(lib, "fakecuda_hooks");
  if (sym == NULL) {
    dlclose(lib);
    return NULL;
  }
  /* POSIX: void * and function pointers convert both ways */
  memcpy(&get, &sym, sizeof(get));
  h = get();
  atomic_store(&hooks, h);
  return h;
}

/* ---- reading a log's text (log_read's copy or the FAKECUDA_LOG file) ---- */

/* If line (up to its newline) is "<pid> BODY" with pid matching (0: any),
 * *body = BODY and *len = its length; else 0. */
static inline int fakecuda_line_body(const char *line, long pid,
                                     const char **body, size_t *len) {
  char *end;
  const char *nl;
  long p = strtol(line, &end, 10);

  if (end == line || *end != ' ' || (pid != 0 && p != pid))
    return 0;
  *body = end + 1;
  nl = strchr(*body, '\n');
  *len = nl != NULL ? (size_t)(nl - *body) : strlen(*body);
  return 1;
}

/* How many lines of text are "<pid> BODY" with exactly this body; pid 0
 * matches any process. */
static inline size_t fakecuda_text_count(const char *text, long pid,
                                         const char *body) {
  size_t n = 0, want = strlen(body), len;
  const char *line = text, *b;

  while (line != NULL && *line != '\0') {
    if (fakecuda_line_body(line, pid, &b, &len) && len == want &&
        memcmp(b, body, len) == 0)
      n++;
    line = strchr(line, '\n');
    if (line != NULL)
      line++;
  }
  return n;
}

/* How many lines of text are "<pid> BODY" with a body that starts with
 * prefix; pid 0 matches any process. */
static inline size_t fakecuda_text_prefixed(const char *text, long pid,
                                            const char *prefix) {
  size_t n = 0, pl = strlen(prefix), len;
  const char *line = text, *b;

  while (line != NULL && *line != '\0') {
    if (fakecuda_line_body(line, pid, &b, &len) && len >= pl &&
        memcmp(b, prefix, pl) == 0)
      n++;
    line = strchr(line, '\n');
    if (line != NULL)
      line++;
  }
  return n;
}

/* The first line "<pid> PREFIX X SUFFIX" (no spaces added: PREFIX and
 * SUFFIX are matched as given) with a non-empty X: copies X into out
 * (cut to outlen - 1) and returns 1; 0 when there is none. pid 0: any.
 * E.g. prefix "record ", suffix " on s4" finds the event recorded on s4. */
static inline int fakecuda_text_find(const char *text, long pid,
                                     const char *prefix, const char *suffix,
                                     char *out, size_t outlen) {
  size_t pl = strlen(prefix), sl = strlen(suffix), len, n;
  const char *line = text, *b;

  while (line != NULL && *line != '\0') {
    if (fakecuda_line_body(line, pid, &b, &len) && len > pl + sl &&
        memcmp(b, prefix, pl) == 0 && memcmp(b + len - sl, suffix, sl) == 0) {
      n = len - pl - sl;
      if (outlen > 0) {
        if (n > outlen - 1)
          n = outlen - 1;
        memcpy(out, b + pl, n);
        out[n] = '\0';
      }
      return 1;
    }
    line = strchr(line, '\n');
    if (line != NULL)
      line++;
  }
  return 0;
}

#endif /* TB_TESTS_FAKE_LIBCUDA_H */
