/* SPDX-License-Identifier: Apache-2.0 */
/* tbctl: look at a running tensorbrokerd. A client of the public library
 * only.
 *
 *   tbctl [--socket PATH] [--json]
 *         status|channels|sessions|leases|waits|buffers
 *   tbctl [--socket PATH] [--json] drop CHANNEL
 *   tbctl [--socket PATH] metrics
 *
 * Exit codes: 0 ok, 1 the daemon is unreachable or answered an error,
 * 2 usage. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <tensorbroker/tensorbroker.h>

static void usage(FILE *f) {
  fprintf(f,
          "Usage: tbctl [--socket PATH] [--json] COMMAND [CHANNEL]\n"
          "Show the state of a running tensorbrokerd.\n"
          "\n"
          "Commands:\n"
          "  status     daemon version, pid, uptime and counters\n"
          "  channels   channels with their latest version, leases, subscribers,\n"
          "             waiting acquires; names that only acquires wait on\n"
          "             are listed as 'waiting'\n"
          "  sessions   connected sessions: pid, uid, name, stream contract,\n"
          "             leases, buffers, calls that relied on the implicit\n"
          "             stream default\n"
          "  leases     every lease: who holds which version of which channel,\n"
          "             since when, how many bytes\n"
          "  waits      every parked request: who waits on what (an acquire,\n"
          "             or a producer's wait for a version to be freed), since\n"
          "             when, with what timeout left\n"
          "  buffers    every buffer: its memory kind, size, device and\n"
          "             producer, the versions and leases that hold it;\n"
          "             retired ones while versions of them are held\n"
          "  drop       drop CHANNEL: free a closed channel and its versions\n"
          "             now (refused while it is open or leased; its\n"
          "             publisher's uid, root or the daemon's uid only)\n"
          "  metrics    the daemon's metrics in the Prometheus text format\n"
          "             (--json does not apply)\n"
          "\n"
          "Options:\n"
          "  -s, --socket PATH  daemon socket (default $TENSORBROKER_SOCKET,\n"
          "                     else $XDG_RUNTIME_DIR/tensorbroker.sock, else\n"
          "                     /run/tensorbroker/tensorbroker.sock)\n"
          "  -j, --json         print JSON instead of a table\n"
          "  -h, --help         this text\n"
          "  -V, --version      print the version\n"
          "\n"
          "Exit status: 0 ok, 1 daemon unreachable or error, 2 usage.\n");
}

/* Print a cJSON value and free it. */
static int print_json(cJSON *j) {
  char *s;

  if (j == NULL) {
    fprintf(stderr, "tbctl: out of memory\n");
    return 1;
  }
  s = cJSON_Print(j);
  cJSON_Delete(j);
  if (s == NULL) {
    fprintf(stderr, "tbctl: out of memory\n");
    return 1;
  }
  printf("%s\n", s);
  cJSON_free(s);
  return 0;
}

static int fail(tb_client *c, const char *what, int rc) {
  char msg[512] = "";

  tb_client_last_error(c, msg, sizeof(msg));
  fprintf(stderr, "tbctl: %s: %s (%s)%s%s\n", what, tb_strerror(rc),
          tb_err_name(rc), msg[0] ? ": " : "", msg);
  return 1;
}

