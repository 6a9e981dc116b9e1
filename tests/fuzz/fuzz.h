/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by the fuzz targets (tests/fuzz): the libFuzzer entry point, a
 * reader that turns fuzz input into values, and a field-by-field comparison
 * of protobuf-c messages driven by their descriptors.
 *
 * Each target is built twice (CMakeLists.txt): with clang's
 * -fsanitize=fuzzer,address,undefined as a libFuzzer binary, and with any
 * compiler as a replay program (replay_main.c) that runs the inputs it is
 * given, for ctest's corpus runs. A target reports a bug by aborting
 * (tbf_fail), which both builds turn into a failure. */
#ifndef TB_FUZZ_H
#define TB_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Print "fuzz: <what>" to stderr and abort. */
void tbf_fail(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));

#define TBF_CHECK(cond)                                                      \
  do {                                                                       \
    if (!(cond))                                                             \
      tbf_fail("%s:%d: check failed: %s", __FILE__, __LINE__, #cond);       \
  } while (0)

/* Fuzz input as a stream of values; reads past the end give zeros. */
struct tbf_in {
  const uint8_t *p, *end;
};

static inline int tbf_left(const struct tbf_in *in) { return in->p < in->end; }

static inline uint8_t tbf_u8(struct tbf_in *in) {
  return in->p < in->end ? *in->p++ : 0;
}

static inline uint16_t tbf_u16(struct tbf_in *in) {
  uint16_t v = tbf_u8(in);
  return (uint16_t)(v | (uint16_t)tbf_u8(in) << 8);
}

static inline uint32_t tbf_u32(struct tbf_in *in) {
  uint32_t v = tbf_u16(in);
  return v | (uint32_t)tbf_u16(in) << 16;
}

static inline uint64_t tbf_u64(struct tbf_in *in) {
  uint64_t v = tbf_u32(in);
  return v | (uint64_t)tbf_u32(in) << 32;
}

/* Up to n bytes (fewer at the end); *len gets the count. */
static inline const uint8_t *tbf_bytes(struct tbf_in *in, size_t n,
                                       size_t *len) {
  const uint8_t *p = in->p;
  size_t left = (size_t)(in->end - in->p);

  if (n > left)
    n = left;
  in->p += n;
  *len = n;
  return p;
}

/* Compare two messages of the same type field by field, as their
 * descriptor lists the fields: scalars by value, strings and bytes by
 * content (a NULL string equals ""), repeated fields element by element,
 * oneofs by case and then the member, sub-messages recursively, and the
 * number of unknown fields. Returns 1 when equal; else 0 with the path of
 * the first difference in why. */
int tbf_msg_equal(const ProtobufCMessage *a, const ProtobufCMessage *b,
                  char *why, size_t whylen);

/* Whether m or a message inside it kept an unknown field numbered 0.
 * protobuf-c (1.4) accepts field number 0 when its key is written in more
 * bytes than needed (0x81 0x00), keeps it as an unknown field, packs it
 * again as 0x01 and then refuses those bytes itself: such a message does
 * not survive its own round trip (docs/testing.md, "Findings"). */
int tbf_has_field0(const ProtobufCMessage *m);

#endif /* TB_FUZZ_H */
