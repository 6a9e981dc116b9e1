/* SPDX-License-Identifier: Apache-2.0 */
/* Layout validation: dtypes, extents with overflow checks, and the check of
 * a wire layout against its buffer. */
#include "tb_test.h"

#include <string.h>

#include <tensorbroker/dlpack.h>

#include "tb_proto.h"

static void test_dtype_valid(void **state) {
  (void)state;
  static const struct {
    uint32_t code, bits, lanes;
    uint64_t elem_bits;
  } ok[] = {
      {TB_DTYPE_INT, 8, 1, 8},       {TB_DTYPE_INT, 16, 1, 16},
      {TB_DTYPE_INT, 32, 1, 32},     {TB_DTYPE_INT, 64, 1, 64},
      {TB_DTYPE_UINT, 8, 1, 8},      {TB_DTYPE_UINT, 64, 1, 64},
      {TB_DTYPE_FLOAT, 16, 1, 16},   {TB_DTYPE_FLOAT, 32, 1, 32},
      {TB_DTYPE_FLOAT, 64, 1, 64},   {TB_DTYPE_BFLOAT, 16, 1, 16},
      {TB_DTYPE_COMPLEX, 64, 1, 64}, {TB_DTYPE_COMPLEX, 128, 1, 128},
      {TB_DTYPE_BOOL, 8, 1, 8},      {TB_DTYPE_FLOAT, 32, 4, 128},
      {TB_DTYPE_FLOAT8_E3M4, 8, 1, 8},
      {TB_DTYPE_FLOAT8_E4M3, 8, 1, 8},
      {TB_DTYPE_FLOAT8_E4M3B11FNUZ, 8, 1, 8},
      {TB_DTYPE_FLOAT8_E4M3FN, 8, 1, 8},
      {TB_DTYPE_FLOAT8_E4M3FNUZ, 8, 1, 8},
      {TB_DTYPE_FLOAT8_E5M2, 8, 1, 8},
      {TB_DTYPE_FLOAT8_E5M2FNUZ, 8, 1, 8},
      {TB_DTYPE_FLOAT8_E8M0FNU, 8, 1, 8},
      {TB_DTYPE_FLOAT6_E2M3FN, 6, 1, 6},
      {TB_DTYPE_FLOAT6_E3M2FN, 6, 1, 6},
      {TB_DTYPE_FLOAT4_E2M1FN, 4, 1, 4},
      {TB_DTYPE_FLOAT4_E2M1FN, 4, 2, 8},
      {TB_DTYPE_UINT, 8, 65535, 8 * 65535},
  };
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    uint64_t eb = 0;
    int rc = tb__dtype_check(ok[i].code, ok[i].bits, ok[i].lanes, &eb);
    if (rc != 0)
      fail_msg("dtype code %u bits %u lanes %u refused: %s", ok[i].code,
               ok[i].bits, ok[i].lanes, tb_err_name(rc));
    assert_true(eb == ok[i].elem_bits);
  }
  /* elem_bits may be NULL */
  assert_tb_ok(tb__dtype_check(TB_DTYPE_FLOAT, 32, 1, NULL));
}

