"""The run plan's fingerprint and state are those every earlier checkpoint was saved with.

Each configuration's loader state (dataset identities aside: they name this test run's converted
copy) is pinned by the SHA-256 of its JSON bytes, key order included, as the loader wrote it
before the plan was split into components: a checkpoint saved then resumes now, and one saved now
resumes in a build of then.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from scripts.bench.data import coco_dataset
from tests.helpers import REPO

SMALL = str(REPO / "configs/encoders/image_text_small.yaml")
PACKED = str(REPO / "configs/encoders/image_text_small_packed.yaml")

#: name -> (encoder, loader section, world size, micro-batch whose state is pinned)
CONFIGS = {
    "stream": (SMALL, {}, 1, 5),
    "stream_locality_two_ranks": (SMALL, {"shuffle_buffer": 64, "shuffle_run": 4}, 2, 7),
    "stream_packed": (PACKED, {"global_batch_size": 4}, 1, 3),
    "stream_excluded": (SMALL, {"exclude": [{"step": 1, "keys": ["00000000001*"]}]}, 1, 4),
    "planned_packed": (PACKED, {"balance": "tokens", "global_batch_size": 4}, 2, 6),
    "planned_attention": (SMALL, {"balance": {"mode": "attention", "window": 64}}, 1, 3),
    "planned_budget": (SMALL, {"balance": {"mode": "tokens", "global_batch_tokens": 2000}}, 1, 2),
}

EXPECTED = {
    "planned_attention": "e9d85c0b959f55651420dc87dd2103942f05fd30ab3074e8ddb746b82809ee80",
    "planned_budget": "17e780c165bf461116d963c875df7c778c47b911dbca64342ca8707b3b83679a",
    "planned_packed": "a47eece46a797a4963609fa65c41836dcaab16910499e0e357526bc66c790016",
    "stream": "414cbf6821dd20f043230223f47e327581842d210badabeb66c9475ad2b38b6d",
    "stream_excluded": "57a3bfe846d3f45bbe4f0d35656f451d96ea420d1c4742cfa6801650d43bbe97",
    "stream_locality_two_ranks": "3756fba8a10a2a3938a5ebdde5127a383d25c35264d4d4ec6a18bbbc76f25e94",
    "stream_packed": "e693513baafb22fe2dc7c3a5a33bd7a57d493758b3f9549b5d4c3b26c2e8710b",
}


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    base = tmp_path_factory.mktemp("run_plan")
    return base, coco_dataset(base)


def _config(coco, name: str):
    """The run config of ``CONFIGS[name]`` over the converted coco corpus."""
    from energon_platform import load_config

    encoder, loader, _, _ = CONFIGS[name]
    base, data = coco
    return load_config(
        {
            "data": {"path": str(data), "val_split": None},
            "encoder": encoder,
            "loader": {
                "global_batch_size": 8,
                "num_workers": 0,
                "length_cache": str(base / "lengths"),
                **loader,
            },
        }
    )


def _state(coco, name: str, resume: bool = False) -> dict:
    from energon_platform import TrainLoader

    _, _, world, microbatch = CONFIGS[name]
    cfg = _config(coco, name)
    state = TrainLoader(cfg, world_size=world, num_workers=0).state_at(microbatch)
    if resume:  # a loader restored from that state saves it again, unchanged
        resumed = TrainLoader(cfg, world_size=world, num_workers=0)
        resumed.load_state_dict(state)
        state = resumed.state_dict()
    assert set(state["fingerprint"].pop("datasets")) == {"dataset"}
    return state


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_state_and_fingerprint_are_byte_for_byte_those_saved_before(coco, name):
    state = _state(coco, name)
    digest = hashlib.sha256(json.dumps(state).encode()).hexdigest()
    assert digest == EXPECTED[name], json.dumps(state)


@pytest.mark.parametrize("name", ["stream_excluded", "planned_packed", "planned_budget"])
def test_a_resumed_plan_saves_the_same_bytes(coco, name):
    state = _state(coco, name, resume=True)
    assert hashlib.sha256(json.dumps(state).encode()).hexdigest() == EXPECTED[name]


def test_every_balance_mode_has_a_batching_mode_and_every_planned_one_a_cost_model():
    from energon_platform.config import BALANCE_MODES
    from energon_platform.loader.batching import BATCHING, COST_MODELS, PlannedBatching

    assert set(BATCHING) == set(BALANCE_MODES)
    planned = {mode for mode, cls in BATCHING.items() if cls is PlannedBatching}
    assert planned == set(COST_MODELS) == set(BALANCE_MODES) - {"none"}


@pytest.mark.parametrize("name", ["stream_packed", "planned_packed"])
def test_the_trace_reads_the_plan_alone(coco, name):
    """A tracer is built from the run plan and its encoder: no loader, no worker."""
    from energon_platform.loader.trace import open_tracer

    tracer = open_tracer(_config(coco, name), CONFIGS[name][2])
    assert type(tracer.plan).__name__ == "RunPlan"
    step = tracer.step(1)
    assert len(step["keys"]) == len(set(step["keys"])) > 0
    assert step["keys"] == sorted(step["keys"]) or not tracer.plan.batching.sorts_logged_keys
