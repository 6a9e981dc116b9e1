/* SPDX-License-Identifier: Apache-2.0 */
/* The operator's view, as an operator uses it: tbctl leases, waits,
 * buffers, channels and drop (text and --json) against a daemon where real
 * processes hold leases, wait for versions and wait for their versions to
 * be freed; the C API's lists, their pages, struct_size, and older
 * daemons. */
#include "tb_test.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "harness.h"
#include "raw_wire.h"

/* client/client_internal.h: pretend the daemon said these features */
void tb__client_set_features(struct tb_client *c, uint32_t features);

static char g_out[1 << 20];

/* ---- running tbctl ---- */

/* tbctl ARGS... (NULL-terminated, at most 4) on d, stdout in g_out, or
 * stdout and stderr with both. */
static int tbctl(const struct tbt_daemon *d, int with_stderr, const char *a1,
                 const char *a2, const char *a3) {
  const char *tb = getenv("TB_TBCTL");
  const char *argv[8];
  int n = 0;

  if (tb == NULL)
    fail_msg("TB_TBCTL not set");
  setenv("TENSORBROKER_SOCKET", d->sock, 1);
  if (with_stderr) {
    argv[n++] = "/bin/sh";
    argv[n++] = "-c";
    argv[n++] = "exec \"$0\" \"$@\" 2>&1";
  }
  argv[n++] = tb;
  argv[n++] = a1;
  argv[n++] = a2;
  argv[n++] = a3;
  argv[n] = NULL;
  return tbt_run(argv, g_out, sizeof(g_out));
}

/* tbctl --json CMD: its array (the caller deletes it). */
static cJSON *tbctl_json(const struct tbt_daemon *d, const char *cmd) {
  cJSON *root;

  assert_int_equal(tbctl(d, 0, "--json", cmd, NULL), 0);
  root = cJSON_Parse(g_out);
  if (root == NULL || !cJSON_IsArray(root))
    fail_msg("tbctl --json %s is not a JSON array: %s", cmd, g_out);
  return root;
}

static double num(const cJSON *o, const char *k) {
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsNumber(f))
    fail_msg("no number '%s' in %s", k, cJSON_PrintUnformatted(o));
  return f->valuedouble;
}

static const char *str(const cJSON *o, const char *k) {
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsString(f))
    fail_msg("no string '%s' in %s", k, cJSON_PrintUnformatted(o));
  return f->valuestring;
}

static int flag(const cJSON *o, const char *k) {
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsBool(f))
    fail_msg("no bool '%s' in %s", k, cJSON_PrintUnformatted(o));
  return cJSON_IsTrue(f);
}

/* The entry of array a whose key k is the number v, or NULL. */
static cJSON *find_num(const cJSON *a, const char *k, double v) {
  cJSON *e;
  cJSON_ArrayForEach(e, a) {
    if (num(e, k) == v)
      return e;
  }
  return NULL;
}

/* The entry of array a whose key k is the string v, or NULL. */
static cJSON *find_str(const cJSON *a, const char *k, const char *v) {
  cJSON *e;
  cJSON_ArrayForEach(e, a) {
    if (strcmp(str(e, k), v) == 0)
      return e;
  }
  return NULL;
}

/* ---- helpers ---- */

static void host_tensor(DLTensor *t, tb_buffer *b, int64_t *shape) {
  memset(t, 0, sizeof(*t));
  t->data = tb_buffer_data(b);
  t->device.device_type = kDLCPU;
  t->ndim = 1;
  t->dtype = (DLDataType){kDLUInt, 8, 1};
  t->shape = shape;
}

/* Memfds the daemon holds now: its descriptors that name one. */
static int daemon_memfds(const struct tbt_daemon *d) {
  char dir[64], path[320], target[256];
  struct dirent *e;
  DIR *fds;
  int n = 0;

  snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)d->pid);
  fds = opendir(dir);
  assert_non_null(fds);
  while ((e = readdir(fds)) != NULL) {
    ssize_t k;
    if (e->d_name[0] == '.')
      continue;
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    k = readlink(path, target, sizeof(target) - 1);
    if (k <= 0)
      continue;
    target[k] = '\0';
    n += strncmp(target, "/memfd:", 7) == 0;
  }
  closedir(fds);
  return n;
}

/* ---- children ---- */

/* A producer: publishes version 1 of op/frames (4096 bytes), then on "go"
 * version 2 and waits, without a timeout, for version 1 to be freed. */
