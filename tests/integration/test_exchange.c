/* SPDX-License-Identifier: Apache-2.0 */
/* Exchange through the real daemon between real processes: bytes, layout
 * and metadata arrive intact; one producer feeds eight consumers; history
 * depth; acquire-next waits; timeouts. */
#include "tb_test.h"

#include <errno.h>
#include <sched.h>
#include <string.h>

#include "harness.h"
#include "tb_proto.h"

#define BUFSZ (64 * 1024)

/* What a consumer expects of one channel: the layout, where element 0 sits
 * in the producer's buffer, and the buffer's fill seed. */
struct expect {
  const char *channel;
  DLDataType dtype;
  int32_t ndim;
  int64_t shape[4];
  int64_t strides[4]; /* all zero: compact */
  uint64_t pos0;      /* buffer position of element 0 */
  uint64_t seed;
  char meta[32];
};

static int has_strides(const struct expect *e) {
  for (int i = 0; i < e->ndim; i++)
    if (e->strides[i] != 0)
      return 1;
  return 0;
}

static int64_t numel(const struct expect *e) {
  int64_t n = 1;
  for (int i = 0; i < e->ndim; i++)
    n *= e->shape[i];
  return n;
}

/* Check a received tensor against e: every field and every element's bytes,
 * walking the strides the consumer was given. Child-side: TBT_CHECK. */
static void check_tensor(const DLManagedTensorVersioned *t,
                         const struct expect *e, uint64_t version) {
  const DLTensor *d = &t->dl_tensor;
  struct tb_lease_info li;
  int64_t cstr[4] = {0, 0, 0, 0}, idx[4] = {0, 0, 0, 0};
  size_t eb = (size_t)(d->dtype.bits * d->dtype.lanes + 7) / 8;

  TBT_CHECK(t->version.major == TB_DLPACK_MAJOR_VERSION);
  TBT_CHECK(d->device.device_type == kDLCPU);
  TBT_CHECK(d->ndim == e->ndim);
  TBT_CHECK(d->dtype.code == e->dtype.code);
  TBT_CHECK(d->dtype.bits == e->dtype.bits);
  TBT_CHECK(d->dtype.lanes == e->dtype.lanes);
  TBT_CHECK(t->flags & TB_DLPACK_FLAG_BITMASK_READ_ONLY);
  for (int i = 0; i < e->ndim; i++)
    TBT_CHECK(d->shape[i] == e->shape[i]);
  /* strides: as sent, or NULL only when the tensor is compact */
  {
    int64_t s = 1;
    for (int i = e->ndim - 1; i >= 0; i--) {
      cstr[i] = has_strides(e) ? e->strides[i] : s;
      s *= e->shape[i];
    }
  }
  if (d->strides == NULL) {
    int64_t s = 1;
    for (int i = e->ndim - 1; i >= 0; i--) {
      TBT_CHECK(e->shape[i] == 1 || cstr[i] == s);
      s *= e->shape[i];
    }
  } else {
    for (int i = 0; i < e->ndim; i++)
      TBT_CHECK(e->shape[i] == 1 || d->strides[i] == cstr[i]);
  }
  for (int64_t k = 0; k < numel(e); k++) {
    int64_t off = 0;
    const uint8_t *p;
    for (int i = 0; i < e->ndim; i++)
      off += idx[i] * cstr[i];
    p = (const uint8_t *)d->data + d->byte_offset + off * (int64_t)eb;
    for (size_t j = 0; j < eb; j++) {
      uint8_t want = tbt_pattern(e->pos0 + (uint64_t)(off * (int64_t)eb) + j,
                                 e->seed);
      if (p[j] != want) {
        fprintf(stderr, "[child] %s: element %lld byte %zu = %u, expected %u\n",
                e->channel, (long long)k, j, p[j], want);
        _exit(3);
      }
    }
    for (int i = e->ndim - 1; i >= 0; i--) {
      if (++idx[i] < e->shape[i])
        break;
      idx[i] = 0;
    }
  }
  TBT_CHECK_OK(tb_lease_info(t, &li));
  TBT_CHECK(li.version == version);
  TBT_CHECK(strcmp(li.channel, e->channel) == 0);
  TBT_CHECK(li.memory_kind == 1);
  TBT_CHECK(li.producer_pid == (uint32_t)getppid());
  TBT_CHECK(li.metadata_len == strlen(e->meta));
  TBT_CHECK(memcmp(li.metadata, e->meta, li.metadata_len) == 0);
}

static struct tb_acquire_options acq_opts(int mode, uint64_t version,
                                          int timeout_ms) {
  struct tb_acquire_options o;
  tb_acquire_options_init(&o);
  o.mode = mode;
  o.version = version;
  o.timeout_ms = timeout_ms;
  return o;
}

/* Publish e from buffer b (element 0 at e->pos0). */
static void publish_expect(tb_client *c, tb_buffer *b, const struct expect *e,
                           uint64_t *version) {
  DLTensor t;
  struct tb_publish_options po;
  int64_t shape[4], strides[4];

  memset(&t, 0, sizeof(t));
  memcpy(shape, e->shape, sizeof(shape));
  memcpy(strides, e->strides, sizeof(strides));
  t.data = (uint8_t *)tb_buffer_data(b) + e->pos0;
  t.device.device_type = kDLCPU;
  t.ndim = e->ndim;
  t.dtype = e->dtype;
  t.shape = shape;
  t.strides = has_strides(e) ? strides : NULL;
  tb_publish_options_init(&po);
  po.metadata = e->meta;
  po.metadata_len = strlen(e->meta);
  assert_tb_ok(tb_publish(c, e->channel, &t, &po, version));
}

