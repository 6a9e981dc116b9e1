/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the daemon's request handling, in-process. A registry
 * (daemon/registry.h, sans-I/O) with up to four sessions is driven as the
 * server drives it (daemon/server.c, conn_read): each datagram decoded with
 * tb__request_decode_in, handed to tbd_session_request with its
 * descriptors (real memfds, pipes), and a session whose request fails with
 * a protocol error muted and closed. No socket, no loop: emitted messages
 * come back through the emit callback, time is a fake clock.
 *
 * The input is a sequence of operations, each a byte (low nibble: what;
 * high nibble: which session) and its arguments (gen_corpus.c writes
 * them):
 *   0 open session: its uid   1 close it: hung up or dropped
 *   2 raw datagram: uid (when the session opens here), length, bytes,
 *     descriptors
 *   3 clock: advance, expire parked waits
 *   4.. structured request: uid, a body kind and its fields, from tables
 *     and the ids the daemon handed out (buffers, events, leases,
 *     versions), encoded with the codec: reaches deep states quickly
 *   5 fail the Nth allocation from now (daemon/alloc.h)
 * Checks: every message the daemon emits encodes within --max-message and
 * decodes (the client could read it), with valid descriptors, and never to
 * a muted session; no reply answers a request after its Cancel was
 * answered; after every session has closed no lease, subscription, wait,
 * event or session is left and no more buffers than versions kept; after
 * the registry is freed, no descriptor is left open. ASan and UBSan check the rest. */
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <tensorbroker/errors.h>

#include "alloc.h"
#include "config.h"
#include "fd_count.h"
#include "fuzz.h"
#include "log.h"
#include "registry.h"
#include "tb_proto.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

#define NSESS 4
#define NIDS 8
#define UUID_CAP 20 /* uuids of 0..19 bytes: 16 is the valid length */
enum { ID_BUFFER, ID_EVENT, ID_LEASE, ID_VERSION, ID_KINDS };

static struct {
  struct tbd_registry *r;
  struct tbd_session *s[NSESS];
  bool muted[NSESS];
  bool doomed[NSESS];
  /* request ids (one byte here) whose Cancel was answered: a reply to one
   * of them would break protocol.md's promise; cleared when the id is
   * used again. Not 0: the id of one-way messages, and of the answer to a
   * datagram that does not decode */
  bool cancelled[NSESS][256];
  uint64_t now;
  uint64_t ids[ID_KINDS][NIDS];
  unsigned nids[ID_KINDS];
  struct tbd_limits lim;
  uint8_t *tx, *rx;
  struct tb__arena arena;
  bool verbose;
} fz;

static const char *const names[] = {
    "a", "b", "cam/0", "a/b/c", "x.y-z_1", "", "..", "/lead", "trail/",
    "sp ace", "a//b", "./a",
};

static void remember(int kind, uint64_t id) {
  fz.ids[kind][fz.nids[kind] % NIDS] = id;
  fz.nids[kind]++;
}

/* An id: mostly one the daemon handed out, else a small or extreme one. */
static uint64_t pick_id(struct tbf_in *in, int kind) {
  uint8_t b = tbf_u8(in);
  unsigned n = fz.nids[kind] < NIDS ? fz.nids[kind] : NIDS;

  if (b < 0xc0 && n > 0)
    return fz.ids[kind][b % n];
  if (b == 0xff)
    return UINT64_MAX;
  return b & 0x0f;
}

static char *pick_name(struct tbf_in *in) {
  static char longname[300];
  uint8_t b = tbf_u8(in);

  if (b >= 0xf0) { /* 254..257 bytes: around --max-name */
    size_t n = 254 + (b & 3);
    memset(longname, 'n', n);
    longname[n] = '\0';
    return longname;
  }
  return (char *)names[b % (sizeof(names) / sizeof(names[0]))];
}

static int session_index(struct tbd_session *s) {
  uintptr_t k = (uintptr_t)tbd_session_conn(s);

  TBF_CHECK(k >= 1 && k <= NSESS && fz.s[k - 1] == s);
  return (int)(k - 1);
}

