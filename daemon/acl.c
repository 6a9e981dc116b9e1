/* SPDX-License-Identifier: Apache-2.0 */
/* Access rules: parsing the configuration file's keys into principal
 * lists, and judging a request against them (acl.h). */
#include "acl.h"

#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensorbroker/errors.h>

#include "alloc.h"
#include "config.h"

enum princ_kind { P_UID, P_GID, P_OWNER, P_ANY };

struct princ {
  enum princ_kind kind;
  uint32_t id;
};

/* One key's value: the principals and the text as written, for denials. */
struct plist {
  bool set;
  struct princ *v;
  size_t n;
  char *text;
};

struct rule {
  char *prefix; /* "" for [access] */
  size_t plen;
  struct plist act[TBD_ACL_NACTIONS];
};

struct tbd_acl {
  bool open;          /* default = open */
  bool default_set;
  struct plist operators;
  struct rule *rules;
  size_t nrules;
};

static const char *const action_names[TBD_ACL_NACTIONS] = {
    "publish", "acquire", "list", "write"};

const char *tbd_acl_action_name(enum tbd_acl_action act) {
  return (unsigned)act < TBD_ACL_NACTIONS ? action_names[act] : "?";
}

int tbd_acl_new(struct tbd_acl **out) {
  struct tbd_acl *a = tbd_calloc(1, sizeof(*a));

  if (a == NULL)
    return TB_ENOMEM;
  *out = a;
  return 0;
}

static void plist_free(struct plist *l) {
  tbd_free(l->v);
  tbd_free(l->text);
  memset(l, 0, sizeof(*l));
}

void tbd_acl_free(struct tbd_acl *a) {
  if (a == NULL)
    return;
  plist_free(&a->operators);
  for (size_t i = 0; i < a->nrules; i++) {
    for (int k = 0; k < TBD_ACL_NACTIONS; k++)
      plist_free(&a->rules[i].act[k]);
    tbd_free(a->rules[i].prefix);
  }
  tbd_free(a->rules);
  tbd_free(a);
}

/* ---- parsing ---- */

/* The section as the file spells it, for messages. */
static void section_name(const char *prefix, char *buf, size_t len) {
  if (prefix == NULL)
    snprintf(buf, len, "[access]");
  else
    snprintf(buf, len, "[access \"%s\"]", prefix);
}

/* getpwnam_r and getgrnam_r want a buffer whose size sysconf suggests, and
 * say ERANGE when a group has more members than that holds. */
static int resolve(bool group, const char *name, uint32_t *out) {
  size_t len = 16384;

  for (int tries = 0; tries < 6; tries++, len *= 4) {
    char *buf = malloc(len);
    int rc;

    if (buf == NULL)
      return -ENOMEM;
    if (group) {
      struct group g, *res = NULL;
      rc = getgrnam_r(name, &g, buf, len, &res);
      if (rc == 0 && res != NULL)
        *out = (uint32_t)g.gr_gid;
      else if (rc == 0)
        rc = ENOENT;
    } else {
      struct passwd pw, *res = NULL;
      rc = getpwnam_r(name, &pw, buf, len, &res);
      if (rc == 0 && res != NULL)
        *out = (uint32_t)pw.pw_uid;
      else if (rc == 0)
        rc = ENOENT;
    }
    free(buf);
    if (rc != ERANGE)
      return -rc;
  }
  return -ERANGE;
}

/* One principal; operators: only users and groups make sense there. */
static int parse_princ(const char *tok, bool operators, struct princ *p,
                       char *err, size_t errlen) {
  static const char *const forms =
      "user:NAME, uid:N, group:NAME, gid:N, owner or *";
  const char *colon = strchr(tok, ':');
  int rc;

  if (strcmp(tok, "*") == 0 || strcmp(tok, "owner") == 0) {
    if (operators) {
      snprintf(err, errlen, "'%s' cannot be an operator (user:NAME, uid:N, "
                            "group:NAME or gid:N)", tok);
      return -1;
    }
    p->kind = tok[0] == '*' ? P_ANY : P_OWNER;
    p->id = 0;
    return 0;
  }
  if (colon == NULL || colon[1] == '\0') {
    snprintf(err, errlen, "'%s' is not a principal (%s)", tok, forms);
    return -1;
  }
  if (strncmp(tok, "uid:", 4) == 0 || strncmp(tok, "gid:", 4) == 0) {
    p->kind = tok[0] == 'u' ? P_UID : P_GID;
    if (tbd_parse_u32(colon + 1, 10, 0, UINT32_MAX - 1, &p->id) < 0) {
      snprintf(err, errlen, "'%s': '%s' is not a number", tok, colon + 1);
      return -1;
    }
    return 0;
  }
  if (strncmp(tok, "user:", 5) == 0 || strncmp(tok, "group:", 6) == 0) {
    bool group = tok[0] == 'g';
    p->kind = group ? P_GID : P_UID;
    rc = resolve(group, colon + 1, &p->id);
    if (rc == -ENOENT) {
      snprintf(err, errlen, "unknown %s '%s'", group ? "group" : "user",
               colon + 1);
      return -1;
    }
    if (rc < 0) {
      snprintf(err, errlen, "cannot look up %s '%s': %s",
               group ? "group" : "user", colon + 1, strerror(-rc));
      return -1;
    }
    return 0;
  }
  snprintf(err, errlen, "'%s' is not a principal (%s)", tok, forms);
  return -1;
}

