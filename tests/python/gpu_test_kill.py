# SPDX-License-Identifier: Apache-2.0
"""GPU: a consumer killed while a kernel reads a CUDA lease. Its lease dies
with its session, the producer's wait_free() completes, and the channel
keeps working for other consumers."""
import json
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tbtest  # noqa: E402
from tbtest import daemon, PYTHON, HERE  # noqa: E402

torch = tbtest.require_torch_cuda()
import tensorbroker as tb  # noqa: E402


def test_consumer_killed_mid_read():
    with daemon() as sock, tb.Client(socket=sock, name="producer") as c:
        x = torch.ones(1 << 22, device="cuda")
        v1 = c.publish("kill/x", x, stream=torch.cuda.current_stream())
        p = subprocess.Popen([PYTHON, os.path.join(HERE, "gpu_peer.py"), sock, "hold", "kill/x"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(p.stdout.readline())["reading"]
        assert any(ch["leases"] == 1 for ch in c.channels())
        p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=60) == -signal.SIGKILL
        p.stdout.close()
        p.stdin.close()
        y = torch.full((1 << 22,), 2.0, device="cuda")
        c.publish("kill/x", y, stream=torch.cuda.current_stream())   # v1 leaves history
        c.wait_free("kill/x", v1, timeout=30)                          # its lease is gone
        out = subprocess.run([PYTHON, os.path.join(HERE, "gpu_peer.py"), sock, "torch",
                              "kill/x"], stdout=subprocess.PIPE, text=True, timeout=300)
        assert out.returncode == 0
        assert json.loads(out.stdout.strip().splitlines()[-1])["sum"] == 2.0 * (1 << 22)
        assert c.status()["sessions"] == 1
