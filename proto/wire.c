/* SPDX-License-Identifier: Apache-2.0 */
/* One datagram plus descriptors over a SOCK_SEQPACKET socket. SEQPACKET keeps
 * message boundaries and delivers the descriptors with the datagram they
 * were sent with, so no framing layer is needed. */
#include "tb_proto.h"

#include <errno.h>
#include <sched.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int tb__wire_send(int sock, const void *buf, size_t len, const int *fds,
                  int nfds, int flags) {
  union {
    char buf[CMSG_SPACE(sizeof(int) * TB__MAX_FDS)];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  ssize_t n;

  if (nfds < 0 || nfds > TB__MAX_FDS)
    return -EINVAL;
  if (nfds > 0) {
    struct cmsghdr *c;
    memset(&ctl, 0, sizeof(ctl));
    msg.msg_control = ctl.buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
  }
  do {
    /* send() when nothing is attached: the kernel copies no msghdr */
    n = nfds > 0 ? sendmsg(sock, &msg, flags | MSG_NOSIGNAL)
                 : send(sock, buf, len, flags | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0)
    return -errno;
  if ((size_t)n != len)
    return -EMSGSIZE; /* cannot happen on SEQPACKET; be explicit anyway */
  return 0;
}

/* The kernel passes at most this many descriptors in one message
 * (SCM_MAX_FD): with room for all of them, MSG_CTRUNC can only mean that
 * the receiver could not take them (out of descriptors, EMFILE). */
#define WIRE_SCM_MAX_FD 253

long tb__wire_recv(int sock, void *buf, size_t cap, int *fds, int *nfds,
                   int flags) {
  union {
    char buf[CMSG_SPACE(sizeof(int) * WIRE_SCM_MAX_FD)];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {.iov_base = buf, .iov_len = cap};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                       .msg_control = ctl.buf,
                       .msg_controllen = sizeof(ctl.buf)};
  struct cmsghdr *c;
  ssize_t n;
  int got = 0, extra = 0;

  *nfds = 0;
  do {
    n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0)
    return -errno;
  for (c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (got < TB__MAX_FDS)
        fds[got++] = fd;
      else {
        close(fd);
        extra++;
      }
    }
  }
  if ((msg.msg_flags & MSG_TRUNC) || extra > 0) {
    for (int i = 0; i < got; i++)
      close(fds[i]);
    return -EMSGSIZE;
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    /* the datagram is whole, its descriptors are lost */
    for (int i = 0; i < got; i++)
      close(fds[i]);
    *nfds = -1;
    return (long)n;
  }
  *nfds = got;
  return (long)n;
}

uint64_t tb__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t tb__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int tb__poll_cpus_ok(struct tb__poll_cpus *p) {
  struct timespec ts;
  uint64_t now_ns;

  /* the coarse clock: no time-stamp counter read for a once-a-second
   * check made on every wait */
  if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) < 0)
    clock_gettime(CLOCK_MONOTONIC, &ts);
  now_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  if (p->checked_ns == 0 || now_ns - p->checked_ns >= 1000000000u) {
    p->ok = tb__cpus_allowed() >= TB__POLL_AUTO_CPUS;
    p->checked_ns = now_ns;
  }
  return p->ok;
}

/* Polling pays only when the process it waits for can run meanwhile on
 * another CPU; the default windows (client spin_us, daemon --busy-poll)
 * therefore apply only to a process that may use this many CPUs. */
int tb__cpus_allowed(void) {
  for (size_t ncpu = 1024; ncpu <= (1u << 20); ncpu *= 8) {
    size_t sz = CPU_ALLOC_SIZE(ncpu);
    cpu_set_t *set = CPU_ALLOC(ncpu);
    int n = -1;

    if (set == NULL)
      return 1;
    if (sched_getaffinity(0, sz, set) == 0)
      n = CPU_COUNT_S(sz, set);
    CPU_FREE(set);
    if (n >= 0)
      return n > 0 ? n : 1;
    if (errno != EINVAL)
      return 1; /* unknown: behave as on one CPU (no polling) */
  }
  return 1;
}
