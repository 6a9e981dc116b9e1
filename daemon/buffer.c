/* SPDX-License-Identifier: Apache-2.0 */
/* Buffers and events: registration's bookkeeping, retirement and the
 * BufferRetired notice, and the BufferInfo consumers are sent. */
#include "registry_impl.h"

#include <string.h>
#include <unistd.h>

#include <tensorbroker/tensorbroker.h>


static void buffer_unlink_owner(struct tbd_buffer *b) {
  if (b->owner == NULL)
    return;
  DL_DELETE2(b->owner->buffers, b, sprev, snext);
  b->owner->nbuffers--;
  b->owner = NULL;
}

void tbd__buffer_maybe_free(struct tbd_registry *r, struct tbd_buffer *b) {
  Tensorbroker__V1__Notice n = TENSORBROKER__V1__NOTICE__INIT;
  Tensorbroker__V1__BufferRetired br = TENSORBROKER__V1__BUFFER_RETIRED__INIT;
  struct tbd_session *s, *stmp;

  if (!b->retired || b->nversions > 0)
    return;
  n.body_case = TENSORBROKER__V1__NOTICE__BODY_BUFFER_RETIRED;
  n.buffer_retired = &br;
  br.buffer_id = b->id;
  br.generation = b->generation;
  HASH_ITER(hh, r->sessions, s, stmp) {
    struct tbd_sent *e;
    HASH_FIND(hh, s->sent, &b->id, sizeof(b->id), e);
    if (e == NULL)
      continue;
    HASH_DEL(s->sent, e);
    tbd_free(e);
    tbd__emit_notice(r, s, &n);
  }
  if (b->fd >= 0) {
    close(b->fd);
    tbd_registry_fds_give(r, 1);
  }
  if (b->rofd >= 0) {
    close(b->rofd);
    tbd_registry_fds_give(r, 1);
  }
  HASH_DEL(r->buffers, b);
  r->nbuffers--;
  b->u->n[TBD_RES_BUFFERS]--;
  tbd__uid_put(r, b->u);
  tbd_free(b->info);
  tbd_free(b->info_ro);
  tbd_free(b);
}

void tbd__buffer_retire(struct tbd_registry *r, struct tbd_buffer *b) {
  buffer_unlink_owner(b);
  b->retired = true;
  tbd__buffer_maybe_free(r, b);
}


/* ---- buffers and events ---- */

int tbd__buffer_add(struct tbd_registry *r, struct tbd_session *s,
                    struct tbd_buffer *b) {
  if (s->nbuffers >= r->lim.max_buffers)
    return TB_ELIMIT;
  b->id = r->next_buffer_id;
  b->generation = 1;
  tbd_hash_oom = 0;
  HASH_ADD(hh, r->buffers, id, sizeof(b->id), b);
  if (tbd_hash_oom)
    return TB_ENOMEM;
  r->next_buffer_id++;
  r->nbuffers++;
  b->u = s->u;
  b->u->n[TBD_RES_BUFFERS]++;
  b->owner = s;
  b->owner_pid = (uint32_t)s->pid;
  b->owner_id = s->id;
  b->owner_shm_id = s->shm_id;
  b->owner_pidns_id = s->pidns_id;
  b->next_slot = 1;
  DL_APPEND2(s->buffers, b, sprev, snext);
  s->nbuffers++;
  return 0;
}

int tbd__event_add(struct tbd_registry *r, struct tbd_session *s,
                   struct tbd_event *e) {
  if (s->nevents >= r->lim.max_events)
    return TB_ELIMIT;
  e->info.id = r->next_event_id;
  e->info.pid = (uint32_t)s->pid;
  e->info.session = s->id;
  tbd_hash_oom = 0;
  HASH_ADD(hh, r->events, info.id, sizeof(e->info.id), e);
  if (tbd_hash_oom)
    return TB_ENOMEM;
  r->next_event_id++;
  r->nevents++;
  s->u->n[TBD_RES_EVENTS]++;
  e->owner = s;
  DL_APPEND2(s->events, e, sprev, snext);
  s->nevents++;
  return 0;
}

void tbd__event_remove(struct tbd_registry *r, struct tbd_event *e) {
  DL_DELETE2(e->owner->events, e, sprev, snext);
  e->owner->nevents--;
  e->owner->u->n[TBD_RES_EVENTS]--;
  HASH_DEL(r->events, e);
  r->nevents--;
  tbd_free(e);
}

/* b's packed BufferInfo (write: as registered, else with writable false;
 * tbd__buffer_info_pack made it) as the value of a length-delimited field (the
 * length, then the bytes, then fd_attached = true when attach), into out,
 * which has room for b->info_len + 16 bytes. Returns the length. Replies
 * and notices carry it as an "unknown" field, which protobuf-c copies
 * verbatim: no unpack, re-pack or re-size per message. */
size_t tbd__buffer_info_field(const struct tbd_buffer *b, bool write,
                              bool attach, uint8_t *out) {
  const uint8_t *info = write || !b->writable ? b->info : b->info_ro;
  size_t info_len = write || !b->writable ? b->info_len : b->info_ro_len;
  size_t len = tb__put_varint(out, info_len + (attach ? 2 : 0));

  memcpy(out + len, info, info_len);
  len += info_len;
  if (attach) { /* BufferInfo.fd_attached = 8, varint true */
    out[len++] = 8u << 3;
    out[len++] = 1;
  }
  return len;
}

/* The BufferInfo of b as every AcquireReply sends it, packed once: all of
 * it is fixed at registration except fd_attached, which lease_grant
 * appends when true, and, for a buffer consumers may write, writable,
 * which is false for a consumer not granted write (!write: b->info_ro).
 * 0 or TB_ENOMEM. */
int tbd__buffer_info_pack(struct tbd_buffer *b, bool write) {
  Tensorbroker__V1__BufferInfo bi = TENSORBROKER__V1__BUFFER_INFO__INIT;
  Tensorbroker__V1__Device bdev = TENSORBROKER__V1__DEVICE__INIT;
  bool ro = b->writable && !write;
  uint8_t **info = ro ? &b->info_ro : &b->info;
  size_t *info_len = ro ? &b->info_ro_len : &b->info_len;

  if (*info != NULL)
    return 0;
  bi.buffer_id = b->id;
  bi.generation = b->generation;
  bi.kind = b->kind;
  bi.size = b->size;
  bi.device = &bdev;
  bdev.type = b->dev_type;
  bdev.id = b->dev_id;
  bdev.uuid.data = b->uuid;
  bdev.uuid.len = b->uuid_len;
  bi.cuda_ipc_handle.data = b->handle;
  bi.cuda_ipc_handle.len = b->handle_len;
  bi.writable = b->writable && !ro;
  bi.producer_pid = b->owner_pid;
  bi.signal_offset = b->signal_offset;
  *info_len = tensorbroker__v1__buffer_info__get_packed_size(&bi);
  *info = tbd_malloc(*info_len);
  if (*info == NULL)
    return TB_ENOMEM;
  tensorbroker__v1__buffer_info__pack(&bi, *info);
  return 0;
}
