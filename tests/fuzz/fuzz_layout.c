/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: layout validation (proto/layout.c), against a reference
 * computed in 128-bit arithmetic.
 *
 * tb__layout_check must give exactly the reference's answer (the error
 * code, and the byte range through tb__layout_extent) whenever every
 * intermediate value stays below 2^62; above that it may refuse a layout
 * for overflow, but what it accepts must still be the exact answer. When
 * it accepts a tensor of at most 4096 elements, every element's bytes are
 * checked to lie in [lo, hi), lo and hi reached: an oracle that does not
 * share the formula.
 *
 * Input: ndim, a mode byte, dtype, max_ndim, byte_offset, buffer size,
 * flags, then each dimension and stride (a byte: small values directly,
 * 0xf0.. for extreme ones), then the length of the reason buffer. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <tensorbroker/dlpack.h>
#include <tensorbroker/errors.h>

#include "fuzz.h"
#include "tb_proto.h"

typedef __int128 i128;

#define NDIM_CAP 72
#define BIG ((i128)1 << 62)

static int64_t dim_value(struct tbf_in *in) {
  uint8_t b = tbf_u8(in);

  if (b < 0xf0)
    return (int64_t)b - 8; /* -8..231 */
  switch (b) {
  case 0xf0:
    return INT64_MAX;
  case 0xf1:
    return INT64_MIN;
  case 0xf2:
    return INT64_MAX / 2 + 1;
  case 0xf3:
    return (int64_t)1 << 32;
  case 0xf4:
    return -((int64_t)1 << 31);
  default:
    return (int64_t)tbf_u64(in);
  }
}

struct ref {
  bool big; /* some intermediate reached 2^62 */
};

/* Clamp to +-2^64 so that products of two stay inside 128 bits. */
static i128 clamp(struct ref *r, i128 v) {
  const i128 lim = (i128)1 << 64;

  if (v >= BIG || v <= -BIG)
    r->big = true;
  if (v > lim)
    return lim;
  if (v < -lim)
    return -lim;
  return v;
}

/* The reference: rc, and [lo, hi) when 0. Mirrors the order of the checks
 * in tb__layout_check, none of its arithmetic. */
static int reference(const Tensorbroker__V1__Layout *l, uint64_t buffer_size,
                     uint32_t max_ndim, struct ref *r, i128 *lo, i128 *hi) {
  uint64_t eb;
  i128 numel = 1, off = (i128)l->byte_offset, min_e = 0, max_e = 0, ebytes;
  bool zero = false;
  size_t n = l->n_shape;

  if (n > max_ndim || n > TB__MAX_NDIM_HARD)
    return TB_ELIMIT;
  if (l->n_strides != 0 && l->n_strides != n)
    return TB_ELAYOUT;
  if (tb__dtype_check(l->dtype_code, l->dtype_bits, l->dtype_lanes, &eb) < 0)
    return TB_EDTYPE;
  if (eb == 0 || eb > 8u * 1024u * 1024u)
    return TB_ELAYOUT;
  if (l->byte_offset > (uint64_t)INT64_MAX)
    return TB_ELAYOUT;
  for (size_t i = 0; i < n; i++) {
    if (l->shape[i] < 0)
      return TB_ELAYOUT;
    if (l->shape[i] == 0)
      zero = true;
    numel = clamp(r, numel * l->shape[i]);
  }
  if (zero) {
    *lo = *hi = off; /* touches nothing, but must start inside the buffer */
  } else if (eb % 8 != 0 &&
      !(l->flags & TB_DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED)) {
    i128 expect = 1;
    if (l->n_strides != 0) {
      for (size_t i = n; i-- > 0;) {
        if (l->shape[i] != 1 && l->strides[i] != expect)
          return TB_ELAYOUT;
        expect = clamp(r, expect * l->shape[i]);
      }
    }
    *lo = off;
    *hi = clamp(r, off + (clamp(r, numel * (i128)eb) + 7) / 8);
  } else {
    ebytes = (i128)((eb + 7) / 8);
    if (l->n_strides == 0) {
      max_e = numel - 1;
    } else {
      for (size_t i = 0; i < n; i++) {
        i128 span = clamp(r, (i128)(l->shape[i] - 1) * l->strides[i]);
        if (span < 0)
          min_e = clamp(r, min_e + span);
        else
          max_e = clamp(r, max_e + span);
      }
    }
    *lo = clamp(r, off + clamp(r, min_e * ebytes));
    *hi = clamp(r, off + clamp(r, clamp(r, max_e + 1) * ebytes));
    if (*lo < 0)
      return TB_ELAYOUT;
  }
  if (*hi > (i128)buffer_size)
    return TB_ELAYOUT;
  return 0;
}

