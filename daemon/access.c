/* SPDX-License-Identifier: Apache-2.0 */
/* Access control at the registry: the rules (acl.c) applied to a session's
 * credentials and a channel's owner; denials replied, counted and logged
 * (docs/deploy.md, "Access control"). */
#include "registry_impl.h"

#include <stdio.h>
#include <string.h>

#include <tensorbroker/errors.h>

#include "log.h"

void tbd_registry_set_acl(struct tbd_registry *r, struct tbd_acl *acl) {
  char line[300];

  if (acl == NULL)
    return;
  tbd_acl_free(r->acl);
  r->acl = acl;
  tbd_acl_describe(acl, line, sizeof(line));
  tbd_info("access rules: %s", line);
}

int tbd_session_set_groups(struct tbd_session *s, const gid_t *groups,
                           size_t n) {
  gid_t *g = NULL;

  if (n > 0) {
    g = tbd_memdup(groups, n * sizeof(*groups));
    if (g == NULL)
      return TB_ENOMEM;
  }
  tbd_free(s->groups);
  s->groups = g;
  s->ngroups = n;
  return 0;
}

static void peer_of(const struct tbd_registry *r,
                    const struct tbd_session *s, struct tbd_acl_peer *p) {
  p->uid = s->uid;
  p->gid = s->gid;
  p->groups = s->groups;
  p->ngroups = s->ngroups;
  p->privileged = s->uid == 0 ||
                  (r->has_operators && (s->uid == r->operator_uid[0] ||
                                        s->uid == r->operator_uid[1]));
}

static int check(struct tbd_registry *r, struct tbd_session *s,
                 enum tbd_acl_action act, const char *name,
                 const struct tbd_channel *ch, char *why, size_t len) {
  struct tbd_acl_peer p;

  peer_of(r, s, &p);
  return tbd_acl_check(r->acl, &p, act, name, ch != NULL ? &ch->owner : NULL,
                       why, len);
}

bool tbd__access_quiet(struct tbd_registry *r, struct tbd_session *s,
                       enum tbd_acl_action act, const char *name,
                       const struct tbd_channel *ch) {
  char why[8];

  return check(r, s, act, name, ch, why, sizeof(why)) == 0;
}

int tbd__access(struct tbd_registry *r, struct tbd_session *s,
                enum tbd_acl_action act, const char *verb, const char *name,
                const struct tbd_channel *ch, char *msg, size_t len) {
  char why[400];

  if (check(r, s, act, name, ch, why, sizeof(why)) == 0)
    return 0;
  snprintf(msg, len, "uid %u may not %s \"%s\": %s", (unsigned)s->uid, verb,
           name, why);
  r->stats.denials++;
  /* once per session at warn: a client retrying in a loop must not fill
   * the log, and the counter says how many */
  tbd_log_with(s->denied ? TBD_LOG_DEBUG : TBD_LOG_WARN,
               &(struct tbd_log_fields){(long long)s->id, (long long)s->pid,
                                        (long long)s->uid, name},
               "session %llu (pid %d uid %u '%s'): denied: %s%s",
               (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid,
               s->name, msg,
               s->denied ? "" : " (further denials of this session are "
                                "logged at debug)");
  s->denied = true;
  return TB_EPERM;
}

bool tbd__access_operator(struct tbd_registry *r, struct tbd_session *s) {
  struct tbd_acl_peer p;

  peer_of(r, s, &p);
  return tbd_acl_operator(r->acl, &p);
}

bool tbd__access_all_sessions(struct tbd_registry *r, struct tbd_session *s) {
  return tbd_acl_open(r->acl) || tbd__access_operator(r, s);
}

/* Whether a session of uid waits (an acquire) on q. */
static bool uid_waits_on(const struct tbd_waitq *q, uid_t uid) {
  const struct tbd_wait *w;

  for (w = q->ready; w != NULL; w = w->next)
    if (w->s->uid == uid)
      return true;
  for (uint32_t i = 0; i < q->later.n; i++) {
    w = (const struct tbd_wait *)(const void *)((const char *)q->later.a[i] -
                                                offsetof(struct tbd_wait,
                                                         by_version));
    if (w->s->uid == uid)
      return true;
  }
  return false;
}

bool tbd__access_waiting(struct tbd_registry *r, struct tbd_session *s,
                         const struct tbd_waitq *q) {
  return tbd__access_all_sessions(r, s) || uid_waits_on(q, s->uid);
}

bool tbd__access_sees_uid(struct tbd_registry *r, struct tbd_session *s,
                          uid_t uid, const struct tbd_channel *ch) {
  if (uid == s->uid || tbd__access_all_sessions(r, s))
    return true;
  return ch != NULL && tbd__access_quiet(r, s, TBD_ACL_LIST, ch->name, ch);
}

bool tbd__access_sees(struct tbd_registry *r, struct tbd_session *s,
                      const struct tbd_session *holder,
                      const struct tbd_channel *ch) {
  return tbd__access_sees_uid(r, s, holder->uid, ch);
}
