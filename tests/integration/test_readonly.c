/* SPDX-License-Identifier: Apache-2.0 */
/* Read-only means read-only (issue 21): a consumer of a producer's host
 * buffer, speaking the wire itself so that no library stands in its way,
 * receives the memfd and tries every route to write it; the kernel refuses
 * each one, the producer's bytes stay as they were (read from its own
 * mapping) and the producer goes on writing through that mapping. A buffer
 * created with TB_BUFFER_CONSUMERS_MAY_WRITE is written by its consumer;
 * a producer that registers a read-only memfd without the seals is
 * refused. docs/memory-access.md says why each route is closed.
 *
 * Every consumer is a forked child (started before the parent connects
 * anything), so that it holds nothing of the producer's but what the
 * daemon sent it. Each route is tried twice: on the descriptor the daemon
 * sent (a read-only file description) and on a read-write one the consumer
 * opens itself through /proc/self/fd, which only the seal stops. */
#include "tb_test.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "raw_wire.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1; older C libraries lack it */
#endif

#define SIZE 8192      /* two pages */
#define SEED 5         /* the producer's pattern */
#define SEED_AFTER 9   /* what it writes after the attack */
#define SEED_CONSUMER 3 /* what a consumer allowed to write writes */
#define CHANNEL "ro/x"

#define READONLY_SEALS                                                       \
  (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)

enum route {
  ROUTE_MMAP_SHARED_WRITE, /* mmap(PROT_WRITE, MAP_SHARED) */
  ROUTE_MPROTECT,          /* mmap(PROT_READ, MAP_SHARED), then PROT_WRITE */
  ROUTE_PWRITE,
  ROUTE_WRITE,             /* lseek, then write */
  ROUTE_PUNCH_HOLE,        /* fallocate(PUNCH_HOLE | KEEP_SIZE) */
  ROUTE_FTRUNCATE,         /* shrink, then grow */
  ROUTE_MAP_PRIVATE,       /* allowed: copy-on-write stays in the consumer */
};

struct attack {
  const struct tbt_daemon *d;
  enum route route;
  bool via_proc; /* on a read-write re-open through /proc/self/fd */
};

/* ---- the raw consumer (children only: checks exit with 2) ---- */

/* Acquire the latest version of ch (waiting for it) and return the memfd
 * the daemon attached; *writable: BufferInfo.writable. */
static int acquire_memfd(int sock, const char *ch, bool *writable) {
  tb__server_message *m;
  int fds[1], n = 0;

  raw_send_acquire(sock, 2, ch, TENSORBROKER__V1__ACQUIRE_MODE__ACQUIRE_LATEST,
                   0, TBT_TIMEOUT_MS);
  while ((m = raw_recv_fds(sock, fds, 1, &n)) != NULL &&
         m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE) {
    for (int i = 0; i < n; i++)
      close(fds[i]);
    tb__server_message_free(m);
  }
  TBT_CHECK(m != NULL);
  TBT_CHECK(m->body_case == TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY);
  TBT_CHECK(m->reply->status == 0);
  TBT_CHECK(m->reply->body_case == TENSORBROKER__V1__REPLY__BODY_ACQUIRE);
  TBT_CHECK(m->reply->acquire->buffer->fd_attached);
  TBT_CHECK(m->reply->acquire->buffer->size == SIZE);
  TBT_CHECK(n == 1);
  *writable = m->reply->acquire->buffer->writable;
  tb__server_message_free(m);
  return fds[0];
}

static int raw_consumer_memfd(const struct tbt_daemon *d, bool *writable) {
  int sock;

  raw_child();
  sock = raw_connect(d);
  raw_hello(sock);
  return acquire_memfd(sock, CHANNEL, writable);
}

/* A route's call failed (failed, errno err): it must have, with want.
 * Otherwise the child reports and exits 2, after the caller did what harm
 * the route allowed, so the parent's check of the bytes sees it too. */
static void refused(bool failed, int err, int want, const char *what) {
  if (failed && err == want)
    return;
  fprintf(stderr, "[child %d] %s: %s, expected %s\n", (int)getpid(), what,
          failed ? strerror(err) : "succeeded", strerror(want));
  _exit(2);
}

static void check_pattern_child(const uint8_t *p, size_t len, uint64_t seed) {
  for (size_t i = 0; i < len; i++)
    TBT_CHECK(p[i] == tbt_pattern(i, seed));
}