/* Every element of an accepted small tensor lies in [lo, hi). */
static void walk_elements(const Tensorbroker__V1__Layout *l, uint64_t lo,
                          uint64_t hi) {
  uint64_t eb;
  int64_t idx[NDIM_CAP] = {0}, strides[NDIM_CAP];
  i128 numel = 1, ebytes, mn = 0, mx = 0;
  size_t n = l->n_shape;
  bool first = true;

  TBF_CHECK(tb__dtype_check(l->dtype_code, l->dtype_bits, l->dtype_lanes,
                            &eb) == 0);
  if (eb % 8 != 0 &&
      !(l->flags & TB_DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED))
    return; /* packed: no byte address per element */
  /* stop at a zero extent or past the walk's cap: the product of the
   * other extents may not fit even 128 bits (a zero extent after huge
   * ones is a valid empty tensor) */
  for (size_t i = 0; i < n && numel != 0; i++) {
    if (l->shape[i] == 0)
      numel = 0;
    else if (numel <= 4096)
      numel *= l->shape[i];
  }
  if (numel == 0 || numel > 4096)
    return;
  ebytes = (i128)((eb + 7) / 8);
  for (size_t i = n, acc = 1; i-- > 0;) {
    strides[i] = l->n_strides != 0 ? l->strides[i] : (int64_t)acc;
    acc *= (size_t)l->shape[i];
  }
  for (i128 k = 0; k < numel; k++) {
    i128 addr = (i128)l->byte_offset;
    for (size_t i = 0; i < n; i++)
      addr += (i128)idx[i] * strides[i] * ebytes;
    if (first || addr < mn)
      mn = addr;
    if (first || addr > mx)
      mx = addr;
    first = false;
    if (addr < (i128)lo || addr + ebytes > (i128)hi)
      tbf_fail("element %lld at byte %lld is outside [%llu, %llu)",
               (long long)k, (long long)addr, (unsigned long long)lo,
               (unsigned long long)hi);
    for (size_t i = n; i-- > 0;) { /* next index, row-major */
      if (++idx[i] < l->shape[i])
        break;
      idx[i] = 0;
    }
  }
  if (mn != (i128)lo || mx + ebytes != (i128)hi)
    tbf_fail("elements span [%lld, %lld), the check said [%llu, %llu)",
             (long long)mn, (long long)(mx + ebytes), (unsigned long long)lo,
             (unsigned long long)hi);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct tbf_in in = {data, data + size};
  Tensorbroker__V1__Layout l = TENSORBROKER__V1__LAYOUT__INIT;
  int64_t shape[NDIM_CAP], strides[NDIM_CAP];
  uint64_t buffer_size, elo = 0, ehi = 0, eb = 0;
  uint32_t max_ndim;
  uint8_t ndim = tbf_u8(&in) % NDIM_CAP, mode = tbf_u8(&in);
  char why[256];
  size_t whylen;
  struct ref r = {false};
  i128 lo = 0, hi = 0;
  int rc, want, erc;

  l.dtype_code = tbf_u8(&in);
  l.dtype_bits = tbf_u8(&in);
  l.dtype_lanes = (mode & 0x04) ? tbf_u32(&in) : tbf_u8(&in);
  max_ndim = (mode & 0x08) ? tbf_u32(&in) : tbf_u8(&in) % 66;
  l.byte_offset = (mode & 0x10) ? tbf_u64(&in) : tbf_u16(&in);
  buffer_size = (mode & 0x20) ? tbf_u64(&in) : tbf_u32(&in);
  l.flags = (mode & 0x40) ? tbf_u64(&in) : tbf_u8(&in) & 7;
  for (unsigned i = 0; i < ndim; i++)
    shape[i] = dim_value(&in);
  l.n_shape = ndim;
  l.shape = shape;
  switch (mode & 3) {
  case 0:
    l.n_strides = 0; /* compact row-major */
    break;
  case 1:
  case 2:
    l.n_strides = ndim;
    break;
  default:
    l.n_strides = tbf_u8(&in) % NDIM_CAP; /* usually a wrong count */
  }
  for (size_t i = 0; i < l.n_strides; i++)
    strides[i] = dim_value(&in);
  l.strides = strides;
  whylen = tbf_u8(&in) % (sizeof(why) + 1);
  memset(why, 0x5a, sizeof(why));

  rc = tb__layout_check(&l, buffer_size, max_ndim, why, whylen);
  if (rc < 0 && whylen > 0 && memchr(why, '\0', whylen) == NULL)
    tbf_fail("the reason is not terminated inside its %zu bytes", whylen);
  for (size_t i = whylen; i < sizeof(why); i++)
    TBF_CHECK((uint8_t)why[i] == 0x5a);
  want = reference(&l, buffer_size, max_ndim, &r, &lo, &hi);

  if (rc == 0) {
    /* accepted: the reference must agree, exactly */
    if (want != 0)
      tbf_fail("accepted a layout the reference refuses (%d)", want);
    TBF_CHECK(tb__dtype_check(l.dtype_code, l.dtype_bits, l.dtype_lanes,
                              &eb) == 0);
    erc = tb__layout_extent((int32_t)l.n_shape, l.shape,
                            l.n_strides ? l.strides : NULL, eb, l.flags,
                            l.byte_offset, &elo, &ehi, NULL, 0);
    TBF_CHECK(erc == 0);
    if ((i128)elo != lo || (i128)ehi != hi)
      tbf_fail("extent [%llu, %llu), the reference [%lld, %lld)",
               (unsigned long long)elo, (unsigned long long)ehi,
               (long long)lo, (long long)hi);
    TBF_CHECK(ehi <= buffer_size && elo <= ehi);
    walk_elements(&l, elo, ehi);
  } else if (!r.big || want != 0) {
    /* refused: for the same reason as the reference, unless only an
     * overflow of the implementation's 64-bit arithmetic explains it */
    if (rc != want && !(r.big && rc == TB_ELAYOUT))
      tbf_fail("refused with %d (%s), the reference says %d", rc,
               whylen > 0 ? why : "", want);
  } else if (rc != TB_ELAYOUT) {
    tbf_fail("refused a huge layout with %d, not TB_ELAYOUT", rc);
  }
  return 0;
}