/* A duration for people: "850ms", "12.4s", "3m07s", "2h05m", "3d04h". */
static void fmt_duration(char *buf, size_t len, uint64_t ms) {
  uint64_t s = ms / 1000;

  if (ms < 1000)
    snprintf(buf, len, "%" PRIu64 "ms", ms);
  else if (s < 60)
    snprintf(buf, len, "%.1fs", (double)ms / 1000.0);
  else if (s < 3600)
    snprintf(buf, len, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
  else if (s < 86400)
    snprintf(buf, len, "%" PRIu64 "h%02" PRIu64 "m", s / 3600,
             s / 60 % 60);
  else
    snprintf(buf, len, "%" PRIu64 "d%02" PRIu64 "h", s / 86400,
             s / 3600 % 24);
}

/* A size for people: "512 B", "4.0 KiB", "1.5 GiB". */
static void fmt_bytes(char *buf, size_t len, uint64_t n) {
  static const char *const unit[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  int u = -1;

  if (n < 1024) {
    snprintf(buf, len, "%" PRIu64 " B", n);
    return;
  }
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, len, "%.1f %s", v, unit[u]);
}

static const char *kind_name(int kind) {
  const char *name = tb_memory_kind_name(kind);
  return name != NULL ? name : "?";
}

/* The width of a text column: its heading's, or its longest entry's. */
static int col_width(int w, const char *s) {
  int n = (int)strlen(s);
  return n > w ? n : w;
}

static int cmd_status(tb_client *c, int json) {
  struct tb_status st;
  int rc = tb_daemon_get_status(c, sizeof(st), &st);

  if (rc < 0)
    return fail(c, "status", rc);
  if (json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "daemon_version", st.daemon_version);
    cJSON_AddNumberToObject(j, "pid", st.pid);
    cJSON_AddNumberToObject(j, "uptime_ms", (double)st.uptime_ms);
    cJSON_AddNumberToObject(j, "sessions", st.sessions);
    cJSON_AddNumberToObject(j, "channels", st.channels);
    cJSON_AddNumberToObject(j, "buffers", st.buffers);
    cJSON_AddNumberToObject(j, "leases", st.leases);
    cJSON_AddNumberToObject(j, "requests", (double)st.requests);
    cJSON_AddNumberToObject(j, "bad_messages", (double)st.bad_messages);
    cJSON_AddNumberToObject(j, "sessions_dropped",
                            (double)st.sessions_dropped);
    cJSON_AddStringToObject(j, "socket_path", st.socket_path);
    return print_json(j);
  }
  printf("daemon version    %s\n", st.daemon_version);
  printf("pid               %" PRIu32 "\n", st.pid);
  printf("uptime            %.1f s\n", (double)st.uptime_ms / 1000.0);
  printf("socket            %s\n", st.socket_path);
  printf("sessions          %" PRIu32 "\n", st.sessions);
  printf("channels          %" PRIu32 "\n", st.channels);
  printf("buffers           %" PRIu32 "\n", st.buffers);
  printf("leases            %" PRIu32 "\n", st.leases);
  printf("requests          %" PRIu64 "\n", st.requests);
  printf("bad messages      %" PRIu64 "\n", st.bad_messages);
  printf("sessions dropped  %" PRIu64 "\n", st.sessions_dropped);
  return 0;
}

static const char *channel_state(const struct tb_channel_info *ch) {
  if (ch->waiting)
    return "waiting";
  return ch->closed ? "closed" : "open";
}