static int producer_child(struct tbt_chan *ch, void *arg) {
  const struct tbt_daemon *d = arg;
  int64_t shape[1] = {4096};
  tb_client *p;
  tb_buffer *b;
  DLTensor t;
  uint64_t v, n;
  char line[64];

  TBT_CHECK_OK(tbt_connect(d, "op-producer", &p));
  TBT_CHECK_OK(tb_host_buffer_create(p, 4096, 0, &b));
  host_tensor(&t, b, shape);
  TBT_CHECK_OK(tb_publish(p, "op/frames", &t, NULL, &v));
  TBT_CHECK(v == 1);
  TBT_CHECK_OK(tbt_send(ch->wr, "%" PRIu64, tb_client_session_id(p)));
  TBT_CHECK_OK(tbt_recv(ch->rd, line, sizeof(line), TBT_TIMEOUT_MS));
  TBT_CHECK_OK(tb_publish(p, "op/frames", &t, NULL, &v));
  TBT_CHECK(v == 2);
  TBT_CHECK_OK(tbt_own_requests(p, &n));
  TBT_CHECK_OK(tbt_send(ch->wr, "%" PRIu64, n));
  TBT_CHECK_OK(tb_wait_free(p, "op/frames", 1, -1, NULL));
  TBT_CHECK_OK(tbt_send(ch->wr, "freed"));
  TBT_CHECK_OK(tbt_recv(ch->rd, line, sizeof(line), TBT_TIMEOUT_MS));
  tb_client_disconnect(p);
  return 0;
}

/* A consumer that acquires from op/nobody, which nobody publishes, with a
 * 60 s timeout; killed by the test. */
static int waiter_child(struct tbt_chan *ch, void *arg) {
  const struct tbt_daemon *d = arg;
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;
  tb_client *c;
  uint64_t n;

  TBT_CHECK_OK(tbt_connect(d, "op-waiter", &c));
  TBT_CHECK_OK(tbt_own_requests(c, &n));
  TBT_CHECK_OK(tbt_send(ch->wr, "%" PRIu64 " %" PRIu64,
                        tb_client_session_id(c), n));
  tb_acquire_options_init(&o);
  o.timeout_ms = 60000;
  (void)tb_acquire(c, "op/nobody", &o, &t);
  return 3; /* it should have been killed waiting */
}

/* ---- tests ---- */

/* A consumer holds version 1, a producer waits for it to be freed, another
 * consumer waits on a channel nobody published: tbctl leases, waits and
 * channels show exactly them, ages grow and timeouts shrink; the release
 * ends the producer's wait and its row. */
