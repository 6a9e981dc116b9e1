#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Check that every relative link in README.md and docs/*.md resolves.

  check_links.py [REPO_ROOT]        (default: two levels above this file)

A link is a markdown inline link or image, [text](target) or
![alt](target), or a reference definition, [id]: target. Links inside
fenced code blocks and inline code are not links. http:, https:, mailto:
and other scheme links, and pure #anchor links, are left alone. For the
rest, the path (relative to the file that holds the link) must exist; when
it names a markdown file and carries a #anchor, that file must have a
heading whose GitHub anchor is the anchor. Prints each broken link as
FILE:LINE: TARGET: WHY and exits 1 if there is any, else 0."""
import glob
import os
import re
import sys
import urllib.parse

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
# [text](target "title"), ![alt](target); the text may hold one level of
# brackets (a link around inline code with [] in it, an image in a link)
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s)]*)(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def slug(text):
    """GitHub's anchor for a heading: the rendered text, lower-cased, with
    everything but letters, digits, '_', '-' and spaces dropped and spaces
    turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def lines_outside_fences(path):
    """(line number, text) of each line outside fenced code blocks."""
    fence = None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = FENCE.match(line)
            if fence is None and m:
                fence = m.group(1)[0]
                continue
            if fence is not None:
                if m and m.group(1)[0] == fence:
                    fence = None
                continue
            yield n, line


_anchors = {}


def anchors(path):
    """The anchors of a markdown file's headings (a repeated heading gets
    -1, -2, ... as on GitHub)."""
    if path not in _anchors:
        seen = {}
        found = set()
        for _, line in lines_outside_fences(path):
            m = HEADING.match(line)
            if m:
                base = slug(m.group(2))
                k = seen.get(base, 0)
                seen[base] = k + 1
                found.add(base if k == 0 else "%s-%d" % (base, k))
        _anchors[path] = found
    return _anchors[path]


def targets(path):
    for n, line in lines_outside_fences(path):
        # inline code is not a link
        line = CODE_SPAN.sub(lambda c: " " * len(c.group(0)), line)
        for m in INLINE.finditer(line):
            yield n, m.group(1)
        m = REFDEF.match(line)
        if m:
            yield n, m.group(1)


def check(root, path):
    broken = []
    rel = os.path.relpath(path, root)
    for n, target in targets(path):
        target = target.strip("<>")
        if not target or target.startswith("#") or SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        file_part = urllib.parse.unquote(file_part)
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        if not os.path.exists(dest):
            broken.append("%s:%d: %s: no such file or directory" % (rel, n, target))
            continue
        if anchor and dest.endswith(".md") and os.path.isfile(dest):
            if anchor.lower() not in anchors(dest):
                broken.append("%s:%d: %s: no heading with anchor #%s in %s"
                              % (rel, n, target, anchor,
                                 os.path.relpath(dest, root)))
    return broken


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1
                           else os.path.join(here, "..", ".."))
    files = [os.path.join(root, "README.md")]
    files += sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    files = [f for f in files if os.path.isfile(f)]
    if not files:
        print("check_links: no README.md or docs/*.md under %s" % root)
        return 1
    broken = []
    for f in files:
        broken += check(root, f)
    for b in broken:
        print(b)
    print("check_links: %d file(s), %d broken link(s)" % (len(files), len(broken)))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
