#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tensorbrokerd's configuration file, SIGHUP and a second SIGTERM, as an
operator meets them (daemon/options.c, daemon/main.c):

  check       --check-config on good and bad files: each error names the
              file and line and says what is wrong; exit 1, nothing started
  example     deploy/tensorbrokerd.conf is valid, names every setting,
              and uncommented gives exactly the embedded defaults
  precedence  defaults < the file < the command line (--print-config)
  reload      a running daemon, a Python client connected throughout: a
              publish the file's max-history refuses succeeds after the
              file is changed and SIGHUP sent (the data read back by a
              consumer), the new log level shows, a change that needs a
              restart is logged as such; a broken file at SIGHUP is
              logged and changes nothing; the client is never dropped
  sigterm     a second SIGTERM sent while the daemon writes its last
              line (held there by a full one-page stderr pipe), after its
              signal handlers are gone, does not kill it half-way: exit 0,
              "stopped" logged, the socket gone (skipped without the
              rights to read the daemon's memory)

usage: daemon_config.py DAEMON TBCTL (PYTHONPATH: the binding)"""
import fcntl
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

DAEMON, TBCTL = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def check_config(*args):
    p = subprocess.run([DAEMON, "--check-config", *args],
                       capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout + p.stderr


def test_check(tmp):
    conf = os.path.join(tmp, "check.conf")
    good = ("# a comment\n; another\n[daemon]\nlog-level = debug\n"
            "socket-mode = 0600\n\n[limits]\nmax-leases = 12  ; inline\n"
            "exempt-root = yes\nbusy-poll = auto\n")
    write(conf, good)
    rc, out = check_config("--config", conf)
    check(rc == 0 and "configuration OK (%s)" % conf in out,
          "check: a good file is OK (%r)" % out.strip())
    bad = [
        ("[limits]\nmax-leases = 0\n", 2, "max-leases: '0' is not a number"),
        ("[limits]\nmax-leases = 5\nmax-leases = 6\n", 3, "given twice"),
        ("[limits]\nbogus = 1\n", 2, "unknown key 'bogus'"),
        ("[daemon]\nmax-leases = 3\n", 2, "belongs in [limits]"),
        ("[limits]\nlog-level = info\n", 2, "belongs in [daemon]"),
        ("[nope]\nx = 1\n", 2, "unknown section [nope]"),
        ("max-leases = 3\n", 1, "comes before any section"),
        ("[daemon]\nready-fd = 3\n", 2, "only on the command line"),
        ("[daemon]\nlog-level = loud\n", 2, "not one of error"),
        ("[limits]\nexempt-root = maybe\n", 2, "not yes or no"),
        ("[daemon]\nthis is not a key\n", 2, "not a key = value line"),
        ("[limits]\nmax-leases = 1%s\n" % ("0" * 220), 2, "longer than"),
        ("[limits]\nmax-metadata = 65536\nmax-message = 65536\n", 0,
         "leaves no room"),
        ("[access \"cam/\"]\nacquire = *\nlist = user:no-such-user-tbconf\n", 3,
         "[access \"cam/\"] list: unknown user 'no-such-user-tbconf'"),
        ("[access]\ndefault = closed\n", 2, "default = 'closed': owner or open"),
    ]
    for text, line, want in bad:
        write(conf, text)
        rc, out = check_config("--config", conf)
        where = "%s:%d:" % (conf, line)
        ok = rc == 1 and want in out and (line == 0 or where in out)
        check(ok, "check: %r -> exit 1, %r at line %d (got %d: %r)" %
              (text[:40], want, line, rc, out.strip()[:160]))
    rc, out = check_config("--config", os.path.join(tmp, "missing.conf"))
    check(rc == 1 and "No such file" in out,
          "check: a missing --config file is an error (%r)" % out.strip())
    rc, out = check_config("--no-config")
    check(rc == 0 and "no configuration file" in out,
          "check: --no-config (%r)" % out.strip())


def test_example(tmp):
    """deploy/tensorbrokerd.conf, the file the package installs: valid as
    it is, and with every key uncommented it gives exactly the embedded
    defaults, every setting named."""
    example = os.environ.get("TB_EXAMPLE_CONF")
    if not example:
        print("skip example: TB_EXAMPLE_CONF not set")
        return
    rc, out = check_config("--config", example)
    check(rc == 0, "example: %s passes --check-config (%r)" %
          (example, out.strip()))
    with open(example) as f:
        text = f.read()
    un = os.path.join(tmp, "uncommented.conf")
    write(un, "\n".join(l[1:] if l[:1] == "#" and l[1:2].isalpha() else l
                        for l in text.splitlines()) + "\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TENSORBROKER_SOCKET", "XDG_RUNTIME_DIR")}

    def printed(*args):
        p = subprocess.run([DAEMON, "--print-config", *args],
                           capture_output=True, text=True, timeout=30,
                           env=env)
        return p.stdout.splitlines()[1:]
    defaults = printed("--no-config")
    check(printed("--config", un) == defaults and len(defaults) > 30,
          "example: uncommented, it gives the embedded defaults")
    keys = [l.split(" = ")[0] for l in defaults if " = " in l]
    missing = [k for k in keys if "#%s = " % k not in text]
    check(not missing, "example: names every setting (missing: %s)" %
          missing)


def test_precedence(tmp):
    conf = os.path.join(tmp, "prec.conf")
    write(conf, "[limits]\nmax-leases = 5\nmax-events = 9\n")

    def settings(*args):
        p = subprocess.run([DAEMON, "--print-config", "--config", conf,
                            *args], capture_output=True, text=True,
                           timeout=30)
        return dict(l.split(" = ", 1) for l in p.stdout.splitlines()
                    if " = " in l)
    s = settings()
    check(s.get("max-leases") == "5" and s.get("max-events") == "9" and
          s.get("max-sessions") == "4096",
          "precedence: the file over the defaults")
    s = settings("--max-leases", "7")
    check(s.get("max-leases") == "7" and s.get("max-events") == "9",
          "precedence: the command line over the file")


class Daemon:
    def __init__(self, tmp, tag, args):
        self.sock = os.path.join(tmp, tag + ".sock")
        self.logpath = os.path.join(tmp, tag + ".log")
        self.err = open(self.logpath, "w")
        env = dict(os.environ)
        env.pop("JOURNAL_STREAM", None)
        r, w = os.pipe()
        self.proc = subprocess.Popen(
            [DAEMON, "--socket", self.sock, "--ready-fd", str(w), *args],
            stderr=self.err, pass_fds=(w,), env=env)
        os.close(w)
        with os.fdopen(r) as f:
            ready = f.read()
        if ready != "READY\n":
            raise RuntimeError("daemon did not start: " + self.log())

    def log(self):
        with open(self.logpath) as f:
            return f.read()

    def wait_log(self, text, count=1, timeout=20):
        """Until text is in the log count times (the daemon writes it when
        it has acted); False on timeout."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.log().count(text) >= count:
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.02)
        return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        self.err.close()


