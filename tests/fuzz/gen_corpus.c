/* SPDX-License-Identifier: Apache-2.0 */
/* Writes the seed corpora of the fuzz targets: gen_corpus DIR makes
 * DIR/request, DIR/server_message, DIR/layout and DIR/daemon and fills
 * them with a few dozen small inputs each, named by what they hold. The
 * committed corpora (tests/fuzz/corpus/) are its output:
 *   build/tests/fuzz/fuzz_gen_corpus tests/fuzz/corpus
 * Seeds are valid messages and sequences the targets should go deep
 * with; libFuzzer mutates from there. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tb_proto.h"

static const char *outdir;

struct buf {
  uint8_t b[8192];
  size_t n;
};

static void put(struct buf *o, const void *p, size_t n) {
  if (o->n + n > sizeof(o->b)) {
    fprintf(stderr, "gen_corpus: seed too long\n");
    exit(1);
  }
  memcpy(o->b + o->n, p, n);
  o->n += n;
}

static void u8(struct buf *o, unsigned v) {
  uint8_t b = (uint8_t)v;
  put(o, &b, 1);
}

static void u16(struct buf *o, unsigned v) {
  u8(o, v & 0xff);
  u8(o, (v >> 8) & 0xff);
}

static void u32(struct buf *o, uint32_t v) {
  u16(o, v & 0xffff);
  u16(o, v >> 16);
}

static void u64(struct buf *o, uint64_t v) {
  u32(o, (uint32_t)v);
  u32(o, (uint32_t)(v >> 32));
}

static void save(const char *target, const char *name, const void *p,
                 size_t n) {
  char path[1024];
  FILE *f;

  snprintf(path, sizeof(path), "%s/%s", outdir, target);
  if (mkdir(path, 0755) < 0 && errno != EEXIST) {
    perror(path);
    exit(1);
  }
  snprintf(path, sizeof(path), "%s/%s/%s", outdir, target, name);
  f = fopen(path, "wb");
  if (f == NULL || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

/* ---- request ---- */

static void save_req(const char *name, tb__request *r) {
  uint8_t b[4096];
  long n = tb__request_encode(r, b, sizeof(b));

  if (n <= 0) {
    fprintf(stderr, "gen_corpus: %s does not encode\n", name);
    exit(1);
  }
  save("request", name, b, (size_t)n);
}

static int64_t g_shape[3] = {2, 3, 4}, g_strides[3] = {12, -4, 1};
static uint8_t g_uuid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static uint8_t g_handle[64];

