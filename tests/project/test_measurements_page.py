"""The measurements page as a reader sees it: per benchmark a comparison table (ours ÷ alternative,
which side is better) and a figures table that say which target is met and why one is not, its
chart with an alt text that says what it plots, every figure folded away, and no path of the
machine; the page on disk is the renderer's output of the kept runs and holds to that convention."""

import json
import re
import subprocess
import sys
from importlib import util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RENDER = REPO / "scripts" / "render_measurements.py"
PAGE = REPO / "docs" / "measurements.md"
RUNS_KEPT = REPO / "docs" / "measurements"
CHARTS = REPO / "docs" / "assets" / "measurements"
COMPARISON = ["comparison", "ours", "alternative", "ours ÷ alternative", "better when", "target"]
COMPARISON += ["met?"]
FIGURE = ["figure", "value", "better when", "target", "met?"]
SIDES = {"lower", "higher"}
MACHINE = {"platform": "Linux-x", "python": "3.11", "processor": "x86_64", "cpus": 2}

#: one small run per benchmark kind: (its JSON, the target expected unmet or None, its chart)
RUNS = {
    "loader": (
        {
            "dataset": "/work/somewhere/generated",
            "settings": {"rounds": 3, "encoder_config": "/home/u/repo/configs/encoders/a.yaml"},
            "decode": {
                "jpeg 640x480 crop 64, 0 workers": {
                    "workers": 0,
                    "kinds": {
                        "floor": {"samples_per_s": 300.0, "cpu_ms_per_sample": 3.0},
                        "ours": {"samples_per_s": 290.0, "cpu_ms_per_sample": 3.3},
                    },
                },
                "jpeg 640x480 crop 64, 2 workers": {
                    "workers": 2,
                    "kinds": {
                        "webdataset": {"samples_per_s": 100.0, "faults_per_sample": 20.0},
                        "energon": {"samples_per_s": 80.0, "faults_per_sample": 20.0},
                        "ours": {"samples_per_s": 90.0, "faults_per_sample": 18.0},
                    },
                },
            },
            "draft_error": {"samples": 64, "mean_abs_error_255": 0.75},
        },
        "jpeg 640x480 crop 64: ours / plain webdataset >= 0.95",
        "loader.svg",
    ),
    "executors": (
        {
            "settings": {"images": 64, "batch": 32, "crop": 224, "workers": 2, "batches": 4},
            "results": {
                kind: {
                    "samples_per_s": rate,
                    "trainer_node_cpu_ms_per_sample": node,
                    "other_node_cpu_ms_per_sample": other,
                    "first_batch_s": 1.0,
                    "first_batch_after_resume_s": 1.0,
                    "batch_bytes_per_sample": 1000.0,
                    **({"object_store_bytes_per_sample": 1001.0} if kind == "ray" else {}),
                }
                for kind, rate, node, other in (("local", 100.0, 7.0, 0.0), ("ray", 95.0, 1.4, 8.0))
            },
            "on_paper": {"assumed": "8 GPUs", "cpu_cores_per_gpu": 0.3},
            "targets": [
                {"target": "ray / local samples/s >= 0.9", "value": 0.95, "met": True},
                {
                    "target": "trainer node CPU per sample, ray / local <= 0.1",
                    "value": 0.2,
                    "met": False,
                    "why": "the object store's copy stays on the trainer's node",
                },
            ],
        },
        "trainer node CPU per sample, ray / local <= 0.1",
        None,
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
    "mixing": (
        {
            "settings": {"domains": ["code", "noise"], "steps": 40, "every": 4, "seeds": 3},
            "best_baseline": "uniform",
            "best_baseline_steps": 40.0,
            "compared": {
                "uniform": {"final_learnable_mean": 3.0},
                "proportional": {"final_learnable_mean": 3.2},
                "ado": {"steps_to_best_baseline": 30.0, "final_learnable_mean": 2.9},
            },
            "weight_paths": {"ado": {"code": [0.5, 0.7, 0.9], "noise": [0.5, 0.3, 0.1]}},
            "targets": [
                {
                    "target": "ado: steps to the best baseline's final learnable loss, ÷ "
                    "uniform's <= 0.85",
                    "value": 0.75,
                    "met": True,
                },
                {
                    "target": "ado: final learnable held-out loss ÷ fixed equal weights' <= 0.97",
                    "value": 0.967,
                    "met": True,
                },
                {
                    "target": "ado: noise weight below half its start by step 8, seeds late: 0",
                    "value": 1,
                    "met": False,
                    "why": "one seed halved it at step 12",
                },
            ],
        },
        "ado: noise weight below half its start by step 8, seeds late: 0",
        "mixing.svg",
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


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def tables(page: str, header: list[str]) -> list[list[list[str]]]:
    """Every top-level table of ``page`` headed ``header`` (the folded "All figures" tables are
    indented, so not these): its rows' cells."""
    lines, found = page.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith("|") and cells(line) == header:
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(cells(row))
            found.append(rows)
    return found


def headline_rows(page: str) -> list[list[str]]:
    """The cells of the first comparison table."""
    return tables(page, COMPARISON)[0]


def figure_rows(page: str) -> list[list[str]]:
    """The cells of every figures table."""
    return [row for t in tables(page, FIGURE) for row in t]


def number(cell: str) -> float:
    """A cell as a number (``1.461%`` → 1.461: ours and the alternative share the unit;
    ``5,436,000``; a small ratio ``1/10,810,000``)."""
    cell = cell.removesuffix("%").replace(",", "")
    return 1 / float(cell.removeprefix("1/")) if cell.startswith("1/") else float(cell)


def sections(page: str) -> dict[str, str]:
    """The page's benchmark sections, name → text (not "At a glance" nor "Producing ...")."""
    parts = re.split(r"^## ", page, flags=re.M)[1:]
    named = {p.split("\n", 1)[0].strip(): p for p in parts}
    return {k: v for k, v in named.items() if k not in ("At a glance", "Producing these figures")}


def load_renderer():
    spec = util.spec_from_file_location("render_measurements_under_test", RENDER)
    mod = util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_each_benchmark_gets_a_headline_a_chart_and_folded_figures(tmp_path, kind):
    run, unmet, chart = RUNS[kind]
    page = render_one(tmp_path, kind, run)
    rows = [r for t in tables(page, COMPARISON) for r in t]
    figures = figure_rows(page)
    assert rows or figures, page
    assert all(len(r) == len(COMPARISON) for r in rows), rows
    assert all(len(r) == len(FIGURE) for r in figures), figures
    judgements = [(r[5].removesuffix(" (on ours)"), r[6]) for r in rows]
    judgements += [(r[3], r[4]) for r in figures]
    verdicts = dict(judgements)
    if unmet:
        assert verdicts[unmet].startswith("**no**: "), verdicts
        reason = verdicts[unmet].removeprefix("**no**: ")
        assert reason and reason != "no reason recorded yet", f"{unmet}: no reason given"
    assert not [v for v in verdicts.values() if v.startswith("**no**") and v.endswith("yet")]
    glance = next(line for line in page.splitlines() if line.startswith(f"| [{kind}](#{kind}) |"))
    judged = [(t, v) for t, v in judgements if v != "–"]
    missed = [t for t, v in judged if v.startswith("**no**")]
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
    assert row[1:] == ["95", "100", "0.95", "higher", "ours / plain >= 0.9", "yes"]


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
    assert first[1:5] == ["1", "3", "0.3333", "lower"] and first[6] == "yes", first
    assert first[5] == "ours <= 1.2 at every position (on ours)", "says the target judges ours"
    assert second[6].startswith("**no**")


@pytest.mark.parametrize("timing", ["plain", "paired"])
def test_a_paired_timing_run_says_so_and_is_not_judged_on_the_max_over_mean_targets(
    tmp_path, timing
):
    """``python -m scripts.bench.balance --timing paired`` divides each timing by a reference's: its max/mean rows
    are labelled and carry no target, which is stated on plain timing."""
    run = json.loads(json.dumps(RUNS["balance"][0]))
    run["measured"]["timing"] = timing
    rows = {r[0]: r for r in headline_rows(render_one(tmp_path, "balance", run))}
    label = " (paired timing)" if timing == "paired" else ""
    row = rows[
        f"measured step time p90 max/mean{label}, 8 ranks, packed: planned by measured cost vs today"
    ]
    assert (row[5] == "–") == (timing == "paired"), row


# --- the page on disk: one convention for every table ------------------------------------------


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text()


def test_the_page_is_the_renderers_output_of_the_kept_runs(tmp_path, page):
    """So that what the tests below read of the page is what the renderer makes today."""
    out = tmp_path / "m.md"
    runs = sorted(RUNS_KEPT.glob("bench-*.json"))
    r = subprocess.run(
        [sys.executable, str(RENDER), "--out", str(out), *map(str, runs)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert out.read_text() == page, (
        "docs/measurements.md is stale: run scripts/render_measurements.py"
    )
    drawn = sorted(p.name for p in (tmp_path / "assets" / "measurements").glob("*.svg"))
    assert drawn == sorted(p.name for p in CHARTS.glob("*.svg")), "a chart is missing or left over"


def test_the_page_opens_with_the_glance_and_says_once_how_to_read_it_folded_below(page):
    top, rest = page.split("## At a glance", 1)
    assert "one run per benchmark, not a history" in " ".join(top.split())
    assert len(top.split()) < 60, "the page opens with its at-a-glance table"
    glance = rest.split("\n## ", 1)[0]
    assert page.count('??? info "How to read the tables"') == 1
    how = " ".join(glance.split('??? info "How to read the tables"', 1)[1].split())
    assert "its ratio is always **ours ÷ alternative**" in how and "**better when**" in how
    assert "**today** is the same loader without balancing" in how, "what today means"
    assert "the order they come" in how and "*(on ours)*" in how


def test_no_figure_is_written_in_exponent_form(page):
    # as Python writes a float in exponent form: a sign and two digits (a key's "1e9" is a name)
    assert not re.findall(r"\b\d(?:\.\d+)?e[+-]\d\d\b", page), "9.3e-08 is read past"
    render = load_renderer()
    assert render.fmt_float(9.254e-08) == "0.00000009254"
    assert render.fmt_float(5.436e6) == "5,436,000" and render.fmt_float(0.6405) == "0.6405"
    assert render.fmt_float(100.0) == "100" and render.fmt_float(12345.6) == "12,350"
    assert render.fmt_ratio(9.254e-08) == "1/10,810,000" and render.fmt_ratio(0.5) == "0.5"
    assert "1/10,810,000 (lower is better)" in page, "the trace headline, readable"


def test_every_ratio_is_ours_divided_by_the_alternative(page):
    rows = [r for t in tables(page, COMPARISON) for r in t]
    assert len(rows) > 40, "the comparison tables of every benchmark"
    wrong = []
    for name, ours, alternative, q, *_ in rows:
        expected = number(ours) / number(alternative)
        if abs(number(q) - expected) > 2e-3 * abs(expected):
            wrong.append(f"{name}: {q} shown, ours ÷ alternative is {expected:.4g}")
    assert not wrong, "\n".join(wrong)


def test_no_ratio_stands_without_both_figures_and_no_table_has_another_ratio_column(page):
    rows = [r for t in tables(page, COMPARISON) for r in t]
    assert not [r for r in rows if "–" in (r[1], r[2], r[3])], "a comparison lacks a figure"
    top = [line for line in page.splitlines() if line.startswith("| ") and "---" not in line]
    headers = {line for line in top if line.startswith(("| comparison", "| figure", "| bench"))}
    assert headers == {
        "| " + " | ".join(COMPARISON) + " |",
        "| " + " | ".join(FIGURE) + " |",
        "| benchmark | run of | headline | targets met | missed |",
    }, headers
    for name, text in sections(page).items():  # every top-level table is one of those three
        for line in text.splitlines():
            if line.startswith("|") and not line.startswith("|---"):
                width = len(cells(line))
                assert width in (len(COMPARISON), len(FIGURE)), f"{name}: {line}"


def test_every_row_says_which_side_is_better(page):
    rows = [r[4] for t in tables(page, COMPARISON) for r in t]
    rows += [r[2] for r in figure_rows(page)]
    assert rows and set(rows) <= SIDES, set(rows) - SIDES
    figures = {r[0]: r for r in figure_rows(page)}
    assert any(" R²" in name for name in figures), "a fit's R² stands in a figures table"
    assert any("padding" in name for name in figures), "a padding fraction too"


def test_the_glance_gives_each_benchmark_a_headline_found_in_its_section(page):
    (glance,) = tables(page, ["benchmark", "run of", "headline", "targets met", "missed"])
    by_name = {re.match(r"\[(.+?)\]", r[0]).group(1): r for r in glance}
    assert set(by_name) == set(sections(page)), "one line per benchmark"
    for name, text in sections(page).items():
        headline = by_name[name][2]
        m = re.fullmatch(
            r"(.+) — (ours ÷ alternative )?(\S+) \((lower|higher) is better\)", headline
        )
        assert m, f"{name}: headline {headline!r}"
        figure, is_ratio, value, side = m.groups()
        if is_ratio:
            row = next(r for t in tables(text, COMPARISON) for r in t if r[0] == figure)
            assert (row[3], row[4]) == (value, side), (name, row)
        else:
            row = next(r for r in figure_rows(text) if r[0] == figure)
            assert (row[1], row[2]) == (value, side), (name, row)


def test_every_chart_has_an_alt_text_that_says_what_it_shows(page):
    charts = re.findall(r"!\[([^\]]*)\]\((assets/measurements/[^)]+)\)", page)
    assert len(charts) >= 3, charts
    for alt, src in charts:
        name = Path(src).stem
        assert (PAGE.parent / src).is_file(), src
        assert len(alt.split()) >= 8, f"{src}: alt text {alt!r} says too little"
        assert "axis" in alt and name not in alt.split()[:2], f"{src}: {alt!r}"


def test_every_chart_keeps_its_labels_inside_the_picture():
    """Each chart drawn from the kept runs: all it draws (axis labels, ticks, titles, legend) lies
    within the figure's canvas, even before the saved picture is cropped to fit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mod = load_renderer()
    drawn = 0
    for path in sorted(RUNS_KEPT.glob("bench-*.json")):
        kind = mod.kind_of(mod.bench_name(path))
        chart = mod.KINDS[kind].chart if kind in mod.KINDS else None
        fig = chart(json.loads(path.read_text()), plt) if chart else None
        if fig is None:
            continue
        drawn += 1
        fig.tight_layout()
        fig.canvas.draw()
        drawn_box = fig.get_tightbbox(fig.canvas.get_renderer())  # what is drawn, in inches
        width, height = fig.get_size_inches()
        plt.close(fig)
        assert (
            drawn_box.x0 >= -0.01
            and drawn_box.y0 >= -0.01
            and drawn_box.x1 <= width + 0.01
            and drawn_box.y1 <= height + 0.01
        ), f"{path.name}: drawn {drawn_box} outside the {width} x {height} in canvas"
    assert drawn >= 3


# --- the direction of a figure -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("unit", "side"),
    [
        ("samples/s", "higher"),
        ("tokens/s", "higher"),
        ("samples per CPU second", "higher"),
        ("calibration R²", "higher"),
        ("ms", "lower"),
        ("seconds", "lower"),
        ("CPU µs per sample", "lower"),
        ("MiB", "lower"),
        ("bytes", "lower"),
        ("p90 max/mean", "lower"),
        ("padding", "lower"),
        ("held-back p90 error", "lower"),
    ],
)
def test_the_better_side_comes_from_the_unit(unit, side):
    assert load_renderer().better_when("a comparison", unit) == side


def test_a_target_without_a_unit_tells_the_side_by_its_operator():
    better_when = load_renderer().better_when
    assert better_when("8 ranks: p90 ours / bound <= 1.03", target="p90 ours / bound <= 1.03") == (
        "lower"
    )
    assert better_when("d/b", target="d/b >= 1.0") == "higher"
    assert better_when("samples early", target="samples early: 0") == "lower"
    assert better_when("widgets", target="widgets", stated="higher") == "higher"


def test_the_renderer_refuses_a_comparison_whose_direction_it_cannot_tell(monkeypatch):
    mod = load_renderer()
    with pytest.raises(mod.Unclear, match="widgets: ours vs theirs"):
        mod.better_when("widgets: ours vs theirs", "widgets")
    with pytest.raises(mod.Unclear, match="says higher is better"):
        mod.better_when("rate", "samples/s", target="rate <= 3")
    unknown = mod.Row("widgets: ours vs theirs", 3.0, 4.0, "widgets")
    monkeypatch.setitem(mod.KINDS, "3d", mod.KINDS["3d"]._replace(rows=lambda r: [unknown]))
    with pytest.raises(mod.Unclear, match="widgets: ours vs theirs"):
        mod.judged_rows("3d", {})


def test_a_run_with_a_target_of_no_direction_stops_the_page_with_one_line(tmp_path):
    path = tmp_path / "bench-3d.json"
    path.write_text(json.dumps({"targets": [{"target": "widgets look right", "met": True}]}))
    out = tmp_path / "m.md"
    r = subprocess.run(
        [sys.executable, str(RENDER), "--out", str(out), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "widgets look right" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not out.exists()