def test_reload(tmp):
    try:
        import numpy as np
        import tensorbroker as tb
    except ImportError as e:
        print("skip reload: no binding or NumPy (%s)" % e)
        return
    conf = os.path.join(tmp, "live.conf")
    write(conf, "[daemon]\nlog-level = info\n[limits]\nmax-history = 4\n")
    d = Daemon(tmp, "live", ["--config", conf])
    try:
        prod = tb.Client(socket=d.sock, name="producer")
        sid = prod.session_id
        frame = np.arange(64, dtype=np.int32)
        try:
            prod.publish("frames", frame, history_depth=8)
            check(False, "reload: max-history 4 refuses a depth of 8")
        except tb.Error as e:
            check("history" in str(e),
                  "reload: max-history 4 refuses a depth of 8 (%s)" % e)
        subprocess.run([TBCTL, "--socket", d.sock, "status"], check=True,
                       capture_output=True, timeout=30)
        check("session" not in d.log().split("listening on")[-1].lower()
              or "debug" not in d.log(),
              "reload: at log-level info a tbctl session is not logged")
        write(conf, "[daemon]\nlog-level = debug\n[limits]\n"
              "max-history = 16\nmax-message = 32768\n")
        d.proc.send_signal(signal.SIGHUP)
        check(d.wait_log("reload: " + conf),
              "reload: SIGHUP re-reads the file (log: %s)" %
              d.log().splitlines()[-1])
        check("max-message 65536 -> 32768 takes effect at the next start"
              in d.log(), "reload: a restart-only change is logged as such")
        v = prod.publish("frames", frame * 3, history_depth=8)
        check(prod.session_id == sid and v >= 1,
              "reload: the same session publishes with a depth of 8")
        with tb.Client(socket=d.sock, name="consumer") as cons:
            with cons.acquire("frames") as lease:
                got = np.from_dlpack(lease).copy()
        check(np.array_equal(got, frame * 3),
              "reload: the consumer reads the frame published after it")
        subprocess.run([TBCTL, "--socket", d.sock, "status"], check=True,
                       capture_output=True, timeout=30)
        check(d.wait_log("debug: ") and "tbctl" in d.log(),
              "reload: log-level debug applies (tbctl's session logged)")
        write(conf, "[daemon]\nlog-level = info\n[limits]\n"
              "max-history = 2\nmax-history-typo = 3\n")
        d.proc.send_signal(signal.SIGHUP)
        check(d.wait_log("the running configuration is kept"),
              "reload: a broken file is logged and kept out")
        check("%s:5: [limits]: unknown key 'max-history-typo'" % conf
              in d.log(), "reload: the error names file and line")
        v2 = prod.publish("frames", frame, history_depth=8)
        check(v2 == v + 1 and prod.session_id == sid,
              "reload: after the broken file max-history is still 16, "
              "the client still connected")
        prod.close()
    finally:
        d.stop()
    check(d.proc.returncode == 0, "reload: the daemon stops with exit 0")


