# SPDX-License-Identifier: Apache-2.0
"""A consumer in its own process, driven by tbtest.Peer: one JSON command per
stdin line, one JSON answer per stdout line."""
import json
import sys
import traceback

import numpy as np
import tensorbroker as tb


def main():
    client = tb.Client(socket=sys.argv[1], name="peer")
    leases, views = {}, {}
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "acquire":
                lease = client.acquire(cmd["channel"], after=cmd.get("after"),
                                       timeout=cmd.get("timeout"), exact=cmd.get("exact"))
                leases[cmd.get("key", cmd["channel"])] = lease
                answer = {"version": lease.version, "metadata": lease.metadata.hex(),
                          "shape": list(lease.shape), "device": list(lease.__dlpack_device__()),
                          "read_only": lease.read_only}
            elif op == "read":
                # numpy.from_dlpack where this NumPy can import the dtype,
                # else the buffer protocol (bool on NumPy < 2).
                lease = leases[cmd["key"]]
                try:
                    x = np.from_dlpack(lease)
                    how = "from_dlpack"
                except (BufferError, TypeError, RuntimeError):
                    x = np.asarray(lease)
                    how = "buffer"
                views[cmd["key"]] = x
                np.save(cmd["path"], x)
                answer = {"how": how, "writeable": bool(x.flags.writeable)}
                del x  # only views[] may hold the lease's memory
            elif op == "reread":
                np.save(cmd["path"], views[cmd["key"]])
                answer = {}
            elif op == "release":
                views.pop(cmd["key"], None)
                leases.pop(cmd["key"]).release()
                answer = {}
            elif op == "publish":
                answer = {"version": client.publish(cmd["channel"],
                                                    np.arange(cmd.get("n", 4), dtype=np.uint8))}
            elif op == "leases":
                answer = {"leases": sum(ch["leases"] for ch in client.channels())}
            else:
                answer = {"error": "unknown op " + op}
        except Exception as e:  # report to the test, keep serving
            answer = {"error": "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())}
        print(json.dumps(answer), flush=True)
    views.clear()
    for lease in leases.values():
        lease.release()
    client.close()


if __name__ == "__main__":
    main()
