/* SPDX-License-Identifier: Apache-2.0 */
/* What the registry emits, captured for the daemon unit tests: pass
 * tbt_cap_emit to tbd_registry_new and every reply and notice lands on
 * tbt_caps, in order, after a round trip through the real codec (as a
 * client would see it) and with its descriptor, if any, duplicated.
 * Single-threaded, as the tests are; a failed check fails the test. */
#ifndef TBT_CAPTURE_H
#define TBT_CAPTURE_H

#include <stdint.h>

#include "registry.h"
#include "tb_proto.h"

/* One message to one session. */
struct tbt_cap {
  uint64_t sid;          /* tbd_session_id of the session it went to */
  tb__server_message *m; /* decoded copy; tbt_cap_free frees it */
  int fd;                /* our duplicate of the attached descriptor, or -1 */
  struct tbt_cap *next;
};

/* Captured messages not yet taken, oldest first. */
extern struct tbt_cap *tbt_caps;

/* A tbd_emit_fn that appends m (and a duplicate of its one descriptor; the
 * registry never attaches more) to tbt_caps. ud is unused. */
void tbt_cap_emit(void *ud, struct tbd_session *s, const tb__server_message *m,
                  const int *fds, int nfds);

/* Free a capture taken off the list: its message and its descriptor. */
void tbt_cap_free(struct tbt_cap *c);

/* Free every capture still on the list (closing their descriptors), so a
 * test can then check that no descriptor leaked. */
void tbt_caps_clear(void);

/* Free r, then every capture still on the list: the end of a test. */
void tbt_registry_free(struct tbd_registry *r);

/* How many captures on the list went to s. */
int tbt_caps_count(struct tbd_session *s);

/* Unlink and return s's first reply to request id, or NULL when there is
 * none; the caller frees it with tbt_cap_free. */
struct tbt_cap *tbt_cap_take_reply(struct tbd_session *s, uint64_t id);

/* As tbt_cap_take_reply, for s's first notice of body case which. */
struct tbt_cap *tbt_cap_take_notice(struct tbd_session *s, int which);

/* Free all of s's notices of body case which; how many there were. */
int tbt_cap_drop_notices(struct tbd_session *s, int which);

#endif /* TBT_CAPTURE_H */
