#!/usr/bin/env bash
# tensorbroker quickstart: on a fresh Debian 12 machine, install what is
# missing, build, start a private daemon, run one producer and two
# consumers exchanging frames (checksums verified), show the sessions, stop.
#
#   deploy/quickstart.sh [FRAMES]        (default 1000 frames of 1 MiB)
#
# Nothing is installed system-wide except the Debian build dependencies;
# the daemon listens on a socket in a private temporary directory and is
# stopped (and the directory removed) however the script ends.
set -euo pipefail

FRAMES="${1:-${TB_QUICKSTART_FRAMES:-1000}}"
case "$FRAMES" in
  ''|*[!0-9]*|0) echo "usage: $0 [FRAMES]  (a positive number)" >&2; exit 2 ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build"

say() { printf '\n==> %s\n' "$*"; }

# ---- 1. dependencies ------------------------------------------------------
PKGS=(cmake gcc make pkg-config libuv1-dev libprotobuf-c-dev
      protobuf-c-compiler libcmocka-dev libdlpack-dev uthash-dev
      libcjson-dev)
missing=()
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

# ---- 2. build ---------------------------------------------------------------
say "building into $BUILD (Release)"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTB_BUILD_TESTS=OFF \
      -DTB_BUILD_EXAMPLES=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target tensorbrokerd tbctl \
      tb_example_producer tb_example_consumer >/dev/null
DAEMON="$BUILD/daemon/tensorbrokerd"
TBCTL="$BUILD/client/tbctl"
PRODUCER="$BUILD/examples/producer"
CONSUMER="$BUILD/examples/consumer"

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
mkfifo "$TMP/daemon.ready" "$TMP/c1.ready" "$TMP/c2.ready" "$TMP/p.ready"
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
say "exchanging $FRAMES frames: 1 producer, 2 consumers (host memory, zero copy)"
"$CONSUMER" --channel quickstart/frames --ready-fd 4 4>"$TMP/c1.ready" \
  >"$TMP/c1.out" &
C1=$!; PIDS+=("$C1")
"$CONSUMER" --channel quickstart/frames --ready-fd 4 4>"$TMP/c2.ready" \
  >"$TMP/c2.out" &
C2=$!; PIDS+=("$C2")
read -r _ <"$TMP/c1.ready" || true
read -r _ <"$TMP/c2.ready" || true
"$PRODUCER" --channel quickstart/frames --frames "$FRAMES" --ready-fd 4 \
  4>"$TMP/p.ready" >"$TMP/p.out" &
P=$!; PIDS+=("$P")
read -r _ <"$TMP/p.ready" || true

say "tbctl sessions (while they are connected)"
"$TBCTL" sessions || true

status=0
wait "$P" || status=1
wait "$C1" || status=1
wait "$C2" || status=1
PIDS=()

say "results"
cat "$TMP/p.out" "$TMP/c1.out" "$TMP/c2.out"
"$TBCTL" channels

# ---- 5. CUDA -----------------------------------------------------------------
# The examples exchange host memory only; the CUDA path is exercised by the
# GPU tests (tests/gpu, docs/gpu-validation.md).

say "stopping the daemon"
kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID" || true
DAEMON_PID=""

if [ "$status" -ne 0 ]; then
  echo "quickstart FAILED (see the lines above)" >&2
  exit 1
fi
echo "quickstart OK: every frame each consumer received had a valid checksum"
