/* SPDX-License-Identifier: Apache-2.0 */
/* Scenario 8: flat costs (issue 21). An acquire's and a publish's round
 * trip should not grow with what else the daemon holds:
 *
 * - parked acquires on other channels: 0, 100, 1,000 and 10,000 sessions
 *   each park one acquire (as daemons before FEATURE_MULTI_WAIT did) on
 *   channels that do not exist yet, with deadlines an hour away, spread
 *   over 64 names; the client times an unrelated acquire (LATEST of an
 *   existing channel, released untimed) and a publish on a third channel
 *   (history depth 1);
 * - history depth: a channel filled to depth 1, 1,024, 16,384 and 65,536;
 *   the client times a publish into it (which pushes the oldest version
 *   out) and EXACT acquires of its oldest and its newest version.
 *
 * Each row has a daemon of its own, and one client process times the rows
 * of a part in turns, so that a shared machine's slow and fast moments
 * fall on all of them alike. The parked sessions are raw connections of
 * one holder process per row (Hello, Acquire, then Status: its reply with
 * no acquire reply before it shows that the acquire parked), so that
 * 10,000 of them cost no threads. It prints figures and asserts nothing
 * about time. */
#include "bench.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "tb_proto.h"

#define FLAT_ELEMS 16
#define FLAT_PARK_NAMES 64
#define FLAT_MAX_ROWS 4

/* ---- the holder of parked acquires ---- */

struct park_arg {
  const char *sock;
  long n;
  int ready_wr; /* 'w': all parked; 'l': the daemon refused sessions; 'x' */
  struct tbb_gate *gate;
};

/* 0, or -1 when the datagram could not go: a daemon that refused the
 * session (its Hello's reply says so) may have closed it already. */
static int park_send(int fd, Tensorbroker__V1__Request *q) {
  uint8_t buf[512];
  long n = tb__request_encode(q, buf, sizeof(buf));

  if (n <= 0)
    return -1;
  return send(fd, buf, (size_t)n, MSG_NOSIGNAL) == n ? 0 : -1;
}

/* Connect, say Hello, park an acquire, ask for Status. Returns the
 * socket, or -1 when it could not connect. */
static int park_open(const char *sock, long i) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  Tensorbroker__V1__Request q = TENSORBROKER__V1__REQUEST__INIT;
  Tensorbroker__V1__Hello h = TENSORBROKER__V1__HELLO__INIT;
  Tensorbroker__V1__Acquire a = TENSORBROKER__V1__ACQUIRE__INIT;
  Tensorbroker__V1__Status st = TENSORBROKER__V1__STATUS__INIT;
  char name[64];
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

  if (fd < 0)
    return -1;
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
    goto out_close;
  q.request_id = 1;
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_HELLO;
  q.hello = &h;
  h.protocol_version = TB_PROTOCOL_VERSION;
  h.client_name = "bench-parked";
  if (park_send(fd, &q) < 0)
    return fd;
  snprintf(name, sizeof(name), "bench/flat/parked/%ld", i % FLAT_PARK_NAMES);
  q.request_id = 2;
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_ACQUIRE;
  q.acquire = &a;
  a.channel = name;
  a.mode = TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_LATEST;
  /* an hour, give or take: none runs out, and they are not in order */
  a.timeout_ms = 3600000 + (i * 7919) % 100003;
  if (park_send(fd, &q) < 0)
    return fd;
  q.request_id = 3;
  q.body_case = TENSORBROKER__V1__REQUEST__BODY_STATUS;
  q.status = &st;
  (void)park_send(fd, &q);
  return fd;

out_close:
  close(fd);
  return -1;
}

/* Read fd's replies up to Status's: 0 when the acquire parked, 1 when the
 * daemon refused the session (its Hello answered TB_ELIMIT, or closed
 * unanswered: a daemon with many refusals pending closes some at once),
 * -1 otherwise. */
static int park_check(int fd) {
  static uint8_t buf[1 << 16];
  bool hello = false;

  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    tb__server_message *m;
    long n;
    int rc = -1;

    if (poll(&p, 1, 60000) != 1)
      return -1;
    n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0)
      return hello ? -1 : 1;
    if (tb__server_message_decode(buf, (size_t)n, &m) < 0)
      return -1;
    if (m->body_case != TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY) {
      tb__server_message_free(m); /* a notice */
      continue;
    }
    switch (m->reply->request_id) {
    case 1: /* Hello */
      rc = m->reply->status == 0 ? 2 : m->reply->status == TB_ELIMIT ? 1 : -1;
      hello = true;
      break;
    case 3: /* Status, and no reply to the acquire before it */
      rc = m->reply->status == 0 ? 0 : -1;
      break;
    default: /* the acquire was answered: it did not park */
      fprintf(stderr, "flat: acquire answered %s: %s\n",
              tb_err_name(m->reply->status),
              m->reply->message ? m->reply->message : "");
      break;
    }
    tb__server_message_free(m);
    if (rc != 2)
      return rc;
  }
}

