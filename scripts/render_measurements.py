"""Render the benchmarks' JSON results into ``docs/measurements.md``: measurements are generated, never typed.

    python scripts/render_measurements.py [JSON ...] [--out docs/measurements.md]

Inputs: the files named, or else every ``bench-*.json`` in the repository root, in ``out/`` and in
``docs/measurements/`` (the runs the page shows, kept with the docs so that it can be rendered again;
``scripts/bench_NAME.py --json bench-NAME.json`` writes one). The benchmark's name is the file's
(``bench-NAME.json`` or ``bench_NAME.json``; ``balance-large-model`` is a ``balance`` run); when
several files name one benchmark, the newest run (its ``date``, else the file's modification time)
is shown: the page holds one run per benchmark, not a history.

Per benchmark the page shows one sentence on what was compared on what data, the run's date,
machine and load average, a headline table (comparison, ours, the alternative, ratio, target,
met, and why when a target is not met: from the target's or the run's ``why``, else from
:data:`WHY`), at most one chart (``assets/measurements/NAME.svg`` next to the page) and every figure
of the run in a collapsed "All figures" block. No absolute path of the machine that ran it is shown.
Exit status: 0, or 2 with one line for a missing or unreadable file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from storage.outputs import OutputError, check_file, write_atomic

REPO = Path(__file__).resolve().parent.parent
META = {"date", "machine", "load_before", "load_after", "load_average", "settings", "config"}
META |= {"targets", "why", "note", "description", "benchmark"}
#: the benchmark runs the committed page was rendered from
RUNS = REPO / "docs" / "measurements"
NOT_RECORDED = "not recorded in this run (recorded from now on)"
MAX_LIST = 8
MAX_COLUMNS = 8

#: why an unmet target was missed, per benchmark kind and target text (a run's JSON may carry its own
#: ``why``: on the target, or as ``{"why": {target: text}}``, which wins over this table)
WHY = {
    "loader": {
        "reseeding every sample": "Energon's reseeding is cheap next to image decoding; on a "
        "shared machine a round's load decides the last percent (per-round figures below).",
        "TrainLoader / Energon's loader": "the global schedule and its state cost time per "
        "batch; compare the per-CPU-second figures below to tell work from load.",
        "Energon's blend": "two blended streams open twice the shards; on a shared machine a "
        "round's load decides the last percent (per-round figures below).",
        "padding with packing": "captions too long to pack well fill rows unevenly; a larger "
        "packing buffer lowers the padding.",
        "ours / plain webdataset >= 0.95": (
            "ours runs through Energon's savable loader, which keeps a restorable state and seeds "
            "every sample from (seed, key, epoch); the plain webdataset pipeline does neither. The "
            "per-CPU-second ratio (All figures) shows the same gap, so it is work, not load."
        ),
    },
    "restore": {
        "at every position": "a position whose fresh start was unusually fast on a shared "
        "machine makes its ratio high; the per-run times are under All figures.",
    },
    "video": {
        "same work": "the loader also batches clips and keeps its position; on a shared machine "
        "the per-epoch medians under All figures tell work from load.",
    },
    "3d": {
        "ours / plain": "the loader also reads each sample from its shard and tokenizes the "
        "caption; on a shared machine the per-epoch figures tell work from load.",
    },
    "convert": {
        "/ naive": "ours also validates, checksums, reports and indexes every shard.",
        "2 workers / 1 worker": "two workers share the machine with everything else on it; "
        "on 2 cores any neighbour takes from them.",
        "peak staging": "shards waited on disk longer than their upload took; see the upload "
        "retries under All figures.",
        "S3 / local": (
            "the S3 server runs on the same machine as the two conversion workers, so uploading "
            "takes CPU from converting; with one worker a core is left for the server."
        ),
    },
    "balance": {
        ": p90 max/mean": "the planner's window held too few samples of like cost; the "
        "batch bound under All figures tells a planning limit from a dealing one.",
        ": padding": "too few short samples were left to fill the rows' ends.",
        "unpacked <=": (
            "an unpacked micro-batch is padded to its longest sample, and a tower costs a call "
            "whenever it runs; measured takes samples of like length that run the oldest one's "
            "towers and deals them to micro-batches by the cost model's time of each micro-batch "
            "as a whole (a cost file of version 2). By that model its plans are even (its "
            "predicted max over mean under All figures, beside the other modes'); what is left "
            "is the model's error on single micro-batches (the worst of a step's micro-batches "
            "sets its max: at 64 ranks that is the worst of 64) and this machine's timing noise "
            "on micro-batches of 10-30 ms (the timing floor row: one rank's micro-batch timed "
            "for every rank)."
        ),
        "held-back p90 error": (
            "the worst held-back micro-batches are single text samples. The reference model's "
            "attention is dense over its row (a mask keeps the documents apart), so its cost "
            "grows with the row's length squared, not with its documents' (`llm_attention`); the "
            "per-token coefficient, fitted mostly on full rows, carries that part and overshoots a "
            "lone sample of a few hundred tokens. The micro-batches are chosen to spread the "
            "features, so the held-back ones include the extremes. And p90 of the held-back "
            "quarter (a dozen micro-batches) is about its second-worst error: one noisy timing "
            "moves it."
        ),
        "ranks, packed <=": (
            "the target sits close to the timing floor of this machine (the timing floor row: "
            "equal work, one rank's micro-batch timed once for every rank); the p90 of 12 global "
            "batches, about their second-worst, each micro-batch the least of 3 timings, moves "
            "between runs by about as much as that gap, so a run lands on either side of the "
            "target."
        ),
        "64 rows, packed": (
            "packing 64 rows takes about 6-7 ms in any mode on this machine (the tokens and "
            "attention rows of the same run under All figures), and the figure has moved by up to "
            "half between runs when the machine runs slow, although each batch counts the least "
            "of 3 plannings."
        ),
        "2-rank tokens/s ours/today": (
            "with 2 ranks today's ranks are already close to even (rank cost max/mean of today, All "
            "figures), so balancing has little to win; the gap grows with the rank count (chart)."
        ),
    },
}


class Row(NamedTuple):
    """One line of a headline table; ``target`` is ``(text, op, threshold)`` or None, about
    ``checks`` (the ratio, or ours when the ratio is missing or ``checks`` is ``"ours"``)."""

    comparison: str
    ours: object
    alternative: object
    ratio: object
    target: tuple[str, str, float] | None = None
    checks: str = "ratio"  # the figure the target is about: "ratio", else "ours"


# --- inputs ----------------------------------------------------------------------------------


def find_inputs(paths: list[Path]) -> list[Path]:
    """The files named, or every ``bench-*.json`` in the repository root, ``out/`` and
    ``RUNS``."""
    if paths:
        return paths
    return sorted(
        {
            *REPO.glob("bench-*.json"),
            *(REPO / "out").glob("bench-*.json"),
            *RUNS.glob("bench-*.json"),
        }
    )


def bench_name(path: Path) -> str:
    """``bench-balance.json`` → ``balance``; any other name → its stem."""
    return re.sub(r"^bench[-_]", "", path.stem)


def kind_of(name: str) -> str:
    """The benchmark a run name belongs to: ``balance-large-model`` → ``balance``."""
    return name.split("-")[0]


def run_date(result: dict, path: Path) -> str:
    if isinstance(result.get("date"), str):
        return result["date"]
    mtime = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat(timespec="seconds")
    return f"{mtime} (file written)"


def newest_per_benchmark(paths: list[Path]) -> dict[str, tuple[Path, dict]]:
    """One run per benchmark: the newest by date. Raises SystemExit(one line) on a bad file."""
    runs: dict[str, tuple[Path, dict]] = {}
    for path in paths:
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: {path}: not a benchmark JSON ({e})") from None
        if not isinstance(result, dict):
            raise SystemExit(f"error: {path}: not a benchmark JSON (expected an object)")
        name = bench_name(path)
        if name not in runs or run_date(result, path) > run_date(runs[name][1], runs[name][0]):
            runs[name] = (path, result)
    return dict(sorted(runs.items()))


# --- formatting ------------------------------------------------------------------------------


def local_path(text: str) -> str:
    """An absolute path without the machine: relative to the repository when it names a folder of
    the repository (``configs/...``), else its last two parts after ``…/``."""
    parts = Path(text).parts
    top = {p.name for p in REPO.iterdir()} if REPO.is_dir() else set()
    for i, part in enumerate(parts[1:], 1):
        if part in top and i < len(parts) - 1:
            return "/".join(parts[i:])
    return "…/" + "/".join(parts[-2:])


ABSOLUTE = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+[\w.+-]*")


def plain(text: str) -> str:
    """``text`` with every absolute path made local, ready for a table cell."""
    text = ABSOLUTE.sub(lambda m: local_path(m.group(0)), str(text))
    return text.replace("|", "\\|").replace("\n", " ")


def fmt(value: object) -> str:
    """A figure for a table: floats to 4 significant digits, long lists shortened."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        shown = ", ".join(fmt(x) for x in value[:MAX_LIST])
        return shown + (f", … ({len(value)} values)" if len(value) > MAX_LIST else "")
    if isinstance(value, dict):
        return ", ".join(f"{k} {fmt(v)}" for k, v in value.items())
    return plain(value)


