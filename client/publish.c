/* SPDX-License-Identifier: Apache-2.0 */
/* Publishing: tb_publish (zero copy from a broker buffer or CUDA memory),
 * tb_publish_copy, and the producer's side of buffer reuse, tb_wait_free,
 * with the table of VersionFree notices it consults first. */
#include "kind.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void tb_publish_options_init(struct tb_publish_options *opts) {
  if (opts == NULL)
    return;
  memset(opts, 0, sizeof(*opts));
  opts->struct_size = sizeof(*opts);
}

static int copy_opts(const struct tb_publish_options *in,
                     struct tb_publish_options *o) {
  tb_publish_options_init(o);
  if (in != NULL) {
    size_t n = in->struct_size < sizeof(*o) ? in->struct_size : sizeof(*o);
    if (n < sizeof(size_t))
      return TB_EINVAL;
    memcpy(o, in, n);
  }
  return 0;
}

/* ---- remembered VersionFree notices ---- */

void tb__freed_clear(struct tb__freed *f) {
  free(f->channel);
  free(f->done);
  memset(f, 0, sizeof(*f));
}

/* Remove the table's entry i (0: the oldest), closing the gap. */
static void freed_remove(struct tb_client *c, size_t i) {
  for (size_t j = i; j + 1 < c->fr_len; j++)
    c->freed[(c->fr_head + j) % TB__FREED_TABLE_MAX] =
        c->freed[(c->fr_head + j + 1) % TB__FREED_TABLE_MAX];
  c->fr_len--;
  memset(&c->freed[(c->fr_head + c->fr_len) % TB__FREED_TABLE_MAX], 0,
         sizeof(struct tb__freed));
}

/* The index (from the oldest) of the oldest entry that pred accepts, or
 * fr_len. */
static size_t freed_oldest(const struct tb_client *c,
                           int (*pred)(const struct tb__freed *)) {
  size_t i;
  for (i = 0; i < c->fr_len; i++)
    if (pred(&c->freed[(c->fr_head + i) % TB__FREED_TABLE_MAX]))
      break;
  return i;
}

static int nothing_to_wait(const struct tb__freed *o) {
  return o->n_done == 0 && o->dropped == 0;
}

static int waited_for(const struct tb__freed *o) { return o->waited; }

/* Keep f (its storage now the table's). Entries stay after tb_wait_free,
 * so that waiting again (on another stream, or the Python binding's and
 * then the application's wait) waits again. When full, the oldest entry
 * with nothing to wait for goes (a later tb_wait_free on it asks the
 * daemon, which answers 0 without done events: the same); else the oldest
 * one waited for already; else the oldest, remembered as forgotten, so
 * that tb_wait_free refuses it instead of taking it as free. */
static void freed_keep(struct tb_client *c, const struct tb__freed *f) {
  size_t slot, i;

  if (c->fr_len == TB__FREED_TABLE_MAX) {
    i = freed_oldest(c, nothing_to_wait);
    if (i == c->fr_len)
      i = freed_oldest(c, waited_for);
    if (i == c->fr_len) {
      struct tb__freed *o = &c->freed[c->fr_head];
      free(c->forgot[c->fg_next].channel);
      c->forgot[c->fg_next].channel = o->channel; /* taken over */
      c->forgot[c->fg_next].version = o->version;
      c->fg_next = (c->fg_next + 1) % TB__FORGOT_MAX;
      o->channel = NULL;
      i = 0;
    }
    tb__freed_clear(&c->freed[(c->fr_head + i) % TB__FREED_TABLE_MAX]);
    freed_remove(c, i);
  }
  slot = (c->fr_head + c->fr_len) % TB__FREED_TABLE_MAX;
  c->freed[slot] = *f;
  c->fr_len++;
}

/* Whether (channel, version)'s done events were forgotten (freed_keep). */
static int freed_forgotten(const struct tb_client *c, const char *channel,
                           uint64_t version) {
  for (size_t i = 0; i < TB__FORGOT_MAX; i++)
    if (c->forgot[i].channel != NULL && c->forgot[i].version == version &&
        strcmp(c->forgot[i].channel, channel) == 0)
      return 1;
  return 0;
}

