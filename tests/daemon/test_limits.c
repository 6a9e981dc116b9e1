/* SPDX-License-Identifier: Apache-2.0 */
/* Every limit at and past its value, per session, per uid and in total
 * (docs/limits.md), at the registry: requests go in decoded, replies come
 * out through the emit callback. Also root's exemption, operator sessions,
 * the descriptor budget, closed-channel retention and reclaiming, and the
 * done-event cap. Each test frees the registry, which asserts that every
 * per-uid count went (debug builds) and, under ASan, that nothing leaked. */
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tb_test.h"

#include <dlpack/dlpack.h>

#include "acl.h"
#include "capture.h"
#include "config.h"
#include "log.h"
#include "registry.h"
#include "registry_impl.h" /* uid entries, closed list */
#include "request.h"
#include "tb_proto.h"
#include "fake_cuda.h"
#include "fd_count.h"

typedef Tensorbroker__V1__Request req_t;
typedef Tensorbroker__V1__ServerMessage msg_t;

#define LATEST TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_LATEST
#define EXACT TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_EXACT
#define PARKED TBT_PARKED

/* ---- fixtures (captured output: capture.h, requests: request.h) ---- */

static int fds_at_start;

/* c's message, for the caller to free with tb__server_message_free; c goes,
 * with any descriptor it carried. NULL when c is NULL. */
static msg_t *cap_message(struct tbt_cap *c) {
  msg_t *m;

  if (c == NULL)
    return NULL;
  m = c->m;
  c->m = NULL;
  tbt_cap_free(c);
  return m;
}

static int setup(void **state) {
  (void)state;
  tbd_log_set_level(TBD_LOG_ERROR);
  fds_at_start = tbt_count_fds();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tbt_caps_clear();
  assert_int_equal(tbt_count_fds(), fds_at_start);
  return 0;
}

/* Limits, not access: sessions of several uids share channels, as under
 * `default = open` (tests/daemon/test_acl.c tests the rules). */
static struct tbd_registry *reg_new(const struct tbd_limits *lim) {
  struct tbd_registry *r;
  struct tbd_acl *open;
  char err[200];

  assert_tb_ok(tbd_registry_new(lim, tbt_cap_emit, NULL, &r));
  assert_tb_ok(tbd_acl_new(&open));
  assert_int_equal(tbd_acl_set(open, NULL, "default", "open", err,
                               sizeof(err)), 0);
  tbd_registry_set_acl(r, open);
  return r;
}

/* Send q with a fresh request id; the status as tbt_req_send returns it.
 * The reply's message goes to tbt_last_message; the reply itself, for the
 * caller to free, to *out when out is not NULL and the status is 0. */
static int send_req(struct tbd_registry *r, struct tbd_session *s, req_t *q,
                    int *fds, int nfds, msg_t **out) {
  struct tbt_cap *c;
  int st;

  if (out != NULL)
    *out = NULL;
  q->request_id = tbt_req_id();
  st = tbt_req_send(r, s, q, fds, nfds, &c);
  if (out != NULL && st == 0)
    *out = cap_message(c);
  else if (c != NULL)
    tbt_cap_free(c);
  return st;
}

static struct tbd_session *session(struct tbd_registry *r, uid_t uid) {
  static pid_t pid = 100;
  struct tbd_session *s;

  assert_tb_ok(tbd_session_open(r, pid++, uid, uid, NULL, &s));
  assert_tb_ok(tbt_req_hello(r, s, "limits"));
  return s;
}

static int memfd(void) {
  int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  void *p;

  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 4096), 0);
  p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  assert_true(p != MAP_FAILED);
  munmap(p, 4096);
  /* sealed as a read-only buffer's must be, before and after the memfd
   * seal rules tightened (a kernel without F_SEAL_FUTURE_WRITE: shrink
   * and grow only) */
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | 0x0010) < 0)
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  return fd;
}

/* Register a memfd buffer (or, cuda, a made-up CUDA one); status, and the
 * id into *id. */
static int reg_buffer(struct tbd_registry *r, struct tbd_session *s,
                      bool cuda, uint64_t *id) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__BufferRegister b =
      TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  struct tbt_fake_cuda f;
  int fds[1];
  msg_t *m;
  int st;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  if (cuda) {
    tbt_fake_cuda_init(&f, 1);
    q.buffer_register = &f.reg;
    st = send_req(r, s, &q, NULL, 0, &m);
  } else {
    q.buffer_register = &b;
    b.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
    b.size = 4096;
    fds[0] = memfd();
    st = send_req(r, s, &q, fds, 1, &m);
  }
  if (st == 0) {
    *id = m->reply->buffer_register->buffer_id;
    tb__server_message_free(m);
  }
  return st;
}

