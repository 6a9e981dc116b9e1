# SPDX-License-Identifier: Apache-2.0
"""CPU: a real PyTorch (Debian 12's python3-torch, 1.13.1, CPU only) on
both sides of the broker, written the way PyTorch users write it, with
the data checked each time.

- A producer publishes ordinary torch CPU tensors (contiguous, transposed,
  a slice): they are copied, so rewriting them in place afterwards leaves
  what consumers read unchanged.
- A producer writes frames into Client.empty()/Client.ring() slots through
  torch.from_dlpack(slot), with torch dtypes (bfloat16 included, a
  HostArray), and publishes the torch view without a copy.
- A consumer keeps only x = torch.from_dlpack(client.acquire(ch)): the
  Lease object never named, deleted, released by a with-block, or its
  Client closed. The tensor alone keeps the lease: the daemon lists it,
  the producer's wait_free(timeout=0) is TB_EBUSY and its ring cannot hand
  that slot out, x's data stays as published while the producer goes on;
  `del x` ends it.
- The same with the consumer in another process (torch_peer.py), which
  is then SIGKILLed holding a tensor.
- Pinned memory (Client.empty(pinned=True)) with the fake CUDA driver as
  libcuda.so.1, so that the consumer's lease is kDLCUDAHost: what torch
  does with it, and the fallback lease.__dlpack__(dl_device=(1, 0)).
- dtype round trips, both through copies and through broker slots.
- A DataLoader whose forked workers read frames: with the client their
  parent made they get TB_EFORKED; connecting their own, they read them.

Registered as python_torch_host (LD_LIBRARY_PATH puts the fake CUDA
driver first); skips (77) where torch does not import. No sleeps: the
daemon's views, timeout=0 and waits with timeouts order everything."""
import math
import os
import signal
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tbtest  # noqa: E402
from tbtest import daemon, Peer  # noqa: E402

torch = tbtest.require_module("torch")
import numpy as np  # noqa: E402  (torch needs it)
import tensorbroker as tb  # noqa: E402

TORCH_1 = torch.__version__.split(".")[0] == "1"

# DLPack (code, bits, lanes) of each torch dtype, as the DLPack header says
DL = {torch.float16: (2, 16, 1), torch.bfloat16: (4, 16, 1), torch.float32: (2, 32, 1),
      torch.float64: (2, 64, 1), torch.int8: (0, 8, 1), torch.int16: (0, 16, 1),
      torch.int32: (0, 32, 1), torch.int64: (0, 64, 1), torch.uint8: (1, 8, 1),
      torch.complex64: (5, 64, 1), torch.complex128: (5, 128, 1), torch.bool: (6, 8, 1)}


def values(dtype, shape=(3, 5), seed=0):
    """A frame of dtype whose every element differs from its neighbours'
    and from another seed's, exact in every dtype (bfloat16 included)."""
    n = torch.arange(math.prod(shape), dtype=torch.float64).reshape(shape)
    if dtype == torch.bool:
        return (n + seed) % 3 == 0
    if dtype.is_complex:
        return torch.complex(n - 7 + seed, seed - n).to(dtype)
    if dtype.is_floating_point:
        return ((n - 7) * 0.25 + seed).to(dtype)
    if dtype == torch.uint8:
        return ((n * 7 + seed * 3) % 251).to(dtype)
    big = 2 ** 40 if dtype == torch.int64 else 0
    return ((n * 7 + seed * 3) % 23 - 11 + big).to(dtype)


def expect_busy(fn):
    """fn raises tensorbroker.Error TB_EBUSY (a version still leased, asked
    with timeout=0)."""
    try:
        fn()
    except tb.Error as e:
        assert e.name == "TB_EBUSY", e
        return
    raise AssertionError("expected TB_EBUSY: the version was free")


def leases_of(client, channel):
    return [(l["version"], l["session_name"], l["pid"]) for l in client.leases()
            if l["channel"] == channel]


def torch_view(slot):
    """What a torch user writes to fill a broker slot: torch.from_dlpack;
    NumPy < 2 cannot export bool by DLPack, so a bool slot goes through
    torch.from_numpy (also a view)."""
    if isinstance(slot, np.ndarray) and slot.dtype == np.bool_:
        return torch.from_numpy(slot)
    return torch.from_dlpack(slot)


