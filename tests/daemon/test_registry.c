/* SPDX-License-Identifier: Apache-2.0 */
/* Registry and handler tests: lease accounting, version and buffer
 * lifetimes, notices, waits, limits, protocol errors and allocation
 * failures. No sockets, no sleeps: requests go in as decoded messages,
 * replies and notices come out through the emit callback, time is a fake
 * clock. Every test frees the registry and checks no descriptor leaked;
 * the suite also runs under ASan+UBSan, which catch leaked memory. */
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tb_test.h"

#include <dlpack/dlpack.h>

#include "alloc.h"
#include "capture.h"
#include "config.h"
#include "log.h"
#include "metrics.h"
#include "registry.h"
#include "kinds.h"
#include "registry_impl.h" /* tbd__channel_recent, tbd__channel_find */
#include "request.h"
#include "tb_proto.h"
#include "fake_cuda.h"
#include "fd_count.h"
#include "tensorbroker/tensorbroker.h" /* TB_CONNECT_CHANNELS_MAX */

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1; older C libraries lack it */
#endif

typedef Tensorbroker__V1__Request req_t;
typedef Tensorbroker__V1__ServerMessage msg_t;

#define REPLY_CASE TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY
#define NOTICE_CASE TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE
#define N_NEW TENSORBROKER__V1__NOTICE__BODY_NEW_VERSION
#define N_FREE TENSORBROKER__V1__NOTICE__BODY_VERSION_FREE
#define N_RETIRED TENSORBROKER__V1__NOTICE__BODY_BUFFER_RETIRED
#define N_CLOSED TENSORBROKER__V1__NOTICE__BODY_CHANNEL_CLOSED
#define N_GONE TENSORBROKER__V1__NOTICE__BODY_EVENTS_GONE
#define LATEST TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_LATEST
#define NEXT TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_NEXT
#define EXACT TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_EXACT
#define PARKED TBT_PARKED

/* ---- fake clock (captured output: capture.h, requests: request.h) ---- */

static uint64_t fake_now = 1000;
static int fds_at_start;

static uint64_t fake_clock(void *ud) {
  (void)ud;
  return fake_now;
}

/* ---- fixtures ---- */

static struct tbd_registry *reg_new(const struct tbd_limits *lim) {
  struct tbd_limits def;
  struct tbd_registry *r;

  if (lim == NULL) {
    tbd_limits_default(&def);
    lim = &def;
  }
  assert_tb_ok(tbd_registry_new(lim, tbt_cap_emit, NULL, &r));
  tbd_registry_set_clock(r, fake_clock, NULL);
  return r;
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
  tbd_alloc_fail_at(0, 0);
  assert_int_equal(tbt_count_fds(), fds_at_start);
  return 0;
}

/* ---- requests ---- */

/* A Hello saying memory kinds HOST_MEMFD (and CUDA_IPC when cuda), asking
 * for prefetch or not and naming n channels; returns the reply's status
 * and passes the reply to *out when out is not NULL. */
static int hello_ex(struct tbd_registry *r, struct tbd_session *s, bool cuda,
                    bool prefetch, const char *const *names, size_t n,
                    struct tbt_cap **out) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Hello h = TENSORBROKER__V1__HELLO__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
  q.hello = &h;
  h.protocol_version = 1;
  h.client_name = "prefetcher";
  h.memory_kinds =
      (1u << TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD) |
      (cuda ? 1u << TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC : 0);
  h.prefetch = prefetch;
  h.channels = (char **)names;
  h.n_channels = n;
  return tbt_req_send(r, s, &q, NULL, 0, out);
}

/* A session whose Hello asks for prefetch (CUDA buffers in NewVersion);
 * cuda: whether it also says it can map CUDA memory. */
static struct tbd_session *session_prefetch_kinds(struct tbd_registry *r,
                                                  pid_t pid, bool cuda) {
  struct tbd_session *s;

  assert_tb_ok(tbd_session_open(r, pid, 1000, 1000, NULL, &s));
  assert_tb_ok(hello_ex(r, s, cuda, true, NULL, 0, NULL));
  return s;
}

static struct tbd_session *session_prefetch(struct tbd_registry *r,
                                            pid_t pid) {
  return session_prefetch_kinds(r, pid, true);
}

static struct tbd_session *session(struct tbd_registry *r, pid_t pid) {
  struct tbd_session *s;

  assert_tb_ok(tbd_session_open(r, pid, 1000, 1000, NULL, &s));
  assert_tb_ok(tbt_req_hello(r, s, "test"));
  return s;
}

/* A session whose Hello says which /dev/shm (shm_id) and PID namespace
 * (pidns_id) it sees; 0: unknown. */
static struct tbd_session *session_ns(struct tbd_registry *r, pid_t pid,
                                      uint64_t shm_id, uint64_t pidns_id) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Hello h = TENSORBROKER__V1__HELLO__INIT;
  struct tbd_session *s;

  assert_tb_ok(tbd_session_open(r, pid, 1000, 1000, NULL, &s));
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
  q.hello = &h;
  h.protocol_version = 1;
  h.client_name = "ns";
  h.shm_id = shm_id;
  h.pidns_id = pidns_id;
  assert_tb_ok(tbt_req_send(r, s, &q, NULL, 0, NULL));
  return s;
}

/* A memfd of size bytes with exactly these seals. */
static int memfd_seals(size_t size, int seals) {
  int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);

  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)size), 0);
  if (seals != 0)
    assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
  return fd;
}

/* seal: the seals the daemon wants of a read-only buffer (none otherwise) */
static int memfd(size_t size, bool seal) {
  return memfd_seals(size, seal ? F_SEAL_SHRINK | F_SEAL_GROW |
                                      F_SEAL_FUTURE_WRITE
                                : 0);
}

static int reg_buffer_fd_ex(struct tbd_registry *r, struct tbd_session *s,
                            uint64_t size, int fd, bool may_write,
                            uint64_t *id) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__BufferRegister b =
      TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  struct tbt_cap *c;
  int fds[1] = {fd};
  int st;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  q.buffer_register = &b;
  b.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
  b.size = size;
  b.consumers_may_write = may_write;
  st = tbt_req_send(r, s, &q, fds, fd >= 0 ? 1 : 0, &c);
  if (st == 0) {
    *id = c->m->reply->buffer_register->buffer_id;
    assert_int_equal(c->m->reply->buffer_register->generation, 1);
  }
  if (st <= 0 && c != NULL)
    tbt_cap_free(c);
  return st;
}

static int reg_buffer_fd(struct tbd_registry *r, struct tbd_session *s,
                         uint64_t size, int fd, uint64_t *id) {
  return reg_buffer_fd_ex(r, s, size, fd, false, id);
}

static uint64_t buffer(struct tbd_registry *r, struct tbd_session *s) {
  uint64_t id = 0;
  assert_tb_ok(reg_buffer_fd(r, s, 4096, memfd(4096, true), &id));
  return id;
}

/* A CUDA_IPC buffer with a made-up handle whose first byte is tag. */
static uint64_t cuda_buffer(struct tbd_registry *r, struct tbd_session *s,
                            uint8_t tag) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  struct tbt_fake_cuda f;
  struct tbt_cap *c;
  uint64_t id;

  tbt_fake_cuda_init(&f, tag);
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  q.buffer_register = &f.reg;
  assert_tb_ok(tbt_req_send(r, s, &q, NULL, 0, &c));
  id = c->m->reply->buffer_register->buffer_id;
  tbt_cap_free(c);
  return id;
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

struct pub {
  uint32_t depth;
  size_t meta_len;
  size_t ndim;
  int dev_type;
  uint64_t event;
  bool complete;
  uint64_t byte_offset;  /* the layout's */
  uint64_t ready_signal;
};

static int publish_ex(struct tbd_registry *r, struct tbd_session *s,
                      const char *ch, uint64_t bid, const struct pub *o,
                      uint64_t *version) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Publish p = TENSORBROKER__V1__PUBLISH__INIT;
  Tensorbroker__V1__Layout l = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__Device d = TENSORBROKER__V1__DEVICE__INIT;
  int64_t shape[80];
  uint8_t meta[8192];
  struct tbt_cap *c;
  int st;

  for (size_t i = 0; i < 80; i++)
    shape[i] = 1;
  shape[0] = 16;
  memset(meta, 'm', sizeof(meta));
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_PUBLISH;
  q.publish = &p;
  p.channel = (char *)ch;
  p.buffer_id = bid;
  p.layout = &l;
  p.history_depth = o ? o->depth : 0;
  p.metadata.data = meta;
  p.metadata.len = o ? o->meta_len : 3;
  p.ready_event_id = o ? o->event : 0;
  p.ready_complete = o ? o->complete : false;
  p.ready_signal = o ? o->ready_signal : 0;
  l.byte_offset = o ? o->byte_offset : 0;
  l.device = &d;
  d.type = o && o->dev_type ? o->dev_type : kDLCPU;
  l.dtype_code = kDLFloat;
  l.dtype_bits = 32;
  l.dtype_lanes = 1;
  l.shape = shape;
  l.n_shape = o && o->ndim ? o->ndim : 1;
  st = tbt_req_send(r, s, &q, NULL, 0, &c);
  if (st == 0 && version != NULL)
    *version = c->m->reply->publish->version;
  if (c != NULL)
    tbt_cap_free(c);
  return st;
}

static uint64_t publish(struct tbd_registry *r, struct tbd_session *s,
                        const char *ch, uint64_t bid, uint32_t depth) {
  struct pub o = {.depth = depth, .meta_len = 3};
  uint64_t v = 0;
  assert_tb_ok(publish_ex(r, s, ch, bid, &o, &v));
  return v;
}

struct acq {
  uint64_t lease, version;
  bool fd_attached;
  int fd;
  uint64_t ready_event;  /* 0: the reply had none */
  bool ready_complete;
  bool ready_owner_died;
  int kind, dev_type;    /* the BufferInfo's */
  uint64_t signal_offset; /* the BufferInfo's */
  uint32_t done_slot;
  uint64_t ready_signal; /* the ready event's signal_value */
  uint32_t ready_slot;   /* and signal_slot */
  uint64_t ready_shm, ready_pidns; /* its owner_shm_id, owner_pidns_id */
};

/* Returns the status, or PARKED; for a parked request, *req_id says
 * which reply to look for later. */
static int acquire_ex(struct tbd_registry *r, struct tbd_session *s,
                      const char *ch, int mode, uint64_t version,
                      int64_t timeout, struct acq *out, uint64_t *req_id) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Acquire a = TENSORBROKER__V1__ACQUIRE__INIT;
  struct tbt_cap *c;
  int st;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  q.acquire = &a;
  q.request_id = tbt_req_id();
  a.channel = (char *)ch;
  a.mode = mode;
  a.version = version;
  a.timeout_ms = timeout;
  a.implicit_stream = true;
  if (req_id != NULL)
    *req_id = q.request_id;
  st = tbt_req_send(r, s, &q, NULL, 0, &c);
  if (st == 0 && out != NULL) {
    Tensorbroker__V1__AcquireReply *ar = c->m->reply->acquire;
    out->lease = ar->lease_id;
    out->version = ar->version;
    out->fd_attached = ar->buffer->fd_attached;
    out->ready_event = ar->ready_event ? ar->ready_event->event_id : 0;
    out->ready_complete = ar->ready_event && ar->ready_event->complete;
    out->ready_owner_died = ar->ready_event && ar->ready_event->owner_died;
    out->kind = ar->buffer->kind;
    out->dev_type = ar->buffer->device ? ar->buffer->device->type : -1;
    out->signal_offset = ar->buffer->signal_offset;
    out->done_slot = ar->done_slot;
    if (ar->ready_event != NULL) {
      out->ready_signal = ar->ready_event->signal_value;
      out->ready_slot = ar->ready_event->signal_slot;
      out->ready_shm = ar->ready_event->owner_shm_id;
      out->ready_pidns = ar->ready_event->owner_pidns_id;
    }
    assert_int_equal(ar->buffer->fd_attached, c->fd >= 0);
    assert_string_equal(ar->channel, ch);
    assert_int_equal(ar->layout->shape[0], 16);
  }
  if (c != NULL)
    tbt_cap_free(c);
  return st;
}

static struct acq acquire(struct tbd_registry *r, struct tbd_session *s,
                          const char *ch, int mode, uint64_t version) {
  struct acq a = {0};
  assert_tb_ok(acquire_ex(r, s, ch, mode, version, 0, &a, NULL));
  return a;
}

/* The reply to a parked request, now. */
static int parked_reply(struct tbd_session *s, uint64_t id, struct acq *out) {
  struct tbt_cap *c = tbt_cap_take_reply(s, id);
  int st;

  if (c == NULL)
    return PARKED;
  st = c->m->reply->status;
  snprintf(tbt_last_message, sizeof(tbt_last_message), "%s",
           c->m->reply->message ? c->m->reply->message : "");
  if (st == 0 && out != NULL && c->m->reply->acquire != NULL) {
    out->lease = c->m->reply->acquire->lease_id;
    out->version = c->m->reply->acquire->version;
  }
  tbt_cap_free(c);
  return st;
}

static int release(struct tbd_registry *r, struct tbd_session *s,
                   uint64_t lease) {
  return tbt_req_release(r, s, lease, 0, true);
}

static int simple(struct tbd_registry *r, struct tbd_session *s, int body,
                  const char *name, uint64_t id) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Subscribe sub = TENSORBROKER__V1__SUBSCRIBE__INIT;
  Tensorbroker__V1__BufferUnregister bu =
      TENSORBROKER__V1__BUFFER_UNREGISTER__INIT;
  Tensorbroker__V1__Forget fg = TENSORBROKER__V1__FORGET__INIT;

  q.body_case = body;
  sub.channel = (char *)name;
  q.subscribe = &sub; /* same layout for Unsubscribe */
  switch (body) {
  case TENSORBROKER__V1__REQUEST__BODY_BUFFER_UNREGISTER:
    bu.buffer_id = id;
    q.buffer_unregister = &bu;
    break;
  case TENSORBROKER__V1__REQUEST__BODY_FORGET:
    fg.buffer_id = id;
    q.forget = &fg;
    q.request_id = 0;
    return tbd_session_request(r, s, &q, NULL, 0);
  case TENSORBROKER__V1__REQUEST__BODY_UNSUBSCRIBE:
    q.unsubscribe = (Tensorbroker__V1__Unsubscribe *)&sub;
    break;
  default:
    break;
  }
  return tbt_req_send(r, s, &q, NULL, 0, NULL);
}

#define SUBSCRIBE TENSORBROKER__V1__REQUEST__BODY_SUBSCRIBE
#define UNSUBSCRIBE TENSORBROKER__V1__REQUEST__BODY_UNSUBSCRIBE
#define UNREGISTER TENSORBROKER__V1__REQUEST__BODY_BUFFER_UNREGISTER
#define FORGET TENSORBROKER__V1__REQUEST__BODY_FORGET

static int wait_free(struct tbd_registry *r, struct tbd_session *s,
                     const char *ch, uint64_t version, int64_t timeout,
                     uint64_t *req_id) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__WaitFree w = TENSORBROKER__V1__WAIT_FREE__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_WAIT_FREE;
  q.wait_free = &w;
  q.request_id = tbt_req_id();
  w.channel = (char *)ch;
  w.version = version;
  w.timeout_ms = timeout;
  if (req_id != NULL)
    *req_id = q.request_id;
  return tbt_req_send(r, s, &q, NULL, 0, NULL);
}

static struct tbd_counts counts(struct tbd_registry *r) {
  struct tbd_counts c;
  tbd_registry_counts(r, &c);
  return c;
}

/* Take the VersionFree notice for version v; returns its done events. */
static size_t expect_free(struct tbd_session *s, uint64_t v) {
  struct tbt_cap *c = tbt_cap_take_notice(s, N_FREE);
  size_t n;

  assert_non_null(c);
  assert_int_equal(c->m->notice->version_free->version, v);
  n = c->m->notice->version_free->n_done_events;
  tbt_cap_free(c);
  return n;
}

/* s's next notice is a NewVersion without a buffer or a ready event. */
static void expect_plain_new(struct tbd_session *s) {
  struct tbt_cap *m = tbt_cap_take_notice(s, N_NEW);

  assert_non_null(m);
  assert_null(m->m->notice->new_version->buffer);
  assert_null(m->m->notice->new_version->ready_event);
  tbt_cap_free(m);
}

/* ---- tests ---- */

static void test_publish_acquire_release(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  uint64_t b = buffer(r, p);
  struct acq a1, a2;

  (void)state;
  assert_int_equal(publish(r, p, "cam/frames", b, 0), 1);
  a1 = acquire(r, c, "cam/frames", LATEST, 0);
  assert_int_equal(a1.version, 1);
  assert_true(a1.fd_attached); /* first time: the memfd comes along */
  a2 = acquire(r, c, "cam/frames", LATEST, 0);
  assert_false(a2.fd_attached); /* already has it */
  assert_int_equal(counts(r).leases, 2);
  assert_tb_ok(release(r, c, a1.lease));
  assert_tb_ok(release(r, c, a2.lease));
  assert_int_equal(counts(r).leases, 0);
  /* still in history (depth 1): not free yet */
  assert_null(tbt_cap_take_notice(p, N_FREE));
  assert_int_equal(publish(r, p, "cam/frames", b, 0), 2);
  assert_int_equal(expect_free(p, 1), 0);
  assert_int_equal(counts(r).versions, 1);
  /* the other session's lease: not ours to release */
  a1 = acquire(r, c, "cam/frames", LATEST, 0);
  assert_tb_err(release(r, p, a1.lease), TB_EPERM);
  assert_tb_err(release(r, c, 9999), TB_ENOTFOUND);
  /* lease 0 is nobody's (the registry's lease table keeps an entry 0) */
  assert_tb_err(release(r, c, 0), TB_ENOTFOUND);
  assert_tb_err(release(r, p, 0), TB_ENOTFOUND);
  assert_int_equal(counts(r).leases, 1);
  /* one-way release: no reply */
  assert_tb_ok(tbt_req_release(r, c, a1.lease, 0, false));
  assert_int_equal(tbt_caps_count(c), 0);
  assert_int_equal(counts(r).leases, 0);
  tbt_registry_free(r);
}

