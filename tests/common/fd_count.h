/* SPDX-License-Identifier: Apache-2.0 */
/* How many descriptors this process has open, for the tests that check
 * that none leaked: a count taken before against one taken after.
 * Header-only, so that the fuzz targets (tests/fuzz), which link neither
 * cmocka nor a test library, use the same count as the cmocka tests. */
#ifndef TB_TESTS_FD_COUNT_H
#define TB_TESTS_FD_COUNT_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

/* The open descriptors, not counting the one this call opens to read
 * /proc/self/fd. Aborts when /proc/self/fd cannot be read: without it no
 * leak check means anything, in a cmocka test or under the fuzzer. */
static inline int tbt_count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int n = 0;

  if (d == NULL) {
    perror("tbt_count_fds: /proc/self/fd");
    abort();
  }
  while ((e = readdir(d)) != NULL)
    n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;
}

#endif /* TB_TESTS_FD_COUNT_H */
