#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# packaging_deb: build the Debian packages, install them, use them, purge them.
#
#   deb_test.sh SOURCE_ROOT
#
#  1. debian/changelog's version is the project's (VERSION, else the
#     project() line of CMakeLists.txt);
#  2. dpkg-buildpackage -us -uc -b in a copy of the tree under /tmp;
#  3. lintian on the result: no error and no warning (-i explains any);
#  4. dpkg -i of tensorbroker, libtensorbroker0, libtensorbroker-dev and
#     python3-tensorbroker; the system user and group exist, the man pages
#     are installed;
#  5. /usr/bin/tensorbrokerd, started as that user on a socket in a temporary
#     folder; `tbctl status`; a NumPy round trip with the installed Python
#     module (no PYTHONPATH, from a folder outside the tree); a C program
#     built with `pkg-config tensorbroker` against libtensorbroker-dev;
#  6. dpkg --purge of the four packages (and the user, if this test made it),
#     however the test ends.
# It installs into the running system: it runs only as root (CI runs it on a
# throw-away machine) and exits 77 (skipped) when not root, when
# TB_PACKAGING_DEB=0, when a build dependency is missing, or when one of the
# packages is installed already (it would replace it). Bounded in time:
# dpkg-buildpackage 400 s, lintian 120 s, each client 30 s.
set -euo pipefail

root=$(cd "${1:?usage: deb_test.sh SOURCE_ROOT}" && pwd)
pkgs=(python3-tensorbroker libtensorbroker-dev tensorbroker libtensorbroker0)

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "${TB_PACKAGING_DEB:-1}" != 0 ] || skip "TB_PACKAGING_DEB=0"
[ "$(id -u)" -eq 0 ] || skip "installs packages: runs as root only (CI)"
command -v dpkg-buildpackage >/dev/null || skip "no dpkg-buildpackage (dpkg-dev)"
command -v dh >/dev/null || skip "no debhelper"
if ! missing=$(cd "$root" && dpkg-checkbuilddeps 2>&1); then
  skip "build dependencies missing: ${missing#*: }"
fi
for p in "${pkgs[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    skip "$p is installed already; this test would replace it"
  fi
done

# 1. one version
version=$(dpkg-parsechangelog -l "$root/debian/changelog" -S Version)
if [ -f "$root/VERSION" ]; then
  want=$(head -n 1 "$root/VERSION")
else
  want=$(sed -nE 's/^project\(tensorbroker VERSION ([0-9.]+).*/\1/p' "$root/CMakeLists.txt")
fi
[ "${version%%-*}" = "$want" ] ||
  fail "debian/changelog says $version, the project $want: add a changelog entry (dch -v $want)"

tmp=$(mktemp -d -t tb-deb.XXXXXX)
daemon_pid=
user_made=0
getent passwd tensorbroker >/dev/null || user_made=1
cleanup() {
  set +e
  if [ -n "$daemon_pid" ]; then
    kill -TERM "$daemon_pid" 2>/dev/null
    wait "$daemon_pid" 2>/dev/null
  fi
  for p in "${pkgs[@]}"; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed\|half\|unpacked'; then
      dpkg --purge "$p" >/dev/null
    fi
  done
  if [ "$user_made" -eq 1 ] && getent passwd tensorbroker >/dev/null; then
    userdel tensorbroker 2>/dev/null
    getent group tensorbroker >/dev/null && groupdel tensorbroker 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# 2. build, in a copy of the tree (what git would commit, without build
# folders; the whole folder when this is no git checkout)
src=$tmp/tensorbroker-$version
mkdir -p "$src"
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$root" && git ls-files -z --cached --others --exclude-standard |
     while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
     tar --null -T - -cf -) | tar -C "$src" -xf -
else
  tar -C "$root" --exclude='./build*' --exclude=./.git -cf - . | tar -C "$src" -xf -
fi
echo "== dpkg-buildpackage -us -uc -b ($version)"
t0=$SECONDS
if ! (cd "$src" && DEB_BUILD_OPTIONS="parallel=$(nproc) ${DEB_BUILD_OPTIONS:-}" \
        timeout 400 dpkg-buildpackage -us -uc -b) >"$tmp/build.log" 2>&1; then
  tail -n 60 "$tmp/build.log"
  fail "dpkg-buildpackage failed"
