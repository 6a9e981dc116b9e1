#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A tensorbroker pipeline in Python: one producer, two consumers, each its
own process, frames passed without copies.

    tensorbrokerd --socket /tmp/tb.sock &
    python3 pipeline.py --socket /tmp/tb.sock --frames 100

or let it start a private daemon (the binary from $TB_DAEMON):

    python3 pipeline.py --spawn-daemon

The producer writes each frame into a ring of broker buffers
(Client.ring(), arrays from Client.empty(), so publishing copies nothing),
which hands a buffer out again only once no consumer reads the version
published from it (wait_free()). Consumers take
each next version with acquire(after=...), view it with numpy.from_dlpack (a
read-only view of the producer's memory) and check it. A slow consumer may
skip versions that already left the channel's history; it never sees a
half-written frame.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np
import tensorbroker as tb

CHANNEL = "example/frames"
SHAPE = (120, 160, 3)
RING = 4                # buffers the producer cycles through
HISTORY = RING - 1      # versions the channel keeps: one buffer is always free


def frame_value(n):
    return n % 251


def producer(sock, frames, consumers_done):
    with tb.Client(socket=sock, name="producer") as c:
        ring = c.ring(CHANNEL, SHAPE, np.uint8, slots=RING, history_depth=HISTORY)
        for n in range(frames):
            frame = ring.next(timeout=30)   # no consumer reads it any more
            frame[...] = frame_value(n)
            ring.publish(metadata=b"frame %d" % n)
        c.publish(CHANNEL, np.zeros(1, np.uint8), metadata=b"end")  # copied in
        consumers_done()   # stay the channel's publisher until they finish
    print("producer: %d frames published" % frames)


def consumer(sock, name):
    seen = bad = 0
    last = 0
    with tb.Client(socket=sock, name=name) as c:
        print("ready", flush=True)          # tells main() we are connected
        while True:
            with c.acquire(CHANNEL, after=last, timeout=30) as lease:
                last = lease.version
                if lease.metadata == b"end":
                    break
                n = int(lease.metadata.split()[1])
                x = np.from_dlpack(lease)        # zero copy, read-only
                assert not x.flags.writeable
                if x.shape != SHAPE or not (x == frame_value(n)).all():
                    bad += 1
                seen += 1
                del x                            # let go before release
    print("%s: %d frames seen, %d bad" % (name, seen, bad), file=sys.stderr)
    return 1 if bad or seen == 0 else 0


def spawn_daemon():
    path = os.environ.get("TB_DAEMON") or shutil.which("tensorbrokerd")
    if not path:
        print("no tensorbrokerd (set TB_DAEMON)", file=sys.stderr)
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="tb-example-")
    sock = os.path.join(tmp, "tb.sock")
    r, w = os.pipe()
    proc = subprocess.Popen([path, "--socket", sock, "--ready-fd", str(w), "--log-level", "warn"],
                            pass_fds=(w,))
    os.close(w)
    with os.fdopen(r, "rb") as f:
        if f.readline() != b"READY\n":
            sys.exit("tensorbrokerd did not start")
    return proc, sock, tmp


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=None, help="daemon socket (default: tensorbroker.default_socket_path())")
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--spawn-daemon", action="store_true")
    ap.add_argument("--role", choices=["consumer"], help=argparse.SUPPRESS)
    ap.add_argument("--name", default="consumer")
    args = ap.parse_args()
    if args.role == "consumer":
        return consumer(args.socket or None, args.name)

    daemon = tmp = None
    sock = args.socket
    if args.spawn_daemon:
        daemon, sock, tmp = spawn_daemon()
    try:
        consumers = [subprocess.Popen([sys.executable, __file__, "--role", "consumer",
                                       "--socket", sock or "", "--name", name],
                                      stdout=subprocess.PIPE)
                     for name in ("consumer-a", "consumer-b")]
        for p in consumers:                    # wait until both are connected
            if p.stdout.readline() != b"ready\n":
                sys.exit("a consumer failed to start")
        rcs = []
        producer(sock, args.frames,
                 lambda: rcs.extend(p.wait(timeout=120) for p in consumers))
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(rc == 0 for rc in rcs) else 1


if __name__ == "__main__":
    sys.exit(main())
