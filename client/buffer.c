/* SPDX-License-Identifier: Apache-2.0 */
/* Buffer registration: telling the daemon about a producer's buffer
 * (BufferRegister, with the memfd of a host buffer or the IPC handle of a
 * CUDA allocation) and that it is gone (BufferUnregister). Each memory kind
 * (kind.h) fills the request; this file makes the round trip. */
#include "client_internal.h"

#include <unistd.h>

int tb__buffer_register(struct tb_client *c,
                        Tensorbroker__V1__BufferRegister *br, int fd,
                        uint64_t *id) {
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  tb__server_message *m = NULL;
  int fds[TB__MAX_FDS], nfds = 0, rc;

  r.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  r.buffer_register = br;
  rc = tb__call(c, &r, fd >= 0 ? &fd : NULL, fd >= 0, 0, &m, fds, &nfds);
  if (rc < 0)
    return rc;
  for (int i = 0; i < nfds; i++)
    close(fds[i]);
  if (m->reply->body_case != TENSORBROKER__V1__REPLY__BODY_BUFFER_REGISTER ||
      m->reply->buffer_register == NULL ||
      m->reply->buffer_register->buffer_id == 0) {
    tb__msg_free(c, m);
    return tb__set_error(c, TB_EPROTO, "BufferRegister answered without an id");
  }
  *id = m->reply->buffer_register->buffer_id;
  tb__msg_free(c, m);
  return 0;
}

int tb__buffer_unregister(struct tb_client *c, uint64_t id) {
  Tensorbroker__V1__BufferUnregister bu =
      TENSORBROKER__V1__BUFFER_UNREGISTER__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  tb__server_message *m = NULL;
  int fds[TB__MAX_FDS], nfds = 0, rc;

  bu.buffer_id = id;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_UNREGISTER;
  r.buffer_unregister = &bu;
  rc = tb__call(c, &r, NULL, 0, 0, &m, fds, &nfds);
  if (rc == 0) {
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    tb__msg_free(c, m);
  }
  return rc;
}
