/* SPDX-License-Identifier: Apache-2.0 */
/* Options from the command line and the configuration file. One table
 * names every option; the file's keys are the long options without their
 * dashes, [daemon] for the daemon's own and [limits] for the limits table
 * (config.c). The file is read with inih (Debian's libinih): a small,
 * well-kept parser that hands each key to a callback and reports the line
 * of the first error, which is all an INI file of flat keys needs. */
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <ini.h>

#include <tensorbroker/tensorbroker.h>

#include "tb_proto.h"

#ifndef TB_CONFIG_FILE
#define TB_CONFIG_FILE "/etc/tensorbroker/tensorbrokerd.conf"
#endif
#define SYSTEM_SOCKET "/run/tensorbroker/tensorbroker.sock"
/* inih reads lines of at most INI_MAX_LINE bytes (200 in Debian's build)
 * and would cut a longer one in two; such a line is refused instead. */
#define CONF_MAX_LINE 199
#define CONF_MAX_BYTES (1u << 20)

enum where {
  W_CMDLINE, /* only on the command line */
  W_DAEMON,  /* [daemon] */
  W_LIMITS,  /* [limits] */
};

enum {
  OPT_SOCKET_MODE = 256,
  OPT_LOG_LEVEL,
  OPT_READY_FD,
  OPT_EXEMPT_ROOT,
  OPT_METRICS_LISTEN,
  OPT_CONFIG,
  OPT_NO_CONFIG,
  OPT_CHECK_CONFIG,
  OPT_PRINT_CONFIG,
  OPT_LIMIT_BASE = 1000,
};

typedef int (*set_fn)(struct tbd_options *o, const char *v, char *err,
                      size_t n);

struct opt {
  const char *name;
  int val;      /* getopt's */
  int has_arg;
  enum where where;
  set_fn set;   /* NULL: handled while reading the command line */
};

static int errf(char *err, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int errf(char *err, size_t n, const char *fmt, ...) {
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
  return -1;
}

static int parse_bool(const char *s, uint32_t *out) {
  static const char *const yes[] = {"yes", "true", "on", "1"};
  static const char *const no[] = {"no", "false", "off", "0"};

  for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
    if (strcasecmp(s, yes[i]) == 0)
      return *out = 1, 0;
    if (strcasecmp(s, no[i]) == 0)
      return *out = 0, 0;
  }
  return -1;
}

static int set_socket(struct tbd_options *o, const char *v, char *err,
                      size_t n) {
  if (strlen(v) == 0 || strlen(v) >= sizeof(o->socket))
    return errf(err, n, "socket: path must be 1..%zu bytes",
                sizeof(o->socket) - 1);
  snprintf(o->socket, sizeof(o->socket), "%s", v);
  o->socket_is_system_default = 0;
  return 0;
}

static int set_socket_mode(struct tbd_options *o, const char *v, char *err,
                           size_t n) {
  uint32_t m;

  if (tbd_parse_u32(v, 8, 0, 0777, &m) < 0)
    return errf(err, n, "socket-mode: '%s' is not an octal mode 0..0777", v);
  o->mode = m;
  return 0;
}

static int set_log_level(struct tbd_options *o, const char *v, char *err,
                         size_t n) {
  if (tbd_log_parse_level(v, &o->level) < 0)
    return errf(err, n, "log-level: '%s' is not one of error, warn, info, "
                        "debug", v);
  return 0;
}

static int set_ready_fd(struct tbd_options *o, const char *v, char *err,
                        size_t n) {
  uint32_t fd;

  if (tbd_parse_u32(v, 10, 0, INT_MAX, &fd) < 0)
    return errf(err, n, "ready-fd: '%s' is not a descriptor number", v);
  o->ready_fd = (int)fd;
  return 0;
}

static int set_exempt_root(struct tbd_options *o, const char *v, char *err,
                           size_t n) {
  if (parse_bool(v, &o->lim.exempt_root) < 0)
    return errf(err, n, "exempt-root: '%s' is not yes or no", v);
  return 0;
}

