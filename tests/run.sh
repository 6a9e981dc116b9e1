#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite, as CI runs it (README: `tests/run.sh`).
#  1. installs missing Debian packages (as root, or through sudo);
#  2. builds with -Werror into build-ci and runs ctest;
#  3. builds with ASan+UBSan into build-ci-asan and runs ctest again;
#  4. builds with ThreadSanitizer into build-ci-tsan and runs the C tests;
#  5. builds the libFuzzer targets with clang into build-ci-fuzz and runs
#     each for TB_FUZZ_SECONDS under ASan+UBSan (docs/testing.md);
#  6. prints "tests: N passed, N failed" and exits non-zero on any failure.
# Environment: TB_JOBS (parallel build jobs, default: nproc),
#              TB_CTEST_JOBS (parallel tests, default 2),
#              TB_FUZZ_SECONDS (per fuzz target, default 15; 0: skip 5).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=${TB_JOBS:-$(nproc 2>/dev/null || echo 2)}
ctest_jobs=${TB_CTEST_JOBS:-2}

packages=(libuv1-dev libprotobuf-c-dev protobuf-c-compiler libcmocka-dev
          libdlpack-dev uthash-dev libcjson-dev libinih-dev python3-numpy
          python3-dev
          cmake gcc pkg-config
          clang libclang-rt-14-dev # libFuzzer (Debian 12's clang is 14)
          scdoc python3-venv python3-setuptools python3-wheel python3-yaml
          python3-prometheus-client # python_metrics parses the exposition
          python3-torch # python_torch_host: Debian's CPU PyTorch (1.13) on both sides
          build-essential debhelper dh-python lintian adduser
          # the daemon's systemd support; systemd-socket-activate and
          # systemd-analyze for its tests
          libsystemd-dev systemd)

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
skipped=0

# build NAME BUILD_DIR CMAKE_ARGS...: configure and build. A failure counts
# as one failed test and returns 1.
build() {
  local name=$1 dir=$2
  shift 2
  echo "==== $name: configure and build in $dir"
  if ! cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"; then
    echo "run.sh: $name: configure failed" >&2
    failed=$((failed + 1))
    return 1
  fi
  if ! cmake --build "$dir" -j "$jobs"; then
    echo "run.sh: $name: build failed" >&2
    failed=$((failed + 1))
    return 1
  fi
}

# run_ctest NAME BUILD_DIR CTEST_ARGS...: run ctest and add its counts to
# the totals. "No tests were found" counts as nothing.
run_ctest() {
  local name=$1 dir=$2 log rc=0 line total nfail nskip
  shift 2
  echo "==== $name: ctest $*"
  log=$(mktemp)
  (cd "$dir" && ctest --output-on-failure -j "$ctest_jobs" "$@") 2>&1 | tee "$log" || rc=$?
  # "100% tests passed, 0 tests failed out of 42"
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1 || true)
  if [ -z "$line" ]; then
    if grep -q 'No tests were found' "$log" && [ "$rc" -eq 0 ]; then
      rm -f "$log"
      return 0
    fi
    rm -f "$log"
    echo "run.sh: $name: ctest gave no summary (rc $rc)" >&2
    failed=$((failed + 1))
    return 0
  fi
  # skipped tests (exit 77: no GPU here) are listed, not counted as passed
  nskip=$(grep -cE '^[[:space:]]+[0-9]+ - .* \(Skipped\)$' "$log" || true)
  rm -f "$log"
  nfail=$(sed -E 's/.*tests passed, ([0-9]+) tests? failed.*/\1/' <<<"$line")
  total=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")
  passed=$((passed + total - nfail - nskip))
  skipped=$((skipped + nskip))
  failed=$((failed + nfail))
  if [ "$rc" -ne 0 ] && [ "$nfail" -eq 0 ]; then
    failed=$((failed + 1))
  fi
}

# (a) warnings are errors
if build "werror" "$root/build-ci" -DTB_WERROR=ON -DTB_SANITIZE=OFF; then
  run_ctest "werror" "$root/build-ci"
fi

# (b) AddressSanitizer + UndefinedBehaviorSanitizer, leaks checked
if build "asan+ubsan" "$root/build-ci-asan" -DTB_WERROR=ON -DTB_SANITIZE=ON; then
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_ctest "asan+ubsan" "$root/build-ci-asan" -LE python
  # The Python tests load the instrumented extension into an uninstrumented
  # interpreter: the ASan runtime must be preloaded, and CPython's own
  # by-design leaks at exit are not ours to report. libstdc++ is preloaded
  # with it so that ASan's __cxa_throw interceptor finds the real one: a
  # C++ exception in PyTorch (torch.from_dlpack refusing a dtype) otherwise
  # fails ASan's CHECK "real___cxa_throw != 0" and aborts the test.
  libasan=$(${CC:-gcc} -print-file-name=libasan.so)
  libstdcxx=$(${CC:-gcc} -print-file-name=libstdc++.so.6)
  LD_PRELOAD="$libasan $libstdcxx" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_ctest "asan+ubsan python" "$root/build-ci-asan" -L python
fi

# (c) ThreadSanitizer, the C tests: the library's deleters run on any
# thread. (The Python tests would need the TSan runtime preloaded into the
# interpreter; they run under ASan above.)
if build "tsan" "$root/build-ci-tsan" -DTB_WERROR=ON -DTB_SANITIZE=thread \
     -DTB_BUILD_EXAMPLES=OFF; then
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    run_ctest "tsan" "$root/build-ci-tsan" -LE python
fi

# (d) the libFuzzer targets (tests/fuzz), each for TB_FUZZ_SECONDS from its
# seed corpus, under ASan+UBSan; only clang builds them. What they find is
# written to build-ci-fuzz/tests/fuzz/artifacts/.
fuzz_seconds=${TB_FUZZ_SECONDS:-15}
if [ "$fuzz_seconds" -gt 0 ]; then
  fuzz_dir="$root/build-ci-fuzz"
  echo "==== fuzz: configure and build in $fuzz_dir"
  if ! command -v clang >/dev/null 2>&1; then
    echo "run.sh: fuzz: no clang" >&2
    failed=$((failed + 1))
  elif ! CC=clang cmake -S "$root" -B "$fuzz_dir" \
         -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTB_SANITIZE=OFF \
         -DTB_BUILD_EXAMPLES=OFF -DTB_BUILD_BENCH=OFF \
         -DTB_FUZZ_SECONDS="$fuzz_seconds" ||
       ! cmake --build "$fuzz_dir" -j "$jobs" --target fuzz_request \
         fuzz_server_message fuzz_layout fuzz_daemon; then
    echo "run.sh: fuzz: configure or build failed" >&2
    failed=$((failed + 1))
  else
    run_ctest "fuzz" "$fuzz_dir" -L fuzzing
  fi
fi

echo "skipped: $skipped (tests that need a GPU or tools this machine lacks)"
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
