# SPDX-License-Identifier: Apache-2.0
"""GPU: pinned host memory (Client.empty(pinned=True); docs/cuda.md, "Pinned
host memory") between a NumPy CPU stage and a PyTorch GPU stage, as such a
pipeline is written.

The CPU stage (this process) writes frames into a ring of three pinned
buffers (Client.ring(..., pinned=True)), which hands a buffer out again
once wait_free() says the version published from it is free. The GPU
stage (another process) takes each frame with torch.from_dlpack, starts a
slow kernel and then a non-blocking copy to the device on a side stream,
names that stream at release and drops its tensor while the copy is still
queued: the copy must still read that frame, which
only the done event the release records (and wait_free's host wait on it)
guarantees. Each device copy's sum is checked. What torch does with a
kDLCUDAHost capsule, and the copy bandwidth from the pinned lease against a
pageable copy of the same bytes, are printed."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tbtest  # noqa: E402
from tbtest import daemon, PYTHON  # noqa: E402

torch = tbtest.require_torch_cuda()
import numpy as np  # noqa: E402
import tensorbroker as tb  # noqa: E402

N = 1 << 22          # float32 elements: 16 MiB a frame
FRAMES = 12
CH = "pinned/frames"

CONSUMER = r"""
import json, sys, time
import numpy as np, torch, tensorbroker as tb
sock, ch, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = tb.Client(socket=sock, name="gpu-stage")
side = torch.cuda.Stream()
out = []
how = None
for line in sys.stdin:
    v = int(line)
    lease = c.acquire(ch, exact=v, timeout=60)
    try:
        x = torch.from_dlpack(lease)
        how = how or "from_dlpack: %s, pinned=%s" % (x.device, x.is_pinned())
    except Exception as e:   # a torch that does not take kDLCUDAHost
        how = how or "from_dlpack refused (%s: %s); took dl_device=(1, 0)" % (
            type(e).__name__, e)
        x = torch.from_dlpack(lease.__dlpack__(dl_device=(1, 0)))
    with torch.cuda.stream(side):
        torch.cuda._sleep(int(5e7))           # the GPU is busy a while
        y = x.to("cuda", non_blocking=True)   # reads the pages later
        out.append((v, y.double().sum()))
    lease.release(stream=side.cuda_stream)    # the copy runs on side
    del x                                     # the lease ends here
    print(json.dumps({"acquired": v}), flush=True)
side.synchronize()
# bandwidth: the pinned lease against a pageable copy of the same bytes
lease = c.acquire(ch, timeout=60)
x = torch.from_dlpack(lease.__dlpack__(dl_device=(1, 0)))
pageable = torch.from_numpy(np.array(np.asarray(lease)))
def gbps(src):
    dst = torch.empty(src.shape, dtype=src.dtype, device="cuda")
    dst.copy_(src, non_blocking=True); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return 10 * src.numel() * src.element_size() / (time.perf_counter() - t0) / 1e9
bw = {"pinned_gbps": gbps(x), "pageable_gbps": gbps(pageable)}
del x
lease.release()
print(json.dumps({"sums": [[v, float(s.item())] for v, s in out], "how": how,
                  **bw}), flush=True)
"""


def test_cpu_stage_to_gpu_stage():
    with daemon() as sock, tb.Client(socket=sock, name="cpu-stage") as c:
        ring = c.ring(CH, (N,), "float32", slots=3, pinned=True, history_depth=2)
        p = subprocess.Popen([PYTHON, "-c", CONSUMER, sock, CH, str(N)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        version_of = {}
        try:
            for f in range(FRAMES):
                frame = ring.next(timeout=60)   # the host waits for the GPU stage
                frame[:] = np.float32(f + 1)
                version_of[f] = ring.publish()
                p.stdin.write("%d\n" % version_of[f])
                p.stdin.flush()
                got = json.loads(p.stdout.readline())
                assert got == {"acquired": version_of[f]}, got
            p.stdin.close()
            last = json.loads(p.stdout.readline())
            assert p.wait(timeout=120) == 0
        finally:
            if p.poll() is None:
                p.kill()
        print("torch and kDLCUDAHost:", last["how"])
        print("H2D from the pinned lease %.1f GB/s, from pageable memory %.1f GB/s"
              % (last["pinned_gbps"], last["pageable_gbps"]))
        want = {version_of[f]: float(f + 1) * N for f in range(FRAMES)}
        bad = [(v, s, want[v]) for v, s in last["sums"] if s != want[v]]
        assert len(last["sums"]) == FRAMES and not bad, bad