def words(key: object) -> str:
    """``max_over_mean`` → ``max over mean``."""
    return str(key).replace("_", " ")


def table(header: tuple[str, ...], rows: list[tuple[str, ...]], indent: str = "") -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [indent + line for line in lines]


def get(node: object, *keys: object) -> object:
    """``node[k1][k2]...``, or None when any step is missing."""
    for k in keys:
        if isinstance(node, dict):
            node = node.get(k)
        elif isinstance(node, list) and isinstance(k, int) and -len(node) <= k < len(node):
            node = node[k]
        else:
            return None
    return node


def ratio(a: object, b: object) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return a / b
    return None


# --- run header: machine and load ----------------------------------------------------------


def machine(result: dict) -> str:
    m = result.get("machine")
    if isinstance(m, dict):
        shown = {k: v for k, v in m.items() if not k.startswith("loadavg")}
        return ", ".join(f"{words(k)} {fmt(v)}" for k, v in shown.items())
    if isinstance(m, str):
        return plain(m)
    return NOT_RECORDED


def load(result: dict) -> str:
    """Load average before / after, wherever the run recorded it."""
    m = result.get("machine") if isinstance(result.get("machine"), dict) else {}
    la = result.get("load_average") if isinstance(result.get("load_average"), dict) else {}
    before = result.get("load_before") or m.get("loadavg_before") or la.get("before")
    after = result.get("load_after") or m.get("loadavg_after") or la.get("after")
    if before is None and after is None:
        return NOT_RECORDED
    return f"{fmt(before)} before, {fmt(after)} after"