static void test_dtype_invalid(void **state) {
  (void)state;
  static const struct {
    uint32_t code, bits, lanes;
  } bad[] = {
      {TB_DTYPE_INT, 0, 1},        {TB_DTYPE_INT, 1, 1},
      {TB_DTYPE_INT, 4, 1},        {TB_DTYPE_INT, 128, 1},
      {TB_DTYPE_UINT, 7, 1},       {TB_DTYPE_FLOAT, 8, 1},
      {TB_DTYPE_FLOAT, 128, 1},    {TB_DTYPE_BFLOAT, 32, 1},
      {TB_DTYPE_BFLOAT, 8, 1},     {TB_DTYPE_COMPLEX, 16, 1},
      {TB_DTYPE_BOOL, 1, 1},       {TB_DTYPE_BOOL, 16, 1},
      {TB_DTYPE_FLOAT8_E4M3FN, 16, 1},
      {TB_DTYPE_FLOAT8_E5M2, 4, 1},
      {TB_DTYPE_FLOAT6_E2M3FN, 8, 1},
      {TB_DTYPE_FLOAT4_E2M1FN, 8, 1},
      {TB_DTYPE_OPAQUE_HANDLE, 64, 1}, /* a pointer: meaningless elsewhere */
      {TB_DTYPE_OPAQUE_HANDLE, 8, 1},
      {18, 8, 1},                  /* one past the last known code */
      {255, 32, 1},                {UINT32_MAX, 32, 1},
      {TB_DTYPE_FLOAT, 32, 0},     /* no lanes */
      {TB_DTYPE_FLOAT, 32, 65536}, /* more lanes than DLPack's uint16 */
      {TB_DTYPE_FLOAT, 32, UINT32_MAX},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    uint64_t eb = 12345;
    int rc = tb__dtype_check(bad[i].code, bad[i].bits, bad[i].lanes, &eb);
    if (rc != TB_EDTYPE)
      fail_msg("dtype code %u bits %u lanes %u gave %s, expected TB_EDTYPE",
               bad[i].code, bad[i].bits, bad[i].lanes, tb_err_name(rc));
    assert_true(eb == 12345); /* untouched */
  }
}

/* shorthand: extent of a tensor, expecting success */
static void extent_ok(int32_t ndim, const int64_t *shape, const int64_t *strides,
                      uint64_t elem_bits, uint64_t flags, uint64_t off,
                      uint64_t want_lo, uint64_t want_hi) {
  uint64_t lo = 1, hi = 1;
  char why[128] = "";
  int rc = tb__layout_extent(ndim, shape, strides, elem_bits, flags, off, &lo,
                             &hi, why, sizeof(why));
  if (rc != 0)
    fail_msg("extent refused: %s (%s)", tb_err_name(rc), why);
  if (lo != want_lo || hi != want_hi)
    fail_msg("extent [%llu, %llu), expected [%llu, %llu)",
             (unsigned long long)lo, (unsigned long long)hi,
             (unsigned long long)want_lo, (unsigned long long)want_hi);
}

static void extent_bad(int32_t ndim, const int64_t *shape,
                       const int64_t *strides, uint64_t elem_bits,
                       uint64_t flags, uint64_t off) {
  uint64_t lo = 7, hi = 7;
  char why[128] = "";
  int rc = tb__layout_extent(ndim, shape, strides, elem_bits, flags, off, &lo,
                             &hi, why, sizeof(why));
  if (rc != TB_ELAYOUT)
    fail_msg("extent gave %s, expected TB_ELAYOUT", tb_err_name(rc));
  assert_true(why[0] != '\0'); /* a reason is given */
  assert_true(lo == 7 && hi == 7);
  /* why may be NULL */
  assert_tb_err(tb__layout_extent(ndim, shape, strides, elem_bits, flags, off,
                                  &lo, &hi, NULL, 0),
                TB_ELAYOUT);
}

static void test_extent_basic(void **state) {
  (void)state;
  int64_t s2[2] = {3, 4};
  int64_t st_c[2] = {4, 1};
  int64_t st_t[2] = {1, 3}; /* transposed (column-major) */
  int64_t st_gap[2] = {8, 2}; /* every other element, rows padded */

  extent_ok(0, NULL, NULL, 32, 0, 0, 0, 4);       /* scalar */
  extent_ok(0, NULL, NULL, 32, 0, 100, 100, 104);
  extent_ok(2, s2, NULL, 32, 0, 0, 0, 48);
  extent_ok(2, s2, st_c, 32, 0, 0, 0, 48);
  extent_ok(2, s2, st_t, 32, 0, 16, 16, 64);
  /* max element index 2*8 + 3*2 = 22 → 23 elements of 2 bytes */
  extent_ok(2, s2, st_gap, 16, 0, 0, 0, 46);
  /* lanes: 4 x float32 = 16-byte elements */
  extent_ok(2, s2, NULL, 128, 0, 0, 0, 192);
}

