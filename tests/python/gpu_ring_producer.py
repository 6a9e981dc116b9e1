# SPDX-License-Identifier: Apache-2.0
"""Ring-buffer producer for gpu_test_ring.py and gpu_test_restart.py, in its
own process: what a torch user writes to stream frames through tensorbroker.

    gpu_ring_producer.py SOCKET [options]

A ring of --ring CUDA int32 tensors of --elems elements each. Frame f (from
--first-frame on, --frames of them) goes into buffer f % ring: first
c.wait_free(channel, <version last published from that buffer>, stream=s),
as docs/python.md says, so that s waits for every consumer still reading
the old contents; then buf.fill_(f) on s (a real kernel), and
c.publish(channel, buf, stream=s, metadata=b"<f>"). Consumers check on the
device that every element equals the frame number in the metadata.

Protocol: JSON lines on stdout. Prints {"ready": true} once connected and
set up (with --warmup, after publishing frame first-frame - 1, so that
consumers can warm up on it), then waits for "go" on stdin. While producing it prints
{"announce": f, "version": v} after publishing frame --announce (if given).
After the last frame it publishes a one-element tensor with metadata b"end"
(the consumers stop there), prints {"done": true, "frames": N, ...} and
waits for "quit" before it closes its session (a producer that left is
"gone": its versions would no longer be granted).

Options:
  --no-wait-free   the control: rewrite buffers without waiting, so slow
                   consumers must see later frames' data.
  --sync-publish   synchronise s before each publish, so every published
                   version's GPU work has finished: a SIGKILL then never
                   leaves a consumer stream waiting on a ready event that
                   can no longer fire (docs/cuda.md, "What happens on a
                   crash"); used by the restart test's first producer.
  --period-us P    pace publishing to one frame per P microseconds (host
                   busy-wait), so that consumers read a known share of the
                   frames whatever the host's speed.
  --vmm            the ring's tensors are torch views of Client.empty(...,
                   device="cuda") arrays (CUDA VMM buffers, whose versions
                   outlive this process) instead of torch allocations
                   (legacy CUDA IPC).
"""
import argparse
import json
import os
import sys
import time

import torch
import tensorbroker as tb


def emit(**kw):
    print(json.dumps(kw), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("socket")
    ap.add_argument("--channel", default="ring/frames")
    ap.add_argument("--frames", type=int, default=1500)
    ap.add_argument("--first-frame", type=int, default=1)
    ap.add_argument("--elems", type=int, default=1 << 20)
    ap.add_argument("--ring", type=int, default=3)
    ap.add_argument("--period-us", type=float, default=200.0)
    ap.add_argument("--no-wait-free", action="store_true")
    ap.add_argument("--sync-publish", action="store_true")
    ap.add_argument("--announce", type=int, default=0)
    ap.add_argument("--wait-free-timeout", type=float, default=60.0)
    ap.add_argument("--vmm", action="store_true")
    ap.add_argument("--warmup", action="store_true",
                    help="publish frame first-frame - 1 before saying ready")
    args = ap.parse_args()

    torch.zeros(1, device="cuda")            # the primary context, current here
    c = tb.Client(socket=args.socket, name="ring-producer")
    s = torch.cuda.Stream()                  # non-blocking, as users' side streams are
    if args.vmm:
        bufs = [torch.from_dlpack(c.empty((args.elems,), "int32", device="cuda"))
                for _ in range(args.ring)]
        for b in bufs:
            b.fill_(-1)
    else:
        bufs = [torch.full((args.elems,), -1, dtype=torch.int32, device="cuda")
                for _ in range(args.ring)]
    endbuf = torch.zeros(1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()

    last = [None] * args.ring                # version last published from each buffer
    counts = {"wait_frees": 0}

    def publish_frame(f):
        slot = f % args.ring
        if last[slot] is not None and not args.no_wait_free:
            # the old version left the history (depth 1) two frames ago;
            # wait until no consumer holds it, and make s wait for their
            # done events, before the fill below overwrites it
            c.wait_free(args.channel, last[slot], timeout=args.wait_free_timeout, stream=s)
            counts["wait_frees"] += 1
        with torch.cuda.stream(s):
            bufs[slot].fill_(f)
            if args.sync_publish:
                s.synchronize()
            v = c.publish(args.channel, bufs[slot], stream=s, metadata=b"%d" % f)
        last[slot] = v
        return v

    warm_version = None
    if args.warmup:
        # one frame before "go", so that consumers can open the channel,
        # compile and capture before the timed run
        warm_version = publish_frame(args.first_frame - 1)
    emit(ready=True, pid=os.getpid(), warmup_version=warm_version)

    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit("producer: expected 'go', got %r" % line)

    first_version = last_version = None
    t0 = time.perf_counter()
    period = args.period_us / 1e6
    for k in range(args.frames):
        f = args.first_frame + k
        due = t0 + k * period
        while time.perf_counter() < due:
            pass
        v = publish_frame(f)
        if first_version is None:
            first_version = v
        last_version = v
        if args.announce and f == args.announce:
            emit(announce=f, version=v)
    elapsed = time.perf_counter() - t0
    with torch.cuda.stream(s):
        s.synchronize()
        end_version = c.publish(args.channel, endbuf, stream=s, metadata=b"end")
    emit(done=True, frames=args.frames, first_frame=args.first_frame,
         last_frame=args.first_frame + args.frames - 1, first_version=first_version,
         last_version=last_version, end_version=end_version,
         wait_frees=counts["wait_frees"],
         elapsed_s=round(elapsed, 3), wait_free=not args.no_wait_free)

    line = sys.stdin.readline()          # "quit" (or EOF): the consumers are done
    s.synchronize()
    c.close()


if __name__ == "__main__":
    main()
