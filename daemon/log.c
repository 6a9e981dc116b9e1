/* SPDX-License-Identifier: Apache-2.0 */
/* Where log entries go, decided at the first one:
 *  - stderr connected to journald ($JOURNAL_STREAM names stderr's device
 *    and inode, sd_journal_stream_fd(3)): the journal's native protocol
 *    with structured fields (sd.h); if that fails, or without libsystemd,
 *    lines that start with their syslog priority ("<4>"), which journald
 *    turns into the entry's priority;
 *  - otherwise: "2026-12-04T19:40:00.123Z tensorbrokerd: warn: ..." on
 *    stderr (journald stamps its own entries; a plain stderr does not). */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "sd.h"

static enum tbd_log_level cur_level = TBD_LOG_INFO;

enum sink { SINK_UNKNOWN, SINK_PLAIN, SINK_JOURNAL };
static enum sink sink = SINK_UNKNOWN;

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

enum tbd_log_level tbd_log_get_level(void) { return cur_level; }

int tbd_log_enabled(enum tbd_log_level level) { return level <= cur_level; }

const char *tbd_log_level_name(enum tbd_log_level level) {
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

/* $JOURNAL_STREAM alone is not enough: a child of a service inherits it
 * with its stderr redirected elsewhere. */
static enum sink find_sink(void) {
  const char *e = getenv("JOURNAL_STREAM");
  unsigned long long dev, ino;
  struct stat st;

  if (e == NULL || sscanf(e, "%llu:%llu", &dev, &ino) != 2 ||
      fstat(2, &st) < 0)
    return SINK_PLAIN;
  return (unsigned long long)st.st_dev == dev &&
                 (unsigned long long)st.st_ino == ino
             ? SINK_JOURNAL
             : SINK_PLAIN;
}

static void vlog(enum tbd_log_level level, const struct tbd_log_fields *f,
                 const char *fmt, va_list ap) {
  char msg[1024];
  struct timespec ts;
  struct tm tm;

  vsnprintf(msg, sizeof(msg), fmt, ap);
  if (sink == SINK_UNKNOWN)
    sink = find_sink();
  if (sink == SINK_JOURNAL) {
    if (tbd_sd_journal((int)level, msg, f ? f->session : -1,
                       f ? f->pid : -1, f ? f->uid : -1,
                       f ? f->channel : NULL) == 0)
      return;
    /* one write per line so lines of concurrent writers do not interleave */
    fprintf(stderr, "<%d>%s\n", (int)level, msg);
    return;
  }
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ tensorbrokerd: %s: %s\n",
          tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
          tm.tm_sec, ts.tv_nsec / 1000000, tbd_log_level_name(level), msg);
}

void tbd_log(enum tbd_log_level level, const char *fmt, ...) {
  va_list ap;

  if (!tbd_log_enabled(level))
    return;
  va_start(ap, fmt);
  vlog(level, NULL, fmt, ap);
  va_end(ap);
}

void tbd_log_with(enum tbd_log_level level, const struct tbd_log_fields *f,
                  const char *fmt, ...) {
  va_list ap;

  if (!tbd_log_enabled(level))
    return;
  va_start(ap, fmt);
  vlog(level, f, fmt, ap);
  va_end(ap);
}
