# SPDX-License-Identifier: Apache-2.0
"""GPU: the case that made PyTorch change its DLPack default. A consumer
calls torch.from_dlpack(lease) inside torch.cuda.graph(g) on a side stream
while the producer's kernel (in another process) is still running. With the
broker's external wait the captured graph waits for the producer's event at
replay and reads the new data, under the 'spec' and 'no_sync' contracts.
The control without the wait (stream -1) reads stale data, which is what
this test would see if the external wait were missing."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tbtest  # noqa: E402
from tbtest import daemon, Peer, HERE  # noqa: E402

torch = tbtest.require_torch_cuda()
import tensorbroker as tb  # noqa: E402

PRODUCER = os.path.join(HERE, "gpu_graph_producer.py")
SPIN_MS = 1000


def captured_read(sock, contract, wait):
    """Returns (value read by the first replay, expected value)."""
    with Peer(sock, script=PRODUCER) as prod, \
            tb.Client(socket=sock, name="graph-consumer", stream_contract=contract) as c:
        v0 = prod.call(op="go", value=1, spin_ms=0)["version"]
        with c.acquire("graph/x", exact=v0) as warm:     # maps the memory once
            torch.from_dlpack(warm).sum().item()
        v = prod.call(op="go", value=7, spin_ms=SPIN_MS)["version"]  # GPU still busy
        lease = c.acquire("graph/x", exact=v)
        side = torch.cuda.Stream()
        out = torch.full((1 << 20,), -1.0, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side):
            if wait:
                x = torch.from_dlpack(lease)   # torch passes the capturing stream
            else:
                x = torch.from_dlpack(lease.__dlpack__(stream=-1, max_version=(1, 0)))
            out.copy_(x)
        g.replay()
        torch.cuda.synchronize()
        got = float(out[0].item()), float(out[-1].item())
        # the graph stays replayable
        g.replay()
        torch.cuda.synchronize()
        del x, g
        lease.release()
        return got, 7.0


def test_capture_replay_spec_contract():
    with daemon() as sock:
        got, want = captured_read(sock, "spec", wait=True)
        assert got == (want, want), got


def test_capture_replay_no_sync_contract():
    with daemon() as sock:
        got, want = captured_read(sock, "no_sync", wait=True)
        assert got == (want, want), got


def test_control_without_wait_reads_stale_data():
    # What goes wrong without the external wait: the replay copies before the
    # producer's fill has run. (If this ever passes with the right value, the
    # spin was too short to show the race; it is a control, not a property.)
    with daemon() as sock:
        got, want = captured_read(sock, "no_sync", wait=False)
        assert got != (want, want), "control read fresh data; raise SPIN_MS"


def test_implicit_legacy_wait_beside_a_nonblocking_capture():
    # torch's side streams are non-blocking, so the legacy default stream
    # does not take part in their capture: stream=None under 'spec' waits on
    # the legacy stream (what the consumer asked for) without touching the
    # capture, which must stay valid. (A *blocking* capturing stream makes the
    # same call TB_ECAPTURE instead: tests/gpu/test_graph_capture.c, on the
    # driver API, covers that case.)
    with daemon() as sock, Peer(sock, script=PRODUCER) as prod, \
            tb.Client(socket=sock, stream_contract="spec") as c:
        v = prod.call(op="go", value=3, spin_ms=0)["version"]
        with c.acquire("graph/x", exact=v) as lease:
            side = torch.cuda.Stream()
            g = torch.cuda.CUDAGraph()
            out = torch.zeros(4, device="cuda")
            with torch.cuda.graph(g, stream=side):
                lease.__dlpack__(max_version=(1, 0))  # stream=None: legacy
                out.add_(1.0)
            g.replay()
            torch.cuda.synchronize()
            assert float(out[0].item()) == 1.0
