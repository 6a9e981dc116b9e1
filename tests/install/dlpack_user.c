/* SPDX-License-Identifier: Apache-2.0 */
/* A user's file that has its own idea of DLPack, for tests/install/dlpack.sh.
 * Built with
 *   TB_USER_FIRST 1: the user's DLPack header (TB_USER_DLPACK) is included
 *                    before tensorbroker.h, 0: after it;
 *   TB_EXPECT_1X   1: that header is DLPack 1.x, 0: an older one (Debian
 *                    12's 0.6), where DLPACK_MAJOR_VERSION must stay
 *                    undefined whatever tensorbroker.h declares.
 * It does what user code does: tests DLPACK_MAJOR_VERSION and then uses the
 * 1.x names (kDLBool, DLPACK_FLAG_BITMASK_*), and passes its
 * DLManagedTensorVersioned to tensorbroker's calls (-Werror: the types must
 * be the same ones). */
#include <stddef.h>
#include <stdio.h>
#if TB_USER_FIRST
#include TB_USER_DLPACK
#endif
#include <tensorbroker/tensorbroker.h>
#if !TB_USER_FIRST
#include TB_USER_DLPACK
#endif

#if TB_EXPECT_1X != defined(DLPACK_MAJOR_VERSION)
#error "DLPACK_MAJOR_VERSION is not what the user's DLPack header says"
#endif

#if defined(DLPACK_MAJOR_VERSION) && DLPACK_MAJOR_VERSION >= 1
/* the user's DLPack is 1.x: its names work, and tensorbroker uses its types */
#define USER_BOOL kDLBool
_Static_assert(DLPACK_FLAG_BITMASK_READ_ONLY == TB_DLPACK_FLAG_BITMASK_READ_ONLY,
               "read-only flag");
_Static_assert(DLPACK_FLAG_BITMASK_IS_COPIED == TB_DLPACK_FLAG_BITMASK_IS_COPIED,
               "copied flag");
_Static_assert(DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED ==
                   TB_DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED,
               "sub-byte flag");
_Static_assert((int)kDLBool == (int)TB_DTYPE_BOOL, "bool code");
#ifdef TB_DLPACK_DECLARES_VERSIONED
#error "tensorbroker declared DLManagedTensorVersioned over a DLPack 1.x header"
#endif
#else
#define USER_BOOL TB_DTYPE_BOOL
#ifndef TB_DLPACK_DECLARES_VERSIONED
#error "no DLManagedTensorVersioned declared over a DLPack 0.x header"
#endif
#endif

/* the 1.1 ABI, however it was declared */
_Static_assert(offsetof(DLManagedTensorVersioned, version) == 0, "version");
_Static_assert(offsetof(DLManagedTensorVersioned, flags) ==
                   2 * sizeof(void *) + sizeof(DLPackVersion),
               "flags");
_Static_assert(offsetof(DLManagedTensorVersioned, dl_tensor) ==
                   2 * sizeof(void *) + sizeof(DLPackVersion) + 8,
               "dl_tensor");

static int deleted;
static void user_deleter(struct DLManagedTensorVersioned *self) { deleted = 1; }

int main(void) {
  int (*acquire)(tb_client *, const char *, const struct tb_acquire_options *,
                 DLManagedTensorVersioned **) = tb_acquire;
  int (*release)(DLManagedTensorVersioned *, void *) = tb_release;
  DLManagedTensorVersioned m = {.deleter = user_deleter,
                                .flags = TB_DLPACK_FLAG_BITMASK_READ_ONLY};
  tb_client *c = NULL;
  struct tb_connect_options o;

  m.dl_tensor.dtype.code = USER_BOOL;
  m.deleter(&m);
  tb_connect_options_init(&o);
  o.socket_path = "/nonexistent/tensorbroker.sock";
  if (tb_client_connect(&o, &c) != TB_ECONNECT || !deleted ||
      acquire == NULL || release == NULL)
    return 1;
  printf("tensorbroker %s, DLPack %s, bool code %d\n", tb_version(),
         TB_EXPECT_1X ? "1.x" : "0.x", m.dl_tensor.dtype.code);
  return 0;
}
