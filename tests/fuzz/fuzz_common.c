/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the fuzz targets; see fuzz.h. */
#include "fuzz.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tbf_fail(const char *fmt, ...) {
  va_list ap;

  fputs("fuzz: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  abort();
}

static size_t scalar_size(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32:
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32:
  case PROTOBUF_C_TYPE_FLOAT:
    return 4;
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
  case PROTOBUF_C_TYPE_DOUBLE:
    return 8;
  case PROTOBUF_C_TYPE_BOOL:
    return sizeof(protobuf_c_boolean);
  case PROTOBUF_C_TYPE_ENUM:
    return sizeof(int);
  case PROTOBUF_C_TYPE_STRING:
    return sizeof(char *);
  case PROTOBUF_C_TYPE_BYTES:
    return sizeof(ProtobufCBinaryData);
  case PROTOBUF_C_TYPE_MESSAGE:
    return sizeof(ProtobufCMessage *);
  }
  return 0;
}

static int differ(char *why, size_t whylen, const char *path,
                  const char *what) {
  if (why != NULL && whylen > 0)
    snprintf(why, whylen, "%s: %s", path, what);
  return 0;
}

static int msg_equal(const ProtobufCMessage *a, const ProtobufCMessage *b,
                     char *path, size_t pathlen, char *why, size_t whylen);

/* One value of field f at pa and pb. */
static int value_equal(const ProtobufCFieldDescriptor *f, const void *pa,
                       const void *pb, char *path, size_t pathlen, char *why,
                       size_t whylen) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_STRING: {
    const char *x = *(char *const *)pa, *y = *(char *const *)pb;
    if (strcmp(x != NULL ? x : "", y != NULL ? y : "") != 0)
      return differ(why, whylen, path, "strings differ");
    return 1;
  }
  case PROTOBUF_C_TYPE_BYTES: {
    const ProtobufCBinaryData *x = pa, *y = pb;
    if (x->len != y->len)
      return differ(why, whylen, path, "byte lengths differ");
    if (x->len > 0 && memcmp(x->data, y->data, x->len) != 0)
      return differ(why, whylen, path, "bytes differ");
    return 1;
  }
  case PROTOBUF_C_TYPE_MESSAGE:
    return msg_equal(*(ProtobufCMessage *const *)pa,
                     *(ProtobufCMessage *const *)pb, path, pathlen, why,
                     whylen);
  case PROTOBUF_C_TYPE_BOOL: {
    /* protobuf-c stores what it read, != 0 */
    protobuf_c_boolean x, y;
    memcpy(&x, pa, sizeof(x));
    memcpy(&y, pb, sizeof(y));
    if ((x != 0) != (y != 0))
      return differ(why, whylen, path, "bools differ");
    return 1;
  }
  default:
    if (memcmp(pa, pb, scalar_size(f->type)) != 0)
      return differ(why, whylen, path, "values differ");
    return 1;
  }
}

static int msg_equal(const ProtobufCMessage *a, const ProtobufCMessage *b,
                     char *path, size_t pathlen, char *why, size_t whylen) {
  const ProtobufCMessageDescriptor *d;
  size_t plen = strlen(path);

  if (a == NULL || b == NULL)
    return a == b ? 1 : differ(why, whylen, path, "one message missing");
  d = a->descriptor;
  if (d != b->descriptor)
    return differ(why, whylen, path, "different message types");
  if (a->n_unknown_fields != b->n_unknown_fields)
    return differ(why, whylen, path, "unknown field counts differ");
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const char *ca = (const char *)a, *cb = (const char *)b;
    int ok = 1;

    snprintf(path + plen, pathlen - plen, ".%s", f->name);
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
      uint32_t qa, qb;
      memcpy(&qa, ca + f->quantifier_offset, sizeof(qa));
      memcpy(&qb, cb + f->quantifier_offset, sizeof(qb));
      if (qa != qb)
        return differ(why, whylen, path, "oneof cases differ");
      if (qa == f->id)
        ok = value_equal(f, ca + f->offset, cb + f->offset, path, pathlen,
                         why, whylen);
    } else if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t na, nb, sz = scalar_size(f->type);
      const char *va, *vb;
      memcpy(&na, ca + f->quantifier_offset, sizeof(na));
      memcpy(&nb, cb + f->quantifier_offset, sizeof(nb));
      if (na != nb)
        return differ(why, whylen, path, "repeated counts differ");
      memcpy(&va, ca + f->offset, sizeof(va));
      memcpy(&vb, cb + f->offset, sizeof(vb));
      for (size_t k = 0; ok && k < na; k++)
        ok = value_equal(f, va + k * sz, vb + k * sz, path, pathlen, why,
                         whylen);
    } else {
      ok = value_equal(f, ca + f->offset, cb + f->offset, path, pathlen, why,
                       whylen);
    }
    if (!ok)
      return 0;
    path[plen] = '\0';
  }
  return 1;
}

int tbf_msg_equal(const ProtobufCMessage *a, const ProtobufCMessage *b,
                  char *why, size_t whylen) {
  char path[512];

  snprintf(path, sizeof(path), "%s",
           a != NULL ? a->descriptor->short_name : "?");
  return msg_equal(a, b, path, sizeof(path), why, whylen);
}

int tbf_has_field0(const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d;

  if (m == NULL)
    return 0;
  for (size_t i = 0; i < m->n_unknown_fields; i++)
    if (m->unknown_fields[i].tag == 0)
      return 1;
  d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const char *at = (const char *)m + f->offset;
    if (f->type != PROTOBUF_C_TYPE_MESSAGE)
      continue;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
      uint32_t q;
      memcpy(&q, (const char *)m + f->quantifier_offset, sizeof(q));
      if (q != f->id)
        continue;
    }
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n;
      ProtobufCMessage *const *v;
      memcpy(&n, (const char *)m + f->quantifier_offset, sizeof(n));
      memcpy(&v, at, sizeof(v));
      for (size_t k = 0; k < n; k++)
        if (tbf_has_field0(v[k]))
          return 1;
    } else {
      ProtobufCMessage *sub;
      memcpy(&sub, at, sizeof(sub));
      if (tbf_has_field0(sub))
        return 1;
    }
  }
  return 0;
}