fi
echo "built in $((SECONDS - t0)) s:"
(cd "$tmp" && ls -1 ./*.deb)

# 3. lintian: errors and warnings fail the test (info tags are not shown;
# the one overridden is explained in debian/libtensorbroker0.lintian-overrides)
if command -v lintian >/dev/null; then
  echo "== lintian"
  t0=$SECONDS
  timeout 120 lintian -i --fail-on error,warning "$tmp"/tensorbroker_"$version"_*.changes ||
    fail "lintian reported errors or warnings (above)"
  echo "lintian clean of errors and warnings ($((SECONDS - t0)) s)"
else
  echo "== lintian: not installed, not run"
fi

# 4. install
echo "== dpkg -i"
debs=()
for p in "${pkgs[@]}"; do debs+=("$tmp/${p}_${version}_"*.deb); done
dpkg -i "${debs[@]}" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "dpkg -i failed"; }
getent passwd tensorbroker >/dev/null || fail "no system user tensorbroker"
getent group tensorbroker >/dev/null || fail "no group tensorbroker"
for m in man1/tbctl.1 man7/tensorbroker.7 man8/tensorbrokerd.8; do
  [ -f "/usr/share/man/$m.gz" ] || fail "/usr/share/man/$m.gz not installed"
done
for u in tensorbroker.service tensorbroker.socket; do
  [ -f "/lib/systemd/system/$u" ] || fail "/lib/systemd/system/$u not installed"
done
grep -qx 'ExecStart=/usr/bin/tensorbrokerd' /lib/systemd/system/tensorbroker.service ||
  fail "tensorbroker.service does not start /usr/bin/tensorbrokerd"
# dh_installsystemd's postinst enables the socket (no systemd needed)
[ -L /etc/systemd/system/sockets.target.wants/tensorbroker.socket ] ||
  fail "tensorbroker.socket not enabled by the package"
/usr/bin/tensorbrokerd --version | grep -qF "tensorbrokerd $want" ||
  fail "tensorbrokerd --version does not say $want"

# 5. use: the daemon as its user, on a socket in a folder of its own
mkdir "$tmp/run" "$tmp/elsewhere"
chown tensorbroker:tensorbroker "$tmp/run"
chmod 0755 "$tmp"
sock=$tmp/run/tb.sock
mkfifo "$tmp/ready"
# setpriv execs the daemon (runuser would stay in between, and answer
# SIGTERM with a status of its own)
setpriv --reuid=tensorbroker --regid=tensorbroker --init-groups \
  /usr/bin/tensorbrokerd --socket "$sock" --log-level warn \
  --ready-fd 3 3>"$tmp/ready" 2>"$tmp/daemon.log" &
daemon_pid=$!
read -r line <"$tmp/ready" || true
[ "${line:-}" = READY ] || { cat "$tmp/daemon.log"; fail "installed tensorbrokerd did not start"; }
[ "$(stat -c %U "$sock")" = tensorbroker ] || fail "socket not owned by the tensorbroker user"

echo "== tbctl status"
timeout 30 /usr/bin/tbctl --socket "$sock" status | tee "$tmp/status.txt"
grep -q "daemon version *$want" "$tmp/status.txt" || fail "tbctl status: no version $want"

echo "== installed Python module: NumPy round trip"
cd "$tmp/elsewhere"
env -u PYTHONPATH -u PYTHONHOME TENSORBROKER_SOCKET="$sock" timeout 30 /usr/bin/python3 - <<'EOF'
import numpy as np
import tensorbroker as tb

assert tb.__file__ == "/usr/lib/python3/dist-packages/tensorbroker/__init__.py", tb.__file__
with tb.Client(name="deb-producer") as p, tb.Client(name="deb-consumer") as c:
    a = p.empty((4, 5), np.int32)
    a[...] = np.arange(20, dtype=np.int32).reshape(4, 5)
    v = p.publish("deb/frames", a, metadata=b"deb")
    with c.acquire("deb/frames", timeout=5.0) as lease:
        assert lease.version == v and lease.metadata == b"deb"
        assert np.array_equal(np.from_dlpack(lease), a)
print("round trip OK: tensorbroker %s from %s" % (tb.__version__, tb.__file__))
EOF

echo "== C against libtensorbroker-dev (pkg-config)"
# shellcheck disable=SC2046  # pkg-config's words are meant to split
cc -o "$tmp/minimal" "$src/examples/minimal.c" $(pkg-config --cflags --libs tensorbroker)
TENSORBROKER_SOCKET=$sock timeout 30 "$tmp/minimal" | tee "$tmp/minimal.txt"
grep -q '^got 0 1 2 3$' "$tmp/minimal.txt" || fail "examples/minimal.c did not get its tensor"
timeout 30 /usr/bin/tbctl --socket "$sock" channels | grep -q 'demo/minimal' ||
  fail "tbctl channels does not list demo/minimal"

# 6. purge (the trap does it too, should anything above fail)
kill -TERM "$daemon_pid"
wait "$daemon_pid" || fail "installed tensorbrokerd did not stop cleanly"
daemon_pid=
echo "== dpkg --purge"
dpkg --purge "${pkgs[@]}" >/dev/null
for p in "${pkgs[@]}"; do
  ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' ||
    fail "$p still installed after purge"
done
[ ! -e /usr/bin/tensorbrokerd ] || fail "/usr/bin/tensorbrokerd left after purge"
echo "packages built, installed, used and purged"
