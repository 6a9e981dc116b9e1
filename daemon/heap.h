/* SPDX-License-Identifier: Apache-2.0 */
/* An intrusive binary min-heap: the registry keeps its parked waits in two
 * (by deadline, for the loop's timer; by version, for NEXT acquires after
 * a version not published yet). A node lives inside its object and knows
 * its slot, so that any node leaves in O(log n); the top is read in O(1).
 * The array grows by doubling; tbd_heap_reserve() makes room before a
 * caller commits, so that a push never fails. */
#ifndef TBD_HEAP_H
#define TBD_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TBD_HEAP_NONE UINT32_MAX /* tbd_heap_node.slot when not in a heap */

struct tbd_heap_node {
  uint32_t slot;
};

typedef bool (*tbd_heap_less_fn)(const struct tbd_heap_node *a,
                                 const struct tbd_heap_node *b);

struct tbd_heap {
  struct tbd_heap_node **a;
  uint32_t n, cap;
  tbd_heap_less_fn less; /* a strict order: ties broken by the caller */
};

void tbd_heap_init(struct tbd_heap *h, tbd_heap_less_fn less);
/* Free the array (the nodes are the caller's). */
void tbd_heap_free(struct tbd_heap *h);
/* Room for one more node: 0 or TB_ENOMEM (the heap is unchanged then). */
int tbd_heap_reserve(struct tbd_heap *h);
/* Add node after a successful tbd_heap_reserve(). */
void tbd_heap_push(struct tbd_heap *h, struct tbd_heap_node *node);
/* Take node out (it must be in h). */
void tbd_heap_remove(struct tbd_heap *h, struct tbd_heap_node *node);

/* The least node, or NULL. */
static inline struct tbd_heap_node *tbd_heap_top(const struct tbd_heap *h) {
  return h->n > 0 ? h->a[0] : NULL;
}

#endif /* TBD_HEAP_H */
