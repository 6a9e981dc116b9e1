/* SPDX-License-Identifier: Apache-2.0 */
/* The refcounted connection (struct tb__conn): the client and every
 * acquired tensor hold a reference; the last one frees the mapping cache
 * and the memory kinds' state of the connection. */
#include "client_internal.h"

#include <stdlib.h>
#include <unistd.h>

#include "kind.h"

/* ---- the refcounted connection ---- */

void tb__conn_ref(struct tb__conn *k) {
  pthread_mutex_lock(&k->lock);
  k->refs++;
  pthread_mutex_unlock(&k->lock);
}

int tb__conn_unref_locked(struct tb__conn *k) {
  if (--k->refs != 0)
    return 0;
  tb__map_drop_unused_locked(k);
  return 1;
}

void tb__conn_unref(struct tb__conn *k) {
  int last;

  if (k == NULL)
    return;
  pthread_mutex_lock(&k->lock);
  last = tb__conn_unref_locked(k);
  pthread_mutex_unlock(&k->lock);
  if (last)
    tb__conn_free(k);
}

void tb__conn_free(struct tb__conn *k) {
  free(k->spare_lease);
  tb__kinds_conn_free(k);
  tb__fork_close(k);
  pthread_mutex_destroy(&k->lock);
  free(k);
}
