/* SPDX-License-Identifier: Apache-2.0 */
/* GPU: tb_client_connect prepares the consumer's done event when the
 * connecting thread has a CUDA context current, so that the client's first
 * CUDA acquire is one request to the daemon, not two (docs/cuda.md, "Ready
 * at connect").
 *
 * - library: the driver loaded through the library (as every GPU test
 *   does), a context current. Connect makes one cuEventCreate and the
 *   daemon counts one request beyond the Hello (the EventRegister); the
 *   first acquire of a CUDA tensor then creates no event and is one
 *   request; its release on a busy stream records the prepared event
 *   (one cuEventRecord) and the producer's tb_wait_free waits on it (one
 *   cuStreamWaitEvent). With no_prefetch, connect prepares nothing.
 * - application: the child loads and initialises libcuda itself (dlopen,
 *   cuInit, its primary context current), as a CUDA runtime or PyTorch
 *   program does: connect loads the library's driver table and prepares
 *   the event.
 * - not initialised: the child has libcuda loaded but never called cuInit:
 *   connect must not initialise CUDA (a process that forks later would
 *   leave its children without it): the table stays unloaded and connect
 *   is the Hello alone.
 * - channels named at connect: a client connects, naming a channel whose
 *   newest version (still being written by a slow kernel) is in a CUDA
 *   buffer; its first acquire of that version opens the buffer and the
 *   ready event once each, both inside the open of the buffer the connect
 *   brought (the acquire counters' prefetch time covers the opens' time:
 *   they ran while the daemon answered, not after the reply), and reads
 *   the finished data; a second acquire opens nothing. When the channel
 *   has moved to another allocation between connect and the first
 *   acquire, that acquire opens the kept buffer for nothing and then the
 *   reply's, and reads the new one's data (docs/cuda.md, "Channels named
 *   at connect"). */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "stats.h" /* tb__acquire_counters */
#include "gpu_common.h"

#define N (1u << 20)
#define V1 0x5151A1A1u
#define SPIN_MS 200
#define CH "gpu/early"

static struct tbt_daemon daemon_;

/* The daemon's count of c's requests, this call's ListSessions included. */
static uint64_t requests(tb_client *c) {
  uint64_t n = 0;
  if (tbt_own_requests(c, &n) != 0)
    TBG_FAIL("cannot read the session's request count");
  return n;
}

static tb_client *connect_opts(const char *name, int no_prefetch,
                               const char *const *channels) {
  struct tb_connect_options o;
  tb_client *c = NULL;
  tb_connect_options_init(&o);
  o.socket_path = daemon_.sock;
  o.client_name = name;
  o.no_prefetch = no_prefetch;
  o.channels = channels;
  int rc = tb_client_connect(&o, &c);
  if (rc != 0)
    TBG_FAIL("connect %s: %s", name, tb_err_name(rc));
  return c;
}

static int producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr p = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, p, V1, N, s);
  uint64_t v = tbg_publish(c, &g, CH, p, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v);
  tbg_child_hear(ch, "released", NULL, 0);
  /* one more version, so that version v leaves the history */
  tbg_publish(c, &g, CH, p, N, s, 1);
  tbg_wait_free_one_wait(c, CH, v, s,
                         "the done event the consumer prepared at connect");
  tbg_child_say(ch, "waited");
  tbg_child_hear(ch, "done", NULL, 0);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  tb_client_disconnect(c);
  return 0;
}

static int consumer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  struct tb_cuda_counters k0, k1;
  DLManagedTensorVersioned *t = NULL;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_cu_stream cs = tbg_stream(&g, 1);
  tb_cu_deviceptr cnt = tbg_alloc(&g, 4);

  /* no_prefetch: connect prepares nothing */
  tb__cuda_counters(&k0);
  tb_client *q = connect_opts("no-prefetch", 1, NULL);
  tb__cuda_counters(&k1);
  if (k1.event_create != k0.event_create || requests(q) != 2)
    TBG_FAIL("a no_prefetch connect made %lu events, %llu requests (expected "
             "0 and the Hello + ListSessions)",
             k1.event_create - k0.event_create,
             (unsigned long long)requests(q));
  tb_client_disconnect(q);

  tb__cuda_counters(&k0);
  tb_client *c = connect_opts("consumer", 0, NULL);
  tb__cuda_counters(&k1);
  if (k1.event_create - k0.event_create != 1)
    TBG_FAIL("connect made %lu cuEventCreate calls, expected 1 (the done "
             "event)", k1.event_create - k0.event_create);
  uint64_t n0 = requests(c);
  if (n0 != 3)
    TBG_FAIL("the daemon counted %llu requests after connect, expected 3 "
             "(Hello, EventRegister, ListSessions)", (unsigned long long)n0);

  uint64_t v = tbg_child_hear_version(ch);
  tb__cuda_counters(&k0);
  TBG_OK(c, tbg_acquire(c, CH, TB_ACQUIRE_EXACT, v, cs, &t));
  tb__cuda_counters(&k1);
  uint64_t n1 = requests(c);
  if (n1 - n0 != 2 || k1.event_create != k0.event_create)
    TBG_FAIL("the first acquire made %llu requests and %lu cuEventCreate "
             "calls, expected 1 (and 1 ListSessions) and 0",
             (unsigned long long)(n1 - n0 - 1),
             k1.event_create - k0.event_create);
  /* a slow read in flight, then the release on that stream */
  tbg_spin_count_async(&g, tbg_tensor_ptr(t, N), V1, N, SPIN_MS, cnt, cs);
  tb__cuda_counters(&k0);
  TBG_OK(c, tb_release(t, cs));
  tb__cuda_counters(&k1);
  if (k1.event_record - k0.event_record != 1)
    TBG_FAIL("the release made %lu cuEventRecord calls, expected 1",
             k1.event_record - k0.event_record);
  tbg_child_say(ch, "released");
  tbg_child_hear(ch, "waited", NULL, 0);
  if (tbg_counter_read(&g, cnt, cs) != 0)
    TBG_FAIL("wrong data in the acquired version");
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

