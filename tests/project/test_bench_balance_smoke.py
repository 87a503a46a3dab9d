"""``python -m scripts.bench.balance --quick`` runs, prints the side-by-side table and writes its JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

#: run as a module from the repository root (``cwd=REPO``)
SCRIPT = ["-m", "scripts.bench.balance"]


def test_quick_run_prints_every_variant_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            *SCRIPT,
            "--quick",
            "--steps",
            "12",
            "--json",
            str(out),
            "--sections",
            "balance",
            "sizes",
            "--sizes-steps",
            "12",
        ],  # fmt: skip
        capture_output=True,
        cwd=REPO,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for word in ("none", "naive", "energon", "ours-budget", "ours/none", "targets"):
        assert word in proc.stdout
    data = json.loads(out.read_text())
    assert {"date", "machine", "load_before", "load_after", "balance"} <= set(data)
    results = data["balance"]["results"]
    assert {(r["cost"], r["layout"]) for r in results} == {
        (c, lay) for c in ("tokens", "attention") for lay in ("packed", "unpacked")
    }
    for r in results:
        ours = r["variants"]["ours"]
        assert ours["max_over_mean"]["p90"] >= ours["batch_bound"]["p90"] - 1e-9 >= 1 - 1e-9
        if r["layout"] == "packed":
            assert ours["rows_per_rank_min"] == ours["rows_per_rank_max"] == 2  # fixed shapes
            assert r["variants"]["energon"]["rows_per_rank_max"] == 2
    targets = data["balance"]["targets"]
    assert len(targets) == 6 and all(isinstance(t["met"], bool) for t in targets)
    # the planner on every dataset size: each case planned, never a sample twice or early
    sizes = data["sizes"]["results"]
    assert len(sizes) == 2 * 2 * 8 * 2  # layouts x costs x sizes x single/blend (8 ranks)
    for r in sizes:
        assert r["plan"]["twice_in_a_batch"] == 0 and r["plan"]["early"] == 0, r
        assert r["balance"]["max_over_mean_p90"] >= r["balance"]["bound_p90"] - 1e-9 >= 1 - 1e-9
    assert "samples early: 0" in proc.stdout and "p90 na" in proc.stdout


def test_bad_flag_value_is_a_one_line_user_error():
    proc = subprocess.run(
        [sys.executable, *SCRIPT, "--quick", "--seq-len", "0"],
        capture_output=True,
        cwd=REPO,
        text=True,
        timeout=60,
    )
    assert (
        proc.returncode == 2
        and proc.stderr.strip().count("\n") == 0
        and "Traceback" not in proc.stderr
    )


def test_bad_train_value_is_a_one_line_user_error():
    proc = subprocess.run(
        [sys.executable, *SCRIPT, "--train", "--train-steps", "2"],
        capture_output=True,
        cwd=REPO,
        text=True,
        timeout=60,
    )
    assert (
        proc.returncode == 2
        and proc.stderr.strip().count("\n") == 0
        and "--train-steps" in proc.stderr
    )


@pytest.mark.slow
def test_train_section_trains_both_variants_on_two_ranks_and_reports_tokens_per_s(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            *SCRIPT,
            "--sections",
            "train",
            "--train-steps",
            "4",
            "--train-rounds",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        cwd=REPO,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "tokens/s ours/today" in proc.stdout and ("met" in proc.stdout)
    train = json.loads(out.read_text())["train"]
    assert "balance" not in json.loads(out.read_text())
    today, ours = train["variants"]["none"], train["variants"]["attention"]
    for v in (today, ours):
        # 4 less 2 warm-up
        assert v["tokens_per_s"] > 0 and len(v["runs"]) == 1 and v["runs"][0]["steps"] == 2
    assert (
        ours["rows_per_rank_min"] == ours["rows_per_rank_max"] == 8
        and ours["padding"] < today["padding"]
    )
    # about the same tokens per step
    assert 0.8 < ours["tokens_per_step"] / today["tokens_per_step"] < 1.25
    assert train["ratio"] == ours["tokens_per_s"] / today["tokens_per_s"]
    assert train["targets"][0]["met"] == (train["ratio"] >= 1.15)


def test_measured_section_calibrates_and_times_every_method(tmp_path):
    """Also the ``llava`` section (in the same process): megatron-core's LLaVAModel calibrated on
    the embedded captions, judged against the same targets."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            *SCRIPT,
            "--sections",
            "measured",
            "llava",
            "--llava-batch",
            "2",
            "--quick",
            "--scale",
            "16",  # half the positions of the default: this checks the section's shape, not its figures
            "--measured-steps",
            "1",
            "--calibrate-batches",
            "8",
            "--json",
            str(out),
        ],
        capture_output=True,
        cwd=REPO,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(out.read_text())["measured"]
    assert {(r["layout"], r["method"]) for r in measured["results"]} == {
        (lay, m)
        for lay in ("packed", "unpacked")
        for m in ("none", "tokens", "attention", "measured", "identical")
    }
    for r in measured["results"]:
        assert r["ranks"] == 8 and 1.0 <= r["max_over_mean"]["p50"] <= r["max_over_mean"]["max"]
        predicted = r.get("predicted_max_over_mean")
        assert (predicted is None) == (r["method"] == "identical")
        assert predicted is None or 1.0 <= predicted["p50"] <= predicted["max"]
    assert "predicted p90" in proc.stdout
    calibration = measured["calibration"]
    assert calibration["micro_batches"] == 8 and 0.0 <= calibration["p90_error"]
    assert "R²" in proc.stdout and "plan ms/64 rows" in proc.stdout
    llava = json.loads(out.read_text())["llava"]
    assert llava["model"].endswith("llava:calibration_model") and llava["micro_batch_size"] == 2
    assert llava["calibration"]["micro_batches"] == 8
    assert [t["target"] for t in llava["targets"]] == [
        "calibration (LLaVAModel) R² >= 0.95",
        "calibration (LLaVAModel) held-back p90 error <= 10%",
    ]
    assert "llava: megatron-core LLaVAModel" in proc.stdout


