/* SPDX-License-Identifier: Apache-2.0 */
/* Build-time check, where the CUDA toolkit is installed: the fake driver
 * compiled after the real cuda.h. A definition whose signature differs from
 * cuda.h's prototype, or a constant whose value differs, fails the build.
 * The object is never linked. */
#include <cuda.h>

#define FAKECUDA_DECLS_CHECK 1
#include "fake_libcuda.c"
