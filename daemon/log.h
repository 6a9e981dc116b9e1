/* SPDX-License-Identifier: Apache-2.0 */
/* Daemon logging to stderr, journald-friendly. */
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
void tbd_log_set_level(enum tbd_log_level level);
/* Whether messages of this level are written (to skip costly formatting). */
int tbd_log_enabled(enum tbd_log_level level);
void tbd_log(enum tbd_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define tbd_error(...) tbd_log(TBD_LOG_ERROR, __VA_ARGS__)
#define tbd_warn(...) tbd_log(TBD_LOG_WARN, __VA_ARGS__)
#define tbd_info(...) tbd_log(TBD_LOG_INFO, __VA_ARGS__)
#define tbd_debug(...) tbd_log(TBD_LOG_DEBUG, __VA_ARGS__)

#endif /* TBD_LOG_H */