def settings(result: dict) -> str | None:
    s = result.get("settings") if isinstance(result.get("settings"), dict) else result.get("config")
    if not isinstance(s, dict):
        return None
    return "; ".join(f"{words(k)} {fmt(v)}" for k, v in s.items())


# --- per benchmark: the sentence, the headline rows, the chart -----------------------------


def loader_rows(r: dict) -> list[Row]:
    t, rate = r.get("throughput") or {}, get(r, "throughput", "samples_per_s") or {}
    pad = r.get("padding") or {}

    def pair(text: str, a: str, b: str, key: str, target: tuple | None) -> Row:
        return Row(
            text, rate.get(a), rate.get(b), t.get(key, ratio(rate.get(a), rate.get(b))), target
        )

    return [
        pair("samples/s: ours vs a plain webdataset pipeline", "ours", "webdataset", "ratio_a_b",
             ("ours / plain webdataset >= 0.95", ">=", 0.95)),
        pair("samples/s: ours vs Energon reseeding every sample", "ours", "restore_seeds",
             "ratio_a_c", ("ours / reseeding every sample >= 1.0", ">=", 1.0)),
        pair("samples/s: our TrainLoader vs ours through Energon's loader", "schedule", "ours",
             "ratio_d_a", ("TrainLoader / Energon's loader >= 0.95", ">=", 0.95)),
        pair("samples/s of a blend: ours vs Energon's blend", "blend", "energon_blend",
             "ratio_e_f", ("ours / Energon's blend >= 1.0", ">=", 1.0)),
        Row("padding: packed rows vs one caption per row", pad.get("padding_packed"),
            pad.get("padding_unpacked"), None, ("padding with packing <= 3%", "<=", 0.03)),
    ]  # fmt: skip


def loader_sentence(r: dict) -> str:
    s = r.get("settings") or {}
    return (
        f"Samples per second through our loaders and the alternatives on the same "
        f"{fmt(r.get('dataset', 'dataset'))} (same transforms, {fmt(s.get('workers', '?'))} "
        "workers each), and the padding of packed against unpacked caption rows."
    )


def loader_chart(r: dict, plt) -> object | None:
    rate = get(r, "throughput", "samples_per_s")
    if not isinstance(rate, dict) or not rate:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    names = [words(k) for k in rate]
    colours = ["#2a7ab0" if k in ("ours", "schedule", "blend") else "#b0b0b0" for k in rate]
    ax.barh(names, list(rate.values()), color=colours)
    ax.invert_yaxis()
    ax.set_xlabel("samples per second (blue: ours, grey: webdataset and Energon)")
    return fig


def restore_rows(r: dict) -> list[Row]:
    rows = []
    limit = get(r, "target", "ratio_max")
    for pos, p in (r.get("positions") or {}).items():
        ours, energon = get(p, "ours", "ratio"), get(p, "energon_default", "ratio")
        target = (f"ours <= {limit} at every position", "<=", limit) if limit else None
        rows.append(
            Row(f"resume after {pos} batches, as a multiple of a fresh start (lower is better)",
                ours, energon, ratio(energon, ours), target, "ours")
        )  # fmt: skip
    return rows


def restore_sentence(r: dict) -> str:
    d = r.get("dataset") or {}
    return (
        "Time from building the loader to its first batch in a fresh process, resuming a state "
        "saved after a number of batches against starting fresh: ours against Energon's savable "
        f"loader, on a generated dataset of {fmt(d.get('num_samples', '?'))} samples in "
        f"{fmt(d.get('num_shards', '?'))} shards. Ratio: Energon's multiple over ours."
    )


def restore_chart(r: dict, plt) -> object | None:
    positions = r.get("positions") or {}
    if not positions:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    xs = [int(p) for p in positions]
    for loader, name in (("ours", "ours"), ("energon_default", "Energon, default"),
                         ("energon_frequent", "Energon, frequent checkpoints")):  # fmt: skip
        ys = [get(p, loader, "ratio") for p in positions.values()]
        if any(y is not None for y in ys):
            ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("position resumed at (batches)")
    ax.set_ylabel("restore time ÷ fresh start")
    ax.legend()
    return fig