static void test_extent_zero_and_negative_shapes(void **state) {
  (void)state;
  int64_t z[2] = {0, 5};
  int64_t zst[2] = {INT64_MAX, INT64_MAX}; /* irrelevant: nothing touched */
  int64_t neg[2] = {3, -1};
  int64_t negmin[1] = {INT64_MIN};
  /* extents whose product overflows before a zero one: still no elements */
  int64_t zlate[3] = {INT64_MAX, 4, 0};
  int64_t zneg[3] = {INT64_MAX, 0, -1}; /* but a negative one is refused */

  extent_ok(2, z, NULL, 32, 0, 64, 64, 64);
  extent_ok(2, z, zst, 32, 0, 64, 64, 64);
  extent_ok(3, zlate, NULL, 32, 0, 8, 8, 8);
  extent_bad(3, zneg, NULL, 32, 0, 0);
  extent_bad(2, neg, NULL, 32, 0, 0);
  extent_bad(1, negmin, NULL, 32, 0, 0);
  /* negative ndim, ndim over the hard ceiling, shape missing */
  extent_bad(-1, z, NULL, 32, 0, 0);
  {
    int64_t big[TB__MAX_NDIM_HARD + 1];
    for (int i = 0; i <= TB__MAX_NDIM_HARD; i++)
      big[i] = 1;
    extent_ok(TB__MAX_NDIM_HARD, big, NULL, 8, 0, 0, 0, 1);
    extent_bad(TB__MAX_NDIM_HARD + 1, big, NULL, 8, 0, 0);
  }
  extent_bad(2, NULL, NULL, 32, 0, 0);
  /* element size 0 or absurd */
  extent_bad(2, z, NULL, 0, 0, 0);
  extent_bad(0, NULL, NULL, 8ull * 1024 * 1024 + 1, 0, 0);
}

static void test_extent_overflow(void **state) {
  (void)state;
  int64_t huge[2] = {INT64_MAX, 2};         /* numel overflows */
  int64_t h3[3] = {1ll << 21, 1ll << 21, 1ll << 21}; /* 2^63: overflows */
  int64_t fits[1] = {1ll << 59};           /* numel fits, bytes (x16) do not */
  int64_t s1[1] = {2};
  int64_t st_big[1] = {INT64_MAX};          /* (2-1)*MAX fine, +1 overflows */
  int64_t st_neg_big[1] = {INT64_MIN};
  int64_t s2[2] = {3, 3};
  int64_t st_sum[2] = {INT64_MAX / 2, INT64_MAX / 2}; /* sum of spans overflows */

  extent_bad(2, huge, NULL, 8, 0, 0);
  extent_bad(3, h3, NULL, 8, 0, 0);
  extent_bad(1, fits, NULL, 128, 0, 0);
  extent_bad(1, s1, st_big, 8, 0, 0);
  extent_bad(1, s1, st_big, 32, 0, 0);
  extent_bad(1, s1, st_neg_big, 8, 0, 0);
  extent_bad(2, s2, st_sum, 8, 0, 0);
  /* byte offset beyond INT64_MAX, and offset + extent overflowing */
  extent_bad(1, s1, NULL, 8, 0, (uint64_t)INT64_MAX + 1);
  extent_bad(1, s1, NULL, 8, 0, UINT64_MAX);
  extent_bad(1, s1, NULL, 8, 0, (uint64_t)INT64_MAX);
  extent_ok(1, s1, NULL, 8, 0, (uint64_t)INT64_MAX - 2,
            (uint64_t)INT64_MAX - 2, (uint64_t)INT64_MAX);
}