static uint64_t buffer(struct tbd_registry *r, struct tbd_session *s) {
  uint64_t id = 0;

  assert_tb_ok(reg_buffer(r, s, false, &id));
  return id;
}

static int simple_id(struct tbd_registry *r, struct tbd_session *s,
                     int body, uint64_t id) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__BufferUnregister bu =
      TENSORBROKER__V1__BUFFER_UNREGISTER__INIT;
  Tensorbroker__V1__EventUnregister eu =
      TENSORBROKER__V1__EVENT_UNREGISTER__INIT;

  q.body_case = body;
  bu.buffer_id = id;
  eu.event_id = id;
  q.buffer_unregister = &bu;
  if (body == TENSORBROKER__V1__REQUEST__BODY_EVENT_UNREGISTER)
    q.event_unregister = &eu;
  return send_req(r, s, &q, NULL, 0, NULL);
}

static int reg_event(struct tbd_registry *r, struct tbd_session *s,
                     uint64_t *id) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__EventRegister e = TENSORBROKER__V1__EVENT_REGISTER__INIT;
  uint8_t handle[64] = {1, 2, 3};
  msg_t *m;
  int st;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_EVENT_REGISTER;
  q.event_register = &e;
  e.cuda_ipc_event_handle.data = handle;
  e.cuda_ipc_event_handle.len = sizeof(handle);
  st = send_req(r, s, &q, NULL, 0, &m);
  if (st == 0) {
    *id = m->reply->event_register->event_id;
    tb__server_message_free(m);
  }
  return st;
}

static int publish_d(struct tbd_registry *r, struct tbd_session *s,
                     const char *ch, uint64_t bid, bool cuda, uint32_t depth,
                     uint64_t *version) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Publish p = TENSORBROKER__V1__PUBLISH__INIT;
  Tensorbroker__V1__Layout l = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__Device d = TENSORBROKER__V1__DEVICE__INIT;
  int64_t shape[1] = {16};
  msg_t *m;
  int st;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_PUBLISH;
  q.publish = &p;
  p.channel = (char *)ch;
  p.buffer_id = bid;
  p.layout = &l;
  p.history_depth = depth;
  l.device = &d;
  d.type = cuda ? kDLCUDA : kDLCPU;
  l.dtype_code = kDLFloat;
  l.dtype_bits = 32;
  l.dtype_lanes = 1;
  l.shape = shape;
  l.n_shape = 1;
  st = send_req(r, s, &q, NULL, 0, &m);
  if (st == 0) {
    if (version != NULL)
      *version = m->reply->publish->version;
    tb__server_message_free(m);
  }
  return st;
}

static int publish(struct tbd_registry *r, struct tbd_session *s,
                   const char *ch, uint64_t bid) {
  return publish_d(r, s, ch, bid, false, 0, NULL);
}

/* Acquire; status, the lease into *lease (may be NULL). */
static int acquire(struct tbd_registry *r, struct tbd_session *s,
                   const char *ch, int mode, uint64_t version,
                   int64_t timeout, uint64_t *lease) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Acquire a = TENSORBROKER__V1__ACQUIRE__INIT;
  msg_t *m;
  int st;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  q.acquire = &a;
  a.channel = (char *)ch;
  a.mode = mode;
  a.version = version;
  a.timeout_ms = timeout;
  st = send_req(r, s, &q, NULL, 0, &m);
  if (st == 0) {
    if (lease != NULL)
      *lease = m->reply->acquire->lease_id;
    tb__server_message_free(m);
  }
  return st;
}

static int wait_free(struct tbd_registry *r, struct tbd_session *s,
                     const char *ch, uint64_t version, int64_t timeout,
                     msg_t **out) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__WaitFree w = TENSORBROKER__V1__WAIT_FREE__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_WAIT_FREE;
  q.wait_free = &w;
  w.channel = (char *)ch;
  w.version = version;
  w.timeout_ms = timeout;
  return send_req(r, s, &q, NULL, 0, out);
}