static void test_history_depth_3(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  uint64_t b = buffer(r, p);
  struct acq a;

  (void)state;
  for (int i = 1; i <= 3; i++)
    assert_int_equal(publish(r, p, "x", b, 3), (uint64_t)i);
  assert_int_equal(counts(r).versions, 3);
  assert_null(tbt_cap_take_notice(p, N_FREE));
  a = acquire(r, c, "x", EXACT, 1);
  assert_int_equal(a.version, 1);
  publish(r, p, "x", b, 0); /* 4: 1 leaves history but is leased */
  assert_null(tbt_cap_take_notice(p, N_FREE));
  assert_int_equal(counts(r).versions, 4);
  publish(r, p, "x", b, 0); /* 5: 2 leaves history, unleased: freed */
  assert_int_equal(expect_free(p, 2), 0);
  assert_tb_ok(release(r, c, a.lease));
  assert_int_equal(expect_free(p, 1), 0);
  assert_int_equal(counts(r).versions, 3);
  /* depth back to 1: two more leave */
  publish(r, p, "x", b, 1);
  assert_int_equal(counts(r).versions, 1);
  assert_int_equal(tbt_cap_drop_notices(p, N_FREE), 3);
  tbt_registry_free(r);
}

static void test_done_events_collected(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c1 = session(r, 11),
                     *c2 = session(r, 12);
  uint64_t b = buffer(r, p), e1 = event(r, c1), e2 = event(r, c2);
  struct acq a1, a1b, a2;
  struct tbt_cap *m;

  (void)state;
  publish(r, p, "x", b, 0);
  a1 = acquire(r, c1, "x", LATEST, 0);
  a1b = acquire(r, c1, "x", LATEST, 0);
  a2 = acquire(r, c2, "x", LATEST, 0);
  publish(r, p, "x", b, 0); /* 1 leaves history, three leases left */
  assert_null(tbt_cap_take_notice(p, N_FREE));
  /* someone else's event is refused and changes nothing */
  assert_tb_err(tbt_req_release(r, c1, a1.lease, e2, true), TB_EPERM);
  assert_tb_ok(tbt_req_release(r, c1, a1.lease, e1, true));
  assert_tb_ok(tbt_req_release(r, c1, a1b.lease, e1, true)); /* same event */
  assert_null(tbt_cap_take_notice(p, N_FREE));
  assert_tb_ok(tbt_req_release(r, c2, a2.lease, e2, true));
  m = tbt_cap_take_notice(p, N_FREE);
  assert_non_null(m);
  assert_int_equal(m->m->notice->version_free->version, 1);
  assert_int_equal(m->m->notice->version_free->buffer_id, b);
  assert_int_equal(m->m->notice->version_free->n_done_events, 2);
  assert_int_equal(m->m->notice->version_free->done_events[0]->event_id, e1);
  assert_int_equal(m->m->notice->version_free->done_events[1]->event_id, e2);
  assert_int_equal(m->m->notice->version_free->done_events[1]->owner_pid, 12);
  tbt_cap_free(m);
  tbt_registry_free(r);
}

/* Publish.ready_complete reaches every acquirer of that version, and only
 * of that version; a consumer's done event never claims it. */
static void test_ready_complete(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  uint64_t b = buffer(r, p), e = event(r, p), ce = event(r, c);
  struct pub busy = {.depth = 4, .meta_len = 3, .event = e};
  struct pub done = {.depth = 4, .meta_len = 3, .event = e, .complete = true};
  struct pub none = {.depth = 4, .meta_len = 3, .complete = true};
  struct acq a1, a2, a3;
  struct tbt_cap *m;

  (void)state;
  assert_tb_ok(publish_ex(r, p, "x", b, &busy, NULL));
  assert_tb_ok(publish_ex(r, p, "x", b, &done, NULL));
  assert_tb_ok(publish_ex(r, p, "x", b, &none, NULL));
  a1 = acquire(r, c, "x", EXACT, 1);
  a2 = acquire(r, c, "x", EXACT, 2);
  a3 = acquire(r, c, "x", EXACT, 3);
  assert_int_equal(a1.ready_event, e);
  assert_false(a1.ready_complete);
  assert_int_equal(a2.ready_event, e);
  assert_true(a2.ready_complete);
  assert_int_equal(a3.ready_event, 0); /* no event: nothing to flag */
  assert_false(a3.ready_complete);
  assert_tb_ok(tbt_req_release(r, c, a1.lease, ce, true));
  assert_tb_ok(tbt_req_release(r, c, a2.lease, 0, true));
  assert_tb_ok(tbt_req_release(r, c, a3.lease, 0, true));
  publish(r, p, "x", b, 1); /* 1..3 leave history, all released */
  for (int i = 0; i < 3; i++) { /* one notice per version, any order */
    Tensorbroker__V1__VersionFree *vf;
    m = tbt_cap_take_notice(p, N_FREE);
    assert_non_null(m);
    vf = m->m->notice->version_free;
    assert_in_range(vf->version, 1, 3);
    /* only version 1 was released with a done event, never "complete" */
    assert_int_equal(vf->n_done_events, vf->version == 1 ? 1 : 0);
    if (vf->version == 1)
      assert_false(vf->done_events[0]->complete);
    tbt_cap_free(m);
  }
  assert_null(tbt_cap_take_notice(p, N_FREE));
  tbt_registry_free(r);
}

static void test_consumer_close_releases(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  uint64_t b = buffer(r, p);

  (void)state;
  publish(r, p, "x", b, 0);
  acquire(r, c, "x", LATEST, 0);
  acquire(r, c, "x", LATEST, 0);
  simple(r, c, SUBSCRIBE, "x", 0);
  publish(r, p, "x", b, 0);
  assert_null(tbt_cap_take_notice(p, N_FREE));
  tbd_session_close(r, c); /* crashed consumer */
  assert_int_equal(expect_free(p, 1), 0); /* no done events */
  assert_int_equal(counts(r).leases, 0);
  assert_int_equal(counts(r).subscriptions, 0);
  assert_int_equal(counts(r).sessions, 1);
  tbt_registry_free(r);
}

static void test_producer_close(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11),
                     *sub = session(r, 12), *w = session(r, 13),
                     *p2 = session(r, 14);
  uint64_t b = buffer(r, p), b2;
  uint64_t id;
  struct acq a;
  struct tbt_cap *m;

  (void)state;
  simple(r, sub, SUBSCRIBE, "x", 0);
  publish(r, p, "x", b, 0);
  assert_int_equal(tbt_cap_drop_notices(sub, N_NEW), 1);
  a = acquire(r, c, "x", LATEST, 0);
  assert_int_equal(acquire_ex(r, w, "x", NEXT, 1, -1, NULL, &id), PARKED);
  tbd_session_close(r, p);
  /* subscriber and lease holder are told, once each */
  assert_int_equal(tbt_cap_drop_notices(sub, N_CLOSED), 1);
  m = tbt_cap_take_notice(c, N_CLOSED);
  assert_non_null(m);
  assert_string_equal(m->m->notice->channel_closed->channel, "x");
  tbt_cap_free(m);
  assert_null(tbt_cap_take_notice(c, N_CLOSED));
  /* the parked acquire waits on, for a new producer */
  assert_int_equal(parked_reply(w, id, NULL), PARKED);
  /* host memory outlives its producer: what was published stays readable */
  assert_int_equal(acquire(r, c, "x", EXACT, 1).version, 1);
  assert_int_equal(acquire(r, c, "x", LATEST, 0).version, 1);
  /* nothing newer, and nobody to publish it: at once with timeout 0 */
  assert_int_equal(acquire_ex(r, c, "x", NEXT, 1, 0, NULL, NULL), TB_ECLOSED);
  assert_string_equal(tbt_last_message,
                      "channel 'x' has no producer: its publisher ended (pid "
                      "10: publisher disconnected) and no version after 1 is "
                      "left that can be granted");
  assert_int_equal(acquire_ex(r, c, "x", EXACT, 2, 0, NULL, NULL),
                   TB_ENOTFOUND);
  assert_tb_ok(release(r, c, a.lease));
  /* a new publisher takes it over, the numbering continues, and the
   * parked acquire gets its version */
  b2 = buffer(r, p2);
  assert_int_equal(publish(r, p2, "x", b2, 0), 2);
  assert_int_equal(parked_reply(w, id, &a), 0);
  assert_int_equal(a.version, 2);
  tbt_registry_free(r);
}

/* ChannelClosed says how the publisher left. A session that promised a
 * Goodbye (Hello.says_goodbye) and hung up without it: "ended without
 * closing", naming the newest leased version published with GPU work in
 * flight (a stream waiting on it may never complete); with its Goodbye,
 * without the promise (an older client), or dropped by the daemon rather
 * than hung up: "publisher disconnected". */
static void test_producer_close_reason(void **state) {
  static const struct {
    bool says, said, hung, busy;
    const char *want;
  } cases[] = {
      {false, false, true, true, "publisher disconnected"},
      {true, true, true, true, "publisher disconnected"},
      {true, false, false, true, "publisher disconnected"},
      {true, false, true, false, "publisher ended without closing its "
                                 "session"},
      {true, false, true, true, "publisher ended without closing its "
                                "session; GPU work of version 2 may never "
                                "finish"},
  };
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *c = session(r, 11);

  (void)state;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    req_t q = TENSORBROKER__V1__REQUEST__INIT;
    Tensorbroker__V1__Hello h = TENSORBROKER__V1__HELLO__INIT;
    Tensorbroker__V1__Goodbye gb = TENSORBROKER__V1__GOODBYE__INIT;
    struct tbd_session *p;
    struct acq a1, a2;
    struct tbt_cap *m;
    char ch[8];

    assert_tb_ok(tbd_session_open(r, 20 + (pid_t)i, 1000, 1000, NULL, &p));
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
    q.hello = &h;
    h.protocol_version = 1;
    h.says_goodbye = cases[i].says;
    assert_tb_ok(tbt_req_send(r, p, &q, NULL, 0, NULL));
    {
      uint64_t b = buffer(r, p), e = event(r, p);
      struct pub o = {.depth = 4, .meta_len = 3, .event = e,
                      .complete = !cases[i].busy};
      snprintf(ch, sizeof(ch), "x%zu", i);
      /* versions 1 and 2 leased, 3 not: only leased ones are named */
      for (int k = 0; k < 3; k++)
        assert_tb_ok(publish_ex(r, p, ch, b, &o, NULL));
    }
    a1 = acquire(r, c, ch, EXACT, 1);
    a2 = acquire(r, c, ch, EXACT, 2);
    if (cases[i].said) {
      req_t g = TENSORBROKER__V1__REQUEST__INIT;
      g.body_case = TENSORBROKER__V1__REQUEST__BODY_GOODBYE;
      g.goodbye = &gb;
      assert_tb_ok(tbd_session_request(r, p, &g, NULL, 0));
      assert_null(tbt_cap_take_reply(p, 0)); /* one-way */
    }
    if (cases[i].hung)
      tbd_session_hung_up(p);
    assert_int_equal(tbd_session_abrupt(p),
                     strncmp(cases[i].want, "publisher ended", 15) == 0);
    tbd_session_close(r, p);
    m = tbt_cap_take_notice(c, N_CLOSED);
    assert_non_null(m);
    assert_string_equal(m->m->notice->channel_closed->channel, ch);
    assert_string_equal(m->m->notice->channel_closed->reason, cases[i].want);
    /* the version named in the reason, as a number too */
    assert_int_equal(m->m->notice->channel_closed->unfinished_version,
                     strstr(cases[i].want, "version 2") != NULL ? 2 : 0);
    tbt_cap_free(m);
    assert_tb_ok(release(r, c, a1.lease));
    assert_tb_ok(release(r, c, a2.lease));
  }
  tbt_registry_free(r);
}

/* A session that promised a Goodbye (Hello.says_goodbye). */
static struct tbd_session *session_says_goodbye(struct tbd_registry *r,
                                                pid_t pid) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Hello h = TENSORBROKER__V1__HELLO__INIT;
  struct tbd_session *s;

  assert_tb_ok(tbd_session_open(r, pid, 1000, 1000, NULL, &s));
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
  q.hello = &h;
  h.protocol_version = 1;
  h.says_goodbye = true;
  assert_tb_ok(tbt_req_send(r, s, &q, NULL, 0, NULL));
  return s;
}

/* A CUDA IPC producer ends (here: killed, no Goodbye): its versions' memory
 * died with it. None is granted again (LATEST, NEXT, EXACT, Hello.channels),
 * none stays in the history; a lease held before keeps its version until
 * it is released, then the version and its buffer are freed. Acquires get
 * TB_ECLOSED saying the producer is gone, at once (timeout 0) or when
 * their wait runs out, never TB_ETIMEDOUT. The channel stays, closed,
 * with its version numbers. */
static void test_cuda_producer_gone(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session_says_goodbye(r, 10), *c = session(r, 11),
                     *sub = session(r, 12), *named;
  uint64_t b = cuda_buffer(r, p, 0x11), e = event(r, p), id;
  struct pub gpu = {.dev_type = kDLCUDA, .depth = 3, .meta_len = 3,
                    .event = e, .complete = true};
  const char *names[] = {"g"};
  const char *gone = "channel 'g' has no producer: its publisher ended (pid "
                     "10: publisher ended without closing its session) and "
                     "no version is left that can be granted";
  struct tbd_channel *ch;
  struct acq a;
  struct tbt_cap *m;

  (void)state;
  assert_tb_ok(simple(r, sub, SUBSCRIBE, "g", 0));
  for (int i = 1; i <= 3; i++)
    assert_tb_ok(publish_ex(r, p, "g", b, &gpu, NULL));
  assert_int_equal(tbt_cap_drop_notices(sub, N_NEW), 3);
  a = acquire(r, c, "g", EXACT, 2);
  tbd_session_hung_up(p);
  tbd_session_close(r, p);
  /* the notices are as before */
  assert_int_equal(tbt_cap_drop_notices(sub, N_CLOSED), 1);
  assert_int_equal(tbt_cap_drop_notices(c, N_CLOSED), 1);
  /* 1 and 3 freed at once; 2 is kept for its lease, out of the history */
  assert_int_equal(counts(r).versions, 1);
  assert_int_equal(counts(r).buffers, 1);
  assert_int_equal(counts(r).channels, 1);
  ch = tbd__channel_find(r, "g");
  assert_non_null(ch);
  assert_null(ch->publisher);
  assert_int_equal(ch->latest, 3);

  assert_int_equal(acquire_ex(r, c, "g", LATEST, 0, 0, NULL, NULL),
                   TB_ECLOSED);
  assert_string_equal(tbt_last_message, gone);
  assert_int_equal(acquire_ex(r, c, "g", NEXT, 0, 0, NULL, NULL), TB_ECLOSED);
  assert_string_equal(tbt_last_message,
                      "channel 'g' has no producer: its publisher ended (pid "
                      "10: publisher ended without closing its session) and "
                      "no version after 0 is left that can be granted");
  /* EXACT: the versions that died say so, leased or freed; others are
   * not found, as ever */
  for (uint64_t v = 1; v <= 3; v++) {
    char want[128];
    assert_int_equal(acquire_ex(r, c, "g", EXACT, v, -1, NULL, NULL),
                     TB_ECLOSED);
    snprintf(want, sizeof(want), "version %llu of 'g' is gone: its CUDA IPC "
             "memory died with its producer (pid 10)", (unsigned long long)v);
    assert_string_equal(tbt_last_message, want);
  }
  assert_int_equal(acquire_ex(r, c, "g", EXACT, 0, 0, NULL, NULL),
                   TB_ENOTFOUND);
  assert_int_equal(acquire_ex(r, c, "g", EXACT, 4, 0, NULL, NULL),
                   TB_ENOTFOUND);
  /* a wait that runs out: the producer is gone, not a timeout */
  assert_int_equal(acquire_ex(r, c, "g", LATEST, 0, 200, NULL, &id), PARKED);
  fake_now += 200;
  tbd_registry_expire(r);
  assert_int_equal(parked_reply(c, id, NULL), TB_ECLOSED);
  assert_string_equal(tbt_last_message, gone);
  /* a session naming the channel at connect is sent no dead buffer */
  assert_tb_ok(tbd_session_open(r, 13, 1000, 1000, NULL, &named));
  assert_tb_ok(hello_ex(r, named, true, true, names, 1, &m));
  assert_int_equal(m->m->reply->hello->n_latest, 0);
  tbt_cap_free(m);

  /* the lease held works on: WaitFree sees it, the release frees the
   * version and its buffer */
  assert_int_equal(wait_free(r, sub, "g", 2, 0, NULL), TB_EBUSY);
  assert_int_equal(wait_free(r, sub, "g", 2, -1, &id), PARKED);
  assert_null(tbt_cap_take_notice(c, N_RETIRED));
  assert_tb_ok(release(r, c, a.lease));
  assert_int_equal(parked_reply(sub, id, NULL), 0);
  m = tbt_cap_take_notice(c, N_RETIRED);
  assert_non_null(m);
  assert_int_equal(m->m->notice->buffer_retired->buffer_id, b);
  tbt_cap_free(m);
  assert_int_equal(counts(r).versions, 0);
  assert_int_equal(counts(r).buffers, 0);
  assert_int_equal(counts(r).leases, 0);
  assert_int_equal(counts(r).channels, 1);
  assert_int_equal(acquire_ex(r, c, "g", EXACT, 2, 0, NULL, NULL), TB_ECLOSED);
  tbt_registry_free(r);
}

