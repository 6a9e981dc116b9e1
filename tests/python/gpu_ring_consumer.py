# SPDX-License-Identifier: Apache-2.0
"""Ring-buffer consumer for gpu_test_ring.py and gpu_test_restart.py, in its
own process: a slow consumer written the way users write them, one variant
per library. Each frame it takes the version after the last one it read
(acquire(after=last): the newest, since the channel keeps one version), runs
a slow kernel and then, on the device, checks that every element equals the
frame number in the metadata; a wrong frame is counted on the device and
read back at the end. Its reads lag the producer, which is then about to
rewrite the buffer: only the consumer's done event (recorded when the lease
ends, on the stream(s) the consumer declared) keeps the producer's
wait_free-ordered fill from overwriting data the slow kernel has not read
yet.

    gpu_ring_consumer.py SOCKET --variant NAME [options]

Variants (docs/python.md for the stream rules):
  torch_side            torch on side = torch.cuda.Stream():
                        `with torch.cuda.stream(side): x = torch.from_dlpack(lease)`,
                        slow kernel + check on side, then `del x` and
                        `lease.release()` (no stream).
  torch_release_stream  the same, but `lease.release(stream=side)` while x
                        is alive; x is dropped only at the next frame.
  cupy                  CuPy on cupy.cuda.Stream(non_blocking=True), a spin
                        RawKernel that then counts mismatches; the lease is
                        a `with` block, the array dropped inside it.
  jax                   jax.dlpack.from_dlpack(lease), a slow jnp reduction
                        then the check in jnp, the array dropped, then
                        lease.release().
  torch_graph           one captured torch.cuda.CUDAGraph per input address
                        (slow kernel + check reading x, static output);
                        each frame waits for the version on side (from_dlpack,
                        outside any capture), replays the graph for x's
                        address on side, release(stream=side), drops x.
  hold                  (restart test) on "hold" acquires the newest version,
                        checks it and keeps x; on "check" checks it again,
                        then releases it.
  probe                 (restart test) a fresh consumer: one acquire of the
                        newest version with --timeout; reports the frame and
                        its check, or the error's name.

Protocol: JSON lines on stdout: {"ready": true, ...} when set up (and
calibrated), {"warm": true, ...} once the first frame is done (the
producer's --warmup frame: buffers opened, JAX compiled, a graph captured);
then the loop variants run until they read the version whose
metadata is b"end" and print one result line {"result": true, "read": R,
"wrong": W, ...}. Errors from acquire are counted by name (TB_ECUDA must
never happen); --stop-on-error makes the first one end the loop.
"""
import argparse
import json
import os
import sys
import time

import tensorbroker as tb


def emit(**kw):
    print(json.dumps(kw), flush=True)


class Stats:
    def __init__(self, split):
        self.read = 0
        self.read_after_split = 0      # frames >= split (the restart test's new producer)
        self.split = split
        self.frames = []               # (version, frame) of every frame read, in order
        self.errors = {}               # error name -> count
        self.error_messages = []
        self.mono_bad = 0              # versions or frames that did not increase

    def add(self, version, frame):
        if self.frames and (version <= self.frames[-1][0] or frame <= self.frames[-1][1]):
            self.mono_bad += 1
        self.frames.append((version, frame))
        self.read += 1
        if self.split and frame >= self.split:
            self.read_after_split += 1

    def error(self, e):
        name = getattr(e, "name", type(e).__name__)
        self.errors[name] = self.errors.get(name, 0) + 1
        if len(self.error_messages) < 5:
            self.error_messages.append(str(e))


# ---- slow kernels -------------------------------------------------------

def torch_sleep_cycles(torch, slow_us):
    """Cycles of torch.cuda._sleep (a clock64 spin) that take about slow_us
    on this GPU, measured with CUDA events."""
    torch.cuda._sleep(1000)
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    probe = 2_000_000
    a.record()
    torch.cuda._sleep(probe)
    b.record()
    b.synchronize()
    ms = max(a.elapsed_time(b), 1e-3)
    return max(1000, int(probe * slow_us / (ms * 1000.0))), ms


