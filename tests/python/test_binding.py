# SPDX-License-Identifier: Apache-2.0
"""tensorbroker Python binding: NumPy round trips across processes, the
DLPack protocol on leases, lifetimes, errors. Each test starts its own
daemon. Runs under run_tests.py (no pytest needed) or pytest."""
import gc
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tbtest  # noqa: E402
from tbtest import daemon, Peer  # noqa: E402

try:
    import numpy as np
except ImportError:  # pragma: no cover
    raise tbtest.Skip("NumPy is not installed for this Python")
import tensorbroker as tb  # noqa: E402


def expect_error(fn, name, cls=None):
    try:
        fn()
    except tb.Error as e:
        assert e.name == name, "expected %s, got %s (%s)" % (name, e.name, e)
        assert e.code == getattr(tb, name), e.code
        assert isinstance(e.message, str) and e.message
        if cls is not None:
            assert isinstance(e, cls), type(e)
        return e
    raise AssertionError("expected tensorbroker.Error %s" % name)


def expect_raises(fn, cls):
    try:
        fn()
    except cls as e:
        return e
    raise AssertionError("expected %s" % cls.__name__)


def channel_leases(client, name):
    for ch in client.channels():
        if ch["name"] == name:
            return ch["leases"]
    raise AssertionError("no channel " + name)


def cases():
    rng = np.random.default_rng(7)
    big = rng.standard_normal((6, 8)).astype(np.float32)
    out = {
        "bool": rng.integers(0, 2, (5, 3)).astype(bool),
        "int8": rng.integers(-128, 127, (4, 5), dtype=np.int8),
        "uint8": rng.integers(0, 255, (17,), dtype=np.uint8),
        "int16": rng.integers(-30000, 30000, (3, 3), dtype=np.int16),
        "int32": rng.integers(-2**31, 2**31 - 1, (2, 5), dtype=np.int32),
        "int64": rng.integers(-2**62, 2**62, (5,), dtype=np.int64),
        "uint64": np.array([0, 1, 2**63 + 5, 2**64 - 1], dtype=np.uint64),
        "float16": rng.standard_normal((4, 4)).astype(np.float16),
        "float32": big,
        "float64": rng.standard_normal((2, 3, 4)),
        "complex64": (rng.standard_normal((3, 2)) + 1j * rng.standard_normal((3, 2))).astype(np.complex64),
        "complex128": rng.standard_normal(5) * (1 + 2j),
        "strided": big[:, ::2],             # non-contiguous
        "transposed": big.T,                # Fortran order
        "reversed": big[::-1, 1:5],         # negative stride
        "scalar": np.array(3.5, dtype=np.float64),   # 0-d
        "empty": np.zeros((0, 3), dtype=np.int32),   # no elements
        "bool_strided": rng.integers(0, 2, (4, 6)).astype(bool)[::2, 1::2],
    }
    return out


def test_numpy_round_trips_across_processes():
    arrays = cases()
    with daemon() as sock, tb.Client(socket=sock, name="producer") as prod, \
            tempfile.TemporaryDirectory() as tmp, Peer(sock) as peer:
        for name, a in arrays.items():
            prod.publish("rt/" + name, a, metadata=name.encode())
            assert prod.last_publish_zero_copy is False  # plain NumPy: copied in
        for name, a in arrays.items():
            info = peer.call(op="acquire", channel="rt/" + name, timeout=10)
            assert bytes.fromhex(info["metadata"]) == name.encode()
            assert tuple(info["shape"]) == a.shape, (name, info["shape"], a.shape)
            assert info["device"] == [1, 0]
            assert info["read_only"] is True
            path = os.path.join(tmp, name + ".npy")
            r = peer.call(op="read", key="rt/" + name, path=path)
            assert r["writeable"] is False, name
            got = np.load(path)
            assert got.dtype == a.dtype, (name, got.dtype, a.dtype)
            assert got.shape == a.shape, (name, got.shape)
            assert np.array_equal(got, a), name
            peer.call(op="release", key="rt/" + name)
        # a release travels on the peer's own connection: ask there
        assert peer.call(op="leases")["leases"] == 0


def test_zero_copy_from_empty_is_shared_with_consumer():
    with daemon() as sock, tb.Client(socket=sock, name="producer") as prod, \
            tempfile.TemporaryDirectory() as tmp, Peer(sock) as peer:
        a = prod.empty((64, 32), np.float32)
        assert a.flags.writeable and a.shape == (64, 32) and a.dtype == np.float32
        a[...] = np.arange(a.size, dtype=np.float32).reshape(a.shape)
        v = prod.publish("zc/frames", a)
        assert prod.last_publish_zero_copy is True
        info = peer.call(op="acquire", channel="zc/frames", timeout=10)
        assert info["version"] == v
        path = os.path.join(tmp, "a.npy")
        r = peer.call(op="read", key="zc/frames", path=path)
        assert r["how"] == "from_dlpack" and r["writeable"] is False
        assert np.array_equal(np.load(path), a)
        # The consumer's view is the producer's memory: a write here (which a
        # real producer would only make after wait_free) shows up there.
        a[3, 5] = -1.0
        peer.call(op="reread", key="zc/frames", path=path)
        assert np.load(path)[3, 5] == -1.0
        # A view of part of a broker buffer goes without a copy too.
        prod.publish("zc/part", a[10:20, ::2])
        assert prod.last_publish_zero_copy is True
        peer.call(op="acquire", channel="zc/part", timeout=10)
        peer.call(op="read", key="zc/part", path=path)
        assert np.array_equal(np.load(path), a[10:20, ::2])


