/* SPDX-License-Identifier: Apache-2.0 */
/* Access control at the registry (daemon/acl.c, daemon/access.c): the rule
 * syntax and its errors, the owner default, prefix rules with groups, every
 * request that names a channel, ids of other sessions, write grants,
 * rules replaced under live sessions, and what the operator's views
 * (leases, waits, buffers) show whom. Sessions carry made-up uids and
 * groups, as the server would take them from SO_PEERCRED and
 * SO_PEERGROUPS; tests/integration/test_access.c does it with real uids. */
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tb_test.h"

#include <dlpack/dlpack.h>

#include "acl.h"
#include "capture.h"
#include "config.h"
#include "log.h"
#include "registry.h"
#include "registry_impl.h"
#include "request.h"
#include "tb_proto.h"
#include "fake_cuda.h"

typedef Tensorbroker__V1__Request req_t;
typedef Tensorbroker__V1__ServerMessage msg_t;

#define LATEST TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_LATEST
#define PARKED TBT_PARKED

#define ALICE 1000
#define BOB 1001
#define CAROL 1002
#define VIDEO 4400 /* a group bob is in through his supplementary groups */

/* ---- fixtures ---- */

static int setup(void **state) {
  (void)state;
  tbd_log_set_level(TBD_LOG_ERROR);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tbt_caps_clear();
  return 0;
}

/* A rule set from "prefix|key|value" lines (prefix "-": [access]). */
static struct tbd_acl *rules(const char *const *lines) {
  struct tbd_acl *a;
  char err[300];

  assert_tb_ok(tbd_acl_new(&a));
  for (size_t i = 0; lines != NULL && lines[i] != NULL; i++) {
    char buf[300], *key, *value;
    snprintf(buf, sizeof(buf), "%s", lines[i]);
    key = strchr(buf, '|');
    assert_non_null(key);
    *key++ = '\0';
    value = strchr(key, '|');
    assert_non_null(value);
    *value++ = '\0';
    if (tbd_acl_set(a, strcmp(buf, "-") == 0 ? NULL : buf, key, value, err,
                    sizeof(err)) < 0)
      fail_msg("%s: %s", lines[i], err);
  }
  return a;
}

static struct tbd_registry *reg_new(const char *const *lines) {
  struct tbd_limits lim;
  struct tbd_registry *r;

  tbd_limits_default(&lim);
  assert_tb_ok(tbd_registry_new(&lim, tbt_cap_emit, NULL, &r));
  /* root and the daemon's own uid (here 4242) are privileged */
  tbd_registry_set_operators(r, 0, 4242);
  if (lines != NULL)
    tbd_registry_set_acl(r, rules(lines));
  return r;
}

/* ---- requests ---- */

/* A session of uid (gid the same) with supplementary groups, said Hello. */
static struct tbd_session *session_g(struct tbd_registry *r, uid_t uid,
                                     const gid_t *groups, size_t ngroups) {
  static pid_t pid = 100;
  struct tbd_session *s;

  assert_tb_ok(tbd_session_open(r, pid++, uid, uid, NULL, &s));
  assert_tb_ok(tbd_session_set_groups(s, groups, ngroups));
  assert_tb_ok(tbt_req_hello(r, s, "acl"));
  return s;
}

static struct tbd_session *session(struct tbd_registry *r, uid_t uid) {
  return session_g(r, uid, NULL, 0);
}

static int memfd(bool may_write) {
  int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);

  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 4096), 0);
  assert_int_equal(fcntl(fd, F_ADD_SEALS,
                         F_SEAL_SHRINK | F_SEAL_GROW |
                             (may_write ? 0 : F_SEAL_FUTURE_WRITE)),
                   0);
  return fd;
}

/* A host buffer; *fd_out (may be NULL) keeps the producer's descriptor. */
static uint64_t buffer_ex(struct tbd_registry *r, struct tbd_session *s,
                          bool may_write, int *fd_out) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__BufferRegister b =
      TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  int fds[1] = {memfd(may_write)};
  struct tbt_cap *c;
  uint64_t id;

  if (fd_out != NULL)
    *fd_out = fcntl(fds[0], F_DUPFD_CLOEXEC, 0);
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  q.buffer_register = &b;
  b.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
  b.size = 4096;
  b.consumers_may_write = may_write;
  assert_tb_ok(tbt_req_send(r, s, &q, fds, 1, &c));
  id = c->m->reply->buffer_register->buffer_id;
  tbt_cap_free(c);
  return id;
}

static uint64_t buffer(struct tbd_registry *r, struct tbd_session *s) {
  return buffer_ex(r, s, false, NULL);
}

static uint64_t event(struct tbd_registry *r, struct tbd_session *s) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__EventRegister e = TENSORBROKER__V1__EVENT_REGISTER__INIT;
  uint8_t handle[64] = {1, 2, 3};
  struct tbt_cap *c;
  uint64_t id;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_EVENT_REGISTER;
  q.event_register = &e;
  e.cuda_ipc_event_handle.data = handle;
  e.cuda_ipc_event_handle.len = sizeof(handle);
  assert_tb_ok(tbt_req_send(r, s, &q, NULL, 0, &c));
  id = c->m->reply->event_register->event_id;
  tbt_cap_free(c);
  return id;
}

static int publish_dev(struct tbd_registry *r, struct tbd_session *s,
                       const char *ch, uint64_t bid, uint64_t ready,
                       int dev_type) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Publish p = TENSORBROKER__V1__PUBLISH__INIT;
  Tensorbroker__V1__Layout l = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__Device d = TENSORBROKER__V1__DEVICE__INIT;
  int64_t shape[1] = {16};

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_PUBLISH;
  q.publish = &p;
  p.channel = (char *)ch;
  p.buffer_id = bid;
  p.layout = &l;
  p.ready_event_id = ready;
  l.device = &d;
  d.type = dev_type;
  l.dtype_code = kDLFloat;
  l.dtype_bits = 32;
  l.dtype_lanes = 1;
  l.shape = shape;
  l.n_shape = 1;
  return tbt_req_send(r, s, &q, NULL, 0, NULL);
}

