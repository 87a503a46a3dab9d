"""Kill-and-resume of the reference trainer: SIGKILL mid-step, torchrun/gloo, elastic layouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from energon_platform.training import checkpoint
from energon_platform.training.resume_check import (
    RunSpec,
    compare,
    count_lines,
    read_log,
    run_command,
    run_killed,
    trainer_command,
)
from scripts.bench.data import coco_dataset
from tests.helpers import REPO
from tests.helpers.cli import run_cli, start_python
from tests.helpers.run_configs import run_config, write_config


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    data = coco_dataset(tmp_path_factory.getbasetemp())
    path = tmp_path_factory.mktemp("cfg") / "run.yaml"
    loader = {"global_batch_size": 8, "num_workers": 2, "seed": 7, "shuffle_buffer": 64}
    train = {"steps": 24, "checkpoint_every": 5, "warmup": 2}
    return write_config(path, run_config(data, loader=loader, model={"dim": 32}, train=train))


def check_resume_cli(config_file, out, *args):
    return run_cli("check-resume", "--config", config_file, "--out", out, *args, timeout=600)


@pytest.fixture(scope="module")
def straight_log(config_file, tmp_path_factory) -> dict[int, dict]:
    """The log of one uninterrupted 24-step run of ``config_file``, shared by the kill tests."""
    base = tmp_path_factory.mktemp("straight")
    run_command(
        trainer_command(RunSpec(str(config_file), steps=24), base / "run"), base / "stdout.txt"
    )
    return read_log(base / "run" / "log.jsonl")


@pytest.mark.slow
def test_sigkill_at_five_steps_in_a_row_resumes_bit_exact_each_time(
    config_file, straight_log, tmp_path
):
    """One run killed with SIGKILL during steps 3, 7, 11, 16 and 22, each time resumed from its
    newest checkpoint, then finished: every step each resumed process logged equals the
    uninterrupted run's (keys, tensors, loss), and no process starts over. The resume points cover
    no checkpoint yet (0), each later checkpoint, and a run resumed, killed and resumed again."""
    spec = RunSpec(str(config_file), steps=24)
    reference = straight_log
    assert len(reference) == 24
    out, resume_from, seen = tmp_path / "run", 0, set()
    for kill_at in (3, 7, 11, 16, 22):
        lines = count_lines(out / "log.jsonl") if out.exists() else 0
        last = run_killed(spec, out, kill_at, resume=lines > 0)
        assert last == kill_at - 1, f"the kill must land while step {kill_at} runs"
        segment = compare(reference, read_log(out / "log.jsonl", lines), resume_from + 1, last, 0.0)
        assert segment["passed"], (kill_at, {k: v for k, v in segment.items() if k != "rows"})
        assert segment["steps_compared"] == last - resume_from
        ckpt = checkpoint.latest(out / "checkpoints")
        resume_from = int(ckpt.name.split("_")[1]) if ckpt else 0
        # the newest checkpoint at or before the kill (a kill during step 11 may even interrupt
        # the writing of checkpoint 10, which then falls back to 5)
        assert resume_from % 5 == 0 and 0 <= kill_at - 1 - resume_from < 10
        seen.add(resume_from)
    assert {0, 5, 20} <= seen, seen
    lines = count_lines(out / "log.jsonl")
    run_command(trainer_command(spec, out, resume=True), out / "stdout.txt")
    result = compare(reference, read_log(out / "log.jsonl", lines), resume_from + 1, 24, 0.0)
    assert result["passed"], {k: v for k, v in result.items() if k != "rows"}
    assert result["steps_compared"] == 24 - resume_from


@pytest.mark.slow
def test_torchrun_two_ranks_across_epoch_boundary(config_file, tmp_path):
    # 286 training samples, 8 per step: epoch 1 starts during step 36; resume from step 35
    # RNG restored too
    r = check_resume_cli(
        config_file,
        tmp_path,
        "--steps",
        40,
        "--kill-at",
        38,
        "--nproc",
        2,
        "--num-workers",
        1,
        "--set",
        "train.checkpoint_every=35",
        "--set",
        "model.dropout=0.1",
    )
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["passed"] and report["resume_step"] == 35 and report["steps_compared"] == 5
    assert report["kill_landed_mid_step"] and report["max_abs_loss_diff"] == 0.0
    assert (tmp_path / "loss.png").stat().st_size > 10_000
    rows = read_log(tmp_path / "straight" / "log.jsonl")
    # epoch: at the end of a step
    assert rows[35]["epoch"] < 1.0 < rows[36]["epoch"] and rows[40]["world_size"] == 2
    resumed = read_log(tmp_path / "killed" / "log.jsonl")
    # evaluation resumes exactly
    assert "val_loss" in rows[35] and resumed[40]["val_loss"] == rows[40]["val_loss"]
    assert "PASS" in r.stdout


@pytest.mark.slow
def test_elastic_two_ranks_to_one_rank_more_workers_with_packing(config_file, tmp_path):
    packed = REPO / "configs/encoders/image_text_small_packed.yaml"  # pack groups of 16 samples
    r = check_resume_cli(
        config_file,
        tmp_path,
        "--steps",
        16,
        "--kill-at",
        12,
        "--nproc",
        2,
        "--num-workers",
        1,
        "--resume-nproc",
        1,
        "--resume-workers",
        2,
        "--set",
        f"encoder={packed}",
        "--set",
        "loader.global_batch_size=2",
    )
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["keys_identical"] and report["tensors_identical"] and report["tolerance"] == 1e-5
    resumed = read_log(tmp_path / "killed" / "log.jsonl")
    assert resumed[16]["world_size"] == 1 and resumed[16]["num_workers"] == 2


def test_resume_with_other_config_is_refused(config_file, tmp_path):
    out = tmp_path / "run"
    r = run_cli("train", "--config", config_file, "--out", out, "--steps", "5", "--quiet")
    assert r.returncode == 0, r.stderr
    r = run_cli(
        "train",
        "--config",
        config_file,
        "--out",
        out,
        "--steps",
        "8",
        "--quiet",
        "--resume",
        "--set",
        "loader.seed=8",
    )
    assert r.returncode == 2 and "seed: saved 7, now 8" in r.stderr and "Traceback" not in r.stderr
    assert len(read_log(out / "log.jsonl")) == 5  # nothing trained on the wrong data


def test_checkpoint_killed_mid_write_is_ignored(tmp_path):
    root = tmp_path / "ckpt"
    checkpoint.save(root, 5, 0, 1, model_state={"w": 1}, loader_state={"pos": 5})
    # the barrier after every rank's files are written (the kill at every later step, up to and
    # past the rename and the marker, is tests/loader/test_state_mismatches_and_compare.py's)
    script = (
        "import os, sys, time\n"
        "from energon_platform.training import checkpoint\n"
        "tmp = sys.argv[1] + '/.tmp-step_000010/'\n"
        "def hang():\n"
        "    if all(os.path.exists(tmp + f) for f in ('loader_rank0.json', 'rng_rank0.pt', 'model.pt')):\n"
        "        print('written', flush=True); time.sleep(60)\n"
        "checkpoint.save(sys.argv[1], 10, 0, 1, model_state={'w': 2}, loader_state={'pos': 10}, barrier=hang)\n"
    )
    with start_python(script, root) as proc:
        # files of step 10 written, not yet renamed
        assert proc.stdout.readline().strip() == "written"
        proc.kill()
    assert (root / ".tmp-step_000010" / "model.pt").exists()
    latest = checkpoint.latest(root)
    assert latest.name == "step_000005"
    assert checkpoint.load(latest, 0)["loader_state"] == {"pos": 5}
    (latest / "loader_rank0.json").write_text('{"pos": 6}')  # a corrupted file is detected
    with pytest.raises(checkpoint.CheckpointError, match="checksum"):
        checkpoint.load(latest, 0)


def test_layout_refused_before_training_and_checkpoints_protected(config_file, tmp_path):
    r = check_resume_cli(config_file, tmp_path, "--steps", 8, "--kill-at", 4, "--resume-nproc", 3)
    assert r.returncode == 2 and "[1, 2, 4, 8]" in r.stderr and not (tmp_path / "straight").exists()
    root = tmp_path / "ckpt"
    for step in (10, 20, 30, 40, 10):
        checkpoint.save(root, step, 0, 1, model_state={}, loader_state={"step": step})
        checkpoint.prune(root, 3)
    assert checkpoint.latest(root).name == "step_000010" and checkpoint.load(
        checkpoint.latest(root), 0
    )
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    checkpoint.save(out / "checkpoints", 5, 0, 1, model_state={}, loader_state={})
    r = run_cli("train", "--config", config_file, "--out", out, "--steps", "6", "--quiet")
    # no run's record there: a folder of checkpoints alone is not this run's
    assert r.returncode == 2 and "holds checkpoints, which no training run wrote" in r.stderr
    record = {"command": ["energon-platform", "train"], "versions": {}, "started": "2026-01-01"}
    (out / "run.json").write_text(json.dumps(record))  # a run's folder: a fresh start is refused
    r = run_cli("train", "--config", config_file, "--out", out, "--steps", "6", "--quiet")
    assert r.returncode == 2 and "--resume" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_audio_text_training_resumes_bit_exact(tmp_path, tmp_path_factory):
    from scripts.bench.data import librispeech_dataset

    config = yaml.safe_load((REPO / "configs/train_audio_text.yaml").read_text())
    config["data"]["path"] = str(librispeech_dataset(tmp_path_factory.getbasetemp()))
    path = tmp_path / "audio.yaml"
    path.write_text(yaml.safe_dump(config))
    r = check_resume_cli(
        path,
        tmp_path / "check",
        "--steps",
        13,
        "--kill-at",
        12,
        "--set",
        "train.checkpoint_every=5",
    )
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    report = json.loads((tmp_path / "check" / "report.json").read_text())
    assert report["passed"] and report["steps_compared"] == 3 and report["max_abs_loss_diff"] == 0.0
