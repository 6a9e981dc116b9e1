/* SPDX-License-Identifier: Apache-2.0 */
/* CPU-side checks of the acquire options added for cross-GPU exchange
 * (device, flags), against the real daemon with a host tensor; runs on any
 * machine:
 *  - tb_acquire_options_init sets device -1 and flags 0;
 *  - a caller built against the older struct (struct_size ending at
 *    stream) is accepted, and whatever lies beyond its struct_size is not
 *    read (garbage there changes nothing);
 *  - bad values are TB_EINVAL with a message: unknown flag bits, device
 *    below -1;
 *  - host tensors ignore device and TB_ACQUIRE_COPY_TO_DEVICE (the flag
 *    asks for a copy only between GPUs): same zero-copy read-only tensor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <tensorbroker/tensorbroker.h>

#include "harness.h"

#define NW 64

static struct tbt_daemon daemon_;
static tb_client *prod, *cons;
static tb_buffer *buf;

static int setup(void **state) {
  DLTensor t;
  int64_t shape = NW;
  uint32_t *w;
  (void)state;
  if (tbt_daemon_start(&daemon_, NULL) != 0)
    return -1;
  if (tbt_connect(&daemon_, "producer", &prod) != 0 ||
      tbt_connect(&daemon_, "consumer", &cons) != 0)
    return -1;
  if (tb_host_buffer_create(prod, NW * 4, 0, &buf) != 0)
    return -1;
  w = tb_buffer_data(buf);
  for (uint32_t i = 0; i < NW; i++)
    w[i] = 0xC0DE0000u + i;
  memset(&t, 0, sizeof t);
  t.data = w;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = kDLUInt;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = &shape;
  return tb_publish(prod, "opts/host", &t, NULL, NULL) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  tb_client_disconnect(cons);
  tb_buffer_destroy(buf);
  tb_client_disconnect(prod);
  tbt_daemon_stop(&daemon_);
  tbt_daemon_cleanup(&daemon_);
  return 0;
}

static void check_host_tensor(DLManagedTensorVersioned *t) {
  const uint32_t *w = t->dl_tensor.data;
  assert_int_equal(t->dl_tensor.device.device_type, kDLCPU);
  assert_int_equal(t->dl_tensor.shape[0], NW);
  assert_ptr_not_equal(w, NULL);
  for (uint32_t i = 0; i < NW; i++)
    assert_int_equal(w[i], 0xC0DE0000u + i);
  /* zero-copy, read-only: never flagged as a copy */
  assert_true(t->flags & TB_DLPACK_FLAG_BITMASK_READ_ONLY);
  assert_false(t->flags & TB_DLPACK_FLAG_BITMASK_IS_COPIED);
}

static void defaults(void **state) {
  struct tb_acquire_options o;
  (void)state;
  memset(&o, 0x5a, sizeof o);
  tb_acquire_options_init(&o);
  assert_int_equal(o.struct_size, sizeof o);
  assert_int_equal(o.mode, TB_ACQUIRE_LATEST);
  assert_int_equal(o.timeout_ms, -1);
  assert_null(o.stream);
  assert_int_equal(o.device, -1);
  assert_int_equal(o.flags, 0);
  assert_null(o.release);
  assert_null(o.release_stream);
  /* the new fields come after every older one */
  assert_true(offsetof(struct tb_acquire_options, release) >
              offsetof(struct tb_acquire_options, flags));
  assert_true(offsetof(struct tb_acquire_options, release_stream) >
              offsetof(struct tb_acquire_options, release));
  assert_true(offsetof(struct tb_acquire_options, device) >=
              offsetof(struct tb_acquire_options, stream) + sizeof(void *));
  assert_true(offsetof(struct tb_acquire_options, flags) >
              offsetof(struct tb_acquire_options, device));
}

static void old_struct_size(void **state) {
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;
  (void)state;
  tb_acquire_options_init(&o);
  o.timeout_ms = TBT_TIMEOUT_MS;
  /* what a caller compiled against 0.1.0 passes */
  o.struct_size = offsetof(struct tb_acquire_options, stream) + sizeof(void *);
  /* garbage beyond its struct_size must not be read */
  o.device = -77;
  o.flags = 0xdead0000u;
  o.release = (DLManagedTensorVersioned *)(uintptr_t)0x5a5a5a5a;
  o.release_stream = (void *)(uintptr_t)0x5a5a;
  assert_int_equal(tb_acquire(cons, "opts/host", &o, &t), 0);
  check_host_tensor(t);
  assert_int_equal(tb_release(t, NULL), 0);
  /* a struct_size ending at flags: release not read */
  o.struct_size = offsetof(struct tb_acquire_options, flags) + sizeof(unsigned);
  o.device = -1;
  o.flags = 0;
  t = NULL;
  assert_int_equal(tb_acquire(cons, "opts/host", &o, &t), 0);
  check_host_tensor(t);
  assert_int_equal(tb_release(t, NULL), 0);
  o.device = -77;
  o.flags = 0xdead0000u;
  /* struct_size cutting device in half: device not read either */
  o.struct_size = offsetof(struct tb_acquire_options, device) + 1;
  t = NULL;
  assert_int_equal(tb_acquire(cons, "opts/host", &o, &t), 0);
  check_host_tensor(t);
  assert_int_equal(tb_release(t, NULL), 0);
}

static void bad_values(void **state) {
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;
  char msg[256];
  (void)state;
  tb_acquire_options_init(&o);
  o.timeout_ms = TBT_TIMEOUT_MS;
  o.flags = 0x80;
  assert_int_equal(tb_acquire(cons, "opts/host", &o, &t), TB_EINVAL);
  assert_null(t);
  tb_client_last_error(cons, msg, sizeof msg);
  assert_non_null(strstr(msg, "unknown acquire flags 0x80"));
  o.flags = 0;
  o.device = -2;
  assert_int_equal(tb_acquire(cons, "opts/host", &o, &t), TB_EINVAL);
  assert_null(t);
  tb_client_last_error(cons, msg, sizeof msg);
  assert_non_null(strstr(msg, "device -2"));
  /* nothing was leased by the refused calls */
  struct tb_channel_info *ch = NULL;
  size_t n = 0;
  assert_int_equal(tb_list_channels(cons, &ch, &n), 0);
  assert_int_equal(n, 1);
  assert_int_equal(ch[0].leases, 0);
  tb_free(ch);
}

static void host_ignores_device(void **state) {
  struct tb_acquire_options o;
  DLManagedTensorVersioned *t = NULL;
  (void)state;
  tb_acquire_options_init(&o);
  o.timeout_ms = TBT_TIMEOUT_MS;
  o.device = 3;
  o.flags = TB_ACQUIRE_COPY_TO_DEVICE;
  assert_int_equal(tb_acquire(cons, "opts/host", &o, &t), 0);
  check_host_tensor(t);
  assert_int_equal(tb_release(t, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(defaults),
      cmocka_unit_test(old_struct_size),
      cmocka_unit_test(bad_values),
      cmocka_unit_test(host_ignores_device),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
