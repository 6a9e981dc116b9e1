# SPDX-License-Identifier: Apache-2.0
"""Access control with real uids (docs/deploy.md, "Access control").

Runs as root (CI does): creates the system users tbacl-alice, tbacl-bob
and tbacl-carol and the group tbacl-video if they are missing (and leaves
them for the next run), starts tensorbrokerd as root on a socket every uid
may connect to, and runs clients as those users with setpriv: acl_peer
(tests/integration/acl_peer.c, which speaks the wire itself) and the
Python binding. Exits 77 when not root or setpriv, useradd or groupadd is
missing.

usage: access.py TENSORBROKERD ACL_PEER
"""
import os
import pwd
import grp
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback

SKIP = 77
TIMEOUT = 20.0

RULES = """\
# the access rules of a shared node: alice's cameras, read by video
[access]
default = owner

[access "acl/"]
publish = user:tbacl-alice
acquire = group:tbacl-video owner
list = group:tbacl-video owner
write = user:tbacl-carol
"""


def skip(why):
    print("SKIP: " + why)
    sys.exit(SKIP)


def ensure_users():
    """The test's users and group: made once, reused by later runs."""
    for tool in ("setpriv", "useradd", "groupadd"):
        if shutil.which(tool) is None:
            skip("%s is missing (util-linux, passwd)" % tool)
    try:
        grp.getgrnam("tbacl-video")
    except KeyError:
        subprocess.run(["groupadd", "--system", "tbacl-video"], check=True)
    ids = {}
    for name in ("tbacl-alice", "tbacl-bob", "tbacl-carol"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home",
                            "--shell", "/usr/sbin/nologin", "--user-group", name],
                           check=True)
            pw = pwd.getpwnam(name)
        ids[name] = (pw.pw_uid, pw.pw_gid)
    ids["video"] = grp.getgrnam("tbacl-video").gr_gid
    return ids


def as_user(uid, gid, groups=()):
    """setpriv's arguments to run as uid:gid with exactly these
    supplementary groups (none by default)."""
    cmd = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid]
    if groups:
        cmd.append("--groups=" + ",".join(str(g) for g in groups))
    else:
        cmd.append("--clear-groups")
    return cmd


class Daemon:
    """tensorbrokerd as root (or user) with its configuration file; its log
    lines are read by a thread, and a test waits for a line instead of
    sleeping."""

    def __init__(self, binary, rules, user=None):
        self.dir = tempfile.mkdtemp(prefix="tbacl-")
        os.chmod(self.dir, 0o755)  # other uids reach the socket
        if user is not None:  # it makes its socket there
            os.chown(self.dir, *user)
        self.sock = os.path.join(self.dir, "tb.sock")
        self.rules = os.path.join(self.dir, "tensorbrokerd.conf")
        self.write_rules(rules)
        r, w = os.pipe()
        self.proc = subprocess.Popen(
            (as_user(*user) if user else []) + [binary, "--config", self.rules,
                                                "--socket", self.sock, "--socket-mode", "0666",
             "--ready-fd", str(w), "--log-level", "info"],
            pass_fds=(w,), stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        os.close(w)
        self.lines = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        with os.fdopen(r, "rb") as ready:
            if ready.readline() != b"READY\n":
                raise AssertionError("tensorbrokerd did not start:\n" + self.log())

    def _read(self):
        for line in self.proc.stderr:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def write_rules(self, text):
        with open(self.rules, "w") as f:
            f.write(text)

    def log(self):
        with self.cond:
            return "\n".join(self.lines)

    def count(self, *words):
        with self.cond:
            return sum(all(w in l for w in words) for l in self.lines)

    def wait_count(self, n, *words):
        """Wait until n log lines contain all of words."""
        with self.cond:
            ok = self.cond.wait_for(
                lambda: sum(all(w in l for w in words) for l in self.lines) >= n,
                timeout=TIMEOUT)
        assert ok, "no log line with %r (x%d):\n%s" % (words, n, self.log())

    def hup(self):
        self.proc.send_signal(signal.SIGHUP)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=TIMEOUT)
        self.reader.join(timeout=TIMEOUT)
        shutil.rmtree(self.dir, ignore_errors=True)
        assert rc == 0, "tensorbrokerd exited %d:\n%s" % (rc, self.log())


