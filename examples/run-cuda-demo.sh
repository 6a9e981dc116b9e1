#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The examples' CUDA pipeline as a test: a private tensorbrokerd, one
# `producer --cuda` and two `consumer --cuda`, every frame's checksum
# verified by each consumer after copying it back from the GPU.
#
#   examples/run-cuda-demo.sh DAEMON PRODUCER CONSUMER [FRAMES]
#
# Exit status: 0 passed, 77 skipped (no CUDA driver or GPU: `producer
# --cuda-check` exited 3), 1 failed. ctest runs it as example_cuda_demo.
set -u

if [ $# -lt 3 ] || [ $# -gt 4 ]; then
  echo "usage: $0 DAEMON PRODUCER CONSUMER [FRAMES]" >&2
  exit 2
fi
DAEMON=$1 PRODUCER=$2 CONSUMER=$3 FRAMES=${4:-50}
case "$FRAMES" in
  ''|*[!0-9]*|0) echo "$0: FRAMES must be a positive number" >&2; exit 2 ;;
esac

why=$("$PRODUCER" --cuda-check 2>&1)
case $? in
  0) ;;
  3) echo "skipped: $why"; exit 77 ;;
  *) echo "FAIL: producer --cuda-check: $why" >&2; exit 1 ;;
esac

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tb-cuda-demo.XXXXXX") || exit 1
DAEMON_PID="" P="" C1="" C2=""
cleanup() {
  for p in $P $C1 $C2; do kill "$p" 2>/dev/null; done
  if [ -n "$DAEMON_PID" ]; then
    kill -TERM "$DAEMON_PID" 2>/dev/null
    wait "$DAEMON_PID" 2>/dev/null
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

SOCK="$TMP/tb.sock"
CHANNEL=cuda-demo/frames
mkfifo "$TMP/daemon.ready" "$TMP/c1.ready" "$TMP/c2.ready" "$TMP/hold" ||
  exit 1

"$DAEMON" --socket "$SOCK" --log-level warn --ready-fd 3 \
  3>"$TMP/daemon.ready" 2>"$TMP/daemon.log" &
DAEMON_PID=$!
# Blocks until the daemon opens the fifo; end-of-file if it dies first.
read -r line <"$TMP/daemon.ready"
if [ "${line:-}" != READY ]; then
  echo "FAIL: tensorbrokerd did not start:" >&2
  cat "$TMP/daemon.log" >&2
  exit 1
fi

"$CONSUMER" --socket "$SOCK" --channel "$CHANNEL" --cuda --timeout 20000 \
  --ready-fd 4 4>"$TMP/c1.ready" >"$TMP/c1.out" 2>"$TMP/c1.err" &
C1=$!
"$CONSUMER" --socket "$SOCK" --channel "$CHANNEL" --cuda --timeout 20000 \
  --ready-fd 4 4>"$TMP/c2.ready" >"$TMP/c2.out" 2>"$TMP/c2.err" &
C2=$!
read -r _ <"$TMP/c1.ready"
read -r _ <"$TMP/c2.ready"

# CUDA memory lives only as long as its producer: it keeps the channel
# (--hold-fd) until we close our end of the hold fifo, after the consumers.
"$PRODUCER" --socket "$SOCK" --channel "$CHANNEL" --cuda --frames "$FRAMES" \
  --ring 4 --hold-fd 5 5<"$TMP/hold" >"$TMP/p.out" 2>"$TMP/p.err" &
P=$!
exec 6>"$TMP/hold" # pairs with the producer's open of the read end

status=0
wait "$C1" || { echo "FAIL: consumer 1 exited $?" >&2; status=1; }
wait "$C2" || { echo "FAIL: consumer 2 exited $?" >&2; status=1; }
C1="" C2=""
exec 6>&-
wait "$P" || { echo "FAIL: producer exited $?" >&2; status=1; }
P=""

cat "$TMP/p.out" "$TMP/c1.out" "$TMP/c2.out"
for f in p c1 c2; do
  [ -s "$TMP/$f.err" ] && sed "s/^/$f: /" "$TMP/$f.err" >&2
done
# Each consumer must have seen the producer's frames with good checksums.
for f in c1 c2; do
  grep -q ' frames, 0 bad checksums' "$TMP/$f.out" ||
    { echo "FAIL: $f did not verify its frames" >&2; status=1; }
done
[ -s "$TMP/daemon.log" ] && sed 's/^/daemon: /' "$TMP/daemon.log" >&2
[ "$status" -eq 0 ] && echo "PASS: CUDA demo, $FRAMES frames, 2 consumers"
exit "$status"
