# SPDX-License-Identifier: Apache-2.0
"""GPU consumer for the gpu_test_*.py files, in its own process.

    gpu_peer.py SOCKET LIB CHANNEL EXPECTED_SUM
Acquires CHANNEL, imports the lease with LIB (torch, cupy, jax) through
from_dlpack, and prints JSON {"sum": ..., "shape": [...], "device": ...}.
    gpu_peer.py SOCKET torch-named CHANNEL
The same with torch, a CUDA context made current first and CHANNEL named
at connect (Client(channels=...)): the acquire opens the buffer the
connect brought while the daemon answers.
    gpu_peer.py SOCKET hold CHANNEL
Acquires CHANNEL with torch, starts a long kernel reading it, prints
"reading" and waits to be killed.
    gpu_peer.py SOCKET follow CHANNEL
Subscribes to CHANNEL with a CUDA context current (so that new buffers are
opened ahead, as their notices are read), prints {"ready": true}, then for
each line "notice V" (wait for the notice of version V, then acquire it) or
"acquire V" (acquire version V, its notice unread) prints the torch sum of
that version as {"version": V, "sum": ...}; "quit" ends."""
import json
import sys

import tensorbroker as tb


def follow(sock, channel):
    import torch
    torch.zeros(1, device="cuda")    # the primary context, current here
    c = tb.Client(socket=sock, name="gpu-peer-follow")
    c.subscribe(channel)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        word, _, arg = line.strip().partition(" ")
        if word == "quit":
            break
        version = int(arg)
        if word == "notice":
            while True:
                n = c.poll_notice(timeout=60)
                if n is None:
                    raise SystemExit("no notice of version %d" % version)
                if n["channel"] == channel and n["version"] == version:
                    break
        lease = c.acquire(channel, exact=version, timeout=60)
        x = torch.from_dlpack(lease)     # waits on the version's ready event
        total = float(x.double().sum().item())
        del x
        lease.release(stream=torch.cuda.current_stream())
        print(json.dumps({"version": version, "sum": total}), flush=True)
    c.close()


def main():
    sock, lib, channel = sys.argv[1], sys.argv[2], sys.argv[3]
    if lib == "follow":
        follow(sock, channel)
        return
    named = None
    if lib == "torch-named":
        import torch
        torch.zeros(1, device="cuda")    # the primary context, current here
        named = [channel]
    c = tb.Client(socket=sock, name="gpu-peer-" + lib, channels=named)
    lease = c.acquire(channel, timeout=60)   # the wait is applied in __dlpack__
    if lib in ("torch", "torch-named"):
        import torch
        x = torch.from_dlpack(lease)
        total = float(x.double().sum().item())
        shape, dev = list(x.shape), str(x.device)
    elif lib == "cupy":
        import cupy
        x = cupy.from_dlpack(lease)
        total = float(x.astype(cupy.float64).sum().get())
        shape, dev = list(x.shape), "cuda:%d" % x.device.id
    elif lib == "jax":
        import jax
        import jax.numpy as jnp
        x = jax.dlpack.from_dlpack(lease)
        total = float(jnp.sum(x.astype(jnp.float32)))
        shape, dev = list(x.shape), str(list(x.devices())[0])
    elif lib == "hold":
        import torch
        x = torch.from_dlpack(lease)
        torch.cuda._sleep(int(5e9))      # a long read in flight
        y = x * 2                        # noqa: F841
        print(json.dumps({"reading": True}), flush=True)
        sys.stdin.read()                 # until killed
        return
    else:
        raise SystemExit("unknown lib " + lib)
    del x
    lease.release()
    c.close()
    print(json.dumps({"sum": total, "shape": shape, "device": dev}), flush=True)


if __name__ == "__main__":
    main()
