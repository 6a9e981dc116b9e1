/* SPDX-License-Identifier: Apache-2.0 */
/* On which stream each CUDA done event is recorded, for every way a lease
 * can end (docs/cuda.md, "When a lease ends"), checked on a CPU with the
 * fake CUDA driver (tests/fakecuda), whose call log names every stream and
 * event. One process holds a producer client and a consumer client of the
 * real daemon; busy mode makes every stream look busy, so no record is
 * skipped as idle.
 *
 * Each case: the producer publishes version V from buffer A on its stream
 * sp; the consumer acquires it and declares streams its own way; the lease
 * ends its own way; the log must show the consumer's done event E recorded
 * where the case says (and nowhere else); then the producer publishes
 * version V+1 from buffer B and tb_wait_free(V) must make sp wait on E
 * (the event the producer waits for is the one recorded there), or on
 * nothing when the consumer declared no stream. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_internal.h" /* the VersionFree table */
#include "cuda/driver.h"
#include "cuda/kind_ipc.h" /* TB__READY_EVENTS_MAX */
#include "fake_libcuda.h"
#include "harness.h"

#define CH "fake/frames"
#define NWORDS 1024

static const struct tb_cuda *cu;
static const struct fakecuda_hooks *fk;
static struct tbt_daemon daemon_;
static tb_client *prod, *cons;
static tb_cu_context ctx;
static tb_cu_stream sp; /* the producer's stream */
static tb_cu_deviceptr buf[2];
static int next_buf;
static char done_ev[64]; /* the consumer's done event, as the log names it */

static const char *sname(tb_cu_stream s) { return fk->stream_name(s); }

static tb_cu_stream new_stream(void) {
  tb_cu_stream s = NULL;
  assert_int_equal(cu->cuStreamCreate(&s, TB_CU_STREAM_NON_BLOCKING), 0);
  return s;
}

static void show_log(void) {
  char text[8192];
  fk->log_read(text, sizeof(text));
  fprintf(stderr, "---- fake CUDA log ----\n%s----\n", text);
}

/* Lines "record E on S" of the done event: the count, all streams. */
static size_t done_records(void) {
  char text[16384], pre[80];
  size_t n = 0;
  const char *line;

  fk->log_read(text, sizeof(text));
  snprintf(pre, sizeof(pre), "record %s on ", done_ev);
  for (line = text; line != NULL && *line != '\0';) {
    const char *b;
    size_t len;
    if (fakecuda_line_body(line, 0, &b, &len) && len > strlen(pre) &&
        strncmp(b, pre, strlen(pre)) == 0)
      n++;
    line = strchr(line, '\n');
    if (line != NULL)
      line++;
  }
  return n;
}

/* Every record of the done event on another stream than its previous
 * record must come after a wait of that stream on the event: CUDA waits
 * for an event's latest record only, so a record that does not follow the
 * previous one would let a producer waiting on it rewrite a version whose
 * reads, marked by the previous record, still run. Checks the log since
 * its last clear. */
static void assert_records_cover(void) {
  char text[16384], rec[80], prev[32] = "", body[128];
  const char *line, *since = NULL;

  fk->log_read(text, sizeof(text));
  snprintf(rec, sizeof(rec), "record %s on ", done_ev);
  for (line = text; line != NULL && *line != '\0';) {
    const char *b;
    size_t len, rl = strlen(rec);
    if (fakecuda_line_body(line, 0, &b, &len) && len > rl &&
        strncmp(b, rec, rl) == 0) {
      char on[32];
      snprintf(on, sizeof(on), "%.*s", (int)(len - rl), b + rl);
      if (prev[0] != '\0' && strcmp(on, prev) != 0) {
        char *between = strndup(since, (size_t)(line - since));
        assert_non_null(between);
        snprintf(body, sizeof(body), "wait %s on %s", on, done_ev);
        if (fakecuda_text_count(between, 0, body) == 0) {
          show_log();
          fail_msg("%s recorded on %s after a record on %s, with no \"%s\" "
                   "in between", done_ev, on, prev, body);
        }
        free(between);
      }
      snprintf(prev, sizeof(prev), "%s", on);
      since = line;
    }
    line = strchr(line, '\n');
    if (line != NULL)
      line++;
  }
}

static void assert_done_on(const char *stream) {
  char body[128];
  snprintf(body, sizeof(body), "record %s on %s", done_ev, stream);
  if (fk->log_count(body) != 1 || done_records() != 1) {
    show_log();
    fail_msg("expected exactly one \"%s\"", body);
  }
}

static uint64_t publish(void) {
  struct tb_publish_options po;
  int64_t shape[1] = {NWORDS};
  DLTensor t;
  uint64_t v = 0;

  memset(&t, 0, sizeof(t));
  t.data = (void *)(uintptr_t)buf[next_buf];
  next_buf ^= 1;
  t.device.device_type = kDLCUDA;
  t.ndim = 1;
  t.dtype.code = kDLUInt;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  tb_publish_options_init(&po);
  po.stream = sp;
  po.history_depth = 1;
  assert_int_equal(tb_publish(prod, CH, &t, &po, &v), 0);
  return v;
}