static int cmd_channels(tb_client *c, int json) {
  struct tb_channel_info *ch = NULL;
  size_t n = 0;
  int rc = tb_channel_list(c, sizeof(*ch), &ch, &n), w = 7;

  if (rc < 0)
    return fail(c, "channels", rc);
  if (json) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
      cJSON *j = cJSON_CreateObject();
      cJSON_AddStringToObject(j, "name", ch[i].name);
      cJSON_AddNumberToObject(j, "latest_version",
                              (double)ch[i].latest_version);
      cJSON_AddNumberToObject(j, "history_depth", ch[i].history_depth);
      cJSON_AddNumberToObject(j, "publisher_session",
                              (double)ch[i].publisher_session);
      cJSON_AddNumberToObject(j, "versions_held", ch[i].versions_held);
      cJSON_AddNumberToObject(j, "leases", ch[i].leases);
      cJSON_AddNumberToObject(j, "subscribers", ch[i].subscribers);
      cJSON_AddBoolToObject(j, "closed", ch[i].closed);
      cJSON_AddNumberToObject(j, "publishes", (double)ch[i].publishes);
      cJSON_AddNumberToObject(j, "waiters", ch[i].waiters);
      cJSON_AddBoolToObject(j, "waiting", ch[i].waiting);
      cJSON_AddStringToObject(j, "state", channel_state(&ch[i]));
      cJSON_AddStringToObject(j, "memory_kind",
                              ch[i].memory_kind != 0
                                  ? kind_name(ch[i].memory_kind)
                                  : "");
      cJSON_AddItemToArray(a, j);
    }
    tb_free(ch);
    return print_json(a);
  }
  for (size_t i = 0; i < n; i++)
    w = col_width(w, ch[i].name);
  printf("%-*s %8s %5s %9s %5s %6s %5s %7s %7s %9s %-8s\n", w, "CHANNEL",
         "LATEST", "DEPTH", "PUBLISHER", "HELD", "LEASES", "SUBS", "WAITERS",
         "STATE", "PUBLISHES", "KIND");
  for (size_t i = 0; i < n; i++)
    printf("%-*s %8" PRIu64 " %5" PRIu32 " %9" PRIu64 " %5" PRIu32
           " %6" PRIu32 " %5" PRIu32 " %7" PRIu32 " %7s %9" PRIu64
           " %-8s\n",
           w, ch[i].name, ch[i].latest_version, ch[i].history_depth,
           ch[i].publisher_session, ch[i].versions_held, ch[i].leases,
           ch[i].subscribers, ch[i].waiters, channel_state(&ch[i]),
           ch[i].publishes,
           ch[i].memory_kind != 0 ? kind_name(ch[i].memory_kind) : "-");
  tb_free(ch);
  return 0;
}

static int cmd_sessions(tb_client *c, int json) {
  struct tb_session_info *s = NULL;
  size_t n = 0;
  int rc = tb_session_list(c, sizeof(*s), &s, &n);
  uint64_t self = tb_client_session_id(c);

  if (rc < 0)
    return fail(c, "sessions", rc);
  if (json) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
      const char *cn = tb_contract_name(s[i].stream_contract);
      cJSON *j = cJSON_CreateObject();
      cJSON_AddNumberToObject(j, "session_id", (double)s[i].session_id);
      cJSON_AddNumberToObject(j, "pid", s[i].pid);
      cJSON_AddNumberToObject(j, "uid", s[i].uid);
      cJSON_AddNumberToObject(j, "gid", s[i].gid);
      cJSON_AddStringToObject(j, "name", s[i].name);
      cJSON_AddStringToObject(j, "stream_contract", cn ? cn : "unknown");
      cJSON_AddNumberToObject(j, "leases", s[i].leases);
      cJSON_AddNumberToObject(j, "buffers", s[i].buffers);
      cJSON_AddNumberToObject(j, "subscriptions", s[i].subscriptions);
      cJSON_AddNumberToObject(j, "implicit_stream_calls",
                              (double)s[i].implicit_stream_calls);
      cJSON_AddNumberToObject(j, "requests", (double)s[i].requests);
      cJSON_AddBoolToObject(j, "self", s[i].session_id == self);
      cJSON_AddItemToArray(a, j);
    }
    tb_free(s);
    return print_json(a);
  }
  printf("%7s %8s %6s %-20s %-10s %6s %7s %4s %8s %8s\n", "SESSION", "PID",
         "UID", "NAME", "CONTRACT", "LEASES", "BUFFERS", "SUBS", "IMPLICIT",
         "REQUESTS");
  for (size_t i = 0; i < n; i++) {
    const char *cn = tb_contract_name(s[i].stream_contract);
    printf("%7" PRIu64 " %8" PRIu32 " %6" PRIu32 " %-20s %-10s %6" PRIu32
           " %7" PRIu32 " %4" PRIu32 " %8" PRIu64 " %8" PRIu64 "%s\n",
           s[i].session_id, s[i].pid, s[i].uid,
           s[i].name[0] ? s[i].name : "-", cn ? cn : "?", s[i].leases,
           s[i].buffers, s[i].subscriptions, s[i].implicit_stream_calls,
           s[i].requests, s[i].session_id == self ? "  (this tbctl)" : "");
  }
  tb_free(s);
  return 0;
}

