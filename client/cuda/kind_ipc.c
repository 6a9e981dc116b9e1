/* SPDX-License-Identifier: Apache-2.0 */
/* The legacy CUDA IPC memory kind (kind.h): its row of the kind table,
 * the consumer's mappings (the IPC handle opened once per consumer device),
 * acquire (same device, peer access or a copy) and prefetch. With
 * ipc_producer.c, ipc_events.c and ipc_lease.c (kind_ipc.h) it decides
 * when to make the driver calls of the CUDA layer (cuda.h) and talks to
 * the daemon.
 *
 * Host exchange never reaches these files' CUDA calls: every entry point
 * is only called for kDLCUDA tensors, CUDA_IPC buffers or versions that
 * carry done events, and each returns TB_ENOCUDA when the driver cannot be
 * loaded. */
#include "kind_ipc.h"
#include "stats.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utlist.h>

#include "cuda.h"

int tb__cuda_map_open(struct tb_client *c,
                      const Tensorbroker__V1__BufferInfo *bi,
                      struct tb__cuda_map **out) {
  struct tb__cuda_client *cc = NULL;
  struct tb__cuda_map *m;
  char why[256] = "";
  int rc, ordinal;

  rc = tb__ci_cuda_client(c, &cc);
  if (rc < 0) {
    struct kept_error ke;
    tb__ci_error_keep(c, &ke);
    return tb__set_error(c, rc, "cannot map a cuda-ipc buffer: %.*s",
                         (int)ke.len, ke.text);
  }
  if (bi->cuda_ipc_handle.len != TB__CUDA_IPC_HANDLE_SIZE ||
      bi->device == NULL || bi->device->uuid.len != TB__UUID_SIZE ||
      bi->size == 0 || bi->size > SIZE_MAX)
    return tb__set_error(c, TB_EPROTO, "cuda-ipc buffer without handle or "
                         "uuid");
  rc = tb__cuda_find_uuid(bi->device->uuid.data, &ordinal, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "cannot map a cuda-ipc buffer: %s", why);
  m = calloc(1, sizeof(*m));
  if (m == NULL)
    return TB_ENOMEM;
  m->m.buffer_id = bi->buffer_id;
  m->m.generation = bi->generation;
  m->m.ops = &tb__kind_cuda_ipc;
  m->m.writable = bi->writable != 0;
  m->device = ordinal;
  memcpy(m->uuid, bi->device->uuid.data, TB__UUID_SIZE);
  memcpy(m->handle, bi->cuda_ipc_handle.data, TB__CUDA_IPC_HANDLE_SIZE);
  m->m.size = (size_t)bi->size;
  *out = m;
  return 0;
}

void tb__cuda_map_close(struct tb__cuda_map *m) {
  struct tb__cuda_view *v, *tmp;

  LL_FOREACH_SAFE(m->views, v, tmp) {
    LL_DELETE(m->views, v);
    if (!v->local)
      (void)tb__cuda_close_mem_in(v->ctx, v->p);
    free(v);
  }
}

/* The view of m for device dev, whose context ctx is current, opened
 * there on first use (cuIpcOpenMemHandle with lazy peer access: dev may be
 * another device than the memory's). */
static int view_in(struct tb_client *c, struct tb__cuda_map *m, int dev,
                   tb_cu_context ctx, struct tb__cuda_view **out) {
  struct tb__cuda_view *v;
  char why[256] = "";
  int rc;

  LL_FOREACH(m->views, v) {
    if (v->device == dev) {
      *out = v;
      return 0;
    }
  }
  v = calloc(1, sizeof(*v));
  if (v == NULL)
    return TB_ENOMEM;
  if (m->view_open != NULL)
    rc = m->view_open(m, dev, &v->p, &v->local, why, sizeof(why));
  else
    rc = tb__cuda_open_mem_here(m->handle, m->device, m->m.size, &v->p,
                                &v->local, why, sizeof(why));
  if (rc < 0) {
    free(v);
    return tb__set_error(c, rc, "cannot map a %s buffer: %s", m->m.ops->name,
                         why);
  }
  v->device = dev;
  v->ctx = ctx;
  LL_PREPEND(m->views, v);
  *out = v;
  return 0;
}