static uint32_t uid_count(struct tbd_registry *r, uid_t uid,
                          enum tbd_res res) {
  struct tbd_uid *u;

  HASH_FIND(hh, r->uids, &uid, sizeof(uid), u);
  return u != NULL ? u->n[res] : 0;
}

/* ---- every limit, at and past it ---- */

/* One resource: how a session takes one more and gives one back. */
struct res_ops {
  const char *what;
  /* flags of the per-session, per-uid and total limits (NULL: none) */
  const char *flag[3];
  size_t field[3]; /* in struct tbd_limits */
  /* take one more for s (the k-th of this test); returns the status and
   * keeps what it needs to give it back in *token */
  int (*take)(struct tbd_registry *r, struct tbd_session *s, int k,
              uint64_t *token);
  void (*give)(struct tbd_registry *r, struct tbd_session *s,
               uint64_t token);
};

/* the producer every lease and buffer test needs, of another uid */
static struct tbd_session *producer;

static int take_channel(struct tbd_registry *r, struct tbd_session *s, int k,
                        uint64_t *token) {
  char name[32];
  uint64_t b = 0;
  int st = reg_buffer(r, s, true, &b);

  if (st != 0)
    return st;
  snprintf(name, sizeof(name), "res/ch%d", k);
  *token = 0;
  return publish_d(r, s, name, b, true, 0, NULL);
}

static int take_buffer(struct tbd_registry *r, struct tbd_session *s, int k,
                       uint64_t *token) {
  (void)k;
  return reg_buffer(r, s, false, token);
}

static void give_buffer(struct tbd_registry *r, struct tbd_session *s,
                        uint64_t token) {
  assert_tb_ok(simple_id(
      r, s, TENSORBROKER__V1__REQUEST__BODY_BUFFER_UNREGISTER, token));
}

static int take_event(struct tbd_registry *r, struct tbd_session *s, int k,
                      uint64_t *token) {
  (void)k;
  return reg_event(r, s, token);
}

static void give_event(struct tbd_registry *r, struct tbd_session *s,
                       uint64_t token) {
  assert_tb_ok(simple_id(r, s, TENSORBROKER__V1__REQUEST__BODY_EVENT_UNREGISTER,
                         token));
}

static int take_lease(struct tbd_registry *r, struct tbd_session *s, int k,
                      uint64_t *token) {
  (void)k;
  return acquire(r, s, "res/src", LATEST, 0, 0, token);
}

static void give_lease(struct tbd_registry *r, struct tbd_session *s,
                       uint64_t token) {
  assert_tb_ok(tbt_req_release(r, s, token, 0, true));
}

static int take_sub(struct tbd_registry *r, struct tbd_session *s, int k,
                    uint64_t *token) {
  char name[32];

  snprintf(name, sizeof(name), "res/sub%d", k);
  *token = (uint64_t)k;
  return tbt_req_subscribe(r, s, name, true);
}

static void give_sub(struct tbd_registry *r, struct tbd_session *s,
                     uint64_t token) {
  char name[32];

  snprintf(name, sizeof(name), "res/sub%d", (int)token);
  assert_tb_ok(tbt_req_subscribe(r, s, name, false));
}

#define F(x) offsetof(struct tbd_limits, x)
static const struct res_ops resources[] = {
    {"channels",
     {"--max-channels-per-session", "--max-channels-per-uid",
      "--max-channels"},
     {F(max_channels_session), F(max_channels_uid), F(max_channels)},
     take_channel, NULL},
    {"buffers",
     {"--max-buffers", "--max-buffers-per-uid", "--max-buffers-total"},
     {F(max_buffers), F(max_buffers_uid), F(max_buffers_total)},
     take_buffer, give_buffer},
    {"events",
     {"--max-events", "--max-events-per-uid", "--max-events-total"},
     {F(max_events), F(max_events_uid), F(max_events_total)},
     take_event, give_event},
    {"leases",
     {"--max-leases", "--max-leases-per-uid", "--max-leases-total"},
     {F(max_leases), F(max_leases_uid), F(max_leases_total)},
     take_lease, give_lease},
    {"subscriptions",
     {"--max-subscriptions", "--max-subscriptions-per-uid",
      "--max-subscriptions-total"},
     {F(max_subscriptions), F(max_subscriptions_uid),
      F(max_subscriptions_total)},
     take_sub, give_sub},
};