static void test_extent_negative_strides(void **state) {
  (void)state;
  int64_t s1[1] = {4};
  int64_t st_neg[1] = {-1};
  int64_t s2[2] = {2, 3};
  int64_t st_flip[2] = {-3, 1}; /* rows reversed */

  /* data pointer at element 3 (byte 12), walking back to byte 0 */
  extent_ok(1, s1, st_neg, 32, 0, 12, 0, 16);
  /* one element further back would start before the buffer */
  extent_bad(1, s1, st_neg, 32, 0, 8);
  extent_bad(1, s1, st_neg, 32, 0, 0);
  extent_ok(2, s2, st_flip, 32, 0, 12, 0, 24);
  extent_bad(2, s2, st_flip, 32, 0, 11);
}

static void test_extent_subbyte(void **state) {
  (void)state;
  int64_t s2[2] = {3, 5};
  int64_t st_c[2] = {5, 1};
  int64_t st_nc[2] = {6, 1}; /* padded rows: not compact */
  int64_t st_t[2] = {1, 3};
  int64_t s1[2] = {1, 5};
  int64_t st_any[2] = {99, 1}; /* stride of a size-1 dim does not matter */

  /* 15 x 4-bit = 60 bits → 8 bytes */
  extent_ok(2, s2, NULL, 4, 0, 0, 0, 8);
  extent_ok(2, s2, st_c, 4, 0, 0, 0, 8);
  extent_ok(2, s2, NULL, 4, 0, 10, 10, 18);
  /* 15 x 6-bit = 90 bits → 12 bytes */
  extent_ok(2, s2, NULL, 6, 0, 0, 0, 12);
  extent_ok(2, s1, st_any, 4, 0, 0, 0, 3);
  extent_bad(2, s2, st_nc, 4, 0, 0);
  extent_bad(2, s2, st_t, 4, 0, 0);
  /* padded sub-byte types take a byte each and may be strided:
   * last element 2*6 + 4 = 16 → 17 bytes */
  extent_ok(2, s2, st_nc, 4, TB_DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, 0,
            0, 17);
  {
    int64_t huge[1] = {INT64_MAX / 2};
    extent_bad(1, huge, NULL, 4, 0, 0); /* bits overflow */
  }
}

/* ---- tb__layout_check: a wire layout against a buffer ---- */

struct lay {
  Tensorbroker__V1__Layout l;
  Tensorbroker__V1__Device dev;
  int64_t shape[TB__MAX_NDIM_HARD + 2];
  int64_t strides[TB__MAX_NDIM_HARD + 2];
};

static void lay_init(struct lay *w, size_t ndim, const int64_t *shape,
                     const int64_t *strides) {
  Tensorbroker__V1__Layout l0 = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__Device d0 = TENSORBROKER__V1__DEVICE__INIT;

  w->l = l0;
  w->dev = d0;
  w->dev.type = kDLCPU;
  w->l.device = &w->dev;
  w->l.dtype_code = TB_DTYPE_FLOAT;
  w->l.dtype_bits = 32;
  w->l.dtype_lanes = 1;
  w->l.n_shape = ndim;
  w->l.shape = w->shape;
  for (size_t i = 0; i < ndim; i++)
    w->shape[i] = shape[i];
  if (strides != NULL) {
    w->l.n_strides = ndim;
    w->l.strides = w->strides;
    for (size_t i = 0; i < ndim; i++)
      w->strides[i] = strides[i];
  }
}