/* Acquires parked on a CUDA channel stay parked when its producer ends
 * (Goodbye or not) and are granted the next producer's first version,
 * numbered after the dead one's; the new producer takes the channel over. */
static void test_cuda_producer_restarts(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *w1 = session_prefetch(r, 11),
                     *w2 = session(r, 12), *w3 = session(r, 13), *p2;
  uint64_t b = cuda_buffer(r, p, 0x11), b2, id1, id2, id3;
  struct pub gpu = {.dev_type = kDLCUDA, .meta_len = 3};
  struct acq a;

  (void)state;
  for (int i = 1; i <= 3; i++)
    assert_tb_ok(publish_ex(r, p, "g", b, &gpu, NULL));
  assert_int_equal(acquire_ex(r, w1, "g", NEXT, 3, -1, NULL, &id1), PARKED);
  assert_int_equal(acquire_ex(r, w2, "g", NEXT, 3, 5000, NULL, &id2), PARKED);
  assert_tb_ok(simple(r, w1, SUBSCRIBE, "g", 0));
  tbd_session_close(r, p);
  assert_int_equal(tbt_cap_drop_notices(w1, N_CLOSED), 1);
  assert_int_equal(parked_reply(w1, id1, NULL), PARKED);
  assert_int_equal(parked_reply(w2, id2, NULL), PARKED);
  assert_int_equal(counts(r).waits, 2);
  assert_int_equal(counts(r).versions, 0);
  /* LATEST waits as well once its producer is gone */
  assert_int_equal(acquire_ex(r, w3, "g", LATEST, 0, 5000, NULL, &id3),
                   PARKED);
  assert_int_equal(acquire_ex(r, w3, "g", LATEST, 0, 0, NULL, NULL),
                   TB_ECLOSED);
  assert_string_equal(tbt_last_message,
                      "channel 'g' has no producer: its publisher ended (pid "
                      "10: publisher disconnected) and no version is left "
                      "that can be granted");
  fake_now += 100; /* within every timeout */
  tbd_registry_expire(r);
  /* a waiter that goes away while it waits takes only its wait along */
  {
    struct tbd_session *gone = session(r, 15);
    assert_int_equal(acquire_ex(r, gone, "g", LATEST, 0, -1, NULL, NULL),
                     PARKED);
    assert_int_equal(counts(r).waits, 4);
    tbd_session_close(r, gone);
    assert_int_equal(counts(r).waits, 3);
  }

  assert_tb_ok(tbd_session_open(r, 14, 1000, 1000, NULL, &p2));
  assert_tb_ok(tbt_req_hello(r, p2, "restarted"));
  b2 = cuda_buffer(r, p2, 0x22);
  assert_tb_ok(publish_ex(r, p2, "g", b2, &gpu, NULL));
  assert_int_equal(parked_reply(w1, id1, &a), 0);
  assert_int_equal(a.version, 4);
  assert_int_equal(parked_reply(w2, id2, &a), 0);
  assert_int_equal(a.version, 4);
  assert_int_equal(parked_reply(w3, id3, &a), 0);
  assert_int_equal(a.version, 4);
  /* the subscriber's notice comes after its reply, and plain: its acquire
   * brought the buffer */
  expect_plain_new(w1);
  assert_int_equal(acquire(r, w2, "g", LATEST, 0).version, 4);
  /* the dead producer's versions stay dead */
  assert_int_equal(acquire_ex(r, w2, "g", EXACT, 3, 0, NULL, NULL),
                   TB_ECLOSED);
  /* the channel is the new producer's now */
  assert_non_null(tbd__channel_find(r, "g"));
  assert_ptr_equal(tbd__channel_find(r, "g")->publisher, p2);
  assert_tb_err(publish_ex(r, w3, "g", cuda_buffer(r, w3, 0x33), &gpu, NULL),
                TB_EBUSY);
  tbt_registry_free(r);
}

/* Host versions outlive their producer; CUDA ones among them do not. EXACT
 * of a CUDA version that died: TB_ECLOSED until the history moves past it
 * (a later publish pushes out the host version before it), then
 * TB_ENOTFOUND as for any version gone from the history. Versions that had
 * left the history before the producer ended were never "died". */
static void test_mixed_kinds_producer_gone(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11), *p2;
  uint64_t cb = cuda_buffer(r, p, 0x11), hb = buffer(r, p), hb2;
  struct pub gpu = {.dev_type = kDLCUDA, .depth = 3, .meta_len = 3};

  (void)state;
  assert_tb_ok(publish_ex(r, p, "m", cb, &gpu, NULL)); /* 1: pushed out */
  assert_tb_ok(publish_ex(r, p, "m", cb, &gpu, NULL)); /* 2 */
  assert_int_equal(publish(r, p, "m", hb, 3), 3);
  assert_tb_ok(publish_ex(r, p, "m", cb, &gpu, NULL)); /* 4 */
  assert_int_equal(counts(r).versions, 3);
  tbd_session_close(r, p);
  assert_int_equal(counts(r).versions, 1);
  /* the host version is granted, however asked for */
  assert_int_equal(acquire(r, c, "m", LATEST, 0).version, 3);
  assert_int_equal(acquire(r, c, "m", NEXT, 0).version, 3);
  assert_int_equal(acquire(r, c, "m", EXACT, 3).version, 3);
  assert_int_equal(acquire_ex(r, c, "m", NEXT, 3, 0, NULL, NULL), TB_ECLOSED);
  assert_int_equal(acquire_ex(r, c, "m", EXACT, 1, 0, NULL, NULL),
                   TB_ENOTFOUND);
  assert_int_equal(acquire_ex(r, c, "m", EXACT, 2, 0, NULL, NULL), TB_ECLOSED);
  assert_int_equal(acquire_ex(r, c, "m", EXACT, 4, 0, NULL, NULL), TB_ECLOSED);
  /* a new producer with history 1 pushes version 3 out (c's leases keep
   * it, not in the history) */
  assert_tb_ok(tbd_session_open(r, 12, 1000, 1000, NULL, &p2));
  assert_tb_ok(tbt_req_hello(r, p2, "next"));
  hb2 = buffer(r, p2);
  assert_int_equal(publish(r, p2, "m", hb2, 1), 5);
  assert_int_equal(acquire_ex(r, c, "m", EXACT, 2, 0, NULL, NULL), TB_ECLOSED);
  tbd_session_close(r, c); /* its leases end: version 3 is freed */
  c = session(r, 13);
  assert_int_equal(acquire_ex(r, c, "m", EXACT, 3, 0, NULL, NULL),
                   TB_ENOTFOUND);
  assert_int_equal(acquire_ex(r, c, "m", EXACT, 2, 0, NULL, NULL),
                   TB_ENOTFOUND);
  assert_int_equal(acquire_ex(r, c, "m", EXACT, 4, 0, NULL, NULL), TB_ECLOSED);
  assert_int_equal(acquire(r, c, "m", LATEST, 0).version, 5);
  tbt_registry_free(r);
}

static void test_buffer_retire(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  uint64_t b = buffer(r, p), b2 = buffer(r, p);
  struct acq a;
  struct tbt_cap *m;

  (void)state;
  publish(r, p, "x", b, 0);
  a = acquire(r, c, "x", LATEST, 0);
  assert_tb_err(simple(r, c, UNREGISTER, NULL, b), TB_EPERM);
  assert_tb_ok(simple(r, p, UNREGISTER, NULL, b));
  assert_tb_err(simple(r, p, UNREGISTER, NULL, b), TB_ENOTFOUND);
  /* retired: no new publish, but the held version still reads */
  assert_tb_err(publish_ex(r, p, "x", b, NULL, NULL), TB_ENOTFOUND);
  assert_int_equal(counts(r).buffers, 2);
  assert_null(tbt_cap_take_notice(c, N_RETIRED));
  publish(r, p, "x", b2, 0); /* v1 leaves history, still leased */
  assert_null(tbt_cap_take_notice(c, N_RETIRED));
  assert_tb_ok(release(r, c, a.lease));
  m = tbt_cap_take_notice(c, N_RETIRED);
  assert_non_null(m);
  assert_int_equal(m->m->notice->buffer_retired->buffer_id, b);
  tbt_cap_free(m);
  assert_int_equal(counts(r).buffers, 1);
  tbt_registry_free(r);
}

static void test_forget_reattaches(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  uint64_t b = buffer(r, p);
  struct acq a;

  (void)state;
  publish(r, p, "x", b, 0);
  a = acquire(r, c, "x", LATEST, 0);
  assert_true(a.fd_attached);
  release(r, c, a.lease);
  assert_tb_ok(simple(r, c, FORGET, NULL, b));
  assert_int_equal(tbt_caps_count(c), 0); /* one-way */
  a = acquire(r, c, "x", LATEST, 0);
  assert_true(a.fd_attached);
  tbt_registry_free(r);
}

/* A session's acquires remember their channel (no name check, no lookup
 * while it is the same name, until any channel is freed); a bad name is
 * still refused. */
static void test_recent_channel(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  uint64_t b = buffer(r, p);
  struct acq a;

  (void)state;
  publish(r, p, "x", b, 0);
  publish(r, p, "y", b, 0);
  a = acquire(r, c, "x", LATEST, 0);
  assert_non_null(tbd__channel_find(r, "x"));
  assert_ptr_equal(tbd__channel_recent(r, c, "x"), tbd__channel_find(r, "x"));
  assert_null(tbd__channel_recent(r, c, "y"));
  assert_null(tbd__channel_recent(r, p, "x")); /* per session */
  assert_int_equal(acquire_ex(r, c, "../x", LATEST, 0, 0, NULL, NULL),
                   TB_ENAME);
  assert_int_equal(acquire(r, c, "y", LATEST, 0).version, 1);
  assert_ptr_equal(tbd__channel_recent(r, c, "y"), tbd__channel_find(r, "y"));
  assert_null(tbd__channel_recent(r, c, "x"));
  assert_tb_ok(release(r, c, a.lease));
  tbt_registry_free(r);
}

static void test_modes(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  uint64_t b = buffer(r, p), id;
  struct acq a;

  (void)state;
  /* nothing yet */
  assert_int_equal(acquire_ex(r, c, "x", LATEST, 0, 0, NULL, NULL),
                   TB_ENOTFOUND);
  assert_int_equal(acquire_ex(r, c, "x", EXACT, 1, -1, NULL, NULL),
                   TB_ENOTFOUND);
  for (int i = 0; i < 3; i++)
    publish(r, p, "x", b, 3);
  assert_int_equal(acquire(r, c, "x", LATEST, 0).version, 3);
  assert_int_equal(acquire(r, c, "x", NEXT, 0).version, 1);
  assert_int_equal(acquire(r, c, "x", NEXT, 1).version, 2);
  assert_int_equal(acquire(r, c, "x", EXACT, 2).version, 2);
  assert_int_equal(acquire_ex(r, c, "x", EXACT, 4, -1, NULL, NULL),
                   TB_ENOTFOUND);
  assert_int_equal(acquire_ex(r, c, "x", NEXT, 3, 0, NULL, NULL), TB_EAGAIN);
  /* NEXT waits for the next publish */
  assert_int_equal(acquire_ex(r, c, "x", NEXT, 3, 5000, NULL, &id), PARKED);
  assert_int_equal(counts(r).waits, 1);
  publish(r, p, "x", b, 0);
  assert_int_equal(parked_reply(c, id, &a), 0);
  assert_int_equal(a.version, 4);
  assert_int_equal(counts(r).waits, 0);
  /* timeouts, on the fake clock */
  assert_int_equal(acquire_ex(r, c, "x", NEXT, 4, 250, NULL, &id), PARKED);
  assert_int_equal(tbd_registry_next_deadline(r), fake_now + 250);
  fake_now += 249;
  tbd_registry_expire(r);
  assert_int_equal(parked_reply(c, id, NULL), PARKED);
  fake_now += 1;
  tbd_registry_expire(r);
  assert_int_equal(parked_reply(c, id, NULL), TB_ETIMEDOUT);
  assert_int_equal(tbd_registry_next_deadline(r), UINT64_MAX);
  /* LATEST on a channel that does not exist yet waits for it */
  assert_int_equal(acquire_ex(r, c, "y", LATEST, 0, -1, NULL, &id), PARKED);
  publish(r, p, "y", b, 0);
  assert_int_equal(parked_reply(c, id, &a), 0);
  assert_int_equal(a.version, 1);
  tbt_registry_free(r);
}

/* A Cancel of request_id from s; its status. */
static int cancel(struct tbd_registry *r, struct tbd_session *s,
                  uint64_t request_id) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Cancel cn = TENSORBROKER__V1__CANCEL__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_CANCEL;
  q.cancel = &cn;
  cn.request_id = request_id;
  return tbt_req_send(r, s, &q, NULL, 0, NULL);
}

/* One page of ListWaits after (session, request); its entries' session
 * and request ids into sid and rid (room for max), how many in *n;
 * returns whether more follow. */
static bool list_waits_page(struct tbd_registry *r, struct tbd_session *s,
                            uint64_t after_sid, uint64_t after_rid,
                            uint64_t *sid, uint64_t *rid, size_t max,
                            size_t *n) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__ListWaits lw = TENSORBROKER__V1__LIST_WAITS__INIT;
  struct tbt_cap *c;
  bool more;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_WAITS;
  q.list_waits = &lw;
  lw.after_session_id = after_sid;
  lw.after_request_id = after_rid;
  assert_tb_ok(tbt_req_send(r, s, &q, NULL, 0, &c));
  *n = c->m->reply->list_waits->n_waits;
  assert_true(*n <= max);
  for (size_t i = 0; i < *n; i++) {
    sid[i] = c->m->reply->list_waits->waits[i]->session_id;
    rid[i] = c->m->reply->list_waits->waits[i]->request_id;
  }
  more = c->m->reply->list_waits->more;
  tbt_cap_free(c);
  return more;
}

/* A session parks several requests (FEATURE_MULTI_WAIT): acquires on two
 * channels and a WaitFree. Each is answered on its own, by its request
 * id, in the order its event comes (not the order they parked); a Cancel
 * drops the one it names and leaves the others; a deadline ends only its
 * own; the session's end drops all that are left. */
static void test_several_waits(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  struct tbd_session *q = session(r, 12);
  uint64_t b = buffer(r, p), ida, idb, idf, idx, sid[8], rid[8];
  struct acq a, held;
  size_t n;

  (void)state;
  publish(r, p, "f", b, 1);
  held = acquire(r, q, "f", LATEST, 0);
  publish(r, p, "f", b, 1); /* version 1 leaves the history, still held */
  assert_int_equal(acquire_ex(r, c, "a", NEXT, 0, 5000, NULL, &ida), PARKED);
  assert_int_equal(acquire_ex(r, c, "b", LATEST, 0, -1, NULL, &idb), PARKED);
  assert_int_equal(wait_free(r, c, "f", 1, -1, &idf), PARKED);
  assert_int_equal(acquire_ex(r, c, "x", LATEST, 0, 300, NULL, &idx), PARKED);
  assert_int_equal(counts(r).waits, 4);
  /* the operator's view lists each, by request id */
  assert_false(list_waits_page(r, q, 0, 0, sid, rid, 8, &n));
  assert_int_equal(n, 4);
  assert_int_equal(rid[0], ida);
  assert_int_equal(rid[1], idb);
  assert_int_equal(rid[2], idf);
  assert_int_equal(rid[3], idx);

  /* the second acquire is answered first; the first still waits */
  publish(r, p, "b", b, 0);
  assert_int_equal(parked_reply(c, idb, &a), 0);
  assert_int_equal(a.version, 1);
  assert_int_equal(parked_reply(c, ida, NULL), PARKED);
  assert_int_equal(parked_reply(c, idf, NULL), PARKED);
  assert_tb_ok(release(r, c, a.lease));
  /* the WaitFree, when its version is freed */
  assert_tb_ok(release(r, q, held.lease));
  assert_int_equal(expect_free(p, 1), 0);
  assert_int_equal(parked_reply(c, idf, NULL), 0);
  assert_int_equal(parked_reply(c, ida, NULL), PARKED);
  /* a deadline ends its own wait only */
  fake_now += 300;
  tbd_registry_expire(r);
  assert_int_equal(parked_reply(c, idx, NULL), TB_ETIMEDOUT);
  assert_int_equal(parked_reply(c, ida, NULL), PARKED);
  assert_int_equal(counts(r).waits, 1);
  /* a Cancel drops the one it names, answered without a reply; one of a
   * request answered already changes nothing */
  assert_int_equal(acquire_ex(r, c, "b", NEXT, 1, -1, NULL, &idb), PARKED);
  assert_tb_ok(cancel(r, c, idx));
  assert_tb_ok(cancel(r, c, ida));
  assert_int_equal(counts(r).waits, 1);
  publish(r, p, "a", b, 0);
  assert_int_equal(parked_reply(c, ida, NULL), PARKED); /* never answered */
  publish(r, p, "b", b, 0);
  assert_int_equal(parked_reply(c, idb, &a), 0);
  assert_int_equal(a.version, 2);
  assert_tb_ok(release(r, c, a.lease));
  /* the session ends with several parked: all dropped */
  assert_int_equal(acquire_ex(r, c, "a", NEXT, 1, 5000, NULL, NULL), PARKED);
  assert_int_equal(acquire_ex(r, c, "y", LATEST, 0, -1, NULL, NULL), PARKED);
  assert_int_equal(wait_free(r, c, "f", 2, 9000, NULL), PARKED);
  assert_int_equal(counts(r).waits, 3);
  tbd_session_close(r, c);
  assert_int_equal(counts(r).waits, 0);
  assert_null(tbd__waitq_find(r, "a"));
  assert_null(tbd__waitq_find(r, "y"));
  assert_int_equal(tbd_registry_next_deadline(r), UINT64_MAX);
  tbt_registry_free(r);
}

