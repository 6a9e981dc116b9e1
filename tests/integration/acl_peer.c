/* SPDX-License-Identifier: Apache-2.0 */
/* A client that speaks the wire itself, for tests/integration/access.py,
 * which runs it as other uids (setpriv). One session for its lifetime;
 * commands on stdin, one line each, one answer line each on stdout:
 *
 *   register ro|rw          a memfd buffer of 4096 bytes filled with 'P'
 *                           (rw: consumers may write): "0 buffer=ID"
 *   publish CH BUFFER       "STATUS version=N | message"
 *   acquire CH [TIMEOUT_MS] "STATUS lease=ID writable=0|1 fd=0|1 | message"
 *                           (the descriptor attached, if any, is kept)
 *   acquire_release CH LEASE
 *   release LEASE | unregister BUFFER | subscribe CH | wait_free CH VERSION
 *   list                    "0 NAME:LATEST:LEASES ..." (ListChannels)
 *   sessions                "0 UID ..." (ListSessions)
 *   byte BUFFER             this producer's first byte of BUFFER
 *   attack                  every way of writing through the kept
 *                           descriptor: "pwrite=E mmap_rw=E mprotect=E
 *                           ftruncate=E reopen_rw=E wrote=0|1"
 *   quit
 *
 * A status is 0 or a TB_E* name. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <dlpack/dlpack.h>
#include <tensorbroker/tensorbroker.h>

#include "tb_proto.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

#define REQ(x) TENSORBROKER__V1__REQUEST__BODY_##x

static int sock = -1;
static uint64_t next_id = 1;
static int kept_fd = -1;         /* the last descriptor an acquire attached */
static struct {
  uint64_t id;
  uint8_t *map;
} bufs[16];
static int nbufs;

static void die(const char *what) {
  fprintf(stderr, "acl_peer: %s: %s\n", what, strerror(errno));
  exit(2);
}

static void send_req(tb__request *r, const int *fds, int nfds) {
  static uint8_t buf[65536];
  long n;

  r->request_id = next_id++;
  n = tb__request_encode(r, buf, sizeof(buf));
  if (n < 0 || tb__wire_send(sock, buf, (size_t)n, fds, nfds, 0) != 0)
    die("send");
}

/* The reply to the request just sent (notices before it are skipped);
 * its descriptor, if any, into *fd. */
static tb__server_message *reply(int *fd) {
  static uint8_t buf[TB__MAX_MESSAGE_HARD];

  for (;;) {
    struct pollfd p = {.fd = sock, .events = POLLIN};
    int fds[TB__MAX_FDS], nfds = 0;
    tb__server_message *m = NULL;
    long n;

    if (poll(&p, 1, 20000) != 1)
      die("no reply");
    n = tb__wire_recv(sock, buf, sizeof(buf), fds, &nfds, 0);
    if (n <= 0 || tb__server_message_decode(buf, (size_t)n, &m) < 0)
      die("recv");
    for (int i = 0; i < nfds; i++) {
      if (fd != NULL && i == 0)
        *fd = fds[i];
      else
        close(fds[i]);
    }
    if (m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY &&
        m->reply->request_id == next_id - 1)
      return m;
    tb__server_message_free(m);
  }
}

static const char *status(int st) { return st == 0 ? "0" : tb_err_name(st); }

/* Print "STATUS | message" for a reply without a body we need. */
static void answer_plain(tb__request *r) {
  tb__server_message *m;

  send_req(r, NULL, 0);
  m = reply(NULL);
  printf("%s | %s\n", status(m->reply->status),
         m->reply->message ? m->reply->message : "");
  tb__server_message_free(m);
}

static void hello(void) {
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Hello h = TENSORBROKER__V1__HELLO__INIT;
  tb__server_message *m;

  h.protocol_version = TB_PROTOCOL_VERSION;
  h.client_name = "acl_peer";
  h.memory_kinds = 1u << TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
  r.body_case = REQ(HELLO);
  r.hello = &h;
  send_req(&r, NULL, 0);
  m = reply(NULL);
  if (m->reply->status != 0) {
    fprintf(stderr, "acl_peer: Hello: %s\n", m->reply->message);
    exit(2);
  }
  tb__server_message_free(m);
}

