/* SPDX-License-Identifier: Apache-2.0 */
/* Internal: the CUDA layer of the client, free of RPC (client/cuda/:
 * driver.c the driver table, context.c contexts and capture mode,
 * stream.c the stream contract, event.c events, ipc.c legacy IPC memory,
 * copy.c copies across devices).
 *
 * These functions only talk to the driver (driver.h); the CUDA memory kind
 * (kind_ipc.c and the files it uses) decides when to call them, keeps the
 * per-client caches and talks to the daemon. Three habits hold throughout:
 *  - Work happens in the context the object belongs to: a pointer's context
 *    (CU_POINTER_ATTRIBUTE_CONTEXT), an explicit stream's (cuStreamGetCtx).
 *    When that is not the calling thread's current context we make it current
 *    for the call and restore the previous one before returning.
 *  - Driver calls that are not stream work (IPC open/close, event create)
 *    run with the thread's capture mode exchanged to RELAXED, so that they
 *    are allowed while the application captures a graph in GLOBAL mode (as
 *    PyTorch does around cudaMalloc during capture).
 *  - Nothing here synchronises the host with the GPU. All return 0 or a negative
 * TB_E* code; on TB_ECUDA/TB_EDEVICE/TB_ECAPTURE/TB_ESTREAM they write a
 * one-line reason into why (may be NULL). Thread-safe. */
#ifndef TB_CUDA_H
#define TB_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <tensorbroker/dlpack.h>

#include "driver.h"

/* Where a device pointer lives: its allocation (base, size), the device
 * (ordinal in this process and 16-byte UUID). */
struct tb__cuda_alloc {
  tb_cu_deviceptr base;
  size_t size;
  int device;            /* ordinal in this process */
  uint8_t uuid[16];
  uint64_t alloc_id;     /* CU_POINTER_ATTRIBUTE_BUFFER_ID: unique per
                            allocation in this process; 0: unknown */
};

/* How a stream argument resolves under a contract. */
struct tb__cuda_stream {
  tb_cu_stream stream; /* TB_CU_STREAM_LEGACY, _PER_THREAD, or a CUstream */
  int no_sync;         /* 1: do nothing (-1, or NULL under NO_SYNC) */
  int implicit;        /* 1: the caller passed NULL and the contract chose */
  /* The context the work runs in; NULL: a CUstream's own, or for the
   * default streams the calling thread's current one. Set for a stream a
   * lease remembers, whose end may run on a thread with another context
   * current, or none. */
  tb_cu_context ctx;
};

/* Resolve a DLPack stream value (NULL, -1, 1, 2 or a CUstream) under a
 * connection contract (enum tb_stream_contract). NULL under
 * TB_CONTRACT_EXPLICIT is TB_ESTREAM. */
int tb__cuda_stream_resolve(int contract, void *stream,
                            struct tb__cuda_stream *out, char *why,
                            size_t whylen);

/* Find the allocation holding [ptr, ptr + len): base, size and device, via
 * cuPointerGetAttribute and cuMemGetAddressRange. TB_EDEVICE when ptr is not
 * device memory, TB_ELAYOUT when the range leaves the allocation. */
int tb__cuda_locate(const void *ptr, size_t len, struct tb__cuda_alloc *out,
                    char *why, size_t whylen);

/* Get the 64-byte IPC handle of an allocation base, and remember base under
 * that handle for this process, so that a consumer in the same process can
 * use the pointer (cuIpcOpenMemHandle fails on one's own memory). */
int tb__cuda_export_mem(const struct tb__cuda_alloc *a, uint8_t handle[64],
                        char *why, size_t whylen);

/* Is the allocation that started at base with this allocation id still
 * there? 0 when the memory was freed, or replaced by another allocation;
 * 1 when it is, or when it cannot be told (alloc_id 0). No context needed;
 * no stream work. */
int tb__cuda_alloc_alive(tb_cu_deviceptr base, uint64_t alloc_id);

/* Forget an exported allocation (the producer unregistered it). */
void tb__cuda_unexport_mem(tb_cu_deviceptr base);

/* Make the device with this UUID usable on the calling thread: find its
 * ordinal, and if no context is current, make its primary context current.
 * TB_EDEVICE when no visible device has the UUID, or when the current
 * context's device cannot reach it. cur_ordinal and cur_ctx (either may be
 * NULL) receive the context current on return and its device's ordinal. */
int tb__cuda_device_by_uuid(const uint8_t uuid[16], int *ordinal,
                            int *cur_ordinal, tb_cu_context *cur_ctx,
                            char *why, size_t whylen);

/* Create an interprocess event (INTERPROCESS | DISABLE_TIMING) on the
 * current context and get its handle. */
int tb__cuda_event_create(tb_cu_event *out, uint8_t handle[64], char *why,
                          size_t whylen);
int tb__cuda_event_open(const uint8_t handle[64], tb_cu_event *out, char *why,
                        size_t whylen);
void tb__cuda_event_destroy(tb_cu_event e);