static int park_holder(void *p) {
  struct park_arg *a = p;
  int *fds = calloc((size_t)a->n, sizeof(*fds));
  long opened = 0, refused = 0;
  char verdict = 'w';

  if (fds == NULL)
    return 2;
  tbb_raise_nofile(a->n + 64);
  for (; opened < a->n; opened++) {
    fds[opened] = park_open(a->sock, opened);
    if (fds[opened] < 0) {
      fprintf(stderr, "flat: parked session %ld: %s\n", opened,
              strerror(errno));
      verdict = 'x';
      break;
    }
  }
  for (long i = 0; i < opened && verdict == 'w'; i++) {
    int rc = park_check(fds[i]);
    if (rc == 1)
      refused++;
    else if (rc < 0)
      verdict = 'x';
  }
  if (verdict == 'w' && refused > 0) {
    fprintf(stderr, "flat: the daemon refused %ld of %ld sessions\n", refused,
            a->n);
    verdict = 'l';
  }
  tbb_write_byte(a->ready_wr, verdict);
  if (verdict == 'w')
    tbb_gate_wait(a->gate);
  for (long i = 0; i < opened; i++)
    close(fds[i]);
  free(fds);
  return verdict == 'x' ? 3 : 0;
}

/* Start a holder of n parked acquires, which waits on gate (one for all
 * holders: a holder forked later would keep an earlier one's gate open);
 * returns its pid once they are parked, 0 when the daemon refused
 * sessions (a per-uid limit), -1 on a failure. */
static pid_t park_start(const char *sock, long n, struct tbb_gate *gate) {
  int ready[2];
  char b = 0;
  pid_t pid;

  if (tbb_pipe(ready) < 0)
    return -1;
  struct park_arg pa = {.sock = sock, .n = n, .ready_wr = ready[1],
                        .gate = gate};
  pid = tbb_spawn(park_holder, &pa);
  close(ready[1]);
  tbb_read_byte(ready[0], &b);
  close(ready[0]);
  if (b == 'w')
    return pid;
  tbb_reap(pid); /* it did not wait */
  return b == 'l' ? 0 : -1;
}

/* ---- the timed client ---- */

/* One client process times every row of a part, each row on its own
 * daemon, in turns: blocks of each row in a round, several rounds, so
 * that a shared machine's slow and fast moments fall on all rows alike. */
struct flat_arg {
  int n;                            /* rows (daemons) */
  const char *sock[FLAT_MAX_ROWS];
  long depth[FLAT_MAX_ROWS];        /* 0: the parked part */
  long iters, warm, rounds;
  uint64_t *lat;                    /* [row][3][iters]: FLAT_LAT */
};

#define FLAT_LAT(a, row, j) ((a)->lat + ((size_t)(row) * 3 + (j)) * (a)->iters)

struct flat_client {
  tb_client *pc, *cc;
  tb_buffer *b;
  DLTensor t;
  int64_t shape[1];
  char channel[64]; /* the depth part's deep channel */
  uint64_t latest;
};

static int flat_connect(struct flat_client *f, const char *sock) {
  int rc;

  rc = tbb_connect(sock, "bench-flat-producer", TB_CONTRACT_SPEC, &f->pc);
  if (rc == 0)
    rc = tbb_connect(sock, "bench-flat-consumer", TB_CONTRACT_SPEC, &f->cc);
  if (rc == 0)
    rc = tb_buffer_create_host(f->pc, 4096, 0, &f->b);
  if (rc < 0) {
    fprintf(stderr, "flat: connect: %s\n", tb_strerror(rc));
    return rc;
  }
  f->shape[0] = FLAT_ELEMS;
  f->t = (DLTensor){.data = tb_buffer_data(f->b), .device = {kDLCPU, 0},
                    .ndim = 1, .dtype = {kDLFloat, 32, 1},
                    .shape = f->shape};
  return 0;
}

