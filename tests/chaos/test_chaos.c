/* SPDX-License-Identifier: Apache-2.0 */
/* Chaos: producers and consumers SIGKILLed at random while thousands of
 * checksummed frames go through the daemon; afterwards the daemon holds
 * nothing beyond its baseline.
 *
 * P producers each publish on their own channel (chaos/pN) from a ring of
 * slots in one host buffer, rewriting a slot only after tb_wait_free says
 * its last version is free. Every frame's bytes follow from its header
 * (producer, incarnation, sequence), and its metadata carries the header
 * and an FNV-1a checksum. C consumers acquire NEXT on random channels,
 * check every byte against the header and the checksum, check versions
 * only grow, and end their leases three ways (tb_release, the deleter,
 * riding on the next acquire). The test process counts the frames the
 * consumers verified (one byte each on their pipes) and, after a random
 * number of them, SIGKILLs a random producer or consumer and starts a new
 * one in its place. Producers publish on credits the test sends them, one
 * per frame of theirs verified, so they run at the consumers' pace: no
 * sleeps anywhere, every wait is for an event and bounded.
 *
 * Afterwards, with every child killed: one session (the test's own), no
 * lease, one buffer per channel (its newest version's: host memory
 * outlives its producer, docs/daemon.md) and the daemon's descriptors
 * those buffers' memfds more than before any child ran.
 *
 * Knobs (environment): TB_CHAOS_SEED (printed at start; set it to replay
 * a run), TB_CHAOS_FRAMES (default 10000), TB_CHAOS_PRODUCERS (2),
 * TB_CHAOS_CONSUMERS (3), TB_CHAOS_KILL_EVERY (frames between kills, on
 * average; 60). The long form: docs/testing.md and bench/stress.sh. */
#include "tb_test.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "stress.h"

#define MAX_P 8
#define MAX_C 16
#define SLOTS 4
#define CREDITS 4            /* frames a producer may publish ahead */
#define FRAME_MAX (16 * 1024)
#define FRAME_MIN 64
#define MAGIC 0x48435442u    /* "TBCH" */
#define ACQUIRE_TIMEOUT_MS 3000
#define STALL_MS 30000       /* no frame verified for this long: fail */

struct frame_head { /* the first bytes of every frame, and its metadata */
  uint32_t magic, producer, incarnation, len;
  uint64_t seq, fnv;
};

static struct tbt_daemon g_daemon;
static uint64_t g_seed;
static int g_producers, g_consumers;