static bool is_sep(char c) {
  return c == ' ' || c == '\t' || c == ',';
}

/* value into out: principals separated by blanks or commas; "" or "none"
 * is the empty list (nobody but the operators). 0, or -1 with err. */
static int parse_list(const char *value, bool operators, struct plist *out,
                      char *err, size_t errlen) {
  struct plist l = {.set = true};
  size_t cap = 0;
  const char *p = value;
  char tok[300];

  while (*p != '\0') {
    size_t n;
    struct princ pr;

    while (is_sep(*p))
      p++;
    if (*p == '\0')
      break;
    for (n = 0; p[n] != '\0' && !is_sep(p[n]); n++)
      ;
    if (n >= sizeof(tok)) {
      snprintf(err, errlen, "a principal of %zu bytes", n);
      goto out_free;
    }
    memcpy(tok, p, n);
    tok[n] = '\0';
    p += n;
    if (strcmp(tok, "none") == 0)
      continue;
    if (parse_princ(tok, operators, &pr, err, errlen) < 0)
      goto out_free;
    if (l.n == cap) {
      size_t ncap = cap ? cap * 2 : 4;
      struct princ *v = tbd_malloc(ncap * sizeof(*v));
      if (v == NULL)
        goto out_nomem;
      if (l.n > 0)
        memcpy(v, l.v, l.n * sizeof(*v));
      tbd_free(l.v);
      l.v = v;
      cap = ncap;
    }
    l.v[l.n++] = pr;
  }
  /* the text as written, spaces trimmed, for denial messages */
  while (is_sep(*value))
    value++;
  {
    size_t n = strlen(value);
    while (n > 0 && is_sep(value[n - 1]))
      n--;
    l.text = tbd_malloc(n + 1);
    if (l.text == NULL)
      goto out_nomem;
    memcpy(l.text, value, n);
    l.text[n] = '\0';
  }
  *out = l;
  return 0;

out_nomem:
  snprintf(err, errlen, "out of memory");
out_free:
  plist_free(&l);
  return -1;
}

static int find_action(const char *key) {
  for (int k = 0; k < TBD_ACL_NACTIONS; k++)
    if (strcmp(key, action_names[k]) == 0)
      return k;
  return -1;
}

/* The rule of prefix, made if there is none; NULL when out of memory. */
static struct rule *rule_get(struct tbd_acl *a, const char *prefix) {
  struct rule *v;

  for (size_t i = 0; i < a->nrules; i++)
    if (strcmp(a->rules[i].prefix, prefix) == 0)
      return &a->rules[i];
  v = tbd_malloc((a->nrules + 1) * sizeof(*v));
  if (v == NULL)
    return NULL;
  if (a->nrules > 0)
    memcpy(v, a->rules, a->nrules * sizeof(*v));
  memset(&v[a->nrules], 0, sizeof(*v));
  v[a->nrules].prefix = tbd_strdup(prefix);
  if (v[a->nrules].prefix == NULL) {
    tbd_free(v);
    return NULL;
  }
  v[a->nrules].plen = strlen(prefix);
  tbd_free(a->rules);
  a->rules = v;
  return &a->rules[a->nrules++];
}

