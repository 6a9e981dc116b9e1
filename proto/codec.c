/* Protobuf-c messages to and from bytes. Knows nothing about sockets. */
#include "tb_proto.h"

#include <tensorbroker/errors.h>

int tb__request_decode(const uint8_t *buf, size_t len, tb__request **out) {
  tb__request *m;

  if (buf == NULL || len == 0 || len > TB__MAX_MESSAGE_HARD)
    return TB_EPROTO;
  m = tensorbroker__v1__request__unpack(NULL, len, buf);
  if (m == NULL)
    return TB_EPROTO;
  if (m->body_case == TENSORBROKER__V1__REQUEST__BODY__NOT_SET) {
    tensorbroker__v1__request__free_unpacked(m, NULL);
    return TB_EPROTO;
  }
  *out = m;
  return 0;
}

void tb__request_free(tb__request *m) {
  if (m != NULL)
    tensorbroker__v1__request__free_unpacked(m, NULL);
}

int tb__server_message_decode(const uint8_t *buf, size_t len,
                              tb__server_message **out) {
  tb__server_message *m;

  if (buf == NULL || len == 0 || len > TB__MAX_MESSAGE_HARD)
    return TB_EPROTO;
  m = tensorbroker__v1__server_message__unpack(NULL, len, buf);
  if (m == NULL)
    return TB_EPROTO;
  if (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY__NOT_SET ||
      (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY &&
       m->reply == NULL) ||
      (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE &&
       (m->notice == NULL ||
        m->notice->body_case == TENSORBROKER__V1__NOTICE__BODY__NOT_SET))) {
    tensorbroker__v1__server_message__free_unpacked(m, NULL);
    return TB_EPROTO;
  }
  *out = m;
  return 0;
}

void tb__server_message_free(tb__server_message *m) {
  if (m != NULL)
    tensorbroker__v1__server_message__free_unpacked(m, NULL);
}

long tb__request_encode(const tb__request *m, uint8_t *buf, size_t cap) {
  size_t n = tensorbroker__v1__request__get_packed_size(m);

  if (n > cap)
    return TB_ELIMIT;
  return (long)tensorbroker__v1__request__pack(m, buf);
}

long tb__server_message_encode(const tb__server_message *m, uint8_t *buf,
                               size_t cap) {
  size_t n = tensorbroker__v1__server_message__get_packed_size(m);

  if (n > cap)
    return TB_ELIMIT;
  return (long)tensorbroker__v1__server_message__pack(m, buf);
}