static int cmd_leases(tb_client *c, int json) {
  struct tb_lease_entry *l = NULL;
  size_t n = 0;
  int rc = tb_lease_list(c, sizeof(*l), &l, &n), wn = 4, wc = 7;

  if (rc < 0)
    return fail(c, "leases", rc);
  if (json) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
      cJSON *j = cJSON_CreateObject();
      cJSON_AddNumberToObject(j, "lease_id", (double)l[i].lease_id);
      cJSON_AddNumberToObject(j, "session_id", (double)l[i].session_id);
      cJSON_AddNumberToObject(j, "pid", l[i].pid);
      cJSON_AddNumberToObject(j, "uid", l[i].uid);
      cJSON_AddStringToObject(j, "session_name", l[i].session_name);
      cJSON_AddStringToObject(j, "channel", l[i].channel);
      cJSON_AddNumberToObject(j, "version", (double)l[i].version);
      cJSON_AddNumberToObject(j, "bytes", (double)l[i].bytes);
      cJSON_AddStringToObject(j, "memory_kind", kind_name(l[i].memory_kind));
      cJSON_AddNumberToObject(j, "age_ms", (double)l[i].age_ms);
      cJSON_AddNumberToObject(j, "buffer_id", (double)l[i].buffer_id);
      cJSON_AddBoolToObject(j, "ready_event", l[i].ready_event);
      cJSON_AddNumberToObject(j, "done_events", l[i].done_events);
      cJSON_AddBoolToObject(j, "died", l[i].died);
      cJSON_AddItemToArray(a, j);
    }
    tb_free(l);
    return print_json(a);
  }
  for (size_t i = 0; i < n; i++) {
    wn = col_width(wn, l[i].session_name);
    wc = col_width(wc, l[i].channel);
  }
  printf("%7s %7s %8s %6s %-*s %-*s %8s %10s %-8s %8s %s\n", "LEASE",
         "SESSION", "PID", "UID", wn, "NAME", wc, "CHANNEL", "VERSION",
         "BYTES", "KIND", "AGE", "NOTES");
  for (size_t i = 0; i < n; i++) {
    char age[32], bytes[32], notes[96];
    fmt_duration(age, sizeof(age), l[i].age_ms);
    fmt_bytes(bytes, sizeof(bytes), l[i].bytes);
    snprintf(notes, sizeof(notes), "%s%s%s",
             l[i].ready_event ? "ready-event " : "",
             l[i].done_events > 0 ? "done-events-pending " : "",
             l[i].died ? "producer-died" : "");
    printf("%7" PRIu64 " %7" PRIu64 " %8" PRIu32 " %6" PRIu32
           " %-*s %-*s %8" PRIu64 " %10s %-8s %8s %s\n",
           l[i].lease_id, l[i].session_id, l[i].pid, l[i].uid, wn,
           l[i].session_name[0] ? l[i].session_name : "-", wc, l[i].channel,
           l[i].version, bytes, kind_name(l[i].memory_kind), age,
           notes[0] ? notes : "-");
  }
  tb_free(l);
  return 0;
}

static const char *wait_what(int what) {
  const char *name = tb_wait_what_name(what);
  return name != NULL ? name : "?";
}

