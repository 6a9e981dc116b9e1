#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# install_dlpack: the installed headers coexist with the DLPack header a
# user has. dlpack_user.c (what it asserts is written there) is built
# against the installed tree with -std=c11 -Wall -Wextra -Werror -pedantic,
# linked to the installed library and run, with:
#  - a DLPack 1.x header of the user's (dlpack1x/, as dmlc/dlpack has it)
#    found as <dlpack/dlpack.h>, included before and after tensorbroker.h;
#  - the same header included by another path, before tensorbroker.h;
#  - only the system's <dlpack/dlpack.h> (Debian 12: 0.6), before and after.
# usage: dlpack.sh BUILD_DIR SOURCE_DIR CC CMAKE
# $TB_USER_LDFLAGS: added to every link (a sanitizer build's -fsanitize=...)
set -eu
build=$1 src=$2 cc=$3 cmake=$4
# the build's tools, where the build folder was carried to a machine
# without them (the GPU machine): skipped, not failed
for tool in "$cc" "$cmake"; do
  [ -x "$tool" ] || { echo "SKIP: $tool is not on this machine"; exit 77; }
done
ldflags=${TB_USER_LDFLAGS:-}
here=$src/tests/install
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$cmake" --install "$build" --prefix "$tmp/p" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install"; }
so=$(find "$tmp/p" -name libtensorbroker.so)
libdir=$(dirname "$so")

# Is the system's own header 1.x? (Debian 12's is 0.6.)
system_1x=$(printf '#include <dlpack/dlpack.h>\n#ifdef DLPACK_MAJOR_VERSION\nis_1x=1\n#else\nis_1x=0\n#endif\n' |
  "$cc" -E -P -x c - | sed -n 's/^is_1x=//p')

n=0
build_run() { # NAME USER_FIRST EXPECT_1X USER_DLPACK [CFLAGS...]
  name=$1 first=$2 expect=$3 hdr=$4
  shift 4
  n=$((n + 1))
  "$cc" -std=c11 -Wall -Wextra -Werror -pedantic -Wno-unused-parameter \
    -o "$tmp/$name" "$here/dlpack_user.c" "$@" -I"$tmp/p/include" \
    -DTB_USER_FIRST="$first" -DTB_EXPECT_1X="$expect" -DTB_USER_DLPACK="$hdr" \
    -L"$libdir" -ltensorbroker -Wl,-rpath,"$libdir" $ldflags ||
    fail "$name: does not build"
  out=$("$tmp/$name") || fail "$name: exited $?"
  echo "$name: $out"
}
build_run user1x_before 1 1 '<dlpack/dlpack.h>' -I"$here/dlpack1x"
build_run user1x_after 0 1 '<dlpack/dlpack.h>' -I"$here/dlpack1x"
build_run user1x_other_path_before 1 1 '<dlpack1x/dlpack/dlpack.h>' -I"$here"
build_run system_before 1 "$system_1x" '<dlpack/dlpack.h>'
build_run system_after 0 "$system_1x" '<dlpack/dlpack.h>'
echo "OK: $n builds (system DLPack header: $([ "$system_1x" = 1 ] && echo 1.x || echo 0.x))"
