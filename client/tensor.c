/* SPDX-License-Identifier: Apache-2.0 */
/* The one check of a tensor a producer publishes, whatever its memory kind
 * (kind.h): tb__tensor_check before the kind locates the memory,
 * tb__tensor_fits once it has. tb_publish_copy uses the first too. */
#include "kind.h"

int tb__tensor_check(struct tb_client *c, const DLTensor *t,
                     uint64_t *elem_bits, uintptr_t *start) {
  int rc;

  if (t->ndim < 0 || (uint32_t)t->ndim > c->max_ndim)
    return tb__set_error(c, t->ndim < 0 ? TB_ELAYOUT : TB_ELIMIT,
                         "ndim %d outside 0..%u", t->ndim,
                         (unsigned)c->max_ndim);
  rc = tb__dtype_check(t->dtype.code, t->dtype.bits, t->dtype.lanes,
                       elem_bits);
  if (rc < 0)
    return tb__set_error(c, rc, "unsupported dtype code %u bits %u lanes %u",
                         t->dtype.code, t->dtype.bits, t->dtype.lanes);
  if ((uintptr_t)t->data > UINTPTR_MAX - t->byte_offset)
    return tb__set_error(c, TB_ELAYOUT, "data + byte_offset overflows");
  *start = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
  return 0;
}

int tb__tensor_fits(struct tb_client *c, const DLTensor *t,
                    uint64_t elem_bits, uint64_t flags, uintptr_t start,
                    uintptr_t base, uint64_t size, const char *what) {
  uint64_t lo, hi;
  char why[160];
  int rc;

  rc = tb__layout_extent(t->ndim, t->shape, t->strides, elem_bits, flags,
                         start - base, &lo, &hi, why, sizeof(why));
  if (rc < 0)
    return tb__set_error(c, rc, "%s", why);
  if (hi > size)
    return tb__set_error(c, TB_ELAYOUT,
                         "tensor reaches byte %llu of its %llu-byte %s",
                         (unsigned long long)hi, (unsigned long long)size,
                         what);
  return 0;
}
