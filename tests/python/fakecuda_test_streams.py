# SPDX-License-Identifier: Apache-2.0
"""CPU: where the Python binding's CUDA leases record their done event, with
the fake CUDA driver (tests/fakecuda) standing in for libcuda.so.1.

A consumer library is emulated the way PyTorch's from_dlpack treats a
capsule: it calls lease.__dlpack__(stream=its_stream), renames the capsule
"used_dltensor_versioned" (it now owns the tensor) and calls the tensor's
deleter when its own tensor dies. The fake's call log must then show the
consumer's done event recorded on the stream the consumer declared, however
the lease ends, and the producer's wait_free waiting on that event.

Registered as python_fakecuda_streams with LD_LIBRARY_PATH pointing at the
fake; anywhere else (the real driver, or none) it skips."""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tbtest import daemon  # noqa: E402

import tensorbroker as tb  # noqa: E402

from fakecuda import (cu, check, make_context_current, new_stream, settle,  # noqa: E402
                      stream_name as sname, log_text as log, log_count as count,
                      recorded_on,
                      DLDevice, DLDataType, DLManagedTensorVersioned,
                      DELETER, capi)

make_context_current()
cu.fakecuda_set_busy(1)  # every stream busy: no record skipped as idle

_keep = []  # producer-side tensors live as long as the test module


class FakeCudaWords:
    """n uint32 words of fake device memory that export themselves by DLPack
    (the producer side: what a torch tensor's __dlpack__ gives)."""

    def __init__(self, n):
        self.n = n
        p = ctypes.c_uint64()
        check(cu.cuMemAlloc_v2(ctypes.byref(p), n * 4), "cuMemAlloc")
        self.ptr = p.value

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        shape = (ctypes.c_int64 * 1)(self.n)
        m = DLManagedTensorVersioned()
        m.major, m.minor = 1, 0
        m.dl_tensor.data = self.ptr
        m.dl_tensor.device = DLDevice(2, 0)
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype = DLDataType(1, 32, 1)
        m.dl_tensor.shape = shape
        m.deleter = None  # borrowed: the broker copies what it needs
        _keep.append((m, shape))
        return capi.PyCapsule_New(ctypes.addressof(m), b"dltensor_versioned", None)


class ConsumerTensor:
    """What a consumer library makes of a lease: it takes the capsule
    (renames it), keeps the tensor, and calls its deleter when it dies."""

    def __init__(self, lease, stream):
        cap = lease.__dlpack__(stream=stream, max_version=(1, 0))
        p = capi.PyCapsule_GetPointer(cap, b"dltensor_versioned")
        assert capi.PyCapsule_SetName(cap, b"used_dltensor_versioned") == 0
        self.m = ctypes.cast(p, ctypes.POINTER(DLManagedTensorVersioned))
        assert self.m.contents.dl_tensor.device.device_type == 2

    def drop(self):
        DELETER(self.m.contents.deleter)(self.m)
        self.m = None


CH = "fake/py"


class Pipeline:
    def __init__(self, sock):
        self.sock = sock
        self.prod = tb.Client(socket=sock, name="producer")
        self.cons = tb.Client(socket=sock, name="consumer")
        self.sp = new_stream()
        self.bufs = [FakeCudaWords(256), FakeCudaWords(256)]
        self.i = 0
        self.done = None

    def publish(self):
        b = self.bufs[self.i]
        self.i ^= 1
        return self.prod.publish(CH, b, stream=self.sp, history_depth=1)

    def reuse(self, v, want=1):
        """The producer moves on and reuses v's buffer: its wait_free must
        wait on the consumer's done event (want 1) or nothing (want 0)."""
        self.publish()
        cu.fakecuda_log_clear()
        self.prod.wait_free(CH, v, timeout=20, stream=self.sp)
        body = "wait %s on %s" % (sname(self.sp), self.done)
        assert count(body) == want, (body, want, log())

    def assert_done_on(self, stream_name):
        body = "record %s on %s" % (self.done, stream_name)
        n_all = sum(1 for line in log().splitlines()
                    if " record %s on " % self.done in " " + line.split(" ", 1)[1])
        assert count(body) == 1 and n_all == 1, (body, log())

    def learn_done_event(self):
        s = new_stream()
        v = self.publish()
        lease = self.cons.acquire(CH, exact=v, stream=s)
        cu.fakecuda_log_clear()
        lease.release()
        self.done = recorded_on(sname(s))
        self.reuse(v)
        settle()  # that read is over: the case's record goes on its stream

    def close(self):
        self.cons.close()
        self.prod.close()


def run(case):
    with daemon() as sock:
        p = Pipeline(sock)
        try:
            p.learn_done_event()
            case(p)
        finally:
            p.close()


