"""``loader.executor: ray`` on a real two-node Ray cluster (`tests.helpers.ray_cluster`): the
actors run on the second node and make the same micro-batches, byte for byte, as the training
process and local workers, across resumes that change the executor and the pool size (stream,
balanced and packed batching, a blend, online mixing); an actor SIGKILLed mid-run is replaced and
the run goes on with the same bytes; a stuck sample costs its actor and takes its stand-in; an
address that does not answer and a node that reads other data stop in one line; a local run
imports no Ray, and a Ray the loader started itself leaves no process behind.

One cluster for the session, few micro-batches per run: every actor start costs seconds of CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from energon_platform.training.digests import batch_digest, tensors_of
from scripts.bench.data import three_modality_blend
from tests.helpers import REPO, hang_encoder
from tests.helpers.ray_cluster import ON_DATA_NODE, actors_alive
from tests.helpers.run_configs import SMALL_IMAGE_TEXT, loader_config

pytestmark = pytest.mark.slow

#: micro-batches each run makes (the chain: 2 by local workers, 6 by actors, 2 in-process)
STEPS = 10
PACKED = str(REPO / "configs/encoders/multimodal_packed.yaml")
MIXED = str(REPO / "configs/encoders/multimodal.yaml")


def digest(batch) -> str:
    """A micro-batch's tensors and sample keys."""
    return batch_digest([tensors_of(batch), list(getattr(batch, "__key__", None) or [])])


@pytest.fixture(autouse=True)
def _disconnect(disconnected_after):
    """Every test here leaves this process disconnected (`disconnected_after`)."""


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    return three_modality_blend(tmp_path_factory.mktemp("ray_blend"))


def config(case: str, coco, blend, cache, **loader):
    """The run config of a case: ``stream`` (coco, one sample per row), ``balanced`` (the
    three-modality blend packed and planned, ``balance: attention``), ``adapt`` (the blend,
    packed by the encoder, ``loader.blend_adapt``)."""
    from energon_platform.config import load_config

    if case == "stream":
        data = loader_config(coco, SMALL_IMAGE_TEXT, **loader)
    elif case == "balanced":
        data = loader_config(
            {"path": str(blend), "val_split": None},
            PACKED,
            global_batch_size=8,
            micro_batch_size=2,
            balance="attention",
            length_cache=str(cache),
            **loader,
        )
    else:
        adapt = {"method": "loss_ratio", "every": 1, "lag": 1}
        data = loader_config(
            {"path": str(blend), "val_split": None},
            MIXED,
            global_batch_size=8,
            micro_batch_size=4,
            blend_adapt=adapt,
            **loader,
        )
    return load_config(data)


def run(cfg, first: int, last: int, state: dict | None = None, workers: int = 0):
    """Micro-batches ``first`` to ``last - 1`` (digests) of a loader restored from ``state``,
    reporting losses at each step end (``blend_adapt``), then its state."""
    from energon_platform.loader.train_loader import TrainLoader

    loader = TrainLoader(cfg, num_workers=workers)
    if state is not None:
        loader.load_state_dict(state)
    out, keys = [], []
    try:
        for c in range(first, last):
            batch = next(loader)
            out.append(digest(batch))
            keys += list(batch.__key__)
            if (c + 1) % loader.accumulation == 0:
                step = c // loader.accumulation
                loader.report_losses(step, keys, [float(len(k) % 7) for k in keys])
                keys = []
        return out, json.loads(json.dumps(loader.state_dict()))
    finally:
        loader.close()