def test_published_torch_tensors_are_copied():
    """Ordinary torch CPU tensors (not broker memory) are copied at
    publish: the producer rewrites them in place right after, and the
    consumer still reads what was published, in its layout (a transposed
    view and a slice come out as their elements, not as the memory under
    them)."""
    with daemon() as sock, tb.Client(socket=sock, name="producer") as prod, \
            tb.Client(socket=sock, name="consumer") as cons:
        base = values(torch.float32, (4, 6))
        cases = [("contiguous", base.clone()), ("transposed", base.clone().t()),
                 ("slice", base.clone()[1:, ::2]), ("int64", values(torch.int64, (5,))),
                 ("bfloat16", values(torch.bfloat16, (2, 3)))]
        published = []
        for name, t in cases:
            want = t.clone()
            v = prod.publish("cp/" + name, t)
            assert prod.last_publish_zero_copy is False, name
            t.add_(100)                    # the producer reuses its tensor
            published.append((name, v, want))
        for name, v, want in published:
            x = torch.from_dlpack(cons.acquire("cp/" + name, exact=v))
            assert x.dtype == want.dtype and x.shape == want.shape, (name, x)
            assert torch.equal(x, want), (name, x, want)
            del x


def test_torch_writes_broker_slots_published_without_copy():
    """A producer fills Client.empty() arrays and Client.ring() slots through
    torch.from_dlpack(slot) (torch dtypes; bfloat16 is a HostArray), and
    publishes the torch view (or a slice of it, or the slot itself) with
    no copy; the consumer's torch tensor has the dtype and exactly those
    values. Dtypes the host path cannot take raise TypeError."""
    with daemon() as sock, tb.Client(socket=sock, name="producer") as prod, \
            tb.Client(socket=sock, name="consumer") as cons:
        for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8):
            ch = "slot/" + str(dt)
            slot = prod.empty((3, 5), dt)
            if dt == torch.bfloat16:
                assert isinstance(slot, tb.HostArray) and slot.dtype == "bfloat16"
                assert slot.__dlpack_device__() == (tb.DEVICE_CPU, 0)
            else:
                assert isinstance(slot, np.ndarray)
            t = torch.from_dlpack(slot)
            assert t.dtype == dt and t.shape == (3, 5)
            addr = slot.data_ptr if isinstance(slot, tb.HostArray) else slot.ctypes.data
            assert t.data_ptr() == addr          # torch writes the slot itself
            t.copy_(values(dt))
            for what, obj, want in (("tensor", t, values(dt)),
                                    ("slice", t[1:, 2:], values(dt)[1:, 2:]),
                                    ("slot", slot, values(dt))):
                v = prod.publish(ch, obj)
                assert prod.last_publish_zero_copy is True, (dt, what)
                lease = cons.acquire(ch, exact=v)
                assert lease.dtype == DL[dt], (dt, lease.dtype)
                x = torch.from_dlpack(lease)
                assert x.dtype == dt and torch.equal(x, want), (dt, what, x)
                lease.release()
                del x

        # a ring of bfloat16 frames, written through torch
        ring = prod.ring("slot/ring", (2, 8), torch.bfloat16, slots=3, history_depth=2)
        assert all(isinstance(s, tb.HostArray) for s in ring.slots)
        for f in range(7):
            frame = torch.from_dlpack(ring.next(timeout=0))
            frame.copy_(values(torch.bfloat16, (2, 8), seed=f))
            v = ring.publish(frame)
            assert prod.last_publish_zero_copy is True
            x = torch.from_dlpack(cons.acquire("slot/ring", exact=v))
            assert torch.equal(x, values(torch.bfloat16, (2, 8), seed=f)), (f, x)
            del x
        try:
            ring.next(timeout=0)
            ring.publish(torch.zeros(2, 8, dtype=torch.bfloat16))  # not the slot
        except ValueError as e:
            assert "does not lie in the slot" in str(e), e
        else:
            raise AssertionError("a tensor outside the slot was published")

        # dtypes the host path cannot take say so
        for bad in (torch.quint8, "float8", np.dtype(">f4")):
            try:
                prod.empty((2,), bad)
            except TypeError as e:
                assert "unsupported dtype" in str(e), e
            else:
                raise AssertionError("empty() took dtype %r" % (bad,))


