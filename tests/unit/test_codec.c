/* SPDX-License-Identifier: Apache-2.0 */
/* Codec: every request, reply and notice survives encode → decode; bytes
 * that are not a message are refused with TB_EPROTO; encoding never writes
 * past its buffer. */
#include "tb_test.h"

#include <stdlib.h>
#include <string.h>

#include "tb_proto.h"

#define BUFCAP 8192

typedef Tensorbroker__V1__Request Req;
typedef Tensorbroker__V1__ServerMessage Srv;

/* Round trip: decode(encode(m)) must have the same body case and re-encode
 * to the same bytes (fields compared by their canonical encoding). */
static void request_round_trip(const Req *m) {
  uint8_t a[BUFCAP], b[BUFCAP];
  tb__request *d = NULL;
  long n, n2;

  n = tb__request_encode(m, a, sizeof(a));
  assert_tb_ok(n);
  assert_true(n > 0);
  assert_tb_ok(tb__request_decode(a, (size_t)n, &d));
  assert_non_null(d);
  assert_int_equal(d->body_case, m->body_case);
  assert_true(d->request_id == m->request_id);
  n2 = tb__request_encode(d, b, sizeof(b));
  assert_int_equal(n2, n);
  assert_memory_equal(a, b, (size_t)n);
  tb__request_free(d);
}

static void server_round_trip(const Srv *m, tb__server_message **keep) {
  uint8_t a[BUFCAP], b[BUFCAP];
  tb__server_message *d = NULL;
  long n, n2;

  n = tb__server_message_encode(m, a, sizeof(a));
  assert_tb_ok(n);
  assert_true(n > 0);
  assert_tb_ok(tb__server_message_decode(a, (size_t)n, &d));
  assert_non_null(d);
  assert_int_equal(d->body_case, m->body_case);
  n2 = tb__server_message_encode(d, b, sizeof(b));
  assert_int_equal(n2, n);
  assert_memory_equal(a, b, (size_t)n);
  if (keep != NULL)
    *keep = d;
  else
    tb__server_message_free(d);
}

static int64_t g_shape[3] = {2, 3, 4};
static int64_t g_strides[3] = {12, 4, 1};
static uint8_t g_uuid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static uint8_t g_handle[64];

static void fill_layout(Tensorbroker__V1__Layout *l,
                        Tensorbroker__V1__Device *dev) {
  dev->type = 1;
  dev->id = 0;
  l->device = dev;
  l->dtype_code = 2;
  l->dtype_bits = 32;
  l->dtype_lanes = 1;
  l->n_shape = 3;
  l->shape = g_shape;
  l->n_strides = 3;
  l->strides = g_strides;
  l->byte_offset = 4096;
  l->flags = 1;
}

static void test_request_round_trips(void **state) {
  (void)state;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;
  Tensorbroker__V1__Layout lay = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__Hello hello = TENSORBROKER__V1__HELLO__INIT;
  Tensorbroker__V1__BufferRegister breg = TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  Tensorbroker__V1__BufferUnregister bunreg = TENSORBROKER__V1__BUFFER_UNREGISTER__INIT;
  Tensorbroker__V1__EventRegister ereg = TENSORBROKER__V1__EVENT_REGISTER__INIT;
  Tensorbroker__V1__EventUnregister eunreg = TENSORBROKER__V1__EVENT_UNREGISTER__INIT;
  Tensorbroker__V1__Publish pub = TENSORBROKER__V1__PUBLISH__INIT;
  Tensorbroker__V1__Acquire acq = TENSORBROKER__V1__ACQUIRE__INIT;
  Tensorbroker__V1__Release rel = TENSORBROKER__V1__RELEASE__INIT;
  Tensorbroker__V1__Subscribe sub = TENSORBROKER__V1__SUBSCRIBE__INIT;
  Tensorbroker__V1__Unsubscribe unsub = TENSORBROKER__V1__UNSUBSCRIBE__INIT;
  Tensorbroker__V1__ListChannels lc = TENSORBROKER__V1__LIST_CHANNELS__INIT;
  Tensorbroker__V1__ListSessions ls = TENSORBROKER__V1__LIST_SESSIONS__INIT;
  Tensorbroker__V1__Status st = TENSORBROKER__V1__STATUS__INIT;
  Tensorbroker__V1__Forget fg = TENSORBROKER__V1__FORGET__INIT;
  Tensorbroker__V1__WaitFree wf = TENSORBROKER__V1__WAIT_FREE__INIT;
  Req r = TENSORBROKER__V1__REQUEST__INIT;
  uint8_t meta[5] = {0, 1, 2, 0xfe, 0xff};
  uint8_t a[BUFCAP];
  tb__request *d = NULL;
  long n;

  memset(g_handle, 0xab, sizeof(g_handle));
  fill_layout(&lay, &dev);
  dev.uuid.data = g_uuid;
  dev.uuid.len = sizeof(g_uuid);

  hello.protocol_version = 1;
  hello.client_name = "unit test";
  hello.stream_contract = TENSORBROKER__V1__STREAM_CONTRACT__STREAM_CONTRACT_EXPLICIT;
  hello.memory_kinds = 6;
  hello.library_version = "0.1.0";
  r.request_id = 1;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
  r.hello = &hello;
  request_round_trip(&r);
  /* spot-check decoded fields, not only the bytes */
  n = tb__request_encode(&r, a, sizeof(a));
  assert_tb_ok(tb__request_decode(a, (size_t)n, &d));
  assert_string_equal(d->hello->client_name, "unit test");
  assert_int_equal(d->hello->stream_contract, 3);
  assert_int_equal(d->hello->memory_kinds, 6);
  tb__request_free(d);

  breg.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC;
  breg.size = 1ull << 40;
  breg.device = &dev;
  breg.cuda_ipc_handle.data = g_handle;
  breg.cuda_ipc_handle.len = sizeof(g_handle);
  breg.consumers_may_write = 1;
  r.request_id = 2;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  r.buffer_register = &breg;
  request_round_trip(&r);

  bunreg.buffer_id = UINT64_MAX;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_UNREGISTER;
  r.buffer_unregister = &bunreg;
  request_round_trip(&r);

  ereg.cuda_ipc_event_handle.data = g_handle;
  ereg.cuda_ipc_event_handle.len = sizeof(g_handle);
  ereg.device = &dev;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_EVENT_REGISTER;
  r.event_register = &ereg;
  request_round_trip(&r);

  eunreg.event_id = 7;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_EVENT_UNREGISTER;
  r.event_unregister = &eunreg;
  request_round_trip(&r);

  pub.channel = "camera0/frames";
  pub.buffer_id = 3;
  pub.layout = &lay;
  pub.ready_event_id = 9;
  pub.metadata.data = meta;
  pub.metadata.len = sizeof(meta);
  pub.history_depth = 3;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_PUBLISH;
  r.publish = &pub;
  request_round_trip(&r);
  n = tb__request_encode(&r, a, sizeof(a));
  assert_tb_ok(tb__request_decode(a, (size_t)n, &d));
  assert_string_equal(d->publish->channel, "camera0/frames");
  assert_int_equal(d->publish->layout->n_shape, 3);
  assert_true(d->publish->layout->shape[2] == 4);
  assert_true(d->publish->layout->strides[0] == 12);
  assert_true(d->publish->layout->byte_offset == 4096);
  assert_int_equal(d->publish->metadata.len, sizeof(meta));
  assert_memory_equal(d->publish->metadata.data, meta, sizeof(meta));
  assert_int_equal(d->publish->layout->device->uuid.len, 16);
  tb__request_free(d);

  acq.channel = "c";
  acq.mode = TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_NEXT;
  acq.version = 41;
  acq.timeout_ms = -1;
  acq.implicit_stream = 1;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  r.acquire = &acq;
  request_round_trip(&r);
  n = tb__request_encode(&r, a, sizeof(a));
  assert_tb_ok(tb__request_decode(a, (size_t)n, &d));
  assert_true(d->acquire->timeout_ms == -1);
  tb__request_free(d);

  rel.lease_id = 5;
  rel.done_event_id = 6;
  rel.want_reply = 0;
  r.request_id = 0; /* one-way */
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_RELEASE;
  r.release = &rel;
  request_round_trip(&r);
  r.request_id = 3;

  sub.channel = "a/b";
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_SUBSCRIBE;
  r.subscribe = &sub;
  request_round_trip(&r);

  unsub.channel = "a/b";
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_UNSUBSCRIBE;
  r.unsubscribe = &unsub;
  request_round_trip(&r);

  /* empty bodies must still decode as "this body is set" */
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_CHANNELS;
  r.list_channels = &lc;
  request_round_trip(&r);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_SESSIONS;
  r.list_sessions = &ls;
  request_round_trip(&r);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
  r.status = &st;
  request_round_trip(&r);

  fg.buffer_id = 12;
  r.request_id = 0;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_FORGET;
  r.forget = &fg;
  request_round_trip(&r);

  wf.channel = "x";
  wf.version = 2;
  wf.timeout_ms = 0;
  r.request_id = UINT64_MAX;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_WAIT_FREE;
  r.wait_free = &wf;
  request_round_trip(&r);
}