static void cmd_register(bool rw) {
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__BufferRegister b = TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  tb__server_message *m;
  int fd = memfd_create("acl_peer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  uint8_t *p;

  if (fd < 0 || ftruncate(fd, 4096) < 0)
    die("memfd");
  p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    die("mmap");
  memset(p, 'P', 4096);
  if (fcntl(fd, F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | (rw ? 0 : F_SEAL_FUTURE_WRITE)) < 0)
    die("seal");
  b.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
  b.size = 4096;
  b.consumers_may_write = rw;
  r.body_case = REQ(BUFFER_REGISTER);
  r.buffer_register = &b;
  send_req(&r, &fd, 1);
  close(fd);
  m = reply(NULL);
  if (m->reply->status == 0 && nbufs < 16) {
    bufs[nbufs].id = m->reply->buffer_register->buffer_id;
    bufs[nbufs++].map = p;
    printf("0 buffer=%llu\n", (unsigned long long)bufs[nbufs - 1].id);
  } else {
    printf("%s | %s\n", status(m->reply->status), m->reply->message);
  }
  tb__server_message_free(m);
}

static void cmd_publish(const char *ch, uint64_t bid) {
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Publish p = TENSORBROKER__V1__PUBLISH__INIT;
  Tensorbroker__V1__Layout l = TENSORBROKER__V1__LAYOUT__INIT;
  Tensorbroker__V1__Device d = TENSORBROKER__V1__DEVICE__INIT;
  int64_t shape[1] = {4096};
  tb__server_message *m;

  p.channel = (char *)ch;
  p.buffer_id = bid;
  p.layout = &l;
  l.device = &d;
  d.type = kDLCPU;
  l.dtype_code = kDLUInt;
  l.dtype_bits = 8;
  l.dtype_lanes = 1;
  l.shape = shape;
  l.n_shape = 1;
  r.body_case = REQ(PUBLISH);
  r.publish = &p;
  send_req(&r, NULL, 0);
  m = reply(NULL);
  if (m->reply->status == 0)
    printf("0 version=%llu\n", (unsigned long long)m->reply->publish->version);
  else
    printf("%s | %s\n", status(m->reply->status), m->reply->message);
  tb__server_message_free(m);
}

static void cmd_acquire(const char *ch, int64_t timeout, uint64_t release) {
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Acquire a = TENSORBROKER__V1__ACQUIRE__INIT;
  tb__server_message *m;
  int fd = -1;

  a.channel = (char *)ch;
  a.mode = TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_LATEST;
  a.timeout_ms = timeout;
  a.release_lease_id = release;
  r.body_case = REQ(ACQUIRE);
  r.acquire = &a;
  send_req(&r, NULL, 0);
  m = reply(&fd);
  if (m->reply->status == 0) {
    printf("0 lease=%llu writable=%d fd=%d\n",
           (unsigned long long)m->reply->acquire->lease_id,
           (int)m->reply->acquire->buffer->writable, fd >= 0);
    if (fd >= 0) {
      if (kept_fd >= 0)
        close(kept_fd);
      kept_fd = fd;
    }
  } else {
    printf("%s | %s\n", status(m->reply->status), m->reply->message);
    if (fd >= 0)
      close(fd);
  }
  tb__server_message_free(m);
}

static void cmd_list(void) {
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__ListChannels lc = TENSORBROKER__V1__LIST_CHANNELS__INIT;
  tb__server_message *m;

  r.body_case = REQ(LIST_CHANNELS);
  r.list_channels = &lc;
  send_req(&r, NULL, 0);
  m = reply(NULL);
  printf("%s", status(m->reply->status));
  for (size_t i = 0; m->reply->status == 0 &&
                     i < m->reply->list_channels->n_channels;
       i++) {
    Tensorbroker__V1__ChannelInfo *c = m->reply->list_channels->channels[i];
    printf(" %s:%llu:%u", c->name, (unsigned long long)c->latest_version,
           c->leases);
  }
  printf("\n");
  tb__server_message_free(m);
}

static void cmd_sessions(void) {
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__ListSessions ls = TENSORBROKER__V1__LIST_SESSIONS__INIT;
  tb__server_message *m;

  r.body_case = REQ(LIST_SESSIONS);
  r.list_sessions = &ls;
  send_req(&r, NULL, 0);
  m = reply(NULL);
  printf("%s", status(m->reply->status));
  for (size_t i = 0; m->reply->status == 0 &&
                     i < m->reply->list_sessions->n_sessions;
       i++)
    printf(" %u", m->reply->list_sessions->sessions[i]->uid);
  printf("\n");
  tb__server_message_free(m);
}

static const char *err_of(int rc) {
  static char buf[8][32];
  static int k;

  if (rc == 0)
    return "OK";
  k = (k + 1) % 8;
  snprintf(buf[k], sizeof(buf[k]), "%s", strerrorname_np(errno));
  return buf[k];
}

/* Every way of writing the producer's memory through the kept descriptor;
 * a route that works writes 'W' at byte 0. */
static void cmd_attack(void) {
  int fd = kept_fd, rw;
  const char *e_pwrite, *e_mmap, *e_mprot, *e_trunc, *e_reopen;
  bool wrote = false;
  void *p;
  char path[64];

  if (fd < 0) {
    printf("no descriptor\n");
    return;
  }
  e_pwrite = err_of(pwrite(fd, "W", 1, 0) == 1 ? 0 : -1);
  wrote = wrote || strcmp(e_pwrite, "OK") == 0;
  p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  e_mmap = err_of(p != MAP_FAILED ? 0 : -1);
  if (p != MAP_FAILED) {
    ((volatile char *)p)[0] = 'W';
    wrote = true;
    munmap(p, 4096);
  }
  p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    die("mmap PROT_READ");
  e_mprot = err_of(mprotect(p, 4096, PROT_READ | PROT_WRITE));
  if (strcmp(e_mprot, "OK") == 0) {
    ((volatile char *)p)[0] = 'W';
    wrote = true;
  }
  munmap(p, 4096);
  e_trunc = err_of(ftruncate(fd, 8192));
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  rw = open(path, O_RDWR | O_CLOEXEC);
  e_reopen = err_of(rw >= 0 ? 0 : -1);
  if (rw >= 0) {
    wrote = wrote || pwrite(rw, "W", 1, 0) == 1;
    close(rw);
  }
  printf("pwrite=%s mmap_rw=%s mprotect=%s ftruncate=%s reopen_rw=%s "
         "wrote=%d\n",
         e_pwrite, e_mmap, e_mprot, e_trunc, e_reopen, wrote);
}

static void cmd_byte(uint64_t bid) {
  for (int i = 0; i < nbufs; i++) {
    if (bufs[i].id == bid) {
      printf("%c\n", bufs[i].map[0]);
      return;
    }
  }
  printf("no buffer\n");
}

static void dispatch(char *line) {
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  char cmd[32] = "", a1[256] = "", a2[64] = "";
  int n = sscanf(line, "%31s %255s %63s", cmd, a1, a2);
  uint64_t x = strtoull(a2, NULL, 10), y = strtoull(a1, NULL, 10);

  if (n < 1)
    return;
  if (strcmp(cmd, "register") == 0) {
    cmd_register(strcmp(a1, "rw") == 0);
  } else if (strcmp(cmd, "publish") == 0) {
    cmd_publish(a1, x);
  } else if (strcmp(cmd, "acquire") == 0) {
    cmd_acquire(a1, n > 2 ? (int64_t)x : 0, 0);
  } else if (strcmp(cmd, "acquire_release") == 0) {
    cmd_acquire(a1, 0, x);
  } else if (strcmp(cmd, "release") == 0) {
    Tensorbroker__V1__Release rl = TENSORBROKER__V1__RELEASE__INIT;
    rl.lease_id = y;
    rl.want_reply = true;
    r.body_case = REQ(RELEASE);
    r.release = &rl;
    answer_plain(&r);
  } else if (strcmp(cmd, "unregister") == 0) {
    Tensorbroker__V1__BufferUnregister bu =
        TENSORBROKER__V1__BUFFER_UNREGISTER__INIT;
    bu.buffer_id = y;
    r.body_case = REQ(BUFFER_UNREGISTER);
    r.buffer_unregister = &bu;
    answer_plain(&r);
  } else if (strcmp(cmd, "subscribe") == 0) {
    Tensorbroker__V1__Subscribe sub = TENSORBROKER__V1__SUBSCRIBE__INIT;
    sub.channel = a1;
    r.body_case = REQ(SUBSCRIBE);
    r.subscribe = &sub;
    answer_plain(&r);
  } else if (strcmp(cmd, "wait_free") == 0) {
    Tensorbroker__V1__WaitFree w = TENSORBROKER__V1__WAIT_FREE__INIT;
    w.channel = a1;
    w.version = x;
    r.body_case = REQ(WAIT_FREE);
    r.wait_free = &w;
    answer_plain(&r);
  } else if (strcmp(cmd, "list") == 0) {
    cmd_list();
  } else if (strcmp(cmd, "sessions") == 0) {
    cmd_sessions();
  } else if (strcmp(cmd, "attack") == 0) {
    cmd_attack();
  } else if (strcmp(cmd, "byte") == 0) {
    cmd_byte(y);
  } else if (strcmp(cmd, "quit") == 0) {
    exit(0);
  } else {
    printf("unknown command\n");
  }
}

int main(int argc, char **argv) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  char line[512];

  if (argc != 2) {
    fprintf(stderr, "usage: acl_peer SOCKET\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  snprintf(a.sun_path, sizeof(a.sun_path), "%s", argv[1]);
  if (sock < 0 || connect(sock, (struct sockaddr *)&a, sizeof(a)) < 0)
    die(argv[1]);
  hello();
  printf("ready\n");
  while (fgets(line, sizeof(line), stdin) != NULL)
    dispatch(line);
  return 0;
}
