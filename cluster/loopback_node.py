"""`ray start` for a worker node of cluster/local_cluster.sh that listens on 127.0.0.1 only.

    python cluster/loopback_node.py start --block --address 127.0.0.1:PORT --node-ip-address 127.0.0.1 ...

Why a launcher and not plain `ray start`: Ray 2.60 replaces a loopback `--node-ip-address`
and a loopback `--address` by the machine's external address
(`ray._private.services.resolve_ip_for_localhost`), and then the GCS, raylets, object
managers, core workers and agents listen on every interface (the node address is not
loopback). With `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (Ray's single-machine mode, meant for
laptops) Ray keeps 127.0.0.1 as the node address, and every gRPC / HTTP server binds to it;
local_cluster.sh exports that variable for every process of the cluster. In that mode
`ray start` refuses to start a *non-head* node ("multi-node clusters are not supported"),
a check of `ray._private.ray_constants.ENABLE_RAY_CLUSTER`. This launcher lifts that check
for this one `ray start` process and keeps its address resolution on loopback, then runs
Ray's own CLI unchanged. The processes it starts (raylet, agents, workers) inherit
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` and resolve 127.0.0.1 to itself on their own.

Checked by tests/test_cluster.py (every listening socket of both nodes is on loopback).
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # for the processes this node starts

    import ray._private.ray_constants as ray_constants
    import ray._private.services as services
    from ray._common.network_utils import get_localhost_ip

    # the multi-node guard of `ray start` reads this flag; address resolution reads it too,
    # so resolution is pinned to loopback explicitly below
    ray_constants.ENABLE_RAY_CLUSTER = True
    services.node_ip_address_from_perspective = lambda address=None: get_localhost_ip()

    from ray.scripts.scripts import main as ray_main

    sys.argv[0] = "ray"
    return ray_main()


if __name__ == "__main__":
    sys.exit(main())
