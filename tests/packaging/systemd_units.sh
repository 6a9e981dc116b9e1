#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# deploy/systemd's units as systemd reads them, without systemd running:
#   systemd-analyze verify   no error and no warning (an unknown key is only
#                            a warning, exit 0: any output fails the test)
#   systemd-analyze security the service's exposure 2.0 or lower ("OK" or
#                            better; docs/deploy.md records the score)
# on a copy whose ExecStart= is the daemon just built (verify checks that
# the program exists). Exits 77 without systemd-analyze.
# usage: systemd_units.sh SOURCE_DIR DAEMON
set -eu
src=$1
daemon=$2
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIP: no systemd-analyze (Debian: systemd)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$src/deploy/systemd/tensorbroker.socket" "$tmp/"
sed "s#^ExecStart=/usr/bin/tensorbrokerd#ExecStart=$daemon#" \
  "$src/deploy/systemd/tensorbroker.service" > "$tmp/tensorbroker.service"
grep -q "^ExecStart=$daemon\$" "$tmp/tensorbroker.service" || {
  echo "FAIL: tensorbroker.service has no ExecStart=/usr/bin/tensorbrokerd"
  exit 1
}
fail=0
cd "$tmp"
# --man=no: the man page is not installed here
if ! out=$(systemd-analyze verify --man=no ./tensorbroker.socket \
             ./tensorbroker.service 2>&1); then
  echo "FAIL: systemd-analyze verify:"; echo "$out"; fail=1
elif [ -n "$out" ]; then
  echo "FAIL: systemd-analyze verify warns:"; echo "$out"; fail=1
else
  echo "ok   systemd-analyze verify: no error, no warning"
fi
# --threshold is in tenths: 20 is an exposure of 2.0
if out=$(systemd-analyze security --offline=true --threshold=20 \
           ./tensorbroker.service 2>&1); then
  echo "ok   $(echo "$out" | tail -n 1)"
else
  echo "FAIL: exposure above 2.0:"; echo "$out"; fail=1
fi
exit $fail
