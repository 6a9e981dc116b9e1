/* SPDX-License-Identifier: Apache-2.0 */
/* Error codes, their names and texts, and the stream contract names. */
#include "tb_test.h"

#include <string.h>

#include <tensorbroker/tensorbroker.h>

struct code {
  int value;
  const char *name;
  const char *text;
};

static const struct code codes[] = {
#define TBT_CODE(n, v, t) {TB_##n, "TB_" #n, t},
    TB_ERRNO_MAP(TBT_CODE)
#undef TBT_CODE
};
#define NCODES (sizeof(codes) / sizeof(codes[0]))

static void test_every_code(void **state) {
  (void)state;
  for (size_t i = 0; i < NCODES; i++) {
    assert_true(codes[i].value < 0);
    assert_true(codes[i].value > TB__ERR_LAST);
    assert_string_equal(tb_err_name(codes[i].value), codes[i].name);
    assert_string_equal(tb_strerror(codes[i].value), codes[i].text);
    assert_true(strlen(codes[i].text) > 0);
    assert_string_not_equal(tb_strerror(codes[i].value), "unknown error");
  }
  /* the list is dense from -1 down to TB__ERR_LAST + 1 */
  assert_int_equal(NCODES, (size_t)(-(TB__ERR_LAST + 1)));
}

static void test_distinct(void **state) {
  (void)state;
  for (size_t i = 0; i < NCODES; i++) {
    for (size_t j = i + 1; j < NCODES; j++) {
      assert_int_not_equal(codes[i].value, codes[j].value);
      assert_string_not_equal(tb_err_name(codes[i].value),
                              tb_err_name(codes[j].value));
      assert_string_not_equal(tb_strerror(codes[i].value),
                              tb_strerror(codes[j].value));
    }
  }
}

static void test_unknown_and_zero(void **state) {
  (void)state;
  const int unknown[] = {TB__ERR_LAST, -1000, 1, 42, -2147483647 - 1, 2147483647};
  for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
    assert_string_equal(tb_strerror(unknown[i]), "unknown error");
    assert_string_equal(tb_err_name(unknown[i]), "TB_E?");
  }
  assert_string_equal(tb_err_name(0), "TB_OK");
  assert_string_not_equal(tb_strerror(0), "unknown error");
}

static void test_version(void **state) {
  (void)state;
  assert_string_equal(tb_version(), TB_VERSION_STRING);
}

static void test_contracts(void **state) {
  (void)state;
  static const struct {
    const char *name;
    int value;
  } ok[] = {
      {"spec", TB_CONTRACT_SPEC},
      {"no_sync", TB_CONTRACT_NO_SYNC},
      {"no-sync", TB_CONTRACT_NO_SYNC},
      {"per_thread", TB_CONTRACT_PER_THREAD},
      {"per-thread", TB_CONTRACT_PER_THREAD},
      {"explicit", TB_CONTRACT_EXPLICIT},
  };
  static const char *bad[] = {"", "SPEC", "spec ", "nosync", "no_sync_",
                              "per", "explicitly", "a-very-long-contract-name",
                              "no_syn"};
  int out;

  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    out = -99;
    assert_tb_ok(tb_contract_parse(ok[i].name, &out));
    assert_int_equal(out, ok[i].value);
  }
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    out = -99;
    if (tb_contract_parse(bad[i], &out) != TB_EINVAL)
      fail_msg("contract \"%s\" accepted", bad[i]);
    assert_int_equal(out, -99); /* untouched */
  }
  assert_tb_err(tb_contract_parse(NULL, &out), TB_EINVAL);
  assert_tb_err(tb_contract_parse("spec", NULL), TB_EINVAL);

  for (int c = TB_CONTRACT_SPEC; c <= TB_CONTRACT_EXPLICIT; c++) {
    const char *n = tb_contract_name(c);
    assert_non_null(n);
    assert_tb_ok(tb_contract_parse(n, &out));
    assert_int_equal(out, c);
  }
  assert_null(tb_contract_name(-1));
  assert_null(tb_contract_name(4));
  assert_string_equal(tb_contract_name(TB_CONTRACT_NO_SYNC), "no_sync");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_code),
      cmocka_unit_test(test_distinct),
      cmocka_unit_test(test_unknown_and_zero),
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_contracts),
  };
  return cmocka_run_group_tests_name("errors", tests, NULL, NULL);
}
