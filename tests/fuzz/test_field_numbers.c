/* SPDX-License-Identifier: Apache-2.0 */
/* The field numbers of the hand-written codec against the generated
 * descriptors. proto/decode_fast.c and proto/codec.c read and write
 * protobuf fields by number, without protobuf-c's tables; a number that
 * does not match tensorbroker.proto would put a value in the wrong field
 * only on the fast path. Two checks:
 *
 *  - by reading the sources: every field the fast decoder's macros name
 *    (VARINT_FIELD, LEN_FIELD, BODY_FIELD) and every field number the
 *    encoders write (wr_u64, wr_len, wr_sub, put_varint_field, and the few
 *    literal tags listed in literal_tags) is looked up in the descriptor of
 *    its message: same number, same name, a type that goes with the wire
 *    type and the conversion used;
 *  - by behaviour: each field of each message on the fast paths, set alone
 *    to a value that is not zero, is packed by protobuf-c and decoded by the
 *    fast decoder to the same message (field by field), and encoded by
 *    tb__request_encode / tb__server_message_encode to protobuf-c's bytes.
 *
 * TB_SOURCE_DIR (a compile definition) is the source tree. */
#include "tb_test.h"

#include <regex.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "tb_proto.h"

#ifndef TB_SOURCE_DIR
#error TB_SOURCE_DIR must name the source tree
#endif

/* ---- descriptors by C type name ---- */

static const ProtobufCMessageDescriptor *known[64];
static size_t nknown;

static void collect(const ProtobufCMessageDescriptor *d) {
  for (size_t i = 0; i < nknown; i++)
    if (known[i] == d)
      return;
  assert_true(nknown < sizeof(known) / sizeof(known[0]));
  known[nknown++] = d;
  for (unsigned i = 0; i < d->n_fields; i++)
    if (d->fields[i].type == PROTOBUF_C_TYPE_MESSAGE)
      collect(d->fields[i].descriptor);
}

/* "Tensorbroker__V1__Layout", or the typedefs of tb_proto.h */
static const ProtobufCMessageDescriptor *by_c_name(const char *name) {
  if (nknown == 0) {
    collect(&tensorbroker__v1__request__descriptor);
    collect(&tensorbroker__v1__server_message__descriptor);
  }
  if (strcmp(name, "tb__request") == 0)
    return &tensorbroker__v1__request__descriptor;
  if (strcmp(name, "tb__server_message") == 0)
    return &tensorbroker__v1__server_message__descriptor;
  for (size_t i = 0; i < nknown; i++)
    if (strcmp(known[i]->c_name, name) == 0)
      return known[i];
  return NULL;
}

/* ---- reading the sources ---- */