static void test_check_fits_exactly(void **state) {
  (void)state;
  int64_t s[2] = {4, 8};
  int64_t st[2] = {16, 1}; /* rows of 16 floats, using the first 8 */
  struct lay w;
  char why[160];

  lay_init(&w, 2, s, NULL);
  assert_tb_ok(tb__layout_check(&w.l, 128, 32, why, sizeof(why)));
  assert_tb_err(tb__layout_check(&w.l, 127, 32, why, sizeof(why)), TB_ELAYOUT);
  assert_non_null(strstr(why, "128"));
  w.l.byte_offset = 64;
  assert_tb_ok(tb__layout_check(&w.l, 192, 32, NULL, 0));
  assert_tb_err(tb__layout_check(&w.l, 191, 32, NULL, 0), TB_ELAYOUT);

  /* non-contiguous: last element index 3*16 + 7 = 55 → 224 bytes */
  lay_init(&w, 2, s, st);
  assert_tb_ok(tb__layout_check(&w.l, 224, 32, NULL, 0));
  assert_tb_err(tb__layout_check(&w.l, 223, 32, NULL, 0), TB_ELAYOUT);
  {
    uint64_t end = 1;
    w.l.byte_offset = 8;
    assert_tb_ok(tb__layout_check_end(&w.l, 4096, 32, &end, NULL, 0));
    assert_int_equal(end, 232); /* where the daemon's signal check looks */
    end = 1;
    assert_tb_err(tb__layout_check_end(&w.l, 231, 32, &end, NULL, 0),
                  TB_ELAYOUT);
    assert_int_equal(end, 1); /* untouched on failure */
  }

  /* empty tensor at the very end of the buffer is fine, past it is not */
  {
    int64_t z[1] = {0};
    lay_init(&w, 1, z, NULL);
    w.l.byte_offset = 100;
    assert_tb_ok(tb__layout_check(&w.l, 100, 32, NULL, 0));
    assert_tb_err(tb__layout_check(&w.l, 99, 32, NULL, 0), TB_ELAYOUT);
  }
  /* zero-size buffer holds only empty tensors */
  lay_init(&w, 2, s, NULL);
  assert_tb_err(tb__layout_check(&w.l, 0, 32, NULL, 0), TB_ELAYOUT);
}

static void test_check_limits(void **state) {
  (void)state;
  int64_t ones[TB__MAX_NDIM_HARD + 2];
  struct lay w;
  char why[160];

  for (int i = 0; i < TB__MAX_NDIM_HARD + 2; i++)
    ones[i] = 1;
  lay_init(&w, 32, ones, NULL);
  assert_tb_ok(tb__layout_check(&w.l, 4, 32, NULL, 0));
  lay_init(&w, 33, ones, NULL);
  assert_tb_err(tb__layout_check(&w.l, 4, 32, why, sizeof(why)), TB_ELIMIT);
  assert_tb_ok(tb__layout_check(&w.l, 4, 33, NULL, 0));
  /* the hard ceiling holds whatever max_ndim says */
  lay_init(&w, TB__MAX_NDIM_HARD, ones, NULL);
  assert_tb_ok(tb__layout_check(&w.l, 4, UINT32_MAX, NULL, 0));
  lay_init(&w, TB__MAX_NDIM_HARD + 1, ones, NULL);
  assert_tb_err(tb__layout_check(&w.l, 4, UINT32_MAX, NULL, 0), TB_ELIMIT);
  /* max_ndim 0 allows scalars only */
  lay_init(&w, 0, ones, NULL);
  assert_tb_ok(tb__layout_check(&w.l, 4, 0, NULL, 0));
  lay_init(&w, 1, ones, NULL);
  assert_tb_err(tb__layout_check(&w.l, 4, 0, NULL, 0), TB_ELIMIT);
}