@pytest.mark.parametrize(("case", "actors"), [("stream", 3), ("balanced", 2), ("adapt", 1)])
def test_local_then_ray_then_in_process_makes_the_same_bytes(
    ray_cluster, coco, blend, tmp_path_factory, case, actors
):
    """In-process from 0 against: local 2 workers [0, 2), resumed on ``actors`` Ray actors on
    the data node [2, 8) (with ``blend_adapt``, weights decided while the actors run), resumed
    in-process [8, 10)."""
    cache = tmp_path_factory.getbasetemp() / "ray_lengths"
    ray = {"executor": "ray", "ray_address": ray_cluster.address}
    ray["ray_actor_options"] = ON_DATA_NODE
    straight, _ = run(config(case, coco, blend, cache), 0, STEPS)
    local, state = run(config(case, coco, blend, cache, num_workers=2), 0, 2, workers=2)
    actors_part, state = run(
        config(case, coco, blend, cache, num_workers=actors, **ray), 2, STEPS - 2, state, actors
    )
    rest, _ = run(config(case, coco, blend, cache), STEPS - 2, STEPS, state)
    assert local + actors_part + rest == straight


def test_an_actor_sigkilled_mid_run_is_replaced_and_the_bytes_stay(ray_cluster, coco, caplog):
    from energon_platform.loader.train_loader import TrainLoader

    straight, _ = run(config("stream", coco, None, None), 0, STEPS)
    cfg = config(
        "stream",
        coco,
        None,
        None,
        num_workers=2,
        executor="ray",
        ray_address=ray_cluster.address,
        ray_actor_options=ON_DATA_NODE,
    )
    loader = TrainLoader(cfg)
    try:
        got = [digest(next(loader)) for _ in range(2)]
        before = list(loader.executor.workers())
        assert all("on node" in w for w in before)
        victim = loader.executor.pids()[1]
        os.kill(victim, signal.SIGKILL)
        got += [digest(next(loader)) for _ in range(STEPS - 2)]
        after = loader.executor.workers()
    finally:
        loader.close()
    assert got == straight and actors_alive(ray_cluster) == [], "close() leaves no actor"
    assert before[0] == after[0] and before[1] != after[1], (before, after)
    assert f"pid {victim}" in before[1]
    assert any("replaced, its micro-batches made again" in r.getMessage() for r in caplog.records)


def test_a_stuck_sample_on_ray_costs_its_actor_and_takes_its_stand_in(
    ray_cluster, coco, tmp_path, caplog
):
    """The sample of micro-batch 2 hangs on the actor: it is killed after ``sample_timeout``, the
    sample takes its stand-in (what a corrupt sample gets), every other micro-batch unchanged."""
    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader

    encoder = str(hang_encoder.encoder_yaml(tmp_path, REPO / SMALL_IMAGE_TEXT))
    plain = load_config(loader_config(coco, encoder))
    straight = TrainLoader(plain)
    batches = [next(straight) for _ in range(4)]
    key = batches[2].__key__[1]
    failing = load_config(loader_config(coco, encoder))
    os.environ["FAIL_KEY"] = key  # in this process: the run where the sample is corrupt
    try:
        corrupt, _ = run(failing, 0, 4)
    finally:
        del os.environ["FAIL_KEY"]
    options = {**ON_DATA_NODE, "runtime_env": {"env_vars": {"HANG_KEY": key}}}
    hung_cfg = load_config(
        loader_config(
            coco,
            encoder,
            num_workers=1,
            executor="ray",
            ray_address=ray_cluster.address,
            ray_actor_options=options,
            sample_timeout=6,  # far above a normal sample on a busy machine (2.1 s seen)
        )
    )
    hung, _ = run(hung_cfg, 0, 4, workers=1)
    assert hung == corrupt
    assert hung[:2] == [digest(b) for b in batches[:2]] and hung[3] == digest(batches[3])
    stuck = [r.getMessage() for r in caplog.records if "loader.sample_timeout" in r.getMessage()]
    assert len(stuck) == 1 and key in stuck[0], stuck


def test_an_address_that_does_not_answer_stops_in_one_line_saying_how_to_resume(coco):
    from energon_platform.loader.executors.ray_connect import RayUnavailable
    from energon_platform.loader.train_loader import TrainLoader

    cfg = config(
        "stream", coco, None, None, num_workers=1, executor="ray", ray_address="127.0.0.1:9"
    )
    with pytest.raises(RayUnavailable) as e:
        next(TrainLoader(cfg))
    line = str(e.value)
    assert "\n" not in line and "127.0.0.1:9 does not answer" in line
    assert "resume from the latest checkpoint" in line


