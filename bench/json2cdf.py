#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Print the latency distributions of one tb-bench JSON section as gnuplot
data blocks (one per row with a 'cdf', separated by two blank lines, each
starting with its quoted name), or with 'count' just how many there are.

  json2cdf.py FILE SECTION [count] [MATCH]

MATCH keeps only rows whose name contains it; "a|b" keeps those containing
either, a leading "!" keeps the others instead, and "x&y" keeps the rows
that pass both x and y (e.g. "cold|open&!polling")."""
import json
import signal
import sys


def matches(name, match):
    if "&" in match:
        return all(matches(name, m) for m in match.split("&"))
    if not match:
        return True
    negate = match.startswith("!")
    alts = (match[1:] if negate else match).split("|")
    return any(a in name for a in alts) != negate


def rows(path, section, match):
    with open(path) as f:
        d = json.load(f)
    for s in d.get("sections", []):
        if s.get("id") != section:
            continue
        for r in s.get("rows", []):
            if "cdf" in r and matches(r["name"], match):
                yield r


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    # gnuplot stops reading once it has the block it wants.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    path, section = sys.argv[1], sys.argv[2]
    rest = sys.argv[3:]
    count = bool(rest) and rest[0] == "count"
    if count:
        rest = rest[1:]
    match = rest[0] if rest else ""
    rs = list(rows(path, section, match))
    if count:
        print(len(rs))
        return
    for r in rs:
        print('"%s"' % r["name"].replace('"', "'"))
        for q, us in r["cdf"]:
            print(us, q)
        print("\n")


if __name__ == "__main__":
    main()