def test_copy_in_for_plain_host_memory():
    with daemon() as sock, tb.Client(socket=sock) as prod, \
            tempfile.TemporaryDirectory() as tmp, Peer(sock) as peer:
        a = np.arange(10, dtype=np.int64)
        prod.publish("cp/a", a)
        assert prod.last_publish_zero_copy is False
        a[:] = -7  # allowed: the version has its own copy
        peer.call(op="acquire", channel="cp/a", timeout=10)
        path = os.path.join(tmp, "a.npy")
        peer.call(op="read", key="cp/a", path=path)
        assert np.array_equal(np.load(path), np.arange(10))


def test_empty_dtypes_and_shapes():
    with daemon() as sock, tb.Client(socket=sock) as prod, tb.Client(socket=sock) as cons:
        for dt, shape in [(bool, (3, 4)), (np.float16, (5,)), (np.complex64, (2, 2)),
                          (np.uint64, ()), (np.int8, (0, 7))]:
            a = prod.empty(shape, dt)
            assert a.shape == shape and a.dtype == np.dtype(dt)
            a[...] = 1
            v = prod.publish("em/x", a)
            assert prod.last_publish_zero_copy is True
            with cons.acquire("em/x", exact=v) as lease:
                got = np.asarray(lease)
                assert got.dtype == np.dtype(dt) and got.shape == shape
                assert np.array_equal(got, a)
                del got


# A program without NumPy (import numpy fails): Client.empty() gives a
# memoryview for what memoryview.cast can carry and a HostArray for the
# rest (float16, bfloat16, complex); both publish without a copy, and a
# ring of memoryviews works. Prints "ok" at the end.
NO_NUMPY = r"""
import array, ctypes, struct, sys
sys.modules["numpy"] = None            # import numpy raises ImportError
import tensorbroker as tb
with tb.Client(socket=sys.argv[1], name="no-numpy") as c:
    a = c.empty((2, 3), "float32")
    assert isinstance(a, memoryview) and a.format == "f" and a.shape == (2, 3), a
    a.cast("B").cast("f")[:] = array.array("f", [0.5, 1, 2, 3, 4, -5])
    v = c.publish("nn/f32", a)
    assert c.last_publish_zero_copy is True
    with c.acquire("nn/f32", exact=v) as lease:
        assert memoryview(lease).tolist() == [[0.5, 1, 2], [3, 4, -5]]
    for dtype, want in (("f", "f"), ("bool", "?"), ("int64", "q"), ("uint8", "B")):
        m = c.empty(4, dtype)
        assert isinstance(m, memoryview) and m.format == want, (dtype, m)
    for dtype, dl in (("float16", (2, 16, 1)), ("bfloat16", (4, 16, 1)),
                      ("complex64", (5, 64, 1))):
        h = c.empty((4,), dtype)
        assert isinstance(h, tb.HostArray) and h.dtype == dtype, (dtype, h)
        raw = bytes(range(1, h.nbytes + 1))
        ctypes.memmove(h.data_ptr, raw, h.nbytes)
        v = c.publish("nn/" + dtype, h)
        assert c.last_publish_zero_copy is True, dtype
        with c.acquire("nn/" + dtype, exact=v) as lease:
            assert lease.dtype == dl and lease.shape == (4,), (dtype, lease.dtype)
            if dtype == "float16":
                assert bytes(memoryview(lease)) == raw
    ring = c.ring("nn/ring", 8, "uint8", slots=2)
    for f in range(3):
        frame = ring.next(timeout=0)
        frame[:] = bytes([f]) * 8
        v = ring.publish()
        with c.acquire("nn/ring", exact=v) as lease:
            assert bytes(memoryview(lease)) == bytes([f]) * 8
    try:
        c.empty(2, "U4")
    except TypeError as e:
        assert "unsupported dtype" in str(e), e
    else:
        raise AssertionError("empty() took 'U4'")
    del a, m, h, frame, ring
print("ok")
"""