def scale_rows(r: dict) -> list[Row]:
    rows = []
    for x in r.get("ratios") or []:
        n = x.get("samples")
        sched = {s.get("variant"): s for s in r.get("schedule") or [] if s.get("samples") == n}
        ours, arr = sched.get("ours permutation", {}), sched.get("array permutation", {})
        rows += [
            Row(f"restore at {n:,} samples: seconds, ours vs one permutation array per epoch",
                ours.get("seconds"), arr.get("seconds"), x.get("restore_time_array_over_ours")),
            Row(f"restore at {n:,} samples: memory above baseline (MiB)",
                ours.get("rss_above_baseline_mib"), arr.get("rss_above_baseline_mib"),
                x.get("rss_above_base_array_over_ours")),
        ]  # fmt: skip
    return rows


def convert_rows(r: dict) -> list[Row]:
    rate, q = r.get("samples_per_s") or {}, r.get("ratios") or {}
    staging = get(r, "object_storage", "peak_staging_bytes") or {}
    bound = get(r, "object_storage", "staging_bound_bytes") or {}
    rows = [
        Row("samples/s: ours with 1 worker vs a naive ShardWriter loop", rate.get("ours, 1 worker"),
            rate.get("naive ShardWriter loop"), q.get("ours_1w_over_naive"),
            ("ours 1 worker / naive >= 0.95", ">=", 0.95)),
        Row("samples/s: ours with 2 workers vs 1 worker", rate.get("ours, 2 workers"),
            rate.get("ours, 1 worker"), q.get("ours_2w_over_ours_1w"),
            ("ours 2 workers / 1 worker >= 1.7", ">=", 1.7)),
    ]  # fmt: skip
    for w, name in (("1w", "1 worker"), ("2w", "2 workers")):
        rows.append(
            Row(f"samples/s: into S3 vs to local disk, {name}", rate.get(f"ours, {name} -> S3"),
                rate.get(f"ours, {name}"), q.get(f"s3_over_local_{w}"),
                (f"S3 / local ({name}) >= 0.9", ">=", 0.9))
        )  # fmt: skip
        if w in staging:
            rows.append(
                Row(f"bytes staged on disk at most, into S3, {name}: peak vs bound", staging[w],
                    bound.get(w), ratio(staging[w], bound.get(w)),
                    (f"peak staging ({w}) <= (workers + 1) x largest shard + records", "<=", 1.0))
            )  # fmt: skip
    return rows


def video_rows(r: dict) -> list[Row]:
    v = r.get("loader_vs_pyav") or {}
    rows = [
        Row("clips/s: our loader vs a PyAV loop decoding the same clips (decode only)",
            v.get("loader_clips_per_s"), v.get("pyav_clips_per_s"), v.get("ratio")),
        Row("clips/s: our loader vs a loop doing the same work by hand",
            v.get("loader_clips_per_s"), v.get("same_work_clips_per_s"), v.get("ratio_same_work"),
            ("loader / same work >= 0.9", ">=", 0.9)),
    ]  # fmt: skip
    for fmt_, x in (r.get("seek_long_over_short") or {}).items():
        rows.append(Row(f"decode time per clip, {fmt_}: long video over short (about 1 is ideal)",
                        None, None, x))  # fmt: skip
    return rows


def three_d_rows(r: dict) -> list[Row]:
    return [
        Row("point clouds/s: our loader vs a plain trimesh loop", r.get("ours_clouds_per_s"),
            r.get("plain_trimesh_clouds_per_s"), r.get("ratio"), ("ours / plain >= 0.9", ">=", 0.9))
    ]  # fmt: skip


def lengths_rows(r: dict) -> list[Row]:
    rows = []
    for x in r.get("results") or []:
        rows.append(
            Row(
                f"{x.get('dataset')}: samples per CPU second, building the length index "
                "vs decoding",
                x.get("index_samples_per_cpu_s"),
                x.get("decode_samples_per_cpu_s"),
                x.get("speedup_vs_decoding"),
            )
        )
        if "lookup_us_per_sample" in x:  # runs before the lookup was timed lack it
            rows.append(
                Row(
                    f"{x.get('dataset')}: CPU µs per sample to look up its lengths and "
                    "cost features (balance: measured) vs decoding it",
                    x.get("lookup_us_per_sample"),
                    x.get("decode_us_per_sample"),
                    x.get("lookup_speedup_vs_decoding"),
                )
            )
    return rows  # fmt: skip


def trace_rows(r: dict) -> list[Row]:
    epochs = get(r, "settings", "epochs")
    rows = [
        Row(f"{x.get('schedule')}: ms to find every step of one sample over {epochs} epochs, "
            "ours vs scanning the steps", x.get("key_ms"),
            None if x.get("scan_s_estimated") is None else 1000 * x["scan_s_estimated"],
            x.get("scan_over_key"))
        for x in r.get("unbalanced") or []
    ]  # fmt: skip
    b = r.get("balanced")
    if isinstance(b, dict):
        rows.append(Row("balanced run: seconds of planner replay to trace step 10,000",
                        b.get("replay_s_per_10k_steps"), None, None))  # fmt: skip
    return rows