static void requests(void) {
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;
  Tensorbroker__V1__Layout lay = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__Hello hello = TENSORBROKER__V1__HELLO__INIT;
  Tensorbroker__V1__BufferRegister br = TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  Tensorbroker__V1__BufferUnregister bu = TENSORBROKER__V1__BUFFER_UNREGISTER__INIT;
  Tensorbroker__V1__EventRegister er = TENSORBROKER__V1__EVENT_REGISTER__INIT;
  Tensorbroker__V1__EventUnregister eu = TENSORBROKER__V1__EVENT_UNREGISTER__INIT;
  Tensorbroker__V1__Publish pub = TENSORBROKER__V1__PUBLISH__INIT;
  Tensorbroker__V1__Acquire acq = TENSORBROKER__V1__ACQUIRE__INIT;
  Tensorbroker__V1__Release rel = TENSORBROKER__V1__RELEASE__INIT;
  Tensorbroker__V1__Subscribe sub = TENSORBROKER__V1__SUBSCRIBE__INIT;
  Tensorbroker__V1__ListChannels lc = TENSORBROKER__V1__LIST_CHANNELS__INIT;
  Tensorbroker__V1__ListSessions ls = TENSORBROKER__V1__LIST_SESSIONS__INIT;
  Tensorbroker__V1__Status st = TENSORBROKER__V1__STATUS__INIT;
  Tensorbroker__V1__Forget fg = TENSORBROKER__V1__FORGET__INIT;
  Tensorbroker__V1__WaitFree wf = TENSORBROKER__V1__WAIT_FREE__INIT;
  Tensorbroker__V1__Goodbye gb = TENSORBROKER__V1__GOODBYE__INIT;
  Tensorbroker__V1__Metrics mt = TENSORBROKER__V1__METRICS__INIT;
  Tensorbroker__V1__ListLeases ll = TENSORBROKER__V1__LIST_LEASES__INIT;
  Tensorbroker__V1__ListWaits lw = TENSORBROKER__V1__LIST_WAITS__INIT;
  Tensorbroker__V1__DropChannel dc = TENSORBROKER__V1__DROP_CHANNEL__INIT;
  Tensorbroker__V1__ListBuffers lb = TENSORBROKER__V1__LIST_BUFFERS__INIT;
  Tensorbroker__V1__Cancel cn = TENSORBROKER__V1__CANCEL__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  char *chans[2] = {"cam/0", "b"};
  uint8_t meta[6] = {0, 1, 2, 0xfe, 0xff, 7};

  memset(g_handle, 0xab, sizeof(g_handle));
  dev.type = 2;
  dev.id = 1;
  dev.uuid.data = g_uuid;
  dev.uuid.len = sizeof(g_uuid);
  lay.device = &dev;
  lay.dtype_code = 2;
  lay.dtype_bits = 32;
  lay.dtype_lanes = 1;
  lay.n_shape = 3;
  lay.shape = g_shape;
  lay.n_strides = 3;
  lay.strides = g_strides;
  lay.byte_offset = 4096;
  lay.flags = 1;

  r.request_id = 1;
  hello.protocol_version = 1;
  hello.client_name = "fuzz";
  hello.stream_contract = 3;
  hello.memory_kinds = 6;
  hello.library_version = "0.1.0";
  hello.prefetch = 1;
  hello.says_goodbye = 1;
  hello.n_channels = 2;
  hello.channels = chans;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
  r.hello = &hello;
  save_req("hello", &r);

  br.kind = 1;
  br.size = 65536;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  r.buffer_register = &br;
  save_req("buffer_register_host", &r);
  br.kind = 2;
  br.device = &dev;
  br.cuda_ipc_handle.data = g_handle;
  br.cuda_ipc_handle.len = sizeof(g_handle);
  br.consumers_may_write = 1;
  save_req("buffer_register_cuda", &r);

  bu.buffer_id = 3;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_UNREGISTER;
  r.buffer_unregister = &bu;
  save_req("buffer_unregister", &r);

  er.cuda_ipc_event_handle.data = g_handle;
  er.cuda_ipc_event_handle.len = sizeof(g_handle);
  er.device = &dev;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_EVENT_REGISTER;
  r.event_register = &er;
  save_req("event_register", &r);

  eu.event_id = 7;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_EVENT_UNREGISTER;
  r.event_unregister = &eu;
  save_req("event_unregister", &r);

  pub.channel = "camera0/frames";
  pub.buffer_id = 3;
  pub.layout = &lay;
  pub.ready_event_id = 9;
  pub.metadata.data = meta;
  pub.metadata.len = sizeof(meta);
  pub.history_depth = 3;
  pub.ready_complete = 1;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_PUBLISH;
  r.publish = &pub;
  save_req("publish", &r);

  /* the fast decoder's own: every field of Acquire and Release */
  acq.channel = "c";
  acq.mode = 1;
  acq.version = 41;
  acq.timeout_ms = -1;
  acq.implicit_stream = 1;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  r.acquire = &acq;
  save_req("acquire_next", &r);
  acq.mode = 0;
  acq.version = 0;
  acq.timeout_ms = 0;
  acq.implicit_stream = 0;
  acq.release_lease_id = 12;
  acq.release_done_event_id = 13;
  acq.release_implicit_stream = 1;
  save_req("acquire_release", &r);
  acq.mode = 2;
  acq.version = UINT64_MAX;
  acq.timeout_ms = INT64_MAX;
  acq.channel = "a/b/c.d-e_f";
  save_req("acquire_exact_extremes", &r);

  rel.lease_id = 5;
  rel.done_event_id = 6;
  rel.want_reply = 1;
  rel.implicit_stream = 1;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_RELEASE;
  r.release = &rel;
  save_req("release_reply", &r);
  rel.want_reply = 0;
  rel.done_event_id = 0;
  r.request_id = 0;
  save_req("release_oneway", &r);
  r.request_id = 2;

  sub.channel = "a/b";
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_SUBSCRIBE;
  r.subscribe = &sub;
  save_req("subscribe", &r);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_UNSUBSCRIBE;
  r.unsubscribe = (Tensorbroker__V1__Unsubscribe *)&sub; /* same layout */
  {
    Tensorbroker__V1__Unsubscribe un = TENSORBROKER__V1__UNSUBSCRIBE__INIT;
    un.channel = "a/b";
    r.unsubscribe = &un;
    save_req("unsubscribe", &r);
  }
  lc.after = "m";
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_CHANNELS;
  r.list_channels = &lc;
  save_req("list_channels", &r);
  ls.after_session_id = 2;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_SESSIONS;
  r.list_sessions = &ls;
  save_req("list_sessions", &r);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
  r.status = &st;
  save_req("status", &r);
  fg.buffer_id = 12;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_FORGET;
  r.forget = &fg;
  save_req("forget", &r);
  wf.channel = "x";
  wf.version = 2;
  wf.timeout_ms = 100;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_WAIT_FREE;
  r.wait_free = &wf;
  save_req("wait_free", &r);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_GOODBYE;
  r.goodbye = &gb;
  save_req("goodbye", &r);
  mt.offset = 4096;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_METRICS;
  r.metrics = &mt;
  save_req("metrics_page", &r);
  ll.after_lease_id = 3;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_LEASES;
  r.list_leases = &ll;
  save_req("list_leases", &r);
  lw.after_session_id = 2;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_WAITS;
  r.list_waits = &lw;
  save_req("list_waits", &r);
  dc.channel = "cam/0";
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_DROP_CHANNEL;
  r.drop_channel = &dc;
  save_req("drop_channel", &r);
  lb.after_buffer_id = UINT64_MAX;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_BUFFERS;
  r.list_buffers = &lb;
  save_req("list_buffers", &r);
  cn.request_id = 41;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_CANCEL;
  r.cancel = &cn;
  save_req("cancel", &r);

  /* forms only protobuf-c takes, or nobody */
  {
    /* Acquire{channel "c"} with an unknown field 99 inside */
    static const uint8_t unknown[] = {0x08, 0x01, 0x82, 0x01, 0x07, 0x0a, 0x01,
                                      0x63, 0x98, 0x06, 0x01};
    /* Release with lease_id twice (protobuf-c: the last wins) */
    static const uint8_t twice[] = {0x08, 0x01, 0x8a, 0x01, 0x04,
                                    0x08, 0x05, 0x08, 0x06};
    /* Publish whose layout's shape is not packed */
    static const uint8_t unpacked[] = {0x08, 0x01, 0xfa, 0x00, 0x09, 0x0a, 0x01,
                                       0x61, 0x1a, 0x04, 0x28, 0x02, 0x28, 0x03};
    /* an 11-byte varint, a truncated body, no body at all */
    static const uint8_t longvar[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                      0xff, 0xff, 0xff, 0xff, 0x01};
    static const uint8_t cut[] = {0x08, 0x01, 0x82, 0x01, 0x09, 0x0a, 0x05, 0x61};
    static const uint8_t nobody[] = {0x08, 0x2a};
    /* field 17's length written in nine bytes: protobuf-c reads at most
     * five (found by fuzz_request, the fast decoder took it) */
    static const uint8_t longlen[] = {0x8a, 0x01, 0x80, 0x80, 0x80, 0x80,
                                      0x80, 0x80, 0x80, 0x80, 0x00};
    save("request", "x_unknown_field", unknown, sizeof(unknown));
    save("request", "x_long_length", longlen, sizeof(longlen));
    save("request", "x_field_twice", twice, sizeof(twice));
    save("request", "x_unpacked_shape", unpacked, sizeof(unpacked));
    save("request", "x_long_varint", longvar, sizeof(longvar));
    save("request", "x_truncated", cut, sizeof(cut));
    save("request", "x_no_body", nobody, sizeof(nobody));
  }
}

