/* SPDX-License-Identifier: Apache-2.0 */
/* A number for each thread, never handed to another (client_internal.h). */
#include "client_internal.h"

#include <stdatomic.h>
#include <stdint.h>

uint64_t tb__thread_id(void) {
  static atomic_uint_least64_t next = 1;
  static _Thread_local uint64_t id;

  if (id == 0)
    id = atomic_fetch_add_explicit(&next, 1, memory_order_relaxed);
  return id;
}
