/* SPDX-License-Identifier: Apache-2.0 */
/* The public API's names and struct_size (issue 25; docs/c-api.md).
 *
 * test_every_new_name: a producer, a consumer and a waiting thread use every
 * tb_<object>_<verb> name, each checked by the data it moves or reports
 * (the rest of the suite calls the older names, so it tests the aliases).
 *
 * test_struct_size: every function that fills a struct, called as programs
 * built against other headers call it: with the struct's size, with 0.1.0's
 * smaller struct tb_channel_info, with a later, larger struct, and with
 * sizes it must refuse. The library writes exactly struct_size bytes (heap
 * blocks of that size, so ASan sees a byte past them, and guard bytes after
 * them in the plain build), fills what fits, zeroes what it does not know,
 * and writes nothing, taking nothing, when it refuses. */
#include "tb_test.h"

#include <pthread.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define GUARD 0xa5
#define GUARD_LEN 64

/* ---- helpers ---- */

static void u8_tensor(DLTensor *t, void *data, int64_t *shape, int64_t n) {
  memset(t, 0, sizeof(*t));
  t->data = data;
  t->device.device_type = kDLCPU;
  t->ndim = 1;
  t->dtype.code = kDLUInt;
  t->dtype.bits = 8;
  t->dtype.lanes = 1;
  shape[0] = n;
  t->shape = shape;
}

static void check_pattern(const DLManagedTensorVersioned *m, int64_t n,
                          uint64_t seed) {
  const uint8_t *p = m->dl_tensor.data;
  assert_int_equal(m->dl_tensor.ndim, 1);
  assert_int_equal(m->dl_tensor.shape[0], n);
  for (int64_t i = 0; i < n; i++)
    assert_int_equal(p[i], tbt_pattern((uint64_t)i, seed));
}

/* A block of size bytes followed by GUARD_LEN guard bytes, all GUARD. */
static unsigned char *guarded(size_t size) {
  unsigned char *p = malloc(size + GUARD_LEN);
  assert_non_null(p);
  memset(p, GUARD, size + GUARD_LEN);
  return p;
}

static void assert_all(const unsigned char *p, size_t from, size_t to,
                       int value) {
  for (size_t i = from; i < to; i++)
    if (p[i] != value)
      fail_msg("byte %zu is 0x%02x, expected 0x%02x", i, p[i], value);
}

struct waiter {
  tb_client *c;
  const char *channel;
  int rc;
  DLManagedTensorVersioned *m;
};

/* Parks an acquire on a channel nobody has published yet. */
static void *waiter_main(void *arg) {
  struct waiter *w = arg;
  struct tb_acquire_options o;

  tb_acquire_options_init(&o);
  o.timeout_ms = TBT_TIMEOUT_MS;
  w->rc = tb_lease_acquire(w->c, w->channel, &o, &w->m);
  return NULL;
}

/* Wait until the daemon has received c's next request after *n. */
static void park_seen(tb_client *observer, tb_client *c, uint64_t n) {
  assert_tb_ok(tbt_wait_requests(observer, tb_client_session_id(c), n + 1));
}

/* ---- every new name ---- */

