"""Micro-batch ``c`` is the same bytes whoever makes it: the training process (``num_workers: 0``),
1 or 3 local worker processes, and across a resume that moves from one executor to the other, in
every batching mode (stream, packed, balanced), a fixed blend and an online-mixed blend (its
weights reach the workers with the requests)."""

from __future__ import annotations

import pytest

from energon_platform.config import load_config
from energon_platform.loader.train_loader import TrainLoader
from energon_platform.training.digests import batch_digest, tensors_of
from tests.helpers import REPO

#: global batches made per run; the resumes start at `MID`
STEPS, MID = 4, 2


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    from scripts.bench.data import three_modality_blend

    return three_modality_blend(tmp_path_factory.getbasetemp())


def config(mode: str, coco, blend, cache):
    """The run config of ``mode``: ``stream``, ``packed`` (coco), ``balanced`` (the packed
    three-modality blend, ``loader.balance``), ``blend`` and ``blend_adapt`` (that blend)."""
    loader = {"global_batch_size": 8, "micro_batch_size": 4, "seed": 3, "num_workers": 0}
    data, encoder = coco, "configs/encoders/image_text_small.yaml"
    if mode == "packed":
        encoder, loader["micro_batch_size"] = "configs/encoders/image_text_small_packed.yaml", 2
    elif mode == "balanced":
        data, encoder = blend, "configs/encoders/multimodal_packed.yaml"
        loader.update(micro_batch_size=2, balance="attention", length_cache=str(cache))
    elif mode in ("blend", "blend_adapt"):
        data, encoder = blend, "configs/encoders/multimodal.yaml"
        if mode == "blend_adapt":
            loader["blend_adapt"] = {"method": "loss_ratio", "every": 1, "lag": 1}
    return load_config(
        {
            "data": {"path": str(data), "val_split": None},
            "encoder": str(REPO / encoder),
            "loader": loader,
        }
    )


def run(cfg, workers: int, first: int = 0, state: dict | None = None) -> tuple[list, dict]:
    """Keys and digest of every tensor of the micro-batches of global batches ``first`` to `STEPS` - 1 (each step's
    losses reported, as a trainer does), and the state at global batch `MID`."""
    loader = TrainLoader(cfg, num_workers=workers)
    if state is not None:
        loader.load_state_dict(state)
    digests, saved = [], None
    try:
        for step in range(first, STEPS):
            if step == MID:
                saved = loader.state_dict()
            keys = []
            for _ in range(loader.accumulation):
                batch = next(loader)
                digests.append((list(batch.__key__), batch_digest(tensors_of(batch))))
                keys += list(batch.__key__)
            # a loss per dataset that differs, so the mixer moves the weights
            losses = [1.0 + len(k.split(":")[0]) / (1 + step) for k in keys]
            loader.report_losses(step, keys, losses)
    finally:
        loader.close()
    return digests, saved


@pytest.mark.parametrize("mode", ["stream", "packed", "balanced", "blend", "blend_adapt"])
def test_every_executor_and_resume_across_them_makes_the_same_bytes(
    mode, coco, blend, tmp_path_factory
):
    cfg = config(mode, coco, blend, tmp_path_factory.getbasetemp() / "exact-lengths")
    reference, state = run(cfg, workers=0)
    per_step = len(reference) // STEPS
    assert len({d for _, d in reference}) == len(reference), "distinct micro-batches"
    for workers in (1, 3):
        got, local_state = run(cfg, workers)
        assert got == reference, f"{workers} worker(s)"
    # in-process -> 3 workers, and a state saved by workers -> in-process
    resumed, _ = run(cfg, workers=3, first=MID, state=state)
    assert resumed == reference[MID * per_step :]
    resumed, _ = run(cfg, workers=0, first=MID, state=local_state)
    assert resumed == reference[MID * per_step :]


def test_workers_forked_by_another_thread_make_the_same_batches_and_close_leaves_none(coco):
    """A trainer that reads its loader from a thread of its own: the workers that thread forks
    (no kernel parent-death rule for them: they watch their parent themselves) make the same
    micro-batches, and ``close`` leaves no process behind."""
    import threading

    import psutil

    cfg = config("stream", coco, None, None)
    reference, _ = run(cfg, workers=0)
    loader = TrainLoader(cfg, num_workers=2)
    got, pids = [], []

    def read():
        for _ in range(4):
            batch = next(loader)
            got.append((list(batch.__key__), batch_digest(tensors_of(batch))))
        pids.extend(loader.executor.pids())

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    assert len(pids) == 2
    batch = next(loader)  # the workers outlive the thread that forked them
    got.append((list(batch.__key__), batch_digest(tensors_of(batch))))
    assert got == reference[:5] and loader.executor.pids() == pids
    loader.close()
    assert not [p for p in pids if psutil.pid_exists(p)], "a worker outlived close()"
    assert loader.executor.workers() == []