def _closed_client_frame(sock, ch, v):
    # a consumer written as a function: its Client closes when it returns
    with tb.Client(socket=sock, name="consumer") as c:
        return torch.from_dlpack(c.acquire(ch, exact=v))


def test_torch_tensor_keeps_the_lease_without_its_lease_object():
    """x = torch.from_dlpack(client.acquire(ch)), the Lease object never
    named, deleted, ended by its with-block, or its Client closed: while x
    lives the daemon lists the lease, the producer's wait_free(timeout=0)
    is TB_EBUSY, its ring cannot hand x's slot out (a producer writes
    whatever slot it is given), and x reads the frame published while the
    producer goes on; `del x` ends the lease."""
    with daemon() as sock, tb.Client(socket=sock, name="producer") as prod, \
            tb.Client(socket=sock, name="consumer") as cons:
        def unnamed(ch, v):
            return torch.from_dlpack(cons.acquire(ch, exact=v))

        def deleted(ch, v):
            lease = cons.acquire(ch, exact=v)
            x = torch.from_dlpack(lease)
            del lease
            return x

        def with_block(ch, v):
            with cons.acquire(ch, exact=v) as lease:
                x = torch.from_dlpack(lease)
            assert lease.released
            return x

        def closed_client(ch, v):
            return _closed_client_frame(sock, ch, v)

        for take in (unnamed, deleted, with_block, closed_client):
            ch = "hold/" + take.__name__
            ring = prod.ring(ch, (64,), torch.float32, slots=2, history_depth=1)
            torch.from_dlpack(ring.next(timeout=0)).copy_(values(torch.float32, (64,), 0))
            v1 = ring.publish()
            x = take(ch, v1)
            assert leases_of(prod, ch) == [(v1, "consumer", os.getpid())], \
                (take.__name__, prod.leases())
            torch.from_dlpack(ring.next(timeout=0)).copy_(values(torch.float32, (64,), 1))
            v2 = ring.publish()                      # v1 leaves the history
            busy = None
            try:
                slot = ring.next(timeout=0)          # v1's slot
                torch.from_dlpack(slot).copy_(values(torch.float32, (64,), 2))
                ring.publish()
            except tb.Error as e:
                busy = e
            # (x is not printed: without its lease its pages may be gone)
            assert torch.equal(x, values(torch.float32, (64,), 0)), \
                (take.__name__, "x lost the frame of v1")
            assert busy is not None and busy.name == "TB_EBUSY", (take.__name__, busy)
            expect_busy(lambda: prod.wait_free(ch, v1, timeout=0))
            assert leases_of(prod, ch) == [(v1, "consumer", os.getpid())], take.__name__
            del x                                    # the lease ends here
            slot = ring.next(timeout=10)             # so the slot comes back
            assert slot is ring.slots[0]
            assert leases_of(prod, ch) == [], (take.__name__, prod.leases())
            assert ring.publish() > v2
            del ring, slot


def test_torch_consumer_in_another_process():
    """The consumer is another process using torch (torch_peer.py keeps
    torch.from_dlpack(lease) and deletes the Lease): the producer sees its
    lease in the daemon's view under the peer's pid, cannot take that slot
    back, and the peer's tensor reads the frame published while the
    producer publishes more; "drop" (del x) frees the slot. Then the peer
    is SIGKILLed holding a tensor: the lease goes with it."""
    with daemon() as sock, tb.Client(socket=sock, name="producer") as prod, \
            Peer(sock, script=os.path.join(tbtest.HERE, "torch_peer.py")) as peer:
        ch = "peer/frames"
        ring = prod.ring(ch, (4, 8), torch.bfloat16, slots=2, history_depth=1)
        frames = [values(torch.bfloat16, (4, 8), f) for f in range(4)]
        torch.from_dlpack(ring.next(timeout=0)).copy_(frames[0])
        v1 = ring.publish()
        got = peer.call(op="take", channel=ch, exact=v1, timeout=10, key="a")
        assert got["version"] == v1 and got["dtype"] == "torch.bfloat16"
        assert got["values"] == frames[0].float().flatten().tolist()
        assert leases_of(prod, ch) == [(v1, "torch-peer", peer.proc.pid)], prod.leases()
        torch.from_dlpack(ring.next(timeout=0)).copy_(frames[1])
        v2 = ring.publish()
        expect_busy(lambda: ring.next(timeout=0))
        expect_busy(lambda: prod.wait_free(ch, v1, timeout=0))
        got = peer.call(op="take", channel=ch, exact=v2, timeout=10, key="b")
        assert got["values"] == frames[1].float().flatten().tolist()
        assert peer.call(op="read", key="a")["values"] == frames[0].float().flatten().tolist()
        peer.call(op="drop", key="a")
        slot = ring.next(timeout=10)                 # v1's slot, free again
        assert slot is ring.slots[0]
        torch.from_dlpack(slot).copy_(frames[2])
        ring.publish()
        assert leases_of(prod, ch) == [(v2, "torch-peer", peer.proc.pid)], prod.leases()
        # killed holding "b" (v2): its session, and so its lease, ends
        peer.proc.send_signal(signal.SIGKILL)
        peer.proc.wait(timeout=30)
        slot = ring.next(timeout=10)
        assert slot is ring.slots[1] and leases_of(prod, ch) == []


