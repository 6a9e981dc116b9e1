/* SPDX-License-Identifier: Apache-2.0 */
/* Log lines go to stderr. Under systemd ($JOURNAL_STREAM set) each line
 * starts with its syslog priority ("<4>"), which journald turns into the
 * entry's priority; otherwise "tensorbrokerd: warn: ...". */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static enum tbd_log_level cur_level = TBD_LOG_INFO;

int tbd_log_parse_level(const char *s, enum tbd_log_level *out) {
  static const struct {
    const char *name;
    enum tbd_log_level level;
  } names[] = {{"error", TBD_LOG_ERROR},
               {"warn", TBD_LOG_WARN},
               {"info", TBD_LOG_INFO},
               {"debug", TBD_LOG_DEBUG}};

  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    if (strcmp(s, names[i].name) == 0) {
      *out = names[i].level;
      return 0;
    }
  }
  return -1;
}

void tbd_log_set_level(enum tbd_log_level level) { cur_level = level; }

int tbd_log_enabled(enum tbd_log_level level) { return level <= cur_level; }

static const char *level_name(enum tbd_log_level level) {
  switch (level) {
  case TBD_LOG_ERROR:
    return "error";
  case TBD_LOG_WARN:
    return "warn";
  case TBD_LOG_INFO:
    return "info";
  default:
    return "debug";
  }
}

void tbd_log(enum tbd_log_level level, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  int n;

  if (!tbd_log_enabled(level))
    return;
  if (getenv("JOURNAL_STREAM") != NULL)
    n = snprintf(line, sizeof(line), "<%d>", (int)level);
  else
    n = snprintf(line, sizeof(line), "tensorbrokerd: %s: ", level_name(level));
  if (n < 0 || (size_t)n >= sizeof(line))
    n = 0;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
  va_end(ap);
  /* one write per line so lines of concurrent writers do not interleave */
  fprintf(stderr, "%s\n", line);
}