def test_empty_without_numpy():
    import subprocess
    with daemon() as sock:
        out = subprocess.run([tbtest.PYTHON, "-c", NO_NUMPY, sock], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and out.stdout == "ok\n", (out.stdout, out.stderr)


def test_metadata_version_channel():
    with daemon() as sock, tb.Client(socket=sock) as prod, tb.Client(socket=sock) as cons:
        a = np.ones(3)
        v1 = prod.publish("md/a", a, metadata=b"\x00frame 1\xff")
        v2 = prod.publish("md/a", a, metadata="frame 2", history_depth=4)
        v3 = prod.publish("md/a", a)
        assert (v1, v2, v3) == (1, 2, 3)
        with cons.acquire("md/a", exact=1) as l1:
            assert l1.metadata == b"\x00frame 1\xff" and l1.version == 1
            assert l1.channel == "md/a"
        with cons.acquire("md/a", after=1, timeout=1) as l2:
            assert l2.version == 2 and l2.metadata == b"frame 2"
        with cons.acquire("md/a") as l3:
            assert l3.version == 3 and l3.metadata == b""
            assert l3.producer_pid == os.getpid()


def test_timeouts():
    with daemon() as sock, tb.Client(socket=sock) as cons:
        e = expect_error(lambda: cons.acquire("to/none", timeout=0.05), "TB_ETIMEDOUT",
                         tb.TimeoutError)
        assert isinstance(e, TimeoutError)  # the builtin one too
        expect_error(lambda: cons.acquire("to/none", timeout=0), "TB_ENOTFOUND")
        cons.publish("to/a", np.zeros(1))
        expect_error(lambda: cons.acquire("to/a", after=1, timeout=0), "TB_EAGAIN")
        expect_error(lambda: cons.acquire("to/a", after=1, timeout=0.05), "TB_ETIMEDOUT")


def test_busy_polling_client():
    with daemon() as sock:
        expect_error(lambda: tb.Client(socket=sock, spin_us=-2), "TB_EINVAL")
        expect_error(lambda: tb.Client(socket=sock, spin_us=2000000), "TB_EINVAL")
        with tb.Client(socket=sock) as prod, tb.Client(socket=sock, spin_us=300) as cons:
            prod.publish("bp/a", np.arange(5.0))
            for _ in range(20):
                with cons.acquire("bp/a") as l:
                    assert np.array_equal(np.from_dlpack(l), np.arange(5.0))
            # polling neither cuts nor stretches a timeout
            expect_error(lambda: cons.acquire("bp/a", after=1, timeout=0.05), "TB_ETIMEDOUT")
            # -1: never poll (the C tests count which waits polled)
            with tb.Client(socket=sock, spin_us=-1) as never:
                with never.acquire("bp/a") as l:
                    assert np.array_equal(np.from_dlpack(l), np.arange(5.0))
                expect_error(lambda: never.acquire("bp/a", after=1, timeout=0.05),
                             "TB_ETIMEDOUT")


def test_prefetch_option():
    # opening ahead concerns CUDA buffers only; either setting exchanges host
    # tensors the same way (the C tests check what the daemon sends)
    with daemon() as sock:
        with tb.Client(socket=sock) as prod, tb.Client(socket=sock, prefetch=False) as off, \
                tb.Client(socket=sock, prefetch=True) as on:
            off.subscribe("pf/a")
            on.subscribe("pf/a")
            prod.publish("pf/a", np.arange(3.0))
            for cons in (off, on):
                n = cons.poll_notice(timeout=5)
                assert n is not None and n["type"] == "new_version", n
                with cons.acquire("pf/a") as l:
                    assert np.array_equal(np.from_dlpack(l), np.arange(3.0))


def test_channels_named_at_connect():
    # the names are checked before connecting; a good list connects, and host
    # tensors come as usual (what the daemon sends back for CUDA channels, and
    # the opening, are checked by the C tests)
    with daemon() as sock:
        expect_error(lambda: tb.Client(socket=sock, channels=["cn/x"] * 17), "TB_ELIMIT")
        expect_error(lambda: tb.Client(socket=sock, channels=["cn/../x"]), "TB_ENAME")
        expect_raises(lambda: tb.Client(socket=sock, channels="cn/x"), TypeError)
        expect_raises(lambda: tb.Client(socket=sock, channels=[b"cn/x"]), TypeError)
        with tb.Client(socket=sock) as prod:
            prod.publish("cn/x", np.arange(4.0))
            with tb.Client(socket=sock, channels=("cn/x", "cn/none")) as cons, \
                    cons.acquire("cn/x") as l:
                assert np.array_equal(np.from_dlpack(l), np.arange(4.0))
            with tb.Client(socket=sock, channels=["cn/x"] * 16) as cons, \
                    cons.acquire("cn/x", timeout=5) as l:
                assert np.array_equal(np.from_dlpack(l), np.arange(4.0))


def test_errors():
    with daemon() as sock, tb.Client(socket=sock) as prod:
        a = np.zeros(4)
        expect_error(lambda: prod.publish("", a), "TB_ENAME")
        expect_error(lambda: prod.publish("bad name\n", a), "TB_ENAME")
        expect_error(lambda: prod.acquire("bad\x01name", timeout=0), "TB_ENAME")
        prod.publish("er/a", a)
        expect_error(lambda: prod.acquire("er/a", exact=99), "TB_ENOTFOUND")
        expect_error(lambda: prod.publish("er/a", a, metadata=b"x" * 5000), "TB_ELIMIT")
        expect_raises(lambda: prod.publish("er/a", a, stream=5), ValueError)
        expect_raises(lambda: prod.publish("er/a", object()), TypeError)
        expect_raises(lambda: prod.acquire("er/a", after=1, exact=1), ValueError)
        # device="cuda" is a VMM buffer: without a CUDA driver, TB_ENOCUDA
        # naming the kind (tests/python/fakecuda_test_vmm.py has the rest)
        if not tb.cuda_available():
            expect_error(lambda: prod.empty((2,), np.float32, device="cuda"), "TB_ENOCUDA")
        expect_error(lambda: prod.empty((2,), np.float32, device="tpu"), "TB_ENOTSUP")
    expect_error(lambda: tb.Client(socket="/nonexistent/tb.sock"), "TB_ECONNECT")
    with daemon() as sock:
        expect_error(lambda: tb.Client(socket=sock, stream_contract="sometimes"), "TB_EINVAL")


def test_connect_errors_name_the_socket_and_why():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "nobody.sock")
        e = expect_error(lambda: tb.Client(socket=path), "TB_ECONNECT")
        assert path in e.message and "no such file (is tensorbrokerd running?" in e.message, e.message
        assert path in str(e), str(e)
    # a Hello the daemon refuses: its reason names the limit
    with daemon("--max-sessions", "1", "--operator-sessions", "0") as sock, \
            tb.Client(socket=sock):
        e = expect_error(lambda: tb.Client(socket=sock), "TB_ELIMIT")
        assert sock in e.message and "--max-sessions" in e.message, e.message
    # the daemon gone: the old client is told it closed the connection
    with daemon() as sock:
        c = tb.Client(socket=sock)
    e = expect_error(c.status, "TB_EDISCONNECTED")
    assert "the daemon closed the connection" in e.message, e.message
    c.close()