/* --max-waits bounds a session's parked requests: one more is refused
 * with TB_ELIMIT naming the flag and changes nothing; another session
 * still parks, and so does this one once a wait ended. */
static void test_waits_limit(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *p, *c, *d;
  uint64_t b, id;
  struct acq a;

  (void)state;
  tbd_limits_default(&lim);
  assert_int_equal(lim.max_waits, 64);
  lim.max_waits = 2;
  r = reg_new(&lim);
  p = session(r, 10);
  c = session(r, 11);
  d = session(r, 12);
  b = buffer(r, p);
  publish(r, p, "f", b, 0);
  assert_int_equal(acquire_ex(r, c, "a", LATEST, 0, -1, NULL, &id), PARKED);
  assert_int_equal(acquire_ex(r, c, "b", LATEST, 0, -1, NULL, NULL), PARKED);
  assert_int_equal(acquire_ex(r, c, "c", LATEST, 0, -1, NULL, NULL),
                   TB_ELIMIT);
  assert_string_equal(tbt_last_message,
                      "session has 2 parked requests (--max-waits)");
  assert_int_equal(wait_free(r, c, "f", 1, -1, NULL), TB_ELIMIT);
  assert_int_equal(counts(r).waits, 2);
  assert_null(tbd__waitq_find(r, "c"));
  /* per session: another one parks */
  assert_int_equal(acquire_ex(r, d, "c", LATEST, 0, -1, NULL, NULL), PARKED);
  /* a request that does not wait is answered as ever */
  assert_int_equal(acquire(r, c, "f", LATEST, 0).version, 1);
  publish(r, p, "a", b, 0);
  assert_int_equal(parked_reply(c, id, &a), 0);
  assert_int_equal(acquire_ex(r, c, "c", LATEST, 0, -1, NULL, NULL), PARKED);
  tbt_registry_free(r);
}

/* ListWaits pages end inside a session's waits when they must: the
 * cursor (session id, request id) goes on from there, and every wait is
 * listed once, in order. A cursor without a request id (older clients)
 * goes on after the whole session. */
static void test_list_waits_pages(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *c, *d, *op;
  uint64_t sid[256], rid[256], want[100], after_s = 0, after_r = 0;
  size_t n, total = 0, pages = 0;
  char name[200];
  bool more;

  (void)state;
  tbd_limits_default(&lim);
  lim.max_message = 4096; /* a few waits per page */
  lim.max_waits = 100;
  r = reg_new(&lim);
  c = session(r, 11);
  d = session(r, 12);
  op = session(r, 13);
  for (int i = 0; i < 60; i++) {
    snprintf(name, sizeof(name), "%0150d", i); /* long: few per page */
    assert_int_equal(acquire_ex(r, i < 50 ? c : d, name, LATEST, 0, -1, NULL,
                                &want[i]),
                     PARKED);
  }
  do {
    more = list_waits_page(r, op, after_s, after_r, sid, rid, 256, &n);
    assert_true(n > 0);
    for (size_t i = 0; i < n; i++, total++) {
      assert_true(total < 60);
      assert_int_equal(sid[i], tbd_session_id(total < 50 ? c : d));
      assert_int_equal(rid[i], want[total]);
    }
    after_s = sid[n - 1];
    after_r = rid[n - 1];
    pages++;
  } while (more);
  assert_int_equal(total, 60);
  assert_true(pages > 2);
  /* an older client's cursor: after c's waits, d's */
  (void)list_waits_page(r, op, tbd_session_id(c), 0, sid, rid, 256, &n);
  assert_true(n > 0);
  assert_int_equal(sid[0], tbd_session_id(d));
  assert_int_equal(rid[0], want[50]);
  tbt_registry_free(r);
}

static void test_second_publisher_busy(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *q = session(r, 11);
  uint64_t b = buffer(r, p), bq = buffer(r, q);

  (void)state;
  publish(r, p, "x", b, 0);
  assert_tb_err(publish_ex(r, q, "x", bq, NULL, NULL), TB_EBUSY);
  /* nor with someone else's buffer */
  assert_tb_err(publish_ex(r, q, "y", b, NULL, NULL), TB_EPERM);
  assert_int_equal(counts(r).versions, 1);
  assert_int_equal(counts(r).channels, 1);
  tbt_registry_free(r);
}

static void test_subscriptions(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  uint64_t b = buffer(r, p);
  struct tbt_cap *m;

  (void)state;
  assert_tb_ok(simple(r, c, SUBSCRIBE, "later", 0));
  assert_tb_ok(simple(r, c, SUBSCRIBE, "later", 0)); /* idempotent */
  assert_tb_err(simple(r, c, SUBSCRIBE, "../bad", 0), TB_ENAME);
  publish(r, p, "later", b, 0);
  m = tbt_cap_take_notice(c, N_NEW);
  assert_non_null(m);
  assert_string_equal(m->m->notice->new_version->channel, "later");
  assert_int_equal(m->m->notice->new_version->version, 1);
  tbt_cap_free(m);
  assert_tb_ok(simple(r, c, UNSUBSCRIBE, "later", 0));
  assert_tb_err(simple(r, c, UNSUBSCRIBE, "later", 0), TB_ENOTFOUND);
  publish(r, p, "later", b, 0);
  assert_int_equal(tbt_caps_count(c), 0);
  tbt_registry_free(r);
}

/* Hello.prefetch: a subscriber hears of each CUDA buffer once, in the
 * NewVersion notice of its first version, with the ready event; then gets
 * its BufferRetired like a session that acquired it. Others, and host
 * buffers, get plain notices. */
static void test_prefetch_notices(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session_prefetch(r, 11),
                     *o = session(r, 12),
                     *h = session_prefetch_kinds(r, 13, false);
  uint64_t b1 = cuda_buffer(r, p, 0x11), b2 = cuda_buffer(r, p, 0x22),
           hb = buffer(r, p), e = event(r, p);
  struct pub gpu = {.dev_type = kDLCUDA, .meta_len = 3, .event = e};
  Tensorbroker__V1__NewVersion *nv;
  struct tbt_cap *m;

  (void)state;
  assert_tb_ok(simple(r, c, SUBSCRIBE, "g", 0));
  assert_tb_ok(simple(r, o, SUBSCRIBE, "g", 0));
  assert_tb_ok(simple(r, h, SUBSCRIBE, "g", 0));
  assert_tb_ok(publish_ex(r, p, "g", b1, &gpu, NULL));
  /* prefetch asked by a session that cannot map CUDA memory: plain */
  expect_plain_new(h);
  m = tbt_cap_take_notice(c, N_NEW);
  assert_non_null(m);
  nv = m->m->notice->new_version;
  assert_int_equal(nv->version, 1);
  assert_non_null(nv->buffer);
  assert_int_equal(nv->buffer->buffer_id, b1);
  assert_int_equal(nv->buffer->kind,
                   TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC);
  assert_int_equal(nv->buffer->cuda_ipc_handle.len, 64);
  assert_int_equal(nv->buffer->cuda_ipc_handle.data[0], 0x11);
  assert_int_equal(nv->buffer->size, 4096);
  assert_non_null(nv->ready_event);
  assert_int_equal(nv->ready_event->event_id, e);
  assert_int_equal(nv->ready_event->cuda_ipc_event_handle.len, 64);
  tbt_cap_free(m);
  expect_plain_new(o); /* no prefetch asked */
  /* the same buffer again: no handle; a new one: its handle */
  assert_tb_ok(publish_ex(r, p, "g", b1, &gpu, NULL));
  expect_plain_new(c);
  assert_tb_ok(publish_ex(r, p, "g", b2, &gpu, NULL));
  m = tbt_cap_take_notice(c, N_NEW);
  assert_non_null(m);
  assert_non_null(m->m->notice->new_version->buffer);
  assert_int_equal(m->m->notice->new_version->buffer->buffer_id, b2);
  assert_int_equal(m->m->notice->new_version->buffer->cuda_ipc_handle.data[0],
                   0x22);
  tbt_cap_free(m);
  publish(r, p, "g", hb, 0); /* host memory travels with the acquire */
  expect_plain_new(c);
  assert_int_equal(tbt_cap_drop_notices(o, N_NEW), 3);
  assert_int_equal(tbt_cap_drop_notices(h, N_NEW), 3);
  /* b1 retired, none of its versions left: the prefetching session, which
   * never acquired it, is told; the other is not */
  assert_tb_ok(simple(r, p, UNREGISTER, NULL, b1));
  m = tbt_cap_take_notice(c, N_RETIRED);
  assert_non_null(m);
  assert_int_equal(m->m->notice->buffer_retired->buffer_id, b1);
  tbt_cap_free(m);
  assert_null(tbt_cap_take_notice(o, N_RETIRED));
  assert_null(tbt_cap_take_notice(h, N_RETIRED));
  tbt_registry_free(r);
}

/* Hello.channels: the HelloReply carries the newest version of each named
 * channel that is in a CUDA buffer, once per buffer, with its ready event;
 * the buffer counts as sent (no handle in a later notice, BufferRetired
 * comes). Not for host memory, unknown channels, or without prefetch. Too
 * many names, or a bad one, fail the Hello and change nothing. */
static void test_hello_channels(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c, *o, *x;
  uint64_t b1 = cuda_buffer(r, p, 0x11), hb = buffer(r, p), e = event(r, p);
  struct pub gpu = {.dev_type = kDLCUDA, .meta_len = 3, .event = e};
  const char *names[] = {"h", "none", "g", "g"};
  const char *many[TB_CONNECT_CHANNELS_MAX + 1];
  const char *bad[] = {"g", "a/../b"};
  Tensorbroker__V1__HelloReply *hr;
  struct tbt_cap *m;

  (void)state;
  assert_tb_ok(publish_ex(r, p, "g", b1, &gpu, NULL));
  assert_tb_ok(publish_ex(r, p, "g", b1, &gpu, NULL));
  publish(r, p, "h", hb, 0);

  assert_tb_ok(tbd_session_open(r, 11, 1000, 1000, NULL, &c));
  assert_tb_ok(hello_ex(r, c, true, true, names, 4, &m));
  hr = m->m->reply->hello;
  assert_int_equal(hr->n_latest, 1);
  assert_string_equal(hr->latest[0]->channel, "g");
  assert_int_equal(hr->latest[0]->version, 2);
  assert_non_null(hr->latest[0]->buffer);
  assert_int_equal(hr->latest[0]->buffer->buffer_id, b1);
  assert_int_equal(hr->latest[0]->buffer->kind,
                   TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC);
  assert_int_equal(hr->latest[0]->buffer->cuda_ipc_handle.len, 64);
  assert_int_equal(hr->latest[0]->buffer->cuda_ipc_handle.data[0], 0x11);
  assert_non_null(hr->latest[0]->ready_event);
  assert_int_equal(hr->latest[0]->ready_event->event_id, e);
  tbt_cap_free(m);
  /* sent once: a subscriber's notice of the same buffer comes plain */
  assert_tb_ok(simple(r, c, SUBSCRIBE, "g", 0));
  assert_tb_ok(publish_ex(r, p, "g", b1, &gpu, NULL));
  expect_plain_new(c);
  /* b1 out of the history and unregistered: c is told, as if it had
   * acquired it */
  publish(r, p, "g", hb, 0);
  expect_plain_new(c);
  assert_tb_ok(simple(r, p, UNREGISTER, NULL, b1));
  m = tbt_cap_take_notice(c, N_RETIRED);
  assert_non_null(m);
  assert_int_equal(m->m->notice->buffer_retired->buffer_id, b1);
  tbt_cap_free(m);

  /* without prefetch: nothing */
  b1 = cuda_buffer(r, p, 0x12);
  assert_tb_ok(publish_ex(r, p, "g", b1, &gpu, NULL));
  assert_tb_ok(tbd_session_open(r, 12, 1000, 1000, NULL, &o));
  assert_tb_ok(hello_ex(r, o, true, false, names, 4, &m));
  assert_int_equal(m->m->reply->hello->n_latest, 0);
  tbt_cap_free(m);

  /* too many names, a bad one: refused, and the session may still say a
   * good Hello, which gets the buffer */
  for (size_t i = 0; i < TB_CONNECT_CHANNELS_MAX + 1; i++)
    many[i] = "g";
  assert_tb_ok(tbd_session_open(r, 13, 1000, 1000, NULL, &x));
  assert_int_equal(hello_ex(r, x, true, true, many,
                                  TB_CONNECT_CHANNELS_MAX + 1, NULL),
                   TB_ELIMIT);
  assert_int_equal(hello_ex(r, x, true, true, bad, 2, NULL), TB_ENAME);
  assert_tb_ok(hello_ex(r, x, true, true, many, TB_CONNECT_CHANNELS_MAX, &m));
  assert_int_equal(m->m->reply->hello->n_latest, 1);
  assert_int_equal(m->m->reply->hello->latest[0]->buffer->buffer_id, b1);
  tbt_cap_free(m);
  tbt_registry_free(r);
}

/* The HelloReply stays inside one datagram: with the smallest
 * --max-message and sixteen long-named CUDA channels, the entries that
 * would not fit are left out, and those left out count as not sent (a
 * later notice carries their buffers). */
static void test_hello_channels_room(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *p, *c;
  struct pub gpu = {.dev_type = kDLCUDA};
  char names[TB_CONNECT_CHANNELS_MAX][201];
  const char *ptr[TB_CONNECT_CHANNELS_MAX];
  uint64_t bufs[TB_CONNECT_CHANNELS_MAX];
  size_t packed, n;
  struct tbt_cap *m;

  (void)state;
  tbd_limits_default(&lim);
  lim.max_message = 4096;
  lim.max_metadata = 0;
  r = reg_new(&lim);
  p = session(r, 10);
  for (int i = 0; i < TB_CONNECT_CHANNELS_MAX; i++) {
    memset(names[i], 'a' + i, 200);
    names[i][200] = '\0';
    ptr[i] = names[i];
    bufs[i] = cuda_buffer(r, p, (uint8_t)(0x40 + i));
    assert_tb_ok(publish_ex(r, p, names[i], bufs[i], &gpu, NULL));
  }
  assert_tb_ok(tbd_session_open(r, 11, 1000, 1000, NULL, &c));
  assert_tb_ok(hello_ex(r, c, true, true, ptr, TB_CONNECT_CHANNELS_MAX, &m));
  n = m->m->reply->hello->n_latest;
  packed = tensorbroker__v1__server_message__get_packed_size(m->m);
  assert_true(n > 0);
  assert_true(n < TB_CONNECT_CHANNELS_MAX);
  assert_true(packed <= lim.max_message);
  for (size_t i = 0; i < n; i++)
    assert_string_equal(m->m->reply->hello->latest[i]->channel, names[i]);
  tbt_cap_free(m);
  /* the first left out: its buffer comes with the next notice */
  assert_tb_ok(simple(r, c, SUBSCRIBE, names[n], 0));
  assert_tb_ok(publish_ex(r, p, names[n], bufs[n], &gpu, NULL));
  m = tbt_cap_take_notice(c, N_NEW);
  assert_non_null(m);
  assert_non_null(m->m->notice->new_version->buffer);
  assert_int_equal(m->m->notice->new_version->buffer->buffer_id, bufs[n]);
  tbt_cap_free(m);
  tbt_registry_free(r);
}

/* Out of memory while a prefetching subscriber's notice is built: the
 * publish succeeds, the notice goes without the buffer, and the buffer is
 * not counted as sent (the next notice carries it). */
static void test_alloc_failure_prefetch(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session_prefetch(r, 11);
  struct pub gpu = {.dev_type = kDLCUDA, .meta_len = 3};
  int degraded = 0, rc;

  (void)state;
  assert_tb_ok(simple(r, c, SUBSCRIBE, "g", 0));
  for (unsigned long n = 1;; n++) {
    uint64_t b = cuda_buffer(r, p, (uint8_t)n);
    struct tbt_cap *m;
    tbd_alloc_fail_at(n, 0);
    rc = publish_ex(r, p, "g", b, &gpu, NULL);
    tbd_alloc_fail_at(0, 0);
    assert_true(n < 100);
    if (rc != 0) {
      assert_int_equal(rc, TB_ENOMEM);
      assert_null(tbt_cap_take_notice(c, N_NEW));
      continue;
    }
    m = tbt_cap_take_notice(c, N_NEW);
    assert_non_null(m);
    if (m->m->notice->new_version->buffer != NULL) {
      tbt_cap_free(m);
      break; /* past the last allocation */
    }
    tbt_cap_free(m);
    degraded++;
    assert_tb_ok(publish_ex(r, p, "g", b, &gpu, NULL));
    m = tbt_cap_take_notice(c, N_NEW);
    assert_non_null(m);
    assert_non_null(m->m->notice->new_version->buffer);
    assert_int_equal(m->m->notice->new_version->buffer->buffer_id, b);
    tbt_cap_free(m);
  }
  assert_true(degraded >= 1);
  tbt_registry_free(r);
}