static void test_every_new_name(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_connect_options co;
  struct tb_publish_options po;
  struct tb_acquire_options ao;
  struct tb_lease_info li;
  struct tb_notice nt;
  struct tb_status st;
  struct tb_channel_info *ci = NULL;
  struct tb_session_info *si = NULL;
  struct tb_lease_entry *le = NULL;
  struct tb_wait_entry *we = NULL;
  struct tb_buffer_entry *be = NULL;
  struct waiter w = {.channel = "api/later"};
  DLManagedTensorVersioned *m = NULL;
  tb_client *p, *c, *bad = NULL;
  tb_buffer *b;
  DLTensor t;
  int64_t shape[1];
  uint64_t v1, v2, v3, nreq;
  char path[256], why[512], *text = NULL;
  uint8_t copy_src[100];
  size_t n, len;
  pthread_t th;
  int found;

  /* the socket path a client uses by default, and why a connect failed */
  setenv("TENSORBROKER_SOCKET", d->sock, 1);
  assert_tb_ok(tb_client_default_socket_path(path, sizeof(path)));
  assert_string_equal(path, d->sock);
  assert_tb_err(tb_client_default_socket_path(path, 4), TB_ELIMIT);
  tb_connect_options_init(&co);
  co.socket_path = "/nonexistent/api.sock";
  assert_tb_err(tb_client_connect(&co, &bad), TB_ECONNECT);
  assert_null(bad);
  assert_true(tb_client_connect_error(why, sizeof(why)) > 0);
  assert_non_null(strstr(why, "/nonexistent/api.sock"));

  assert_tb_ok(tbt_connect(d, "api-producer", &p));
  assert_tb_ok(tbt_connect(d, "api-consumer", &c));

  /* publish from a broker buffer, with metadata; a subscriber hears it */
  assert_tb_ok(tb_channel_subscribe(c, "api/x"));
  assert_tb_ok(tb_buffer_create_host(p, 4096, 0, &b));
  tbt_fill(tb_buffer_data(b), 256, 1);
  u8_tensor(&t, tb_buffer_data(b), shape, 256);
  tb_publish_options_init(&po);
  po.metadata = "meta";
  po.metadata_len = 4;
  assert_tb_ok(tb_channel_publish(p, "api/x", &t, &po, &v1));
  assert_tb_ok(tb_notice_poll(c, sizeof(nt), &nt, TBT_TIMEOUT_MS));
  assert_int_equal(nt.type, TB_NOTICE_NEW_VERSION);
  assert_string_equal(nt.channel, "api/x");
  assert_int_equal(nt.version, v1);

  /* acquire it: the producer's bytes, described by tb_lease_get_info */
  tb_acquire_options_init(&ao);
  ao.timeout_ms = 0;
  assert_tb_ok(tb_lease_acquire(c, "api/x", &ao, &m));
  check_pattern(m, 256, 1);
  assert_tb_ok(tb_lease_get_info(m, sizeof(li), &li));
  assert_int_equal(li.version, v1);
  assert_string_equal(li.channel, "api/x");
  assert_int_equal(li.metadata_len, 4);
  assert_memory_equal(li.metadata, "meta", 4);
  assert_int_equal(li.buffer_id, tb_buffer_id(b));
  assert_int_equal(li.memory_kind, TB_MEMORY_HOST);
  assert_int_equal(li.producer_pid, getpid());
  assert_string_equal(tb_memory_kind_name(li.memory_kind), "host");
  assert_string_equal(tb_memory_kind_name(TB_MEMORY_CUDA_IPC), "cuda-ipc");
  assert_null(tb_memory_kind_name(TB_MEMORY_NONE));
  assert_null(tb_memory_kind_name(99));

  /* an acquire parked on a name nobody published */
  assert_tb_ok(tbt_connect(d, "api-waiter", &w.c));
  assert_tb_ok(tbt_own_requests(w.c, &nreq));
  assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
  park_seen(c, w.c, nreq);

  /* the operator's view of all that */
  assert_tb_ok(tb_lease_list(c, sizeof(*le), &le, &n));
  assert_int_equal(n, 1);
  assert_int_equal(le[0].lease_id, li.lease_id);
  assert_int_equal(le[0].session_id, tb_client_session_id(c));
  assert_string_equal(le[0].session_name, "api-consumer");
  assert_string_equal(le[0].channel, "api/x");
  assert_int_equal(le[0].version, v1);
  assert_int_equal(le[0].memory_kind, TB_MEMORY_HOST);
  assert_int_equal(le[0].bytes, 4096);
  tb_free(le);
  assert_tb_ok(tb_wait_list(c, sizeof(*we), &we, &n));
  assert_int_equal(n, 1);
  assert_int_equal(we[0].session_id, tb_client_session_id(w.c));
  assert_int_equal(we[0].what, TB_WAIT_ACQUIRE_LATEST);
  assert_string_equal(tb_wait_what_name(we[0].what), "acquire-latest");
  assert_string_equal(tb_wait_what_name(TB_WAIT_ACQUIRE_NEXT), "acquire-next");
  assert_string_equal(tb_wait_what_name(TB_WAIT_ACQUIRE_EXACT),
                      "acquire-exact");
  assert_string_equal(tb_wait_what_name(TB_WAIT_FREE), "wait-free");
  assert_null(tb_wait_what_name(-1));
  assert_null(tb_wait_what_name(99));
  assert_string_equal(we[0].channel, "api/later");
  tb_free(we);
  assert_tb_ok(tb_buffer_list(c, sizeof(*be), &be, &n));
  assert_int_equal(n, 1);
  assert_int_equal(be[0].buffer_id, tb_buffer_id(b));
  assert_int_equal(be[0].memory_kind, TB_MEMORY_HOST);
  assert_int_equal(be[0].size, 4096);
  assert_int_equal(be[0].device_type, kDLCPU);
  assert_int_equal(be[0].session_id, tb_client_session_id(p));
  assert_string_equal(be[0].session_name, "api-producer");
  assert_int_equal(be[0].pid, getpid());
  assert_int_equal(be[0].uid, getuid());
  assert_int_equal(be[0].versions, 1);
  assert_int_equal(be[0].leases, 1);
  assert_false(be[0].retired);
  assert_true(be[0].survives_producer);
  tb_free(be);
  assert_tb_ok(tb_channel_list(c, sizeof(*ci), &ci, &n));
  assert_int_equal(n, 2);
  assert_string_equal(ci[0].name, "api/later");
  assert_true(ci[0].waiting);
  assert_int_equal(ci[0].waiters, 1);
  assert_string_equal(ci[1].name, "api/x");
  assert_int_equal(ci[1].latest_version, v1);
  assert_int_equal(ci[1].publisher_session, tb_client_session_id(p));
  assert_int_equal(ci[1].leases, 1);
  assert_int_equal(ci[1].subscribers, 1);
  assert_false(ci[1].waiting);
  tb_free(ci);
  assert_tb_ok(tb_session_list(c, sizeof(*si), &si, &n));
  assert_int_equal(n, 3);
  found = 0;
  for (size_t i = 0; i < n; i++) {
    if (si[i].session_id != tb_client_session_id(c))
      continue;
    found = 1;
    assert_string_equal(si[i].name, "api-consumer");
    assert_int_equal(si[i].pid, getpid());
    assert_int_equal(si[i].leases, 1);
    assert_int_equal(si[i].subscriptions, 1);
  }
  assert_true(found);
  tb_free(si);
  assert_tb_ok(tb_daemon_get_status(c, sizeof(st), &st));
  assert_int_equal(st.pid, d->pid);
  assert_int_equal(st.sessions, 3);
  assert_int_equal(st.leases, 1);
  assert_int_equal(st.channels, 1);
  assert_string_equal(st.socket_path, d->sock);
  assert_tb_ok(tb_daemon_get_metrics(c, &text, &len));
  assert_int_equal(strlen(text), len);
  assert_non_null(strstr(text, "\ntensorbroker_leases 1\n"));
  assert_non_null(strstr(text, "\ntensorbroker_sessions 3\n"));
  tb_free(text);

  /* the waiter gets the first version published on its name */
  tbt_fill(copy_src, sizeof(copy_src), 3);
  u8_tensor(&t, copy_src, shape, sizeof(copy_src));
  assert_tb_ok(tb_channel_publish_copy(p, "api/later", &t, NULL, &v3));
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_tb_ok(w.rc);
  check_pattern(w.m, sizeof(copy_src), 3);
  assert_tb_ok(tb_lease_release(w.m, NULL));
  tb_client_disconnect(w.c);

  /* release, publish the next version: the first one is free */
  assert_tb_ok(tb_lease_release(m, NULL));
  assert_tb_ok(tb_channel_unsubscribe(c, "api/x"));
  tbt_fill((uint8_t *)tb_buffer_data(b) + 2048, 256, 2);
  u8_tensor(&t, (uint8_t *)tb_buffer_data(b) + 2048, shape, 256);
  assert_tb_ok(tb_channel_publish(p, "api/x", &t, NULL, &v2));
  assert_int_equal(v2, v1 + 1);
  assert_tb_ok(tb_channel_wait_free(p, "api/x", v1, TBT_TIMEOUT_MS, NULL));
  /* unsubscribed: no notice of v2 */
  assert_tb_err(tb_notice_poll(c, sizeof(nt), &nt, 0), TB_EAGAIN);
  assert_tb_ok(tb_lease_acquire(c, "api/x", &ao, &m));
  check_pattern(m, 256, 2);
  assert_tb_ok(tb_lease_release(m, NULL));

  /* the producer goes; its closed channels can be dropped */
  {
    uint64_t pid_session = tb_client_session_id(p);
    assert_tb_ok(tb_buffer_destroy(b));
    tb_client_disconnect(p);
    assert_tb_ok(tbt_wait_session_gone(c, pid_session));
  }
  assert_tb_ok(tb_channel_drop(c, "api/x"));
  assert_tb_ok(tb_channel_drop(c, "api/later"));
  assert_tb_err(tb_channel_drop(c, "api/x"), TB_ENOTFOUND);
  assert_tb_ok(tb_channel_list(c, sizeof(*ci), &ci, &n));
  assert_int_equal(n, 0);
  assert_non_null(ci);
  tb_free(ci);
  tb_client_disconnect(c);
}