void tb__freed_add(struct tb_client *c,
                   const Tensorbroker__V1__VersionFree *vf) {
  struct tb__freed f;

  memset(&f, 0, sizeof(f));
  f.channel = strdup(vf->channel ? vf->channel : "");
  if (f.channel == NULL)
    return;
  f.version = vf->version;
  f.buffer_id = vf->buffer_id;
  f.dropped = vf->done_events_dropped;
  if (vf->n_done_events > 0) {
    f.done = calloc(vf->n_done_events, sizeof(*f.done));
    if (f.done == NULL) {
      free(f.channel);
      return;
    }
    for (size_t i = 0; i < vf->n_done_events; i++) {
      const Tensorbroker__V1__EventInfo *e = vf->done_events[i];
      struct tb__done_event *d = &f.done[f.n_done];
      if (e == NULL ||
          e->cuda_ipc_event_handle.len != TB__CUDA_IPC_HANDLE_SIZE)
        continue;
      d->event_id = e->event_id;
      memcpy(d->handle, e->cuda_ipc_event_handle.data,
             TB__CUDA_IPC_HANDLE_SIZE);
      if (e->device != NULL && e->device->uuid.len == TB__UUID_SIZE)
        memcpy(d->uuid, e->device->uuid.data, TB__UUID_SIZE);
      d->owner_pid = e->owner_pid;
      d->owner_shm_id = e->owner_shm_id;
      d->owner_pidns_id = e->owner_pidns_id;
      d->signal_value = e->signal_value;
      d->signal_slot = e->signal_slot;
      f.n_done++;
    }
  }
  freed_keep(c, &f);
}

struct tb__freed *tb__freed_find(struct tb_client *c, const char *channel,
                                 uint64_t version) {
  for (size_t i = 0; i < c->fr_len; i++) {
    struct tb__freed *f = &c->freed[(c->fr_head + i) % TB__FREED_TABLE_MAX];
    if (f->version == version && strcmp(f->channel, channel) == 0)
      return f;
  }
  return NULL;
}

void tb__freed_events_gone(struct tb_client *c, const uint64_t *ids,
                           size_t n) {
  for (size_t i = 0; i < c->fr_len; i++) {
    struct tb__freed *f = &c->freed[(c->fr_head + i) % TB__FREED_TABLE_MAX];
    size_t keep = 0;
    for (size_t d = 0; d < f->n_done; d++) {
      size_t j = 0;
      while (j < n && ids[j] != f->done[d].event_id)
        j++;
      if (j == n)
        f->done[keep++] = f->done[d];
    }
    f->n_done = keep;
  }
}

void tb__freed_free_all(struct tb_client *c) {
  for (size_t i = 0; i < TB__FORGOT_MAX; i++) {
    free(c->forgot[i].channel);
    c->forgot[i].channel = NULL;
  }
  for (size_t i = 0; i < c->fr_len; i++)
    tb__freed_clear(&c->freed[(c->fr_head + i) % TB__FREED_TABLE_MAX]);
  c->fr_len = 0;
}

/* ---- publish ---- */

/* Send Publish and read the version. Holds call_lock. */
static int send_publish(struct tb_client *c, const char *channel,
                        const DLTensor *t, const struct tb_publish_options *o,
                        struct tb__kind_publish *kp, uint64_t *version) {
  Tensorbroker__V1__Publish pb = TENSORBROKER__V1__PUBLISH__INIT;
  Tensorbroker__V1__Layout lay = TENSORBROKER__V1__LAYOUT__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  tb__server_message *m = NULL;
  int fds[TB__MAX_FDS], nfds = 0, rc;

  lay.device = &kp->dev;
  lay.dtype_code = t->dtype.code;
  lay.dtype_bits = t->dtype.bits;
  lay.dtype_lanes = t->dtype.lanes;
  lay.n_shape = (size_t)t->ndim;
  lay.shape = t->shape;
  if (t->strides != NULL) {
    lay.n_strides = (size_t)t->ndim;
    lay.strides = t->strides;
  }
  lay.byte_offset = kp->byte_offset;
  lay.flags = o->flags;
  pb.channel = (char *)channel;
  pb.buffer_id = kp->buffer_id;
  pb.layout = &lay;
  pb.ready_event_id = kp->ready_event_id;
  pb.ready_complete = kp->ready_event_id != 0 && kp->ready_complete;
  pb.ready_signal = kp->ready_event_id != 0 ? kp->ready_signal : 0;
  pb.metadata.data = (uint8_t *)o->metadata;
  pb.metadata.len = o->metadata_len;
  pb.history_depth = o->history_depth;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_PUBLISH;
  r.publish = &pb;
  rc = tb__call(c, &r, NULL, 0, 0, &m, fds, &nfds);
  if (rc < 0)
    return rc;
  for (int i = 0; i < nfds; i++)
    close(fds[i]);
  if (m->reply->body_case != TENSORBROKER__V1__REPLY__BODY_PUBLISH ||
      m->reply->publish == NULL || m->reply->publish->version == 0) {
    tb__msg_free(c, m);
    return tb__set_error(c, TB_EPROTO, "Publish answered without a version");
  }
  *version = m->reply->publish->version;
  tb__msg_free(c, m);
  return 0;
}