/* Limit `scope` (0 session, 1 uid, 2 total) of res set to 2: a and b are
 * sessions of uid 1000, c of uid 2000. Who may take up to the limit takes
 * it; one more is refused with TB_ELIMIT naming the flag; who is outside
 * that limit's reach still gets one; and what is given back may be taken
 * again. The producer is of uid 3000, and for the uid and total limits of
 * buffers and channels its one of each counts in the total (so that limit
 * is one higher there). */
static void one_limit(const struct res_ops *res, int scope) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *a, *b, *c;
  uint64_t tok[8] = {0}, bid;
  int k = 0;
  uint32_t limit = 2;
  tbd_limits_default(&lim);
  /* the producer's buffer and channel count in the totals */
  if ((res->take == take_buffer || res->take == take_channel) && scope == 2)
    limit++;
  *(uint32_t *)((char *)&lim + res->field[scope]) = limit;
  r = reg_new(&lim);
  producer = session(r, 3000);
  assert_tb_ok(reg_buffer(r, producer, true, &bid));
  assert_tb_ok(publish_d(r, producer, "res/src", bid, true, 0, NULL));
  a = session(r, 1000);
  b = session(r, 1000);
  c = session(r, 2000);

  switch (scope) {
  case 0: /* per session: a takes 2, the third refused; b (same uid) not */
    assert_tb_ok(res->take(r, a, k, &tok[k]));
    k++;
    assert_tb_ok(res->take(r, a, k, &tok[k]));
    k++;
    assert_tb_err(res->take(r, a, k, &tok[k]), TB_ELIMIT);
    assert_non_null(strstr(tbt_last_message, res->flag[0]));
    assert_non_null(strstr(tbt_last_message, "session has 2"));
    assert_tb_ok(res->take(r, b, k + 1, &tok[k + 1]));
    break;
  case 1: /* per uid: a and b one each, then b refused; c (other uid) not */
    assert_tb_ok(res->take(r, a, k, &tok[k]));
    k++;
    assert_tb_ok(res->take(r, b, k, &tok[k]));
    k++;
    assert_tb_err(res->take(r, b, k, &tok[k]), TB_ELIMIT);
    assert_non_null(strstr(tbt_last_message, res->flag[1]));
    assert_non_null(strstr(tbt_last_message, "uid 1000 has 2"));
    assert_tb_ok(res->take(r, c, k + 1, &tok[k + 1]));
    break;
  default: /* in total: a and c one each, then anyone refused */
    assert_tb_ok(res->take(r, a, k, &tok[k]));
    k++;
    assert_tb_ok(res->take(r, c, 5, &tok[5]));
    assert_tb_err(res->take(r, b, k, &tok[k]), TB_ELIMIT);
    assert_non_null(strstr(tbt_last_message, res->flag[2]));
    assert_non_null(strstr(tbt_last_message, "the daemon has"));
    break;
  }
  /* given back, it may be taken again (channels are not given back: a
   * table full of closed ones is tested below) */
  if (res->give != NULL) {
    res->give(r, a, tok[0]);
    assert_tb_ok(res->take(r, scope == 0 ? a : b, 6, &tok[6]));
  }
  tbt_registry_free(r);
}

static void test_every_limit(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(resources) / sizeof(resources[0]); i++)
    for (int scope = 0; scope < 3; scope++)
      one_limit(&resources[i], scope);
}

/* Sessions: per uid and in total, counted at Hello; one that ends makes
 * room. */
static void test_session_limits(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *s[4], *x;

  (void)state;
  tbd_limits_default(&lim);
  lim.max_sessions_uid = 2;
  lim.max_sessions = 3;
  r = reg_new(&lim);
  s[0] = session(r, 1000);
  s[1] = session(r, 1000);
  assert_tb_ok(tbd_session_open(r, 50, 1000, 1000, NULL, &x));
  assert_int_equal(tbt_req_hello(r, x, "limits"), TB_ELIMIT);
  assert_string_equal(tbt_last_message,
                      "uid 1000 has 2 sessions (--max-sessions-per-uid)");
  tbd_session_close(r, x);
  s[2] = session(r, 2000); /* another uid: room */
  assert_tb_ok(tbd_session_open(r, 51, 3000, 3000, NULL, &x));
  assert_int_equal(tbt_req_hello(r, x, "limits"), TB_ELIMIT);
  assert_string_equal(tbt_last_message,
                      "the daemon has 3 sessions (--max-sessions)");
  tbd_session_close(r, x);
  /* one ends: room again, for its uid too */
  tbd_session_close(r, s[0]);
  s[0] = session(r, 1000);
  assert_int_equal(uid_count(r, 1000, TBD_RES_SESSIONS), 2);
  tbt_registry_free(r);
}