static void flat_disconnect(struct flat_client *f) {
  tb_buffer_destroy(f->b);
  tb_client_disconnect(f->cc);
  tb_client_disconnect(f->pc);
}

/* Publish (timed into *ns when ns is not NULL). */
static int flat_publish(struct flat_client *f, const char *channel,
                        long depth, uint64_t *ns) {
  struct tb_publish_options po;
  uint64_t t0;
  int rc;

  tb_publish_options_init(&po);
  po.history_depth = (uint32_t)depth;
  t0 = tbb_now_ns();
  rc = tb_channel_publish(f->pc, channel, &f->t, &po, &f->latest);
  if (ns != NULL)
    *ns = tbb_now_ns() - t0;
  if (rc < 0)
    fprintf(stderr, "flat: publish %s: %s\n", channel, tb_strerror(rc));
  return rc;
}

/* Acquire (timed into *ns), then release (not timed). */
static int flat_acquire(struct flat_client *f, const char *channel, int mode,
                        uint64_t version, uint64_t *ns) {
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t;
  uint64_t t0;
  int rc;

  tb_acquire_options_init(&o);
  o.mode = mode;
  o.version = version;
  o.timeout_ms = 0;
  t0 = tbb_now_ns();
  rc = tb_lease_acquire(f->cc, channel, &o, &t);
  *ns = tbb_now_ns() - t0;
  if (rc == 0)
    rc = tb_lease_release(t, NULL);
  if (rc < 0)
    fprintf(stderr, "flat: acquire %s@%llu: %s\n", channel,
            (unsigned long long)version, tb_strerror(rc));
  return rc;
}

/* One cycle of a row, its times into ns[0..3): parked part, an unrelated
 * acquire and a publish on a third channel; depth part, a publish into
 * the deep channel (it pushes the oldest out), then EXACT acquires of the
 * oldest and of the newest version. */
static int flat_cycle(struct flat_client *f, long depth, uint64_t ns[3]) {
  int rc;

  if (depth == 0) {
    rc = flat_acquire(f, "bench/flat/acquired", TB_ACQUIRE_LATEST, 0, &ns[0]);
    if (rc == 0)
      rc = flat_publish(f, "bench/flat/published", 1, &ns[1]);
    return rc;
  }
  rc = flat_publish(f, f->channel, depth, &ns[0]);
  if (rc == 0)
    rc = flat_acquire(f, f->channel, TB_ACQUIRE_EXACT,
                      f->latest - (uint64_t)depth + 1, &ns[1]);
  if (rc == 0)
    rc = flat_acquire(f, f->channel, TB_ACQUIRE_EXACT, f->latest, &ns[2]);
  return rc;
}

static int flat_main(void *p) {
  struct flat_arg *a = p;
  struct flat_client f[FLAT_MAX_ROWS];
  long per = (a->iters + a->rounds - 1) / a->rounds;
  uint64_t ns[3];
  int rc = 0;

  memset(f, 0, sizeof(f));
  for (int k = 0; rc == 0 && k < a->n; k++) {
    rc = flat_connect(&f[k], a->sock[k]);
    snprintf(f[k].channel, sizeof(f[k].channel), "bench/flat/depth/%ld",
             a->depth[k]);
    if (rc == 0 && a->depth[k] == 0)
      rc = flat_publish(&f[k], "bench/flat/acquired", 1, NULL);
    for (long i = 0; rc == 0 && i < a->depth[k]; i++) /* fill, untimed */
      rc = flat_publish(&f[k], f[k].channel, a->depth[k], NULL);
    for (long i = 0; rc == 0 && i < a->warm; i++)
      rc = flat_cycle(&f[k], a->depth[k], ns);
  }
  for (long r = 0; rc == 0 && r < a->rounds; r++) {
    for (int k = 0; rc == 0 && k < a->n; k++) {
      for (long i = r * per; rc == 0 && i < a->iters && i < (r + 1) * per;
           i++) {
        rc = flat_cycle(&f[k], a->depth[k], ns);
        for (int j = 0; j < 3; j++)
          FLAT_LAT(a, k, j)[i] = ns[j];
      }
    }
  }
  for (int k = 0; k < a->n; k++)
    flat_disconnect(&f[k]);
  return rc < 0 ? 2 : 0;
}

/* ---- the daemon ---- */

/* Whether the daemon under test lists option in its --help (options that
 * older daemons lack are passed only to those that know them). */