static int check_common(struct tb_client *c, const char *channel,
                        const DLTensor *t, const struct tb_publish_options *o) {
  if (tb__name_check(channel, TB_NAME_MAX) < 0)
    return tb__set_error(c, TB_ENAME, "invalid channel name");
  if (t == NULL || (t->ndim > 0 && t->shape == NULL))
    return tb__set_error(c, TB_EINVAL, "tensor or its shape missing");
  if (o->metadata_len > 0 && o->metadata == NULL)
    return tb__set_error(c, TB_EINVAL, "metadata_len without metadata");
  if (o->metadata_len > c->max_metadata)
    return tb__set_error(c, TB_ELIMIT,
                         "%zu bytes of metadata; the daemon allows %u",
                         o->metadata_len, (unsigned)c->max_metadata);
  return 0;
}

/* The tensor checked once (tensor.c), then published by the kind of
 * memory its device type names (kind.h). */
static int publish_locked(struct tb_client *c, const char *channel,
                          const DLTensor *t, const struct tb_publish_options *o,
                          uint64_t *version) {
  const struct tb__kind_ops *ops = tb__kind_for_device(t->device.device_type);
  struct tb__kind_publish kp;
  uint64_t elem_bits;
  uintptr_t start;
  int rc;

  if (ops == NULL || ops->publish == NULL)
    return tb__set_error(c, TB_EDEVICE, "device type %d not supported",
                         (int)t->device.device_type);
  rc = tb__tensor_check(c, t, &elem_bits, &start);
  if (rc < 0)
    return rc;
  ops = tb__kind_for_tensor(c, t->device.device_type, start);
  memset(&kp, 0, sizeof(kp));
  kp.dev = (Tensorbroker__V1__Device)TENSORBROKER__V1__DEVICE__INIT;
  rc = ops->publish(c, t, start, elem_bits, o->flags, o->stream, &kp);
  if (rc < 0)
    return rc;
  return send_publish(c, channel, t, o, &kp, version);
}