static int set_metrics_listen(struct tbd_options *o, const char *v,
                              char *err, size_t n) {
  char why[256];

  if (strcmp(v, "off") == 0 || v[0] == '\0') {
    memset(&o->metrics, 0, sizeof(o->metrics));
    snprintf(o->metrics_listen, sizeof(o->metrics_listen), "off");
    return 0;
  }
  if (strlen(v) >= sizeof(o->metrics_listen))
    return errf(err, n, "metrics-listen: longer than %zu bytes",
                sizeof(o->metrics_listen) - 1);
  if (tbd_http_addr_parse(v, &o->metrics, why, sizeof(why)) < 0)
    return errf(err, n, "metrics-listen: %s", why);
  snprintf(o->metrics_listen, sizeof(o->metrics_listen), "%s", v);
  return 0;
}

static const struct opt opts[] = {
    {"socket", 's', required_argument, W_DAEMON, set_socket},
    {"socket-mode", OPT_SOCKET_MODE, required_argument, W_DAEMON,
     set_socket_mode},
    {"log-level", OPT_LOG_LEVEL, required_argument, W_DAEMON, set_log_level},
    {"metrics-listen", OPT_METRICS_LISTEN, required_argument, W_DAEMON,
     set_metrics_listen},
    {"exempt-root", OPT_EXEMPT_ROOT, no_argument, W_LIMITS, set_exempt_root},
    {"ready-fd", OPT_READY_FD, required_argument, W_CMDLINE, set_ready_fd},
    {"config", OPT_CONFIG, required_argument, W_CMDLINE, NULL},
    {"no-config", OPT_NO_CONFIG, no_argument, W_CMDLINE, NULL},
    {"check-config", OPT_CHECK_CONFIG, no_argument, W_CMDLINE, NULL},
    {"print-config", OPT_PRINT_CONFIG, no_argument, W_CMDLINE, NULL},
    {"help", 'h', no_argument, W_CMDLINE, NULL},
    {"version", 'V', no_argument, W_CMDLINE, NULL},
};
#define NOPTS (sizeof(opts) / sizeof(opts[0]))

static int set_limit(struct tbd_options *o, const struct tbd_limit_desc *d,
                     const char *v, char *err, size_t n) {
  int busy_poll = d->offset == offsetof(struct tbd_limits, busy_poll_us);
  uint32_t x;

  if (busy_poll && strcmp(v, "auto") == 0) {
    o->lim.busy_poll_us = d->def;
    o->lim.busy_poll_auto = 1;
    return 0;
  }
  if (tbd_parse_u32(v, 10, d->min, d->max, &x) < 0)
    return errf(err, n, "%s: '%s' is not a number in %u..%u%s", d->flag, v,
                d->min, d->max, busy_poll ? " or 'auto'" : "");
  if (busy_poll)
    o->lim.busy_poll_auto = 0;
  *tbd_limit_field(&o->lim, d) = x;
  if (d->offset == offsetof(struct tbd_limits, max_done_events))
    o->done_events_set = 1;
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "Usage: tensorbrokerd [OPTION]...\n"
          "Broker zero-copy DLPack tensor exchange between processes.\n\n"
          "  -s, --socket PATH      listening socket (default "
          "$TENSORBROKER_SOCKET,\n"
          "                         else $XDG_RUNTIME_DIR/tensorbroker.sock, "
          "else\n"
          "                         " SYSTEM_SOCKET ")\n"
          "      --socket-mode OCTAL  permissions of the socket (default "
          "0660)\n"
          "      --log-level LEVEL  error, warn, info or debug (default "
          "info)\n"
          "      --ready-fd N       write \"READY\\n\" to descriptor N once "
          "listening,\n"
          "                         then close it (default: none)\n"
          "      --exempt-root      per-uid limits do not apply to uid 0 "
          "(default: they do)\n"
          "      --metrics-listen ADDR  serve the metrics over HTTP at ADDR:\n"
          "                         unix:PATH (mode of --socket-mode), "
          "tcp:127.0.0.1:PORT\n"
          "                         or tcp:[::1]:PORT, loopback only; off "
          "(the default)\n");
  for (unsigned i = 0; i < tbd_limit_count; i++) {
    const struct tbd_limit_desc *d = &tbd_limit_table[i];
    char flag[48];
    snprintf(flag, sizeof(flag), "--%s N", d->flag);
    fprintf(f, "      %-21s %s (default %u, %u..%u)\n", flag, d->help, d->def,
            d->min, d->max);
  }
  fprintf(f,
          "      --config PATH      read this configuration file (default "
          TB_CONFIG_FILE ",\n"
          "                         read when it exists); the command line "
          "overrides it\n"
          "      --no-config        read no configuration file\n"
          "      --check-config     check the configuration file and the "
          "options, say\n"
          "                         what is wrong or \"configuration OK\", "
          "and exit\n"
          "      --print-config     print the settings in effect as a "
          "configuration file\n"
          "                         and exit\n"
          "  -h, --help             this text\n"
          "  -V, --version          print the version\n\n"
          "SIGTERM or SIGINT: tell clients, close everything, remove the "
          "socket, exit 0;\n"
          "a second one while stopping ends the daemon at once, exit 1.\n"
          "SIGHUP: read the configuration file again and apply the log "
          "level, the\n"
          "limits and the access rules without dropping a client "
          "(docs/deploy.md).\n");
}

