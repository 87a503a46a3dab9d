"""The measurements page as a reader sees it: per benchmark a headline table that says which target
is met and why one is not, its chart, every figure folded away, and no path of the machine."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RENDER = REPO / "scripts" / "render_measurements.py"
MACHINE = {"platform": "Linux-x", "python": "3.11", "processor": "x86_64", "cpus": 2}

#: one small run per benchmark kind: (its JSON, the target expected unmet or None, its chart)
RUNS = {
    "loader": (
        {
            "dataset": "/work/somewhere/generated",
            "settings": {"workers": 2, "encoder_config": "/home/u/repo/configs/encoders/a.yaml"},
            "throughput": {
                "samples_per_s": {"ours": 90.0, "webdataset": 100.0, "restore_seeds": 80.0},
                "ratio_a_b": 0.9,
                "ratio_a_c": 1.125,
            },
        },
        "ours / plain webdataset >= 0.95",
        "loader.svg",
    ),
    "restore": (
        {
            "target": {"ratio_max": 1.2},
            "dataset": {"path": "/tmp/bench_restore-x/dataset", "num_samples": 64},
            "positions": {
                "10": {"ours": {"ratio": 1.0}, "energon_default": {"ratio": 3.0}},
                "100": {"ours": {"ratio": 1.5}, "energon_default": {"ratio": 2.0}},
            },
            "why": {"ours <= 1.2 at every position": "the disk cache was cold"},
        },
        "ours <= 1.2 at every position",
        "restore.svg",
    ),
    "balance": (
        {
            "balance": {
                "results": [
                    {
                        "cost": "tokens",
                        "ranks": r,
                        "per_rank": 2,
                        "layout": "packed",
                        "variants": {
                            m: {"max_over_mean": {"p50": v, "p90": v, "max": v}}
                            for m, v in (("none", 1.5), ("ours", p90))
                        },
                    }
                    for r, p90 in ((8, 1.2), (64, 1.01))
                ],  # fmt: skip
                "targets": [
                    {
                        "target": "packed tokens: p90 max/mean <= 1.05",
                        "value": 1.2,
                        "met": False,
                        "why": "the window was too small",
                    }
                ],  # fmt: skip
            },
            "measured": {
                "results": [
                    {"ranks": 8, "layout": "packed", "method": m, "max_over_mean": {"p90": v}}
                    for m, v in (("none", 1.6), ("measured", 1.1))
                ]
            },
        },
        "packed tokens: p90 max/mean <= 1.05",
        "balance.svg",
    ),
    "convert": (
        {
            "samples_per_s": {
                "naive ShardWriter loop": 10.0,
                "ours, 1 worker": 10.0,
                "ours, 2 workers": 19.0,
                "ours, 2 workers -> S3": 15.0,
            },
            "ratios": {
                "ours_1w_over_naive": 1.0,
                "ours_2w_over_ours_1w": 1.9,
                "s3_over_local_2w": 0.79,
            },
        },  # fmt: skip
        "S3 / local (2 workers) >= 0.9",
        None,
    ),
    "video": (
        {
            "loader_vs_pyav": {
                "loader_clips_per_s": 8.0,
                "same_work_clips_per_s": 10.0,
                "ratio_same_work": 0.8,
            }
        },  # fmt: skip
        "loader / same work >= 0.9",
        None,
    ),
    "3d": (
        {"ours_clouds_per_s": 95.0, "plain_trimesh_clouds_per_s": 100.0, "ratio": 0.95},
        None,
        None,
    ),
    "scale": (
        {
            "schedule": [
                {"samples": 1000, "variant": "ours permutation", "seconds": 0.01},
                {"samples": 1000, "variant": "array permutation", "seconds": 0.03},
            ],
            "ratios": [{"samples": 1000, "restore_time_array_over_ours": 3.0}],
        },
        None,
        None,
    ),
    "lengths": (
        {
            "results": [
                {
                    "dataset": "coco_mini",
                    "index_samples_per_cpu_s": 600,
                    "decode_samples_per_cpu_s": 20,
                    "speedup_vs_decoding": 30.0,
                }
            ]
        },  # fmt: skip
        None,
        None,
    ),
    "trace": (
        {
            "settings": {"epochs": 10},
            "unbalanced": [
                {
                    "schedule": "one dataset",
                    "key_ms": 1.0,
                    "scan_s_estimated": 40.0,
                    "scan_over_key": 40000,
                }
            ],  # fmt: skip
            "balanced": {"replay_s_per_10k_steps": 50.0},
        },
        None,
        None,
    ),
}


def render_one(tmp_path: Path, kind: str, run: dict) -> str:
    """The page rendered from one ``bench-KIND.json`` holding ``run`` (dated, with a machine)."""
    path = tmp_path / f"bench-{kind}.json"
    path.write_text(json.dumps({"date": "2026-01-01T00:00:00+00:00", "machine": MACHINE, **run}))
    r = subprocess.run(
        [sys.executable, str(RENDER), "--out", str(tmp_path / "m.md"), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return (tmp_path / "m.md").read_text()


def headline_rows(page: str) -> list[list[str]]:
    """The cells of the headline table (the one headed ``comparison``)."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| comparison |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_each_benchmark_gets_a_headline_a_chart_and_folded_figures(tmp_path, kind):
    run, unmet, chart = RUNS[kind]
    page = render_one(tmp_path, kind, run)
    rows = headline_rows(page)
    assert rows and all(len(r) == 6 for r in rows), rows
    verdicts = {r[4]: r[5] for r in rows}
    if unmet:
        assert verdicts[unmet].startswith("**no**: "), verdicts
        reason = verdicts[unmet].removeprefix("**no**: ")
        assert reason and reason != "no reason recorded yet", f"{unmet}: no reason given"
    assert not [v for v in verdicts.values() if v.startswith("**no**") and v.endswith("yet")]
    glance = next(line for line in page.splitlines() if line.startswith(f"| [{kind}](#{kind}) |"))
    judged = [r for r in rows if r[5] != "–"]
    missed = [r[4] for r in judged if r[5].startswith("**no**")]
    met = f"{len(judged) - len(missed)} of {len(judged)}" if judged else "no target"
    assert f"| {met} |" in glance, glance
    assert all(t in glance for t in missed), f"at a glance names the missed targets: {glance}"
    assert '??? note "All figures"' in page and "\n    | " in page, "the figures fold away"
    assert not re.search(r"`[\w]+\.[\w.\[\]]+`", page.split("## Producing")[0]), "JSON paths"
    if chart:
        svg = tmp_path / "assets" / "measurements" / chart
        assert svg.is_file() and svg.read_text().lstrip().startswith("<?xml")
        assert f"](assets/measurements/{chart})" in page
    for root in ("/work/", "/tmp/", "/home/"):
        assert root not in page, f"{root} on the page"