/* ---- bytes, shape, strides, dtype and metadata arrive intact ---- */

static const struct expect intact[] = {
    {"intact/f32", {kDLFloat, 32, 1}, 2, {3, 5}, {0}, 64, 1, "frame=42"},
    /* a transposed view: column-major 4x3 int16 */
    {"intact/strided", {kDLInt, 16, 1}, 2, {4, 3}, {1, 4}, 128, 2, "t"},
    /* every other element of every other row of an 8x8 float64 */
    {"intact/slice", {kDLFloat, 64, 1}, 2, {4, 4}, {16, 2}, 0, 3,
     "ts=1700000000.5"},
    {"intact/bool", {TB_DTYPE_BOOL, 8, 1}, 1, {7}, {0}, 1, 4, ""},
    {"intact/bf16", {TB_DTYPE_BFLOAT, 16, 1}, 3, {2, 2, 3}, {0}, 256, 5, "bf"},
    {"intact/f8", {TB_DTYPE_FLOAT8_E4M3FN, 8, 1}, 1, {33}, {0}, 1000, 6, "f8"},
    {"intact/f8e5m2", {TB_DTYPE_FLOAT8_E5M2, 8, 1}, 2, {2, 9}, {9, 1}, 7, 7, ""},
    {"intact/lanes", {kDLFloat, 32, 4}, 1, {5}, {0}, 16, 8, "x4"},
    {"intact/scalar", {kDLUInt, 64, 1}, 0, {0}, {0}, 8, 9, "0d"},
    {"intact/u8-4d", {kDLUInt, 8, 1}, 4, {2, 1, 3, 2}, {0}, 3, 10, "4d"},
};
#define NINTACT (sizeof(intact) / sizeof(intact[0]))

static int intact_consumer(struct tbt_chan *ch, void *arg) {
  const char *daemon_sock = arg;
  struct tbt_daemon d;
  tb_client *c;

  memset(&d, 0, sizeof(d));
  snprintf(d.sock, sizeof(d.sock), "%s", daemon_sock);
  TBT_CHECK_OK(tbt_connect(&d, "consumer", &c));
  TBT_CHECK_OK(tbt_send(ch->wr, "ready"));
  for (size_t i = 0; i < NINTACT; i++) {
    struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, TBT_TIMEOUT_MS);
    DLManagedTensorVersioned *t = NULL;
    TBT_CHECK_OK(tb_acquire(c, intact[i].channel, &o, &t));
    check_tensor(t, &intact[i], 1);
    TBT_CHECK_OK(tb_release(t, NULL));
  }
  tb_client_disconnect(c);
  return 0;
}

static void test_intact(void **state) {
  struct tbt_daemon *d = *state;
  struct tbt_child ch;
  tb_client *p;
  tb_buffer *bufs[NINTACT];
  char line[64];

  assert_tb_ok(tbt_child_start(&ch, intact_consumer, d->sock));
  assert_tb_ok(tbt_recv(ch.rd, line, sizeof(line), TBT_TIMEOUT_MS));
  assert_string_equal(line, "ready");
  assert_tb_ok(tbt_connect(d, "producer", &p));
  for (size_t i = 0; i < NINTACT; i++) {
    uint64_t v = 0;
    assert_tb_ok(tb_host_buffer_create(p, BUFSZ, 0, &bufs[i]));
    tbt_fill(tb_buffer_data(bufs[i]), BUFSZ, intact[i].seed);
    publish_expect(p, bufs[i], &intact[i], &v);
    assert_int_equal(v, 1);
  }
  assert_int_equal(tbt_child_wait(&ch, TBT_TIMEOUT_MS), 0);
  for (size_t i = 0; i < NINTACT; i++)
    assert_tb_ok(tb_buffer_destroy(bufs[i]));
  tb_client_disconnect(p);
}

/* Negative strides: a reversed view whose element 0 is the buffer's last
 * element; layout validation (proto/) accepts it since it stays inside. */
static void test_negative_strides(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *p, *c;
  tb_buffer *b;
  DLTensor t;
  int64_t shape[1] = {16}, strides[1] = {-1};
  DLManagedTensorVersioned *r = NULL;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  const int32_t *src;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "consumer", &c));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b));
  for (int i = 0; i < 16; i++)
    ((int32_t *)tb_buffer_data(b))[i] = i * 10;
  memset(&t, 0, sizeof(t));
  t.data = (int32_t *)tb_buffer_data(b) + 15;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype = (DLDataType){kDLInt, 32, 1};
  t.shape = shape;
  t.strides = strides;
  assert_tb_ok(tb_publish(p, "neg", &t, NULL, NULL));
  assert_tb_ok(tb_acquire(c, "neg", &o, &r));
  assert_non_null(r->dl_tensor.strides);
  assert_int_equal(r->dl_tensor.strides[0], -1);
  src = (const int32_t *)((const uint8_t *)r->dl_tensor.data +
                          r->dl_tensor.byte_offset);
  for (int i = 0; i < 16; i++)
    assert_int_equal(src[-i], (15 - i) * 10);
  assert_tb_ok(tb_release(r, NULL));
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

/* A tensor reaching past its buffer is refused before or by the daemon,
 * and a bad name or a foreign pointer too; nothing is published. */
