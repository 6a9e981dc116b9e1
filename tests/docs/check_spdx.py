#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every source file in the repository carries an SPDX licence line.

    check_spdx.py REPO_ROOT [--add]

Source files: C, CUDA, protobuf, Python, shell, CMake and the build inputs
(*.in, the linker map, the gnuplot script, pyproject.toml, debian/rules,
.ci/run). The line must sit in the first three lines ("SPDX-License-
Identifier: Apache-2.0", in the file's comment syntax). With --add, files
that lack it get it (after a shebang line); without, the missing ones are
listed and the exit status is 1. Files are the ones git tracks, or every
file under the root when it is no git checkout."""
import os
import subprocess
import sys

TAG = "SPDX-License-Identifier: Apache-2.0"
C_STYLE = (".c", ".h", ".cu", ".proto", ".map", ".h.in")
HASH_STYLE = (".py", ".sh", ".cmake", ".cmake.in", ".pc.in", ".gp", ".toml")
SKIP_DIRS = ("tests/fuzz/corpus/", "docs/", ".git/")


def style(path):
    base = os.path.basename(path)
    if any(path.endswith(e) for e in C_STYLE):
        return "c"
    if any(path.endswith(e) for e in HASH_STYLE):
        return "#"
    if base == "CMakeLists.txt" or path in ("debian/rules", ".ci/run"):
        return "#"
    return None


def files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], check=True,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True).stdout.split()
        if out:
            return out
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(".") and not x.startswith("build")]
        for n in names:
            found.append(os.path.relpath(os.path.join(d, n), root))
    return found


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    root, add = argv[1], "--add" in argv[2:]
    missing = []
    for rel in sorted(files(root)):
        if rel.startswith(SKIP_DIRS):
            continue
        st = style(rel)
        path = os.path.join(root, rel)
        if st is None or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        if any(TAG in line for line in lines[:3]):
            continue
        if not add:
            missing.append(rel)
            continue
        line = "/* %s */" % TAG if st == "c" else "# %s" % TAG
        at = 1 if lines and lines[0].startswith("#!") else 0
        lines.insert(at, line)
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
    for rel in missing:
        print("check_spdx: %s has no '%s' line" % (rel, TAG))
    print("check_spdx: %d file(s) without the licence line" % len(missing))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
