/* SPDX-License-Identifier: Apache-2.0 */
/* tbctl: look at a running tensorbrokerd. A client of the public library
 * only.
 *
 *   tbctl [--socket PATH] [--json] status|channels|sessions|metrics
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
          "Usage: tbctl [--socket PATH] [--json] COMMAND\n"
          "Show the state of a running tensorbrokerd.\n"
          "\n"
          "Commands:\n"
          "  status     daemon version, pid, uptime and counters\n"
          "  channels   channels with their latest version, leases, subscribers\n"
          "  sessions   connected sessions: pid, uid, name, stream contract,\n"
          "             leases, buffers, calls that relied on the implicit\n"
          "             stream default\n"
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

static int cmd_status(tb_client *c, int json) {
  struct tb_status st;
  int rc = tb_daemon_status(c, &st);

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

static int cmd_channels(tb_client *c, int json) {
  struct tb_channel_info *ch = NULL;
  size_t n = 0;
  int rc = tb_list_channels(c, &ch, &n);

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
      cJSON_AddItemToArray(a, j);
    }
    tb_free(ch);
    return print_json(a);
  }
  printf("%-32s %8s %5s %9s %5s %6s %5s %6s %9s\n", "CHANNEL", "LATEST",
         "DEPTH", "PUBLISHER", "HELD", "LEASES", "SUBS", "STATE",
         "PUBLISHES");
  for (size_t i = 0; i < n; i++)
    printf("%-32s %8" PRIu64 " %5" PRIu32 " %9" PRIu64 " %5" PRIu32
           " %6" PRIu32 " %5" PRIu32 " %6s %9" PRIu64 "\n",
           ch[i].name, ch[i].latest_version, ch[i].history_depth,
           ch[i].publisher_session, ch[i].versions_held, ch[i].leases,
           ch[i].subscribers, ch[i].closed ? "closed" : "open",
           ch[i].publishes);
  tb_free(ch);
  return 0;
}

static int cmd_sessions(tb_client *c, int json) {
  struct tb_session_info *s = NULL;
  size_t n = 0;
  int rc = tb_list_sessions(c, &s, &n);
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

/* The exposition as the daemon wrote it: it is the format. */
static int cmd_metrics(tb_client *c) {
  char *text = NULL;
  size_t len = 0;
  int rc = tb_daemon_metrics(c, &text, &len);

  if (rc < 0)
    return fail(c, "metrics", rc);
  rc = fwrite(text, 1, len, stdout) == len && fflush(stdout) == 0 ? 0 : 1;
  tb_free(text);
  if (rc != 0)
    fprintf(stderr, "tbctl: metrics: cannot write the output\n");
  return rc;
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
  int json = 0, opt, rc;

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
  if (optind != argc - 1) {
    fprintf(stderr, "tbctl: %s\n",
            optind >= argc ? "a command is required" : "one command only");
    usage(stderr);
    return 2;
  }
  cmd = argv[optind];
  if (strcmp(cmd, "status") != 0 && strcmp(cmd, "channels") != 0 &&
      strcmp(cmd, "sessions") != 0 && strcmp(cmd, "metrics") != 0) {
    fprintf(stderr, "tbctl: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
  }

  if (socket_path == NULL) {
    if (tb_default_socket_path(path, sizeof(path)) < 0) {
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
    tb_connect_error(why, sizeof(why));
    fprintf(stderr, "tbctl: %s (%s)\n", why, tb_err_name(rc));
    return 1;
  }
  if (strcmp(cmd, "status") == 0)
    rc = cmd_status(c, json);
  else if (strcmp(cmd, "channels") == 0)
    rc = cmd_channels(c, json);
  else if (strcmp(cmd, "metrics") == 0)
    rc = cmd_metrics(c);
  else
    rc = cmd_sessions(c, json);
  tb_client_disconnect(c);
  return rc;
}
