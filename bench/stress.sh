#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The long forms of the chaos and load tests (docs/testing.md, "Chaos and
# load, long"): the programs ctest runs for seconds (tests/chaos/chaos,
# tests/chaos/load), run for as long as asked, their figures printed at the
# end and the run failing as they fail.
#
# usage: bench/stress.sh [BUILD_DIR]        (default: build)
# environment, with the defaults of a run of about 20 minutes on 2 cores:
#   STRESS_SEED      seed of both (default: from the clock; printed)
#   STRESS_FRAMES    checksummed frames the chaos run verifies (3000000)
#   STRESS_PRODUCERS, STRESS_CONSUMERS   chaos processes (4, 8)
#   STRESS_KILL_EVERY  frames between kills on average (200)
#   STRESS_CLIENTS   load clients (1000)
#   STRESS_SECONDS   load seconds a round (60)
#   STRESS_ROUNDS    load rounds on one daemon (10): VmRSS after the last
#                    must be within 1 MiB of after the first
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build}
seed=${STRESS_SEED:-$(date +%s)}
for p in "$build/tests/chaos/chaos" "$build/tests/chaos/load" \
         "$build/daemon/tensorbrokerd"; do
  if [ ! -x "$p" ]; then
    echo "stress.sh: $p missing: build $build first" >&2
    exit 2
  fi
done
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export TB_DAEMON="$build/daemon/tensorbrokerd"
rc=0

echo "==== chaos, seed $seed"
TB_CHAOS_SEED=$seed \
TB_CHAOS_FRAMES=${STRESS_FRAMES:-3000000} \
TB_CHAOS_PRODUCERS=${STRESS_PRODUCERS:-4} \
TB_CHAOS_CONSUMERS=${STRESS_CONSUMERS:-8} \
TB_CHAOS_KILL_EVERY=${STRESS_KILL_EVERY:-200} \
  "$build/tests/chaos/chaos" 2>&1 | tee -a "$log" || rc=1

echo "==== load, seed $seed"
TB_LOAD_SEED=$seed \
TB_LOAD_CLIENTS=${STRESS_CLIENTS:-1000} \
TB_LOAD_SECONDS=${STRESS_SECONDS:-60} \
TB_LOAD_ROUNDS=${STRESS_ROUNDS:-10} \
  "$build/tests/chaos/load" 2>&1 | tee -a "$log" || rc=1

echo "==== figures"
grep -E '^(chaos|load): ' "$log" || true
if [ "$rc" -ne 0 ]; then
  echo "stress.sh: FAILED (seed $seed)"
fi
exit "$rc"