/* Record ev on s (capture-aware: inside a capture the record becomes an
 * external event-record node). complete (may be NULL): set to 1 when the
 * work the record marks had already finished, so that nobody needs to wait
 * for it: s is a non-blocking stream and cuStreamQuery(s) succeeded before
 * the record, or cuEventQuery(ev) succeeded right after it. Both are exact
 * (an event recorded on an idle non-blocking stream completes at once; for
 * other streams the event's own query answers). 0 when capturing, when
 * work is in flight, or when the query cannot tell. With may_skip (and
 * complete not NULL), an idle non-blocking stream is not recorded on at
 * all: ev's earlier records, all on s, have completed too, so a wait on its
 * latest record waits for nothing either way; *skipped says so. Pass
 * may_skip only for an event that has been recorded before or that nobody
 * waits on unless told to. */
int tb__cuda_record(tb_cu_event ev, const struct tb__cuda_stream *s,
                    int may_skip, int *complete, int *skipped, char *why,
                    size_t whylen);

/* Whether ev's latest record has completed (cuEventQuery succeeded), asked
 * in ctx (NULL: the current one) and in relaxed capture mode, so that it
 * never touches a capture; 0 when it has not or the query failed. */
int tb__cuda_event_done(tb_cu_event ev, tb_cu_context ctx);

/* Make s wait for ev. Not capturing: cuStreamWaitEvent(s, ev, 0).
 * Capturing: cuStreamWaitEvent(s, ev, CU_EVENT_WAIT_EXTERNAL), which the
 * capture records as a node that waits for the event's latest record when
 * the graph is launched. The legacy stream while this thread captures (or an
 * invalidated capture): TB_ECAPTURE with advice, and nothing is enqueued.
 * Never synchronises the host. no_sync streams: nothing, 0. */
int tb__cuda_wait(const struct tb__cuda_stream *s, tb_cu_event ev, char *why,
                  size_t whylen);

/* ---- streams a lease remembers (docs/cuda.md, "When a lease ends") ---- */

/* Identify a resolved stream (not no_sync) for later use from any thread:
 * its context (the default streams: the current one, which must exist) and
 * that context's device ordinal. Allowed while s captures (no call here
 * touches the capture). */
int tb__cuda_stream_ident(const struct tb__cuda_stream *s, tb_cu_context *ctx,
                          int *device, char *why, size_t whylen);

/* A non-blocking stream, and a plain event (timing disabled), created in
 * ctx; and their destruction (either may be NULL). */
int tb__cuda_stream_create(tb_cu_context ctx, tb_cu_stream *out, char *why,
                           size_t whylen);
void tb__cuda_stream_destroy(tb_cu_stream s);
int tb__cuda_plain_event_create(tb_cu_context ctx, tb_cu_event *out,
                                char *why, size_t whylen);

/* ---- cross-GPU exchange (docs/cuda.md, "Cross-GPU exchange") ---------- */

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it. */
void tb__cuda_uuid_text(const uint8_t uuid[16], char *buf, size_t len);

/* The ordinal of the visible device with this UUID; no context is touched
 * (the devices' UUIDs are enumerated once per process). TB_EDEVICE when no
 * visible device has it. */
int tb__cuda_find_uuid(const uint8_t uuid[16], int *ordinal, char *why,
                       size_t whylen);

/* The UUID of visible device ordinal; TB_EDEVICE for an ordinal out of
 * range. */
int tb__cuda_device_uuid(int ordinal, uint8_t uuid[16], char *why,
                         size_t whylen);

/* How an acquire reaches memory on device owner from device consumer. */
enum tb__xdev_plan {
  TB__XDEV_SAME = 0, /* same device (or consumer -1): map it there */
  TB__XDEV_PEER = 1, /* map it for the consumer's device by peer access */
  TB__XDEV_COPY = 2  /* copy it onto the consumer's device */
};

/* The decision, free of driver calls so that it can be tested without two
 * GPUs: consumer < 0 or consumer == owner -> SAME (the copy flag asks for a
 * copy only across devices); TB_ACQUIRE_COPY_TO_DEVICE -> COPY; can_access
 * (cuDeviceCanAccessPeer(consumer, owner)) -> PEER; otherwise TB_EDEVICE,
 * naming both devices by UUID and the flag to pass, and *plan untouched.
 * Never a silent copy. */
int tb__cuda_xdev_plan(int owner, int consumer, unsigned flags,
                       int can_access, const uint8_t owner_uuid[16],
                       const uint8_t consumer_uuid[16], int *plan, char *why,
                       size_t whylen);

/* cuDeviceCanAccessPeer(consumer, owner) by ordinals. */
int tb__cuda_can_access_peer(int consumer, int owner, int *can, char *why,
                             size_t whylen);

/* A context on a device made current for a while. */
struct tb__cuda_devctx {
  tb_cu_context ctx;  /* the context used for the device */
  tb_cu_context prev; /* restored by leave when switched */
  int switched;
};

/* Make a context of device ordinal current on this thread: the current one
 * if it is on that device, else the device's primary context (retained
 * once per process). With no context current before, the primary context
 * stays current after leave (as tb__cuda_device_by_uuid does), so that the
 * legacy stream means that device's afterwards; otherwise leave restores
 * the previous one. */
