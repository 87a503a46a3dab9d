"""An adaptive blend (``loader.blend_adapt``) with the reference trainer, as written in a run
config: killed on 2 ranks and resumed on 1, it passes ``check-resume``; its finished run is traced
from its state, replayed with the recorded weights or with fixed ones, and reported with its
weights over time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from energon_platform import cli
from scripts.bench.data import three_modality_blend
from tests.helpers import REPO

#: as a user writes it in a run config
ADAPT = (
    "loader:\n  global_batch_size: 8\n  num_workers: 1\n  seed: 5\n"
    "  blend_adapt: {method: loss_ratio, every: 2, lag: 2}\n"
)


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """``check-resume`` of 12 steps on 2 ranks, killed during step 8 (after the update of step 5,
    before the batch its weights apply from) and resumed on 1 rank from the checkpoint of step 6."""
    base = tmp_path_factory.mktemp("mixing-runs")
    blend = three_modality_blend(base)
    config = base / "run.yaml"
    config.write_text(
        f"data: {{path: {blend}, val_split: null}}\n"
        f"encoder: {REPO / 'configs/encoders/multimodal.yaml'}\n"
        + ADAPT
        + "model: {dim: 32, layers: 1, heads: 2, patch: 16}\n"
        + f"train: {{steps: 12, checkpoint_every: 3, out: {base / 'unused'}}}\n"
    )
    out = base / "check"
    code = cli.main(
        [
            "check-resume",
            "--config",
            str(config),
            "--steps",
            "12",
            "--kill-at",
            "8",
            "--nproc",
            "2",
            "--resume-nproc",
            "1",
            "--out",
            str(out),
        ]
    )
    return code, out, base


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def test_an_adaptive_blend_killed_on_2_ranks_resumes_exactly_on_1(checked):
    code, out, _ = checked
    report = json.loads((out / "report.json").read_text())
    assert code == 0 and report["passed"], report
    assert report["resume_step"] == 6 and report["keys_identical"] and report["tensors_identical"]
    assert report["layout"]["nproc"] == 2 and report["resume_layout"]["nproc"] == 1
    weights = [json.dumps(r["blend_weights"]) for r in rows(out / "straight")]
    assert json.loads(weights[0]) == {"coco_mini": 0.5, "librispeech_mini": 0.25, "text_mini": 0.25}
    # updates after global batches 1, 3, 5, 7 apply from batches 4, 6, 8, 10 (logged steps 5, ...)
    changed = [i for i in range(1, len(weights)) if weights[i] != weights[i - 1]]
    assert changed and set(changed) <= {4, 6, 8, 10} and len(changed) >= 3, changed


def test_the_run_is_traced_from_its_state_and_replayed_with_recorded_or_fixed_weights(
    checked, capsys
):
    _, out, base = checked
    run = out / "straight"
    logged = rows(run)
    capsys.readouterr()
    assert cli.main(["trace", "--run", str(run), "--steps", "1:12", "--json"]) == 0
    traced = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [t["keys"] for t in traced] == [r["keys"] for r in logged]  # adapted weights included
    replayed = base / "replayed"
    argv = ["replay", "--run", str(run), "--from", "10", "--steps", "2", "--out", str(replayed)]
    assert cli.main(argv) == 0  # every step before 10 is the original's
    by_step = {r["step"]: r["blend_weights"] for r in logged}
    again = rows(replayed)
    assert again and all(r["blend_weights"] == by_step[r["step"]] for r in again)
    fixed = base / "fixed"
    argv = ["replay", "--run", str(run), "--from", "7", "--steps", "3", "--out", str(fixed)]
    assert cli.main([*argv, "--set", "loader.blend_adapt=null"]) == 0
    assert {json.dumps(r["blend_weights"]) for r in rows(fixed)} == {
        json.dumps({"coco_mini": 0.5, "librispeech_mini": 0.25, "text_mini": 0.25})
    }


def test_the_report_draws_the_weights_beside_the_per_dataset_losses(checked, tmp_path):
    _, out, _ = checked
    page = tmp_path / "report.html"
    assert cli.main(["report", "--run", str(out / "straight"), "--out", str(page)]) == 0
    text = page.read_text()
    assert 'id="chart-mixing"' in text
    for name in ("coco_mini", "librispeech_mini", "text_mini"):
        assert f"{name} weight" in text and f"{name} loss" in text