static void test_reply_round_trips(void **state) {
  (void)state;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;
  Tensorbroker__V1__Layout lay = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__HelloReply hr = TENSORBROKER__V1__HELLO_REPLY__INIT;
  Tensorbroker__V1__BufferRegisterReply br = TENSORBROKER__V1__BUFFER_REGISTER_REPLY__INIT;
  Tensorbroker__V1__EventRegisterReply er = TENSORBROKER__V1__EVENT_REGISTER_REPLY__INIT;
  Tensorbroker__V1__PublishReply pr = TENSORBROKER__V1__PUBLISH_REPLY__INIT;
  Tensorbroker__V1__BufferInfo bi = TENSORBROKER__V1__BUFFER_INFO__INIT;
  Tensorbroker__V1__EventInfo ei = TENSORBROKER__V1__EVENT_INFO__INIT;
  Tensorbroker__V1__AcquireReply ar = TENSORBROKER__V1__ACQUIRE_REPLY__INIT;
  Tensorbroker__V1__ChannelInfo ci[2] = {TENSORBROKER__V1__CHANNEL_INFO__INIT,
                                         TENSORBROKER__V1__CHANNEL_INFO__INIT};
  Tensorbroker__V1__ChannelInfo *cip[2] = {&ci[0], &ci[1]};
  Tensorbroker__V1__SessionInfo si = TENSORBROKER__V1__SESSION_INFO__INIT;
  Tensorbroker__V1__SessionInfo *sip[1] = {&si};
  Tensorbroker__V1__ListChannelsReply lcr = TENSORBROKER__V1__LIST_CHANNELS_REPLY__INIT;
  Tensorbroker__V1__ListSessionsReply lsr = TENSORBROKER__V1__LIST_SESSIONS_REPLY__INIT;
  Tensorbroker__V1__StatusReply sr = TENSORBROKER__V1__STATUS_REPLY__INIT;
  Tensorbroker__V1__EventInfo *eip[1] = {&ei};
  Tensorbroker__V1__WaitFreeReply wfr = TENSORBROKER__V1__WAIT_FREE_REPLY__INIT;
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Srv m = TENSORBROKER__V1__SERVER_MESSAGE__INIT;
  tb__server_message *d = NULL;
  uint8_t meta[3] = {7, 8, 9};

  fill_layout(&lay, &dev);
  m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY;
  m.reply = &rep;

  /* an error reply with no body */
  rep.request_id = 17;
  rep.status = TB_ENAME;
  rep.message = "bad name";
  server_round_trip(&m, &d);
  assert_int_equal(d->reply->status, TB_ENAME);
  assert_string_equal(d->reply->message, "bad name");
  assert_true(d->reply->request_id == 17);
  assert_int_equal(d->reply->body_case, TENSORBROKER__V1__REPLY__BODY__NOT_SET);
  tb__server_message_free(d);
  rep.status = 0;
  rep.message = "";

  hr.protocol_version = 1;
  hr.session_id = 99;
  hr.daemon_version = "0.1.0";
  hr.max_message = 65536;
  hr.max_ndim = 32;
  hr.max_metadata = 4096;
  hr.max_name = 255;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_HELLO;
  rep.hello = &hr;
  server_round_trip(&m, NULL);

  br.buffer_id = 4;
  br.generation = 1;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_BUFFER_REGISTER;
  rep.buffer_register = &br;
  server_round_trip(&m, NULL);

  er.event_id = 8;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_EVENT_REGISTER;
  rep.event_register = &er;
  server_round_trip(&m, NULL);

  pr.version = 1234567890123ull;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_PUBLISH;
  rep.publish = &pr;
  server_round_trip(&m, &d);
  assert_true(d->reply->publish->version == 1234567890123ull);
  tb__server_message_free(d);

  bi.buffer_id = 4;
  bi.generation = 1;
  bi.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
  bi.size = 1 << 20;
  bi.device = &dev;
  bi.writable = 0;
  bi.fd_attached = 1;
  bi.producer_pid = 4242;
  ei.event_id = 3;
  ei.cuda_ipc_event_handle.data = g_handle;
  ei.cuda_ipc_event_handle.len = sizeof(g_handle);
  ei.owner_pid = 4242;
  ar.lease_id = 77;
  ar.version = 5;
  ar.layout = &lay;
  ar.buffer = &bi;
  ar.ready_event = &ei;
  ar.metadata.data = meta;
  ar.metadata.len = sizeof(meta);
  ar.channel = "cam";
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_ACQUIRE;
  rep.acquire = &ar;
  server_round_trip(&m, &d);
  assert_true(d->reply->acquire->buffer->fd_attached);
  assert_int_equal(d->reply->acquire->buffer->producer_pid, 4242);
  assert_string_equal(d->reply->acquire->channel, "cam");
  tb__server_message_free(d);

  ci[0].name = "a";
  ci[0].latest_version = 3;
  ci[0].closed = 1;
  ci[1].name = "b/c";
  ci[1].publishes = 10;
  lcr.n_channels = 2;
  lcr.channels = cip;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_LIST_CHANNELS;
  rep.list_channels = &lcr;
  server_round_trip(&m, &d);
  assert_int_equal(d->reply->list_channels->n_channels, 2);
  assert_true(d->reply->list_channels->channels[0]->closed);
  assert_string_equal(d->reply->list_channels->channels[1]->name, "b/c");
  tb__server_message_free(d);

  si.session_id = 1;
  si.pid = 100;
  si.uid = 1000;
  si.gid = 1000;
  si.name = "prod";
  si.stream_contract = TENSORBROKER__V1__STREAM_CONTRACT__STREAM_CONTRACT_NO_SYNC;
  si.leases = 2;
  si.implicit_stream_calls = 5;
  lsr.n_sessions = 1;
  lsr.sessions = sip;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_LIST_SESSIONS;
  rep.list_sessions = &lsr;
  server_round_trip(&m, NULL);

  sr.daemon_version = "0.1.0";
  sr.pid = 1;
  sr.uptime_ms = 10;
  sr.bad_messages = 3;
  sr.socket_path = "/tmp/x.sock";
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_STATUS_INFO;
  rep.status_info = &sr;
  server_round_trip(&m, NULL);

  wfr.version = 5;
  wfr.n_done_events = 1;
  wfr.done_events = eip;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_WAIT_FREE;
  rep.wait_free = &wfr;
  server_round_trip(&m, NULL);
}