def test_second_publisher_is_refused():
    with daemon() as sock, tb.Client(socket=sock) as a, tb.Client(socket=sock) as b:
        a.publish("pb/x", np.zeros(2))
        expect_error(lambda: b.publish("pb/x", np.zeros(2)), "TB_EBUSY")


def test_lease_after_release_raises():
    with daemon() as sock, tb.Client(socket=sock) as prod, tb.Client(socket=sock) as cons:
        prod.publish("rl/a", np.arange(4))
        lease = cons.acquire("rl/a")
        assert channel_leases(cons, "rl/a") == 1
        lease.release()
        assert lease.released
        assert channel_leases(cons, "rl/a") == 0
        assert lease.version == 1  # plain attributes stay readable
        expect_error(lambda: lease.__dlpack__(), "TB_ESTALE")
        expect_error(lambda: lease.__dlpack_device__(), "TB_ESTALE")
        expect_error(lambda: lease.release(), "TB_ESTALE")
        expect_error(lambda: np.from_dlpack(lease), "TB_ESTALE")
        expect_raises(lambda: memoryview(lease), tb.Error)


def test_context_managers_release_and_close():
    with daemon() as sock, tb.Client(socket=sock) as prod:
        prod.publish("cm/a", np.arange(4))
        with tb.Client(socket=sock) as cons:
            with cons.acquire("cm/a") as lease:
                assert channel_leases(cons, "cm/a") == 1
                x = np.from_dlpack(lease)
                assert x.sum() == 6
                del x
            assert lease.released
            assert channel_leases(cons, "cm/a") == 0
        assert cons.closed
        expect_error(lambda: cons.acquire("cm/a"), "TB_ESTALE")
        assert len(prod.sessions()) == 1


def test_consumer_keeps_lease_alive_until_its_deleter():
    # The capsule's consumer owns the tensor: release() ends the lease only
    # when that consumer lets go, and nothing is freed twice.
    with daemon() as sock, tb.Client(socket=sock) as prod, tb.Client(socket=sock) as cons:
        prod.publish("kd/a", np.arange(6, dtype=np.int32))
        lease = cons.acquire("kd/a")
        x = np.from_dlpack(lease)
        y = np.asarray(lease)            # a buffer view holds it too
        lease.release()
        assert channel_leases(cons, "kd/a") == 1
        assert x.tolist() == list(range(6)) and y.tolist() == list(range(6))
        del x
        gc.collect()
        assert channel_leases(cons, "kd/a") == 1
        del y
        gc.collect()
        assert channel_leases(cons, "kd/a") == 0
        # Release while nothing is out, then drop the Lease: one release only.
        lease2 = cons.acquire("kd/a")
        lease2.release()
        del lease2
        assert channel_leases(cons, "kd/a") == 0
        # A lease dropped without release() ends when collected.
        lease3 = cons.acquire("kd/a")
        assert channel_leases(cons, "kd/a") == 1
        del lease3
        gc.collect()
        assert channel_leases(cons, "kd/a") == 0


def test_dlpack_protocol_on_leases():
    with daemon() as sock, tb.Client(socket=sock) as prod, tb.Client(socket=sock) as cons:
        prod.publish("dp/a", np.arange(6, dtype=np.float32).reshape(2, 3))
        with cons.acquire("dp/a") as lease:
            assert lease.__dlpack_device__() == (1, 0)
            assert '"dltensor_versioned"' in repr(lease.__dlpack__(max_version=(1, 0)))
            assert '"dltensor_versioned"' in repr(lease.__dlpack__(max_version=(1, 3)))
            assert '"dltensor"' in repr(lease.__dlpack__(max_version=(0, 8)))
            assert '"dltensor"' in repr(lease.__dlpack__())
            # unconsumed capsules above were freed by their destructors
            gc.collect()
            assert channel_leases(cons, "dp/a") == 1
            lease.__dlpack__(dl_device=(1, 0), copy=False)
            expect_raises(lambda: lease.__dlpack__(copy=True), BufferError)
            expect_raises(lambda: lease.__dlpack__(dl_device=(2, 0)), BufferError)
            expect_raises(lambda: lease.__dlpack__(stream=5), BufferError)
            expect_raises(lambda: lease.__dlpack__(stream=-1), BufferError)
            # read-only: the buffer view refuses writes
            expect_raises(lambda: memoryview(lease).cast("B").__setitem__(0, 1), TypeError)
            assert lease.dtype == (2, 32, 1) and lease.strides == (3, 1)
        gc.collect()
        assert channel_leases(cons, "dp/a") == 0


