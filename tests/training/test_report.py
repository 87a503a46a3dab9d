"""``energon-platform report``: a run's log as one self-contained HTML page, checked in a real
headless Chromium (Debian's, installed by the set-up where missing)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from energon_platform.tools.report import BUCKETS, build_report, reduce_curve
from scripts.bench.data import three_modality_blend
from scripts.browser import chromium_or_reason, console_messages, run_chromium
from tests.helpers import REPO
from tests.helpers.cli import run_cli
from tests.helpers.spikes import spikes_of

#: keys of the embedded corpora, as a blend logs them
KEYS = ["coco_mini:000000000005", "librispeech_mini:9001-100-0003", "text_mini:photo-cell"]
SPIKE_STEP = 30


def _write_log(run: Path, rows: list[dict], extra_lines: tuple[str, ...] = ()) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    (run / "log.jsonl").write_text("\n".join(lines) + "\n")
    return run


def _blend_rows(steps: int = 40) -> list[dict]:
    """A balanced blend's log: keys, lr, rank cost, padding, samples and exclusions per dataset;
    one loss spike at :data:`SPIKE_STEP` whose batch holds :data:`KEYS` and a key of no dataset."""
    rng = np.random.default_rng(0)
    rows = []
    for step in range(1, steps + 1):
        spike = step == SPIKE_STEP
        keys = [*KEYS, "coco_mini:not-a-key"] if spike else KEYS[:1]
        rows.append(
            {
                "step": step,
                "loss": 4.0 - step * 0.02 + float(rng.normal(0, 0.02)) + (3.0 if spike else 0.0),
                "keys": keys,
                "sample_losses": [9.5, 7.25, 6.0, 5.5][: len(keys)],
                "lr": 0.003 * min(1.0, step / 5),
                "rank_cost": 1.0 + float(rng.uniform(0, 0.1)),
                "padding": float(rng.uniform(0, 0.2)),
                "datasets": {
                    "coco_mini": {"samples": 4 * step, "epochs": step / 10},
                    "librispeech_mini": {"samples": 2 * step, "epochs": step / 8},
                },
                **({"excluded": {"coco_mini": 1}} if step % 7 == 0 else {}),
            }
        )
    return rows


@pytest.fixture(scope="module")
def blend_report(tmp_path_factory) -> Path:
    """The report of a blend run whose spike's samples are drawn from the embedded corpora."""
    base = tmp_path_factory.mktemp("report")
    blend = three_modality_blend(base / "data")
    rows = _blend_rows()
    run = _write_log(base / "run", rows)
    config = {
        "data": {"path": str(blend)},
        "encoder": str(REPO / "configs/encoders/multimodal.yaml"),
        "loader": {"global_batch_size": 4},
    }
    out = base / "report.html"
    build_report(run, out, spikes=spikes_of(rows), config=config)
    return out


def test_spike_panels_draw_each_sample_by_key_with_its_loss(blend_report):
    page = blend_report.read_text()
    panel = page[page.index(f'id="spike-{SPIKE_STEP}"') :]
    assert panel.count('class="sample"><img') == 3  # image, audio and text samples drawn
    for key, loss in zip(KEYS, ("9.5", "7.25", "6")):
        assert re.search(re.escape(key) + r"</code> — loss <b>" + re.escape(loss) + "</b>", panel)
    assert "coco_mini:not-a-key" in panel and "not found in the datasets" in panel
    assert "tokens: “A close-up of a tabby cat" in panel  # the decoded caption of 000000000005


def test_the_report_holds_every_chart_and_fetches_nothing(blend_report):
    page = blend_report.read_text()
    for chart in ("chart-loss", "chart-lr", "chart-balance", "chart-datasets"):
        assert f'<figure class="chart" id="{chart}"><svg' in page
    assert not re.findall(r"""(?:src|href)\s*=\s*["'](?!data:|#)""", page)
    assert "Content-Security-Policy" in page


def test_reduced_curve_keeps_extremes_and_every_kept_index():
    rng = np.random.default_rng(1)
    y = rng.normal(0, 1, 100_000)
    y[[17, 5000, 99_999]] = [50.0, -50.0, 40.0]
    keep = np.array([3, 12_345, 77_777])
    idx = reduce_curve(y, keep=keep)
    assert len(idx) <= 2 * BUCKETS + len(keep)
    assert set(keep) | {17, 5000, 99_999} <= set(idx.tolist())
    assert (np.diff(idx) > 0).all()


def test_a_million_steps_stay_under_ten_megabytes(tmp_path):
    n = 1_000_000
    loss = 3.0 + np.random.default_rng(2).normal(0, 0.05, n)
    peaks = [1_233, 500_000, 999_998]
    loss[peaks] += 5.0
    run = tmp_path / "long"
    run.mkdir()
    (run / "log.jsonl").write_text(
        "".join(f'{{"step": {i + 1}, "loss": {v:.5f}, "lr": 0.0001}}\n' for i, v in enumerate(loss))
    )
    spikes = [{"step": p + 1, "loss": float(loss[p]), "z": 99.0, "samples": []} for p in peaks]
    info = build_report(run, tmp_path / "long.html", spikes=spikes)
    assert info["steps"] == n and info["bytes"] < 10 * 2**20


def test_compare_run_is_drawn_against_the_run(tmp_path):
    run = _write_log(tmp_path / "first", [{"step": s, "loss": 3.0 / s} for s in range(1, 9)])
    replay = _write_log(tmp_path / "replay", [{"step": s, "loss": 2.9 / s} for s in range(1, 9)])
    build_report(run, tmp_path / "r.html", compare_run=replay)
    page = (tmp_path / "r.html").read_text()
    chart = page[page.index('id="chart-loss"') : page.index("</figure>")]
    assert "replay (compared)" in chart and "<th>compared with</th>" in page