class Peer:
    """acl_peer as another uid: one session, one command per line."""

    def __init__(self, peer, d, user, groups=()):
        self.proc = subprocess.Popen(as_user(*user, groups) + [peer, d.sock],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self._line() == "ready"

    def _line(self):
        r, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT)
        assert r, "acl_peer did not answer"
        line = self.proc.stdout.readline()
        assert line, "acl_peer ended (exit %r)" % self.proc.wait()
        return line.rstrip("\n")

    def __call__(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._line()

    def value(self, cmd, key):
        """The key=value of a successful answer."""
        out = self(cmd)
        assert out.startswith("0 "), "%s: %s" % (cmd, out)
        return dict(kv.split("=") for kv in out.split()[1:] if "=" in kv)[key]

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=TIMEOUT) == 0


def expect(got, want):
    assert got == want, "got      %r\nexpected %r" % (got, want)


def denied(got, text):
    assert got.startswith("TB_EPERM | ") and text in got, \
        "expected TB_EPERM saying %r, got %r" % (text, got)


# ---- the tests ----


def test_foreign_uid_refused(t):
    """bob, in no group, can do nothing to alice's channels and ids; alice
    still can and nothing changed; each session's first denial is logged
    at warn, the others not."""
    d = Daemon(t.daemon, RULES)
    try:
        alice = Peer(t.peer, d, t.ids["tbacl-alice"])
        abuf = alice.value("register rw", "buffer")
        obuf = alice.value("register ro", "buffer")
        expect(alice("publish acl/w " + abuf), "0 version=1")
        expect(alice("publish own/x " + obuf), "0 version=1")
        lease = alice.value("acquire acl/w", "lease")
        bob = Peer(t.peer, d, t.ids["tbacl-bob"])
        b = t.ids["tbacl-bob"][0]
        a = t.ids["tbacl-alice"][0]
        rule = 'rule [access "acl/"] acquire = group:tbacl-video owner'
        denied(bob("acquire acl/w"), 'uid %d may not acquire "acl/w": %s' % (b, rule))
        denied(bob("acquire acl/w 60000"), rule)  # refused, not parked
        denied(bob("acquire own/x"), 'uid %d may not acquire "own/x": channel '
               '"own/x" belongs to uid %d (default = owner)' % (b, a))
        denied(bob("subscribe acl/w"), 'may not subscribe to "acl/w"')
        denied(bob("wait_free acl/w 1"), 'may not wait on "acl/w"')
        expect(bob("list"), "0")  # not even the names
        if t.tbctl:  # as an operator would look
            out = subprocess.run(as_user(*t.ids["tbacl-bob"]) +
                                 [t.tbctl, "--socket", d.sock, "channels"],
                                 capture_output=True, text=True, timeout=TIMEOUT)
            assert out.returncode == 0 and "acl/w" not in out.stdout, out
            out = subprocess.run(as_user(*t.ids["tbacl-alice"]) +
                                 [t.tbctl, "--socket", d.sock, "channels"],
                                 capture_output=True, text=True, timeout=TIMEOUT)
            assert "acl/w" in out.stdout and "own/x" in out.stdout, out
        expect(bob("sessions"), "0 %d" % b)
        bbuf = bob.value("register ro", "buffer")
        denied(bob("publish acl/w " + bbuf),
               'rule [access "acl/"] publish = user:tbacl-alice')
        denied(bob("publish own/x " + bbuf), "belongs to uid %d" % a)
        # ids of alice's session
        denied(bob("release " + lease), "the lease belongs to another session")
        got = bob("acquire_release bob/x " + lease)
        assert got.startswith("TB_EINVAL") and "another session" in got, got
        denied(bob("unregister " + abuf), "not registered by this session")
        denied(bob("publish bob/y " + abuf), "belongs to another session")
        # nothing changed for alice, who still may
        expect(alice("list"), "0 acl/w:1:1 own/x:1:0")
        expect(alice("byte " + abuf), "P")
        expect(alice("publish acl/w " + abuf), "0 version=2")
        alice.value("acquire own/x", "lease")
        # one warn line for bob's session; a new session gets its own
        d.wait_count(1, "warn:", "denied:", "uid %d " % b)
        bob2 = Peer(t.peer, d, t.ids["tbacl-bob"])
        denied(bob2("acquire acl/w"), rule)
        d.wait_count(2, "warn:", "denied:", "uid %d " % b)
        expect(d.count("warn:", "denied:"), 2)
        for p in (bob2, bob, alice):
            p.close()
    finally:
        d.stop()


