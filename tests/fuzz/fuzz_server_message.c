/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the client library's server-message decoders, as
 * fuzz_request.c checks the daemon's: the fast decoder (with and without
 * the arena's keep of decoded sub-messages, tb_proto.h) takes only what
 * protobuf-c takes and decodes it to the same message, field by field;
 * tb__server_message_decode_in agrees with protobuf-c; a decoded message
 * re-encodes (tb__server_message_encode, partly by hand) to protobuf-c's
 * bytes, refuses a buffer one byte short without writing past it, and
 * decodes back to the same message (unless it kept a field numbered 0:
 * fuzz.h, tbf_has_field0). */
#include <stdlib.h>
#include <string.h>

#include <tensorbroker/errors.h>

#include "fuzz.h"
#include "tb_proto.h"

static struct tb__arena arena_fast, arena_in;

static void same(const tb__server_message *x, const tb__server_message *y,
                 const char *what) {
  char why[600];

  if (!tbf_msg_equal(&x->base, &y->base, why, sizeof(why)))
    tbf_fail("%s: %s", what, why);
}

static void check_encode(const tb__server_message *p) {
  size_t n = tensorbroker__v1__server_message__get_packed_size(p);
  uint8_t *ref = malloc(n + 1), *mine = malloc(n + 1), *small;
  tb__server_message *back = NULL;
  long got;

  TBF_CHECK(ref != NULL && mine != NULL);
  TBF_CHECK(tensorbroker__v1__server_message__pack(p, ref) == n);
  got = tb__server_message_encode(p, mine, n);
  if (got != (long)n)
    tbf_fail("tb__server_message_encode gave %ld bytes, protobuf-c %zu", got,
             n);
  if (memcmp(ref, mine, n) != 0)
    tbf_fail("tb__server_message_encode's bytes differ from protobuf-c's");
  if (n > 0) {
    small = malloc(n - 1 > 0 ? n - 1 : 1);
    TBF_CHECK(small != NULL);
    got = tb__server_message_encode(p, small, n - 1);
    if (got != TB_ELIMIT)
      tbf_fail("tb__server_message_encode into %zu of %zu bytes gave %ld",
               n - 1, n, got);
    free(small);
    if (tb__server_message_decode(mine, n, &back) == 0) {
      same(p, back, "re-encoded message");
      tb__server_message_free(back);
    } else if (!tbf_has_field0(&p->base)) {
      tbf_fail("a decoded message, encoded again, does not decode");
    }
  }
  free(ref);
  free(mine);
}

/* The fast decoder into a, twice when a keeps sub-messages (the second
 * decode finds them kept). */
static void fast_decode(struct tb__arena *a, const uint8_t *data, size_t size,
                        int rc_pb, const tb__server_message *pb) {
  for (int round = 0; round < (a->keep != NULL ? 2 : 1); round++) {
    tb__server_message *fast = NULL;

    tb__arena_reset(a);
    if (tb__server_message_decode_fast(a, data, size, &fast) == 1) {
      if (rc_pb != 0)
        tbf_fail("the fast decoder took %zu bytes that protobuf-c refuses",
                 size);
      same(fast, pb, a->keep != NULL ? "fast decoder (keep)" : "fast decoder");
    }
  }
  tb__arena_reset(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tb__server_message *pb = NULL, *in = NULL;
  struct tb__keep keep;
  int rc_pb, rc_in;

  if (arena_fast.base == NULL &&
      (tb__arena_init(&arena_fast, 4096) < 0 ||
       tb__arena_init(&arena_in, 4096) < 0))
    abort();
  rc_pb = tb__server_message_decode(data, size, &pb);
  fast_decode(&arena_fast, data, size, rc_pb, pb);
  /* a fresh keep each time, so that every input replays alone */
  if (tb__keep_init(&keep) < 0)
    abort();
  arena_fast.keep = &keep;
  fast_decode(&arena_fast, data, size, rc_pb, pb);
  arena_fast.keep = NULL;
  tb__keep_fini(&keep);

  rc_in = tb__server_message_decode_in(&arena_in, data, size, &in);
  if ((rc_in == 0) != (rc_pb == 0))
    tbf_fail("tb__server_message_decode_in gave %d, protobuf-c %d", rc_in,
             rc_pb);
  if (rc_pb == 0) {
    same(in, pb, "tb__server_message_decode_in");
    check_encode(pb);
    tb__server_message_free(pb);
  }
  tb__arena_reset(&arena_in);
  return 0;
}