static int cmd_waits(tb_client *c, int json) {
  struct tb_wait_entry *w = NULL;
  size_t n = 0;
  int rc = tb_wait_list(c, sizeof(*w), &w, &n), wn = 4, wc = 7;

  if (rc < 0)
    return fail(c, "waits", rc);
  if (json) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
      cJSON *j = cJSON_CreateObject();
      cJSON_AddNumberToObject(j, "session_id", (double)w[i].session_id);
      cJSON_AddNumberToObject(j, "pid", w[i].pid);
      cJSON_AddNumberToObject(j, "uid", w[i].uid);
      cJSON_AddStringToObject(j, "session_name", w[i].session_name);
      cJSON_AddStringToObject(j, "what", wait_what(w[i].what));
      cJSON_AddStringToObject(j, "channel", w[i].channel);
      cJSON_AddNumberToObject(j, "version", (double)w[i].version);
      cJSON_AddNumberToObject(j, "age_ms", (double)w[i].age_ms);
      cJSON_AddNumberToObject(j, "timeout_ms", (double)w[i].timeout_ms);
      if (w[i].what == TB_WAIT_FREE) {
        cJSON_AddNumberToObject(j, "leases", w[i].leases);
        cJSON_AddBoolToObject(j, "in_history", w[i].in_history);
      }
      cJSON_AddItemToArray(a, j);
    }
    tb_free(w);
    return print_json(a);
  }
  for (size_t i = 0; i < n; i++) {
    wn = col_width(wn, w[i].session_name);
    wc = col_width(wc, w[i].channel);
  }
  printf("%7s %8s %6s %-*s %-14s %-*s %8s %8s %8s %s\n", "SESSION", "PID",
         "UID", wn, "NAME", "WAITS-FOR", wc, "CHANNEL", "VERSION", "AGE",
         "TIMEOUT", "BLOCKED-BY");
  for (size_t i = 0; i < n; i++) {
    char age[32], tmo[32], blocked[64] = "-", ver[24] = "-";
    fmt_duration(age, sizeof(age), w[i].age_ms);
    if (w[i].timeout_ms < 0)
      snprintf(tmo, sizeof(tmo), "forever");
    else
      fmt_duration(tmo, sizeof(tmo), (uint64_t)w[i].timeout_ms);
    if (w[i].what != TB_WAIT_ACQUIRE_LATEST)
      snprintf(ver, sizeof(ver), "%" PRIu64, w[i].version);
    if (w[i].what == TB_WAIT_FREE)
      snprintf(blocked, sizeof(blocked), "%" PRIu32 " lease%s%s",
               w[i].leases, w[i].leases == 1 ? "" : "s",
               w[i].in_history ? ", in history" : "");
    printf("%7" PRIu64 " %8" PRIu32 " %6" PRIu32 " %-*s %-14s %-*s %8s %8s "
           "%8s %s\n",
           w[i].session_id, w[i].pid, w[i].uid, wn,
           w[i].session_name[0] ? w[i].session_name : "-",
           wait_what(w[i].what), wc, w[i].channel, ver, age, tmo, blocked);
  }
  tb_free(w);
  return 0;
}

/* "cpu", "cuda:1", "cuda-host", "-" (none given), else "TYPE:ID". */
static void fmt_device(char *buf, size_t len, int32_t type, int32_t id) {
  switch (type) {
  case 0:
    snprintf(buf, len, "-");
    break;
  case kDLCPU:
    snprintf(buf, len, "cpu");
    break;
  case kDLCUDA:
    snprintf(buf, len, "cuda:%" PRId32, id);
    break;
  case kDLCUDAHost:
    snprintf(buf, len, "cuda-host");
    break;
  default:
    snprintf(buf, len, "%" PRId32 ":%" PRId32, type, id);
    break;
  }
}

/* A device uuid in hex, "" when it is all zero (host memory). */
static void fmt_uuid(char *buf, size_t len, const uint8_t *u, size_t n) {
  size_t used = 0, zero = 0;

  buf[0] = '\0';
  for (size_t i = 0; i < n; i++)
    zero += u[i] == 0;
  if (zero == n)
    return;
  for (size_t i = 0; i < n && used + 3 <= len; i++)
    used += (size_t)snprintf(buf + used, len - used, "%02x", u[i]);
}