static void emit(void *ud, struct tbd_session *s, const tb__server_message *m,
                 const int *fds, int nfds) {
  int k = session_index(s);
  tb__server_message *back = NULL;
  long len;

  (void)ud;
  if (fz.muted[k])
    tbf_fail("a message for session %d after it was muted", k);
  TBF_CHECK(nfds >= 0 && nfds <= TB__MAX_FDS);
  for (int i = 0; i < nfds; i++)
    if (fcntl(fds[i], F_GETFD) < 0)
      tbf_fail("emitted descriptor %d is not open", fds[i]);
  len = tb__server_message_encode(m, fz.tx, TB__MAX_MESSAGE_HARD);
  if (len <= 0)
    tbf_fail("an emitted message does not encode (%ld)", len);
  if ((unsigned long)len > fz.lim.max_message)
    tbf_fail("an emitted message of %ld bytes exceeds --max-message %u", len,
             fz.lim.max_message);
  if (tb__server_message_decode(fz.tx, (size_t)len, &back) != 0)
    tbf_fail("an emitted message of %ld bytes does not decode", len);
  if (fz.verbose) /* TBF_VERBOSE=1: what each session is told */
    fprintf(stderr, "  -> session %d: %s %d status %d %s\n", k,
            back->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY
                ? "reply"
                : "notice",
            back->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY
                ? (int)back->reply->body_case
                : (int)back->notice->body_case,
            back->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY
                ? back->reply->status
                : 0,
            back->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY
                ? back->reply->message
                : "");
  if (back->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY &&
      back->reply->request_id < 256 &&
      fz.cancelled[k][back->reply->request_id])
    tbf_fail("session %d: a reply to request %llu after its Cancel was "
             "answered", k, (unsigned long long)back->reply->request_id);
  if (back->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY &&
      back->reply->status == 0) {
    const Tensorbroker__V1__Reply *rep = back->reply;
    switch (rep->body_case) {
    case TENSORBROKER__V1__REPLY__BODY_BUFFER_REGISTER:
      remember(ID_BUFFER, rep->buffer_register->buffer_id);
      break;
    case TENSORBROKER__V1__REPLY__BODY_EVENT_REGISTER:
      remember(ID_EVENT, rep->event_register->event_id);
      break;
    case TENSORBROKER__V1__REPLY__BODY_ACQUIRE:
      remember(ID_LEASE, rep->acquire->lease_id);
      remember(ID_VERSION, rep->acquire->version);
      break;
    case TENSORBROKER__V1__REPLY__BODY_PUBLISH:
      remember(ID_VERSION, rep->publish->version);
      break;
    default:
      break;
    }
  }
  tb__server_message_free(back);
}

static uint64_t clock_now(void *ud) {
  (void)ud;
  return fz.now;
}

/* The server's reap: close the sessions doomed by the last request. */
static void reap(void) {
  for (int k = 0; k < NSESS; k++) {
    if (fz.doomed[k]) {
      tbd_session_close(fz.r, fz.s[k]);
      fz.s[k] = NULL;
      fz.doomed[k] = fz.muted[k] = false;
      memset(fz.cancelled[k], 0, sizeof(fz.cancelled[k]));
    }
  }
}

static void doom(int k) {
  tbd_session_mute(fz.s[k]);
  fz.muted[k] = true;
  fz.doomed[k] = true;
}

static void open_session(int k, uint8_t who) {
  if (fz.s[k] != NULL)
    return;
  if (tbd_session_open(fz.r, 1000 + k, (who & 1) ? 0 : 1000, 1000,
                       (void *)(uintptr_t)(k + 1), &fz.s[k]) < 0)
    fz.s[k] = NULL;
}

/* Descriptors to attach: memfds (sized and sealed as the input says),
 * pipes and /dev/null. */