static void test_notice_round_trips(void **state) {
  (void)state;
  Tensorbroker__V1__NewVersion nv = TENSORBROKER__V1__NEW_VERSION__INIT;
  Tensorbroker__V1__VersionFree vf = TENSORBROKER__V1__VERSION_FREE__INIT;
  Tensorbroker__V1__EventInfo ei = TENSORBROKER__V1__EVENT_INFO__INIT;
  Tensorbroker__V1__EventInfo *eip[1] = {&ei};
  Tensorbroker__V1__BufferRetired brt = TENSORBROKER__V1__BUFFER_RETIRED__INIT;
  Tensorbroker__V1__ChannelClosed cc = TENSORBROKER__V1__CHANNEL_CLOSED__INIT;
  Tensorbroker__V1__DaemonClosing dc = TENSORBROKER__V1__DAEMON_CLOSING__INIT;
  Tensorbroker__V1__Notice no = TENSORBROKER__V1__NOTICE__INIT;
  Srv m = TENSORBROKER__V1__SERVER_MESSAGE__INIT;
  tb__server_message *d = NULL;

  m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE;
  m.notice = &no;

  nv.channel = "cam";
  nv.version = 9;
  no.body_case = TENSORBROKER__V1__NOTICE__BODY_NEW_VERSION;
  no.new_version = &nv;
  server_round_trip(&m, &d);
  assert_int_equal(d->notice->body_case, TENSORBROKER__V1__NOTICE__BODY_NEW_VERSION);
  assert_string_equal(d->notice->new_version->channel, "cam");
  assert_true(d->notice->new_version->version == 9);
  tb__server_message_free(d);

  ei.event_id = 2;
  vf.channel = "cam";
  vf.version = 9;
  vf.buffer_id = 4;
  vf.n_done_events = 1;
  vf.done_events = eip;
  no.body_case = TENSORBROKER__V1__NOTICE__BODY_VERSION_FREE;
  no.version_free = &vf;
  server_round_trip(&m, &d);
  assert_int_equal(d->notice->version_free->n_done_events, 1);
  assert_true(d->notice->version_free->done_events[0]->event_id == 2);
  tb__server_message_free(d);

  brt.buffer_id = 4;
  brt.generation = 1;
  no.body_case = TENSORBROKER__V1__NOTICE__BODY_BUFFER_RETIRED;
  no.buffer_retired = &brt;
  server_round_trip(&m, NULL);

  cc.channel = "cam";
  cc.reason = "producer gone";
  no.body_case = TENSORBROKER__V1__NOTICE__BODY_CHANNEL_CLOSED;
  no.channel_closed = &cc;
  server_round_trip(&m, NULL);

  dc.reason = "SIGTERM";
  no.body_case = TENSORBROKER__V1__NOTICE__BODY_DAEMON_CLOSING;
  no.daemon_closing = &dc;
  server_round_trip(&m, &d);
  assert_string_equal(d->notice->daemon_closing->reason, "SIGTERM");
  tb__server_message_free(d);

  {
    Tensorbroker__V1__EventsGone eg = TENSORBROKER__V1__EVENTS_GONE__INIT;
    uint64_t ids[3] = {7, 8, 1ull << 40};
    eg.session_id = 12;
    eg.n_event_ids = 3;
    eg.event_ids = ids;
    no.body_case = TENSORBROKER__V1__NOTICE__BODY_EVENTS_GONE;
    no.events_gone = &eg;
    server_round_trip(&m, &d);
    assert_int_equal(d->notice->events_gone->session_id, 12);
    assert_int_equal(d->notice->events_gone->n_event_ids, 3);
    assert_true(d->notice->events_gone->event_ids[2] == 1ull << 40);
    tb__server_message_free(d);
  }
}

static void test_empty_input(void **state) {
  (void)state;
  tb__request *r = (tb__request *)0x1;
  tb__server_message *s = (tb__server_message *)0x1;
  uint8_t one = 0;

  assert_tb_err(tb__request_decode(&one, 0, &r), TB_EPROTO);
  assert_tb_err(tb__request_decode(NULL, 0, &r), TB_EPROTO);
  assert_tb_err(tb__request_decode(NULL, 5, &r), TB_EPROTO);
  assert_tb_err(tb__server_message_decode(&one, 0, &s), TB_EPROTO);
  assert_tb_err(tb__server_message_decode(NULL, 0, &s), TB_EPROTO);
  /* out-parameters untouched on failure */
  assert_ptr_equal(r, (tb__request *)0x1);
  assert_ptr_equal(s, (tb__server_message *)0x1);
  /* oversized input is refused before parsing */
  assert_tb_err(tb__request_decode(&one, TB__MAX_MESSAGE_HARD + 1, &r), TB_EPROTO);
}

