/* Introspection: tb_list_channels, tb_list_sessions, tb_daemon_status. */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void copy_str(char *dst, size_t cap, const char *src) {
  size_t n = src ? strnlen(src, cap - 1) : 0;
  if (n > 0)
    memcpy(dst, src, n);
  dst[n] = '\0';
}

/* Send a body-less introspection request and check the reply's body. */
static int ask(struct tb_client *c, tb__request *r, int want,
               tb__server_message **out) {
  int fds[TB__MAX_FDS], nfds = 0, rc;

  rc = tb__call(c, r, NULL, 0, 0, out, fds, &nfds);
  if (rc < 0)
    return rc;
  for (int i = 0; i < nfds; i++)
    close(fds[i]);
  if ((int)(*out)->reply->body_case != want) {
    tb__msg_free(c, *out);
    return tb__set_error(c, TB_EPROTO, "reply of the wrong kind");
  }
  return 0;
}

int tb_list_channels(tb_client *c, struct tb_channel_info **out,
                     size_t *count) {
  Tensorbroker__V1__ListChannels lc = TENSORBROKER__V1__LIST_CHANNELS__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  const Tensorbroker__V1__ListChannelsReply *lr;
  tb__server_message *m = NULL;
  struct tb_channel_info *a;
  size_t n;
  int rc;

  if (c == NULL || out == NULL || count == NULL)
    return TB_EINVAL;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_CHANNELS;
  r.list_channels = &lc;
  rc = ask(c, &r, TENSORBROKER__V1__REPLY__BODY_LIST_CHANNELS, &m);
  if (rc < 0)
    goto out_unlock;
  lr = m->reply->list_channels;
  n = lr ? lr->n_channels : 0;
  a = calloc(n ? n : 1, sizeof(*a));
  if (a == NULL) {
    rc = TB_ENOMEM;
    goto out_free;
  }
  for (size_t i = 0; i < n; i++) {
    const Tensorbroker__V1__ChannelInfo *ci = lr->channels[i];
    copy_str(a[i].name, sizeof(a[i].name), ci->name);
    a[i].latest_version = ci->latest_version;
    a[i].history_depth = ci->history_depth;
    a[i].publisher_session = ci->publisher_session;
    a[i].versions_held = ci->versions_held;
    a[i].leases = ci->leases;
    a[i].subscribers = ci->subscribers;
    a[i].closed = ci->closed != 0;
    a[i].publishes = ci->publishes;
  }
  *out = a;
  *count = n;
out_free:
  tb__msg_free(c, m);
out_unlock:
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

int tb_list_sessions(tb_client *c, struct tb_session_info **out,
                     size_t *count) {
  Tensorbroker__V1__ListSessions ls = TENSORBROKER__V1__LIST_SESSIONS__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  const Tensorbroker__V1__ListSessionsReply *lr;
  tb__server_message *m = NULL;
  struct tb_session_info *a;
  size_t n;
  int rc;

  if (c == NULL || out == NULL || count == NULL)
    return TB_EINVAL;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_SESSIONS;
  r.list_sessions = &ls;
  rc = ask(c, &r, TENSORBROKER__V1__REPLY__BODY_LIST_SESSIONS, &m);
  if (rc < 0)
    goto out_unlock;
  lr = m->reply->list_sessions;
  n = lr ? lr->n_sessions : 0;
  a = calloc(n ? n : 1, sizeof(*a));
  if (a == NULL) {
    rc = TB_ENOMEM;
    goto out_free;
  }
  for (size_t i = 0; i < n; i++) {
    const Tensorbroker__V1__SessionInfo *si = lr->sessions[i];
    a[i].session_id = si->session_id;
    a[i].pid = si->pid;
    a[i].uid = si->uid;
    a[i].gid = si->gid;
    copy_str(a[i].name, sizeof(a[i].name), si->name);
    a[i].stream_contract = (int)si->stream_contract;
    a[i].leases = si->leases;
    a[i].buffers = si->buffers;
    a[i].subscriptions = si->subscriptions;
    a[i].implicit_stream_calls = si->implicit_stream_calls;
    a[i].requests = si->requests;
  }
  *out = a;
  *count = n;
out_free:
  tb__msg_free(c, m);
out_unlock:
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}

int tb_daemon_status(tb_client *c, struct tb_status *out) {
  Tensorbroker__V1__Status st = TENSORBROKER__V1__STATUS__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  const Tensorbroker__V1__StatusReply *sr;
  tb__server_message *m = NULL;
  int rc;

  if (c == NULL || out == NULL)
    return TB_EINVAL;
  pthread_mutex_lock(&c->call_lock);
  tb__clear_error(c);
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
  r.status = &st;
  rc = ask(c, &r, TENSORBROKER__V1__REPLY__BODY_STATUS_INFO, &m);
  if (rc < 0)
    goto out_unlock;
  sr = m->reply->status_info;
  if (sr == NULL) {
    rc = tb__set_error(c, TB_EPROTO, "empty status reply");
    goto out_free;
  }
  memset(out, 0, sizeof(*out));
  copy_str(out->daemon_version, sizeof(out->daemon_version),
           sr->daemon_version);
  out->pid = sr->pid;
  out->uptime_ms = sr->uptime_ms;
  out->sessions = sr->sessions;
  out->channels = sr->channels;
  out->buffers = sr->buffers;
  out->leases = sr->leases;
  out->requests = sr->requests;
  out->bad_messages = sr->bad_messages;
  out->sessions_dropped = sr->sessions_dropped;
  copy_str(out->socket_path, sizeof(out->socket_path), sr->socket_path);
out_free:
  tb__msg_free(c, m);
out_unlock:
  pthread_mutex_unlock(&c->call_lock);
  return rc;
}
