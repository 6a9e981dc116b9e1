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


def need_lease_wait():
    if not tb._native.HAVE_LEASE_WAIT:
        raise AssertionError(
            "libtensorbroker lacks tb_lease_wait(t, stream): Lease.__dlpack__(stream=s) "
            "cannot make the consumer's stream wait (see docs/python.md)")


def test_capture_replay_spec_contract():
    need_lease_wait()
    with daemon() as sock:
        got, want = captured_read(sock, "spec", wait=True)
        assert got == (want, want), got


def test_capture_replay_no_sync_contract():
    need_lease_wait()
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


def test_implicit_legacy_wait_inside_capture_is_refused():
    need_lease_wait()
    with daemon() as sock, Peer(sock, script=PRODUCER) as prod, \
            tb.Client(socket=sock, stream_contract="spec") as c:
        v = prod.call(op="go", value=3, spin_ms=0)["version"]
        with c.acquire("graph/x", exact=v) as lease:
            side = torch.cuda.Stream()
            g = torch.cuda.CUDAGraph()
            err = None
            try:
                with torch.cuda.graph(g, stream=side):
                    try:
                        lease.__dlpack__(max_version=(1, 0))  # stream=None: legacy
                    except tb.Error as e:
                        err = e
            except RuntimeError:
                pass  # the capture may end invalidated; what matters is err
            assert err is not None and err.name == "TB_ECAPTURE", err
