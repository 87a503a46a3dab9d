"""The trainer and check-resume under hostile but ordinary use: every mistake is one line
and exit status 2 before any step is trained; resuming finds the newest complete checkpoint."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from energon_platform import cli
from energon_platform.config import load_config
from energon_platform.training import checkpoint
from energon_platform.training.preflight import preflight
from energon_platform.training.resume_check import RunSpec, check_resume, read_log, verdict
from storage import DatasetError
from task_encoders.config_parser import ConfigError
from tests.helpers.cli import one_line_error, one_line_error_in_process, run_cli
from tests.helpers.run_configs import run_config

AUDIO = {"encoder": "audio_text", "text": {"seq_len": 48}, "audio": {"n_mels": 32}}


@pytest.fixture(scope="module")
def config_file(coco, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "run.yaml"
    # never in the repo
    path.write_text(
        yaml.safe_dump(run_config(coco, train={"out": str(path.parent / "default-out")}))
    )
    return path


def train_cli(config_file, out, *args):
    return run_cli("train", "--config", config_file, "--out", out, *args, timeout=300)


# ---------------------------------------------------------------- 1: val loss at every checkpoint


@pytest.mark.slow
def test_checkpoint_every_step_without_quiet_logs_the_right_val_loss(config_file, tmp_path):
    loud = train_cli(
        config_file, tmp_path / "loud", "--steps", 3, "--set", "train.checkpoint_every=1"
    )
    assert loud.returncode == 0, loud.stderr[-3000:]
    quiet = train_cli(
        config_file,
        tmp_path / "quiet",
        "--steps",
        3,
        "--set",
        "train.checkpoint_every=1",
        "--quiet",
    )
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    rows, reference = (
        read_log(tmp_path / "loud" / "log.jsonl"),
        read_log(tmp_path / "quiet" / "log.jsonl"),
    )
    assert sorted(rows) == [1, 2, 3] and all(r["val_loss"] > 1.0 for r in rows.values())
    assert [r["val_loss"] for r in rows.values()] == [r["val_loss"] for r in reference.values()]
    # evaluated after each step, not a stale value
    assert len({r["val_loss"] for r in rows.values()}) == 3
    assert "val loss" in loud.stdout and "val loss" not in quiet.stdout


# ---------------------------------------------------------------- 6: one line, exit 2


@pytest.mark.parametrize(
    "override,key",
    [
        ("model.heads=0", "model.heads"),
        ("model.dim=0", "model.dim"),
        ("model.patch=0", "model.patch"),
        ("model.dropout=2", "model.dropout"),
        ("model.dropout=-0.1", "model.dropout"),
        ("model.layers=-1", "model.layers"),
        ("train.lr=-1", "train.lr"),
        ("train.lr=.nan", "train.lr"),
        ("train.weight_decay=-1", "train.weight_decay"),
        ("train.warmup=-2", "train.warmup"),
        ("loader.seed=-1", "loader.seed"),
        ("model.dim=31", "model.dim"),
        ("train.steps=[1,", "train.steps"),
        ("model.dim.x=1", "model.dim"),
        ("train=3", "train"),
    ],
)
def test_set_values_that_break_the_run_are_one_line(config_file, capsys, override, key):
    line = one_line_error_in_process(capsys, ["train", "--config", config_file, "--set", override])
    assert line.startswith("energon-platform train: error: ") and key in line


@pytest.mark.parametrize(
    "override,needle",
    [
        (
            "loader.global_batch_size=99999999999",
            "loader.global_batch_size: got 99999999999 (expected at most",
        ),
        (
            "loader.micro_batch_size=99999999999",
            "loader.micro_batch_size: got 99999999999 (expected at most",
        ),
        ("loader.num_workers=100000", "loader.num_workers: got 100000 (expected at most"),
        (
            "loader.prefetch_factor=99999999999",
            "loader.prefetch_factor: got 99999999999 (expected at most",
        ),
        ("train.steps=99999999999999", "train.steps: got 99999999999999 (expected at most"),
        (
            "train.checkpoint_every=99999999999999",
            "train.checkpoint_every: got 99999999999999 (expected at most",
        ),
        ("train.weight_decay=.inf", "train.weight_decay: got inf (expected a finite number"),
        ("loader.balance.linear=.inf", "loader.balance.linear: got inf (expected a finite number"),
        (
            "loader.balance.lookahead=1e308",
            "loader.balance.lookahead: got 1e+308 (expected at most window",
        ),
        (
            "loader.balance.lookahead=nan",
            "loader.balance.lookahead: got nan (expected a finite number",
        ),
        (
            "loader.balance.lookahead=inf",
            "loader.balance.lookahead: got inf (expected a finite number",
        ),
    ],
)
def test_absurd_and_non_finite_numbers_are_one_line_at_config_load(
    config_file, capsys, override, needle
):
    # trace: a command that loads the config and starts no worker process, whatever the value
    line = one_line_error_in_process(
        capsys, ["trace", "--config", config_file, "--step", 1, "--set", override]
    )
    assert line.startswith("energon-platform trace: error: ") and needle in line, line


def test_numbers_yaml_reads_as_text_are_numbers_where_a_number_is_expected(coco, tmp_path):
    # PyYAML reads 3e-4 and 1e1 (no dot, no exponent sign) and nan/inf as strings
    config = run_config(coco, train={"lr": "3e-4"})
    config["loader"]["balance"] = {"lookahead": "1e1", "linear": "2.5E+1"}
    cfg = load_config(config)
    assert (cfg.train.lr, cfg.loader.balance.lookahead, cfg.loader.balance.linear) == (
        3e-4,
        10.0,
        25.0,
    )
    with pytest.raises(ConfigError, match="train.lr: got str 'fast'"):
        load_config(run_config(coco, train={"lr": "fast"}))
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(run_config(coco)).replace(
            "loader:\n", "loader:\n  balance: {linear: .inf}\n"
        )
    )
    with pytest.raises(
        ConfigError, match=r"run.yaml: loader.balance.linear: got inf \(expected a finite number"
    ):
        load_config(path)


def test_override_does_not_touch_the_callers_config(coco):
    config = run_config(coco)
    load_config(config, {"model.dim": 32})
    assert config["model"]["dim"] == 16


def test_patch_larger_than_the_images_is_refused_before_training(coco):
    config = load_config(run_config(coco), {"model.patch": 65})  # image_text_small crops to 64 px
    with pytest.raises(
        ConfigError, match=r"model\.patch: 65 is larger than the encoder's images \(64x64\)"
    ):
        preflight(config)


def test_encoder_of_another_modality_is_refused_before_training(coco, speech, tmp_path):
    with pytest.raises(
        DatasetError, match="image_text encoder cannot encode the AudioTextSample samples"
    ):
        preflight(load_config(run_config(speech)))
    with pytest.raises(
        DatasetError, match="audio_text encoder cannot encode the CaptioningSample samples"
    ):
        preflight(load_config(run_config(coco, AUDIO)))
    path = tmp_path / "audio-on-images.yaml"
    path.write_text(yaml.safe_dump(run_config(speech)))
    one_line_error(train_cli(path, tmp_path / "out"), "AudioTextSample", "image_text")
    assert not (tmp_path / "out").exists()  # a refused run leaves no folder behind
    mine = tmp_path / "mine"  # a folder of the user's is refused first, by the output rule
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    one_line_error(train_cli(path, mine), "holds notes.txt, which no training run wrote")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_dataset_without_the_split_is_one_line(config_file, capsys):
    for command in ("train", "check-resume"):
        extra = ["--steps", 6, "--kill-at", 4] if command == "check-resume" else []
        line = one_line_error_in_process(
            capsys, [command, "--config", config_file, "--set", "data.train_split=nope", *extra]
        )
        assert "no split 'nope'" in line and "train, val" in line


# ---------------------------------------------------------------- 4: a shard deleted


def test_deleted_shard_stops_train_at_start(coco, tmp_path):
    data = tmp_path / "coco"
    shutil.copytree(coco, data)
    (data / "train" / "shard-000002.tar").unlink()
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run_config(data)))
    one_line_error(train_cli(config, tmp_path / "out"), "shard train/shard-000002.tar", "missing")
    assert not read_log(tmp_path / "out" / "log.jsonl")  # no step trained
    shutil.copy(coco / "train" / "shard-000002.tar", data / "train")
    # a val shard: caught at start too, not at the first checkpoint
    next((data / "val").glob("*.tar")).unlink()
    with pytest.raises(DatasetError, match=r"shard val/.* of split 'val' is missing"):
        preflight(load_config(run_config(data)))


# ---------------------------------------------------------------- 9: finding the checkpoint to resume


@pytest.fixture(scope="module")
def trained(config_file, tmp_path_factory) -> Path:
    """A 4-step run with checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("trained") / "run"
    r = train_cli(config_file, out, "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert checkpoint.latest(out / "checkpoints").name == "step_000004"
    return out


def copy_run(trained, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


def logged_steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_latest_marker_deleted_resumes_from_newest_complete_checkpoint(
    trained, config_file, tmp_path
):
    out = copy_run(trained, tmp_path)
    (out / "checkpoints" / "latest").unlink()
    # a fresh run is refused
    one_line_error(train_cli(config_file, out, "--steps", 6, "--quiet"), "--resume")
    r = train_cli(config_file, out, "--steps", 6, "--quiet", "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert logged_steps(out) == [1, 2, 3, 4, 5, 6]
    assert read_log(out / "log.jsonl")[5]["resumed_from"] == 4


def test_corrupt_model_falls_back_to_the_older_good_checkpoint(trained, config_file, tmp_path):
    out = copy_run(trained, tmp_path)
    model = out / "checkpoints" / "step_000004" / "model.pt"
    model.write_bytes(model.read_bytes()[:-10] + b"0123456789")
    r = train_cli(config_file, out, "--steps", 6, "--quiet", "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "resuming from the older checkpoint" in r.stderr
        and "step_000002" in r.stderr
        and "checksum" in r.stderr
    )
    assert logged_steps(out) == [1, 2, 3, 4, 3, 4, 5, 6]
    first = json.loads((out / "log.jsonl").read_text().splitlines()[4])
    assert first["resumed_from"] == 2 and first["checkpoint"] == "step_000002"
    assert "step_000004/model.pt: checksum mismatch" in first["skipped_checkpoints"][0]


@pytest.mark.parametrize(
    "damage,needles",
    [
        (
            lambda ck: (ck / "latest").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff"),
            ("latest", "unreadable"),
        ),
        (lambda ck: (ck / "latest").write_text("../../etc"), ("latest", "not a checkpoint name")),
        (
            lambda ck: [
                (ck / s / "meta.json").write_text("{not json")
                for s in ("step_000002", "step_000004")
            ],
            ("no usable checkpoint", "meta.json"),
        ),
    ],
    ids=["binary-latest", "foreign-latest", "every-meta-corrupt"],
)
def test_unusable_checkpoints_are_one_line_at_resume(
    trained, config_file, tmp_path, damage, needles
):
    out = copy_run(trained, tmp_path)
    damage(out / "checkpoints")
    one_line_error(train_cli(config_file, out, "--steps", 6, "--quiet", "--resume"), *needles)
    assert logged_steps(out) == [1, 2, 3, 4]


def test_checkpoint_of_another_model_is_one_line_at_resume(trained, config_file, tmp_path):
    out = copy_run(trained, tmp_path)
    r = train_cli(config_file, out, "--steps", 6, "--quiet", "--resume", "--set", "model.dim=32")
    one_line_error(r, "step_000004", "does not fit this model")
    assert logged_steps(out) == [1, 2, 3, 4]


def test_find_skips_incomplete_and_corrupt_checkpoints(tmp_path):
    root = tmp_path / "ck"
    for step in (2, 4, 6):
        checkpoint.save(root, step, 0, 1, model_state={"w": step}, loader_state={"pos": step})
    (root / "step_000006" / "meta.json").write_text("{")
    found = checkpoint.find(root)
    assert (
        found.path.name == "step_000004" and "step_000006/meta.json: unreadable" in found.skipped[0]
    )
    (root / "latest").write_text("step_000008")  # names a folder that is not there
    assert checkpoint.latest(root).name == "step_000004"
    (root / "latest").unlink()
    (root / "step_000004" / "rng_rank0.pt").unlink()
    found = checkpoint.load_newest(root, 0)
    assert (
        found.content["step"] == 2
        and len(found.skipped) == 2
        and "rng_rank0.pt" in found.skipped[1]
    )
    assert checkpoint.exists(root) and not checkpoint.exists(tmp_path / "none")
    assert checkpoint.find(tmp_path / "none") is None


def _unwritable(folder: Path) -> None:
    """Make ``folder`` a directory no file can be created in, even by root (sysfs)."""
    if os.geteuid() != 0:
        folder.mkdir(parents=True)
        folder.chmod(0o555)
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.symlink_to("/sys/kernel")
    try:
        (folder / "probe").write_text("x")
    except OSError:
        return
    pytest.skip("no folder here refuses writes to this user")


def test_read_only_checkpoints_fail_before_any_step(config_file, tmp_path):
    out = tmp_path / "run"
    _unwritable(out / "checkpoints")
    record = {"command": ["energon-platform", "train"], "versions": {}, "started": "2026-01-01"}
    (out / "run.json").write_text(json.dumps(record))  # a run's folder: train writes there
    one_line_error(train_cli(config_file, out, "--quiet"), "checkpoints", "cannot write")
    assert not read_log(out / "log.jsonl")


def test_out_that_is_a_file_is_one_line(config_file, tmp_path):
    (tmp_path / "file").write_text("mine")
    one_line_error(train_cli(config_file, tmp_path / "file", "--quiet"), "cannot write")
    assert (tmp_path / "file").read_text() == "mine"


def test_out_that_is_or_lies_in_the_dataset_it_reads_is_one_line(config_file, coco, capsys):
    """``train --out`` the dataset it reads was accepted (the run's files went into the dataset)."""
    before = sorted(p.name for p in coco.iterdir())
    for out, said in [(coco, "which this command reads"), (coco / "run", "is inside or holds")]:
        err = one_line_error_in_process(
            capsys, ["train", "--config", str(config_file), "--out", str(out)]
        )
        assert said in err, err
    assert sorted(p.name for p in coco.iterdir()) == before


def test_quiet_draws_no_progress_bar_not_even_the_length_index(config_file, tmp_path):
    """``--quiet`` still drew the length index's bars."""
    r = train_cli(
        config_file,
        tmp_path / "run",
        "--quiet",
        "--steps",
        "1",
        "--set",
        "loader.balance=attention",
        "--set",
        f"loader.length_cache={tmp_path / 'lengths'}",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "%|" not in r.stderr and "it/s" not in r.stderr and "sample/s" not in r.stderr


# ---------------------------------------------------------------- 11: check-resume


def test_check_resume_refuses_negative_tolerance_and_kill_before_first_checkpoint(
    config_file, capsys, tmp_path
):
    with pytest.raises(SystemExit) as e:
        cli.main(
            [
                "check-resume",
                "--config",
                str(config_file),
                "--steps",
                "6",
                "--kill-at",
                "4",
                "--tolerance",
                "-1",
            ]
        )
    assert e.value.code == 2 and "expected a number >= 0" in capsys.readouterr().err
    # once step 2 is logged, checkpoint 2 is being written: no complete one yet
    for kill_at in (
        2,
        3,
    ):
        line = one_line_error_in_process(
            capsys,
            [
                "check-resume",
                "--config",
                config_file,
                "--steps",
                6,
                "--kill-at",
                kill_at,
                "--out",
                tmp_path / "check",
            ],
        )
        assert (
            "first checkpoint (step 2" in line
            and "--kill-at >= 4" in line
            and not (tmp_path / "check").exists()
        )
    (tmp_path / "file").write_text("mine")
    line = one_line_error_in_process(
        capsys,
        [
            "check-resume",
            "--config",
            config_file,
            "--steps",
            6,
            "--kill-at",
            4,
            "--out",
            tmp_path / "file",
        ],
    )
    assert "cannot write" in line and (tmp_path / "file").read_text() == "mine"


@pytest.mark.slow
def test_check_resume_reports_when_nothing_was_restored(config_file, tmp_path):
    # checkpoint_every beyond the kill (the CLI refuses this; the check itself must not pass it)
    spec = RunSpec(str(config_file), steps=4, overrides=("train.checkpoint_every=10",))
    result = check_resume(spec, 3, tmp_path, log=lambda *_: None)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["resume_step"] == 0 and report["restored"] is False and not report["passed"]
    assert report[
        "resumed_steps_before_resume_point"
    ] == [] and "NO loader state was restored" in verdict(result)


@pytest.mark.slow
def test_check_resume_passes_and_says_it_restored(config_file, tmp_path):
    (tmp_path / "straight").mkdir()
    (tmp_path / "straight" / "notes.txt").write_text("mine")  # not a run's: never deleted
    with pytest.raises(checkpoint.CheckpointError, match="notes.txt"):
        check_resume(RunSpec(str(config_file), steps=5), 4, tmp_path, log=lambda *_: None)
    (tmp_path / "straight" / "notes.txt").unlink()
    result = check_resume(RunSpec(str(config_file), steps=5), 4, tmp_path, log=lambda *_: None)
    assert result["passed"] and result["restored"] and result["resume_step"] == 2, verdict(result)
    assert result["steps_compared"] == 3 and result["resumed_steps_before_resume_point"] == []
