/* SPDX-License-Identifier: Apache-2.0 */
/* Leases: tb_acquire builds a DLManagedTensorVersioned over a cached
 * mapping; its deleter (or tb_release) ends the lease with a one-way
 * Release that needs no call lock. */
#include "kind.h"
#include "stats.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utlist.h>

/* One allocation per acquired tensor: the managed tensor first (so the
 * deleter's self is the lease), then shape, strides, metadata, channel. */
struct tb__lease {
  DLManagedTensorVersioned m;
  struct tb__lease *prev, *next; /* utlist: conn->leases or conn->later */
  int listed;                    /* on one of those lists */
  struct tb__conn *conn;
  struct tb__map *map;
  uint64_t lease_id;
  uint64_t version;
  uint32_t producer_pid;
  int implicit; /* the acquire relied on the contract's default stream */
  uint64_t buffer_id;
  const struct tb__kind_ops *ops; /* the buffer's memory kind */
  int copied; /* a private copy: its lease ended at acquire (kind.h) */
  /* the kind's state of the lease (kind.h: lease_state bytes) */
  _Alignas(max_align_t) unsigned char state[TB__KIND_LEASE_STATE];
  void *metadata;
  size_t metadata_len;
  char *channel;
  size_t size; /* bytes allocated for this struct and its tail */
  int64_t dims[]; /* shape[ndim], strides[ndim], then the bytes */
};

/* A lease's memory: the connection's spare when it is large enough (the
 * previous lease of a consumer that acquires one tensor after another),
 * else a new allocation. The struct is zeroed; its tail (dims and bytes)
 * is for build_tensor to fill. */
#define SPARE_LEASE_MAX 1024 /* larger leases are not kept */

static struct tb__lease *lease_alloc(struct tb__conn *k, size_t sz) {
  struct tb__lease *l = __atomic_exchange_n(
      (struct tb__lease **)&k->spare_lease, NULL, __ATOMIC_ACQ_REL);

  if (l != NULL && l->size >= sz) {
    sz = l->size;
    memset(l, 0, sizeof(*l));
  } else {
    free(l);
    if (sz < 512)
      sz = 512; /* room for the next one, which is likely alike */
    l = calloc(1, sz);
    if (l == NULL)
      return NULL;
  }
  l->size = sz;
  return l;
}

/* Keep l as k's spare (freeing the one it replaces), or free it. */
static void lease_free(struct tb__conn *k, struct tb__lease *l) {
  if (l->size <= SPARE_LEASE_MAX)
    l = __atomic_exchange_n((struct tb__lease **)&k->spare_lease, l,
                            __ATOMIC_ACQ_REL);
  free(l);
}

void tb_acquire_options_init(struct tb_acquire_options *opts) {
  if (opts == NULL)
    return;
  memset(opts, 0, sizeof(*opts));
  opts->struct_size = sizeof(*opts);
  opts->mode = TB_ACQUIRE_LATEST;
  opts->timeout_ms = -1;
  opts->device = -1;
  opts->flags = 0;
}

/* Bytes of struct tb_acquire_options up to and including member f: what a
 * caller's struct_size must cover for f to be read. */
#define TB__AO_HAS(n, f)                                                     \
  ((n) >= offsetof(struct tb_acquire_options, f) +                           \
              sizeof(((struct tb_acquire_options *)0)->f))

/* Send the one-way Release of a lease with a done event. Caller holds
 * k->lock. */
static int send_release_locked(struct tb__conn *k, uint64_t lease_id,
                               uint64_t done, uint64_t signal,
                               int implicit) {
  Tensorbroker__V1__Release rel = TENSORBROKER__V1__RELEASE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;

  rel.lease_id = lease_id;
  rel.done_event_id = done;
  rel.done_signal = signal;
  rel.want_reply = 0;
  rel.implicit_stream = implicit != 0;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_RELEASE;
  r.release = &rel;
  return tb__conn_send_oneway_locked(k, &r);
}

/* Free an ended lease's local state: its mapping reference, its memory,
 * its connection reference. Caller holds k->lock; returns 1 when that was
 * the connection's last reference (tb__conn_unref_locked). */
static int lease_drop_locked(struct tb__conn *k, struct tb__lease *l) {
  tb__map_put_locked(k, l->map);
  lease_free(k, l);
  return tb__conn_unref_locked(k);
}

