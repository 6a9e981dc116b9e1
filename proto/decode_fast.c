/* SPDX-License-Identifier: Apache-2.0 */
/* Hand-written decoders for the messages of the acquire/release hot path:
 * in the library ServerMessage{reply: Reply{request_id, status, message,
 * acquire: AcquireReply}} and ServerMessage{notice: Notice{new_version:
 * NewVersion}} (what a subscribed consumer reads), in the daemon Request{request_id, acquire or
 * release}. protobuf-c's table-driven unpack spent ~5.8k instructions on
 * the first, about 60 % of a warm tb_acquire in the library, and ~1.1k on
 * each request in the daemon; these fill the same protobuf-c structs, in the
 * same arena, in a fraction of that.
 *
 * It takes only what it understands completely: each known field at most
 * once and with its proto3 wire type, repeated int64 fields packed, strings
 * of printable ASCII, varints of at most 10 bytes (keys and lengths at most
 * 5), no unknown fields, and a Reply whose body is an AcquireReply. For
 * anything else it answers "not mine" and protobuf-c decodes the message,
 * or refuses it. So they never
 * accept what protobuf-c would refuse, and what they accept they decode to
 * the values protobuf-c gives (tests/unit/test_codec.c compares the two on
 * generated and on corrupted messages). */
#include "tb_proto.h"

#include <stddef.h>
#include <string.h>

#include <tensorbroker/errors.h>

struct rd {
  const uint8_t *p, *end;
};

/* < 0: not mine (malformed, or a form left to protobuf-c) */
#define NOT_MINE (-1)

/* A varint of at most max_bytes bytes: 10 for a value, 5 for a key or a
 * length prefix, as protobuf-c reads them (parse_tag_and_wiretype and
 * scan_length_prefix refuse a sixth byte). */
static int rd_varint_max(struct rd *r, uint64_t *v, size_t max_bytes) {
  const uint8_t *p = r->p;
  const uint8_t *end = (size_t)(r->end - p) > max_bytes ? p + max_bytes
                                                        : r->end;
  uint64_t x = 0;
  unsigned shift = 0;

  while (p < end) {
    uint8_t b = *p++;
    x |= (uint64_t)(b & 0x7f) << shift;
    if (b < 0x80) {
      if (shift == 63 && b > 1)
        return NOT_MINE; /* more than 64 bits */
      r->p = p;
      *v = x;
      return 0;
    }
    shift += 7;
    if (shift > 63)
      return NOT_MINE; /* more than ten bytes */
  }
  return NOT_MINE;
}

static int rd_varint(struct rd *r, uint64_t *v) {
  return rd_varint_max(r, v, 10);
}

/* The next key; 0 at the end of r. */
static int rd_key(struct rd *r, uint32_t *field, int *wire) {
  uint64_t k;

  if (r->p == r->end)
    return 0;
  if (rd_varint_max(r, &k, 5) < 0 || k > UINT32_MAX || (k >> 3) == 0)
    return NOT_MINE;
  *field = (uint32_t)(k >> 3);
  *wire = (int)(k & 7);
  return 1;
}

static int rd_len(struct rd *r, struct rd *sub) {
  uint64_t n;

  if (rd_varint_max(r, &n, 5) < 0 || n > (uint64_t)(r->end - r->p))
    return NOT_MINE;
  sub->p = r->p;
  sub->end = r->p + n;
  r->p += n;
  return 0;
}

/* Wire types */
#define WT_VARINT 0
#define WT_LEN 2

/* Each field number below 64 may come once: seen is a bitmask. */
#define ONCE(seen, f)                                                        \
  do {                                                                       \
    if ((seen) & (1ull << (f)))                                              \
      return NOT_MINE;                                                       \
    (seen) |= 1ull << (f);                                                   \
  } while (0)

/* The arena's bump allocation inline (its first block); the rest through
 * its allocator. Sizes are rounded as arena_alloc in codec.c rounds them. */
static void *arena_new(struct tb__arena *a, size_t size) {
  size_t n = (size + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1);

  if (n >= size && n <= a->cap - a->used) {
    void *p = a->base + a->used;
    a->used += n;
    return p;
  }
  return a->pb.alloc(a->pb.allocator_data, size);
}