/* ---- struct_size ---- */

/* What the struct_size test reads back. */
static struct {
  tb_client *p, *c;
  pid_t daemon_pid;
  uint64_t v1, v2, lease_id, next_notice, buffer_id;
  const char *sock;
} g;

/* The sizes a function must refuse for a struct of first version first
 * and alignment align, whose size is now size: below the first version,
 * not aligned, above TB_STRUCT_SIZE_MAX. */
static size_t refused_sizes(size_t first, size_t size, size_t align,
                            size_t out[4]) {
  out[0] = 0;
  out[1] = first - align;
  out[2] = size + 1;
  out[3] = TB_STRUCT_SIZE_MAX + align;
  return 4;
}

/* The sizes it must accept: the first version, today's, a later one. */
static size_t accepted_sizes(size_t first, size_t size, size_t align,
                             size_t out[3]) {
  size_t k = 0;
  if (first != size)
    out[k++] = first;
  out[k++] = size;
  out[k++] = size + 5 * align;
  return k;
}

typedef int (*fill_fn)(void *ctx, size_t struct_size, void *out);
/* Check the fields of a struct the library filled. */
typedef void (*fill_check)(const void *s);

/* A function that fills one struct: refused sizes write nothing (and, for
 * tb_notice_poll, take no notice), accepted ones write exactly struct_size
 * bytes: the fields, then zeros, and not one guard byte. */
