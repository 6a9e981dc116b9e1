/* SPDX-License-Identifier: Apache-2.0 */
/* The limits as clients meet them (docs/limits.md), with the real daemon:
 * the descriptor budget and its reserve (a new client and tbctl are told
 * TB_ELIMIT, an operator gets in), a channel table filled by a producer
 * that left, the done-event cap on the wire and in tb_wait_free, sessions
 * that never read their replies (the daemon's memory, measured), the
 * largest message the daemon takes sent and received by the library, and
 * the start-up checks. */
#include "tb_test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/sockios.h>

#include "harness.h"
#include "raw_wire.h"

/* ---- helpers ---- */

static int daemon_fds(const struct tbt_daemon *d) {
  char path[64];
  DIR *dir;
  struct dirent *e;
  int n = 0;

  snprintf(path, sizeof(path), "/proc/%d/fd", (int)d->pid);
  dir = opendir(path);
  assert_non_null(dir);
  while ((e = readdir(dir)) != NULL)
    n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

/* The daemon's resident and peak resident memory, in KiB. */
static void daemon_rss(const struct tbt_daemon *d, long *rss, long *hwm) {
  char path[64], line[256];
  FILE *f;

  snprintf(path, sizeof(path), "/proc/%d/status", (int)d->pid);
  f = fopen(path, "re");
  assert_non_null(f);
  *rss = *hwm = -1;
  while (fgets(line, sizeof(line), f) != NULL) {
    if (strncmp(line, "VmRSS:", 6) == 0)
      *rss = strtol(line + 6, NULL, 10);
    else if (strncmp(line, "VmHWM:", 6) == 0)
      *hwm = strtol(line + 6, NULL, 10);
  }
  fclose(f);
  assert_true(*rss > 0 && *hwm > 0);
}

static int start(struct tbt_daemon *d, const char *const *extra) {
  memset(d, 0, sizeof(*d));
  return tbt_daemon_start(d, extra);
}

static tb_client *connect_as(const struct tbt_daemon *d, const char *name,
                             int *rc) {
  struct tb_connect_options o;
  tb_client *c = NULL;

  tb_connect_options_init(&o);
  o.socket_path = d->sock;
  o.client_name = name;
  o.timeout_ms = TBT_TIMEOUT_MS;
  *rc = tb_client_connect(&o, &c);
  return c;
}

static int run_tbctl(const struct tbt_daemon *d, const char *cmd) {
  static char out[65536];
  const char *argv[] = {getenv("TB_TBCTL"), cmd, NULL};

  if (argv[0] == NULL)
    fail_msg("TB_TBCTL not set");
  setenv("TENSORBROKER_SOCKET", d->sock, 1);
  return tbt_run(argv, out, sizeof(out));
}

static void last_error_has(tb_client *c, const char *what) {
  char msg[512];

  tb_client_last_error(c, msg, sizeof(msg));
  if (strstr(msg, what) == NULL)
    fail_msg("last error '%s' does not name '%s'", msg, what);
}

static int publish_u8(tb_client *c, const char *ch, tb_buffer *b,
                      const void *meta, size_t meta_len, uint64_t *v) {
  struct tb_publish_options o;
  int64_t shape[1];
  DLTensor t;

  tbt_u8_tensor(&t, b, shape, 16);
  tb_publish_options_init(&o);
  o.metadata = meta;
  o.metadata_len = meta_len;
  return tb_publish(c, ch, &t, &o, v);
}

/* ---- descriptors: the budget, the reserve, operators ---- */

/* One uid fills the daemon's descriptor budget with buffers (--max-fds
 * small): the next buffer is TB_ELIMIT naming descriptors. Connections
 * still come in, from the reserve: root gets the one operator session,
 * after that a new client and tbctl are told TB_ELIMIT (not a refused
 * connection, as before); once the operator leaves, tbctl works again, and
 * once buffers go, anyone connects. */
static void test_fd_reserve(void **state) {
  static const char *const extra[] = {"--max-fds", "128", "--fd-reserve",
                                      "16", "--operator-sessions", "1",
                                      NULL};
  struct tbt_daemon d;
  tb_client *c, *op, *x;
  tb_buffer *bufs[256];
  int n = 0, rc;

  (void)state;
  assert_int_equal(start(&d, extra), 0);
  assert_tb_ok(tbt_connect(&d, "hog", &c));
  for (;;) {
    assert_true(n < 256);
    rc = tb_host_buffer_create(c, 4096, 0, &bufs[n]);
    if (rc < 0)
      break;
    n++;
  }
  assert_int_equal(rc, TB_ELIMIT);
  last_error_has(c, "descriptors");
  last_error_has(c, "--fd-reserve");
  assert_true(n > 40); /* 128 less what the daemon holds and the reserve */
  /* the operator (root here, or the daemon's uid) */
  if (geteuid() == 0) {
    op = connect_as(&d, "operator", &rc);
    assert_tb_ok(rc);
    x = connect_as(&d, "late", &rc);
    assert_int_equal(rc, TB_ELIMIT);
    assert_null(x);
    assert_int_equal(run_tbctl(&d, "status"), 1);
    tb_client_disconnect(op);
    assert_int_equal(run_tbctl(&d, "status"), 0);
  }
  /* a non-operator is told at once; what the hog frees makes room */
  for (int i = 0; i < n; i++)
    assert_tb_ok(tb_buffer_destroy(bufs[i]));
  x = connect_as(&d, "later", &rc);
  assert_tb_ok(rc);
  tb_client_disconnect(x);
  tb_client_disconnect(c);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

/* ---- closed channels ---- */

/* The first finding, at --max-channels 32: a producer publishes on
 * every name (a buffer each) and leaves. The daemon keeps each channel's
 * last version, and its memfd, while it has room; a new producer's
 * channels then replace the oldest closed ones, whose memfds go with them.
 * A name published again after being freed starts at version 1; one not
 * freed carries on. */
static void test_channel_table_refills(void **state) {
  static const char *const extra[] = {"--max-channels", "32", NULL};
  struct tbt_daemon d;
  tb_client *p, *c;
  tb_buffer *b[32];
  DLManagedTensorVersioned *t;
  struct tb_status st;
  char name[32];
  uint64_t v;
  int base;

  (void)state;
  assert_int_equal(start(&d, extra), 0);
  assert_tb_ok(tbt_connect(&d, "first", &p));
  base = daemon_fds(&d);
  for (int i = 0; i < 32; i++) {
    snprintf(name, sizeof(name), "old/%02d", i);
    assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b[i]));
    tbt_fill(tb_buffer_data(b[i]), 16, (uint64_t)i);
    assert_tb_ok(publish_u8(p, name, b[i], NULL, 0, NULL));
    assert_tb_ok(publish_u8(p, name, b[i], NULL, 0, NULL));
  }
  tb_client_disconnect(p); /* destroys its buffers: retired, still held */
  assert_tb_ok(tbt_connect(&d, "second", &c));
  assert_tb_ok(tb_daemon_status(c, &st));
  assert_int_equal(st.channels, 32);
  /* what the first producer left is still readable */
  assert_tb_ok(tb_acquire(c, "old/31", NULL, &t));
  assert_int_equal(((uint8_t *)t->dl_tensor.data)[5], tbt_pattern(5, 31));
  t->deleter(t);
  assert_int_equal(daemon_fds(&d), base + 32); /* their memfds */
  /* a new producer's channels take the place of the oldest */
  for (int i = 0; i < 31; i++) {
    snprintf(name, sizeof(name), "new/%02d", i);
    if (i == 0)
      assert_tb_ok(tb_host_buffer_create(c, 4096, 0, &b[0]));
    assert_tb_ok(publish_u8(c, name, b[0], NULL, 0, &v));
    assert_int_equal(v, 1);
  }
  assert_tb_ok(tb_daemon_status(c, &st));
  assert_int_equal(st.channels, 32);
  /* 31 old memfds went, the new buffer came */
  assert_int_equal(daemon_fds(&d), base + 1 + 1);
  /* old/31 was not freed: its numbering carries on; old/00 was: it starts
   * again */
  assert_tb_ok(publish_u8(c, "old/31", b[0], NULL, 0, &v));
  assert_int_equal(v, 3);
  tb_client_disconnect(c);
  assert_tb_ok(tbt_connect(&d, "third", &c));
  assert_tb_ok(tb_host_buffer_create(c, 4096, 0, &b[0]));
  assert_tb_ok(publish_u8(c, "old/00", b[0], NULL, 0, &v));
  assert_int_equal(v, 1);
  tb_client_disconnect(c);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

/* ---- done events ---- */

static uint64_t raw_event(int fd, uint64_t id, uint8_t tag) {
  Tensorbroker__V1__EventRegister er = TENSORBROKER__V1__EVENT_REGISTER__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  uint8_t handle[64] = {0};
  tb__server_message *m;
  uint64_t e;

  handle[0] = tag;
  er.cuda_ipc_event_handle.data = handle;
  er.cuda_ipc_event_handle.len = sizeof(handle);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_EVENT_REGISTER;
  r.event_register = &er;
  m = raw_ok(fd, &r, id);
  e = m->reply->event_register->event_id;
  tb__server_message_free(m);
  return e;
}

/* A raw consumer of its own session: acquire version v of ch and release
 * it with a done event of its own (made-up CUDA handle). Returns the fd. */
static int consume_with_event(const struct tbt_daemon *d, const char *ch,
                              uint64_t v, uint8_t tag) {
  Tensorbroker__V1__Acquire a = TENSORBROKER__V1__ACQUIRE__INIT;
  Tensorbroker__V1__Release rl = TENSORBROKER__V1__RELEASE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  tb__server_message *m;
  int fd = raw_connect(d);
  uint64_t e;

  raw_hello_as(fd, false, true);
  e = raw_event(fd, 2, tag);
  a.channel = (char *)ch;
  a.mode = TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_EXACT;
  a.version = v;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  r.acquire = &a;
  m = raw_ok(fd, &r, 3);
  rl.lease_id = m->reply->acquire->lease_id;
  tb__server_message_free(m);
  rl.done_event_id = e;
  rl.want_reply = true;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_RELEASE;
  r.release = &rl;
  tb__server_message_free(raw_ok(fd, &r, 4));
  return fd;
}

/* Publish the next version of ch from CUDA buffer bid (raw_publish's
 * tensor) and return the VersionFree notice for version old that comes
 * before the reply (in *keep, for the caller to free). */
static Tensorbroker__V1__VersionFree *publish_freeing(
    int fd, uint64_t id, const char *ch, uint64_t bid, uint64_t old,
    tb__server_message **keep) {
  Tensorbroker__V1__Publish p = TENSORBROKER__V1__PUBLISH__INIT;
  Tensorbroker__V1__Layout l = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  int64_t shape[1] = {16};

  p.channel = (char *)ch;
  p.buffer_id = bid;
  p.layout = &l;
  l.device = &dev;
  dev.type = kDLCUDA;
  l.dtype_code = kDLFloat;
  l.dtype_bits = 32;
  l.dtype_lanes = 1;
  l.shape = shape;
  l.n_shape = 1;
  r.request_id = id;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_PUBLISH;
  r.publish = &p;
  raw_send_req(fd, &r);
  *keep = NULL;
  for (;;) {
    tb__server_message *m = raw_recv(fd);
    assert_non_null(m);
    if (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY) {
      assert_int_equal(m->reply->request_id, id);
      assert_int_equal(m->reply->status, 0);
      tb__server_message_free(m);
      break;
    }
    if (m->notice->body_case == TENSORBROKER__V1__NOTICE__BODY_VERSION_FREE &&
        m->notice->version_free->version == old && *keep == NULL)
      *keep = m;
    else
      tb__server_message_free(m);
  }
  assert_non_null(*keep);
  return (*keep)->notice->version_free;
}

/* Park a WaitFree on version v of ch from fd (its own session). */
static void send_wait_free(int fd, uint64_t id, const char *ch, uint64_t v) {
  Tensorbroker__V1__WaitFree w = TENSORBROKER__V1__WAIT_FREE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;

  w.channel = (char *)ch;
  w.version = v;
  w.timeout_ms = -1;
  r.request_id = id;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_WAIT_FREE;
  r.wait_free = &w;
  raw_send_req(fd, &r);
}

/* --max-done-events 2 on the wire (made-up CUDA events, tests/common/
 * fake_cuda.h): two consumers' events are both in the VersionFree; with
 * three, two are and done_events_dropped says one went. Through the
 * library, a producer's tb_wait_free on such a version is TB_ELIMIT,
 * every time it asks, and never 0. */
static void test_done_events_capped(void **state) {
  static const char *const extra[] = {"--max-done-events", "2", NULL};
  struct tbt_daemon d;
  Tensorbroker__V1__VersionFree *vf;
  tb__server_message *keep;
  int prod, cons[3], watch;
  uint64_t b;
  tb_client *lp;
  tb_buffer *hb;
  uint64_t v;

  (void)state;
  assert_int_equal(start(&d, extra), 0);
  prod = raw_connect(&d);
  raw_hello_as(prod, true, true);
  b = raw_cuda_buffer(prod, 2, 0x44);
  watch = raw_connect(&d);
  raw_hello(watch);
  for (int n = 2; n <= 3; n++) {
    uint64_t ver = raw_publish(prod, 10 + (uint64_t)n, "de/x", b, 0);
    tb__server_message *m;
    for (int i = 0; i < n; i++)
      cons[i] = consume_with_event(&d, "de/x", ver, (uint8_t)(n * 10 + i));
    send_wait_free(watch, 30 + (uint64_t)n, "de/x", ver);
    {
      /* parked before the publish below: the Status after it answered */
      Tensorbroker__V1__Status st = TENSORBROKER__V1__STATUS__INIT;
      tb__request r = TENSORBROKER__V1__REQUEST__INIT;
      r.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
      r.status = &st;
      tb__server_message_free(raw_ok(watch, &r, 40 + (uint64_t)n));
    }
    /* ver leaves the history */
    vf = publish_freeing(prod, 20 + (uint64_t)n, "de/x", b, ver, &keep);
    assert_int_equal(vf->n_done_events, 2);
    assert_int_equal(vf->done_events_dropped, (uint32_t)(n - 2));
    tb__server_message_free(keep);
    m = raw_recv(watch);
    assert_non_null(m);
    assert_int_equal(m->reply->request_id, 30 + (uint64_t)n);
    assert_int_equal(m->reply->wait_free->n_done_events, 2);
    assert_int_equal(m->reply->wait_free->done_events_dropped,
                     (uint32_t)(n - 2));
    tb__server_message_free(m);
    for (int i = 0; i < n; i++)
      close(cons[i]);
  }
  close(watch);
  close(prod);

  /* the library's producer (host memory: a raw consumer may still name
   * done events) */
  assert_tb_ok(tbt_connect(&d, "producer", &lp));
  assert_tb_ok(tb_host_buffer_create(lp, 4096, 0, &hb));
  assert_tb_ok(publish_u8(lp, "de/h", hb, NULL, 0, &v));
  for (int i = 0; i < 3; i++)
    cons[i] = consume_with_event(&d, "de/h", v, (uint8_t)(90 + i));
  assert_tb_ok(publish_u8(lp, "de/h", hb, NULL, 0, NULL));
  assert_tb_err(tb_wait_free(lp, "de/h", v, TBT_TIMEOUT_MS, NULL), TB_ELIMIT);
  last_error_has(lp, "--max-done-events");
  assert_tb_err(tb_wait_free(lp, "de/h", v, 0, NULL), TB_ELIMIT);
  for (int i = 0; i < 3; i++)
    close(cons[i]);
  tb_client_disconnect(lp);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

/* ---- unread replies ---- */

/* Whether the daemon has read everything fd sent, or closed fd. */
static bool drained_or_closed(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  int queued = 0;

  if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
    return true;
  assert_int_equal(ioctl(fd, SIOCOUTQ, &queued), 0);
  return queued == 0;
}

/* A request whose reply is a page of sessions (list: channels). */
static void send_list(int fd, uint64_t id, bool channels) {
  Tensorbroker__V1__ListSessions ls = TENSORBROKER__V1__LIST_SESSIONS__INIT;
  Tensorbroker__V1__ListChannels lc = TENSORBROKER__V1__LIST_CHANNELS__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  uint8_t buf[64];
  long n;

  r.request_id = id;
  if (channels) {
    r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_CHANNELS;
    r.list_channels = &lc;
  } else {
    r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_SESSIONS;
    r.list_sessions = &ls;
  }
  n = tb__request_encode(&r, buf, sizeof(buf));
  assert_true(n > 0);
  /* blocks while the socket is full (the daemon reads on); fails once
   * the daemon closed it */
  (void)tb__wire_send(fd, buf, (size_t)n, NULL, 0, 0);
}

/* The fourth finding: 500 sessions of one uid ask for large
 * replies (a page of 250 channels with long names, ~56 KiB) and never read
 * them: each has 12 in flight, more than its socket holds. Their queues
 * count against the uid (--max-outq-per-uid, 16 MiB by default): the
 * largest are dropped, a reading client is served all along, the daemon's
 * peak memory stays within that bound, and once they leave it gives the
 * memory back. The figures are printed (docs/limits.md quotes them; with
 * TB_DAEMON set to an older daemon, the same run measures that one). */
static void unread_replies(const char *const *extra, bool bounded) {
  enum { N = 500, K = 12, NCH = 250 };
  struct tbt_daemon d;
  static int fds[N];
  long rss0, hwm0, rss1, hwm1, rss2, hwm2;
  struct tb_status st;
  tb_client *c;
  tb_buffer *b;
  char name[256];
  uint64_t dropped;

  assert_int_equal(start(&d, extra), 0);
  assert_tb_ok(tbt_connect(&d, "reader", &c));
  assert_tb_ok(tb_host_buffer_create(c, 4096, 0, &b));
  memset(name, 'x', sizeof(name));
  for (int i = 0; i < NCH; i++) {
    snprintf(name, sizeof(name), "unread/%03d-", i);
    name[11] = 'x';
    name[220] = '\0';
    assert_tb_ok(publish_u8(c, name, b, NULL, 0, NULL));
  }
  for (int i = 0; i < N; i++) {
    fds[i] = raw_connect(&d);
    raw_hello(fds[i]);
  }
  assert_tb_ok(tb_daemon_status(c, &st));
  daemon_rss(&d, &rss0, &hwm0);
  for (int k = 0; k < K; k++) {
    for (int i = 0; i < N; i++)
      send_list(fds[i], 2 + (uint64_t)k, true);
    /* the daemon's own state grows meanwhile (channels that stay): freed
     * queues are then holes in its heap, which only a trim gives back */
    for (int i = 0; i < 20; i++) {
      snprintf(name, sizeof(name), "pin/%d-%d", k, i);
      assert_tb_ok(publish_u8(c, name, b, NULL, 0, NULL));
    }
  }
  /* wait until the daemon read all of it (or dropped the sender), with
   * a reading client's round trips between looks */
  for (int i = 0; i < N; i++) {
    uint64_t t0 = tbt_now_ms();
    while (!drained_or_closed(fds[i])) {
      assert_tb_ok(tb_daemon_status(c, &st));
      assert_true(tbt_now_ms() - t0 < TBT_TIMEOUT_MS);
    }
  }
  assert_tb_ok(tb_daemon_status(c, &st));
  daemon_rss(&d, &rss1, &hwm1);
  dropped = st.sessions_dropped;
  print_message("unread replies: %d sessions x %d ListChannels: daemon RSS "
                "%ld KiB before, peak %ld KiB, %llu sessions dropped\n",
                N, K, rss0, hwm1, (unsigned long long)dropped);
  for (int i = 0; i < N; i++)
    close(fds[i]);
  do
    assert_tb_ok(tb_daemon_status(c, &st));
  while (st.sessions > 1);
  /* one more round trip: the answer above may come before the loop's
   * closing phase, where the connections' memory is freed */
  assert_tb_ok(tb_daemon_status(c, &st));
  daemon_rss(&d, &rss2, &hwm2);
  print_message("unread replies: after they left, daemon RSS %ld KiB\n",
                rss2);
  if (bounded)
    assert_true(dropped >= 1);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  /* (the sanitizers' own memory would dwarf the daemon's) */
  /* the uid's queues, at most 16 MiB counted with their overhead, plus
   * the allocator's slack */
  if (bounded)
    assert_true(hwm1 - rss0 < 24 * 1024);
  else
    assert_true(hwm1 - rss0 > 64 * 1024); /* they did queue that much */
  assert_true(rss2 - rss0 < 4 * 1024);
#endif
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(c);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

static void test_unread_replies(void **state) {
  (void)state;
  unread_replies(NULL, true);
}

/* The same with limits high enough that nobody is dropped (the daemon
 * holds over 100 MB of queues): once the sessions leave, the memory is
 * given back all the same. */
static void test_unread_replies_returned(void **state) {
  static const char *const extra[] = {"--max-outq-per-uid", "1073741824",
                                      "--max-outq-total", "1073741824", NULL};
  (void)state;
  unread_replies(extra, false);
}

/* --max-outq-total: two slow sessions of one uid, whose queues together
 * pass it; the one with more queued is dropped, the other and a reading
 * client stay. */
static void test_outq_total(void **state) {
  static const char *const extra[] = {"--max-outq-total", "600000", NULL};
  struct tbt_daemon d;
  struct tb_status st;
  tb_client *c;
  int big, small;

  (void)state;
  assert_int_equal(start(&d, extra), 0);
  assert_tb_ok(tbt_connect(&d, "reader", &c));
  big = raw_connect(&d);
  small = raw_connect(&d);
  raw_hello(big);
  raw_hello(small);
  /* small fills its socket and a little more; big goes on */
  for (int k = 0; k < 8000; k++) {
    send_list(k % 8 == 0 ? small : big, 2 + (uint64_t)k, false);
    if (k % 64 == 0)
      assert_tb_ok(tb_daemon_status(c, &st));
  }
  while (!drained_or_closed(big) || !drained_or_closed(small))
    assert_tb_ok(tb_daemon_status(c, &st));
  assert_tb_ok(tb_daemon_status(c, &st));
  assert_true(st.sessions_dropped >= 1);
  /* the reader was never dropped, and small outlived big */
  {
    struct pollfd p = {.fd = big, .events = POLLRDHUP};
    int n = poll(&p, 1, 0);
    assert_true(n == 1 && (p.revents & (POLLRDHUP | POLLHUP)));
  }
  assert_int_equal(st.sessions, 2 + 1 - 1);
  close(big);
  close(small);
  tb_client_disconnect(c);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

/* ---- the largest message ---- */

static long wmem_max(void) {
  FILE *f = fopen("/proc/sys/net/core/wmem_max", "re");
  long v = 0;

  if (f != NULL) {
    if (fscanf(f, "%ld", &v) != 1)
      v = 0;
    fclose(f);
  }
  return v;
}

/* The fifth finding: metadata inside the daemon's limits (256 KiB,
 * and --max-metadata exactly, at the largest --max-message this machine's
 * sockets allow, up to 1 MiB) goes out in a Publish and comes back in an
 * AcquireReply through the library; one byte more is TB_ELIMIT before
 * anything is sent, and a datagram one byte over --max-message closes that
 * connection only. */
static void test_largest_message(void **state) {
  char maxmsg[32], maxmeta[32];
  const char *extra[] = {"--max-message", maxmsg, "--max-metadata", maxmeta,
                         NULL};
  struct tbt_daemon d;
  long allowed = 2 * wmem_max() - 8192;
  uint32_t m = 1u << 20, meta;
  static uint8_t blob[(1u << 20) + 1];
  size_t sizes[2];
  tb_client *p, *c;
  tb_buffer *b;
  DLManagedTensorVersioned *t;
  struct tb_lease_info li;
  int fd;

  (void)state;
  if (allowed < (long)m)
    m = (uint32_t)(allowed & ~4095L);
  if (m < 256 * 1024 + 8192) {
    print_message("net.core.wmem_max %ld: too small to test\n", wmem_max());
    skip();
  }
  meta = m - 4096;
  snprintf(maxmsg, sizeof(maxmsg), "%u", m);
  snprintf(maxmeta, sizeof(maxmeta), "%u", meta);
  assert_int_equal(start(&d, extra), 0);
  assert_tb_ok(tbt_connect(&d, "big-producer", &p));
  assert_tb_ok(tbt_connect(&d, "big-consumer", &c));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b));
  sizes[0] = 256 * 1024;
  sizes[1] = meta;
  for (int i = 0; i < 2; i++) {
    tbt_fill(blob, sizes[i], (uint64_t)i + 3);
    assert_tb_ok(publish_u8(p, "big", b, blob, sizes[i], NULL));
    assert_tb_ok(tb_acquire(c, "big", NULL, &t));
    assert_tb_ok(tb_lease_info(t, &li));
    assert_int_equal(li.metadata_len, sizes[i]);
    assert_memory_equal(li.metadata, blob, sizes[i]);
    t->deleter(t);
  }
  assert_tb_err(publish_u8(p, "big", b, blob, (size_t)meta + 1, NULL),
                TB_ELIMIT);
  /* one byte over --max-message: that connection only */
  fd = raw_connect(&d);
  raw_hello(fd);
  {
    int sb = (int)m + 8192;
    tb__server_message *r;
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sb, sizeof(sb)),
                     0);
    memset(blob, 0x0a, sizeof(blob));
    assert_int_equal(tb__wire_send(fd, blob, (size_t)m + 1, NULL, 0, 0), 0);
    r = raw_recv(fd);
    if (r != NULL) {
      assert_int_equal(r->reply->status, TB_EPROTO);
      tb__server_message_free(r);
      assert_null(raw_recv(fd));
    }
  }
  close(fd);
  assert_tb_ok(tb_acquire(c, "big", NULL, &t));
  t->deleter(t);
  tb_client_disconnect(c);
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(p);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

/* ---- start-up ---- */

/* Limits that cannot agree stop the daemon at start, saying why: more
 * done events than a message holds (2), a descriptor limit that leaves
 * nothing for clients (1). The default done-event cap fits itself to a
 * small --max-message. */
static void test_startup_checks(void **state) {
  static const char *const events[] = {"--max-message", "16384",
                                       "--max-done-events", "200", NULL};
  static const char *const fds[] = {"--max-fds", "24", NULL};
  static const char *const small[] = {"--max-message", "4096",
                                      "--max-metadata", "0", NULL};
  struct tbt_daemon d;
  char sock[128];
  int code = 0;

  (void)state;
  snprintf(sock, sizeof(sock), "/tmp/tb-limits-%d.sock", (int)getpid());
  memset(&d, 0, sizeof(d));
  assert_true(tbt_daemon_start_at(&d, sock, events, &code) < 0);
  assert_int_equal(code, 2);
  memset(&d, 0, sizeof(d));
  assert_true(tbt_daemon_start_at(&d, sock, fds, &code) < 0);
  assert_int_equal(code, 1);
  unlink(sock);
  assert_int_equal(start(&d, small), 0);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_startup_checks),
      cmocka_unit_test(test_fd_reserve),
      cmocka_unit_test(test_channel_table_refills),
      cmocka_unit_test(test_done_events_capped),
      cmocka_unit_test(test_outq_total),
      cmocka_unit_test(test_unread_replies),
      cmocka_unit_test(test_unread_replies_returned),
      cmocka_unit_test(test_largest_message),
  };
  return cmocka_run_group_tests_name("limits", tests, NULL, NULL);
}
