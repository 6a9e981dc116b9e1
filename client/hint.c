/* SPDX-License-Identifier: Apache-2.0 */
/* Channels named at connect (tb_connect_options.channels): the newest
 * buffer of each whose memory kind opens ahead (kind.h, prefetch: CUDA), as
 * the HelloReply brought it, kept until the client's
 * first acquire on that channel opens it while the daemon answers that
 * acquire (docs/cuda.md, "Channels named at connect"). Under call_lock. */
#include "kind.h"

#include <stdlib.h>
#include <string.h>

/* c->hints[i] is a NewVersion from the HelloReply, copied out of the
 * reply's arena at connect (packed and unpacked again: a deep copy), so
 * that the acquire that uses it decodes nothing. Free hint i; the last one
 * takes its place. */
static void hint_remove(struct tb_client *c, size_t i) {
  tensorbroker__v1__new_version__free_unpacked(c->hints[i], NULL);
  c->hints[i] = c->hints[--c->n_hints];
}

void tb__hints_keep(struct tb_client *c,
                    const Tensorbroker__V1__HelloReply *hr) {
  size_t n = hr->n_latest < TB_CONNECT_CHANNELS_MAX ? hr->n_latest
                                                    : TB_CONNECT_CHANNELS_MAX;

  if (n == 0 || c->hints != NULL)
    return;
  c->hints = calloc(n, sizeof(*c->hints));
  if (c->hints == NULL)
    return; /* the acquires open what they need, as without the hints */
  for (size_t i = 0; i < n; i++) {
    const Tensorbroker__V1__NewVersion *nv = hr->latest[i];

    const struct tb__kind_ops *ops;

    if (nv == NULL || nv->channel == NULL || nv->buffer == NULL)
      continue;
    ops = tb__kind((int)nv->buffer->kind);
    if (ops == NULL || ops->prefetch == NULL)
      continue;
    size_t len = tensorbroker__v1__new_version__get_packed_size(nv);
    uint8_t *buf = malloc(len);
    if (buf == NULL)
      continue;
    tensorbroker__v1__new_version__pack(nv, buf);
    c->hints[c->n_hints] = tensorbroker__v1__new_version__unpack(NULL, len, buf);
    free(buf);
    if (c->hints[c->n_hints] != NULL)
      c->n_hints++;
  }
}

void tb__hint_open(struct tb_client *c, const char *channel) {
  const Tensorbroker__V1__NewVersion *nv;
  size_t i;

  for (i = 0; i < c->n_hints; i++)
    if (strcmp(c->hints[i]->channel, channel) == 0)
      break;
  if (i == c->n_hints)
    return;
  nv = c->hints[i];
  tb__kind_prefetch(c, nv->buffer, nv->ready_event);
  /* once: a later acquire on the channel finds the mapping, or opens what
   * its reply names */
  hint_remove(c, i);
}

void tb__hints_retire(struct tb_client *c, uint64_t buffer_id,
                      uint32_t generation) {
  for (size_t i = 0; i < c->n_hints;) {
    if (c->hints[i]->buffer->buffer_id == buffer_id &&
        c->hints[i]->buffer->generation <= generation)
      hint_remove(c, i);
    else
      i++;
  }
}

void tb__hints_free(struct tb_client *c) {
  while (c->n_hints > 0)
    hint_remove(c, c->n_hints - 1);
  free(c->hints);
  c->hints = NULL;
}
