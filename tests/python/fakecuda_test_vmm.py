# SPDX-License-Identifier: Apache-2.0
"""CPU: Client.empty(shape, dtype, device="cuda") with the fake CUDA driver
(tests/fakecuda) standing in for libcuda.so.1.

The array is a CUDA VMM buffer (docs/cuda.md, "VMM buffers"). A framework's
from_dlpack is emulated the way PyTorch treats a capsule (it renames it
"used_dltensor_versioned" and calls the deleter when its tensor dies): the
capsule must describe the buffer's device memory with the asked shape and
dtype, and keep the buffer alive until the deleter runs. The array is then
filled through the fake's cuMemcpyHtoD, published, and read back by a
consumer process-side client (lease.memory_kind 3, cuda-vmm in the channel
list), the data checked through cuMemcpyDtoH. A driver without POSIX
descriptor support gives TB_ENOTSUP, and a bad dtype or device a clear
error. A producer process killed and started again: a held tensor, a
consumer in between and one waiting across the restart lose nothing. A
consumer in a container of its own (unshare, a tmpfs /dev/shm;
root only), where CUDA interprocess events do not reach: its stream waits
for the buffer's ready signal of a version published with work in flight,
it reads a finished one, and its release with a read queued writes a done
signal that the producer's wait_free waits for (docs/cuda.md, "Signals").

Registered as python_fakecuda_vmm with LD_LIBRARY_PATH pointing at the fake;
anywhere else it skips."""
import ctypes
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tbtest  # noqa: E402
from tbtest import daemon  # noqa: E402

import tensorbroker as tb  # noqa: E402

from fakecuda import (cu, check, make_context_current,  # noqa: E402
                      DLManagedTensorVersioned, DELETER, capi)

make_context_current()

N = 1024


def fill(ptr, base):
    host = (ctypes.c_uint32 * N)(*[base + i for i in range(N)])
    check(cu.cuMemcpyHtoD_v2(ptr, host, N * 4), "cuMemcpyHtoD")


def words(ptr):
    host = (ctypes.c_uint32 * N)()
    check(cu.cuMemcpyDtoH_v2(host, ptr, N * 4), "cuMemcpyDtoH")
    return list(host)


def from_dlpack(obj):
    """What a framework does: take the capsule, keep the tensor."""
    cap = obj.__dlpack__(stream=1, max_version=(1, 0))
    p = capi.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    assert capi.PyCapsule_SetName(cap, b"used_dltensor_versioned") == 0
    return ctypes.cast(p, ctypes.POINTER(DLManagedTensorVersioned))


def test_empty_cuda_is_a_vmm_buffer_frameworks_import():
    with daemon() as sock:
        p = tb.Client(socket=sock, name="py-vmm-producer")
        a = p.empty((N,), "uint32", device="cuda")
        assert a.__dlpack_device__() == (tb.DEVICE_CUDA, 0)
        assert a.shape == (N,)
        m = from_dlpack(a)
        t = m.contents.dl_tensor
        assert (t.device.device_type, t.device.device_id) == (2, 0)
        assert t.data == a.data_ptr
        assert t.ndim == 1 and t.shape[0] == N
        assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (1, 32, 1)
        # the framework's tensor keeps the buffer: dropping our array
        # leaves it mapped until the deleter runs
        buf = a._buf
        refs = sys.getrefcount(buf)
        DELETER(m.contents.deleter)(m)
        assert sys.getrefcount(buf) == refs - 1
        del buf
        # fill, publish, read back as a consumer
        fill(a.data_ptr, 7000)
        v = p.publish("py/vmm", a, stream=1)
        c = tb.Client(socket=sock, name="py-vmm-consumer")
        lease = c.acquire("py/vmm", exact=v)
        assert lease.memory_kind == 3
        cm = from_dlpack(lease)
        got = words(cm.contents.dl_tensor.data + cm.contents.dl_tensor.byte_offset)
        assert got == [7000 + i for i in range(N)], got[:4]
        DELETER(cm.contents.deleter)(cm)
        lease.release()
        kinds = {ch["name"]: ch["memory_kind"] for ch in c.channels()}
        assert kinds == {"py/vmm": "cuda-vmm"}, kinds
        c.close()
        del a
        gc.collect()
        p.close()


def test_empty_cuda_dtypes():
    with daemon() as sock:
        p = tb.Client(socket=sock, name="py-vmm-dtypes")
        for dtype, want in (("float32", (2, 32)), ("bfloat16", (4, 16)),
                            ("int8", (0, 8)), ("bool", (6, 8))):
            a = p.empty((2, 3), dtype, device="cuda:0")
            m = from_dlpack(a)
            t = m.contents.dl_tensor
            assert (t.dtype.code, t.dtype.bits) == want, (dtype, t.dtype.code, t.dtype.bits)
            assert (t.ndim, t.shape[0], t.shape[1]) == (2, 2, 3)
            DELETER(m.contents.deleter)(m)
        try:
            p.empty((4,), "no-such-type", device="cuda")
        except TypeError as e:
            assert "unsupported dtype" in str(e)
        else:
            raise AssertionError("a bad dtype was accepted")
        try:
            p.empty((4,), "uint8", device="tpu")
        except tb.Error as e:
            assert "device must be 'cpu' or 'cuda'" in str(e), str(e)
        else:
            raise AssertionError("a bad device was accepted")
        p.close()