static int attacker(struct tbt_chan *ch, void *arg) {
  const struct attack *a = arg;
  bool via = a->via_proc, writable;
  uint8_t x[16];
  char path[40];
  uint8_t *p, *q;
  int fd, e, r;

  (void)ch;
  memset(x, 'X', sizeof(x));
  fd = raw_consumer_memfd(a->d, &writable);
  TBT_CHECK(!writable);
  if (via) {
    /* a new description of the same inode: the mode of a memfd (0777)
     * lets the re-open have write access; only the seal holds now */
    int rw;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    rw = open(path, O_RDWR | O_CLOEXEC);
    TBT_CHECK(rw >= 0);
    TBT_CHECK((fcntl(rw, F_GETFL) & O_ACCMODE) == O_RDWR);
    close(fd);
    fd = rw;
  }
  switch (a->route) {
  case ROUTE_MMAP_SHARED_WRITE:
    errno = 0;
    p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    e = errno;
    if (p != MAP_FAILED)
      memset(p, 'X', 64);
    refused(p == MAP_FAILED, e, via ? EPERM : EACCES,
            "mmap(PROT_WRITE, MAP_SHARED)");
    break;
  case ROUTE_MPROTECT:
    p = mmap(NULL, SIZE, PROT_READ, MAP_SHARED, fd, 0);
    TBT_CHECK(p != MAP_FAILED);
    check_pattern_child(p, SIZE, SEED);
    errno = 0;
    r = mprotect(p, SIZE, PROT_READ | PROT_WRITE);
    e = errno;
    if (r == 0)
      memset(p, 'X', 64);
    refused(r < 0, e, EACCES, "mprotect(PROT_WRITE) of a shared mapping");
    break;
  case ROUTE_PWRITE:
    errno = 0;
    r = (int)pwrite(fd, x, sizeof(x), 100);
    e = errno;
    refused(r < 0, e, via ? EPERM : EBADF, "pwrite");
    break;
  case ROUTE_WRITE:
    TBT_CHECK(lseek(fd, 200, SEEK_SET) == 200);
    errno = 0;
    r = (int)write(fd, x, sizeof(x));
    e = errno;
    refused(r < 0, e, via ? EPERM : EBADF, "lseek + write");
    break;
  case ROUTE_PUNCH_HOLE:
    errno = 0;
    r = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, SIZE);
    e = errno;
    refused(r < 0, e, via ? EPERM : EBADF,
            "fallocate(PUNCH_HOLE | KEEP_SIZE)");
    break;
  case ROUTE_FTRUNCATE:
    errno = 0;
    r = ftruncate(fd, 100);
    e = errno;
    if (r == 0) /* the bytes beyond 100 are gone; spare the producer SIGBUS */
      TBT_CHECK(ftruncate(fd, SIZE) == 0);
    refused(r < 0, e, via ? EPERM : EINVAL, "ftruncate (shrink)");
    errno = 0;
    r = ftruncate(fd, 4 * SIZE);
    e = errno;
    if (r == 0)
      TBT_CHECK(ftruncate(fd, SIZE) == 0);
    refused(r < 0, e, via ? EPERM : EINVAL, "ftruncate (grow)");
    break;
  case ROUTE_MAP_PRIVATE:
    /* allowed: the writes land in the consumer's private copy */
    p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    TBT_CHECK(p != MAP_FAILED);
    memset(p, 'X', SIZE);
    TBT_CHECK(p[SIZE - 1] == 'X');
    q = mmap(NULL, SIZE, PROT_READ, MAP_SHARED, fd, 0);
    TBT_CHECK(q != MAP_FAILED);
    check_pattern_child(q, SIZE, SEED);
    munmap(q, SIZE);
    munmap(p, SIZE);
    break;
  }
  close(fd);
  return 0;
}

/* ---- the producer (the test process, through the library) ---- */

struct producer {
  tb_client *c;
  tb_buffer *b;
};

static void publish(struct producer *pr) {
  int64_t shape[1];
  DLTensor t;

  tbt_u8_tensor(&t, pr->b, shape, SIZE);
  assert_tb_ok(tb_publish(pr->c, CHANNEL, &t, NULL, NULL));
}

static void producer_start(const struct tbt_daemon *d, unsigned flags,
                           struct producer *pr) {
  assert_tb_ok(tbt_connect(d, "producer", &pr->c));
  assert_tb_ok(tb_host_buffer_create(pr->c, SIZE, flags, &pr->b));
  tbt_fill(tb_buffer_data(pr->b), SIZE, SEED);
  publish(pr);
}