CUPY_SRC = r"""
extern "C" __global__ void spin_count(const int *x, int expect,
                                      unsigned long long n,
                                      unsigned long long ns, int *counts,
                                      int slot) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x +
                              threadIdx.x;
       i < n; i += (unsigned long long)gridDim.x * blockDim.x)
    if (x[i] != expect)
      atomicAdd(&counts[slot], 1);
}
"""


# ---- variants -------------------------------------------------------------

class TorchSide:
    """(a) torch side stream; del x, then lease.release()."""

    def __init__(self, args):
        import torch
        self.torch = torch
        torch.zeros(1, device="cuda")
        self.cycles, self.probe_ms = torch_sleep_cycles(torch, args.slow_us)
        self.side = torch.cuda.Stream()
        self.bad = torch.zeros((), dtype=torch.int32, device="cuda")
        self.prev_ev = None
        self.elems = args.elems
        torch.cuda.synchronize()

    def info(self):
        return {"sleep_cycles": self.cycles}

    def check_layout(self, x):
        if x.dtype != self.torch.int32 or tuple(x.shape) != (self.elems,):
            raise SystemExit("unexpected tensor %s %s" % (x.dtype, tuple(x.shape)))

    def slow_check(self, x, f):
        # on the current stream (side): the slow read, then the check
        self.torch.cuda._sleep(self.cycles)
        self.bad.add_((x != f).any().to(self.torch.int32))
        ev = self.torch.cuda.Event()
        ev.record()
        return ev

    def throttle(self, ev):
        # at most two frames in flight on the GPU: wait for the previous
        # frame's check (never for this frame's, whose lease has just ended
        # with its kernels still queued: that is the window under test)
        if self.prev_ev is not None:
            self.prev_ev.synchronize()
        self.prev_ev = ev

    def frame(self, lease, f):
        torch = self.torch
        with torch.cuda.stream(self.side):
            x = torch.from_dlpack(lease)      # passes side to __dlpack__: waits there
            self.check_layout(x)
            ev = self.slow_check(x, f)
        del x                                  # the capsule's deleter: not the end yet
        lease.release()                        # the lease ends here, no stream given
        self.throttle(ev)

    def finish(self):
        self.side.synchronize()
        with self.torch.cuda.stream(self.side):
            return int(self.bad.item())


class TorchReleaseStream(TorchSide):
    """(b) release(stream=side) while x is alive; x dropped at the next frame."""

    def __init__(self, args):
        super().__init__(args)
        self.x_prev = None
        self.evs = []

    def throttle(self, ev):
        # Three frames in flight, not two: x is dropped one frame late, and
        # its read must still be queued then (measured on the H200: with two
        # in flight the read had always finished by the time x went, so the
        # variant passed with the old library too, which ended this lease on
        # the legacy stream).
        self.evs.append(ev)
        if len(self.evs) > 2:
            self.evs.pop(0).synchronize()

    def frame(self, lease, f):
        torch = self.torch
        # the next frame: the previous tensor goes now, and with it (its
        # deleter) the previous lease, which release(stream=side) left open
        self.x_prev = None
        with torch.cuda.stream(self.side):
            x = torch.from_dlpack(lease)
            self.check_layout(x)
            ev = self.slow_check(x, f)
        lease.release(stream=self.side)        # x still alive: ends when x goes
        self.x_prev = x
        self.throttle(ev)

    def end(self):
        self.x_prev = None

    def finish(self):
        self.x_prev = None
        return super().finish()


