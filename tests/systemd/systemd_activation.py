#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tensorbrokerd under a service manager, without systemd as PID 1:
systemd-socket-activate makes the socket and starts the daemon on the first
connection (socket activation), and a SOCK_DGRAM socket this test binds
stands in for $NOTIFY_SOCKET.

  activation  the daemon serves the passed socket (tbctl status through it)
  notify      READY=1 with a STATUS= line; STATUS= follows the sessions;
              WATCHDOG=1 arrives while $WATCHDOG_USEC is set; SIGHUP gives
              RELOADING=1 then READY=1; STOPPING=1
  ownership   on SIGTERM the daemon exits 0 and leaves the socket file it
              did not create
  wrong type  a stream socket passed instead: exit 1, a clear error

usage: systemd_activation.py DAEMON TBCTL; exits 77 when
systemd-socket-activate is missing or the daemon has no libsystemd."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

DAEMON, TBCTL = sys.argv[1], sys.argv[2]
SSA = shutil.which("systemd-socket-activate")
if SSA is None:
    print("SKIP: no systemd-socket-activate (Debian: systemd)")
    sys.exit(77)
if os.environ.get("TB_WITH_SYSTEMD") != "1":
    print("SKIP: tensorbrokerd built without libsystemd")
    sys.exit(77)

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def wait_path(path, timeout=10.0):
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def recv_until(ns, want, timeout):
    """Datagrams from the notify socket until one holds the line want;
    returns all of them (each a list of lines)."""
    got = []
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return got
        ns.settimeout(left)
        try:
            msg = ns.recv(4096).decode()
        except socket.timeout:
            return got
        lines = msg.split("\n")
        got.append(lines)
        if any(l == want or (want.endswith("=") and l.startswith(want))
               for l in lines):
            return got


def lines_of(got):
    return [l for m in got for l in m]


with tempfile.TemporaryDirectory(prefix="tb-sd-") as tmp:
    sock = os.path.join(tmp, "tb.sock")
    npath = os.path.join(tmp, "notify")
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(npath)
    log = open(os.path.join(tmp, "daemon.log"), "w+")
    env = dict(os.environ)
    env.pop("JOURNAL_STREAM", None)
    proc = subprocess.Popen(
        [SSA, "--seqpacket", "-l", sock,
         "-E", "NOTIFY_SOCKET=" + npath, "-E", "WATCHDOG_USEC=600000",
         DAEMON, "--log-level", "debug", "--hello-timeout", "0"],
        stdout=log, stderr=log, env=env)
    try:
        check(wait_path(sock), "systemd-socket-activate made " + sock)
        # the first connection starts the daemon; tbctl waits in the backlog
        r = subprocess.run([TBCTL, "--socket", sock, "--json", "status"],
                           capture_output=True, text=True, timeout=30)
        check(r.returncode == 0, "tbctl status through the passed socket "
              "(rc %d: %s)" % (r.returncode, r.stderr.strip()))
        # systemd-socket-activate execs the daemon: same pid
        try:
            pid = json.loads(r.stdout).get("pid")
        except ValueError:
            pid = None
        check(pid == proc.pid,
              "the daemon answering is the one started (pid %r, started %d)"
              % (pid, proc.pid))

        got = recv_until(ns, "READY=1", 10)
        lines = lines_of(got)
        check("READY=1" in lines, "READY=1 on $NOTIFY_SOCKET")
        status = [l for l in lines if l.startswith("STATUS=")]
        check(any("sessions" in l and "channels" in l for l in status),
              "a STATUS= line with sessions and channels: %r" % status)

        got = recv_until(ns, "WATCHDOG=1", 3)
        check("WATCHDOG=1" in lines_of(got),
              "WATCHDOG=1 within 3 s of WATCHDOG_USEC=600000")

        # a session that stays: STATUS= follows it (at most a second late)
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        c.connect(sock)
        got = recv_until(ns, "STATUS=1 sessions, 0 channels", 5)
        check("STATUS=1 sessions, 0 channels" in lines_of(got),
              "STATUS= updated to 1 session")
        c.close()

        # systemctl reload: RELOADING=1 with MONOTONIC_USEC=, then READY=1
        proc.send_signal(signal.SIGHUP)
        got = recv_until(ns, "READY=1", 5)
        lines = lines_of(got)
        check("RELOADING=1" in lines and
              any(l.startswith("MONOTONIC_USEC=") for l in lines) and
              "READY=1" in lines and
              lines.index("RELOADING=1") < len(lines) - 1,
              "SIGHUP: RELOADING=1, MONOTONIC_USEC=, then READY=1 (%r)" %
              lines)

        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        check(rc == 0, "exit 0 on SIGTERM (got %d)" % rc)
        got = recv_until(ns, "STOPPING=1", 2)
        check("STOPPING=1" in lines_of(got), "STOPPING=1 on SIGTERM")
        check(os.path.exists(sock),
              "the socket systemd made is left in place")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.seek(0)
        text = log.read()
        print("--- daemon log ---\n" + text)
    check("passed by systemd" in text, "the log says the socket was passed")

    # a stream socket is refused with a clear error
    sock2 = os.path.join(tmp, "stream.sock")
    log2 = open(os.path.join(tmp, "daemon2.log"), "w+")
    proc = subprocess.Popen([SSA, "-l", sock2, DAEMON],
                            stdout=log2, stderr=log2, env=env)
    try:
        check(wait_path(sock2), "systemd-socket-activate made " + sock2)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock2)
        rc = proc.wait(timeout=30)
        s.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log2.seek(0)
    text = log2.read()
    print("--- daemon log (stream socket) ---\n" + text)
    check(rc == 1, "exit 1 with a stream socket (got %d)" % rc)
    check("not a listening AF_UNIX SOCK_SEQPACKET socket" in text,
          "the error names what was expected")

if failures:
    print("%d failed" % len(failures))
    sys.exit(1)
print("all passed")
