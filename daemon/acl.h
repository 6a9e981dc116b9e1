/* SPDX-License-Identifier: Apache-2.0 */
/* Access rules (docs/deploy.md, "Access control"): which users and groups
 * may publish onto, acquire from (and write), and list which channels. A
 * struct tbd_acl is built key by key from the configuration file's
 * [access] and [access "PREFIX"] sections, then installed in the registry
 * (tbd_registry_set_acl), which never changes it: a reload builds a new
 * one. Sans-I/O but for the user and group names resolved at tbd_acl_set.
 *
 * One thread: the daemon's loop thread (or a loader before the loop). */
#ifndef TBD_ACL_H
#define TBD_ACL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* What a rule decides; a rule line is named after its action. Subscribing
 * is acquiring (it tells the subscriber of every version); WaitFree needs
 * publish or acquire. */
enum tbd_acl_action {
  TBD_ACL_PUBLISH,
  TBD_ACL_ACQUIRE,
  TBD_ACL_LIST,
  TBD_ACL_WRITE, /* read-write mappings of consumers-may-write buffers */
  TBD_ACL_NACTIONS
};

/* Who asks, from SO_PEERCRED and SO_PEERGROUPS at accept: never from the
 * client. privileged: root or the daemon's own uid, always allowed. */
struct tbd_acl_peer {
  uid_t uid;
  gid_t gid;
  const gid_t *groups; /* supplementary groups, ngroups of them */
  size_t ngroups;
  bool privileged;
};

struct tbd_acl;

/* An empty rule set: `default = owner`, no operators beyond root and the
 * daemon's uid, no rules. 0 or TB_ENOMEM. */
int tbd_acl_new(struct tbd_acl **out);
/* NULL and half-built sets are fine. */
void tbd_acl_free(struct tbd_acl *a);

/* One key of the configuration file: prefix NULL for [access] (keys
 * default, operators, and publish, acquire, list, write for every
 * channel), else for [access "prefix"] (publish, acquire, list, write).
 * Names in the value are resolved now (getpwnam_r, getgrnam_r). Returns 0,
 * or -1 with err ("unknown user 'bob' in [access \"cam/\"] acquire") and a
 * unchanged. A key given twice for one prefix is an error. */
int tbd_acl_set(struct tbd_acl *a, const char *prefix, const char *key,
                const char *value, char *err, size_t errlen);

/* Whether p may do act on channel (the whole name): 0, or TB_EPERM with
 * why naming the rule that refused ("rule [access \"cam/\"] acquire =
 * group:video", or "channel \"x\" belongs to uid 1000 (default = owner)").
 * owner: the uid that first published the channel, or NULL when it has
 * not been published (then the principal `owner`, and the owner default,
 * admit anyone: whoever publishes it first becomes its owner, and a
 * parked acquire is judged again when it is). */
int tbd_acl_check(const struct tbd_acl *a, const struct tbd_acl_peer *p,
                  enum tbd_acl_action act, const char *channel,
                  const uid_t *owner, char *why, size_t whylen);

/* Whether p is an operator: privileged, or named by `operators`. */
bool tbd_acl_operator(const struct tbd_acl *a, const struct tbd_acl_peer *p);
/* Whether the set is `default = open` (today's everyone-may: also every
 * session is listed to everyone). */
bool tbd_acl_open(const struct tbd_acl *a);
/* A line for the log: "default = owner, 3 rules, operators group:wheel". */
void tbd_acl_describe(const struct tbd_acl *a, char *buf, size_t len);

const char *tbd_acl_action_name(enum tbd_acl_action act);

#endif /* TBD_ACL_H */
