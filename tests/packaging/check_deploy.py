#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""deploy/kubernetes and deploy/container against the programs they run.

    check_deploy.py SOURCE_DIR TENSORBROKERD TBCTL

No cluster or container runtime runs here, so this checks what can go
wrong without one: the manifest parses; its DaemonSet mounts the socket's
directory from the host at the path the daemon's --socket names, and the
liveness and readiness probes ask that socket with `tbctl status`; every
option the manifest and the Containerfile pass to tensorbrokerd and tbctl
is one their --help lists, and every CMake option the Containerfile sets
exists; the container drops privileges and has a memory limit. Exit 77
without PyYAML."""
import os
import re
import subprocess
import sys

try:
    import yaml
except ImportError:
    print("check_deploy: no PyYAML (python3-yaml): skipped")
    sys.exit(77)


def fail(msg):
    print("check_deploy: FAIL: " + msg)
    sys.exit(1)


def options(prog):
    out = subprocess.run([prog, "--help"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=30).stdout
    return set(re.findall(r"--[a-z][a-z0-9-]*", out))


def check_args(args, known, who):
    for a in args:
        if a.startswith("--") and a.split("=")[0] not in known:
            fail("%s is given %s, which its --help does not list" % (who, a))


def arg_after(args, flag):
    if flag in args and args.index(flag) + 1 < len(args):
        return args[args.index(flag) + 1]
    return None


def main(src, daemon, tbctl):
    d_opts, t_opts = options(daemon), options(tbctl)
    with open(os.path.join(src, "deploy/kubernetes/tensorbroker.yaml")) as f:
        docs = [x for x in yaml.safe_load_all(f) if x]
    ds = [x for x in docs if x.get("kind") == "DaemonSet"]
    if len(ds) != 1:
        fail("expected one DaemonSet, found %d" % len(ds))
    spec = ds[0]["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    cmd = c["command"]
    if os.path.basename(cmd[0]) != "tensorbrokerd":
        fail("the container runs %s, not tensorbrokerd" % cmd[0])
    check_args(cmd[1:], d_opts, "tensorbrokerd")
    sock = arg_after(cmd, "--socket")
    if sock is None:
        fail("tensorbrokerd is not given --socket")
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    sock_dir = os.path.dirname(sock)
    hosted = [n for n, p in mounts.items()
              if p == sock_dir and "hostPath" in vols.get(n, {})]
    if not hosted:
        fail("the socket's directory %s is not a hostPath mount" % sock_dir)
    for probe in ("livenessProbe", "readinessProbe"):
        p = c.get(probe, {}).get("exec", {}).get("command")
        if not p or os.path.basename(p[0]) != "tbctl" or "status" not in p:
            fail("%s is not `tbctl ... status`" % probe)
        check_args(p[1:], t_opts, "tbctl")
        if arg_after(p, "--socket") != sock:
            fail("%s asks %s, the daemon listens on %s"
                 % (probe, arg_after(p, "--socket"), sock))
    sc = c.get("securityContext", {})
    if sc.get("allowPrivilegeEscalation") is not False or \
            sc.get("capabilities", {}).get("drop") != ["ALL"]:
        fail("the container keeps privileges")
    if not spec.get("securityContext", {}).get("runAsNonRoot"):
        fail("the pod may run as root")
    if "memory" not in c.get("resources", {}).get("limits", {}):
        fail("no memory limit")

    with open(os.path.join(src, "deploy/container/Containerfile")) as f:
        cf = f.read()
    cmake_opts = set()
    for root, _, names in os.walk(src):
        if "/build" in root or "/.git" in root:
            continue
        if "CMakeLists.txt" in names:
            with open(os.path.join(root, "CMakeLists.txt")) as f:
                cmake_opts |= set(re.findall(r"option\((TB_[A-Z_]+)", f.read()))
    for o in re.findall(r"-D(TB_[A-Z_]+)=", cf):
        if o not in cmake_opts:
            fail("the Containerfile sets %s, which no CMakeLists.txt defines" % o)
    m = re.search(r'CMD \[(.*)\]', cf)
    if not m:
        fail("the Containerfile has no CMD")
    cargs = [a.strip().strip('"') for a in m.group(1).split(",")]
    if cargs[0] != "tensorbrokerd":
        fail("the Containerfile's CMD runs %s" % cargs[0])
    check_args(cargs[1:], d_opts, "tensorbrokerd (Containerfile)")
    print("check_deploy: OK (socket %s, %d tensorbrokerd and %d tbctl options known)"
          % (sock, len(d_opts), len(t_opts)))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
