/* SPDX-License-Identifier: Apache-2.0 */
/* The tb_<object>_<verb> names of the public API (docs/c-api.md). Each
 * calls the function that has done the work since 0.1.0 under its older
 * name, which stays exported as an alias; those that fill a struct take a
 * struct_size and copy the older function's whole struct into as much of
 * the caller's as it has (tensorbroker.h, "struct_size"). Only the public
 * header is used here, as a user of the library would. */
#include <stdalign.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <tensorbroker/tensorbroker.h>

/* One past the last byte of field f of struct type t. */
#define END_OF(t, f) (offsetof(t, f) + sizeof(((t *)0)->f))
/* x rounded up to a multiple of a (a power of two). */
#define ROUND_UP(x, a) (((x) + (a)-1) & ~((size_t)(a)-1))

/* The first version of each struct the library fills: its size in the
 * release that first filled it (0.1.0, or the struct's own first release).
 * The older entry points fill exactly that many bytes, so they must never
 * grow: when a field is added to one of these structs, its assertion below
 * fails, and the older function must then be made to fill only FIRST_*
 * bytes (with the new field left to the struct_size functions). */
#define FIRST_STATUS END_OF(struct tb_status, socket_path)
#define FIRST_SESSION END_OF(struct tb_session_info, requests)
#define FIRST_LEASE_INFO END_OF(struct tb_lease_info, producer_pid)
#define FIRST_NOTICE END_OF(struct tb_notice, reason)
#define FIRST_LEASE_ENTRY END_OF(struct tb_lease_entry, died)
#define FIRST_WAIT_ENTRY END_OF(struct tb_wait_entry, in_history)

#define SAME_AS_FIRST(t, first)                                                \
  _Static_assert(sizeof(t) == ROUND_UP(first, alignof(t)),                     \
                 #t " grew after its first version: make its older entry "     \
                 "point fill only the first version (api_names.c)")
SAME_AS_FIRST(struct tb_status, FIRST_STATUS);
SAME_AS_FIRST(struct tb_session_info, FIRST_SESSION);
SAME_AS_FIRST(struct tb_lease_info, FIRST_LEASE_INFO);
SAME_AS_FIRST(struct tb_notice, FIRST_NOTICE);
SAME_AS_FIRST(struct tb_lease_entry, FIRST_LEASE_ENTRY);
SAME_AS_FIRST(struct tb_wait_entry, FIRST_WAIT_ENTRY);

/* A struct_size the library accepts for a struct whose first version is
 * first bytes long and which is aligned to align. */
static int size_ok(size_t struct_size, size_t first, size_t align) {
  return struct_size >= first && struct_size <= TB_STRUCT_SIZE_MAX &&
         struct_size % align == 0;
}

/* Write x (size bytes) into the first struct_size bytes at dst: as much of
 * it as fits, zero after it. */
static void put(void *dst, size_t struct_size, const void *x, size_t size) {
  size_t n = size < struct_size ? size : struct_size;

  memcpy(dst, x, n);
  memset((char *)dst + n, 0, struct_size - n);
}

/* ---- names that only changed ---- */

int tb_client_default_socket_path(char *buf, size_t len) {
  return tb_default_socket_path(buf, len);
}

size_t tb_client_connect_error(char *buf, size_t len) {
  return tb_connect_error(buf, len);
}

int tb_buffer_create_host(tb_client *c, size_t size, unsigned flags,
                          tb_buffer **out) {
  return tb_host_buffer_create(c, size, flags, out);
}

/* the other way round: the name the VMM design gave it */
int tb_cuda_buffer_create(tb_client *c, size_t size, int device,
                          unsigned flags, tb_buffer **out) {
  return tb_buffer_create_cuda(c, size, device, flags, out);
}

int tb_channel_publish(tb_client *c, const char *channel, const DLTensor *t,
                       const struct tb_publish_options *opts,
                       uint64_t *out_version) {
  return tb_publish(c, channel, t, opts, out_version);
}

int tb_channel_publish_copy(tb_client *c, const char *channel,
                            const DLTensor *t,
                            const struct tb_publish_options *opts,
                            uint64_t *out_version) {
  return tb_publish_copy(c, channel, t, opts, out_version);
}

int tb_channel_wait_free(tb_client *c, const char *channel, uint64_t version,
                         int timeout_ms, void *stream) {
  return tb_wait_free(c, channel, version, timeout_ms, stream);
}

int tb_channel_subscribe(tb_client *c, const char *channel) {
  return tb_subscribe(c, channel);
}

int tb_channel_unsubscribe(tb_client *c, const char *channel) {
  return tb_unsubscribe(c, channel);
}

