#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# install_consumers: what a user gets from `cmake --install BUILD --prefix P`.
# The tree is installed, then moved, so nothing in it may remember where it
# was installed. From the moved tree, with nothing else set (only the tree's
# own path given to CMake or pkg-config):
#  - tensorbrokerd and tbctl run and print VERSION's number; tbctl finds the
#    installed library (its RPATH), and talks to the installed daemon;
#  - tensorbroker.pc gives VERSION and paths inside the moved tree;
#  - tools/tbctl.c builds from the moved tree's headers and library alone
#    (it uses only the public API) and shows what the installed tbctl does;
#  - examples/minimal.c (the README's program) and app.c build in five ways:
#    CMake find_package with tensorbroker::tensorbroker and
#    tensorbroker::tensorbroker_static, pkg-config (shared, and --static
#    with the static libraries), and plain -I -L -ltensorbroker;
#  - each runs: minimal against the installed daemon ("got 0 1 2 3"), app
#    checks tb_version() against the header and VERSION and that a connect
#    with no daemon fails with TB_ECONNECT; the static ones need no
#    libtensorbroker.so, the shared ones load the moved tree's.
# usage: consumers.sh BUILD_DIR SOURCE_DIR CC CMAKE PKG_CONFIG
# $TB_USER_LDFLAGS: added to every link (a sanitizer build's -fsanitize=...)
set -eu
build=$1 src=$2 cc=$3 cmake=$4 pkgconfig=$5
# the build's tools, where the build folder was carried to a machine
# without them (the GPU machine): skipped, not failed
for tool in "$cc" "$cmake" "$pkgconfig"; do
  [ -x "$tool" ] || { echo "SKIP: $tool is not on this machine"; exit 77; }
done
ldflags=${TB_USER_LDFLAGS:-}
version=$(cat "$src/VERSION")
tmp=$(mktemp -d)
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "FAIL: $*"; exit 1; }
step() { echo "== $*"; }

step "install, then move the tree"
"$cmake" --install "$build" --prefix "$tmp/stage" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install"; }
mv "$tmp/stage" "$tmp/p"
P=$tmp/p
left=$(grep -rlF "$tmp/stage" "$P" || true)
[ -z "$left" ] || fail "files that remember the install prefix: $left"
pc=$(find "$P" -name tensorbroker.pc)
[ -n "$pc" ] || fail "no tensorbroker.pc installed"
libdir=$(cd "$(dirname "$pc")/.." && pwd)
[ -f "$libdir/libtensorbroker.a" ] || fail "no libtensorbroker.a in $libdir"
[ -f "$P/include/tensorbroker/version.h" ] || fail "no tensorbroker/version.h"
[ ! -e "$P/include/tensorbroker/version.h.in" ] || fail "version.h.in installed"

step "installed programs"
out=$("$P/bin/tensorbrokerd" --version)
echo "$out"
case "$out" in *" $version "*) ;; *) fail "tensorbrokerd --version is not $version" ;; esac
out=$("$P/bin/tbctl" --version)
echo "$out"
[ "$out" = "tbctl $version" ] || fail "tbctl --version is not $version"
# loads(PROGRAM): the libtensorbroker.so PROGRAM loads, its full path
loads() {
  so=$(ldd "$1" | awk '$1 ~ /^libtensorbroker\.so/ { print $3 }')
  [ -z "$so" ] || readlink -f "$so"
}
[ "$(loads "$P/bin/tbctl")" = "$(readlink -f "$libdir/libtensorbroker.so")" ] ||
  fail "tbctl does not load $libdir/libtensorbroker.so: $(ldd "$P/bin/tbctl")"

step "pkg-config"
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
[ "$("$pkgconfig" --modversion tensorbroker)" = "$version" ] ||
  fail "pkg-config --modversion is not $version"
pc_libdir=$("$pkgconfig" --variable=libdir tensorbroker)
[ "$(cd "$pc_libdir" && pwd)" = "$libdir" ] || fail "pkg-config libdir $pc_libdir"
echo "cflags: $("$pkgconfig" --cflags tensorbroker)"
echo "libs: $("$pkgconfig" --libs tensorbroker)"
echo "libs --static: $("$pkgconfig" --libs --static tensorbroker)"

step "start the installed daemon"
TENSORBROKER_SOCKET=$tmp/tb.sock
export TENSORBROKER_SOCKET
mkfifo "$tmp/ready"
"$P/bin/tensorbrokerd" --socket "$TENSORBROKER_SOCKET" --log-level warn \
  --ready-fd 3 3>"$tmp/ready" 2>"$tmp/daemon.log" &