static void test_check_bad_layouts(void **state) {
  (void)state;
  int64_t s[2] = {4, 4};
  int64_t st_out[2] = {4, 2}; /* reaches element 3*4+3*2 = 18 > 15 */
  int64_t st_neg[2] = {-4, 1};
  int64_t huge[2] = {INT64_MAX, INT64_MAX};
  struct lay w;
  char why[160];

  assert_tb_err(tb__layout_check(NULL, 100, 32, why, sizeof(why)), TB_ELAYOUT);

  lay_init(&w, 2, s, st_out);
  assert_tb_err(tb__layout_check(&w.l, 64, 32, why, sizeof(why)), TB_ELAYOUT);
  assert_tb_ok(tb__layout_check(&w.l, 76, 32, NULL, 0));

  lay_init(&w, 2, s, st_neg); /* rows reversed from offset 0: before the buffer */
  assert_tb_err(tb__layout_check(&w.l, 1 << 20, 32, why, sizeof(why)),
                TB_ELAYOUT);
  w.l.byte_offset = 48;
  assert_tb_ok(tb__layout_check(&w.l, 64, 32, NULL, 0));

  /* strides count must match ndim */
  lay_init(&w, 2, s, st_out);
  w.l.n_strides = 1;
  assert_tb_err(tb__layout_check(&w.l, 1 << 20, 32, NULL, 0), TB_ELAYOUT);

  lay_init(&w, 2, huge, NULL);
  assert_tb_err(tb__layout_check(&w.l, UINT64_MAX, 32, why, sizeof(why)),
                TB_ELAYOUT);

  lay_init(&w, 2, s, NULL);
  w.l.byte_offset = (uint64_t)INT64_MAX + 1;
  assert_tb_err(tb__layout_check(&w.l, UINT64_MAX, 32, NULL, 0), TB_ELAYOUT);
  w.l.byte_offset = UINT64_MAX - 8;
  assert_tb_err(tb__layout_check(&w.l, UINT64_MAX, 32, NULL, 0), TB_ELAYOUT);

  /* unknown dtype and opaque handles are TB_EDTYPE */
  lay_init(&w, 2, s, NULL);
  w.l.dtype_code = 99;
  assert_tb_err(tb__layout_check(&w.l, 1 << 20, 32, why, sizeof(why)),
                TB_EDTYPE);
  w.l.dtype_code = TB_DTYPE_OPAQUE_HANDLE;
  w.l.dtype_bits = 64;
  assert_tb_err(tb__layout_check(&w.l, 1 << 20, 32, NULL, 0), TB_EDTYPE);
  w.l.dtype_code = TB_DTYPE_FLOAT;
  w.l.dtype_bits = 32;
  w.l.dtype_lanes = 0;
  assert_tb_err(tb__layout_check(&w.l, 1 << 20, 32, NULL, 0), TB_EDTYPE);

  /* bool, bfloat16 and float8 layouts are checked by their own widths */
  lay_init(&w, 2, s, NULL);
  w.l.dtype_code = TB_DTYPE_BOOL;
  w.l.dtype_bits = 8;
  assert_tb_ok(tb__layout_check(&w.l, 16, 32, NULL, 0));
  assert_tb_err(tb__layout_check(&w.l, 15, 32, NULL, 0), TB_ELAYOUT);
  w.l.dtype_code = TB_DTYPE_BFLOAT;
  w.l.dtype_bits = 16;
  assert_tb_ok(tb__layout_check(&w.l, 32, 32, NULL, 0));
  assert_tb_err(tb__layout_check(&w.l, 31, 32, NULL, 0), TB_ELAYOUT);
  w.l.dtype_code = TB_DTYPE_FLOAT8_E4M3FN;
  w.l.dtype_bits = 8;
  assert_tb_ok(tb__layout_check(&w.l, 16, 32, NULL, 0));
  w.l.dtype_code = TB_DTYPE_FLOAT4_E2M1FN;
  w.l.dtype_bits = 4;
  assert_tb_ok(tb__layout_check(&w.l, 8, 32, NULL, 0));
  assert_tb_err(tb__layout_check(&w.l, 7, 32, NULL, 0), TB_ELAYOUT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtype_valid),
      cmocka_unit_test(test_dtype_invalid),
      cmocka_unit_test(test_extent_basic),
      cmocka_unit_test(test_extent_zero_and_negative_shapes),
      cmocka_unit_test(test_extent_overflow),
      cmocka_unit_test(test_extent_negative_strides),
      cmocka_unit_test(test_extent_subbyte),
      cmocka_unit_test(test_check_fits_exactly),
      cmocka_unit_test(test_check_limits),
      cmocka_unit_test(test_check_bad_layouts),
  };
  return cmocka_run_group_tests_name("layout", tests, NULL, NULL);
}