int tb_publish(tb_client *c, const char *channel, const DLTensor *t,
               const struct tb_publish_options *opts, uint64_t *out_version) {
  struct tb_publish_options o;
  uint64_t version = 0;
  int rc;

  if (c == NULL)
    return TB_EINVAL;
  if (copy_opts(opts, &o) < 0)
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  rc = check_common(c, channel, t, &o);
  if (rc < 0)
    goto out_unlock;
  rc = publish_locked(c, channel, t, &o, &version);
  if (rc == 0 && out_version != NULL)
    *out_version = version;
out_unlock:
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

/* Copy an arbitrary-stride tensor into dst, compact row-major. */
static void copy_strided(uint8_t *dst, const uint8_t *src, int ndim,
                         const int64_t *shape, const int64_t *strides,
                         size_t elem) {
  int64_t idx[TB__MAX_NDIM_HARD];
  int64_t n = 1;

  for (int i = 0; i < ndim; i++) {
    idx[i] = 0;
    n *= shape[i];
  }
  for (int64_t k = 0; k < n; k++) {
    int64_t off = 0;
    for (int i = 0; i < ndim; i++)
      off += idx[i] * strides[i];
    memcpy(dst + (size_t)k * elem, src + off * (int64_t)elem, elem);
    for (int i = ndim - 1; i >= 0; i--) {
      if (++idx[i] < shape[i])
        break;
      idx[i] = 0;
    }
  }
}

int tb_publish_copy(tb_client *c, const char *channel, const DLTensor *t,
                    const struct tb_publish_options *opts,
                    uint64_t *out_version) {
  struct tb_publish_options o;
  struct tb_buffer *b = NULL;
  uint64_t elem_bits, lo = 0, hi = 0, bytes;
  uintptr_t start;
  DLTensor copy;
  int rc;

  if (c == NULL)
    return TB_EINVAL;
  if (copy_opts(opts, &o) < 0)
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  rc = check_common(c, channel, t, &o);
  if (rc == 0 && t->device.device_type != kDLCPU)
    rc = tb__set_error(c, TB_EDEVICE, "tb_publish_copy takes host tensors");
  if (rc == 0 && o.stream != NULL)
    rc = tb__set_error(c, TB_ESTREAM, "host tensors take no stream (NULL)");
  if (rc == 0)
    rc = tb__tensor_check(c, t, &elem_bits, &start);
  if (rc == 0) {
    /* the compact size, overflow-checked */
    char why[160];
    rc = tb__layout_extent(t->ndim, t->shape, NULL, elem_bits, o.flags, 0,
                           &lo, &hi, why, sizeof(why));
    if (rc < 0)
      rc = tb__set_error(c, rc, "%s", why);
  }
  if (rc == 0 && t->strides != NULL && elem_bits % 8 != 0) {
    char why[160];
    rc = tb__layout_extent(t->ndim, t->shape, t->strides, elem_bits, o.flags,
                           0, &lo, &hi, why, sizeof(why));
    if (rc < 0)
      rc = tb__set_error(c, rc, "%s", why);
  }
  if (rc == 0 && t->data == NULL && hi > lo)
    rc = tb__set_error(c, TB_EINVAL, "tensor data is NULL");
  pthread_mutex_unlock(&c->call_lock);
  if (rc < 0)
    return rc;

  bytes = hi - lo; /* compact size (sub-byte: checked compact above) */
  rc = tb_host_buffer_create(c, bytes > 0 ? (size_t)bytes : 1, 0, &b);
  if (rc < 0)
    return rc;
  if (bytes > 0) {
    const uint8_t *src = (const uint8_t *)t->data + t->byte_offset;
    if (t->strides == NULL || elem_bits % 8 != 0)
      memcpy(b->data, src, (size_t)bytes); /* compact (sub-byte must be) */
    else
      copy_strided(b->data, src, t->ndim, t->shape, t->strides,
                   (size_t)(elem_bits / 8));
  }
  copy = *t;
  copy.data = b->data;
  copy.byte_offset = 0;
  copy.strides = NULL;
  rc = tb_publish(c, channel, &copy, &o, out_version);
  /* Unregistered right away: the daemon retires the buffer once the version
   * is freed, and our mapping is not needed any more. A refused publish
   * keeps the daemon's reason as the last error. A failure here leaks only
   * until the session ends; the version is out either way. */
  pthread_mutex_lock(&c->call_lock);
  (void)tb__buffer_destroy(c, b);
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

/* ---- wait_free ---- */

int tb_wait_free(tb_client *c, const char *channel, uint64_t version,
                 int timeout_ms, void *stream) {
  Tensorbroker__V1__WaitFree wf = TENSORBROKER__V1__WAIT_FREE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  tb__server_message *m = NULL;
  struct tb__freed *f;
  int fds[TB__MAX_FDS], nfds = 0, rc, parking = 0;
  uint64_t id = 0;

  if (c == NULL)
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  tb__leases_retry(c->conn);
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  if (tb__name_check(channel, TB_NAME_MAX) < 0) {
    rc = tb__set_error(c, TB_ENAME, "invalid channel name");
    goto out_unlock;
  }
  if (version == 0) {
    rc = tb__set_error(c, TB_ENOTFOUND, "version 0 is never published");
    goto out_unlock;
  }
again:
  /* Notices already here first: an EventsGone among them takes the done
   * events of a consumer whose process died out of the entry, and a stream
   * made to wait on one would never run again. */
  while (tb__pump(c, 0) > 0) {
  }
  f = tb__freed_find(c, channel, version);
  if (f == NULL && freed_forgotten(c, channel, version)) {
    rc = tb__set_error(c, TB_ELIMIT,
                       "version %llu of '%s' was freed with consumers' done "
                       "events, which this client forgot to make room: more "
                       "than %d freed versions were not waited for. Its "
                       "readers cannot be waited for now, so this buffer "
                       "must not be rewritten on the strength of this call; "
                       "wait for each version soon after it is freed",
                       (unsigned long long)version, channel,
                       TB__FREED_TABLE_MAX);
    goto out_unlock;
  }
  if (f == NULL && timeout_ms != 0 && !parking && tb__park_serial(c)) {
    /* The WaitFree may park: where the daemon parks one request per
     * session, after the parked request of another thread, if any (rpc.c,
     * "Waits without the call lock"). Only now, so that a wait for a
     * version known free never waits for another thread's acquire.
     * park_lock comes before call_lock: let go, take both, and look
     * again. */
    parking = 1;
    if (pthread_mutex_trylock(&c->park_lock) != 0) {
      pthread_mutex_unlock(&c->call_lock);
      pthread_mutex_lock(&c->park_lock);
      pthread_mutex_lock(&c->call_lock);
      goto again;
    }
  }
  if (f == NULL) {
    wf.channel = (char *)channel;
    wf.version = version;
    wf.timeout_ms = timeout_ms < 0 ? -1 : timeout_ms;
    r.body_case = TENSORBROKER__V1__REQUEST__BODY_WAIT_FREE;
    r.wait_free = &wf;
    rc = tb__send_request(c, &r, NULL, 0, &id);
    if (rc == 0)
      rc = tb__await_parked(c, id, timeout_ms < 0 ? -1 : timeout_ms, &m, fds,
                            &nfds);
    if (rc < 0)
      goto out_unlock;
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    /* The VersionFree notice, sent before this reply, is in the table now
     * and carries the same done events. */
    f = tb__freed_find(c, channel, version);
    if (f == NULL &&
        m->reply->body_case == TENSORBROKER__V1__REPLY__BODY_WAIT_FREE &&
        m->reply->wait_free != NULL) {
      Tensorbroker__V1__VersionFree vf = TENSORBROKER__V1__VERSION_FREE__INIT;
      vf.channel = (char *)channel;
      vf.version = version;
      vf.buffer_id = m->reply->wait_free->buffer_id;
      vf.n_done_events = m->reply->wait_free->n_done_events;
      vf.done_events = m->reply->wait_free->done_events;
      vf.done_events_dropped = m->reply->wait_free->done_events_dropped;
      tb__freed_add(c, &vf);
      f = tb__freed_find(c, channel, version);
    }
    tb__msg_free(c, m);
  }
  rc = 0;
  if (f == NULL)
    goto out_unlock; /* free long ago: nothing left to wait for */
  if (f->dropped > 0) {
    /* Some consumers' done events were not kept: their reads cannot be
     * waited for, so nothing here may say the buffer is free. The entry
     * stays, so that asking again says the same. */
    rc = tb__set_error(c, TB_ELIMIT,
                       "version %llu of '%s' was released by more consumers "
                       "than the daemon keeps done events for "
                       "(--max-done-events; %u not kept): their reads cannot "
                       "be waited for, so this buffer must not be rewritten; "
                       "publish from another one",
                       (unsigned long long)version, channel,
                       (unsigned)f->dropped);
    goto out_unlock;
  }
  /* Plain host versions carry no done events and never touch CUDA;
   * pinned ones do when a consumer's GPU read them. The entry stays: a
   * second wait (another stream) waits again, on the events' latest
   * records, which is later than needed but never too early. */
  if (f->n_done > 0)
    rc = tb__kinds_done_wait(c, f, stream);
  if (rc == 0)
    f->waited = 1;
out_unlock:
  pthread_mutex_unlock(&c->call_lock);
  if (parking)
    pthread_mutex_unlock(&c->park_lock);
  return rc;
}
