/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by the chaos and load tests (tests/chaos): a seeded generator,
 * knobs read from the environment, and what the daemon holds, read
 * through its status and from /proc. */
#ifndef TB_TESTS_STRESS_H
#define TB_TESTS_STRESS_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* splitmix64: every process derives its own stream from the seed */
static inline uint64_t st_next(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint64_t st_mix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b * 0xd6e8feb86659fd93ull);
  return st_next(&x);
}

/* A knob: $name as a decimal number, else def. */
static inline long st_env(const char *name, long def) {
  const char *v = getenv(name);
  char *end;
  long x;

  if (v == NULL || *v == '\0')
    return def;
  x = strtol(v, &end, 0);
  if (*end != '\0') {
    fprintf(stderr, "%s=%s is not a number; using %ld\n", name, v, def);
    return def;
  }
  return x;
}

/* Descriptors open in process pid, or -1. */
static inline int st_proc_fds(pid_t pid) {
  char path[64];
  DIR *d;
  struct dirent *e;
  int n = 0;

  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  d = opendir(path);
  if (d == NULL)
    return -1;
  while ((e = readdir(d)) != NULL)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* A "Vm...:" line of /proc/pid/status in KiB, or -1. */
static inline long st_proc_kib(pid_t pid, const char *field) {
  char path[64], line[256];
  size_t flen = strlen(field);
  long kib = -1;
  FILE *f;

  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  f = fopen(path, "r");
  if (f == NULL)
    return -1;
  while (fgets(line, sizeof(line), f) != NULL) {
    if (strncmp(line, field, flen) == 0 && line[flen] == ':') {
      kib = strtol(line + flen + 1, NULL, 10);
      break;
    }
  }
  fclose(f);
  return kib;
}

#endif /* TB_TESTS_STRESS_H */