def test_acquire_releases_previous_lease():
    with daemon() as sock, tb.Client(socket=sock) as prod, \
            tb.Client(socket=sock) as cons, tb.Client(socket=sock) as other:
        prod.publish("ar/a", np.arange(4))
        first = cons.acquire("ar/a")
        v2 = prod.publish("ar/a", np.arange(4) * 2)
        second = cons.acquire("ar/a", after=first.version, release=first, timeout=5)
        assert first.released and not second.released
        assert second.version == v2 and np.from_dlpack(second).tolist() == [0, 2, 4, 6]
        assert channel_leases(cons, "ar/a") == 1
        prod.wait_free("ar/a", v2 - 1, timeout=0)   # version 1 is free at once
        # the acquire times out; the lease was released all the same
        expect_error(lambda: cons.acquire("ar/a", after=v2, timeout=0, release=second),
                     "TB_EAGAIN")
        assert second.released and channel_leases(cons, "ar/a") == 0
        # refused before anything is released: the lease stays usable
        third = cons.acquire("ar/a")
        expect_error(lambda: cons.acquire("ar/../x", release=third), "TB_ENAME")
        assert not third.released and np.from_dlpack(third).tolist() == [0, 2, 4, 6]
        foreign = other.acquire("ar/a")
        expect_error(lambda: cons.acquire("ar/a", release=foreign), "TB_EINVAL")
        assert not foreign.released
        expect_raises(lambda: cons.acquire("ar/a", release=np.zeros(1)), TypeError)
        expect_raises(lambda: cons.acquire("ar/a", release=third, release_stream=5), ValueError)
        expect_raises(lambda: cons.acquire("ar/a", release_stream=5), ValueError)
        assert not third.released and channel_leases(cons, "ar/a") == 2
        # a consumer library still holds the tensor: the lease ends when it goes
        x = np.from_dlpack(third)
        fourth = cons.acquire("ar/a", release=third)
        assert third.released and channel_leases(cons, "ar/a") == 3
        del x
        gc.collect()
        assert channel_leases(cons, "ar/a") == 2
        expect_error(lambda: cons.acquire("ar/a", release=third), "TB_ESTALE")
        # one-way releases: each checked through its own client's socket,
        # which the daemon reads in order (two sockets are not ordered)
        fourth.release()
        assert channel_leases(cons, "ar/a") == 1
        foreign.release()
        assert channel_leases(other, "ar/a") == 0


def test_stream_objects_with_handle_zero():
    # torch's default stream has .cuda_stream == 0: as a stream object that
    # is the legacy stream, while a bare 0 stays ambiguous (DLPack). The
    # native layer is called directly, as Lease.release(stream=) does.
    class Stream:
        def __init__(self, handle):
            self.cuda_stream = handle

    with daemon() as sock, tb.Client(socket=sock) as c:
        v1 = c.publish("so/a", np.zeros(4))
        c.publish("so/a", np.zeros(4))
        c._c.wait_free("so/a", v1, 0, Stream(0))
        expect_raises(lambda: c._c.wait_free("so/a", v1, 0, 0), ValueError)
        expect_raises(lambda: c._c.wait_free("so/a", v1, 0, Stream(-7)), ValueError)
        c._c.wait_free("so/a", v1, 0, Stream(1))


def test_introspection():
    with daemon() as sock, tb.Client(socket=sock, name="intro",
                                     stream_contract="no_sync") as c:
        assert c.stream_contract == "no_sync"
        st = c.status()
        assert st["sessions"] == 1 and st["socket_path"] == sock
        me = [s for s in c.sessions() if s["session_id"] == c.session_id]
        assert me and me[0]["name"] == "intro" and me[0]["stream_contract"] == "no_sync"
        assert me[0]["pid"] == os.getpid()
        c.publish("in/a", np.zeros(1), history_depth=3)
        (ch,) = c.channels()
        assert ch["name"] == "in/a" and ch["history_depth"] == 3 and ch["latest_version"] == 1
        assert isinstance(c.fileno(), int)


def test_operator_view_and_drop():
    import threading
    with daemon() as sock, tb.Client(socket=sock, name="op-prod") as prod, \
            tb.Client(socket=sock, name="op-cons") as cons, \
            tb.Client(socket=sock, name="op-wait") as waiter:
        cons.subscribe("op/a")
        prod.publish("op/a", np.arange(1024, dtype=np.uint8))
        lease = cons.acquire("op/a")
        (le,) = cons.leases()
        assert le["session_id"] == cons.session_id and le["session_name"] == "op-cons"
        assert (le["channel"], le["version"], le["bytes"]) == ("op/a", 1, 1024)
        assert le["memory_kind"] == "host" and le["pid"] == os.getpid()
        (bf,) = [b for b in cons.buffers() if b["buffer_id"] == le["buffer_id"]]
        assert bf["memory_kind"] == "host" and bf["device"] == "cpu" and bf["device_uuid"] == ""
        # published as a copy: its buffer is retired at once, its session named
        assert bf["session_id"] == prod.session_id and bf["session_name"] == "op-prod"
        assert (bf["versions"], bf["leases"]) == (1, 1)
        assert bf["size"] >= 1024 and bf["survives_producer"]
        got = []
        t = threading.Thread(target=lambda: got.append(waiter.acquire("op/none", timeout=30)))
        t.start()
        for _ in range(100000):     # each call is a round trip to the daemon
            ws = cons.waits()
            if ws:
                break
        (w,) = ws
        assert w["session_id"] == waiter.session_id and w["what"] == "acquire-latest"
        assert w["channel"] == "op/none" and 0 < w["timeout_ms"] <= 30000
        none = [ch for ch in cons.channels() if ch["name"] == "op/none"]
        assert none and none[0]["waiting"] and none[0]["waiters"] == 1
        expect_error(lambda: cons.drop("op/a"), "TB_EBUSY")           # open
        prod.close()
        assert channel_closed_reason(cons, "op/a") == "publisher disconnected"
        (bf,) = [b for b in cons.buffers() if b["buffer_id"] == le["buffer_id"]]
        assert bf["retired"] and bf["session_id"] == 0 and bf["session_name"] == ""
        assert bf["leases"] == 1 and bf["pid"] == os.getpid()
        e = expect_error(lambda: cons.drop("op/a"), "TB_EBUSY")       # leased
        assert "lease %d" % le["lease_id"] in e.message, e.message
        expect_error(lambda: cons.drop("op/b"), "TB_ENOTFOUND")
        assert channel_leases(cons, "op/a") == 1
        lease.release()
        cons.drop("op/a")
        assert [ch["name"] for ch in cons.channels()] == ["op/none"]
        expect_error(lambda: cons.drop("op/a"), "TB_ENOTFOUND")
        with tb.Client(socket=sock) as p2:
            p2.publish("op/none", np.zeros(4, np.uint8))
            t.join(30)
            assert got and not t.is_alive()
            got[0].release()


