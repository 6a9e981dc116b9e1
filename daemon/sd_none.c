/* SPDX-License-Identifier: Apache-2.0 */
/* Built without libsystemd: no socket is taken from systemd, nothing is
 * notified, log lines go to stderr (with their priority prefix under
 * journald: log.c). */
#include "sd.h"

#include "log.h"

#include <stdlib.h>

int tbd_sd_listen_fd(int *fd) {
  if (getenv("LISTEN_FDS") != NULL)
    tbd_warn("$LISTEN_FDS is set but this daemon was built without "
             "libsystemd; ignoring it");
  *fd = -1;
  return 0;
}

void tbd_sd_ready(const char *status) { (void)status; }
void tbd_sd_stopping(void) {}
void tbd_sd_reloading(void) {}
void tbd_sd_status(const char *status) { (void)status; }
uint64_t tbd_sd_watchdog_usec(void) { return 0; }
void tbd_sd_watchdog_ping(void) {}

int tbd_sd_journal(int priority, const char *msg, long long session,
                   long long pid, long long uid, const char *channel) {
  (void)priority;
  (void)msg;
  (void)session;
  (void)pid;
  (void)uid;
  (void)channel;
  return -1;
}