static char *slurp(const char *rel) {
  char path[1024];
  FILE *f;
  long n;
  char *buf;

  snprintf(path, sizeof(path), "%s/%s", TB_SOURCE_DIR, rel);
  f = fopen(path, "r");
  if (f == NULL)
    fail_msg("cannot open %s", path);
  assert_int_equal(fseek(f, 0, SEEK_END), 0);
  n = ftell(f);
  assert_true(n > 0);
  rewind(f);
  buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

/* The next line of the text at *cur (split in place), or NULL at its end. */
static char *next_line(char **cur) {
  char *line = *cur, *nl;

  if (line == NULL || *line == '\0')
    return NULL;
  nl = strchr(line, '\n');
  if (nl != NULL) {
    *nl = '\0';
    *cur = nl + 1;
  } else {
    *cur = line + strlen(line);
  }
  return line;
}

static regex_t compile(const char *re) {
  regex_t r;
  int rc = regcomp(&r, re, REG_EXTENDED);

  if (rc != 0)
    fail_msg("bad regex %s", re);
  return r;
}

/* Sub-match i of m in line, as a new string. */
static char *grab(const char *line, const regmatch_t *m, int i) {
  size_t n = (size_t)(m[i].rm_eo - m[i].rm_so);
  char *s = malloc(n + 1);

  assert_non_null(s);
  memcpy(s, line + m[i].rm_so, n);
  s[n] = '\0';
  return s;
}

enum wire { W_VARINT, W_LEN, W_BODY };

/* Check one use: field number n of message desc is named member and has a
 * type that goes with wire (and with the conversion conv, when given). */
static void check_use(const char *where, const ProtobufCMessageDescriptor *d,
                      unsigned n, const char *member, enum wire wire,
                      const char *conv) {
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field(d, n);
  bool ok;

  if (f == NULL)
    fail_msg("%s: %s has no field %u (the code names %s)", where, d->name, n,
             member);
  if (strcmp(f->name, member) != 0)
    fail_msg("%s: field %u of %s is %s, the code writes it as %s", where, n,
             d->name, f->name, member);
  switch (wire) {
  case W_VARINT:
    ok = f->label != PROTOBUF_C_LABEL_REPEATED &&
         (f->type == PROTOBUF_C_TYPE_INT32 || f->type == PROTOBUF_C_TYPE_INT64 ||
          f->type == PROTOBUF_C_TYPE_UINT32 ||
          f->type == PROTOBUF_C_TYPE_UINT64 || f->type == PROTOBUF_C_TYPE_BOOL ||
          f->type == PROTOBUF_C_TYPE_ENUM);
    break;
  case W_LEN:
    ok = f->label == PROTOBUF_C_LABEL_REPEATED
             ? (f->flags & PROTOBUF_C_FIELD_FLAG_PACKED) != 0
             : (f->type == PROTOBUF_C_TYPE_STRING ||
                f->type == PROTOBUF_C_TYPE_BYTES ||
                f->type == PROTOBUF_C_TYPE_MESSAGE);
    break;
  default:
    ok = f->type == PROTOBUF_C_TYPE_MESSAGE &&
         (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0;
  }
  if (!ok)
    fail_msg("%s: %s.%s (%u) does not go with the wire type the code uses",
             where, d->name, f->name, n);
  if (conv != NULL) {
    const char *want = NULL;
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_ENUM:
      want = "AS_I32";
      break;
    case PROTOBUF_C_TYPE_UINT32:
      want = "AS_U32";
      break;
    case PROTOBUF_C_TYPE_INT64:
      want = "AS_I64";
      break;
    case PROTOBUF_C_TYPE_UINT64:
      want = "AS_U64";
      break;
    case PROTOBUF_C_TYPE_BOOL:
      want = "AS_BOOL";
      break;
    default:
      break;
    }
    if (want == NULL || strstr(conv, want) == NULL)
      fail_msg("%s: %s.%s is converted with %s, not %s", where, d->name,
               f->name, conv, want != NULL ? want : "?");
  }
}

/* The oneof case constants BODY_FIELD uses. */
static const struct {
  const char *name;
  unsigned value;
} body_cases[] = {
#define C(x) {#x, x}
    C(TENSORBROKER__V1__REPLY__BODY_ACQUIRE),
    C(TENSORBROKER__V1__NOTICE__BODY_NEW_VERSION),
    C(TENSORBROKER__V1__SERVER_MESSAGE__BODY_REPLY),
    C(TENSORBROKER__V1__SERVER_MESSAGE__BODY_NOTICE),
    C(TENSORBROKER__V1__REQUEST__BODY_ACQUIRE),
    C(TENSORBROKER__V1__REQUEST__BODY_RELEASE),
#undef C
};

static int uses_checked;

static void test_decoder_field_numbers(void **state) {
  (void)state;
  char *src = slurp("proto/decode_fast.c"), *save = src, *line;
  regex_t fn = compile("^static int (dec_[a-z_]+)\\(");
  regex_t ty = compile("(Tensorbroker__V1__[A-Za-z]+|tb__[a-z_]+) \\*m\\)");
  regex_t varint = compile("VARINT_FIELD\\(([0-9]+), m->([a-z_]+), *(.*)\\);");
  regex_t len = compile("LEN_FIELD\\(([0-9]+), ");
  regex_t body = compile("BODY_FIELD\\(([A-Z_0-9]+),");
  regex_t member = compile("m->([a-z_]+)");
  const ProtobufCMessageDescriptor *d = NULL;
  char func[64] = "", pending[64] = "";
  int n = 0, funcs = 0;
  regmatch_t m[4];

  while ((line = next_line(&save)) != NULL) {
    char where[128];
    if (regexec(&fn, line, 2, m, 0) == 0) {
      char *f = grab(line, m, 1);
      snprintf(pending, sizeof(pending), "%s", f);
      free(f);
      d = NULL;
    }
    if (pending[0] != '\0' && regexec(&ty, line, 2, m, 0) == 0) {
      char *t = grab(line, m, 1);
      d = by_c_name(t);
      if (d == NULL)
        fail_msg("decode_fast.c: %s decodes %s, which is no message", pending,
                 t);
      free(t);
      snprintf(func, sizeof(func), "%s", pending);
      pending[0] = '\0';
      funcs++;
    }
    snprintf(where, sizeof(where), "decode_fast.c %s", func);
    if (regexec(&varint, line, 4, m, 0) == 0) {
      char *num = grab(line, m, 1), *mem = grab(line, m, 2),
           *conv = grab(line, m, 3);
      assert_non_null(d);
      check_use(where, d, (unsigned)atoi(num), mem, W_VARINT, conv);
      free(num);
      free(mem);
      free(conv);
      n++;
    } else if (regexec(&len, line, 2, m, 0) == 0) {
      char *num = grab(line, m, 1), *mem = NULL;
      const char *p = line + m[0].rm_eo;
      regmatch_t mm[2];
      /* the last m->member of the call (rd_packed_i64 also names n_...) */
      while (regexec(&member, p, 2, mm, 0) == 0) {
        free(mem);
        mem = grab(p, mm, 1);
        p += mm[0].rm_eo;
      }
      assert_non_null(d);
      if (mem == NULL)
        fail_msg("%s: LEN_FIELD(%s) names no member", where, num);
      check_use(where, d, (unsigned)atoi(num), mem, W_LEN, NULL);
      free(num);
      free(mem);
      n++;
    } else if (regexec(&body, line, 2, m, 0) == 0 &&
               strstr(line, "#define") == NULL) {
      char *name = grab(line, m, 1), *mem;
      const char *p = line + m[0].rm_eo;
      regmatch_t mm[2];
      unsigned value = 0;
      bool found = false;
      for (size_t i = 0; i < sizeof(body_cases) / sizeof(body_cases[0]); i++) {
        if (strcmp(body_cases[i].name, name) == 0) {
          value = body_cases[i].value;
          found = true;
        }
      }
      if (!found)
        fail_msg("%s: BODY_FIELD(%s): add it to body_cases", where, name);
      /* the next line holds the call: sub_x(a, &r, &m->member) */
      if (regexec(&member, p, 2, mm, 0) != 0) {
        line = next_line(&save);
        assert_non_null(line);
        p = line;
        assert_int_equal(regexec(&member, p, 2, mm, 0), 0);
      }
      mem = grab(p, mm, 1);
      assert_non_null(d);
      check_use(where, d, value, mem, W_BODY, NULL);
      free(name);
      free(mem);
      n++;
    }
  }
  /* Device, Layout, BufferInfo, EventInfo, AcquireReply, Reply,
   * NewVersion, Notice, ServerMessage, Acquire, Release, Request */
  assert_int_equal(funcs, 12);
  /* 3 + 8 + 10 + 10 + 8 + 4 + 4 + 1 + 2 + 9 + 5 + 3 */
  assert_int_equal(n, 67);
  uses_checked += n;
  regfree(&fn);
  regfree(&ty);
  regfree(&varint);
  regfree(&len);
  regfree(&body);
  regfree(&member);
  free(src);
}

/* Tags codec.c writes as literals, each looked up here by hand; the scan
 * below fails when there are others. */
static const struct {
  const char *func;
  unsigned number;
  const char *type, *field;
} literal_tags[] = {
    {"reply_head", 1, "Tensorbroker__V1__Reply", "request_id"},
    {"reply_head", 2, "Tensorbroker__V1__Reply", "status"},
    {"reply_head", 3, "Tensorbroker__V1__Reply", "message"},
    {"put_acquire", 1, "Tensorbroker__V1__Acquire", "channel"},
    {"tb__request_encode", 1, "tb__request", "request_id"},
};

static void test_encoder_field_numbers(void **state) {
  (void)state;
  char *src = slurp("proto/codec.c"), *save = src, *line;
  regex_t fn = compile("^(static )?[a-z_ ]+[ *]([a-z_0-9]+)\\(");
  regex_t decl = compile("(Tensorbroker__V1__[A-Za-z]+|tb__[a-z_]+) \\*([a-z]+)");
  regex_t call = compile("(wr_u64|wr_len|wr_sub|put_varint_field)\\([^,]+, ([0-9]+), (.*)$");
  regex_t use = compile("([a-z]+)->([a-z_]+)");
  regex_t lit = compile("([0-9]+)u << 3|put_len_field\\([^,]+, ([0-9]+),");
  char func[64] = "", vars[8][16];
  const ProtobufCMessageDescriptor *types[8];
  int nvars = 0, n = 0, nlit = 0;
  regmatch_t m[4];

  while ((line = next_line(&save)) != NULL) {
    char where[128];
    const char *p;
    regmatch_t mm[3];

    if (regexec(&fn, line, 3, m, 0) == 0 && line[0] != ' ') {
      char *f = grab(line, m, 2);
      snprintf(func, sizeof(func), "%s", f);
      free(f);
      nvars = 0;
    }
    /* the variables of message types in scope: parameters, locals */
    for (p = line; nvars < 8 && regexec(&decl, p, 3, mm, 0) == 0;
         p += mm[0].rm_eo) {
      char *t = grab(p, mm, 1), *v = grab(p, mm, 2);
      const ProtobufCMessageDescriptor *d = by_c_name(t);
      if (d != NULL && strlen(v) < sizeof(vars[0])) {
        snprintf(vars[nvars], sizeof(vars[0]), "%s", v);
        types[nvars++] = d;
      }
      free(t);
      free(v);
    }
    snprintf(where, sizeof(where), "codec.c %s", func);
    if (regexec(&call, line, 4, m, 0) == 0 && strstr(line, "static") == NULL) {
      char *what = grab(line, m, 1), *num = grab(line, m, 2),
           *rest = grab(line, m, 3), *v, *mem;
      const ProtobufCMessageDescriptor *d = NULL;
      if (regexec(&use, rest, 3, mm, 0) != 0)
        fail_msg("%s: %s(%s) names no field", where, what, num);
      v = grab(rest, mm, 1);
      mem = grab(rest, mm, 2);
      for (int i = 0; i < nvars; i++)
        if (strcmp(vars[i], v) == 0)
          d = types[i];
      if (d == NULL)
        fail_msg("%s: %s->%s: %s is of no known message type", where, v, mem,
                 v);
      check_use(where, d, (unsigned)atoi(num), mem,
                strcmp(what, "wr_u64") == 0 ||
                        strcmp(what, "put_varint_field") == 0
                    ? W_VARINT
                    : W_LEN,
                NULL);
      free(what);
      free(num);
      free(rest);
      free(v);
      free(mem);
      n++;
    } else if (regexec(&lit, line, 3, m, 0) == 0) {
      char *num = grab(line, m, m[1].rm_so >= 0 ? 1 : 2);
      bool listed = false;
      for (size_t i = 0; i < sizeof(literal_tags) / sizeof(literal_tags[0]);
           i++) {
        if (strcmp(literal_tags[i].func, func) == 0 &&
            literal_tags[i].number == (unsigned)atoi(num)) {
          const ProtobufCMessageDescriptor *d = by_c_name(literal_tags[i].type);
          assert_non_null(d);
          check_use(where, d, literal_tags[i].number, literal_tags[i].field,
                    literal_tags[i].number == 3 ||
                            strcmp(literal_tags[i].field, "channel") == 0
                        ? W_LEN
                        : W_VARINT,
                    NULL);
          listed = true;
        }
      }
      if (!listed)
        fail_msg("%s: tag %s written as a literal: add it to literal_tags",
                 where, num);
      free(num);
      nlit++;
    }
  }
  assert_int_equal(nlit, (int)(sizeof(literal_tags) / sizeof(literal_tags[0])));
  /* Device 3, EventInfo 10, AcquireReply 6, Acquire 8, Release 5 */
  assert_int_equal(n, 32);
  uses_checked += n + nlit;
  regfree(&fn);
  regfree(&decl);
  regfree(&call);
  regfree(&use);
  regfree(&lit);
  free(src);
}

/* ---- behaviour: one field at a time ---- */

static uint8_t pool[1 << 16];
static size_t pool_used;

static void *pool_new(size_t n) {
  void *p;

  n = (n + 15) & ~(size_t)15;
  assert_true(pool_used + n <= sizeof(pool));
  p = pool + pool_used;
  pool_used += n;
  memset(p, 0, n);
  return p;
}

static ProtobufCMessage *new_msg(const ProtobufCMessageDescriptor *d) {
  ProtobufCMessage *m = pool_new(d->sizeof_message);

  d->message_init(m);
  return m;
}

/* Set field f of m to a value that is not zero and tells fields apart. */
static void set_field(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  char *at = (char *)m + f->offset;
  uint64_t v = 100 + f->id;

  if (f->label == PROTOBUF_C_LABEL_REPEATED) {
    size_t count = 2;
    int64_t *vals = pool_new(2 * sizeof(*vals));
    assert_int_equal(f->type, PROTOBUF_C_TYPE_INT64); /* shape, strides */
    vals[0] = (int64_t)v;
    vals[1] = -3;
    memcpy(at, &vals, sizeof(vals));
    memcpy((char *)m + f->quantifier_offset, &count, sizeof(count));
    return;
  }
  if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
    uint32_t c = f->id;
    memcpy((char *)m + f->quantifier_offset, &c, sizeof(c));
  }
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32: { /* negative: ten bytes on the wire */
    int32_t x = -(int32_t)v;
    memcpy(at, &x, sizeof(x));
    break;
  }
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_ENUM: {
    uint32_t x = f->type == PROTOBUF_C_TYPE_ENUM ? 1 + f->id % 2 : (uint32_t)v;
    memcpy(at, &x, sizeof(x));
    break;
  }
  case PROTOBUF_C_TYPE_INT64: {
    int64_t x = -(int64_t)v;
    memcpy(at, &x, sizeof(x));
    break;
  }
  case PROTOBUF_C_TYPE_UINT64:
    memcpy(at, &v, sizeof(v));
    break;
  case PROTOBUF_C_TYPE_BOOL: {
    protobuf_c_boolean b = 1;
    memcpy(at, &b, sizeof(b));
    break;
  }
  case PROTOBUF_C_TYPE_STRING: {
    char *s = pool_new(16);
    snprintf(s, 16, "f%u", f->id);
    memcpy(at, &s, sizeof(s));
    break;
  }
  case PROTOBUF_C_TYPE_BYTES: {
    ProtobufCBinaryData b = {3, pool_new(3)};
    memset(b.data, (int)v, 3);
    memcpy(at, &b, sizeof(b));
    break;
  }
  case PROTOBUF_C_TYPE_MESSAGE: {
    ProtobufCMessage *sub = new_msg(f->descriptor);
    memcpy(at, &sub, sizeof(sub));
    break;
  }
  default:
    fail_msg("%s: type %d not used by this protocol", f->name, (int)f->type);
  }
}

