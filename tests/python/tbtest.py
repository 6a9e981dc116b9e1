# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the Python tests: start a private tensorbrokerd, run a
peer process. No sleeps: the daemon says READY on a pipe, peers talk over
their stdin/stdout."""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.environ.get("TB_PYTHON", sys.executable)


class Skip(Exception):
    """Raise to mark a test skipped (the runner counts it)."""


def daemon_path():
    path = os.environ.get("TB_DAEMON")
    if not path or not os.access(path, os.X_OK):
        raise Skip("TB_DAEMON does not name the tensorbrokerd binary")
    return path


@contextlib.contextmanager
def daemon(*extra_args):
    """Start tensorbrokerd on a socket in a fresh temporary directory, wait
    for READY on --ready-fd, yield the socket path, then SIGTERM and reap."""
    tmp = tempfile.mkdtemp(prefix="tbpy-")
    sock = os.path.join(tmp, "tb.sock")
    r, w = os.pipe()
    proc = subprocess.Popen(
        [daemon_path(), "--socket", sock, "--ready-fd", str(w), "--log-level", "warn",
         *extra_args], pass_fds=(w,), stdin=subprocess.DEVNULL)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as ready:
            line = ready.readline()
        if line != b"READY\n":
            raise RuntimeError("tensorbrokerd did not become ready (exit %r)" % proc.poll())
        yield sock
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
        if rc not in (0, -signal.SIGTERM):
            raise RuntimeError("tensorbrokerd exited with %d" % rc)


class Peer:
    """A child Python process running tests/python/peer.py: send it one JSON
    command per line, read one JSON answer per line."""

    def __init__(self, sock, *, env=None, script=None):
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen(
            [PYTHON, script or os.path.join(HERE, "peer.py"), sock],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=e, text=True)

    def call(self, **cmd):
        self.send(**cmd)
        return self.recv()

    def send(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def recv(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("peer died (exit %r)" % self.proc.wait())
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError("peer: " + answer["error"])
        return answer

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
        rc = self.proc.wait(timeout=60)
        self.proc.stdout.close()
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is not None and self.proc.poll() is None:
            self.proc.kill()
        self.close()


def require_torch_cuda():
    """Skip unless torch with a CUDA device and a CUDA-capable libtensorbroker
    are here; returns torch."""
    try:
        import torch
    except ImportError:
        raise Skip("torch is not installed")
    if not torch.cuda.is_available():
        raise Skip("no CUDA device")
    import tensorbroker
    if not tensorbroker.cuda_available():
        raise Skip("libtensorbroker cannot load libcuda.so.1")
    return torch


def require_module(name):
    try:
        return __import__(name)
    except ImportError:
        raise Skip(name + " is not installed")