static void test_publish_refused(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *p;
  tb_buffer *b;
  DLTensor t;
  int64_t shape[1] = {1025};
  int32_t local[4];
  struct tb_channel_info ci;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b));
  memset(&t, 0, sizeof(t));
  t.data = tb_buffer_data(b);
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype = (DLDataType){kDLFloat, 32, 1};
  t.shape = shape;
  assert_tb_err(tb_publish(p, "refused", &t, NULL, NULL), TB_ELAYOUT);
  shape[0] = 1024;
  assert_tb_err(tb_publish(p, "bad//name", &t, NULL, NULL), TB_ENAME);
  t.dtype = (DLDataType){TB_DTYPE_OPAQUE_HANDLE, 64, 1};
  assert_tb_err(tb_publish(p, "refused", &t, NULL, NULL), TB_EDTYPE);
  t.dtype = (DLDataType){kDLFloat, 32, 1};
  shape[0] = 4;
  t.data = local;
  assert_true(tb_publish(p, "refused", &t, NULL, NULL) < 0);
  assert_tb_err(tbt_find_channel(p, "refused", &ci), TB_ENOTFOUND);
  /* tb_publish_copy takes the same local memory */
  memset(local, 0x11, sizeof(local));
  assert_tb_ok(tb_publish_copy(p, "refused", &t, NULL, NULL));
  assert_tb_ok(tbt_find_channel(p, "refused", &ci));
  assert_int_equal(ci.latest_version, 1);
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(p);
}

/* ---- connect asks nothing more of a host-only process ---- */

/* tb_client_connect prepares a CUDA done event only when this thread has a
 * CUDA context current (tests/gpu/test_connect_early.c); a process without
 * one sends its Hello and nothing else, and its first host acquire is one
 * request. */
static void test_connect_hello_only(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *p, *c;
  tb_buffer *b;
  DLTensor t;
  DLManagedTensorVersioned *mt;
  int64_t shape[1];
  uint64_t n0, n1;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tb_host_buffer_create(p, 64, 0, &b));
  tbt_u8_tensor(&t, b, shape, 64);
  assert_tb_ok(tb_publish(p, "hello-only", &t, NULL, NULL));
  assert_tb_ok(tbt_connect(d, "consumer", &c));
  /* the daemon's count: the Hello and this ListSessions */
  assert_tb_ok(tbt_own_requests(c, &n0));
  assert_int_equal(n0, 2);
  assert_tb_ok(tb_acquire(c, "hello-only", NULL, &mt));
  assert_tb_ok(tbt_own_requests(c, &n1));
  assert_int_equal(n1 - n0, 2); /* the Acquire and this ListSessions */
  assert_tb_ok(tb_release(mt, NULL));
  tb_client_disconnect(c);
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(p);
}

/* ---- one producer, eight consumer processes ---- */

#define NCONS 8
#define NVERS 24
#define NRING 4
#define FANSZ (32 * 1024)

static int fan_consumer(struct tbt_chan *ch, void *arg) {
  struct tbt_daemon d;
  tb_client *c;
  uint64_t last = 0;
  int seen = 0;

  memset(&d, 0, sizeof(d));
  snprintf(d.sock, sizeof(d.sock), "%s", (const char *)arg);
  TBT_CHECK_OK(tbt_connect(&d, "fan-consumer", &c));
  TBT_CHECK_OK(tbt_send(ch->wr, "ready"));
  while (last < NVERS) {
    struct tb_acquire_options o = acq_opts(TB_ACQUIRE_NEXT, last, TBT_TIMEOUT_MS);
    DLManagedTensorVersioned *t = NULL;
    struct tb_lease_info li;
    const uint8_t *p;
    TBT_CHECK_OK(tb_acquire(c, "fan", &o, &t));
    TBT_CHECK_OK(tb_lease_info(t, &li));
    TBT_CHECK(li.version > last);
    TBT_CHECK(li.metadata_len == sizeof(uint64_t));
    TBT_CHECK(memcmp(li.metadata, &li.version, sizeof(uint64_t)) == 0);
    TBT_CHECK(t->dl_tensor.shape[0] == FANSZ);
    p = (const uint8_t *)t->dl_tensor.data + t->dl_tensor.byte_offset;
    for (size_t i = 0; i < FANSZ; i++)
      TBT_CHECK(p[i] == tbt_pattern(i, li.version));
    last = li.version;
    seen++;
    TBT_CHECK_OK(tb_release(t, NULL));
  }
  TBT_CHECK(last == NVERS);
  TBT_CHECK_OK(tbt_send(ch->wr, "seen %d", seen));
  tb_client_disconnect(c);
  return 0;
}

