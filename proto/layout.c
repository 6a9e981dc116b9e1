/* SPDX-License-Identifier: Apache-2.0 */
/* Tensor layout validation: dtypes, extents, and the check that a layout
 * lies inside its buffer. Every product and sum over client-supplied
 * integers goes through the overflow-checking builtins. */
#include "tb_proto.h"

#include <stdarg.h>
#include <stdio.h>

#include <tensorbroker/dlpack.h>
#include <tensorbroker/errors.h>

static int fail(char *why, size_t whylen, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *why, size_t whylen, int err, const char *fmt, ...) {
  va_list ap;

  if (why != NULL && whylen > 0) {
    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
  }
  return err;
}

int tb__dtype_check(uint32_t code, uint32_t bits, uint32_t lanes,
                    uint64_t *elem_bits) {
  int ok;

  switch (code) {
  case TB_DTYPE_INT:
  case TB_DTYPE_UINT:
    ok = bits == 8 || bits == 16 || bits == 32 || bits == 64;
    break;
  case TB_DTYPE_FLOAT:
    ok = bits == 16 || bits == 32 || bits == 64;
    break;
  case TB_DTYPE_BFLOAT:
    ok = bits == 16;
    break;
  case TB_DTYPE_COMPLEX:
    ok = bits == 32 || bits == 64 || bits == 128;
    break;
  case TB_DTYPE_BOOL:
    ok = bits == 8;
    break;
  case TB_DTYPE_FLOAT8_E3M4:
  case TB_DTYPE_FLOAT8_E4M3:
  case TB_DTYPE_FLOAT8_E4M3B11FNUZ:
  case TB_DTYPE_FLOAT8_E4M3FN:
  case TB_DTYPE_FLOAT8_E4M3FNUZ:
  case TB_DTYPE_FLOAT8_E5M2:
  case TB_DTYPE_FLOAT8_E5M2FNUZ:
  case TB_DTYPE_FLOAT8_E8M0FNU:
    ok = bits == 8;
    break;
  case TB_DTYPE_FLOAT6_E2M3FN:
  case TB_DTYPE_FLOAT6_E3M2FN:
    ok = bits == 6;
    break;
  case TB_DTYPE_FLOAT4_E2M1FN:
    ok = bits == 4;
    break;
  default:
    /* Opaque handles are pointers: meaningless in another process. */
    ok = 0;
    break;
  }
  if (!ok || lanes == 0 || lanes > UINT16_MAX)
    return TB_EDTYPE;
  if (elem_bits != NULL)
    *elem_bits = (uint64_t)bits * lanes;
  return 0;
}

