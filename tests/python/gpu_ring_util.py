# SPDX-License-Identifier: Apache-2.0
"""Helpers for gpu_test_ring.py and gpu_test_restart.py: their producer and
consumer processes (gpu_ring_producer.py, gpu_ring_consumer.py) speak JSON
lines on stdout and take words on stdin. A thread reads each child's
stdout, so every wait here is bounded; other output is passed to stderr."""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from tbtest import PYTHON, HERE

PRODUCER = os.path.join(HERE, "gpu_ring_producer.py")
CONSUMER = os.path.join(HERE, "gpu_ring_consumer.py")


class Proc:
    """One child process: Proc(script, args..., name=...)."""

    def __init__(self, script, *args, name, env=None):
        self.name = name
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen([PYTHON, script, *[str(a) for a in args]],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=e)
        self.lines = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            text = line.strip()
            if text.startswith("{"):
                try:
                    self.lines.put(json.loads(text))
                    continue
                except ValueError:
                    pass
            if text:
                print("[%s] %s" % (self.name, text), file=sys.stderr, flush=True)
        self.lines.put(None)

    def expect(self, keys, timeout):
        """The next JSON line holding one of keys (a str or a tuple);
        AssertionError when none comes within timeout seconds or the child
        ends first."""
        if isinstance(keys, str):
            keys = (keys,)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("%s: no %s within %.0f s (running: %s)"
                                     % (self.name, "/".join(keys), timeout,
                                        self.proc.poll() is None))
            try:
                msg = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if msg is None:
                self.lines.put(None)
                try:
                    code = self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    code = "still running"
                raise AssertionError("%s ended (exit %s) before saying %s"
                                     % (self.name, code, "/".join(keys)))
            if any(k in msg for k in keys):
                return msg
            print("[%s] %s" % (self.name, json.dumps(msg)), file=sys.stderr, flush=True)

    def say(self, word):
        try:
            self.proc.stdin.write(word + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def finish(self, timeout=60):
        """Close its stdin and wait for it; returns the exit code (the child
        is killed, and AssertionError raised, past timeout)."""
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("%s did not exit within %.0f s" % (self.name, timeout))

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(timeout=60)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            if exc[0] is not None:
                self.kill()
            else:
                self.finish()
        self.reader.join(timeout=10)
        return False