int tb_lease_acquire(tb_client *c, const char *channel,
                     const struct tb_acquire_options *opts,
                     DLManagedTensorVersioned **out) {
  return tb_acquire(c, channel, opts, out);
}

int tb_lease_release(DLManagedTensorVersioned *t, void *stream) {
  return tb_release(t, stream);
}

int tb_lease_list(tb_client *c, size_t struct_size,
                  struct tb_lease_entry **out, size_t *count) {
  if (struct_size > TB_STRUCT_SIZE_MAX)
    return TB_EINVAL;
  return tb_list_leases(c, struct_size, out, count);
}

int tb_wait_list(tb_client *c, size_t struct_size, struct tb_wait_entry **out,
                 size_t *count) {
  if (struct_size > TB_STRUCT_SIZE_MAX)
    return TB_EINVAL;
  return tb_list_waits(c, struct_size, out, count);
}

int tb_channel_list(tb_client *c, size_t struct_size,
                    struct tb_channel_info **out, size_t *count) {
  if (struct_size > TB_STRUCT_SIZE_MAX)
    return TB_EINVAL;
  return tb_list_channels_sized(c, struct_size, out, count);
}

int tb_daemon_get_metrics(tb_client *c, char **text, size_t *len) {
  return tb_daemon_metrics(c, text, len);
}

const char *tb_memory_kind_name(int kind) {
  switch (kind) {
  case TB_MEMORY_HOST:
    return "host";
  case TB_MEMORY_CUDA_IPC:
    return "cuda-ipc";
  case TB_MEMORY_CUDA_VMM:
    return "cuda-vmm";
  case TB_MEMORY_CUDA_HOST:
    return "cuda-host";
  default:
    return NULL;
  }
}

const char *tb_wait_what_name(int what) {
  switch (what) {
  case TB_WAIT_ACQUIRE_LATEST:
    return "acquire-latest";
  case TB_WAIT_ACQUIRE_NEXT:
    return "acquire-next";
  case TB_WAIT_ACQUIRE_EXACT:
    return "acquire-exact";
  case TB_WAIT_FREE:
    return "wait-free";
  default:
    return NULL;
  }
}

/* ---- names that take a struct_size ---- */

int tb_lease_get_info(const DLManagedTensorVersioned *t, size_t struct_size,
                      struct tb_lease_info *out) {
  struct tb_lease_info x;
  int rc;

  if (out == NULL ||
      !size_ok(struct_size, FIRST_LEASE_INFO, alignof(struct tb_lease_info)))
    return TB_EINVAL;
  rc = tb_lease_info(t, &x);
  if (rc == 0)
    put(out, struct_size, &x, sizeof(x));
  return rc;
}

int tb_notice_poll(tb_client *c, size_t struct_size, struct tb_notice *out,
                   int timeout_ms) {
  struct tb_notice x;
  int rc;

  /* checked before a notice is taken off the queue, not after */
  if (out == NULL ||
      !size_ok(struct_size, FIRST_NOTICE, alignof(struct tb_notice)))
    return TB_EINVAL;
  rc = tb_client_poll_notice(c, &x, timeout_ms);
  if (rc == 0)
    put(out, struct_size, &x, sizeof(x));
  return rc;
}

int tb_daemon_get_status(tb_client *c, size_t struct_size,
                         struct tb_status *out) {
  struct tb_status x;
  int rc;

  if (out == NULL ||
      !size_ok(struct_size, FIRST_STATUS, alignof(struct tb_status)))
    return TB_EINVAL;
  rc = tb_daemon_status(c, &x);
  if (rc == 0)
    put(out, struct_size, &x, sizeof(x));
  return rc;
}

int tb_session_list(tb_client *c, size_t struct_size,
                    struct tb_session_info **out, size_t *count) {
  struct tb_session_info *a;
  char *b;
  size_t n;
  int rc;

  if (out == NULL || count == NULL ||
      !size_ok(struct_size, FIRST_SESSION, alignof(struct tb_session_info)))
    return TB_EINVAL;
  rc = tb_list_sessions(c, &a, &n);
  if (rc < 0)
    return rc;
  if (struct_size == sizeof(*a)) {
    b = (char *)a;
  } else {
    /* at least one entry, as the other lists: never NULL on success */
    b = calloc(n > 0 ? n : 1, struct_size);
    if (b == NULL) {
      tb_free(a);
      return TB_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
      put(b + i * struct_size, struct_size, &a[i], sizeof(*a));
    tb_free(a);
  }
  *out = (struct tb_session_info *)b;
  *count = n;
  return 0;
}
