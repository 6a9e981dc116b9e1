# SPDX-License-Identifier: Apache-2.0
"""Producer for gpu_test_graph_capture.py, in its own process (the CUDA IPC
event must cross a process boundary). Commands on stdin, JSON lines:
    {"op": "go", "value": K, "spin_ms": MS}
spins the GPU for about MS milliseconds on its stream, fills the tensor with
K, publishes on that stream (the ready event is recorded after the fill) and
answers {"version": V} as soon as publish() returns, long before the GPU is
done."""
import json
import sys

import torch
import tensorbroker as tb

N = 1 << 20


def spin_cycles(ms):
    props = torch.cuda.get_device_properties(0)
    rate_khz = getattr(props, "clock_rate", 1_500_000)  # kHz
    return int(rate_khz * ms)


def main():
    c = tb.Client(socket=sys.argv[1], name="graph-producer")
    s = torch.cuda.Stream()
    x = torch.zeros(N, device="cuda")
    torch.cuda.synchronize()
    for line in sys.stdin:
        cmd = json.loads(line)
        with torch.cuda.stream(s):
            if cmd.get("spin_ms"):
                torch.cuda._sleep(spin_cycles(cmd["spin_ms"]))
            x.fill_(float(cmd["value"]))
        v = c.publish("graph/x", x, stream=s)
        print(json.dumps({"version": v}), flush=True)
    torch.cuda.synchronize()
    c.close()


if __name__ == "__main__":
    main()
