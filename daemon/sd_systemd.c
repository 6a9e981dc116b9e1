/* SPDX-License-Identifier: Apache-2.0 */
/* The systemd backend, through libsystemd: its protocol (LISTEN_FDS,
 * NOTIFY_SOCKET, the journal's native socket) is not re-implemented here. */
#include "sd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* CODE_FILE= and CODE_LINE= would all name this file: left out */
#define SD_JOURNAL_SUPPRESS_LOCATION
#include <systemd/sd-daemon.h>
#include <systemd/sd-journal.h>

#include "log.h"

int tbd_sd_listen_fd(int *fd) {
  int n, rc, flags;

  *fd = -1;
  /* unset_environment: the sessions' children must not take it as theirs */
  n = sd_listen_fds(1);
  if (n < 0) {
    tbd_error("sd_listen_fds: %s", strerror(-n));
    return -1;
  }
  if (n == 0)
    return 0;
  if (n != 1) {
    tbd_error("systemd passed %d sockets; the daemon listens on one "
              "(ListenSequentialPacket= in tensorbroker.socket)", n);
    return -1;
  }
  rc = sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_SEQPACKET, 1, NULL, 0);
  if (rc <= 0) {
    tbd_error("the socket systemd passed is not a listening AF_UNIX "
              "SOCK_SEQPACKET socket%s%s (tensorbroker.socket needs "
              "ListenSequentialPacket=)", rc < 0 ? ": " : "",
              rc < 0 ? strerror(-rc) : "");
    return -1;
  }
  flags = fcntl(SD_LISTEN_FDS_START, F_GETFL);
  if (flags < 0 ||
      fcntl(SD_LISTEN_FDS_START, F_SETFL, flags | O_NONBLOCK) < 0 ||
      fcntl(SD_LISTEN_FDS_START, F_SETFD, FD_CLOEXEC) < 0) {
    tbd_error("fcntl on the socket systemd passed: %s", strerror(errno));
    return -1;
  }
  *fd = SD_LISTEN_FDS_START;
  return 0;
}

static void notify(const char *what) {
  int rc = sd_notify(0, what);

  if (rc < 0)
    tbd_warn("sd_notify: %s", strerror(-rc));
}

void tbd_sd_ready(const char *status) {
  char buf[512];

  snprintf(buf, sizeof(buf), "READY=1\nSTATUS=%s", status);
  notify(buf);
}

void tbd_sd_stopping(void) { notify("STOPPING=1\nSTATUS=stopping"); }

void tbd_sd_reloading(void) {
  struct timespec ts;
  char buf[128];

  clock_gettime(CLOCK_MONOTONIC, &ts);
  snprintf(buf, sizeof(buf),
           "RELOADING=1\nSTATUS=reloading\nMONOTONIC_USEC=%llu",
           (unsigned long long)ts.tv_sec * 1000000ull +
               (unsigned long long)ts.tv_nsec / 1000);
  notify(buf);
}

void tbd_sd_status(const char *status) {
  char buf[512];

  snprintf(buf, sizeof(buf), "STATUS=%s", status);
  notify(buf);
}

uint64_t tbd_sd_watchdog_usec(void) {
  uint64_t usec = 0;

  if (sd_watchdog_enabled(0, &usec) <= 0)
    return 0;
  return usec;
}

void tbd_sd_watchdog_ping(void) { notify("WATCHDOG=1"); }

int tbd_sd_journal(int priority, const char *msg, long long session,
                   long long pid, long long uid, const char *channel) {
  char f_msg[1100], f_pri[16], f_sess[48], f_pid[48], f_uid[48], f_chan[300];
  struct iovec iov[7];
  int n = 0;

#define ADD(buf, ...)                                                          \
  do {                                                                         \
    snprintf(buf, sizeof(buf), __VA_ARGS__);                                   \
    iov[n].iov_base = buf;                                                     \
    iov[n].iov_len = strlen(buf);                                              \
    n++;                                                                       \
  } while (0)
  ADD(f_msg, "MESSAGE=%s", msg);
  ADD(f_pri, "PRIORITY=%d", priority);
  if (session >= 0)
    ADD(f_sess, "TB_SESSION=%lld", session);
  if (pid >= 0)
    ADD(f_pid, "TB_PEER_PID=%lld", pid);
  if (uid >= 0)
    ADD(f_uid, "TB_PEER_UID=%lld", uid);
  if (channel != NULL)
    ADD(f_chan, "TB_CHANNEL=%s", channel);
#undef ADD
  iov[n].iov_base = "SYSLOG_IDENTIFIER=tensorbrokerd";
  iov[n].iov_len = strlen(iov[n].iov_base);
  n++;
  return sd_journal_sendv(iov, n) < 0 ? -1 : 0;
}