static void check_fill(void *ctx, fill_fn f, size_t size, size_t align,
                       fill_check ck) {
  size_t sizes[4], k;

  k = refused_sizes(size, size, align, sizes);
  for (size_t i = 0; i < k; i++) {
    unsigned char *buf = guarded(sizes[i]);
    assert_tb_err(f(ctx, sizes[i], buf), TB_EINVAL);
    assert_all(buf, 0, sizes[i] + GUARD_LEN, GUARD);
    free(buf);
  }
  assert_tb_err(f(ctx, size, NULL), TB_EINVAL);
  k = accepted_sizes(size, size, align, sizes);
  for (size_t i = 0; i < k; i++) {
    unsigned char *exact = malloc(sizes[i]), *buf = guarded(sizes[i]);
    assert_non_null(exact);
    /* a block of exactly struct_size bytes: ASan sees any byte past it */
    assert_tb_ok(f(ctx, sizes[i], exact));
    ck(exact);
    free(exact);
    assert_tb_ok(f(ctx, sizes[i], buf));
    ck(buf);
    assert_all(buf, size, sizes[i], 0);
    assert_all(buf, sizes[i], sizes[i] + GUARD_LEN, GUARD);
    free(buf);
  }
}

static int fill_status(void *ctx, size_t sz, void *out) {
  return tb_daemon_get_status(ctx, sz, out);
}
static void check_status(const void *s) {
  const struct tb_status *st = s;
  assert_string_equal(st->daemon_version, TB_VERSION_STRING);
  assert_int_equal(st->pid, g.daemon_pid);
  assert_int_equal(st->sessions, 3);
  assert_int_equal(st->channels, 2);
  assert_int_equal(st->leases, 1);
  assert_true(st->requests > 0);
  assert_string_equal(st->socket_path, g.sock);
}

