"""Hugging Face Accelerate: the loader kept out of ``prepare`` (no double sharding), its
state in ``save_state``/``load_state`` as JSON restored in O(1) (no ``skip_first_batches`` replay),
and scripts/examples/accelerate_example.py resuming exactly after SIGKILL."""

from __future__ import annotations

import json
import re
import shlex
import socket
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

from tests.helpers.trainer_examples import (
    PY,
    assert_exact_pass,
    assert_fails,
    assert_sample_losses_fit,
    check_resume,
    example,
    write_run_config,
)

# the CLI of this environment
ACCELERATE = shlex.quote(str(Path(sys.executable).parent / "accelerate"))


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    return write_run_config(
        tmp_path_factory.getbasetemp(), tmp_path_factory.mktemp("accelerate") / "run.yaml"
    )


def test_save_state_carries_the_loader_and_load_state_restores_far_positions_without_replay(
    config_file, tmp_path
):
    import torch
    from accelerate import Accelerator

    from energon_platform import TrainLoader, load_config
    from energon_platform.integrations.accelerate import STATE_FILE, prepare_loader

    cfg = load_config(config_file)
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
    far = loader.state_at(1_000_000)
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


def test_gradient_accumulation_other_than_the_loaders_is_refused(config_file):
    from accelerate import Accelerator

    from energon_platform import load_config
    from energon_platform.integrations.accelerate import prepare_loader

    with pytest.raises(ValueError, match="set gradient_accumulation_steps=1"):
        prepare_loader(
            Accelerator(cpu=True, gradient_accumulation_steps=2), load_config(config_file)
        )


def test_load_state_without_the_loader_file_names_it(config_file, tmp_path):
    """A checkpoint saved by an accelerator without our loader: load_state refuses it, naming the
    missing file, instead of training on from position 0."""
    import torch
    from accelerate import Accelerator

    from energon_platform import load_config
    from energon_platform.integrations.accelerate import STATE_FILE, prepare_loader

    plain = Accelerator(cpu=True)
    plain.prepare(torch.nn.Linear(2, 2))
    plain.save_state(str(tmp_path / "ckpt"))
    resumed = Accelerator(cpu=True)
    loader = prepare_loader(resumed, load_config(config_file))
    resumed.prepare(torch.nn.Linear(2, 2))
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "ckpt" / STATE_FILE))):
        resumed.load_state(str(tmp_path / "ckpt"))
    assert loader.next_microbatch == 0


@pytest.mark.parametrize(
    "micro_batch_size, world_size", [(None, 1), (None, 2), (1, 1), (1, 2), (2, 1)]
)
def test_gradient_accumulation_steps_is_the_loaders_accumulation(
    tmp_path_factory, tmp_path, micro_batch_size, world_size
):
    from energon_platform import TrainLoader, gradient_accumulation_steps, load_config

    cfg = load_config(
        write_run_config(
            tmp_path_factory.getbasetemp(), tmp_path / "run.yaml", micro_batch_size=micro_batch_size
        )
    )
    steps = gradient_accumulation_steps(cfg, world_size)
    assert steps == TrainLoader(cfg, rank=world_size - 1, world_size=world_size).accumulation
    assert steps == 4 // world_size // (micro_batch_size or 4 // world_size)


def test_gradient_accumulation_steps_refuses_a_world_size_that_cannot_split_the_batch(config_file):
    from energon_platform import LayoutError, gradient_accumulation_steps, load_config

    with pytest.raises(
        LayoutError, match=r"world sizes that keep the same global batches: \[1, 2, 4\]"
    ):
        gradient_accumulation_steps(load_config(config_file), 3)


@pytest.mark.slow
def test_accelerate_example_resumes_exactly_after_sigkill(config_file, tmp_path):
    cmd = example("accelerate_example.py", config_file, "--out {out} --steps 6")
    r, report = check_resume(tmp_path / "ok", cmd, cmd + " --resume", 6, 4)
    assert_exact_pass(r, report)
    assert_sample_losses_fit(report["logs"]["straight"], config_file)
    assert_fails(
        *check_resume(
            tmp_path / "broken",
            cmd,
            cmd + " --resume --skip-loader-restore",
            6,
            4,
            straight_from=tmp_path / "ok",
        )
    )


@pytest.mark.slow
def test_accelerate_launch_two_processes_resumes_exactly_without_double_sharding(
    config_file, tmp_path
):
    """``accelerate launch`` with 2 processes on CPU (``--multi_gpu`` picks its torchrun launcher;
    ``--cpu`` alone would start one process), killed and resumed: exact. Each process reads its own
    half of every global batch: the halves are disjoint and, in rank order, the global batch a
    one-process loader makes."""
    from energon_platform import TrainLoader, load_config

    with socket.socket() as s:  # a free port for the launcher's rendezvous (its default is fixed)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = (
        f"{PY} {ACCELERATE} launch --multi_gpu --num_processes 2 --num_machines 1 --main_process_port {port} "
        f"--mixed_precision no --dynamo_backend no"
    )
    cmd = example("accelerate_example.py", config_file, "--out {out} --steps 6", launcher=launch)
    r, report = check_resume(tmp_path / "ok", cmd, cmd + " --resume", 6, 4)
    assert_exact_pass(r, report)
    rows = [json.loads(line) for line in Path(report["logs"]["straight"]).read_text().splitlines()]
    one_process = TrainLoader(load_config(config_file))
    for row in rows:
        first, second = row["rank_keys"]
        assert first and second and not set(first) & set(second), row
        assert first + second == row["keys"] == list(next(one_process).keys), row
    assert len(rows) == 6
    # the loss: the mean of each process's token mean over its half
    assert_sample_losses_fit(report["logs"]["straight"], config_file, group=2)
