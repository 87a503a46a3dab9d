"""energon_platform's train loader: exact, elastic, O(1) restore, loud on mismatch."""

from __future__ import annotations

import json

import pytest
import torch

from energon_platform.config import load_config
from energon_platform.loader.schedule import LayoutError, Schedule
from energon_platform.loader.state import StateMismatchError
from energon_platform.loader.train_loader import TrainLoader
from energon_platform.training.train import batch_digest
from task_encoders.config_parser import ConfigError
from tests.helpers import REPO

IMAGE = str(REPO / "configs/encoders/image_text_small.yaml")
IMAGE_PACKED = str(REPO / "configs/encoders/image_text_small_packed.yaml")
AUDIO = {
    "encoder": "audio_text",
    "text": {"seq_len": 48},
    "audio": {
        "n_mels": 32,
        "spec_augment": {
            "enabled": True,
            "freq_masks": 1,
            "freq_width": 4,
            "time_masks": 1,
            "time_width": 10,
            "max_time_fraction": 0.2,
        },
    },
}
AUDIO_PACKED = {**AUDIO, "text": {"seq_len": 96}, "packing": {"enabled": True, "buffer_size": 4}}


def cfg(path, encoder=IMAGE, **loader):
    return load_config(
        {
            "data": {"path": str(path)},
            "encoder": encoder,
            "loader": {"global_batch_size": 8, "num_workers": 0, **loader},
        }
    )


def run_layout(
    config, ranks: int, workers: int, steps: int, states: list[dict] | None = None
) -> tuple[list, list]:
    """``steps`` global batches as (keys, row digests), ranks simulated in this process, each rank
    taking its ``accumulation`` micro-batches per step (rank order, then micro-batch order, as the
    trainer logs them); then every rank's ``state_dict()``. ``states``: the saved ranks' states to
    restore first; a rank beyond the saved ones gets rank 0's (as ``checkpoint.load`` does)."""
    loaders = [
        TrainLoader(config, rank=r, world_size=ranks, num_workers=workers) for r in range(ranks)
    ]
    for r, loader in enumerate(loaders):
        if states is not None:
            loader.load_state_dict(states[r] if r < len(states) else states[0])
    out = []
    for _ in range(steps):
        parts = [next(loader) for loader in loaders for _ in range(loader.accumulation)]
        out.append(
            ([k for p in parts for k in p.keys], [d for p in parts for d in batch_digest(p)])
        )
    saved = [json.loads(json.dumps(loader.state_dict())) for loader in loaders]  # travels as JSON
    for loader in loaders:
        loader.close()
    return out, saved


def global_batches(
    config, ranks: int, workers: int, steps: int, state: dict | None = None
) -> list[tuple]:
    """:func:`run_layout`'s batches, every rank restored from ``state`` first (when given)."""
    return run_layout(config, ranks, workers, steps, None if state is None else [state])[0]


# ---------------------------------------------------------------- schedule


def test_schedule_every_sample_once_per_epoch_and_epochs_differ():
    s = Schedule.for_dataset(15, seed=3, items_per_batch=4)
    e0 = [s.sample_at(p) for p in range(15)]
    e1 = [s.sample_at(p) for p in range(15, 30)]
    assert sorted(i for _, _, i in e0) == list(range(15)) == sorted(i for _, _, i in e1)
    assert {e for _, e, _ in e0} == {0} and {e for _, e, _ in e1} == {1}
    assert [i for _, _, i in e0] != [i for _, _, i in e1]
    windowed = Schedule.for_dataset(15, seed=3, items_per_batch=4, shuffle_buffer=4)
    assert sorted(windowed.sample_at(p)[2] for p in range(15)) == list(range(15))
    assert Schedule.for_dataset(15, seed=3, items_per_batch=4).sample_at(9) == s.sample_at(9)


def test_schedule_refuses_world_size_that_cannot_split_the_batch():
    s = Schedule.for_dataset(10, seed=0, items_per_batch=6)
    with pytest.raises(
        LayoutError, match=r"world sizes that keep the same global batches: \[1, 2, 3, 6\]"
    ):
        s.check_world_size(4)


# ---------------------------------------------------------------- exact resume


@pytest.mark.parametrize("workers", [0, 2])
def test_restore_continues_with_identical_batches(coco, workers):
    config = cfg(coco, num_workers=workers, shuffle_buffer=64)
    reference = global_batches(config, 1, workers, 9)
    loader = TrainLoader(config)
    for _ in range(5):
        next(loader)
    state = json.loads(json.dumps(loader.state_dict()))  # travels as JSON
    assert state["next_microbatch"] == 5 and len(json.dumps(state)) < 2000
    assert global_batches(config, 1, workers, 4, state) == reference[5:]


def test_restore_twice_in_a_row_and_across_epoch_boundary(coco):
    config = cfg(coco, global_batch_size=32)  # 286 train samples: epoch 1 starts inside batch 8
    reference = global_batches(config, 1, 0, 12)
    loader = TrainLoader(config)
    for _ in range(7):
        next(loader)
    first = loader.state_dict()
    again = TrainLoader(config)
    again.load_state_dict(first)
    got = [next(again) for _ in range(2)]
    second = again.state_dict()
    assert [list(b.keys) for b in got] == [k for k, _ in reference[7:9]]
    assert global_batches(config, 1, 0, 3, second) == reference[9:12]
    epoch0 = [k for keys, _ in reference[:9] for k in keys][:286]
    assert len(set(epoch0)) == 286  # every training sample once in epoch 0


