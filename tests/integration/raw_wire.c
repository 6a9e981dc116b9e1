/* SPDX-License-Identifier: Apache-2.0 */
/* Raw protocol helpers for the integration tests (raw_wire.h). */
#include "tb_test.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "raw_wire.h"
#include "fake_cuda.h"

static bool in_child;

void raw_child(void) { in_child = true; }

static void raw_fail(const char *file, int line, const char *what) {
  if (in_child) {
    fprintf(stderr, "[child %d] %s:%d: check failed: %s\n", (int)getpid(),
            file, line, what);
    _exit(2);
  }
  fail_msg("%s:%d: check failed: %s", file, line, what);
}

#define RAW_CHECK(cond)                                                      \
  do {                                                                       \
    if (!(cond))                                                             \
      raw_fail(__FILE__, __LINE__, #cond);                                   \
  } while (0)

int raw_connect(const struct tbt_daemon *d) {
  struct sockaddr_un a;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

  RAW_CHECK(fd >= 0);
  memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof(a.sun_path), "%s", d->sock);
  RAW_CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
  return fd;
}

void raw_send_req(int fd, tb__request *r) {
  uint8_t buf[4096];
  long n = tb__request_encode(r, buf, sizeof(buf));

  RAW_CHECK(n >= 0);
  RAW_CHECK(tb__wire_send(fd, buf, (size_t)n, NULL, 0, 0) == 0);
}

tb__server_message *raw_recv_fds(int fd, int *keep, int max, int *nkept) {
  static uint8_t buf[TB__MAX_MESSAGE_HARD];
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int fds[TB__MAX_FDS], nfds = 0;
  tb__server_message *m = NULL;
  long n;

  *nkept = 0;
  RAW_CHECK(poll(&p, 1, TBT_TIMEOUT_MS) == 1);
  n = tb__wire_recv(fd, buf, sizeof(buf), fds, &nfds, 0);
  if (n == 0 || n == -ECONNRESET)
    return NULL;
  RAW_CHECK(n >= 0);
  for (int i = 0; i < nfds; i++) {
    if (i < max)
      keep[(*nkept)++] = fds[i];
    else
      close(fds[i]);
  }
  RAW_CHECK(tb__server_message_decode(buf, (size_t)n, &m) == 0);
  return m;
}

tb__server_message *raw_recv(int fd) {
  int n;

  return raw_recv_fds(fd, NULL, 0, &n);
}

bool raw_pending(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int n = poll(&p, 1, 0);

  RAW_CHECK(n >= 0);
  return n == 1;
}

tb__server_message *raw_hello_reply(int fd, const struct raw_hello_opts *o) {
  Tensorbroker__V1__Hello h = TENSORBROKER__V1__HELLO__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  tb__server_message *m;

  h.protocol_version = 1;
  h.client_name = "raw";
  h.says_goodbye = o->says_goodbye;
  if (o->cuda)
    h.memory_kinds =
        1u << TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC;
  h.prefetch = o->prefetch;
  h.channels = (char **)o->channels;
  h.n_channels = o->n_channels;
  r.request_id = 1;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
  r.hello = &h;
  raw_send_req(fd, &r);
  m = raw_recv(fd);
  RAW_CHECK(m != NULL);
  RAW_CHECK(m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY);
  RAW_CHECK(m->reply->status == 0);
  RAW_CHECK(m->reply->request_id == 1);
  RAW_CHECK(m->reply->body_case == TENSORBROKER__V1__REPLY__BODY_HELLO);
  RAW_CHECK(m->reply->hello->session_id != 0);
  return m;
}

uint64_t raw_hello_as(int fd, bool says_goodbye, bool cuda) {
  struct raw_hello_opts o = {.says_goodbye = says_goodbye, .cuda = cuda};
  tb__server_message *m = raw_hello_reply(fd, &o);
  uint64_t id = m->reply->hello->session_id;

  tb__server_message_free(m);
  return id;
}

uint64_t raw_hello(int fd) { return raw_hello_as(fd, false, false); }

tb__server_message *raw_call(int fd, tb__request *r, uint64_t id) {
  tb__server_message *m;

  r->request_id = id;
  raw_send_req(fd, r);
  while ((m = raw_recv(fd)) != NULL &&
         m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE)
    tb__server_message_free(m);
  RAW_CHECK(m != NULL);
  RAW_CHECK(m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY);
  RAW_CHECK(m->reply->request_id == id);
  return m;
}

tb__server_message *raw_ok(int fd, tb__request *r, uint64_t id) {
  tb__server_message *m = raw_call(fd, r, id);

  RAW_CHECK(m->reply->status == 0);
  return m;
}

uint64_t raw_cuda_buffer(int fd, uint64_t id, uint8_t tag) {
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  struct tbt_fake_cuda f;
  tb__server_message *m;
  uint64_t bid;

  tbt_fake_cuda_init(&f, tag);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  r.buffer_register = &f.reg;
  m = raw_ok(fd, &r, id);
  bid = m->reply->buffer_register->buffer_id;
  tb__server_message_free(m);
  return bid;
}

uint64_t raw_publish_depth(int fd, uint64_t id, const char *ch, uint64_t bid,
                           uint64_t ready, uint32_t depth) {
  Tensorbroker__V1__Publish p = TENSORBROKER__V1__PUBLISH__INIT;
  Tensorbroker__V1__Layout l = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__Device d = TENSORBROKER__V1__DEVICE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  tb__server_message *m;
  int64_t shape[1] = {16};
  uint64_t v;

  p.channel = (char *)ch;
  p.buffer_id = bid;
  p.layout = &l;
  p.ready_event_id = ready;
  p.history_depth = depth;
  l.device = &d;
  d.type = kDLCUDA;
  l.dtype_code = kDLFloat;
  l.dtype_bits = 32;
  l.dtype_lanes = 1;
  l.shape = shape;
  l.n_shape = 1;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_PUBLISH;
  r.publish = &p;
  m = raw_ok(fd, &r, id);
  RAW_CHECK(m->reply->body_case == TENSORBROKER__V1__REPLY__BODY_PUBLISH);
  v = m->reply->publish->version;
  tb__server_message_free(m);
  return v;
}

uint64_t raw_publish(int fd, uint64_t id, const char *ch, uint64_t bid,
                     uint64_t ready) {
  return raw_publish_depth(fd, id, ch, bid, ready, 0);
}

void raw_send_acquire(int fd, uint64_t id, const char *ch, int mode,
                      uint64_t version, int64_t timeout_ms) {
  Tensorbroker__V1__Acquire a = TENSORBROKER__V1__ACQUIRE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;

  a.channel = (char *)ch;
  a.mode = (Tensorbroker__V1__AcquireMode)mode;
  a.version = version;
  a.timeout_ms = timeout_ms;
  r.request_id = id;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  r.acquire = &a;
  raw_send_req(fd, &r);
}

void raw_goodbye(int fd) {
  Tensorbroker__V1__Goodbye g = TENSORBROKER__V1__GOODBYE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;

  r.body_case = TENSORBROKER__V1__REQUEST__BODY_GOODBYE;
  r.goodbye = &g;
  raw_send_req(fd, &r);
}
