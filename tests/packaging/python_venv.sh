#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# packaging_python_venv: the Python package as a user installs it.
#
#   python_venv.sh SOURCE_ROOT        (TB_DAEMON: the tensorbrokerd to talk to;
#                                      TB_PYTHON: the interpreter, default python3)
#
# In a fresh temporary folder, offline and without CMake's build:
#  1. copies the parts of the tree setup.py builds from (pip writes build/
#     and *.egg-info next to setup.py; the checkout stays untouched);
#  2. makes a venv with --system-site-packages (NumPy, setuptools and wheel
#     from Debian) and runs `pip install --no-build-isolation --no-index
#     ./python` in it;
#  3. `pip wheel` the same way and checks the wheel is the one abi3 wheel
#     (cp311-abi3), named with the project's version;
#  4. from another folder, with no PYTHONPATH, imports tensorbroker from the
#     venv and makes a NumPy round trip through a real daemon: a zero-copy
#     publish from broker memory and a copied one, each acquired by a second
#     client and compared.
# Exits 77 (skipped) when the interpreter lacks venv, setuptools, wheel or
# NumPy, or protoc-c is missing.
set -euo pipefail

root=$(cd "${1:?usage: python_venv.sh SOURCE_ROOT}" && pwd)
python=${TB_PYTHON:-python3}
daemon=${TB_DAEMON:?TB_DAEMON must name tensorbrokerd}

skip() { echo "SKIP: $*"; exit 77; }
"$python" -c 'import venv, ensurepip' 2>/dev/null ||
  skip "$python has no venv/ensurepip (Debian: python3-venv)"
"$python" -c 'import setuptools, wheel' 2>/dev/null ||
  skip "$python has no setuptools or wheel (Debian: python3-setuptools python3-wheel)"
"$python" -c 'import numpy' 2>/dev/null || skip "$python has no NumPy (python3-numpy)"
command -v protoc-c >/dev/null || skip "no protoc-c (protobuf-c-compiler)"

tmp=$(mktemp -d -t tb-venv.XXXXXX)
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ]; then
    kill -TERM "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# Offline and on its own: no index, no find-links or config from the machine.
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL PYTHONPATH PYTHONHOME

mkdir "$tmp/src"
for p in python client proto include CMakeLists.txt VERSION; do
  [ -e "$root/$p" ] && cp -a "$root/$p" "$tmp/src/"
done
rm -rf "$tmp/src/python/build" "$tmp/src/python"/*.egg-info
if [ -f "$root/VERSION" ]; then
  version=$(head -n 1 "$root/VERSION")
else
  version=$(sed -nE 's/^project\(tensorbroker VERSION ([0-9.]+).*/\1/p' "$root/CMakeLists.txt")
fi

echo "== venv ($("$python" --version))"
"$python" -m venv --system-site-packages "$tmp/venv"
py=$tmp/venv/bin/python

echo "== pip install --no-build-isolation --no-index ./python"
(cd "$tmp/src" && "$py" -m pip install -q --no-build-isolation --no-index ./python)

echo "== pip wheel --no-build-isolation --no-index ./python"
(cd "$tmp/src" && "$py" -m pip wheel -q --no-build-isolation --no-index --no-deps \
   -w "$tmp/wheels" ./python)
wheels=("$tmp"/wheels/*.whl)
echo "built ${wheels[*]##*/}"
case "${wheels[*]##*/}" in
  "tensorbroker-$version-cp311-abi3-linux_"*.whl) ;;
  *) echo "FAIL: expected one tensorbroker-$version-cp311-abi3-linux_*.whl" >&2; exit 1 ;;
esac

echo "== round trip through $daemon"
mkfifo "$tmp/ready"
"$daemon" --socket "$tmp/tb.sock" --log-level warn --ready-fd 3 3>"$tmp/ready" &
daemon_pid=$!
read -r line <"$tmp/ready" || true
[ "${line:-}" = READY ] || { echo "FAIL: tensorbrokerd did not start" >&2; exit 1; }

mkdir "$tmp/elsewhere"
cd "$tmp/elsewhere"
TENSORBROKER_SOCKET=$tmp/tb.sock TB_VENV=$tmp/venv TB_VERSION=$version "$py" - <<'EOF'
import os
import numpy as np
import tensorbroker as tb

venv = os.path.realpath(os.environ["TB_VENV"])
where = os.path.realpath(tb.__file__)
assert where.startswith(venv + os.sep), "imported from %s, not the venv" % where
assert tb.__version__ == os.environ["TB_VERSION"], tb.__version__

with tb.Client(name="venv-producer") as p, tb.Client(name="venv-consumer") as c:
    a = p.empty((64, 3), np.float32)              # broker memory: no copy
    a[...] = np.arange(a.size, dtype=np.float32).reshape(a.shape)
    v1 = p.publish("venv/frames", a, metadata=b"one")
    assert p.last_publish_zero_copy
    with c.acquire("venv/frames", timeout=5.0) as lease:
        x = np.from_dlpack(lease)
        assert lease.version == v1 and lease.metadata == b"one"
        assert np.array_equal(x, a), "zero-copy round trip differs"
        del x
    b = np.linspace(0, 1, 1000).reshape(10, 100)  # ordinary memory: copied
    v2 = p.publish("venv/frames", b)
    with c.acquire("venv/frames", after=v1, timeout=5.0) as lease:
        y = np.from_dlpack(lease)
        assert lease.version == v2 and y.dtype == np.float64
        assert np.array_equal(y, b), "copied round trip differs"
        del y
print("round trip OK: tensorbroker %s from %s" % (tb.__version__, where))
EOF