static int default_socket(struct tbd_options *o) {
  const char *env = getenv("TENSORBROKER_SOCKET");
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  int n;

  o->socket_is_system_default = 0;
  if (env != NULL && *env != '\0')
    n = snprintf(o->socket, sizeof(o->socket), "%s", env);
  else if (xdg != NULL && *xdg != '\0')
    n = snprintf(o->socket, sizeof(o->socket), "%s/tensorbroker.sock", xdg);
  else {
    n = snprintf(o->socket, sizeof(o->socket), "%s", SYSTEM_SOCKET);
    o->socket_is_system_default = 1;
  }
  return n < 0 || (size_t)n >= sizeof(o->socket) ? -1 : 0;
}

static void defaults(struct tbd_options *o) {
  memset(o, 0, sizeof(*o));
  o->mode = 0660;
  o->level = TBD_LOG_INFO;
  o->ready_fd = -1;
  tbd_limits_default(&o->lim);
  snprintf(o->metrics_listen, sizeof(o->metrics_listen), "off");
  snprintf(o->config, sizeof(o->config), "%s", TB_CONFIG_FILE);
}

/* ---- the configuration file ---- */

struct conf_ctx {
  struct tbd_options *o;
  tbd_access_fn access;
  void *access_ud;
  char err[512];      /* the first error */
  char seen[NOPTS + 64]; /* keys given, to refuse one given twice */
};

/* The prefix of an [access "PREFIX"] section, into buf; NULL for
 * [access]; "" with *bad set for anything else that starts "access". */
static const char *access_prefix(const char *section, char *buf, size_t len,
                                 int *bad) {
  size_t n;

  *bad = 0;
  if (strcmp(section, "access") == 0)
    return NULL;
  if (strncmp(section, "access ", 7) != 0)
    return *bad = 1, "";
  section += 7;
  while (*section == ' ')
    section++;
  n = strlen(section);
  if (n < 2 || section[0] != '"' || section[n - 1] != '"' ||
      memchr(section + 1, '"', n - 2) != NULL || n - 2 >= len)
    return *bad = 1, "";
  memcpy(buf, section + 1, n - 2);
  buf[n - 2] = '\0';
  return buf;
}

static int conf_access(struct conf_ctx *x, const char *section,
                       const char *key, const char *value) {
  char prefix[TB__DEFAULT_MAX_NAME + 1];
  int bad;
  const char *p = access_prefix(section, prefix, sizeof(prefix), &bad);

  if (bad) {
    errf(x->err, sizeof(x->err), "[%s]: an access section is [access] or "
         "[access \"PREFIX\"], PREFIX at most %d bytes", section,
         TB__DEFAULT_MAX_NAME);
    return 0;
  }
  if (x->access == NULL) {
    errf(x->err, sizeof(x->err), "[%s]: access rules are not supported by "
         "this daemon", section);
    return 0;
  }
  if (x->access(x->access_ud, p, key, value, x->err, sizeof(x->err)) < 0)
    return 0;
  return 1;
}