def test_empty_cuda_without_posix_fd_support():
    with daemon() as sock:
        p = tb.Client(socket=sock, name="py-vmm-nofd")
        os.environ["FAKECUDA_NO_VMM"] = "1"
        try:
            p.empty((N,), "uint32", device="cuda")
        except tb.Error as e:
            assert e.code == tb.TB_ENOTSUP, e.code
            assert "cannot create a cuda-vmm buffer" in str(e), str(e)
        else:
            raise AssertionError("empty(device='cuda') worked without VMM support")
        finally:
            del os.environ["FAKECUDA_NO_VMM"]
        assert cu.fakecuda_log_count(b"vmm-create size 2097152") == 0
        p.close()


def test_ring_of_vmm_buffers():
    """Client.ring(device="cuda"): two VMM buffers taken in turn; each frame
    written through the fake's copies, published on the legacy stream and
    read back as written by a consumer, which releases it before the ring
    comes back to its slot."""
    with daemon() as sock:
        p = tb.Client(socket=sock, name="py-vmm-ring")
        c = tb.Client(socket=sock, name="py-vmm-ring-reader")
        ring = p.ring("py/ring", (N,), "uint32", slots=2, device="cuda")
        assert ring.slots[0].buffer_id != ring.slots[1].buffer_id
        for f in range(5):
            a = ring.next(timeout=5, stream=1)
            assert a is ring.slots[f % 2]
            fill(a.data_ptr, 1000 * f)
            v = ring.publish(stream=1)
            lease = c.acquire("py/ring", exact=v, timeout=5)
            assert lease.memory_kind == 3
            cm = from_dlpack(lease)
            got = words(cm.contents.dl_tensor.data + cm.contents.dl_tensor.byte_offset)
            assert got == [1000 * f + i for i in range(N)], (f, got[:4])
            DELETER(cm.contents.deleter)(cm)
            lease.release()
        # the next slot's reuse is ordered on the legacy stream: writing
        # and publishing it on a side stream could overtake a reader
        a = ring.next(timeout=5)  # None: the spec contract's legacy stream
        side = __import__("fakecuda").new_stream()
        try:  # asked for again on another stream before it is published
            ring.next(timeout=5, stream=side)
            raise AssertionError("next() on another stream gave the slot again")
        except ValueError as e:
            assert "not published" in str(e), e
        assert ring.next(timeout=5, stream=1) is a
        try:
            ring.publish(stream=side)
            raise AssertionError("published on another stream than next()'s")
        except ValueError as e:
            assert "pass the stream that writes the slot to both" in str(e), e
        ring.publish(stream=1)  # the same stream: accepted
        c.close()
        del ring, a
        gc.collect()
        p.close()


# A consumer in a container of its own: other PID namespace, its own
# /dev/shm (no host IPC namespace), as a user runs one with
# `docker run` without --ipc=host. CUDA interprocess events do not reach
# across, so the buffers' signals order the exchange (docs/cuda.md,
# "Signals"): its stream waits for the producer's ready signal, and
# releases with a done signal that the producer's wait_free waits for.
CONTAINER_CONSUMER = r"""
import ctypes, sys
sys.path.insert(0, sys.argv[2])
from fakecuda import (cu, check, make_context_current, new_stream,
                      stream_name, log_text, DLManagedTensorVersioned, capi)
import tensorbroker as tb
make_context_current()
cu.fakecuda_set_busy(1)  # its reads are still queued when it releases
c = tb.Client(socket=sys.argv[1], name="container")
side = new_stream()
cu.fakecuda_log_clear()
lease = c.acquire("py/shm-pending", stream=side)
log = log_text()
assert ("wait-value %%s " %% stream_name(side)) in log and "(unmet)" in log, log
assert "ipc-open-event" not in log, log
lease.release(stream=-1)
lease = c.acquire("py/shm-done", stream=side)
cap = lease.__dlpack__(stream=side, max_version=(1, 0))
m = ctypes.cast(capi.PyCapsule_GetPointer(cap, b"dltensor_versioned"),
                ctypes.POINTER(DLManagedTensorVersioned)).contents.dl_tensor
host = (ctypes.c_uint32 * %d)()
check(cu.cuMemcpyDtoH_v2(host, m.data + m.byte_offset, ctypes.sizeof(host)),
      "copy")
assert list(host) == [9000 + i for i in range(len(host))], list(host)[:4]
del lease, m
del cap  # the read queued on side: the lease ends with a done signal
check(cu.cuStreamSynchronize(ctypes.c_void_p(side)), "sync")  # the read, and the signal, land
c.close()
print("ok")
""" % N