static uint64_t fnv1a(const uint8_t *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;

  for (size_t i = 0; i < n; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* The bytes after the header, from the header alone. */
static void frame_fill(uint8_t *p, const struct frame_head *h) {
  uint64_t x = st_mix(st_mix(g_seed, h->producer),
                      ((uint64_t)h->incarnation << 32) ^ h->seq);

  for (size_t i = sizeof(*h); i < h->len; i += 8) {
    uint64_t v = st_next(&x);
    size_t n = h->len - i < 8 ? h->len - i : 8;
    memcpy(p + i, &v, n);
  }
}

struct role {
  int producer; /* else a consumer */
  int index;
  uint32_t incarnation;
};

/* ---- producer ---- */

static int producer_main(struct tbt_chan *ch, void *arg) {
  const struct role *r = arg;
  uint64_t x = st_mix(st_mix(g_seed, 1000 + r->index), r->incarnation);
  uint64_t slot_version[SLOTS] = {0};
  char name[32];
  tb_client *c;
  tb_buffer *b;

  snprintf(name, sizeof(name), "chaos/p%d", r->index);
  TBT_CHECK_OK(tbt_connect(&g_daemon, name, &c));
  TBT_CHECK_OK(tb_host_buffer_create(c, SLOTS * FRAME_MAX, 0, &b));
  for (uint64_t seq = 1;; seq++) {
    struct tb_publish_options o;
    struct frame_head h;
    uint8_t *p;
    int64_t shape[1];
    DLTensor t;
    char credit;
    ssize_t n;
    unsigned slot = (unsigned)(seq % SLOTS);

    do {
      n = read(ch->rd, &credit, 1);
    } while (n < 0 && errno == EINTR);
    if (n <= 0)
      break; /* the test is done with us */
    if (slot_version[slot] != 0)
      TBT_CHECK_OK(tb_wait_free(c, name, slot_version[slot], TBT_TIMEOUT_MS,
                                NULL));
    p = (uint8_t *)tb_buffer_data(b) + (size_t)slot * FRAME_MAX;
    memset(&h, 0, sizeof(h));
    h.magic = MAGIC;
    h.producer = (uint32_t)r->index;
    h.incarnation = r->incarnation;
    h.seq = seq;
    h.len = (uint32_t)(FRAME_MIN + st_next(&x) % (FRAME_MAX - FRAME_MIN + 1));
    memcpy(p, &h, sizeof(h));
    frame_fill(p, &h);
    h.fnv = fnv1a(p, h.len);
    memset(&t, 0, sizeof(t));
    shape[0] = h.len;
    t.data = p;
    t.device.device_type = kDLCPU;
    t.ndim = 1;
    t.dtype = (DLDataType){kDLUInt, 8, 1};
    t.shape = shape;
    tb_publish_options_init(&o);
    o.metadata = &h;
    o.metadata_len = sizeof(h);
    o.history_depth = 1;
    TBT_CHECK_OK(tb_publish(c, name, &t, &o, &slot_version[slot]));
  }
  tb_buffer_destroy(b);
  tb_client_disconnect(c);
  return 0;
}

/* ---- consumer ---- */

/* Everything a frame must be; prints what is wrong. */
static bool frame_ok(const DLManagedTensorVersioned *t, int channel) {
  static uint8_t want[FRAME_MAX];
  const uint8_t *p = t->dl_tensor.data;
  struct tb_lease_info info;
  struct frame_head h, meta;

  if (tb_lease_info(t, &info) != 0 || info.metadata_len != sizeof(meta)) {
    fprintf(stderr, "[consumer %d] chaos/p%d: no frame metadata\n",
            (int)getpid(), channel);
    return false;
  }
  memcpy(&meta, info.metadata, sizeof(meta));
  if (t->dl_tensor.ndim != 1 || t->dl_tensor.shape[0] != (int64_t)meta.len ||
      meta.len < FRAME_MIN || meta.len > FRAME_MAX || meta.magic != MAGIC ||
      meta.producer != (uint32_t)channel) {
    fprintf(stderr, "[consumer %d] chaos/p%d v%llu: bad metadata\n",
            (int)getpid(), channel, (unsigned long long)info.version);
    return false;
  }
  memcpy(&h, p, sizeof(h));
  h.fnv = meta.fnv;
  if (memcmp(&h, &meta, sizeof(h)) != 0) {
    fprintf(stderr,
            "[consumer %d] chaos/p%d v%llu: header (incarnation %u seq %llu) "
            "is not the published one (incarnation %u seq %llu)\n",
            (int)getpid(), channel, (unsigned long long)info.version,
            h.incarnation, (unsigned long long)h.seq, meta.incarnation,
            (unsigned long long)meta.seq);
    return false;
  }
  if (fnv1a(p, meta.len) != meta.fnv) {
    fprintf(stderr, "[consumer %d] chaos/p%d v%llu: checksum mismatch\n",
            (int)getpid(), channel, (unsigned long long)info.version);
    return false;
  }
  memcpy(want, &meta, sizeof(meta));
  frame_fill(want, &meta);
  if (memcmp(want + sizeof(meta), p + sizeof(meta),
             meta.len - sizeof(meta)) != 0) {
    fprintf(stderr, "[consumer %d] chaos/p%d v%llu: payload is not the "
            "producer's\n", (int)getpid(), channel,
            (unsigned long long)info.version);
    return false;
  }
  return true;
}

static int consumer_main(struct tbt_chan *ch, void *arg) {
  const struct role *r = arg;
  uint64_t x = st_mix(st_mix(g_seed, 2000 + r->index), r->incarnation);
  uint64_t last[MAX_P] = {0};
  DLManagedTensorVersioned *held = NULL;
  char name[32];
  tb_client *c;

  snprintf(name, sizeof(name), "chaos-c%d", r->index);
  TBT_CHECK_OK(tbt_connect(&g_daemon, name, &c));
  for (;;) {
    struct tb_acquire_options o;
    struct tb_lease_info info;
    DLManagedTensorVersioned *t = NULL;
    int i = (int)(st_next(&x) % (uint64_t)g_producers), rc;
    char byte = (char)('a' + i);

    snprintf(name, sizeof(name), "chaos/p%d", i);
    tb_acquire_options_init(&o);
    o.mode = TB_ACQUIRE_NEXT;
    o.version = last[i];
    o.timeout_ms = ACQUIRE_TIMEOUT_MS;
    o.release = held; /* ends with this call, whatever its outcome */
    held = NULL;
    rc = tb_acquire(c, name, &o, &t);
    if (rc == TB_ETIMEDOUT || rc == TB_ECLOSED || rc == TB_EAGAIN ||
        rc == TB_ENOTFOUND)
      continue; /* its producer is being replaced */
    TBT_CHECK_OK(rc);
    if (!frame_ok(t, i)) {
      (void)!write(ch->wr, "X", 1);
      _exit(3);
    }
    TBT_CHECK_OK(tb_lease_info(t, &info));
    if (info.version <= last[i]) {
      fprintf(stderr, "[consumer %d] chaos/p%d: NEXT after %llu gave %llu\n",
              (int)getpid(), i, (unsigned long long)last[i],
              (unsigned long long)info.version);
      (void)!write(ch->wr, "X", 1);
      _exit(3);
    }
    last[i] = info.version;
    switch (st_next(&x) % 3) {
    case 0:
      TBT_CHECK_OK(tb_release(t, NULL));
      break;
    case 1:
      t->deleter(t);
      break;
    default:
      held = t; /* released by the next acquire */
    }
    if (write(ch->wr, &byte, 1) != 1)
      _exit(0);
  }
}

/* ---- the test ---- */

struct child {
  struct role role;
  struct tbt_child proc;
  int credits_owed; /* credits not delivered yet (pipe full) */
};

static void give_credits(struct child *p, int n) {
  char buf[64];

  p->credits_owed += n;
  while (p->credits_owed > 0) {
    int k = p->credits_owed < (int)sizeof(buf) ? p->credits_owed
                                                : (int)sizeof(buf);
    ssize_t w;
    memset(buf, 'c', (size_t)k);
    w = write(p->proc.wr, buf, (size_t)k);
    if (w <= 0)
      break; /* it died; its successor starts with fresh credits */
    p->credits_owed -= (int)w;
  }
}

static void start(struct child *k) {
  k->credits_owed = 0;
  assert_tb_ok(tbt_child_start(&k->proc,
                               k->role.producer ? producer_main : consumer_main,
                               &k->role));
  if (k->role.producer)
    give_credits(k, CREDITS);
}

/* The daemon's state, printed when a check fails. */
static void dump(tb_client *obs) {
  struct tb_status st;
  struct tb_channel_info *ch = NULL;
  size_t n = 0;

  if (tb_daemon_status(obs, &st) == 0)
    fprintf(stderr, "daemon: %u sessions %u channels %u buffers %u leases, "
            "%d descriptors\n", st.sessions, st.channels, st.buffers,
            st.leases, st_proc_fds(g_daemon.pid));
  if (tb_list_channels(obs, &ch, &n) == 0) {
    for (size_t i = 0; i < n; i++)
      fprintf(stderr, "  %s: latest %llu held %u leases %u publisher %llu\n",
              ch[i].name, (unsigned long long)ch[i].latest_version,
              ch[i].versions_held, ch[i].leases,
              (unsigned long long)ch[i].publisher_session);
    tb_free(ch);
  }
}

static void test_chaos(void **state) {
  (void)state;
  long frames = st_env("TB_CHAOS_FRAMES", 10000);
  long every = st_env("TB_CHAOS_KILL_EVERY", 60);
  struct child kids[MAX_P + MAX_C];
  uint32_t incarnations = 0;
  long verified = 0, next_kill, kills_p = 0, kills_c = 0;
  long per_channel[MAX_P] = {0};
  uint64_t rng, t0, last_progress;
  int nkids, fds0, held_buffers, fds_now = -1;
  struct tb_status st = {0};
  tb_client *obs;
  const char *const args[] = {"--log-level", "warn", NULL};

  g_seed = (uint64_t)st_env("TB_CHAOS_SEED", 20240601);
  g_producers = (int)st_env("TB_CHAOS_PRODUCERS", 2);
  g_consumers = (int)st_env("TB_CHAOS_CONSUMERS", 3);
  assert_true(g_producers >= 1 && g_producers <= MAX_P);
  assert_true(g_consumers >= 1 && g_consumers <= MAX_C);
  if (every < 2)
    every = 2;
  printf("chaos: seed %llu (TB_CHAOS_SEED), %ld frames, %d producers, %d "
         "consumers, a kill every ~%ld frames\n",
         (unsigned long long)g_seed, frames, g_producers, g_consumers, every);
  fflush(stdout);
  rng = st_mix(g_seed, 42);
  signal(SIGPIPE, SIG_IGN);

  assert_tb_ok(tbt_daemon_start(&g_daemon, args));
  assert_tb_ok(tbt_connect(&g_daemon, "chaos-observer", &obs));
  assert_tb_ok(tb_daemon_status(obs, &st));
  fds0 = st_proc_fds(g_daemon.pid);
  assert_true(fds0 > 0);

  nkids = g_producers + g_consumers;
  for (int i = 0; i < nkids; i++) {
    kids[i].role.producer = i < g_producers;
    kids[i].role.index = i < g_producers ? i : i - g_producers;
    kids[i].role.incarnation = ++incarnations;
    start(&kids[i]);
  }
  next_kill = 1 + (long)(st_next(&rng) % (uint64_t)(2 * every));
  t0 = last_progress = tbt_now_ms();

  while (verified < frames) {
    struct pollfd pf[MAX_P + MAX_C];
    int rc;

    for (int i = 0; i < nkids; i++) {
      pf[i].fd = kids[i].proc.rd;
      pf[i].events = POLLIN;
      pf[i].revents = 0;
    }
    rc = poll(pf, (nfds_t)nkids, STALL_MS);
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc == 0 || tbt_now_ms() - last_progress > STALL_MS) {
      dump(obs);
      fail_msg("no frame verified for %d ms (%ld so far; seed %llu)",
               STALL_MS, verified, (unsigned long long)g_seed);
    }
    for (int i = 0; i < nkids; i++) {
      char buf[4096];
      ssize_t n;
      if (pf[i].revents == 0)
        continue;
      n = read(kids[i].proc.rd, buf, sizeof(buf));
      if (n <= 0) { /* it exited, and nobody killed it */
        pid_t pid = kids[i].proc.pid;
        int code = tbt_child_wait(&kids[i].proc, TBT_TIMEOUT_MS);
        dump(obs);
        fail_msg("%s %d (pid %d) exited with %d (seed %llu)",
                 kids[i].role.producer ? "producer" : "consumer",
                 kids[i].role.index, (int)pid, code,
                 (unsigned long long)g_seed);
      }
      for (ssize_t k = 0; k < n; k++) {
        int ch = buf[k] - 'a';
        if (buf[k] == 'X' || ch < 0 || ch >= g_producers) {
          tbt_child_wait(&kids[i].proc, TBT_TIMEOUT_MS);
          fail_msg("consumer %d saw a bad frame (its message above; seed "
                   "%llu)", kids[i].role.index, (unsigned long long)g_seed);
        }
        verified++;
        per_channel[ch]++;
        give_credits(&kids[ch], 1);
      }
      last_progress = tbt_now_ms();
    }
    while (verified >= next_kill && verified < frames) {
      int v = (int)(st_next(&rng) % (uint64_t)nkids);
      tbt_child_kill(&kids[v].proc); /* SIGKILL, reaped */
      if (kids[v].role.producer)
        kills_p++;
      else
        kills_c++;
      kids[v].role.incarnation = ++incarnations;
      start(&kids[v]);
      next_kill += 1 + (long)(st_next(&rng) % (uint64_t)(2 * every));
    }
  }
  for (int i = 0; i < nkids; i++)
    tbt_child_kill(&kids[i].proc);

  /* The daemon learns of the deaths in its own time: each status round
   * trip below is a wait on it (it ends sessions before it answers,
   * docs/daemon.md "Ordering"). A closed socket's descriptor goes in its
   * loop's next closing phase, hence the loop over the count too. */
  {
    uint64_t deadline = tbt_now_ms() + TBT_TIMEOUT_MS;
    struct tb_channel_info *ch = NULL;
    size_t n = 0;
    bool done = false;

    while (!done && tbt_now_ms() < deadline) {
      assert_tb_ok(tb_daemon_status(obs, &st));
      fds_now = st_proc_fds(g_daemon.pid);
      done = st.sessions == 1 && st.leases == 0 &&
             fds_now == fds0 + (int)st.buffers;
    }
    assert_tb_ok(tb_list_channels(obs, &ch, &n));
    held_buffers = 0;
    for (size_t i = 0; i < n; i++) {
      if (ch[i].leases != 0 || ch[i].versions_held > 1 ||
          ch[i].publisher_session != 0) {
        dump(obs);
        fail_msg("%s keeps %u versions, %u leases, publisher %llu", ch[i].name,
                 ch[i].versions_held, ch[i].leases,
                 (unsigned long long)ch[i].publisher_session);
      }
      held_buffers += (int)ch[i].versions_held;
    }
    tb_free(ch);
    if (!done || st.buffers != (uint32_t)held_buffers) {
      dump(obs);
      fail_msg("after the children: %u sessions (1 expected), %u leases (0), "
               "%u buffers (%d), %d daemon descriptors (%d + %d); seed %llu",
               st.sessions, st.leases, st.buffers, held_buffers, fds_now, fds0,
               held_buffers, (unsigned long long)g_seed);
    }
  }
  printf("chaos: %ld frames verified (", verified);
  for (int i = 0; i < g_producers; i++)
    printf("%s%ld", i ? " + " : "", per_channel[i]);
  printf(") in %.2f s, %ld producers and %ld consumers killed; after: %u "
         "session, %u leases, %u buffers, %d descriptors (baseline %d)\n",
         (double)(tbt_now_ms() - t0) / 1000.0, kills_p, kills_c, st.sessions,
         st.leases, st.buffers, fds_now, fds0);
  tb_client_disconnect(obs);
  assert_int_equal(tbt_daemon_stop(&g_daemon), 0);
  tbt_daemon_cleanup(&g_daemon);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chaos),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