def test_notices_and_wait_free():
    with daemon() as sock, tb.Client(socket=sock) as prod, tb.Client(socket=sock) as cons:
        cons.subscribe("nt/a")
        a = prod.empty((4,), np.uint8)
        v1 = prod.publish("nt/a", a)
        n = cons.poll_notice(timeout=5)
        assert n["type"] == "new_version" and n["channel"] == "nt/a" and n["version"] == v1
        lease = cons.acquire("nt/a")
        expect_error(lambda: prod.wait_free("nt/a", v1, timeout=0), "TB_EBUSY")
        prod.publish("nt/a", a)       # v1 leaves history but is still leased
        expect_error(lambda: prod.wait_free("nt/a", v1, timeout=0.05), "TB_ETIMEDOUT")
        lease.release()
        prod.wait_free("nt/a", v1, timeout=5)
        expect_error(lambda: prod.wait_free("nt/a", 99, timeout=0), "TB_ENOTFOUND")


# What a forked worker finds of its parent's (test_forked_workers_...).
_INHERITED = {}


def _worker_uses_inherited(results):
    """A worker that uses its parent's client and lease: refused, and
    letting go of them ends nothing of the parent's."""
    c = _INHERITED["client"]
    try:
        c.acquire("fk/frames", timeout=0)
        results.put("acquire on the parent's client went through")
        return
    except tb.Error as e:
        if e.name != "TB_EFORKED" or "is a fork of it" not in e.message:
            results.put("wrong error %s: %s" % (e.name, e.message))
            return
    try:
        c.channels()
        results.put("channels() on the parent's client went through")
        return
    except tb.Error as e:
        if e.name != "TB_EFORKED":
            results.put("wrong error %s" % e.name)
            return
    frame = _INHERITED.pop("frame")
    ok = frame.tolist() == list(range(16))  # this process's copy of the mapping
    del frame
    _INHERITED.pop("lease").release()         # the child's copy only
    results.put("ok" if ok else "inherited frame unreadable")


def _worker_reads(results, sock, version):
    with tb.Client(socket=sock, name="worker") as own:
        with own.acquire("fk/frames", exact=version) as lease:
            results.put(np.from_dlpack(lease).tolist())


def test_forked_workers_need_their_own_client():
    """A stage that hands frames to worker processes (multiprocessing, fork
    start method): a worker that uses the client and lease its parent made
    gets TB_EFORKED, and dropping them there ends nothing of the parent's
    (its lease still holds the frame, which stays as it was, and its own
    calls are answered); workers that connect a client of their own read
    the frames."""
    import multiprocessing
    fork = multiprocessing.get_context("fork")

    def run(target, *args):
        results = fork.SimpleQueue()
        workers = [fork.Process(target=target, args=(results,) + args) for _ in range(2)]
        for w in workers:
            w.start()
        got = [results.get() for _ in workers]
        for w in workers:
            w.join(30)
            assert w.exitcode == 0, w.exitcode
        return got

    with daemon() as sock, tb.Client(socket=sock) as prod, tb.Client(socket=sock) as cons:
        a = prod.empty((16,), np.uint8)
        a[:] = np.arange(16)
        v1 = prod.publish("fk/frames", a)
        lease = cons.acquire("fk/frames")
        frame = np.from_dlpack(lease)
        _INHERITED.update(client=cons, lease=lease, frame=frame)
        try:
            assert run(_worker_uses_inherited) == ["ok", "ok"]
        finally:
            _INHERITED.clear()
        b = prod.empty((16,), np.uint8)
        b[:] = 7
        v2 = prod.publish("fk/frames", b)   # v1 leaves the channel's history
        expect_error(lambda: prod.wait_free("fk/frames", v1, timeout=0), "TB_EBUSY")
        assert frame.tolist() == list(range(16))
        assert cons.acquire("fk/frames", exact=v2, timeout=5).version == v2
        assert run(_worker_reads, sock, v2) == [[7] * 16] * 2
        del frame
        lease.release()
        prod.wait_free("fk/frames", v1, timeout=5)


def test_publish_from_one_thread_while_another_waits():
    """A stage with an input thread that waits for frames and a main thread
    that publishes results, on one Client: the results go out while the
    input thread waits (the daemon still lists its wait), and the input
    thread then gets its frame."""
    import threading

    def input_waits(watch):
        return [w for w in watch.waits() if w["channel"] == "st/in"]

    with daemon() as sock, tb.Client(socket=sock, name="stage") as stage, \
            tb.Client(socket=sock) as upstream, tb.Client(socket=sock) as watch:
        got = []
        t = threading.Thread(target=lambda: got.append(
            np.from_dlpack(stage.acquire("st/in", timeout=10)).tolist()))
        t.start()
        deadline = time.monotonic() + 10
        while not input_waits(watch):          # the acquire is parked
            assert time.monotonic() < deadline, "the input thread never waited"
        for i in range(3):
            out = stage.empty((4,), np.uint8)
            out[:] = i
            stage.publish("st/out", out)
        assert t.is_alive() and input_waits(watch)
        with watch.acquire("st/out", timeout=5) as lease:
            assert np.from_dlpack(lease).tolist() == [2] * 4
        a = upstream.empty((4,), np.uint8)
        a[:] = 7
        upstream.publish("st/in", a)
        t.join(10)
        assert got == [[7] * 4]


