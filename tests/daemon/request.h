/* SPDX-License-Identifier: Apache-2.0 */
/* Requests to the registry for the daemon unit tests: send one as the
 * server hands it over (decoded, with its descriptors) and take its reply
 * off the capture list (capture.h), and the requests that more than one
 * test file builds the same way. Single-threaded, as the tests are; a
 * failed check fails the test. */
#ifndef TBT_REQUEST_H
#define TBT_REQUEST_H

#include <stdbool.h>
#include <stdint.h>

#include "capture.h"
#include "registry.h"
#include "tb_proto.h"

/* What tbt_req_send returns when no reply came: the request parked. */
#define TBT_PARKED 1

/* The message of the reply tbt_req_send took last, "" when it took none.
 * A test that takes a parked request's reply itself may write it too. */
extern char tbt_last_message[512];

/* A request id not handed out before in this process. Ids come from one
 * counter so that a reply to a parked request is never taken for the
 * reply to a later one. */
uint64_t tbt_req_id(void);

/* Send q from s with fds (nfds of them, which the registry then owns);
 * q->request_id gets tbt_req_id() when it is 0. Returns the registry's
 * error when the request failed (the session must then be closed), else
 * TBT_PARKED when no reply came, else the reply's status. When out is not
 * NULL, *out is the reply (whatever its status) if the request did not
 * fail and a reply came, for the caller to free with tbt_cap_free; NULL
 * otherwise. */
int tbt_req_send(struct tbd_registry *r, struct tbd_session *s,
                 tb__request *q, int *fds, int nfds, struct tbt_cap **out);

/* Hello, protocol version 1, as client name; the status. */
int tbt_req_hello(struct tbd_registry *r, struct tbd_session *s,
                  const char *name);

/* Release lease with done event done (0: none). With want_reply, the
 * status as tbt_req_send returns it; without, a one-way release: what
 * tbd_session_request returned, and no reply is looked for. */
int tbt_req_release(struct tbd_registry *r, struct tbd_session *s,
                    uint64_t lease, uint64_t done, bool want_reply);

/* Subscribe to channel name (sub), or unsubscribe from it; the status. */
int tbt_req_subscribe(struct tbd_registry *r, struct tbd_session *s,
                      const char *name, bool sub);

#endif /* TBT_REQUEST_H */