static void producer_stop(struct producer *pr) {
  assert_tb_ok(tb_buffer_destroy(pr->b));
  tb_client_disconnect(pr->c);
}

/* Every byte of p is the pattern of seed. */
static void assert_pattern(const uint8_t *p, size_t len, uint64_t seed) {
  for (size_t i = 0; i < len; i++)
    if (p[i] != tbt_pattern(i, seed))
      fail_msg("byte %zu is %#x, the pattern (seed %llu) says %#x", i, p[i],
               (unsigned long long)seed, tbt_pattern(i, seed));
}

/* The producer writes a new pattern through its own mapping and publishes
 * it; a library consumer reads it. */
static void producer_still_writes(const struct tbt_daemon *d,
                                  struct producer *pr) {
  DLManagedTensorVersioned *t;
  tb_client *c;

  tbt_fill(tb_buffer_data(pr->b), SIZE, SEED_AFTER);
  publish(pr);
  assert_tb_ok(tbt_connect(d, "reader", &c));
  assert_tb_ok(tb_acquire(c, CHANNEL, NULL, &t));
  assert_pattern(t->dl_tensor.data, SIZE, SEED_AFTER);
  assert_tb_ok(tb_release(t, NULL));
  tb_client_disconnect(c);
}

static void attack(void **state, enum route route, bool via_proc) {
  const struct tbt_daemon *d = *state;
  struct attack a = {.d = d, .route = route, .via_proc = via_proc};
  struct producer pr;
  struct tbt_child ch;
  int rc;

  assert_tb_ok(tbt_child_start(&ch, attacker, &a));
  producer_start(d, 0, &pr);
  rc = tbt_child_wait(&ch, TBT_TIMEOUT_MS);
  /* the producer's own mapping first: what the attack did, if anything */
  assert_pattern(tb_buffer_data(pr.b), SIZE, SEED);
  assert_int_equal(rc, 0);
  producer_still_writes(d, &pr);
  producer_stop(&pr);
}

static void test_mmap_shared_write(void **s) {
  attack(s, ROUTE_MMAP_SHARED_WRITE, false);
}
static void test_mmap_shared_write_proc(void **s) {
  attack(s, ROUTE_MMAP_SHARED_WRITE, true);
}
static void test_mprotect(void **s) { attack(s, ROUTE_MPROTECT, false); }
static void test_mprotect_proc(void **s) { attack(s, ROUTE_MPROTECT, true); }
static void test_pwrite(void **s) { attack(s, ROUTE_PWRITE, false); }
static void test_pwrite_proc(void **s) { attack(s, ROUTE_PWRITE, true); }
static void test_write(void **s) { attack(s, ROUTE_WRITE, false); }
static void test_write_proc(void **s) { attack(s, ROUTE_WRITE, true); }
static void test_punch_hole(void **s) { attack(s, ROUTE_PUNCH_HOLE, false); }
static void test_punch_hole_proc(void **s) {
  attack(s, ROUTE_PUNCH_HOLE, true);
}
static void test_ftruncate(void **s) { attack(s, ROUTE_FTRUNCATE, false); }
static void test_ftruncate_proc(void **s) {
  attack(s, ROUTE_FTRUNCATE, true);
}
static void test_map_private(void **s) { attack(s, ROUTE_MAP_PRIVATE, false); }
static void test_map_private_proc(void **s) {
  attack(s, ROUTE_MAP_PRIVATE, true);
}

/* ---- what the consumer is sent ---- */

/* The daemon sends a read-only description of a memfd sealed against
 * writes, shrinking, growing and further seals. */
static int inspector(struct tbt_chan *ch, void *arg) {
  bool writable;
  int fd = raw_consumer_memfd(arg, &writable);

  (void)ch;
  TBT_CHECK(!writable);
  TBT_CHECK((fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY);
  TBT_CHECK((fcntl(fd, F_GET_SEALS) & READONLY_SEALS) == READONLY_SEALS);
  /* and no seal can be added to lock the producer out */
  TBT_CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) < 0);
  close(fd);
  return 0;
}