/* Root is not exempt from the per-uid limits unless --exempt-root; the
 * totals hold for it either way. */
static void test_root_exempt(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  uint64_t b;

  (void)state;
  for (int exempt = 0; exempt <= 1; exempt++) {
    struct tbd_session *s1, *s2;
    tbd_limits_default(&lim);
    lim.max_buffers_uid = 1;
    lim.max_buffers_total = 3;
    lim.exempt_root = (uint32_t)exempt;
    r = reg_new(&lim);
    s1 = session(r, 0);
    s2 = session(r, 0);
    assert_tb_ok(reg_buffer(r, s1, true, &b));
    if (!exempt) {
      assert_tb_err(reg_buffer(r, s2, true, &b), TB_ELIMIT);
      assert_non_null(strstr(tbt_last_message, "uid 0 has 1 buffers"));
    } else {
      assert_tb_ok(reg_buffer(r, s2, true, &b));
      assert_tb_ok(reg_buffer(r, s2, true, &b));
      assert_tb_err(reg_buffer(r, s2, true, &b), TB_ELIMIT);
      assert_non_null(strstr(tbt_last_message, "--max-buffers-total"));
    }
    tbt_registry_free(r);
  }
}

/* Past the session limits, or refused by the server (its reserve), root
 * and the daemon's uid get one of --operator-sessions, and nobody else. */
static void test_operator_sessions(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *x, *op1, *op2;
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Status st = TENSORBROKER__V1__STATUS__INIT;
  msg_t *m;

  (void)state;
  tbd_limits_default(&lim);
  lim.max_sessions = 1;
  lim.operator_sessions = 2;
  r = reg_new(&lim);
  tbd_registry_set_operators(r, 0, 4242);
  session(r, 1000);
  assert_tb_ok(tbd_session_open(r, 60, 1000, 1000, NULL, &x));
  assert_int_equal(tbt_req_hello(r, x, "limits"), TB_ELIMIT);
  tbd_session_close(r, x);
  op1 = session(r, 4242);
  /* refused by the server: an operator still gets in, others are told */
  assert_tb_ok(tbd_session_open(r, 61, 0, 0, NULL, &op2));
  tbd_session_refuse(op2, "the daemon holds 9 descriptors (--fd-reserve)");
  assert_tb_ok(tbt_req_hello(r, op2, "limits"));
  assert_tb_ok(tbd_session_open(r, 62, 2000, 2000, NULL, &x));
  tbd_session_refuse(x, "the daemon holds 9 descriptors (--fd-reserve)");
  assert_int_equal(tbt_req_hello(r, x, "limits"), TB_ELIMIT);
  assert_string_equal(tbt_last_message,
                      "the daemon holds 9 descriptors (--fd-reserve)");
  tbd_session_close(r, x);
  /* both operator sessions taken: the next operator is refused */
  assert_tb_ok(tbd_session_open(r, 63, 4242, 4242, NULL, &x));
  assert_int_equal(tbt_req_hello(r, x, "limits"), TB_ELIMIT);
  assert_string_equal(tbt_last_message,
                      "the daemon has 1 sessions (--max-sessions)");
  tbd_session_close(r, x);
  /* Status counts them */
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
  q.status = &st;
  assert_tb_ok(send_req(r, op1, &q, NULL, 0, &m));
  assert_int_equal(m->reply->status_info->sessions, 3);
  tb__server_message_free(m);
  /* one operator leaves: its slot is free again */
  tbd_session_close(r, op1);
  session(r, 4242);
  tbt_registry_free(r);
}

/* The descriptor budget: a memfd buffer needs a descriptor within the
 * capacity, a CUDA one none; a buffer freed gives it back. */