/* Record the done event of a lease (its memory kind decides on which
 * streams) and send its Release, or with aq put the Release's fields
 * into that Acquire. Returns TB__LEASE_LATER, without sending anything,
 * when the end must wait for a capture; an error when the kind reported
 * one (a release stream that cannot be named: the Release still carries
 * the done event recorded after the lease's other streams; a record that
 * failed: it goes without one). Caller holds k->lock; the connection is
 * open. */
static int lease_send_end_locked(struct tb__conn *k, struct tb__lease *l,
                                 void *stream,
                                 Tensorbroker__V1__Acquire *aq) {
  struct tb__lease_done done = {0, 0, 0};
  int implicit = l->implicit, rc = 0, src;

  if (l->ops->done_record_locked != NULL) {
    rc = l->ops->done_record_locked(k, l->state, stream, &done);
    if (rc == TB__LEASE_LATER)
      return rc;
    implicit |= done.implicit;
  }
  if (aq != NULL && rc == 0) {
    aq->release_lease_id = l->lease_id;
    aq->release_done_event_id = done.event_id;
    aq->release_done_signal = done.signal;
    aq->release_implicit_stream = implicit != 0;
    return 0;
  }
  src = send_release_locked(k, l->lease_id, done.event_id, done.signal,
                            implicit);
  return rc < 0 ? rc : src;
}

/* The leases whose end waits for a capture, retried; caller holds
 * k->lock. give_up (disconnect): those still waiting are released without
 * a done event, as the closing session would end them anyway. */
static void later_retry_locked(struct tb__conn *k, int give_up) {
  struct tb__lease *l, *tmp;

  DL_FOREACH_SAFE(k->later, l, tmp) {
    if (!k->closed && !__atomic_load_n(&k->dead, __ATOMIC_ACQUIRE)) {
      if (lease_send_end_locked(k, l, NULL, NULL) == TB__LEASE_LATER) {
        if (!give_up)
          continue;
        (void)send_release_locked(k, l->lease_id, 0, 0, l->implicit);
      }
    }
    DL_DELETE(k->later, l);
    l->listed = 0;
    /* never the last reference: the caller's lease or client holds one */
    (void)lease_drop_locked(k, l);
  }
}

void tb__leases_retry(struct tb__conn *k) {
  if (__atomic_load_n(&k->later, __ATOMIC_ACQUIRE) == NULL ||
      tb__conn_forked(k))
    return;
  pthread_mutex_lock(&k->lock);
  later_retry_locked(k, 0);
  pthread_mutex_unlock(&k->lock);
}

void tb__leases_end_all_locked(struct tb__conn *k) {
  struct tb__lease *l, *tmp;

  later_retry_locked(k, 1);
  if (k->closed || __atomic_load_n(&k->dead, __ATOMIC_ACQUIRE))
    return;
  /* The tensors stay the application's (mapped until their deleters run),
   * but the session's end ends their leases: each gets its done event now,
   * recorded after the work queued on its streams so far. */
  DL_FOREACH_SAFE(k->leases, l, tmp) {
    if (lease_send_end_locked(k, l, NULL, NULL) == TB__LEASE_LATER)
      (void)send_release_locked(k, l->lease_id, 0, 0, l->implicit);
    DL_DELETE(k->leases, l);
    l->listed = 0;
  }
}

/* End a lease: record the done event on the streams the lease
 * remembers (and stream), send the one-way Release, drop the mapping
 * reference, free the tensor. With aq (the release rides on that Acquire:
 * tb_acquire_options.release, the daemon permitting) the Release's fields
 * go into aq instead of a datagram of their own; but if the done event
 * cannot be recorded, the Release goes alone without it and the error is
 * returned (no acquire may follow). While a remembered stream captures a
 * graph the lease is kept on k->later and ended by a later call
 * (tb__leases_retry); that returns 0. Takes only conn->lock, so any thread
 * may call it at any time. */