/* Append word to the space-separated words in buf. */
static void add_note(char *buf, size_t len, const char *word) {
  size_t used = strlen(buf);

  snprintf(buf + used, len - used, "%s%s", used > 0 ? " " : "", word);
}

static int cmd_buffers(tb_client *c, int json) {
  struct tb_buffer_entry *b = NULL;
  size_t n = 0;
  int rc = tb_buffer_list(c, sizeof(*b), &b, &n), wn = 4;

  if (rc < 0)
    return fail(c, "buffers", rc);
  if (json) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
      cJSON *j = cJSON_CreateObject();
      char dev[32], uuid[40];
      fmt_device(dev, sizeof(dev), b[i].device_type, b[i].device_id);
      fmt_uuid(uuid, sizeof(uuid), b[i].device_uuid,
               sizeof(b[i].device_uuid));
      cJSON_AddNumberToObject(j, "buffer_id", (double)b[i].buffer_id);
      cJSON_AddStringToObject(j, "memory_kind", kind_name(b[i].memory_kind));
      cJSON_AddNumberToObject(j, "size", (double)b[i].size);
      cJSON_AddStringToObject(j, "device", dev);
      cJSON_AddNumberToObject(j, "device_type", b[i].device_type);
      cJSON_AddNumberToObject(j, "device_id", b[i].device_id);
      cJSON_AddStringToObject(j, "device_uuid", uuid);
      cJSON_AddNumberToObject(j, "session_id", (double)b[i].session_id);
      cJSON_AddNumberToObject(j, "pid", b[i].pid);
      cJSON_AddNumberToObject(j, "uid", b[i].uid);
      cJSON_AddStringToObject(j, "session_name", b[i].session_name);
      cJSON_AddBoolToObject(j, "retired", b[i].retired);
      cJSON_AddNumberToObject(j, "versions", b[i].versions);
      cJSON_AddNumberToObject(j, "leases", b[i].leases);
      cJSON_AddBoolToObject(j, "writable", b[i].writable);
      cJSON_AddNumberToObject(j, "signal_offset", (double)b[i].signal_offset);
      cJSON_AddBoolToObject(j, "survives_producer", b[i].survives_producer);
      cJSON_AddItemToArray(a, j);
    }
    tb_free(b);
    return print_json(a);
  }
  for (size_t i = 0; i < n; i++)
    wn = col_width(wn, b[i].session_name);
  printf("%7s %-9s %10s %-9s %7s %8s %6s %-*s %8s %6s %s\n", "BUFFER", "KIND",
         "SIZE", "DEVICE", "SESSION", "PID", "UID", wn, "NAME", "VERSIONS",
         "LEASES", "NOTES");
  for (size_t i = 0; i < n; i++) {
    char size[32], dev[32], notes[96] = "";
    fmt_bytes(size, sizeof(size), b[i].size);
    fmt_device(dev, sizeof(dev), b[i].device_type, b[i].device_id);
    if (b[i].retired)
      add_note(notes, sizeof(notes), "retired");
    if (b[i].writable)
      add_note(notes, sizeof(notes), "writable");
    if (b[i].signal_offset != 0)
      add_note(notes, sizeof(notes), "signals");
    if (!b[i].survives_producer)
      add_note(notes, sizeof(notes), "dies-with-producer");
    printf("%7" PRIu64 " %-9s %10s %-9s %7" PRIu64 " %8" PRIu32 " %6" PRIu32
           " %-*s %8" PRIu32 " %6" PRIu32 " %s\n",
           b[i].buffer_id, kind_name(b[i].memory_kind), size, dev,
           b[i].session_id, b[i].pid, b[i].uid, wn,
           b[i].session_name[0] ? b[i].session_name : "-", b[i].versions,
           b[i].leases, notes[0] ? notes : "-");
  }
  tb_free(b);
  return 0;
}