static DLManagedTensorVersioned *acquire(uint64_t v, void *stream) {
  struct tb_acquire_options ao;
  DLManagedTensorVersioned *t = NULL;

  tb_acquire_options_init(&ao);
  ao.mode = TB_ACQUIRE_EXACT;
  ao.version = v;
  ao.timeout_ms = TBT_TIMEOUT_MS;
  ao.stream = stream;
  assert_int_equal(tb_acquire(cons, CH, &ao, &t), 0);
  return t;
}

/* The producer moves on and reuses V's buffer: wait_free(V) on sp must
 * wait on the done event (want 1) or on nothing (want 0). */
static void producer_reuses(uint64_t v, int want) {
  char body[128];
  (void)publish();
  fk->log_clear();
  assert_int_equal(tb_wait_free(prod, CH, v, TBT_TIMEOUT_MS, sp), 0);
  snprintf(body, sizeof(body), "wait %s on %s", sname(sp), done_ev);
  if (fk->log_count(body) != (size_t)want) {
    show_log();
    fail_msg("tb_wait_free: expected %d \"%s\"", want, body);
  }
}

static int group_setup(void **state) {
  tb_cu_device dev;
  (void)state;
  fk = fakecuda();
  if (fk == NULL || tb_cuda_available() != 0) {
    fprintf(stderr, "the fake CUDA driver is not what libcuda.so.1 loads "
            "here: skipped\n");
    exit(77);
  }
  assert_int_equal(tb__cuda_load(&cu), 0);
  assert_int_equal(cu->cuDeviceGet(&dev, 0), 0);
  assert_int_equal(cu->cuDevicePrimaryCtxRetain(&ctx, dev), 0);
  assert_int_equal(cu->cuCtxSetCurrent(ctx), 0);
  fk->set_busy(1);
  if (tbt_daemon_start(&daemon_, NULL) != 0)
    fail_msg("daemon did not start");
  assert_int_equal(tbt_connect(&daemon_, "producer", &prod), 0);
  assert_int_equal(tbt_connect(&daemon_, "consumer", &cons), 0);
  sp = new_stream();
  assert_int_equal(cu->cuMemAlloc(&buf[0], NWORDS * 4), 0);
  assert_int_equal(cu->cuMemAlloc(&buf[1], NWORDS * 4), 0);

  /* Learn the done event's name: the one record a release on s makes. */
  tb_cu_stream s = new_stream();
  uint64_t v = publish();
  DLManagedTensorVersioned *t = acquire(v, s);
  char text[8192], suffix[64];
  fk->log_clear();
  assert_int_equal(tb_release(t, s), 0);
  fk->log_read(text, sizeof(text));
  snprintf(suffix, sizeof(suffix), " on %s", sname(s));
  if (!fakecuda_text_find(text, 0, "record ", suffix, done_ev,
                          sizeof(done_ev)))
    fail_msg("no record on the release stream:\n%s", text);
  producer_reuses(v, 1);
  return 0;
}

/* Before each case: the consumer's earlier reads are over (the done
 * event's latest record has completed, as the fake says once the host
 * synchronised), so the case's record may go straight on its stream. */
static int settled(void **state) {
  (void)state;
  assert_int_equal(cu->cuCtxSynchronize(), 0);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  tb_client_disconnect(cons);
  tb_client_disconnect(prod);
  tbt_daemon_cleanup(&daemon_);
  return 0;
}

/* tb_release(t, s) with t acquired on s: recorded on s. */
static void release_on_acquire_stream(void **state) {
  (void)state;
  tb_cu_stream s = new_stream();
  uint64_t v = publish();
  DLManagedTensorVersioned *t = acquire(v, s);
  fk->log_clear();
  assert_int_equal(tb_release(t, TB_STREAM_DEFAULT), 0);
  assert_done_on(sname(s)); /* not the contract's legacy stream */
  producer_reuses(v, 1);
}

/* Acquired with -1, the stream named later by tb_lease_wait (what
 * __dlpack__(stream=) does), ended by the plain deleter: recorded on it. */
static void deleter_after_lease_wait(void **state) {
  (void)state;
  tb_cu_stream s = new_stream();
  uint64_t v = publish();
  DLManagedTensorVersioned *t = acquire(v, TB_STREAM_NO_SYNC);
  assert_int_equal(tb_lease_wait(t, s), 0);
  fk->log_clear();
  t->deleter(t);
  assert_done_on(sname(s));
  producer_reuses(v, 1);
}

/* tb_lease_use (release(stream=) while a consumer library holds the
 * tensor), then the plain deleter: recorded on that stream. */
static void deleter_after_lease_use(void **state) {
  (void)state;
  tb_cu_stream s = new_stream();
  uint64_t v = publish();
  DLManagedTensorVersioned *t = acquire(v, TB_STREAM_NO_SYNC);
  fk->log_clear();
  assert_int_equal(tb_lease_use(t, s), 0);
  assert_int_equal(done_records(), 0); /* nothing yet: declared only */
  t->deleter(t);
  assert_done_on(sname(s));
  producer_reuses(v, 1);
}

/* Acquired on s1, tb_lease_wait on s2, released on s3: one done event
 * after all three, recorded on the library's join stream, which waited
 * for a plain event recorded on each. */
