/* SPDX-License-Identifier: Apache-2.0 */
/* What the daemon asks of systemd: the socket it was handed (socket
 * activation), readiness, status and watchdog notifications, and the
 * journal. Two backends: sd_systemd.c (libsystemd) and sd_none.c (built
 * when libsystemd is absent: no socket passed, notifications dropped). */
#ifndef TBD_SD_H
#define TBD_SD_H

#include <stdint.h>

/* The listening socket systemd passed ($LISTEN_FDS), made non-blocking.
 * Returns 0 with *fd = -1 when none was passed, 0 with *fd set when one
 * was (the caller owns it), -1 (logged) when what was passed is not one
 * listening AF_UNIX SOCK_SEQPACKET socket. */
int tbd_sd_listen_fd(int *fd);
/* Tell the service manager ($NOTIFY_SOCKET) the daemon is ready, with a
 * status line; that it stops; a new status line. No-ops without one. */
void tbd_sd_ready(const char *status);
void tbd_sd_stopping(void);
/* RELOADING=1 with MONOTONIC_USEC= (systemd's reload protocol): sent
 * before re-reading the configuration; tbd_sd_ready() ends the reload. */
void tbd_sd_reloading(void);
void tbd_sd_status(const char *status);
/* The watchdog interval in microseconds ($WATCHDOG_USEC for this pid), or
 * 0 when none is asked for; tbd_sd_watchdog_ping() sends WATCHDOG=1. */
uint64_t tbd_sd_watchdog_usec(void);
void tbd_sd_watchdog_ping(void);
/* Send one entry to the journal with its structured fields (those < 0 or
 * NULL are left out); -1 when it could not (the caller writes the line
 * instead) or when built without libsystemd. */
int tbd_sd_journal(int priority, const char *msg, long long session,
                   long long pid, long long uid, const char *channel);

#endif /* TBD_SD_H */
