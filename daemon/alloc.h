/* SPDX-License-Identifier: Apache-2.0 */
/* Every allocation of the daemon's state goes through here, so that tests
 * can fail the Nth one (curl's torture mode) and check that nothing changed.
 * The protobuf-c allocator and uthash use the same functions. */
#ifndef TBD_ALLOC_H
#define TBD_ALLOC_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

void *tbd_malloc(size_t n);
void *tbd_calloc(size_t nmemb, size_t size);
void tbd_free(void *p);
char *tbd_strdup(const char *s);
/* n bytes of p; a zero-length copy still returns a valid pointer. */
void *tbd_memdup(const void *p, size_t n);

/* Test hook: fail the nth allocation from now on (1 = the next one), and
 * every one after it when sticky is set. 0 turns the hook off. */
void tbd_alloc_fail_at(unsigned long nth, int sticky);
/* Allocations made (and failed) since the hook was last set. */
unsigned long tbd_alloc_count(void);

/* A protobuf-c allocator that uses tbd_malloc/tbd_free. */
extern ProtobufCAllocator tbd_pb_allocator;

#endif /* TBD_ALLOC_H */
