/* SPDX-License-Identifier: Apache-2.0 */
/* What the example producer and consumer agree on: the metadata each
 * version carries, the test pattern and the checksum. */
#ifndef TB_EXAMPLE_FRAME_H
#define TB_EXAMPLE_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Sent as the version's metadata (both sides run on one node, so the
 * struct's layout is the same). */
struct frame_meta {
  uint64_t frame_id;  /* 0, 1, 2, ... */
  uint64_t frames;    /* how many the producer will publish in all */
  uint64_t t_pub_ns;  /* CLOCK_MONOTONIC just before tb_channel_publish */
  uint64_t checksum;  /* frame_checksum() of the tensor's bytes */
};

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A pattern that differs in every frame and every element. */
static inline void frame_fill(float *px, size_t n, uint64_t frame_id) {
  for (size_t i = 0; i < n; i++)
    px[i] = (float)((frame_id * 131u + i * 7u) % 65521u);
}

/* 64-bit checksum of n bytes (a multiply-add over 8-byte words, then the
 * tail). Not cryptographic; catches torn or stale frames. */
static inline uint64_t frame_checksum(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull, w;
  size_t i = 0;

  for (; i + 8 <= n; i += 8) {
    __builtin_memcpy(&w, b + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < n; i++)
    h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

#endif