int tbd_acl_set(struct tbd_acl *a, const char *prefix, const char *key,
                const char *value, char *err, size_t errlen) {
  char sect[300], why[400];
  int act = find_action(key);
  struct plist l;
  struct rule *ru;

  section_name(prefix, sect, sizeof(sect));
  if (prefix == NULL && strcmp(key, "default") == 0) {
    if (a->default_set) {
      snprintf(err, errlen, "%s default is given twice", sect);
      return -1;
    }
    if (strcmp(value, "owner") != 0 && strcmp(value, "open") != 0) {
      snprintf(err, errlen, "%s default = '%s': owner or open", sect, value);
      return -1;
    }
    a->open = strcmp(value, "open") == 0;
    a->default_set = true;
    return 0;
  }
  if (prefix == NULL && strcmp(key, "operators") == 0) {
    if (a->operators.set) {
      snprintf(err, errlen, "%s operators is given twice", sect);
      return -1;
    }
    if (parse_list(value, true, &a->operators, why, sizeof(why)) < 0) {
      snprintf(err, errlen, "%s operators: %s", sect, why);
      return -1;
    }
    return 0;
  }
  if (act < 0) {
    snprintf(err, errlen, "%s: unknown key '%s' (%spublish, acquire, list, "
                          "write)",
             sect, key, prefix == NULL ? "default, operators, " : "");
    return -1;
  }
  if (prefix != NULL && strlen(prefix) > 255) {
    snprintf(err, errlen, "[access \"%.40s...\"]: a prefix of more than "
                          "255 bytes", prefix);
    return -1;
  }
  ru = rule_get(a, prefix != NULL ? prefix : "");
  if (ru == NULL) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  if (ru->act[act].set) {
    snprintf(err, errlen, "%s %s is given twice", sect, key);
    return -1;
  }
  if (parse_list(value, false, &l, why, sizeof(why)) < 0) {
    snprintf(err, errlen, "%s %s: %s", sect, key, why);
    return -1;
  }
  ru->act[act] = l;
  return 0;
}

/* ---- judging ---- */

static bool in_groups(const struct tbd_acl_peer *p, uint32_t gid) {
  if (p->gid == gid)
    return true;
  for (size_t i = 0; i < p->ngroups; i++)
    if (p->groups[i] == gid)
      return true;
  return false;
}

static bool plist_admits(const struct plist *l, const struct tbd_acl_peer *p,
                         const uid_t *owner) {
  for (size_t i = 0; i < l->n; i++) {
    const struct princ *q = &l->v[i];
    switch (q->kind) {
    case P_ANY:
      return true;
    case P_OWNER:
      if (owner == NULL || *owner == p->uid)
        return true;
      break;
    case P_UID:
      if (q->id == p->uid)
        return true;
      break;
    case P_GID:
      if (in_groups(p, q->id))
        return true;
      break;
    }
  }
  return false;
}

bool tbd_acl_operator(const struct tbd_acl *a, const struct tbd_acl_peer *p) {
  return p->privileged || plist_admits(&a->operators, p, NULL);
}

bool tbd_acl_open(const struct tbd_acl *a) { return a->open; }

/* The rule that decides act on channel: the longest prefix of channel
 * whose section sets act ([access] counts as the empty prefix), or NULL
 * when none does and the default decides. */
static const struct rule *rule_for(const struct tbd_acl *a,
                                   enum tbd_acl_action act,
                                   const char *channel) {
  const struct rule *best = NULL;

  for (size_t i = 0; i < a->nrules; i++) {
    const struct rule *ru = &a->rules[i];
    if (!ru->act[act].set || (best != NULL && ru->plen <= best->plen))
      continue;
    if (strncmp(channel, ru->prefix, ru->plen) == 0)
      best = ru;
  }
  return best;
}

int tbd_acl_check(const struct tbd_acl *a, const struct tbd_acl_peer *p,
                  enum tbd_acl_action act, const char *channel,
                  const uid_t *owner, char *why, size_t whylen) {
  const struct rule *ru;

  if (tbd_acl_operator(a, p))
    return 0;
  ru = rule_for(a, act, channel);
  if (ru != NULL) {
    if (plist_admits(&ru->act[act], p, owner))
      return 0;
    if (ru->plen == 0)
      snprintf(why, whylen, "rule [access] %s = %s", action_names[act],
               ru->act[act].text);
    else
      snprintf(why, whylen, "rule [access \"%s\"] %s = %s", ru->prefix,
               action_names[act], ru->act[act].text);
    return TB_EPERM;
  }
  if (a->open || owner == NULL || *owner == p->uid)
    return 0;
  snprintf(why, whylen, "channel \"%s\" belongs to uid %u (default = owner)",
           channel, (unsigned)*owner);
  return TB_EPERM;
}

void tbd_acl_describe(const struct tbd_acl *a, char *buf, size_t len) {
  snprintf(buf, len, "default = %s, %zu rule section%s, operators: %s",
           a->open ? "open" : "owner", a->nrules, a->nrules == 1 ? "" : "s",
           a->operators.set && a->operators.text[0] != '\0'
               ? a->operators.text
               : "root and the daemon's uid");
}