static int fill_lease_info(void *ctx, size_t sz, void *out) {
  return tb_lease_get_info(ctx, sz, out);
}
static void check_lease_info(const void *s) {
  const struct tb_lease_info *li = s;
  assert_int_equal(li->version, g.v2);
  assert_int_equal(li->lease_id, g.lease_id);
  assert_int_equal(li->metadata_len, 2);
  assert_memory_equal(li->metadata, "v2", 2);
  assert_string_equal(li->channel, "api/s");
  assert_int_equal(li->memory_kind, TB_MEMORY_HOST);
  assert_int_equal(li->producer_pid, getpid());
}

/* Every accepted call takes the next notice: v1's, then v2's, then the
 * two again (published again as v3 and v4 below). */
static int fill_notice(void *ctx, size_t sz, void *out) {
  return tb_notice_poll(ctx, sz, out, TBT_TIMEOUT_MS);
}
static void check_notice(const void *s) {
  const struct tb_notice *nt = s;
  assert_int_equal(nt->type, TB_NOTICE_NEW_VERSION);
  assert_string_equal(nt->channel, "api/s");
  assert_int_equal(nt->version, g.next_notice);
  g.next_notice++;
}

typedef int (*list_fn)(tb_client *c, size_t struct_size, void **out,
                       size_t *count);
/* Check entry i of a list, of which the library knew `known` bytes. */
typedef void (*entry_check)(const unsigned char *e, size_t i, size_t known);

/* A list: refused sizes write neither *out nor *count; accepted ones give
 * the entries struct_size apart, each with its fields (as far as they fit)
 * and zeros after them. */
static void check_list(list_fn f, size_t first, size_t size, size_t align,
                       size_t want, entry_check ck) {
  size_t sizes[4], k;

  k = refused_sizes(first, size, align, sizes);
  for (size_t i = 0; i < k; i++) {
    void *out = &sizes;
    size_t n = 77;
    assert_tb_err(f(g.c, sizes[i], &out, &n), TB_EINVAL);
    assert_ptr_equal(out, &sizes);
    assert_int_equal(n, 77);
  }
  k = accepted_sizes(first, size, align, sizes);
  for (size_t i = 0; i < k; i++) {
    unsigned char *a = NULL;
    size_t n = 0, known = sizes[i] < size ? sizes[i] : size;
    assert_tb_ok(f(g.c, sizes[i], (void **)&a, &n));
    assert_int_equal(n, want);
    for (size_t j = 0; j < n; j++) {
      ck(a + j * sizes[i], j, known);
      assert_all(a + j * sizes[i], known, sizes[i], 0);
    }
    tb_free(a);
  }
}

static int list_channels(tb_client *c, size_t sz, void **out, size_t *n) {
  return tb_channel_list(c, sz, (struct tb_channel_info **)out, n);
}
static void check_channel(const unsigned char *e, size_t i, size_t known) {
  static const char *const names[] = {"api/s", "api/s2", "api/w"};
  const struct tb_channel_info *ci = (const void *)e;
  assert_string_equal(ci->name, names[i]);
  assert_int_equal(ci->latest_version, i == 2 ? 0 : i == 0 ? 4 : 1);
  assert_int_equal(ci->publisher_session,
                   i == 2 ? 0 : tb_client_session_id(g.p));
  assert_int_equal(ci->leases, i == 0);
  assert_int_equal(ci->publishes, i == 2 ? 0 : i == 0 ? 4 : 1);
  if (known < sizeof(*ci))
    return; /* 0.1.0's struct: no waiters, no waiting */
  assert_int_equal(ci->waiters, i == 2);
  assert_int_equal(ci->waiting, i == 2);
}