COSTS_OF_TODAY = {"none": "today", "naive": "naive sort-and-deal", "energon": "Energon packing"}


def balance_rows(r: dict) -> list[Row]:
    rows = []
    for x in get(r, "balance", "results") or []:
        ours, today = (
            get(x, "variants", "ours", "max_over_mean", "p90"),
            get(x, "variants", "none", "max_over_mean", "p90"),
        )
        text = f"{x.get('layout')} {x.get('cost')}: p90 max/mean"
        rows.append(
            Row(f"rank cost p90 max/mean, {x.get('cost')}, {x.get('ranks')} ranks × "
                f"{x.get('per_rank')}, {x.get('layout')}: ours vs today", ours, today,
                ratio(today, ours), (text, "<=", None) if x.get("ranks") == 8 else None)
        )  # fmt: skip
    for key, ours, figure, comparison, target in (
        ("train", "attention", "tokens_per_s",
         "tokens/s training on 2 ranks: ours (balance: attention) vs today",
         "2-rank tokens/s ours/today"),
        ("train-measured", "measured", "steps_per_s",
         "two-tower optimizer steps/s on 2 ranks: balance measured vs none",
         "2-rank two-tower steps/s measured/none"),
    ):  # fmt: skip
        section = r.get(key)
        if isinstance(section, dict):
            rows.append(
                Row(comparison, get(section, "variants", ours, figure),
                    get(section, "variants", "none", figure), section.get("ratio"),
                    (target, ">=", None))
            )  # fmt: skip
    beside = get(r, "train-measured", "variants", "attention", "steps_per_s")
    if beside is not None:
        rows.append(
            Row("two-tower optimizer steps/s on 2 ranks: balance measured vs attention (both plan "
                "rows; the cost model's own gain)",
                get(r, "train-measured", "variants", "measured", "steps_per_s"), beside,
                get(r, "train-measured", "attention_ratio"))
        )  # fmt: skip
    # paired timing (`bench_balance.timed`) is not what the targets are stated on: no target
    paired = get(r, "measured", "timing") == "paired"
    timing = " (paired timing)" if paired else ""
    for x in get(r, "measured", "results") or []:
        if x.get("method") == "measured":
            none = next(
                (y for y in r["measured"]["results"] if y.get("method") == "none"
                 and y.get("ranks") == x.get("ranks") and y.get("layout") == x.get("layout")),
                {},
            )  # fmt: skip
            rows.append(
                Row(f"measured step time p90 max/mean{timing}, {x.get('ranks')} ranks, "
                    f"{x.get('layout')}: planned by measured cost vs today",
                    get(x, "max_over_mean", "p90"), get(none, "max_over_mean", "p90"),
                    ratio(get(none, "max_over_mean", "p90"), get(x, "max_over_mean", "p90")),
                    (f"measured p90 max/mean, {x.get('ranks')} ranks, {x.get('layout')}", "<=",
                     None) if x.get("ranks") in (8, 64) and not paired else None, "ours")
            )  # fmt: skip
            floor = next(
                (y for y in r["measured"]["results"] if y.get("method") == "identical"
                 and y.get("ranks") == x.get("ranks") and y.get("layout") == x.get("layout")),
                None,
            )  # fmt: skip
            if floor is not None:
                rows.append(
                    Row(f"timing floor{timing}, {x.get('ranks')} ranks, {x.get('layout')}: p90 "
                        "max/mean of equal work (one rank's micro-batch timed for every rank)",
                        get(floor, "max_over_mean", "p90"), None, None)
                )  # fmt: skip
    rows += sizes_rows(r)
    return rows


def sizes_rows(r: dict) -> list[Row]:
    """The ``sizes`` section: ours against today per dataset size, one dataset, unpacked
    ``attention`` (every case is in All figures)."""
    rows = []
    for x in get(r, "sizes", "results") or []:
        if (
            x.get("kind") != "single"
            or x.get("layout") != "unpacked"
            or x.get("cost") != "attention"
        ):
            continue
        rows.append(
            Row(f"rank cost p90 max/mean, one dataset of N = {x.get('n')} samples, "
                f"{x.get('ranks')} ranks × {x.get('per_rank')}, unpacked attention "
                f"({x.get('outlier_anchored_steps')} steps outlier-anchored; bound "
                f"{fmt(x.get('bound_p90'))}): ours vs today",
                x.get("max_over_mean_p90"), x.get("none_p90"),
                ratio(x.get("none_p90"), x.get("max_over_mean_p90")))
        )  # fmt: skip
    return rows