static void several_streams_join(void **state) {
  (void)state;
  tb_cu_stream s[3] = {new_stream(), new_stream(), new_stream()};
  char text[16384], join[32], jev[64], body[128];
  uint64_t v = publish();
  DLManagedTensorVersioned *t = acquire(v, s[0]);
  assert_int_equal(tb_lease_wait(t, s[1]), 0);
  fk->log_clear();
  assert_int_equal(tb_release(t, s[2]), 0);
  fk->log_read(text, sizeof(text));
  snprintf(body, sizeof(body), "record %s on ", done_ev);
  if (!fakecuda_text_find(text, 0, body, "", join, sizeof(join))) {
    show_log();
    fail_msg("the done event was not recorded");
  }
  for (int i = 0; i < 3; i++)
    assert_string_not_equal(join, sname(s[i]));
  assert_int_equal(done_records(), 1);
  for (int i = 0; i < 3; i++) {
    char suffix[64];
    snprintf(suffix, sizeof(suffix), " on %s", sname(s[i]));
    if (!fakecuda_text_find(text, 0, "record ", suffix, jev, sizeof(jev)))
      fail_msg("nothing recorded on the declared stream %s:\n%s",
               sname(s[i]), text);
    snprintf(body, sizeof(body), "wait %s on %s", join, jev);
    if (fakecuda_text_count(text, 0, body) < 1)
      fail_msg("the join stream did not wait for %s:\n%s", sname(s[i]),
               text);
  }
  producer_reuses(v, 1);
}

/* The release rides on the next acquire (tb_acquire_options.release) with
 * release_stream NULL: recorded on the stream the lease remembers. */
static void release_riding_on_acquire(void **state) {
  (void)state;
  tb_cu_stream s = new_stream();
  uint64_t v = publish();
  DLManagedTensorVersioned *t = acquire(v, s), *t2 = NULL;
  uint64_t v2 = publish();
  struct tb_acquire_options ao;
  tb_acquire_options_init(&ao);
  ao.mode = TB_ACQUIRE_EXACT;
  ao.version = v2;
  ao.stream = TB_STREAM_NO_SYNC;
  ao.release = t;
  fk->log_clear();
  assert_int_equal(tb_acquire(cons, CH, &ao, &t2), 0);
  assert_done_on(sname(s));
  fk->log_clear();
  assert_int_equal(tb_wait_free(prod, CH, v, TBT_TIMEOUT_MS, sp), 0);
  char body[128];
  snprintf(body, sizeof(body), "wait %s on %s", sname(sp), done_ev);
  assert_int_equal(fk->log_count(body), 1);
  assert_int_equal(tb_release(t2, TB_STREAM_NO_SYNC), 0);
}

/* A per-thread default stream is its thread's: ended on that thread, the
 * record goes on it; ended on another thread, on the legacy stream of the
 * same context, which waits for it. */
struct end_arg {
  DLManagedTensorVersioned *t;
};
static void *end_on_thread(void *p) {
  struct end_arg *a = p;
  /* a thread with no context current, as a consumer library's may be */
  a->t->deleter(a->t);
  return NULL;
}

static void per_thread_stream(void **state) {
  (void)state;
  uint64_t v = publish();
  DLManagedTensorVersioned *t = acquire(v, TB_STREAM_NO_SYNC);
  assert_int_equal(tb_lease_wait(t, TB_STREAM_PER_THREAD), 0);
  fk->log_clear();
  t->deleter(t);
  assert_done_on("ptds");
  producer_reuses(v, 1);

  (void)settled(NULL);
  v = publish();
  t = acquire(v, TB_STREAM_NO_SYNC);
  assert_int_equal(tb_lease_wait(t, TB_STREAM_PER_THREAD), 0);
  fk->log_clear();
  struct end_arg a = {t};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, end_on_thread, &a), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_done_on("legacy");
  producer_reuses(v, 1);
}

/* Two threads, one after the other, each declare their per-thread default
 * stream and end a lease there, the first one's reads still running when
 * the second records. The second thread is made after the first was
 * joined, so it usually gets the same pthread_t (glibc reuses the
 * descriptor); its per-thread stream is another stream all the same, so
 * its record must follow a wait for the first one's (the join stream),
 * not go straight on "its" per-thread stream as though it were the first
 * thread's. */
struct ptds_end_arg {
  DLManagedTensorVersioned *t;
  int rc;
};
static void *wait_and_end_on_ptds(void *p) {
  struct ptds_end_arg *a = p;
  a->rc = cu->cuCtxSetCurrent(ctx);
  if (a->rc == 0)
    a->rc = tb_lease_wait(a->t, TB_STREAM_PER_THREAD);
  a->t->deleter(a->t);
  return NULL;
}

static void per_thread_streams_of_joined_threads(void **state) {
  (void)state;
  struct ptds_end_arg a[2];
  pthread_t th[2];
  uint64_t v[2];
  char on_ptds[128];

  for (int i = 0; i < 2; i++) {
    v[i] = publish();
    a[i].t = acquire(v[i], TB_STREAM_NO_SYNC);
    a[i].rc = -1;
  }
  fk->log_clear();
  for (int i = 0; i < 2; i++) {
    assert_int_equal(
        pthread_create(&th[i], NULL, wait_and_end_on_ptds, &a[i]), 0);
    assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(a[i].rc, 0);
  }
  if (!pthread_equal(th[0], th[1]))
    fprintf(stderr, "note: the second thread got another pthread_t; the "
                    "case checks the ordering all the same\n");
  /* busy: the first thread's reads still run when the second records */
  snprintf(on_ptds, sizeof(on_ptds), "record %s on ptds", done_ev);
  if (done_records() != 2 || fk->log_count(on_ptds) != 1) {
    show_log();
    fail_msg("expected one \"%s\" (the first thread's) and the second "
             "thread's record elsewhere (the join stream)", on_ptds);
  }
  assert_records_cover(); /* the join stream waited for the first record */
  producer_reuses(v[1], 1);
  producer_reuses(v[0], 1);
}

