#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The client library's files call each other without a cycle
(docs/internals.md, "Layers" under "The client library").

    check_client_layers.py CLIENT_SRC OBJ_DIR

OBJ_DIR holds the library's object files (one per client/**/*.c, as CMake
builds them); each one's defined and undefined symbols (nm) give the
file-level call graph: A -> B when A uses a symbol B defines. The check
fails when the graph has a cycle, when rpc.c (the RPC core) uses a symbol
of another client file, or when a file outside client/cuda/ and the kind
table uses a CUDA function (tb__cuda_*, tb__cu_*, tb__ci_*): those go
through a memory kind's table row (client/kind.h). Prints the graph."""
import collections
import os
import subprocess
import sys

CORE_CUDA_FREE = {"client.c", "conn.c", "rpc.c", "lease.c", "mapcache.c",
                  "publish.c", "hint.c", "buffer.c", "tensor.c", "list.c",
                  "kind_host.c"}
CUDA_PREFIXES = ("tb__cuda_", "tb__cu_", "tb__ci_")


def objects(src, objdir):
    """(source path relative to src, object path) of every object whose
    source still exists (a removed source's stale object is ignored)."""
    found = []
    for root, _, files in os.walk(objdir):
        for f in files:
            if not f.endswith(".c.o"):
                continue
            obj = os.path.join(root, f)
            rel = os.path.relpath(obj, objdir)[:-2]
            if os.path.exists(os.path.join(src, rel)):
                found.append((rel, obj))
    return sorted(found)


def symbols(obj):
    out = subprocess.run(["nm", obj], capture_output=True, text=True,
                         check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBRC":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
    return defined, used


def cycles(nodes, edges):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, objdir = sys.argv[1], sys.argv[2]
    objs = objects(src, objdir)
    if not objs:
        sys.exit("check_client_layers: no object files under %s" % objdir)
    owner, uses = {}, {}
    for rel, obj in objs:
        defined, used = symbols(obj)
        for s in defined:
            owner[s] = rel
        uses[rel] = used
    nodes = [rel for rel, _ in objs]
    edges = collections.defaultdict(set)
    bad = []
    for f in nodes:
        for s in uses[f]:
            d = owner.get(s)
            if d is not None and d != f:
                edges[f].add(d)
            if f in CORE_CUDA_FREE and s.startswith(CUDA_PREFIXES):
                bad.append("%s calls %s (a CUDA function: go through the "
                           "memory kind's table, client/kind.h)" % (f, s))
        print("%-22s -> %s" % (f, " ".join(sorted(edges[f])) or "-"))
    for comp in cycles(nodes, edges):
        bad.append("these files call each other in a cycle: " +
                   " ".join(comp))
    if edges["rpc.c"]:
        bad.append("rpc.c (the RPC core) calls " +
                   " ".join(sorted(edges["rpc.c"])) +
                   ": it hands notices up through its hooks instead")
    for b in bad:
        print("check_client_layers: " + b)
    print("check_client_layers: %d file(s), %s" %
          (len(nodes), "%d problem(s)" % len(bad) if bad else "no cycle"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