static void test_views(void **state) {
  struct tbt_daemon *d = *state;
  struct tbt_child prod, waiter;
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;
  struct tb_lease_info li;
  struct tb_notice nt;
  uint64_t psid, asid, n;
  tb_client *c;
  cJSON *a, *e, *wf, *wa;
  double age1, tmo1, fage1;
  char line[64];
  pid_t ppid;

  assert_int_equal(tbt_child_start(&prod, producer_child, d), 0);
  assert_int_equal(tbt_recv(prod.rd, line, sizeof(line), TBT_TIMEOUT_MS), 0);
  psid = strtoull(line, NULL, 10);
  assert_tb_ok(tbt_connect(d, "op-holder", &c));
  tb_acquire_options_init(&o);
  o.mode = TB_ACQUIRE_EXACT;
  o.version = 1;
  o.timeout_ms = 0;
  assert_tb_ok(tb_acquire(c, "op/frames", &o, &t));
  assert_tb_ok(tb_lease_info(t, &li));
  assert_int_equal(tbt_send(prod.wr, "go"), 0);
  assert_int_equal(tbt_recv(prod.rd, line, sizeof(line), TBT_TIMEOUT_MS), 0);
  n = strtoull(line, NULL, 10);
  assert_tb_ok(tbt_wait_requests(c, psid, n + 1)); /* its WaitFree parked */
  assert_int_equal(tbt_child_start(&waiter, waiter_child, d), 0);
  assert_int_equal(tbt_recv(waiter.rd, line, sizeof(line), TBT_TIMEOUT_MS),
                   0);
  assert_int_equal(sscanf(line, "%" SCNu64 " %" SCNu64, &asid, &n), 2);
  assert_tb_ok(tbt_wait_requests(c, asid, n + 1)); /* its Acquire parked */

  /* leases: exactly the one lease */
  a = tbctl_json(d, "leases");
  assert_int_equal(cJSON_GetArraySize(a), 1);
  e = cJSON_GetArrayItem(a, 0);
  assert_true(num(e, "lease_id") == (double)li.lease_id);
  assert_true(num(e, "session_id") == (double)tb_client_session_id(c));
  assert_int_equal((int)num(e, "pid"), (int)getpid());
  assert_int_equal((int)num(e, "uid"), (int)getuid());
  assert_string_equal(str(e, "session_name"), "op-holder");
  assert_string_equal(str(e, "channel"), "op/frames");
  assert_int_equal((int)num(e, "version"), 1);
  assert_int_equal((int)num(e, "bytes"), 4096);
  assert_string_equal(str(e, "memory_kind"), "host");
  assert_true(num(e, "buffer_id") == (double)li.buffer_id);
  assert_false(flag(e, "died"));
  age1 = num(e, "age_ms");
  cJSON_Delete(a);

  /* waits: the producer's wait for version 1, and the acquire */
  a = tbctl_json(d, "waits");
  assert_int_equal(cJSON_GetArraySize(a), 2);
  wf = find_num(a, "session_id", (double)psid);
  wa = find_num(a, "session_id", (double)asid);
  assert_non_null(wf);
  assert_non_null(wa);
  assert_true(num(cJSON_GetArrayItem(a, 0), "session_id") <
              num(cJSON_GetArrayItem(a, 1), "session_id"));
  assert_string_equal(str(wf, "what"), "wait-free");
  assert_string_equal(str(wf, "channel"), "op/frames");
  assert_int_equal((int)num(wf, "version"), 1);
  assert_int_equal((int)num(wf, "timeout_ms"), -1);
  assert_int_equal((int)num(wf, "leases"), 1);
  assert_false(flag(wf, "in_history"));
  assert_int_equal((int)num(wf, "pid"), (int)prod.pid);
  assert_string_equal(str(wf, "session_name"), "op-producer");
  assert_string_equal(str(wa, "what"), "acquire-latest");
  assert_string_equal(str(wa, "channel"), "op/nobody");
  assert_int_equal((int)num(wa, "pid"), (int)waiter.pid);
  assert_string_equal(str(wa, "session_name"), "op-waiter");
  tmo1 = num(wa, "timeout_ms");
  assert_true(tmo1 > 0 && tmo1 <= 60000);
  fage1 = num(wf, "age_ms");
  cJSON_Delete(a);

  /* channels: op/nobody exists only because someone waits on it */
  a = tbctl_json(d, "channels");
  assert_int_equal(cJSON_GetArraySize(a), 2);
  e = find_str(a, "name", "op/nobody");
  assert_non_null(e);
  assert_true(flag(e, "waiting"));
  assert_int_equal((int)num(e, "waiters"), 1);
  assert_string_equal(str(e, "state"), "waiting");
  assert_string_equal(str(e, "memory_kind"), ""); /* nothing held */
  assert_int_equal((int)num(e, "latest_version"), 0);
  e = find_str(a, "name", "op/frames");
  assert_non_null(e);
  assert_false(flag(e, "waiting"));
  assert_int_equal((int)num(e, "waiters"), 0);
  assert_string_equal(str(e, "state"), "open");
  assert_string_equal(str(e, "memory_kind"), "host");
  assert_int_equal((int)num(e, "leases"), 1);
  cJSON_Delete(a);

  /* buffers: the producer's one, its two versions held (1 leased, 2 in
   * the history), the lease */
  a = tbctl_json(d, "buffers");
  assert_int_equal(cJSON_GetArraySize(a), 1);
  e = cJSON_GetArrayItem(a, 0);
  assert_true(num(e, "buffer_id") == (double)li.buffer_id);
  assert_string_equal(str(e, "memory_kind"), "host");
  assert_int_equal((int)num(e, "size"), 4096);
  assert_string_equal(str(e, "device"), "cpu");
  assert_string_equal(str(e, "device_uuid"), "");
  assert_true(num(e, "session_id") == (double)psid);
  assert_int_equal((int)num(e, "pid"), (int)prod.pid);
  assert_int_equal((int)num(e, "uid"), (int)getuid());
  assert_string_equal(str(e, "session_name"), "op-producer");
  assert_int_equal((int)num(e, "versions"), 2);
  assert_int_equal((int)num(e, "leases"), 1);
  assert_false(flag(e, "retired"));
  assert_false(flag(e, "writable"));
  assert_true(flag(e, "survives_producer"));
  assert_int_equal((int)num(e, "signal_offset"), 0);
  cJSON_Delete(a);

  /* time passes (nothing is sent to c: no notice comes) */
  assert_tb_err(tb_client_poll_notice(c, &nt, 60), TB_EAGAIN);
  a = tbctl_json(d, "leases");
  assert_true(num(cJSON_GetArrayItem(a, 0), "age_ms") >= age1 + 55);
  cJSON_Delete(a);
  a = tbctl_json(d, "waits");
  wa = find_num(a, "session_id", (double)asid);
  wf = find_num(a, "session_id", (double)psid);
  assert_true(num(wa, "timeout_ms") <= tmo1 - 55);
  assert_true(num(wf, "age_ms") >= fage1 + 55);
  assert_int_equal((int)num(wf, "timeout_ms"), -1);
  cJSON_Delete(a);

  /* the text forms */
  assert_int_equal(tbctl(d, 0, "leases", NULL, NULL), 0);
  assert_non_null(strstr(g_out, "LEASE"));
  assert_non_null(strstr(g_out, "op-holder"));
  assert_non_null(strstr(g_out, "4.0 KiB"));
  assert_int_equal(tbctl(d, 0, "waits", NULL, NULL), 0);
  assert_non_null(strstr(g_out, "wait-free"));
  assert_non_null(strstr(g_out, "acquire-latest"));
  assert_non_null(strstr(g_out, "forever"));
  assert_non_null(strstr(g_out, "1 lease"));
  assert_int_equal(tbctl(d, 0, "channels", NULL, NULL), 0);
  assert_non_null(strstr(g_out, "waiting"));
  assert_int_equal(tbctl(d, 0, "buffers", NULL, NULL), 0);
  if (strstr(g_out, "BUFFER") == NULL || strstr(g_out, "op-producer") == NULL ||
      strstr(g_out, " host ") == NULL || strstr(g_out, "4.0 KiB") == NULL)
    fail_msg("tbctl buffers: %s", g_out);

  /* the release frees version 1: the producer's wait ends, its row goes */
  assert_tb_ok(tb_release(t, NULL));
  assert_int_equal(tbt_recv(prod.rd, line, sizeof(line), TBT_TIMEOUT_MS), 0);
  assert_string_equal(line, "freed");
  a = tbctl_json(d, "waits");
  assert_int_equal(cJSON_GetArraySize(a), 1);
  assert_non_null(find_num(a, "session_id", (double)asid));
  cJSON_Delete(a);
  a = tbctl_json(d, "leases");
  assert_int_equal(cJSON_GetArraySize(a), 0);
  cJSON_Delete(a);

  ppid = prod.pid; /* tbt_child_wait clears it */
  assert_int_equal(tbt_send(prod.wr, "bye"), 0);
  assert_int_equal(tbt_child_wait(&prod, TBT_TIMEOUT_MS), 0);
  /* the producer went: its buffer stays, retired, for version 2 in the
   * closed channel's history, with the producer's pid and no session */
  assert_tb_ok(tbt_wait_session_gone(c, psid));
  a = tbctl_json(d, "buffers");
  assert_int_equal(cJSON_GetArraySize(a), 1);
  e = cJSON_GetArrayItem(a, 0);
  assert_true(num(e, "buffer_id") == (double)li.buffer_id);
  assert_true(flag(e, "retired"));
  assert_int_equal((int)num(e, "session_id"), 0);
  assert_string_equal(str(e, "session_name"), "");
  assert_int_equal((int)num(e, "pid"), (int)ppid);
  assert_int_equal((int)num(e, "versions"), 1);
  assert_int_equal((int)num(e, "leases"), 0);
  cJSON_Delete(a);
  assert_int_equal(tbctl(d, 0, "buffers", NULL, NULL), 0);
  assert_non_null(strstr(g_out, "retired"));
  tbt_child_kill(&waiter);
  tb_client_disconnect(c);
}