static int daemon_has_option(const char *option) {
  char out[16384];
  size_t got = 0;
  int p[2], found;
  pid_t pid;

  if (tbb_pipe(p) < 0)
    return 0;
  fflush(stdout);
  pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return 0;
  }
  if (pid == 0) {
    dup2(p[1], STDOUT_FILENO);
    execl(tbb_opt.daemon_path, tbb_opt.daemon_path, "--help", (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  for (;;) {
    ssize_t r = read(p[0], out + got, sizeof(out) - 1 - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    got += (size_t)r;
  }
  close(p[0]);
  tbb_reap(pid);
  out[got] = 0;
  found = 0;
  for (const char *s = out; (s = strstr(s, option)) != NULL; s++) {
    char after = s[strlen(option)];
    if (after == ' ' || after == '=' || after == '\n')
      found = 1;
  }
  return found;
}

static int flat_daemon_start(struct tbb_daemon *d, long sessions) {
  /* the bench's sessions are all of one uid */
  static const char *const per_uid[] = {"--max-sessions-per-uid",
                                        "--max-sessions-uid"};
  char nsess[32];
  const char *extra[8];
  int n = 0;

  snprintf(nsess, sizeof(nsess), "%ld", sessions);
  extra[n++] = "--max-sessions";
  extra[n++] = nsess;
  extra[n++] = "--max-history";
  extra[n++] = "65536";
  for (size_t i = 0; i < sizeof(per_uid) / sizeof(per_uid[0]); i++) {
    if (daemon_has_option(per_uid[i])) {
      extra[n++] = per_uid[i];
      extra[n++] = nsess;
      break;
    }
  }
  extra[n] = NULL;
  if (tbb_daemon_start(d, extra) < 0) {
    tbb_failed("daemon did not start");
    return -1;
  }
  return 0;
}

/* ---- the scenario ---- */

static void flat_stop_all(struct tbb_daemon *d, int n) {
  for (int k = 0; k < n; k++)
    tbb_daemon_stop(&d[k]);
}

/* The parked part: a daemon per row, row k with parked[k] acquires. */
static void flat_parked(struct flat_arg *fa, const long *parked, int n,
                        double p50[2][FLAT_MAX_ROWS]) {
  struct tbb_daemon d[FLAT_MAX_ROWS];
  struct tbb_gate gate;
  pid_t holder[FLAT_MAX_ROWS] = {0};
  int up = 0;

  if (tbb_gate_init(&gate) < 0) {
    tbb_failed("no pipe for the parked rows");
    return;
  }
  for (; up < n; up++) {
    if (flat_daemon_start(&d[up], parked[up] + 64) < 0)
      break;
    fa->sock[up] = d[up].sock;
    fa->depth[up] = 0;
    if (parked[up] == 0)
      continue;
    holder[up] = park_start(d[up].sock, parked[up], &gate);
    if (holder[up] == 0)
      tbb_note("the daemon would not take %ld sessions of one uid: rows "
               "from %ld parked acquires on skipped",
               parked[up], parked[up]);
    else if (holder[up] < 0)
      tbb_failed("could not park %ld acquires", parked[up]);
    if (holder[up] <= 0) {
      holder[up] = 0;
      tbb_daemon_stop(&d[up]);
      break;
    }
  }
  fa->n = up;
  if (up > 0 && tbb_reap(tbb_spawn(flat_main, fa)) == 0) {
    for (int k = 0; k < up; k++) {
      char an[64], pn[64];
      struct tbb_summary s;
      snprintf(an, sizeof(an), "acquire, %ld parked", parked[k]);
      snprintf(pn, sizeof(pn), "publish, %ld parked", parked[k]);
      tbb_row_latency(an, FLAT_LAT(fa, k, 0), (size_t)fa->iters,
                      k > 0 ? "acquire, 0 parked" : NULL);
      tbb_row_latency(pn, FLAT_LAT(fa, k, 1), (size_t)fa->iters,
                      k > 0 ? "publish, 0 parked" : NULL);
      for (int j = 0; j < 2; j++) {
        tbb_summarise(FLAT_LAT(fa, k, j), (size_t)fa->iters, &s);
        p50[j][k] = s.p50_us;
      }
    }
  } else if (up > 0) {
    tbb_failed("the parked rows did not run");
  }
  tbb_gate_open(&gate);
  for (int k = 0; k < up; k++)
    if (holder[k] > 0)
      tbb_reap(holder[k]);
  tbb_gate_close(&gate);
  flat_stop_all(d, up);
}

/* The depth part: a daemon per row, row k with a channel depths[k] deep. */
static void flat_depths(struct flat_arg *fa, const long *depths, int n,
                        double p50[3][FLAT_MAX_ROWS]) {
  struct tbb_daemon d[FLAT_MAX_ROWS];
  int up = 0;

  for (; up < n; up++) {
    if (flat_daemon_start(&d[up], 64) < 0)
      break;
    fa->sock[up] = d[up].sock;
    fa->depth[up] = depths[up];
  }
  fa->n = up;
  if (up > 0 && tbb_reap(tbb_spawn(flat_main, fa)) == 0) {
    static const char *const what[3] = {"publish", "EXACT oldest",
                                        "EXACT newest"};
    for (int j = 0; j < 3; j++) {
      for (int k = 0; k < up; k++) {
        char name[64], base[64];
        struct tbb_summary s;
        snprintf(name, sizeof(name), "%s, depth %ld", what[j], depths[k]);
        snprintf(base, sizeof(base), "%s, depth %ld", what[j], depths[0]);
        tbb_row_latency(name, FLAT_LAT(fa, k, j), (size_t)fa->iters,
                        k > 0 ? base : NULL);
        tbb_summarise(FLAT_LAT(fa, k, j), (size_t)fa->iters, &s);
        p50[j][k] = s.p50_us;
      }
    }
  } else if (up > 0) {
    tbb_failed("the depth rows did not run");
  }
  flat_stop_all(d, up);
}

void tbb_scenario_flat(void) {
  static const long parked_full[] = {0, 100, 1000, 10000};
  static const long parked_smoke[] = {0, 10, 100};
  static const long depth_full[] = {1, 1024, 16384, 65536};
  static const long depth_smoke[] = {1, 64, 1024};
  const long *parked = tbb_opt.smoke ? parked_smoke : parked_full;
  const long *depths = tbb_opt.smoke ? depth_smoke : depth_full;
  int nparked = tbb_opt.smoke ? 3 : 4, ndepths = tbb_opt.smoke ? 3 : 4;
  long iters = tbb_scale(2000, 500, 50), total = 0;
  size_t bytes = sizeof(uint64_t) * FLAT_MAX_ROWS * 3 * (size_t)iters;
  double p50[2][FLAT_MAX_ROWS] = {{0}}, dp50[3][FLAT_MAX_ROWS] = {{0}};
  char how[640];

  snprintf(how, sizeof(how),
           "p50 of an acquire (LATEST of another channel) and of a publish "
           "(depth 1) beside N acquires parked by N sessions on %d other "
           "channels, deadlines an hour away; then of a publish into a "
           "channel of history depth D (each pushes the oldest out) and of "
           "EXACT acquires of its oldest and newest version. A daemon per "
           "row, the rows of a part timed in turns (%d rounds); %ld of "
           "each, unpinned",
           FLAT_PARK_NAMES, (int)tbb_scale(10, 5, 2), iters);
  tbb_section("8", "flat costs: parked acquires and deep histories", how);
  uint64_t *lat = tbb_shared_alloc(bytes);
  struct flat_arg fa = {.iters = iters, .warm = iters / 10 + 20,
                        .rounds = tbb_scale(10, 5, 2), .lat = lat};

  for (int k = 0; k < nparked; k++)
    total += parked[k] + 64;
  long lim = tbb_raise_nofile(total + 256);
  while (nparked > 1 && lim < parked[nparked - 1] + 256)
    nparked--;
  if (nparked < (tbb_opt.smoke ? 3 : 4))
    tbb_note("RLIMIT_NOFILE %ld: rows up to %ld parked acquires", lim,
             parked[nparked - 1]);
  flat_parked(&fa, parked, nparked, p50);
  flat_depths(&fa, depths, ndepths, dp50);

  /* the same p50s side by side */
  printf("\n   %-10s %14s %14s\n", "parked", "acquire p50", "publish p50");
  for (int k = 0; k < nparked; k++)
    if (p50[0][k] > 0)
      printf("   %-10ld %11.2f us %11.2f us\n", parked[k], p50[0][k],
             p50[1][k]);
  printf("\n   %-10s %14s %14s %14s\n", "depth", "publish p50",
         "EXACT oldest", "EXACT newest");
  for (int k = 0; k < ndepths; k++)
    if (dp50[0][k] > 0)
      printf("   %-10ld %11.2f us %11.2f us %11.2f us\n", depths[k],
             dp50[0][k], dp50[1][k], dp50[2][k]);
  tbb_shared_free(lat, bytes);
}