def test_consumer_in_another_container():
    import shutil
    import subprocess
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise tbtest.Skip("needs root and unshare(1) for a private /dev/shm")
    fc = __import__("fakecuda")
    with daemon() as sock:
        p = tb.Client(socket=sock, name="host-producer")
        s = fc.new_stream()
        a = p.empty((N,), "uint32", device="cuda")
        fill(a.data_ptr, 8000)
        cu.fakecuda_set_busy(1)  # its work in flight at publish
        p.publish("py/shm-pending", a, stream=s)
        cu.fakecuda_set_busy(0)
        b = p.empty((N,), "uint32", device="cuda")
        fill(b.data_ptr, 9000)
        v = p.publish("py/shm-done", b, stream=s)  # finished at publish
        out = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
             'mount -t tmpfs tmpfs /dev/shm && exec "$0" -c "$1" "$2" "$3"',
             sys.executable, CONTAINER_CONSUMER, sock,
             os.path.dirname(os.path.abspath(__file__))],
            stdout=subprocess.PIPE, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == "ok", out
        p.publish("py/shm-done", b, stream=s)  # v leaves the history
        cu.fakecuda_log_clear()
        p.wait_free("py/shm-done", v, timeout=5, stream=s)
        log = fc.log_text()
        want = "wait-value %s " % fc.stream_name(s)
        assert want in log and "(unmet)" not in log, log
        assert "ipc-open-event" not in log, log
        p.close()


# A producer process as a user writes one: a VMM buffer from
# Client.empty(device="cuda"), filled, published, then left running until
# it is killed (argv: socket, tests dir, fill base).
PRODUCER = r"""
import ctypes, sys
sys.path.insert(0, sys.argv[2])
from fakecuda import cu, check, make_context_current
import tensorbroker as tb
make_context_current()
c = tb.Client(socket=sys.argv[1], name="py-vmm-producer")
a = c.empty((%d,), "uint32", device="cuda")
base = int(sys.argv[3])
host = (ctypes.c_uint32 * %d)(*[base + i for i in range(%d)])
check(cu.cuMemcpyHtoD_v2(a.data_ptr, host, ctypes.sizeof(host)), "fill")
v = c.publish("py/restart", a, stream=1)
print(v, flush=True)
sys.stdin.read()  # until killed
""" % (N, N, N)


def test_producer_killed_and_restarted():
    # a pipeline whose producer process dies and is started again: its
    # consumers lose nothing. A tensor held across the death still reads
    # the dead producer's frame; a consumer that comes while no producer
    # runs reads that last version (VMM memory outlives its producer; a
    # legacy CUDA IPC version would be TB_ECLOSED); a consumer waiting for
    # the next version across the restart gets the new producer's.
    import signal
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))

    def start(base):
        p = subprocess.Popen([sys.executable, "-c", PRODUCER, sock, here, str(base)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        assert line.strip().isdigit(), (line, p.poll())
        return p, int(line)

    def read(lease):
        m = from_dlpack(lease)
        got = words(m.contents.dl_tensor.data + m.contents.dl_tensor.byte_offset)
        return m, got

    with daemon() as sock:
        first, v1 = start(1000)
        steady = tb.Client(socket=sock, name="steady")
        steady.subscribe("py/restart")
        held = steady.acquire("py/restart", exact=v1)
        hm, got = read(held)
        assert got == [1000 + i for i in range(N)], got[:4]
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        while True:  # the daemon has seen the producer go
            n = steady.poll_notice(timeout=20)
            assert n is not None, "no channel_closed notice after the kill"
            if n["type"] == "channel_closed":
                break

        between = tb.Client(socket=sock, name="in-between")
        # the operator's view: the dead producer's buffer, held by the
        # versions it published, says its kind and that it outlived it
        (bf,) = between.buffers()
        assert (bf["memory_kind"], bf["retired"], bf["survives_producer"],
                bf["pid"], bf["session_id"], bf["device"]) == \
            ("cuda-vmm", True, True, first.pid, 0, "cuda:0"), bf
        assert bf["versions"] == 1 and bf["leases"] == 1, bf  # steady's held
        lease = between.acquire("py/restart", timeout=0)
        assert lease.version == v1 and lease.memory_kind == 3
        m, got = read(lease)
        assert got == [1000 + i for i in range(N)], got[:4]
        DELETER(m.contents.deleter)(m)
        lease.release()

        second, v2 = start(2000)
        try:
            lease = steady.acquire("py/restart", after=v1, timeout=20)
            assert lease.version == v2 > v1
            m, got = read(lease)
            assert got == [2000 + i for i in range(N)], got[:4]
            DELETER(m.contents.deleter)(m)
            lease.release()
            got = words(hm.contents.dl_tensor.data + hm.contents.dl_tensor.byte_offset)
            assert got == [1000 + i for i in range(N)], "the held frame changed"
            DELETER(hm.contents.deleter)(hm)
            held.release()
        finally:
            second.kill()
            second.wait(timeout=30)
        between.close()
        steady.close()