static void test_body_not_set(void **state) {
  (void)state;
  Req r = TENSORBROKER__V1__REQUEST__INIT;
  Srv m = TENSORBROKER__V1__SERVER_MESSAGE__INIT;
  Tensorbroker__V1__Notice no = TENSORBROKER__V1__NOTICE__INIT;
  uint8_t buf[64];
  tb__request *dr = NULL;
  tb__server_message *ds = NULL;
  long n;

  r.request_id = 5; /* an id, but no body */
  n = tb__request_encode(&r, buf, sizeof(buf));
  assert_tb_ok(n);
  assert_tb_err(tb__request_decode(buf, (size_t)n, &dr), TB_EPROTO);
  assert_null(dr);

  /* a notice whose body is not set */
  m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE;
  m.notice = &no;
  n = tb__server_message_encode(&m, buf, sizeof(buf));
  assert_tb_ok(n);
  assert_tb_err(tb__server_message_decode(buf, (size_t)n, &ds), TB_EPROTO);
  assert_null(ds);

  /* a server message with neither reply nor notice: field 3 only */
  {
    const uint8_t only_unknown[] = {0x18, 0x01};
    assert_tb_err(tb__server_message_decode(only_unknown, sizeof(only_unknown), &ds),
                  TB_EPROTO);
    assert_tb_err(tb__request_decode(only_unknown, sizeof(only_unknown), &dr),
                  TB_EPROTO);
  }
}

static void test_garbage(void **state) {
  (void)state;
  static const uint8_t junk[][8] = {
      {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
      {0x07, 0, 0, 0, 0, 0, 0, 0},           /* wire type 7 does not exist */
      {0x82, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f, 0}, /* field 16, length 2^32 */
      {0x52, 0x05, 0x08, 0x01, 0, 0, 0, 0},  /* hello claims 5 bytes, has 2 */
  };
  uint8_t buf[512];
  uint32_t x = 12345;
  tb__request *r = NULL;
  tb__server_message *s = NULL;

  for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++) {
    assert_tb_err(tb__request_decode(junk[i], sizeof(junk[i]), &r), TB_EPROTO);
    assert_tb_err(tb__server_message_decode(junk[i], sizeof(junk[i]), &s), TB_EPROTO);
  }
  /* Deterministic pseudo-random bytes: must never crash, and whatever
   * decodes must have a body. */
  for (int round = 0; round < 2000; round++) {
    size_t len = 1 + (size_t)(round % (int)sizeof(buf));
    for (size_t i = 0; i < len; i++) {
      x = x * 1103515245u + 12345u;
      buf[i] = (uint8_t)(x >> 16);
    }
    if (tb__request_decode(buf, len, &r) == 0) {
      assert_int_not_equal(r->body_case, TENSORBROKER__V1__REQUEST__BODY__NOT_SET);
      tb__request_free(r);
    }
    if (tb__server_message_decode(buf, len, &s) == 0) {
      assert_int_not_equal(s->body_case, TENSORBROKER__V1__SERVER_MESSAGE__BODY__NOT_SET);
      tb__server_message_free(s);
    }
  }
}

/* The body is one length-delimited field after request_id, so every strict
 * prefix of an encoded request is either cut inside a field or has no body:
 * all must be refused. */
static void test_truncated(void **state) {
  (void)state;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;
  Tensorbroker__V1__Layout lay = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__Publish pub = TENSORBROKER__V1__PUBLISH__INIT;
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Tensorbroker__V1__PublishReply pr = TENSORBROKER__V1__PUBLISH_REPLY__INIT;
  Req r = TENSORBROKER__V1__REQUEST__INIT;
  Srv m = TENSORBROKER__V1__SERVER_MESSAGE__INIT;
  uint8_t buf[BUFCAP];
  tb__request *dr = NULL;
  tb__server_message *ds = NULL;
  long n;

  fill_layout(&lay, &dev);
  pub.channel = "some/channel";
  pub.buffer_id = 300;
  pub.layout = &lay;
  r.request_id = 1000;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_PUBLISH;
  r.publish = &pub;
  n = tb__request_encode(&r, buf, sizeof(buf));
  assert_true(n > 10);
  for (long len = 1; len < n; len++) {
    int rc = tb__request_decode(buf, (size_t)len, &dr);
    if (rc != TB_EPROTO)
      fail_msg("prefix of %ld/%ld bytes gave %d", len, n, rc);
  }
  assert_tb_ok(tb__request_decode(buf, (size_t)n, &dr));
  tb__request_free(dr);

  pr.version = 300;
  rep.request_id = 1000;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_PUBLISH;
  rep.publish = &pr;
  m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY;
  m.reply = &rep;
  n = tb__server_message_encode(&m, buf, sizeof(buf));
  for (long len = 1; len < n; len++) {
    int rc = tb__server_message_decode(buf, (size_t)len, &ds);
    if (rc != TB_EPROTO)
      fail_msg("prefix of %ld/%ld bytes gave %d", len, n, rc);
  }
}

static void test_encode_too_small(void **state) {
  (void)state;
  Tensorbroker__V1__Subscribe sub = TENSORBROKER__V1__SUBSCRIBE__INIT;
  Tensorbroker__V1__NewVersion nv = TENSORBROKER__V1__NEW_VERSION__INIT;
  Tensorbroker__V1__Notice no = TENSORBROKER__V1__NOTICE__INIT;
  Req r = TENSORBROKER__V1__REQUEST__INIT;
  Srv m = TENSORBROKER__V1__SERVER_MESSAGE__INIT;
  uint8_t buf[256];
  long n;

  sub.channel = "a/long/enough/channel/name";
  r.request_id = 1;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_SUBSCRIBE;
  r.subscribe = &sub;
  n = tb__request_encode(&r, buf, sizeof(buf));
  assert_true(n > 0);
  memset(buf, 0x5a, sizeof(buf));
  assert_tb_err(tb__request_encode(&r, buf, (size_t)n - 1), TB_ELIMIT);
  for (size_t i = 0; i < sizeof(buf); i++)
    assert_int_equal(buf[i], 0x5a); /* nothing written */
  assert_tb_err(tb__request_encode(&r, buf, 0), TB_ELIMIT);
  assert_int_equal(tb__request_encode(&r, buf, (size_t)n), n);
  assert_int_equal(buf[n], 0x5a);

  nv.channel = "cam";
  nv.version = 1;
  no.body_case = TENSORBROKER__V1__NOTICE__BODY_NEW_VERSION;
  no.new_version = &nv;
  m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE;
  m.notice = &no;
  n = tb__server_message_encode(&m, buf, sizeof(buf));
  assert_true(n > 0);
  assert_tb_err(tb__server_message_encode(&m, buf, (size_t)n - 1), TB_ELIMIT);
  assert_int_equal(tb__server_message_encode(&m, buf, (size_t)n), n);
}