def test_pinned_lease_with_torch():
    """Pinned host memory with the fake CUDA driver: the producer fills a
    pinned slot through torch (float32: a NumPy array; bfloat16: a
    HostArray), publishes the torch view without a copy, and the consumer's
    lease is kDLCUDAHost. torch.from_dlpack(lease) raises "Unsupported
    device_type: 3" (RuntimeError on torch 1.13, BufferError on 2.11) and
    leaves nothing held; the documented fallback,
    torch.from_dlpack(lease.__dlpack__(dl_device=(1, 0))), is a view of
    the same pages, which keeps the lease after release() until `del x`."""
    import fakecuda  # noqa: F401  (Skip unless libcuda.so.1 is the fake)
    with daemon() as sock, tb.Client(socket=sock, name="producer") as prod, \
            tb.Client(socket=sock, name="consumer") as cons:
        for dt in (torch.float32, torch.bfloat16):
            ch = "pin/" + str(dt)
            a, b = prod.empty((16,), dt, pinned=True), prod.empty((16,), dt, pinned=True)
            t = torch.from_dlpack(a)
            t.copy_(values(dt, (16,)))
            v = prod.publish(ch, t, history_depth=1)
            assert prod.last_publish_zero_copy is True
            lease = cons.acquire(ch, exact=v)
            assert lease.__dlpack_device__() == (tb.DEVICE_CUDA_HOST, 0)
            assert lease.memory_kind == 4 and lease.dtype == DL[dt]
            try:
                x = torch.from_dlpack(lease)
            except (RuntimeError, BufferError) as e:
                # 1.13: RuntimeError; 2.11 (the GPU machine's): BufferError
                assert "Unsupported device_type: 3" in str(e), e
            else:
                # a torch that takes kDLCUDAHost (not 1.13): the same frame
                assert not TORCH_1, "torch %s took kDLCUDAHost" % torch.__version__
                assert torch.equal(x, values(dt, (16,)))
                del x
            assert leases_of(prod, ch) == [(v, "consumer", os.getpid())]
            x = torch.from_dlpack(lease.__dlpack__(dl_device=(1, 0)))
            assert x.device.type == "cpu" and x.dtype == dt
            assert torch.equal(x, values(dt, (16,))), x
            lease.release()                   # x still reads it
            torch.from_dlpack(b).copy_(values(dt, (16,), seed=1))
            prod.publish(ch, b)               # v leaves the history
            expect_busy(lambda: prod.wait_free(ch, v, timeout=0))
            assert torch.equal(x, values(dt, (16,))), "x lost the frame of v"
            del x
            prod.wait_free(ch, v, timeout=10)
            assert leases_of(prod, ch) == []
            t.copy_(values(dt, (16,), seed=2))  # now safe to rewrite
            del t, a, b


