/* SPDX-License-Identifier: Apache-2.0 */
/* The emit callback's capture list shared by the daemon unit tests
 * (capture.h). */
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "tb_test.h"

#include "capture.h"

struct tbt_cap *tbt_caps;

void tbt_cap_emit(void *ud, struct tbd_session *s, const tb__server_message *m,
                  const int *fds, int nfds) {
  struct tbt_cap *c = calloc(1, sizeof(*c)), **p;
  size_t n = tensorbroker__v1__server_message__get_packed_size(m);
  uint8_t *buf = malloc(n + 1);

  (void)ud;
  assert_non_null(c);
  assert_non_null(buf);
  /* through the real codec, as a client would see it */
  assert_int_equal(tb__server_message_encode(m, buf, n + 1), (long)n);
  assert_tb_ok(tb__server_message_decode(buf, n, &c->m));
  free(buf);
  c->sid = tbd_session_id(s);
  c->fd = -1;
  assert_true(nfds <= 1);
  if (nfds == 1) {
    c->fd = fcntl(fds[0], F_DUPFD_CLOEXEC, 0);
    assert_true(c->fd >= 0);
  }
  for (p = &tbt_caps; *p != NULL; p = &(*p)->next)
    ;
  *p = c;
}

void tbt_cap_free(struct tbt_cap *c) {
  if (c->fd >= 0)
    close(c->fd);
  tb__server_message_free(c->m);
  free(c);
}

void tbt_caps_clear(void) {
  while (tbt_caps != NULL) {
    struct tbt_cap *c = tbt_caps;
    tbt_caps = c->next;
    tbt_cap_free(c);
  }
}

void tbt_registry_free(struct tbd_registry *r) {
  tbd_registry_free(r);
  tbt_caps_clear();
}

int tbt_caps_count(struct tbd_session *s) {
  int n = 0;
  for (struct tbt_cap *c = tbt_caps; c != NULL; c = c->next)
    n += c->sid == tbd_session_id(s);
  return n;
}

static bool is_reply(const struct tbt_cap *c, uint64_t id) {
  return c->m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY &&
         c->m->reply->request_id == id;
}

static bool is_notice(const struct tbt_cap *c, uint64_t which) {
  return c->m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE &&
         (uint64_t)c->m->notice->body_case == which;
}

static struct tbt_cap *unlink_first(bool (*pred)(const struct tbt_cap *,
                                                 uint64_t),
                                    uint64_t sid, uint64_t arg) {
  for (struct tbt_cap **p = &tbt_caps; *p != NULL; p = &(*p)->next) {
    struct tbt_cap *c = *p;
    if (c->sid == sid && pred(c, arg)) {
      *p = c->next;
      return c;
    }
  }
  return NULL;
}

struct tbt_cap *tbt_cap_take_reply(struct tbd_session *s, uint64_t id) {
  return unlink_first(is_reply, tbd_session_id(s), id);
}

struct tbt_cap *tbt_cap_take_notice(struct tbd_session *s, int which) {
  return unlink_first(is_notice, tbd_session_id(s), (uint64_t)which);
}

int tbt_cap_drop_notices(struct tbd_session *s, int which) {
  int n = 0;
  struct tbt_cap *c;
  while ((c = tbt_cap_take_notice(s, which)) != NULL) {
    tbt_cap_free(c);
    n++;
  }
  return n;
}