/* A stream that declared nothing but -1: no done event; the producer
 * waits on nothing. */
static void no_stream_declared(void **state) {
  (void)state;
  uint64_t v = publish();
  DLManagedTensorVersioned *t = acquire(v, TB_STREAM_NO_SYNC);
  fk->log_clear();
  assert_int_equal(tb_release(t, TB_STREAM_NO_SYNC), 0);
  assert_int_equal(done_records(), 0);
  producer_reuses(v, 0);
}

/* The plain deleter of a lease that remembers nothing: the contract's
 * default stream (legacy, under spec), as before. */
static void deleter_without_streams(void **state) {
  (void)state;
  uint64_t v = publish();
  DLManagedTensorVersioned *t = acquire(v, TB_STREAM_NO_SYNC);
  fk->log_clear();
  t->deleter(t);
  assert_done_on("legacy");
  producer_reuses(v, 1);
}

/* The lease ends while its stream captures a graph: nothing is recorded
 * (not even into the capture), the capture stays valid, the lease stays
 * held; after the capture has ended, the next call on the client ends it
 * with the done event on the stream. */
static void capturing_at_end(void **state) {
  (void)state;
  tb_cu_stream s = new_stream();
  void *graph = NULL;
  char body[128];
  uint64_t v = publish();
  DLManagedTensorVersioned *t = acquire(v, s);
  assert_int_equal(cu->cuStreamBeginCapture(s, TB_CU_STREAM_CAPTURE_MODE_GLOBAL),
                   0);
  fk->log_clear();
  t->deleter(t);
  assert_int_equal(done_records(), 0);
  assert_int_equal(cu->cuStreamEndCapture(s, &graph), 0);
  assert_non_null(graph);
  assert_int_equal(cu->cuGraphDestroy(graph), 0);
  /* still leased: the producer cannot reuse V */
  (void)publish();
  assert_int_equal(tb_wait_free(prod, CH, v, 0, sp), TB_EBUSY);
  /* any call on the consumer's client ends it now */
  struct tb_notice n;
  assert_int_equal(tb_client_poll_notice(cons, &n, 0), TB_EAGAIN);
  assert_done_on(sname(s));
  snprintf(body, sizeof(body), "record-external %s on %s (capturing)",
           done_ev, sname(s));
  assert_int_equal(fk->log_count(body), 0);
  fk->log_clear();
  assert_int_equal(tb_wait_free(prod, CH, v, TBT_TIMEOUT_MS, sp), 0);
  snprintf(body, sizeof(body), "wait %s on %s", sname(sp), done_ev);
  assert_int_equal(fk->log_count(body), 1);
}

/* Disconnect with a lease held: its done event is recorded on its stream
 * before the session ends; the deleter afterwards records nothing. */
static void disconnect_with_lease(void **state) {
  (void)state;
  tb_client *c2 = NULL;
  tb_cu_stream s = new_stream();
  struct tb_acquire_options ao;
  DLManagedTensorVersioned *t = NULL;
  char body[128], text[8192], suffix[64], ev2[64];
  uint64_t v = publish();

  assert_int_equal(tbt_connect(&daemon_, "leaver", &c2), 0);
  tb_acquire_options_init(&ao);
  ao.mode = TB_ACQUIRE_EXACT;
  ao.version = v;
  ao.stream = s;
  assert_int_equal(tb_acquire(c2, CH, &ao, &t), 0);
  fk->log_clear();
  tb_client_disconnect(c2);
  /* c2 has a done event of its own: the one recorded on s */
  fk->log_read(text, sizeof(text));
  snprintf(suffix, sizeof(suffix), " on %s", sname(s));
  if (!fakecuda_text_find(text, 0, "record ", suffix, ev2, sizeof(ev2)))
    fail_msg("disconnect recorded nothing on the lease's stream:\n%s", text);
  (void)publish();
  fk->log_clear();
  assert_int_equal(tb_wait_free(prod, CH, v, TBT_TIMEOUT_MS, sp), 0);
  snprintf(body, sizeof(body), "wait %s on %s", sname(sp), ev2);
  assert_int_equal(fk->log_count(body), 1);
  fk->log_clear();
  t->deleter(t); /* after disconnect: unmaps, records and sends nothing */
  snprintf(body, sizeof(body), "record %s on %s", ev2, sname(s));
  assert_int_equal(fk->log_count(body), 0);
}

/* Two leases read on two streams end one after the other while the first
 * stream's reads still run (busy): the second record must cover the first
 * lease too, since the producer waits for the event's latest record only.
 * It goes on the join stream, after a wait for the first record and for
 * the second stream; the producer's wait for the first version, made after
 * both releases, then waits for the first stream's reads. */
