/* SPDX-License-Identifier: Apache-2.0 */
/* Protobuf-c messages to and from bytes. Knows nothing about sockets. */
#include "tb_proto.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <tensorbroker/errors.h>

/* ---- arena ---- */

struct tb__arena_block {
  struct tb__arena_block *next;
  size_t cap, used;
  max_align_t data[];
};

#define ARENA_ALIGN (sizeof(max_align_t))

static void *arena_alloc(void *ud, size_t size) {
  struct tb__arena *a = ud;
  struct tb__arena_block *b = a->more;
  size_t n = (size + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1);
  void *p;

  if (n < size)
    return NULL;
  if (n <= a->cap - a->used) {
    p = a->base + a->used;
    a->used += n;
    return p;
  }
  if (b == NULL || n > b->cap - b->used) {
    size_t cap = b != NULL ? b->cap * 2 : a->cap * 2;
    if (cap < n)
      cap = n;
    if (cap > SIZE_MAX - sizeof(*b))
      return NULL;
    b = malloc(sizeof(*b) + cap);
    if (b == NULL)
      return NULL;
    b->next = a->more;
    b->cap = cap;
    b->used = 0;
    a->more = b;
  }
  p = (uint8_t *)b->data + b->used;
  b->used += n;
  return p;
}

static void arena_free(void *ud, void *p) {
  (void)ud; /* everything goes at the next reset */
  (void)p;
}

int tb__arena_init(struct tb__arena *a, size_t cap) {
  memset(a, 0, sizeof(*a));
  cap = (cap + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1);
  a->base = malloc(cap);
  if (a->base == NULL)
    return TB_ENOMEM;
  a->cap = cap;
  a->pb.alloc = arena_alloc;
  a->pb.free = arena_free;
  a->pb.allocator_data = a;
  return 0;
}

void tb__arena_reset(struct tb__arena *a) {
  while (a->more != NULL) {
    struct tb__arena_block *b = a->more;
    a->more = b->next;
    free(b);
  }
  a->used = 0;
}

void tb__arena_fini(struct tb__arena *a) {
  if (a == NULL || a->base == NULL)
    return;
  tb__arena_reset(a);
  free(a->base);
  a->base = NULL;
}

/* ---- decoding ---- */

static int request_unpack(ProtobufCAllocator *pa, const uint8_t *buf,
                          size_t len, tb__request **out) {
  tb__request *m;

  if (buf == NULL || len == 0 || len > TB__MAX_MESSAGE_HARD)
    return TB_EPROTO;
  m = tensorbroker__v1__request__unpack(pa, len, buf);
  if (m == NULL)
    return TB_EPROTO;
  if (m->body_case == TENSORBROKER__V1__REQUEST__BODY__NOT_SET) {
    tensorbroker__v1__request__free_unpacked(m, pa);
    return TB_EPROTO;
  }
  *out = m;
  return 0;
}

int tb__request_decode(const uint8_t *buf, size_t len, tb__request **out) {
  return request_unpack(NULL, buf, len, out);
}

int tb__request_decode_in(struct tb__arena *a, const uint8_t *buf,
                          size_t len, tb__request **out) {
  tb__arena_reset(a);
  if (tb__request_decode_fast(a, buf, len, out) == 1)
    return 0;
  tb__arena_reset(a);
  return request_unpack(&a->pb, buf, len, out);
}

void tb__request_free(tb__request *m) {
  if (m != NULL)
    tensorbroker__v1__request__free_unpacked(m, NULL);
}

static int server_message_unpack(ProtobufCAllocator *pa, const uint8_t *buf,
                                 size_t len, tb__server_message **out) {
  tb__server_message *m;

  if (buf == NULL || len == 0 || len > TB__MAX_MESSAGE_HARD)
    return TB_EPROTO;
  m = tensorbroker__v1__server_message__unpack(pa, len, buf);
  if (m == NULL)
    return TB_EPROTO;
  if (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY__NOT_SET ||
      (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY &&
       m->reply == NULL) ||
      (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE &&
       (m->notice == NULL ||
        m->notice->body_case == TENSORBROKER__V1__NOTICE__BODY__NOT_SET))) {
    tensorbroker__v1__server_message__free_unpacked(m, pa);
    return TB_EPROTO;
  }
  *out = m;
  return 0;
}

