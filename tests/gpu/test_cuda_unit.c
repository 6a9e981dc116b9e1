/* SPDX-License-Identifier: Apache-2.0 */
/* CPU-side tests of the CUDA layer: how each contract resolves a stream
 * argument, and what the library says when CUDA is missing. Runs on any
 * machine (on a GPU machine the "missing" checks take the other branch). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <tensorbroker/tensorbroker.h>

#include "cuda/cuda.h"

static void resolve_null(void **state) {
  struct tb__cuda_stream s;
  char why[200];
  (void)state;

  assert_int_equal(tb__cuda_stream_resolve(TB_CONTRACT_SPEC, NULL, &s, why,
                                           sizeof why), 0);
  assert_ptr_equal(s.stream, TB_CU_STREAM_LEGACY);
  assert_int_equal(s.no_sync, 0);
  assert_int_equal(s.implicit, 1);

  assert_int_equal(tb__cuda_stream_resolve(TB_CONTRACT_PER_THREAD, NULL, &s,
                                           why, sizeof why), 0);
  assert_ptr_equal(s.stream, TB_CU_STREAM_PER_THREAD);
  assert_int_equal(s.implicit, 1);

  assert_int_equal(tb__cuda_stream_resolve(TB_CONTRACT_NO_SYNC, NULL, &s, why,
                                           sizeof why), 0);
  assert_int_equal(s.no_sync, 1);
  assert_int_equal(s.implicit, 1);

  /* EXPLICIT: an error with advice, and *out untouched */
  memset(&s, 0x5a, sizeof s);
  why[0] = '\0';
  assert_int_equal(tb__cuda_stream_resolve(TB_CONTRACT_EXPLICIT, NULL, &s,
                                           why, sizeof why), TB_ESTREAM);
  assert_int_equal(s.no_sync, 0x5a5a5a5a);
  assert_non_null(strstr(why, "explicit"));

  assert_int_equal(tb__cuda_stream_resolve(7, NULL, &s, why, sizeof why),
                   TB_EINVAL);
}

static void resolve_values(void **state) {
  struct tb__cuda_stream s;
  char why[200];
  (void)state;

  for (int contract = 0; contract <= 3; contract++) {
    assert_int_equal(tb__cuda_stream_resolve(contract, TB_STREAM_NO_SYNC, &s,
                                             why, sizeof why), 0);
    assert_int_equal(s.no_sync, 1);
    assert_int_equal(s.implicit, 0);
    assert_int_equal(tb__cuda_stream_resolve(contract, TB_STREAM_LEGACY, &s,
                                             why, sizeof why), 0);
    assert_ptr_equal(s.stream, TB_CU_STREAM_LEGACY);
    assert_int_equal(s.no_sync, 0);
    assert_int_equal(s.implicit, 0);
    assert_int_equal(tb__cuda_stream_resolve(contract, TB_STREAM_PER_THREAD,
                                             &s, why, sizeof why), 0);
    assert_ptr_equal(s.stream, TB_CU_STREAM_PER_THREAD);
    void *mine = (void *)(uintptr_t)0x7f0012345600ull;
    assert_int_equal(tb__cuda_stream_resolve(contract, mine, &s, why,
                                             sizeof why), 0);
    assert_ptr_equal(s.stream, mine);
    assert_int_equal(s.no_sync, 0);
    assert_int_equal(s.implicit, 0);
    assert_int_equal(tb__cuda_stream_resolve(contract, (void *)(intptr_t)-5,
                                             &s, why, sizeof why),
                     TB_ESTREAM);
  }
  /* why may be NULL */
  assert_int_equal(tb__cuda_stream_resolve(TB_CONTRACT_EXPLICIT, NULL, &s,
                                           NULL, 0), TB_ESTREAM);
}

