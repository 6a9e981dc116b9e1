/* SPDX-License-Identifier: Apache-2.0 */
/* A channel's versions by number (vindex.h). */
#include "vindex.h"

#include <assert.h>
#include <string.h>

#include <tensorbroker/errors.h>

#include "registry_impl.h"

/* Smallest array; below it an index never shrinks. */
#define VINDEX_MIN 16

/* Move the n live slots to a new array of cap slots; 0 or TB_ENOMEM. */
static int vindex_move(struct tbd_vindex *x, uint32_t cap) {
  uint32_t n = x->end - x->first;
  struct tbd_version **a = tbd_malloc(cap * sizeof(*a));

  if (a == NULL)
    return TB_ENOMEM;
  if (n > 0)
    memcpy(a, x->a + x->first, n * sizeof(*a));
  tbd_free(x->a);
  x->a = a;
  x->first = 0;
  x->end = n;
  x->cap = cap;
  return 0;
}

int tbd_vindex_reserve(struct tbd_vindex *x) {
  uint32_t n = x->end - x->first;

  if (x->end < x->cap)
    return 0;
  if (n < x->cap / 2) {
    /* half of it is free at the front, where trims took versions */
    memmove(x->a, x->a + x->first, n * sizeof(*x->a));
    x->first = 0;
    x->end = n;
    return 0;
  }
  if (x->cap > UINT32_MAX / 4)
    return TB_ENOMEM;
  return vindex_move(x, x->cap < VINDEX_MIN ? VINDEX_MIN : x->cap * 2);
}

void tbd_vindex_append(struct tbd_vindex *x, struct tbd_version *v) {
  assert(x->end < x->cap);
  assert(x->end == x->first || x->a[x->end - 1]->number < v->number);
  x->a[x->end++] = v;
}

uint32_t tbd_vindex_lower(const struct tbd_vindex *x, uint64_t number) {
  uint32_t lo, hi;
  uint64_t newest, back;

  if (x->first == x->end)
    return x->end;
  newest = x->a[x->end - 1]->number;
  if (number > newest)
    return x->end;
  if (number <= x->a[x->first]->number)
    return x->first;
  /* no gap between it and the newest: it is this many slots back */
  back = newest - number;
  if (back < x->end - x->first && x->a[x->end - 1 - back]->number == number)
    return x->end - 1 - (uint32_t)back;
  /* a[lo] < number <= a[hi] */
  lo = x->first;
  hi = x->end - 1;
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (x->a[mid]->number < number)
      lo = mid;
    else
      hi = mid;
  }
  return hi;
}

struct tbd_version *tbd_vindex_find(const struct tbd_vindex *x,
                                    uint64_t number) {
  uint32_t i = tbd_vindex_lower(x, number);

  return i < x->end && x->a[i]->number == number ? x->a[i] : NULL;
}

void tbd_vindex_remove(struct tbd_vindex *x, const struct tbd_version *v) {
  uint32_t i = tbd_vindex_lower(x, v->number), n;

  assert(i < x->end && x->a[i] == v);
  /* close the gap from the nearer end */
  if (i - x->first < x->end - 1 - i) {
    memmove(x->a + x->first + 1, x->a + x->first,
            (i - x->first) * sizeof(*x->a));
    x->first++;
  } else {
    memmove(x->a + i, x->a + i + 1, (x->end - 1 - i) * sizeof(*x->a));
    x->end--;
  }
  n = x->end - x->first;
  if (n == 0)
    x->first = x->end = 0;
  /* a history made shallow gives its memory back (kept as it is when
   * there is no memory for the smaller copy) */
  if (x->cap > 4 * VINDEX_MIN && n < x->cap / 8)
    (void)vindex_move(x, x->cap / 4);
}

void tbd_vindex_free(struct tbd_vindex *x) {
  tbd_free(x->a);
  x->a = NULL;
  x->first = x->end = x->cap = 0;
}
