/* SPDX-License-Identifier: Apache-2.0 */
/* tb_strerror / tb_err_name, generated from the one list in errors.h. */
#include <tensorbroker/tensorbroker.h>

const char *tb_strerror(int err) {
  switch (err) {
  case 0:
    return "success";
#define TB__ERR_TEXT(name, value, text)                                      \
  case TB_##name:                                                            \
    return text;
    TB_ERRNO_MAP(TB__ERR_TEXT)
#undef TB__ERR_TEXT
  default:
    return "unknown error";
  }
}

const char *tb_err_name(int err) {
  switch (err) {
  case 0:
    return "TB_OK";
#define TB__ERR_NAME(name, value, text)                                      \
  case TB_##name:                                                            \
    return "TB_" #name;
    TB_ERRNO_MAP(TB__ERR_NAME)
#undef TB__ERR_NAME
  default:
    return "TB_E?";
  }
}

const char *tb_version(void) { return TB_VERSION_STRING; }

const char *tb_contract_name(int contract) {
  switch (contract) {
  case TB_CONTRACT_SPEC:
    return "spec";
  case TB_CONTRACT_NO_SYNC:
    return "no_sync";
  case TB_CONTRACT_PER_THREAD:
    return "per_thread";
  case TB_CONTRACT_EXPLICIT:
    return "explicit";
  default:
    return NULL;
  }
}

int tb_contract_parse(const char *name, int *out) {
  char norm[16];
  size_t i;

  if (name == NULL || out == NULL)
    return TB_EINVAL;
  for (i = 0; name[i] != '\0'; i++) {
    if (i + 1 >= sizeof(norm))
      return TB_EINVAL;
    norm[i] = name[i] == '-' ? '_' : name[i];
  }
  norm[i] = '\0';
  for (int c = TB_CONTRACT_SPEC; c <= TB_CONTRACT_EXPLICIT; c++) {
    const char *n = tb_contract_name(c);
    size_t j = 0;
    while (n[j] != '\0' && n[j] == norm[j])
      j++;
    if (n[j] == '\0' && norm[j] == '\0') {
      *out = c;
      return 0;
    }
  }
  return TB_EINVAL;
}
