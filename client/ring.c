/* SPDX-License-Identifier: Apache-2.0 */
/* A producer's ring of slots in one buffer, a CUDA VMM buffer or a host
 * buffer (pinned or not) (tb_ring_*, docs/cuda.md, "VMM buffers"): the
 * next slot is handed out once the version last published from it is free
 * (tb_channel_wait_free: the producer's stream waits for the consumers'
 * done events, or for pinned memory the host), and a tensor in it is
 * published as the channel's next version. Built on the public API only,
 * with the library's layout check. */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

#define RING_ALIGN 256 /* what CUDA allocations guarantee */

struct tb_ring {
  tb_client *c;
  tb_buffer *b;
  char channel[TB_NAME_MAX + 1];
  size_t stride;        /* slot_bytes rounded up to RING_ALIGN */
  unsigned nslots;
  unsigned next;        /* the slot tb_ring_next hands out */
  int cur;              /* the slot handed out, not yet published; -1 */
  int cuda;             /* device memory: its writes are ordered on a stream */
  void *stream;         /* the stream tb_ring_next made wait (normalised) */
  uint64_t thread;      /* whose per-thread stream that was (tb__thread_id) */
  uint64_t versions[];  /* the version last published from each; 0: none */
};

/* The ring of tb_ring_create_cuda (device >= 0) or tb_ring_create_host
 * (device -1). */