class TorchGraph(TorchSide):
    """(e) a captured CUDA graph per input address, replayed on side."""

    def __init__(self, args):
        super().__init__(args)
        torch = self.torch
        self.expect = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.graphs = {}
        self.captures = 0
        torch.cuda.synchronize()

    def info(self):
        d = super().info()
        d["captures"] = self.captures
        return d

    def capture(self, x):
        torch = self.torch
        g = torch.cuda.CUDAGraph()
        # torch.cuda.graph synchronises the device, then captures on its own
        # stream. Nothing of tensorbroker runs inside: the lease was taken and
        # imported (and side made to wait) before, so the capture records
        # only the kernels that read x's address.
        with torch.cuda.graph(g):
            torch.cuda._sleep(self.cycles)
            self.bad.add_((x != self.expect).any().to(torch.int32))
        self.captures += 1
        return g

    def frame(self, lease, f):
        torch = self.torch
        with torch.cuda.stream(self.side):
            x = torch.from_dlpack(lease)       # side waits for this version's ready event
        self.check_layout(x)
        addr = x.data_ptr()
        g = self.graphs.get(addr)
        if g is None:
            g = self.graphs[addr] = self.capture(x)
        with torch.cuda.stream(self.side):
            self.expect.fill_(f)
            g.replay()                         # launched on the current stream: side
            ev = torch.cuda.Event()
            ev.record()
        lease.release(stream=self.side)
        del x                                  # the lease ends here (deleter)
        self.throttle(ev)


class CupyVariant:
    """(c) CuPy on a non-blocking stream; a `with lease:` block."""

    def __init__(self, args):
        import cupy
        import numpy
        self.cupy, self.np = cupy, numpy
        self.elems = args.elems
        self.ns = numpy.uint64(int(args.slow_us * 1000))
        self.kernel = cupy.RawKernel(CUPY_SRC, "spin_count")
        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        self.grid = (2 * sms,)                   # every block resident: one spin
        self.s = cupy.cuda.Stream(non_blocking=True)
        self.counts = cupy.zeros(args.max_frames + 1, dtype=cupy.int32)
        self.slot = 0
        self.prev_ev = None
        # compile and run once, off the record
        dummy = cupy.zeros(16, dtype=cupy.int32)
        self.kernel(self.grid, (256,), (dummy, numpy.int32(0), numpy.uint64(16),
                                        numpy.uint64(1000), self.counts, numpy.int32(args.max_frames)))
        cupy.cuda.Device().synchronize()
        self.counts.fill(0)
        cupy.cuda.Device().synchronize()

    def info(self):
        return {"spin_ns": int(self.ns)}

    def frame(self, lease, f):
        cupy, np = self.cupy, self.np
        with lease:
            with self.s:
                x = cupy.from_dlpack(lease)     # passes s.ptr to __dlpack__
                if x.dtype != cupy.int32 or x.shape != (self.elems,):
                    raise SystemExit("unexpected array %s %s" % (x.dtype, x.shape))
                self.kernel(self.grid, (256,), (x, np.int32(f), np.uint64(x.size), self.ns,
                                                self.counts, np.int32(self.slot)))
                ev = self.s.record()
            del x                               # CuPy frees its DLPack memory: deleter
        # `with` exit ended the lease (release() with no stream)
        self.slot += 1
        if self.prev_ev is not None:
            self.prev_ev.synchronize()
        self.prev_ev = ev

    def finish(self):
        self.s.synchronize()
        h = self.counts.get()
        return int(self.np.count_nonzero(h[:self.slot]))


