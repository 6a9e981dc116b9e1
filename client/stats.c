/* SPDX-License-Identifier: Apache-2.0 */
/* tb-bench's acquire counters (stats.h): per thread, so that counting
 * costs no shared cache line, and only in a thread that has asked for
 * them, so that an application's acquires read no clocks for it. Compiled
 * into the TB_STATS build only. */
#include "stats.h"

#ifdef TB_STATS
_Thread_local struct tb_acquire_counters tb__acq;
_Thread_local int tb__acq_on;
_Thread_local int tb__acq_waiting;
_Thread_local uint64_t tb__acq_mark;

void tb__acquire_counters(struct tb_acquire_counters *out) {
  tb__acq_on = 1;
  *out = tb__acq;
}
#endif