static void test_one_producer_eight_consumers(void **state) {
  struct tbt_daemon *d = *state;
  struct tbt_child ch[NCONS];
  tb_client *p;
  tb_buffer *ring[NRING];
  char line[64];
  int64_t shape[1] = {FANSZ};
  struct tb_session_info si;
  size_t nsess = 0;
  struct tb_session_info *all = NULL;

  for (int i = 0; i < NCONS; i++)
    assert_tb_ok(tbt_child_start(&ch[i], fan_consumer, d->sock));
  for (int i = 0; i < NCONS; i++) {
    assert_tb_ok(tbt_recv(ch[i].rd, line, sizeof(line), TBT_TIMEOUT_MS));
    assert_string_equal(line, "ready");
  }
  assert_tb_ok(tbt_connect(d, "fan-producer", &p));
  assert_tb_ok(tb_list_sessions(p, &all, &nsess));
  assert_int_equal(nsess, NCONS + 1);
  tb_free(all);
  for (int i = 0; i < NRING; i++)
    assert_tb_ok(tb_host_buffer_create(p, FANSZ, 0, &ring[i]));
  for (uint64_t v = 1; v <= NVERS; v++) {
    tb_buffer *b = ring[(v - 1) % NRING];
    struct tb_publish_options po;
    DLTensor t;
    uint64_t got = 0;
    /* the buffer last carried version v - NRING: rewrite it only once
     * nobody reads that version any more */
    if (v > NRING)
      assert_tb_ok(tb_wait_free(p, "fan", v - NRING, TBT_TIMEOUT_MS, NULL));
    tbt_fill(tb_buffer_data(b), FANSZ, v);
    memset(&t, 0, sizeof(t));
    t.data = tb_buffer_data(b);
    t.device.device_type = kDLCPU;
    t.ndim = 1;
    t.dtype = (DLDataType){kDLUInt, 8, 1};
    t.shape = shape;
    tb_publish_options_init(&po);
    po.metadata = &v;
    po.metadata_len = sizeof(v);
    assert_tb_ok(tb_publish(p, "fan", &t, &po, &got));
    assert_int_equal(got, v);
  }
  for (int i = 0; i < NCONS; i++) {
    int seen = 0;
    assert_tb_ok(tbt_recv(ch[i].rd, line, sizeof(line), TBT_TIMEOUT_MS));
    assert_int_equal(sscanf(line, "seen %d", &seen), 1);
    assert_true(seen >= 1 && seen <= NVERS);
    assert_int_equal(tbt_child_wait(&ch[i], TBT_TIMEOUT_MS), 0);
  }
  /* everyone is gone: the daemon holds no lease and one session */
  assert_tb_ok(tbt_find_session_id(p, tb_client_session_id(p), &si));
  assert_int_equal(si.buffers, NRING);
  {
    struct tb_channel_info ci;
    assert_tb_ok(tbt_find_channel(p, "fan", &ci));
    assert_int_equal(ci.latest_version, NVERS);
    assert_int_equal(ci.publishes, NVERS);
    assert_int_equal(ci.publisher_session, tb_client_session_id(p));
  }
  for (int i = 0; i < NRING; i++)
    assert_tb_ok(tb_buffer_destroy(ring[i]));
  tb_client_disconnect(p);
}

/* ---- history depth ---- */

static void test_history_depth(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *p, *c;
  tb_buffer *b;
  int64_t shape[1] = {256};
  struct tb_channel_info ci;
  DLManagedTensorVersioned *t = NULL;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "consumer", &c));
  assert_tb_ok(tb_host_buffer_create(p, 5 * 256, 0, &b));
  tbt_fill(tb_buffer_data(b), 5 * 256, 77);
  for (uint64_t v = 1; v <= 5; v++) {
    struct tb_publish_options po;
    DLTensor tt;
    uint64_t got = 0;
    memset(&tt, 0, sizeof(tt));
    tt.data = (uint8_t *)tb_buffer_data(b) + (v - 1) * 256;
    tt.device.device_type = kDLCPU;
    tt.ndim = 1;
    tt.dtype = (DLDataType){kDLUInt, 8, 1};
    tt.shape = shape;
    tb_publish_options_init(&po);
    po.history_depth = 3;
    po.metadata = &v;
    po.metadata_len = sizeof(v);
    assert_tb_ok(tb_publish(p, "hist", &tt, &po, &got));
    assert_int_equal(got, v);
  }
  assert_tb_ok(tbt_find_channel(c, "hist", &ci));
  assert_int_equal(ci.history_depth, 3);
  assert_int_equal(ci.versions_held, 3);
  assert_int_equal(ci.latest_version, 5);

  for (uint64_t v = 3; v <= 5; v++) {
    struct tb_acquire_options o = acq_opts(TB_ACQUIRE_EXACT, v, 0);
    struct tb_lease_info li;
    const uint8_t *px;
    assert_tb_ok(tb_acquire(c, "hist", &o, &t));
    assert_tb_ok(tb_lease_info(t, &li));
    assert_int_equal(li.version, v);
    assert_memory_equal(li.metadata, &v, sizeof(v));
    px = (const uint8_t *)t->dl_tensor.data + t->dl_tensor.byte_offset;
    for (int i = 0; i < 256; i++)
      assert_int_equal(px[i], tbt_pattern((v - 1) * 256 + (uint64_t)i, 77));
    assert_tb_ok(tb_release(t, NULL));
  }
  for (uint64_t v = 1; v <= 2; v++) {
    struct tb_acquire_options o = acq_opts(TB_ACQUIRE_EXACT, v, TBT_TIMEOUT_MS);
    t = NULL;
    assert_tb_err(tb_acquire(c, "hist", &o, &t), TB_ENOTFOUND);
    assert_null(t);
  }
  {
    /* EXACT never waits, even for a version not yet published */
    struct tb_acquire_options o = acq_opts(TB_ACQUIRE_EXACT, 6, TBT_TIMEOUT_MS);
    assert_tb_err(tb_acquire(c, "hist", &o, &t), TB_ENOTFOUND);
  }
  {
    /* NEXT after a dropped version: the oldest held newer one */
    struct tb_acquire_options o = acq_opts(TB_ACQUIRE_NEXT, 1, 0);
    struct tb_lease_info li;
    assert_tb_ok(tb_acquire(c, "hist", &o, &t));
    assert_tb_ok(tb_lease_info(t, &li));
    assert_int_equal(li.version, 3);
    assert_tb_ok(tb_release(t, NULL));
    o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
    assert_tb_ok(tb_acquire(c, "hist", &o, &t));
    assert_tb_ok(tb_lease_info(t, &li));
    assert_int_equal(li.version, 5);
    t->deleter(t);
  }
  /* dropped versions are free, held ones are not */
  assert_tb_ok(tb_wait_free(p, "hist", 1, 0, NULL));
  assert_tb_ok(tb_wait_free(p, "hist", 2, 0, NULL));
  assert_tb_err(tb_wait_free(p, "hist", 3, 0, NULL), TB_EBUSY);
  assert_tb_err(tb_wait_free(p, "hist", 9, 0, NULL), TB_ENOTFOUND);
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