int tb__server_message_decode(const uint8_t *buf, size_t len,
                              tb__server_message **out) {
  return server_message_unpack(NULL, buf, len, out);
}

int tb__server_message_decode_in(struct tb__arena *a, const uint8_t *buf,
                                 size_t len, tb__server_message **out) {
  tb__arena_reset(a);
  if (tb__server_message_decode_fast(a, buf, len, out) == 1)
    return 0;
  tb__arena_reset(a);
  return server_message_unpack(&a->pb, buf, len, out);
}

void tb__server_message_free(tb__server_message *m) {
  if (m != NULL)
    tensorbroker__v1__server_message__free_unpacked(m, NULL);
}


/* The header of a length-delimited field: tag then length. */
static size_t put_len_field(uint8_t *p, uint32_t field, size_t len) {
  size_t n = tb__put_varint(p, ((uint64_t)field << 3) | 2u);
  return n + tb__put_varint(p + n, len);
}

static size_t len_field_size(uint32_t field, size_t len) {
  return tb__varint_size((uint64_t)field << 3) + tb__varint_size(len) + len;
}

/* The message a oneof case points at, or NULL. */
static const ProtobufCMessage *oneof_body(const ProtobufCMessage *m,
                                          uint32_t field) {
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field(m->descriptor, field);

  if (f == NULL || f->type != PROTOBUF_C_TYPE_MESSAGE)
    return NULL;
  return *(const ProtobufCMessage *const *)((const char *)m + f->offset);
}

/* Reply's fields before its body (request_id = 1, status = 2, message =
 * 3), as protobuf-c writes them for proto3: zero values and empty strings
 * left out, a negative int32 as a ten-byte varint. Writes to out unless
 * NULL; returns the length. */
static size_t reply_head(const Tensorbroker__V1__Reply *r, uint8_t *out) {
  uint8_t tmp[24];
  size_t n = 0, k = 0, len;

  if (r->request_id != 0) {
    tmp[k++] = 1u << 3;
    k += tb__put_varint(tmp + k, r->request_id);
  }
  if (r->status != 0) {
    tmp[k++] = 2u << 3;
    k += tb__put_varint(tmp + k, (uint64_t)(int64_t)r->status);
  }
  if (out != NULL)
    memcpy(out, tmp, k);
  n = k;
  if (r->message != NULL && r->message[0] != '\0') {
    len = strlen(r->message);
    if (out != NULL) {
      k = put_len_field(out + n, 3, len);
      memcpy(out + n + k, r->message, len);
    }
    n += len_field_size(3, len);
  }
  return n;
}

/* ---- AcquireReply by hand ----
 * The daemon's every acquire answer, written in protobuf-c's form: known
 * fields by number (zero values, empty strings and bytes left out), then
 * the unknown fields verbatim in their order (the daemon puts the layout
 * and the buffer there, packed once). A writer with p == NULL only counts. */
struct wr {
  uint8_t *p;
  size_t n;
};

static void wr_bytes(struct wr *w, const void *data, size_t len) {
  if (w->p != NULL && len > 0)
    memcpy(w->p + w->n, data, len);
  w->n += len;
}

static void wr_varint(struct wr *w, uint64_t v) {
  if (w->p == NULL)
    w->n += tb__varint_size(v);
  else
    w->n += tb__put_varint(w->p + w->n, v);
}

static void wr_u64(struct wr *w, uint32_t field, uint64_t v) {
  if (v == 0)
    return;
  wr_varint(w, (uint64_t)field << 3);
  wr_varint(w, v);
}