def test_group_grants_and_write(t):
    """bob reads through his supplementary group but may not write: every
    route is refused and alice's bytes stay; carol, granted write, writes
    them."""
    d = Daemon(t.daemon, RULES)
    video = t.ids["video"]
    try:
        alice = Peer(t.peer, d, t.ids["tbacl-alice"])
        abuf = alice.value("register rw", "buffer")
        expect(alice("publish acl/w " + abuf), "0 version=1")
        bob = Peer(t.peer, d, t.ids["tbacl-bob"], groups=(video,))
        out = bob("acquire acl/w")
        assert out.startswith("0 ") and "writable=0 fd=1" in out, out
        expect(bob("attack"), "pwrite=EBADF mmap_rw=EACCES mprotect=EACCES "
               "ftruncate=EINVAL reopen_rw=EACCES wrote=0")
        expect(alice("byte " + abuf), "P")
        expect(bob("list"), "0 acl/w:1:1")
        carol = Peer(t.peer, d, t.ids["tbacl-carol"], groups=(video,))
        out = carol("acquire acl/w")
        assert out.startswith("0 ") and "writable=1 fd=1" in out, out
        out = carol("attack")
        assert out.endswith("wrote=1") and "mmap_rw=OK" in out, out
        expect(alice("byte " + abuf), "W")
        expect(d.count("denied:"), 0)
        for p in (carol, bob, alice):
            p.close()
    finally:
        d.stop()


def test_sighup(t):
    """New rules apply to the next request of a session that stays; a file
    that does not load leaves the rules as they were."""
    d = Daemon(t.daemon, RULES)
    try:
        alice = Peer(t.peer, d, t.ids["tbacl-alice"])
        expect(alice("publish acl/w " + alice.value("register ro", "buffer")),
               "0 version=1")
        bob = Peer(t.peer, d, t.ids["tbacl-bob"])
        denied(bob("acquire acl/w"), "acquire = group:tbacl-video owner")
        d.write_rules(RULES.replace("acquire = group:tbacl-video owner",
                                    "acquire = group:tbacl-video owner user:tbacl-bob"))
        d.hup()
        d.wait_count(2, "access rules:")
        assert bob("acquire acl/w").startswith("0 lease=")
        d.write_rules(RULES.replace("acquire = group:tbacl-video owner",
                                    "acquire = user:no-such-user-tbacl"))
        d.hup()
        d.wait_count(1, "the running configuration is kept")
        assert "unknown user 'no-such-user-tbacl'" in d.log(), d.log()
        assert bob("acquire acl/w").startswith("0 lease=")
        expect(bob("sessions"), "0 %d" % t.ids["tbacl-bob"][0])
        bob.close()
        alice.close()
    finally:
        d.stop()


PY_PRODUCER = """
import sys
import tensorbroker as tb
c = tb.Client(sys.argv[1])
a = c.empty((4096,), "B", consumers_may_write=True)
if hasattr(a, "fill"):  # NumPy
    a.fill(ord("P"))
else:  # a memoryview
    a[:] = b"P" * 4096
print(c.publish("acl/w", a), flush=True)
for line in sys.stdin:
    print(chr(int(a[0])), flush=True)
"""