static void availability(void **state) {
  (void)state;
  int rc = tb_cuda_available();
  const char *why = tb__cuda_why();
  assert_non_null(why);
  assert_non_null(tb__cuda_err_name(1));
  if (rc == 0) {
    assert_string_equal(why, "");
    return;
  }
  /* No driver here: every CUDA entry point says so, with a reason. */
  assert_int_equal(rc, TB_ENOCUDA);
  assert_true(strlen(why) > 0);
  struct tb__cuda_alloc a;
  char buf[200] = "";
  int dummy = 0;
  assert_int_equal(tb__cuda_locate(&dummy, sizeof dummy, &a, buf, sizeof buf),
                   TB_ENOCUDA);
  assert_string_equal(buf, why);
  uint8_t h[64] = {0};
  tb_cu_deviceptr p = 0;
  int local = 0;
  assert_int_equal(tb__cuda_open_mem_here(h, 0, 16, &p, &local, NULL, 0),
                   TB_ENOCUDA);
  struct tb__cuda_stream s = {TB_CU_STREAM_LEGACY, 0, 0, NULL};
  assert_int_equal(tb__cuda_wait(&s, NULL, NULL, 0), TB_ENOCUDA);
  s.no_sync = 1; /* nothing to do needs no driver */
  assert_int_equal(tb__cuda_wait(&s, NULL, NULL, 0), 0);
  assert_int_equal(tb__cuda_record(NULL, &s, 1, NULL, NULL, NULL, 0), 0);
}

/* The cross-GPU decision with a faked cuDeviceCanAccessPeer result: the
 * no-P2P error path cannot be produced on machines whose GPUs all reach
 * each other, so it is tested here. */
static void xdev_plan(void **state) {
  static const uint8_t ua[16] = {0xaa, 0xaa, 0xaa, 0xaa, 1, 2, 3, 4,
                                 5,    6,    7,    8,    9, 10, 11, 12};
  static const uint8_t ub[16] = {0xbb, 0xbb, 0xbb, 0xbb, 1, 2, 3, 4,
                                 5,    6,    7,    8,    9, 10, 11, 13};
  char why[300];
  int plan;
  (void)state;

  /* -1 and the same device: zero-copy there, with or without the flag */
  for (unsigned f = 0; f <= TB_ACQUIRE_COPY_TO_DEVICE; f++) {
    for (int can = 0; can <= 1; can++) {
      plan = 99;
      assert_int_equal(tb__cuda_xdev_plan(0, -1, f, can, ua, ub, &plan, why,
                                          sizeof why), 0);
      assert_int_equal(plan, TB__XDEV_SAME);
      plan = 99;
      assert_int_equal(tb__cuda_xdev_plan(1, 1, f, can, ua, ua, &plan, why,
                                          sizeof why), 0);
      assert_int_equal(plan, TB__XDEV_SAME);
    }
  }
  /* another device: peer access when it can reach, copy when asked */
  assert_int_equal(tb__cuda_xdev_plan(0, 1, 0, 1, ua, ub, &plan, why,
                                      sizeof why), 0);
  assert_int_equal(plan, TB__XDEV_PEER);
  assert_int_equal(tb__cuda_xdev_plan(0, 1, TB_ACQUIRE_COPY_TO_DEVICE, 1, ua,
                                      ub, &plan, why, sizeof why), 0);
  assert_int_equal(plan, TB__XDEV_COPY);
  assert_int_equal(tb__cuda_xdev_plan(0, 1, TB_ACQUIRE_COPY_TO_DEVICE, 0, ua,
                                      ub, &plan, why, sizeof why), 0);
  assert_int_equal(plan, TB__XDEV_COPY);
  /* no peer access and no flag: an error naming both GPUs and the flag,
   * never a silent copy; *plan untouched */
  plan = 99;
  why[0] = '\0';
  assert_int_equal(tb__cuda_xdev_plan(0, 1, 0, 0, ua, ub, &plan, why,
                                      sizeof why), TB_EDEVICE);
  assert_int_equal(plan, 99);
  assert_non_null(strstr(why, "GPU-bbbbbbbb-0102-0304-0506-0708090a0b0d "
                              "(device 1) cannot reach "
                              "GPU-aaaaaaaa-0102-0304-0506-0708090a0b0c"));
  assert_non_null(strstr(why, "TB_ACQUIRE_COPY_TO_DEVICE"));
  /* why may be NULL */
  assert_int_equal(tb__cuda_xdev_plan(2, 0, 0, 0, ua, ub, &plan, NULL, 0),
                   TB_EDEVICE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(resolve_null),
      cmocka_unit_test(resolve_values),
      cmocka_unit_test(availability),
      cmocka_unit_test(xdev_plan),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