/* Unknown fields (a newer peer) are ignored, as the protocol promises. */
static void test_unknown_fields_ignored(void **state) {
  (void)state;
  Tensorbroker__V1__Status st = TENSORBROKER__V1__STATUS__INIT;
  Req r = TENSORBROKER__V1__REQUEST__INIT;
  uint8_t buf[64];
  tb__request *d = NULL;
  long n;

  r.request_id = 4;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
  r.status = &st;
  n = tb__request_encode(&r, buf, sizeof(buf) - 3);
  assert_true(n > 0);
  /* append field 99 (varint) = 1 */
  buf[n] = (uint8_t)((99 << 3) & 0x7f) | 0x80;
  buf[n + 1] = (uint8_t)(99 >> 4);
  buf[n + 2] = 1;
  assert_tb_ok(tb__request_decode(buf, (size_t)n + 3, &d));
  assert_int_equal(d->body_case, TENSORBROKER__V1__REQUEST__BODY_STATUS);
  assert_true(d->request_id == 4);
  tb__request_free(d);
}

/* ---- the hand-written AcquireReply decoder against protobuf-c ---- */

static uint64_t rng_next(uint64_t *x) { /* xorshift64* */
  *x ^= *x >> 12;
  *x ^= *x << 25;
  *x ^= *x >> 27;
  return *x * 2685821657736338717ull;
}

/* A value of a random magnitude: 0, small, or up to 64 bits. */
static uint64_t rng_val(uint64_t *x) {
  uint64_t r = rng_next(x);
  switch (r & 3) {
  case 0:
    return 0;
  case 1:
    return (r >> 8) & 0x7f;
  case 2:
    return (r >> 8) & 0xffffffffu;
  default:
    return rng_next(x);
  }
}

struct gen {
  char channel[48], message[48];
  uint8_t uuid[3][16], handle[64], ev_handle[64], meta[40];
  int64_t shape[6], strides[6];
};

static void rng_ascii(uint64_t *x, char *out, size_t cap) {
  size_t n = rng_next(x) % cap;
  for (size_t i = 0; i < n; i++)
    out[i] = (char)(0x20 + rng_next(x) % 95);
  out[n] = '\0';
}

static void rng_bytes(uint64_t *x, uint8_t *out, size_t cap,
                      ProtobufCBinaryData *bd) {
  bd->len = rng_next(x) % (cap + 1);
  bd->data = bd->len ? out : NULL;
  for (size_t i = 0; i < bd->len; i++)
    out[i] = (uint8_t)rng_next(x);
}

/* Carry ar's layout and buffer as the daemon does: packed beforehand, as
 * unknown fields 3 and 4 (tag, then the length-prefixed bytes), which the
 * hand-written encoder writes verbatim. lbuf and bbuf hold 512 bytes each;
 * they and pre must outlive ar's encoding. */
static void as_daemon_packs(Tensorbroker__V1__AcquireReply *ar,
                            ProtobufCMessageUnknownField pre[2],
                            uint8_t *lbuf, uint8_t *bbuf) {
  size_t nu = 0, k;

  if (ar->layout != NULL) {
    k = tb__put_varint(lbuf,
                       tensorbroker__v1__layout__get_packed_size(ar->layout));
    k += tensorbroker__v1__layout__pack(ar->layout, lbuf + k);
    pre[nu++] = (ProtobufCMessageUnknownField){
        3, PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED, k, lbuf};
  }
  if (ar->buffer != NULL) {
    k = tb__put_varint(
        bbuf, tensorbroker__v1__buffer_info__get_packed_size(ar->buffer));
    k += tensorbroker__v1__buffer_info__pack(ar->buffer, bbuf + k);
    pre[nu++] = (ProtobufCMessageUnknownField){
        4, PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED, k, bbuf};
  }
  ar->layout = NULL;
  ar->buffer = NULL;
  ar->base.n_unknown_fields = nu;
  ar->base.unknown_fields = nu ? pre : NULL;
}

/* Encode a random ServerMessage{Reply{AcquireReply}}: each field present or
 * not, values of every magnitude, negative int32s. */
static long random_acquire_reply(uint64_t *x, struct gen *g, uint8_t *buf,
                                 size_t cap, int as_daemon) {
  Tensorbroker__V1__Device d[3] = {TENSORBROKER__V1__DEVICE__INIT,
                                   TENSORBROKER__V1__DEVICE__INIT,
                                   TENSORBROKER__V1__DEVICE__INIT};
  Tensorbroker__V1__Layout lay = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__BufferInfo bi = TENSORBROKER__V1__BUFFER_INFO__INIT;
  Tensorbroker__V1__EventInfo ev = TENSORBROKER__V1__EVENT_INFO__INIT;
  Tensorbroker__V1__AcquireReply ar = TENSORBROKER__V1__ACQUIRE_REPLY__INIT;
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Srv m = TENSORBROKER__V1__SERVER_MESSAGE__INIT;

  for (int i = 0; i < 3; i++) {
    d[i].type = (int32_t)rng_val(x);
    d[i].id = (int32_t)rng_val(x);
    rng_bytes(x, g->uuid[i], 16, &d[i].uuid);
  }
  lay.device = rng_next(x) & 1 ? &d[0] : NULL;
  lay.dtype_code = (uint32_t)rng_val(x);
  lay.dtype_bits = (uint32_t)rng_val(x);
  lay.dtype_lanes = (uint32_t)rng_val(x);
  lay.n_shape = rng_next(x) % 7;
  lay.shape = g->shape;
  lay.n_strides = rng_next(x) % 7;
  lay.strides = g->strides;
  for (int i = 0; i < 6; i++) {
    g->shape[i] = (int64_t)rng_val(x);
    g->strides[i] = (int64_t)rng_val(x);
  }
  lay.byte_offset = rng_val(x);
  lay.flags = rng_val(x);
  bi.buffer_id = rng_val(x);
  bi.generation = (uint32_t)rng_val(x);
  bi.kind = (Tensorbroker__V1__MemoryKind)(rng_next(x) % 3);
  bi.size = rng_val(x);
  bi.device = rng_next(x) & 1 ? &d[1] : NULL;
  rng_bytes(x, g->handle, 64, &bi.cuda_ipc_handle);
  bi.writable = rng_next(x) & 1;
  bi.fd_attached = rng_next(x) & 1;
  bi.producer_pid = (uint32_t)rng_val(x);
  ev.event_id = rng_val(x);
  rng_bytes(x, g->ev_handle, 64, &ev.cuda_ipc_event_handle);
  ev.device = rng_next(x) & 1 ? &d[2] : NULL;
  ev.owner_pid = (uint32_t)rng_val(x);
  ev.complete = rng_next(x) & 1;
  ar.lease_id = rng_val(x);
  ar.version = rng_val(x);
  ar.layout = rng_next(x) % 4 ? &lay : NULL;
  ar.buffer = rng_next(x) % 4 ? &bi : NULL;
  ar.ready_event = rng_next(x) & 1 ? &ev : NULL;
  rng_bytes(x, g->meta, 40, &ar.metadata);
  rng_ascii(x, g->channel, sizeof(g->channel));
  ar.channel = g->channel;
  rep.request_id = rng_val(x);
  rep.status = (int32_t)rng_val(x);
  rng_ascii(x, g->message, sizeof(g->message));
  rep.message = g->message;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_ACQUIRE;
  rep.acquire = &ar;
  m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY;
  m.reply = &rep;
  if (as_daemon) {
    /* As the daemon sends it (as_daemon_packs); its bytes must be
     * protobuf-c's. */
    ProtobufCMessageUnknownField pre[2];
    uint8_t lbuf[512], bbuf[512];
    long n;

    as_daemon_packs(&ar, pre, lbuf, bbuf);
    n = tb__server_message_encode(&m, buf, cap);
    assert_true(n > 0);
    assert_int_equal((size_t)n, tensorbroker__v1__server_message__get_packed_size(&m));
    {
      uint8_t ref[BUFCAP];
      assert_int_equal(tensorbroker__v1__server_message__pack(&m, ref), (size_t)n);
      assert_memory_equal(buf, ref, (size_t)n);
    }
    return n;
  }
  return tb__server_message_encode(&m, buf, cap);
}

