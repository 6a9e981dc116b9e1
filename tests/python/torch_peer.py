# SPDX-License-Identifier: Apache-2.0
"""A PyTorch consumer in its own process, driven by tbtest.Peer (one JSON
command per stdin line, one JSON answer per stdout line), for
torch_test_host.py. It keeps torch tensors, never Lease objects: each
frame is taken as a PyTorch user writes it,

    lease = client.acquire(channel, ...)
    x = torch.from_dlpack(lease)
    del lease

so only the tensor holds the lease, until "drop" deletes it."""
import json
import sys
import traceback

import torch
import tensorbroker as tb


def main():
    client = tb.Client(socket=sys.argv[1], name="torch-peer")
    tensors = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "take":
                lease = client.acquire(cmd["channel"], exact=cmd.get("exact"),
                                       timeout=cmd.get("timeout"))
                x = torch.from_dlpack(lease)
                version = lease.version
                del lease  # the tensor alone keeps the lease
                tensors[cmd["key"]] = x
                answer = {"version": version, "dtype": str(x.dtype),
                          "values": x.float().flatten().tolist()}
            elif op == "read":
                answer = {"values": tensors[cmd["key"]].float().flatten().tolist()}
            elif op == "drop":
                del tensors[cmd["key"]]  # its deleter ends the lease
                answer = {}
            else:
                answer = {"error": "unknown op " + op}
        except Exception as e:  # report to the test, keep serving
            answer = {"error": "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())}
        print(json.dumps(answer), flush=True)
    tensors.clear()
    client.close()


if __name__ == "__main__":
    main()