static void test_consumer_fd(void **state) {
  const struct tbt_daemon *d = *state;
  struct producer pr;
  struct tbt_child ch;

  assert_tb_ok(tbt_child_start(&ch, inspector, (void *)d));
  producer_start(d, 0, &pr);
  assert_int_equal(tbt_child_wait(&ch, TBT_TIMEOUT_MS), 0);
  producer_stop(&pr);
}

/* tb_publish_copy's internal buffers are sealed the same way. */
static void test_publish_copy_sealed(void **state) {
  const struct tbt_daemon *d = *state;
  static uint8_t src[SIZE];
  int64_t shape[1] = {SIZE};
  struct tbt_child ch;
  tb_client *p;
  DLTensor t;

  assert_tb_ok(tbt_child_start(&ch, inspector, (void *)d));
  assert_tb_ok(tbt_connect(d, "copier", &p));
  tbt_fill(src, SIZE, SEED);
  memset(&t, 0, sizeof(t));
  t.data = src;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype = (DLDataType){kDLUInt, 8, 1};
  t.shape = shape;
  assert_tb_ok(tb_publish_copy(p, CHANNEL, &t, NULL, NULL));
  assert_int_equal(tbt_child_wait(&ch, TBT_TIMEOUT_MS), 0);
  tb_client_disconnect(p);
}

/* The library's own read-only mapping cannot be made writable either. */
static int library_consumer(struct tbt_chan *ch, void *arg) {
  const struct tbt_daemon *d = arg;
  DLManagedTensorVersioned *t;
  struct tb_acquire_options o;
  tb_client *c;
  uint8_t *p;
  int r, e;

  (void)ch;
  TBT_CHECK_OK(tbt_connect(d, "library-consumer", &c));
  tb_acquire_options_init(&o);
  o.timeout_ms = TBT_TIMEOUT_MS;
  TBT_CHECK_OK(tb_acquire(c, CHANNEL, &o, &t));
  p = t->dl_tensor.data; /* the mapping's start: byte_offset 0 */
  TBT_CHECK(((uintptr_t)p & 4095) == 0);
  check_pattern_child(p, SIZE, SEED);
  errno = 0;
  r = mprotect(p, SIZE, PROT_READ | PROT_WRITE);
  e = errno;
  if (r == 0)
    memset(p, 'X', 64);
  refused(r < 0, e, EACCES, "mprotect(PROT_WRITE) of the library's mapping");
  TBT_CHECK_OK(tb_release(t, NULL));
  tb_client_disconnect(c);
  return 0;
}

static void test_library_mapping(void **state) {
  const struct tbt_daemon *d = *state;
  struct producer pr;
  struct tbt_child ch;
  int rc;

  assert_tb_ok(tbt_child_start(&ch, library_consumer, (void *)d));
  producer_start(d, 0, &pr);
  rc = tbt_child_wait(&ch, TBT_TIMEOUT_MS);
  assert_pattern(tb_buffer_data(pr.b), SIZE, SEED);
  assert_int_equal(rc, 0);
  producer_still_writes(d, &pr);
  producer_stop(&pr);
}

/* ---- consumers granted write ---- */

/* Writes the first page with a shared mapping and the last 16 bytes with
 * pwrite. */
