# SPDX-License-Identifier: Apache-2.0
"""GPU: a ring producer SIGKILLed mid-stream and a new producer process
started on the same channel (issue 20, second half).

Before the fix, versions whose legacy-IPC memory died with their producer
were still granted, and a new consumer's acquire failed with TB_ECUDA
(cuIpcOpenMemHandle: CUDA_ERROR_INVALID_HANDLE). Now such versions are never
granted to a new lease; an acquire on a channel whose producer is gone waits
within its timeout for a new producer, whose versions carry on the
numbering (so acquire(after=v) carries on), and gives TB_ECLOSED when the
timeout runs out; leases held before the death keep working.

The pipeline (gpu_ring_producer.py, gpu_ring_consumer.py):
  1. producer P1 (frames from 1, --sync-publish so that no consumer stream
     is left waiting on a ready event the dead process can never fire,
     docs/cuda.md "What happens on a crash") streams through its ring;
     two ring consumers (torch side stream, variants torch_side and
     torch_release_stream) follow it, each acquire with a 60 s timeout;
  2. after P1 announces frame ANNOUNCE, a holder process acquires the newest
     version, checks it and keeps the tensor; P1 is SIGKILLed at once (it
     is then blocked in wait_free on the held version, or close to it);
  3. once the daemon has closed the channel: a fresh consumer (probe) with
     a 2 s timeout must get TB_ECLOSED; another fresh consumer with a 60 s
     timeout starts waiting (with --vmm rings, test_vmm_...: both read
     producer 1's last version at once, since VMM memory outlives it);
  4. producer P2 starts on the same channel with frames from P2_FIRST: the
     waiting probe must get one of P2's frames (data checked on the
     device), the ring consumers carry on with P2's frames to its end
     marker with zero wrong frames and no error at all (any TB_ECUDA
     fails), and the holder's tensor still holds its frame number before
     it is released.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tbtest  # noqa: E402
from tbtest import daemon  # noqa: E402

torch = tbtest.require_torch_cuda()
import tensorbroker as tb  # noqa: E402
from gpu_ring_util import Proc, PRODUCER, CONSUMER  # noqa: E402

CH = "ring/restart"
ANNOUNCE = 300          # P1 is killed once it has published this frame
P2_FIRST = 1_000_000    # P2's first frame number
P2_FRAMES = 1000
MIN_READ_P1 = 20
MIN_READ_P2 = 50


def wait_channel_closed(watch, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = watch.poll_notice(timeout=max(0.0, deadline - time.monotonic()))
        if n is not None and n["type"] == "channel_closed" and n["channel"] == CH:
            return n
    raise AssertionError("no channel_closed notice within %d s of the kill" % timeout)


def run_restart(vmm):
    """The pipeline above; vmm: both producers' rings are CUDA VMM buffers
    (gpu_ring_producer.py --vmm), whose versions outlive their producer, so
    the fresh consumer with no producer alive reads producer 1's last
    version instead of getting TB_ECLOSED."""
    variants = ("torch_side", "torch_release_stream")
    kind = ("--vmm",) if vmm else ()
    with daemon() as sock, \
            tb.Client(socket=sock, name="restart-watch", prefetch=False) as watch:
        procs = []
        try:
            ring = [Proc(CONSUMER, sock, "--variant", v, "--channel", CH, "--timeout", 60,
                         "--deadline", 200, "--split", P2_FIRST, name=v) for v in variants]
            procs += ring
            hold = Proc(CONSUMER, sock, "--variant", "hold", "--channel", CH,
                        "--timeout", 30, name="hold")
            procs.append(hold)
            p1 = Proc(PRODUCER, sock, "--channel", CH, "--frames", 100000, "--sync-publish",
                      "--warmup", *kind,
                      "--announce", ANNOUNCE, "--period-us", 200, "--wait-free-timeout", 120,
                      name="producer-1")
            procs.append(p1)
            for p in ring + [hold, p1]:
                p.expect("ready", 120)
            for p in ring:
                p.expect("warm", 120)          # each has read P1's warm-up frame
            p1.say("go")
            ann = p1.expect("announce", 60)

            # a lease taken before the death, kept across it
            watch.subscribe(CH)
            hold.say("hold")
            held = hold.expect("held", 60)
            assert held["ok"], "the held version read wrong before the kill: %s" % held

            p1.kill()
            assert p1.proc.returncode == -9, p1.proc.returncode
            closed = wait_channel_closed(watch)
            print("killed producer 1 after frame %d (version %d); holder has frame %d "
                  "(version %d); channel_closed: %s"
                  % (ann["announce"], ann["version"], held["held"], held["version"],
                     closed.get("reason")), flush=True)

            # fresh consumers while no producer is alive
            f1 = Proc(CONSUMER, sock, "--variant", "probe", "--channel", CH, "--timeout", 2,
                      name="fresh-2s")
            f2 = Proc(CONSUMER, sock, "--variant", "probe", "--channel", CH, "--timeout", 60,
                      name="fresh-60s")
            procs += [f1, f2]
            r1 = f1.expect(("error", "got"), 120)
            if vmm:
                assert "got" in r1 and r1["ok"] and r1["got"] < P2_FIRST, \
                    "a fresh consumer with no producer alive: want producer 1's " \
                    "last frame (VMM memory outlives it), got %s" % r1
            else:
                assert r1.get("error") == "TB_ECLOSED", \
                    "a fresh consumer with no producer alive: want TB_ECLOSED, got %s" % r1
            assert f1.finish(60) == 0
            f2.expect("ready", 120)

            # the restart
            p2 = Proc(PRODUCER, sock, "--channel", CH, "--frames", P2_FRAMES,
                      "--first-frame", P2_FIRST, "--period-us", 200, *kind,
                      name="producer-2")
            procs.append(p2)
            p2.expect("ready", 120)
            p2.say("go")
            r2 = f2.expect(("error", "got"), 120)
            assert "got" in r2, "the waiting fresh consumer failed: %s" % r2
            if vmm:
                # nothing to wait for: producer 1's last version is granted
                assert r2["got"] < P2_FIRST and r2["ok"], \
                    "the fresh consumer got %s, not producer 1's last frame" % r2
            else:
                assert r2["got"] >= P2_FIRST and r2["ok"], \
                    "the waiting fresh consumer got %s, not a checked frame of " \
                    "producer 2" % r2
            assert f2.finish(60) == 0
            done2 = p2.expect("done", 120)
            assert done2["first_version"] > held["version"], \
                "producer 2's versions do not carry on the numbering: %s" % done2
            results = [p.expect("result", 150) for p in ring]

            hold.say("check")
            checked = hold.expect("checked", 60)
            hold.say("quit")
            p2.say("quit")
            for p in ring + [hold, p2]:
                assert p.finish(60) == 0, "%s failed" % p.name
        finally:
            for p in procs:
                if p.proc.poll() is None:
                    p.kill()

    print("%s: fresh consumer (2 s, no producer): %s after %.1f s; fresh consumer (60 s): "
          "frame %d after %.1f s"
          % ("vmm" if vmm else "legacy IPC",
             r1.get("error") or "frame %d" % r1["got"], r1["waited_s"], r2["got"],
             r2["waited_s"]))
    print("producer 2: %d frames (%d..%d), versions %d..%d"
          % (done2["frames"], done2["first_frame"], done2["last_frame"],
             done2["first_version"], done2["last_version"]))
    for res in results:
        print("%s: read %d frames (%d of producer 1, %d of producer 2; frames %s..%s), "
              "wrong %d, errors %s" % (res["variant"], res["read"],
                                       res["read"] - res["read_after_split"],
                                       res["read_after_split"], res["first_frame"],
                                       res["last_frame"], res["wrong"], res["errors"]))
    print("holder: frame %d still read %s after the restart (%d wrong elements)"
          % (checked["checked"], "right" if checked["ok"] else "WRONG",
             checked["wrong_elements"]), flush=True)

    for res in results:
        assert "TB_ECUDA" not in res["errors"], "%s: %s" % (res["variant"], res)
        assert res["errors"] == {}, "%s: acquire failed: %s" % (res["variant"], res)
        assert res["ended"], "%s did not reach producer 2's end marker" % res["variant"]
        assert res["not_increasing"] == 0, res
        assert res["wrong"] == 0, "%s: %d wrong frames" % (res["variant"], res["wrong"])
        assert res["read"] - res["read_after_split"] >= MIN_READ_P1, res
        assert res["read_after_split"] >= MIN_READ_P2, res
    assert checked["checked"] == held["held"] and checked["ok"], checked


def test_producer_killed_and_restarted():
    run_restart(vmm=False)


def test_vmm_producer_killed_and_restarted():
    run_restart(vmm=True)