/* If the fast decoder takes buf, protobuf-c must take it too, to the same
 * message (compared by canonical re-encoding). Returns whether it took it. */
static int fast_agrees(struct tb__arena *a, const uint8_t *buf, size_t len) {
  uint8_t e1[BUFCAP], e2[BUFCAP];
  tb__server_message *f = NULL, *p = NULL;
  long n1, n2;

  tb__arena_reset(a);
  if (tb__server_message_decode_fast(a, buf, len, &f) != 1)
    return 0;
  if (tb__server_message_decode(buf, len, &p) != 0)
    fail_msg("fast decoder took %zu bytes protobuf-c refuses", len);
  n1 = tb__server_message_encode(f, e1, sizeof(e1));
  n2 = tb__server_message_encode(p, e2, sizeof(e2));
  assert_true(n1 > 0);
  assert_int_equal(n1, n2);
  assert_memory_equal(e1, e2, (size_t)n1);
  if (f->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY) {
    assert_string_equal(f->reply->acquire->channel, p->reply->acquire->channel);
    assert_string_equal(f->reply->message, p->reply->message);
  } else {
    assert_string_equal(f->notice->new_version->channel,
                        p->notice->new_version->channel);
  }
  tb__server_message_free(p);
  return 1;
}

/* Eight corrupted copies of the n bytes at buf (a bit flipped, a byte
 * replaced, the tail cut, a byte inserted), each given to agrees(); counts
 * the copies the fast decoder took and those it left to protobuf-c. */
typedef int agrees_fn(struct tb__arena *a, const uint8_t *buf, size_t len);

static void corrupt_and_compare(uint64_t *x, struct tb__arena *a,
                                const uint8_t *buf, size_t n, agrees_fn *agrees,
                                int *taken, int *refused) {
  uint8_t mut[BUFCAP + 1];

  for (int j = 0; j < 8; j++) {
    size_t len = n, at = rng_next(x) % n;
    memcpy(mut, buf, n);
    switch (rng_next(x) % 4) {
    case 0:
      mut[at] ^= (uint8_t)(1u << (rng_next(x) % 8));
      break;
    case 1:
      mut[at] = (uint8_t)rng_next(x);
      break;
    case 2:
      len = at; /* truncated */
      break;
    default:
      memmove(mut + at + 1, mut + at, n - at);
      mut[at] = (uint8_t)rng_next(x);
      len++;
    }
    if (agrees(a, mut, len))
      (*taken)++;
    else
      (*refused)++;
  }
}

/* With keep set, the arena keeps decoded sub-messages (tb_proto.h): the
 * same comparisons must hold, with the kept copies used often. */