def balance_sentence(r: dict) -> str:
    s = r.get("settings") or {}
    if s.get("sections") == ["sizes"]:
        return (
            "The planner on every dataset size: one dataset of N samples, and a large one blended "
            "4:1 with it, for N from one global batch to ten times the window, packed and "
            f"unpacked, `attention` and `measured`, {fmt(get(r, 'sizes', 'steps'))} global batches "
            "each: the ranks' p90 max/mean beside the batches' lower bound, steps whose costliest "
            "item exceeds a rank's share (outlier-anchored), samples twice in a batch or placed "
            "before their previous epoch ended, and planning time."
        )
    if s.get("sections") == ["llava"]:
        return (
            "How well `calibrate` predicts the time of megatron-core's own LLaVAModel (tiny, on the "
            "CPU, its vision tower sized by the run) on vision-language micro-batches of the "
            "embedded captions: the fit's R² and its relative error on held-back micro-batches."
        )
    return (
        "How evenly one global batch's compute is spread over simulated data-parallel ranks, for "
        "today's consecutive samples, a naive sort-and-deal, Energon's packing and ours, on a "
        f"skewed synthetic blend of image-text, audio and text lengths ({fmt(s.get('steps'))} "
        f"steps, rows of {fmt(s.get('seq_len'))} positions); with ``train``, the reference model's "
        "tokens/s on 2 ranks; with ``measured``, the two-tower model's timed steps"
        + (
            " (paired timing: each micro-batch's time divided by that of a fixed reference "
            "micro-batch timed just before and after it, which divides out the machine's slow "
            "drift; not judged on the targets, which are stated on plain timing)."
            if get(r, "measured", "timing") == "paired"
            else "."
        )
    ).replace("``", "`")


def balance_chart(r: dict, plt) -> object | None:
    results = get(r, "balance", "results") or []
    if not results:
        return None
    panels = sorted({(x.get("cost"), x.get("layout")) for x in results})
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.2), sharey=True)
    axes = axes if len(panels) > 1 else [axes]
    for ax, (cost, layout) in zip(axes, panels):
        chosen = [x for x in results if (x.get("cost"), x.get("layout")) == (cost, layout)]
        methods = list(dict.fromkeys(m for x in chosen for m in x.get("variants", {})))
        width = 0.8 / max(1, len(chosen))
        for i, x in enumerate(chosen):
            ys = [get(x, "variants", m, "max_over_mean", "p90") or 0 for m in methods]
            xs = [j + i * width for j in range(len(methods))]
            ax.bar(xs, ys, width, label=f"{x.get('ranks')} ranks")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(methods))])
        ax.set_xticklabels([COSTS_OF_TODAY.get(m, m) for m in methods], rotation=30, ha="right")
        ax.set_title(f"{cost}, {layout}", fontsize=10)
        ax.axhline(1.0, color="black", linewidth=0.6)
    axes[0].set_ylabel("p90 max/mean of rank cost (1 = even)")
    axes[-1].legend()
    return fig


class Kind(NamedTuple):
    """What the page says of one benchmark."""

    sentence: Callable[[dict], str]
    rows: Callable[[dict], list[Row]]
    chart: Callable[[dict, object], object | None] | None = None


KINDS = {
    "loader": Kind(loader_sentence, loader_rows, loader_chart),
    "restore": Kind(restore_sentence, restore_rows, restore_chart),
    "scale": Kind(
        lambda r: (
            "The time and memory a fresh process needs to compute one global batch deep in "
            "the run (a restore's work), ours against one permutation array per epoch, at growing "
            "corpus sizes; shuffle quality and object-storage reads are under All figures."
        ),
        scale_rows,
    ),
    "convert": Kind(
        lambda r: (
            f"Converting the same generated {fmt(r.get('images', '?'))}-image COCO-style "
            "corpus to shards: a naive single-process ShardWriter loop against our converter with "
            "1 and 2 workers, to local disk and into S3 on the same machine."
        ),
        convert_rows,
    ),
    "video": Kind(
        lambda r: (
            "Video clips per second through our loader against plain PyAV loops over "
            "the same generated MP4 and WebM videos, and the decode time per clip on short and long "
            "videos."
        ),
        video_rows,
    ),
    "3d": Kind(
        lambda r: (
            f"Point clouds per second from {fmt(r.get('shapes', '?'))} generated meshes: "
            "our loader against a plain trimesh loop doing the same sampling."
        ),
        three_d_rows,
    ),
    "lengths": Kind(
        lambda r: (
            "What building the length index costs per sample on the embedded corpora, "
            "against decoding every sample to learn its length; and what `balance: measured` "
            "pays per sample in a run to look up its lengths and cost features from the index."
        ),
        lengths_rows,
    ),
    "trace": Kind(
        lambda r: (
            "Provenance queries on synthetic schedules of 10⁹ samples: finding one "
            "sample's steps with our inverse schedule against scanning the steps, and the planner "
            "replay a balanced run's trace costs."
        ),
        trace_rows,
    ),
    "balance": Kind(balance_sentence, balance_rows, balance_chart),
}


# --- targets and reasons -----------------------------------------------------------------------


def json_targets(node: object) -> list[dict]:
    """Every ``{"target", "value", "met"}`` found under a ``targets`` key."""
    found = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "targets" and isinstance(v, list):
                found += [t for t in v if isinstance(t, dict) and "target" in t]
            else:
                found += json_targets(v)
    elif isinstance(node, list):
        for x in node:
            found += json_targets(x)
    return found