static void test_limits(void **state) {
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *p, *c, *extra;
  uint64_t b, id;
  struct pub o = {0};

  (void)state;
  tbd_limits_default(&lim);
  lim.max_leases = 2;
  lim.max_buffers = 1;
  lim.max_channels = 1;
  lim.max_metadata = 16;
  lim.max_ndim = 4;
  lim.max_subscriptions = 1;
  lim.max_history = 4;
  lim.max_sessions = 2;
  r = reg_new(&lim);
  p = session(r, 10);
  c = session(r, 11);
  /* sessions: accepted, Hello refused, to be closed */
  assert_tb_ok(tbd_session_open(r, 12, 0, 0, NULL, &extra));
  assert_int_equal(tbt_req_hello(r, extra, "x"), TB_ELIMIT);
  tbd_session_close(r, extra);
  b = buffer(r, p);
  assert_tb_err(reg_buffer_fd(r, p, 4096, memfd(4096, true), &id), TB_ELIMIT);
  publish(r, p, "x", b, 0);
  assert_tb_err(publish_ex(r, p, "y", b, NULL, NULL), TB_ELIMIT);
  o.meta_len = 17;
  assert_tb_err(publish_ex(r, p, "x", b, &o, NULL), TB_ELIMIT);
  o.meta_len = 16;
  assert_tb_ok(publish_ex(r, p, "x", b, &o, NULL));
  o.ndim = 5;
  assert_tb_err(publish_ex(r, p, "x", b, &o, NULL), TB_ELIMIT);
  o.ndim = 4;
  assert_tb_ok(publish_ex(r, p, "x", b, &o, NULL));
  o.depth = 5;
  assert_tb_err(publish_ex(r, p, "x", b, &o, NULL), TB_ELIMIT);
  o.depth = 0;
  o.dev_type = kDLCUDA;
  assert_tb_err(publish_ex(r, p, "x", b, &o, NULL), TB_EDEVICE);
  acquire(r, c, "x", LATEST, 0);
  acquire(r, c, "x", LATEST, 0);
  assert_int_equal(acquire_ex(r, c, "x", LATEST, 0, 0, NULL, NULL), TB_ELIMIT);
  assert_tb_ok(simple(r, c, SUBSCRIBE, "a", 0));
  assert_tb_err(simple(r, c, SUBSCRIBE, "b", 0), TB_ELIMIT);
  assert_int_equal(counts(r).versions, 1);
  tbt_registry_free(r);
}

static void test_buffer_register_checks(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10);
  uint64_t id;

  (void)state;
  assert_tb_err(reg_buffer_fd(r, p, 4096, memfd(4096, false), &id),
                TB_EINVAL); /* not sealed */
  assert_tb_err(reg_buffer_fd(r, p, 8192, memfd(4096, true), &id),
                TB_EINVAL); /* smaller than declared */
  assert_tb_err(reg_buffer_fd(r, p, 4096, -1, &id), TB_EINVAL); /* no fd */
  assert_tb_err(reg_buffer_fd(r, p, 0, memfd(4096, true), &id), TB_EINVAL);
  assert_int_equal(counts(r).buffers, 0);
  tbt_registry_free(r);
}

/* The kernel keeps consumers from writing a read-only buffer: its memfd
 * must be sealed against writes, shrinking and growing, and consumers are
 * sent a read-only description of it; a buffer consumers may write must
 * not be write-sealed, and keeps the producer's read-write description. */
static void test_buffer_register_seals(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10);
  struct tbd_buffer *b;
  uint64_t id;

  (void)state;
  assert_tb_err(reg_buffer_fd(r, p, 4096, memfd_seals(4096, F_SEAL_SHRINK),
                              &id),
                TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "F_SEAL_GROW"));
  assert_tb_err(reg_buffer_fd(r, p, 4096,
                              memfd_seals(4096, F_SEAL_SHRINK | F_SEAL_GROW),
                              &id),
                TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "F_SEAL_FUTURE_WRITE"));
  assert_non_null(strstr(tbt_last_message, "Linux 5.1"));
  assert_tb_err(reg_buffer_fd(r, p, 4096,
                              memfd_seals(4096, F_SEAL_GROW |
                                                    F_SEAL_FUTURE_WRITE),
                              &id),
                TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "F_SEAL_SHRINK"));
  assert_tb_err(reg_buffer_fd_ex(r, p, 4096, memfd(4096, true), true, &id),
                TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "sealed against writes"));
  assert_int_equal(counts(r).buffers, 0);

  assert_tb_ok(reg_buffer_fd(r, p, 4096, memfd(4096, true), &id));
  HASH_FIND(hh, r->buffers, &id, sizeof(id), b);
  assert_non_null(b);
  assert_int_equal(fcntl(b->fd, F_GETFL) & O_ACCMODE, O_RDONLY);
  assert_tb_ok(reg_buffer_fd_ex(r, p, 4096, memfd_seals(4096, F_SEAL_SHRINK),
                                true, &id));
  HASH_FIND(hh, r->buffers, &id, sizeof(id), b);
  assert_non_null(b);
  assert_int_equal(fcntl(b->fd, F_GETFL) & O_ACCMODE, O_RDWR);
  assert_int_equal(counts(r).buffers, 2);
  tbt_registry_free(r);
}

/* Every memory kind of the protocol has a row in the daemon's table
 * (kinds.h) with what its columns need, so that no request can reach a
 * kind the daemon has no row for; a kind the protocol does not name has
 * none. */
static void test_kind_table(void **state) {
  const ProtobufCEnumDescriptor *d = &tensorbroker__v1__memory_kind__descriptor;

  (void)state;
  for (unsigned i = 0; i < d->n_values; i++) {
    int kind = d->values[i].value;
    const struct tbd_kind *k = tbd_kind_find(kind);

    if (kind == TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_NONE) {
      assert_null(k);
      continue;
    }
    if (k == NULL)
      fail_msg("memory kind %s (%d) has no row in daemon/kinds.c",
               d->values[i].name, kind);
    assert_int_equal(k->kind, kind);
    assert_non_null(k->name);
    assert_string_equal(tbd_kind_name(kind), k->name);
    assert_non_null(k->validate_register);
    assert_true(k->dev_type > 0); /* a DLPack device type */
    /* a descriptor the daemon holds is taken and handed on by the kind */
    if (k->carries_fd) {
      assert_non_null(k->adopt);
      assert_non_null(k->attach_fd);
      assert_non_null(k->fds_held);
    }
    /* a signal area is waited on after its producer is gone: the memory
     * must outlive it, held by the daemon's descriptor */
    if (k->signals)
      assert_true(k->carries_fd && k->survives_producer);
  }
  assert_null(tbd_kind_find(99));
  assert_string_equal(tbd_kind_name(99), "memory");
  assert_false(tbd_kind_survives_producer(99));
}

/* EventRegister's device, when one is named, is a CUDA device: another
 * type, a negative ordinal or a uuid of other than 16 bytes is refused
 * with the reason and registers nothing; without a device (the consumer
 * then takes the buffer's) it is registered as before. */
static void test_event_register_device(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10);
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__EventRegister e = TENSORBROKER__V1__EVENT_REGISTER__INIT;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;
  uint8_t handle[64] = {1, 2, 3}, uuid[16] = {9};

  (void)state;
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_EVENT_REGISTER;
  q.event_register = &e;
  e.cuda_ipc_event_handle.data = handle;
  e.cuda_ipc_event_handle.len = sizeof(handle);
  e.device = &dev;
  dev.type = kDLCPU;
  dev.uuid.data = uuid;
  dev.uuid.len = sizeof(uuid);
  assert_tb_err(tbt_req_send(r, p, &q, NULL, 0, NULL), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "on device type 1"));
  q.request_id = 0;
  dev.type = kDLCUDA;
  dev.id = -2;
  assert_tb_err(tbt_req_send(r, p, &q, NULL, 0, NULL), TB_EINVAL);
  assert_string_equal(tbt_last_message, "device id -2 is negative");
  q.request_id = 0;
  dev.id = 1;
  dev.uuid.len = 15;
  assert_tb_err(tbt_req_send(r, p, &q, NULL, 0, NULL), TB_EINVAL);
  assert_string_equal(tbt_last_message,
                      "device uuid must be 16 bytes, not 15");
  assert_int_equal(counts(r).events, 0);
  q.request_id = 0;
  dev.uuid.len = sizeof(uuid);
  assert_tb_ok(tbt_req_send(r, p, &q, NULL, 0, NULL));
  q.request_id = 0;
  e.device = NULL;
  assert_tb_ok(tbt_req_send(r, p, &q, NULL, 0, NULL));
  assert_int_equal(counts(r).events, 2);
  tbt_registry_free(r);
}

/* BufferRegister is checked by its kind's row: a kind the daemon does not
 * know is refused; CUDA_IPC needs its handle, a
 * CUDA device with its uuid and no descriptor; HOST_MEMFD exactly one
 * descriptor. Each refusal names what is wrong and leaves nothing behind
 * (teardown counts descriptors). An accepted host buffer is described on
 * the host whatever device the registration named. */
static void test_buffer_register_kinds(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11), *x;
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  struct tbt_fake_cuda f;
  struct pub gpu = {.dev_type = kDLCUDA, .meta_len = 3};
  struct acq a;
  struct tbt_cap *m;
  uint64_t id;
  int fds[2];

  (void)state;
  tbt_fake_cuda_init(&f, 1);
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  q.buffer_register = &f.reg;
  f.reg.kind = 7;
  assert_tb_err(tbt_req_send(r, p, &q, NULL, 0, NULL), TB_EINVAL);
  assert_string_equal(tbt_last_message, "unknown memory kind 7");
  q.request_id = 0;
  f.reg.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC;
  f.reg.cuda_ipc_handle.len = 63;
  assert_tb_err(tbt_req_send(r, p, &q, NULL, 0, NULL), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "cuda_ipc_handle must be 64 bytes"));
  q.request_id = 0;
  f.reg.cuda_ipc_handle.len = 64;
  f.dev.uuid.len = 0;
  assert_tb_err(tbt_req_send(r, p, &q, NULL, 0, NULL), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "16-byte device uuid"));
  q.request_id = 0;
  f.dev.uuid.len = 16;
  f.dev.type = kDLCPU;
  assert_tb_err(tbt_req_send(r, p, &q, NULL, 0, NULL), TB_EDEVICE);
  q.request_id = 0;
  f.dev.type = kDLCUDA;
  f.dev.id = -1;
  assert_tb_err(tbt_req_send(r, p, &q, NULL, 0, NULL), TB_EINVAL);
  assert_string_equal(tbt_last_message, "device id -1 is negative");
  f.dev.id = 0;
  q.request_id = 0;
  f.reg.size = 0;
  assert_tb_err(tbt_req_send(r, p, &q, NULL, 0, NULL), TB_EINVAL);
  assert_int_equal(counts(r).buffers, 0);
  /* a descriptor with a CUDA_IPC registration: a protocol error */
  x = session(r, 12);
  q.request_id = 0;
  f.reg.size = 4096;
  fds[0] = memfd(4096, true);
  assert_tb_err(tbt_req_send(r, x, &q, fds, 1, NULL), TB_EPROTO);
  assert_non_null(strstr(tbt_last_message, "CUDA_IPC BufferRegister with"));
  tbd_session_close(r, x);
  /* two descriptors with a HOST_MEMFD one: a protocol error too */
  x = session(r, 13);
  q.request_id = 0;
  f.reg.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
  fds[0] = memfd(4096, true);
  fds[1] = memfd(4096, true);
  assert_tb_err(tbt_req_send(r, x, &q, fds, 2, NULL), TB_EPROTO);
  assert_non_null(strstr(tbt_last_message, "more than one descriptor"));
  tbd_session_close(r, x);
  assert_int_equal(counts(r).buffers, 0);

  /* a host buffer whose registration named a CUDA device: on the host */
  q.request_id = 0;
  fds[0] = memfd(4096, true);
  assert_tb_ok(tbt_req_send(r, p, &q, fds, 1, &m));
  id = m->m->reply->buffer_register->buffer_id;
  tbt_cap_free(m);
  assert_tb_err(publish_ex(r, p, "k", id, &gpu, NULL), TB_EDEVICE);
  publish(r, p, "k", id, 0);
  a = acquire(r, c, "k", LATEST, 0);
  assert_int_equal(a.kind,
                   TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD);
  assert_int_equal(a.dev_type, kDLCPU);
  assert_true(a.fd_attached);
  tbt_registry_free(r);
}

/* A CUDA_VMM_FD registration of size bytes carrying fds (nfds of them). */
static int reg_vmm(struct tbd_registry *r, struct tbd_session *s,
                   struct tbt_fake_cuda *f, uint64_t size, int *fds, int nfds,
                   uint64_t *id) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  struct tbt_cap *c = NULL;
  int st;

  f->reg.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_VMM_FD;
  f->reg.cuda_ipc_handle.len = 0;
  f->reg.size = size;
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  q.buffer_register = &f->reg;
  q.request_id = tbt_req_id();
  st = tbt_req_send(r, s, &q, fds, nfds, &c);
  if (st == 0 && id != NULL)
    *id = c->m->reply->buffer_register->buffer_id;
  if (c != NULL)
    tbt_cap_free(c);
  return st;
}

/* TBD_DONE_EVENT_BYTES is what one done event adds to a VersionFree at
 * most: an EventInfo with every field at its longest (negative device
 * numbers take ten bytes), with its tag and length. */
static void test_done_event_bytes(void **state) {
  Tensorbroker__V1__VersionFree vf = TENSORBROKER__V1__VERSION_FREE__INIT;
  Tensorbroker__V1__EventInfo ei = TENSORBROKER__V1__EVENT_INFO__INIT;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;
  Tensorbroker__V1__EventInfo *list[1] = {&ei};
  uint8_t handle[64] = {0}, uuid[16] = {0};
  size_t base;

  (void)state;
  vf.channel = "c";
  base = tensorbroker__v1__version_free__get_packed_size(&vf);
  ei.event_id = UINT64_MAX;
  ei.cuda_ipc_event_handle.data = handle;
  ei.cuda_ipc_event_handle.len = sizeof(handle);
  dev.type = INT32_MIN;
  dev.id = INT32_MIN;
  dev.uuid.data = uuid;
  dev.uuid.len = sizeof(uuid);
  ei.device = &dev;
  ei.owner_pid = UINT32_MAX;
  ei.complete = true;
  ei.owner_died = true;
  ei.owner_shm_id = UINT64_MAX;
  ei.owner_pidns_id = UINT64_MAX;
  ei.signal_value = UINT64_MAX;
  ei.signal_slot = UINT32_MAX;
  vf.n_done_events = 1;
  vf.done_events = list;
  assert_int_equal(tensorbroker__v1__version_free__get_packed_size(&vf) - base,
                   TBD_DONE_EVENT_BYTES);
}

/* Unregister event id of s. */
static void event_unregister(struct tbd_registry *r, struct tbd_session *s,
                             uint64_t id) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__EventUnregister u =
      TENSORBROKER__V1__EVENT_UNREGISTER__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_EVENT_UNREGISTER;
  q.event_unregister = &u;
  u.event_id = id;
  assert_tb_ok(tbt_req_send(r, s, &q, NULL, 0, NULL));
}

/* Sessions that die (promised a Goodbye, hung up without it).
 *  - A consumer with 300 events: one was the done event of a version the
 *    producer has been sent (VersionFree), another that of a version still
 *    held by another consumer, unregistered since (versions keep copies).
 *    The producer, told of its events once, hears all 300 in two
 *    EventsGone notices (256 + 44); a session never sent any hears
 *    nothing; the held version's VersionFree names no dead event.
 *  - A producer whose VMM version had its ready event pending: the version
 *    is granted with that event marked owner_died.
 *  - Sessions that close with a Goodbye send nothing of the kind. */
static void test_dead_sessions_events_gone(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *k = session_says_goodbye(r, 11),
                     *o = session(r, 12), *q = session_says_goodbye(r, 13);
  uint64_t b = cuda_buffer(r, p, 0x31), ids[300], seen[300], vid = 0;
  struct pub gpu = {.dev_type = kDLCUDA, .depth = 1, .event = event(r, p)};
  struct tbt_fake_cuda f;
  struct tbt_cap *m;
  struct acq ak, ao;
  size_t nseen = 0, pieces = 0;
  int fds[1];

  (void)state;
  for (int i = 0; i < 300; i++)
    ids[i] = event(r, k);
  /* version 1, read by k, freed: the producer is sent k's event 0 */
  assert_tb_ok(publish_ex(r, p, "g", b, &gpu, NULL));
  ak = acquire(r, k, "g", LATEST, 0);
  assert_tb_ok(tbt_req_release(r, k, ak.lease, ids[0], true));
  assert_tb_ok(publish_ex(r, p, "g", b, &gpu, NULL));
  m = tbt_cap_take_notice(p, N_FREE);
  assert_non_null(m);
  assert_int_equal(m->m->notice->version_free->n_done_events, 1);
  tbt_cap_free(m);
  /* version 2, read by k and o; k's done event 1, then unregistered */
  ak = acquire(r, k, "g", LATEST, 0);
  ao = acquire(r, o, "g", LATEST, 0);
  assert_tb_ok(tbt_req_release(r, k, ak.lease, ids[1], true));
  event_unregister(r, k, ids[1]);
  tbt_caps_clear();
  uint64_t kid = tbd_session_id(k);
  tbd_session_hung_up(k);
  tbd_session_close(r, k);
  while ((m = tbt_cap_take_notice(p, N_GONE)) != NULL) {
    const Tensorbroker__V1__EventsGone *eg = m->m->notice->events_gone;
    assert_int_equal(eg->session_id, kid);
    assert_true(eg->n_event_ids <= 256);
    for (size_t i = 0; i < eg->n_event_ids && nseen < 300; i++)
      seen[nseen++] = eg->event_ids[i];
    pieces++;
    tbt_cap_free(m);
  }
  assert_int_equal(pieces, 2);
  assert_int_equal(nseen, 300);
  for (int i = 0; i < 300; i++)
    assert_true(seen[i] == ids[i]); /* ascending, each once */
  assert_int_equal(tbt_cap_drop_notices(o, N_GONE), 0);
  /* version 2 leaves the history and is freed: no dead done event, not
   * even the unregistered one */
  assert_tb_ok(publish_ex(r, p, "g", b, &gpu, NULL));
  assert_tb_ok(release(r, o, ao.lease));
  m = tbt_cap_take_notice(p, N_FREE);
  assert_non_null(m);
  assert_int_equal(m->m->notice->version_free->version, 2);
  assert_int_equal(m->m->notice->version_free->n_done_events, 0);
  tbt_cap_free(m);

  /* a producer dies with its VMM version's ready event pending */
  tbt_fake_cuda_init(&f, 2);
  fds[0] = memfd(4096, false);
  assert_tb_ok(reg_vmm(r, q, &f, 4096, fds, 1, &vid));
  struct pub pending = {.dev_type = kDLCUDA, .depth = 1,
                        .event = event(r, q)};
  assert_tb_ok(publish_ex(r, q, "v", vid, &pending, NULL));
  ao = acquire(r, o, "v", LATEST, 0);
  assert_false(ao.ready_owner_died);
  assert_tb_ok(release(r, o, ao.lease));
  tbd_session_hung_up(q);
  tbd_session_close(r, q);
  ao = acquire(r, o, "v", LATEST, 0);
  assert_true(ao.ready_event != 0 && !ao.ready_complete);
  assert_true(ao.ready_owner_died);
  assert_tb_ok(release(r, o, ao.lease));

  /* closing with a Goodbye: nothing of the kind */
  tbt_caps_clear();
  tbd_session_close(r, p);
  assert_null(tbt_cap_take_notice(o, N_GONE));
  tbt_registry_free(r);
}

