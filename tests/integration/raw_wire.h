/* SPDX-License-Identifier: Apache-2.0 */
/* Integration tests that speak the wire directly, with proto/'s codec: a
 * CUDA producer or consumer without a GPU (the daemon never opens CUDA
 * handles; tests/common/fake_cuda.h makes them up), or a client that
 * misbehaves on purpose.
 *
 * A failed check fails the cmocka test; in a forked child that called
 * raw_child() first, it prints where and why and exits the child with 2
 * (cmocka must not run there, see harness.h). */
#ifndef TB_TESTS_RAW_WIRE_H
#define TB_TESTS_RAW_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tb_proto.h"

struct tbt_daemon; /* harness.h, which may be included only once */

/* Checks from here on exit the process with 2 instead of failing a test. */
void raw_child(void);

/* A SOCK_SEQPACKET connection to d (no Hello yet). */
int raw_connect(const struct tbt_daemon *d);
void raw_send_req(int fd, tb__request *r);
/* Read one server message (bounded by TBT_TIMEOUT_MS); NULL at end of
 * stream. Descriptors that came with it are closed. */
tb__server_message *raw_recv(int fd);
/* raw_recv that keeps the first max descriptors that came with the message
 * in keep (*nkept of them; the caller closes them) and closes the rest. */
tb__server_message *raw_recv_fds(int fd, int *keep, int max, int *nkept);
/* Whether a datagram is waiting to be read now. */
bool raw_pending(int fd);

struct raw_hello_opts {
  bool says_goodbye;            /* Hello.says_goodbye */
  bool cuda;                    /* memory_kinds lists CUDA_IPC */
  bool prefetch;                /* Hello.prefetch */
  const char *const *channels;  /* Hello.channels, n_channels of them */
  size_t n_channels;
};

/* Hello (request id 1) that must succeed; returns its reply (the caller
 * frees it). */
tb__server_message *raw_hello_reply(int fd, const struct raw_hello_opts *o);
/* Hello; says_goodbye as Hello.says_goodbye, cuda: it can map CUDA memory.
 * Returns the session id. */
uint64_t raw_hello_as(int fd, bool says_goodbye, bool cuda);
uint64_t raw_hello(int fd);

/* Send r with request id id and read until its reply, skipping the
 * notices before it; returns the reply, whatever its status (caller
 * frees). */
tb__server_message *raw_call(int fd, tb__request *r, uint64_t id);
/* raw_call that must succeed. */
tb__server_message *raw_ok(int fd, tb__request *r, uint64_t id);

/* A made-up CUDA_IPC buffer whose handle's first byte is tag; its id. */
uint64_t raw_cuda_buffer(int fd, uint64_t id, uint8_t tag);

/* Publish a float32[16] CUDA tensor in buffer bid; ready: its ready event
 * (0: none), published as not complete; depth: history_depth (0: keep).
 * Returns the version. */
uint64_t raw_publish_depth(int fd, uint64_t id, const char *ch, uint64_t bid,
                           uint64_t ready, uint32_t depth);
uint64_t raw_publish(int fd, uint64_t id, const char *ch, uint64_t bid,
                     uint64_t ready);

/* Send an Acquire without reading its reply (for a request that parks). */
void raw_send_acquire(int fd, uint64_t id, const char *ch, int mode,
                      uint64_t version, int64_t timeout_ms);

/* The one-way Goodbye of a session that closes on purpose. */
void raw_goodbye(int fd);

#endif /* TB_TESTS_RAW_WIRE_H */