/* ---- server messages ---- */

static void save_srv(const char *name, tb__server_message *m) {
  uint8_t b[4096];
  long n = tb__server_message_encode(m, b, sizeof(b));

  if (n <= 0) {
    fprintf(stderr, "gen_corpus: %s does not encode\n", name);
    exit(1);
  }
  save("server_message", name, b, (size_t)n);
}

static void server_messages(void) {
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;
  Tensorbroker__V1__Layout lay = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__BufferInfo bi = TENSORBROKER__V1__BUFFER_INFO__INIT;
  Tensorbroker__V1__EventInfo ei = TENSORBROKER__V1__EVENT_INFO__INIT;
  Tensorbroker__V1__AcquireReply ar = TENSORBROKER__V1__ACQUIRE_REPLY__INIT;
  Tensorbroker__V1__HelloReply hr = TENSORBROKER__V1__HELLO_REPLY__INIT;
  Tensorbroker__V1__NewVersion nv = TENSORBROKER__V1__NEW_VERSION__INIT;
  Tensorbroker__V1__NewVersion *nvp[1] = {&nv};
  Tensorbroker__V1__PublishReply pr = TENSORBROKER__V1__PUBLISH_REPLY__INIT;
  Tensorbroker__V1__BufferRegisterReply brr = TENSORBROKER__V1__BUFFER_REGISTER_REPLY__INIT;
  Tensorbroker__V1__ChannelInfo ci = TENSORBROKER__V1__CHANNEL_INFO__INIT;
  Tensorbroker__V1__ChannelInfo *cip[1] = {&ci};
  Tensorbroker__V1__ListChannelsReply lcr = TENSORBROKER__V1__LIST_CHANNELS_REPLY__INIT;
  Tensorbroker__V1__SessionInfo si = TENSORBROKER__V1__SESSION_INFO__INIT;
  Tensorbroker__V1__SessionInfo *sip[1] = {&si};
  Tensorbroker__V1__ListSessionsReply lsr = TENSORBROKER__V1__LIST_SESSIONS_REPLY__INIT;
  Tensorbroker__V1__StatusReply sr = TENSORBROKER__V1__STATUS_REPLY__INIT;
  Tensorbroker__V1__EventInfo *eip[1] = {&ei};
  Tensorbroker__V1__WaitFreeReply wfr = TENSORBROKER__V1__WAIT_FREE_REPLY__INIT;
  Tensorbroker__V1__VersionFree vf = TENSORBROKER__V1__VERSION_FREE__INIT;
  Tensorbroker__V1__BufferRetired bret = TENSORBROKER__V1__BUFFER_RETIRED__INIT;
  Tensorbroker__V1__ChannelClosed cc = TENSORBROKER__V1__CHANNEL_CLOSED__INIT;
  Tensorbroker__V1__DaemonClosing dc = TENSORBROKER__V1__DAEMON_CLOSING__INIT;
  Tensorbroker__V1__Notice no = TENSORBROKER__V1__NOTICE__INIT;
  Tensorbroker__V1__Reply rep = TENSORBROKER__V1__REPLY__INIT;
  tb__server_message m = TENSORBROKER__V1__SERVER_MESSAGE__INIT;
  uint8_t meta[3] = {7, 8, 9};

  dev.type = 2;
  dev.uuid.data = g_uuid;
  dev.uuid.len = sizeof(g_uuid);
  lay.device = &dev;
  lay.dtype_code = 2;
  lay.dtype_bits = 32;
  lay.dtype_lanes = 1;
  lay.n_shape = 3;
  lay.shape = g_shape;
  lay.byte_offset = 64;
  bi.buffer_id = 4;
  bi.generation = 1;
  bi.kind = 2;
  bi.size = 1 << 20;
  bi.device = &dev;
  bi.cuda_ipc_handle.data = g_handle;
  bi.cuda_ipc_handle.len = sizeof(g_handle);
  bi.writable = 1;
  bi.fd_attached = 1;
  bi.producer_pid = 4242;
  ei.event_id = 9;
  ei.cuda_ipc_event_handle.data = g_handle;
  ei.cuda_ipc_event_handle.len = sizeof(g_handle);
  ei.device = &dev;
  ei.owner_pid = 4242;
  ei.complete = 1;

  m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY;
  m.reply = &rep;
  rep.request_id = 17;
  rep.status = -12;
  rep.message = "bad name";
  save_srv("error_reply", &m);
  rep.status = 0;
  rep.message = "";

  /* the fast decoder's own: acquire replies */
  ar.lease_id = 77;
  ar.version = 5;
  ar.layout = &lay;
  ar.buffer = &bi;
  ar.ready_event = &ei;
  ar.metadata.data = meta;
  ar.metadata.len = sizeof(meta);
  ar.channel = "cam/0";
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_ACQUIRE;
  rep.acquire = &ar;
  save_srv("acquire_cuda", &m);
  ar.ready_event = NULL;
  bi.kind = 1;
  bi.device = NULL;
  bi.cuda_ipc_handle.len = 0;
  lay.device = NULL;
  save_srv("acquire_host", &m);
  ar.layout = NULL;
  ar.buffer = NULL;
  save_srv("acquire_bare", &m);

  hr.protocol_version = 1;
  hr.session_id = 99;
  hr.daemon_version = "0.1.0";
  hr.max_message = 65536;
  hr.max_ndim = 32;
  hr.features = 3;
  nv.channel = "cam/0";
  nv.version = 8;
  nv.buffer = &bi;
  nv.ready_event = &ei;
  hr.n_latest = 1;
  hr.latest = nvp;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_HELLO;
  rep.hello = &hr;
  save_srv("hello_reply", &m);

  brr.buffer_id = 4;
  brr.generation = 2;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_BUFFER_REGISTER;
  rep.buffer_register = &brr;
  save_srv("buffer_register_reply", &m);
  pr.version = 1234567890123ull;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_PUBLISH;
  rep.publish = &pr;
  save_srv("publish_reply", &m);

  ci.name = "cam/0";
  ci.latest_version = 3;
  ci.history_depth = 2;
  ci.leases = 1;
  ci.closed = 1;
  lcr.n_channels = 1;
  lcr.channels = cip;
  lcr.more = 1;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_LIST_CHANNELS;
  rep.list_channels = &lcr;
  save_srv("list_channels_reply", &m);
  si.session_id = 3;
  si.pid = 100;
  si.name = "tbctl";
  si.requests = 9;
  lsr.n_sessions = 1;
  lsr.sessions = sip;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_LIST_SESSIONS;
  rep.list_sessions = &lsr;
  save_srv("list_sessions_reply", &m);
  sr.daemon_version = "0.1.0";
  sr.pid = 1;
  sr.sessions = 2;
  sr.socket_path = "/run/tb.sock";
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_STATUS_INFO;
  rep.status_info = &sr;
  save_srv("status_reply", &m);
  wfr.version = 4;
  wfr.n_done_events = 1;
  wfr.done_events = eip;
  rep.body_case = TENSORBROKER__V1__REPLY__BODY_WAIT_FREE;
  rep.wait_free = &wfr;
  save_srv("wait_free_reply", &m);

  m.body_case = TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE;
  m.notice = &no;
  no.body_case = TENSORBROKER__V1__NOTICE__BODY_NEW_VERSION;
  no.new_version = &nv;
  save_srv("new_version_prefetch", &m);
  nv.buffer = NULL;
  nv.ready_event = NULL;
  save_srv("new_version", &m);
  vf.channel = "cam/0";
  vf.version = 2;
  vf.buffer_id = 4;
  vf.n_done_events = 1;
  vf.done_events = eip;
  no.body_case = TENSORBROKER__V1__NOTICE__BODY_VERSION_FREE;
  no.version_free = &vf;
  save_srv("version_free", &m);
  bret.buffer_id = 4;
  bret.generation = 1;
  no.body_case = TENSORBROKER__V1__NOTICE__BODY_BUFFER_RETIRED;
  no.buffer_retired = &bret;
  save_srv("buffer_retired", &m);
  cc.channel = "cam/0";
  cc.reason = "publisher ended without closing its session";
  cc.unfinished_version = 3;
  no.body_case = TENSORBROKER__V1__NOTICE__BODY_CHANNEL_CLOSED;
  no.channel_closed = &cc;
  save_srv("channel_closed", &m);
  dc.reason = "SIGTERM";
  no.body_case = TENSORBROKER__V1__NOTICE__BODY_DAEMON_CLOSING;
  no.daemon_closing = &dc;
  save_srv("daemon_closing", &m);
  {
    Tensorbroker__V1__EventsGone eg = TENSORBROKER__V1__EVENTS_GONE__INIT;
    uint64_t ids[2] = {5, 6};
    eg.session_id = 9;
    eg.n_event_ids = 2;
    eg.event_ids = ids;
    no.body_case = TENSORBROKER__V1__NOTICE__BODY_EVENTS_GONE;
    no.events_gone = &eg;
    save_srv("events_gone", &m);
  }
  {
    /* reply{acquire{}} with an unknown field, and a notice with no body */
    static const uint8_t unknown[] = {0x0a, 0x06, 0x72, 0x02, 0x08, 0x01,
                                      0x98, 0x06};
    static const uint8_t empty_notice[] = {0x12, 0x00};
    /* reply{acquire{}} with the acquire's length written in six bytes */
    static const uint8_t longlen[] = {0x0a, 0x07, 0x72, 0x80, 0x80,
                                      0x80, 0x80, 0x80, 0x00};
    save("server_message", "x_unknown_field", unknown, sizeof(unknown));
    save("server_message", "x_long_length", longlen, sizeof(longlen));
    save("server_message", "x_empty_notice", empty_notice,
         sizeof(empty_notice));
  }
}

