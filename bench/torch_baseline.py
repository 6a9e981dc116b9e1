#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""torch.multiprocessing baseline for tb-bench scenario 4.

Ping-pong hand-off of a CUDA tensor through a torch.multiprocessing queue,
one in flight: the producer puts the tensor, the consumer (a spawned process)
takes it, reads one element (which synchronises its stream, like tb-bench's
consumer does) and answers on a second queue. The producer times put -> answer.
The same tensor is sent every time, so torch's IPC handle cache is warm, as
tensorbroker's is in the warm row.

  python3 bench/torch_baseline.py [--mib 4] [--iters 1000] [--out FILE]

Prints p50/p99/p99.9 in microseconds; with --out also writes one round trip
per line in nanoseconds (tb-bench reads that file and adds the row to its
table). Exits 1 without torch or without a GPU.
"""
import argparse
import sys
import time


def consumer(q, back):
    import torch
    torch.cuda.init()
    while True:
        x = q.get()
        if x is None:
            break
        v = x[0].item()
        del x
        back.put(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=4)
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--out")
    a = ap.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        sys.exit(f"torch not importable: {e}")
    if not torch.cuda.is_available():
        sys.exit("torch sees no CUDA device")
    ctx = mp.get_context("spawn")
    q, back = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=consumer, args=(q, back))
    p.start()
    x = torch.ones(a.mib * 262144, device="cuda")  # float32: 4 B each
    lat = []
    for i in range(a.warmup + a.iters):
        x[0] = float(i)
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        q.put(x)
        back.get()
        t1 = time.perf_counter_ns()
        if i >= a.warmup:
            lat.append(t1 - t0)
    q.put(None)
    p.join()
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(str(v) for v in lat) + "\n")
    lat.sort()
    n = len(lat)
    print(f"torch {torch.__version__} mp queue ping-pong, {a.mib} MiB CUDA "
          f"tensor, n={n}: p50 {lat[n // 2] / 1e3:.1f} us, "
          f"p99 {lat[int(n * .99)] / 1e3:.1f} us, "
          f"p99.9 {lat[min(n - 1, int(n * .999))] / 1e3:.1f} us")


if __name__ == "__main__":
    main()