/* CUDA_VMM_FD: the registration carries the exported descriptor, which the
 * daemon keeps (its descriptor count says so) and attaches to each
 * consumer's first AcquireReply of the buffer; the versions outlive their
 * producer, as host memory's do, and are still granted to a consumer that
 * comes after the producer is gone (TB_ECLOSED only for one that is not
 * kept). Bad registrations are refused with why and change nothing: no
 * descriptor, two (a protocol error), one that cannot be an exported
 * allocation (a socket, a pipe), a size above the bound or above what the
 * descriptor holds, an IPC handle or no device uuid. */
static void test_vmm_buffers(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11), *x;
  struct pub gpu = {.dev_type = kDLCUDA};
  struct tbt_fake_cuda f;
  uint32_t held0 = tbd_registry_fds_held(r);
  int fds0, fds[2], sv[2];
  uint64_t id;
  struct acq a, b;

  (void)state;
  tbt_fake_cuda_init(&f, 1);
  /* refused, nothing kept */
  assert_tb_err(reg_vmm(r, p, &f, 4096, NULL, 0, &id), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "exported descriptor attached"));
  assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv),
                   0);
  fds[0] = sv[0];
  assert_tb_err(reg_vmm(r, p, &f, 4096, fds, 1, &id), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "descriptor is a socket"));
  close(sv[1]);
  assert_int_equal(pipe2(sv, O_CLOEXEC), 0);
  fds[0] = sv[0];
  assert_tb_err(reg_vmm(r, p, &f, 4096, fds, 1, &id), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "descriptor is a pipe"));
  close(sv[1]);
  fds[0] = memfd(4096, false);
  assert_tb_err(reg_vmm(r, p, &f, TBD_VMM_SIZE_MAX + 1, fds, 1, &id),
                TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "must be 1 to"));
  fds[0] = memfd(4096, false);
  assert_tb_err(reg_vmm(r, p, &f, 8192, fds, 1, &id), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "4096 bytes, 8192 declared"));
  fds[0] = memfd(4096, false);
  f.reg.cuda_ipc_handle.len = 64;
  f.reg.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_VMM_FD;
  {
    req_t q = TENSORBROKER__V1__REQUEST__INIT;
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
    q.buffer_register = &f.reg;
    q.request_id = tbt_req_id();
    assert_tb_err(tbt_req_send(r, p, &q, fds, 1, NULL), TB_EINVAL);
    assert_non_null(strstr(tbt_last_message, "with a cuda_ipc_handle"));
  }
  fds[0] = memfd(4096, false);
  f.dev.uuid.len = 0;
  assert_tb_err(reg_vmm(r, p, &f, 4096, fds, 1, &id), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "16-byte device uuid"));
  f.dev.uuid.len = 16;
  x = session(r, 12); /* two descriptors: a protocol error */
  fds[0] = memfd(4096, false);
  fds[1] = memfd(4096, false);
  assert_tb_err(reg_vmm(r, x, &f, 4096, fds, 2, &id), TB_EPROTO);
  assert_non_null(strstr(tbt_last_message, "more than one descriptor"));
  tbd_session_close(r, x);
  assert_int_equal(counts(r).buffers, 0);
  assert_int_equal(tbd_registry_fds_held(r), held0);

  /* accepted: the daemon holds the descriptor */
  fds0 = tbt_count_fds();
  fds[0] = memfd(4096, false);
  assert_tb_ok(reg_vmm(r, p, &f, 4096, fds, 1, &id));
  assert_int_equal(tbt_count_fds(), fds0 + 1);
  assert_int_equal(tbd_registry_fds_held(r), held0 + 1);
  {
    /* the metrics count it by kind, as the library names kinds */
    char *text = NULL;
    size_t len = 0;
    assert_tb_ok(tbd_metrics_render(r, NULL, &text, &len));
    assert_non_null(
        strstr(text, "tensorbroker_buffers_by_kind{kind=\"cuda-vmm\"} 1\n"));
    assert_non_null(
        strstr(text, "tensorbroker_buffers_by_kind{kind=\"host\"} 0\n"));
    assert_non_null(strstr(
        text, "tensorbroker_buffer_bytes_by_kind{kind=\"cuda-vmm\"} 4096\n"));
    assert_non_null(strstr(
        text, "tensorbroker_buffer_bytes_by_kind{kind=\"cuda-host\"} 0\n"));
    free(text);
  }
  assert_int_equal(publish_ex(r, p, "v", id, &gpu, NULL), 0);
  a = acquire(r, c, "v", LATEST, 0);
  assert_int_equal(a.kind,
                   TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_VMM_FD);
  assert_int_equal(a.dev_type, kDLCUDA);
  assert_true(a.fd_attached); /* first time: the descriptor comes along */
  b = acquire(r, c, "v", LATEST, 0);
  assert_false(b.fd_attached); /* the consumer has it mapped */
  assert_tb_ok(release(r, c, a.lease));
  assert_tb_ok(release(r, c, b.lease));

  /* the producer is gone (as after SIGKILL): its version is still
   * granted, with the descriptor, to a consumer that comes now */
  tbd_session_close(r, p);
  tbt_caps_clear();
  x = session(r, 13);
  a = acquire(r, x, "v", LATEST, 0);
  assert_int_equal(a.version, 1);
  assert_true(a.fd_attached);
  assert_int_equal(acquire_ex(r, x, "v", NEXT, 1, 0, NULL, NULL), TB_ECLOSED);
  assert_tb_ok(release(r, x, a.lease));
  assert_int_equal(tbd_registry_fds_held(r), held0 + 1);
  tbt_registry_free(r);
}

/* A VMM buffer of size bytes with its signal area from off (a fresh
 * memfd for the fake driver's descriptor). */
static int reg_vmm_signals(struct tbd_registry *r, struct tbd_session *s,
                           uint64_t size, uint64_t off, uint64_t *id) {
  struct tbt_fake_cuda f;
  int fds[1];

  tbt_fake_cuda_init(&f, 3);
  f.reg.signal_offset = off;
  fds[0] = memfd(size, false);
  return reg_vmm(r, s, &f, size, fds, 1, id);
}

/* BufferRegister.signal_offset: only a CUDA_VMM_FD buffer may have a
 * signal area, 8-aligned, after at least 8 bytes of tensor, and with 16
 * bytes (the ready word and one done slot) before the end; each refusal
 * says why and registers nothing, keeps no descriptor. An accepted one
 * reaches consumers in the BufferInfo. */
static void test_signal_offset_register(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  uint32_t held0 = tbd_registry_fds_held(r);
  struct pub gpu = {.dev_type = kDLCUDA};
  uint64_t id = 0;
  struct acq a;

  (void)state;
  {
    /* another kind: refused whatever the offset */
    req_t q = TENSORBROKER__V1__REQUEST__INIT;
    Tensorbroker__V1__BufferRegister b =
        TENSORBROKER__V1__BUFFER_REGISTER__INIT;
    struct tbt_fake_cuda f;
    int fds[1] = {memfd(4096, true)};

    q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
    q.buffer_register = &b;
    b.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
    b.size = 4096;
    b.signal_offset = 4064;
    assert_tb_err(tbt_req_send(r, p, &q, fds, 1, NULL), TB_EINVAL);
    assert_non_null(strstr(tbt_last_message, "signal_offset is for "
                                             "CUDA_VMM_FD buffers"));
    tbt_fake_cuda_init(&f, 4);
    f.reg.signal_offset = 4064;
    q.buffer_register = &f.reg;
    q.request_id = 0;
    assert_tb_err(tbt_req_send(r, p, &q, NULL, 0, NULL), TB_EINVAL);
    assert_non_null(strstr(tbt_last_message, "signal_offset is for "
                                             "CUDA_VMM_FD buffers"));
  }
  assert_tb_err(reg_vmm_signals(r, p, 4096, 4, &id), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "no room for a tensor"));
  assert_tb_err(reg_vmm_signals(r, p, 4096, 4068, &id), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "4068 is not a multiple of 8"));
  assert_tb_err(reg_vmm_signals(r, p, 4096, 4088, &id), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "less than 16 bytes"));
  assert_tb_err(reg_vmm_signals(r, p, 4096, 4096, &id), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "less than 16 bytes"));
  assert_tb_err(reg_vmm_signals(r, p, 4096, 8192, &id), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "less than 16 bytes"));
  assert_int_equal(id, 0);
  assert_int_equal(counts(r).buffers, 0);
  assert_int_equal(tbd_registry_fds_held(r), held0);

  /* the smallest area (16 bytes) after the smallest tensor area (8) */
  assert_tb_ok(reg_vmm_signals(r, p, 24, 8, &id));
  assert_tb_ok(reg_vmm_signals(r, p, 4096, 4080, &id));
  assert_int_equal(counts(r).buffers, 2);
  assert_tb_ok(publish_ex(r, p, "s", id, &gpu, NULL));
  a = acquire(r, c, "s", LATEST, 0);
  assert_int_equal(a.signal_offset, 4080);
  assert_int_equal(a.done_slot, 0); /* the same domain: no slot */
  assert_tb_ok(release(r, c, a.lease));
  tbt_registry_free(r);
}

/* On a buffer with a signal area a tensor ends before it (the layout is
 * 16 floats, 64 bytes: at byte_offset 3968 it ends where the area
 * begins). Publish.ready_signal comes with a ready event on such a buffer,
 * and reaches each AcquireReply in its ready EventInfo (slot 0: the ready
 * word), with the producer's shm_id and pidns_id; refused otherwise. Each
 * refusal publishes nothing. */
static void test_signal_publish(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session_ns(r, 10, 21, 31),
                     *c = session_ns(r, 11, 22, 31);
  uint64_t id, plain, ev = event(r, p);
  struct pub o = {.dev_type = kDLCUDA, .depth = 4};
  struct tbd_channel *ch;
  struct tbt_fake_cuda f;
  int fds[1];
  struct acq a;

  (void)state;
  assert_tb_ok(reg_vmm_signals(r, p, 4096, 4032, &id));
  o.byte_offset = 3976;
  assert_tb_err(publish_ex(r, p, "s", id, &o, NULL), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "the tensor ends at byte 4040: "
                                           "it overlaps the buffer's signal "
                                           "area from byte 4032"));
  assert_null(tbd__channel_find(r, "s"));
  o.byte_offset = 3968;
  assert_tb_ok(publish_ex(r, p, "s", id, &o, NULL)); /* 1 */

  /* a ready signal without its event; on a buffer without an area */
  o.ready_signal = 5;
  assert_tb_err(publish_ex(r, p, "s", id, &o, NULL), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "comes with the ready event"));
  tbt_fake_cuda_init(&f, 5);
  fds[0] = memfd(4096, false);
  assert_tb_ok(reg_vmm(r, p, &f, 4096, fds, 1, &plain));
  o.event = ev;
  assert_tb_err(publish_ex(r, p, "s", plain, &o, NULL), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "has no signal area"));
  ch = tbd__channel_find(r, "s");
  assert_int_equal(ch->latest, 1);

  /* it reaches the consumer with the event */
  o.ready_signal = 7;
  assert_tb_ok(publish_ex(r, p, "s", id, &o, NULL)); /* 2 */
  o.ready_signal = 0;
  assert_tb_ok(publish_ex(r, p, "s", id, &o, NULL)); /* 3 */
  a = acquire(r, c, "s", EXACT, 2);
  assert_int_equal(a.ready_event, ev);
  assert_int_equal(a.ready_signal, 7);
  assert_int_equal(a.ready_slot, 0);
  assert_int_equal(a.ready_shm, 21);
  assert_int_equal(a.ready_pidns, 31);
  assert_tb_ok(release(r, c, a.lease));
  a = acquire(r, c, "s", EXACT, 3);
  assert_int_equal(a.ready_event, ev);
  assert_int_equal(a.ready_signal, 0); /* this one was published without */
  assert_tb_ok(release(r, c, a.lease));
  tbt_registry_free(r);
}

/* Done slots: a session that acquires from a buffer with a signal area
 * and sees another /dev/shm or another PID namespace than the buffer's
 * producer (both known) gets one, the same on every acquire of that
 * buffer (also after a Forget), distinct for distinct sessions; a session
 * of the producer's domain, one that says nothing, and any session on a
 * buffer without an area get none. A 16-byte area has one slot: the second
 * foreign session gets none, and neither does a later one. */
static void test_signal_done_slots(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session_ns(r, 10, 21, 31),
                     *same = session_ns(r, 11, 21, 31),
                     *old = session(r, 12),
                     *shm = session_ns(r, 13, 22, 31),
                     *pidns = session_ns(r, 14, 21, 32),
                     *half = session_ns(r, 15, 0, 33); /* no /dev/shm */
  struct pub o = {.dev_type = kDLCUDA};
  uint64_t id, tiny, plain;
  struct tbt_fake_cuda f;
  int fds[1];
  struct acq a;

  (void)state;
  assert_tb_ok(reg_vmm_signals(r, p, 4096, 4064, &id)); /* 3 slots */
  assert_tb_ok(publish_ex(r, p, "s", id, &o, NULL));
  a = acquire(r, same, "s", LATEST, 0);
  assert_int_equal(a.done_slot, 0);
  a = acquire(r, old, "s", LATEST, 0);
  assert_int_equal(a.done_slot, 0);
  a = acquire(r, shm, "s", LATEST, 0);
  assert_int_equal(a.done_slot, 1);
  a = acquire(r, pidns, "s", LATEST, 0);
  assert_int_equal(a.done_slot, 2);
  a = acquire(r, shm, "s", LATEST, 0); /* the same slot again */
  assert_int_equal(a.done_slot, 1);
  assert_false(a.fd_attached);
  assert_int_equal(simple(r, shm, FORGET, NULL, id), 0);
  a = acquire(r, shm, "s", LATEST, 0);
  assert_true(a.fd_attached);
  assert_int_equal(a.done_slot, 1);
  a = acquire(r, half, "s", LATEST, 0);
  assert_int_equal(a.done_slot, 3);

  /* one slot: the first foreign session takes it */
  assert_tb_ok(reg_vmm_signals(r, p, 80, 64, &tiny)); /* 64 bytes of tensor */
  assert_tb_ok(publish_ex(r, p, "t", tiny, &o, NULL));
  a = acquire(r, pidns, "t", LATEST, 0);
  assert_int_equal(a.done_slot, 1);
  a = acquire(r, shm, "t", LATEST, 0);
  assert_int_equal(a.done_slot, 0);
  a = acquire(r, half, "t", LATEST, 0);
  assert_int_equal(a.done_slot, 0);
  a = acquire(r, pidns, "t", LATEST, 0);
  assert_int_equal(a.done_slot, 1);

  /* no signal area: no slot */
  tbt_fake_cuda_init(&f, 6);
  fds[0] = memfd(4096, false);
  assert_tb_ok(reg_vmm(r, p, &f, 4096, fds, 1, &plain));
  assert_tb_ok(publish_ex(r, p, "u", plain, &o, NULL));
  a = acquire(r, shm, "u", LATEST, 0);
  assert_int_equal(a.done_slot, 0);
  tbt_registry_free(r);
}

/* A Release of lease with done event done and done signal signal. */
static int release_signal(struct tbd_registry *r, struct tbd_session *s,
                          uint64_t lease, uint64_t done, uint64_t signal) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Release rl = TENSORBROKER__V1__RELEASE__INIT;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_RELEASE;
  q.release = &rl;
  rl.lease_id = lease;
  rl.done_event_id = done;
  rl.done_signal = signal;
  rl.want_reply = true;
  return tbt_req_send(r, s, &q, NULL, 0, NULL);
}

/* An Acquire of LATEST on ch that releases lease with done event done and
 * done signal signal; the new lease's id goes to *out. */
static int acquire_releasing(struct tbd_registry *r, struct tbd_session *s,
                             const char *ch, uint64_t lease, uint64_t done,
                             uint64_t signal, uint64_t *out) {
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Acquire a = TENSORBROKER__V1__ACQUIRE__INIT;
  struct tbt_cap *c;
  int st;

  q.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  q.acquire = &a;
  a.channel = (char *)ch;
  a.mode = LATEST;
  a.release_lease_id = lease;
  a.release_done_event_id = done;
  a.release_done_signal = signal;
  st = tbt_req_send(r, s, &q, NULL, 0, &c);
  if (st == 0)
    *out = c->m->reply->acquire->lease_id;
  if (c != NULL)
    tbt_cap_free(c);
  return st;
}

/* Release.done_signal (and Acquire.release_done_signal) needs the done
 * event it stands for and the session's done slot in the lease's buffer:
 * without either it is refused and nothing changes (the lease is still
 * held, the version not freed). Accepted, the version's entry for the
 * event carries the slot and the largest signal of the session's releases
 * to the producer's VersionFree, with the consumer's shm_id and pidns_id;
 * a same-domain consumer's event carries none. */