static int lease_end(struct tb__lease *l, void *stream,
                     Tensorbroker__V1__Acquire *aq) {
  struct tb__conn *k = l->conn;
  int rc = 0, last;

  if (tb__conn_forked(k))
    return 0; /* the parent's lease: nothing here to end (rpc.c, fork) */
  if (l->copied) {
    /* a copy: its lease ended when the copy was enqueued */
    rc = l->ops->copy_free(k, l->state, stream);
    tb__conn_unref(k);
    free(l);
    return rc;
  }
  pthread_mutex_lock(&k->lock);
  if (k->later != NULL)
    later_retry_locked(k, 0);
  if (l->listed) {
    DL_DELETE(k->leases, l);
    l->listed = 0;
  }
  if (!k->closed && !__atomic_load_n(&k->dead, __ATOMIC_ACQUIRE)) {
    rc = lease_send_end_locked(k, l, stream, aq);
    if (rc == TB__LEASE_LATER) {
      DL_APPEND(k->later, l);
      l->listed = 1;
      pthread_mutex_unlock(&k->lock);
      return 0;
    }
  }
  last = lease_drop_locked(k, l);
  pthread_mutex_unlock(&k->lock);
  if (last)
    tb__conn_free(k);
  return rc;
}

void tb__lease_deleter(DLManagedTensorVersioned *self) {
  if (self != NULL)
    (void)lease_end((struct tb__lease *)self, TB_STREAM_DEFAULT, NULL);
}

int tb_release(DLManagedTensorVersioned *t, void *stream) {
  if (t == NULL || t->deleter != tb__lease_deleter)
    return TB_EINVAL;
  return lease_end((struct tb__lease *)t, stream, NULL);
}

int tb_lease_wait(const DLManagedTensorVersioned *t, void *stream) {
  struct tb__lease *l;

  if (t == NULL || t->deleter != tb__lease_deleter)
    return TB_EINVAL;
  /* the tensor stays const to the caller; its lease records the stream */
  l = (struct tb__lease *)(uintptr_t)t;
  if (tb__conn_forked(l->conn))
    return TB_EFORKED;
  if (l->ops->ready_wait == NULL)
    return 0; /* host memory is ready when published */
  return l->ops->ready_wait(l->conn, l->state, &l->m.dl_tensor, stream);
}

int tb_lease_use(const DLManagedTensorVersioned *t, void *stream) {
  struct tb__lease *l;
  int rc;

  if (t == NULL || t->deleter != tb__lease_deleter)
    return TB_EINVAL;
  l = (struct tb__lease *)(uintptr_t)t;
  if (tb__conn_forked(l->conn))
    return TB_EFORKED;
  if (l->ops->use_locked == NULL)
    return 0;
  pthread_mutex_lock(&l->conn->lock);
  rc = l->ops->use_locked(l->conn, l->state, stream);
  pthread_mutex_unlock(&l->conn->lock);
  return rc;
}

int tb_lease_info(const DLManagedTensorVersioned *t,
                  struct tb_lease_info *out) {
  const struct tb__lease *l;

  if (t == NULL || out == NULL || t->deleter != tb__lease_deleter)
    return TB_EINVAL;
  l = (const struct tb__lease *)t;
  memset(out, 0, sizeof(*out));
  out->version = l->version;
  out->lease_id = l->lease_id;
  out->metadata = l->metadata;
  out->metadata_len = l->metadata_len;
  out->channel = l->channel;
  out->buffer_id = l->buffer_id;
  out->memory_kind = l->ops->kind;
  out->producer_pid = l->producer_pid;
  return 0;
}

/* A buffer whose descriptor came with a reply but that could not be
 * mapped: tell the daemon (one-way Forget), or it would count the
 * descriptor as held here and never attach it again (the next acquire
 * then fails with "no memfd attached"). */
static void forget_unmapped(struct tb_client *c,
                            const Tensorbroker__V1__BufferInfo *bi) {
  Tensorbroker__V1__Forget fg = TENSORBROKER__V1__FORGET__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;

  if (!bi->fd_attached)
    return;
  fg.buffer_id = bi->buffer_id;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_FORGET;
  r.forget = &fg;
  pthread_mutex_lock(&c->conn->lock);
  (void)tb__conn_send_oneway_locked(c->conn, &r);
  pthread_mutex_unlock(&c->conn->lock);
}

/* Send the one-way Release for a lease we could not hand out. */
static void abandon_lease(struct tb_client *c, uint64_t lease_id) {
  Tensorbroker__V1__Release rel = TENSORBROKER__V1__RELEASE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;

  rel.lease_id = lease_id;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_RELEASE;
  r.release = &rel;
  pthread_mutex_lock(&c->conn->lock);
  (void)tb__conn_send_oneway_locked(c->conn, &r);
  pthread_mutex_unlock(&c->conn->lock);
}

