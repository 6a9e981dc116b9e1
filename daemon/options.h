/* SPDX-License-Identifier: Apache-2.0 */
/* The daemon's settings: embedded defaults, then the configuration file
 * (an INI file, docs/deploy.md "Configuration"), then the command line,
 * each overriding the one before. The same path builds them at start and
 * at SIGHUP. */
#ifndef TBD_OPTIONS_H
#define TBD_OPTIONS_H

#include <stddef.h>
#include <stdio.h>
#include <sys/un.h>

#include "config.h"
#include "log.h"
#include "metrics_http.h"

struct tbd_options {
  char socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
  int socket_is_system_default;
  int activated; /* the socket came from systemd (set by main) */
  unsigned mode;
  enum tbd_log_level level;
  int ready_fd;
  int done_events_set; /* max-done-events given */
  struct tbd_limits lim;
  struct tbd_http_addr metrics; /* metrics-listen; kind 0: off */
  char metrics_listen[256];     /* as given, "off" when off */
  /* the configuration file read, "" when none */
  char config[4096];
  int config_required; /* --config given: a missing file is an error */
  int check_config;    /* --check-config */
  int print_config;    /* --print-config */
};

/* Called for each key of an [access] or [access "PREFIX"] section (prefix
 * NULL for [access]); returns 0, or -1 with a message in err. */
typedef int (*tbd_access_fn)(void *ud, const char *prefix, const char *key,
                             const char *value, char *err, size_t errlen);

/* Builds o from the defaults, the configuration file and argv. Returns -1
 * to go on, else the exit status (0 after --help or --version, 2 for a bad
 * command line, 1 for a bad configuration file); errors are printed to
 * stderr at start (quiet == 0) and written to err for a reload. access is
 * called for the access sections (NULL: they are refused). */
int tbd_options_build(struct tbd_options *o, int argc, char **argv,
                      int quiet, tbd_access_fn access, void *access_ud,
                      char *err, size_t errlen);

/* The settings as a configuration file would give them, to f. */
void tbd_options_print(const struct tbd_options *o, FILE *f);

/* What changed from old to new that only a restart applies; logs each and
 * returns how many. */
int tbd_options_restart_only(const struct tbd_options *old,
                             const struct tbd_options *new_);

#endif