static int make_fds(struct tbf_in *in, uint64_t size_hint, int *fds) {
  uint8_t spec = tbf_u8(in);
  int n = spec & 3;

  if (n == 3 && (spec & 4))
    n = TB__MAX_FDS;
  for (int i = 0; i < n; i++) {
    uint8_t how = tbf_u8(in);
    int fd = -1;

    if ((how & 0xc0) == 0xc0) {
      int p[2];
      if (pipe2(p, O_CLOEXEC) == 0) {
        close(p[1]);
        fd = p[0];
      }
    } else if ((how & 0xc0) == 0x80) {
      fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    } else {
      static const uint64_t sizes[] = {0, 1, 4096, 65536};
      uint64_t sz = (how & 0x20) ? sizes[(how >> 3) & 3] : size_hint;
      int seals = 0;
      fd = memfd_create("fz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (fd >= 0 && sz <= (1u << 20) && ftruncate(fd, (off_t)sz) < 0) {
        close(fd);
        fd = -1;
      }
      if (how & 1)
        seals |= F_SEAL_SHRINK;
      if (how & 2)
        seals |= F_SEAL_GROW;
      if (how & 4)
        seals |= F_SEAL_FUTURE_WRITE;
      if ((how & 0x18) == 0x18)
        seals |= F_SEAL_WRITE;
      if (fd >= 0 && seals != 0)
        (void)fcntl(fd, F_ADD_SEALS, seals);
    }
    if (fd < 0) {
      while (i-- > 0)
        close(fds[i]);
      return 0;
    }
    fds[i] = fd;
  }
  return n;
}

/* One datagram from session k, as conn_read handles it. */
static void deliver(int k, const uint8_t *buf, size_t len, int *fds,
                    int nfds) {
  tb__request *req;
  int rc;

  if (len > fz.lim.max_message) {
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    tbd_session_protocol_error(fz.r, fz.s[k], 0, "datagram too large");
    doom(k);
    return;
  }
  if (len == 0 || tb__request_decode_in(&fz.arena, buf, len, &req) < 0) {
    tb__arena_reset(&fz.arena);
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    if (len == 0)
      tbd_session_hung_up(fz.s[k]);
    else
      tbd_session_protocol_error(fz.r, fz.s[k], 0, "undecodable datagram");
    doom(k);
    return;
  }
  if (req->request_id < 256)
    fz.cancelled[k][req->request_id] = false;
  rc = tbd_session_request(fz.r, fz.s[k], req, fds, nfds);
  if (rc >= 0 && req->body_case == TENSORBROKER__V1__REQUEST__BODY_CANCEL &&
      req->cancel->request_id != 0 && req->cancel->request_id < 256 &&
      req->cancel->request_id != req->request_id)
    fz.cancelled[k][req->cancel->request_id] = true;
  tb__arena_reset(&fz.arena);
  if (rc < 0)
    doom(k);
}

static void fill_device(struct tbf_in *in, Tensorbroker__V1__Device *d,
                        uint8_t *uuid) {
  uint8_t b = tbf_u8(in);

  d->type = (b & 3) == 3 ? (int32_t)tbf_u32(in) : (b & 1) ? 2 : 1;
  d->id = (b & 4) ? (int32_t)tbf_u8(in) - 1 : 0;
  memset(uuid, b, UUID_CAP);
  d->uuid.data = uuid;
  d->uuid.len = (b & 8) ? TB__UUID_SIZE : (b & 16) ? b % 20 : 0;
}