static int publish_ev(struct tbd_registry *r, struct tbd_session *s,
                      const char *ch, uint64_t bid, uint64_t ready) {
  return publish_dev(r, s, ch, bid, ready, kDLCPU);
}

static int publish(struct tbd_registry *r, struct tbd_session *s,
                   const char *ch, uint64_t bid) {
  return publish_ev(r, s, ch, bid, 0);
}

struct acq {
  uint64_t lease;
  int fd;          /* attached descriptor (the caller closes), or -1 */
  bool writable;   /* BufferInfo.writable */
};

/* Acquire LATEST (timeout: 0 answers now), releasing release_lease with
 * it when not 0. The status, or PARKED with *req_id. */
static int acquire_rel(struct tbd_registry *r, struct tbd_session *s,
                       const char *ch, int64_t timeout, uint64_t release_lease,
                       struct acq *out, uint64_t *req_id) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Acquire a = TENSORBROKER__V1__ACQUIRE__INIT;
  struct tbt_cap *c;
  int st;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  q.acquire = &a;
  q.request_id = tbt_req_id();
  a.channel = (char *)ch;
  a.mode = LATEST;
  a.timeout_ms = timeout;
  a.release_lease_id = release_lease;
  if (req_id != NULL)
    *req_id = q.request_id;
  st = tbt_req_send(r, s, &q, NULL, 0, &c);
  if (out != NULL) {
    out->fd = -1;
    if (st == 0) {
      out->lease = c->m->reply->acquire->lease_id;
      out->writable = c->m->reply->acquire->buffer->writable;
      out->fd = c->fd;
      c->fd = -1;
    }
  }
  if (c != NULL)
    tbt_cap_free(c);
  return st;
}

static int acquire(struct tbd_registry *r, struct tbd_session *s,
                   const char *ch, struct acq *out) {
  struct acq tmp;
  int st = acquire_rel(r, s, ch, 0, 0, out != NULL ? out : &tmp, NULL);
  if (out == NULL && tmp.fd >= 0)
    close(tmp.fd);
  return st;
}

static int unregister(struct tbd_registry *r, struct tbd_session *s,
                      uint64_t bid) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__BufferUnregister bu =
      TENSORBROKER__V1__BUFFER_UNREGISTER__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_UNREGISTER;
  q.buffer_unregister = &bu;
  bu.buffer_id = bid;
  return tbt_req_send(r, s, &q, NULL, 0, NULL);
}

static int wait_free(struct tbd_registry *r, struct tbd_session *s,
                     const char *ch, uint64_t version) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__WaitFree w = TENSORBROKER__V1__WAIT_FREE__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_WAIT_FREE;
  q.wait_free = &w;
  w.channel = (char *)ch;
  w.version = version;
  return tbt_req_send(r, s, &q, NULL, 0, NULL);
}

/* The channels s is told of, joined by spaces. */
static void list_channels(struct tbd_registry *r, struct tbd_session *s,
                          char *out, size_t len) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__ListChannels lc = TENSORBROKER__V1__LIST_CHANNELS__INIT;
  struct tbt_cap *c;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_CHANNELS;
  q.list_channels = &lc;
  assert_tb_ok(tbt_req_send(r, s, &q, NULL, 0, &c));
  out[0] = '\0';
  for (size_t i = 0; i < c->m->reply->list_channels->n_channels; i++)
    snprintf(out + strlen(out), len - strlen(out), "%s%s", i ? " " : "",
             c->m->reply->list_channels->channels[i]->name);
  tbt_cap_free(c);
}

/* The uids of the sessions s is told of, joined by spaces. */
static void list_sessions(struct tbd_registry *r, struct tbd_session *s,
                          char *out, size_t len) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__ListSessions ls = TENSORBROKER__V1__LIST_SESSIONS__INIT;
  struct tbt_cap *c;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_SESSIONS;
  q.list_sessions = &ls;
  assert_tb_ok(tbt_req_send(r, s, &q, NULL, 0, &c));
  out[0] = '\0';
  for (size_t i = 0; i < c->m->reply->list_sessions->n_sessions; i++)
    snprintf(out + strlen(out), len - strlen(out), "%s%u", i ? " " : "",
             c->m->reply->list_sessions->sessions[i]->uid);
  tbt_cap_free(c);
}

static struct tbd_counts counts(struct tbd_registry *r) {
  struct tbd_counts c;
  tbd_registry_counts(r, &c);
  return c;
}

static void assert_counts_equal(struct tbd_counts a, struct tbd_counts b) {
  assert_int_equal(a.channels, b.channels);
  assert_int_equal(a.versions, b.versions);
  assert_int_equal(a.buffers, b.buffers);
  assert_int_equal(a.leases, b.leases);
  assert_int_equal(a.subscriptions, b.subscriptions);
  assert_int_equal(a.waits, b.waits);
}

#define assert_denied(expr, text)                                            \
  do {                                                                       \
    assert_tb_err((expr), TB_EPERM);                                         \
    if (strstr(tbt_last_message, (text)) == NULL)                            \
      fail_msg("denial '%s' does not say '%s'", tbt_last_message, (text));   \
  } while (0)

/* ---- the rule syntax ---- */

static int set(struct tbd_acl *a, const char *prefix, const char *key,
               const char *value, char *err) {
  err[0] = '\0';
  return tbd_acl_set(a, prefix, key, value, err, 300);
}