/* ---- acquire NEXT waits for the next publish; timeouts ---- */

static int next_waiter(struct tbt_chan *ch, void *arg) {
  struct tbt_daemon d;
  tb_client *c;
  DLManagedTensorVersioned *t = NULL;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  struct tb_lease_info li;
  uint64_t n = 0;

  memset(&d, 0, sizeof(d));
  snprintf(d.sock, sizeof(d.sock), "%s", (const char *)arg);
  TBT_CHECK_OK(tbt_connect(&d, "waiter", &c));
  TBT_CHECK_OK(tb_acquire(c, "next", &o, &t));
  TBT_CHECK_OK(tb_lease_info(t, &li));
  TBT_CHECK(li.version == 1);
  TBT_CHECK_OK(tb_release(t, NULL));
  /* the acquire below will be request n + 1 of this session */
  TBT_CHECK_OK(tbt_own_requests(c, &n));
  /* NEXT after 1 returns 2 whenever 2 is published, so the parent may
   * publish as soon as it reads this line: no race */
  TBT_CHECK_OK(tbt_send(ch->wr, "waiting %llu %llu",
                        (unsigned long long)tb_client_session_id(c),
                        (unsigned long long)n));
  o = acq_opts(TB_ACQUIRE_NEXT, 1, TBT_TIMEOUT_MS);
  TBT_CHECK_OK(tb_acquire(c, "next", &o, &t));
  TBT_CHECK_OK(tb_lease_info(t, &li));
  TBT_CHECK(li.version == 2);
  TBT_CHECK(((const uint8_t *)t->dl_tensor.data + t->dl_tensor.byte_offset)[5] ==
            tbt_pattern(5, 2));
  TBT_CHECK_OK(tb_release(t, NULL));
  tb_client_disconnect(c);
  return 0;
}

static void publish_small(tb_client *p, tb_buffer *b, const char *ch,
                          uint64_t seed, uint64_t *v) {
  int64_t shape[1] = {64};
  DLTensor t;

  tbt_fill(tb_buffer_data(b), 64, seed);
  memset(&t, 0, sizeof(t));
  t.data = tb_buffer_data(b);
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype = (DLDataType){kDLUInt, 8, 1};
  t.shape = shape;
  assert_tb_ok(tb_publish(p, ch, &t, NULL, v));
}

static void test_next_waits(void **state) {
  struct tbt_daemon *d = *state;
  struct tbt_child ch;
  tb_client *p;
  tb_buffer *b1, *b2;
  char line[64];
  unsigned long long sid = 0, nreq = 0;
  uint64_t v = 0;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b1));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b2));
  publish_small(p, b1, "next", 1, &v);
  assert_int_equal(v, 1);
  assert_tb_ok(tbt_child_start(&ch, next_waiter, d->sock));
  assert_tb_ok(tbt_recv(ch.rd, line, sizeof(line), TBT_TIMEOUT_MS));
  assert_int_equal(sscanf(line, "waiting %llu %llu", &sid, &nreq), 2);
  publish_small(p, b2, "next", 2, &v);
  assert_int_equal(v, 2);
  assert_int_equal(tbt_child_wait(&ch, TBT_TIMEOUT_MS), 0);
  assert_tb_ok(tb_buffer_destroy(b1));
  assert_tb_ok(tb_buffer_destroy(b2));
  tb_client_disconnect(p);
}

/* The waiter is already parked in the daemon when the publish comes. */
static void test_next_parked(void **state) {
  struct tbt_daemon *d = *state;
  struct tbt_child ch;
  tb_client *p;
  tb_buffer *b1, *b2;
  char line[64];
  unsigned long long sid = 0, nreq = 0;
  uint64_t v = 0;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b1));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b2));
  publish_small(p, b1, "next", 1, &v);
  assert_tb_ok(tbt_child_start(&ch, next_waiter, d->sock));
  assert_tb_ok(tbt_recv(ch.rd, line, sizeof(line), TBT_TIMEOUT_MS));
  assert_int_equal(sscanf(line, "waiting %llu %llu", &sid, &nreq), 2);
  /* the parked acquire is the child's next request */
  assert_tb_ok(tbt_wait_requests(p, sid, nreq + 1));
  publish_small(p, b2, "next", 2, &v);
  assert_int_equal(tbt_child_wait(&ch, TBT_TIMEOUT_MS), 0);
  assert_tb_ok(tb_buffer_destroy(b1));
  assert_tb_ok(tb_buffer_destroy(b2));
  tb_client_disconnect(p);
}