/* A message on a fast path: root with the sub-messages of path set (each
 * a field name), the last of them returned in *leaf. */
static ProtobufCMessage *build(const ProtobufCMessageDescriptor *root,
                               const char *const *path,
                               ProtobufCMessage **leaf) {
  ProtobufCMessage *top = new_msg(root), *cur = top;

  for (; *path != NULL; path++) {
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(cur->descriptor, *path);
    ProtobufCMessage *sub;
    assert_non_null(f);
    set_field(cur, f);
    memcpy(&sub, (char *)cur + f->offset, sizeof(sub));
    cur = sub;
  }
  *leaf = cur;
  return top;
}

struct fast_path {
  const ProtobufCMessageDescriptor *root;
  const char *path[5];
};

#define SRV (&tensorbroker__v1__server_message__descriptor)
#define REQ (&tensorbroker__v1__request__descriptor)

/* Every message the fast decoder and encoders handle, reached the way they
 * reach it. The fast decoder takes a ServerMessage only with
 * reply.acquire or notice.new_version, a Request only with acquire or
 * release, so those are on every path. */
static const struct fast_path paths[] = {
    {SRV, {"reply", "acquire", NULL}},
    {SRV, {"reply", "acquire", "layout", NULL}},
    {SRV, {"reply", "acquire", "layout", "device", NULL}},
    {SRV, {"reply", "acquire", "buffer", NULL}},
    {SRV, {"reply", "acquire", "buffer", "device", NULL}},
    {SRV, {"reply", "acquire", "ready_event", NULL}},
    {SRV, {"reply", "acquire", "ready_event", "device", NULL}},
    {SRV, {"notice", "new_version", NULL}},
    {SRV, {"notice", "new_version", "buffer", NULL}},
    {SRV, {"notice", "new_version", "ready_event", NULL}},
    {REQ, {"acquire", NULL}},
    {REQ, {"release", NULL}},
};

