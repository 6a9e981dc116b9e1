/* SPDX-License-Identifier: Apache-2.0 */
/* Internal: what the daemon and the client library share about the wire.
 *
 * - tb__codec_*: protobuf-c messages to and from bytes, with hard limits
 *   (sans-I/O, unit-tested and fuzzable on their own).
 * - tb__layout_*, tb__dtype_*: tensor layout validation with overflow-checked
 *   arithmetic.
 * - tb__name_check: channel name rules.
 * - tb__wire_*: one datagram plus file descriptors over a SOCK_SEQPACKET
 *   socket.
 * Not installed; not part of the public API. */
#ifndef TB_PROTO_H
#define TB_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "tensorbroker.pb-c.h"

/* Hard ceilings no configuration can raise. The daemon's configurable
 * limits sit at or below these. */
#define TB__MAX_MESSAGE_HARD (1u << 20) /* bytes in one datagram */
#define TB__MAX_NDIM_HARD 64
#define TB__MAX_FDS 4 /* fds attached to one datagram */

/* Defaults shared by both sides. */
#define TB__DEFAULT_MAX_MESSAGE (64u * 1024u)
#define TB__DEFAULT_MAX_NDIM 32
#define TB__DEFAULT_MAX_METADATA 4096
#define TB__DEFAULT_MAX_NAME 255
#define TB__CUDA_IPC_HANDLE_SIZE 64
#define TB__UUID_SIZE 16

typedef Tensorbroker__V1__Request tb__request;
typedef Tensorbroker__V1__ServerMessage tb__server_message;

/* ---- codec ---- */

/* Decode one request datagram. On success *out owns the message (free with
 * tb__request_free). TB_EPROTO when the bytes are not a request, or carry no
 * body. */
int tb__request_decode(const uint8_t *buf, size_t len, tb__request **out);
void tb__request_free(tb__request *m);

int tb__server_message_decode(const uint8_t *buf, size_t len,
                              tb__server_message **out);
void tb__server_message_free(tb__server_message *m);

/* Decoding into an arena: a bump allocator for protobuf-c. A decode takes
 * its memory from one block (further blocks are malloc'ed if a message
 * needs more) and tb__arena_reset gives it all back at once, without the
 * walk over the message that free_unpacked does. A message decoded in an
 * arena lives until the arena's next decode, reset or fini; it is never
 * passed to tb__*_free. */
struct tb__arena_block;
struct tb__keep;
struct tb__arena {
  ProtobufCAllocator pb; /* handed to protobuf-c */
  uint8_t *base;         /* the first block, cap bytes */
  size_t cap, used;
  struct tb__arena_block *more; /* overflow blocks */
  struct tb__keep *keep; /* optional, see below; NULL after init */
};

/* Allocate the first block (cap bytes). Returns 0 or TB_ENOMEM. */
int tb__arena_init(struct tb__arena *a, size_t cap);
/* Give back everything allocated since the last reset. */
void tb__arena_reset(struct tb__arena *a);
void tb__arena_fini(struct tb__arena *a);
/* As tb__request_decode and tb__server_message_decode, into a (reset
 * first). */
int tb__request_decode_in(struct tb__arena *a, const uint8_t *buf,
                          size_t len, tb__request **out);
int tb__server_message_decode_in(struct tb__arena *a, const uint8_t *buf,
                                 size_t len, tb__server_message **out);
/* Sub-messages kept decoded. The daemon packs a version's Layout and a
 * buffer's BufferInfo once and copies the same bytes into every reply, so
 * a consumer that acquires the same buffer again receives the same bytes
 * again. When an arena has a keep, the fast decoder below compares a
 * Layout, BufferInfo or EventInfo with the one it decoded last (from this
 * arena) and, when the bytes are equal, points the new message at that
 * decoded copy instead of decoding it again. The kept copies live in their
 * own arenas, so a message decoded in the arena shares them: it is read
 * only, and it lives, as any message of the arena, until the arena's next
 * decode (which is the only time a kept copy is replaced). */
#define TB__KEPT_BYTES 192 /* longer sub-messages are decoded every time */
struct tb__kept {
  void *msg; /* decoded from bytes[0..len); NULL when there is none */
  size_t len;
  uint64_t hits; /* decodes saved (for tests) */
  struct tb__arena arena;
  uint8_t bytes[TB__KEPT_BYTES];
};
struct tb__keep {
  struct tb__kept layout, buffer, event;
};
/* Returns 0 or TB_ENOMEM (then k needs no fini). */
int tb__keep_init(struct tb__keep *k);
void tb__keep_fini(struct tb__keep *k);

/* The hand-written decoder that tb__server_message_decode_in tries first
 * (decode_fast.c): 1 with *out set in a for a reply carrying an
 * AcquireReply or a NewVersion notice in the forms it takes, <= 0 for "not
 * mine" (a may then hold garbage: reset it). */