static int rd_string(struct tb__arena *a, struct rd *r, char **out) {
  struct rd s;
  char *p;

  if (rd_len(r, &s) < 0)
    return NOT_MINE;
  for (const uint8_t *c = s.p; c < s.end; c++)
    if (*c < 0x20 || *c > 0x7e)
      return NOT_MINE;
  p = arena_new(a, (size_t)(s.end - s.p) + 1);
  if (p == NULL)
    return NOT_MINE;
  memcpy(p, s.p, (size_t)(s.end - s.p));
  p[s.end - s.p] = '\0';
  *out = p;
  return 0;
}

static int rd_bytes(struct tb__arena *a, struct rd *r, ProtobufCBinaryData *out) {
  struct rd s;
  size_t n;

  if (rd_len(r, &s) < 0)
    return NOT_MINE;
  n = (size_t)(s.end - s.p);
  out->len = n;
  out->data = NULL;
  if (n > 0) {
    out->data = arena_new(a, n);
    if (out->data == NULL)
      return NOT_MINE;
    memcpy(out->data, s.p, n);
  }
  return 0;
}

/* A packed repeated int64. */
static int rd_packed_i64(struct tb__arena *a, struct rd *r, size_t *n_out,
                         int64_t **out) {
  struct rd s, c;
  size_t n = 0;
  uint64_t v;
  int64_t *vals;

  if (rd_len(r, &s) < 0)
    return NOT_MINE;
  for (c = s; c.p < c.end; n++)
    if (rd_varint(&c, &v) < 0)
      return NOT_MINE;
  *n_out = n;
  *out = NULL;
  if (n == 0)
    return 0;
  vals = arena_new(a, n * sizeof(*vals));
  if (vals == NULL)
    return NOT_MINE;
  for (size_t i = 0; i < n; i++) {
    (void)rd_varint(&s, &v);
    vals[i] = (int64_t)v;
  }
  *out = vals;
  return 0;
}

/* var = a new type in the arena, set to the initialiser that follows
 * (protobuf-c's INIT macro, whose commas make it several arguments). */
#define NEW(a, type, var, ...)                                               \
  do {                                                                       \
    static const type init_ = __VA_ARGS__;                                   \
    (var) = arena_new((a), sizeof(type));                                    \
    if ((var) == NULL)                                                       \
      return NOT_MINE;                                                       \
    *(var) = init_;                                                          \
  } while (0)

/* Fields of a message body: one case per field, each reading its value. */
#define VARINT_FIELD(n, lvalue, conv)                                        \
  case n:                                                                    \
    if (wire != WT_VARINT || rd_varint(&r, &v) < 0)                          \
      return NOT_MINE;                                                       \
    (lvalue) = conv(v);                                                      \
    break
#define AS_U64(v) (v)
#define AS_I64(v) ((int64_t)(v))
#define AS_U32(v) ((uint32_t)(v))
#define AS_I32(v) ((int32_t)(uint32_t)(v))
#define AS_BOOL(v) ((v) != 0)

#define BODY_BEGIN(in)                                                       \
  struct rd r = *(in);                                                       \
  uint64_t seen = 0, v;                                                      \
  uint32_t field;                                                            \
  int wire, k;                                                               \
  (void)v;                                                                   \
  while ((k = rd_key(&r, &field, &wire)) == 1) {                             \
    if (field >= 64)                                                         \
      return NOT_MINE;                                                       \
    ONCE(seen, field);                                                       \
    switch (field) {
#define BODY_END                                                             \
    default:                                                                 \
      return NOT_MINE;                                                       \
    }                                                                        \
  }                                                                          \
  return k

#define LEN_FIELD(n, call)                                                   \
  case n:                                                                    \
    if (wire != WT_LEN || (call) < 0)                                        \
      return NOT_MINE;                                                       \
    break

/* sub_NAME: a length-delimited field holding a TYPE, decoded by dec_NAME
 * into a new TYPE in the arena. */
#define SUB(name, type, init)                                                \
  static int new_##name(struct tb__arena *a, struct rd *s, type **out) {     \
    NEW(a, type, *out, init);                                                \
    return dec_##name(a, s, *out);                                           \
  }                                                                          \
  static int sub_##name(struct tb__arena *a, struct rd *r, type **out) {     \
    struct rd s;                                                             \
    if (rd_len(r, &s) < 0)                                                   \
      return NOT_MINE;                                                       \
    return new_##name(a, &s, out);                                           \
  }