static int conf_key(struct conf_ctx *x, enum where where, const char *key,
                    const char *value) {
  const char *sect = where == W_DAEMON ? "daemon" : "limits";

  for (size_t i = 0; i < NOPTS; i++) {
    if (strcmp(opts[i].name, key) != 0)
      continue;
    if (opts[i].where == W_CMDLINE) {
      errf(x->err, sizeof(x->err), "%s: only on the command line", key);
      return 0;
    }
    if (opts[i].where != where) {
      errf(x->err, sizeof(x->err), "%s belongs in [%s], not [%s]", key,
           opts[i].where == W_DAEMON ? "daemon" : "limits", sect);
      return 0;
    }
    if (x->seen[i]++) {
      errf(x->err, sizeof(x->err), "%s: given twice", key);
      return 0;
    }
    return opts[i].set(x->o, value, x->err, sizeof(x->err)) < 0 ? 0 : 1;
  }
  for (unsigned i = 0; i < tbd_limit_count; i++) {
    const struct tbd_limit_desc *d = &tbd_limit_table[i];

    if (strcmp(d->flag, key) != 0)
      continue;
    if (where != W_LIMITS) {
      errf(x->err, sizeof(x->err), "%s belongs in [limits], not [%s]", key,
           sect);
      return 0;
    }
    if (i < sizeof(x->seen) - NOPTS && x->seen[NOPTS + i]++) {
      errf(x->err, sizeof(x->err), "%s: given twice", key);
      return 0;
    }
    return set_limit(x->o, d, value, x->err, sizeof(x->err)) < 0 ? 0 : 1;
  }
  errf(x->err, sizeof(x->err), "[%s]: unknown key '%s'", sect, key);
  return 0;
}

/* inih's callback: nonzero to go on. Only the first error is kept: inih
 * reports the line of the first. */
static int conf_handler(void *ud, const char *section, const char *key,
                        const char *value) {
  struct conf_ctx *x = ud;

  if (x->err[0] != '\0')
    return 1;
  if (strcmp(section, "daemon") == 0)
    return conf_key(x, W_DAEMON, key, value);
  if (strcmp(section, "limits") == 0)
    return conf_key(x, W_LIMITS, key, value);
  if (strncmp(section, "access", 6) == 0 &&
      (section[6] == '\0' || section[6] == ' '))
    return conf_access(x, section, key, value);
  if (section[0] == '\0')
    errf(x->err, sizeof(x->err), "'%s' comes before any section ([daemon], "
         "[limits], [access])", key);
  else
    errf(x->err, sizeof(x->err), "unknown section [%s] (known: [daemon], "
         "[limits], [access], [access \"PREFIX\"])", section);
  return 0;
}

/* The whole file into a string; the line of a line too long in *badline. */
static char *slurp(const char *path, char *err, size_t n, int *missing,
                   int *badline) {
  FILE *f = fopen(path, "re");
  char *buf = NULL;
  size_t len = 0, col = 0;
  int c, line = 1;

  *missing = 0;
  *badline = 0;
  if (f == NULL) {
    *missing = errno == ENOENT;
    errf(err, n, "%s: %s", path, strerror(errno));
    return NULL;
  }
  buf = malloc(CONF_MAX_BYTES + 1);
  if (buf == NULL) {
    fclose(f);
    errf(err, n, "%s: out of memory", path);
    return NULL;
  }
  while ((c = getc(f)) != EOF) {
    if (len == CONF_MAX_BYTES) {
      errf(err, n, "%s: longer than %u bytes", path, CONF_MAX_BYTES);
      goto fail;
    }
    if (c == '\0') {
      errf(err, n, "%s:%d: a NUL byte", path, line);
      goto fail;
    }
    buf[len++] = (char)c;
    if (c == '\n') {
      line++;
      col = 0;
    } else if (++col > CONF_MAX_LINE && *badline == 0) {
      *badline = line;
    }
  }
  if (ferror(f)) {
    errf(err, n, "%s: %s", path, strerror(errno));
    goto fail;
  }
  fclose(f);
  buf[len] = '\0';
  if (*badline != 0) {
    errf(err, n, "%s:%d: line longer than %d bytes (continue a long "
         "value on indented lines)", path, *badline, CONF_MAX_LINE);
    free(buf);
    return NULL;
  }
  return buf;

fail:
  fclose(f);
  free(buf);
  return NULL;
}