class JaxVariant:
    """(d) JAX.

    What JAX does with the lease, read from jax/_src/dlpack.py and XLA's
    PjRt StreamExecutor client (jax-ml/jax, openxla/xla):
    - jax.dlpack.from_dlpack(obj) calls obj.__dlpack__(stream=S) with no
      max_version (so it gets the legacy "dltensor" capsule), where S is
      device.get_stream_for_external_ready_events(): one of a small pool of
      "external ready event" streams (LocalDeviceState::
      GetExternalReadyEventStream), NOT the compute stream. It then wraps
      the pointer with CreateViewOfDeviceBuffer(..., on_delete_callback,
      S): a definition event is recorded on S, and JAX's computations (on
      its compute stream) wait for it.
    - The capsule's deleter is that on_delete_callback, run when the last
      jax.Array on the buffer is freed (here: `del x`). Measured on the H200
      (JAX with driver 580.159.04, 2026-12-04): it runs only once JAX's
      reads have finished. The library of 368f7b2, which recorded the done
      event on the legacy stream, also read 0 wrong frames in 1181, while
      the same consumer without the producer's wait_free reads wrong ones
      (test_ring_jax_control_without_wait_free). So JAX is safe whatever
      stream the lease ends on; this variant checks that it stays so.
    """

    def __init__(self, args):
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        import jax
        import jax.numpy as jnp
        self.jax, self.jnp = jax, jnp
        self.elems = args.elems

        @jax.jit
        def check(x, f, big, bad):
            # the slow part: a reduction over `big` (zeros) on the compute
            # stream; the check of x depends on its result, so it runs after
            total = jnp.sum(big)
            gate = (total == -1.0).astype(x.dtype)      # 0: big holds zeros
            wrong = jnp.any((x + gate) != f)
            return bad + wrong.astype(jnp.int32)

        @jax.jit
        def reduce_only(big):
            return jnp.sum(big)

        self.check = check
        # size `big` so that its reduction takes about slow_us
        n = 64 << 20                                    # 256 MiB of float32
        big = jnp.zeros(n, jnp.float32)
        reduce_only(big).block_until_ready()
        t0 = time.perf_counter()
        for _ in range(10):
            r = reduce_only(big)
        r.block_until_ready()
        per_us = (time.perf_counter() - t0) / 10 * 1e6
        scale = min(16.0, max(1.0, args.slow_us / max(per_us, 1.0)))
        del big
        self.big = jnp.zeros(int(n * scale), jnp.float32)
        self.big_mib = int(n * scale) * 4 >> 20
        self.bad = jnp.zeros((), jnp.int32)
        dummy = jnp.zeros(self.elems, jnp.int32)
        self.bad = self.check(dummy, 0, self.big, self.bad)  # compile
        self.bad.block_until_ready()
        t0 = time.perf_counter()
        self.bad = self.check(dummy, 0, self.big, self.bad)
        self.bad.block_until_ready()
        self.check_us = (time.perf_counter() - t0) * 1e6
        self.bad = jnp.zeros((), jnp.int32)
        self.prev = None

    def info(self):
        return {"big_mib": self.big_mib, "check_us": round(self.check_us, 1)}

    def frame(self, lease, f):
        x = self.jax.dlpack.from_dlpack(lease)
        if x.dtype != self.jnp.int32 or x.shape != (self.elems,):
            raise SystemExit("unexpected array %s %s" % (x.dtype, x.shape))
        self.bad = self.check(x, f, self.big, self.bad)
        del x                 # JAX runs the capsule's deleter here (see above)
        lease.release()
        if self.prev is not None:
            self.prev.block_until_ready()
        self.prev = self.bad

    def finish(self):
        return int(self.bad)


VARIANTS = {
    "torch_side": TorchSide,
    "torch_release_stream": TorchReleaseStream,
    "torch_graph": TorchGraph,
    "cupy": CupyVariant,
    "jax": JaxVariant,
}


