/* SPDX-License-Identifier: Apache-2.0 */
/* Intrusive binary min-heap (heap.h). */
#include "heap.h"

#include <assert.h>
#include <string.h>

#include <tensorbroker/errors.h>

#include "alloc.h"

void tbd_heap_init(struct tbd_heap *h, tbd_heap_less_fn less) {
  h->a = NULL;
  h->n = h->cap = 0;
  h->less = less;
}

void tbd_heap_free(struct tbd_heap *h) {
  tbd_free(h->a);
  h->a = NULL;
  h->n = h->cap = 0;
}

int tbd_heap_reserve(struct tbd_heap *h) {
  struct tbd_heap_node **a;
  uint32_t cap;

  if (h->n < h->cap)
    return 0;
  if (h->cap > UINT32_MAX / 4)
    return TB_ENOMEM;
  cap = h->cap == 0 ? 16 : h->cap * 2;
  a = tbd_malloc(cap * sizeof(*a));
  if (a == NULL)
    return TB_ENOMEM;
  if (h->n > 0)
    memcpy(a, h->a, h->n * sizeof(*a));
  tbd_free(h->a);
  h->a = a;
  h->cap = cap;
  return 0;
}

static void put(struct tbd_heap *h, uint32_t i, struct tbd_heap_node *node) {
  h->a[i] = node;
  node->slot = i;
}

static void sift_up(struct tbd_heap *h, uint32_t i) {
  struct tbd_heap_node *node = h->a[i];

  while (i > 0) {
    uint32_t parent = (i - 1) / 2;
    if (!h->less(node, h->a[parent]))
      break;
    put(h, i, h->a[parent]);
    i = parent;
  }
  put(h, i, node);
}

static void sift_down(struct tbd_heap *h, uint32_t i) {
  struct tbd_heap_node *node = h->a[i];

  for (;;) {
    uint32_t child = 2 * i + 1;
    if (child >= h->n)
      break;
    if (child + 1 < h->n && h->less(h->a[child + 1], h->a[child]))
      child++;
    if (!h->less(h->a[child], node))
      break;
    put(h, i, h->a[child]);
    i = child;
  }
  put(h, i, node);
}

void tbd_heap_push(struct tbd_heap *h, struct tbd_heap_node *node) {
  assert(h->n < h->cap);
  put(h, h->n, node);
  h->n++;
  sift_up(h, h->n - 1);
}

void tbd_heap_remove(struct tbd_heap *h, struct tbd_heap_node *node) {
  uint32_t i = node->slot;
  struct tbd_heap_node *moved;

  assert(i < h->n && h->a[i] == node);
  node->slot = TBD_HEAP_NONE;
  h->n--;
  if (i == h->n)
    return;
  /* the last node takes the hole and moves whichever way it must */
  moved = h->a[h->n];
  put(h, i, moved);
  sift_down(h, i);
  if (moved->slot == i)
    sift_up(h, i);
}
