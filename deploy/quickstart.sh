#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tensorbroker quickstart: on a fresh Debian 12 machine, install what is
# missing, build, start a private daemon, run one producer and two
# consumers exchanging frames in host memory (checksums verified), show the
# sessions; then, if a GPU is usable, the same pipeline in CUDA device
# memory; stop.
#
#   deploy/quickstart.sh [--no-build BUILD_DIR] [FRAMES]
#                                        (default 1000 frames of 1 MiB)
#
# --no-build BUILD_DIR (or QUICKSTART_BUILD=BUILD_DIR) skips the package
# check and the build and uses the programs already built in BUILD_DIR
# (for a machine without network, where a build folder was carried; its
# carry-libs/, if any, and client/ are put on LD_LIBRARY_PATH).
#
# Nothing is installed system-wide except the Debian build dependencies;
# the daemon listens on a socket in a private temporary directory and is
# stopped (and the directory removed) however the script ends.
set -euo pipefail

usage() {
  echo "usage: $0 [--no-build BUILD_DIR] [FRAMES]  (FRAMES a positive number)" >&2
  exit 2
}
NO_BUILD="${QUICKSTART_BUILD:-}"
FRAMES="${TB_QUICKSTART_FRAMES:-1000}"
while (($#)); do
  case "$1" in
    --no-build) (($# >= 2)) || usage; NO_BUILD="$2"; shift 2 ;;
    --no-build=*) NO_BUILD="${1#--no-build=}"; shift ;;
    -h|--help) usage ;;
    -*) usage ;;
    *) FRAMES="$1"; shift ;;
  esac
done
case "$FRAMES" in
  ''|*[!0-9]*|0) usage ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build"

say() { printf '\n==> %s\n' "$*"; }

# ---- 1. dependencies ------------------------------------------------------
install_deps() {
  local p
  local PKGS=(cmake gcc make pkg-config libuv1-dev libprotobuf-c-dev
              protobuf-c-compiler libcmocka-dev libdlpack-dev uthash-dev
              libcjson-dev libinih-dev)
  local missing=()
  for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$p")
    fi
  done
  if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    SUDO=()
    if [ "$(id -u)" -ne 0 ]; then
      command -v sudo >/dev/null || { echo "need root or sudo to install: ${missing[*]}" >&2; exit 1; }
      SUDO=(sudo)
    fi
    "${SUDO[@]}" apt-get update
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
  else
    say "dependencies already installed"
  fi
}

# ---- 2. build ---------------------------------------------------------------
build() {
  say "building into $BUILD (Release)"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTB_BUILD_TESTS=OFF \
        -DTB_BUILD_EXAMPLES=ON >/dev/null
  cmake --build "$BUILD" -j"$(nproc)" --target tensorbrokerd tbctl \
        tb_example_producer tb_example_consumer >/dev/null
}