/* A request built from the input's fields; encoded and delivered. */
static void structured(int k, struct tbf_in *in) {
  Tensorbroker__V1__Request q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Hello hello = TENSORBROKER__V1__HELLO__INIT;
  Tensorbroker__V1__BufferRegister br = TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  Tensorbroker__V1__BufferUnregister bu = TENSORBROKER__V1__BUFFER_UNREGISTER__INIT;
  Tensorbroker__V1__EventRegister er = TENSORBROKER__V1__EVENT_REGISTER__INIT;
  Tensorbroker__V1__EventUnregister eu = TENSORBROKER__V1__EVENT_UNREGISTER__INIT;
  Tensorbroker__V1__Publish pub = TENSORBROKER__V1__PUBLISH__INIT;
  Tensorbroker__V1__Layout lay = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;
  Tensorbroker__V1__Acquire acq = TENSORBROKER__V1__ACQUIRE__INIT;
  Tensorbroker__V1__Release rel = TENSORBROKER__V1__RELEASE__INIT;
  Tensorbroker__V1__Subscribe sub = TENSORBROKER__V1__SUBSCRIBE__INIT;
  Tensorbroker__V1__Unsubscribe unsub = TENSORBROKER__V1__UNSUBSCRIBE__INIT;
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
  static uint8_t handle[80], meta[128]; /* handles of 0..79 bytes */
  uint8_t uuid[UUID_CAP];
  char *chans[3];
  int64_t shape[4], strides[4];
  int fds[TB__MAX_FDS], nfds = 0;
  uint8_t kind = tbf_u8(in), b;
  long n;

  q.request_id = tbf_u8(in);
  switch (kind % 23) {
  case 0:
    b = tbf_u8(in);
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
    q.hello = &hello;
    hello.protocol_version = (b & 0x80) ? tbf_u8(in) : 1;
    hello.client_name = (b & 0x40) ? pick_name(in) : "fuzz";
    hello.stream_contract = (b & 0x20) ? (int)tbf_u8(in) - 1 : b & 3;
    hello.memory_kinds = (b & 4) ? 6 : 2;
    hello.prefetch = (b >> 3) & 1;
    hello.says_goodbye = (b >> 4) & 1;
    hello.n_channels = tbf_u8(in) % 4;
    for (size_t i = 0; i < hello.n_channels; i++)
      chans[i] = pick_name(in);
    hello.channels = chans;
    break;
  case 1:
    b = tbf_u8(in);
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
    q.buffer_register = &br;
    br.kind = (b & 3) == 3 ? (int)tbf_u8(in) : (b & 1) ? 2 : 1;
    br.size = (b & 0x80) ? tbf_u64(in) : 4096u << (b >> 4 & 3);
    br.consumers_may_write = (b >> 2) & 1;
    if (b & 8) {
      fill_device(in, &dev, uuid);
      br.device = &dev;
    }
    memset(handle, tbf_u8(in), sizeof(handle));
    br.cuda_ipc_handle.data = handle;
    br.cuda_ipc_handle.len = (b & 0x40) ? tbf_u8(in) % 80 : TB__CUDA_IPC_HANDLE_SIZE;
    nfds = make_fds(in, br.size, fds);
    break;
  case 2:
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_UNREGISTER;
    q.buffer_unregister = &bu;
    bu.buffer_id = pick_id(in, ID_BUFFER);
    break;
  case 3:
    b = tbf_u8(in);
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_EVENT_REGISTER;
    q.event_register = &er;
    memset(handle, b, sizeof(handle));
    er.cuda_ipc_event_handle.data = handle;
    er.cuda_ipc_event_handle.len = (b & 1) ? b % 80 : TB__CUDA_IPC_HANDLE_SIZE;
    if (b & 2) {
      fill_device(in, &dev, uuid);
      er.device = &dev;
    }
    break;
  case 4:
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_EVENT_UNREGISTER;
    q.event_unregister = &eu;
    eu.event_id = pick_id(in, ID_EVENT);
    break;
  case 5: {
    static const uint8_t dtypes[][3] = {
        {2, 32, 1}, {1, 8, 1}, {0, 64, 1}, {17, 4, 1}, {5, 64, 2}, {3, 64, 1}};
    b = tbf_u8(in);
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_PUBLISH;
    q.publish = &pub;
    pub.channel = pick_name(in);
    pub.buffer_id = pick_id(in, ID_BUFFER);
    pub.layout = (b & 0x80) ? NULL : &lay;
    if (b & 0x40) {
      fill_device(in, &dev, uuid);
      lay.device = &dev;
    }
    if (b & 0x20) {
      lay.dtype_code = tbf_u8(in);
      lay.dtype_bits = tbf_u8(in);
      lay.dtype_lanes = tbf_u8(in);
    } else {
      const uint8_t *dt = dtypes[tbf_u8(in) % 6];
      lay.dtype_code = dt[0];
      lay.dtype_bits = dt[1];
      lay.dtype_lanes = dt[2];
    }
    lay.n_shape = b & 3;
    for (size_t i = 0; i < lay.n_shape; i++)
      shape[i] = (int64_t)tbf_u8(in) - 2;
    lay.shape = shape;
    if (b & 4) {
      lay.n_strides = lay.n_shape;
      for (size_t i = 0; i < lay.n_strides; i++)
        strides[i] = (int64_t)(int8_t)tbf_u8(in);
      lay.strides = strides;
    }
    lay.byte_offset = (b & 8) ? tbf_u16(in) : 0;
    lay.flags = tbf_u8(in) & 7;
    pub.ready_event_id = (b & 0x10) ? pick_id(in, ID_EVENT) : 0;
    pub.metadata.data = meta;
    pub.metadata.len = tbf_u8(in) % sizeof(meta);
    pub.history_depth = tbf_u8(in) % 6;
    pub.ready_complete = tbf_u8(in) & 1;
    break;
  }
  case 6:
    b = tbf_u8(in);
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
    q.acquire = &acq;
    acq.channel = pick_name(in);
    acq.mode = (b & 0x80) ? (int)tbf_u8(in) : (b & 3) % 3;
    acq.version = (b & 4) ? pick_id(in, ID_VERSION) : 0;
    acq.timeout_ms = (b & 8) ? -1 : (b & 0x10) ? 0 : (int64_t)tbf_u16(in);
    acq.implicit_stream = (b >> 5) & 1;
    if (b & 0x40) {
      acq.release_lease_id = pick_id(in, ID_LEASE);
      acq.release_done_event_id = tbf_u8(in) & 1 ? pick_id(in, ID_EVENT) : 0;
      acq.release_implicit_stream = tbf_u8(in) & 1;
    }
    break;
  case 7:
    b = tbf_u8(in);
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_RELEASE;
    q.release = &rel;
    rel.lease_id = pick_id(in, ID_LEASE);
    rel.done_event_id = (b & 1) ? pick_id(in, ID_EVENT) : 0;
    rel.want_reply = (b >> 1) & 1;
    rel.implicit_stream = (b >> 2) & 1;
    if (!rel.want_reply)
      q.request_id = 0;
    break;
  case 8:
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_SUBSCRIBE;
    q.subscribe = &sub;
    sub.channel = pick_name(in);
    break;
  case 9:
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_UNSUBSCRIBE;
    q.unsubscribe = &unsub;
    unsub.channel = pick_name(in);
    break;
  case 10:
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_CHANNELS;
    q.list_channels = &lc;
    b = tbf_u8(in);
    lc.after = b & 1 ? pick_name(in) : "";
    lc.waiting = (b & 2) != 0;
    break;
  case 11:
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_SESSIONS;
    q.list_sessions = &ls;
    ls.after_session_id = tbf_u8(in) % 6;
    break;
  case 12:
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
    q.status = &st;
    break;
  case 13:
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_FORGET;
    q.forget = &fg;
    fg.buffer_id = pick_id(in, ID_BUFFER);
    break;
  case 14:
    b = tbf_u8(in);
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_WAIT_FREE;
    q.wait_free = &wf;
    wf.channel = pick_name(in);
    wf.version = pick_id(in, ID_VERSION);
    wf.timeout_ms = (b & 1) ? -1 : (b & 2) ? 0 : (int64_t)tbf_u16(in);
    break;
  case 15:
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_GOODBYE;
    q.goodbye = &gb;
    break;
  case 16: /* a first page, or a continuation at any offset */
    b = tbf_u8(in);
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_METRICS;
    q.metrics = &mt;
    mt.offset = (b & 1) ? 0 : (b & 2) ? tbf_u32(in) : (uint64_t)b * 97;
    break;
  case 17:
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_LEASES;
    q.list_leases = &ll;
    ll.after_lease_id = tbf_u8(in) & 1 ? pick_id(in, ID_LEASE) : 0;
    break;
  case 18:
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_WAITS;
    q.list_waits = &lw;
    b = tbf_u8(in);
    lw.after_session_id = b % 6;
    lw.after_request_id = (b & 0x80) ? tbf_u8(in) : 0;
    break;
  case 19:
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_DROP_CHANNEL;
    q.drop_channel = &dc;
    dc.channel = pick_name(in);
    break;
  case 20:
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_BUFFERS;
    q.list_buffers = &lb;
    lb.after_buffer_id = tbf_u8(in) & 1 ? pick_id(in, ID_BUFFER) : 0;
    break;
  case 21: /* request ids are one byte here: a parked one, or any */
    q.body_case = TENSORBROKER__V1__REQUEST__BODY_CANCEL;
    q.cancel = &cn;
    cn.request_id = tbf_u8(in);
    break;
  default: /* a body this daemon does not know: field 99 */
    q.body_case = 99;
    q.status = &st;
    break;
  }
  if (q.body_case == 99) {
    /* protobuf-c cannot pack an unknown case: a Request with an
     * unknown field and no body */
    static const uint8_t unk[] = {0x08, 0x07, 0x9a, 0x06, 0x00};
    deliver(k, unk, sizeof(unk), fds, 0);
    return;
  }
  n = tb__request_encode(&q, fz.rx, fz.lim.max_message);
  if (n < 0) {
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    return;
  }
  deliver(k, fz.rx, (size_t)n, fds, nfds);
}

