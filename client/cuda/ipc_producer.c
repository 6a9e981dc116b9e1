/* SPDX-License-Identifier: Apache-2.0 */
/* The producer side of the CUDA IPC kind: which allocation a published
 * tensor lives in, its registration with the daemon (once per allocation,
 * dropped when the application frees it), and the ready event of each
 * producer stream, recorded for every publish.
 * (kind_ipc.h) */
#include "kind_ipc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utlist.h>

#include "cuda.h"

static int register_alloc(struct tb_client *c, const struct tb__cuda_alloc *a,
                          const uint8_t *handle, uint64_t *id) {
  Tensorbroker__V1__BufferRegister br = TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;

  dev.type = kDLCUDA;
  dev.id = a->device;
  dev.uuid.data = (uint8_t *)a->uuid;
  dev.uuid.len = TB__UUID_SIZE;
  br.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC;
  br.size = a->size;
  br.device = &dev;
  br.cuda_ipc_handle.data = (uint8_t *)handle;
  br.cuda_ipc_handle.len = TB__CUDA_IPC_HANDLE_SIZE;
  return tb__buffer_register(c, &br, -1, id);
}

static void unregister_buffer(struct tb_client *c, uint64_t id) {
  (void)tb__buffer_unregister(c, id);
}

/* ---- producer ---- */

/* Drop the registrations of allocations the application has freed (or
 * replaced) since they were published, except keep (handled by the
 * caller). Called when a new allocation registers, so a producer that
 * allocates afresh does not pile up registrations (--max-buffers) and the
 * daemon retires the dead buffers, whose mappings consumers then close:
 * a consumer's IPC mapping keeps the producer's freed memory alive. A
 * producer that never registers anything new keeps its stale entries, at
 * most as many as it ever had live. One cuPointerGetAttribute per entry. */
static void sweep_freed(struct tb_client *c, struct tb__cuda_client *cc,
                        const struct tb__cuda_reg *keep) {
  struct tb__cuda_reg *r, *tmp;

  HASH_ITER(hh, cc->regs, r, tmp) {
    if (r == keep || tb__cuda_alloc_alive(r->base, r->alloc_id))
      continue;
    HASH_DEL(cc->regs, r);
    unregister_buffer(c, r->buffer_id);
    tb__cuda_unexport_mem(r->base);
    free(r);
  }
}

/* The registration for allocation a, made or reused. A second publish from
 * the same allocation (same base, size and driver allocation id) reuses its
 * buffer id and makes no further driver call (cuIpcGetMemHandle is counted
 * by the GPU tests). Anything else at a known base means the memory was
 * freed and allocated again, possibly at the same address with the same
 * size (CU_POINTER_ATTRIBUTE_BUFFER_ID tells them apart): the old
 * registration is dropped (the daemon retires it once unused) and the new
 * allocation registered, so consumers map the new memory, never the old. */
