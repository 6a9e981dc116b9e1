/* SPDX-License-Identifier: Apache-2.0 */
/* The streams that read a lease of pinned host memory, and the done event
 * recorded after them (kind.h: tb__pinned_lease_*). A GPU reads pinned
 * memory asynchronously (a non-blocking host-to-device copy, a kernel over
 * the mapped pages), so a consumer's lease of it ends as a CUDA lease
 * does: its done event is recorded after the streams the consumer
 * declared, or on the contract's default stream when it declared none,
 * and the producer waits for that event before it rewrites the buffer
 * (tb__pinned_done_wait). The lease machinery is the legacy IPC kind's
 * (kind_ipc.h, ipc_lease.c); only a mapping pinned in this process uses
 * it: without a driver every read is the host's, over when it releases.
 * docs/cuda.md, "Pinned host memory". */
#include "kind_ipc.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "cuda.h"

/* A pinned lease's state, in the lease's kind state (kind.h). */
struct pinned_lease {
  struct tb__cuda_acq acq;
  int cuda; /* the mapping is pinned here: the GPU may read it */
};

static_assert(sizeof(struct pinned_lease) <= TB__KIND_LEASE_STATE,
              "a pinned lease's state must fit the lease's kind state");

int tb__pinned_lease_begin(struct tb_client *c, void *stream, void *state) {
  struct pinned_lease *l = state;
  struct tb__cuda_stream s;
  char why[256] = "";
  int rc, dev;

  /* The done event lives on device 0, where the mapping was registered
   * (host_register.c); a stream of another device joins it there. */
  rc = tb__ci_done_event_ensure(c, 0);
  if (rc < 0)
    return rc;
  l->acq.done_device = 0;
  l->cuda = 1;
  /* NULL names the contract's stream of this thread and context, as for a
   * CUDA lease: remembered now (with its thread), since the lease may end
   * on another thread, whose per-thread or legacy stream is another. With
   * no context current (a CPU stage), or under the explicit contract (a
   * host reader), nothing is declared yet: tb__pinned_lease_end_locked. */
  if (stream == NULL &&
      (c->conn->contract == TB_CONTRACT_EXPLICIT ||
       tb__cuda_current_device(&dev, NULL, NULL, 0) < 0))
    return 0;
  rc = tb__cuda_stream_resolve(c->conn->contract, stream, &s, why,
                               sizeof(why));
  if (rc == 0)
    rc = tb__ci_lease_stream_add(&l->acq, &s, TB__LEASE_STREAMS, why,
                                 sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "pinned host memory (cuda-host): %s", why);
  return 0;
}

int tb__pinned_lease_wait(struct tb__conn *k, void *state, const DLTensor *t,
                          void *stream) {
  struct pinned_lease *l = state;

  (void)t;
  if (!l->cuda)
    return 0;
  /* Host memory is ready when published: no event to wait for, but the
   * stream is one that reads the lease. */
  return tb__cuda_lease_wait(k, &l->acq, 0, NULL, NULL, 1, 0, stream);
}

int tb__pinned_lease_use_locked(struct tb__conn *k, void *state,
                                void *stream) {
  struct pinned_lease *l = state;

  if (!l->cuda)
    return 0;
  return tb__cuda_lease_use_locked(k, &l->acq, stream);
}

int tb__pinned_lease_end_locked(struct tb__conn *k, void *state,
                                void *stream, struct tb__lease_done *done) {
  struct pinned_lease *l = state;

  struct tb__cuda_devctx dc;
  int dev, rc;

  memset(done, 0, sizeof(*done));
  if (!l->cuda)
    return 0;
  if (stream == NULL && l->acq.n_streams == 0) {
    /* Under the explicit contract a consumer that names no stream reads
     * on the host: its reads are over, and nothing is recorded (a CUDA
     * lease would be TB_ESTREAM here; a CPU stage must not be). */
    if (k->contract == TB_CONTRACT_EXPLICIT)
      return 0;
    /* The contract's default stream is the current context's. A thread
     * with none (a CPU stage's worker, a consumer library's deleter)
     * queued nothing on a stream of its own: it names device 0's primary
     * context, where the mapping was registered, rather than fail. */
    if (tb__cuda_current_device(&dev, NULL, NULL, 0) < 0 &&
        tb__cuda_device_enter(l->acq.done_device, &dc, NULL, 0) == 0) {
      rc = tb__cuda_lease_end_locked(k, &l->acq, NULL, done);
      tb__cuda_device_leave(&dc);
      return rc;
    }
  }
  return tb__cuda_lease_end_locked(k, &l->acq, stream, done);
}

/* Block until the done event completes, in relaxed capture mode so that
 * another thread's stream capture is not invalidated. */
static int done_sync(struct tb__conn *k, const struct tb__done_event *d,
                     char *why, size_t whylen) {
  const struct tb_cuda *cu;
  struct tb__cuda_devctx dc;
  tb_cu_event ev;
  tb_cu_result r;
  int rc, mode, ordinal;

  rc = tb__cu_get(&cu, why, whylen);
  if (rc != 0)
    return rc;
  /* in a context of the event's device, the one it is opened in */
  rc = tb__cuda_find_uuid(d->uuid, &ordinal, why, whylen);
  if (rc == 0)
    rc = tb__cuda_device_enter(ordinal, &dc, why, whylen);
  if (rc < 0)
    return rc;
  pthread_mutex_lock(&k->lock);
  rc = tb__ci_open_event_locked(k, d->event_id, d->handle, d->uuid, &ev, why,
                                whylen);
  if (rc == 0) {
    mode = tb__cu_relaxed_enter(cu);
    r = cu->cuEventSynchronize(ev);
    tb__cu_relaxed_leave(cu, mode);
    if (r != 0)
      rc = tb__cu_fail(why, whylen, "cuEventSynchronize", r);
  }
  pthread_mutex_unlock(&k->lock);
  tb__cuda_device_leave(&dc);
  return rc;
}

int tb__pinned_done_wait(struct tb_client *c, const struct tb__freed *f,
                         void *stream) {
  char why[256] = "";
  int rc;

  /* A stream that writes the buffer (a device-to-host copy into it) waits
   * on the GPU, as for device memory (which refuses unreachable readers
   * first). */
  if (stream != NULL)
    return tb__cuda_wait_done(c, f, stream);
  rc = tb__ci_done_unreachable(c, f);
  if (rc < 0)
    return rc;
  /* NULL: the host writes it, so the host waits. */
  for (size_t i = 0; i < f->n_done; i++) {
    rc = done_sync(c->conn, &f->done[i], why, sizeof(why));
    if (rc < 0)
      return tb__set_error(c, rc,
                           "version %llu of '%s' is read by a consumer's GPU "
                           "(a done event of pinned host memory, cuda-host); "
                           "waiting for it failed, so the buffer must not be "
                           "rewritten yet: %s",
                           (unsigned long long)f->version, f->channel, why);
  }
  return 0;
}
