/* SPDX-License-Identifier: Apache-2.0 */
/* uthash configured for the daemon: allocations go through tbd_malloc and an
 * allocation failure while adding leaves the table as it was and sets
 * tbd_hash_oom instead of exiting. */
#ifndef TBD_HASH_H
#define TBD_HASH_H

#include "alloc.h"

extern int tbd_hash_oom;

#define HASH_NONFATAL_OOM 1
#define uthash_malloc(sz) tbd_malloc(sz)
#define uthash_free(ptr, sz) tbd_free(ptr)
#define uthash_nonfatal_oom(obj)                                             \
  do {                                                                       \
    tbd_hash_oom = 1;                                                        \
  } while (0)

#include "tb_uthash.h" /* <uthash.h>, cheaper for 8-byte keys */
#include <utlist.h>

/* Usage: tbd_hash_oom = 0; HASH_ADD(...); if (tbd_hash_oom) <failed>; */

#endif /* TBD_HASH_H */
