/* SPDX-License-Identifier: Apache-2.0 */
/* The replay program of a fuzz target: runs LLVMFuzzerTestOneInput on each
 * file named on the command line, and on every file in each directory
 * named (sorted by name, not recursive). ctest uses it to run the seed
 * corpora with any compiler; give it a crash file to debug it without
 * libFuzzer. Exits 0 after the last input (a target that finds a bug
 * aborts), 2 when an input cannot be read or nothing was run. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0, n;

  if (f == NULL) {
    fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
    return -1;
  }
  do {
    if (len == cap) {
      uint8_t *nb;
      cap = cap ? cap * 2 : 4096;
      nb = realloc(buf, cap);
      if (nb == NULL) {
        free(buf);
        fclose(f);
        return -1;
      }
      buf = nb;
    }
    n = fread(buf + len, 1, cap - len, f);
    len += n;
  } while (n > 0);
  fclose(f);
  /* an exact-size copy, so that ASan sees reads past the input */
  {
    uint8_t *exact = malloc(len ? len : 1);
    if (exact == NULL) {
      free(buf);
      return -1;
    }
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
  }
  return 0;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *dir, unsigned long *count) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char **names = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;

  if (d == NULL) {
    fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
    return -1;
  }
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    if (n == cap) {
      char **nn;
      cap = cap ? cap * 2 : 64;
      nn = realloc(names, cap * sizeof(*names));
      if (nn == NULL) {
        rc = -1;
        break;
      }
      names = nn;
    }
    names[n] = strdup(e->d_name);
    if (names[n] == NULL) {
      rc = -1;
      break;
    }
    n++;
  }
  closedir(d);
  if (n > 0)
    qsort(names, n, sizeof(*names), cmp_names);
  for (size_t i = 0; i < n; i++) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
    if (rc == 0 && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
      if (run_file(path) < 0)
        rc = -1;
      else
        (*count)++;
    }
    free(names[i]);
  }
  free(names);
  return rc;
}

int main(int argc, char **argv) {
  unsigned long count = 0;

  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) < 0) {
      fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
      return 2;
    }
    if (S_ISDIR(st.st_mode) ? run_dir(argv[i], &count) < 0
                            : run_file(argv[i]) < 0)
      return 2;
    if (!S_ISDIR(st.st_mode))
      count++;
  }
  printf("replay: %lu input(s) run\n", count);
  return count > 0 ? 0 : 2;
}