static int cmd_drop(tb_client *c, const char *channel, int json) {
  int rc = tb_channel_drop(c, channel);

  if (rc < 0)
    return fail(c, "drop", rc);
  if (json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "channel", channel);
    cJSON_AddBoolToObject(j, "dropped", 1);
    return print_json(j);
  }
  printf("dropped channel '%s'\n", channel);
  return 0;
}

/* The exposition as the daemon wrote it: it is the format. */
static int cmd_metrics(tb_client *c) {
  char *text = NULL;
  size_t len = 0;
  int rc = tb_daemon_get_metrics(c, &text, &len);

  if (rc < 0)
    return fail(c, "metrics", rc);
  rc = fwrite(text, 1, len, stdout) == len && fflush(stdout) == 0 ? 0 : 1;
  tb_free(text);
  if (rc != 0)
    fprintf(stderr, "tbctl: metrics: cannot write the output\n");
  return rc;
}

static const char *const commands[] = {"status", "channels", "sessions",
                                       "leases", "waits", "buffers", "drop",
                                       "metrics", NULL};

/* The arguments the command takes after its name. */
static int command_args(const char *cmd) {
  return strcmp(cmd, "drop") == 0 ? 1 : 0;
}

static int run_command(tb_client *c, const char *cmd, char **args,
                       int json) {
  if (strcmp(cmd, "status") == 0)
    return cmd_status(c, json);
  if (strcmp(cmd, "channels") == 0)
    return cmd_channels(c, json);
  if (strcmp(cmd, "sessions") == 0)
    return cmd_sessions(c, json);
  if (strcmp(cmd, "leases") == 0)
    return cmd_leases(c, json);
  if (strcmp(cmd, "waits") == 0)
    return cmd_waits(c, json);
  if (strcmp(cmd, "buffers") == 0)
    return cmd_buffers(c, json);
  if (strcmp(cmd, "metrics") == 0)
    return cmd_metrics(c);
  return cmd_drop(c, args[0], json);
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"socket", required_argument, NULL, 's'},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0}};
  struct tb_connect_options o;
  const char *socket_path = NULL, *cmd;
  char path[108];
  tb_client *c = NULL;
  int json = 0, opt, rc, known;

  while ((opt = getopt_long(argc, argv, "s:jhV", longopts, NULL)) != -1) {
    switch (opt) {
    case 's':
      socket_path = optarg;
      break;
    case 'j':
      json = 1;
      break;
    case 'h':
      usage(stdout);
      return 0;
    case 'V':
      printf("tbctl %s\n", tb_version());
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (optind >= argc) {
    fprintf(stderr, "tbctl: a command is required\n");
    usage(stderr);
    return 2;
  }
  cmd = argv[optind];
  for (known = 0; commands[known] != NULL; known++)
    if (strcmp(cmd, commands[known]) == 0)
      break;
  if (commands[known] == NULL) {
    fprintf(stderr, "tbctl: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
  }
  if (argc - optind - 1 != command_args(cmd)) {
    fprintf(stderr, "tbctl: %s\n",
            command_args(cmd) == 1 ? "drop needs one CHANNEL"
                                   : "one command only");
    usage(stderr);
    return 2;
  }

  if (socket_path == NULL) {
    if (tb_client_default_socket_path(path, sizeof(path)) < 0) {
      fprintf(stderr, "tbctl: default socket path too long\n");
      return 2;
    }
    socket_path = path;
  }
  tb_connect_options_init(&o);
  o.socket_path = socket_path;
  o.client_name = "tbctl";
  o.timeout_ms = 5000;
  rc = tb_client_connect(&o, &c);
  if (rc < 0) {
    char why[512];
    tb_client_connect_error(why, sizeof(why));
    fprintf(stderr, "tbctl: %s (%s)\n", why, tb_err_name(rc));
    return 1;
  }
  rc = run_command(c, cmd, argv + optind + 1, json);
  tb_client_disconnect(c);
  return rc;
}