/* ---- layouts (fuzz_layout.c's format) ---- */

struct lay {
  unsigned ndim, mode, code, bits, lanes, max_ndim;
  uint64_t offset, size;
  unsigned flags;
  uint8_t dims[16], strides[16];
  unsigned nstrides; /* for mode 3 */
};

static void save_layout(const char *name, const struct lay *l) {
  struct buf o = {{0}, 0};

  u8(&o, l->ndim);
  u8(&o, l->mode);
  u8(&o, l->code);
  u8(&o, l->bits);
  if (l->mode & 0x04)
    u32(&o, l->lanes);
  else
    u8(&o, l->lanes);
  if (l->mode & 0x08)
    u32(&o, l->max_ndim);
  else
    u8(&o, l->max_ndim);
  if (l->mode & 0x10)
    u64(&o, l->offset);
  else
    u16(&o, (unsigned)l->offset);
  if (l->mode & 0x20)
    u64(&o, l->size);
  else
    u32(&o, (uint32_t)l->size);
  if (l->mode & 0x40)
    u64(&o, l->flags);
  else
    u8(&o, l->flags);
  for (unsigned i = 0; i < l->ndim; i++)
    u8(&o, l->dims[i]);
  if ((l->mode & 3) == 3)
    u8(&o, l->nstrides);
  for (unsigned i = 0; i < ((l->mode & 3) == 3 ? l->nstrides
                            : (l->mode & 3) ? l->ndim
                                            : 0);
       i++)
    u8(&o, l->strides[i]);
  u8(&o, 64); /* reason buffer */
  save("layout", name, o.b, o.n);
}