static void leases_on_two_streams(void **state) {
  (void)state;
  tb_cu_stream a = new_stream(), b = new_stream();
  char text[16384], join[32], body[128], jev[64], suffix[64];
  uint64_t v1 = publish();
  DLManagedTensorVersioned *t1 = acquire(v1, a);
  uint64_t v2 = publish();
  DLManagedTensorVersioned *t2 = acquire(v2, b);

  fk->log_clear();
  assert_int_equal(tb_release(t1, TB_STREAM_DEFAULT), 0);
  assert_done_on(sname(a)); /* the earlier record had completed */
  assert_int_equal(tb_release(t2, TB_STREAM_DEFAULT), 0);
  assert_records_cover();
  assert_int_equal(done_records(), 2);
  fk->log_read(text, sizeof(text));
  /* J: the stream that waited on the done event */
  snprintf(body, sizeof(body), " on %s", done_ev);
  snprintf(suffix, sizeof(suffix), " on %s", sname(b));
  if (!fakecuda_text_find(text, 0, "wait ", body, join, sizeof(join)) ||
      !fakecuda_text_find(text, 0, "record ", suffix, jev, sizeof(jev))) {
    show_log();
    fail_msg("no join of the two streams");
  }
  assert_string_not_equal(join, sname(a));
  assert_string_not_equal(join, sname(b));
  snprintf(body, sizeof(body), "wait %s on %s", join, jev);
  assert_int_equal(fakecuda_text_count(text, 0, body), 1);
  snprintf(body, sizeof(body), "record %s on %s", done_ev, join);
  assert_int_equal(fakecuda_text_count(text, 0, body), 1);
  producer_reuses(v1, 1);
  fk->log_clear();
  assert_int_equal(tb_wait_free(prod, CH, v2, TBT_TIMEOUT_MS, sp), 0);
  snprintf(body, sizeof(body), "wait %s on %s", sname(sp), done_ev);
  assert_int_equal(fk->log_count(body), 1);
}

/* The producer side of the same rule: a ready event is re-recorded for
 * every version its stream publishes, which is safe only while all its
 * records are on one stream. Two threads publishing on their per-thread
 * default streams (the per-thread contract's NULL) publish on two streams,
 * so they must record two ready events. */
struct ptds_pub {
  tb_client *c;
  tb_cu_deviceptr p;
  pthread_barrier_t *published, *leave; /* NULL: none */
  char ev[64];
  const char *err;
};
static void *publish_on_ptds(void *arg) {
  struct ptds_pub *a = arg;
  int64_t shape[1] = {NWORDS};
  DLTensor t;
  char text[8192];
  uint64_t v = 0;

  memset(&t, 0, sizeof(t));
  t.data = (void *)(uintptr_t)a->p;
  t.device.device_type = kDLCUDA;
  t.ndim = 1;
  t.dtype = (DLDataType){kDLUInt, 32, 1};
  t.shape = shape;
  if (cu->cuCtxSetCurrent(ctx) != 0)
    a->err = "cuCtxSetCurrent";
  fk->log_clear(); /* the log is per process: the threads take turns */
  if (a->err == NULL && tb_publish(a->c, "fake/ptds", &t, NULL, &v) != 0)
    a->err = "tb_publish";
  fk->log_read(text, sizeof(text));
  if (a->err == NULL &&
      !fakecuda_text_find(text, 0, "record ", " on ptds", a->ev, sizeof(a->ev)))
    a->err = "no ready event recorded on ptds";
  /* stay alive while the other thread publishes: a thread that has ended
   * may hand its pthread_t to the next one */
  if (a->published != NULL) {
    pthread_barrier_wait(a->published);
    pthread_barrier_wait(a->leave);
  }
  return NULL;
}

static void ready_per_thread_streams(void **state) {
  (void)state;
  tb_client *pt = NULL;
  struct ptds_pub a[2];
  pthread_barrier_t published, leave;
  pthread_t th[2];

  assert_int_equal(
      tbt_connect_contract(&daemon_, "ptds-producer", TB_CONTRACT_PER_THREAD,
                           &pt),
      0);
  assert_int_equal(pthread_barrier_init(&published, NULL, 2), 0);
  assert_int_equal(pthread_barrier_init(&leave, NULL, 2), 0);
  memset(a, 0, sizeof(a));
  for (int i = 0; i < 2; i++) {
    a[i].c = pt;
    a[i].p = buf[i];
  }
  a[0].published = &published;
  a[0].leave = &leave;
  assert_int_equal(pthread_create(&th[0], NULL, publish_on_ptds, &a[0]), 0);
  pthread_barrier_wait(&published); /* thread 0 published, and lives on */
  assert_int_equal(pthread_create(&th[1], NULL, publish_on_ptds, &a[1]), 0);
  assert_int_equal(pthread_join(th[1], NULL), 0);
  pthread_barrier_wait(&leave);
  assert_int_equal(pthread_join(th[0], NULL), 0);
  pthread_barrier_destroy(&published);
  pthread_barrier_destroy(&leave);
  for (int i = 0; i < 2; i++) {
    if (a[i].err != NULL) {
      show_log();
      fail_msg("thread %d: %s", i, a[i].err);
    }
  }
  assert_string_not_equal(a[0].ev, a[1].ev);
  tb_client_disconnect(pt);
}

/* A producer under the per-thread contract whose publishing threads come
 * and go (a thread per request): each new thread's per-thread stream is a
 * stream of its own, with a ready event of its own, but an ended thread's
 * event whose latest record has completed (here: the host synchronised)
 * is taken over by the next thread, so more threads than a client keeps
 * ready events for (TB__READY_EVENTS_MAX) publish without TB_ELIMIT. */