static void test_syntax_errors(void **state) {
  struct tbd_acl *a;
  char err[300];

  (void)state;
  assert_tb_ok(tbd_acl_new(&a));
  assert_int_equal(set(a, "cam/", "acquire", "group:root uid:7 owner *",
                       err), 0);
  assert_int_equal(set(a, NULL, "default", "open", err), 0);
  assert_int_equal(set(a, NULL, "operators", "user:root gid:10", err), 0);
  assert_int_equal(set(a, "", "list", "", err), 0); /* nobody */
  assert_int_equal(set(a, "x/", "write", "none", err), 0);

  assert_int_equal(set(a, "cam/", "acquire", "*", err), -1);
  assert_string_equal(err, "[access \"cam/\"] acquire is given twice");
  assert_int_equal(set(a, "cam/", "read", "*", err), -1);
  assert_string_equal(err, "[access \"cam/\"]: unknown key 'read' "
                           "(publish, acquire, list, write)");
  assert_int_equal(set(a, "cam/", "default", "open", err), -1);
  assert_int_equal(set(a, NULL, "default", "closed", err), -1);
  assert_string_equal(err, "[access] default is given twice");
  assert_int_equal(set(a, "d/", "publish", "user:no-such-user-tb", err), -1);
  assert_string_equal(err, "[access \"d/\"] publish: unknown user "
                           "'no-such-user-tb'");
  assert_int_equal(set(a, "d/", "publish", "group:no-such-group-tb", err),
                   -1);
  assert_string_equal(err, "[access \"d/\"] publish: unknown group "
                           "'no-such-group-tb'");
  assert_int_equal(set(a, "d/", "publish", "alice", err), -1);
  assert_non_null(strstr(err, "'alice' is not a principal"));
  assert_int_equal(set(a, "d/", "publish", "uid:12x", err), -1);
  assert_string_equal(err, "[access \"d/\"] publish: 'uid:12x': '12x' is "
                           "not a number");
  assert_int_equal(set(a, NULL, "operators", "owner", err), -1);
  tbd_acl_free(a);

  assert_tb_ok(tbd_acl_new(&a));
  assert_int_equal(set(a, NULL, "default", "closed", err), -1);
  assert_string_equal(err, "[access] default = 'closed': owner or open");
  assert_int_equal(set(a, NULL, "operators", "*", err), -1);
  assert_non_null(strstr(err, "'*' cannot be an operator"));
  tbd_acl_free(a);
  tbd_acl_free(NULL);
}

/* Names resolve when the file is read: user:root is uid 0. */
static void test_names_resolve(void **state) {
  struct tbd_acl *a;
  struct tbd_acl_peer root = {.uid = 0, .gid = 0};
  struct tbd_acl_peer other = {.uid = 5, .gid = 5};
  char err[300], why[300];

  (void)state;
  assert_tb_ok(tbd_acl_new(&a));
  assert_int_equal(set(a, "r/", "acquire", "user:root", err), 0);
  assert_int_equal(set(a, "g/", "acquire", "group:root", err), 0);
  assert_int_equal(tbd_acl_check(a, &root, TBD_ACL_ACQUIRE, "r/x", NULL, why,
                                 sizeof(why)), 0);
  assert_int_equal(tbd_acl_check(a, &root, TBD_ACL_ACQUIRE, "g/x", NULL, why,
                                 sizeof(why)), 0);
  assert_int_equal(tbd_acl_check(a, &other, TBD_ACL_ACQUIRE, "r/x", NULL,
                                 why, sizeof(why)), TB_EPERM);
  assert_string_equal(why, "rule [access \"r/\"] acquire = user:root");
  tbd_acl_free(a);
}

/* ---- the owner default ---- */

static void test_default_owner(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *alice = session(r, ALICE), *bob = session(r, BOB);
  struct tbd_session *root = session(r, 0);
  struct acq a;
  struct tbd_counts before;
  uint64_t bid = buffer(r, alice), bbid = buffer(r, bob);
  char list[200];

  (void)state;
  assert_tb_ok(publish(r, alice, "cam/front", bid));
  assert_tb_ok(acquire(r, alice, "cam/front", &a));
  assert_tb_ok(tbt_req_subscribe(r, alice, "cam/front", true));
  before = counts(r);

  assert_denied(publish(r, bob, "cam/front", bbid),
                "uid 1001 may not publish \"cam/front\": channel "
                "\"cam/front\" belongs to uid 1000 (default = owner)");
  assert_denied(acquire(r, bob, "cam/front", NULL),
                "uid 1001 may not acquire \"cam/front\": channel "
                "\"cam/front\" belongs to uid 1000 (default = owner)");
  assert_denied(acquire_rel(r, bob, "cam/front", 1000, 0, NULL, NULL),
                "may not acquire");
  assert_denied(tbt_req_subscribe(r, bob, "cam/front", true),
                "may not subscribe to");
  assert_denied(wait_free(r, bob, "cam/front", 1), "may not wait on");
  assert_int_equal(tbd_registry_stats(r)->denials, 5);
  /* nothing changed: versions, leases, subscriptions, waits */
  assert_counts_equal(counts(r), before);
  assert_int_equal(tbd__channel_find(r, "cam/front")->latest, 1);

  /* bob does not learn the name; alice and root see it */
  list_channels(r, bob, list, sizeof(list));
  assert_string_equal(list, "");
  list_channels(r, alice, list, sizeof(list));
  assert_string_equal(list, "cam/front");
  list_channels(r, root, list, sizeof(list));
  assert_string_equal(list, "cam/front");
  /* sessions: bob sees his own uid's, root everyone's */
  list_sessions(r, bob, list, sizeof(list));
  assert_string_equal(list, "1001");
  list_sessions(r, root, list, sizeof(list));
  assert_string_equal(list, "1000 1001 0");

  /* the owner and root still may; bob owns what he publishes first */
  assert_tb_ok(publish(r, alice, "cam/front", bid));
  assert_tb_ok(acquire(r, root, "cam/front", NULL));
  assert_tb_ok(publish(r, bob, "bob/x", bbid));
  assert_denied(acquire(r, alice, "bob/x", NULL), "belongs to uid 1001");
  assert_int_equal(tbd_registry_stats(r)->denials, 6);
  tbt_registry_free(r);
}