/* The parent of the leaf: Reply (whose request_id, status and message the
 * fast paths also handle) and Request. */
static const struct fast_path parents[] = {
    {SRV, {"reply", NULL}},
    {REQ, {NULL}},
};

static void check_one(const ProtobufCMessage *m, const char *what) {
  uint8_t packed[4096], mine[4096];
  size_t n = protobuf_c_message_get_packed_size(m);
  struct tb__arena a;
  ProtobufCMessage *fast = NULL;
  char why[600];
  long got;
  int rc;

  assert_true(n < sizeof(packed));
  assert_int_equal(protobuf_c_message_pack(m, packed), n);
  assert_tb_ok(tb__arena_init(&a, 4096));
  if (m->descriptor == SRV) {
    rc = tb__server_message_decode_fast(&a, packed, n,
                                        (tb__server_message **)&fast);
    got = tb__server_message_encode((const tb__server_message *)m, mine,
                                    sizeof(mine));
  } else {
    rc = tb__request_decode_fast(&a, packed, n, (tb__request **)&fast);
    got = tb__request_encode((const tb__request *)m, mine, sizeof(mine));
  }
  if (rc != 1)
    fail_msg("%s: the fast decoder leaves it to protobuf-c", what);
  if (!tbf_msg_equal(m, fast, why, sizeof(why)))
    fail_msg("%s: the fast decoder differs: %s", what, why);
  if (got != (long)n || memcmp(mine, packed, n) != 0)
    fail_msg("%s: the encoder's %ld bytes differ from protobuf-c's %zu", what,
             got, n);
  tb__arena_fini(&a);
}

