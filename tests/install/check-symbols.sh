#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# install_symbols: libtensorbroker.so exports exactly the public API.
#   every dynamic symbol it defines starts with tb_ (not tb__), and is a
#   function declared TB_EXPORT in include/tensorbroker/*.h;
#   every TB_EXPORT function of those headers is exported.
# usage: check-symbols.sh LIBTENSORBROKER_SO INCLUDE_DIR [NM [CC]]
set -eu
so=$1 inc=$2 nm=${3:-nm} cc=${4:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$nm" -D --defined-only "$so" | awk 'NF == 3 { print $3 }' |
  sed 's/@.*//' | sort -u >"$tmp/exported"
# TB_EXPORT declarations: the headers without comments (the compiler's
# -fpreprocessed -E removes them and expands nothing) and without
# preprocessor lines, one declaration per line; the name is the identifier before the first '('.
for h in "$inc"/tensorbroker/*.h; do
  "$cc" -fpreprocessed -dD -E -P -w -x c "$h"
done | grep -v '^[[:space:]]*#' | tr '\n' ' ' | tr ';' '\n' | grep 'TB_EXPORT' |
  sed -n 's/^[^(]*[^A-Za-z0-9_(]\([A-Za-z_][A-Za-z0-9_]*\) *(.*/\1/p' |
  sort -u >"$tmp/declared"

fail=0
n=$(wc -l <"$tmp/exported")
d=$(wc -l <"$tmp/declared")
echo "exported: $n symbols; declared TB_EXPORT: $d functions"
if [ "$d" -lt 10 ]; then
  echo "FAIL: found only $d TB_EXPORT declarations in $inc: the parser is broken"
  exit 1
fi
bad=$(grep -v '^tb_[a-z]' "$tmp/exported" || true)
if [ -n "$bad" ]; then
  echo "FAIL: exported, not a public tb_ name ($(echo "$bad" | wc -l)):"
  echo "$bad" | head -20 | sed 's/^/  /'
  fail=1
fi
extra=$(comm -23 "$tmp/exported" "$tmp/declared" | grep '^tb_[a-z]' || true)
if [ -n "$extra" ]; then
  echo "FAIL: exported but not declared TB_EXPORT in the public headers:"
  echo "$extra" | sed 's/^/  /'
  fail=1
fi
missing=$(comm -13 "$tmp/exported" "$tmp/declared")
if [ -n "$missing" ]; then
  echo "FAIL: declared TB_EXPORT but not exported:"
  echo "$missing" | sed 's/^/  /'
  fail=1
fi
[ "$fail" -eq 0 ] && echo "OK: exactly the $d public functions are exported"
exit "$fail"