def test_from_dlpack_then_del_then_release():
    # case (b) of the bug: the consumer library read on its side stream,
    # drops its tensor, then release() with no stream
    def case(p):
        side = new_stream()
        v = p.publish()
        lease = p.cons.acquire(CH, exact=v)
        x = ConsumerTensor(lease, side)
        cu.fakecuda_log_clear()
        x.drop()
        lease.release()
        p.assert_done_on(sname(side))
        p.reuse(v)
    run(case)


def test_release_with_stream_while_tensor_lives():
    # case (a): release(stream=side) while the library holds the tensor;
    # the lease ends when the tensor is dropped, on side
    def case(p):
        side = new_stream()
        v = p.publish()
        lease = p.cons.acquire(CH, exact=v)
        x = ConsumerTensor(lease, -1)  # the library said -1: no sync
        lease.release(stream=side)
        assert lease.released
        cu.fakecuda_log_clear()
        x.drop()
        p.assert_done_on(sname(side))
        p.reuse(v)
    run(case)


def test_capsule_never_consumed_is_collected():
    # a capsule nobody took is garbage-collected: its destructor ends the
    # lease on the stream __dlpack__ was given
    def case(p):
        side = new_stream()
        v = p.publish()
        lease = p.cons.acquire(CH, exact=v)
        cap = lease.__dlpack__(stream=side, max_version=(1, 0))
        cu.fakecuda_log_clear()
        del lease
        del cap
        p.assert_done_on(sname(side))
        p.reuse(v)
    run(case)


def test_two_frames_on_two_side_streams():
    # a PyTorch-style consumer holds two frames, each read on its own side
    # stream, and drops them in turn while the first stream's reads still
    # run (busy): the producer waits for the done event's latest record
    # only, so that record must come after a wait on the first one
    def case(p):
        s1, s2 = new_stream(), new_stream()
        v1 = p.publish()
        x1 = ConsumerTensor(p.cons.acquire(CH, exact=v1), s1)
        v2 = p.publish()
        x2 = ConsumerTensor(p.cons.acquire(CH, exact=v2), s2)
        cu.fakecuda_log_clear()
        x1.drop()
        x2.drop()
        prev, since = None, []
        for body in (line.split(" ", 1)[1] for line in log().splitlines()):
            if body.startswith("record %s on " % p.done):
                on = body.rsplit(" ", 1)[1]
                if prev is not None and on != prev:
                    assert "wait %s on %s" % (on, p.done) in since, (
                        "the record on %s does not follow the one on %s"
                        % (on, prev), log())
                prev, since = on, []
            else:
                since.append(body)
        assert prev not in (None, sname(s2)), log()
        p.reuse(v1)
    run(case)


def test_published_tensor_let_go_after_the_readers():
    # the producer publishes a framework's tensor (kept alive by the
    # binding) and lets go of it once the version is free: a caching
    # allocator reuses that memory on the publish stream at once, so the
    # stream must first wait for the consumer's done event; and the
    # application's own wait_free afterwards still waits (on its stream)
    def case(p):
        side, mine = new_stream(), new_stream()
        v = p.publish()
        lease = p.cons.acquire(CH, exact=v)
        x = ConsumerTensor(lease, side)
        x.drop()  # the read queued on side: a done event
        lease.release()
        assert (CH, v) in p.prod._pins
        cu.fakecuda_log_clear()
        p.publish()  # v leaves the history: its VersionFree comes
        p.publish()  # ... and is collected here at the latest
        assert (CH, v) not in p.prod._pins
        body = "wait %s on %s" % (sname(p.sp), p.done)
        assert count(body) == 1, (body, log())
        p.prod.wait_free(CH, v, timeout=5, stream=mine)
        body = "wait %s on %s" % (sname(mine), p.done)
        assert count(body) == 1, (body, log())
    run(case)


# A consumer process, as a PyTorch user writes it: the frame goes to the
# framework on a side stream, the tensor is dropped at once (its reads
# still queued: busy), and the process is killed before they finish.
DYING_CONSUMER = r'''
import sys
sys.path.insert(0, sys.argv[4])
from fakecuda import cu, make_context_current, new_stream, stream_name, recorded_on
import tensorbroker as tb
make_context_current()
cu.fakecuda_set_busy(1)
c = tb.Client(socket=sys.argv[1], name="dying")
side = new_stream()
lease = c.acquire(sys.argv[2], exact=int(sys.argv[3]))
cap = lease.__dlpack__(stream=side, max_version=(1, 0))
cu.fakecuda_log_clear()
del lease
del cap
print(recorded_on(stream_name(side)), flush=True)
sys.stdin.read()  # until killed
'''