static int ring_create(tb_client *c, const char *channel, size_t slot_bytes,
                       unsigned nslots, int device, unsigned flags,
                       tb_ring **out) {
  struct tb_ring *r;
  size_t stride;
  int rc;

  if (c == NULL || channel == NULL || out == NULL)
    return TB_EINVAL;
  if (tb__conn_forked(c->conn))
    return TB_EFORKED;
  if (strlen(channel) > TB_NAME_MAX || nslots < 2 || nslots > 1024 ||
      slot_bytes == 0 || slot_bytes > SIZE_MAX / 2 / nslots) {
    pthread_mutex_lock(&c->call_lock);
    rc = tb__set_error(c, TB_EINVAL, "ring: a channel name of at most %d "
                       "bytes, 2 to 1024 slots and a slot size > 0 that fits",
                       TB_NAME_MAX);
    pthread_mutex_unlock(&c->call_lock);
    return rc;
  }
  stride = (slot_bytes + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
  r = calloc(1, sizeof(*r) + nslots * sizeof(r->versions[0]));
  if (r == NULL)
    return TB_ENOMEM;
  if (device < 0)
    rc = tb_buffer_create_host(c, stride * nslots, flags, &r->b);
  else
    rc = tb_buffer_create_cuda(c, stride * nslots, device, flags, &r->b);
  if (rc < 0) {
    free(r);
    return rc;
  }
  r->c = c;
  r->cuda = device >= 0;
  memcpy(r->channel, channel, strlen(channel) + 1);
  r->stride = stride;
  r->nslots = nslots;
  r->cur = -1;
  *out = r;
  return 0;
}

int tb_ring_create_cuda(tb_client *c, const char *channel, size_t slot_bytes,
                        unsigned nslots, int device, unsigned flags,
                        tb_ring **out) {
  if (device < 0)
    return TB_EINVAL;
  return ring_create(c, channel, slot_bytes, nslots, device, flags, out);
}

int tb_ring_create_host(tb_client *c, const char *channel, size_t slot_bytes,
                        unsigned nslots, unsigned flags, tb_ring **out) {
  return ring_create(c, channel, slot_bytes, nslots, -1, flags, out);
}

/* stream as its contract reads it: NULL names the contract's stream. */
static void *ring_stream(const tb_ring *r, void *stream) {
  if (stream != TB_STREAM_DEFAULT)
    return stream;
  switch (r->c->conn->contract) {
  case TB_CONTRACT_SPEC:
    return TB_STREAM_LEGACY;
  case TB_CONTRACT_NO_SYNC:
    return TB_STREAM_NO_SYNC;
  case TB_CONTRACT_PER_THREAD:
    return TB_STREAM_PER_THREAD;
  default:
    return stream;
  }
}

int tb_ring_next(tb_ring *r, int timeout_ms, void *stream, void **data) {
  uint64_t v;
  int rc;

  if (r == NULL || data == NULL)
    return TB_EINVAL;
  if (tb__conn_forked(r->c->conn))
    return TB_EFORKED;
  /* The slot handed out and not published was ordered on the stream of
   * that call: asked for again, it comes back for that stream alone (its
   * readers' done events were waited for once, there). */
  if (r->cur >= 0) {
    if (r->cuda && (ring_stream(r, stream) != r->stream ||
                    (r->stream == TB_STREAM_PER_THREAD &&
                     r->thread != tb__thread_id()))) {
      pthread_mutex_lock(&r->c->call_lock);
      rc = tb__set_error(r->c, TB_ESTREAM, "ring: slot %d was handed out "
                         "for stream %p and not published; ask for it on "
                         "that stream", r->cur, r->stream);
      pthread_mutex_unlock(&r->c->call_lock);
      return rc;
    }
    *data = (char *)tb_buffer_data(r->b) + (size_t)r->cur * r->stride;
    return 0;
  }
  r->stream = ring_stream(r, stream);
  r->thread = tb__thread_id();
  v = r->versions[r->next];
  if (v != 0) {
    rc = tb_channel_wait_free(r->c, r->channel, v, timeout_ms, stream);
    if (rc < 0)
      return rc;
  }
  r->cur = (int)r->next;
  *data = (char *)tb_buffer_data(r->b) + (size_t)r->cur * r->stride;
  return 0;
}

/* t lies inside slot r->cur; why on the client otherwise. */
static int ring_tensor_in_slot(tb_ring *r, const DLTensor *t) {
  uintptr_t slot = (uintptr_t)tb_buffer_data(r->b) + (size_t)r->cur * r->stride;
  uintptr_t data = (uintptr_t)t->data;
  uint64_t elem_bits = 0, lo = 0, hi = 0;
  int rc;

  rc = tb__dtype_check(t->dtype.code, t->dtype.bits, t->dtype.lanes,
                       &elem_bits);
  if (rc == 0)
    rc = tb__layout_extent(t->ndim, t->shape, t->strides, elem_bits, 0,
                           t->byte_offset, &lo, &hi, NULL, 0);
  if (rc < 0 || data < slot || data - slot > r->stride ||
      hi > r->stride - (data - slot)) {
    pthread_mutex_lock(&r->c->call_lock);
    rc = tb__set_error(r->c, TB_EINVAL, "ring: the tensor is not inside slot "
                       "%d (%zu bytes) that tb_ring_next returned", r->cur,
                       r->stride);
    pthread_mutex_unlock(&r->c->call_lock);
    return rc;
  }
  return 0;
}

int tb_ring_publish(tb_ring *r, const DLTensor *t,
                    const struct tb_publish_options *opts,
                    uint64_t *out_version) {
  struct tb_publish_options o;
  uint64_t v = 0;
  int rc;

  if (r == NULL || t == NULL)
    return TB_EINVAL;
  if (tb__conn_forked(r->c->conn))
    return TB_EFORKED;
  if (r->cur < 0) {
    pthread_mutex_lock(&r->c->call_lock);
    rc = tb__set_error(r->c, TB_EINVAL, "ring: tb_ring_publish without a "
                       "slot from tb_ring_next");
    pthread_mutex_unlock(&r->c->call_lock);
    return rc;
  }
  if (opts != NULL) {
    o = *opts;
  } else {
    tb_publish_options_init(&o);
  }
  if (o.history_depth == 0)
    o.history_depth = 1;
  if (o.history_depth >= r->nslots) {
    pthread_mutex_lock(&r->c->call_lock);
    rc = tb__set_error(r->c, TB_EINVAL, "ring: history_depth %u must be "
                       "below the ring's %u slots, or no slot ever comes "
                       "free", o.history_depth, r->nslots);
    pthread_mutex_unlock(&r->c->call_lock);
    return rc;
  }
  /* The slot came back with the consumers' reads ordered before the work
   * of the stream tb_ring_next was given, and no other: writes on another
   * stream may overtake them (a side stream does not wait for the legacy
   * one). Caught here on every frame, not only when the race is lost. */
  if (r->cuda && (ring_stream(r, o.stream) != r->stream ||
                  (r->stream == TB_STREAM_PER_THREAD &&
                   r->thread != tb__thread_id()))) {
    pthread_mutex_lock(&r->c->call_lock);
    rc = tb__set_error(r->c, TB_ESTREAM, "ring: published on stream %p, but "
                       "tb_ring_next ordered the slot's reuse on stream %p "
                       "(a per-thread stream: of the thread that called it): "
                       "pass the stream that writes the slot to both, on "
                       "one thread",
                       ring_stream(r, o.stream), r->stream);
    pthread_mutex_unlock(&r->c->call_lock);
    return rc;
  }
  rc = ring_tensor_in_slot(r, t);
  if (rc < 0)
    return rc;
  rc = tb_channel_publish(r->c, r->channel, t, &o, &v);
  if (rc < 0)
    return rc;
  r->versions[r->cur] = v;
  r->next = ((unsigned)r->cur + 1) % r->nslots;
  r->cur = -1;
  if (out_version != NULL)
    *out_version = v;
  return 0;
}

tb_buffer *tb_ring_buffer(const tb_ring *r) { return r ? r->b : NULL; }

int tb_ring_destroy(tb_ring *r) {
  int rc;

  if (r == NULL)
    return 0;
  rc = tb_buffer_destroy(r->b);
  free(r);
  return rc;
}