def test_a_met_target_says_yes_and_an_unmeasured_row_is_left_out(tmp_path):
    page = render_one(tmp_path, "3d", RUNS["3d"][0])
    (row,) = headline_rows(page)
    assert row[1:] == ["95", "100", "0.95", "ours / plain >= 0.9", "yes"]


def test_old_runs_say_machine_and_load_were_not_recorded(tmp_path):
    path = tmp_path / "bench-3d.json"
    path.write_text(json.dumps({"ratio": 0.95}))
    out = tmp_path / "m.md"
    r = subprocess.run([sys.executable, str(RENDER), "--out", str(out), str(path)], timeout=120)
    assert r.returncode == 0
    page = out.read_text()
    assert page.count("not recorded in this run (recorded from now on)") == 2


def test_the_page_is_written_only_over_its_own_earlier_page(tmp_path):
    """The docs script holds to the output rule: a file it did not write is never replaced."""
    path = tmp_path / "bench-3d.json"
    path.write_text(json.dumps({"ratio": 0.95}))
    out = tmp_path / "m.md"
    for _ in range(2):  # new, then its own page again
        r = subprocess.run([sys.executable, str(RENDER), "--out", str(out), str(path)], timeout=120)
        assert r.returncode == 0
    out.write_text("# My notes\n")
    r = subprocess.run(
        [sys.executable, str(RENDER), "--out", str(out), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "not a measurements page this command wrote" in r.stderr
    assert out.read_text() == "# My notes\n"


def test_repository_paths_are_shown_relative_to_it(tmp_path):
    page = render_one(tmp_path, "loader", RUNS["loader"][0])
    assert "configs/encoders/a.yaml" in page and "…/work/somewhere" not in page


def test_restore_target_judges_ours_not_the_ratio_to_energon(tmp_path):
    page = render_one(tmp_path, "restore", RUNS["restore"][0])
    first, second = headline_rows(page)
    assert first[1:4] == ["1", "3", "3"] and first[5] == "yes"
    assert second[5].startswith("**no**")


@pytest.mark.parametrize("timing", ["plain", "paired"])
def test_a_paired_timing_run_says_so_and_is_not_judged_on_the_max_over_mean_targets(
    tmp_path, timing
):
    """``bench_balance.py --timing paired`` divides each timing by a reference's: its max/mean rows
    are labelled and carry no target, which is stated on plain timing."""
    run = json.loads(json.dumps(RUNS["balance"][0]))
    run["measured"]["timing"] = timing
    rows = {r[0]: r for r in headline_rows(render_one(tmp_path, "balance", run))}
    label = " (paired timing)" if timing == "paired" else ""
    row = rows[
        f"measured step time p90 max/mean{label}, 8 ranks, packed: planned by measured cost vs today"
    ]
    assert (row[4] == "–") == (timing == "paired"), row
