# SPDX-License-Identifier: Apache-2.0
"""GPU: Client.empty(shape, dtype, device="cuda"), a CUDA VMM buffer
(docs/cuda.md, "VMM buffers"). NOT YET RUN ON A GPU.

- PyTorch (and CuPy, JAX where installed) take the array with from_dlpack
  and write it without a copy; published, a consumer process reads the
  data with each library (gpu_peer.py), and the channel says cuda-vmm.
- A producer process that publishes from such an array and is SIGKILLed
  leaves its version readable: a consumer started afterwards reads it.
- One killed while its kernel still writes the version it published
  leaves a version nobody may read: a consumer's acquire fails with
  TB_ECLOSED rather than leave a stream waiting for good."""
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
            try:
                lease = c.acquire("vmm/pending", timeout=10, stream=side.cuda_stream)
            except tb.Error as e:
                assert e.code == tb.TB_ECLOSED, e
                side.synchronize()  # nothing waits on the dead producer's event
                return
            # granted: say what the stream found, without waiting for good
            with torch.cuda.stream(side):
                total = torch.from_dlpack(lease).double().sum()
                done = torch.cuda.Event()
                done.record(side)
            deadline = time.monotonic() + 60
            while not done.query() and time.monotonic() < deadline:
                time.sleep(0.1)
            seen = ("sum %r of %r" % (float(total.item()), 7.0 * N)
                    if done.query() else "its stream still waits after 60 s")
            raise AssertionError(
                "the version of a producer killed mid-write was granted (the "
                "kill took %.1f s to end the process; %s)" % (took, seen))


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
