/* SPDX-License-Identifier: Apache-2.0 */
/* Requests to the registry shared by the daemon unit tests (request.h). */
#include <stdio.h>

#include "tb_test.h"

#include "request.h"

char tbt_last_message[512];

static uint64_t next_req = 1;

uint64_t tbt_req_id(void) { return next_req++; }

int tbt_req_send(struct tbd_registry *r, struct tbd_session *s,
                 tb__request *q, int *fds, int nfds, struct tbt_cap **out) {
  struct tbt_cap *c;
  int rc, st;

  if (out != NULL)
    *out = NULL;
  if (q->request_id == 0)
    q->request_id = tbt_req_id();
  rc = tbd_session_request(r, s, q, fds, nfds);
  c = tbt_cap_take_reply(s, q->request_id);
  tbt_last_message[0] = '\0';
  if (c != NULL)
    snprintf(tbt_last_message, sizeof(tbt_last_message), "%s",
             c->m->reply->message ? c->m->reply->message : "");
  if (rc < 0) {
    if (c != NULL)
      tbt_cap_free(c);
    return rc;
  }
  if (c == NULL)
    return TBT_PARKED;
  st = c->m->reply->status;
  if (out != NULL)
    *out = c;
  else
    tbt_cap_free(c);
  return st;
}

int tbt_req_hello(struct tbd_registry *r, struct tbd_session *s,
                  const char *name) {
  tb__request q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Hello h = TENSORBROKER__V1__HELLO__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
  q.hello = &h;
  h.protocol_version = 1;
  h.client_name = (char *)name;
  return tbt_req_send(r, s, &q, NULL, 0, NULL);
}

int tbt_req_release(struct tbd_registry *r, struct tbd_session *s,
                    uint64_t lease, uint64_t done, bool want_reply) {
  tb__request q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Release rl = TENSORBROKER__V1__RELEASE__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_RELEASE;
  q.release = &rl;
  rl.lease_id = lease;
  rl.done_event_id = done;
  rl.want_reply = want_reply;
  if (!want_reply)
    return tbd_session_request(r, s, &q, NULL, 0); /* request id 0 */
  return tbt_req_send(r, s, &q, NULL, 0, NULL);
}

int tbt_req_subscribe(struct tbd_registry *r, struct tbd_session *s,
                      const char *name, bool sub) {
  tb__request q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Subscribe su = TENSORBROKER__V1__SUBSCRIBE__INIT;
  Tensorbroker__V1__Unsubscribe un = TENSORBROKER__V1__UNSUBSCRIBE__INIT;

  su.channel = un.channel = (char *)name;
  if (sub) {
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_SUBSCRIBE;
    q.subscribe = &su;
  } else {
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_UNSUBSCRIBE;
    q.unsubscribe = &un;
  }
  return tbt_req_send(r, s, &q, NULL, 0, NULL);
}
