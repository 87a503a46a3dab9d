"""Commands that read a run do not resume it, and say what is true of it: a run with no checkpoint
yet is traced from its record (``trace --run``) or said to have none yet (``spikes``, ``trace
--checkpoint``), not told it is no run's folder; a config that differs from the checkpoint it is
traced with is a note about the trace, never "changed at resume" of a run never resumed."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import yaml

from energon_platform import cli, load_config
from energon_platform.loader.trace import open_tracer
from tests.helpers import REPO
from tests.helpers.cli import one_line_error_in_process, run_cli


def _cli(capsys, *argv) -> tuple[int, str, str]:
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture(params=["empty checkpoints", "a checkpoint half-written"])
def unsaved_run(request, spike_run, tmp_path) -> Path:
    """A run's folder before its first checkpoint is complete: its record and log, and a
    ``checkpoints`` folder that is empty, or holds only a checkpoint still being written."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("run.yaml", "run.json", "log.jsonl"):
        shutil.copy(spike_run["out"] / name, run / name)
    if request.param == "a checkpoint half-written":
        (run / "checkpoints" / ".tmp-step_000008").mkdir()
        (run / "checkpoints" / ".tmp-step_000008" / "model.pt").write_bytes(b"\0" * 64)
    return run


def test_trace_answers_for_a_run_with_no_checkpoint_yet_from_its_record(
    unsaved_run, spike_run, capsys
):
    alone = _cli(capsys, "trace", "--run", unsaved_run, "--step", "3", "--json")
    given = _cli(capsys, "trace", "--config", spike_run["config"], "--step", "3", "--json")
    assert alone[0] == given[0] == 0, alone[2]
    assert alone[1] == given[1] and "checkpoint" not in alone[2]


def test_a_run_with_no_checkpoint_yet_is_said_to_have_none_yet(unsaved_run, capsys):
    for argv in (
        ["spikes", "--run", unsaved_run, "--window", "10"],
        ["trace", "--run", unsaved_run, "--checkpoint", unsaved_run, "--step", "1"],
    ):
        line = one_line_error_in_process(
            capsys,
            argv,
            f"{unsaved_run}: the run has no checkpoint yet (none complete under "
            f"{unsaved_run / 'checkpoints'})",
        )
        assert "step_NNNNNN" not in line


def test_a_folder_that_is_no_run_is_still_told_what_a_checkpoint_is(tmp_path, capsys):
    line = one_line_error_in_process(
        capsys,
        ["trace", "--config", REPO / "configs/train_image_text.yaml", "--checkpoint", tmp_path]
        + ["--step", "1"],
        f"{tmp_path}: no checkpoint there (a step_NNNNNN folder, or a run's output folder)",
    )
    assert "no checkpoint yet" not in line


# --- a config other than the checkpoint's --------------------------------------------------------


def test_spikes_with_another_config_is_no_resume(spike_run, tmp_path):
    """``spikes --run R --config OTHER`` (OTHER excludes two samples from step 5 on) printed
    "loader.exclude changed at resume" for a run never resumed (its checkpoint: step 16)."""
    other = tmp_path / "other.yaml"
    data = yaml.safe_load(Path(spike_run["config"]).read_text())
    data["loader"]["exclude"] = [{"step": 5, "keys": spike_run["planted"]}]
    other.write_text(yaml.safe_dump(data))
    r = run_cli("spikes", "--run", spike_run["out"], "--config", other, "--window", 10, timeout=300)
    assert r.returncode == 0 and "1 spike(s)" in r.stdout, r.stderr[-2000:]
    assert "at resume" not in r.stderr
    assert "note: the config differs from the checkpoint's state: from global batch 16: " in (
        r.stderr
    )


def test_tracing_a_blend_with_other_weights_is_no_resume(coco, text_mini, tmp_path, caplog):
    """A blend's checkpoint traced with a config of other weights: a note about the trace, not
    "blend changed at resume"."""
    from energon_platform.loader.train_loader import TrainLoader

    def config(weights: tuple[int, int]):
        blend = tmp_path / f"blend_{weights[0]}_{weights[1]}.yaml"
        entries = [{"weight": w, "path": str(p)} for w, p in zip(weights, (coco, text_mini))]
        blend.write_text(
            yaml.safe_dump(
                {
                    "__module__": "megatron.energon",
                    "__class__": "MetadatasetV2",
                    "splits": {"train": {"blend": entries}},
                }
            )
        )
        return load_config(
            {
                "data": {"path": str(blend), "val_split": None},
                "encoder": str(REPO / "configs/encoders/multimodal.yaml"),
                "loader": {"global_batch_size": 4, "num_workers": 0, "seed": 3},
            }
        )

    loader = TrainLoader(config((1, 1)), num_workers=0)
    next(loader), next(loader)
    state = loader.state_dict()
    loader.close()
    with caplog.at_level(logging.WARNING):
        tracer = open_tracer(config((1, 3)), None, state)
    assert tracer.step(1)["keys"]  # the checkpoint's history serves the steps before it
    said = [r.getMessage() for r in caplog.records]
    assert not any("at resume" in m for m in said), said
    assert any(
        m.startswith("note: the config differs from the checkpoint's state: from global batch 2: ")
        for m in said
    ), said
