/* SPDX-License-Identifier: Apache-2.0 */
/* Daemon logging: to the journal with structured fields when stderr is
 * connected to journald, else plain lines on stderr. */
#ifndef TBD_LOG_H
#define TBD_LOG_H

enum tbd_log_level {
  TBD_LOG_ERROR = 3, /* syslog priorities, so the journald prefix is free */
  TBD_LOG_WARN = 4,
  TBD_LOG_INFO = 6,
  TBD_LOG_DEBUG = 7
};

/* Parse "error", "warn", "info", "debug"; 0 or -1. */
int tbd_log_parse_level(const char *s, enum tbd_log_level *out);
/* "error", "warn", "info" or "debug". */
const char *tbd_log_level_name(enum tbd_log_level level);
/* The level set now. */
enum tbd_log_level tbd_log_get_level(void);
void tbd_log_set_level(enum tbd_log_level level);
/* Whether messages of this level are written (to skip costly formatting). */
int tbd_log_enabled(enum tbd_log_level level);
void tbd_log(enum tbd_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* What an entry is about, for the journal's fields TB_SESSION=,
 * TB_PEER_PID=, TB_PEER_UID= and TB_CHANNEL= (journalctl TB_SESSION=12);
 * the text says it too, for plain lines. -1 or NULL: not about one. */
struct tbd_log_fields {
  long long session;
  long long pid;
  long long uid;
  const char *channel;
};
void tbd_log_with(enum tbd_log_level level, const struct tbd_log_fields *f,
                  const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define tbd_error(...) tbd_log(TBD_LOG_ERROR, __VA_ARGS__)
#define tbd_warn(...) tbd_log(TBD_LOG_WARN, __VA_ARGS__)
#define tbd_info(...) tbd_log(TBD_LOG_INFO, __VA_ARGS__)
#define tbd_debug(...) tbd_log(TBD_LOG_DEBUG, __VA_ARGS__)

#endif /* TBD_LOG_H */