def write_in_progress(pid):
    """The bytes of the write(2) pid sleeps in, or None (needs ptrace
    rights over pid: root, or the same uid without Yama restrictions)."""
    try:
        with open("/proc/%d/syscall" % pid) as f:
            parts = f.read().split()
        if parts[0] not in ("1", "64"):  # write on x86-64, arm64
            return None
        buf, count = int(parts[2], 16), int(parts[3], 16)
        with open("/proc/%d/mem" % pid, "rb") as m:
            m.seek(buf)
            return m.read(count)
    except (OSError, IndexError, ValueError):
        return None


def test_sigterm_twice(tmp):
    """The daemon's stderr is a one-page pipe the test fills so that the
    first SIGTERM's "shutting down" line fills it exactly: the daemon then
    blocks writing its very last line, "stopped", after its signal handlers
    are gone. A second SIGTERM sent then must not kill it half-way."""
    sock = os.path.join(tmp, "term.sock")
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    rr, rw = os.pipe()
    proc = subprocess.Popen([DAEMON, "--no-config", "--socket", sock,
                             "--ready-fd", str(rw)], stderr=w,
                            pass_fds=(rw,))
    os.close(rw)
    os.close(w)
    with os.fdopen(rr) as f:
        ready = f.read()
    check(ready == "READY\n", "sigterm: the daemon started")
    if not os.access("/proc/%d/mem" % proc.pid, os.R_OK):
        print("skip sigterm: cannot read the daemon's memory")
        proc.terminate()
        proc.wait()
        return
    os.set_blocking(r, False)
    out = b""
    try:
        while True:
            out += os.read(r, 65536)  # the start-up lines: empty the pipe
    except BlockingIOError:
        pass
    # room for exactly the next line, a 24-byte timestamp and this
    first = (" tensorbrokerd: info: shutting down: daemon received "
             "SIGTERM\n")
    fill = os.open("/proc/self/fd/%d" % r, os.O_WRONLY)
    os.write(fill, b"#" * (4096 - 24 - len(first)))
    os.close(fill)
    proc.send_signal(signal.SIGTERM)
    held = None
    end = time.monotonic() + 30
    while time.monotonic() < end and proc.poll() is None:
        line = write_in_progress(proc.pid)
        if line is not None and b"stopped" in line:
            held = line
            break
        time.sleep(0.005)  # polling /proc for the blocked write
    check(held is not None, "sigterm: the daemon held at its last line "
          "(%r)" % (held or b"")[-40:])
    proc.send_signal(signal.SIGTERM)
    os.set_blocking(r, True)
    with os.fdopen(r, "rb") as f:
        out += f.read()
    rc = proc.wait(timeout=30)
    log = out.decode(errors="replace").replace("#", "")
    check(rc == 0 and log.rstrip().endswith("stopped"),
          "sigterm: a SIGTERM during the last steps does not kill it: "
          "exit 0, 'stopped' logged (got %d)" % rc)
    check(not os.path.exists(sock), "sigterm: its socket file is gone")


def main():
    with tempfile.TemporaryDirectory(prefix="tb-config-") as tmp:
        test_check(tmp)
        test_example(tmp)
        test_precedence(tmp)
        test_reload(tmp)
        test_sigterm_twice(tmp)
    if failures:
        print("%d FAILED" % len(failures))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
