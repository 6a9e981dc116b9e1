/* SPDX-License-Identifier: Apache-2.0 */
/* A channel's live versions by number, for lookups without a walk: a
 * sorted deque of pointers, the oldest at a[first] and the newest at
 * a[end - 1]. A publish appends; the history's trim takes from the front.
 * A lookup is offset arithmetic from the newest while the numbers there
 * have no gaps (versions mostly leave oldest first), else a binary search.
 * Removing the i-th of n moves min(i, n - i) pointers: none for the oldest
 * or the newest. */
#ifndef TBD_VINDEX_H
#define TBD_VINDEX_H

#include <stdint.h>

struct tbd_version;

struct tbd_vindex {
  struct tbd_version **a;
  uint32_t first, end, cap;
};

/* Room to append one version: 0 or TB_ENOMEM (nothing changed). */
int tbd_vindex_reserve(struct tbd_vindex *x);
/* Append v, numbered above every version in x, after tbd_vindex_reserve(). */
void tbd_vindex_append(struct tbd_vindex *x, struct tbd_version *v);
/* The slot of the first version numbered number or more (x->end: none). */
uint32_t tbd_vindex_lower(const struct tbd_vindex *x, uint64_t number);
/* The version numbered number, or NULL. */
struct tbd_version *tbd_vindex_find(const struct tbd_vindex *x,
                                    uint64_t number);
/* Take v (which must be in x) out. */
void tbd_vindex_remove(struct tbd_vindex *x, const struct tbd_version *v);
void tbd_vindex_free(struct tbd_vindex *x);

#endif /* TBD_VINDEX_H */
