# SPDX-License-Identifier: Apache-2.0
"""GPU: CUDA tensors across processes between torch, CuPy and JAX, zero copy
(the lead runs these on the H200; they skip elsewhere)."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tbtest  # noqa: E402
from tbtest import daemon, PYTHON, HERE  # noqa: E402

torch = tbtest.require_torch_cuda()
import tensorbroker as tb  # noqa: E402


def consume(sock, lib, channel):
    out = subprocess.run([PYTHON, os.path.join(HERE, "gpu_peer.py"), sock, lib, channel],
                         stdout=subprocess.PIPE, text=True, timeout=300)
    if out.returncode == 77 or out.returncode != 0:
        raise AssertionError("%s consumer failed (exit %d)" % (lib, out.returncode))
    return json.loads(out.stdout.strip().splitlines()[-1])


def torch_source():
    x = torch.arange(4096 * 64, dtype=torch.float32, device="cuda").reshape(4096, 64)
    x.mul_(0.5)              # pending work on the current stream
    return x, float(x.double().sum().item())


def check(got, expected, shape):
    assert abs(got["sum"] - expected) <= 1e-6 * abs(expected) + 1e-3, (got, expected)
    assert got["shape"] == list(shape), got


def run_pair(lib, contract="spec"):
    with daemon() as sock, tb.Client(socket=sock, name="torch-producer",
                                     stream_contract=contract) as c:
        x, expected = torch_source()
        s = torch.cuda.current_stream()
        c.publish("gpu/" + lib, x, stream=s)
        assert c.last_publish_zero_copy
        check(consume(sock, lib, "gpu/" + lib), expected, x.shape)


def test_torch_to_torch():
    run_pair("torch")


def test_torch_to_torch_channel_named_at_connect():
    # the consumer names the channel at connect, so its acquire opens the
    # buffer (and the ready event of the producer's pending work) while the
    # daemon answers; the sum is right only if its stream still waited
    run_pair("torch-named")


def test_torch_to_torch_no_sync_contract_implicit_stream():
    # stream=None on publish under no_sync: torch.__dlpack__(stream=-1) and no
    # ready event; the producer orders its work itself.
    with daemon() as sock, tb.Client(socket=sock, stream_contract="no_sync") as c:
        x, expected = torch_source()
        torch.cuda.synchronize()
        c.publish("gpu/ns", x)
        check(consume(sock, "torch", "gpu/ns"), expected, x.shape)


def test_torch_to_cupy():
    tbtest.require_module("cupy")
    run_pair("cupy")


def test_torch_to_jax():
    tbtest.require_module("jax")
    run_pair("jax")


def test_cupy_to_torch():
    cupy = tbtest.require_module("cupy")
    with daemon() as sock, tb.Client(socket=sock, name="cupy-producer") as c:
        x = cupy.arange(1000 * 33, dtype=cupy.float32).reshape(1000, 33) * 3
        expected = float(x.astype(cupy.float64).sum().get())
        c.publish("gpu/cupy", x, stream=cupy.cuda.get_current_stream())
        check(consume(sock, "torch", "gpu/cupy"), expected, x.shape)


def test_torch_noncontiguous_and_dtypes():
    with daemon() as sock, tb.Client(socket=sock) as c:
        base = torch.randn(256, 128, device="cuda")
        for i, t in enumerate([base[:, ::2], base.t(), base.half(), base.to(torch.bfloat16),
                               (base > 0), base.to(torch.int8)]):
            ch = "gpu/dt%d" % i
            c.publish(ch, t, stream=torch.cuda.current_stream())
            got = consume(sock, "torch", ch)
            check(got, float(t.double().sum().item()), t.shape)


def test_same_process_lease_to_torch():
    with daemon() as sock, tb.Client(socket=sock) as p, tb.Client(socket=sock) as c:
        x, expected = torch_source()
        p.publish("gpu/self", x, stream=torch.cuda.current_stream())
        with c.acquire("gpu/self") as lease:
            assert lease.__dlpack_device__() == (2, x.device.index)
            y = torch.from_dlpack(lease)
            assert abs(float(y.double().sum().item()) - expected) < 1e-3
            del y


def test_acquire_releases_previous_cuda_lease():
    # acquire(release=, release_stream=) with CUDA leases: the previous
    # lease ends in the same request, its done event on the given stream,
    # and the producer can wait for it to be free.
    with daemon() as sock, tb.Client(socket=sock) as p, tb.Client(socket=sock) as c:
        x1, e1 = torch_source()
        x2 = x1 * 2
        s = torch.cuda.current_stream()
        v1 = p.publish("gpu/rel", x1, stream=s)
        first = c.acquire("gpu/rel", exact=v1)
        y = torch.from_dlpack(first)
        assert abs(float(y.double().sum().item()) - e1) < 1e-3
        del y
        v2 = p.publish("gpu/rel", x2, stream=s, history_depth=1)
        second = c.acquire("gpu/rel", after=v1, release=first, release_stream=s)
        assert first.released and second.version == v2
        p.wait_free("gpu/rel", v1, timeout=5, stream=s)
        z = torch.from_dlpack(second)
        assert abs(float(z.double().sum().item()) - 2 * e1) < 1e-2
        del z
        second.release(stream=s)


def test_subscribed_consumer_opens_new_buffers_ahead():
    # A subscribed consumer in its own process, a CUDA context current: each
    # round the producer publishes a new allocation whose last kernel is
    # still queued behind a ~10 ms sleep on its stream. The consumer's
    # library opens the buffer and its ready event as it reads the notice,
    # either in poll_notice ("notice") or inside the acquire's wait
    # ("acquire"); the sum it reads is right only if the acquire still made
    # its stream wait for that kernel.
    with daemon() as sock, tb.Client(socket=sock, name="torch-producer") as p:
        peer = subprocess.Popen(
            [PYTHON, os.path.join(HERE, "gpu_peer.py"), sock, "follow", "gpu/follow"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert json.loads(peer.stdout.readline()) == {"ready": True}
            kept = []                     # every buffer stays allocated: new ones each round
            s = torch.cuda.current_stream()
            for i in range(6):
                x = torch.full((1024, 256), float(i + 1), device="cuda")
                torch.cuda.synchronize()
                torch.cuda._sleep(int(2e7))   # the kernel below runs ~10 ms from now
                x.mul_(2.0)
                kept.append(x)
                v = p.publish("gpu/follow", x, stream=s)
                peer.stdin.write("%s %d\n" % ("notice" if i % 2 == 0 else "acquire", v))
                peer.stdin.flush()
                got = json.loads(peer.stdout.readline())
                expected = 2.0 * (i + 1) * x.numel()
                assert got["version"] == v and got["sum"] == expected, (i, got, expected)
            assert len({t.data_ptr() for t in kept}) == len(kept)
            peer.stdin.write("quit\n")
            peer.stdin.flush()
            assert peer.wait(timeout=60) == 0
        finally:
            if peer.poll() is None:
                peer.kill()
                peer.wait()
