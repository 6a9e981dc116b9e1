# SPDX-License-Identifier: Apache-2.0
"""CPU: pinned host memory from Python (Client.empty(pinned=True); docs/cuda.md,
"Pinned host memory"), with the fake CUDA driver (tests/fakecuda) standing in
for libcuda.so.1, whose call log shows each cuMemHostRegister.

The producer's array is registered once, read-write; the consumer's mapping
once, read-only; the lease is a kDLCUDAHost (3, 0) tensor of memory kind 4
that still exports the buffer protocol with the producer's bytes; closing
both clients unregisters both; a driver that refuses raises TB_ECUDA naming
the kind.

Registered as python_fakecuda_pinned with LD_LIBRARY_PATH pointing at the
fake; anywhere else (the real driver, or none) it skips."""
import contextlib
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tbtest import daemon  # noqa: E402

import tensorbroker as tb  # noqa: E402

from fakecuda import (cu, make_context_current, new_stream,  # noqa: E402
                      stream_name, log_bodies, recorded_on, DLManagedTensorVersioned,
                      capi)

CH = "fake/pinned"
N = 5000


def registrations(read_only):
    return [b for b in log_bodies() if b.startswith("host-register ")
            and b.endswith(" portable devicemap read-only" if read_only
                           else " portable devicemap")]


def capsule_device(lease, dl_device):
    """(device_type, device_id, data address) of a versioned capsule of the
    lease, which is then dropped unconsumed (its destructor frees it)."""
    cap = lease.__dlpack__(max_version=(1, 0), dl_device=dl_device)
    t = ctypes.cast(capi.PyCapsule_GetPointer(cap, b"dltensor_versioned"),
                    ctypes.POINTER(DLManagedTensorVersioned)).contents.dl_tensor
    return (t.device.device_type, t.device.device_id, t.data)


def test_empty_pinned_exchange():
    with daemon() as sock:
        prod = tb.Client(socket=sock, name="producer")
        cons = tb.Client(socket=sock, name="consumer")
        try:
            cu.fakecuda_log_clear()
            arr = prod.empty(N, "B", pinned=True)
            assert len(registrations(False)) == 1, log_bodies()
            view = memoryview(arr).cast("B")
            want = bytes(i % 251 for i in range(N))
            view[:] = want
            v = prod.publish(CH, arr)
            lease = cons.acquire(CH, exact=v)
            assert lease.__dlpack_device__() == (tb.DEVICE_CUDA_HOST, 0)
            assert lease.memory_kind == 4
            assert bytes(memoryview(lease)) == want
            assert len(registrations(True)) == 1, log_bodies()
            # a consumer that knows only kDLCPU may ask for it: same pages
            pinned_cap = capsule_device(lease, None)
            cpu_cap = capsule_device(lease, (1, 0))
            assert pinned_cap[:2] == (3, 0) and cpu_cap[:2] == (1, 0)
            assert pinned_cap[2] == cpu_cap[2] != 0  # the same pages
            try:
                lease.__dlpack__(dl_device=(2, 0))
            except BufferError:
                pass
            else:
                raise AssertionError("dl_device=(2, 0) was accepted")
            lease.release()
            view.release()
            del view, arr  # the producer's buffer goes with its last array
        finally:
            cons.close()
            prod.close()
        unreg = [b for b in log_bodies() if b.startswith("host-unregister ")]
        assert len(unreg) == 2 and not any("unmapped" in b for b in unreg), \
            log_bodies()


def test_driver_refuses():
    with daemon() as sock:
        prod = tb.Client(socket=sock, name="producer")
        os.environ["FAKECUDA_HOST_REGISTER_MAX"] = "0"
        try:
            prod.empty(N, "B", pinned=True)
        except tb.Error as e:
            assert "cuda-host" in str(e) and "cuMemHostRegister" in str(e), e
        else:
            raise AssertionError("a refused registration raised nothing")
        finally:
            del os.environ["FAKECUDA_HOST_REGISTER_MAX"]
            prod.close()


@contextlib.contextmanager
def cpu_and_gpu_stages():
    """A daemon, a CPU stage's client and a GPU stage's, with the fake's
    primary context current and busy mode on (every stream looks busy, so
    no done event is skipped as idle); yields (producer, consumer, stream,
    the stream's name in the log)."""
    make_context_current()
    s = new_stream()
    cu.fakecuda_set_busy(1)
    try:
        with daemon() as sock:
            prod = tb.Client(socket=sock, name="cpu-stage")
            gpu = tb.Client(socket=sock, name="gpu-stage")
            try:
                yield prod, gpu, s, stream_name(s)
            finally:
                gpu.close()
                prod.close()
    finally:
        cu.fakecuda_set_busy(0)


def test_gpu_reader_orders_rewrite():
    """A GPU stage reads a pinned lease asynchronously (a non-blocking copy
    on its side stream) and says so at release(stream=); the producer's
    wait_free() blocks until that stream's work is done before it writes
    the buffer again. A consumer that just drops the lease (del) gets its
    done event on the contract's default stream (spec: legacy)."""
    with cpu_and_gpu_stages() as (prod, gpu, s, s_name):
        bufs = [prod.empty(N, "B", pinned=True) for _ in range(2)]
        memoryview(bufs[0]).cast("B")[:] = bytes([1]) * N
        v = prod.publish(CH, bufs[0])
        lease = gpu.acquire(CH, exact=v)
        view = memoryview(lease)      # the consumer library's hold
        lease.release(stream=s)       # its copy runs on s
        cu.fakecuda_log_clear()
        view.release()                # the lease ends here
        ev = recorded_on(s_name)
        prod.publish(CH, bufs[1])     # v leaves the history
        cu.fakecuda_log_clear()
        prod.wait_free(CH, v, timeout=10)
        assert ("event-synchronize " + ev) in log_bodies(), log_bodies()
        memoryview(bufs[0]).cast("B")[:] = bytes([2]) * N  # now safe

        lease = gpu.acquire(CH, exact=v + 1)
        assert bytes(memoryview(lease))[:4] == bytes(4)
        cu.fakecuda_log_clear()
        del lease                     # no stream named: spec's legacy
        ev = recorded_on("legacy")
        prod.publish(CH, bufs[0])
        cu.fakecuda_log_clear()
        prod.wait_free(CH, v + 1, timeout=10)
        assert ("event-synchronize " + ev) in log_bodies(), log_bodies()
        del view, bufs


def test_ring_of_pinned_frames_waits_for_the_gpu_reader():
    """Client.ring(pinned=True), as a CPU stage feeding a GPU stage: the ring
    comes back to a frame only after the host waited on the done event the
    GPU reader's release(stream=) recorded."""
    with cpu_and_gpu_stages() as (prod, gpu, s, s_name):
        ring = prod.ring("fake/ring", N, "B", slots=2, pinned=True)
        done = []
        for f in range(4):
            frame = ring.next(timeout=10)
            if f >= 2:   # back at a slot: the host waited for its reader
                assert ("event-synchronize " + done[f - 2]) in log_bodies(), \
                    log_bodies()
            memoryview(frame).cast("B")[:] = bytes([f]) * N
            v = ring.publish()
            lease = gpu.acquire("fake/ring", exact=v, timeout=10)
            assert bytes(memoryview(lease))[:3] == bytes([f]) * 3
            cu.fakecuda_log_clear()
            lease.release(stream=s)
            done.append(recorded_on(s_name))
            cu.fakecuda_log_clear()
        del frame, ring