def run_loop(args):
    impl = VARIANTS[args.variant](args)
    c = tb.Client(socket=args.socket, name="ring-" + args.variant)
    stats = Stats(args.split)
    emit(ready=True, variant=args.variant, **impl.info())
    last = 0
    deadline = time.monotonic() + args.deadline
    t0 = None
    ended = False
    while time.monotonic() < deadline and stats.read < args.max_frames:
        try:
            lease = c.acquire(args.channel, after=last, timeout=args.timeout)
        except tb.Error as e:
            stats.error(e)
            # a timeout means nothing came for args.timeout: stop; other
            # errors are retried a few times (each is counted, and the
            # tests want none)
            if (args.stop_on_error or isinstance(e, tb.TimeoutError)
                    or sum(stats.errors.values()) >= 20):
                break
            time.sleep(0.05)
            continue
        if t0 is None:
            t0 = time.perf_counter()
        last = lease.version
        meta = bytes(lease.metadata)
        if meta == b"end":
            lease.release()
            ended = True
            break
        f = int(meta)
        impl.frame(lease, f)
        stats.add(last, f)
        if stats.read == 1:
            emit(warm=True, frame=f, version=last)   # opened, compiled, captured
    if hasattr(impl, "end"):
        impl.end()
    wrong = impl.finish()
    elapsed = time.perf_counter() - t0 if t0 is not None else 0.0
    frames = [fr for _, fr in stats.frames]
    emit(result=True, variant=args.variant, read=stats.read, wrong=wrong,
         read_after_split=stats.read_after_split, ended=ended,
         first_frame=frames[0] if frames else None, last_frame=frames[-1] if frames else None,
         first_version=stats.frames[0][0] if frames else None,
         last_version=last, not_increasing=stats.mono_bad, errors=stats.errors,
         error_messages=stats.error_messages, elapsed_s=round(elapsed, 3), **impl.info())
    c.close()


def run_hold(args):
    """Hold one lease across the producer's death (restart test)."""
    import torch
    torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    c = tb.Client(socket=args.socket, name="ring-hold")
    emit(ready=True, variant="hold")
    if sys.stdin.readline().strip() != "hold":
        raise SystemExit("hold: expected 'hold'")
    lease = c.acquire(args.channel, timeout=args.timeout)
    f = int(bytes(lease.metadata))
    with torch.cuda.stream(side):
        x = torch.from_dlpack(lease)
        ok = bool((x == f).all().item())          # syncs side only
    emit(held=f, version=lease.version, ok=ok)
    if sys.stdin.readline().strip() != "check":
        raise SystemExit("hold: expected 'check'")
    with torch.cuda.stream(side):
        ok2 = bool((x == f).all().item())
        nbad = int((x != f).sum().item())
    lease.release(stream=side)
    del x
    emit(checked=f, ok=ok2, wrong_elements=nbad)
    sys.stdin.readline()                           # "quit"
    c.close()


def run_probe(args):
    """A consumer that starts while no producer is alive (restart test)."""
    import torch
    torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    c = tb.Client(socket=args.socket, name="ring-probe")
    emit(ready=True, variant="probe", acquiring=True)
    t0 = time.monotonic()
    try:
        lease = c.acquire(args.channel, timeout=args.timeout)
    except tb.Error as e:
        emit(error=getattr(e, "name", type(e).__name__), message=str(e),
             waited_s=round(time.monotonic() - t0, 3))
        c.close()
        return
    f = int(bytes(lease.metadata)) if bytes(lease.metadata) != b"end" else -1
    with torch.cuda.stream(side):
        x = torch.from_dlpack(lease)
        ok = bool((x == f).all().item()) if f >= 0 else None
    del x
    lease.release(stream=side)
    emit(got=f, version=lease.version, ok=ok, waited_s=round(time.monotonic() - t0, 3))
    c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("socket")
    ap.add_argument("--variant", required=True,
                    choices=sorted(VARIANTS) + ["hold", "probe"])
    ap.add_argument("--channel", default="ring/frames")
    ap.add_argument("--elems", type=int, default=1 << 20)
    ap.add_argument("--slow-us", type=float, default=500.0)
    ap.add_argument("--timeout", type=float, default=30.0,
                    help="each acquire's timeout, seconds")
    ap.add_argument("--deadline", type=float, default=90.0,
                    help="the whole loop's bound, seconds")
    ap.add_argument("--max-frames", type=int, default=100000)
    ap.add_argument("--split", type=int, default=0,
                    help="count frames >= this apart (the restart's new producer)")
    ap.add_argument("--stop-on-error", action="store_true")
    args = ap.parse_args()
    if args.variant == "hold":
        run_hold(args)
    elif args.variant == "probe":
        run_probe(args)
    else:
        run_loop(args)


if __name__ == "__main__":
    main()
