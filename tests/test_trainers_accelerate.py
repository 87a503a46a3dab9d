"""Hugging Face Accelerate (issue 21): the loader kept out of ``prepare`` (no double sharding), its
state in ``save_state``/``load_state`` as JSON restored in O(1) (no ``skip_first_batches`` replay),
and scripts/examples/accelerate_example.py resuming exactly after SIGKILL."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("accelerate")

from trainer_examples import assert_exact_pass, assert_fails, check_resume, example, write_run_config


@pytest.fixture(scope="module")
def run_config(tmp_path_factory):
    return write_run_config(tmp_path_factory.getbasetemp(), tmp_path_factory.mktemp("accelerate") / "run.yaml")


def test_save_state_carries_the_loader_and_load_state_restores_far_positions_without_replay(run_config, tmp_path):
    import torch
    from accelerate import Accelerator

    from energon_platform import TrainLoader, load_config
    from energon_platform.integrations.accelerate import STATE_FILE, prepare_loader
    from energon_platform.integrations.lightning import state_at

    cfg = load_config(run_config)
    accelerator = Accelerator(cpu=True)
    loader = prepare_loader(accelerator, cfg)
    assert accelerator.prepare(loader) is loader  # prepare neither wraps nor re-shards it
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    for _ in range(3):
        next(loader)
    accelerator.save_state(str(tmp_path / "ckpt"))
    saved = json.loads((tmp_path / "ckpt" / STATE_FILE).read_text())
    assert saved == loader.state_dict() and saved["next_microbatch"] == 3

    # a position a million micro-batches in: restored as fast as a fresh start, the same batch as
    # a loader restored directly
    far = state_at(loader, 1_000_000)
    (tmp_path / "ckpt" / STATE_FILE).write_text(json.dumps(far))
    resumed = prepare_loader(accelerator2 := Accelerator(cpu=True), cfg)
    accelerator2.prepare(model)
    t0 = time.perf_counter()
    accelerator2.load_state(str(tmp_path / "ckpt"))
    took = time.perf_counter() - t0
    assert resumed.next_microbatch == 1_000_000 and took < 5, took
    direct = TrainLoader(cfg)
    direct.load_state_dict(far)
    assert next(resumed).keys == next(direct).keys


def test_gradient_accumulation_other_than_the_loaders_is_refused(run_config):
    from accelerate import Accelerator

    from energon_platform import load_config
    from energon_platform.integrations.accelerate import prepare_loader

    with pytest.raises(ValueError, match="set gradient_accumulation_steps=1"):
        prepare_loader(Accelerator(cpu=True, gradient_accumulation_steps=2), load_config(run_config))


@pytest.mark.slow
def test_accelerate_example_resumes_exactly_after_sigkill(run_config, tmp_path):
    cmd = example("accelerate_example.py", run_config, "--out {out} --steps 6")
    assert_exact_pass(*check_resume(tmp_path / "ok", cmd, cmd + " --resume", 6, 4))
    assert_fails(*check_resume(tmp_path / "broken", cmd, cmd + " --resume --skip-loader-restore", 6, 4))