static void test_fd_budget(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *s;
  uint64_t b1, b2, b;

  (void)state;
  tbd_limits_default(&lim);
  r = reg_new(&lim);
  tbd_registry_set_fds(r, 2, 4, 100, 2);
  s = session(r, 1000);
  b1 = buffer(r, s);
  b2 = buffer(r, s);
  (void)b2;
  assert_int_equal(tbd_registry_fds_held(r), 2);
  assert_tb_err(reg_buffer(r, s, false, &b), TB_ELIMIT);
  assert_non_null(strstr(tbt_last_message, "the daemon holds 2 descriptors"));
  assert_non_null(strstr(tbt_last_message, "--fd-reserve"));
  assert_tb_ok(reg_buffer(r, s, true, &b)); /* CUDA: no descriptor */
  /* the reserve is for connections only */
  assert_int_equal(tbd_registry_fds_take(r, 1, false), -1);
  assert_int_equal(tbd_registry_fds_take(r, 2, true), 0);
  assert_int_equal(tbd_registry_fds_take(r, 1, true), -1);
  tbd_registry_fds_give(r, 2);
  assert_tb_ok(simple_id(
      r, s, TENSORBROKER__V1__REQUEST__BODY_BUFFER_UNREGISTER, b1));
  assert_int_equal(tbd_registry_fds_held(r), 1);
  buffer(r, s);
  tbt_registry_free(r);
}

/* ---- closed channels ---- */

/* A closed channel keeps the newest --closed-history versions of memory
 * that outlives its producer (default 1; leased ones until released), and
 * none of one that died with it; 0 keeps none. */
static void test_closed_retention(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *p, *c;
  uint64_t b, lease, v;

  (void)state;
  for (uint32_t keep = 0; keep <= 2; keep++) {
    tbd_limits_default(&lim);
    lim.closed_history = keep;
    r = reg_new(&lim);
    p = session(r, 1000);
    c = session(r, 2000);
    b = buffer(r, p);
    for (int i = 0; i < 5; i++)
      assert_tb_ok(publish_d(r, p, "keep", b, false, 5, &v));
    assert_tb_ok(acquire(r, c, "keep", EXACT, 2, 0, &lease));
    tbd_session_close(r, p);
    /* the newest keep, and the leased 2 */
    assert_int_equal(tbd__channel_find(r, "keep")->nversions, keep + 1);
    assert_int_equal(acquire(r, c, "keep", EXACT, 5, 0, NULL),
                     keep >= 1 ? 0 : TB_ENOTFOUND);
    assert_int_equal(acquire(r, c, "keep", EXACT, 4, 0, NULL),
                     keep >= 2 ? 0 : TB_ENOTFOUND);
    assert_tb_ok(acquire(r, c, "keep", EXACT, 2, 0, NULL));
    tbd_session_close(r, c); /* its leases end: 2 goes */
    assert_int_equal(tbd__channel_find(r, "keep")->nversions, keep);
    c = session(r, 2000);
    if (keep == 0)
      assert_int_equal(acquire(r, c, "keep", LATEST, 0, 0, NULL), TB_ECLOSED);
    else
      assert_tb_ok(acquire(r, c, "keep", LATEST, 0, 0, NULL));
    /* a new producer carries on the numbering, with its own depth */
    p = session(r, 1000);
    assert_tb_ok(publish_d(r, p, "keep", buffer(r, p), false, 5, &v));
    assert_int_equal(v, 6);
    tbt_registry_free(r);
  }
}

/* The channel table full of closed channels (the daemon's, then one
 * uid's): a new channel frees the oldest closed one nobody leases from or
 * waits on (an acquire, a WaitFree), with its memfd; one so held is never
 * freed, and without any to free the publish is refused. A freed channel
 * published again starts at version 1. The session's own limit frees
 * nothing. */
