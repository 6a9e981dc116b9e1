# SPDX-License-Identifier: Apache-2.0
"""GPU: Client.empty(shape, dtype, device="cuda"), a CUDA VMM buffer
(docs/cuda.md, "VMM buffers").

- PyTorch (and CuPy, JAX where installed) take the array with from_dlpack
  and write it without a copy; published, a consumer process reads the
  data with each library (gpu_peer.py), and the channel says cuda-vmm.
- A producer process that publishes from such an array and is SIGKILLed
  leaves its version readable: a consumer started afterwards reads it.
- One killed while its kernel still writes the version it published:
  a consumer's acquire is refused (TB_ECLOSED) or granted with the data
  whole on its stream, never read early and never left waiting for good."""
import json
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tbtest  # noqa: E402
from tbtest import daemon, PYTHON, HERE  # noqa: E402

torch = tbtest.require_torch_cuda()
import tensorbroker as tb  # noqa: E402

N = 1 << 20


def peer(sock, lib, channel):
    out = subprocess.run([PYTHON, os.path.join(HERE, "gpu_peer.py"), sock, lib, channel],
                         stdout=subprocess.PIPE, text=True, timeout=300)
    assert out.returncode == 0, out
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_empty_cuda_with_frameworks():
    with daemon() as sock, tb.Client(socket=sock, name="producer") as c:
        a = c.empty((N,), "float32", device="cuda")
        t = torch.from_dlpack(a)
        assert t.data_ptr() == a.data_ptr and t.device.type == "cuda"
        t.fill_(3.0)
        c.publish("vmm/x", t, stream=torch.cuda.current_stream())
        assert {ch["name"]: ch["memory_kind"] for ch in c.channels()} == {"vmm/x": "cuda-vmm"}
        libs = ["torch"]
        for name in ("cupy", "jax"):
            try:
                __import__(name)
                libs.append(name)
            except ImportError:
                pass
        for lib in libs:
            got = peer(sock, lib, "vmm/x")
            assert got["sum"] == 3.0 * N and got["shape"] == [N], (lib, got)
        try:
            import cupy
            y = cupy.from_dlpack(c.empty((4, 8), "int32", device="cuda"))
            y[:] = 5
            assert int(y.sum()) == 5 * 32
        except ImportError:
            pass


PRODUCER = r"""
import sys, torch, tensorbroker as tb
c = tb.Client(socket=sys.argv[1], name="doomed-producer")
a = c.empty((%d,), "float32", device="cuda")
torch.from_dlpack(a).fill_(7.0)
torch.cuda.synchronize()
c.publish("vmm/kill", a, stream=torch.cuda.current_stream())
print("published", flush=True)
sys.stdin.read()
""" % N


def kill_after_publish(sock, script):
    """Run a producer script until it says "published", then SIGKILL it;
    returns the seconds from the kill to the process's end."""
    import time
    p = subprocess.Popen([PYTHON, "-c", script, sock], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "published"
    t0 = time.monotonic()
    p.send_signal(signal.SIGKILL)
    assert p.wait(timeout=120) == -signal.SIGKILL
    p.stdout.close()
    p.stdin.close()
    return time.monotonic() - t0


def test_version_outlives_killed_producer():
    with daemon() as sock:
        kill_after_publish(sock, PRODUCER)
        got = peer(sock, "torch", "vmm/kill")    # a consumer that starts now
        assert got["sum"] == 7.0 * N, got


PENDING_PRODUCER = r"""
import sys, torch, tensorbroker as tb
c = tb.Client(socket=sys.argv[1], name="doomed-producer")
a = c.empty((%d,), "float32", device="cuda")
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    torch.cuda._sleep(60_000_000_000)  # ~30 s of GPU time before the write
    torch.from_dlpack(a).fill_(7.0)
c.publish("vmm/pending", a, stream=s.cuda_stream)
print("published", flush=True)
sys.stdin.read()
""" % N


def test_version_killed_with_work_in_flight():
    # The product's promise, whatever the driver does with the dead
    # process's work: a version is refused (TB_ECLOSED: its work is known
    # not to have finished) or granted with its data whole on the stream
    # that acquired it, never read before that work is done. Measured on
    # an H200 (driver 580.159.04): the killed process's queued kernels ran
    # to their end, and the version was granted with its data whole.
    import time
    with daemon() as sock:
        took = kill_after_publish(sock, PENDING_PRODUCER)
        with tb.Client(socket=sock, name="after") as c:
            # the daemon has seen the producer's session end (a consumer
            # that acquires before it does is not told of the death)
            deadline = time.monotonic() + 30
            while any(x["name"] == "doomed-producer" for x in c.sessions()):
                assert time.monotonic() < deadline, c.sessions()
            side = torch.cuda.Stream()
            t0 = time.monotonic()
            try:
                lease = c.acquire("vmm/pending", timeout=60, stream=side.cuda_stream)
            except tb.Error as e:
                assert e.code == tb.TB_ECLOSED, e
                side.synchronize()  # nothing waits on the dead producer's event
                print("refused: %s (the kill took %.1f s)" % (e, took))
                return
            acquired = time.monotonic() - t0
            with torch.cuda.stream(side):
                total = torch.from_dlpack(lease).double().sum()
                done = torch.cuda.Event()
                done.record(side)
            # bounded: a stream waiting for good fails the test, not hangs it
            deadline = time.monotonic() + 120
            while not done.query():
                assert time.monotonic() < deadline, (
                    "granted, and the stream that acquired it still waits "
                    "after 120 s (acquire took %.1f s)" % acquired)
                time.sleep(0.05)
            read = time.monotonic() - t0
            print("granted: the acquire took %.1f s, the read ended %.1f s "
                  "after it began; the kill took %.1f s" % (acquired, read, took))
            assert float(total.item()) == 7.0 * N, (
                "granted with the data incomplete: sum %r of %r"
                % (float(total.item()), 7.0 * N))
            lease.release(stream=side)


FINISHED_PRODUCER = PENDING_PRODUCER.replace(
    "60_000_000_000", "200_000_000").replace(
    'c.publish("vmm/pending", a, stream=s.cuda_stream)',
    'c.publish("vmm/pending", a, stream=s.cuda_stream)\ns.synchronize()')


def test_version_finished_before_the_kill():
    # published with its work in flight, finished before the producer was
    # killed: the buffer's ready signal says so, and a new consumer reads it
    with daemon() as sock:
        kill_after_publish(sock, FINISHED_PRODUCER)
        got = peer(sock, "torch", "vmm/pending")
        assert got["sum"] == 7.0 * N, got
