/* SPDX-License-Identifier: Apache-2.0 */
/* Channel names: path-like, printable, bounded. */
#include "tb_test.h"

#include <string.h>

#include "tb_proto.h"

static void test_valid(void **state) {
  (void)state;
  static const char *ok[] = {
      "a", "camera0", "camera0/frames", "a/b/c/d", "A-Z_a.z-0.9",
      "x.y", ".hidden", "a/.b", "a/b.", "...", "a/.../b", "_", "-", "a-/b_",
  };
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    int rc = tb__name_check(ok[i], TB__DEFAULT_MAX_NAME);
    if (rc != 0)
      fail_msg("name \"%s\" refused: %s", ok[i], tb_err_name(rc));
  }
}

static void test_invalid(void **state) {
  (void)state;
  static const char *bad[] = {
      "",        "/",         "/a",        "a/",        "a//b",
      "..",      "a/..",      "../a",      "a/../b",    ".",
      "a/.",     "./a",       "a/./b",     "a b",       "a\tb",
      "a\nb",    "a:b",       "a\\b",      "caf\xc3\xa9", "\x7f",
      "a*",      "a?",        "a%2f",      "//",        "a/b/",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int rc = tb__name_check(bad[i], TB__DEFAULT_MAX_NAME);
    if (rc != TB_ENAME)
      fail_msg("name \"%s\" gave %s, expected TB_ENAME", bad[i],
               tb_err_name(rc));
  }
  assert_tb_err(tb__name_check(NULL, TB__DEFAULT_MAX_NAME), TB_ENAME);
}

static void test_length(void **state) {
  (void)state;
  char name[TB__DEFAULT_MAX_NAME + 2];

  memset(name, 'n', sizeof(name));
  name[TB__DEFAULT_MAX_NAME] = '\0';
  assert_tb_ok(tb__name_check(name, TB__DEFAULT_MAX_NAME));
  name[TB__DEFAULT_MAX_NAME] = 'n';
  name[TB__DEFAULT_MAX_NAME + 1] = '\0';
  assert_tb_err(tb__name_check(name, TB__DEFAULT_MAX_NAME), TB_ENAME);
  /* the limit is the caller's */
  assert_tb_ok(tb__name_check("abcd", 4));
  assert_tb_err(tb__name_check("abcde", 4), TB_ENAME);
  assert_tb_err(tb__name_check("a", 0), TB_ENAME);
  /* a name longer than the limit need not be NUL-terminated within reach:
   * only max_len + 1 bytes are read */
  {
    char unterminated[5] = {'a', 'b', 'c', 'd', 'e'};
    assert_tb_err(tb__name_check(unterminated, 4), TB_ENAME);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid),
      cmocka_unit_test(test_invalid),
      cmocka_unit_test(test_length),
  };
  return cmocka_run_group_tests_name("names", tests, NULL, NULL);
}