daemon_pid=$!
# blocks until the daemon opens the fifo; end-of-file if it dies first
read -r line <"$tmp/ready" || true
[ "${line:-}" = READY ] || { cat "$tmp/daemon.log"; fail "tensorbrokerd did not start"; }
"$P/bin/tbctl" status >"$tmp/status.txt" || { cat "$tmp/status.txt"; fail "tbctl status"; }

step "build: plain -I -L, pkg-config shared and static"
minimal=$src/examples/minimal.c
app=$src/tests/install/app.c
for prog in minimal app; do
  eval "f=\$$prog"
  # shellcheck disable=SC2046 # word splitting of the flags is meant
  "$cc" -o "$tmp/${prog}_plain" "$f" -I"$P/include" -L"$libdir" \
    -ltensorbroker -Wl,-rpath,"$libdir" $ldflags || fail "plain build of $prog"
  # shellcheck disable=SC2046
  "$cc" -o "$tmp/${prog}_pkgconfig_shared" "$f" \
    $("$pkgconfig" --cflags --libs tensorbroker) -Wl,-rpath,"$pc_libdir" $ldflags ||
    fail "pkg-config build of $prog"
  # shellcheck disable=SC2046
  "$cc" -o "$tmp/${prog}_pkgconfig_static" "$f" \
    $("$pkgconfig" --cflags --static tensorbroker) \
    -Wl,-Bstatic $("$pkgconfig" --libs --static tensorbroker) -Wl,-Bdynamic \
    $ldflags ||
    fail "pkg-config --static build of $prog"
done

step "tools/tbctl.c from the installed tree alone"
# tbctl is a client of the public library only: its source builds with the
# installed headers and -ltensorbroker (plus cJSON) and nothing of the
# source tree, and shows the same daemon as the installed tbctl
# shellcheck disable=SC2046
"$cc" -o "$tmp/tbctl_user" "$src/tools/tbctl.c" -I"$P/include" \
  $("$pkgconfig" --cflags libcjson) -L"$libdir" -ltensorbroker \
  $("$pkgconfig" --libs libcjson) -Wl,-rpath,"$libdir" $ldflags ||
  fail "tools/tbctl.c does not build against the installed tree alone"
"$tmp/tbctl_user" --json channels >"$tmp/channels_user.json" ||
  fail "tbctl built by a user: channels"
"$P/bin/tbctl" --json channels >"$tmp/channels.json" || fail "tbctl channels"
cmp "$tmp/channels_user.json" "$tmp/channels.json" ||
  fail "the two tbctl show different channels"

step "build: CMake find_package"
"$cmake" -S "$src/tests/install/consumer" -B "$tmp/cmake" \
  -DCMAKE_PREFIX_PATH="$P" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_EXE_LINKER_FLAGS="$ldflags" \
  -DTB_EXPECT_VERSION="$version" -DTB_MINIMAL_C="$minimal" \
  >"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "configure"; }
"$cmake" --build "$tmp/cmake" -j2 >>"$tmp/cmake.log" 2>&1 ||
  { cat "$tmp/cmake.log"; fail "build against the CMake package"; }
for kind in shared static; do
  for prog in minimal app; do
    cp "$tmp/cmake/${prog}_cmake_$kind" "$tmp/${prog}_cmake_$kind"
  done
done

step "run"
for way in plain pkgconfig_shared pkgconfig_static cmake_shared cmake_static; do
  for prog in minimal app; do
    needed=$(readelf -d "$tmp/${prog}_$way" | grep NEEDED || true)
    case "$way" in
    *static)
      case "$needed" in *libtensorbroker*) fail "${prog}_$way needs libtensorbroker.so" ;; esac ;;
    *)
      [ "$(loads "$tmp/${prog}_$way")" = "$(readlink -f "$libdir/libtensorbroker.so")" ] ||
        fail "${prog}_$way does not load $libdir/libtensorbroker.so" ;;
    esac
  done
  out=$("$tmp/minimal_$way") || fail "minimal_$way exited $?: $out"
  [ "$out" = "got 0 1 2 3" ] || fail "minimal_$way printed '$out'"
  app_out=$("$tmp/app_$way" "$version" "$tmp/none.sock") ||
    fail "app_$way: $app_out"
  echo "$way: minimal: $out; app: $app_out"
done
echo "OK"