/* dimension bytes: value + 8 (fuzz_layout.c's dim_value) */
#define D(v) ((uint8_t)((v) + 8))

static void layouts(void) {
  struct lay l;

#define BASE(nd, md)                                                         \
  memset(&l, 0, sizeof(l));                                                  \
  l.ndim = nd;                                                               \
  l.mode = md;                                                               \
  l.code = 2;                                                                \
  l.bits = 32;                                                               \
  l.lanes = 1;                                                               \
  l.max_ndim = 32;                                                           \
  l.size = 1 << 20

  BASE(3, 0);
  l.dims[0] = D(2), l.dims[1] = D(3), l.dims[2] = D(4);
  save_layout("f32_compact", &l);
  BASE(3, 1);
  l.dims[0] = D(2), l.dims[1] = D(3), l.dims[2] = D(4);
  l.strides[0] = D(12), l.strides[1] = D(4), l.strides[2] = D(1);
  save_layout("f32_strided", &l);
  BASE(2, 1);
  l.dims[0] = D(4), l.dims[1] = D(5);
  l.strides[0] = D(-5), l.strides[1] = D(1);
  l.offset = 4 * 15;
  save_layout("negative_stride_offset", &l);
  BASE(2, 1);
  l.dims[0] = D(4), l.dims[1] = D(5);
  l.strides[0] = D(-5), l.strides[1] = D(1);
  save_layout("negative_stride_before_buffer", &l);
  BASE(2, 1);
  l.dims[0] = D(3), l.dims[1] = D(3);
  l.strides[0] = D(0), l.strides[1] = D(0);
  save_layout("broadcast_zero_strides", &l);
  BASE(0, 0);
  save_layout("scalar", &l);
  BASE(2, 0);
  l.dims[0] = D(0), l.dims[1] = D(200);
  save_layout("zero_extent", &l);
  BASE(2, 0);
  l.code = 17, l.bits = 4;
  l.dims[0] = D(3), l.dims[1] = D(5);
  save_layout("float4_packed", &l);
  BASE(2, 1);
  l.code = 17, l.bits = 4;
  l.dims[0] = D(3), l.dims[1] = D(5);
  l.strides[0] = D(5), l.strides[1] = D(1);
  save_layout("float4_packed_strided", &l);
  BASE(2, 1);
  l.code = 17, l.bits = 4;
  l.dims[0] = D(3), l.dims[1] = D(5);
  l.strides[0] = D(6), l.strides[1] = D(1);
  save_layout("float4_not_compact", &l);
  BASE(2, 1);
  l.code = 17, l.bits = 4, l.flags = 4;
  l.dims[0] = D(3), l.dims[1] = D(5);
  l.strides[0] = D(6), l.strides[1] = D(1);
  save_layout("float4_padded", &l);
  BASE(1, 0);
  l.code = 6, l.bits = 8;
  l.dims[0] = D(100);
  save_layout("bool", &l);
  BASE(1, 0);
  l.code = 5, l.bits = 64, l.lanes = 2;
  l.dims[0] = D(10);
  save_layout("complex_lanes", &l);
  BASE(1, 0);
  l.code = 3, l.bits = 64;
  l.dims[0] = D(1);
  save_layout("opaque_refused", &l);
  BASE(1, 0);
  l.lanes = 0;
  l.dims[0] = D(1);
  save_layout("zero_lanes", &l);
  BASE(1, 0x04);
  l.code = 1, l.bits = 8, l.lanes = 65535;
  l.dims[0] = D(2);
  save_layout("many_lanes", &l);
  BASE(4, 0);
  l.max_ndim = 3;
  l.dims[0] = l.dims[1] = l.dims[2] = l.dims[3] = D(1);
  save_layout("over_max_ndim", &l);
  BASE(2, 3);
  l.dims[0] = D(2), l.dims[1] = D(2);
  l.nstrides = 1;
  l.strides[0] = D(1);
  save_layout("wrong_stride_count", &l);
  BASE(2, 0);
  l.dims[0] = 0xf0, l.dims[1] = D(2);
  save_layout("huge_dims_overflow", &l);
  BASE(2, 1);
  l.dims[0] = D(2), l.dims[1] = D(2);
  l.strides[0] = 0xf1, l.strides[1] = D(1);
  save_layout("int64_min_stride", &l);
  BASE(1, 0x30);
  l.code = 1, l.bits = 8;
  l.dims[0] = D(16);
  l.offset = UINT64_MAX - 8;
  l.size = UINT64_MAX;
  save_layout("offset_past_int64", &l);
  BASE(1, 0x20);
  l.code = 1, l.bits = 8;
  l.dims[0] = 0xf3;
  l.size = (uint64_t)1 << 32;
  save_layout("exactly_fills_4g", &l);
  BASE(1, 0);
  l.dims[0] = D(-1);
  save_layout("negative_dim", &l);
  BASE(3, 2);
  l.code = 0, l.bits = 16;
  l.dims[0] = D(5), l.dims[1] = D(1), l.dims[2] = D(7);
  l.strides[0] = D(7), l.strides[1] = D(-100), l.strides[2] = D(1);
  l.offset = 2;
  save_layout("unit_dim_any_stride", &l);
  BASE(1, 0);
  l.dims[0] = D(200);
  l.size = 800;
  save_layout("exact_fit", &l);
  l.size = 799;
  save_layout("one_byte_short", &l);
}

