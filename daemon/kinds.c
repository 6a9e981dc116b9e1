/* SPDX-License-Identifier: Apache-2.0 */
/* The daemon's table of memory kinds. */
#include "kinds.h"

#include <stddef.h>

#include "tb_proto.h"

static const struct tbd_kind kinds[] = {
    /* The daemon holds its own descriptor of the memfd: the pages live as
     * long as it or any consumer's mapping does. */
    {TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_HOST_MEMFD, "host memfd",
     true},
    /* A legacy IPC handle names the producer's own allocation: the
     * allocation dies with the producer process, and a consumer's open of
     * its handle then fails (CUDA_ERROR_INVALID_HANDLE). Mappings opened
     * before keep working (measured, though CUDA calls it undefined). */
    {TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC, "CUDA IPC", false},
    /* An exported VMM allocation lives while any descriptor of it does,
     * the daemon's included (measured). Not accepted yet (TB_ENOTSUP). */
    {TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_VMM_FD, "CUDA VMM fd",
     true},
};

const struct tbd_kind *tbd_kind_find(int kind) {
  for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
    if (kinds[i].kind == kind)
      return &kinds[i];
  return NULL;
}

bool tbd_kind_survives_producer(int kind) {
  const struct tbd_kind *k = tbd_kind_find(kind);

  return k != NULL && k->survives_producer;
}

const char *tbd_kind_name(int kind) {
  const struct tbd_kind *k = tbd_kind_find(kind);

  return k != NULL ? k->name : "memory";
}