/* The daemon's view of channel name (TB_ENOTFOUND when not listed). */
static int channel_of(tb_client *c, const char *name,
                      struct tb_channel_info *out) {
  return tbt_find_channel(c, name, out);
}

/* Run tbctl drop as uid 65534 (a uid that neither published the channel
 * nor is root or the daemon's); its exit code, output in g_out. */
static int drop_as_nobody(const struct tbt_daemon *d, const char *channel) {
  const char *argv[] = {"/bin/sh", "-c",
                        "exec setpriv --reuid=65534 --regid=65534 "
                        "--clear-groups \"$0\" --socket \"$1\" drop \"$2\" "
                        "2>&1",
                        getenv("TB_TBCTL"), d->sock, channel, NULL};
  return tbt_run(argv, g_out, sizeof(g_out));
}

/* drop refuses an open channel, a leased one, an unknown one and another
 * uid's, changing nothing (the channel, its versions, the daemon's
 * memfds); a closed channel nobody leases is freed: gone from the list,
 * its memfd closed. */
static void test_drop(void **state) {
  struct tbt_daemon *d = *state;
  int64_t shape[1] = {4096};
  struct tb_acquire_options o;
  struct tb_channel_info ci;
  struct tb_lease_info li;
  DLManagedTensorVersioned *t = NULL;
  char msg[512], want[96];
  tb_client *p, *c;
  tb_buffer *b;
  DLTensor ten;
  uint64_t psid;
  int memfds;
  cJSON *a;

  assert_tb_ok(tbt_connect(d, "drop-producer", &p));
  assert_tb_ok(tbt_connect(d, "drop-consumer", &c));
  psid = tb_client_session_id(p);
  assert_tb_ok(tb_host_buffer_create(p, 4096, 0, &b));
  host_tensor(&ten, b, shape);
  assert_tb_ok(tb_publish(p, "drop/me", &ten, NULL, NULL));
  assert_tb_ok(tb_publish(p, "drop/me", &ten, NULL, NULL));
  tb_acquire_options_init(&o);
  o.timeout_ms = 0;
  assert_tb_ok(tb_acquire(c, "drop/me", &o, &t));
  assert_tb_ok(tb_lease_info(t, &li));
  memfds = daemon_memfds(d);
  assert_true(memfds >= 1);

  /* open: refused, saying so */
  assert_int_equal(tbctl(d, 1, "drop", "drop/me", NULL), 1);
  if (strstr(g_out, "TB_EBUSY") == NULL || strstr(g_out, "is open") == NULL)
    fail_msg("tbctl drop of an open channel: %s", g_out);
  assert_tb_err(tb_channel_drop(c, "drop/me"), TB_EBUSY);

  /* closed but leased: refused, naming the lease */
  tb_client_disconnect(p);
  assert_tb_ok(tbt_wait_session_gone(c, psid));
  assert_tb_ok(channel_of(c, "drop/me", &ci));
  assert_true(ci.closed);
  assert_tb_err(tb_channel_drop(c, "drop/me"), TB_EBUSY);
  tb_client_last_error(c, msg, sizeof(msg));
  snprintf(want, sizeof(want), "lease %" PRIu64 " (session %" PRIu64,
           li.lease_id, tb_client_session_id(c));
  if (strstr(msg, want) == NULL)
    fail_msg("the refusal does not name the lease ('%s'): %s", want, msg);
  assert_int_equal(tbctl(d, 1, "drop", "drop/me", NULL), 1);
  assert_non_null(strstr(g_out, want));

  /* unknown */
  assert_tb_err(tb_channel_drop(c, "drop/nothing"), TB_ENOTFOUND);
  assert_int_equal(tbctl(d, 1, "drop", "drop/nothing", NULL), 1);
  assert_non_null(strstr(g_out, "no channel 'drop/nothing'"));
  assert_tb_err(tb_channel_drop(c, "bad//name"), TB_ENAME);

  /* nothing changed: the channel, its versions, the lease's data */
  assert_tb_ok(channel_of(c, "drop/me", &ci));
  assert_int_equal(ci.latest_version, 2);
  assert_int_equal(ci.versions_held, 1);
  assert_int_equal(ci.leases, 1);
  assert_int_equal(daemon_memfds(d), memfds);
  assert_tb_ok(tb_release(t, NULL));
  /* a round trip on c: its one-way release has been handled */
  assert_tb_ok(channel_of(c, "drop/me", &ci));
  assert_int_equal(ci.leases, 0);

  /* another uid may not, even now that nothing holds it */
  if (geteuid() == 0) {
    /* let uid 65534 reach the socket */
    assert_int_equal(chmod(d->dir, 0755), 0);
    assert_int_equal(chmod(d->sock, 0777), 0);
    assert_int_equal(drop_as_nobody(d, "drop/me"), 1);
    if (strstr(g_out, "TB_EPERM") == NULL ||
        strstr(g_out, "uid 65534 may not drop \"drop/me\": channel "
                      "\"drop/me\" belongs to uid 0 (default = owner)") ==
            NULL)
      fail_msg("tbctl drop as another uid: %s", g_out);
  } else {
    print_message("skipped: dropping as another uid needs root (setpriv)\n");
  }
  assert_tb_ok(channel_of(c, "drop/me", &ci));
  assert_int_equal(ci.versions_held, 1);
  assert_int_equal(daemon_memfds(d), memfds);

  /* closed and unleased: freed */
  assert_int_equal(tbctl(d, 0, "drop", "drop/me", NULL), 0);
  assert_non_null(strstr(g_out, "dropped channel 'drop/me'"));
  a = tbctl_json(d, "channels");
  assert_null(find_str(a, "name", "drop/me"));
  cJSON_Delete(a);
  assert_int_equal(daemon_memfds(d), memfds - 1);
  assert_tb_err(tb_channel_drop(c, "drop/me"), TB_ENOTFOUND);
  assert_int_equal(tbctl(d, 0, "--json", "drop", "drop/nothing"), 1);
  tb_client_disconnect(c);
}