/* A wait does not make its session the owner: the first publisher is, and
 * a parked acquire of another uid is then refused. A subscriber of a name
 * not published yet hears nothing of a channel it may not acquire. */
static void test_no_squatting_by_waiting(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *alice = session(r, ALICE), *bob = session(r, BOB);
  uint64_t bid = buffer(r, alice), req;

  (void)state;
  assert_tb_ok(tbt_req_subscribe(r, bob, "later", true));
  assert_int_equal(acquire_rel(r, bob, "later", 60000, 0, NULL, &req),
                   PARKED);
  assert_int_equal(counts(r).channels, 0);
  assert_tb_ok(publish(r, alice, "later", bid));
  assert_int_equal(tbd__channel_find(r, "later")->owner, ALICE);
  {
    struct tbt_cap *c = tbt_cap_take_reply(bob, req);
    assert_non_null(c);
    assert_int_equal(c->m->reply->status, TB_EPERM);
    assert_non_null(strstr(c->m->reply->message,
                           "belongs to uid 1000 (default = owner)"));
    tbt_cap_free(c);
  }
  assert_int_equal(
      tbt_cap_drop_notices(bob, TENSORBROKER__V1__NOTICE__BODY_NEW_VERSION),
      0);
  assert_int_equal(counts(r).leases, 0);
  /* nor a ChannelClosed when alice goes */
  tbd_session_close(r, alice);
  assert_int_equal(
      tbt_cap_drop_notices(bob, TENSORBROKER__V1__NOTICE__BODY_CHANNEL_CLOSED),
      0);
  tbt_registry_free(r);
}

static void test_default_open(void **state) {
  static const char *const open[] = {"-|default|open", NULL};
  struct tbd_registry *r = reg_new(open);
  struct tbd_session *alice = session(r, ALICE), *bob = session(r, BOB);
  uint64_t bid = buffer(r, alice);
  char list[200];

  (void)state;
  assert_tb_ok(publish(r, alice, "x", bid));
  assert_tb_ok(acquire(r, bob, "x", NULL));
  assert_tb_ok(tbt_req_subscribe(r, bob, "x", true));
  list_channels(r, bob, list, sizeof(list));
  assert_string_equal(list, "x");
  list_sessions(r, bob, list, sizeof(list));
  assert_string_equal(list, "1000 1001");
  assert_int_equal(tbd_registry_stats(r)->denials, 0);
  tbt_registry_free(r);
}

/* ---- rules ---- */

static void test_prefix_rules_and_groups(void **state) {
  static const char *const lines[] = {
      "cam/|publish|uid:1000",
      "cam/|acquire|gid:4400 owner",
      "cam/|list|*",
      "cam/secret/|acquire|uid:1000",
      NULL};
  struct tbd_registry *r = reg_new(lines);
  gid_t video = VIDEO;
  struct tbd_session *alice = session(r, ALICE);
  struct tbd_session *bob = session_g(r, BOB, &video, 1);
  struct tbd_session *carol = session(r, CAROL);
  uint64_t bid = buffer(r, alice), cbid = buffer(r, carol);
  char list[200];

  (void)state;
  assert_tb_ok(publish(r, alice, "cam/front", bid));
  assert_tb_ok(publish(r, alice, "cam/secret/x", bid));
  /* bob by his supplementary group; carol not */
  assert_tb_ok(acquire(r, bob, "cam/front", NULL));
  assert_denied(acquire(r, carol, "cam/front", NULL),
                "uid 1002 may not acquire \"cam/front\": rule "
                "[access \"cam/\"] acquire = gid:4400 owner");
  /* the longest prefix that sets the key wins */
  assert_denied(acquire(r, bob, "cam/secret/x", NULL),
                "rule [access \"cam/secret/\"] acquire = uid:1000");
  /* publish is alice's alone, also onto a name not published yet */
  assert_denied(publish(r, carol, "cam/new", cbid),
                "uid 1002 may not publish \"cam/new\": rule "
                "[access \"cam/\"] publish = uid:1000");
  assert_int_equal(counts(r).channels, 2);
  /* list = * under cam/: carol sees both names though she may not read */
  list_channels(r, carol, list, sizeof(list));
  assert_string_equal(list, "cam/front cam/secret/x");
  /* outside any rule, the default: carol owns what she publishes */
  assert_tb_ok(publish(r, carol, "carol/x", cbid));
  list_channels(r, bob, list, sizeof(list));
  assert_string_equal(list, "cam/front cam/secret/x");
  tbt_registry_free(r);
}

/* An operator group may do anything; a rule of nobody leaves only root,
 * the daemon's uid and the operators. */
static void test_operators(void **state) {
  static const char *const lines[] = {
      "-|operators|gid:4400", "locked/|publish|", "locked/|acquire|none",
      NULL};
  struct tbd_registry *r = reg_new(lines);
  gid_t video = VIDEO;
  struct tbd_session *op = session_g(r, CAROL, &video, 1);
  struct tbd_session *daemon_uid = session(r, 4242);
  struct tbd_session *alice = session(r, ALICE);
  uint64_t obid = buffer(r, op), abid = buffer(r, alice);
  char list[200];

  (void)state;
  assert_tb_ok(publish(r, op, "locked/x", obid));
  assert_tb_ok(acquire(r, daemon_uid, "locked/x", NULL));
  assert_denied(publish(r, alice, "locked/y", abid),
                "rule [access \"locked/\"] publish = ");
  assert_denied(acquire(r, alice, "locked/x", NULL),
                "rule [access \"locked/\"] acquire = none");
  list_sessions(r, op, list, sizeof(list));
  assert_string_equal(list, "1002 4242 1000");
  tbt_registry_free(r);
}