static void setup_once(void) {
  if (fz.tx != NULL)
    return;
  fz.verbose = getenv("TBF_VERBOSE") != NULL;
  tbd_log_set_level(fz.verbose ? TBD_LOG_DEBUG : TBD_LOG_ERROR);
  fz.tx = malloc(TB__MAX_MESSAGE_HARD);
  fz.rx = malloc(TB__MAX_MESSAGE_HARD);
  if (fz.tx == NULL || fz.rx == NULL || tb__arena_init(&fz.arena, 16384) < 0)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct tbf_in in = {data, data + size};
  struct tbd_counts c;
  int fds_before, steps = 0;

  setup_once();
  fds_before = tbt_count_fds();
  memset(fz.s, 0, sizeof(fz.s));
  memset(fz.muted, 0, sizeof(fz.muted));
  memset(fz.doomed, 0, sizeof(fz.doomed));
  memset(fz.cancelled, 0, sizeof(fz.cancelled));
  memset(fz.nids, 0, sizeof(fz.nids));
  fz.now = 1000;
  /* small limits, so that every limit can be reached */
  tbd_limits_default(&fz.lim);
  fz.lim.max_message = 4096;
  fz.lim.max_ndim = 8;
  fz.lim.max_metadata = 64;
  fz.lim.max_channels = 6;
  fz.lim.max_sessions = 3;
  fz.lim.max_buffers = 4;
  fz.lim.max_events = 4;
  fz.lim.max_leases = 8;
  fz.lim.max_subscriptions = 4;
  fz.lim.max_history = 4;
  if (tbd_registry_new(&fz.lim, emit, NULL, &fz.r) < 0)
    abort();
  tbd_registry_set_clock(fz.r, clock_now, NULL);

  while (tbf_left(&in) && steps++ < 256) {
    uint8_t op = tbf_u8(&in);
    int k = (op >> 4) % NSESS, fds[TB__MAX_FDS], nfds;
    size_t len;
    const uint8_t *bytes;

    switch (op & 0x0f) {
    case 0:
      open_session(k, tbf_u8(&in));
      break;
    case 1: {
      uint8_t how = tbf_u8(&in);
      if (fz.s[k] != NULL) {
        if (how & 1)
          tbd_session_hung_up(fz.s[k]);
        doom(k);
      }
      break;
    }
    case 2:
      open_session(k, tbf_u8(&in)); /* if not open yet */
      len = tbf_u16(&in) % 5000;
      bytes = tbf_bytes(&in, len, &len);
      memcpy(fz.rx, bytes, len);
      nfds = make_fds(&in, 4096, fds);
      if (fz.s[k] != NULL)
        deliver(k, fz.rx, len, fds, nfds);
      else
        for (int i = 0; i < nfds; i++)
          close(fds[i]);
      break;
    case 3:
      fz.now += tbf_u16(&in);
      tbd_registry_expire(fz.r);
      break;
    case 5:
      tbd_alloc_fail_at(1 + tbf_u8(&in) % 32, 0);
      break;
    default:
      open_session(k, tbf_u8(&in)); /* if not open yet */
      if (fz.s[k] != NULL)
        structured(k, &in);
      break;
    }
    reap();
  }
  tbd_alloc_fail_at(0, 0);

  for (int k = 0; k < NSESS; k++)
    if (fz.s[k] != NULL && !fz.doomed[k])
      doom(k);
  reap();
  tbd_registry_counts(fz.r, &c);
  if (c.sessions != 0 || c.leases != 0 || c.subscriptions != 0 ||
      c.waits != 0 || c.events != 0)
    tbf_fail("with every session closed: %u sessions, %u leases, %u "
             "subscriptions, %u waits, %u events left",
             c.sessions, c.leases, c.subscriptions, c.waits, c.events);
  /* host memory outlives its producer, but only for versions kept */
  if (c.buffers > c.versions)
    tbf_fail("with every session closed: %u buffers for %u versions",
             c.buffers, c.versions);
  tbd_registry_free(fz.r);
  fz.r = NULL;
  if (tbt_count_fds() != fds_before)
    tbf_fail("%d descriptors open after the registry was freed, %d before",
             tbt_count_fds(), fds_before);
  return 0;
}