/* channel's latest version is 1: NEXT after it is TB_EAGAIN at once with
 * timeout 0, and TB_ETIMEDOUT after (not before) 80 ms; *t untouched. */
static void check_next_after_1_times_out(tb_client *c, const char *channel) {
  DLManagedTensorVersioned *t = (DLManagedTensorVersioned *)0x1;
  struct tb_acquire_options o = acq_opts(TB_ACQUIRE_NEXT, 1, 0);
  uint64_t t0, el;

  assert_tb_err(tb_acquire(c, channel, &o, &t), TB_EAGAIN);
  o = acq_opts(TB_ACQUIRE_NEXT, 1, 80);
  t0 = tbt_now_ms();
  assert_tb_err(tb_acquire(c, channel, &o, &t), TB_ETIMEDOUT);
  el = tbt_now_ms() - t0;
  assert_true(el >= 70 && el < TBT_TIMEOUT_MS);
  assert_ptr_equal(t, (DLManagedTensorVersioned *)0x1);
}

static void test_timeouts(void **state) {
  struct tbt_daemon *d = *state;
  tb_client *p, *c;
  tb_buffer *b;
  DLManagedTensorVersioned *t = (DLManagedTensorVersioned *)0x1;
  struct tb_acquire_options o;
  struct tb_status st;
  uint64_t v = 0, t0, el;
  int rc;

  assert_tb_ok(tbt_connect(d, "producer", &p));
  assert_tb_ok(tbt_connect(d, "consumer", &c));

  /* no such channel, timeout 0: does not wait */
  o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  rc = tb_acquire(c, "nothing/here", &o, &t);
  if (rc != TB_EAGAIN && rc != TB_ENOTFOUND)
    fail_msg("acquire with timeout 0 on a missing channel: %s", tb_err_name(rc));
  assert_ptr_equal(t, (DLManagedTensorVersioned *)0x1);

  /* a short wait on a missing channel times out */
  o = acq_opts(TB_ACQUIRE_LATEST, 0, 50);
  t0 = tbt_now_ms();
  assert_tb_err(tb_acquire(c, "nothing/here", &o, &t), TB_ETIMEDOUT);
  el = tbt_now_ms() - t0;
  assert_true(el >= 40 && el < TBT_TIMEOUT_MS);

  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b));
  publish_small(p, b, "t", 1, &v);
  /* NEXT after the latest: nothing now */
  check_next_after_1_times_out(c, "t");
  /* the client is still in step with the daemon after its timeouts */
  assert_tb_ok(tb_daemon_status(c, &st));
  assert_int_equal(st.leases, 0);
  o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  assert_tb_ok(tb_acquire(c, "t", &o, &t));
  assert_tb_ok(tb_release(t, NULL));
  /* a later publish is not handed to the timed-out waits */
  publish_small(p, b, "t", 2, &v);
  assert_tb_ok(tb_daemon_status(c, &st));
  assert_int_equal(st.leases, 0);
  assert_tb_ok(tb_buffer_destroy(b));
  tb_client_disconnect(c);
  tb_client_disconnect(p);
}

/* ---- busy polling: tensorbrokerd --busy-poll, tb_connect_options.spin_us ---- */

/* utime + stime of pid, in milliseconds; -1 when unreadable. */
static long proc_cpu_ms(pid_t pid) {
  char path[64], buf[1024], *p;
  unsigned long ut = 0, st = 0;
  FILE *f;
  size_t n;

  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  f = fopen(path, "re");
  if (f == NULL)
    return -1;
  n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  p = strrchr(buf, ')'); /* the name may hold spaces */
  if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u "
                                 "%*u %lu %lu", &ut, &st) != 2)
    return -1;
  return (long)((ut + st) * 1000 / (unsigned long)sysconf(_SC_CLK_TCK));
}

static int connect_spin(const struct tbt_daemon *d, int spin_us,
                        tb_client **out) {
  struct tb_connect_options co;
  tb_connect_options_init(&co);
  co.socket_path = d->sock;
  co.client_name = "spinner";
  co.spin_us = spin_us;
  return tb_client_connect(&co, out);
}

/* The daemon's tensorbroker_busy_poll_seconds_total: the wall time of its
 * busy-polling periods that have ended (this request starts another). */
static double busy_poll_seconds(tb_client *c) {
  static const char name[] = "\ntensorbroker_busy_poll_seconds_total ";
  char *text = NULL, *at;
  double secs = -1;

  assert_tb_ok(tb_daemon_get_metrics(c, &text, NULL));
  at = strstr(text, name);
  if (at == NULL || sscanf(at + strlen(name), "%lf", &secs) != 1)
    fail_msg("no tensorbroker_busy_poll_seconds_total in the metrics");
  tb_free(text);
  return secs;
}

