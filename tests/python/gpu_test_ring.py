# SPDX-License-Identifier: Apache-2.0
"""GPU: ring-buffer pipelines written the way users write them (issue 20).

A torch producer process streams FRAMES frames through a ring of three CUDA
buffers of int32, filling buffer f % 3 with f on its stream s after
c.wait_free(channel, <the version last published from it>, stream=s), and
publishing it on s with metadata b"<f>" (gpu_ring_producer.py). A slower
consumer process (gpu_ring_consumer.py) takes the version after the last
one it read, runs a slow kernel (~SLOW_US) and then checks ON THE DEVICE that
every element equals the frame number, counting wrong frames in device
memory; it lets the lease end while that work is still queued. The
producer's next fill of the same buffer (three frames later) is ordered
after the consumer's reads only by the done event the lease's end records,
on the streams the consumer declared. One test per consumer variant:

    test_ring_torch_side            torch side stream, del x, release()
    test_ring_torch_release_stream  release(stream=side) with x alive, x
                                    dropped at the next frame
    test_ring_cupy                  CuPy non-blocking stream, `with lease:`
    test_ring_jax                   jax.dlpack.from_dlpack, jnp check
    test_ring_torch_graph           one captured CUDA graph per buffer
                                    address, replayed on side
    test_ring_control_without_wait_free
                                    the producer skips wait_free: the same
                                    consumer as test_ring_torch_side must
                                    see wrong frames (the check can fire)

Each passes with zero wrong frames and at least MIN_READ frames read of
FRAMES >= 1000 produced. Run one by name:

    python3 tests/python/run_tests.py tests/python/gpu_test_ring.py test_ring_cupy

(with TB_DAEMON and PYTHONPATH set as ctest sets them).
"""
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tbtest  # noqa: E402
from tbtest import daemon  # noqa: E402

torch = tbtest.require_torch_cuda()
from gpu_ring_util import Proc, PRODUCER, CONSUMER  # noqa: E402

FRAMES = 1500        # produced per test
PERIOD_US = 150      # the producer publishes one frame per 150 us ...
SLOW_US = 500        # ... and the consumer's slow kernel takes ~500 us a frame
MIN_READ = 100       # frames the consumer must have checked


def require(name):
    if importlib.util.find_spec(name) is None:
        raise tbtest.Skip(name + " is not installed")


def run_ring(variant, wait_free=True, slow_us=SLOW_US):
    """Run a producer and one consumer on a private daemon; returns the
    producer's and the consumer's summaries."""
    prod_args = ["--frames", FRAMES, "--period-us", PERIOD_US, "--warmup"]
    if not wait_free:
        prod_args.append("--no-wait-free")
    with daemon() as sock:
        with Proc(CONSUMER, sock, "--variant", variant, "--slow-us", slow_us,
                  "--timeout", 30, "--deadline", 100, name=variant) as cons, \
                Proc(PRODUCER, sock, *prod_args, name="producer") as prod:
            ready = cons.expect("ready", 180)   # JAX: start-up, compile, calibration
            prod.expect("ready", 120)             # after publishing a warm-up frame
            cons.expect("warm", 120)              # the consumer has read it
            prod.say("go")
            done = prod.expect("done", 120)
            res = cons.expect("result", 120)
            prod.say("quit")
            assert prod.finish(60) == 0, "producer failed"
            assert cons.finish(60) == 0, "consumer failed"
    print("ring %s%s: produced %d frames (%d..%d) in %.2f s, %d wait_frees; consumer "
          "read %d (frames %s..%s) in %.2f s, wrong %d, errors %s; %s"
          % (variant, "" if wait_free else " WITHOUT wait_free", done["frames"],
             done["first_frame"], done["last_frame"], done["elapsed_s"],
             done["wait_frees"], res["read"], res["first_frame"], res["last_frame"],
             res["elapsed_s"], res["wrong"], res["errors"],
             {k: v for k, v in ready.items() if k not in ("ready", "variant")}),
          flush=True)
    return done, res


def assert_clean(done, res):
    assert done["frames"] >= 1000, done
    assert res["errors"] == {}, "acquire failed: %s" % res
    assert res["ended"], "the consumer did not reach the end marker: %s" % res
    assert res["not_increasing"] == 0, "versions or frames went backwards: %s" % res
    assert res["read"] >= MIN_READ, \
        "the consumer read only %d frames (want >= %d): it proves too little" % (
            res["read"], MIN_READ)
    assert res["wrong"] == 0, \
        "%d of %d frames read held another frame's data: the producer rewrote a " \
        "buffer the consumer was still reading" % (res["wrong"], res["read"])


def test_ring_torch_side():
    # case (b) of issue 20: del x, then lease.release()
    assert_clean(*run_ring("torch_side"))


def test_ring_torch_release_stream():
    # case (a) of issue 20: release(stream=side) while x lives, x dropped at
    # the next frame
    assert_clean(*run_ring("torch_release_stream"))


def test_ring_cupy():
    require("cupy")
    assert_clean(*run_ring("cupy"))


def test_ring_jax():
    # See JaxVariant in gpu_ring_consumer.py: JAX declares one of its
    # "external ready event" streams and reads on its compute stream, and
    # drops the capsule (the deleter) when the array is freed on the host.
    require("jax")
    assert_clean(*run_ring("jax"))


def test_ring_jax_control_without_wait_free():
    # JAX calls the capsule's deleter only once its reads have finished
    # (measured on the H200: the library of 368f7b2, which recorded the
    # done event on the legacy stream, also read 0 wrong frames here), so
    # JAX is safe with or without a stream-true lease end. Its check can
    # still fire: without wait_free it must see wrong frames.
    require("jax")
    done, res = run_ring("jax", wait_free=False)
    assert res["errors"] == {}, res
    # JAX's check is slow (~0.8 ms a frame) and the producer runs free here:
    # it reads 80-120 frames of the 1,500 (H200, runs 57-59), 2 in run 64
    # (1 wrong): any wrong frame shows the check fires; none fails the test
    # however many it read
    assert res["wrong"] > 0, "JAX's check saw no rewrite without wait_free: %s" % res


def test_ring_torch_graph():
    done, res = run_ring("torch_graph")
    assert_clean(done, res)
    # the ring's three buffers keep their addresses (the mapping is cached):
    # one capture per buffer, replayed for every later version
    assert 1 <= res["captures"] <= 3, "captured %d graphs for a ring of 3" % res["captures"]


def test_ring_control_without_wait_free():
    # The same pipeline without wait_free must show wrong frames: proof that
    # the consumer lags enough, and checks well enough, to catch a rewrite.
    done, res = run_ring("torch_side", wait_free=False)
    assert res["errors"] == {}, res
    assert res["read"] >= MIN_READ, "the consumer read only %d frames" % res["read"]
    assert res["wrong"] > 0, \
        "without wait_free none of %d frames read was overwritten: the consumer " \
        "does not lag enough for the check to fire (raise SLOW_US)" % res["read"]