/* More leases, waits and waiting names than one message holds
 * (--max-message 8192: about 150 leases or 180 waits a page): the lists
 * come whole, sorted, once each, through the API and tbctl; struct_size
 * spaces the entries. */
static void test_pages(void **state) {
  static const char *const extra[] = {"--max-message", "8192",
                                      "--max-metadata", "1024", NULL};
  enum { NLEASES = 300, NWAITS = 240 };
  struct tbt_daemon d;
  int64_t shape[1] = {64};
  int fds[NWAITS];
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t[NLEASES];
  struct tb_lease_entry *le = NULL;
  struct tb_wait_entry *we = NULL;
  struct tb_channel_info *ci = NULL;
  size_t n = 0;
  tb_client *p, *c;
  tb_buffer *b;
  DLTensor ten;
  cJSON *a;
  (void)state;

  memset(&d, 0, sizeof(d));
  assert_int_equal(tbt_daemon_start(&d, extra), 0);
  assert_tb_ok(tbt_connect(&d, "pages-producer", &p));
  assert_tb_ok(tbt_connect(&d, "pages-consumer", &c));
  assert_tb_ok(tb_host_buffer_create(p, 64, 0, &b));
  host_tensor(&ten, b, shape);
  assert_tb_ok(tb_publish(p, "pages/x", &ten, NULL, NULL));
  tb_acquire_options_init(&o);
  o.timeout_ms = 0;
  for (int i = 0; i < NLEASES; i++)
    assert_tb_ok(tb_acquire(c, "pages/x", &o, &t[i]));
  for (int i = 0; i < NWAITS; i++) {
    tb__request r = TENSORBROKER__V1__REQUEST__INIT;
    Tensorbroker__V1__Status st = TENSORBROKER__V1__STATUS__INIT;
    char name[64];
    fds[i] = raw_connect(&d);
    (void)raw_hello(fds[i]);
    snprintf(name, sizeof(name), "pages/wait-%03d", (i * 37) % NWAITS);
    raw_send_acquire(fds[i], 2, name, 0, 0, -1);
    /* answered after the acquire: it is parked */
    r.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
    r.status = &st;
    tb__server_message_free(raw_ok(fds[i], &r, 3));
  }

  /* the daemon's pages: each fits one message and says there is more */
  {
    Tensorbroker__V1__ListLeases ll = TENSORBROKER__V1__LIST_LEASES__INIT;
    Tensorbroker__V1__ListWaits lw = TENSORBROKER__V1__LIST_WAITS__INIT;
    tb__request r = TENSORBROKER__V1__REQUEST__INIT;
    tb__server_message *m;
    size_t pages = 0, got = 0;
    int more = 1;

    r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_LEASES;
    r.list_leases = &ll;
    while (more) {
      const Tensorbroker__V1__ListLeasesReply *lr;
      m = raw_ok(fds[0], &r, 10 + pages);
      lr = m->reply->list_leases;
      assert_non_null(lr);
      assert_true(tensorbroker__v1__server_message__get_packed_size(m) <=
                  8192);
      assert_true(lr->n_leases > 0);
      got += lr->n_leases;
      more = lr->more;
      ll.after_lease_id = lr->leases[lr->n_leases - 1]->lease_id;
      tb__server_message_free(m);
      pages++;
    }
    assert_int_equal(got, NLEASES);
    assert_true(pages >= 2);
    r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_WAITS;
    r.list_waits = &lw;
    m = raw_ok(fds[0], &r, 100);
    assert_true(m->reply->list_waits->more);
    assert_true(m->reply->list_waits->n_waits < NWAITS);
    assert_true(tensorbroker__v1__server_message__get_packed_size(m) <= 8192);
    tb__server_message_free(m);
  }

  assert_tb_ok(tb_list_leases(c, sizeof(*le), &le, &n));
  assert_int_equal(n, NLEASES);
  for (size_t i = 1; i < n; i++)
    assert_true(le[i].lease_id > le[i - 1].lease_id);
  tb_free(le);
  assert_tb_ok(tb_list_waits(c, sizeof(*we), &we, &n));
  assert_int_equal(n, NWAITS);
  for (size_t i = 1; i < n; i++)
    assert_true(we[i].session_id > we[i - 1].session_id);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(we[i].timeout_ms, -1);
  tb_free(we);
  assert_tb_ok(tb_list_channels(c, &ci, &n));
  assert_int_equal(n, NWAITS + 1);
  for (size_t i = 0; i < n; i++) {
    if (i > 0)
      assert_true(strcmp(ci[i].name, ci[i - 1].name) > 0);
    assert_int_equal(ci[i].waiting, strcmp(ci[i].name, "pages/x") != 0);
  }
  tb_free(ci);
  /* the 0.1.0 symbol, as programs built then call it: no waiting names */
  assert_tb_ok((tb_list_channels)(c, &ci, &n));
  assert_int_equal(n, 1);
  assert_string_equal(ci[0].name, "pages/x");
  tb_free(ci);

  /* a later, larger struct: entries that far apart, the rest zero */
  {
    size_t sz = sizeof(struct tb_lease_entry) + 24;
    unsigned char *raw = NULL;
    assert_tb_ok(tb_list_leases(c, sz, (struct tb_lease_entry **)&raw, &n));
    assert_int_equal(n, NLEASES);
    for (size_t i = 0; i < n; i++) {
      const struct tb_lease_entry *x = (const void *)(raw + i * sz);
      assert_string_equal(x->channel, "pages/x");
      assert_int_equal(x->bytes, 64);
      for (size_t k = sizeof(*x); k < sz; k++)
        assert_int_equal(raw[i * sz + k], 0);
    }
    tb_free(raw);
    assert_tb_err(tb_list_leases(c, sizeof(*le) - 8,
                                 (struct tb_lease_entry **)&raw, &n),
                  TB_EINVAL);
  }

  a = tbctl_json(&d, "leases");
  assert_int_equal(cJSON_GetArraySize(a), NLEASES);
  cJSON_Delete(a);
  a = tbctl_json(&d, "waits");
  assert_int_equal(cJSON_GetArraySize(a), NWAITS);
  cJSON_Delete(a);
  a = tbctl_json(&d, "channels");
  assert_int_equal(cJSON_GetArraySize(a), NWAITS + 1);
  cJSON_Delete(a);
  a = tbctl_json(&d, "sessions");
  assert_int_equal(cJSON_GetArraySize(a), NWAITS + 3);
  cJSON_Delete(a);
  assert_int_equal(tbctl(&d, 0, "--json", "status", NULL), 0);
  a = cJSON_Parse(g_out);
  assert_non_null(a);
  cJSON_Delete(a);

  for (int i = 0; i < NWAITS; i++)
    close(fds[i]);
  for (int i = 0; i < NLEASES; i++)
    assert_tb_ok(tb_release(t[i], NULL));
  tb_client_disconnect(c);
  tb_client_disconnect(p);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

/* More buffers than one message holds (--max-message 4096: about 70
 * entries a page): the daemon's pages fit, each says more while buffers
 * are left; tb_buffer_list and tbctl list them whole, once each,
 * ascending; struct_size spaces the entries. */
static void test_buffer_pages(void **state) {
  static const char *const extra[] = {"--max-message", "4096",
                                      "--max-metadata", "0", NULL};
  enum { NBUF = 160 };
  struct tbt_daemon d;
  tb_buffer *b[NBUF];
  struct tb_buffer_entry *be = NULL;
  size_t n = 0;
  tb_client *p;
  cJSON *a;
  int fd;
  (void)state;

  memset(&d, 0, sizeof(d));
  assert_int_equal(tbt_daemon_start(&d, extra), 0);
  assert_tb_ok(tbt_connect(&d, "pages-producer", &p));
  for (int i = 0; i < NBUF; i++)
    assert_tb_ok(tb_buffer_create_host(p, 64, 0, &b[i]));

  /* the daemon's pages */
  fd = raw_connect(&d);
  (void)raw_hello(fd);
  {
    Tensorbroker__V1__ListBuffers lb = TENSORBROKER__V1__LIST_BUFFERS__INIT;
    tb__request r = TENSORBROKER__V1__REQUEST__INIT;
    size_t pages = 0, got = 0;
    int more = 1;

    r.body_case = TENSORBROKER__V1__REQUEST__BODY_LIST_BUFFERS;
    r.list_buffers = &lb;
    while (more) {
      const Tensorbroker__V1__ListBuffersReply *lr;
      tb__server_message *m = raw_ok(fd, &r, 10 + pages);
      lr = m->reply->list_buffers;
      assert_non_null(lr);
      assert_true(tensorbroker__v1__server_message__get_packed_size(m) <=
                  4096);
      assert_true(lr->n_buffers > 0);
      for (size_t i = 0; i < lr->n_buffers; i++)
        assert_int_equal(lr->buffers[i]->buffer_id,
                         tb_buffer_id(b[got + i]));
      got += lr->n_buffers;
      more = lr->more;
      lb.after_buffer_id = lr->buffers[lr->n_buffers - 1]->buffer_id;
      tb__server_message_free(m);
      pages++;
    }
    assert_int_equal(got, NBUF);
    assert_true(pages >= 2);
  }
  close(fd);

  assert_tb_ok(tb_buffer_list(p, sizeof(*be), &be, &n));
  assert_int_equal(n, NBUF);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(be[i].buffer_id, tb_buffer_id(b[i]));
    assert_int_equal(be[i].size, 64);
  }
  tb_free(be);
  /* a later, larger struct: entries that far apart, the rest zero */
  {
    size_t sz = sizeof(struct tb_buffer_entry) + 16;
    unsigned char *raw = NULL;
    assert_tb_ok(tb_buffer_list(p, sz, (struct tb_buffer_entry **)&raw, &n));
    assert_int_equal(n, NBUF);
    for (size_t i = 0; i < n; i++) {
      const struct tb_buffer_entry *x = (const void *)(raw + i * sz);
      assert_int_equal(x->buffer_id, tb_buffer_id(b[i]));
      assert_string_equal(x->session_name, "pages-producer");
      for (size_t k = sizeof(*x); k < sz; k++)
        assert_int_equal(raw[i * sz + k], 0);
    }
    tb_free(raw);
  }
  a = tbctl_json(&d, "buffers");
  assert_int_equal(cJSON_GetArraySize(a), NBUF);
  for (int i = 0; i < NBUF; i++)
    assert_true(num(cJSON_GetArrayItem(a, i), "buffer_id") ==
                (double)tb_buffer_id(b[i]));
  cJSON_Delete(a);

  for (int i = 0; i < NBUF; i++)
    assert_tb_ok(tb_buffer_destroy(b[i]));
  tb_client_disconnect(p);
  assert_int_equal(tbt_daemon_stop(&d), 0);
  tbt_daemon_cleanup(&d);
}