static void wr_len(struct wr *w, uint32_t field, const void *data, size_t len) {
  if (len == 0)
    return;
  wr_varint(w, ((uint64_t)field << 3) | 2u);
  wr_varint(w, len);
  wr_bytes(w, data, len);
}

/* A submessage field: its body is written twice, first only counted (for
 * the length prefix), then for real. */
typedef void wr_body_fn(struct wr *w, const void *m);

static void wr_sub(struct wr *w, uint32_t field, wr_body_fn *body,
                   const void *m) {
  struct wr count = {NULL, 0};

  body(&count, m);
  wr_varint(w, ((uint64_t)field << 3) | 2u);
  wr_varint(w, count.n);
  body(w, m);
}

/* Device and EventInfo, without unknown fields */
static void device_body(struct wr *w, const void *m) {
  const Tensorbroker__V1__Device *d = m;

  wr_u64(w, 1, (uint64_t)(int64_t)d->type);
  wr_u64(w, 2, (uint64_t)(int64_t)d->id);
  wr_len(w, 3, d->uuid.data, d->uuid.len);
}

static void event_body(struct wr *w, const void *m) {
  const Tensorbroker__V1__EventInfo *e = m;

  wr_u64(w, 1, e->event_id);
  wr_len(w, 2, e->cuda_ipc_event_handle.data, e->cuda_ipc_event_handle.len);
  if (e->device != NULL)
    wr_sub(w, 3, device_body, e->device);
  wr_u64(w, 4, e->owner_pid);
  wr_u64(w, 5, e->complete != 0);
  wr_u64(w, 6, e->owner_died != 0);
  wr_u64(w, 7, e->owner_shm_id);
  wr_u64(w, 8, e->owner_pidns_id);
  wr_u64(w, 9, e->signal_value);
  wr_u64(w, 10, e->signal_slot);
}

/* 0 when the message has a form left to protobuf-c. */
static int acquire_reply_mine(const Tensorbroker__V1__AcquireReply *ar) {
  if (ar->layout != NULL || ar->buffer != NULL)
    return 0;
  if (ar->ready_event != NULL &&
      (ar->ready_event->base.n_unknown_fields != 0 ||
       (ar->ready_event->device != NULL &&
        ar->ready_event->device->base.n_unknown_fields != 0)))
    return 0;
  return 1;
}

static size_t acquire_reply_put(const Tensorbroker__V1__AcquireReply *ar,
                                uint8_t *out) {
  struct wr w = {out, 0};

  wr_u64(&w, 1, ar->lease_id);
  wr_u64(&w, 2, ar->version);
  if (ar->ready_event != NULL)
    wr_sub(&w, 5, event_body, ar->ready_event);
  wr_len(&w, 6, ar->metadata.data, ar->metadata.len);
  if (ar->channel != NULL)
    wr_len(&w, 7, ar->channel, strlen(ar->channel));
  wr_u64(&w, 8, ar->done_slot);
  for (size_t i = 0; i < ar->base.n_unknown_fields; i++) {
    const ProtobufCMessageUnknownField *u = &ar->base.unknown_fields[i];
    wr_varint(&w, ((uint64_t)u->tag << 3) | (uint64_t)u->wire_type);
    wr_bytes(&w, u->data, u->len);
  }
  return w.n;
}

/* protobuf-c sizes a nested message once for each message around it (pack
 * asks every submessage for its size before packing it), so a reply three
 * levels down was sized three times, plus once for the cap check. Here the
 * two outer levels (ServerMessage, then Reply or Notice) are written by
 * hand around their oneof body, which protobuf-c sizes once and packs. The
 * bytes are the same as protobuf-c's: fields in field-number order, the
 * oneof body (highest numbers) last. */
