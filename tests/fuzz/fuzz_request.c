/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the daemon's request decoders. For any bytes:
 *  - the hand-written fast decoder (proto/decode_fast.c) takes only what
 *    protobuf-c takes, and decodes it to the same message, field by field;
 *  - tb__request_decode_in (fast decoder, else protobuf-c in the arena, as
 *    the daemon decodes) succeeds exactly when protobuf-c does, to the same
 *    message;
 *  - a decoded request re-encodes (tb__request_encode, partly by hand) to
 *    protobuf-c's own bytes, refuses a buffer one byte short without
 *    writing past it, and decodes back to the same message (unless it
 *    kept a field numbered 0: fuzz.h, tbf_has_field0). */
#include <stdlib.h>
#include <string.h>

#include <tensorbroker/errors.h>

#include "fuzz.h"
#include "tb_proto.h"

static struct tb__arena arena_fast, arena_in;

static void same(const tb__request *x, const tb__request *y, const char *what) {
  char why[600];

  if (!tbf_msg_equal(&x->base, &y->base, why, sizeof(why)))
    tbf_fail("%s: %s", what, why);
}

static void check_encode(const tb__request *p) {
  size_t n = tensorbroker__v1__request__get_packed_size(p);
  uint8_t *ref = malloc(n + 1), *mine = malloc(n + 1), *small;
  tb__request *back = NULL;
  long got;

  TBF_CHECK(ref != NULL && mine != NULL);
  TBF_CHECK(tensorbroker__v1__request__pack(p, ref) == n);
  got = tb__request_encode(p, mine, n);
  if (got != (long)n)
    tbf_fail("tb__request_encode gave %ld bytes, protobuf-c %zu", got, n);
  if (memcmp(ref, mine, n) != 0)
    tbf_fail("tb__request_encode's bytes differ from protobuf-c's");
  if (n > 0) {
    /* exactly n - 1 bytes, so that ASan catches a write past them */
    small = malloc(n - 1 > 0 ? n - 1 : 1);
    TBF_CHECK(small != NULL);
    got = tb__request_encode(p, small, n - 1);
    if (got != TB_ELIMIT)
      tbf_fail("tb__request_encode into %zu of %zu bytes gave %ld", n - 1, n,
               got);
    free(small);
  }
  if (n > 0) {
    if (tb__request_decode(mine, n, &back) == 0) {
      same(p, back, "re-encoded request");
      tb__request_free(back);
    } else if (!tbf_has_field0(&p->base)) {
      tbf_fail("a decoded request, encoded again, does not decode");
    }
  }
  free(ref);
  free(mine);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tb__request *pb = NULL, *fast = NULL, *in = NULL;
  int rc_pb, rc_fast, rc_in;

  if (arena_fast.base == NULL &&
      (tb__arena_init(&arena_fast, 4096) < 0 ||
       tb__arena_init(&arena_in, 4096) < 0))
    abort();
  rc_pb = tb__request_decode(data, size, &pb);
  tb__arena_reset(&arena_fast);
  rc_fast = tb__request_decode_fast(&arena_fast, data, size, &fast);
  if (rc_fast == 1) {
    if (rc_pb != 0)
      tbf_fail("the fast decoder took %zu bytes that protobuf-c refuses",
               size);
    same(fast, pb, "fast decoder");
  }
  rc_in = tb__request_decode_in(&arena_in, data, size, &in);
  if ((rc_in == 0) != (rc_pb == 0))
    tbf_fail("tb__request_decode_in gave %d, protobuf-c %d", rc_in, rc_pb);
  if (rc_pb == 0) {
    same(in, pb, "tb__request_decode_in");
    check_encode(pb);
    tb__request_free(pb);
  }
  tb__arena_reset(&arena_in);
  tb__arena_reset(&arena_fast);
  return 0;
}