/* kept_NAME: the same for a sub-message the arena's keep may hold
 * (tb_proto.h): when its bytes are those of keep->slot, the kept copy;
 * else decoded into the slot's arena and kept. */
#define KEPT(name, type, slot)                                               \
  static int kept_##name(struct tb__arena *a, struct rd *r, type **out) {    \
    struct rd s;                                                             \
    struct tb__kept *k;                                                      \
    size_t n;                                                                \
    if (a->keep == NULL)                                                     \
      return sub_##name(a, r, out);                                          \
    if (rd_len(r, &s) < 0)                                                   \
      return NOT_MINE;                                                       \
    k = &a->keep->slot;                                                      \
    n = (size_t)(s.end - s.p);                                               \
    if (k->msg != NULL && k->len == n && memcmp(k->bytes, s.p, n) == 0) {    \
      *out = k->msg;                                                         \
      k->hits++;                                                             \
      return 0;                                                              \
    }                                                                        \
    if (n > sizeof(k->bytes))                                                \
      return new_##name(a, &s, out);                                         \
    k->msg = NULL;                                                           \
    tb__arena_reset(&k->arena);                                              \
    if (new_##name(&k->arena, &s, out) < 0)                                  \
      return NOT_MINE;                                                       \
    memcpy(k->bytes, s.p, n);                                                \
    k->len = n;                                                              \
    k->msg = *out;                                                           \
    return 0;                                                                \
  }

int tb__keep_init(struct tb__keep *k) {
  struct tb__kept *slots[] = {&k->layout, &k->buffer, &k->event};

  memset(k, 0, sizeof(*k));
  for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++) {
    if (tb__arena_init(&slots[i]->arena, 512) < 0) {
      tb__keep_fini(k);
      return TB_ENOMEM;
    }
  }
  return 0;
}

void tb__keep_fini(struct tb__keep *k) {
  if (k == NULL)
    return;
  tb__arena_fini(&k->layout.arena);
  tb__arena_fini(&k->buffer.arena);
  tb__arena_fini(&k->event.arena);
  memset(k, 0, sizeof(*k));
}

static int dec_device(struct tb__arena *a, struct rd *in,
                      Tensorbroker__V1__Device *m) {
  BODY_BEGIN(in)
    VARINT_FIELD(1, m->type, AS_I32);
    VARINT_FIELD(2, m->id, AS_I32);
    LEN_FIELD(3, rd_bytes(a, &r, &m->uuid));
  BODY_END;
}

SUB(device, Tensorbroker__V1__Device, TENSORBROKER__V1__DEVICE__INIT)

static int dec_layout(struct tb__arena *a, struct rd *in,
                      Tensorbroker__V1__Layout *m) {
  BODY_BEGIN(in)
    LEN_FIELD(1, sub_device(a, &r, &m->device));
    VARINT_FIELD(2, m->dtype_code, AS_U32);
    VARINT_FIELD(3, m->dtype_bits, AS_U32);
    VARINT_FIELD(4, m->dtype_lanes, AS_U32);
    LEN_FIELD(5, rd_packed_i64(a, &r, &m->n_shape, &m->shape));
    LEN_FIELD(6, rd_packed_i64(a, &r, &m->n_strides, &m->strides));
    VARINT_FIELD(7, m->byte_offset, AS_U64);
    VARINT_FIELD(8, m->flags, AS_U64);
  BODY_END;
}

SUB(layout, Tensorbroker__V1__Layout, TENSORBROKER__V1__LAYOUT__INIT)
KEPT(layout, Tensorbroker__V1__Layout, layout)

static int dec_buffer(struct tb__arena *a, struct rd *in,
                      Tensorbroker__V1__BufferInfo *m) {
  BODY_BEGIN(in)
    VARINT_FIELD(1, m->buffer_id, AS_U64);
    VARINT_FIELD(2, m->generation, AS_U32);
    VARINT_FIELD(3, m->kind, (Tensorbroker__V1__MemoryKind)AS_I32);
    VARINT_FIELD(4, m->size, AS_U64);
    LEN_FIELD(5, sub_device(a, &r, &m->device));
    LEN_FIELD(6, rd_bytes(a, &r, &m->cuda_ipc_handle));
    VARINT_FIELD(7, m->writable, AS_BOOL);
    VARINT_FIELD(8, m->fd_attached, AS_BOOL);
    VARINT_FIELD(9, m->producer_pid, AS_U32);
    VARINT_FIELD(10, m->signal_offset, AS_U64);
  BODY_END;
}