#define CH2 "gpu/named"
#define V2 0x6262B2B2u
#define V3 0x7373C3C3u

static int named_producer(struct tbt_chan *ch, void *arg) {
  struct tbg_gpu g;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_client *c = tbg_connect(&daemon_, "producer", TB_CONTRACT_SPEC);
  tb_cu_stream s = tbg_stream(&g, 1);
  tb_cu_deviceptr p = tbg_alloc(&g, N * 4ull);
  /* pending at publish: the version's ready event comes with the buffer */
  tbg_spin_fill(&g, p, V2, N, SPIN_MS, s);
  uint64_t v = tbg_publish(c, &g, CH2, p, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v);
  /* the channel moves to another allocation */
  tbg_child_hear(ch, "move", NULL, 0);
  tb_cu_deviceptr p2 = tbg_alloc(&g, N * 4ull);
  tbg_fill(&g, p2, V3, N, s);
  v = tbg_publish(c, &g, CH2, p2, N, s, 1);
  tbg_child_say(ch, "published %llu", (unsigned long long)v);
  tbg_child_hear(ch, "done", NULL, 0);
  TBG_CU(g.cu->cuStreamSynchronize(s));
  tb_client_disconnect(c);
  return 0;
}

static int named_consumer(struct tbt_chan *ch, void *arg) {
  static const char *const names[] = {"gpu/none", CH2, NULL};
  struct tbg_gpu g;
  struct tb_cuda_counters k0, k1;
  struct tb_acquire_counters a0, a1;
  DLManagedTensorVersioned *t = NULL;
  (void)arg;
  tbg_gpu_init(&g, 0);
  tb_cu_stream cs = tbg_stream(&g, 1);

  uint64_t v = tbg_child_hear_version(ch);
  tb_client *c = connect_opts("named", 0, names);
  tb__acquire_counters(&a0); /* counting starts in this thread */
  tb__cuda_counters(&k0);
  TBG_OK(c, tbg_acquire(c, CH2, TB_ACQUIRE_EXACT, v, cs, &t));
  tb__cuda_counters(&k1);
  tb__acquire_counters(&a1);
  unsigned long long opens_ns = (k1.ipc_open_mem_ns - k0.ipc_open_mem_ns) +
                                (k1.ipc_open_event_ns - k0.ipc_open_event_ns);
  if (k1.ipc_open_mem - k0.ipc_open_mem != 1 ||
      k1.ipc_open_event - k0.ipc_open_event != 1)
    TBG_FAIL("the first acquire opened %lu buffers and %lu events, "
             "expected 1 and 1",
             k1.ipc_open_mem - k0.ipc_open_mem,
             k1.ipc_open_event - k0.ipc_open_event);
  if (a1.prefetch_ns - a0.prefetch_ns < opens_ns)
    TBG_FAIL("the opens (%llu ns) did not run in the open of the buffer "
             "named at connect (%llu ns): they waited for the reply",
             opens_ns, a1.prefetch_ns - a0.prefetch_ns);
  if (tbg_count(&g, tbg_tensor_ptr(t, N), V2, N, cs) != 0)
    TBG_FAIL("wrong data in the acquired version");
  TBG_OK(c, tb_release(t, cs));
  tb__cuda_counters(&k0);
  TBG_OK(c, tbg_acquire(c, CH2, TB_ACQUIRE_LATEST, 0, cs, &t));
  tb__cuda_counters(&k1);
  if (k1.ipc_open_mem != k0.ipc_open_mem ||
      k1.ipc_open_event != k0.ipc_open_event)
    TBG_FAIL("the second acquire opened %lu buffers and %lu events",
             k1.ipc_open_mem - k0.ipc_open_mem,
             k1.ipc_open_event - k0.ipc_open_event);
  TBG_OK(c, tb_release(t, cs));
  tb_client_disconnect(c);

  /* the channel moves to another buffer between connect and the first
   * acquire: the kept buffer is opened for nothing, the reply's after the
   * reply, and the data is the new buffer's */
  c = connect_opts("named-moved", 0, names);
  tbg_child_say(ch, "move");
  v = tbg_child_hear_version(ch);
  tb__cuda_counters(&k0);
  TBG_OK(c, tbg_acquire(c, CH2, TB_ACQUIRE_EXACT, v, cs, &t));
  tb__cuda_counters(&k1);
  if (k1.ipc_open_mem - k0.ipc_open_mem != 2)
    TBG_FAIL("an acquire after the channel moved opened %lu buffers, "
             "expected 2 (the kept one, then the reply's)",
             k1.ipc_open_mem - k0.ipc_open_mem);
  if (tbg_count(&g, tbg_tensor_ptr(t, N), V3, N, cs) != 0)
    TBG_FAIL("wrong data after the channel moved");
  TBG_OK(c, tb_release(t, cs));
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void channels_named(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_start(&daemon_, &p, named_producer, NULL, &c, named_consumer, NULL);
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_pass(&c, "consumer", "move", &p);
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_finish(&p, &c, &daemon_);
}

typedef tb_cu_result (*init_fn)(unsigned);
typedef tb_cu_result (*dev_get_fn)(tb_cu_device *, int);
typedef tb_cu_result (*retain_fn)(tb_cu_context *, tb_cu_device);
typedef tb_cu_result (*set_fn)(tb_cu_context);

static void *sym(void *lib, const char *name) {
  void *f = dlsym(lib, name);
  if (f == NULL)
    TBG_FAIL("libcuda.so.1 lacks %s", name);
  return f;
}

/* arg non-NULL: initialise CUDA and make a context current, as an
 * application does; NULL: load libcuda and do nothing more. */
static int app_driver(struct tbt_chan *ch, void *arg) {
  struct tb_cuda_counters k;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL)
    TBG_FAIL("dlopen libcuda.so.1: %s", dlerror());
  if (arg != NULL) {
    init_fn init;
    dev_get_fn dev_get;
    retain_fn retain;
    set_fn set;
    void *f;
    tb_cu_device dev;
    tb_cu_context ctx;
    f = sym(lib, "cuInit");
    memcpy(&init, &f, sizeof f);
    f = sym(lib, "cuDeviceGet");
    memcpy(&dev_get, &f, sizeof f);
    f = sym(lib, "cuDevicePrimaryCtxRetain");
    memcpy(&retain, &f, sizeof f);
    f = sym(lib, "cuCtxSetCurrent");
    memcpy(&set, &f, sizeof f);
    if (init(0) != 0 || dev_get(&dev, 0) != 0 || retain(&ctx, dev) != 0 ||
        set(ctx) != 0)
      TBG_FAIL("cannot make a context current through libcuda itself");
  }
  if (tb__cuda_loaded())
    TBG_FAIL("the library's driver table is loaded before connect");
  tb_client *c = connect_opts(arg != NULL ? "app-cuda" : "app-no-init", 0, NULL);
  if (arg != NULL) {
    tb__cuda_counters(&k); /* counted since the table loaded, at connect */
    if (!tb__cuda_loaded() || k.event_create != 1 || requests(c) != 3)
      TBG_FAIL("connect with the application's context: table loaded %d, "
               "%lu events, %llu requests (expected 1, 1, 3)",
               tb__cuda_loaded(), k.event_create,
               (unsigned long long)requests(c));
  } else if (tb__cuda_loaded() || requests(c) != 2) {
    TBG_FAIL("connect without cuInit: table loaded %d, %llu requests "
             "(expected 0 and the Hello + ListSessions)",
             tb__cuda_loaded(), (unsigned long long)requests(c));
  }
  tb_client_disconnect(c);
  tbg_child_say(ch, "ok");
  return 0;
}

static void first_acquire_one_request(void **state) {
  struct tbt_child p, c;
  (void)state;
  tbg_start(&daemon_, &p, producer, NULL, &c, consumer, NULL);
  tbg_relay(&p, "producer", "published", &c, "v");
  tbg_pass(&c, "consumer", "released", &p);
  tbg_pass(&p, "producer", "waited", &c);
  tbg_finish(&p, &c, &daemon_);
}

static void application_context(void **state) {
  static int init = 1;
  struct tbt_child a, b;
  (void)state;
  tbg_daemon_up(&daemon_);
  tbg_spawn(&a, app_driver, &init);
  tbg_hear(&a, "app-cuda", "ok", NULL, 0);
  tbg_reap(&a, "app-cuda");
  tbg_spawn(&b, app_driver, NULL);
  tbg_hear(&b, "app-no-init", "ok", NULL, 0);
  tbg_reap(&b, "app-no-init");
  tbg_daemon_down(&daemon_);
}

TBG_MAIN(cmocka_unit_test(first_acquire_one_request),
         cmocka_unit_test(application_context),
         cmocka_unit_test(channels_named))