def judge(row: Row, recorded: list[dict]) -> tuple[str, bool | None, dict]:
    """The row's target text, whether it is met (None: no target) and the run's own target entry
    (matched by text, or by prefix when the renderer does not know the threshold)."""
    if row.target is None:
        return "–", None, {}
    text, op, limit = row.target
    entry = next((t for t in recorded if str(t["target"]).startswith(text)), {})
    if entry:
        return str(entry["target"]), bool(entry.get("met")), entry
    value = row.ratio if row.ratio is not None and row.checks == "ratio" else row.ours
    if limit is None or not isinstance(value, (int, float)):
        return text, None, {}
    return text, (value >= limit if op == ">=" else value <= limit), {}


def reason(kind: str, target: str, entry: dict, result: dict) -> str:
    """Why ``target`` was missed: the target's ``why``, the run's ``why[target]``, else the first
    :data:`WHY` entry of ``kind`` whose key occurs in the target's text."""
    run_why = result.get("why") if isinstance(result.get("why"), dict) else {}
    known = next((v for k, v in WHY.get(kind, {}).items() if k in target), None)
    text = entry.get("why") or run_why.get(target) or known
    return plain(text) if text else "no reason recorded yet"


def judged_rows(kind: str, result: dict) -> list[tuple]:
    """The headline rows of a run: (comparison, ours, alternative, ratio, target, met, the run's
    target entry), rows the run did not measure left out, the run's own targets without a row
    added."""
    recorded = json_targets(result)
    rows = []
    for row in KINDS[kind].rows(result) if kind in KINDS else []:
        if row.ours is None and row.alternative is None and row.ratio is None:
            continue  # a figure this run did not measure
        target, met, entry = judge(row, recorded)
        rows.append((row.comparison, row.ours, row.alternative, row.ratio, target, met, entry))
    for t in recorded:  # the run's targets the renderer has no row for
        if all(t is not r[-1] for r in rows):
            rows.append((str(t["target"]), None, None, t.get("value"), str(t["target"]),
                         bool(t.get("met")), t))  # fmt: skip
    return rows


def at_a_glance(runs: dict[str, tuple[Path, dict]]) -> list[str]:
    """One line per benchmark: its targets met of those it has, and the ones missed."""
    cells = []
    for name, (path, result) in runs.items():
        rows = [r for r in judged_rows(kind_of(name), result) if r[5] is not None]
        missed = [plain(r[4]) for r in rows if not r[5]]
        met = f"{len(rows) - len(missed)} of {len(rows)}" if rows else "no target"
        cells.append((f"[{name}](#{name})", run_date(result, path)[:10], met,
                      "; ".join(missed) or "–"))  # fmt: skip
    return table(("benchmark", "run of", "targets met", "missed"), cells) + [""]


def headline(kind: str, result: dict) -> list[str]:
    rows = judged_rows(kind, result)
    if not rows:
        return []
    cells = []
    for comparison, ours, alt, q, target, met, entry in rows:
        verdict = (
            "–"
            if met is None
            else "yes"
            if met
            else "**no**: " + reason(kind, target, entry, result)
        )
        cells.append((plain(comparison), fmt(ours), fmt(alt), fmt(q), plain(target), verdict))
    header = ("comparison", "ours", "alternative", "ratio", "target", "met?")
    return table(header, cells) + [""]


# --- all figures, as readable tables --------------------------------------------------------


def element_name(item: object, index: int) -> str:
    """A list element's name: its short text/integer fields (``cost tokens, ranks 8``), else #i."""
    if isinstance(item, dict):
        parts = [
            f"{words(k)} {v}"
            for k, v in item.items()
            if isinstance(v, (str, int)) and not isinstance(v, bool) and len(str(v)) <= 24
        ]
        if parts:
            return "(" + ", ".join(parts[:4]) + ")"
    return f"#{index + 1}"


def groups(node: object, where: str = "") -> list[tuple[str, dict]]:
    """``node``'s scalars grouped by the object holding them: (readable place, {key: value})."""
    out: list[tuple[str, dict]] = []
    if isinstance(node, dict):
        own = {k: v for k, v in node.items() if not isinstance(v, (dict, list)) or is_numbers(v)}
        if own:
            out.append((where, own))
        for k, v in node.items():
            if k not in own:
                place = words(k) if k != "variants" else ""
                out += groups(v, " › ".join(x for x in (where, place) if x))
    elif isinstance(node, list):
        for i, x in enumerate(node):
            out += groups(x, f"{where} {element_name(x, i)}".strip())
    return out


def is_numbers(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in value
    )