static void fast_acquire_reply_decoder(struct tb__keep *keep) {
  struct tb__arena a;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  uint8_t buf[BUFCAP];
  struct gen g;
  int taken_mutants = 0, refused_mutants = 0;

  assert_tb_ok(tb__arena_init(&a, 1024));
  a.keep = keep;
  for (int i = 0; i < 3000; i++) {
    long n = random_acquire_reply(&x, &g, buf, sizeof(buf), i & 1);
    assert_true(n > 0);
    /* everything the daemon sends for an acquire is the fast decoder's */
    if (!fast_agrees(&a, buf, (size_t)n))
      fail_msg("generated AcquireReply %d (%ld bytes) not taken", i, n);
    /* and through tb__server_message_decode_in */
    tb__server_message *d = NULL;
    assert_tb_ok(tb__server_message_decode_in(&a, buf, (size_t)n, &d));
    assert_int_equal(d->reply->body_case, TENSORBROKER__V1__REPLY__BODY_ACQUIRE);
    /* corrupted copies: what it takes, protobuf-c reads the same */
    corrupt_and_compare(&x, &a, buf, (size_t)n, fast_agrees, &taken_mutants,
                        &refused_mutants);
  }
  /* NewVersion notices, with and without the prefetched buffer and event */
  for (int i = 0; i < 2000; i++) {
    Tensorbroker__V1__Device d[2] = {TENSORBROKER__V1__DEVICE__INIT,
                                     TENSORBROKER__V1__DEVICE__INIT};
    Tensorbroker__V1__BufferInfo bi = TENSORBROKER__V1__BUFFER_INFO__INIT;
    Tensorbroker__V1__EventInfo ev = TENSORBROKER__V1__EVENT_INFO__INIT;
    Tensorbroker__V1__NewVersion nv = TENSORBROKER__V1__NEW_VERSION__INIT;
    Tensorbroker__V1__Notice no = TENSORBROKER__V1__NOTICE__INIT;
    Srv m = TENSORBROKER__V1__SERVER_MESSAGE__INIT;
    long n;

    rng_ascii(&x, g.channel, sizeof(g.channel));
    nv.channel = g.channel;
    nv.version = rng_val(&x);
    for (int k = 0; k < 2; k++) {
      d[k].type = (int32_t)rng_val(&x);
      d[k].id = (int32_t)rng_val(&x);
      rng_bytes(&x, g.uuid[k], 16, &d[k].uuid);
    }
    bi.buffer_id = rng_val(&x);
    bi.generation = (uint32_t)rng_val(&x);
    bi.kind = (Tensorbroker__V1__MemoryKind)(rng_next(&x) % 3);
    bi.size = rng_val(&x);
    bi.device = rng_next(&x) & 1 ? &d[0] : NULL;
    rng_bytes(&x, g.handle, 64, &bi.cuda_ipc_handle);
    bi.producer_pid = (uint32_t)rng_val(&x);
    ev.event_id = rng_val(&x);
    rng_bytes(&x, g.ev_handle, 64, &ev.cuda_ipc_event_handle);
    ev.device = rng_next(&x) & 1 ? &d[1] : NULL;
    ev.complete = rng_next(&x) & 1;
    nv.buffer = rng_next(&x) & 1 ? &bi : NULL;
    nv.ready_event = rng_next(&x) & 1 ? &ev : NULL;
    no.body_case = TENSORBROKER__V1__NOTICE__BODY_NEW_VERSION;
    no.new_version = &nv;
    m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE;
    m.notice = &no;
    n = tb__server_message_encode(&m, buf, sizeof(buf));
    assert_true(n > 0);
    if (!fast_agrees(&a, buf, (size_t)n))
      fail_msg("generated NewVersion %d (%ld bytes) not taken", i, n);
    corrupt_and_compare(&x, &a, buf, (size_t)n, fast_agrees, &taken_mutants,
                        &refused_mutants);
  }
  /* both kinds occurred, so both paths of the comparison ran */
  assert_true(taken_mutants > 1000);
  assert_true(refused_mutants > 1000);

  /* forms left to protobuf-c: other replies, notices, unknown fields,
   * unpacked repeated fields; decode_in still decodes them */
  {
    Tensorbroker__V1__PublishReply pr = TENSORBROKER__V1__PUBLISH_REPLY__INIT;
    Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
    Srv m = TENSORBROKER__V1__SERVER_MESSAGE__INIT;
    tb__server_message *d = NULL;
    long n;

    pr.version = 3;
    rep.body_case = TENSORBROKER__V1__REPLY__BODY_PUBLISH;
    rep.publish = &pr;
    m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY;
    m.reply = &rep;
    n = tb__server_message_encode(&m, buf, sizeof(buf));
    assert_true(tb__server_message_decode_fast(&a, buf, (size_t)n, &d) <= 0);
    assert_tb_ok(tb__server_message_decode_in(&a, buf, (size_t)n, &d));
    assert_true(d->reply->publish->version == 3);
  }
  {
    /* Reply{acquire: AcquireReply{lease_id 5, field 99 = 1}} */
    static const uint8_t unk[] = {0x0a, 0x07, 0x72, 0x05, 0x08,
                                  0x05, 0x98, 0x06, 0x01};
    tb__server_message *d = NULL;
    assert_true(tb__server_message_decode_fast(&a, unk, sizeof(unk), &d) <= 0);
    assert_tb_ok(tb__server_message_decode_in(&a, unk, sizeof(unk), &d));
    assert_true(d->reply->acquire->lease_id == 5);
    /* Reply{acquire: {layout: {shape: 7 (unpacked)}}} */
    static const uint8_t unpacked[] = {0x0a, 0x06, 0x72, 0x04, 0x1a, 0x02,
                                       0x28, 0x07};
    assert_true(tb__server_message_decode_fast(&a, unpacked, sizeof(unpacked), &d) <= 0);
    assert_tb_ok(tb__server_message_decode_in(&a, unpacked, sizeof(unpacked), &d));
    assert_int_equal(d->reply->acquire->layout->n_shape, 1);
    assert_true(d->reply->acquire->layout->shape[0] == 7);
  }
  tb__arena_fini(&a);
}

static void test_fast_acquire_reply_decoder(void **state) {
  (void)state;
  fast_acquire_reply_decoder(NULL);
}

static void test_fast_decoder_keeping(void **state) {
  (void)state;
  struct tb__keep k;

  assert_tb_ok(tb__keep_init(&k));
  fast_acquire_reply_decoder(&k);
  /* corrupted copies of a message mostly leave its sub-messages alone */
  assert_true(k.layout.hits > 500);
  assert_true(k.buffer.hits > 500);
  assert_true(k.event.hits > 500);
  tb__keep_fini(&k);
}

/* A reply whose layout has shape {dim} and whose lease is lease_id, as the
 * daemon sends it (layout and buffer packed once: as_daemon_packs). */
static long kept_reply(uint8_t *buf, size_t cap, uint64_t lease_id,
                       int64_t dim, uint64_t buffer_id) {
  Tensorbroker__V1__Layout lay = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__BufferInfo bi = TENSORBROKER__V1__BUFFER_INFO__INIT;
  Tensorbroker__V1__AcquireReply ar = TENSORBROKER__V1__ACQUIRE_REPLY__INIT;
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  Srv m = TENSORBROKER__V1__SERVER_MESSAGE__INIT;
  ProtobufCMessageUnknownField pre[2];
  uint8_t lbuf[512], bbuf[512];

  lay.dtype_code = 2;
  lay.dtype_bits = 32;
  lay.dtype_lanes = 1;
  lay.n_shape = 1;
  lay.shape = &dim;
  bi.buffer_id = buffer_id;
  bi.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
  bi.size = 4096;
  ar.layout = &lay;
  ar.buffer = &bi;
  as_daemon_packs(&ar, pre, lbuf, bbuf);
  ar.lease_id = lease_id;
  ar.version = lease_id;
  ar.channel = "cam0";
  rep.request_id = lease_id;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_ACQUIRE;
  rep.acquire = &ar;
  m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY;
  m.reply = &rep;
  return tb__server_message_encode(&m, buf, cap);
}

/* The kept copy is used only for the same bytes, and a sub-message the
 * fast decoder gave up on leaves nothing kept behind. */
