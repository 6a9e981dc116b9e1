/* SPDX-License-Identifier: Apache-2.0 */
/* Consumer mapping cache: one mapping per daemon buffer (id + generation),
 * shared by every lease on that buffer, so a buffer is mapped (by its
 * memory kind: kind.h) once. Entries are refcounted by leases under
 * conn->lock; a retired buffer is unmapped once unused; beyond
 * TB__MAPCACHE_MAX entries the least recently used unused ones are dropped
 * and the daemon told (Forget), so it attaches the memfd again next time. */
#include "client_internal.h"

#include <stdlib.h>

#include "kind.h"

_Thread_local int tb__hash_oom;

void tb__map_release_memory(struct tb__map *m) { m->ops->unmap(m); }

static void drop_locked(struct tb__conn *k, struct tb__map *m) {
  HASH_DEL(k->maps, m);
  k->nmaps--;
  tb__map_release_memory(m);
}

struct tb__map *tb__map_get(struct tb__conn *k, uint64_t id, uint32_t gen) {
  struct tb__map *m;

  pthread_mutex_lock(&k->lock);
  HASH_FIND(hh, k->maps, &id, sizeof(id), m);
  if (m != NULL && m->generation != gen) {
    /* an older generation of a reused id: it can never be used again */
    m->retired = 1;
    if (m->refs == 0)
      drop_locked(k, m);
    m = NULL;
  }
  if (m != NULL) {
    m->refs++;
    m->stamp = ++k->map_clock;
  }
  pthread_mutex_unlock(&k->lock);
  return m;
}

static void evict_locked(struct tb__conn *k) {
  /* a parked reply may name an unused entry (client_internal.h, parked):
   * the bound is kept again by the first insert after it */
  if (k->parked)
    return;
  while (k->nmaps >= TB__MAPCACHE_MAX) {
    struct tb__map *m, *tmp, *victim = NULL;
    HASH_ITER(hh, k->maps, m, tmp) {
      if (m->refs == 0 && (victim == NULL || m->stamp < victim->stamp))
        victim = m;
    }
    if (victim == NULL)
      return; /* all in use: grow past the bound rather than fail a lease */
    {
      Tensorbroker__V1__Forget fg = TENSORBROKER__V1__FORGET__INIT;
      tb__request r = TENSORBROKER__V1__REQUEST__INIT;
      fg.buffer_id = victim->buffer_id;
      r.body_case = TENSORBROKER__V1__REQUEST__BODY_FORGET;
      r.forget = &fg;
      (void)tb__conn_send_oneway_locked(k, &r);
    }
    drop_locked(k, victim);
  }
}

void tb__map_insert(struct tb__conn *k, struct tb__map *m) {
  struct tb__map *old;

  pthread_mutex_lock(&k->lock);
  HASH_FIND(hh, k->maps, &m->buffer_id, sizeof(m->buffer_id), old);
  if (old != NULL) {
    /* Replaced by a newer generation: the old entry leaves the table and
     * its leases unmap it when they end. */
    HASH_DEL(k->maps, old);
    k->nmaps--;
    if (old->refs == 0)
      tb__map_release_memory(old);
    else
      old->retired = 2; /* 2: retired and no longer in the table */
  }
  evict_locked(k);
  m->refs = 1;
  m->stamp = ++k->map_clock;
  tb__hash_oom = 0;
  HASH_ADD(hh, k->maps, buffer_id, sizeof(m->buffer_id), m);
  if (tb__hash_oom)
    m->retired = 2; /* not cached: unmapped when its leases end */
  else
    k->nmaps++;
  pthread_mutex_unlock(&k->lock);
}

void tb__map_put_locked(struct tb__conn *k, struct tb__map *m) {
  if (--m->refs > 0)
    return;
  if (m->retired == 2) {
    tb__map_release_memory(m);
    return;
  }
  if (m->retired || k->closed)
    drop_locked(k, m);
}

void tb__map_retire(struct tb__conn *k, uint64_t id, uint32_t gen) {
  struct tb__map *m;

  pthread_mutex_lock(&k->lock);
  HASH_FIND(hh, k->maps, &id, sizeof(id), m);
  if (m != NULL && m->generation <= gen) {
    m->retired = 1;
    if (m->refs == 0)
      drop_locked(k, m);
  }
  pthread_mutex_unlock(&k->lock);
}

void tb__map_drop_unused_locked(struct tb__conn *k) {
  struct tb__map *m, *tmp;

  HASH_ITER(hh, k->maps, m, tmp) {
    if (m->refs == 0)
      drop_locked(k, m);
  }
}
