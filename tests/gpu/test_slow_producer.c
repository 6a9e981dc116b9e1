/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: a consumer reads correct data only because its stream waits for the
 * producer's event, and the test shows it can tell.
 *
 * The producer's buffer holds OLD (written and synchronised). A slow
 * kernel (300 ms) then writes NEW, and the version is published on that
 * kernel's stream at once. The consumer acquires the version twice, at
 * once: on stream A (the library makes A wait on the producer's event) and
 * with stream -1 (no wait), and on both streams launches a kernel counting
 * words != NEW. Stream -1's count must be non-zero (it ran while the
 * producer's kernel was still spinning: the read is stale, so the timing
 * window is real), stream A's must be zero. Both children are gpu_common's
 * tbg_slow_producer and tbg_slow_consumer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "gpu_common.h"

#define N (4u << 20)
#define SPIN_MS 300
#define OLD 0x01D01D01u
#define NEW 0x0E30E30Eu

static struct tbt_daemon daemon_;

static const struct tbg_slow slow = {
    .daemon = &daemon_,
    .channel = "gpu/slow",
    .n = N,
    .old_value = OLD,
    .new_value = NEW,
    .spin_ms = SPIN_MS,
    .producer_ordinal = 0,
    .consumer_ordinal = 0,
    .consumer_device = -1,
    .consumer_label = "consumer",
};

static void slow_producer(void **state) {
  (void)state;
  tbg_slow_run(&slow);
}

TBG_MAIN(cmocka_unit_test(slow_producer))