def test_nonroot_daemon_library_producer(t):
    """The daemon as an unprivileged user (as the systemd unit runs it), a
    producer through the library: the daemon's read-only description still
    goes to bob, and the memfd the library made 0600 stops his re-open."""
    if not t.python or not t.pythonpath:
        print("  (skipped: no Python binding built)")
        return
    daemon_user = (t.ids["tbacl-carol"][0], t.ids["tbacl-carol"][1])
    d = Daemon(t.daemon, RULES.replace("user:tbacl-carol", "none"),
               user=daemon_user)
    try:
        prod = subprocess.Popen(
            as_user(*t.ids["tbacl-alice"]) + [t.python, "-c", PY_PRODUCER, d.sock],
            env=dict(os.environ, PYTHONPATH=t.pythonpath), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        r, _, _ = select.select([prod.stdout], [], [], TIMEOUT)
        assert r and prod.stdout.readline().strip() == "1", "producer failed"
        bob = Peer(t.peer, d, t.ids["tbacl-bob"], groups=(t.ids["video"],))
        out = bob("acquire acl/w")
        assert out.startswith("0 ") and "writable=0 fd=1" in out, out
        expect(bob("attack"), "pwrite=EBADF mmap_rw=EACCES mprotect=EACCES "
               "ftruncate=EINVAL reopen_rw=EACCES wrote=0")
        prod.stdin.write("byte\n")
        prod.stdin.flush()
        expect(prod.stdout.readline().strip(), "P")
        expect(d.count("cannot make it owner-only"), 0)
        bob.close()
        prod.stdin.close()
        assert prod.wait(timeout=TIMEOUT) == 0
    finally:
        d.stop()


PY_CLIENT = """
import sys
import tensorbroker as tb
c = tb.Client(sys.argv[1])
try:
    c.acquire("acl/w", timeout=0)
except tb.PermissionError as e:
    print(isinstance(e, PermissionError), e.name, e.message)
else:
    print("acquired")
"""


def test_python_user(t):
    """The binding, as another uid, raises tensorbroker.PermissionError (a
    builtin PermissionError too) with the daemon's message."""
    if not t.python or not t.pythonpath:
        print("  (skipped: no Python binding built)")
        return
    d = Daemon(t.daemon, RULES)
    try:
        alice = Peer(t.peer, d, t.ids["tbacl-alice"])
        expect(alice("publish acl/w " + alice.value("register ro", "buffer")),
               "0 version=1")
        b = t.ids["tbacl-bob"]
        out = subprocess.run(as_user(*b) + [t.python, "-c", PY_CLIENT, d.sock],
                             env=dict(os.environ, PYTHONPATH=t.pythonpath),
                             capture_output=True, text=True, timeout=TIMEOUT)
        expect(out.stdout.strip(),
               'True TB_EPERM uid %d may not acquire "acl/w": rule '
               '[access "acl/"] acquire = group:tbacl-video owner' % b[0])
        alice.close()
    finally:
        d.stop()


class T:
    pass


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    if os.geteuid() != 0:
        skip("needs root to run clients as other uids (CI runs as root)")
    t = T()
    t.daemon, t.peer = sys.argv[1], sys.argv[2]
    t.ids = ensure_users()
    t.python = os.environ.get("TB_PYTHON")
    t.pythonpath = os.environ.get("TB_PYTHONPATH")
    t.tbctl = os.environ.get("TB_TBCTL")
    failed = 0
    tests = [test_foreign_uid_refused, test_group_grants_and_write, test_sighup,
             test_python_user, test_nonroot_daemon_library_producer]
    for fn in tests:
        try:
            fn(t)
            print("PASS " + fn.__name__)
        except Exception:  # noqa: BLE001 - report every test
            failed += 1
            print("FAIL " + fn.__name__)
            traceback.print_exc()
    print("%d of %d failed" % (failed, len(tests)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