static int writer(struct tbt_chan *ch, void *arg) {
  uint8_t w[16], *p;
  bool writable;
  int fd = raw_consumer_memfd(arg, &writable);

  (void)ch;
  TBT_CHECK(writable);
  TBT_CHECK((fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDWR);
  TBT_CHECK((fcntl(fd, F_GET_SEALS) & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) ==
            0);
  p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  TBT_CHECK(p != MAP_FAILED);
  check_pattern_child(p, SIZE, SEED);
  tbt_fill(p, 4096, SEED_CONSUMER);
  memset(w, 'W', sizeof(w));
  TBT_CHECK(pwrite(fd, w, sizeof(w), SIZE - sizeof(w)) == (ssize_t)sizeof(w));
  /* the size stays sealed */
  TBT_CHECK(ftruncate(fd, 100) < 0 && errno == EPERM);
  TBT_CHECK(ftruncate(fd, 4 * SIZE) < 0 && errno == EPERM);
  munmap(p, SIZE);
  close(fd);
  return 0;
}

static void test_consumers_may_write(void **state) {
  const struct tbt_daemon *d = *state;
  struct producer pr;
  struct tbt_child ch;
  const uint8_t *p;

  assert_tb_ok(tbt_child_start(&ch, writer, (void *)d));
  producer_start(d, TB_BUFFER_CONSUMERS_MAY_WRITE, &pr);
  assert_int_equal(tbt_child_wait(&ch, TBT_TIMEOUT_MS), 0);
  p = tb_buffer_data(pr.b);
  assert_pattern(p, 4096, SEED_CONSUMER);
  for (size_t i = 4096; i < SIZE - 16; i++)
    assert_int_equal(p[i], tbt_pattern(i, SEED));
  for (size_t i = SIZE - 16; i < SIZE; i++)
    assert_int_equal(p[i], 'W');
  producer_still_writes(d, &pr);
  producer_stop(&pr);
}

/* ---- a producer that does not seal ---- */

/* BufferRegister of a fresh memfd of SIZE bytes with these seals, added
 * after a read-write mapping as the library does; returns the reply. */
static tb__server_message *register_sealed(int sock, uint64_t id, int seals,
                                           bool may_write) {
  Tensorbroker__V1__BufferRegister br =
      TENSORBROKER__V1__BUFFER_REGISTER__INIT;
  Tensorbroker__V1__Device dev = TENSORBROKER__V1__DEVICE__INIT;
  tb__request r = TENSORBROKER__V1__REQUEST__INIT;
  tb__server_message *m;
  int fd = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  uint8_t buf[512];
  void *p;
  long n;

  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, SIZE), 0);
  p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  assert_true(p != MAP_FAILED);
  tbt_fill(p, SIZE, SEED);
  if (seals != 0)
    assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
  dev.type = kDLCPU;
  br.kind = TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD;
  br.size = SIZE;
  br.device = &dev;
  br.consumers_may_write = may_write;
  r.request_id = id;
  r.body_case = TENSORBROKER__V1__REQUEST__BODY_BUFFER_REGISTER;
  r.buffer_register = &br;
  n = tb__request_encode(&r, buf, sizeof(buf));
  assert_true(n > 0);
  assert_int_equal(tb__wire_send(sock, buf, (size_t)n, &fd, 1, 0), 0);
  close(fd);
  munmap(p, SIZE);
  m = raw_recv(sock);
  assert_non_null(m);
  assert_int_equal(m->body_case, TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY);
  assert_int_equal(m->reply->request_id, id);
  return m;
}

static void expect_refused(int sock, uint64_t id, int seals, bool may_write,
                           const char *names) {
  tb__server_message *m = register_sealed(sock, id, seals, may_write);

  assert_int_equal(m->reply->status, TB_EINVAL);
  if (strstr(m->reply->message, names) == NULL)
    fail_msg("refusal '%s' does not name %s", m->reply->message, names);
  tb__server_message_free(m);
}

static void test_unsealed_refused(void **state) {
  const struct tbt_daemon *d = *state;
  tb__server_message *m;
  int sock = raw_connect(d);

  raw_hello(sock);
  expect_refused(sock, 2, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, false,
                 "F_SEAL_FUTURE_WRITE");
  expect_refused(sock, 3, 0, false, "F_SEAL_SHRINK");
  expect_refused(sock, 4, F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE, false,
                 "F_SEAL_GROW");
  /* consumers could not map it writable as promised */
  expect_refused(sock, 5, READONLY_SEALS, true, "sealed against writes");
  /* the controls: what the library registers */
  m = register_sealed(sock, 6, READONLY_SEALS, false);
  assert_int_equal(m->reply->status, 0);
  tb__server_message_free(m);
  m = register_sealed(sock, 7, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL,
                      true);
  assert_int_equal(m->reply->status, 0);
  tb__server_message_free(m);
  close(sock);
}

#define T(f) cmocka_unit_test_setup_teardown(f, tbt_setup, tbt_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_consumer_fd),
      T(test_mmap_shared_write),
      T(test_mmap_shared_write_proc),
      T(test_mprotect),
      T(test_mprotect_proc),
      T(test_pwrite),
      T(test_pwrite_proc),
      T(test_write),
      T(test_write_proc),
      T(test_punch_hole),
      T(test_punch_hole_proc),
      T(test_ftruncate),
      T(test_ftruncate_proc),
      T(test_map_private),
      T(test_map_private_proc),
      T(test_library_mapping),
      T(test_publish_copy_sealed),
      T(test_consumers_may_write),
      T(test_unsealed_refused),
  };
  return cmocka_run_group_tests_name("readonly", tests, NULL, NULL);
}
