#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Prepare a build folder to be carried to the GPU machine (Ubuntu 24.04 with
# CUDA, but without libuv, protobuf-c, cmocka or cJSON and without network).
#
#   tests/gpu/prepare-carry.sh [BUILD_DIR]      (default: <repo>/build-gpu)
#
# Builds everything, then copies into BUILD_DIR/carry-libs every shared
# library the built programs need that is not part of the base system
# (libuv.so.1, libprotobuf-c.so.1, libcmocka.so.0, libcjson.so.1), and
# records the absolute source and build paths in carry-libs/ORIGIN so that
# run-on-gpu.sh can rewrite ctest's files when the tree lands elsewhere.
# Deletes the object files and static libraries (but the client's objects)
# and strips the debug sections of the test and benchmark programs, so that
# the folder fits the run tool's 64 MiB; a build folder of its own.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-$src/build-gpu}
[ -f "$build/CMakeCache.txt" ] || cmake -S "$src" -B "$build" -G Ninja
build=$(cd "$build" && pwd)
cmake --build "$build" -j "$(nproc)"

carry="$build/carry-libs"
rm -rf "$carry"
mkdir -p "$carry"
# every ELF program or library in the build
find "$build" -type f \( -perm -u+x -o -name '*.so*' \) ! -path "$carry/*" \
  -exec sh -c 'head -c 4 "$1" | grep -q ELF' _ {} \; -print >"$carry/.elves"
while read -r f; do
  ldd "$f" 2>/dev/null | awk '/=> \//{print $3}'
done <"$carry/.elves" | sort -u | grep -E 'lib(uv|protobuf-c|cmocka|cjson|inih)\.so' \
  >"$carry/.needed" || true
rm -f "$carry/.elves"
while read -r lib; do
  # keep the soname the programs ask for; copy the real file behind it
  cp -L "$lib" "$carry/$(basename "$lib")"
done <"$carry/.needed"
rm -f "$carry/.needed"
for want in libuv.so.1 libprotobuf-c.so.1 libcmocka.so.0; do
  [ -f "$carry/$want" ] || { echo "prepare-carry: $want not found" >&2; exit 1; }
done
printf 'src=%s\nbuild=%s\n' "$src" "$build" >"$carry/ORIGIN"
# the run tool carries 64 MiB at most: the object files and static
# libraries stay here, but for the client library's objects, which
# docs_client_layers reads (nm); the next build here makes them again
find "$build" \( -name '*.o' -o -name '*.a' \) \
  ! -path "$build/client/CMakeFiles/tensorbroker_static.dir/*" -delete
# and the tests' and benchmarks' programs lose their debug sections (their
# symbols stay, for backtraces): with the source tree they were over 64 MiB
for dir in tests bench examples; do
  [ -d "$build/$dir" ] || continue
  find "$build/$dir" -type f -perm -u+x \
    -exec sh -c 'head -c 4 "$1" | grep -q ELF && strip --strip-debug "$1"' _ {} \;
done
echo "prepare-carry: $(ls "$carry" | tr '\n' ' ')"
echo "prepare-carry: build folder is $(du -sh "$build" | cut -f1); carry it" \
  "(e.g. run's carry: [\"$(basename "$build")\"]) and run" \
  "tests/gpu/run-on-gpu.sh $(basename "$build") there"