static void test_signal_done_release(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session_ns(r, 10, 21, 31),
                     *c = session_ns(r, 11, 22, 32),
                     *d = session_ns(r, 12, 21, 31);
  struct pub o = {.dev_type = kDLCUDA};
  uint64_t id, ec = event(r, c), ed = event(r, d), l4 = 0;
  const Tensorbroker__V1__EventInfo *e;
  struct acq a1, a2, a3;
  struct tbt_cap *m;

  (void)state;
  assert_tb_ok(reg_vmm_signals(r, p, 4096, 4064, &id));
  assert_tb_ok(publish_ex(r, p, "s", id, &o, NULL));
  a1 = acquire(r, c, "s", LATEST, 0);
  a2 = acquire(r, c, "s", LATEST, 0);
  a3 = acquire(r, d, "s", LATEST, 0);
  assert_int_equal(a1.done_slot, 1);
  assert_int_equal(a3.done_slot, 0);
  assert_tb_ok(publish_ex(r, p, "s", id, &o, NULL)); /* 1 leaves, leased */

  /* refused, changing nothing */
  assert_tb_err(release_signal(r, c, a1.lease, 0, 5), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "a done signal comes with the "
                                           "done event it stands for"));
  assert_tb_err(release_signal(r, d, a3.lease, ed, 5), TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "no done slot"));
  assert_tb_err(acquire_releasing(r, c, "s", a1.lease, 0, 5, &l4),
                TB_EINVAL);
  assert_non_null(strstr(tbt_last_message, "cannot release lease"));
  assert_int_equal(counts(r).leases, 3);
  assert_int_equal(counts(r).versions, 2);
  assert_null(tbt_cap_take_notice(p, N_FREE));

  /* 9, then 4 with the acquire of version 2: the producer waits for 9 */
  assert_tb_ok(release_signal(r, c, a1.lease, ec, 9));
  assert_tb_ok(acquire_releasing(r, c, "s", a2.lease, ec, 4, &l4));
  assert_null(tbt_cap_take_notice(p, N_FREE));
  assert_tb_ok(release_signal(r, d, a3.lease, ed, 0));
  m = tbt_cap_take_notice(p, N_FREE);
  assert_non_null(m);
  assert_int_equal(m->m->notice->version_free->version, 1);
  assert_int_equal(m->m->notice->version_free->n_done_events, 2);
  e = m->m->notice->version_free->done_events[0];
  assert_int_equal(e->event_id, ec);
  assert_int_equal(e->signal_slot, 1);
  assert_int_equal(e->signal_value, 9);
  assert_int_equal(e->owner_shm_id, 22);
  assert_int_equal(e->owner_pidns_id, 32);
  e = m->m->notice->version_free->done_events[1];
  assert_int_equal(e->event_id, ed);
  assert_int_equal(e->signal_slot, 0);
  assert_int_equal(e->signal_value, 0);
  assert_int_equal(e->owner_pidns_id, 31);
  tbt_cap_free(m);
  /* version 2: its own entry, from the release of l4 alone */
  assert_tb_ok(publish_ex(r, p, "s", id, &o, NULL)); /* 2 leaves, by l4 */
  assert_tb_ok(release_signal(r, c, l4, ec, 6));
  m = tbt_cap_take_notice(p, N_FREE);
  assert_non_null(m);
  assert_int_equal(m->m->notice->version_free->version, 2);
  assert_int_equal(m->m->notice->version_free->n_done_events, 1);
  e = m->m->notice->version_free->done_events[0];
  assert_int_equal(e->signal_slot, 1);
  assert_int_equal(e->signal_value, 6);
  tbt_cap_free(m);
  tbt_registry_free(r);
}

static void test_wait_free(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  uint64_t b = buffer(r, p), id;
  struct acq a;

  (void)state;
  assert_int_equal(wait_free(r, p, "x", 1, 0, NULL), TB_ENOTFOUND);
  publish(r, p, "x", b, 0);
  assert_int_equal(wait_free(r, p, "x", 2, 0, NULL), TB_ENOTFOUND);
  assert_int_equal(wait_free(r, p, "x", 1, 0, NULL), TB_EBUSY); /* history */
  a = acquire(r, c, "x", LATEST, 0);
  publish(r, p, "x", b, 0);
  assert_int_equal(wait_free(r, p, "x", 1, 0, NULL), TB_EBUSY); /* leased */
  assert_int_equal(wait_free(r, p, "x", 1, -1, &id), PARKED);
  assert_tb_ok(release(r, c, a.lease));
  assert_int_equal(expect_free(p, 1), 0);
  assert_int_equal(parked_reply(p, id, NULL), 0);
  /* already free: at once */
  assert_int_equal(wait_free(r, p, "x", 1, -1, NULL), 0);
  /* timeout */
  assert_int_equal(wait_free(r, p, "x", 2, 10, &id), PARKED);
  fake_now += 10;
  tbd_registry_expire(r);
  assert_int_equal(parked_reply(p, id, NULL), TB_ETIMEDOUT);
  tbt_registry_free(r);
}

static void test_protocol_errors(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *s, *t;
  req_t q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Status st = TENSORBROKER__V1__STATUS__INIT;
  int fds[2];

  (void)state;
  assert_tb_ok(tbd_session_open(r, 1, 0, 0, NULL, &s));
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
  q.status = &st;
  q.request_id = 7;
  /* before Hello */
  assert_int_equal(tbd_session_request(r, s, &q, NULL, 0), TB_EPROTO);
  {
    struct tbt_cap *c = tbt_cap_take_reply(s, 7);
    assert_non_null(c);
    assert_int_equal(c->m->reply->status, TB_EPROTO);
    assert_true(strlen(c->m->reply->message) > 0);
    tbt_cap_free(c);
  }
  tbd_session_close(r, s);
  /* unexpected descriptors are closed (teardown counts them) */
  t = session(r, 2);
  fds[0] = memfd(16, false);
  fds[1] = memfd(16, false);
  q.request_id = 8;
  assert_int_equal(tbd_session_request(r, t, &q, fds, 2), TB_EPROTO);
  tbt_caps_clear();
  tbd_session_close(r, t);
  /* second Hello */
  t = session(r, 3);
  assert_int_equal(tbt_req_hello(r, t, "again"), TB_EPROTO);
  tbd_session_close(r, t);
  /* bad Hello fields are semantic errors */
  assert_tb_ok(tbd_session_open(r, 4, 0, 0, NULL, &s));
  assert_int_equal(tbt_req_hello(r, s, "bad\nname"), TB_ENAME);
  assert_int_equal(tbt_req_hello(r, s, "fine"), 0);
  tbd_session_close(r, s);
  assert_int_equal(tbd_registry_stats(r)->bad_messages, 3);
  assert_int_equal(counts(r).sessions, 0);
  tbt_registry_free(r);
}

/* ---- allocation failures: fail each allocation in turn ---- */

struct snapshot {
  struct tbd_counts c;
  size_t msgs;
};

static struct snapshot snap(struct tbd_registry *r) {
  struct snapshot s = {0};
  tbd_registry_counts(r, &s.c);
  for (struct tbt_cap *c = tbt_caps; c != NULL; c = c->next)
    s.msgs++;
  return s;
}

static void test_alloc_failure_publish(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  uint64_t b = buffer(r, p), v = 0;
  int rc, failures = 0;

  (void)state;
  simple(r, c, SUBSCRIBE, "new/channel", 0);
  for (unsigned long n = 1;; n++) {
    struct snapshot before = snap(r);
    tbd_alloc_fail_at(n, 0);
    rc = publish_ex(r, p, "new/channel", b, NULL, &v);
    tbd_alloc_fail_at(0, 0);
    if (rc == 0)
      break;
    assert_int_equal(rc, TB_ENOMEM);
    failures++;
    struct snapshot after = snap(r);
    assert_memory_equal(&before.c, &after.c, sizeof(before.c));
    assert_int_equal(before.msgs, after.msgs); /* no notice went out */
    assert_true(n < 100);
  }
  assert_true(failures >= 4);
  assert_int_equal(v, 1); /* no number was used up by the failures */
  assert_int_equal(tbt_cap_drop_notices(c, N_NEW), 1);
  tbt_registry_free(r);
}

static void test_alloc_failure_acquire(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c = session(r, 11);
  uint64_t b = buffer(r, p);
  struct acq a;
  int rc, failures = 0;

  (void)state;
  publish(r, p, "x", b, 0);
  for (unsigned long n = 1;; n++) {
    struct snapshot before = snap(r);
    tbd_alloc_fail_at(n, 0);
    rc = acquire_ex(r, c, "x", LATEST, 0, 0, &a, NULL);
    tbd_alloc_fail_at(0, 0);
    if (rc == 0)
      break;
    assert_int_equal(rc, TB_ENOMEM);
    failures++;
    struct snapshot after = snap(r);
    assert_memory_equal(&before.c, &after.c, sizeof(before.c));
    assert_true(n < 100);
  }
  assert_true(failures >= 3);
  /* the failed attempts did not mark the fd as sent */
  assert_true(a.fd_attached);
  assert_int_equal(a.lease, 1);
  assert_tb_ok(release(r, c, a.lease));
  tbt_registry_free(r);
}

static void test_alloc_failure_subscribe(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *c = session(r, 11);
  int rc;

  (void)state;
  for (unsigned long n = 1;; n++) {
    struct snapshot before = snap(r);
    tbd_alloc_fail_at(n, 0);
    rc = simple(r, c, SUBSCRIBE, "s", 0);
    tbd_alloc_fail_at(0, 0);
    if (rc == 0)
      break;
    assert_int_equal(rc, TB_ENOMEM);
    struct snapshot after = snap(r);
    assert_memory_equal(&before.c, &after.c, sizeof(before.c));
    assert_true(n < 100);
  }
  assert_int_equal(counts(r).subscriptions, 1);
  tbt_registry_free(r);
}

/* ---- flat costs: waits by deadline and by channel, deep histories ---- */

/* The replies emitted since tbt_caps was last cleared, in emission order:
 * sessions (by id) and request ids, at most max of them. */
static size_t replies_in_order(uint64_t *sids, uint64_t *ids, int *status,
                               size_t max) {
  size_t n = 0;

  for (struct tbt_cap *c = tbt_caps; c != NULL; c = c->next) {
    if (c->m->body_case != REPLY_CASE)
      continue;
    assert_true(n < max);
    sids[n] = c->sid;
    ids[n] = c->m->reply->request_id;
    status[n] = c->m->reply->status;
    n++;
  }
  return n;
}

struct timed_wait {
  struct tbd_session *s;
  uint64_t id, deadline;
  int want;
  size_t arrival;
};

static int timed_wait_cmp(const void *a, const void *b) {
  const struct timed_wait *x = a, *y = b;

  if (x->deadline != y->deadline)
    return x->deadline < y->deadline ? -1 : 1;
  return x->arrival < y->arrival ? -1 : x->arrival > y->arrival;
}

/* Waits of every kind on many channels, their deadlines interleaved (and
 * some equal): the next deadline is always the soonest left, and each wait
 * is answered at its deadline, not a millisecond before, soonest first
 * and at one deadline in arrival order: acquires on a channel that does
 * not exist yet or has its producer, and WaitFree, with TB_ETIMEDOUT;
 * acquires on a channel whose producer is gone with TB_ECLOSED. Waits
 * without a deadline never expire. */
static void test_wait_deadlines(void **state) {
  enum { N = 600 };
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *gone = session(r, 11);
  uint64_t b = buffer(r, p), start = fake_now;
  uint64_t sids[N], ids[N];
  int status[N];
  struct timed_wait *tw = calloc(N, sizeof(*tw));
  size_t ntimed = 0, nforever = 0;

  (void)state;
  assert_non_null(tw);
  publish(r, p, "d/live", b, 4);
  publish(r, gone, "d/dead", buffer(r, gone), 0);
  tbd_session_close(r, gone);
  for (size_t i = 0; i < N; i++) {
    struct tbd_session *s = session(r, (pid_t)(100 + i));
    /* 97 deadlines 3 ms apart, in an order unlike arrival's */
    int64_t timeout = i % 50 == 49 ? -1 : 1 + (int64_t)((i * 7919) % 97) * 3;
    uint64_t id;
    int want = TB_ETIMEDOUT;
    char name[32];

    switch (i % 4) {
    case 0: /* a channel that does not exist yet */
      snprintf(name, sizeof(name), "d/none/%zu", i % 5);
      assert_int_equal(acquire_ex(r, s, name, LATEST, 0, timeout, NULL, &id),
                       PARKED);
      break;
    case 1:
      assert_int_equal(
          acquire_ex(r, s, "d/live", NEXT, 1, timeout, NULL, &id), PARKED);
      break;
    case 2: /* its producer is gone: TB_ECLOSED at the deadline */
      assert_int_equal(
          acquire_ex(r, s, "d/dead", NEXT, 1, timeout, NULL, &id), PARKED);
      want = TB_ECLOSED;
      break;
    default:
      assert_int_equal(wait_free(r, s, "d/live", 1, timeout, &id), PARKED);
      break;
    }
    if (timeout < 0) {
      nforever++;
      continue;
    }
    tw[ntimed++] = (struct timed_wait){.s = s, .id = id, .want = want,
                                       .deadline = start + (uint64_t)timeout,
                                       .arrival = i};
  }
  assert_int_equal(counts(r).waits, N);
  qsort(tw, ntimed, sizeof(*tw), timed_wait_cmp);
  tbt_caps_clear();
  for (size_t k = 0; k < ntimed;) {
    uint64_t d = tw[k].deadline;
    size_t group = 0, n;

    while (k + group < ntimed && tw[k + group].deadline == d)
      group++;
    assert_int_equal(tbd_registry_next_deadline(r), d);
    fake_now = d - 1;
    tbd_registry_expire(r);
    assert_null(tbt_caps);
    fake_now = d;
    tbd_registry_expire(r);
    n = replies_in_order(sids, ids, status, N);
    assert_int_equal(n, group);
    for (size_t j = 0; j < group; j++) {
      assert_int_equal(sids[j], tbd_session_id(tw[k + j].s));
      assert_int_equal(ids[j], tw[k + j].id);
      assert_int_equal(status[j], tw[k + j].want);
    }
    tbt_caps_clear();
    k += group;
  }
  assert_int_equal(counts(r).waits, nforever);
  assert_int_equal(tbd_registry_next_deadline(r), UINT64_MAX);
  fake_now += 1000000;
  tbd_registry_expire(r);
  assert_null(tbt_caps);
  free(tw);
  tbt_registry_free(r);
}

struct fifo_wait {
  struct tbd_session *s;
  uint64_t id;
};

/* The replies since tbt_caps was cleared are acquires granting version v to
 * exactly want[0..n), in that order. */
static void expect_granted(const struct fifo_wait *want, size_t n,
                           uint64_t v) {
  size_t k = 0;

  for (struct tbt_cap *c = tbt_caps; c != NULL; c = c->next) {
    if (c->m->body_case != REPLY_CASE)
      continue;
    assert_true(k < n);
    assert_int_equal(c->sid, tbd_session_id(want[k].s));
    assert_int_equal(c->m->reply->request_id, want[k].id);
    assert_int_equal(c->m->reply->status, 0);
    assert_int_equal(c->m->reply->acquire->version, v);
    k++;
  }
  assert_int_equal(k, n);
  tbt_caps_clear();
}

/* A publish answers the acquires parked on its channel that its version
 * satisfies, in arrival order, and nobody else: not those on other
 * channels, nor NEXT after a number not yet reached, which the publish of
 * that number + 1 answers, merged in arrival order with the acquires that
 * came later. LATEST and NEXT on a channel that does not exist yet wait
 * for its first version (NEXT after 1 for the second). */
static void test_publish_wakes_own_channel(void **state) {
  enum { N = 90 };
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10);
  uint64_t b = buffer(r, p);
  struct fifo_wait a_all[N], b_next1[N], b_next2[N], new_first[N],
      new_second[N];
  size_t na = 0, nb1 = 0, nb2 = 0, nn1 = 0, nn2 = 0;
  uint32_t parked = 0;

  (void)state;
  publish(r, p, "f/a", b, 0);
  publish(r, p, "f/b", b, 0);
  for (size_t i = 0; i < N; i++) {
    struct tbd_session *s = session(r, (pid_t)(100 + i));
    struct fifo_wait w = {.s = s};
    size_t j = i / 3;

    switch (i % 3) {
    case 0:
      assert_int_equal(acquire_ex(r, s, "f/a", NEXT, 1, -1, NULL, &w.id),
                       PARKED);
      a_all[na++] = w;
      break;
    case 1: /* f/b is at 1: NEXT after 2 waits for version 3 */
      assert_int_equal(acquire_ex(r, s, "f/b", NEXT, j % 2 ? 2 : 1, 60000,
                                  NULL, &w.id),
                       PARKED);
      if (j % 2)
        b_next2[nb2++] = w;
      else
        b_next1[nb1++] = w;
      break;
    default: /* f/new does not exist */
      if (j % 3 == 2) {
        assert_int_equal(
            acquire_ex(r, s, "f/new", NEXT, 1, 60000, NULL, &w.id), PARKED);
        new_second[nn2++] = w;
      } else {
        assert_int_equal(acquire_ex(r, s, "f/new", j % 3 ? LATEST : NEXT, 0,
                                    j % 2 ? -1 : 60000, NULL, &w.id),
                         PARKED);
        new_first[nn1++] = w;
      }
      break;
    }
    parked++;
  }
  assert_int_equal(counts(r).waits, parked);
  tbt_caps_clear();

  assert_int_equal(publish(r, p, "f/b", b, 0), 2);
  expect_granted(b_next1, nb1, 2);
  parked -= (uint32_t)nb1;
  assert_int_equal(counts(r).waits, parked);
  /* more arrive, now satisfied by the next publish: they are served after
   * the earlier NEXT-after-2 ones, which arrived first */
  for (size_t i = 0; i < 5; i++) {
    struct tbd_session *s = session(r, (pid_t)(300 + i));
    struct fifo_wait w = {.s = s};
    assert_int_equal(acquire_ex(r, s, "f/b", NEXT, 2, 60000, NULL, &w.id),
                     PARKED);
    b_next2[nb2++] = w;
    parked++;
  }
  assert_int_equal(publish(r, p, "f/b", b, 0), 3);
  expect_granted(b_next2, nb2, 3);
  parked -= (uint32_t)nb2;

  assert_int_equal(publish(r, p, "f/new", b, 0), 1);
  expect_granted(new_first, nn1, 1);
  parked -= (uint32_t)nn1;
  assert_int_equal(publish(r, p, "f/new", b, 0), 2);
  expect_granted(new_second, nn2, 2);
  parked -= (uint32_t)nn2;

  /* f/a's waiters heard nothing of all that */
  assert_int_equal(counts(r).waits, parked);
  assert_int_equal(parked, na);
  assert_int_equal(publish(r, p, "f/a", b, 0), 2);
  expect_granted(a_all, na, 2);
  assert_int_equal(counts(r).waits, 0);
  assert_null(r->waitqs);
  tbt_registry_free(r);
}

