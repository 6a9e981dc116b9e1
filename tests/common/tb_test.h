/* SPDX-License-Identifier: Apache-2.0 */
/* Assertion helpers shared by the cmocka tests. Include after <cmocka.h>'s
 * prerequisites (stdarg.h, stddef.h, stdint.h, setjmp.h). They print the
 * error's name and text, so a failure says what went wrong. */
#ifndef TB_TEST_H
#define TB_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <tensorbroker/errors.h>

const char *tb_strerror(int err);
const char *tb_err_name(int err);

/* expr must return 0 (or a non-negative count). */
#define assert_tb_ok(expr)                                                   \
  do {                                                                       \
    long tbt_rc_ = (long)(expr);                                             \
    if (tbt_rc_ < 0)                                                         \
      fail_msg("%s = %ld %s (%s)", #expr, tbt_rc_, tb_err_name((int)tbt_rc_), \
               tb_strerror((int)tbt_rc_));                                   \
  } while (0)

/* expr must return exactly the error want. */
#define assert_tb_err(expr, want)                                            \
  do {                                                                       \
    long tbt_rc_ = (long)(expr);                                             \
    if (tbt_rc_ != (long)(want))                                             \
      fail_msg("%s = %ld %s (%s), expected %s", #expr, tbt_rc_,              \
               tb_err_name((int)tbt_rc_), tb_strerror((int)tbt_rc_),         \
               tb_err_name((int)(want)));                                    \
  } while (0)

#endif /* TB_TEST_H */