SUB(buffer, Tensorbroker__V1__BufferInfo, TENSORBROKER__V1__BUFFER_INFO__INIT)
KEPT(buffer, Tensorbroker__V1__BufferInfo, buffer)

static int dec_event(struct tb__arena *a, struct rd *in,
                     Tensorbroker__V1__EventInfo *m) {
  BODY_BEGIN(in)
    VARINT_FIELD(1, m->event_id, AS_U64);
    LEN_FIELD(2, rd_bytes(a, &r, &m->cuda_ipc_event_handle));
    LEN_FIELD(3, sub_device(a, &r, &m->device));
    VARINT_FIELD(4, m->owner_pid, AS_U32);
    VARINT_FIELD(5, m->complete, AS_BOOL);
    VARINT_FIELD(6, m->owner_died, AS_BOOL);
    VARINT_FIELD(7, m->owner_shm_id, AS_U64);
    VARINT_FIELD(8, m->owner_pidns_id, AS_U64);
    VARINT_FIELD(9, m->signal_value, AS_U64);
    VARINT_FIELD(10, m->signal_slot, AS_U32);
  BODY_END;
}

SUB(event, Tensorbroker__V1__EventInfo, TENSORBROKER__V1__EVENT_INFO__INIT)
KEPT(event, Tensorbroker__V1__EventInfo, event)

static int dec_acquire(struct tb__arena *a, struct rd *in,
                       Tensorbroker__V1__AcquireReply *m) {
  BODY_BEGIN(in)
    VARINT_FIELD(1, m->lease_id, AS_U64);
    VARINT_FIELD(2, m->version, AS_U64);
    LEN_FIELD(3, kept_layout(a, &r, &m->layout));
    LEN_FIELD(4, kept_buffer(a, &r, &m->buffer));
    LEN_FIELD(5, kept_event(a, &r, &m->ready_event));
    LEN_FIELD(6, rd_bytes(a, &r, &m->metadata));
    LEN_FIELD(7, rd_string(a, &r, &m->channel));
    VARINT_FIELD(8, m->done_slot, AS_U32);
  BODY_END;
}

SUB(acquire, Tensorbroker__V1__AcquireReply, TENSORBROKER__V1__ACQUIRE_REPLY__INIT)

/* A oneof member (field n, read by call): one body per message; protobuf-c
 * numbers each body case by its field. */
#define BODY_FIELD(n, call, body_case)                                       \
  case n:                                                                    \
    if ((body_case) != 0 || wire != WT_LEN || (call) < 0)                    \
      return NOT_MINE;                                                       \
    (body_case) = n;                                                         \
    break

static int dec_reply(struct tb__arena *a, struct rd *in,
                     Tensorbroker__V1__Reply *m) {
  BODY_BEGIN(in)
    VARINT_FIELD(1, m->request_id, AS_U64);
    VARINT_FIELD(2, m->status, AS_I32);
    LEN_FIELD(3, rd_string(a, &r, &m->message));
    BODY_FIELD(TENSORBROKER__V1__REPLY__BODY_ACQUIRE,
               sub_acquire(a, &r, &m->acquire), m->body_case);
  BODY_END;
}

SUB(reply, Tensorbroker__V1__Reply, TENSORBROKER__V1__REPLY__INIT)

static int dec_new_version(struct tb__arena *a, struct rd *in,
                           Tensorbroker__V1__NewVersion *m) {
  BODY_BEGIN(in)
    LEN_FIELD(1, rd_string(a, &r, &m->channel));
    VARINT_FIELD(2, m->version, AS_U64);
    LEN_FIELD(3, kept_buffer(a, &r, &m->buffer));
    LEN_FIELD(4, kept_event(a, &r, &m->ready_event));
  BODY_END;
}

SUB(new_version, Tensorbroker__V1__NewVersion,
    TENSORBROKER__V1__NEW_VERSION__INIT)

static int dec_notice(struct tb__arena *a, struct rd *in,
                      Tensorbroker__V1__Notice *m) {
  BODY_BEGIN(in)
    BODY_FIELD(TENSORBROKER__V1__NOTICE__BODY_NEW_VERSION,
               sub_new_version(a, &r, &m->new_version), m->body_case);
  BODY_END;
}