# --no-build: an existing build folder instead of 1 and 2.
use_build() {
  case "$NO_BUILD" in
    /*) BUILD="$NO_BUILD" ;;
    *) if [ -d "$NO_BUILD" ]; then BUILD="$PWD/$NO_BUILD"; else BUILD="$ROOT/$NO_BUILD"; fi ;;
  esac
  [ -d "$BUILD" ] || { echo "--no-build: no directory $NO_BUILD" >&2; exit 1; }
  BUILD="$(cd "$BUILD" && pwd)"
  local d
  for d in "$BUILD/carry-libs" "$BUILD/client"; do
    if [ -d "$d" ]; then
      export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
  done
  say "using the build in $BUILD (no package check, no build)"
}

if [ -n "$NO_BUILD" ]; then
  use_build
else
  install_deps
  build
fi
DAEMON="$BUILD/daemon/tensorbrokerd"
TBCTL="$BUILD/tools/tbctl"
PRODUCER="$BUILD/examples/producer"
CONSUMER="$BUILD/examples/consumer"
for prog in "$DAEMON" "$TBCTL" "$PRODUCER" "$CONSUMER"; do
  [ -x "$prog" ] || { echo "missing $prog: build it first" >&2; exit 1; }
done

# ---- 3. a private daemon ----------------------------------------------------
TMP="$(mktemp -d -t tensorbroker-quickstart.XXXXXX)"
PIDS=()
DAEMON_PID=""
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ -n "$DAEMON_PID" ]; then
    kill -TERM "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export TENSORBROKER_SOCKET="$TMP/tensorbroker.sock"
say "starting tensorbrokerd on $TENSORBROKER_SOCKET"
mkfifo "$TMP/daemon.ready"
# Embedded defaults; --ready-fd writes READY once the socket listens.
"$DAEMON" --socket "$TENSORBROKER_SOCKET" --log-level warn --ready-fd 3 \
  3>"$TMP/daemon.ready" 2>"$TMP/daemon.log" &
DAEMON_PID=$!
# Opening the fifo for reading blocks until the daemon opens it to write; if
# it dies first, the read sees end-of-file and the check below fails.
read -r line <"$TMP/daemon.ready" || true
if [ "${line:-}" != READY ]; then
  echo "tensorbrokerd did not start:" >&2; cat "$TMP/daemon.log" >&2; exit 1
fi
"$TBCTL" status

# ---- 4. one producer, two consumers -------------------------------------------
# run_pipeline TAG CHANNEL [--cuda]: start two consumers, wait until both
# are connected, start the producer, show the sessions, wait for all three
# and print their result lines. Returns 0 when all three exited 0.
run_pipeline() {
  local tag="$1" channel="$2" mode=("${@:3}") rc=0 c1 c2 p
  local cargs=()
  [ ${#mode[@]} -eq 0 ] || cargs=(--timeout 30000) # first CUDA use is slow
  mkfifo "$TMP/$tag.c1.ready" "$TMP/$tag.c2.ready" "$TMP/$tag.p.ready" \
         "$TMP/$tag.hold"
  "$CONSUMER" --channel "$channel" "${mode[@]}" "${cargs[@]}" --ready-fd 4 \
    4>"$TMP/$tag.c1.ready" >"$TMP/$tag.c1.out" &
  c1=$!; PIDS+=("$c1")
  "$CONSUMER" --channel "$channel" "${mode[@]}" "${cargs[@]}" --ready-fd 4 \
    4>"$TMP/$tag.c2.ready" >"$TMP/$tag.c2.out" &
  c2=$!; PIDS+=("$c2")
  read -r _ <"$TMP/$tag.c1.ready" || true
  read -r _ <"$TMP/$tag.c2.ready" || true
  # The producer keeps its buffers and the channel (--hold-fd) until we
  # close our end of the hold fifo, after the consumers finished: CUDA
  # memory lives only as long as the process that allocated it.
  "$PRODUCER" --channel "$channel" --frames "$FRAMES" "${mode[@]}" \
    --hold-fd 5 --ready-fd 4 5<"$TMP/$tag.hold" 4>"$TMP/$tag.p.ready" \
    >"$TMP/$tag.p.out" &
  p=$!; PIDS+=("$p")
  exec 6>"$TMP/$tag.hold" # pairs with the producer's open of the read end
  read -r _ <"$TMP/$tag.p.ready" || true

  say "tbctl sessions (while they are connected)"
  "$TBCTL" sessions 6>&- || true
  say "tbctl buffers (each buffer's memory kind)"
  "$TBCTL" buffers 6>&- || true

  wait "$c1" || rc=1
  wait "$c2" || rc=1
  exec 6>&-
  wait "$p" || rc=1
  PIDS=()

  say "results"
  cat "$TMP/$tag.p.out" "$TMP/$tag.c1.out" "$TMP/$tag.c2.out"
  "$TBCTL" channels
  return "$rc"
}

say "exchanging $FRAMES frames: 1 producer, 2 consumers (host memory, zero copy)"
status=0
run_pipeline host quickstart/frames || status=1

# ---- 5. CUDA -----------------------------------------------------------------
# The same pipeline in device memory on GPU 0 where a GPU is usable:
# `producer --cuda-check` exits 0 then, 3 when there is no CUDA driver or
# GPU (and says why).
cuda_ran=0
set +e
why="$("$PRODUCER" --cuda-check 2>&1)"
cuda_rc=$?
set -e
case "$cuda_rc" in
  0)
    say "exchanging $FRAMES frames: 1 producer, 2 consumers (CUDA device memory, zero copy)"
    cuda_ran=1
    run_pipeline cuda quickstart/cuda-frames --cuda || status=1
    ;;
  3)
    say "no GPU: CUDA demo skipped (host demo above is the whole demo here)"
    echo "    ($why)"
    ;;
  *)
    say "CUDA check failed (exit $cuda_rc): $why"
    status=1
    ;;
esac

say "stopping the daemon"
kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID" || true
DAEMON_PID=""

if [ "$status" -ne 0 ]; then
  echo "quickstart FAILED (see the lines above)" >&2
  exit 1
fi
if [ "$cuda_ran" -eq 1 ]; then
  echo "quickstart OK: every frame each consumer received had a valid checksum (host and CUDA)"
else
  echo "quickstart OK: every frame each consumer received had a valid checksum"
fi