def test_consumer_killed_after_del():
    # a dead process's done event never completes: the producer's
    # wait_free must not make its stream wait on it, once the daemon has
    # seen that consumer's session end without its Goodbye
    import subprocess

    def case(p):
        v = p.publish()
        child = subprocess.Popen(
            [sys.executable, "-c", DYING_CONSUMER, p.sock, CH, str(v),
             os.path.dirname(os.path.abspath(__file__))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ev = child.stdout.readline().strip()
        p.publish()  # v leaves the history: its VersionFree names ev
        p.prod.sessions()  # ... and has reached the producer
        child.kill()
        child.wait()
        assert ev.startswith("e"), ev
        for _ in range(1000):
            if not any(x["name"] == "dying" for x in p.prod.sessions()):
                break
            p.prod.poll_notice(timeout=0.01)
        else:
            raise AssertionError("the killed consumer's session did not end")
        cu.fakecuda_log_clear()
        p.prod.wait_free(CH, v, timeout=20, stream=p.sp)
        body = "wait %s on %s" % (sname(p.sp), ev)
        assert count(body) == 0, (body, log())
    run(case)


def test_release_riding_on_acquire_while_tensor_lives():
    # acquire(release=lease, release_stream=side) while a consumer library
    # still holds the lease's tensor: the lease ends when that tensor goes,
    # and then after side too, as release(stream=side) would
    def case(p):
        side = new_stream()
        v = p.publish()
        lease = p.cons.acquire(CH, exact=v)
        x = ConsumerTensor(lease, -1)  # the library said -1: no sync
        v2 = p.publish()
        nxt = p.cons.acquire(CH, exact=v2, release=lease, release_stream=side)
        assert lease.released
        cu.fakecuda_log_clear()
        x.drop()
        p.assert_done_on(sname(side))
        nxt.release()
    run(case)


def test_with_block_after_acquire_stream():
    # acquire(stream=s), then the library's own stream via __dlpack__:
    # the end follows both (joined on the library's stream)
    def case(p):
        s, side = new_stream(), new_stream()
        v = p.publish()
        with p.cons.acquire(CH, exact=v, stream=s) as lease:
            x = ConsumerTensor(lease, side)
            x.drop()
            cu.fakecuda_log_clear()
        text = log()
        for st in (s, side):
            assert any(line.split(" ", 1)[1].startswith("record ")
                       and line.endswith(" on %s" % sname(st))
                       for line in text.splitlines()), (sname(st), text)
        assert sum(1 for line in text.splitlines()
                   if line.split(" ", 1)[1].startswith("record %s on " % p.done)) == 1, text
        p.reuse(v)
    run(case)


def test_no_stream_declared():
    # a consumer that only ever says -1 promises its own ordering: no done
    # event, and the producer waits on nothing
    def case(p):
        v = p.publish()
        lease = p.cons.acquire(CH, exact=v)
        x = ConsumerTensor(lease, -1)
        cu.fakecuda_log_clear()
        x.drop()
        lease.release(stream=-1)
        assert not any(" record %s on " % p.done in " " + line.split(" ", 1)[1]
                       for line in log().splitlines()), log()
        p.reuse(v, want=0)
    run(case)


def test_thread_per_request_on_per_thread_streams():
    # a server under the per_thread contract that serves each request on a
    # thread of its own, joined before the next one starts (so glibc hands
    # the next thread the same pthread_t): the frame goes to the consumer
    # library with stream None (this thread's per-thread default stream)
    # and is dropped while its read still runs (busy). The second thread's
    # per-thread stream is another stream, so the done event's record there
    # must come after a wait for the first thread's record.
    import threading

    def case(p):
        cons = tb.Client(socket=p.sock, name="per-thread-server",
                         stream_contract="per_thread")
        errors = []

        def serve(v):
            try:
                make_context_current()
                lease = cons.acquire(CH, exact=v)
                x = ConsumerTensor(lease, None)
                x.drop()
                lease.release()
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        try:
            cu.fakecuda_log_clear()
            for _ in range(2):
                t = threading.Thread(target=serve, args=(p.publish(),))
                t.start()
                t.join()
            assert not errors, errors
            done = recorded_on("ptds")
            records = [b.rsplit(" ", 1)[1] for b in (line.split(" ", 1)[1]
                       for line in log().splitlines())
                       if b.startswith("record %s on " % done)]
            assert records[0] == "ptds" and len(records) == 2, (records, log())
            assert records[1] != "ptds", (
                "the second thread's record went straight on 'its' per-thread "
                "stream, not after the first thread's", log())
            assert count("wait %s on %s" % (records[1], done)) == 1, log()
        finally:
            cons.close()
    run(case)