static int read_config(struct tbd_options *o, tbd_access_fn access,
                       void *access_ud, char *err, size_t n) {
  struct conf_ctx x;
  int missing, badline, line;
  char *text;

  memset(&x, 0, sizeof(x));
  x.o = o;
  x.access = access;
  x.access_ud = access_ud;
  text = slurp(o->config, err, n, &missing, &badline);
  if (text == NULL) {
    if (missing && !o->config_required) {
      o->config[0] = '\0'; /* the default file is optional */
      return 0;
    }
    return -1;
  }
  line = ini_parse_string(text, conf_handler, &x);
  free(text);
  if (line == 0 && x.err[0] == '\0')
    return 0;
  if (line > 0 && x.err[0] == '\0')
    snprintf(x.err, sizeof(x.err), "not a key = value line or a [section]");
  errf(err, n, "%s:%d: %s", o->config, line > 0 ? line : 0, x.err);
  return -1;
}

/* ---- the command line ---- */

static void longopts_build(struct option *lo) {
  size_t n = 0;

  for (size_t i = 0; i < NOPTS; i++)
    lo[n++] = (struct option){opts[i].name, opts[i].has_arg, NULL,
                              opts[i].val};
  for (unsigned i = 0; i < tbd_limit_count; i++)
    lo[n++] = (struct option){tbd_limit_table[i].flag, required_argument,
                              NULL, OPT_LIMIT_BASE + (int)i};
  lo[n] = (struct option){NULL, 0, NULL, 0};
}

static const struct opt *opt_by_val(int val) {
  for (size_t i = 0; i < NOPTS; i++)
    if (opts[i].val == val)
      return &opts[i];
  return NULL;
}

/* Pass 1 reads only what says where the file is and what to do; pass 2
 * applies the settings, over the file's. */
static int scan_args(struct tbd_options *o, int argc, char **argv,
                     const struct option *lo, int pass, int quiet,
                     char *err, size_t n) {
  int c;

  optind = 0; /* glibc: start over */
  opterr = pass == 1 && !quiet;
  while ((c = getopt_long(argc, argv, "s:hV", lo, NULL)) != -1) {
    const struct opt *op = opt_by_val(c);
    char why[256];

    if (c == '?' || c == ':')
      return errf(err, n, "Try 'tensorbrokerd --help'."), 2;
    if (pass == 1) {
      switch (c) {
      case 'h':
        usage(stdout);
        return 0;
      case 'V':
        printf("tensorbrokerd %s (protocol %d)\n", TB_VERSION_STRING,
               TB_PROTOCOL_VERSION);
        return 0;
      case OPT_CONFIG:
        if (strlen(optarg) == 0 || strlen(optarg) >= sizeof(o->config))
          return errf(err, n, "--config: path must be 1..%zu bytes",
                      sizeof(o->config) - 1), 2;
        snprintf(o->config, sizeof(o->config), "%s", optarg);
        o->config_required = 1;
        break;
      case OPT_NO_CONFIG:
        o->config[0] = '\0';
        o->config_required = 0;
        break;
      case OPT_CHECK_CONFIG:
        o->check_config = 1;
        break;
      case OPT_PRINT_CONFIG:
        o->print_config = 1;
        break;
      }
      continue;
    }
    if (op != NULL && op->set != NULL) {
      if (op->set(o, op->has_arg ? optarg : "yes", why, sizeof(why)) < 0)
        return errf(err, n, "--%s", why), 2;
    } else if (c >= OPT_LIMIT_BASE &&
               c < OPT_LIMIT_BASE + (int)tbd_limit_count) {
      if (set_limit(o, &tbd_limit_table[c - OPT_LIMIT_BASE], optarg, why,
                    sizeof(why)) < 0)
        return errf(err, n, "--%s", why), 2;
    }
  }
  if (optind < argc)
    return errf(err, n, "unexpected argument '%s'", argv[optind]), 2;
  return -1;
}

