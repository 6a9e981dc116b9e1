/* DLPack for tensorbroker: the system's <dlpack/dlpack.h> plus the DLPack 1.x
 * pieces it may lack.
 *
 * Debian 12 ships DLPack 0.6, which has DLTensor but not the versioned
 * managed tensor. Where the header is older than 1.0, the 1.x structures are
 * declared here exactly as the published ABI has them (dmlc/dlpack
 * include/dlpack/dlpack.h, v1.1), so that binaries built against either header
 * agree on the layout. */
#ifndef TENSORBROKER_DLPACK_H
#define TENSORBROKER_DLPACK_H

#include <dlpack/dlpack.h>
#include <stdint.h>

#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION < 1
#define TB_DLPACK_DECLARES_VERSIONED 1

#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 1

typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)

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