/* An acquire refused while releasing a lease leaves the lease. */
static void test_denied_acquire_keeps_release(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *alice = session(r, ALICE), *bob = session(r, BOB);
  struct acq a;

  (void)state;
  assert_tb_ok(publish(r, bob, "mine", buffer(r, bob)));
  assert_tb_ok(publish(r, alice, "theirs", buffer(r, alice)));
  assert_tb_ok(acquire(r, bob, "mine", &a));
  assert_denied(acquire_rel(r, bob, "theirs", 0, a.lease, NULL, NULL),
                "may not acquire \"theirs\"");
  assert_int_equal(counts(r).leases, 1);
  assert_tb_ok(tbt_req_release(r, bob, a.lease, 0, true));
  tbt_registry_free(r);
}

/* Ids of another session's leases, buffers and events are refused, even
 * to a session allowed on the channel. */
static void test_other_sessions_ids(void **state) {
  static const char *const open[] = {"-|default|open", NULL};
  struct tbd_registry *r = reg_new(open);
  struct tbd_session *alice = session(r, ALICE), *bob = session(r, BOB);
  uint64_t abid = buffer(r, alice), bbid = buffer(r, bob);
  uint64_t aev = event(r, alice);
  struct acq a, b;
  struct tbd_counts before;

  (void)state;
  assert_tb_ok(publish(r, alice, "x", abid));
  assert_tb_ok(acquire(r, alice, "x", &a));
  before = counts(r);
  assert_denied(tbt_req_release(r, bob, a.lease, 0, true),
                "the lease belongs to another session");
  assert_tb_err(acquire_rel(r, bob, "x", 0, a.lease, NULL, NULL),
                TB_EINVAL); /* the release riding along is refused */
  assert_non_null(strstr(tbt_last_message, "belongs to another session"));
  assert_denied(unregister(r, bob, abid),
                "is not registered by this session");
  assert_denied(publish(r, bob, "y", abid),
                "belongs to another session");
  assert_denied(publish_ev(r, bob, "y", bbid, aev),
                "is not registered by this session");
  assert_tb_ok(acquire(r, bob, "x", &b));
  assert_denied(tbt_req_release(r, bob, b.lease, aev, true),
                "done event is not registered by this session");
  before.leases++;
  assert_counts_equal(counts(r), before);
  assert_tb_ok(tbt_req_release(r, bob, b.lease, 0, true));
  assert_tb_ok(tbt_req_release(r, alice, a.lease, 0, true));
  tbt_registry_free(r);
}

/* ---- write ---- */

static void test_write_grant(void **state) {
  static const char *const lines[] = {
      "w/|acquire|*", "w/|write|uid:1001", NULL};
  struct tbd_registry *r = reg_new(lines);
  struct tbd_session *alice = session(r, ALICE), *bob = session(r, BOB);
  struct tbd_session *carol = session(r, CAROL);
  int pfd;
  uint64_t bid = buffer_ex(r, alice, true, &pfd);
  struct stat st;
  struct acq b, c, a;

  (void)state;
  /* owner-only now: nobody re-opens it read-write through /proc */
  assert_int_equal(fstat(pfd, &st), 0);
  assert_int_equal(st.st_mode & 077, 0);
  assert_tb_ok(publish(r, alice, "w/x", bid));
  assert_tb_ok(acquire(r, bob, "w/x", &b));
  assert_tb_ok(acquire(r, carol, "w/x", &c));
  assert_tb_ok(acquire(r, alice, "w/x", &a)); /* default: the owner may */
  assert_true(b.writable);
  assert_int_equal(fcntl(b.fd, F_GETFL) & O_ACCMODE, O_RDWR);
  assert_false(c.writable);
  assert_int_equal(fcntl(c.fd, F_GETFL) & O_ACCMODE, O_RDONLY);
  assert_false(a.writable); /* the rule names bob alone: it replaces the
                               owner default for write */
  /* the read-only one maps only for reading */
  assert_ptr_equal(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, c.fd,
                        0),
                   MAP_FAILED);
  /* a second acquire by carol: no descriptor, still not writable */
  {
    struct acq c2;
    assert_tb_ok(acquire(r, carol, "w/x", &c2));
    assert_int_equal(c2.fd, -1);
    assert_false(c2.writable);
  }
  close(a.fd);
  close(b.fd);
  close(c.fd);
  close(pfd);
  assert_int_equal(counts(r).leases, 4);
  tbt_registry_free(r);
}

/* ---- rules replaced under live sessions ---- */

static void test_rules_replaced_live(void **state) {
  static const char *const open[] = {"-|default|open", NULL};
  struct tbd_registry *r = reg_new(open);
  struct tbd_session *alice = session(r, ALICE), *bob = session(r, BOB);
  struct acq b;

  (void)state;
  assert_tb_ok(publish(r, alice, "x", buffer(r, alice)));
  assert_tb_ok(acquire(r, bob, "x", &b));
  close(b.fd);
  tbd_registry_set_acl(r, rules(NULL)); /* default = owner */
  /* the session and its lease stay; the next request is refused */
  assert_int_equal(counts(r).leases, 1);
  assert_denied(acquire(r, bob, "x", NULL), "(default = owner)");
  assert_tb_ok(tbt_req_release(r, bob, b.lease, 0, true));
  {
    static const char *const grant[] = {"x|acquire|uid:1001", NULL};
    tbd_registry_set_acl(r, rules(grant));
  }
  assert_tb_ok(acquire(r, bob, "x", NULL));
  tbt_registry_free(r);
}