/* view_in for the current context's device. */
static int view_here(struct tb_client *c, struct tb__cuda_map *m,
                     struct tb__cuda_view **out) {
  tb_cu_context ctx = NULL;
  char why[256] = "";
  int rc, dev;

  rc = tb__cuda_current_device(&dev, &ctx, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  return view_in(c, m, dev, ctx, out);
}

static void prefetch(struct tb_client *c,
                     const Tensorbroker__V1__BufferInfo *bi,
                     const Tensorbroker__V1__EventInfo *ready) {
  struct tb__conn *k = c->conn;
  struct tb__cuda_view *v;
  struct tb__cuda_map *cm;
  struct tb__map *m;
  tb_cu_context ctx = NULL;
  tb_cu_event ev;
  struct kept_error ke;
  char why[256] = "";
  int dev, rc;

  /* never the first to load the driver or to make a context current */
  if (bi->kind != TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC ||
      !tb__cuda_loaded() ||
      tb__cuda_current_device(&dev, &ctx, why, sizeof(why)) < 0)
    return;
  m = tb__map_get(k, bi->buffer_id, bi->generation);
  if (m != NULL) {
    pthread_mutex_lock(&k->lock);
    tb__map_put_locked(k, m);
    pthread_mutex_unlock(&k->lock);
    return;
  }
  tb__ci_error_keep(c, &ke);
  /* the mapping an acquire on this thread's device would make (view_in,
   * as acquire_default does), kept in the cache without a lease */
  rc = tb__cuda_map_open(c, bi, &cm);
  if (rc == 0) {
    rc = view_in(c, cm, dev, ctx, &v);
    if (rc < 0) {
      tb__map_release_memory(&cm->m);
    } else {
      tb__map_insert(k, &cm->m);
      pthread_mutex_lock(&k->lock);
      tb__map_put_locked(k, &cm->m);
      pthread_mutex_unlock(&k->lock);
    }
  }
  /* a finished version's event is never opened by its acquire either, nor
   * one that does not reach this process (another /dev/shm) */
  if (rc == 0 && ready != NULL && ready->event_id != 0 && !ready->complete &&
      !tb__events_foreign(ready->owner_shm_id, ready->owner_pidns_id) &&
      ready->cuda_ipc_event_handle.len == TB__CUDA_IPC_HANDLE_SIZE) {
    const uint8_t *uuid = bi->device->uuid.data;
    if (ready->device != NULL && ready->device->uuid.len == TB__UUID_SIZE)
      uuid = ready->device->uuid.data;
    pthread_mutex_lock(&k->lock);
    (void)tb__ci_open_event_locked(k, ready->event_id,
                            ready->cuda_ipc_event_handle.data, uuid, &ev, why,
                            sizeof(why));
    pthread_mutex_unlock(&k->lock);
  }
  /* a failure is met again, and reported, by the acquire that needs it */
  tb__ci_error_restore(c, &ke);
}

/* tb__cuda_prefetch, timed for tb__acquire_counters (prefetch_ns). */
void tb__cuda_prefetch(struct tb_client *c,
                       const Tensorbroker__V1__BufferInfo *bi,
                       const Tensorbroker__V1__EventInfo *ready) {
  uint64_t t0 = tb__stat_now();

  prefetch(c, bi, ready);
  tb__stat_prefetch(t0);
}

/* The default path (device -1), as before cross-GPU support: the memory's
 * device is made current when no context is (a current context on another
 * device is used as it is, through peer access), the mapping is the one
 * of the current context's device. */
static int acquire_default(struct tb_client *c, struct tb__cuda_map *m,
                           const Tensorbroker__V1__EventInfo *ready,
                           const struct tb__cuda_stream *s,
                           struct tb__cuda_acq *out) {
  struct tb__cuda_view *v = NULL;
  struct done_pending pd;
  tb_cu_context ctx = NULL;
  char why[256] = "";
  int rc, rc2, ordinal, dev;

  rc = tb__cuda_device_by_uuid(m->uuid, &ordinal, &dev, &ctx, why,
                               sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  /* the mapping is that of the current device, and so is the done event:
   * its registration travels while the memory opens */
  rc = tb__ci_done_event_begin(c, dev, &pd);
  if (rc < 0)
    return rc;
  rc = view_in(c, m, dev, ctx, &v);
  rc2 = tb__ci_done_event_finish(c, &pd);
  if (rc < 0)
    return rc;
  if (rc2 < 0)
    return rc2;
  rc = tb__ci_wait_ready(c, m, ready, s);
  if (rc < 0)
    return rc;
  out->ready_gone = rc == 1;
  out->base = v->p;
  out->done_device = v->device;
  out->enter = 0;
  return 0;
}

/* COPY_TO_DEVICE across devices; the consumer device's context is
 * current. can: the consumer's device can reach the memory's by peer
 * access (then the source is read through the consumer's own mapping,
 * else through a mapping in the memory device's context). */
static int acquire_copy(struct tb_client *c, struct tb__cuda_map *m,
                        const Tensorbroker__V1__EventInfo *ready,
                        const struct tb__cuda_stream *s, int device, int can,
                        uint64_t lo, uint64_t hi, struct tb__cuda_acq *out) {
  struct tb__cuda_stream cs = *s;
  struct tb__cuda_view *v = NULL;
  struct tb__cuda_devctx dc;
  tb_cu_deviceptr dst = 0;
  tb_cu_context dctx = NULL;
  tb_cu_event copied = NULL;
  uint64_t done = 0;
  char why[256] = "";
  int rc, pooled = 0;

  if (can) {
    rc = view_here(c, m, &v);
  } else {
    rc = tb__cuda_device_enter(m->device, &dc, why, sizeof(why));
    if (rc < 0)
      return tb__set_error(c, rc, "%s", why);
    rc = view_here(c, m, &v);
    tb__cuda_device_leave(&dc);
  }
  if (rc < 0)
    return rc;
  rc = tb__ci_wait_ready(c, m, ready, s);
  if (rc < 0)
    return rc;
  out->ready_gone = rc == 1;
  /* -1: nothing is waited for (the caller says the data is ready), the
   * copy goes on the consumer device's legacy stream. */
  if (cs.no_sync) {
    cs.no_sync = 0;
    cs.stream = TB_CU_STREAM_LEGACY;
  }
  rc = tb__cuda_copy_peer(&cs, v->p + lo, v->ctx, (size_t)(hi - lo), &dst,
                          &dctx, &pooled, &copied, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  /* The producer may reuse its memory once the copy has read it. */
  rc = tb__ci_record_done(c->conn, device, &cs, &done);
  if (rc < 0) {
    (void)tb__cuda_free_copy(dst, dctx, pooled, &cs);
    tb__cuda_event_destroy(copied);
    return tb__set_error(c, rc, "cannot record the done event after the "
                         "copy");
  }
  out->base = dst - lo;
  out->copy = dst;
  out->copy_ctx = dctx;
  out->copy_pooled = pooled;
  out->copy_event = copied;
  out->done_event_id = done;
  return 0;
}

int tb__cuda_acquire(struct tb_client *c, struct tb__cuda_map *m,
                     const Tensorbroker__V1__EventInfo *ready, void *stream,
                     int device, unsigned flags, uint64_t lo, uint64_t hi,
                     struct tb__cuda_acq *out) {
  struct tb__cuda_client *cc = NULL;
  struct tb__cuda_acq a;
  struct tb__cuda_stream s;
  struct tb__cuda_devctx dc;
  struct tb__cuda_view *v = NULL;
  uint8_t cuuid[TB__UUID_SIZE];
  char why[256] = "";
  int rc, can = 1, plan = TB__XDEV_SAME, sdev;

  rc = tb__ci_cuda_client(c, &cc);
  if (rc < 0)
    return rc;
  memset(&a, 0, sizeof(a));
  rc = tb__cuda_stream_resolve(c->conn->contract, stream, &s, why,
                               sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  a.implicit = s.implicit;
  a.map = m;
  if (device < 0) {
    rc = acquire_default(c, m, ready, &s, &a);
    if (rc == 0)
      rc = tb__ci_lease_stream_add(&a, &s, TB__LEASE_STREAMS, why, sizeof(why));
    if (rc < 0)
      return rc == TB_ESTREAM ? tb__set_error(c, rc, "%s", why) : rc;
    *out = a;
    return 0;
  }

  rc = tb__cuda_device_uuid(device, cuuid, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  if (device != m->device) {
    rc = tb__cuda_can_access_peer(device, m->device, &can, why, sizeof(why));
    if (rc < 0)
      return tb__set_error(c, rc, "%s", why);
  }
  rc = tb__cuda_xdev_plan(m->device, device, flags, can, m->uuid, cuuid,
                          &plan, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  rc = tb__cuda_device_enter(device, &dc, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  if (!s.no_sync) {
    tb_cu_context sctx;
    rc = tb__cuda_stream_ident(&s, &sctx, &sdev, why, sizeof(why));
    if (rc < 0) {
      rc = tb__set_error(c, rc, "%s", why);
      goto out_leave;
    }
    if (sdev != device) {
      rc = tb__set_error(c, TB_ESTREAM,
                         "the stream runs on device %d, not on the "
                         "consumer's device %d (opts.device)",
                         sdev, device);
      goto out_leave;
    }
  }
  a.done_device = device;
  a.enter = 1;
  if (plan == TB__XDEV_COPY) {
    rc = tb__ci_done_event_ensure(c, device); /* the copy records it */
    if (rc == 0)
      rc = acquire_copy(c, m, ready, &s, device, can, lo, hi, &a);
  } else {
    /* SAME or PEER: the mapping of the consumer's device (for PEER opened
     * with lazy peer access); the stream waits on the ready event, which
     * may have been recorded on another device. The done event registers
     * while the memory opens. */
    struct done_pending pd;
    int rc2;
    rc = tb__ci_done_event_begin(c, device, &pd);
    if (rc < 0)
      goto out_leave;
    rc = view_here(c, m, &v);
    rc2 = tb__ci_done_event_finish(c, &pd);
    if (rc == 0)
      rc = rc2;
    if (rc == 0)
      rc = tb__ci_wait_ready(c, m, ready, &s);
    if (rc == 1) {
      a.ready_gone = 1;
      rc = 0;
    }
    if (rc == 0)
      a.base = v->p;
  }
  if (rc == 0) {
    rc = tb__ci_lease_stream_add(&a, &s, TB__LEASE_STREAMS, why, sizeof(why));
    if (rc < 0)
      rc = tb__set_error(c, rc, "%s", why);
  }
  if (rc == 0)
    *out = a;
out_leave:
  tb__cuda_device_leave(&dc);
  return rc;
}

/* ---- teardown ---- */

void tb__cuda_client_free(struct tb_client *c) {
  struct tb__cuda_client *cc = C_CUDA(c);
  struct tb__cuda_reg *reg, *rtmp;
  struct tb__cuda_ev *e, *etmp;

  if (cc == NULL)
    return;
  HASH_ITER(hh, cc->regs, reg, rtmp) {
    HASH_DEL(cc->regs, reg);
    tb__cuda_unexport_mem(reg->base);
    free(reg);
  }
  LL_FOREACH_SAFE(cc->ready, e, etmp) {
    LL_DELETE(cc->ready, e);
    tb__ci_own_event_destroy(e->ev);
    free(e);
  }
  if (cc->spare.ev != NULL)
    tb__ci_own_event_destroy(cc->spare.ev);
  free(cc);
  c->kind[TB_MEMORY_CUDA_IPC] = NULL;
}

void tb__cuda_conn_free(struct tb__cuda_conn *cc) {
  struct tb__cuda_ev *e, *etmp;
  struct tb__cuda_open_ev *o, *otmp;
  struct tb__cuda_join *j, *jtmp;
  struct tb__cuda_join_ev *je, *jetmp;

  if (cc == NULL)
    return;
  LL_FOREACH_SAFE(cc->joins, j, jtmp) {
    LL_DELETE(cc->joins, j);
    tb__cuda_stream_destroy(j->stream);
    free(j);
  }
  LL_FOREACH_SAFE(cc->join_evs, je, jetmp) {
    LL_DELETE(cc->join_evs, je);
    tb__cuda_event_destroy(je->ev);
    free(je);
  }
  LL_FOREACH_SAFE(cc->done, e, etmp) {
    LL_DELETE(cc->done, e);
    tb__ci_own_event_destroy(e->ev);
    free(e);
  }
  HASH_ITER(hh, cc->opened, o, otmp) {
    HASH_DEL(cc->opened, o);
    if (!o->own)
      tb__cuda_event_destroy(o->ev);
    free(o);
  }
  free(cc);
}

/* ---- the kind's table (kind.h) ---- */

_Static_assert(sizeof(struct tb__cuda_lease) <= TB__KIND_LEASE_STATE,
               "a lease has no room for the CUDA kind's state");

static int ipc_map(struct tb_client *c, const Tensorbroker__V1__BufferInfo *bi,
                   const int *fds, int nfds, struct tb__map **out) {
  struct tb__cuda_map *m = NULL;
  int rc = tb__cuda_map_open(c, bi, &m);

  if (rc == 0)
    *out = &m->m;
  return rc;
}

static void ipc_unmap(struct tb__map *m) {
  tb__cuda_map_close((struct tb__cuda_map *)m);
  free(m);
}

int tb__ci_kind_acquire(struct tb_client *c, struct tb__map *map,
                       const Tensorbroker__V1__AcquireReply *ar,
                       const struct tb_acquire_options *o, void *state,
                       struct tb__kind_acq *out) {
  struct tb__cuda_map *m = (struct tb__cuda_map *)map;
  struct tb__cuda_lease *l = state;
  const Tensorbroker__V1__EventInfo *re = ar->ready_event;
  uint64_t lo = 0, hi = 0;
  int rc;

  if (o->flags & TB_ACQUIRE_COPY_TO_DEVICE) {
    /* the bytes of the buffer the tensor touches: what a copy copies */
    const Tensorbroker__V1__Layout *lay = ar->layout;
    uint64_t elem_bits = 0;
    char why[160];
    rc = tb__dtype_check(lay->dtype_code, lay->dtype_bits, lay->dtype_lanes,
                         &elem_bits);
    if (rc == 0)
      rc = tb__layout_extent((int32_t)lay->n_shape, lay->shape,
                             lay->n_strides == lay->n_shape ? lay->strides
                                                            : NULL,
                             elem_bits, lay->flags, lay->byte_offset, &lo,
                             &hi, why, sizeof(why));
    if (rc < 0)
      return tb__set_error(c, TB_EPROTO, "daemon sent a bad layout");
  }
  /* this session's done slot in a VMM buffer's signal area (the same for
   * every lease of the buffer) */
  if (ar->done_slot != 0 && m->signal != 0) {
    if ((uint64_t)ar->done_slot >= m->signal_bytes / 8)
      return tb__set_error(c, TB_EPROTO, "daemon sent done slot %u past the "
                           "buffer's signal area", (unsigned)ar->done_slot);
    if (m->signal_rw == 0 && m->signal_rw_open != NULL) {
      char why[256] = "";
      rc = m->signal_rw_open(m, why, sizeof(why));
      if (rc < 0)
        return tb__set_error(c, rc, "cannot map the buffer's signal area "
                             "for this session's done signal: %s", why);
    }
    if (m->done_slot != ar->done_slot)
      memset(&m->done, 0, sizeof(m->done));
    m->done_slot = ar->done_slot;
  }
  rc = tb__cuda_acquire(c, m, re, o->stream, o->device, o->flags, lo, hi,
                        &l->acq);
  if (rc < 0)
    return rc;
  /* a dead producer's finished event: nothing for tb_lease_wait either */
  if (re != NULL && re->event_id != 0 && !l->acq.ready_gone &&
      re->cuda_ipc_event_handle.len == TB__CUDA_IPC_HANDLE_SIZE) {
    l->ready_event_id = re->event_id;
    l->ready_complete = re->complete != 0;
    memcpy(l->ready_handle, re->cuda_ipc_event_handle.data,
           TB__CUDA_IPC_HANDLE_SIZE);
    if (re->device != NULL && re->device->uuid.len == TB__UUID_SIZE)
      memcpy(l->ready_uuid, re->device->uuid.data, TB__UUID_SIZE);
    else
      memcpy(l->ready_uuid, m->uuid, TB__UUID_SIZE);
    if (tb__events_foreign(re->owner_shm_id, re->owner_pidns_id))
      l->ready_signal = re->signal_value; /* the acquire checked it is set */
  }
  /* a peer mapping keeps the memory device's ordinal (where the data
   * lives, as this process numbers it); a copy is on the consumer's */
  out->base = l->acq.base;
  out->device.device_type = kDLCUDA;
  out->device.device_id = l->acq.copy != 0 ? o->device : m->device;
  out->implicit = l->acq.implicit;
  out->copied = l->acq.copy != 0;
  out->done_event_id = l->acq.done_event_id;
  return 0;
}

int tb__ci_kind_ready_wait(struct tb__conn *k, void *state, const DLTensor *t,
                          void *stream) {
  struct tb__cuda_lease *l = state;

  if (l->acq.copy != 0) /* the copy is what the stream must wait for */
    return tb__cuda_copy_wait(k, &l->acq, t->device.device_id, stream);
  return tb__cuda_lease_wait(k, &l->acq, l->ready_event_id, l->ready_handle,
                             l->ready_uuid, l->ready_complete, l->ready_signal,
                             stream);
}

int tb__ci_kind_use_locked(struct tb__conn *k, void *state, void *stream) {
  return tb__cuda_lease_use_locked(k, &((struct tb__cuda_lease *)state)->acq,
                                   stream);
}

int tb__ci_kind_done_record_locked(struct tb__conn *k, void *state,
                                  void *stream, struct tb__lease_done *done) {
  return tb__cuda_lease_end_locked(k, &((struct tb__cuda_lease *)state)->acq,
                                   stream, done);
}

int tb__ci_kind_copy_free(struct tb__conn *k, void *state, void *stream) {
  return tb__cuda_copy_free(k, &((struct tb__cuda_lease *)state)->acq, stream);
}

static void ipc_conn_free(struct tb__conn *k) {
  tb__cuda_conn_free(K_CUDA(k));
  k->kind[TB_MEMORY_CUDA_IPC] = NULL;
}

const struct tb__kind_ops tb__kind_cuda_ipc = {
    .name = "cuda-ipc",
    .kind = TB_MEMORY_CUDA_IPC,
    .dl_device = kDLCUDA,
    .lease_state = sizeof(struct tb__cuda_lease),
    .publish = tb__ci_publish,
    .done_wait = tb__cuda_wait_done,
    .map = ipc_map,
    .unmap = ipc_unmap,
    .acquire = tb__ci_kind_acquire,
    .ready_wait = tb__ci_kind_ready_wait,
    .use_locked = tb__ci_kind_use_locked,
    .done_record_locked = tb__ci_kind_done_record_locked,
    .copy_free = tb__ci_kind_copy_free,
    .prefetch = tb__cuda_prefetch,
    .acquire_early = tb__cuda_acquire_early,
    .connect_begin = tb__cuda_connect_begin,
    .connect_end = tb__cuda_connect_end,
    .client_free = tb__cuda_client_free,
    .conn_free = ipc_conn_free,
};