/* A history 65,536 deep: EXACT and NEXT find versions at both ends and in
 * the middle; a version that left the history while leased is still
 * granted (EXACT, NEXT), WaitFree waits on it and on one still in the
 * history, and each is freed when it should be; a publish that makes the
 * history shallow frees the rest, newest first. */
static void test_deep_history(void **state) {
  enum { DEPTH = 65536, EXTRA = 1000 };
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *p, *c, *w1, *w2;
  uint64_t b, oldest = EXTRA + 1, newest = DEPTH + EXTRA, mid, id1, id2;

  (void)state;
  tbd_limits_default(&lim);
  lim.max_history = DEPTH;
  /* the whole history outlives its producer, for the new producer's
   * publish to trim below (by default a closed channel keeps one version:
   * --closed-history, docs/limits.md) */
  lim.closed_history = DEPTH;
  r = reg_new(&lim);
  p = session(r, 10);
  c = session(r, 11);
  w1 = session(r, 12);
  w2 = session(r, 13);
  b = buffer(r, p);
  for (uint64_t v = 1; v <= newest; v++) {
    assert_int_equal(publish(r, p, "deep", b, DEPTH), v);
    tbt_caps_clear(); /* VersionFree notices of the first EXTRA */
  }
  mid = oldest + DEPTH / 2;
  assert_int_equal(counts(r).versions, DEPTH);
  assert_int_equal(acquire(r, c, "deep", LATEST, 0).version, newest);
  for (uint64_t v = 0; v <= 2; v++) {
    assert_int_equal(acquire(r, c, "deep", EXACT, oldest + v).version,
                     oldest + v);
    assert_int_equal(acquire(r, c, "deep", EXACT, mid + v).version, mid + v);
    assert_int_equal(acquire(r, c, "deep", EXACT, newest - v).version,
                     newest - v);
    assert_int_equal(acquire(r, c, "deep", NEXT, oldest + v).version,
                     oldest + v + 1);
    assert_int_equal(acquire(r, c, "deep", NEXT, mid + v).version,
                     mid + v + 1);
  }
  assert_int_equal(acquire(r, c, "deep", NEXT, 0).version, oldest);
  assert_int_equal(acquire(r, c, "deep", NEXT, oldest - 1).version, oldest);
  assert_int_equal(acquire(r, c, "deep", NEXT, newest - 1).version, newest);
  assert_int_equal(acquire_ex(r, c, "deep", NEXT, newest, 0, NULL, NULL),
                   TB_EAGAIN);
  assert_int_equal(acquire_ex(r, c, "deep", EXACT, oldest - 1, 0, NULL, NULL),
                   TB_ENOTFOUND);
  assert_int_equal(acquire_ex(r, c, "deep", EXACT, newest + 1, 0, NULL, NULL),
                   TB_ENOTFOUND);
  assert_int_equal(acquire_ex(r, c, "deep", EXACT, 1, 0, NULL, NULL),
                   TB_ENOTFOUND);
  /* c holds leases on many versions now; close it and keep two */
  tbd_session_close(r, c);
  c = session(r, 14);
  assert_int_equal(acquire(r, c, "deep", EXACT, oldest).version, oldest);
  assert_int_equal(acquire(r, c, "deep", EXACT, mid).version, mid);
  assert_int_equal(wait_free(r, w1, "deep", oldest, -1, &id1), PARKED);
  assert_int_equal(wait_free(r, w2, "deep", mid + 1, -1, &id2), PARKED);

  /* oldest leaves the history, leased: granted still, not freed */
  assert_int_equal(publish(r, p, "deep", b, DEPTH), newest + 1);
  assert_null(tbt_cap_take_notice(p, N_FREE));
  assert_int_equal(counts(r).versions, DEPTH + 1);
  assert_int_equal(acquire(r, c, "deep", EXACT, oldest).version, oldest);
  assert_int_equal(acquire(r, c, "deep", NEXT, oldest - 1).version, oldest);
  assert_int_equal(acquire(r, c, "deep", NEXT, oldest).version, oldest + 1);
  assert_int_equal(parked_reply(w1, id1, NULL), PARKED);
  /* c's leases end (the session goes): oldest is freed, mid stays in the
   * history */
  tbd_session_close(r, c);
  assert_int_equal(expect_free(p, oldest), 0);
  assert_null(tbt_cap_take_notice(p, N_FREE));
  assert_int_equal(parked_reply(w1, id1, NULL), 0);
  assert_int_equal(parked_reply(w2, id2, NULL), PARKED);
  c = session(r, 15);
  assert_int_equal(acquire_ex(r, c, "deep", EXACT, oldest, 0, NULL, NULL),
                   TB_ENOTFOUND);
  assert_int_equal(acquire(r, c, "deep", NEXT, 0).version, oldest + 1);

  /* the producer goes (host versions outlive it) and a new one makes the
   * history shallow: every version but its own and the leased one is gone
   * (their producer, gone, hears nothing), and mid + 1's WaitFree has
   * been answered */
  tbd_session_close(r, p);
  p = session(r, 16);
  assert_int_equal(publish(r, p, "deep", buffer(r, p), 1), newest + 2);
  assert_int_equal(parked_reply(w2, id2, NULL), 0);
  assert_null(tbt_cap_take_notice(p, N_FREE));
  assert_int_equal(counts(r).versions, 2); /* newest + 2, and c's lease */
  tbd_session_close(r, c);
  assert_int_equal(counts(r).versions, 1);
  c = session(r, 17);
  assert_int_equal(acquire(r, c, "deep", NEXT, 0).version, newest + 2);
  assert_int_equal(acquire(r, c, "deep", EXACT, newest + 2).version,
                   newest + 2);
  tbt_registry_free(r);
}

/* Waits leave with their session from wherever they are (the deadline
 * heap's top or middle, a channel's ready list or its heap of NEXT after a
 * number not yet published, a version's WaitFree list), and a channel
 * name's queue goes with its last wait. The waits left are answered as
 * before; nothing reaches the sessions that went. */
static void test_waits_session_end(void **state) {
  enum { N = 240 };
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *ss[N];
  uint64_t b = buffer(r, p), sids[N], first = UINT64_MAX, second = UINT64_MAX;
  bool gone[N];
  size_t nleft = 0, top = 0;

  (void)state;
  for (int v = 1; v <= 3; v++)
    publish(r, p, "e/x", b, 8);
  for (size_t i = 0; i < N; i++) {
    int64_t timeout = i % 7 == 0 ? -1 : 10 + (int64_t)((i * 31) % 200);
    uint64_t id;

    ss[i] = session(r, (pid_t)(100 + i));
    sids[i] = tbd_session_id(ss[i]);
    switch (i % 4) {
    case 0: /* answered by the next publish */
      assert_int_equal(acquire_ex(r, ss[i], "e/x", NEXT, 3, timeout, NULL,
                                  &id),
                       PARKED);
      break;
    case 1: /* by the publish of 6, 7 or 8 */
      assert_int_equal(acquire_ex(r, ss[i], "e/x", NEXT, 5 + i % 3, timeout,
                                  NULL, &id),
                       PARKED);
      break;
    case 2:
      assert_int_equal(acquire_ex(r, ss[i], "e/none", LATEST, 0, timeout,
                                  NULL, &id),
                       PARKED);
      break;
    default:
      assert_int_equal(wait_free(r, ss[i], "e/x", 1 + i % 3, timeout, &id),
                       PARKED);
      break;
    }
    if (timeout >= 0 && fake_now + (uint64_t)timeout < first) {
      second = first;
      first = fake_now + (uint64_t)timeout;
      top = i;
    } else if (timeout >= 0 && fake_now + (uint64_t)timeout < second &&
               fake_now + (uint64_t)timeout != first) {
      second = fake_now + (uint64_t)timeout;
    }
  }
  assert_int_equal(counts(r).waits, N);
  assert_int_equal(tbd_registry_next_deadline(r), first);
  /* the soonest deadline's session goes (it is the only one due then) */
  tbd_session_close(r, ss[top]);
  gone[top] = true;
  assert_int_equal(tbd_registry_next_deadline(r), second);
  for (size_t i = 0; i < N; i++) {
    if (i != top)
      gone[i] = i % 3 == 1;
    if (gone[i] && i != top)
      tbd_session_close(r, ss[i]);
    nleft += !gone[i];
  }
  assert_int_equal(counts(r).waits, nleft);
  tbt_caps_clear();

  for (int v = 4; v <= 11; v++) /* 9 to 11 free versions 1 to 3 */
    publish(r, p, "e/x", b, 8);
  assert_int_equal(tbt_cap_drop_notices(p, N_FREE), 3);
  assert_int_equal(publish(r, p, "e/none", b, 0), 1);
  assert_int_equal(counts(r).waits, 0);
  assert_null(r->waitqs);
  for (size_t i = 0; i < N; i++) {
    size_t n = 0;
    for (struct tbt_cap *c = tbt_caps; c != NULL; c = c->next)
      n += c->sid == sids[i];
    assert_int_equal(n, gone[i] ? 0 : 1);
    if (!gone[i]) {
      struct tbt_cap *c = tbt_caps;
      while (c->sid != sids[i])
        c = c->next;
      assert_int_equal(c->m->body_case, REPLY_CASE);
      assert_int_equal(c->m->reply->status, 0);
    }
  }
  tbt_caps_clear();
  fake_now += 1000;
  tbd_registry_expire(r);
  assert_null(tbt_caps);
  tbt_registry_free(r);
}

/* Parking fails cleanly, whichever allocation fails: for a channel name
 * with no queue yet, one with a queue, NEXT after a number not yet
 * published, and WaitFree. Nothing changes but the TB_ENOMEM reply; the
 * wait parked at last is answered as usual. */
static void test_alloc_failure_park(void **state) {
  struct tbd_registry *r = reg_new(NULL);
  struct tbd_session *p = session(r, 10), *c[5];
  uint64_t b = buffer(r, p), id[5];
  struct acq a;
  int failures = 0;

  (void)state;
  publish(r, p, "x", b, 2);
  for (int k = 0; k < 5; k++)
    c[k] = session(r, 20 + k);
  for (int k = 0; k < 5; k++) {
    for (unsigned long n = 1;; n++) {
      struct snapshot before = snap(r);
      int rc;
      tbd_alloc_fail_at(n, 0);
      switch (k) {
      case 0: /* a new queue */
        rc = acquire_ex(r, c[k], "x", NEXT, 1, 100, NULL, &id[k]);
        break;
      case 1: /* the same queue */
        rc = acquire_ex(r, c[k], "x", NEXT, 1, -1, NULL, &id[k]);
        break;
      case 2: /* its heap of NEXT after a later number */
        rc = acquire_ex(r, c[k], "x", NEXT, 2, 100, NULL, &id[k]);
        break;
      case 3: /* a channel that does not exist */
        rc = acquire_ex(r, c[k], "y", LATEST, 0, 100, NULL, &id[k]);
        break;
      default:
        rc = wait_free(r, c[k], "x", 1, 100, &id[k]);
        break;
      }
      tbd_alloc_fail_at(0, 0);
      if (rc == PARKED)
        break;
      assert_int_equal(rc, TB_ENOMEM);
      failures++;
      struct snapshot after = snap(r);
      assert_memory_equal(&before.c, &after.c, sizeof(before.c));
      assert_int_equal(before.msgs, after.msgs);
      assert_true(n < 100);
    }
  }
  assert_true(failures >= 5);
  assert_int_equal(counts(r).waits, 5);
  publish(r, p, "x", b, 0);
  assert_int_equal(parked_reply(c[0], id[0], &a), 0);
  assert_int_equal(a.version, 2);
  assert_int_equal(parked_reply(c[1], id[1], &a), 0);
  assert_int_equal(parked_reply(c[2], id[2], NULL), PARKED);
  publish(r, p, "x", b, 0); /* 3: version 1 leaves the history */
  assert_int_equal(parked_reply(c[2], id[2], &a), 0);
  assert_int_equal(a.version, 3);
  assert_int_equal(parked_reply(c[4], id[4], NULL), 0);
  fake_now += 100;
  tbd_registry_expire(r);
  assert_int_equal(parked_reply(c[3], id[3], NULL), TB_ETIMEDOUT);
  assert_int_equal(counts(r).waits, 0);
  tbt_registry_free(r);
}

/* Gaps in a history: a producer of host and CUDA versions in turn ends, so
 * its CUDA versions die (freed, or kept while leased but never granted
 * again). Versions are still found by number across the gaps, NEXT skips
 * the dead ones still leased, and those leave from the middle as their
 * leases end in no particular order. The host versions are leased too, so
 * that whatever the daemon keeps of a closed channel's history, they stay. */
static void test_history_gaps(void **state) {
  enum { N = 600 };
  struct tbd_limits lim;
  struct tbd_registry *r;
  struct tbd_session *p, *c;
  uint64_t hb, cb, lease[N + 1] = {0};
  struct pub gpu = {.dev_type = kDLCUDA, .depth = N, .meta_len = 3};
  struct pub host = {.depth = N, .meta_len = 3};

  (void)state;
  tbd_limits_default(&lim);
  lim.max_history = N;
  r = reg_new(&lim);
  p = session(r, 10);
  c = session(r, 11);
  hb = buffer(r, p);
  cb = cuda_buffer(r, p, 0x11);
  for (uint64_t v = 1; v <= N; v++) /* odd: host, even: CUDA */
    assert_tb_ok(publish_ex(r, p, "gaps", v % 2 ? hb : cb,
                            v % 2 ? &host : &gpu, NULL));
  for (uint64_t v = 1; v <= N; v++)
    if (v % 2 == 1 || v % 6 == 0)
      lease[v] = acquire(r, c, "gaps", EXACT, v).lease;
  tbd_session_close(r, p);
  assert_int_equal(counts(r).versions, N / 2 + N / 6);
  for (int pass = 0; pass < 2; pass++) {
    for (uint64_t v = 1; v <= N; v++) {
      struct acq a;
      if (v % 2 == 1) {
        a = acquire(r, c, "gaps", EXACT, v);
        assert_int_equal(a.version, v);
        assert_tb_ok(release(r, c, a.lease));
      } else {
        assert_int_equal(acquire_ex(r, c, "gaps", EXACT, v, 0, NULL, NULL),
                         TB_ECLOSED);
      }
      if (v < N - 1) {
        a = acquire(r, c, "gaps", NEXT, v);
        assert_int_equal(a.version, v % 2 ? v + 2 : v + 1);
        assert_tb_ok(release(r, c, a.lease));
      } else {
        assert_int_equal(acquire_ex(r, c, "gaps", NEXT, v, 0, NULL, NULL),
                         TB_ECLOSED);
      }
    }
    if (pass == 1)
      break;
    /* the dead ones' leases end, scattered: each leaves the middle */
    for (uint64_t k = 0; k < N / 6; k++) {
      uint64_t v = 6 * (1 + (k * 37) % (N / 6));
      assert_tb_ok(release(r, c, lease[v]));
      lease[v] = 0;
    }
    assert_int_equal(counts(r).versions, N / 2);
  }
  tbt_registry_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
      T(test_publish_acquire_release),
      T(test_history_depth_3),
      T(test_done_events_collected),
      T(test_ready_complete),
      T(test_consumer_close_releases),
      T(test_producer_close),
      T(test_producer_close_reason),
      T(test_cuda_producer_gone),
      T(test_cuda_producer_restarts),
      T(test_mixed_kinds_producer_gone),
      T(test_buffer_retire),
      T(test_forget_reattaches),
      T(test_modes),
      T(test_several_waits),
      T(test_waits_limit),
      T(test_list_waits_pages),
      T(test_recent_channel),
      T(test_second_publisher_busy),
      T(test_subscriptions),
      T(test_prefetch_notices),
      T(test_hello_channels),
      T(test_hello_channels_room),
      T(test_alloc_failure_prefetch),
      T(test_limits),
      T(test_buffer_register_checks),
      T(test_buffer_register_seals),
      T(test_kind_table),
      T(test_event_register_device),
      T(test_buffer_register_kinds),
      T(test_vmm_buffers),
      T(test_signal_offset_register),
      T(test_signal_publish),
      T(test_signal_done_slots),
      T(test_signal_done_release),
      T(test_dead_sessions_events_gone),
      T(test_done_event_bytes),
      T(test_wait_free),
      T(test_protocol_errors),
      T(test_alloc_failure_publish),
      T(test_alloc_failure_acquire),
      T(test_alloc_failure_subscribe),
      T(test_wait_deadlines),
      T(test_publish_wakes_own_channel),
      T(test_deep_history),
      T(test_history_gaps),
      T(test_waits_session_end),
      T(test_alloc_failure_park),
#undef T
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