/* Hello's latest versions leave out what the session may not acquire. */
static void test_hello_latest(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *alice = session(r, ALICE);
  static const char *const names[] = {"cuda/a"};
  struct tbt_fake_cuda f;
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  struct tbt_cap *c;
  uint64_t bid;

  (void)state;
  tbt_fake_cuda_init(&f, 7);
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  q.buffer_register = &f.reg;
  assert_tb_ok(tbt_req_send(r, alice, &q, NULL, 0, &c));
  bid = c->m->reply->buffer_register->buffer_id;
  tbt_cap_free(c);
  assert_tb_ok(publish_dev(r, alice, "cuda/a", bid, 0, kDLCUDA));
  for (uid_t uid = ALICE; uid <= BOB; uid++) {
    req_t h = TENSORBROKER__V1__REQUEST__INIT;
    Tensorbroker__V1__Hello hello = TENSORBROKER__V1__HELLO__INIT;
    struct tbd_session *s;

    assert_tb_ok(tbd_session_open(r, 300 + (pid_t)uid, uid, uid, NULL, &s));
    h.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
    h.hello = &hello;
    hello.protocol_version = 1;
    hello.memory_kinds =
        1u << TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC;
    hello.prefetch = true;
    hello.channels = (char **)names;
    hello.n_channels = 1;
    assert_tb_ok(tbt_req_send(r, s, &h, NULL, 0, &c));
    /* alice gets her channel's version; bob not even its name */
    assert_int_equal(c->m->reply->hello->n_latest, uid == ALICE ? 1 : 0);
    tbt_cap_free(c);
  }
  tbt_registry_free(r);
}

/* ---- the operator's views ---- */

static size_t list_count(struct tbd_registry *r, struct tbd_session *s,
                         int body) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__ListLeases ll = TENSORBROKER__V1__LIST_LEASES__INIT;
  Tensorbroker__V1__ListWaits lw = TENSORBROKER__V1__LIST_WAITS__INIT;
  Tensorbroker__V1__ListChannels lc = TENSORBROKER__V1__LIST_CHANNELS__INIT;
  struct tbt_cap *c;
  size_t n;

  q.body_case = body;
  q.list_leases = &ll; /* one of them, by body */
  if (body == TENSORBROKER__V1__REQUEST__BODY_LIST_WAITS)
    q.list_waits = &lw;
  if (body == TENSORBROKER__V1__REQUEST__BODY_LIST_CHANNELS) {
    lc.waiting = true;
    q.list_channels = &lc;
  }
  assert_tb_ok(tbt_req_send(r, s, &q, NULL, 0, &c));
  n = body == TENSORBROKER__V1__REQUEST__BODY_LIST_LEASES
          ? c->m->reply->list_leases->n_leases
      : body == TENSORBROKER__V1__REQUEST__BODY_LIST_WAITS
          ? c->m->reply->list_waits->n_waits
          : c->m->reply->list_channels->n_channels;
  tbt_cap_free(c);
  return n;
}

#define LEASES TENSORBROKER__V1__REQUEST__BODY_LIST_LEASES
#define WAITS TENSORBROKER__V1__REQUEST__BODY_LIST_WAITS
#define CHANNELS TENSORBROKER__V1__REQUEST__BODY_LIST_CHANNELS

/* Leases, waits and waiting names of other uids on channels a session may
 * not list are left out; dropping needs the right to publish. */
static void test_operator_views(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *alice = session(r, ALICE), *alice2 = session(r, ALICE);
  struct tbd_session *bob = session(r, BOB), *root = session(r, 0);
  uint64_t bid = buffer(r, alice), req;
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__DropChannel dc = TENSORBROKER__V1__DROP_CHANNEL__INIT;

  (void)state;
  assert_tb_ok(publish(r, alice, "a", bid));
  assert_tb_ok(acquire(r, alice2, "a", NULL));
  assert_tb_ok(acquire(r, root, "a", NULL));
  assert_int_equal(acquire_rel(r, bob, "secret/name", 60000, 0, NULL, &req),
                   PARKED);
  assert_int_equal(acquire_rel(r, alice2, "alice/next", 60000, 0, NULL,
                               NULL),
                   PARKED);
  /* alice sees both leases on her channel (root's too), not bob's wait */
  assert_int_equal(list_count(r, alice, LEASES), 2);
  assert_int_equal(list_count(r, alice, WAITS), 1);
  assert_int_equal(list_count(r, alice, CHANNELS), 2); /* a, alice/next */
  /* bob sees his own wait and waiting name, nothing of alice's */
  assert_int_equal(list_count(r, bob, LEASES), 0);
  assert_int_equal(list_count(r, bob, WAITS), 1);
  assert_int_equal(list_count(r, bob, CHANNELS), 1); /* secret/name */
  assert_int_equal(list_count(r, root, LEASES), 2);
  assert_int_equal(list_count(r, root, WAITS), 2);
  assert_int_equal(list_count(r, root, CHANNELS), 3);

  tbd_session_close(r, alice);
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_DROP_CHANNEL;
  q.drop_channel = &dc;
  dc.channel = "a";
  assert_denied(tbt_req_send(r, bob, &q, NULL, 0, NULL),
                "uid 1001 may not drop \"a\": channel \"a\" belongs to uid "
                "1000 (default = owner)");
  assert_int_equal(counts(r).channels, 1);
  tbt_registry_free(r);
}

/* ListBuffers from s after buffer id after: the reply (the caller frees
 * it). */
static struct tbt_cap *list_buffers(struct tbd_registry *r,
                                    struct tbd_session *s, uint64_t after) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__ListBuffers lb = TENSORBROKER__V1__LIST_BUFFERS__INIT;
  struct tbt_cap *c;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_BUFFERS;
  q.list_buffers = &lb;
  lb.after_buffer_id = after;
  assert_tb_ok(tbt_req_send(r, s, &q, NULL, 0, &c));
  assert_non_null(c->m->reply->list_buffers);
  return c;
}