int tb__server_message_decode_fast(struct tb__arena *a, const uint8_t *buf,
                                   size_t len, tb__server_message **out);
/* Its daemon-side twin, which tb__request_decode_in tries first: a Request
 * whose body is an Acquire or a Release. */
int tb__request_decode_fast(struct tb__arena *a, const uint8_t *buf,
                            size_t len, tb__request **out);

/* Protobuf varints: the bytes v takes (1..10), and writing them at p
 * (returns the count). Inline: most are one byte. */
static inline size_t tb__varint_size(uint64_t v) {
  size_t n = 1;

  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static inline size_t tb__put_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;

  while (v >= 0x80) {
    p[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (uint8_t)v;
  return n;
}

/* Encode into buf of cap bytes. Returns the length, or TB_ELIMIT when the
 * encoding would exceed cap. */
long tb__request_encode(const tb__request *m, uint8_t *buf, size_t cap);
long tb__server_message_encode(const tb__server_message *m, uint8_t *buf,
                               size_t cap);

/* ---- layouts ---- */

/* Check a DLPack dtype. On success writes the storage bits of one element
 * (bits * lanes; sub-byte types stay below 8) to *elem_bits. TB_EDTYPE for
 * an unknown code or a width that code does not have. */
int tb__dtype_check(uint32_t code, uint32_t bits, uint32_t lanes,
                    uint64_t *elem_bits);

/* Compute the byte range [*lo, *hi) that a tensor touches, relative to the
 * start of its buffer. strides may be NULL (compact row-major). Every
 * multiplication and addition is overflow-checked. A tensor with a zero
 * extent touches nothing: *lo == *hi == byte_offset. Sub-byte element types
 * must be compact. Returns TB_ELAYOUT with a reason in why (may be NULL). */
int tb__layout_extent(int32_t ndim, const int64_t *shape,
                      const int64_t *strides, uint64_t elem_bits,
                      uint64_t flags, uint64_t byte_offset, uint64_t *lo,
                      uint64_t *hi, char *why, size_t whylen);

/* Validate a wire layout against a buffer of buffer_size bytes. */
int tb__layout_check(const Tensorbroker__V1__Layout *l, uint64_t buffer_size,
                     uint32_t max_ndim, char *why, size_t whylen);

/* tb__layout_check, and on success the end of the byte range the tensor
 * touches (tb__layout_extent's *hi) in *end (may be NULL). */
int tb__layout_check_end(const Tensorbroker__V1__Layout *l,
                         uint64_t buffer_size, uint32_t max_ndim,
                         uint64_t *end, char *why, size_t whylen);

/* ---- names ---- */

/* A channel name: 1..max_len bytes of [A-Za-z0-9._-/], no leading or
 * trailing '/', no empty or "." or ".." component. TB_ENAME otherwise. */
int tb__name_check(const char *name, size_t max_len);

/* ---- wire (SOCK_SEQPACKET datagrams) ---- */

/* Send one datagram with nfds descriptors attached. flags are passed to
 * sendmsg (MSG_NOSIGNAL is always added). Returns 0, or -errno. */
int tb__wire_send(int sock, const void *buf, size_t len, const int *fds,
                  int nfds, int flags);

/* Receive one datagram into buf (cap bytes) and up to TB__MAX_FDS
 * descriptors (opened O_CLOEXEC) into fds, count in *nfds. Returns the
 * datagram length, 0 at end of stream, -EMSGSIZE when the datagram was
 * longer than cap or carried more descriptors than allowed (any received
 * descriptors are closed), or -errno. When the datagram came whole but the
 * descriptors it carried could not be received (this process is out of
 * descriptors: MSG_CTRUNC), its length is returned with *nfds set to -1
 * (none kept), so that the caller can answer it instead of calling it too
 * large. */
long tb__wire_recv(int sock, void *buf, size_t cap, int *fds, int *nfds,
                   int flags);

/* ---- misc ---- */

/* Monotonic milliseconds. */
uint64_t tb__now_ms(void);
uint64_t tb__now_ns(void); /* CLOCK_MONOTONIC in nanoseconds */

/* The default polling windows (client spin_us, daemon --busy-poll): used
 * only while the process may run on at least TB__POLL_AUTO_CPUS CPUs. */
#define TB__POLL_AUTO_US 50
#define TB__POLL_AUTO_CPUS 4
/* CPUs the calling thread may run on (sched_getaffinity); 1 when unknown. */
int tb__cpus_allowed(void);

/* Whether the default polling window applies now: the thread may run on
 * TB__POLL_AUTO_CPUS CPUs or more. The answer is kept and read again at
 * most once a second (affinity and cpusets change at run time). */
struct tb__poll_cpus {
  uint64_t checked_ns; /* when ok was last read (coarse clock); 0: never */
  int ok;
};
int tb__poll_cpus_ok(struct tb__poll_cpus *p);

#endif /* TB_PROTO_H */