static int list_sessions(tb_client *c, size_t sz, void **out, size_t *n) {
  return tb_session_list(c, sz, (struct tb_session_info **)out, n);
}
static void check_session(const unsigned char *e, size_t i, size_t known) {
  static const char *const names[] = {"size-producer", "size-consumer",
                                      "size-waiter"};
  const struct tb_session_info *si = (const void *)e;
  (void)known;
  assert_string_equal(si->name, names[i]);
  assert_int_equal(si->pid, getpid());
  assert_int_equal(si->uid, getuid());
  assert_int_equal(si->leases, i == 1);
  assert_int_equal(si->buffers, i == 0);
  assert_int_equal(si->subscriptions, i == 1);
}

static int list_leases(tb_client *c, size_t sz, void **out, size_t *n) {
  return tb_lease_list(c, sz, (struct tb_lease_entry **)out, n);
}
static void check_lease(const unsigned char *e, size_t i, size_t known) {
  const struct tb_lease_entry *le = (const void *)e;
  (void)i;
  (void)known;
  assert_int_equal(le->lease_id, g.lease_id);
  assert_int_equal(le->session_id, tb_client_session_id(g.c));
  assert_string_equal(le->session_name, "size-consumer");
  assert_string_equal(le->channel, "api/s");
  assert_int_equal(le->version, g.v2);
  assert_int_equal(le->memory_kind, TB_MEMORY_HOST);
  assert_false(le->died);
}

static int list_waits(tb_client *c, size_t sz, void **out, size_t *n) {
  return tb_wait_list(c, sz, (struct tb_wait_entry **)out, n);
}
static void check_wait(const unsigned char *e, size_t i, size_t known) {
  const struct tb_wait_entry *we = (const void *)e;
  (void)i;
  (void)known;
  assert_string_equal(we->session_name, "size-waiter");
  assert_int_equal(we->what, TB_WAIT_ACQUIRE_LATEST);
  assert_string_equal(we->channel, "api/w");
  assert_int_equal(we->version, 0);
}

static int list_buffers(tb_client *c, size_t sz, void **out, size_t *n) {
  return tb_buffer_list(c, sz, (struct tb_buffer_entry **)out, n);
}
static void check_buffer(const unsigned char *e, size_t i, size_t known) {
  const struct tb_buffer_entry *be = (const void *)e;
  (void)i;
  (void)known;
  assert_int_equal(be->buffer_id, g.buffer_id);
  assert_int_equal(be->memory_kind, TB_MEMORY_HOST);
  assert_int_equal(be->size, 4096);
  assert_int_equal(be->session_id, tb_client_session_id(g.p));
  assert_string_equal(be->session_name, "size-producer");
  assert_int_equal(be->pid, getpid());
  /* api/s: version 2 leased and version 4 in the history; api/s2's 1 */
  assert_int_equal(be->versions, 3);
  assert_int_equal(be->leases, 1);
  assert_true(be->survives_producer);
}