static void ready_events_of_ended_threads(void **state) {
  (void)state;
  tb_client *pt = NULL;
  struct ptds_pub a;
  pthread_t th;

  assert_int_equal(
      tbt_connect_contract(&daemon_, "ptds-churn", TB_CONTRACT_PER_THREAD,
                           &pt),
      0);
  for (int i = 0; i < TB__READY_EVENTS_MAX + 8; i++) {
    memset(&a, 0, sizeof(a));
    a.c = pt;
    a.p = buf[i & 1];
    assert_int_equal(pthread_create(&th, NULL, publish_on_ptds, &a), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    if (a.err != NULL) {
      char why[512];
      (void)tb_client_last_error(pt, why, sizeof(why));
      fail_msg("thread %d: %s: %s", i, a.err, why);
    }
    assert_int_equal(cu->cuCtxSynchronize(), 0);
  }
  tb_client_disconnect(pt);
}

/* A consumer process acquires version v on a stream of its own, releases
 * it there (busy: its done event pending) and then ends its session:
 * killed (SIGKILL) when kill_it, else by tb_client_disconnect, after which
 * it lives on until told. Writes its done event's name into ev. */
static pid_t consumer_process(uint64_t v, int kill_it, int *go, char *ev,
                              size_t evlen) {
  int up[2], down[2];
  pid_t pid;
  ssize_t n;

  assert_int_equal(pipe(up), 0);
  assert_int_equal(pipe(down), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    tb_client *c2 = NULL;
    tb_cu_stream s = NULL;
    struct tb_acquire_options ao;
    DLManagedTensorVersioned *t = NULL;
    char text[8192], suffix[64], name[64] = "";
    close(up[0]);
    close(down[1]);
    if (tbt_connect(&daemon_, "dying", &c2) != 0 ||
        cu->cuStreamCreate(&s, TB_CU_STREAM_NON_BLOCKING) != 0)
      _exit(2);
    tb_acquire_options_init(&ao);
    ao.mode = TB_ACQUIRE_EXACT;
    ao.version = v;
    ao.timeout_ms = TBT_TIMEOUT_MS;
    ao.stream = s;
    if (tb_acquire(c2, CH, &ao, &t) != 0)
      _exit(3);
    fk->log_clear();
    if (tb_release(t, s) != 0)
      _exit(4);
    fk->log_read(text, sizeof(text));
    snprintf(suffix, sizeof(suffix), " on %s", fk->stream_name(s));
    if (!fakecuda_text_find(text, 0, "record ", suffix, name, sizeof(name)))
      _exit(5);
    if (!kill_it)
      tb_client_disconnect(c2); /* a Goodbye: the process lives on */
    if (write(up[1], name, sizeof(name)) != (ssize_t)sizeof(name))
      _exit(6);
    char b;
    (void)read(down[0], &b, 1); /* until the parent is done (or kills) */
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  n = read(up[0], ev, evlen < 64 ? evlen : 64);
  close(up[0]);
  if (n != 64) {
    int st = 0;
    waitpid(pid, &st, 0);
    fail_msg("the consumer process failed (exit %d)", WEXITSTATUS(st));
  }
  *go = down[1];
  return pid;
}

/* A consumer process that is killed after releasing a version it still
 * read leaves a done event that will never complete: a producer stream
 * made to wait on it would never run again. The daemon takes it out of
 * its versions, and tells the producer (EventsGone), whose tb_wait_free
 * then does not wait on it either when the version was freed (its
 * VersionFree naming the event received) before the kill. A consumer that
 * closes its session and lives on is waited for, as always. */
static void consumer_killed_after_release(void **state) {
  static const struct {
    int kill_it, freed_first;
  } cases[] = {{1, 0}, {1, 1}, {0, 1}};
  (void)state;
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    int kill_it = cases[k].kill_it;
    char ev[64], body[128];
    int go = -1, st = 0;
    uint64_t v = publish();
    pid_t pid = consumer_process(v, kill_it, &go, ev, sizeof(ev));

    if (cases[k].freed_first) /* v leaves the history: VersionFree now */
      (void)publish();
    if (kill_it) {
      assert_int_equal(kill(pid, SIGKILL), 0);
      assert_int_equal(waitpid(pid, &st, 0), pid);
    }
    /* the daemon has closed that session (and sent what it sends then) */
    assert_int_equal(tbt_wait_session_name_gone(prod, "dying"), 0);
    if (!cases[k].freed_first)
      (void)publish();
    fk->log_clear();
    assert_int_equal(tb_wait_free(prod, CH, v, TBT_TIMEOUT_MS, sp), 0);
    snprintf(body, sizeof(body), "wait %s on %s", sname(sp), ev);
    if (fk->log_count(body) != (kill_it ? 0u : 1u)) {
      show_log();
      fail_msg("%s consumer: expected %d \"%s\"",
               kill_it ? "a killed" : "a disconnected, living", !kill_it,
               body);
    }
    close(go);
    if (!kill_it)
      assert_int_equal(waitpid(pid, &st, 0), pid);
  }
  /* the two kills are counted; the disconnect is not */
  char *text = NULL;
  size_t len = 0;
  assert_int_equal(tb_daemon_get_metrics(prod, &text, &len), 0);
  if (strstr(text, "\ntensorbroker_sessions_died_total 2\n") == NULL)
    fail_msg("metrics:\n%s", text);
  tb_free(text);
}

/* A producer process publishes a VMM buffer (which outlives it) on two
 * channels with its GPU work in flight (busy: the ready events not
 * complete), synchronising its stream between them, and is killed. A
 * dead process's event that had not completed never will, and one opened
 * after the death queries as complete whatever its work did (measured on
 * a GPU): neither can say whether the data is whole. The buffer's ready
 * signal can: the producer's stream wrote it after each version's work
 * (the fake writes it when the stream is synchronised). So the daemon
 * marks the versions' ready events (EventInfo.owner_died) and the consumer
 * reads the signal instead of waiting: version 2's work never finished,
 * the acquire fails with TB_ECLOSED and nothing waits; version 1's did,
 * the acquire succeeds and neither it nor tb_lease_wait waits. */
static void producer_killed_with_work_in_flight(void **state) {
  (void)state;
  int up[2], st = 0;
  uint64_t v[2] = {0, 0};
  pid_t pid;
  tb_cu_stream s = new_stream();
  struct tb_acquire_options ao;
  DLManagedTensorVersioned *t = NULL;
  char text[8192];

  assert_int_equal(pipe(up), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    tb_client *c2 = NULL;
    tb_buffer *b = NULL;
    struct tb_publish_options po;
    int64_t shape[1] = {NWORDS};
    DLTensor x;
    close(up[0]);
    if (tbt_connect(&daemon_, "dying-producer", &c2) != 0 ||
        tb_buffer_create_cuda(c2, NWORDS * 4, 0, 0, &b) != 0)
      _exit(2);
    memset(&x, 0, sizeof(x));
    x.data = tb_buffer_data(b);
    x.device.device_type = kDLCUDA;
    x.ndim = 1;
    x.dtype = (DLDataType){kDLUInt, 32, 1};
    x.shape = shape;
    tb_publish_options_init(&po);
    po.stream = sp;
    if (tb_publish(c2, "fake/dead-done", &x, &po, &v[0]) != 0 ||
        cu->cuStreamSynchronize(sp) != 0 || /* version 1's work finishes */
        tb_publish(c2, "fake/dead", &x, &po, &v[1]) != 0)
      _exit(3);
    if (write(up[1], v, sizeof(v)) != (ssize_t)sizeof(v))
      _exit(4);
    for (;;)
      pause(); /* until killed */
  }
  close(up[1]);
  assert_int_equal(read(up[0], v, sizeof(v)), (ssize_t)sizeof(v));
  close(up[0]);
  assert_int_equal(kill(pid, SIGKILL), 0);
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_int_equal(
      tbt_wait_session_name_gone(cons, "dying-producer"), 0);

  tb_acquire_options_init(&ao);
  ao.mode = TB_ACQUIRE_EXACT;
  ao.version = v[1];
  ao.timeout_ms = TBT_TIMEOUT_MS;
  ao.stream = s;
  fk->log_clear();
  int arc = tb_acquire(cons, "fake/dead", &ao, &t);
  if (arc != TB_ECLOSED) {
    show_log();
    fail_msg("the acquire returned %d, not TB_ECLOSED", arc);
  }
  tb_client_last_error(cons, text, sizeof(text));
  if (strstr(text, "died before its GPU work on it finished") == NULL)
    fail_msg("the error says: %s", text);
  fk->log_read(text, sizeof(text));
  if (strstr(text, "wait") != NULL) {
    show_log();
    fail_msg("a stream waits on the dead producer's pending work");
  }

  fk->log_clear();
  ao.version = v[0];
  arc = tb_acquire(cons, "fake/dead-done", &ao, &t);
  if (arc != 0) {
    tb_client_last_error(cons, text, sizeof(text));
    fail_msg("version 1 (finished): %s (%s)", tb_err_name(arc), text);
  }
  assert_int_equal(tb_lease_wait(t, new_stream()), 0);
  fk->log_read(text, sizeof(text));
  if (strstr(text, "wait") != NULL) {
    show_log();
    fail_msg("a stream waits on the dead producer's finished work");
  }
  assert_int_equal(tb_release(t, TB_STREAM_NO_SYNC), 0);
}

/* A lease read on s, released with a stream on a thread that has no CUDA
 * context current (a worker's): the legacy stream it names is device 0's,
 * and the done event follows s and it. And released with a stream value
 * that names nothing: TB_ESTREAM, but the done event still follows s (the
 * lease ends either way, and the producer must not rewrite under s). */
struct rel_arg {
  DLManagedTensorVersioned *t;
  void *stream;
  int rc;
};
static void *release_on_thread(void *p) {
  struct rel_arg *a = p;
  a->rc = tb_release(a->t, a->stream);
  return NULL;
}

static void release_stream_unnamable(void **state) {
  (void)state;
  tb_cu_stream s = new_stream();
  uint64_t v = publish();
  struct rel_arg a = {acquire(v, s), TB_STREAM_LEGACY, 1};
  pthread_t th;

  fk->log_clear();
  assert_int_equal(pthread_create(&th, NULL, release_on_thread, &a), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  if (a.rc != 0) {
    show_log();
    fail_msg("tb_release(t, legacy) on a thread without a context: %d", a.rc);
  }
  assert_int_equal(done_records(), 1);
  assert_records_cover();
  producer_reuses(v, 1);

  (void)settled(NULL);
  v = publish();
  DLManagedTensorVersioned *t = acquire(v, s);
  fk->log_clear();
  assert_int_equal(tb_release(t, (void *)(intptr_t)-5), TB_ESTREAM);
  assert_done_on(sname(s));
  producer_reuses(v, 1);
}

/* The client's table of VersionFree notices not yet waited for is bounded
 * (TB__FREED_TABLE_MAX). When it is full, an entry with nothing to wait
 * for goes first; when every entry has done events, the oldest goes and
 * tb_wait_free then refuses it (TB_ELIMIT) rather than ask the daemon,
 * which no longer knows the version and would answer "free" with no done
 * events: a ring reusing that slot would rewrite it under its readers. */
static void freed_table_full(void **state) {
  Tensorbroker__V1__VersionFree vf = TENSORBROKER__V1__VERSION_FREE__INIT;
  Tensorbroker__V1__EventInfo ei = TENSORBROKER__V1__EVENT_INFO__INIT;
  Tensorbroker__V1__EventInfo *list[1] = {&ei};
  uint8_t handle[64] = {0};
  struct tb__freed *f;
  char why[512];
  tb_client *x = NULL;

  (void)state;
  assert_int_equal(tbt_connect(&daemon_, "table", &x), 0);
  ei.event_id = 77;
  ei.cuda_ipc_event_handle.data = handle;
  ei.cuda_ipc_event_handle.len = sizeof(handle);
  vf.channel = "t/done";
  vf.n_done_events = 1;
  vf.done_events = list;
  for (uint64_t v = 1; v <= TB__FREED_TABLE_MAX; v++) {
    vf.version = v;
    tb__freed_add(x, &vf);
  }
  /* full of done events: the oldest is forgotten, and said so */
  vf.channel = "t/host";
  vf.version = 1;
  vf.n_done_events = 0;
  tb__freed_add(x, &vf);
  assert_int_equal(tb_wait_free(x, "t/done", 1, 0, NULL), TB_ELIMIT);
  tb_client_last_error(x, why, sizeof(why));
  assert_non_null(strstr(why, "forgot"));
  /* full again: the entry without done events goes first */
  vf.channel = "t/done";
  vf.version = TB__FREED_TABLE_MAX + 1;
  vf.n_done_events = 1;
  tb__freed_add(x, &vf);
  assert_null(tb__freed_find(x, "t/host", 1));
  f = tb__freed_find(x, "t/done", 2);
  assert_non_null(f);
  assert_int_equal(f->n_done, 1);
  /* full of done events again, one of them waited for: that one goes
   * first, and is not refused later (it was waited for) */
  f->waited = 1;
  vf.version = TB__FREED_TABLE_MAX + 2;
  tb__freed_add(x, &vf);
  assert_null(tb__freed_find(x, "t/done", 2));
  assert_non_null(tb__freed_find(x, "t/done", 3));
  tb_client_disconnect(x);
}

/* Bad input: a ninth declared stream is refused and changes nothing. */
static void too_many_streams(void **state) {
  (void)state;
  tb_cu_stream s[9];
  uint64_t v = publish();
  DLManagedTensorVersioned *t = acquire(v, TB_STREAM_NO_SYNC);
  for (int i = 0; i < 9; i++)
    s[i] = new_stream();
  for (int i = 0; i < 8; i++)
    assert_int_equal(tb_lease_use(t, s[i]), 0);
  assert_int_equal(tb_lease_use(t, s[8]), TB_ELIMIT);
  assert_int_equal(tb_lease_use(t, s[3]), 0); /* known: not a new one */
  assert_int_equal(tb_lease_use(t, (void *)(intptr_t)-5), TB_ESTREAM);
  assert_int_equal(tb_lease_use(NULL, s[0]), TB_EINVAL);
  fk->log_clear();
  assert_int_equal(tb_release(t, TB_STREAM_DEFAULT), 0);
  for (int i = 0; i < 8; i++) {
    char suffix[64], ev[64], text[16384];
    fk->log_read(text, sizeof(text));
    snprintf(suffix, sizeof(suffix), " on %s", sname(s[i]));
    assert_true(fakecuda_text_find(text, 0, "record ", suffix, ev,
                                   sizeof(ev)));
  }
  producer_reuses(v, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(release_on_acquire_stream, settled),
      cmocka_unit_test_setup(deleter_after_lease_wait, settled),
      cmocka_unit_test_setup(deleter_after_lease_use, settled),
      cmocka_unit_test_setup(several_streams_join, settled),
      cmocka_unit_test_setup(release_riding_on_acquire, settled),
      cmocka_unit_test_setup(per_thread_stream, settled),
      cmocka_unit_test_setup(per_thread_streams_of_joined_threads, settled),
      cmocka_unit_test_setup(no_stream_declared, settled),
      cmocka_unit_test_setup(deleter_without_streams, settled),
      cmocka_unit_test_setup(capturing_at_end, settled),
      cmocka_unit_test_setup(disconnect_with_lease, settled),
      cmocka_unit_test_setup(leases_on_two_streams, settled),
      cmocka_unit_test_setup(ready_per_thread_streams, settled),
      cmocka_unit_test_setup(ready_events_of_ended_threads, settled),
      cmocka_unit_test_setup(consumer_killed_after_release, settled),
      cmocka_unit_test_setup(producer_killed_with_work_in_flight, settled),
      cmocka_unit_test_setup(release_stream_unnamable, settled),
      cmocka_unit_test_setup(freed_table_full, settled),
      cmocka_unit_test_setup(too_many_streams, settled),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