long tb__server_message_encode(const tb__server_message *m, uint8_t *buf,
                               size_t cap) {
  const ProtobufCMessage *mid = NULL, *body = NULL;
  uint32_t mid_field = (uint32_t)m->body_case, body_field = 0;
  size_t head, body_len, mid_len, n;
  union {
    Tensorbroker__V1__Reply reply;
    Tensorbroker__V1__Notice notice;
  } h; /* the middle message without its body: the fields before it */
  ProtobufCMessage *hm = NULL;
  int is_reply = 0;

  if (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY &&
      m->reply != NULL &&
      m->reply->body_case == TENSORBROKER__V1__REPLY__BODY_ACQUIRE &&
      m->reply->acquire != NULL && m->reply->base.n_unknown_fields == 0 &&
      m->base.n_unknown_fields == 0 && acquire_reply_mine(m->reply->acquire)) {
    /* every acquire's answer: no copy of the Reply, no descriptor lookup
     * (reply_head reads only the fields before the body) */
    head = reply_head(m->reply, NULL);
    body_len = acquire_reply_put(m->reply->acquire, NULL);
    mid_len = head + len_field_size(TENSORBROKER__V1__REPLY__BODY_ACQUIRE,
                                    body_len);
    n = len_field_size(mid_field, mid_len);
    if (n > cap)
      return TB_ELIMIT;
    n = put_len_field(buf, mid_field, mid_len);
    n += reply_head(m->reply, buf + n);
    n += put_len_field(buf + n, TENSORBROKER__V1__REPLY__BODY_ACQUIRE,
                       body_len);
    n += acquire_reply_put(m->reply->acquire, buf + n);
    return (long)n;
  }
  if (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY &&
      m->reply != NULL) {
    mid = &m->reply->base;
    body_field = (uint32_t)m->reply->body_case;
    h.reply = *m->reply;
    h.reply.body_case = TENSORBROKER__V1__REPLY__BODY__NOT_SET;
    hm = &h.reply.base;
    is_reply = 1;
  } else if (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE &&
             m->notice != NULL) {
    mid = &m->notice->base;
    body_field = (uint32_t)m->notice->body_case;
    h.notice = *m->notice;
    h.notice.body_case = TENSORBROKER__V1__NOTICE__BODY__NOT_SET;
    hm = &h.notice.base;
  }
  if (mid != NULL && body_field != 0)
    body = oneof_body(mid, body_field);
  if (body == NULL || mid->n_unknown_fields != 0 ||
      m->base.n_unknown_fields != 0) {
    n = tensorbroker__v1__server_message__get_packed_size(m);
    if (n > cap)
      return TB_ELIMIT;
    return (long)tensorbroker__v1__server_message__pack(m, buf);
  }
  if (is_reply)
    head = reply_head(&h.reply, NULL); /* protobuf-c would walk 12 fields */
  else
    head = protobuf_c_message_get_packed_size(hm);
  body_len = protobuf_c_message_get_packed_size(body);
  mid_len = head + len_field_size(body_field, body_len);
  n = len_field_size(mid_field, mid_len);
  if (n > cap)
    return TB_ELIMIT;
  n = put_len_field(buf, mid_field, mid_len);
  if (is_reply)
    n += reply_head(&h.reply, buf + n);
  else
    n += protobuf_c_message_pack(hm, buf + n);
  n += put_len_field(buf + n, body_field, body_len);
  n += protobuf_c_message_pack(body, buf + n);
  return (long)n;
}

/* A varint field at p (tag, value), left out when v is 0 as protobuf-c
 * does for proto3. */
static size_t put_varint_field(uint8_t *p, uint32_t field, uint64_t v) {
  size_t n;

  if (v == 0)
    return 0;
  n = tb__put_varint(p, (uint64_t)field << 3);
  return n + tb__put_varint(p + n, v);
}

/* The bodies the library sends on every acquire and release, written by
 * hand in protobuf-c's order and form (fields by number, zero values and
 * empty strings left out, negative int32/int64 as ten-byte varints): its
 * table-driven pack took ~1.3k instructions for an Acquire. Returns the
 * length written to out (up to 2 * 11 + 9 * 11 bytes plus the channel),
 * or 0 for a body left to protobuf-c. */
