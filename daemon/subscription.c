/* SPDX-License-Identifier: Apache-2.0 */
/* Subscriptions and the NewVersion notices a publish sends subscribers
 * (with the buffer, for prefetch). */
#include "registry_impl.h"

#include <string.h>

#include <tensorbroker/tensorbroker.h>

#include "kinds.h"

/* NewVersion of v for s; see registry_impl.h. */
bool tbd__new_version_fill(struct tbd_registry *r, struct tbd_session *s,
                           struct tbd_version *v,
                           struct tbd_new_version *out) {
  Tensorbroker__V1__NewVersion nv = TENSORBROKER__V1__NEW_VERSION__INIT;
  struct tbd_buffer *b = v->buf;
  struct tbd_sent *sent = NULL;
  bool write;

  out->nv = nv;
  out->nv.channel = v->ch->name;
  out->nv.version = v->number;
  if (!s->prefetch || !tbd_kind_find(b->kind)->prefetch_with_notice ||
      !(s->memory_kinds & (1u << b->kind)))
    return false;
  HASH_FIND(hh, s->sent, &b->id, sizeof(b->id), sent);
  write = b->writable &&
          tbd__access_quiet(r, s, TBD_ACL_WRITE, v->ch->name, v->ch);
  if (sent != NULL || tbd__buffer_info_pack(b, write) < 0 ||
      b->info_len + 16 > sizeof(out->bibuf))
    return false;
  sent = tbd_calloc(1, sizeof(*sent));
  if (sent == NULL)
    return false;
  sent->buffer_id = b->id;
  sent->write = write;
  tbd_hash_oom = 0;
  HASH_ADD(hh, s->sent, buffer_id, sizeof(sent->buffer_id), sent);
  if (tbd_hash_oom) {
    tbd_free(sent);
    return false;
  }
  out->uf.tag = 3; /* NewVersion.buffer */
  out->uf.wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
  out->uf.len = tbd__buffer_info_field(b, write, false, out->bibuf);
  out->uf.data = out->bibuf;
  out->nv.base.n_unknown_fields = 1;
  out->nv.base.unknown_fields = &out->uf;
  if (v->has_ready) {
    tbd__evinfo_to_pb(&v->ready, &out->ei, &out->edev);
    out->nv.ready_event = &out->ei;
  }
  return true;
}


/* A subscriber's NewVersion notice (with the buffer, for prefetch); none
 * for a subscriber that may not acquire from the channel (it subscribed
 * before the channel was published, or the rules changed). */
void tbd__new_version_notify(struct tbd_registry *r, struct tbd_session *s,
                             struct tbd_version *v) {
  Tensorbroker__V1__Notice n = TENSORBROKER__V1__NOTICE__INIT;
  struct tbd_new_version nv;

  if (!tbd__access_quiet(r, s, TBD_ACL_ACQUIRE, v->ch->name, v->ch))
    return;
  (void)tbd__new_version_fill(r, s, v, &nv);
  n.body_case = TENSORBROKER__V1__NOTICE__BODY_NEW_VERSION;
  n.new_version = &nv.nv;
  tbd__emit_notice(r, s, &n);
}

/* ---- subscriptions ---- */

int tbd__subscribe(struct tbd_registry *r, struct tbd_session *s,
                   const char *name) {
  struct tbd_sub *sub;
  struct tbd_subgroup *g, *newg = NULL;

  HASH_FIND_STR(s->subs, name, sub);
  if (sub != NULL)
    return 0;
  if (s->nsubs >= r->lim.max_subscriptions)
    return TB_ELIMIT;
  sub = tbd_calloc(1, sizeof(*sub));
  if (sub == NULL)
    return TB_ENOMEM;
  sub->name = tbd_strdup(name);
  if (sub->name == NULL)
    goto out_free_sub;
  HASH_FIND_STR(r->subgroups, name, g);
  if (g == NULL) {
    newg = tbd_calloc(1, sizeof(*newg));
    if (newg == NULL)
      goto out_free_sub;
    newg->name = tbd_strdup(name);
    if (newg->name == NULL)
      goto out_free_group;
    tbd_hash_oom = 0;
    HASH_ADD_KEYPTR(hh, r->subgroups, newg->name, strlen(newg->name), newg);
    if (tbd_hash_oom)
      goto out_free_group;
    g = newg;
  }
  tbd_hash_oom = 0;
  HASH_ADD_KEYPTR(hh, s->subs, sub->name, strlen(sub->name), sub);
  if (tbd_hash_oom) {
    if (newg != NULL)
      HASH_DEL(r->subgroups, newg);
    goto out_free_group;
  }
  sub->s = s;
  sub->g = g;
  DL_APPEND2(g->members, sub, gprev, gnext);
  s->nsubs++;
  s->u->n[TBD_RES_SUBS]++;
  r->nsubs++;
  return 0;

out_free_group:
  if (newg != NULL)
    tbd_free(newg->name);
  tbd_free(newg);
out_free_sub:
  tbd_free(sub->name);
  tbd_free(sub);
  return TB_ENOMEM;
}

int tbd__unsubscribe(struct tbd_registry *r, struct tbd_session *s,
                     const char *name) {
  struct tbd_sub *sub;
  struct tbd_subgroup *g;

  HASH_FIND_STR(s->subs, name, sub);
  if (sub == NULL)
    return TB_ENOTFOUND;
  g = sub->g;
  DL_DELETE2(g->members, sub, gprev, gnext);
  if (g->members == NULL) {
    HASH_DEL(r->subgroups, g);
    tbd_free(g->name);
    tbd_free(g);
  }
  HASH_DEL(s->subs, sub);
  s->nsubs--;
  s->u->n[TBD_RES_SUBS]--;
  r->nsubs--;
  tbd_free(sub->name);
  tbd_free(sub);
  return 0;
}