static int build_tensor(struct tb_client *c,
                        const Tensorbroker__V1__AcquireReply *ar,
                        struct tb__map *map, const struct tb__kind_acq *ka,
                        const void *state, struct tb__lease **out) {
  const Tensorbroker__V1__Layout *lay = ar->layout;
  size_t ndim = lay->n_shape, chlen = ar->channel ? strlen(ar->channel) : 0;
  size_t sz = sizeof(struct tb__lease) + 2 * ndim * sizeof(int64_t) +
              ar->metadata.len + chlen + 1;
  struct tb__lease *l = lease_alloc(c->conn, sz);
  DLTensor *t;
  uint8_t *tail;

  if (l == NULL)
    return tb__set_error(c, TB_ENOMEM, "out of memory for the tensor");
  t = &l->m.dl_tensor;
  l->m.version.major = TB_DLPACK_MAJOR_VERSION;
  l->m.version.minor = TB_DLPACK_MINOR_VERSION;
  l->m.manager_ctx = l;
  l->m.deleter = tb__lease_deleter;
  l->m.flags = lay->flags;
  if (!map->writable && !ka->copied)
    l->m.flags |= TB_DLPACK_FLAG_BITMASK_READ_ONLY;
  l->conn = c->conn;
  l->map = map;
  l->buffer_id = map->buffer_id;
  l->ops = map->ops;
  l->copied = ka->copied;
  if (map->ops->lease_state > 0)
    memcpy(l->state, state, map->ops->lease_state);
  if (l->copied) {
    /* our own writable copy on the consumer's device */
    l->m.flags &= ~(uint64_t)TB_DLPACK_FLAG_BITMASK_READ_ONLY;
    l->m.flags |= TB_DLPACK_FLAG_BITMASK_IS_COPIED;
  }
  l->lease_id = ar->lease_id;
  l->version = ar->version;
  l->producer_pid = ar->buffer->producer_pid;
  l->implicit = ka->implicit;

  /* byte_offset is folded into data (byte_offset = 0): every DLPack
   * consumer reads data, not all of them honour byte_offset. */
  t->data = (void *)(uintptr_t)(ka->base + lay->byte_offset);
  t->device = ka->device;
  t->byte_offset = 0;
  t->ndim = (int)ndim;
  t->dtype.code = (uint8_t)lay->dtype_code;
  t->dtype.bits = (uint8_t)lay->dtype_bits;
  t->dtype.lanes = (uint16_t)lay->dtype_lanes;
  t->shape = l->dims;
  t->strides = l->dims + ndim; /* always filled: DLPack >= 1.2 wants them */
  for (size_t i = 0; i < ndim; i++)
    t->shape[i] = lay->shape[i];
  if (lay->n_strides == ndim) {
    for (size_t i = 0; i < ndim; i++)
      t->strides[i] = lay->strides[i];
  } else {
    int64_t s = 1;
    for (size_t i = ndim; i-- > 0;) {
      t->strides[i] = s;
      s *= lay->shape[i] > 0 ? lay->shape[i] : 1;
    }
  }
  if (ndim == 0) {
    t->shape = NULL;
    t->strides = NULL;
  }
  tail = (uint8_t *)(l->dims + 2 * ndim);
  l->metadata = tail;
  l->metadata_len = ar->metadata.len;
  if (ar->metadata.len > 0)
    memcpy(tail, ar->metadata.data, ar->metadata.len);
  l->channel = (char *)tail + ar->metadata.len;
  if (chlen > 0)
    memcpy(l->channel, ar->channel, chlen);
  l->channel[chlen] = '\0';
  *out = l;
  return 0;
}