def test_two_threads_wait_on_two_channels_of_one_client():
    """A stage with one Client and an input thread per channel: both
    threads wait in acquire() at once (the daemon lists both waits). The
    second channel's frame comes first: its thread gets its data while the
    first thread still waits, and that one then gets its own frame."""
    import threading

    def stage_waits(watch, stage):
        return sorted(w["channel"] for w in watch.waits()
                      if w["session_id"] == stage.session_id)

    with daemon() as sock, tb.Client(socket=sock, name="stage") as stage, \
            tb.Client(socket=sock, name="upstream") as upstream, \
            tb.Client(socket=sock, name="watch") as watch:
        got = {}

        def take(channel):
            with stage.acquire(channel, timeout=10) as lease:
                got[channel] = np.from_dlpack(lease).tolist()

        ta = threading.Thread(target=take, args=("mw/a",))
        tb_ = threading.Thread(target=take, args=("mw/b",))
        ta.start()
        tb_.start()
        deadline = time.monotonic() + 10
        while stage_waits(watch, stage) != ["mw/a", "mw/b"]:   # both parked
            assert time.monotonic() < deadline, stage_waits(watch, stage)
            assert ta.is_alive() and tb_.is_alive(), got

        b = upstream.empty((3,), np.int32)
        b[:] = [4, 5, 6]
        upstream.publish("mw/b", b)
        tb_.join(10)
        assert not tb_.is_alive() and got == {"mw/b": [4, 5, 6]}, got
        assert ta.is_alive() and stage_waits(watch, stage) == ["mw/a"]

        a = upstream.empty((2,), np.int32)
        a[:] = [7, 8]
        upstream.publish("mw/a", a)
        ta.join(10)
        assert not ta.is_alive()
        assert got == {"mw/a": [7, 8], "mw/b": [4, 5, 6]}, got


def test_ctrl_c_stops_a_waiting_consumer():
    """A consumer waiting for a frame that does not come is stopped from
    the terminal with Ctrl-C (SIGINT: KeyboardInterrupt), in acquire() and
    in poll_notice(); the client stays usable: the daemon forgot the wait
    (a session parks one at a time: another acquire parks and times out
    instead of TB_EBUSY), and the next frame arrives."""
    import signal
    import threading

    fired = []
    closing = []

    def on_sigint(signum, frame):
        if fired:           # once, whatever else is sent
            return
        fired.append(signum)
        if closing:         # a handler that closes the client instead
            closing.pop().close()
        else:
            raise KeyboardInterrupt

    def interrupted(fn):
        """fn() under Ctrl-C pressed every 10 ms (one that comes just
        before the wait starts is not seen by it)."""
        stop = threading.Event()
        main = threading.main_thread().ident
        presser = threading.Thread(target=lambda: [
            signal.pthread_kill(main, signal.SIGINT) for _ in iter(lambda: stop.wait(0.01), True)])
        fired.clear()
        old = signal.signal(signal.SIGINT, on_sigint)
        presser.start()
        try:
            fn()
        except KeyboardInterrupt:
            return True
        finally:
            stop.set()
            presser.join()
            signal.signal(signal.SIGINT, old)
        return False

    with daemon() as sock, tb.Client(socket=sock) as prod, tb.Client(socket=sock) as cons:
        started = time.monotonic()
        assert interrupted(lambda: cons.acquire("cc/frames", timeout=10))
        assert time.monotonic() - started < 5
        expect_error(lambda: cons.acquire("cc/frames", timeout=0.05), "TB_ETIMEDOUT")
        cancels = re.search(r'tensorbroker_requests_total\{type="cancel"\} (\d+)',
                            prod.metrics())
        assert cancels is not None and int(cancels.group(1)) >= 1
        cons.subscribe("cc/frames")
        assert interrupted(lambda: cons.poll_notice(timeout=10))
        a = prod.empty((4,), np.uint8)
        a[:] = 3
        v = prod.publish("cc/frames", a)
        with cons.acquire("cc/frames", timeout=5) as lease:
            assert lease.version == v and np.from_dlpack(lease).tolist() == [3] * 4
        assert cons.poll_notice(timeout=5)["version"] == v
        # a handler that closes the waiting client: the wait ends, TB_ESTALE
        other = tb.Client(socket=sock)
        closing.append(other)
        started = time.monotonic()
        assert not interrupted(lambda: expect_error(
            lambda: other.acquire("cc/never", timeout=10), "TB_ESTALE"))
        assert time.monotonic() - started < 5 and not closing


def channel_closed_reason(client, channel):
    while True:
        n = client.poll_notice(timeout=10)
        assert n is not None, "no channel_closed notice for " + channel
        if n["type"] == "channel_closed" and n["channel"] == channel:
            return n["reason"]


def test_channel_closed_says_how_the_publisher_left():
    # close() says Goodbye; a killed process cannot
    with daemon() as sock, tb.Client(socket=sock) as cons:
        cons.subscribe("bye/closed")
        cons.subscribe("bye/killed")
        prod = tb.Client(socket=sock)
        prod.publish("bye/closed", np.zeros(4, np.uint8))
        prod.close()
        assert channel_closed_reason(cons, "bye/closed") == "publisher disconnected"
        peer = tbtest.Peer(sock)
        try:
            assert peer.call(op="publish", channel="bye/killed")["version"] == 1
            peer.proc.kill()
            peer.proc.wait()
        finally:
            peer.close()
        assert (channel_closed_reason(cons, "bye/killed")
                == "publisher ended without closing its session")


def test_empty_outlives_closed_client():
    with daemon() as sock:
        c = tb.Client(socket=sock)
        a = c.empty((8,), np.int32)
        a[:] = 5
        c.close()
        assert c.closed
        a[:] = 6  # still mapped: the connection closes with the last array
        assert a.sum() == 48
        expect_error(lambda: c.publish("oc/a", a), "TB_ESTALE")
        del a
        gc.collect()