static void test_channel_table_full(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *p, *c, *w, *p2;
  uint64_t b, lease, v;
  int held;

  (void)state;
  tbd_limits_default(&lim);
  lim.max_channels = 4;
  r = reg_new(&lim);
  p = session(r, 1000);
  c = session(r, 2000);
  w = session(r, 2000);
  b = buffer(r, p);
  assert_tb_ok(publish(r, p, "t/a", b));
  assert_tb_ok(publish(r, p, "t/b", b));
  assert_tb_ok(publish(r, p, "t/c", b));
  assert_tb_ok(publish(r, p, "t/d", b));
  assert_tb_ok(publish(r, p, "t/d", buffer(r, p))); /* 2 buffers now */
  assert_tb_ok(acquire(r, c, "t/a", LATEST, 0, 0, &lease));
  assert_int_equal(wait_free(r, w, "t/b", 1, -1, NULL), PARKED);
  held = (int)tbd_registry_fds_held(r);
  assert_int_equal(held, 2);
  tbd_session_close(r, p);
  assert_int_equal(tbd_registry_fds_held(r), 2); /* kept by t/a..t/d */
  /* a, leased, and b, waited on, stay; c goes, then d */
  p2 = session(r, 3000);
  b = buffer(r, p2);
  assert_tb_ok(publish(r, p2, "t/e", b));
  assert_null(tbd__channel_find(r, "t/c"));
  assert_int_equal(acquire(r, c, "t/c", LATEST, 0, 0, NULL), TB_ENOTFOUND);
  assert_tb_ok(publish(r, p2, "t/f", b));
  assert_null(tbd__channel_find(r, "t/d"));
  /* d's memfd went with it (p2's is 1 more) */
  assert_int_equal(tbd_registry_fds_held(r), 2);
  assert_int_equal(tbd__channel_find(r, "t/a")->nversions, 1);
  /* nothing left to free */
  assert_tb_err(publish(r, p2, "t/g", b), TB_ELIMIT);
  assert_string_equal(tbt_last_message,
                      "the daemon has 4 channels (--max-channels)");
  /* the lease ends: a may go; a parked acquire on a closed channel also
   * keeps it (b: the WaitFree, answered once b is freed) */
  assert_tb_ok(tbt_req_release(r, c, lease, 0, true));
  assert_tb_ok(publish(r, p2, "t/g", b));
  assert_null(tbd__channel_find(r, "t/a"));
  /* published again, a freed channel starts over */
  tbd_session_close(r, p2);
  p = session(r, 1000);
  assert_tb_ok(publish_d(r, p, "t/a", buffer(r, p), false, 0, &v));
  assert_int_equal(v, 1);
  tbt_registry_free(r);
}

/* A uid's channel limit frees that uid's oldest closed channel, not
 * another uid's; the per-session limit frees nothing. */
static void test_channel_uid_and_session(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *p, *q;
  uint64_t b;

  (void)state;
  tbd_limits_default(&lim);
  lim.max_channels_uid = 2;
  lim.max_channels_session = 1;
  r = reg_new(&lim);
  q = session(r, 2000);
  assert_tb_ok(publish(r, q, "u/other", buffer(r, q)));
  tbd_session_close(r, q); /* uid 2000's closed channel */
  p = session(r, 1000);
  b = buffer(r, p);
  assert_tb_ok(publish(r, p, "u/x", b));
  assert_tb_err(publish(r, p, "u/y", b), TB_ELIMIT);
  assert_string_equal(
      tbt_last_message, "session has 1 channels (--max-channels-per-session)");
  tbd_session_close(r, p);
  p = session(r, 1000);
  b = buffer(r, p);
  assert_tb_ok(publish(r, p, "u/y", b));
  assert_int_equal(uid_count(r, 1000, TBD_RES_CHANNELS), 2);
  q = session(r, 1000);
  assert_tb_ok(publish(r, q, "u/z", buffer(r, q))); /* frees u/x */
  assert_null(tbd__channel_find(r, "u/x"));
  assert_non_null(tbd__channel_find(r, "u/other"));
  assert_int_equal(uid_count(r, 1000, TBD_RES_CHANNELS), 2);
  /* taking over another uid's closed channel counts it for the new uid */
  tbd_session_close(r, q);
  q = session(r, 2000);
  assert_tb_ok(publish(r, q, "u/z", buffer(r, q)));
  assert_int_equal(uid_count(r, 1000, TBD_RES_CHANNELS), 1);
  assert_int_equal(uid_count(r, 2000, TBD_RES_CHANNELS), 2);
  tbt_registry_free(r);
}

/* Buffers retired with their producer and held by closed channels count
 * against its uid and the daemon; a full buffer table frees the oldest
 * such channel (of that uid, for the uid's limit). */
static void test_buffer_reclaim(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *p;
  uint64_t b;

  (void)state;
  tbd_limits_default(&lim);
  lim.max_buffers_uid = 2;
  r = reg_new(&lim);
  p = session(r, 1000);
  assert_tb_ok(publish(r, p, "b/1", buffer(r, p)));
  assert_tb_ok(publish(r, p, "b/2", buffer(r, p)));
  tbd_session_close(r, p);
  assert_int_equal(uid_count(r, 1000, TBD_RES_BUFFERS), 2);
  p = session(r, 1000);
  assert_tb_ok(reg_buffer(r, p, false, &b));
  assert_null(tbd__channel_find(r, "b/1"));
  assert_non_null(tbd__channel_find(r, "b/2"));
  assert_tb_ok(reg_buffer(r, p, false, &b));
  assert_null(tbd__channel_find(r, "b/2"));
  assert_tb_err(reg_buffer(r, p, false, &b), TB_ELIMIT);
  assert_non_null(strstr(tbt_last_message, "--max-buffers-per-uid"));
  tbt_registry_free(r);
}