int tb_acquire(tb_client *c, const char *channel,
               const struct tb_acquire_options *opts,
               DLManagedTensorVersioned **out) {
  Tensorbroker__V1__Acquire aq = TENSORBROKER__V1__ACQUIRE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  struct tb_acquire_options o;
  const Tensorbroker__V1__AcquireReply *ar;
  const Tensorbroker__V1__BufferInfo *bi;
  tb__server_message *m = NULL;
  struct tb__map *map = NULL;
  struct tb__lease *l = NULL;
  const struct tb__kind_ops *ops;
  struct tb__kind_acq ka;
  _Alignas(max_align_t) unsigned char state[TB__KIND_LEASE_STATE];
  int fds[TB__MAX_FDS], nfds = 0, rc, serial;
  uint64_t id = 0, t0, t1, t2, t3;
  char why[160];

  if (c == NULL || out == NULL)
    return TB_EINVAL;
  tb_acquire_options_init(&o);
  if (opts != NULL) {
    size_t n = opts->struct_size < sizeof(o) ? opts->struct_size : sizeof(o);
    if (n < sizeof(size_t))
      return TB_EINVAL;
    /* fields the caller's struct does not have keep their defaults (a
     * field cut in the middle is not read either) */
    memcpy(&o, opts, n);
    if (!TB__AO_HAS(n, device))
      o.device = -1;
    if (!TB__AO_HAS(n, flags))
      o.flags = 0;
    if (!TB__AO_HAS(n, release))
      o.release = NULL;
    if (!TB__AO_HAS(n, release_stream))
      o.release_stream = NULL;
  }
  memset(&ka, 0, sizeof(ka));
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  /* an acquire that may park lets call_lock go while it waits (rpc.c,
   * "Waits without the call lock"); where the daemon parks one request per
   * session, it first waits for the one parked now, if any */
  serial = o.timeout_ms != 0 && tb__park_serial(c);
  if (serial)
    pthread_mutex_lock(&c->park_lock);
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  tb__leases_retry(c->conn);
  if (channel == NULL || c->name_ok[0] == '\0' ||
      strcmp(channel, c->name_ok) != 0) {
    size_t len;
    if (tb__name_check(channel, TB_NAME_MAX) < 0) {
      rc = tb__set_error(c, TB_ENAME, "invalid channel name");
      goto out_unlock;
    }
    len = strlen(channel);
    if (len < sizeof(c->name_ok))
      memcpy(c->name_ok, channel, len + 1);
  }
  if (o.mode < TB_ACQUIRE_LATEST || o.mode > TB_ACQUIRE_EXACT) {
    rc = tb__set_error(c, TB_EINVAL, "unknown acquire mode %d", o.mode);
    goto out_unlock;
  }
  if (o.device < -1) {
    rc = tb__set_error(c, TB_EINVAL,
                       "acquire device %d: use -1 (the memory's device) or "
                       "a device ordinal",
                       o.device);
    goto out_unlock;
  }
  if (o.flags & ~TB_ACQUIRE_COPY_TO_DEVICE) {
    rc = tb__set_error(c, TB_EINVAL, "unknown acquire flags 0x%x",
                       o.flags & ~TB_ACQUIRE_COPY_TO_DEVICE);
    goto out_unlock;
  }
  if (o.release != NULL &&
      (o.release->deleter != tb__lease_deleter ||
       ((struct tb__lease *)o.release)->conn != c->conn)) {
    rc = tb__set_error(c, TB_EINVAL, "the tensor to release was not "
                                     "acquired on this client");
    goto out_unlock;
  }
  aq.channel = (char *)channel;
  aq.mode = (Tensorbroker__V1__AcquireMode)o.mode;
  aq.version = o.version;
  aq.timeout_ms = o.timeout_ms < 0 ? -1 : o.timeout_ms;
  /* The memory kind is known only from the reply, so whether the call
   * relied on the default stream is reported with the Release. */
  aq.implicit_stream = 0;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  r.acquire = &aq;
  t0 = tb__stat_now();
  if (o.release != NULL) {
    int rides = (c->features &
                 TENSORBROKER__V1__FEATURE__FEATURE_ACQUIRE_RELEASE) != 0;
    rc = lease_end((struct tb__lease *)o.release, o.release_stream,
                   rides ? &aq : NULL);
    if (rc < 0) {
      rc = tb__set_error(c, rc, "the lease to release ended without a done "
                                "event (%s); nothing acquired",
                         tb_strerror(rc));
      goto out_unlock;
    }
  }
  rc = tb__send_request(c, &r, NULL, 0, &id);
  if (rc < 0) {
    if (aq.release_lease_id != 0 &&
        !__atomic_load_n(&c->conn->dead, __ATOMIC_ACQUIRE)) {
      /* the release did not leave with the acquire: send it alone */
      pthread_mutex_lock(&c->conn->lock);
      (void)send_release_locked(c->conn, aq.release_lease_id,
                                aq.release_done_event_id,
                                aq.release_done_signal,
                                aq.release_implicit_stream);
      pthread_mutex_unlock(&c->conn->lock);
    }
    goto out_unlock;
  }
  t1 = tb__stat_now();
  tb__kinds_acquire_early(c); /* while the daemon answers */
  t2 = tb__stat_now();
  /* also while the daemon answers, and counted in the wait, as opening
   * ahead in it is (channels named at connect) */
  if (c->n_hints > 0)
    tb__hint_open(c, channel);
  tb__stat_wait_begin(tb__stat_now());
  rc = tb__await_parked(c, id, o.timeout_ms < 0 ? -1 : o.timeout_ms, &m, fds,
                        &nfds);
  t3 = tb__stat_now();
  tb__stat_wait_end(t0, t1, t2, t3);
  if (rc < 0)
    goto out_unlock;

  ar = m->reply->acquire;
  if (m->reply->body_case != TENSORBROKER__V1__REPLY__BODY_ACQUIRE ||
      ar == NULL || ar->layout == NULL || ar->buffer == NULL) {
    rc = tb__set_error(c, TB_EPROTO, "Acquire answered without a lease");
    if (ar != NULL)
      abandon_lease(c, ar->lease_id);
    goto out_free_reply;
  }
  bi = ar->buffer;
  rc = tb__layout_check(ar->layout, bi->size, TB__MAX_NDIM_HARD, why,
                        sizeof(why));
  if (rc < 0) {
    rc = tb__set_error(c, TB_EPROTO, "daemon sent a bad layout: %s", why);
    goto out_abandon;
  }

  ops = tb__kind((int)bi->kind);
  if (ops == NULL) {
    rc = tb__set_error(c, TB_ENOTSUP, "cannot map a buffer of memory kind "
                       "%d, which this library does not know (a daemon "
                       "newer than the library?)", (int)bi->kind);
    goto out_abandon;
  }
  map = tb__map_get(c->conn, bi->buffer_id, bi->generation);
  if (map == NULL) {
    rc = ops->map(c, bi, fds, nfds, &map);
    if (rc < 0) {
      forget_unmapped(c, bi);
      goto out_abandon;
    }
    tb__map_insert(c->conn, map);
  }
  if (ops->lease_state > 0)
    memset(state, 0, ops->lease_state);
  rc = ops->acquire(c, map, ar, &o, state, &ka);
  if (rc < 0)
    goto out_put_map;

  rc = build_tensor(c, ar, map, &ka, state, &l);
  if (rc < 0) {
    if (ka.copied) {
      /* the copy was enqueued with its done event: end the lease with it */
      (void)ops->copy_free(c->conn, state, o.stream);
      pthread_mutex_lock(&c->conn->lock);
      (void)send_release_locked(c->conn, ar->lease_id, ka.done_event_id, 0,
                                ka.implicit);
      tb__map_put_locked(c->conn, map);
      pthread_mutex_unlock(&c->conn->lock);
      goto out_free_reply;
    }
    goto out_put_map;
  }
  if (ka.copied) {
    /* Copied: the producer's memory is no longer read once the done event
     * (recorded after the copy) completes, so the lease ends now. */
    pthread_mutex_lock(&c->conn->lock);
    rc = send_release_locked(c->conn, ar->lease_id, ka.done_event_id, 0,
                             ka.implicit);
    tb__map_put_locked(c->conn, map);
    pthread_mutex_unlock(&c->conn->lock);
    l->map = NULL;
    if (rc < 0) {
      (void)ops->copy_free(c->conn, state, o.stream);
      free(l);
      rc = tb__set_error(c, rc, "cannot end the lease after the copy");
      goto out_free_reply;
    }
  }
  tb__conn_ref(c->conn);
  if (!l->copied) {
    /* held: disconnect ends it with its done event */
    pthread_mutex_lock(&c->conn->lock);
    DL_APPEND(c->conn->leases, l);
    l->listed = 1;
    pthread_mutex_unlock(&c->conn->lock);
  }
  *out = &l->m;
  rc = 0;
  tb__stat_after(t3);
  goto out_free_reply;

out_put_map:
  pthread_mutex_lock(&c->conn->lock);
  tb__map_put_locked(c->conn, map);
  pthread_mutex_unlock(&c->conn->lock);
out_abandon:
  abandon_lease(c, ar->lease_id);
out_free_reply:
  for (int i = 0; i < nfds; i++)
    close(fds[i]);
  tb__msg_free(c, m);
out_unlock:
  pthread_mutex_unlock(&c->call_lock);
  if (serial)
    pthread_mutex_unlock(&c->park_lock);
  return rc;
}