static int alloc_registration(struct tb_client *c, struct tb__cuda_client *cc,
                              const struct tb__cuda_alloc *a,
                              struct tb__cuda_reg **out) {
  uint8_t handle[TB__CUDA_IPC_HANDLE_SIZE];
  struct tb__cuda_reg *reg = NULL;
  char why[256] = "";
  int rc;

  HASH_FIND(hh, cc->regs, &a->base, sizeof(a->base), reg);
  if (reg != NULL && reg->size == a->size && reg->alloc_id == a->alloc_id) {
    *out = reg;
    return 0;
  }
  rc = tb__cuda_export_mem(a, handle, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  sweep_freed(c, cc, reg);
  if (reg != NULL) {
    HASH_DEL(cc->regs, reg);
    unregister_buffer(c, reg->buffer_id);
    /* export_mem above took a second reference on the same base */
    tb__cuda_unexport_mem(reg->base);
    free(reg);
  }
  reg = calloc(1, sizeof(*reg));
  if (reg == NULL) {
    tb__cuda_unexport_mem(a->base);
    return TB_ENOMEM;
  }
  rc = register_alloc(c, a, handle, &reg->buffer_id);
  if (rc < 0) {
    tb__cuda_unexport_mem(a->base);
    free(reg);
    return rc;
  }
  reg->base = a->base;
  reg->size = a->size;
  reg->alloc_id = a->alloc_id;
  reg->device = a->device;
  memcpy(reg->uuid, a->uuid, TB__UUID_SIZE);
  memcpy(reg->handle, handle, sizeof(handle));
  tb__hash_oom = 0;
  HASH_ADD(hh, cc->regs, base, sizeof(reg->base), reg);
  if (tb__hash_oom) {
    unregister_buffer(c, reg->buffer_id);
    tb__cuda_unexport_mem(reg->base);
    free(reg);
    return tb__set_error(c, TB_ENOMEM, "out of memory for the buffer table");
  }
  *out = reg;
  return 0;
}

/* The ready event of (device, producer stream; for a per-thread default
 * stream, its thread's), created and registered the first time that stream
 * publishes, then re-recorded for every version the
 * stream publishes. Re-recording is safe because all records are on one
 * stream: a later record completes only after everything an earlier one
 * marked, so a consumer waiting on the latest record can only wait longer,
 * never too short. It is also what CUDA graph replay needs: a captured
 * external wait waits for the event's latest record at launch time, so a
 * graph captured on version N waits, on replay, for the producer's newest
 * publish from the same stream (measured on an H200: gpu_graph_capture,
 * docs/gpu-validation.md). One event per version would leave a replayed
 * graph waiting on a stale event. */
static int ready_event_get(struct tb_client *c, struct tb__cuda_client *cc,
                           int device, const uint8_t *uuid,
                           tb_cu_stream stream, struct tb__cuda_ev **out) {
  uint8_t handle[TB__CUDA_IPC_HANDLE_SIZE];
  struct tb__cuda_ev *e;
  char why[256] = "";
  int rc, ordinal, n = 0;

  LL_FOREACH(cc->ready, e) {
    /* each thread's per-thread default stream is a stream of its own:
     * records of one event on two of them would not be ordered */
    if (e->device == device && e->stream == stream &&
        (stream != TB_CU_STREAM_PER_THREAD ||
         e->thread == tb__thread_id())) {
      *out = e;
      return 0;
    }
    n++;
  }
  if (n >= TB__READY_EVENTS_MAX && stream == TB_CU_STREAM_PER_THREAD) {
    /* Threads come and go (a thread per request): another thread's event
     * whose latest record has completed marks nothing still running, so
     * this thread's stream takes it over. A consumer waiting on it for a
     * version of the other thread's then waits for this thread's newer
     * record: longer, never too short. */
    LL_FOREACH(cc->ready, e) {
      if (e->device == device && e->stream == stream &&
          tb__cuda_event_done(e->ev, NULL)) {
        e->thread = tb__thread_id();
        *out = e;
        return 0;
      }
    }
  }
  if (n >= TB__READY_EVENTS_MAX)
    return tb__set_error(c, TB_ELIMIT,
                         "more than %d producer streams published on this "
                         "client; publish from fewer streams (or, under the "
                         "per-thread contract, from threads whose earlier "
                         "work has finished)",
                         TB__READY_EVENTS_MAX);
  /* the event must belong to the device's context */
  rc = tb__cuda_device_by_uuid(uuid, &ordinal, NULL, NULL, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  e = calloc(1, sizeof(*e));
  if (e == NULL)
    return TB_ENOMEM;
  rc = tb__ci_own_event_create(&e->ev, handle, why, sizeof(why));
  if (rc < 0) {
    free(e);
    return tb__set_error(c, rc, "%s", why);
  }
  rc = tb__ci_register_event(c, handle, device, uuid, &e->event_id);
  if (rc < 0) {
    tb__ci_own_event_destroy(e->ev);
    free(e);
    return rc;
  }
  e->device = device;
  e->stream = stream;
  e->thread = tb__thread_id();
  LL_PREPEND(cc->ready, e);
  *out = e;
  return 0;
}

/* kind.h, publish: the allocation holding start, registered once; the
 * ready event of (device, stream) recorded. */
int tb__ci_publish(struct tb_client *c, const DLTensor *t, uintptr_t start,
                       uint64_t elem_bits, uint64_t flags, void *stream,
                       struct tb__kind_publish *out) {
  struct tb__cuda_client *cc = NULL;
  struct tb__cuda_stream s;
  struct tb__cuda_alloc a;
  struct tb__cuda_reg *reg = NULL;
  char why[256] = "";
  int rc;

  rc = tb__ci_cuda_client(c, &cc);
  if (rc < 0)
    return rc;
  rc = tb__cuda_stream_resolve(c->conn->contract, stream, &s, why,
                               sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  rc = tb__cuda_locate((const void *)start, 0, &a, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  rc = tb__tensor_fits(c, t, elem_bits, flags, start, (uintptr_t)a.base,
                       a.size, "allocation");
  if (rc < 0)
    return rc;
  rc = alloc_registration(c, cc, &a, &reg);
  if (rc < 0)
    return rc;
  return tb__ci_publish_ready(c, stream, reg->device, reg->uuid,
                              reg->buffer_id,
                              (uint64_t)(start - (uintptr_t)a.base), NULL, 0,
                              out);
}

int tb__ci_publish_ready(struct tb_client *c, void *stream, int device,
                         const uint8_t *uuid, uint64_t buffer_id,
                         uint64_t byte_offset, struct tb__signal *ready,
                         tb_cu_deviceptr ready_word,
                         struct tb__kind_publish *out) {
  struct tb__cuda_client *cc = NULL;
  struct tb__cuda_stream s;
  struct tb__cuda_ev *e = NULL;
  char why[256] = "";
  int rc;

  out->ready_complete = 0;
  out->ready_signal = 0;
  rc = tb__ci_cuda_client(c, &cc);
  if (rc < 0)
    return rc;
  rc = tb__cuda_stream_resolve(c->conn->contract, stream, &s, why,
                               sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  if (!s.no_sync) {
    rc = ready_event_get(c, cc, device, uuid, s.stream, &e);
    if (rc < 0)
      return rc;
    /* skipped on an idle stream once it has a record: a consumer that
     * captures a graph still finds a recorded event to wait on */
    int skipped = 0;
    rc = tb__cuda_record(e->ev, &s, e->recorded, &out->ready_complete,
                         &skipped, why, sizeof(why));
    if (rc < 0)
      return tb__set_error(c, rc, "%s", why);
    if (!skipped)
      e->recorded = 1;
    /* After the work a consumer in another PID namespace or container
     * cannot wait for with the event, and that says after the producer
     * died whether the work finished (docs/cuda.md, "Signals"). Not into
     * a capture: a graph would write it at every launch. */
    if (ready != NULL && !out->ready_complete &&
        tb__cuda_capturing(&s, "writing the ready signal", NULL, 0) == 0) {
      struct tb__conn *k = c->conn;
      pthread_mutex_lock(&k->lock);
      rc = tb__signal_write_locked(k, ready, ready_word, device, &s,
                                   &out->ready_signal, why, sizeof(why));
      pthread_mutex_unlock(&k->lock);
      if (rc < 0)
        return tb__set_error(c, rc, "cannot write the ready signal: %s",
                             why);
    }
  }
  memcpy(out->uuid, uuid, TB__UUID_SIZE);
  out->dev.type = kDLCUDA;
  out->dev.id = device;
  out->dev.uuid.data = out->uuid;
  out->dev.uuid.len = TB__UUID_SIZE;
  out->buffer_id = buffer_id;
  out->byte_offset = byte_offset;
  out->ready_event_id = e ? e->event_id : 0;
  return 0;
}
