/* SPDX-License-Identifier: Apache-2.0 */
/* Allocation wrappers with a failure-injection hook for the tests. */
#include "alloc.h"

#include <stdlib.h>
#include <string.h>

static unsigned long fail_nth;  /* 0: hook off */
static int fail_sticky;
static unsigned long count;

static int should_fail(void) {
  count++;
  if (fail_nth == 0)
    return 0;
  return count == fail_nth || (fail_sticky && count > fail_nth);
}

void tbd_alloc_fail_at(unsigned long nth, int sticky) {
  fail_nth = nth;
  fail_sticky = sticky;
  count = 0;
}

unsigned long tbd_alloc_count(void) { return count; }

void *tbd_malloc(size_t n) {
  if (should_fail())
    return NULL;
  return malloc(n == 0 ? 1 : n);
}

void *tbd_calloc(size_t nmemb, size_t size) {
  if (should_fail())
    return NULL;
  return calloc(nmemb == 0 ? 1 : nmemb, size == 0 ? 1 : size);
}

void tbd_free(void *p) { free(p); }

char *tbd_strdup(const char *s) { return tbd_memdup(s, strlen(s) + 1); }

void *tbd_memdup(const void *p, size_t n) {
  void *d = tbd_malloc(n);

  if (d != NULL && n > 0)
    memcpy(d, p, n);
  return d;
}

static void *pb_alloc(void *data, size_t size) {
  (void)data;
  return tbd_malloc(size);
}

static void pb_free(void *data, void *p) {
  (void)data;
  tbd_free(p);
}

ProtobufCAllocator tbd_pb_allocator = {pb_alloc, pb_free, NULL};
int tbd_hash_oom;