def test_dtype_round_trips():
    """Every torch dtype that DLPack names, published from an ordinary
    tensor (copied) and from a broker slot the producer wrote through torch
    (no copy), comes back to a torch consumer as the same dtype and values.
    bool goes through NumPy on torch 1.x, which can neither export nor
    import it by DLPack; NumPy's unsigned 16/32/64-bit arrays reach a torch
    1.13 consumer only through NumPy (torch has no such dtypes)."""
    with daemon() as sock, tb.Client(socket=sock, name="producer") as prod, \
            tb.Client(socket=sock, name="consumer") as cons:
        for dt, want_dl in DL.items():
            src = values(dt)
            slot = prod.empty(src.shape, dt)
            torch_view(slot).copy_(src)
            ch = "rt/" + str(dt)
            for route, obj, zero_copy in (("copy", src, False), ("slot", torch_view(slot), True)):
                v = prod.publish(ch, obj)
                assert prod.last_publish_zero_copy is zero_copy, (dt, route)
                lease = cons.acquire(ch, exact=v)
                assert lease.dtype == want_dl, (dt, lease.dtype)
                try:
                    x = torch.from_dlpack(lease)
                except RuntimeError as e:
                    # torch 1.x: "Unsupported code 6" (kDLBool)
                    assert dt == torch.bool and TORCH_1, (dt, e)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")   # read-only: torch warns
                        x = torch.from_numpy(np.asarray(lease))
                assert x.dtype == dt and torch.equal(x, src), (dt, route, x)
                del x
                lease.release()
            del slot
        # NumPy producers of the unsigned types torch 1.13 lacks
        for npdt in (np.uint16, np.uint32, np.uint64):
            a = prod.empty((4,), npdt)
            a[:] = [0, 1, 2 ** (8 * a.itemsize) - 1, 7]
            v = prod.publish("rt/np", a)
            with cons.acquire("rt/np", exact=v) as lease:
                if TORCH_1:
                    try:
                        torch.from_dlpack(lease)
                    except RuntimeError as e:
                        assert "Unsupported kUInt bits" in str(e), e
                    else:
                        raise AssertionError("torch 1.x took %s" % npdt)
                assert np.array_equal(np.from_dlpack(lease), a)


class _Frames(torch.utils.data.Dataset):
    """A Dataset whose items are frames in the broker, by version, read the
    way a DataLoader's workers read them. client: one made by the process
    that builds the DataLoader (which its forked workers inherit), or None
    to connect one lazily in each process that reads."""

    def __init__(self, sock, versions, client=None, report=False):
        self.sock, self.versions, self.client = sock, versions, client
        self.report = report

    def __len__(self):
        return len(self.versions)

    def __getitem__(self, i):
        if self.client is None:
            self.client = tb.Client(socket=self.sock, name="loader-%d" % os.getpid())
        try:
            with self.client.acquire("dl/frames", exact=self.versions[i], timeout=10) as lease:
                x = torch.from_dlpack(lease).clone()
        except tb.Error as e:
            if self.report:
                return str(e)
            raise
        return "no error" if self.report else x


def test_dataloader_workers_connect_their_own_client():
    """A torch DataLoader with worker processes (forked, Linux's default)
    over a Dataset that reads frames from the broker: a Dataset holding the
    client its builder made fails in the workers with TB_EFORKED (the
    workers cannot share their parent's session), and the builder's client
    still works; one that connects lazily in each worker reads every frame,
    in order."""
    with daemon() as sock, tb.Client(socket=sock, name="producer") as prod, \
            tb.Client(socket=sock, name="builder") as builder:
        versions = []
        for i in range(6):
            slot = prod.empty((2, 3), torch.float32)
            torch.from_dlpack(slot).copy_(values(torch.float32, (2, 3), seed=i))
            versions.append(prod.publish("dl/frames", slot, history_depth=6))
        # (each item says what its worker's acquire raised: a worker's
        # exception would make torch 1.13 wait 5 s for each worker to end)
        errors = torch.utils.data.DataLoader(
            _Frames(sock, versions, client=builder, report=True), batch_size=None,
            num_workers=2)
        whys = list(errors)
        assert len(whys) == 6, whys
        for why in whys:
            assert "TB_EFORKED" in why and "is a fork of it" in why, why
        with builder.acquire("dl/frames", exact=versions[0], timeout=5) as lease:
            assert torch.equal(torch.from_dlpack(lease), values(torch.float32, (2, 3), seed=0))
        own = torch.utils.data.DataLoader(_Frames(sock, versions), batch_size=2, num_workers=2)
        got = torch.cat(list(own))
        want = torch.stack([values(torch.float32, (2, 3), seed=i) for i in range(6)])
        assert torch.equal(got, want), got