def test_ring_never_rewrites_a_frame_in_use():
    """A decode stage's ring of three frames (Client.ring): while a consumer
    process still reads frame 0, the ring's return to that slot waits
    (timeout 0: TB_EBUSY, and the frame is left as it was); once the
    consumer lets go the slot comes back. A view of part of a slot is
    published as is; bad sizes and misuse raise before anything is
    published."""
    with daemon() as sock, tb.Client(socket=sock, name="decoder") as prod, \
            tempfile.TemporaryDirectory() as tmp, Peer(sock) as peer:
        expect_raises(lambda: prod.ring("rg/x", (4,), np.uint8, slots=1), ValueError)
        expect_raises(lambda: prod.ring("rg/x", (4,), np.uint8, slots=3, history_depth=3),
                      ValueError)
        ring = prod.ring("rg/frames", (64,), np.uint16, slots=3)
        expect_raises(ring.publish, RuntimeError)
        frame = ring.next()
        frame[:] = 100
        v0 = ring.publish()
        peer.call(op="acquire", channel="rg/frames", exact=v0, timeout=10, key="f0")
        held = os.path.join(tmp, "held.npy")
        peer.call(op="read", key="f0", path=held)
        for f in (1, 2):
            frame = ring.next()
            frame[:] = 100 + f
            expect_raises(lambda: ring.publish(np.zeros(4, np.uint16)), ValueError)
            v = ring.publish(frame[:32] if f == 2 else None)
        info = peer.call(op="acquire", channel="rg/frames", exact=v, timeout=10, key="f2")
        assert info["shape"] == [32]                 # the view of frame 2
        peer.call(op="release", key="f2")
        expect_error(lambda: ring.next(timeout=0), "TB_EBUSY")   # frame 0 is read
        peer.call(op="reread", key="f0", path=held)
        assert np.array_equal(np.load(held), np.full(64, 100, np.uint16))
        peer.call(op="release", key="f0")
        frame = ring.next(timeout=5)
        assert frame is ring.slots[0]
        frame[:] = 103
        v3 = ring.publish()
        peer.call(op="acquire", channel="rg/frames", exact=v3, timeout=10, key="f3")
        peer.call(op="read", key="f3", path=held)
        assert np.array_equal(np.load(held), np.full(64, 103, np.uint16))
        peer.call(op="release", key="f3")


def test_array_freed_while_another_thread_waits_in_acquire():
    # A consumer thread of a client waits in acquire() (the client's call
    # lock held for the whole wait); the main thread drops an array from
    # empty() of the same client, whose buffer's destruction waits for that
    # lock. It must wait without the GIL: the producer thread that publishes
    # what the acquire waits for runs meanwhile. Holding the GIL, it would
    # stop the interpreter until the acquire timed out (the test's 60 s).
    import threading
    import numpy as np
    with daemon() as sock:
        c = tb.Client(socket=sock, name="waiter")
        prod = tb.Client(socket=sock, name="producer")
        arr = c.empty((16,), "uint8")
        got, go = {}, threading.Event()

        def wait():
            got["lease"] = c.acquire("gil/ch", timeout=60)

        def publish():
            go.wait()
            prod.publish("gil/ch", np.zeros(4, np.uint8))

        th, tp = threading.Thread(target=wait), threading.Thread(target=publish)
        th.start()
        tp.start()
        while not any(w["channel"] == "gil/ch" for w in prod.waits()):
            th.join(0.01)  # until the acquire is parked in the daemon
        go.set()
        del arr  # waits for the acquire, which waits for the publish
        gc.collect()
        th.join(60)
        tp.join(60)
        assert not th.is_alive() and got["lease"].version == 1
        got["lease"].release()
        c.close()
        prod.close()


def test_tensor_outlives_closed_client():
    # A consumer written as a function that returns the frame, its client
    # closed by the with-block: the array keeps the session, and so the
    # lease, so the producer cannot rewrite the version under it.
    def latest(sock):
        with tb.Client(socket=sock, name="short-lived") as c:
            c.subscribe("ol/a")
            return np.from_dlpack(c.acquire("ol/a"))

    with daemon() as sock, tb.Client(socket=sock, name="producer") as prod:
        a = prod.empty((1024,), np.int32)
        a[:] = 7
        v = prod.publish("ol/a", a)
        x = latest(sock)
        b = prod.empty((1024,), np.int32)
        prod.publish("ol/a", b)         # v leaves the history: only x holds it
        expect_error(lambda: prod.wait_free("ol/a", v, timeout=0.2), "TB_ETIMEDOUT")
        assert [s["name"] for s in prod.sessions()].count("short-lived") == 1
        # its subscription ended with close(): no notice piles up unread
        assert {ch["name"]: ch["subscribers"] for ch in prod.channels()}["ol/a"] == 0
        assert int(x.sum()) == 7 * 1024
        del x
        gc.collect()
        prod.wait_free("ol/a", v, timeout=5)    # its deleter ended the lease
        deadline = time.monotonic() + 10        # and then the session
        while "short-lived" in [s["name"] for s in prod.sessions()]:
            assert time.monotonic() < deadline, prod.sessions()
        # an unreleased Lease object (no tensor taken) keeps it as well
        c = tb.Client(socket=sock, name="lease-only")
        lease = c.acquire("ol/a")
        w = lease.version
        c.close()
        prod.publish("ol/a", a)
        expect_error(lambda: prod.wait_free("ol/a", w, timeout=0.1), "TB_ETIMEDOUT")
        lease.release()
        prod.wait_free("ol/a", w, timeout=5)