static size_t put_acquire(const Tensorbroker__V1__Acquire *q, uint8_t *out,
                          size_t cap) {
  size_t n = 0, len = q->channel != NULL ? strlen(q->channel) : 0;

  if (q->base.n_unknown_fields != 0 || len > cap || cap - len < 112)
    return 0;
  if (len > 0) {
    n += put_len_field(out, 1, len);
    memcpy(out + n, q->channel, len);
    n += len;
  }
  n += put_varint_field(out + n, 2, (uint64_t)(int64_t)(int32_t)q->mode);
  n += put_varint_field(out + n, 3, q->version);
  n += put_varint_field(out + n, 4, (uint64_t)q->timeout_ms);
  n += put_varint_field(out + n, 5, q->implicit_stream != 0);
  n += put_varint_field(out + n, 6, q->release_lease_id);
  n += put_varint_field(out + n, 7, q->release_done_event_id);
  n += put_varint_field(out + n, 8, q->release_implicit_stream != 0);
  n += put_varint_field(out + n, 9, q->release_done_signal);
  return n;
}

static size_t put_release(const Tensorbroker__V1__Release *q, uint8_t *out) {
  size_t n = 0;

  if (q->base.n_unknown_fields != 0)
    return 0;
  n += put_varint_field(out + n, 1, q->lease_id);
  n += put_varint_field(out + n, 2, q->done_event_id);
  n += put_varint_field(out + n, 3, q->want_reply != 0);
  n += put_varint_field(out + n, 4, q->implicit_stream != 0);
  n += put_varint_field(out + n, 5, q->done_signal);
  return n;
}

/* Same idea for a request: Request's own fields, then its body sized once
 * (protobuf-c would size it twice and walk Request's fields twice); an
 * Acquire or Release body is written by hand. */
long tb__request_encode(const tb__request *m, uint8_t *buf, size_t cap) {
  const ProtobufCMessage *body = NULL;
  uint8_t head[16], tmp[384]; /* an Acquire of a name up to 255 bytes */
  size_t hlen, body_len, n;
  int by_hand;

  if (m->body_case == TENSORBROKER__V1__REQUEST__BODY_ACQUIRE)
    body = m->acquire != NULL ? &m->acquire->base : NULL;
  else if (m->body_case == TENSORBROKER__V1__REQUEST__BODY_RELEASE)
    body = m->release != NULL ? &m->release->base : NULL;
  else if (m->body_case != TENSORBROKER__V1__REQUEST__BODY__NOT_SET)
    body = oneof_body(&m->base, (uint32_t)m->body_case);
  if (m->base.n_unknown_fields != 0)
    body = NULL;
  if (body == NULL) {
    n = tensorbroker__v1__request__get_packed_size(m);
    if (n > cap)
      return TB_ELIMIT;
    return (long)tensorbroker__v1__request__pack(m, buf);
  }
  /* Request's only field besides the body: request_id = 1 (left out when
   * 0, as protobuf-c does for proto3) */
  hlen = 0;
  if (m->request_id != 0) {
    head[hlen++] = 1u << 3;
    hlen += tb__put_varint(head + hlen, m->request_id);
  }
  body_len = 0;
  if (m->body_case == TENSORBROKER__V1__REQUEST__BODY_ACQUIRE)
    body_len = put_acquire(m->acquire, tmp, sizeof(tmp));
  else if (m->body_case == TENSORBROKER__V1__REQUEST__BODY_RELEASE)
    body_len = put_release(m->release, tmp);
  by_hand = body_len > 0;
  if (!by_hand)
    body_len = protobuf_c_message_get_packed_size(body);
  n = hlen + len_field_size((uint32_t)m->body_case, body_len);
  if (n > cap)
    return TB_ELIMIT;
  memcpy(buf, head, hlen);
  n = hlen + put_len_field(buf + hlen, (uint32_t)m->body_case, body_len);
  if (by_hand)
    memcpy(buf + n, tmp, body_len);
  else
    (void)protobuf_c_message_pack(body, buf + n);
  return (long)(n + body_len);
}