/* A daemon without the operator's view: TB_ENOTSUP, saying why, and the
 * connection goes on (an unknown request would have ended it). */
static void test_older_daemon(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_lease_entry *le = NULL;
  struct tb_wait_entry *we = NULL;
  struct tb_status st;
  char msg[512];
  size_t n;
  tb_client *c;

  assert_tb_ok(tbt_connect(d, "old", &c));
  tb__client_set_features(c, 0);
  assert_tb_err(tb_list_leases(c, sizeof(*le), &le, &n), TB_ENOTSUP);
  tb_client_last_error(c, msg, sizeof(msg));
  assert_non_null(strstr(msg, "older than the operator's view"));
  assert_tb_err(tb_list_waits(c, sizeof(*we), &we, &n), TB_ENOTSUP);
  assert_tb_err(tb_channel_drop(c, "some/channel"), TB_ENOTSUP);
  assert_tb_ok(tb_daemon_status(c, &st));
  tb_client_disconnect(c);
}

/* A daemon with the operator's view but older than the buffers view (the
 * features of the release before it): tb_buffer_list is TB_ENOTSUP,
 * saying why, nothing is sent, and the connection goes on; the leases
 * still come. */
static void test_older_daemon_buffers(void **state) {
  struct tbt_daemon *d = *state;
  struct tb_buffer_entry *be = NULL;
  struct tb_lease_entry *le = NULL;
  uint64_t before, after;
  char msg[512];
  size_t n = 7;
  tb_client *c;

  assert_tb_ok(tbt_connect(d, "old-buffers", &c));
  tb__client_set_features(c,
                          TENSORBROKER__V1__FEATURE__FEATURE_ACQUIRE_RELEASE |
                              TENSORBROKER__V1__FEATURE__FEATURE_GOODBYE |
                              TENSORBROKER__V1__FEATURE__FEATURE_OPERATOR_VIEW |
                              TENSORBROKER__V1__FEATURE__FEATURE_METRICS |
                              TENSORBROKER__V1__FEATURE__FEATURE_CUDA_HOST |
                              TENSORBROKER__V1__FEATURE__FEATURE_CUDA_VMM);
  assert_tb_ok(tbt_own_requests(c, &before));
  assert_tb_err(tb_buffer_list(c, sizeof(*be), &be, &n), TB_ENOTSUP);
  assert_null(be);
  assert_int_equal(n, 7);
  tb_client_last_error(c, msg, sizeof(msg));
  if (strstr(msg, "does not list buffers") == NULL ||
      strstr(msg, "older than") == NULL ||
      strstr(msg, "FEATURE_BUFFER_LIST") == NULL)
    fail_msg("no clear reason: %s", msg);
  /* nothing went to the daemon: one request since, tbt_own_requests' */
  assert_tb_ok(tbt_own_requests(c, &after));
  assert_int_equal(after, before + 1);
  assert_tb_ok(tb_lease_list(c, sizeof(*le), &le, &n));
  assert_int_equal(n, 0);
  tb_free(le);
  tb_client_disconnect(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_views, tbt_setup, tbt_teardown),
      cmocka_unit_test_setup_teardown(test_drop, tbt_setup, tbt_teardown),
      cmocka_unit_test(test_pages),
      cmocka_unit_test(test_buffer_pages),
      cmocka_unit_test_setup_teardown(test_older_daemon, tbt_setup,
                                      tbt_teardown),
      cmocka_unit_test_setup_teardown(test_older_daemon_buffers, tbt_setup,
                                      tbt_teardown),
  };
  return cmocka_run_group_tests_name("operator", tests, NULL, NULL);
}