static void test_struct_size(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_publish_options po;
  struct tb_acquire_options ao;
  struct tb_lease_info li;
  struct waiter w = {.channel = "api/w"};
  DLManagedTensorVersioned *m;
  tb_buffer *b;
  DLTensor t;
  int64_t shape[1];
  uint64_t nreq, v;
  pthread_t th;

  g.daemon_pid = d->pid;
  g.sock = d->sock;
  assert_tb_ok(tbt_connect(d, "size-producer", &g.p));
  assert_tb_ok(tbt_connect(d, "size-consumer", &g.c));
  assert_tb_ok(tb_channel_subscribe(g.c, "api/s"));
  assert_tb_ok(tb_buffer_create_host(g.p, 4096, 0, &b));
  g.buffer_id = tb_buffer_id(b);
  u8_tensor(&t, tb_buffer_data(b), shape, 16);
  tb_publish_options_init(&po);
  po.metadata = "v1";
  po.metadata_len = 2;
  assert_tb_ok(tb_channel_publish(g.p, "api/s", &t, &po, &g.v1));
  po.metadata = "v2";
  assert_tb_ok(tb_channel_publish(g.p, "api/s", &t, &po, &g.v2));
  assert_tb_ok(tb_channel_publish(g.p, "api/s2", &t, NULL, NULL));
  tb_acquire_options_init(&ao);
  ao.timeout_ms = 0;
  assert_tb_ok(tb_lease_acquire(g.c, "api/s", &ao, &m));
  assert_tb_ok(tb_lease_info(m, &li)); /* the older name, 0.1.0's struct */
  g.lease_id = li.lease_id;
  assert_tb_ok(tbt_connect(d, "size-waiter", &w.c));
  assert_tb_ok(tbt_own_requests(w.c, &nreq));
  assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
  park_seen(g.c, w.c, nreq);

  check_fill(g.c, fill_status, sizeof(struct tb_status),
             alignof(struct tb_status), check_status);
  check_fill(m, fill_lease_info, sizeof(struct tb_lease_info),
             alignof(struct tb_lease_info), check_lease_info);
  /* two accepted sizes, two calls each: v1, v2, then v3, v4 */
  g.next_notice = g.v1;
  assert_tb_ok(tb_channel_publish(g.p, "api/s", &t, NULL, &v));
  assert_tb_ok(tb_channel_publish(g.p, "api/s", &t, NULL, &v));
  check_fill(g.c, fill_notice, sizeof(struct tb_notice),
             alignof(struct tb_notice), check_notice);
  assert_int_equal(g.next_notice, v + 1);
  assert_tb_err(tb_notice_poll(g.c, sizeof(struct tb_notice),
                               &(struct tb_notice){0}, 0),
                TB_EAGAIN);

  check_list(list_channels, offsetof(struct tb_channel_info, waiters),
             sizeof(struct tb_channel_info), alignof(struct tb_channel_info),
             3, check_channel);
  check_list(list_sessions, sizeof(struct tb_session_info),
             sizeof(struct tb_session_info), alignof(struct tb_session_info),
             3, check_session);
  check_list(list_leases, sizeof(struct tb_lease_entry),
             sizeof(struct tb_lease_entry), alignof(struct tb_lease_entry), 1,
             check_lease);
  check_list(list_waits, sizeof(struct tb_wait_entry),
             sizeof(struct tb_wait_entry), alignof(struct tb_wait_entry), 1,
             check_wait);
  check_list(list_buffers, sizeof(struct tb_buffer_entry),
             sizeof(struct tb_buffer_entry), alignof(struct tb_buffer_entry),
             1, check_buffer);
  /* the older list names take a size too: one so large that the array's
   * size would overflow is refused, not multiplied (it wrapped before) */
  {
    size_t huge = SIZE_MAX / 2 + 1, n = 7;
    void *out = NULL;

    assert_tb_err(tb_list_leases(g.c, huge, (struct tb_lease_entry **)&out,
                                 &n), TB_EINVAL);
    assert_tb_err(tb_list_waits(g.c, huge, (struct tb_wait_entry **)&out,
                                &n), TB_EINVAL);
    assert_tb_err(tb_list_channels_sized(g.c, huge,
                                         (struct tb_channel_info **)&out, &n),
                  TB_EINVAL);
    assert_tb_err(tb_buffer_list(g.c, huge, (struct tb_buffer_entry **)&out,
                                 &n), TB_EINVAL);
    assert_null(out);
    assert_int_equal(n, 7);
  }

  assert_tb_ok(tb_channel_publish(g.p, "api/w", &t, NULL, NULL));
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_tb_ok(w.rc);
  assert_tb_ok(tb_lease_release(w.m, NULL));
  tb_client_disconnect(w.c);
  assert_tb_ok(tb_lease_release(m, NULL));
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(g.c);
  tb_client_disconnect(g.p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_every_new_name, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(test_struct_size, tbt_setup,
                                      tbt_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