/* Checks across options; 0 or -1 with err. */
static int finish(struct tbd_options *o, char *err, size_t n) {
  struct tbd_limits *l = &o->lim;

  if (l->max_metadata + 4096 > l->max_message)
    return errf(err, n, "max-metadata %u leaves no room in max-message %u "
                "(need 4096 bytes more)", l->max_metadata, l->max_message);
  /* the default fits itself to a smaller max-message; a number given
   * must fit */
  if (!o->done_events_set &&
      (uint64_t)l->max_done_events * TBD_DONE_EVENT_BYTES +
              TBD_VERSION_FREE_BASE > l->max_message)
    l->max_done_events =
        (l->max_message - TBD_VERSION_FREE_BASE) / TBD_DONE_EVENT_BYTES;
  if ((uint64_t)l->max_done_events * TBD_DONE_EVENT_BYTES +
          TBD_VERSION_FREE_BASE > l->max_message)
    return errf(err, n, "max-done-events %u needs %llu bytes in a message; "
                "max-message is %u", l->max_done_events,
                (unsigned long long)l->max_done_events *
                        TBD_DONE_EVENT_BYTES + TBD_VERSION_FREE_BASE,
                l->max_message);
  return 0;
}

int tbd_options_build(struct tbd_options *o, int argc, char **argv,
                      int quiet, tbd_access_fn access, void *access_ud,
                      char *err, size_t errlen) {
  struct option lo[NOPTS + 64 + 1];
  int rc;

  err[0] = '\0';
  if (tbd_limit_count > 64) {
    errf(err, errlen, "too many options for the table");
    return 1;
  }
  longopts_build(lo);
  defaults(o);
  if (default_socket(o) < 0) {
    /* only an error if nothing names another socket */
    o->socket[0] = '\0';
  }
  rc = scan_args(o, argc, argv, lo, 1, quiet, err, errlen);
  if (rc >= 0)
    return rc;
  if (o->config[0] != '\0' && read_config(o, access, access_ud, err,
                                          errlen) < 0)
    return 1;
  rc = scan_args(o, argc, argv, lo, 2, quiet, err, errlen);
  if (rc >= 0)
    return rc;
  if (finish(o, err, errlen) < 0)
    return o->config[0] != '\0' ? 1 : 2;
  if (o->socket[0] == '\0') {
    errf(err, errlen, "default socket path too long; set socket");
    return 2;
  }
  return -1;
}

/* ---- printing and comparing ---- */

void tbd_options_print(const struct tbd_options *o, FILE *f) {
  struct tbd_limits lim = o->lim;

  fprintf(f, "# tensorbrokerd %s: the settings in effect (%s)\n",
          TB_VERSION_STRING,
          o->config[0] != '\0' ? o->config : "no configuration file");
  fprintf(f, "[daemon]\nsocket = %s\nsocket-mode = %04o\nlog-level = %s\n"
          "metrics-listen = %s\n",
          o->socket, o->mode, tbd_log_level_name(o->level),
          o->metrics_listen);
  fprintf(f, "\n[limits]\nexempt-root = %s\n",
          o->lim.exempt_root ? "yes" : "no");
  for (unsigned i = 0; i < tbd_limit_count; i++) {
    const struct tbd_limit_desc *d = &tbd_limit_table[i];

    if (d->offset == offsetof(struct tbd_limits, busy_poll_us) &&
        lim.busy_poll_auto)
      fprintf(f, "%s = auto\n", d->flag);
    else
      fprintf(f, "%s = %u\n", d->flag, *tbd_limit_field(&lim, d));
  }
}

int tbd_options_restart_only(const struct tbd_options *old,
                             const struct tbd_options *new_) {
  struct tbd_limits a = old->lim, b = new_->lim;
  int n = 0;

  if (strcmp(old->socket, new_->socket) != 0 && !old->activated) {
    tbd_warn("reload: socket %s -> %s takes effect at the next start",
             old->socket, new_->socket);
    n++;
  }
  if (strcmp(old->metrics_listen, new_->metrics_listen) != 0) {
    tbd_warn("reload: metrics-listen %s -> %s takes effect at the next "
             "start", old->metrics_listen, new_->metrics_listen);
    n++;
  }
  if (old->mode != new_->mode && !old->activated) {
    tbd_warn("reload: socket-mode %04o -> %04o takes effect at the next "
             "start", old->mode, new_->mode);
    n++;
  }
  for (unsigned i = 0; i < tbd_limit_count; i++) {
    const struct tbd_limit_desc *d = &tbd_limit_table[i];
    uint32_t x = *tbd_limit_field(&a, d), y = *tbd_limit_field(&b, d);

    if (x != y && tbd_limit_needs_restart(d)) {
      tbd_warn("reload: %s %u -> %u takes effect at the next start",
               d->flag, x, y);
      n++;
    }
  }
  return n;
}