def test_a_node_that_reads_other_data_or_cannot_read_it_stops_in_one_line(
    ray_cluster, coco, tmp_path
):
    """The dataset changes (another index uuid) between the trainer's plan and the actors'
    start, as on a node that mounts another copy; then it is gone, as on a node that lacks it."""
    from energon_platform.loader.executors.maker_spec import NodeMismatch
    from energon_platform.loader.train_loader import TrainLoader

    data = shutil.copytree(coco, tmp_path / "coco")
    ray = {"executor": "ray", "ray_address": ray_cluster.address}
    cfg = config("stream", data, None, None, num_workers=1, ray_actor_options=ON_DATA_NODE, **ray)
    loader = TrainLoader(cfg)
    loader.state_dict()  # the trainer's fingerprint, read now (as at its start)
    uuid = data / ".nv-meta" / "index.uuid"
    uuid.write_text("another-copy")
    with pytest.raises(NodeMismatch) as e:
        next(loader)
    line = str(e.value)
    assert "\n" not in line and "ray actor 0 on node " in line
    assert f"reads other data at {data}" in line and "index_uuid" in line
    shutil.rmtree(data / "train")
    shutil.rmtree(data / ".nv-meta")
    with pytest.raises(NodeMismatch) as e:
        next(loader)
    line = str(e.value)
    assert "\n" not in line and "cannot make the run's micro-batches" in line and str(data) in line
    assert loader.executor.workers() == [] and actors_alive(ray_cluster) == []


def test_a_cluster_that_loses_every_actor_stops_in_one_line_saying_how_to_resume(
    ray_cluster, coco, monkeypatch
):
    """A third node carries the pool; it is removed mid-run: no node can take a new actor."""
    from energon_platform.loader.executors import ray_pool
    from energon_platform.loader.train_loader import LoaderWorkerError, TrainLoader

    node = ray_cluster.cluster.add_node(num_cpus=1, resources={"doomed": 1}, num_gpus=0)
    options = {"num_cpus": 0.5, "resources": {"doomed": 1}}
    ray = {"executor": "ray", "ray_address": ray_cluster.address, "ray_actor_options": options}
    loader = TrainLoader(config("stream", coco, None, None, num_workers=1, **ray))
    try:
        next(loader)
        monkeypatch.setattr(ray_pool, "PLACE_TIMEOUT", 5.0)  # a new actor: placed within 5 s
        ray_cluster.cluster.remove_node(node)
        with pytest.raises(LoaderWorkerError) as e:
            for _ in range(STEPS):
                next(loader)
    finally:
        loader.close()
    line = str(e.value)
    assert "\n" not in line and "was not placed within 5 s" in line
    assert "resume from the latest checkpoint" in line


#: a local run, then a Ray of its own (ray_address null): no Ray module for the first, no
#: process of the second's session after close
FRESH = """
import json, sys
from energon_platform.config import load_config
from energon_platform.loader.train_loader import TrainLoader
from tests.helpers.run_configs import loader_config
from tests.helpers.ray_cluster import left_over
local = TrainLoader(load_config(loader_config(sys.argv[1], num_workers=1)))
next(local); local.close()
imported = sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))
pool = TrainLoader(load_config(loader_config(sys.argv[1], num_workers=1, executor="ray",
    ray_actor_options={"num_cpus": 0.5})))
next(pool)
import ray
session = ray._private.worker._global_node.get_session_dir_path()
alive = len(pool.executor.workers())
pool.close()
print(json.dumps({"imported": imported, "alive": alive, "connected": ray.is_initialized(),
                  "left": left_over(session)}))
"""


def test_a_local_run_imports_no_ray_and_a_ray_of_its_own_leaves_no_process(coco):
    done = subprocess.run(
        [sys.executable, "-c", FRESH, str(coco)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["imported"] == [], out
    assert out["alive"] == 1 and not out["connected"] and out["left"] == [], out