static void test_busy_poll(void **state) {
  const char *extra[] = {"--busy-poll", "300000", NULL};
  struct tbt_daemon d;
  struct tbt_child ch;
  tb_client *p, *c;
  tb_buffer *b1, *b2;
  DLManagedTensorVersioned *t;
  struct tb_acquire_options o;
  char line[64];
  unsigned long long sid = 0, nreq = 0;
  uint64_t v = 0, t0;
  long cpu0, cpu1, cpu2;
  double polled0, polled1;
  (void)state;

  /* bad values are refused, from the options and from the environment */
  assert_tb_ok(tbt_daemon_start(&d, extra));
  assert_tb_err(connect_spin(&d, -2, &c), TB_EINVAL);
  assert_tb_err(connect_spin(&d, 1000001, &c), TB_EINVAL);
  setenv("TENSORBROKER_SPIN_US", "lots", 1);
  assert_tb_err(connect_spin(&d, 0, &c), TB_EINVAL);
  setenv("TENSORBROKER_SPIN_US", "500", 1);
  assert_tb_ok(connect_spin(&d, 0, &c)); /* 500 from the environment */
  unsetenv("TENSORBROKER_SPIN_US");

  assert_tb_ok(tbt_connect(&d, "producer", &p));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b1));
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b2));
  publish_small(p, b1, "next", 1, &v);
  /* replies that come while the client polls */
  o = acq_opts(TB_ACQUIRE_LATEST, 0, 0);
  for (int i = 0; i < 100; i++) {
    assert_tb_ok(tb_acquire(c, "next", &o, &t));
    assert_int_equal(((const uint8_t *)t->dl_tensor.data +
                      t->dl_tensor.byte_offset)[5], tbt_pattern(5, 1));
    assert_tb_ok(tb_release(t, NULL));
  }
  /* polling does not stretch or cut a timeout */
  check_next_after_1_times_out(c, "next");
  tb_client_disconnect(c);

  /* a parked NEXT of a polling client (it polls 500 us, then sleeps) is
   * woken by the publish */
  setenv("TENSORBROKER_SPIN_US", "500", 1);
  assert_tb_ok(tbt_child_start(&ch, next_waiter, d.sock));
  unsetenv("TENSORBROKER_SPIN_US");
  assert_tb_ok(tbt_recv(ch.rd, line, sizeof(line), TBT_TIMEOUT_MS));
  assert_int_equal(sscanf(line, "waiting %llu %llu", &sid, &nreq), 2);
  assert_tb_ok(tbt_wait_requests(p, sid, nreq + 1));
  publish_small(p, b2, "next", 2, &v);
  assert_int_equal(tbt_child_wait(&ch, TBT_TIMEOUT_MS), 0);

  /* The daemon polls for 300 ms after the last activity, then sleeps: by
   * its own clock the period that the metrics request starts lasts 300 ms
   * or more of wall time (what CPU that takes depends on the machine's
   * load), and over the next 1.2 s of silence it spends next to no CPU.
   * (Not a synchronisation: the test measures what an idle daemon costs.) */
  polled0 = busy_poll_seconds(p);
  cpu0 = proc_cpu_ms(d.pid);
  t0 = tbt_now_ms();
  while (tbt_now_ms() - t0 < 300)
    usleep(10000);
  cpu1 = proc_cpu_ms(d.pid);
  while (tbt_now_ms() - t0 < 1500)
    usleep(10000);
  cpu2 = proc_cpu_ms(d.pid);
  assert_true(cpu0 >= 0 && cpu1 >= 0 && cpu2 >= 0);
  polled1 = busy_poll_seconds(p);
  print_message("daemon CPU while polling: %ld ms in the first 300 ms, %ld ms "
                "in the next 1200 ms; it polled %.3f s\n", cpu1 - cpu0,
                cpu2 - cpu1, polled1 - polled0);
  assert_true(polled1 - polled0 >= 0.3); /* it polled 300 ms */
  assert_true(cpu2 - cpu1 <= 200); /* and stopped (polling on: ~1200) */

  assert_tb_ok(tb_buffer_destroy(b1));
  assert_tb_ok(tb_buffer_destroy(b2));
  tb_client_disconnect(p);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

/* ---- polling by default: 50 us while the process may use 4+ CPUs ---- */

/* the library's count of c's waits that polled first (client/rpc.c) */
uint64_t tb__client_polled_waits(const tb_client *c);

#define QUIET_WAITS 100 /* waits for a notice that never comes, 2 ms each */

static int cpus_allowed(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0)
    return -1;
  return CPU_COUNT(&set);
}

/* Connect with spin_us (0: the default), wait QUIET_WAITS times 2 ms for a
 * notice that does not come, and return how many of those waits polled
 * before sleeping (the library counts them), or -1. */
static long polled_waits(const char *sock, int spin_us) {
  struct tbt_daemon d;
  struct tb_notice n;
  tb_client *c;
  uint64_t p0;
  long polled = -1;

  memset(&d, 0, sizeof(d));
  snprintf(d.sock, sizeof(d.sock), "%s", sock);
  if (connect_spin(&d, spin_us, &c) < 0)
    return -1;
  p0 = tb__client_polled_waits(c);
  for (int i = 0; i < QUIET_WAITS; i++)
    if (tb_client_poll_notice(c, &n, 2) != TB_EAGAIN)
      goto out;
  polled = (long)(tb__client_polled_waits(c) - p0);
out:
  tb_client_disconnect(c);
  return polled;
}

/* Child: pinned to one CPU, a default client must not poll. */
static int pinned_waiter(struct tbt_chan *ch, void *arg) {
  cpu_set_t one;
  int cpu = sched_getcpu();
  long n;

  CPU_ZERO(&one);
  CPU_SET(cpu >= 0 ? cpu : 0, &one);
  TBT_CHECK(sched_setaffinity(0, sizeof(one), &one) == 0);
  n = polled_waits(arg, 0);
  TBT_CHECK(n >= 0);
  TBT_CHECK_OK(tbt_send(ch->wr, "polled %ld", n));
  return 0;
}

/* voluntary_ctxt_switches of pid's main thread (/proc/PID/status): how
 * often the daemon went to sleep. -1 when unreadable. */