/* ---- daemon op sequences (fuzz_daemon.c's format) ---- */

enum {
  K_HELLO, K_BREG, K_BUNREG, K_EREG, K_EUNREG, K_PUBLISH, K_ACQUIRE,
  K_RELEASE, K_SUB, K_UNSUB, K_LCHAN, K_LSESS, K_STATUS, K_FORGET,
  K_WAITFREE, K_GOODBYE, K_METRICS, K_LLEASES, K_LWAITS, K_DROP, K_LBUFS,
  K_CANCEL, K_UNKNOWN /* fuzz_daemon.c's request kinds, in its order */
};

static uint8_t next_id = 1;

/* A structured request from session k: op, uid byte, kind, request id. */
static void req(struct buf *o, int k, int kind) {
  u8(o, (unsigned)(k << 4) | 4);
  u8(o, 0); /* uid 1000 */
  u8(o, (unsigned)kind);
  u8(o, next_id++);
}

static void hello(struct buf *o, int k) {
  req(o, k, K_HELLO);
  u8(o, 0x10); /* says goodbye, contract spec */
  u8(o, 0);    /* no channels */
}

/* a host buffer of 4096 bytes with a memfd sealed for read-only use */
static void host_buffer(struct buf *o, int k) {
  req(o, k, K_BREG);
  u8(o, 0x00);
  u8(o, 0x5c); /* handle byte */
  u8(o, 1);    /* one descriptor */
  u8(o, 0x07); /* memfd of the registered size: shrink, grow, future write */
}