/* ---- done events ---- */

/* A version keeps at most --max-done-events distinct done events; past
 * that they are counted, not kept, and VersionFree and WaitFreeReply say
 * how many went. The same event twice is one. */
static void test_done_event_cap(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *p, *c[4];
  uint64_t b, v, e[4], lease;
  msg_t *m;

  (void)state;
  for (int n = 2; n <= 4; n++) { /* consumers: at the cap of 3, past it */
    tbd_limits_default(&lim);
    lim.max_done_events = 3;
    r = reg_new(&lim);
    p = session(r, 1000);
    assert_tb_ok(reg_buffer(r, p, true, &b));
    assert_tb_ok(publish_d(r, p, "d/x", b, true, 0, &v));
    for (int i = 0; i < n; i++) {
      c[i] = session(r, 2000 + (uid_t)i);
      assert_tb_ok(reg_event(r, c[i], &e[i]));
      assert_tb_ok(acquire(r, c[i], "d/x", LATEST, 0, 0, &lease));
      assert_tb_ok(tbt_req_release(r, c[i], lease, e[i], true));
    }
    /* again, the same event: still one */
    assert_tb_ok(acquire(r, c[0], "d/x", LATEST, 0, 0, &lease));
    assert_tb_ok(tbt_req_release(r, c[0], lease, e[0], true));
    assert_int_equal(wait_free(r, c[0], "d/x", v, -1, NULL), PARKED);
    assert_tb_ok(publish_d(r, p, "d/x", b, true, 0, NULL)); /* v leaves */
    m = cap_message(tbt_cap_take_notice(
        p, TENSORBROKER__V1__NOTICE__BODY_VERSION_FREE));
    assert_non_null(m);
    assert_int_equal(m->notice->version_free->n_done_events, n > 3 ? 3 : n);
    assert_int_equal(m->notice->version_free->done_events_dropped,
                     n > 3 ? n - 3 : 0);
    tb__server_message_free(m);
    for (struct tbt_cap *k = tbt_caps; k != NULL; k = k->next)
      if (k->sid == tbd_session_id(c[0]) &&
          k->m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY) {
        assert_int_equal(k->m->reply->wait_free->done_events_dropped,
                         n > 3 ? n - 3 : 0);
        assert_int_equal(k->m->reply->wait_free->n_done_events,
                         n > 3 ? 3 : n);
      }
    tbt_registry_free(r);
  }
}

/* Nothing of a uid is left once all it held went. */
static void test_uid_entries_go(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *p, *c;
  uint64_t lease, e;

  (void)state;
  tbd_limits_default(&lim);
  r = reg_new(&lim);
  p = session(r, 1000);
  c = session(r, 2000);
  assert_tb_ok(publish(r, p, "g/x", buffer(r, p)));
  assert_tb_ok(acquire(r, c, "g/x", LATEST, 0, 0, &lease));
  assert_tb_ok(reg_event(r, c, &e));
  assert_tb_ok(tbt_req_subscribe(r, c, "g/y", true));
  assert_int_equal(HASH_COUNT(r->uids), 2);
  tbd_session_close(r, c);
  assert_int_equal(HASH_COUNT(r->uids), 1);
  tbd_session_close(r, p);
  /* the closed channel holds its last version and buffer for uid 1000 */
  assert_int_equal(HASH_COUNT(r->uids), 1);
  assert_int_equal(uid_count(r, 1000, TBD_RES_CHANNELS), 1);
  assert_int_equal(uid_count(r, 1000, TBD_RES_BUFFERS), 1);
  assert_true(tbd__channel_reclaim(r, NULL, false, NULL));
  assert_null(r->uids);
  tbt_registry_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
      T(test_every_limit),
      T(test_session_limits),
      T(test_root_exempt),
      T(test_operator_sessions),
      T(test_fd_budget),
      T(test_closed_retention),
      T(test_channel_table_full),
      T(test_channel_uid_and_session),
      T(test_buffer_reclaim),
      T(test_done_event_cap),
      T(test_uid_entries_go),
#undef T
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