def test_per_sample_augmentation_differs_between_epochs(coco):
    config = cfg(coco, global_batch_size=26)  # 286 = 11 x 26: epoch 1 is batches 11..21
    batches = global_batches(config, 1, 0, 22)
    digest = {}
    for epoch, chunk in ((0, batches[:11]), (1, batches[11:])):
        for keys, rows in chunk:
            for k, d in zip(keys, rows):
                digest.setdefault(k, {})[epoch] = d
    assert len(digest) == 286 and all(d[0] != d[1] for d in digest.values())


# ---------------------------------------------------------------- elastic resume

LAYOUTS = [
    # (encoder, packed, saved ranks x workers, resumed ranks x workers, micro_batch_size)
    ("image", False, (1, 2), (2, 1), None),
    ("image", False, (2, 2), (4, 0), None),
    ("image", True, (2, 1), (1, 0), None),
    ("image", True, (1, 0), (2, 2), None),
    ("audio", False, (2, 0), (1, 2), None),
    ("audio", True, (1, 1), (2, 0), None),
    ("image", False, (4, 1), (2, 0), None),
    # gradient accumulation: 2 micro-batches per step on each of 2 ranks, then 4 on one rank
    ("image", False, (2, 1), (1, 2), 2),
    # packed: 4 pack groups per step, 4 then 2 micro-batches per rank
    (
        "image",
        True,
        (1, 1),
        (2, 0),
        1,
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "modality,packed,saved,resumed,micro",
    LAYOUTS,
    ids=[
        f"{m}{'-packed' if p else ''}-{a[0]}x{a[1]}-to-{b[0]}x{b[1]}{f'-micro{u}' if u else ''}"
        for m, p, a, b, u in LAYOUTS
    ],
)
def test_layout_change_keeps_global_batches_and_exactly_once(
    coco, speech, modality, packed, saved, resumed, micro
):
    if modality == "image":
        data, encoder, gb = coco, IMAGE_PACKED if packed else IMAGE, 4 if packed else 8
    else:
        data, encoder, gb = speech, AUDIO_PACKED if packed else AUDIO, 2 if packed else 4
    config = cfg(data, encoder, global_batch_size=gb, micro_batch_size=micro)
    n = TrainLoader(config).plan.datasets.entries[0].source.__len__()
    group = TrainLoader(config).plan.schedule.group_size
    steps_per_epoch = -(-n // (gb * group))
    stop = steps_per_epoch // 2
    reference = global_batches(config, 1, 0, steps_per_epoch)
    before, states = run_layout(config, *saved, stop)  # the saving loaders' own states
    assert before == reference[:stop]
    if micro:
        assert TrainLoader(config, rank=0, world_size=saved[0]).accumulation > 1, (
            "the layout must accumulate"
        )
    after, _ = run_layout(config, *resumed, steps_per_epoch - stop, states)
    assert after == reference[stop:], "the resumed layout must produce the same global batches"
    # exactly once: every sample of the epoch appears, and repeats are only the next epoch's
    # samples that complete the last batch (packs reorder keys within a batch, so count, not slice)
    keys = [k for keys, _ in before + after for k in keys]
    assert len(set(keys)) == n, "a sample of the epoch was skipped"
    assert len(keys) - n == steps_per_epoch * gb * group - n, "a sample was repeated or dropped"


# ---------------------------------------------------------------- loud failures


def test_mismatched_dataset_config_and_layout_are_refused(coco, speech):
    loader = TrainLoader(cfg(coco))
    next(loader)
    state = loader.state_dict()
    with pytest.raises(StateMismatchError, match=r"global_batch_size: saved 8, now 16"):
        TrainLoader(cfg(coco, global_batch_size=16)).load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"seed"):
        TrainLoader(cfg(coco, seed=99)).load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"encoder.config_sha"):
        TrainLoader(cfg(coco, {"encoder": "image_text", "text": {"seq_len": 40}})).load_state_dict(
            state
        )
    with pytest.raises(StateMismatchError, match=r"dataset\.(index_uuid|num_samples)"):
        TrainLoader(cfg(speech, AUDIO)).load_state_dict(state)
    with pytest.raises(LayoutError, match=r"\[1, 2, 4, 8\]"):
        TrainLoader(cfg(coco), rank=0, world_size=3)
    with pytest.raises(StateMismatchError, match="version"):
        TrainLoader(cfg(coco)).load_state_dict({**state, "version": 99})
    with pytest.raises(ConfigError, match="pack_group"):
        TrainLoader(cfg(coco, pack_group=4))


def test_mid_step_state_needs_the_same_layout(coco):
    config = cfg(coco, micro_batch_size=2)  # 4 micro-batches per step on one rank
    loader = TrainLoader(config)
    assert loader.accumulation == 4
    next(loader)
    state = loader.state_dict()
    with pytest.raises(LayoutError, match="middle of a global batch"):
        TrainLoader(config, rank=0, world_size=2).load_state_dict(state)
    same = TrainLoader(config)
    same.load_state_dict(state)
    assert list(next(same).keys) == list(next(loader).keys)


def test_a_loader_without_workers_batches_on_one_intra_op_thread(coco, monkeypatch):
    # as in its DataLoader workers (PyTorch sets 1 there), so a batch does not depend on
    # num_workers; the suite runs on one thread (tests/conftest.py), so the process is given more
    loader = TrainLoader(cfg(coco), num_workers=0)
    seen, batch = [], loader.encoder.encode_batch
    monkeypatch.setattr(
        loader.encoder,
        "encode_batch",
        lambda b: (seen.append(torch.get_num_threads()), batch(b))[1],
    )
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        next(iter(loader))
        assert seen == [1] and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