def test_the_calibration_pool_varies_the_documents_per_micro_batch_in_full_rows():
    """``measured``'s calibration pool: one-sample micro-batches alternate with packed rows of
    several documents, filled as the planner fills its rows. With one-sample micro-batches only,
    ``samples`` is 1 in every one and the fit puts the micro-batch's own cost on each document."""
    from scripts.bench.balance.common import SyntheticLengths
    from scripts.bench.balance.measured import CALIBRATION_ROW_FILL, Synthetic, calibration_pool
    from scripts.bench.balance.runner import build_parser

    args = build_parser().parse_args(["--seed", "3", "--scale", "8"])
    synth = Synthetic(SyntheticLengths(args), args)
    batches = list(calibration_pool(synth, 40))
    samples = [b.cost_features["samples"] for b in batches]
    assert samples[0::2] == [1] * 20
    rows = batches[1::2]
    assert all(tuple(b.tokens.shape) == (1, synth.seq_len) for b in rows)
    tokens = [b.cost_features["llm_tokens"] for b in rows]
    assert all(t <= synth.seq_len for t in tokens)
    full = [t >= CALIBRATION_ROW_FILL * synth.seq_len for t in tokens]  # as the planner's rows
    assert sum(full) >= 15
    assert len(set(samples[1::2])) >= 3 and max(samples) >= 3


def test_the_skewed_captions_are_cut_into_the_grids_they_were_drawn_for(tmp_path):
    """``train-measured``'s data: each image an exact grid of 1-12 tiles that the tiling encoder
    (``skewed_encoder``) cuts as drawn, every count present; captions of lognormal length."""
    from scripts.bench.balance.train_measured import SKEW_TILE, skewed_encoder
    from scripts.bench.data import SKEW_WORDS_MAX, skewed_captions_dataset
    from task_encoders.tiling import TilingConfig, choose_grid

    data = skewed_captions_dataset(tmp_path, SKEW_TILE)
    assert (data / ".nv-meta" / "dataset.yaml").is_file()
    from PIL import Image

    raw = json.loads((tmp_path / "skewed_captions_raw" / "captions.json").read_text())
    tiling = TilingConfig(**skewed_encoder()["image"]["tiling"])
    grids = [(i["width"] // SKEW_TILE, i["height"] // SKEW_TILE) for i in raw["images"]]
    assert all(i["width"] % SKEW_TILE == 0 == i["height"] % SKEW_TILE for i in raw["images"])
    for i in raw["images"]:  # the files are the sizes the annotations say
        with Image.open(tmp_path / "skewed_captions_raw" / "images" / i["file_name"]) as im:
            assert im.size == (i["width"], i["height"])
    assert [choose_grid(i["width"], i["height"], SKEW_TILE, tiling) for i in raw["images"]] == grids
    assert {c * r for c, r in grids} == set(range(1, 13))
    words = sorted(len(a["caption"].split()) for a in raw["annotations"])
    assert 8 <= words[len(words) // 2] <= 16 and words[-1] <= SKEW_WORDS_MAX
    assert words[-1] >= 4 * words[len(words) // 2]  # a long tail


def test_paired_timing_divides_out_a_slow_drift_that_the_least_of_three_keeps(monkeypatch):
    """``--timing paired`` (`timed`): on a clock that drifts slowly (consecutive runs of equal work
    take alike longer, as on a shared machine), eight equal micro-batches timed plain spread by the
    drift; paired with a reference timed around each, they come out equal, in seconds of the
    model's fastest runs."""
    import math
    from types import SimpleNamespace

    import torch

    import energon_platform.training.calibrate as calibrate
    from scripts.bench.balance.measured import timed

    class Drifting(torch.nn.Module):
        """Each forward moves the clock on by its batch's cost times a factor that drifts over
        calls (±20%, a period of about 60 calls)."""

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(()))
            self.now, self.calls = 0.0, 0

        def forward(self, batch):
            self.calls += 1
            self.now += batch.cost * (1.0 + 0.2 * math.sin(self.calls / 10))
            return self.weight * 1.0

    model = Drifting()
    monkeypatch.setattr(calibrate, "time", SimpleNamespace(perf_counter=lambda: model.now))
    equal, reference = [SimpleNamespace(cost=0.01)] * 8, SimpleNamespace(cost=0.02)
    plain = timed(model, equal, reference, "plain")
    assert plain.max() / plain.mean() > 1.05  # the drift lands in the least of 3
    paired = timed(model, equal, reference, "paired")
    assert paired.max() / paired.mean() < 1.002
    # in seconds at the reference's fastest runs, whose factor is near the drift's least (0.8)
    assert 0.01 * 0.8 <= paired.min() and paired.max() <= 0.01 * 0.83