SUB(notice, Tensorbroker__V1__Notice, TENSORBROKER__V1__NOTICE__INIT)

/* exactly one field: reply (1) holding an AcquireReply, or notice (2)
 * holding a NewVersion */
static int dec_server_message(struct tb__arena *a, struct rd *in,
                              tb__server_message *m) {
  BODY_BEGIN(in)
    BODY_FIELD(TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY,
               sub_reply(a, &r, &m->reply), m->body_case);
    BODY_FIELD(TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE,
               sub_notice(a, &r, &m->notice), m->body_case);
  BODY_END;
}

int tb__server_message_decode_fast(struct tb__arena *a, const uint8_t *buf,
                                   size_t len, tb__server_message **out) {
  struct rd r = {buf, buf + len};
  tb__server_message *m;

  if (buf == NULL || len == 0 || len > TB__MAX_MESSAGE_HARD)
    return 0;
  NEW(a, tb__server_message, m, TENSORBROKER__V1__SERVER_MESSAGE__INIT);
  if (dec_server_message(a, &r, m) < 0)
    return 0;
  switch (m->body_case) {
  case TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY:
    if (m->reply->body_case != TENSORBROKER__V1__REPLY__BODY_ACQUIRE)
      return 0;
    break;
  case TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE:
    if (m->notice->body_case != TENSORBROKER__V1__NOTICE__BODY_NEW_VERSION)
      return 0;
    break;
  default:
    return 0;
  }
  *out = m;
  return 1;
}

static int dec_acquire_req(struct tb__arena *a, struct rd *in,
                           Tensorbroker__V1__Acquire *m) {
  BODY_BEGIN(in)
    LEN_FIELD(1, rd_string(a, &r, &m->channel));
    VARINT_FIELD(2, m->mode, (Tensorbroker__V1__AcquireMode)AS_I32);
    VARINT_FIELD(3, m->version, AS_U64);
    VARINT_FIELD(4, m->timeout_ms, AS_I64);
    VARINT_FIELD(5, m->implicit_stream, AS_BOOL);
    VARINT_FIELD(6, m->release_lease_id, AS_U64);
    VARINT_FIELD(7, m->release_done_event_id, AS_U64);
    VARINT_FIELD(8, m->release_implicit_stream, AS_BOOL);
    VARINT_FIELD(9, m->release_done_signal, AS_U64);
  BODY_END;
}

SUB(acquire_req, Tensorbroker__V1__Acquire, TENSORBROKER__V1__ACQUIRE__INIT)

static int dec_release_req(struct tb__arena *a, struct rd *in,
                           Tensorbroker__V1__Release *m) {
  (void)a;
  BODY_BEGIN(in)
    VARINT_FIELD(1, m->lease_id, AS_U64);
    VARINT_FIELD(2, m->done_event_id, AS_U64);
    VARINT_FIELD(3, m->want_reply, AS_BOOL);
    VARINT_FIELD(4, m->implicit_stream, AS_BOOL);
    VARINT_FIELD(5, m->done_signal, AS_U64);
  BODY_END;
}

SUB(release_req, Tensorbroker__V1__Release, TENSORBROKER__V1__RELEASE__INIT)

static int dec_request(struct tb__arena *a, struct rd *in, tb__request *m) {
  BODY_BEGIN(in)
    VARINT_FIELD(1, m->request_id, AS_U64);
    BODY_FIELD(TENSORBROKER__V1__REQUEST__BODY_ACQUIRE,
               sub_acquire_req(a, &r, &m->acquire), m->body_case);
    BODY_FIELD(TENSORBROKER__V1__REQUEST__BODY_RELEASE,
               sub_release_req(a, &r, &m->release), m->body_case);
  BODY_END;
}

int tb__request_decode_fast(struct tb__arena *a, const uint8_t *buf,
                            size_t len, tb__request **out) {
  struct rd r = {buf, buf + len};
  tb__request *m;

  if (buf == NULL || len == 0 || len > TB__MAX_MESSAGE_HARD)
    return 0;
  NEW(a, tb__request, m, TENSORBROKER__V1__REQUEST__INIT);
  if (dec_request(a, &r, m) < 0 ||
      m->body_case == TENSORBROKER__V1__REQUEST__BODY__NOT_SET)
    return 0;
  *out = m;
  return 1;
}
