"""One real two-node Ray cluster on this machine, shared by the tests that need Ray.

`ray_cluster` (a session fixture; ``tests/conftest.py`` names this module in ``pytest_plugins``)
starts a head node with no CPU to offer (nothing is placed there but the driver) and a second
node with 4 CPUs and the custom resource ``data_node``: actors asked with
``ray_actor_options: {resources: {data_node: 1}}`` (`ON_DATA_NODE`) run on that node, in their own
processes, apart from the head's GCS and raylet. No dashboard, 100 MB object stores. The cluster is
not recorded as the machine's current one (a plain ``ray.init()`` elsewhere starts its own Ray);
the loaders under test connect to it by address, and each test disconnects after itself
(`disconnected_after`), so a later test of the same process finds no connection to reuse. At the
end of the session both nodes stop, and no process of the cluster's session is left
(`left_over`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest

#: the custom resource of the second node, and the actor options that place an actor there
DATA_RESOURCE = "data_node"
ON_DATA_NODE = {"num_cpus": 0.5, "resources": {DATA_RESOURCE: 1}}
OBJECT_STORE = 100 * 1024 * 1024


@dataclass
class RayCluster:
    """The running cluster: its address (``loader.ray_address``), the session folder its
    processes name on their command lines, and the Ray ``Cluster`` object."""

    address: str
    session_dir: str
    cluster: object
    data_node: object


def left_over(session_dir: str) -> list[str]:
    """The processes of this machine that belong to the cluster's session (its GCS, raylets,
    workers): their command line names its session folder."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(p.info["cmdline"] or ())
        if session_dir in cmdline and p.info["pid"] != os.getpid():
            found.append(f"{p.info['pid']}: {cmdline[:120]}")
    return found


def actors_alive(rc: RayCluster, wait: float = 15.0) -> list[int]:
    """The pids of the pool's actors still alive on the data node after up to ``wait`` seconds
    (a killed actor's process takes a moment to end): processes under its raylet whose title
    Ray set to ``ray::MakerActor...``."""
    import time

    raylet = psutil.Process(rc.data_node.all_processes["raylet"][0].process.pid)
    deadline = time.monotonic() + wait
    while True:
        alive = []
        for p in raylet.children(recursive=True):
            try:
                if " ".join(p.cmdline()).startswith("ray::MakerActor"):
                    alive.append(p.pid)
            except psutil.Error:
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def start() -> RayCluster:
    """Start the two nodes and connect this process to them."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "object_store_memory": OBJECT_STORE,
        },
    )
    data_node = cluster.add_node(
        num_cpus=4, resources={DATA_RESOURCE: 4}, object_store_memory=OBJECT_STORE
    )
    # Ray's test cluster records itself as this machine's current cluster, which a plain
    # ``ray.init()`` of any other test (a conversion's own Ray) would then try to join
    recorded = ray._private.utils.get_ray_address_file(None)
    if ray._private.utils.read_ray_address() == cluster.address:
        os.remove(recorded)
    return RayCluster(cluster.address, cluster.head_node.get_session_dir_path(), cluster, data_node)


def stop(rc: RayCluster) -> None:
    """Disconnect, stop both nodes."""
    import ray

    ray.shutdown()
    rc.cluster.shutdown()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """The shared cluster (module doc); torn down at the end of the session, leaving no process
    of its session behind."""
    rc = start()
    try:
        yield rc
    finally:
        stop(rc)
        left = left_over(rc.session_dir)
        assert not left, f"Ray processes left after the cluster stopped: {left}"


@pytest.fixture
def disconnected_after() -> Iterator[None]:
    """This process disconnected from Ray after the test (a loader that joined a cluster by
    address stays connected, as a trainer's process does)."""
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()
