/* Channels named at connect (tb_connect_options.channels): the newest CUDA
 * buffer of each, as the HelloReply brought it, kept until the client's
 * first acquire on that channel opens it while the daemon answers that
 * acquire (docs/cuda.md, "Channels named at connect"). Under call_lock. */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

struct tb__hint {
  char *channel;
  uint64_t buffer_id;
  uint32_t generation;
  uint8_t *packed; /* the NewVersion, as the daemon sent it */
  size_t len;
};

static void hint_free(struct tb__hint *h) {
  free(h->channel);
  free(h->packed);
}

/* Remove hint i; the last one takes its place. */
static void hint_remove(struct tb_client *c, size_t i) {
  hint_free(&c->hints[i]);
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
    struct tb__hint *h = &c->hints[c->n_hints];

    if (nv == NULL || nv->channel == NULL || nv->buffer == NULL ||
        nv->buffer->kind !=
            TENSORBROKER__V1__MEMORY_KIND__MEMORY_KIND_CUDA_IPC)
      continue;
    h->len = tensorbroker__v1__new_version__get_packed_size(nv);
    h->packed = malloc(h->len);
    h->channel = strdup(nv->channel);
    if (h->packed == NULL || h->channel == NULL) {
      hint_free(h);
      continue;
    }
    tensorbroker__v1__new_version__pack(nv, h->packed);
    h->buffer_id = nv->buffer->buffer_id;
    h->generation = nv->buffer->generation;
    c->n_hints++;
  }
}

void tb__hint_open(struct tb_client *c, const char *channel) {
  Tensorbroker__V1__NewVersion *nv;
  uint64_t t0;
  size_t i;

  for (i = 0; i < c->n_hints; i++)
    if (strcmp(c->hints[i].channel, channel) == 0)
      break;
  if (i == c->n_hints)
    return;
  /* once: a later acquire on the channel finds the mapping, or opens what
   * the reply names */
  nv = tensorbroker__v1__new_version__unpack(NULL, c->hints[i].len,
                                             c->hints[i].packed);
  hint_remove(c, i);
  if (nv == NULL)
    return;
  t0 = tb__acquire_counting() ? tb__now_ns() : 0;
  if (nv->buffer != NULL)
    tb__cuda_prefetch(c, nv->buffer, nv->ready_event);
  if (t0 != 0)
    tb__count_prefetch(tb__now_ns() - t0);
  tensorbroker__v1__new_version__free_unpacked(nv, NULL);
}

void tb__hints_retire(struct tb_client *c, uint64_t buffer_id,
                      uint32_t generation) {
  for (size_t i = 0; i < c->n_hints;) {
    if (c->hints[i].buffer_id == buffer_id &&
        c->hints[i].generation <= generation)
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