static void cuda_buffer(struct buf *o, int k) {
  req(o, k, K_BREG);
  u8(o, 0x09); /* CUDA IPC, with a device */
  u8(o, 0x09); /* device: CUDA, 16-byte uuid */
  u8(o, 0xab);
  u8(o, 0);
}

static void event(struct buf *o, int k) {
  req(o, k, K_EREG);
  u8(o, 0x02); /* 64-byte handle, a device */
  u8(o, 0x09);
}

/* float32[16] on channel name index ch in the n-th buffer handed out; a
 * ready event makes it a CUDA tensor (the buffer must be cuda_buffer's) */
static void publish(struct buf *o, int k, int ch, int buf, int with_event) {
  req(o, k, K_PUBLISH);
  u8(o, with_event ? 0x51 : 0x41); /* one dimension, a device */
  u8(o, (unsigned)ch);
  u8(o, (unsigned)buf);
  u8(o, with_event ? 0x09 : 0x00); /* CUDA as cuda_buffer's, or the CPU */
  u8(o, 0);  /* float32 */
  u8(o, 18); /* shape: 16 (fuzz_daemon.c subtracts 2) */
  u8(o, 0);     /* flags */
  if (with_event)
    u8(o, 0);
  u8(o, 4); /* metadata bytes */
  u8(o, 2); /* history depth */
  u8(o, 0);
}

/* mode 0 latest, 1 next (after the newest version seen); timeout: -1
 * forever, 0 none, else milliseconds */
static void acquire(struct buf *o, int k, int ch, int mode, int timeout,
                    int release_lease) {
  unsigned b = (unsigned)mode;

  if (mode == 1)
    b |= 0x04;
  if (timeout < 0)
    b |= 0x08;
  else if (timeout == 0)
    b |= 0x10;
  if (release_lease >= 0)
    b |= 0x40;
  req(o, k, K_ACQUIRE);
  u8(o, b);
  u8(o, (unsigned)ch);
  if (mode == 1)
    u8(o, 0xbf); /* a version handed out */
  if (timeout > 0)
    u16(o, (unsigned)timeout);
  if (release_lease >= 0) {
    u8(o, (unsigned)release_lease);
    u8(o, 0); /* no done event */
    u8(o, 0);
  }
}

static void release(struct buf *o, int k, int lease, int reply) {
  req(o, k, K_RELEASE);
  u8(o, reply ? 0x02 : 0x00);
  u8(o, (unsigned)lease);
}

static void simple(struct buf *o, int k, int kind, int arg) {
  req(o, k, kind);
  if (arg >= 0)
    u8(o, (unsigned)arg);
}

static void clock_ms(struct buf *o, unsigned ms) {
  u8(o, 3);
  u16(o, ms);
}

static void close_session(struct buf *o, int k, int hung_up) {
  u8(o, (unsigned)(k << 4) | 1);
  u8(o, (unsigned)hung_up);
}

static void raw(struct buf *o, int k, const void *p, size_t n) {
  u8(o, (unsigned)(k << 4) | 2);
  u8(o, 0);
  u16(o, (unsigned)n);
  put(o, p, n);
  u8(o, 0); /* no descriptors */
}

