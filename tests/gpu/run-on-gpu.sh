#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Run the test suite on the GPU machine, from a build folder prepared here
# by tests/gpu/prepare-carry.sh and carried along with the source tree.
#
#   tests/gpu/run-on-gpu.sh [BUILD_DIR]     (default: <repo>/build-gpu)
#
# Prints the GPU and driver, runs the GPU tests (ctest -L gpu), with
# TB_GPU_RUN_ALL=1 then the rest of the suite, and copies the logs into
# $OUT when it is set. Bounded under 9 minutes. Exit status: 0 when every
# test passed or skipped.
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-$src/build-gpu}
case "$build" in /*) ;; *) build="$src/$build" ;; esac
build=$(cd "$build" && pwd) || exit 2
carry="$build/carry-libs"
logs=${OUT:-$build/gpu-logs}
mkdir -p "$logs"

if [ ! -f "$carry/ORIGIN" ]; then
  echo "run-on-gpu: $carry/ORIGIN missing: run tests/gpu/prepare-carry.sh first" >&2
  exit 2
fi
old_src=$(sed -n 's/^src=//p' "$carry/ORIGIN")
old_build=$(sed -n 's/^build=//p' "$carry/ORIGIN")
# ctest's files name absolute paths of the machine that built them
if [ "$old_build" != "$build" ] || [ "$old_src" != "$src" ]; then
  echo "run-on-gpu: relocating ctest files: $old_build -> $build"
  find "$build" -name CTestTestfile.cmake | while read -r f; do
    sed -i -e "s|$old_build|$build|g" -e "s|$old_src|$src|g" "$f"
  done
  printf 'src=%s\nbuild=%s\n' "$src" "$build" >"$carry/ORIGIN"
fi

# The Python tests were configured with this machine's /usr/bin/python3;
# there, the python3 on PATH is the one with torch, CuPy and JAX.
py=$(command -v python3 || true)
if [ -n "$py" ] && [ "$py" != /usr/bin/python3 ] &&
  "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "run-on-gpu: Python tests use $py"
  find "$build" -name CTestTestfile.cmake -exec sed -i "s|/usr/bin/python3|$py|g" {} +
fi

export LD_LIBRARY_PATH="$carry:$build/client${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
  echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "== host: $(uname -a)"
  echo "== nvidia-smi"
  nvidia-smi 2>&1 || echo "(nvidia-smi failed)"
  nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total \
    --format=csv 2>&1 || true
  echo "== libcuda: $(ls -l /usr/lib/x86_64-linux-gnu/libcuda.so.1 2>&1)"
  echo "== missing libraries of the test programs:"
  for f in "$build"/tests/gpu/gpu_* "$build"/daemon/tensorbrokerd; do
    [ -x "$f" ] && ldd "$f" | grep 'not found' | sed "s|^|  $(basename "$f"): |"
  done
  echo "(end)"
} 2>&1 | tee "$logs/gpu-env.txt"

cd "$build" || exit 2
# ctest writes LastTest.log.tmp and renames it when it ends: a ctest that
# timeout stopped leaves only the .tmp, whose output is kept all the same
keep_log() {
  t=Testing/Temporary
  if [ -f $t/LastTest.log.tmp ]; then
    mv $t/LastTest.log.tmp "$logs/LastTest-$1.log"
  else
    cp $t/LastTest.log "$logs/LastTest-$1.log" 2>/dev/null
  fi
}

status=0
echo "== ctest -L gpu"
# TB_GPU_EXCLUDE: a ctest -E regex, to leave tests out when device time is
# short (e.g. 'python' skips the Python GPU tests); TB_GPU_TIMEOUT: seconds
# for the whole ctest -L gpu (default 420)
timeout "${TB_GPU_TIMEOUT:-420}" ctest -L gpu ${TB_GPU_EXCLUDE:+-E "$TB_GPU_EXCLUDE"} \
  --output-on-failure --timeout 120 2>&1 |
  tee "$logs/ctest-gpu.txt"
grep -q '100% tests passed' "$logs/ctest-gpu.txt" || status=1
keep_log gpu

if [ "${TB_GPU_RUN_ALL:-0}" = 1 ]; then
  echo "== ctest (everything else)"
  timeout 150 ctest -LE gpu --output-on-failure --timeout 60 -j 8 2>&1 |
    tee "$logs/ctest-rest.txt"
  grep -q '100% tests passed' "$logs/ctest-rest.txt" || status=1
  keep_log rest
fi

echo "== run-on-gpu: exit $status (logs in $logs)"
exit $status
