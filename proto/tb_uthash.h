/* SPDX-License-Identifier: Apache-2.0 */
/* uthash with a cheaper hash for 8-byte keys, shared by the daemon and the
 * library. Their 8-byte keys are ids the daemon hands out in sequence
 * (sessions, leases, buffers, events), which nobody chooses, so a
 * multiplicative hash spreads them well; Jenkins' hash, uthash's default,
 * costs ~60 instructions a lookup, and the acquire/release path makes
 * four. Other keys (channel names) keep Jenkins' hash, except a name of
 * exactly 8 bytes (neither hash is keyed against chosen collisions).
 * Include this instead of <uthash.h>, after any uthash_* configuration. */
#ifndef TB_UTHASH_H
#define TB_UTHASH_H

#include <stdint.h>
#include <string.h>

static inline unsigned tb__hash8(const void *key) {
  uint64_t k;

  memcpy(&k, key, sizeof(k));
  /* the high half of the Fibonacci product mixes every key bit; uthash
   * takes a bucket from its low bits */
  return (unsigned)((k * 0x9E3779B97F4A7C15ull) >> 32);
}

static inline int tb__keycmp8(const void *a, const void *b) {
  uint64_t x, y;

  memcpy(&x, a, sizeof(x));
  memcpy(&y, b, sizeof(y));
  return x != y;
}

#define HASH_FUNCTION(keyptr, keylen, hashv)                                 \
  do {                                                                       \
    if ((keylen) == 8)                                                       \
      (hashv) = tb__hash8(keyptr);                                           \
    else                                                                     \
      HASH_JEN(keyptr, keylen, hashv);                                       \
  } while (0)
#define HASH_KEYCMP(a, b, n)                                                 \
  ((n) == 8 ? tb__keycmp8((a), (b)) : memcmp((a), (b), (n)))

#include <uthash.h>

#endif /* TB_UTHASH_H */
