/* SPDX-License-Identifier: Apache-2.0 */
/* tb-bench: a static host producer shared by scenarios 2 and 3. */
#ifndef TB_BENCH_PRODUCER_H
#define TB_BENCH_PRODUCER_H

#include "bench.h"

#define TBB_SMALL_ELEMS 64

struct tbb_producer {
  pid_t pid;
  struct tbb_gate gate;
};

/* Spawn a producer that publishes float32[64] once on "<prefix>/0" ..
 * "<prefix>/<n-1>" and returns once all are published. Create it before any
 * child that must not inherit its gate. */
int tbb_producer_start(struct tbb_producer *p, const char *sock,
                       const char *prefix, long n);
void tbb_producer_stop(struct tbb_producer *p);

#endif
