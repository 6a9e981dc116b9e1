/* SPDX-License-Identifier: Apache-2.0 */
/* Channel name rules: path-like, printable, bounded. */
#include "tb_proto.h"

#include <string.h>

#include <tensorbroker/errors.h>

static int name_char_ok(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' ||
         c == '/';
}

int tb__name_check(const char *name, size_t max_len) {
  size_t len, comp = 0;

  if (name == NULL)
    return TB_ENAME;
  len = strnlen(name, max_len + 1);
  if (len == 0 || len > max_len)
    return TB_ENAME;
  for (size_t i = 0; i <= len; i++) {
    char c = name[i];
    if (c == '/' || c == '\0') {
      /* empty, "." and ".." components would make names that look alike */
      if (comp == 0 || (comp == 1 && name[i - 1] == '.') ||
          (comp == 2 && name[i - 1] == '.' && name[i - 2] == '.'))
        return TB_ENAME;
      comp = 0;
      continue;
    }
    if (!name_char_ok(c))
      return TB_ENAME;
    comp++;
  }
  return 0;
}
