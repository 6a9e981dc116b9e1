#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# docs_readme_minimal: the C program README.md shows under "## A C example"
# (its first ```c block) is examples/minimal.c, byte for byte but for the
# file's SPDX licence line, so the README shows what the build compiles and
# install_consumers runs.
# usage: check-readme.sh SOURCE_DIR
set -eu
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
awk '
  /^## / { in_section = ($0 == "## A C example") ; next }
  in_section && !done && /^```c[[:space:]]*$/ { in_block = 1; next }
  in_block && /^```[[:space:]]*$/ { in_block = 0; done = 1; next }
  in_block { print }
' "$src/README.md" >"$tmp/readme.c"
if [ ! -s "$tmp/readme.c" ]; then
  echo "FAIL: no \`\`\`c block under '## A C example' in README.md"
  exit 1
fi
grep -v '^/\* SPDX-License-Identifier: .* \*/$' "$src/examples/minimal.c" >"$tmp/minimal.c"
if ! diff -u "$tmp/readme.c" "$tmp/minimal.c" >"$tmp/diff"; then
  echo "FAIL: README.md's C example differs from examples/minimal.c:"
  sed -e "s|$tmp/readme.c|README.md (## A C example)|" \
      -e "s|$tmp/minimal.c|examples/minimal.c|" "$tmp/diff"
  exit 1
fi
echo "OK: README.md's C example is examples/minimal.c ($(wc -l <"$tmp/readme.c") lines)"
