/* SPDX-License-Identifier: Apache-2.0 */
/* DLPack for tensorbroker: the <dlpack/dlpack.h> the compiler finds, plus
 * what tensorbroker needs from DLPack 1.x when that header is older.
 *
 * Debian 12 ships DLPack 0.6, which has DLTensor but not the versioned
 * managed tensor this API hands out. Where the header found is older than
 * 1.0, DLPackVersion and DLManagedTensorVersioned are declared here exactly
 * as the published ABI has them (dmlc/dlpack include/dlpack/dlpack.h, v1.1),
 * so that binaries built against either header agree on the layout, and
 * TB_DLPACK_DECLARES_VERSIONED is defined (a user's own fallback
 * declarations can test it).
 *
 * DLPack's macros are never defined here: DLPACK_MAJOR_VERSION stays
 * undefined over a 0.6 header, so code that tests it does not go on to use
 * what 0.6 lacks (kDLBool). What tensorbroker's API needs of them has its own
 * name, defined whatever the header: TB_DLPACK_MAJOR_VERSION and
 * TB_DLPACK_MINOR_VERSION, the version of the DLManagedTensorVersioned
 * objects the library makes, and the flag bits TB_DLPACK_FLAG_BITMASK_*,
 * the same values as DLPack's DLPACK_FLAG_BITMASK_*.
 *
 * A user's DLPack 1.x header, found as <dlpack/dlpack.h> (before the system
 * one on the include path) or included before this one, is the one used:
 * its types are then the ones in tensorbroker's API. */
#ifndef TENSORBROKER_DLPACK_H
#define TENSORBROKER_DLPACK_H

#include <dlpack/dlpack.h>
#include <stdint.h>

#define TB_DLPACK_MAJOR_VERSION 1
#define TB_DLPACK_MINOR_VERSION 1

/* DLManagedTensorVersioned.flags bits (DLPack 1.0 and 1.1). */
#define TB_DLPACK_FLAG_BITMASK_READ_ONLY (UINT64_C(1) << 0)
#define TB_DLPACK_FLAG_BITMASK_IS_COPIED (UINT64_C(1) << 1)
#define TB_DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (UINT64_C(1) << 2)

#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION < 1
#define TB_DLPACK_DECLARES_VERSIONED 1

typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

#endif

/* Data type codes added after DLPack 0.6 (values from the 1.1 ABI). The
 * enum in older headers stops at kDLComplex; these are plain integers so the
 * code compiles against both. */
enum tb_dtype_code {
  TB_DTYPE_INT = 0,
  TB_DTYPE_UINT = 1,
  TB_DTYPE_FLOAT = 2,
  TB_DTYPE_OPAQUE_HANDLE = 3,
  TB_DTYPE_BFLOAT = 4,
  TB_DTYPE_COMPLEX = 5,
  TB_DTYPE_BOOL = 6,
  TB_DTYPE_FLOAT8_E3M4 = 7,
  TB_DTYPE_FLOAT8_E4M3 = 8,
  TB_DTYPE_FLOAT8_E4M3B11FNUZ = 9,
  TB_DTYPE_FLOAT8_E4M3FN = 10,
  TB_DTYPE_FLOAT8_E4M3FNUZ = 11,
  TB_DTYPE_FLOAT8_E5M2 = 12,
  TB_DTYPE_FLOAT8_E5M2FNUZ = 13,
  TB_DTYPE_FLOAT8_E8M0FNU = 14,
  TB_DTYPE_FLOAT6_E2M3FN = 15,
  TB_DTYPE_FLOAT6_E3M2FN = 16,
  TB_DTYPE_FLOAT4_E2M1FN = 17
};

#endif /* TENSORBROKER_DLPACK_H */