int tb__cuda_device_enter(int ordinal, struct tb__cuda_devctx *d, char *why,
                          size_t whylen);
void tb__cuda_device_leave(const struct tb__cuda_devctx *d);

/* The device ordinal of the current context (TB_EDEVICE without one). */
int tb__cuda_current_device(int *ordinal, tb_cu_context *ctx, char *why,
                            size_t whylen);

/* Map another process's allocation (exported on device owner) into the
 * CURRENT context, which may be on another device: with
 * CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS the driver enables peer access from
 * the current device to owner's. This process's own allocations come back
 * as their base (*local = 1); used from a context on another device, peer
 * access to the allocation's context is enabled first. */
int tb__cuda_open_mem_here(const uint8_t handle[64], int owner, size_t size,
                           tb_cu_deviceptr *out, int *local, char *why,
                           size_t whylen);

/* Close a mapping in the context it was opened in (own allocations: no-op). */
int tb__cuda_close_mem_in(tb_cu_context ctx, tb_cu_deviceptr p);

/* Whether s captures: 0 no (no_sync streams: 0), 1 yes; TB_ECAPTURE when
 * touching s would invalidate a capture (the legacy stream while this
 * thread captures) or it is already invalidated; what: the operation, for
 * that message. */
int tb__cuda_capturing(const struct tb__cuda_stream *s, const char *what,
                       char *why, size_t whylen);

/* Copy n bytes from src (mapped in context sctx) to a new allocation on
 * the current context's device, on stream s (a resolved stream, not
 * no_sync; must not capture: TB_ECAPTURE). Stream-ordered allocation
 * (cuMemAllocAsync) where the device supports memory pools (*pooled = 1),
 * else cuMemAlloc. Enqueues only; never synchronises the host. Then records
 * a new plain event after the copy into *copied (for tb_lease_wait). */
int tb__cuda_copy_peer(const struct tb__cuda_stream *s, tb_cu_deviceptr src,
                       tb_cu_context sctx, size_t n, tb_cu_deviceptr *dst,
                       tb_cu_context *dctx, int *pooled, tb_cu_event *copied,
                       char *why, size_t whylen);

/* Free a copy made by tb__cuda_copy_peer, in its context: pooled copies
 * with cuMemFreeAsync on s (no_sync or NULL s: that context's legacy
 * stream), without blocking the host. While the calling thread captures a
 * graph the stream-ordered free is not allowed: the copy is then freed
 * with cuMemFree in relaxed capture mode (which synchronises). */
int tb__cuda_free_copy(tb_cu_deviceptr p, tb_cu_context ctx, int pooled,
                       const struct tb__cuda_stream *s);

/* ---- shared by the files of this folder ---- */

/* Write a one-line reason into why (may be NULL). */
void tb__cu_why(char *why, size_t whylen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A failed driver call: TB_ECUDA with "call failed: CUDA_ERROR_NAME". */
int tb__cu_fail(char *why, size_t whylen, const char *call, tb_cu_result r);
/* tb__cuda_load, with the reason in why on failure. */
int tb__cu_get(const struct tb_cuda **cu, char *why, size_t whylen);

/* context.c: make want current for a call (NULL or current: nothing), and
 * restore the previous context after it. */
struct tb__cu_ctx_saved {
  tb_cu_context prev;
  int switched;
};
int tb__cu_ctx_enter(const struct tb_cuda *cu, tb_cu_context want,
                     struct tb__cu_ctx_saved *saved, char *why,
                     size_t whylen);
void tb__cu_ctx_leave(const struct tb_cuda *cu,
                      const struct tb__cu_ctx_saved *saved);
/* context.c: exchange this thread's capture mode to RELAXED (returns the
 * previous mode, -1 when it could not), and back. */
int tb__cu_relaxed_enter(const struct tb_cuda *cu);
void tb__cu_relaxed_leave(const struct tb_cuda *cu, int saved);

/* stream.c: make s's context current for work on it (saved puts the
 * thread's back); with what, also return its capture state (0 or 1),
 * leaving the context again on error. Whether every operation enqueued on
 * a non-blocking stream has finished (stream_idle). Create in ctx a
 * non-blocking stream (stream not NULL) or else a plain event
 * (create_in). */
int tb__cu_stream_enter(const struct tb__cuda_stream *s, const char *what,
                        const struct tb_cuda **cu,
                        struct tb__cu_ctx_saved *saved, char *why,
                        size_t whylen);
int tb__cu_stream_idle(const struct tb_cuda *cu, tb_cu_stream s);
int tb__cu_create_in(tb_cu_context ctx, tb_cu_stream *stream,
                     tb_cu_event *event, char *why, size_t whylen);
/* event.c: TB_ECUDA/TB_EDEVICE unless a context is current (what: for the
 * message). */
int tb__cu_need_ctx(const struct tb_cuda *cu, const char *what, char *why,
                    size_t whylen);

#endif /* TB_CUDA_H */