def test_the_page_names_run_folders_relative_to_itself_not_by_absolute_path(tmp_path):
    run = _write_log(tmp_path / "runs" / "first", [{"step": s, "loss": 1.0 / s} for s in (1, 2)])
    replay = _write_log(tmp_path / "replays" / "r", [{"step": s, "loss": 0.9 / s} for s in (1, 2)])
    build_report(run, tmp_path / "runs" / "report.html", compare_run=replay)
    page = (tmp_path / "runs" / "report.html").read_text()
    assert "<td>first</td>" in page and "<td>../replays/r</td>" in page, page[:2000]
    assert str(tmp_path) not in page


@pytest.mark.parametrize("chart", ["loss_chart", "balance_chart", "datasets_chart", "mixing_chart"])
def test_no_legend_lies_over_a_chart_s_curves(chart, tmp_path, monkeypatch):
    """Each chart's legend lies outside its axes: inside, it hid a curve (the mixing chart's
    weights, a spike near the loss chart's corner)."""
    from energon_platform.tools import report

    drawn = []
    monkeypatch.setattr(report, "_svg", lambda fig: drawn.append(fig) or "")
    rows = [
        {
            "step": s,
            "loss": 3.0 - s / 10 + (5.0 if s == 18 else 0.0),
            "keys": ["a:1", "b:2"],
            "sample_losses": [2.0 + s / 50, 3.0 - s / 50],
            "rank_cost": 1.1,
            "rank_cost_bound": 1.0,
            "padding": 0.1,
            "blend_weights": {"a": 0.5 + s / 100, "b": 0.5 - s / 100},
            "datasets": {n: {"samples": s * 4} for n in ("a", "b")},
            "excluded": {"a": 1},
        }
        for s in range(1, 21)
    ]
    log = report.read_run_log(_write_log(tmp_path / "run", rows))
    args = (
        (log, [{"step": 18, "loss": rows[17]["loss"], "z": 9.0}])
        if chart == "loss_chart"
        else (log,)
    )
    getattr(report, chart)(*args)
    (fig,) = drawn
    fig.canvas.draw()
    axes = fig.axes[0]
    legend = axes.get_legend()
    assert legend is not None and len(legend.get_texts()) >= 2
    assert not legend.get_window_extent().overlaps(axes.get_window_extent()), chart


def _report(*args: str) -> subprocess.CompletedProcess:
    return run_cli("report", *args, timeout=120)


def test_report_command_refuses_a_folder_without_steps_in_one_line(tmp_path):
    out = str(tmp_path / "r.html")
    empty = tmp_path / "empty"
    empty.mkdir()
    torn = _write_log(tmp_path / "torn", [], ('{"step": 1', "not json"))
    for run, says in (
        (tmp_path / "nowhere", "no such run folder"),
        (empty, "no step log in the run folder"),
        (torn, "no step rows (2 corrupt lines skipped)"),
    ):
        r = _report("--run", str(run), "--out", out)
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and says in r.stderr and str(run) in r.stderr
    assert not Path(out).exists()


def test_report_command_skips_corrupt_lines_and_counts_them(tmp_path):
    rows = [{"step": s, "loss": 2.0 / s} for s in range(1, 6)]
    run = _write_log(tmp_path / "run", rows, ('{"step": 6, "loss": "x"}', "{torn"))
    r = _report("--run", str(run), "--out", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    assert "5 steps" in r.stdout and "2 corrupt lines skipped" in r.stdout
    assert "<th>corrupt lines skipped</th><td>2</td>" in (tmp_path / "r.html").read_text()


@pytest.fixture(scope="session")
def chromium():
    reason = chromium_or_reason()
    if reason:
        pytest.skip(reason)


def test_chromium_renders_the_report_with_no_console_message(chromium, blend_report, tmp_path):
    dom = run_chromium(blend_report, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not console_messages(dom.stderr), console_messages(dom.stderr)
    assert 'id="chart-loss"' in dom.stdout and dom.stdout.count("<svg") >= 4
    assert f'id="spike-{SPIKE_STEP}"' in dom.stdout and dom.stdout.count('class="sample"><img') == 3
    shot = tmp_path / "report.png"
    r = run_chromium(blend_report, f"--screenshot={shot}", "--window-size=1200,1600")
    assert r.returncode == 0 and shot.stat().st_size > 10_000, r.stderr[-2000:]


def test_chromium_reports_a_fetch_the_page_tries(chromium, blend_report, tmp_path):
    page = blend_report.read_text().replace(
        "<h2>Curves</h2>", '<h2>Curves</h2><img src="https://example.invalid/x.png">'
    )
    bad = tmp_path / "fetching.html"
    bad.write_text(page)
    r = run_chromium(bad, "--dump-dom")
    assert any("example.invalid" in line for line in console_messages(r.stderr)), r.stderr[-2000:]


def test_a_step_logged_again_after_a_resume_is_drawn_with_its_later_row(tmp_path):
    """A resumed run logs the steps after its checkpoint again: the report draws the later loss."""
    from energon_platform.tools.report import read_run_log

    rows = [{"step": s, "loss": 1.0} for s in (1, 2, 3, 4)] + [
        {"step": s, "loss": 9.0} for s in (3, 4, 5)
    ]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = read_run_log(tmp_path)
    assert log.steps.tolist() == [1, 2, 3, 4, 5] and log.loss.tolist() == [1, 1, 9, 9, 9]
