"""Wait until the Ray head at ADDRESS answers and COUNT nodes have joined (slurm/ray_cluster.sh).

    python slurm/wait_for_nodes.py HOST:PORT COUNT

Exits 1 with a line saying what is missing after 300 s.
"""

from __future__ import annotations

import socket
import sys
import time

TIMEOUT_S = 300


def main(address: str, count: int) -> int:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                print(f"the Ray head at {address} did not answer in {TIMEOUT_S} s", file=sys.stderr)
                return 1
            time.sleep(1)  # the head is starting in another process; nothing to wait on but its port
    if count > 1:  # the head counts itself; workers need Ray's node table
        import ray

        ray.init(address=address, log_to_driver=False)
        while (joined := sum(node["Alive"] for node in ray.nodes())) < count:
            if time.monotonic() > deadline:
                print(f"{joined} of {count} Ray nodes joined {address} in {TIMEOUT_S} s", file=sys.stderr)
                return 1
            time.sleep(1)  # polling Ray's node table: workers join on other nodes
        ray.shutdown()
    print(f"ray cluster at {address}: {count} node(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
