/* Internal: the CUDA half of the legacy-IPC transport, free of RPC.
 *
 * These functions only talk to the driver (cuda_driver.h); the client core
 * (publish, acquire, release, wait_free) decides when to call them, keeps
 * the per-client caches and talks to the daemon. All return 0 or a negative
 * TB_E* code; on TB_ECUDA/TB_EDEVICE/TB_ECAPTURE/TB_ESTREAM they write a
 * one-line reason into why (may be NULL). Thread-safe. */
#ifndef TB_CUDA_IPC_H
#define TB_CUDA_IPC_H

#include <stddef.h>
#include <stdint.h>

#include <tensorbroker/dlpack.h>

#include "cuda_driver.h"

/* Where a device pointer lives: its allocation (base, size), the device
 * (ordinal in this process and 16-byte UUID). */
struct tb__cuda_alloc {
  tb_cu_deviceptr base;
  size_t size;
  int device;            /* ordinal in this process */
  uint8_t uuid[16];
};

/* How a stream argument resolves under a contract. */
struct tb__cuda_stream {
  tb_cu_stream stream; /* TB_CU_STREAM_LEGACY, _PER_THREAD, or a CUstream */
  int no_sync;         /* 1: do nothing (-1, or NULL under NO_SYNC) */
  int implicit;        /* 1: the caller passed NULL and the contract chose */
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

/* Forget an exported allocation (the producer unregistered it). */
void tb__cuda_unexport_mem(tb_cu_deviceptr base);

/* Make the device with this UUID usable on the calling thread: find its
 * ordinal, and if no context is current, make its primary context current.
 * TB_EDEVICE when no visible device has the UUID. */
int tb__cuda_device_by_uuid(const uint8_t uuid[16], int *ordinal, char *why,
                            size_t whylen);

/* Map another process's allocation: *out is its base in this process.
 * Allocations exported by this same process come back as their own base
 * (*local = 1) and must not be closed. Checks that the mapping covers size
 * bytes. */
int tb__cuda_open_mem(const uint8_t handle[64], const uint8_t uuid[16],
                      size_t size, tb_cu_deviceptr *out, int *local,
                      char *why, size_t whylen);
int tb__cuda_close_mem(tb_cu_deviceptr p);

/* Create an interprocess event (INTERPROCESS | DISABLE_TIMING) on the
 * current context and get its handle. */
int tb__cuda_event_create(tb_cu_event *out, uint8_t handle[64], char *why,
                          size_t whylen);
int tb__cuda_event_open(const uint8_t handle[64], tb_cu_event *out, char *why,
                        size_t whylen);
void tb__cuda_event_destroy(tb_cu_event e);

/* Record ev on s (capture-aware: inside a capture the record becomes an
 * external event-record node). */
int tb__cuda_record(tb_cu_event ev, const struct tb__cuda_stream *s,
                    char *why, size_t whylen);

/* Make s wait for ev. Not capturing: cuStreamWaitEvent(s, ev, 0).
 * Capturing: cuStreamWaitEvent(s, ev, CU_EVENT_WAIT_EXTERNAL), which the
 * capture records as a node that waits for the event's latest record when
 * the graph is launched. The legacy stream while this thread captures (or an
 * invalidated capture): TB_ECAPTURE with advice, and nothing is enqueued.
 * Never synchronises the host. no_sync streams: nothing, 0. */
int tb__cuda_wait(const struct tb__cuda_stream *s, tb_cu_event ev, char *why,
                  size_t whylen);

#endif /* TB_CUDA_IPC_H */
