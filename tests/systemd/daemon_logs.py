#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tensorbrokerd's log lines, by where stderr goes (daemon/log.c):

  plain       every line "YYYY-MM-DDTHH:MM:SS.mmmZ tensorbrokerd: LEVEL: ..."
  tbctl       a tbctl call's session open and close are logged at debug
              level: absent at --log-level info, present at debug
  journal     $JOURNAL_STREAM naming stderr's device:inode: with
              libsystemd (TB_WITH_SYSTEMD=1) the entries go to the journal
              through sd_journal_sendv, nothing to stderr; without, lines
              carry their syslog priority ("<6>") and no timestamp
  fields      with libsystemd, as root where a mount namespace may be made
              (else skipped): in a private mount namespace with a tmpfs on
              /run, the test binds /run/systemd/journal/socket and reads
              the entries: PRIORITY=, SYSLOG_IDENTIFIER=tensorbrokerd, and
              for tbctl's session TB_SESSION=, TB_PEER_PID=, TB_PEER_UID=
  not stderr  $JOURNAL_STREAM naming another file (a service's child with
              stderr redirected): plain lines again

usage: daemon_logs.py DAEMON TBCTL (TB_WITH_SYSTEMD=1: built with libsystemd)"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

DAEMON, TBCTL = sys.argv[1], sys.argv[2]
IN_NAMESPACE = len(sys.argv) > 3 and sys.argv[3] == "--in-namespace"
PLAIN = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z tensorbrokerd: "
                   r"(error|warn|info|debug): ")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run_daemon(tmp, tag, level, journal=None):
    """Start the daemon, make one tbctl call, stop it; its stderr lines."""
    sock = os.path.join(tmp, tag + ".sock")
    errpath = os.path.join(tmp, tag + ".log")
    err = open(errpath, "w")
    env = dict(os.environ)
    env.pop("JOURNAL_STREAM", None)
    if journal == "stderr":
        st = os.fstat(err.fileno())
        env["JOURNAL_STREAM"] = "%d:%d" % (st.st_dev, st.st_ino)
    elif journal == "other":
        st = os.stat(tmp)
        env["JOURNAL_STREAM"] = "%d:%d" % (st.st_dev, st.st_ino)
    r, w = os.pipe()
    proc = subprocess.Popen([DAEMON, "--socket", sock, "--log-level", level,
                             "--ready-fd", str(w)],
                            stderr=err, pass_fds=(w,), env=env)
    os.close(w)
    with os.fdopen(r) as ready:
        check(ready.read() == "READY\n", "%s: daemon ready" % tag)
    t = subprocess.run([TBCTL, "--socket", sock, "status"],
                       capture_output=True, text=True, timeout=30)
    check(t.returncode == 0, "%s: tbctl status" % tag)
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=30) == 0, "%s: exit 0" % tag)
    err.close()
    with open(errpath) as f:
        lines = f.read().splitlines()
    print("--- %s ---\n%s" % (tag, "\n".join(lines)))
    return lines


def journal_fields(tmp):
    """Run in a mount namespace of its own (see --in-namespace): a journal
    socket of the test's, the entries the daemon sends to it."""
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run"]).returncode:
        print("SKIP fields: cannot mount a tmpfs on /run here")
        return 77
    os.makedirs("/run/systemd/journal")
    js = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    js.bind("/run/systemd/journal/socket")
    lines = run_daemon(tmp, "fields", "debug", journal="stderr")
    check(lines == [], "fields: nothing on stderr")
    js.setblocking(False)
    entries = []
    while True:
        try:
            data = js.recv(65536)
        except BlockingIOError:
            break
        entries.append(dict(l.split("=", 1) for l in
                            data.decode().split("\n") if "=" in l))
    for e in entries:
        print("entry: %r" % e)
    check(len(entries) > 0 and all(
        e.get("SYSLOG_IDENTIFIER") == "tensorbrokerd" and "PRIORITY" in e
        for e in entries), "fields: every entry has its identifier, priority")
    opened = [e for e in entries
              if re.match(r"session \d+ open: .*'tbctl'", e.get("MESSAGE", ""))]
    check(len(opened) == 1 and opened[0].get("PRIORITY") == "7" and
          opened[0].get("TB_SESSION", "").isdigit() and
          opened[0].get("TB_PEER_PID", "").isdigit() and
          opened[0].get("TB_PEER_UID") == str(os.getuid()),
          "fields: tbctl's session open at debug (7) with TB_SESSION, "
          "TB_PEER_PID, TB_PEER_UID")
    check(any(e.get("MESSAGE", "").startswith("shutting down") and
              e.get("PRIORITY") == "6" for e in entries),
          "fields: 'shutting down' at info (6)")
    return 1 if failures else 0


if IN_NAMESPACE:
    with tempfile.TemporaryDirectory(prefix="tb-logs-ns-") as tmp:
        sys.exit(journal_fields(tmp))

with tempfile.TemporaryDirectory(prefix="tb-logs-") as tmp:
    if os.environ.get("TB_WITH_SYSTEMD") != "1":
        print("skip fields: the daemon is built without libsystemd")
    elif os.geteuid() != 0 or shutil.which("unshare") is None:
        print("skip fields: needs root and unshare (a mount namespace)")
    elif subprocess.run(["unshare", "--mount", "true"],
                        stderr=subprocess.DEVNULL).returncode != 0:
        print("skip fields: no mount namespace may be made here")
    else:
        r = subprocess.run(["unshare", "--mount", "--propagation", "private",
                            sys.executable, os.path.abspath(__file__),
                            DAEMON, TBCTL, "--in-namespace"], timeout=120)
        if r.returncode == 77:
            print("skip fields: no mount namespace here")
        else:
            check(r.returncode == 0, "fields: the journal entries (above)")

    lines = run_daemon(tmp, "info", "info")
    check(len(lines) > 0 and all(PLAIN.match(l) for l in lines),
          "info: every line has a timestamp and a level")
    check(not any(re.search(r"session \d+ (open|closed)", l) for l in lines),
          "info: tbctl's session open/close not logged at info")

    lines = run_daemon(tmp, "debug", "debug")
    check(any(re.search(r"debug: session \d+ open: .*name 'tbctl'", l)
              for l in lines), "debug: tbctl's session open at debug")
    check(any(re.search(r"debug: session \d+ closed: .*name 'tbctl'", l)
              for l in lines), "debug: tbctl's session close at debug")

    lines = run_daemon(tmp, "journal", "info", journal="stderr")
    if os.environ.get("TB_WITH_SYSTEMD") == "1":
        # sd_journal_sendv: entries go to the journal's socket (dropped
        # by libsystemd where none listens), nothing to stderr
        check(lines == [], "journal: entries sent natively, none on stderr")
    else:
        check(len(lines) > 0 and
              all(re.match(r"^<[3467]>", l) and not PLAIN.match(l)
                  for l in lines),
              "journal: lines start with their priority, no timestamp")
        check(any(l.startswith("<6>shutting down") for l in lines),
              "journal: info is <6>")

    lines = run_daemon(tmp, "other", "info", journal="other")
    check(len(lines) > 0 and all(PLAIN.match(l) for l in lines),
          "JOURNAL_STREAM not stderr: plain lines")

if failures:
    print("%d failed" % len(failures))
    sys.exit(1)
print("all passed")