/* The ids s is shown, joined by spaces ("" for none), in the order sent;
 * and the entry of id want (NULL when it is not shown) into *out, which
 * the caller frees with tbt_cap_free(*cap). */
static const Tensorbroker__V1__BufferEntryInfo *
buffers_seen(struct tbd_registry *r, struct tbd_session *s, uint64_t want,
             char *ids, size_t len, struct tbt_cap **cap) {
  const Tensorbroker__V1__ListBuffersReply *lr;
  const Tensorbroker__V1__BufferEntryInfo *found = NULL;

  *cap = list_buffers(r, s, 0);
  lr = (*cap)->m->reply->list_buffers;
  assert_false(lr->more);
  ids[0] = '\0';
  for (size_t i = 0; i < lr->n_buffers; i++) {
    snprintf(ids + strlen(ids), len - strlen(ids), "%s%llu", i ? " " : "",
             (unsigned long long)lr->buffers[i]->buffer_id);
    if (lr->buffers[i]->buffer_id == want)
      found = lr->buffers[i];
  }
  return found;
}

/* The buffers view: a host buffer of alice and a CUDA IPC buffer of bob,
 * each published and leased, listed with their kind, size, device, owner
 * and counts; each uid sees its own, an operator both; a buffer retired
 * while leased stays listed as retired, without its session but with its
 * producer's pid and uid, until its last version goes; the pages come
 * after the cursor, ascending, each with more while entries are left. */
static void test_buffer_list(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *alice = session(r, ALICE), *alice2 = session(r, ALICE);
  struct tbd_session *bob = session(r, BOB), *root = session(r, 0);
  const Tensorbroker__V1__BufferEntryInfo *e;
  struct tbt_fake_cuda f;
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  struct tbt_cap *c;
  struct acq held, cuda_held;
  uint64_t hb, cb, alice_pid = tbd_session_pid(alice);
  char ids[256], want[64];

  (void)state;
  hb = buffer_ex(r, alice, true, NULL);
  tbt_fake_cuda_init(&f, 9);
  f.dev.id = 1;
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  q.buffer_register = &f.reg;
  assert_tb_ok(tbt_req_send(r, bob, &q, NULL, 0, &c));
  cb = c->m->reply->buffer_register->buffer_id;
  tbt_cap_free(c);
  assert_true(cb > hb);

  /* nothing published yet: listed, with no versions */
  e = buffers_seen(r, root, hb, ids, sizeof(ids), &c);
  snprintf(want, sizeof(want), "%llu %llu", (unsigned long long)hb,
           (unsigned long long)cb);
  assert_string_equal(ids, want);
  assert_int_equal(e->versions, 0);
  assert_int_equal(e->leases, 0);
  tbt_cap_free(c);

  /* alice's version 1 leased by alice2, then version 2 (depth 1: version
   * 1 leaves the history but is held); bob's version leased by root */
  assert_tb_ok(publish(r, alice, "a", hb));
  assert_tb_ok(acquire(r, alice2, "a", &held));
  close(held.fd);
  assert_tb_ok(publish(r, alice, "a", hb));
  assert_tb_ok(publish_dev(r, bob, "cuda/b", cb, 0, kDLCUDA));
  assert_tb_ok(acquire(r, root, "cuda/b", &cuda_held));

  /* root (an operator) sees both, ascending, each as registered */
  e = buffers_seen(r, root, hb, ids, sizeof(ids), &c);
  assert_string_equal(ids, want);
  assert_int_equal(e->kind,
                   TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD);
  assert_int_equal(e->size, 4096);
  assert_int_equal(e->session_id, tbd_session_id(alice));
  assert_int_equal(e->pid, alice_pid);
  assert_int_equal(e->uid, ALICE);
  assert_string_equal(e->session_name, "acl");
  assert_int_equal(e->versions, 2);
  assert_int_equal(e->leases, 1);
  assert_false(e->retired);
  assert_true(e->writable);
  assert_true(e->survives_producer);
  assert_int_equal(e->signal_offset, 0);
  tbt_cap_free(c);
  e = buffers_seen(r, root, cb, ids, sizeof(ids), &c);
  assert_int_equal(e->kind,
                   TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC);
  assert_int_equal(e->size, 4096);
  assert_non_null(e->device);
  assert_int_equal(e->device->type, kDLCUDA);
  assert_int_equal(e->device->id, 1);
  assert_int_equal(e->device->uuid.len, 16);
  assert_int_equal(e->device->uuid.data[0], 7);
  assert_int_equal(e->session_id, tbd_session_id(bob));
  assert_int_equal(e->uid, BOB);
  assert_int_equal(e->versions, 1);
  assert_int_equal(e->leases, 1);
  assert_false(e->writable);
  assert_false(e->survives_producer); /* CUDA IPC dies with bob */
  tbt_cap_free(c);

  /* each uid sees its own buffers only (default = owner) */
  assert_null(buffers_seen(r, alice2, cb, ids, sizeof(ids), &c));
  snprintf(want, sizeof(want), "%llu", (unsigned long long)hb);
  assert_string_equal(ids, want);
  tbt_cap_free(c);
  assert_null(buffers_seen(r, bob, hb, ids, sizeof(ids), &c));
  snprintf(want, sizeof(want), "%llu", (unsigned long long)cb);
  assert_string_equal(ids, want);
  tbt_cap_free(c);

  /* after the cursor: only the later buffer */
  c = list_buffers(r, root, hb);
  assert_int_equal(c->m->reply->list_buffers->n_buffers, 1);
  assert_int_equal(c->m->reply->list_buffers->buffers[0]->buffer_id, cb);
  tbt_cap_free(c);
  c = list_buffers(r, root, cb);
  assert_int_equal(c->m->reply->list_buffers->n_buffers, 0);
  tbt_cap_free(c);

  /* alice unregisters her buffer: retired, still hers while she lives;
   * then she goes: still listed while its versions are held, for her uid
   * and the operators, without a session */
  assert_tb_ok(unregister(r, alice, hb));
  e = buffers_seen(r, root, hb, ids, sizeof(ids), &c);
  assert_true(e->retired);
  assert_int_equal(e->session_id, tbd_session_id(alice));
  assert_string_equal(e->session_name, "acl");
  tbt_cap_free(c);
  tbd_session_close(r, alice);
  e = buffers_seen(r, alice2, hb, ids, sizeof(ids), &c);
  assert_non_null(e);
  assert_true(e->retired);
  assert_int_equal(e->session_id, 0);
  assert_string_equal(e->session_name, "");
  assert_int_equal(e->pid, alice_pid);
  assert_int_equal(e->uid, ALICE);
  assert_int_equal(e->versions, 2);
  assert_int_equal(e->leases, 1);
  tbt_cap_free(c);
  assert_null(buffers_seen(r, bob, hb, ids, sizeof(ids), &c));
  tbt_cap_free(c);
  assert_tb_ok(tbt_req_release(r, alice2, held.lease, 0, true));
  e = buffers_seen(r, root, hb, ids, sizeof(ids), &c);
  assert_int_equal(e->versions, 1); /* version 2, in the closed history */
  assert_int_equal(e->leases, 0);
  tbt_cap_free(c);

  /* bob goes: his CUDA IPC memory died with him; the buffer stays,
   * retired, while root's lease holds its version, then goes */
  tbd_session_close(r, bob);
  e = buffers_seen(r, root, cb, ids, sizeof(ids), &c);
  assert_non_null(e);
  assert_true(e->retired);
  assert_int_equal(e->leases, 1);
  assert_int_equal(e->session_id, 0);
  assert_int_equal(e->uid, BOB);
  tbt_cap_free(c);
  assert_tb_ok(tbt_req_release(r, root, cuda_held.lease, 0, true));
  assert_null(buffers_seen(r, root, cb, ids, sizeof(ids), &c));
  tbt_cap_free(c);
  tbt_registry_free(r);
}