static void each_field(const struct fast_path *p, int *count) {
  ProtobufCMessage *leaf;
  const ProtobufCMessageDescriptor *d;

  pool_used = 0;
  (void)build(p->root, p->path, &leaf);
  d = leaf->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    ProtobufCMessage *top, *l;
    char what[256];

    /* oneof members other than the path's: not the fast decoder's */
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
      continue;
    pool_used = 0;
    top = build(p->root, p->path, &l);
    set_field(l, f);
    snprintf(what, sizeof(what), "%s.%s (%u)", d->name, f->name, f->id);
    check_one(top, what);
    (*count)++;
  }
}

static void test_fields_one_by_one(void **state) {
  (void)state;
  int count = 0;

  for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
    each_field(&paths[i], &count);
  /* the fields of Reply and Request before their bodies */
  for (size_t i = 0; i < sizeof(parents) / sizeof(parents[0]); i++) {
    ProtobufCMessage *leaf;
    const ProtobufCMessageDescriptor *d;
    pool_used = 0;
    (void)build(parents[i].root, parents[i].path, &leaf);
    d = leaf->descriptor;
    for (unsigned k = 0; k < d->n_fields; k++) {
      const ProtobufCFieldDescriptor *f = &d->fields[k];
      ProtobufCMessage *top, *l, *body;
      const ProtobufCFieldDescriptor *bf;
      char what[256];
      if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
        continue;
      pool_used = 0;
      top = build(parents[i].root, parents[i].path, &l);
      set_field(l, f);
      /* with the body the fast paths need */
      bf = protobuf_c_message_descriptor_get_field_by_name(d, "acquire");
      assert_non_null(bf);
      set_field(l, bf);
      memcpy(&body, (char *)l + bf->offset, sizeof(body));
      (void)body;
      snprintf(what, sizeof(what), "%s.%s (%u)", d->name, f->name, f->id);
      check_one(top, what);
      count++;
    }
  }
  /* AcquireReply 8 + Layout 8 + Device 3 * 3 + BufferInfo 10 * 2 +
   * EventInfo 10 * 2 + NewVersion 4 + Acquire 9 + Release 5 + Reply 3 +
   * Request 1 */
  assert_int_equal(count, 8 + 8 + 9 + 20 + 20 + 4 + 9 + 5 + 3 + 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decoder_field_numbers),
      cmocka_unit_test(test_encoder_field_numbers),
      cmocka_unit_test(test_fields_one_by_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