static void daemon_seeds(void) {
  struct buf o;

#define START memset(&o, 0, sizeof(o))
#define SAVE(name) save("daemon", name, o.b, o.n)

  START;
  hello(&o, 0);
  simple(&o, 0, K_STATUS, -1);
  SAVE("hello_status");

  START;
  hello(&o, 0);
  host_buffer(&o, 0);
  publish(&o, 0, 0, 0, 0);
  hello(&o, 1);
  acquire(&o, 1, 0, 0, 0, -1);
  release(&o, 1, 0, 1);
  simple(&o, 0, K_WAITFREE, 0x02);
  u8(&o, 0);
  u8(&o, 0);
  SAVE("publish_acquire_release");

  START;
  hello(&o, 0);
  hello(&o, 1);
  simple(&o, 1, K_SUB, 0);
  acquire(&o, 1, 0, 0, -1, -1); /* parks: nothing published yet */
  host_buffer(&o, 0);
  publish(&o, 0, 0, 0, 0);
  publish(&o, 0, 0, 0, 0);
  acquire(&o, 1, 0, 1, 500, 0);
  publish(&o, 0, 0, 0, 0);
  close_session(&o, 0, 1); /* the producer dies */
  acquire(&o, 1, 0, 0, 0, 1);
  SAVE("subscriber_parked_then_producer_dies");

  START;
  hello(&o, 0);
  acquire(&o, 0, 1, 0, 200, -1);
  clock_ms(&o, 100);
  clock_ms(&o, 150);
  simple(&o, 0, K_LCHAN, 0);
  SAVE("acquire_times_out");

  START;
  hello(&o, 0);
  cuda_buffer(&o, 0);
  event(&o, 0);
  publish(&o, 0, 2, 0, 1);
  hello(&o, 1);
  event(&o, 1);
  acquire(&o, 1, 2, 0, 0, -1);
  req(&o, 1, K_RELEASE);
  u8(&o, 0x03); /* with a done event, want a reply */
  u8(&o, 0);
  u8(&o, 1);
  req(&o, 0, K_WAITFREE);
  u8(&o, 0x00);
  u8(&o, 2);
  u8(&o, 0);
  u16(&o, 1000);
  close_session(&o, 0, 1);
  SAVE("cuda_publish_events_waitfree");

  START;
  hello(&o, 0);
  host_buffer(&o, 0);
  publish(&o, 0, 0, 0, 0);
  hello(&o, 1);
  acquire(&o, 1, 0, 0, 0, -1);
  close_session(&o, 0, 0);
  acquire(&o, 1, 0, 0, 0, 0);
  simple(&o, 1, K_LSESS, 0);
  SAVE("lease_outlives_producer");

  {
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x07, 0x00, 0x13};
    START;
    hello(&o, 0);
    raw(&o, 0, junk, sizeof(junk));
    hello(&o, 1);
    simple(&o, 1, K_STATUS, -1);
    SAVE("garbage_datagram");
  }

  START;
  simple(&o, 0, K_STATUS, -1); /* before Hello */
  hello(&o, 1);
  hello(&o, 1); /* twice */
  SAVE("protocol_errors");

  START;
  hello(&o, 0);
  hello(&o, 1);
  hello(&o, 2);
  hello(&o, 3); /* over --max-sessions */
  simple(&o, 0, K_LSESS, 0);
  SAVE("too_many_sessions");

  START;
  hello(&o, 0);
  for (int i = 0; i < 6; i++)
    host_buffer(&o, 0);
  simple(&o, 0, K_BUNREG, 0);
  simple(&o, 0, K_FORGET, 1);
  SAVE("buffer_limit_unregister");

  START;
  hello(&o, 0);
  host_buffer(&o, 0);
  u8(&o, 5);
  u8(&o, 3); /* the 4th allocation from now fails */
  publish(&o, 0, 0, 0, 0);
  publish(&o, 0, 0, 0, 0);
  hello(&o, 1);
  acquire(&o, 1, 0, 0, 0, -1);
  SAVE("allocation_fails");

  START;
  hello(&o, 0);
  host_buffer(&o, 0);
  publish(&o, 0, 0, 0, 0);
  simple(&o, 0, K_GOODBYE, -1);
  close_session(&o, 0, 1);
  hello(&o, 1);
  host_buffer(&o, 1);
  publish(&o, 1, 0, 1, 0); /* takes the channel over */
  SAVE("goodbye_then_new_producer");

  START;
  hello(&o, 0);
  simple(&o, 0, K_SUB, 0);
  simple(&o, 0, K_SUB, 1);
  simple(&o, 0, K_SUB, 5); /* bad name */
  simple(&o, 0, K_UNSUB, 1);
  simple(&o, 0, K_UNKNOWN, -1);
  SAVE("subscriptions_unknown_body");

  START;
  hello(&o, 0);
  req(&o, 0, K_BREG);
  u8(&o, 0x00);
  u8(&o, 0);
  u8(&o, 1);
  u8(&o, 0x01); /* memfd sealed against shrinking only: refused */
  req(&o, 0, K_BREG);
  u8(&o, 0x00);
  u8(&o, 0);
  u8(&o, 1);
  u8(&o, 0xc0); /* a pipe */
  req(&o, 0, K_BREG);
  u8(&o, 0x04); /* consumers may write */
  u8(&o, 0);
  u8(&o, 1);
  u8(&o, 0x03);
  SAVE("memfd_seals");

  {
    uint8_t first, second;

    START;
    hello(&o, 0);
    hello(&o, 1);
    host_buffer(&o, 1);
    first = next_id;
    acquire(&o, 0, 1, 0, -1, -1); /* parks: nothing on channel b */
    second = next_id;
    acquire(&o, 0, 2, 0, 300, -1); /* parks beside it, on cam/0 */
    simple(&o, 0, K_CANCEL, first); /* dropped, the Cancel answered */
    publish(&o, 1, 1, 0, 0);        /* on b: answers nothing */
    simple(&o, 0, K_CANCEL, first); /* answered already: nothing */
    simple(&o, 0, K_CANCEL, 0xee);  /* never sent */
    simple(&o, 0, K_LWAITS, 0);
    publish(&o, 1, 2, 0, 0);         /* answers the second acquire */
    simple(&o, 0, K_CANCEL, second); /* after its answer */
    acquire(&o, 0, 1, 1, 300, -1); /* the next version of b: parks */
    req(&o, 1, K_WAITFREE); /* parks: session 0 holds the version */
    u8(&o, 0x01);           /* forever */
    u8(&o, 2);
    u8(&o, 0);
    clock_ms(&o, 500); /* the acquire times out */
    close_session(&o, 1, 1); /* with its WaitFree parked */
    SAVE("acquire_cancelled");
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gen_corpus DIR\n");
    return 2;
  }
  outdir = argv[1];
  if (mkdir(outdir, 0755) < 0 && errno != EEXIST) {
    perror(outdir);
    return 1;
  }
  requests();
  server_messages();
  layouts();
  daemon_seeds();
  return 0;
}
