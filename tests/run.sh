#!/usr/bin/env bash
# The whole test suite, as CI runs it (README: `tests/run.sh`).
#  1. installs missing Debian packages (as root, or through sudo);
#  2. builds with -Werror into build-ci and runs ctest;
#  3. builds with ASan+UBSan into build-ci-asan and runs ctest again;
#  4. prints "tests: N passed, N failed" and exits non-zero on any failure.
# Environment: TB_JOBS (parallel build jobs, default: nproc),
#              TB_CTEST_JOBS (parallel tests, default 2).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=${TB_JOBS:-$(nproc 2>/dev/null || echo 2)}
ctest_jobs=${TB_CTEST_JOBS:-2}

packages=(libuv1-dev libprotobuf-c-dev protobuf-c-compiler libcmocka-dev
          libdlpack-dev uthash-dev libcjson-dev python3-numpy python3-dev
          cmake gcc pkg-config)

install_missing() {
  local missing=() p
  for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "run.sh: installing ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      echo "run.sh: missing packages ${missing[*]} and not root; install them first" >&2
      return 1
    fi
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

if command -v dpkg-query >/dev/null 2>&1; then
  install_missing
fi

passed=0
failed=0

# run_stage NAME BUILD_DIR CMAKE_ARGS...: configure, build, ctest; add the
# counts to the totals. A configure or build failure counts as one failure.
run_stage() {
  local name=$1 dir=$2 log rc
  shift 2
  echo "==== $name: configure and build in $dir"
  if ! cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"; then
    echo "run.sh: $name: configure failed" >&2
    failed=$((failed + 1))
    return 0
  fi
  if ! cmake --build "$dir" -j "$jobs"; then
    echo "run.sh: $name: build failed" >&2
    failed=$((failed + 1))
    return 0
  fi
  echo "==== $name: ctest"
  log=$(mktemp)
  rc=0
  (cd "$dir" && ctest --output-on-failure -j "$ctest_jobs") 2>&1 | tee "$log" || rc=$?
  # "100% tests passed, 0 tests failed out of 42"
  local line total nfail
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1 || true)
  rm -f "$log"
  if [ -z "$line" ]; then
    echo "run.sh: $name: ctest gave no summary (rc $rc)" >&2
    failed=$((failed + 1))
    return 0
  fi
  nfail=$(sed -E 's/.*tests passed, ([0-9]+) tests? failed.*/\1/' <<<"$line")
  total=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")
  passed=$((passed + total - nfail))
  failed=$((failed + nfail))
  if [ "$rc" -ne 0 ] && [ "$nfail" -eq 0 ]; then
    failed=$((failed + 1))
  fi
}

run_stage "werror" "$root/build-ci" -DTB_WERROR=ON -DTB_SANITIZE=OFF

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run_stage "asan+ubsan" "$root/build-ci-asan" -DTB_WERROR=ON -DTB_SANITIZE=ON

echo "tests: $passed passed, $failed failed"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