static void test_kept_only_for_same_bytes(void **state) {
  (void)state;
  struct tb__keep k;
  struct tb__arena a;
  tb__server_message *d = NULL;
  uint8_t buf[256];
  long n;

  assert_tb_ok(tb__keep_init(&k));
  assert_tb_ok(tb__arena_init(&a, 1024));
  a.keep = &k;
  n = kept_reply(buf, sizeof(buf), 1, 16, 7);
  assert_tb_ok(tb__server_message_decode_in(&a, buf, (size_t)n, &d));
  assert_true(d->reply->acquire->layout->shape[0] == 16);
  assert_int_equal(k.layout.hits, 0);

  /* another lease of the same version's layout and buffer: kept */
  n = kept_reply(buf, sizeof(buf), 2, 16, 7);
  assert_tb_ok(tb__server_message_decode_in(&a, buf, (size_t)n, &d));
  assert_int_equal(k.layout.hits, 1);
  assert_int_equal(k.buffer.hits, 1);
  assert_true(d->reply->acquire->lease_id == 2);
  assert_ptr_equal(d->reply->acquire->layout, k.layout.msg);
  assert_true(d->reply->acquire->layout->shape[0] == 16);
  assert_true(d->reply->acquire->buffer->buffer_id == 7);

  /* same lengths, other bytes: decoded anew */
  n = kept_reply(buf, sizeof(buf), 3, 17, 8);
  assert_tb_ok(tb__server_message_decode_in(&a, buf, (size_t)n, &d));
  assert_int_equal(k.layout.hits, 1);
  assert_int_equal(k.buffer.hits, 1);
  assert_true(d->reply->acquire->layout->shape[0] == 17);
  assert_true(d->reply->acquire->buffer->buffer_id == 8);

  /* a layout the fast decoder gives up on inside (its dtype_code, field 2,
   * twice: protobuf-c takes the last), then the earlier one again */
  {
    static const uint8_t twice[] = {
        0x0a, 0x0a, 0x72, 0x08, 0x08, 0x04, 0x1a, 0x04,
        0x10, 0x02, 0x10, 0x05};
    assert_tb_ok(tb__server_message_decode_in(&a, twice, sizeof(twice), &d));
    assert_int_equal(d->reply->acquire->layout->dtype_code, 5);
    assert_null(k.layout.msg);
  }
  n = kept_reply(buf, sizeof(buf), 4, 17, 8);
  assert_tb_ok(tb__server_message_decode_in(&a, buf, (size_t)n, &d));
  assert_int_equal(k.layout.hits, 1);
  assert_true(d->reply->acquire->layout->shape[0] == 17);
  assert_true(d->reply->acquire->layout->dtype_code == 2);
  tb__arena_fini(&a);
  tb__keep_fini(&k);
}

/* The daemon's Request{Acquire | Release} decoder against protobuf-c, as
 * above. */
static int fast_request_agrees(struct tb__arena *a, const uint8_t *buf,
                               size_t len) {
  uint8_t e1[BUFCAP], e2[BUFCAP];
  tb__request *f = NULL, *p = NULL;
  long n1, n2;

  tb__arena_reset(a);
  if (tb__request_decode_fast(a, buf, len, &f) != 1)
    return 0;
  if (tb__request_decode(buf, len, &p) != 0)
    fail_msg("fast decoder took %zu bytes protobuf-c refuses", len);
  n1 = tb__request_encode(f, e1, sizeof(e1));
  n2 = tb__request_encode(p, e2, sizeof(e2));
  assert_true(n1 > 0);
  assert_int_equal(n1, n2);
  assert_memory_equal(e1, e2, (size_t)n1);
  if (f->body_case == TENSORBROKER__V1__REQUEST__BODY_ACQUIRE)
    assert_string_equal(f->acquire->channel, p->acquire->channel);
  tb__request_free(p);
  return 1;
}

static void test_fast_request_decoder(void **state) {
  (void)state;
  struct tb__arena a;
  uint64_t x = 0x2545f4914f6cdd1dull;
  uint8_t buf[BUFCAP], mut[BUFCAP];
  char channel[200]; /* bodies above 127 bytes too */
  int taken_mutants = 0, refused_mutants = 0;

  assert_tb_ok(tb__arena_init(&a, 1024));
  for (int i = 0; i < 3000; i++) {
    Tensorbroker__V1__Acquire aq = TENSORBROKER__V1__ACQUIRE__INIT;
    Tensorbroker__V1__Release rel = TENSORBROKER__V1__RELEASE__INIT;
    Req r = TENSORBROKER__V1__REQUEST__INIT;
    long n;

    r.request_id = rng_val(&x);
    if (i & 1) {
      rng_ascii(&x, channel, sizeof(channel));
      aq.channel = channel;
      aq.mode = (Tensorbroker__V1__AcquireMode)(int32_t)rng_val(&x);
      aq.version = rng_val(&x);
      aq.timeout_ms = (int64_t)rng_val(&x);
      aq.implicit_stream = rng_next(&x) & 1;
      aq.release_lease_id = rng_val(&x);
      aq.release_done_event_id = rng_val(&x);
      aq.release_implicit_stream = rng_next(&x) & 1;
      r.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
      r.acquire = &aq;
    } else {
      rel.lease_id = rng_val(&x);
      rel.done_event_id = rng_val(&x);
      rel.want_reply = rng_next(&x) & 1;
      rel.implicit_stream = rng_next(&x) & 1;
      r.body_case = TENSORBROKER__V1__REQUEST__BODY_RELEASE;
      r.release = &rel;
    }
    n = tb__request_encode(&r, buf, sizeof(buf));
    assert_true(n > 0);
    /* the hand-written encoder writes protobuf-c's bytes */
    assert_int_equal((size_t)n, tensorbroker__v1__request__get_packed_size(&r));
    assert_int_equal(tensorbroker__v1__request__pack(&r, mut), (size_t)n);
    assert_memory_equal(buf, mut, (size_t)n);
    if (!fast_request_agrees(&a, buf, (size_t)n))
      fail_msg("generated request %d (%ld bytes) not taken", i, n);
    corrupt_and_compare(&x, &a, buf, (size_t)n, fast_request_agrees,
                        &taken_mutants, &refused_mutants);
  }
  assert_true(taken_mutants > 1000);
  assert_true(refused_mutants > 1000);
  {
    /* other requests are protobuf-c's, and still decoded */
    Tensorbroker__V1__Status st = TENSORBROKER__V1__STATUS__INIT;
    Req r = TENSORBROKER__V1__REQUEST__INIT;
    tb__request *d = NULL;
    long n;

    r.request_id = 9;
    r.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
    r.status = &st;
    n = tb__request_encode(&r, buf, sizeof(buf));
    assert_true(tb__request_decode_fast(&a, buf, (size_t)n, &d) <= 0);
    assert_tb_ok(tb__request_decode_in(&a, buf, (size_t)n, &d));
    assert_int_equal(d->body_case, TENSORBROKER__V1__REQUEST__BODY_STATUS);
  }
  tb__arena_fini(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_request_round_trips),
      cmocka_unit_test(test_reply_round_trips),
      cmocka_unit_test(test_notice_round_trips),
      cmocka_unit_test(test_empty_input),
      cmocka_unit_test(test_body_not_set),
      cmocka_unit_test(test_garbage),
      cmocka_unit_test(test_truncated),
      cmocka_unit_test(test_encode_too_small),
      cmocka_unit_test(test_unknown_fields_ignored),
      cmocka_unit_test(test_fast_acquire_reply_decoder),
      cmocka_unit_test(test_fast_decoder_keeping),
      cmocka_unit_test(test_kept_only_for_same_bytes),
      cmocka_unit_test(test_fast_request_decoder),
  };
  return cmocka_run_group_tests_name("codec", tests, NULL, NULL);
}