def all_figures(result: dict) -> list[str]:
    """Every figure of the run: objects with the same keys share a table, one row each."""
    body = {k: v for k, v in result.items() if k not in META}
    clusters: dict[tuple, list[tuple[str, dict]]] = {}
    for where, own in groups(body):
        clusters.setdefault(tuple(own), []).append((where, own))
    lines = ['??? note "All figures"', ""]
    singles = []
    for keys, members in clusters.items():
        if len(members) == 1 or len(keys) > MAX_COLUMNS:
            singles += [
                (f"{where} › {words(k)}" if where else words(k), fmt(v))
                for where, own in members
                for k, v in own.items()
            ]
            continue
        rows = [(plain(where) or "–", *(fmt(own[k]) for k in keys)) for where, own in members]
        lines += table(("of", *map(words, keys)), rows, "    ") + [""]
    if singles:
        lines += table(("figure", "value"), [(plain(a), b) for a, b in singles], "    ") + [""]
    return lines if len(lines) > 2 else []


# --- the page ---------------------------------------------------------------------------------


def draw(kind: str, result: dict, assets: Path, name: str) -> str | None:
    """The benchmark's chart as ``assets/NAME.svg``; its file name, or None when it has none."""
    chart = KINDS[kind].chart if kind in KINDS else None
    if chart is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "measurements"
    fig = chart(result, plt)
    if fig is None:
        return None
    assets.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(assets / f"{name}.svg", metadata={"Date": None})
    plt.close(fig)
    return f"{name}.svg"


def section(name: str, path: Path, result: dict, assets: Path) -> list[str]:
    kind = kind_of(name)
    lines = [f"## {name}", ""]
    if kind in KINDS:
        lines += [KINDS[kind].sentence(result), ""]
    lines += [
        f"`scripts/bench_{kind}.py`, run of {run_date(result, path)} (`{path.name}`).",
        "",
        f"- machine: {machine(result)}",
        f"- load average (1, 5, 15 min): {load(result)}",
    ]
    if settings(result):
        lines.append(f"- settings: {settings(result)}")
    if isinstance(result.get("note"), str):
        lines.append(f"- note: {plain(result['note'])}")
    lines.append("")
    lines += headline(kind, result)
    chart = draw(kind, result, assets, name)
    if chart:
        lines += [f"![{name}: {words(kind)} chart](assets/measurements/{chart})", ""]
    return lines + all_figures(result)


HOW = """Each `scripts/bench_*.py` measures ours and the alternative side by side in one run and writes
its figures as JSON with `--json`. To fill this page:

```bash
# illustrative: each benchmark takes minutes (bench_balance --quick: seconds)
.venv/bin/python scripts/bench_balance.py --train --json bench-balance.json
.venv/bin/python scripts/bench_loader.py --json bench-loader.json
.venv/bin/python scripts/bench_restore.py --json bench-restore.json
.venv/bin/python scripts/bench_scale.py --json bench-scale.json
.venv/bin/python scripts/bench_convert.py --json bench-convert.json
.venv/bin/python scripts/bench_video.py --json bench-video.json
.venv/bin/python scripts/bench_trace.py --json bench-trace.json
.venv/bin/python scripts/bench_3d.py --json bench-3d.json
.venv/bin/python scripts/bench_lengths.py --json bench-lengths.json
.venv/bin/python scripts/render_measurements.py
```
"""


def render(runs: dict[str, tuple[Path, dict]], assets: Path | None = None) -> str:
    """The page for ``runs`` (name → (file, result)); charts go to ``assets``."""
    assets = assets or REPO / "docs" / "assets" / "measurements"
    lines = [
        "# Measurements",
        "",
        "Generated by `scripts/render_measurements.py` from the benchmarks' JSON: one run per benchmark,",
        "not a history. Absolute rates depend on the machine and its load; read the ratios of one run.",
        "",
    ]
    if not runs:
        lines += ["No benchmark JSON was found when this page was rendered.", "", HOW]
        return "\n".join(lines)
    lines += ["## At a glance", "", *at_a_glance(runs)]
    for name, (path, result) in runs.items():
        lines += section(name, path, result, assets)
    lines += ["## Producing these figures", "", HOW]
    return "\n".join(lines)


def is_page(path: Path) -> bool:
    """Whether ``path`` is a page this script wrote (its opening lines)."""
    try:
        head = path.read_text(encoding="utf-8", errors="replace")[:200]
    except OSError:
        return False
    return head.startswith("# Measurements\n\nGenerated by `scripts/render_measurements.py`")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "json",
        nargs="*",
        type=Path,
        help="benchmark JSON files (default: bench-*.json in the repo root, out/ and docs/measurements/)",
    )
    p.add_argument(
        "--out", type=Path, default=REPO / "docs" / "measurements.md", help="the page to write"
    )
    args = p.parse_args(argv)
    try:  # the page this script wrote, or a new file: never another file (storage.outputs)
        check_file(args.out, is_page, "measurements page", inputs=args.json, example="page.md")
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    missing = [str(x) for x in args.json if not x.is_file()]
    if missing:
        print(f"error: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        runs = newest_per_benchmark(find_inputs(args.json))
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    page = render(runs, args.out.parent / "assets" / "measurements")
    with write_atomic(args.out) as tmp:
        tmp.write_text(page)
    print(f"wrote {args.out} ({len(runs)} benchmark{'s' if len(runs) != 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