/* More buffers than one page holds: each page fits the message, says
 * more while buffers are left, and goes on after its cursor; together
 * they list every buffer once, ascending. */
static void test_buffer_list_pages(void **state) {
  enum { N = 40 };
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *carol = session(r, CAROL);
  uint64_t ids[N], after = 0;
  size_t got = 0, pages = 0;
  bool more = true;

  (void)state;
  for (int i = 0; i < N; i++)
    ids[i] = buffer(r, carol);
  r->lim.max_message = 1024; /* about eight entries a page */
  while (more) {
    struct tbt_cap *c = list_buffers(r, carol, after);
    const Tensorbroker__V1__ListBuffersReply *lr = c->m->reply->list_buffers;

    assert_true(tensorbroker__v1__server_message__get_packed_size(c->m) <=
                1024);
    assert_true(lr->n_buffers > 0);
    for (size_t i = 0; i < lr->n_buffers; i++) {
      assert_true(got < N);
      assert_int_equal(lr->buffers[i]->buffer_id, ids[got]);
      got++;
    }
    after = lr->buffers[lr->n_buffers - 1]->buffer_id;
    more = lr->more;
    pages++;
    tbt_cap_free(c);
  }
  assert_int_equal(got, N);
  assert_true(pages >= 3);
  tbt_registry_free(r);
}

/* Metrics over the socket name only the channels the caller may list. */
static void test_metrics_filtered(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *alice = session(r, ALICE), *bob = session(r, BOB);
  struct tbd_session *root = session(r, 0);
  struct tbd_session *who[3] = {alice, bob, root};
  bool sees[3] = {true, false, true};

  (void)state;
  assert_tb_ok(publish(r, alice, "alice/secret", buffer(r, alice)));
  for (int i = 0; i < 3; i++) {
    req_t q = TENSORBROKER__V1__REQUEST__INIT;
    Tensorbroker__V1__Metrics mq = TENSORBROKER__V1__METRICS__INIT;
    struct tbt_cap *c;
    char *text;

    q.body_case = TENSORBROKER__V1__REQUEST__BODY_METRICS;
    q.metrics = &mq;
    assert_tb_ok(tbt_req_send(r, who[i], &q, NULL, 0, &c));
    assert_false(c->m->reply->metrics->more);
    text = strndup((const char *)c->m->reply->metrics->text.data,
                   c->m->reply->metrics->text.len);
    assert_non_null(text);
    assert_int_equal(strstr(text, "channel=\"alice/secret\"") != NULL,
                     sees[i]);
    assert_non_null(strstr(text, "tensorbroker_channels 1"));
    free(text);
    tbt_cap_free(c);
  }
  tbt_registry_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_syntax_errors),
      cmocka_unit_test(test_names_resolve),
      cmocka_unit_test_setup_teardown(test_default_owner, setup, teardown),
      cmocka_unit_test_setup_teardown(test_no_squatting_by_waiting, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_default_open, setup, teardown),
      cmocka_unit_test_setup_teardown(test_prefix_rules_and_groups, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_operators, setup, teardown),
      cmocka_unit_test_setup_teardown(test_denied_acquire_keeps_release,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_other_sessions_ids, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_write_grant, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rules_replaced_live, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_operator_views, setup, teardown),
      cmocka_unit_test_setup_teardown(test_buffer_list, setup, teardown),
      cmocka_unit_test_setup_teardown(test_buffer_list_pages, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_hello_latest, setup, teardown),
      cmocka_unit_test_setup_teardown(test_metrics_filtered, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