int tb__layout_extent(int32_t ndim, const int64_t *shape,
                      const int64_t *strides, uint64_t elem_bits,
                      uint64_t flags, uint64_t byte_offset, uint64_t *lo,
                      uint64_t *hi, char *why, size_t whylen) {
  int64_t numel = 1, min_e = 0, max_e = 0, elem_bytes, off, lo_b, hi_b;
  int packed;

  if (ndim < 0 || ndim > TB__MAX_NDIM_HARD)
    return fail(why, whylen, TB_ELAYOUT, "ndim %d out of range", (int)ndim);
  if (ndim > 0 && shape == NULL)
    return fail(why, whylen, TB_ELAYOUT, "shape missing");
  if (elem_bits == 0 || elem_bits > 8u * 1024u * 1024u)
    return fail(why, whylen, TB_ELAYOUT, "element size out of range");
  if (byte_offset > (uint64_t)INT64_MAX)
    return fail(why, whylen, TB_ELAYOUT, "byte_offset too large");
  off = (int64_t)byte_offset;

  for (int32_t i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return fail(why, whylen, TB_ELAYOUT, "shape[%d] = %lld is negative",
                  (int)i, (long long)shape[i]);
    if (shape[i] == 0)
      numel = 0;
  }
  /* A zero extent anywhere means no elements, whatever the others would
   * multiply to (even past INT64_MAX): nothing is read. */
  if (numel == 0) {
    *lo = *hi = byte_offset;
    return 0;
  }
  for (int32_t i = 0; i < ndim; i++) {
    if (__builtin_mul_overflow(numel, shape[i], &numel))
      return fail(why, whylen, TB_ELAYOUT, "element count overflows");
  }

  /* Packed sub-byte elements have no byte address of their own: accept only
   * the compact layout, whose size is the bit count rounded up. */
  packed = (elem_bits % 8) != 0 &&
           !(flags & TB_DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED);
  if (packed) {
    int64_t expect = 1, bits;
    if (strides != NULL) {
      for (int32_t i = ndim - 1; i >= 0; i--) {
        if (shape[i] != 1 && strides[i] != expect)
          return fail(why, whylen, TB_ELAYOUT,
                      "sub-byte elements must be compact row-major");
        if (__builtin_mul_overflow(expect, shape[i], &expect))
          return fail(why, whylen, TB_ELAYOUT, "extent overflows");
      }
    }
    if (__builtin_mul_overflow(numel, (int64_t)elem_bits, &bits) ||
        __builtin_add_overflow(off, (bits + 7) / 8, &hi_b))
      return fail(why, whylen, TB_ELAYOUT, "extent overflows");
    *lo = byte_offset;
    *hi = (uint64_t)hi_b;
    return 0;
  }
  elem_bytes = (int64_t)((elem_bits + 7) / 8);

  if (strides == NULL) {
    max_e = numel - 1;
  } else {
    for (int32_t i = 0; i < ndim; i++) {
      int64_t span;
      if (__builtin_mul_overflow(shape[i] - 1, strides[i], &span))
        return fail(why, whylen, TB_ELAYOUT, "stride[%d] overflows", (int)i);
      if (span < 0) {
        if (__builtin_add_overflow(min_e, span, &min_e))
          return fail(why, whylen, TB_ELAYOUT, "extent overflows");
      } else if (__builtin_add_overflow(max_e, span, &max_e)) {
        return fail(why, whylen, TB_ELAYOUT, "extent overflows");
      }
    }
  }
  if (__builtin_mul_overflow(min_e, elem_bytes, &lo_b) ||
      __builtin_add_overflow(off, lo_b, &lo_b) ||
      __builtin_add_overflow(max_e, (int64_t)1, &hi_b) ||
      __builtin_mul_overflow(hi_b, elem_bytes, &hi_b) ||
      __builtin_add_overflow(off, hi_b, &hi_b))
    return fail(why, whylen, TB_ELAYOUT, "extent overflows");
  if (lo_b < 0)
    return fail(why, whylen, TB_ELAYOUT,
                "negative strides reach %llu bytes before the buffer",
                /* -lo_b overflows for INT64_MIN; negate unsigned */
                0ull - (unsigned long long)lo_b);
  *lo = (uint64_t)lo_b;
  *hi = (uint64_t)hi_b;
  return 0;
}

int tb__layout_check(const Tensorbroker__V1__Layout *l, uint64_t buffer_size,
                     uint32_t max_ndim, char *why, size_t whylen) {
  return tb__layout_check_end(l, buffer_size, max_ndim, NULL, why, whylen);
}

int tb__layout_check_end(const Tensorbroker__V1__Layout *l,
                         uint64_t buffer_size, uint32_t max_ndim,
                         uint64_t *end, char *why, size_t whylen) {
  uint64_t elem_bits, lo, hi;
  int rc;

  if (l == NULL)
    return fail(why, whylen, TB_ELAYOUT, "layout missing");
  if (l->n_shape > max_ndim || l->n_shape > TB__MAX_NDIM_HARD)
    return fail(why, whylen, TB_ELIMIT, "ndim %zu exceeds the limit of %u",
                l->n_shape, (unsigned)max_ndim);
  if (l->n_strides != 0 && l->n_strides != l->n_shape)
    return fail(why, whylen, TB_ELAYOUT, "%zu strides for %zu dimensions",
                l->n_strides, l->n_shape);
  rc = tb__dtype_check(l->dtype_code, l->dtype_bits, l->dtype_lanes,
                       &elem_bits);
  if (rc < 0)
    return fail(why, whylen, rc, "unsupported dtype code %u bits %u lanes %u",
                l->dtype_code, l->dtype_bits, l->dtype_lanes);
  rc = tb__layout_extent((int32_t)l->n_shape, l->shape,
                         l->n_strides ? l->strides : NULL, elem_bits, l->flags,
                         l->byte_offset, &lo, &hi, why, whylen);
  if (rc < 0)
    return rc;
  if (hi > buffer_size)
    return fail(why, whylen, TB_ELAYOUT,
                "tensor reaches byte %llu of a %llu-byte buffer",
                (unsigned long long)hi, (unsigned long long)buffer_size);
  if (end != NULL)
    *end = hi;
  return 0;
}