static long proc_sleeps(pid_t pid) {
  char path[64], line[128];
  long n = -1;
  FILE *f;

  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  f = fopen(path, "re");
  if (f == NULL)
    return -1;
  while (fgets(line, sizeof(line), f) != NULL)
    if (sscanf(line, "voluntary_ctxt_switches: %ld", &n) == 1)
      break;
  fclose(f);
  return n;
}

/* How often a daemon started with extra goes to sleep over QUIET_WAITS
 * status requests sent 10 us after the previous reply (the client polls
 * for replies and waits those 10 us on the clock: a daemon that polls for
 * longer than that after a request never sleeps in between, one that does
 * not poll sleeps before each). -1 on failure. */
static long daemon_sleeps(const char *const *extra) {
  struct tbt_daemon d;
  struct tb_status st;
  tb_client *c;
  long s0, s1;

  assert_tb_ok(tbt_daemon_start(&d, extra));
  assert_tb_ok(connect_spin(&d, 1000, &c));
  assert_tb_ok(tb_daemon_status(c, &st));
  s0 = proc_sleeps(d.pid);
  for (int i = 0; i < QUIET_WAITS; i++) {
    uint64_t t0 = tb__now_ns();
    while (tb__now_ns() - t0 < 10000)
      ;
    assert_tb_ok(tb_daemon_status(c, &st));
  }
  s1 = proc_sleeps(d.pid);
  tb_client_disconnect(c);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
  return s0 < 0 || s1 < s0 ? -1 : s1 - s0;
}

static void test_default_polling(void **state) {
  const char *off[] = {"--busy-poll", "0", NULL};
  const char *auto_[] = {"--busy-poll", "auto", NULL};
  const char *bad[] = {"--busy-poll", "sometimes", NULL};
  const char *poll300[] = {"--busy-poll", "300", NULL};
  struct tbt_daemon d;
  struct tbt_child ch;
  char line[64];
  long never, def, chosen, env0, env70, pinned, d_off, d_def, d_auto, d_300;
  int cpus = cpus_allowed(), spare, st = 0;
  (void)state;

  assert_true(cpus >= 1);
  spare = cpus >= 4;
  unsetenv("TENSORBROKER_SPIN_US");
  assert_tb_ok(tbt_daemon_start(&d, off));
  never = polled_waits(d.sock, -1);
  def = polled_waits(d.sock, 0);
  chosen = polled_waits(d.sock, 50); /* whatever the CPUs */
  setenv("TENSORBROKER_SPIN_US", "0", 1);
  env0 = polled_waits(d.sock, 0); /* "0" in the environment: off */
  setenv("TENSORBROKER_SPIN_US", "70", 1);
  env70 = polled_waits(d.sock, 0); /* a number: whatever the CPUs */
  unsetenv("TENSORBROKER_SPIN_US");
  assert_tb_ok(tbt_child_start(&ch, pinned_waiter, d.sock));
  assert_tb_ok(tbt_recv(ch.rd, line, sizeof(line), TBT_TIMEOUT_MS));
  assert_int_equal(sscanf(line, "polled %ld", &pinned), 1);
  assert_int_equal(tbt_child_wait(&ch, TBT_TIMEOUT_MS), 0);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
  print_message("waits that polled, of %d, on %d CPUs: never %ld, default "
                "%ld, 50 us chosen %ld, $TENSORBROKER_SPIN_US=0 %ld, =70 %ld, "
                "default on one CPU %ld\n",
                QUIET_WAITS, cpus, never, def, chosen, env0, env70, pinned);
  assert_int_equal(never, 0);
  assert_int_equal(def, spare ? QUIET_WAITS : 0);
  assert_int_equal(chosen, QUIET_WAITS);
  assert_int_equal(env0, 0);
  assert_int_equal(env70, QUIET_WAITS);
  assert_int_equal(pinned, 0);

  /* The daemon. --busy-poll 300 shows what polling looks like here. */
  assert_true(tbt_daemon_start_at(&d, "/tmp/tb-never.sock", bad, &st) < 0);
  assert_int_equal(st, 2); /* refused at the option, socket untouched */
  d_off = daemon_sleeps(off);
  d_def = daemon_sleeps(NULL);
  d_auto = daemon_sleeps(auto_);
  d_300 = daemon_sleeps(poll300);
  print_message("daemon sleeps in %d requests, %d CPUs: --busy-poll 0 %ld, "
                "default %ld, auto %ld, 300 %ld\n",
                QUIET_WAITS, cpus, d_off, d_def, d_auto, d_300);
  assert_true(d_off >= 0 && d_def >= 0 && d_auto >= 0 && d_300 >= 0);
  assert_true(d_off >= QUIET_WAITS / 2);
  assert_true(d_300 < QUIET_WAITS / 2);
  if (spare) {
    assert_true(d_def < QUIET_WAITS / 2);
    assert_true(d_auto < QUIET_WAITS / 2);
  } else {
    assert_true(d_def >= QUIET_WAITS / 2);
    assert_true(d_auto >= QUIET_WAITS / 2);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_intact, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_negative_strides, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_publish_refused, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_connect_hello_only, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_one_producer_eight_consumers, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_history_depth, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_next_waits, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_next_parked, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_timeouts, tbt_setup, tbt_teardown),
      cmocka_unit_test(test_busy_poll),
      cmocka_unit_test(test_default_polling),
  };
  return cmocka_run_group_tests_name("exchange", tests, NULL, NULL);
}
