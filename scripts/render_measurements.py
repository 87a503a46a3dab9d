"""Render the benchmarks' JSON results into ``docs/measurements.md``: measurements are generated, never typed.

    python scripts/render_measurements.py [JSON ...] [--out docs/measurements.md]

Inputs: the files named, or else every ``bench-*.json`` in the repository root, in ``out/`` and in
``docs/measurements/`` (the runs the page shows, kept with the docs so that it can be rendered again;
``python -m scripts.bench.NAME --json bench-NAME.json`` writes one). The benchmark's name is the
file's (``bench-NAME.json`` or ``bench_NAME.json``; ``balance-large-model`` is a ``balance`` run); when
several files name one benchmark, the newest run (its ``date``, else the file's modification time)
is shown: the page holds one run per benchmark, not a history.

Per benchmark the page shows one sentence on what was compared on what data, the run's date,
machine and load average, a comparison table (comparison, ours, the alternative, ours ÷ alternative,
better when, target, met, and why when a target is not met: from the target's or the run's ``why``,
else from :data:`WHY`), a "figures" table for what has no alternative (a fit's R², an error, a
padding fraction), at most one chart (``assets/measurements/NAME.svg`` next to the page, with an alt
text saying what it plots) and every figure of the run in a collapsed "All figures" block. The ratio
is always ours ÷ the alternative, computed here from the two figures (a run's own ratio may be the
other way round), and "better when" (lower or higher) comes from the figure's unit by
:func:`better_when`: a figure whose direction it cannot tell stops the page (:class:`Unclear`), so a
new benchmark states it (a unit the table knows, a target with ``<=``/``>=``, or ``"better"`` on
its target). The page opens with the at-a-glance table, one headline figure per benchmark
(:func:`headline_of`), and how to read the tables folded below it. Figures are never in exponent
form (:func:`fmt_float`; a ratio below 0.001 as ``1/N``), and a chart is a link to itself. No
absolute path of the machine that ran it is shown.
Exit status: 0, or 2 with one line for a missing or unreadable file or a figure without a
direction.
"""

from __future__ import annotations

import argparse
import json
import math
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
        "ours / floor <= 1.15": (
            "the floor reads no shard, tokenizes nothing and makes no batch; and ours keeps the "
            "tensors of earlier runs bit for bit, so it resizes the crop in float where the floor "
            "resizes uint8 (image.uint8_resize, opt-in, resizes uint8): at crop 224 and on "
            "1600x1200 photos that float resize is most of the gap."
        ),
        "ours / plain webdataset >= 0.95": (
            "the default path resizes the float crop to keep earlier runs' bytes; webdataset's "
            "advised pipeline resizes uint8 (image.uint8_resize does the same, opt-in)."
        ),
        "ours / Energon >= 1.1": (
            "Energon's loader given image_decode='pil' does the same decode and uint8 geometry; "
            "ours also resizes in float (the bit-identical default) and keeps an exact, elastic "
            "state: compare the CPU per sample under All figures."
        ),
        "draft / plain webdataset >= 1.5": (
            "with two workers on two cores the trainer process, the batch transfer and the "
            "tokenizer take a share that draft decoding does not shrink."
        ),
        "draft / full >= 2": (
            "with two workers on two cores the parts draft decoding does not touch weigh more; "
            "with one thread (the CPU rows) the ratio is larger."
        ),
        "ours <= 50 per sample": (
            "a batch of 224-pixel float images (19 MB) reaches the trainer through shared memory "
            "mapped anew for every batch; those pages fault in whatever the allocator keeps "
            "(plain webdataset's workers fault as many)."
        ),
        "padding with packing": "captions too long to pack well fill rows unevenly; a larger "
        "packing buffer lowers the padding.",
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
    """One comparison: ``ours`` against ``alternative``, both in ``unit`` (its words tell
    :func:`better_when` which side is good); ``target`` is ``(text, op, threshold)`` or None, about
    ``checks`` (``"ratio"``: ours ÷ alternative, else ``"ours"``). ``ratio`` is the run's own ratio
    stated as ours ÷ alternative (invert a run's alternative-over-ours first): shown, as a figure,
    only when the run lacks one of the two figures."""

    comparison: str
    ours: object
    alternative: object
    unit: str
    target: tuple[str, str, float | None] | None = None
    checks: str = "ratio"  # the figure the target is about: "ratio", else "ours"
    ratio: object = None


class Figure(NamedTuple):
    """One figure with no alternative (a fit's R², an error, a time): ``value`` in ``unit``."""

    name: str
    value: object
    unit: str
    target: tuple[str, str, float | None] | None = None


class Line(NamedTuple):
    """A row as the page shows it: a comparison when ``ratio`` (ours ÷ alternative) is set, else a
    figure whose value is ``ours``."""

    name: str
    ours: object
    alternative: object
    ratio: float | None
    better: str  # "lower" or "higher"
    target: str  # the target's text, "–" for none
    met: bool | None  # None: no target
    entry: dict  # the run's own target entry, {} for none
    on_ours: bool = False  # a comparison's target judges ours, not the ratio
    percent: bool = False  # the target is in percent: show the figures so


class Unclear(ValueError):
    """A figure whose better side (lower or higher) the renderer cannot tell."""


#: which side of a figure is better, by the words of its unit (or name): the first rule matching
#: wins, so a rate (``samples/s``) is higher before its ``s`` reads as seconds
BETTER = (
    ("higher", re.compile(r"/s\b|\bper (?:cpu )?s(?:econd)?\b|r²|\bspeedup\b")),
    (
        "lower",
        re.compile(
            r"\b(?:ms|µs|s|seconds?|mib|gib|bytes|time|max/mean|padding|error|latency|loss)\b"
        ),
    ),
)
KNOWN_UNITS = (
    "(samples/s, per s, R²: higher; ms, s, MiB, bytes, time, max/mean, padding, error, loss: lower)"
)
#: a target's comparison operator, its last one in the text (``N >= 10g: p90 max/mean <= 1.05``)
OPERATOR = re.compile(r"<=|>=|≤|≥|<|>")


def side_of_target(text: str) -> str | None:
    """The side a target's text asks for: ``<=`` lower, ``>=`` higher, ``...: 0`` (a count that
    must be none) lower; None when it has no operator."""
    ops = OPERATOR.findall(text)
    if ops:
        return "lower" if ops[-1] in ("<=", "≤", "<") else "higher"
    return "lower" if re.search(r":\s*0$", text.strip()) else None


def better_when(name: str, unit: str = "", target: str = "", stated: object = None) -> str:
    """``"lower"`` or ``"higher"``: the run's own ``better`` on the target, else the words of
    ``unit`` (or of ``name`` when no unit is given), else the target's operator. Raises
    :class:`Unclear` naming ``name`` when none tells, or when the unit and the target disagree."""
    if stated in ("lower", "higher"):
        return str(stated)
    words_of = (unit or name).lower()
    by_unit = next((side for side, rule in BETTER if rule.search(words_of)), None)
    by_target = side_of_target(target) if target else None
    if by_unit and by_target and by_unit != by_target:
        raise Unclear(
            f"{name!r}: its unit {unit or name!r} says {by_unit} is better, its target "
            f"{target!r} asks for {by_target}"
        )
    side = by_unit or by_target
    if side is None:
        raise Unclear(
            f"{name!r}: cannot tell whether lower or higher is better; give it a unit "
            f'{KNOWN_UNITS} or a target with <= or >=, or "better": "lower"|"higher" on '
            "its target"
        )
    return side


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


def fmt_float(x: float) -> str:
    """``x`` to 4 significant digits, never in exponent form (``9.3e-08`` is read past): large
    ones with thousands separators (``5,436,000``), small ones with their zeros
    (``0.0000677``)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:.4g}"
    decimals = 3 - math.floor(math.log10(abs(x)))
    x = round(x, decimals)
    if abs(x) >= 1e4:
        return f"{x:,.0f}"
    text = f"{x:.{max(decimals, 0)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt_ratio(q: object) -> str:
    """A ratio ours ÷ alternative: below 0.001 as ``1/N`` (``1/10,810,000`` for ``9.254e-08``:
    ours takes one ten-millionth as long), else as :func:`fmt`."""
    if isinstance(q, float) and 0 < q < 1e-3:
        return "1/" + fmt_float(1 / q)
    return fmt(q)


def fmt(value: object) -> str:
    """A figure for a table: floats to 4 significant digits (`fmt_float`), long lists
    shortened."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "–"
    if isinstance(value, float):
        return fmt_float(value)
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


def number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def ratio(a: object, b: object) -> float | None:
    """``a / b``, or None unless both are numbers and ``b`` is not 0."""
    if number(a) and number(b) and b:
        return a / b
    return None


def inverse(x: object) -> float | None:
    """A run's ratio of the alternative over ours, turned into ours ÷ the alternative."""
    return ratio(1, x)


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


#: ``scripts.bench.loader``'s loader kinds, as the page names them; ours are drawn blue
LOADERS = {
    "floor": "floor (PIL decode + advised pipeline)",
    "floor_tiles": "floor (PIL decode + uint8 tiling)",
    "webdataset": "plain webdataset",
    "energon": "Energon's loader",
    "ours": "ours (TrainLoader)",
    "ours_draft": "ours, draft_decode",
    "ours_u8": "ours, uint8_resize",
    "ours_tiles": "ours, tiles",
    "ours_tiles_u8": "ours, tiles, uint8_resize",
}
OURS_LOADERS = ("ours", "ours_draft", "ours_u8", "ours_tiles", "ours_tiles_u8")


def loader_rows(r: dict) -> list[Row]:
    rows: list[Row] = []
    for name, case in (r.get("decode") or {}).items():
        k = case.get("kinds") or {}
        short = name.split(",")[0]  # the corpus and crop, for the list of missed targets
        if case.get("workers") == 0:
            floor = k.get("floor") or k.get("floor_tiles") or {}
            for kind in ("ours", "ours_u8", "ours_tiles", "ours_tiles_u8", "ours_draft"):
                if kind in k:
                    target = (
                        (f"{short}: ours / floor <= 1.15", "<=", 1.15)
                        if kind != "ours_draft"
                        else None
                    )
                    rows.append(
                        Row(
                            f"CPU per sample, {name}: {LOADERS[kind]} vs the floor",
                            get(k, kind, "cpu_ms_per_sample"),
                            floor.get("cpu_ms_per_sample"),
                            "CPU ms",
                            target,
                        )
                    )
            continue
        ours = k.get("ours") or {}

        def rate(text: str, mine: str, theirs: str, target: str, limit: float) -> Row:
            """samples/s of kind ``mine`` against kind ``theirs``, judged by ``target >= limit``."""
            return Row(
                f"samples/s, {name}: {text}",
                get(k, mine, "samples_per_s"),
                get(k, theirs, "samples_per_s"),
                "samples/s",
                (f"{short}: {target} >= {limit:g}", ">=", limit),
            )

        rows.append(
            rate("ours vs plain webdataset", "ours", "webdataset", "ours / plain webdataset", 0.95)
        )
        rows.append(rate("ours vs Energon's loader", "ours", "energon", "ours / Energon", 1.1))
        if "ours_draft" in k:
            rows.append(
                rate(
                    "draft decoding vs plain webdataset",
                    "ours_draft",
                    "webdataset",
                    "draft / plain webdataset",
                    1.5,
                )
            )
            rows.append(
                rate("draft decoding vs full decoding", "ours_draft", "ours", "draft / full", 2.0)
            )
        rows.append(
            Row(
                f"page faults per sample in a worker, {name}: ours vs plain webdataset",
                ours.get("faults_per_sample"),
                get(k, "webdataset", "faults_per_sample"),
                "faults per sample (lower is better)",
                (f"{short}: ours <= 50 per sample", "<=", 50),
                "ours",
            )
        )
    d = r.get("draft_error") or {}
    if d:
        rows.append(
            Row(
                "draft decoding: mean pixel error (in 1/255) against a full decode of the "
                "same 64-pixel crops",
                d.get("mean_abs_error_255"),
                None,
                "error",
                None,
                "ours",
            )
        )
    pad = r.get("padding") or {}
    rows.append(
        Row(
            "padding: packed rows vs one caption per row",
            pad.get("padding_packed"),
            pad.get("padding_unpacked"),
            "padding",
            ("padding with packing <= 3%", "<=", 0.03),
            "ours",
        )
    )
    return rows  # fmt: skip


def loader_sentence(r: dict) -> str:
    s = r.get("settings") or {}
    return (
        "Our TrainLoader against the floor of the work (PIL decode of bytes in memory + "
        "torchvision's advised uint8-first pipeline, one thread), a plain webdataset pipeline and "
        "Energon's loader with a minimal TaskEncoder, on photo-like JPEG and PNG corpora: CPU per "
        "sample with no workers, samples per second with two, each the best of "
        f"{fmt(s.get('rounds', '?'))} interleaved rounds in fresh processes; and the padding of "
        "packed against unpacked caption rows."
    )


def _loader_bars(r: dict) -> list[tuple[str, str, float]]:
    """(case, kind, samples/s) of every two-worker case."""
    return [
        (name, kind, m["samples_per_s"])
        for name, case in (r.get("decode") or {}).items()
        if case.get("workers")
        for kind, m in (case.get("kinds") or {}).items()
        if isinstance(m, dict) and number(m.get("samples_per_s"))
    ]


def loader_chart(r: dict, plt) -> object | None:
    bars = _loader_bars(r)
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(bars) + 1.2))
    names = [f"{case.split(',')[0]}: {LOADERS.get(kind, words(kind))}" for case, kind, _ in bars]
    colours = ["#2a7ab0" if kind in OURS_LOADERS else "#b0b0b0" for _, kind, _ in bars]
    ax.barh(names, [v for *_, v in bars], color=colours)
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel(
        "samples per second, 2 workers (higher is better)\nblue: ours; grey: the alternatives"
    )
    return fig


def loader_alt(r: dict) -> str:
    cases = sorted({case.split(",")[0] for case, _, _ in _loader_bars(r)})
    return (
        "Horizontal bar chart: samples per second with two workers on the x axis (higher is "
        "better), one bar per corpus and loader on the y axis, grouped by corpus "
        f"({'; '.join(cases)}); ours in blue (TrainLoader, and with draft decoding), the "
        "alternatives in grey (plain webdataset, Energon's loader)."
    )


def restore_rows(r: dict) -> list[Row]:
    rows = []
    limit = get(r, "target", "ratio_max")
    for pos, p in (r.get("positions") or {}).items():
        ours, energon = get(p, "ours", "ratio"), get(p, "energon_default", "ratio")
        target = (f"ours <= {limit} at every position", "<=", limit) if limit else None
        rows.append(
            Row(f"resume after {pos} batches, time to the first batch as a multiple of a fresh "
                "start: ours vs Energon's savable loader", ours, energon,
                "restore time ÷ fresh start", target, "ours")
        )  # fmt: skip
    return rows


def restore_sentence(r: dict) -> str:
    d = r.get("dataset") or {}
    return (
        "Time from building the loader to its first batch in a fresh process, resuming a state "
        "saved after a number of batches against starting fresh: ours against Energon's savable "
        f"loader, on a generated dataset of {fmt(d.get('num_samples', '?'))} samples in "
        f"{fmt(d.get('num_shards', '?'))} shards."
    )


def restore_chart(r: dict, plt) -> object | None:
    positions = r.get("positions") or {}
    if not positions:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    xs = [int(p) for p in positions]
    for loader, style in RESTORE_LINES.items():
        ys = [get(p, loader, "ratio") for p in positions.values()]
        if any(y is not None for y in ys):
            ax.plot(xs, ys, **style)
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda y, _: f"{y:g}"))
    ax.set_xlabel("position resumed at (batches, log scale)")
    ax.set_ylabel("time to first batch\n÷ a fresh start's (log)")
    ax.legend()
    return fig


#: the lines of the restore chart: ours drawn last and thin over a thick grey Energon with frequent
#: checkpoints, so that both stay seen where they run together near 1
RESTORE_LINES = {
    "energon_default": {"label": "Energon (default)", "marker": "s", "color": "#b07a2a"},
    "energon_frequent": {"label": "Energon (frequent checkpoints)", "marker": "^", "markersize": 10,
                         "linestyle": "--", "linewidth": 4, "color": "#b0b0b0"},
    "ours": {"label": "ours", "marker": "o", "color": "#2a7ab0", "linewidth": 1.5, "zorder": 3},
}  # fmt: skip


def restore_alt(r: dict) -> str:
    positions = r.get("positions") or {}
    lines = [
        style["label"]
        for k, style in RESTORE_LINES.items()
        if any(get(p, k, "ratio") is not None for p in positions.values())
    ]
    return (
        "Line chart: the time from building the loader to its first batch when resuming, as a "
        "multiple of a fresh start's (y axis, log scale, lower is better, 1 = no slower than "
        f"fresh), against the batch position resumed at (x axis, log scale: {', '.join(positions)})"
        f"; one line each for {'; '.join(lines)}."
    )


def scale_rows(r: dict) -> list[Row]:
    rows = []
    for x in r.get("ratios") or []:
        n = x.get("samples")
        sched = {s.get("variant"): s for s in r.get("schedule") or [] if s.get("samples") == n}
        ours, arr = sched.get("ours permutation", {}), sched.get("array permutation", {})
        rows += [
            Row(f"restore at {n:,} samples: seconds, ours vs one permutation array per epoch",
                ours.get("seconds"), arr.get("seconds"), "seconds",
                ratio=inverse(x.get("restore_time_array_over_ours"))),
            Row(f"restore at {n:,} samples: memory above baseline (MiB), ours vs one permutation "
                "array per epoch", ours.get("rss_above_baseline_mib"),
                arr.get("rss_above_baseline_mib"), "MiB",
                ratio=inverse(x.get("rss_above_base_array_over_ours"))),
        ]  # fmt: skip
    return rows


def convert_rows(r: dict) -> list[Row]:
    rate, q = r.get("samples_per_s") or {}, r.get("ratios") or {}
    staging = get(r, "object_storage", "peak_staging_bytes") or {}
    bound = get(r, "object_storage", "staging_bound_bytes") or {}
    rows = [
        Row("samples/s: ours with 1 worker vs a naive ShardWriter loop", rate.get("ours, 1 worker"),
            rate.get("naive ShardWriter loop"), "samples/s",
            ("ours 1 worker / naive >= 0.95", ">=", 0.95), ratio=q.get("ours_1w_over_naive")),
        Row("samples/s: ours with 2 workers vs 1 worker", rate.get("ours, 2 workers"),
            rate.get("ours, 1 worker"), "samples/s",
            ("ours 2 workers / 1 worker >= 1.7", ">=", 1.7), ratio=q.get("ours_2w_over_ours_1w")),
    ]  # fmt: skip
    for w, name in (("1w", "1 worker"), ("2w", "2 workers")):
        rows.append(
            Row(f"samples/s: into S3 vs to local disk, {name}", rate.get(f"ours, {name} -> S3"),
                rate.get(f"ours, {name}"), "samples/s", (f"S3 / local ({name}) >= 0.9", ">=", 0.9),
                ratio=q.get(f"s3_over_local_{w}"))
        )  # fmt: skip
        if w in staging:
            rows.append(
                Row(f"bytes staged on disk at most, into S3, {name}: peak vs bound", staging[w],
                    bound.get(w), "bytes",
                    (f"peak staging ({w}) <= (workers + 1) x largest shard + records", "<=", 1.0))
            )  # fmt: skip
    return rows


def video_rows(r: dict) -> list[Row | Figure]:
    v = r.get("loader_vs_pyav") or {}
    rows = [
        Row("clips/s: our loader vs a PyAV loop decoding the same clips (decode only)",
            v.get("loader_clips_per_s"), v.get("pyav_clips_per_s"), "clips/s",
            ratio=v.get("ratio")),
        Row("clips/s: our loader vs a loop doing the same work by hand",
            v.get("loader_clips_per_s"), v.get("same_work_clips_per_s"), "clips/s",
            ("loader / same work >= 0.9", ">=", 0.9), ratio=v.get("ratio_same_work")),
    ]  # fmt: skip
    for fmt_, x in (r.get("seek_long_over_short") or {}).items():
        rows.append(Figure(f"decode time per clip, {fmt_}: a long video's ÷ a short one's (1: the "
                           "length costs nothing)", x, "decode time ratio"))  # fmt: skip
    return rows


def three_d_rows(r: dict) -> list[Row]:
    return [
        Row("point clouds/s: our loader vs a plain trimesh loop", r.get("ours_clouds_per_s"),
            r.get("plain_trimesh_clouds_per_s"), "point clouds/s",
            ("ours / plain >= 0.9", ">=", 0.9), ratio=r.get("ratio"))
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
                "samples per CPU second",
                ratio=x.get("speedup_vs_decoding"),
            )
        )
        if "lookup_us_per_sample" in x:  # runs before the lookup was timed lack it
            rows.append(
                Row(
                    f"{x.get('dataset')}: CPU µs per sample to look up its lengths and "
                    "cost features (balance: measured) vs decoding it",
                    x.get("lookup_us_per_sample"),
                    x.get("decode_us_per_sample"),
                    "CPU µs per sample",
                    ratio=inverse(x.get("lookup_speedup_vs_decoding")),
                )
            )
    return rows  # fmt: skip


def index_rows(r: dict) -> list[Row | Figure]:
    """Per size: our build against Energon's prepare (one process each), the start-up of a
    balanced loader with its index prebuilt against an unbalanced one, and the figures with no
    alternative (scaling, memory, opening, bytes); then what they mean at 10⁹ samples."""
    rows: list[Row | Figure] = []
    for x in r.get("results") or []:
        n = f"N = {fmt(x.get('n'))}"
        rows += [
            Row(f"{n}: samples/s on one process, `energon-platform index` vs Energon's prepare",
                get(x, "build", "local_1", "samples_per_s"), x.get("prepare_samples_per_s"),
                "samples/s"),
            Row(f"{n}: start-up to the first batch, seconds, balanced (index prebuilt) vs "
                "unbalanced", get(x, "startup", "balanced_s"), get(x, "startup", "unbalanced_s"),
                "seconds"),
            Figure(f"{n}: peak resident memory of the build (one process), MiB",
                   get(x, "build", "local_1", "peak_mib"), "MiB"),
            Figure(f"{n}: opening the index, seconds", get(x, "open", "open_s"), "seconds"),
            Figure(f"{n}: resident memory added by opening it and reading "
                   "10,000 random samples, MiB", get(x, "open", "rss_added_mib"), "MiB"),
            Figure(f"{n}: bytes stored per sample", x.get("bytes_per_sample"), "bytes"),
        ]  # fmt: skip
        if x.get("msc"):  # the dataset and its index on object storage, a fresh node
            rows += [
                Row(f"{n}, msc://: index bytes a fresh node fetches to open it vs the index",
                    get(x, "msc", "open", "fetched_at_open"), get(x, "msc", "open", "bytes"),
                    "bytes"),
                Row(f"{n}, msc://: start-up to the first batch, seconds, balanced (index "
                    "published) vs unbalanced", get(x, "msc", "startup", "balanced_s"),
                    get(x, "msc", "startup", "unbalanced_s"), "seconds"),
                Figure(f"{n}, msc://: opening the published index, seconds",
                       get(x, "msc", "open", "open_s"), "seconds"),
            ]  # fmt: skip
    e = r.get("at_1e9") or {}
    rows += [
        Figure("at 10⁹ samples: time to build on one process, hours",
               e.get("hours_per_process"), "time"),
        Figure("at 10⁹ samples: time of Energon's prepare on one process, hours",
               e.get("energon_prepare_hours_one_process"), "time"),
        Figure("at 10⁹ samples: bytes stored", e.get("bytes"), "bytes"),
    ]  # fmt: skip
    return rows


def trace_rows(r: dict) -> list[Row | Figure]:
    epochs = get(r, "settings", "epochs")
    rows = [
        Row(f"{x.get('schedule')}: ms to find every step of one sample over {epochs} epochs, "
            "ours vs scanning the steps", x.get("key_ms"),
            None if x.get("scan_s_estimated") is None else 1000 * x["scan_s_estimated"], "ms",
            ratio=inverse(x.get("scan_over_key")))
        for x in r.get("unbalanced") or []
    ]  # fmt: skip
    b = r.get("balanced")
    if isinstance(b, dict):
        rows.append(Figure("balanced run: seconds of planner replay to trace step 10,000",
                           b.get("replay_s_per_10k_steps"), "seconds"))  # fmt: skip
    return rows


def mixing_rows(r: dict) -> list[Row | Figure]:
    """Per method: steps to the best fixed mixture's final learnable loss against that mixture's
    own, and its final learnable loss against fixed equal weights (the run's targets say which
    are met); the noise and overhead targets come in as the run's own figures."""
    rows: list[Row | Figure] = []
    best, compared = r.get("best_baseline"), r.get("compared") or {}
    uniform = get(compared, "uniform", "final_learnable_mean")
    for method, c in compared.items():
        if method in ("uniform", "proportional"):
            if method != "uniform":
                rows.append(
                    Row(f"{method} (fixed): final held-out loss over the learnable domains vs "
                        "fixed equal weights", c.get("final_learnable_mean"), uniform, "loss")
                )  # fmt: skip
            continue
        rows += [
            Row(f"{method}: steps to the best fixed mixture's final learnable held-out loss, "
                f"{method} vs {best}", c.get("steps_to_best_baseline"),
                r.get("best_baseline_steps"), "steps",
                (f"{method}: steps to the best baseline's final learnable loss", "<=", 0.85)),
            Row(f"{method}: final held-out loss over the learnable domains vs fixed equal weights",
                c.get("final_learnable_mean"), uniform, "loss",
                (f"{method}: final learnable held-out loss", "<=", 0.97)),
        ]  # fmt: skip
    return rows


#: the domains' colours in the mixing chart (noise drawn thick)
MIXING_COLOURS = ("#2a7ab0", "#e08a1e", "#3a9a3a", "#8a5ab0", "#c83232")


def mixing_chart(r: dict, plt) -> object | None:
    """The weight paths of each method (mean over the seeds), one panel per method."""
    paths = {m: p for m, p in (r.get("weight_paths") or {}).items()
             if m not in ("uniform", "proportional")}  # fmt: skip
    every, steps = get(r, "settings", "every"), get(r, "settings", "steps")
    if not paths or not every:
        return None
    fig, axes = plt.subplots(1, len(paths), figsize=(3.2 * len(paths), 2.8), squeeze=False)
    for ax, (method, weights) in zip(axes[0], paths.items()):
        for (domain, ws), colour in zip(weights.items(), MIXING_COLOURS):
            ax.plot([i * every for i in range(len(ws))], ws, color=colour, label=domain,
                    lw=2.2 if domain == "noise" else 1.2)  # fmt: skip
        if steps:
            ax.axvline(steps / 5, color="grey", ls=":", lw=1)
        ax.set_title(method, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylim(0, 1)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("blend weight", fontsize=8)
    axes[0][0].legend(fontsize=7, loc="upper right")
    return fig


def mixing_alt(r: dict) -> str:
    methods = [m for m in (r.get("weight_paths") or {}) if m not in ("uniform", "proportional")]
    domains = get(r, "settings", "domains") or []
    return (
        f"Line charts, one panel per method ({', '.join(methods)}): each domain's blend weight "
        f"(y axis, 0 to 1, mean over the seeds) against the training step (x axis), one line per "
        f"domain ({', '.join(domains)}; noise drawn thick); the dotted line marks the first fifth "
        "of the run, by which the noise weight should be below half its start."
    )


def cli_rows(r: dict) -> list[Row]:
    return [
        Row(
            "energon-platform --help: seconds, rooms imported when a command runs vs all up front",
            r.get("help_s"),
            r.get("eager_import_s"),
            "seconds",
            ("energon-platform --help <=", "<=", None),
            "ours",
        ),
        Figure(
            "energon-platform train without --config (a usage error)",
            r.get("usage_error_s"),
            "seconds",
        ),
    ]


COSTS_OF_TODAY = {"none": "today", "naive": "naive sort-and-deal", "energon": "Energon packing"}


def balance_rows(r: dict) -> list[Row | Figure]:
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
                "p90 max/mean", (text, "<=", None) if x.get("ranks") == 8 else None, "ours")
        )  # fmt: skip
    for key, ours, figure, comparison, target in (
        ("train", "attention", "tokens_per_s",
         "tokens/s training on 2 ranks: ours (balance: attention) vs today",
         "2-rank tokens/s ours/today"),
        ("train-measured", "measured", "steps_per_s",
         "two-tower optimizer steps/s on 2 ranks: balance measured vs today (none)",
         "2-rank two-tower steps/s measured/none"),
    ):  # fmt: skip
        section = r.get(key)
        if isinstance(section, dict):
            rows.append(
                Row(comparison, get(section, "variants", ours, figure),
                    get(section, "variants", "none", figure), words(figure).replace(" per ", "/"),
                    (target, ">=", None), ratio=section.get("ratio"))
            )  # fmt: skip
    beside = get(r, "train-measured", "variants", "attention", "steps_per_s")
    if beside is not None:
        rows.append(
            Row("two-tower optimizer steps/s on 2 ranks: balance measured vs attention (both plan "
                "rows; the cost model's own gain)",
                get(r, "train-measured", "variants", "measured", "steps_per_s"), beside,
                "steps/s", ratio=get(r, "train-measured", "attention_ratio"))
        )  # fmt: skip
    # paired timing (`scripts.bench.balance.measured.timed`) is not what the targets are stated
    # on: no target
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
                    "p90 max/mean",
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
                    Figure(f"timing floor{timing}, {x.get('ranks')} ranks, {x.get('layout')}: p90 "
                           "max/mean of equal work (one rank's micro-batch timed for every rank)",
                           get(floor, "max_over_mean", "p90"), "p90 max/mean")
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
        b = x.get("balance") or {}
        rows.append(
            Row(f"rank cost p90 max/mean, one dataset of N = {x.get('n')} samples, "
                f"{x.get('ranks')} ranks, unpacked attention "
                f"({b.get('outlier_anchored_steps')} steps outlier-anchored; bound "
                f"{fmt(b.get('bound_p90'))}): ours vs today",
                b.get("max_over_mean_p90"), b.get("none_p90"), "p90 max/mean")
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
    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.6 * cols, 3.2 * rows), sharey=True, squeeze=False
    )
    axes = list(axes.flat)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
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
    for ax in axes[::cols]:
        ax.set_ylabel("p90 max/mean of rank cost\n(1 = even, lower is better)", fontsize=9)
    axes[len(panels) - 1].legend()
    return fig


def balance_alt(r: dict) -> str:
    results = get(r, "balance", "results") or []
    panels = sorted({(x.get("cost"), x.get("layout")) for x in results})
    methods = list(dict.fromkeys(m for x in results for m in x.get("variants", {})))
    ranks = list(dict.fromkeys(str(x.get("ranks")) for x in results))
    return (
        "Grouped bar charts, one panel per cost and layout ("
        + "; ".join(f"{c}, {lay}" for c, lay in panels)
        + "): the p90 over steps of the costliest rank's cost divided by the mean rank's (y axis, "
        "1 = even ranks, lower is better) for each way of dealing samples on the x axis ("
        + ", ".join(COSTS_OF_TODAY.get(m, m) for m in methods)
        + f"), one bar per rank count ({', '.join(ranks)} ranks); a black line marks 1."
    )


class Kind(NamedTuple):
    """What the page says of one benchmark; ``alt`` says what its chart shows (each axis, each
    series), for a reader who does not see it."""

    sentence: Callable[[dict], str]
    rows: Callable[[dict], list[Row | Figure]]
    chart: Callable[[dict, object], object | None] | None = None
    alt: Callable[[dict], str] | None = None


def executors_rows(r: dict) -> list[Row | Figure]:
    ray, local = get(r, "results", "ray") or {}, get(r, "results", "local") or {}
    paper = r.get("on_paper") or {}
    return [
        Row("samples/s on the same 2 cores, a pool of 2 Ray actors vs 2 local worker processes",
            ray.get("samples_per_s"), local.get("samples_per_s"), "samples/s",
            ("ray / local samples/s >= 0.9", ">=", 0.9)),
        Row("CPU ms per sample on the trainer's node (trainer process, its children, the head "
            "node's Ray processes), actors on the other node vs local workers",
            ray.get("trainer_node_cpu_ms_per_sample"), local.get("trainer_node_cpu_ms_per_sample"),
            "ms", ("trainer node CPU per sample, ray / local <= 0.1", "<=", 0.1)),
        Row("first batch after start, Ray actors vs local workers", ray.get("first_batch_s"),
            local.get("first_batch_s"), "s"),
        Row("first batch after resume, Ray actors vs local workers",
            ray.get("first_batch_after_resume_s"), local.get("first_batch_after_resume_s"), "s"),
        Row("bytes per sample through Ray's object store vs the batch's own tensors",
            ray.get("object_store_bytes_per_sample"), ray.get("batch_bytes_per_sample"), "bytes"),
        Figure("CPU ms per sample on the actors' node (counted apart)",
               ray.get("other_node_cpu_ms_per_sample"), "ms"),
        Figure(f"on paper: CPU cores per GPU ({paper.get('assumed', '?')})",
               paper.get("cpu_cores_per_gpu"), "time"),
        Figure("on paper: 64-core CPU nodes per 8-GPU node", paper.get("cpu_nodes_per_8_gpu_node"),
               "time"),
    ]  # fmt: skip


KINDS = {
    "loader": Kind(loader_sentence, loader_rows, loader_chart, loader_alt),
    "restore": Kind(restore_sentence, restore_rows, restore_chart, restore_alt),
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
    "index": Kind(
        lambda r: (
            "The length index at scale, on synthetic text datasets of "
            f"{', '.join(fmt(n) for n in get(r, 'settings', 'sizes') or [])} samples: "
            "`energon-platform index` on 1 and 2 local processes and Ray workers against Energon's "
            "own prepare of the same shards, the memory of building and of opening the index as "
            "the dataset grows, and a balanced loader's start-up with the index prebuilt against "
            "an unbalanced one's; at 10⁹ samples, the figures extrapolated."
        ),
        index_rows,
    ),
    "trace": Kind(
        lambda r: (
            "Provenance queries on synthetic schedules of 10⁹ samples: finding one "
            "sample's steps with our inverse schedule against scanning the steps, and the planner "
            "replay a balanced run's trace costs."
        ),
        trace_rows,
    ),
    "mixing": Kind(
        lambda r: (
            "Online data mixing (blend_adapt in the loader config) on real text that ships with "
            f"Python and torch ({', '.join(get(r, 'settings', 'domains') or [])}: standard-library "
            "source, the language reference's prose, a JSON registry, near-duplicate windows of "
            "one license that saturate, and noise words), "
            f"{fmt(get(r, 'settings', 'tokens_per_domain') or '?')} tokens per domain; the "
            f"reference LM ({get(r, 'settings', 'model') or '?'}) trained from scratch on each "
            f"mixture for {fmt(get(r, 'settings', 'steps') or '?')} steps, "
            f"{fmt(get(r, 'settings', 'seeds') or '?')} seeds: fixed equal and proportional "
            "weights against each method; held-out loss per domain, where the weights went, "
            "and the mixer's cost per step."
        ),
        mixing_rows,
        mixing_chart,
        mixing_alt,
    ),
    "balance": Kind(balance_sentence, balance_rows, balance_chart, balance_alt),
    "executors": Kind(
        lambda r: (
            "Who makes the batches: 2 local worker processes against a pool of 2 Ray actors "
            "placed on a second Ray node of the same machine (`loader.executor: ray`), on "
            f"{fmt(get(r, 'settings', 'images') or '?')} photo-like 640×480 JPEGs cropped to "
            f"{fmt(get(r, 'settings', 'crop') or '?')}: throughput, the CPU left on the trainer's "
            "node, the first batch after a start and a resume, and the bytes each sample moves "
            "through Ray's object store."
        ),
        executors_rows,
    ),
    "cli": Kind(
        lambda r: (
            "What the energon-platform command costs before it does anything, in fresh processes: "
            "its rooms imported by the command that runs (as shipped) against "
            f"{len(r.get('rooms') or [])} modules of every command imported up front."
        ),
        cli_rows,
    ),
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


def judge(
    target: tuple | None, value: object, recorded: list[dict]
) -> tuple[str, bool | None, dict]:
    """A target's text, whether ``value`` meets it (None: no target) and the run's own target entry
    (matched by text, or by prefix when the renderer does not know the threshold)."""
    if target is None:
        return "–", None, {}
    text, op, limit = target
    entry = next((t for t in recorded if str(t["target"]).startswith(text)), {})
    if entry:
        return str(entry["target"]), bool(entry.get("met")), entry
    if limit is None or not number(value):
        return text, None, {}
    return text, (value >= limit if op == ">=" else value <= limit), {}


def reason(kind: str, target: str, entry: dict, result: dict) -> str:
    """Why ``target`` was missed: the target's ``why``, the run's ``why[target]``, else the first
    :data:`WHY` entry of ``kind`` whose key occurs in the target's text."""
    run_why = result.get("why") if isinstance(result.get("why"), dict) else {}
    known = next((v for k, v in WHY.get(kind, {}).items() if k in target), None)
    text = entry.get("why") or run_why.get(target) or known
    return plain(text) if text else "no reason recorded yet"


def in_percent(target: str) -> bool:
    """Whether a target's threshold is in percent (``padding <= 2%``)."""
    ops = list(OPERATOR.finditer(target))
    return bool(ops) and target[ops[-1].end() :].strip().endswith("%")


def figure_name(target: str, entry: dict) -> str:
    """The figure a run's own target is about: its text before its last operator (``calibration
    R² >= 0.95`` → ``calibration R²``), with the worst case the run names."""
    ops = list(OPERATOR.finditer(target))
    name = target[: ops[-1].start()] if ops else re.sub(r":\s*0$", "", target.strip())
    while re.search(r"(?:[,:]|\bin)\s*$", name):
        name = re.sub(r"(?:[,:]|\bin)\s*$", "", name)
    name = name.strip() or target
    unit = re.search(r"\d\s*([^\W\d_][\w/]*)$", target[ops[-1].end() :]) if ops else None
    if unit and unit.group(1) not in name:  # ``... in <= 10 ms``: the value is in ms
        name += f" ({unit.group(1)})"
    worst = entry.get("worst")
    return f"{name} (worst: {worst})" if isinstance(worst, str) else name


def line_of(row: Row | Figure, recorded: list[dict]) -> Line | None:
    """How ``row`` shows: a comparison when the run has both figures, else a figure (ours alone, or
    the run's own ratio when it lacks the figures); None when the run measured none of it."""
    if isinstance(row, Row) and ratio(row.ours, row.alternative) is not None:
        q = ratio(row.ours, row.alternative)
        target, met, entry = judge(row.target, q if row.checks == "ratio" else row.ours, recorded)
        better = better_when(row.comparison, row.unit, target, entry.get("better"))
        on_ours = row.target is not None and row.checks == "ours"
        return Line(row.comparison, row.ours, row.alternative, q, better, target, met, entry,
                    on_ours, in_percent(target))  # fmt: skip
    if isinstance(row, Figure):
        name, value, checked = row.name, row.value, row.value
    elif row.ours is not None:  # the run has no alternative for it, or one of 0
        why = "the alternative is 0" if row.alternative == 0 else "no alternative in this run"
        name, value = f"{row.comparison}: ours ({why})", row.ours
        checked = value if row.checks == "ours" else None
    elif row.ratio is not None:  # only the run's own ratio, already ours ÷ alternative
        name, value = f"{row.comparison}: ours ÷ alternative", row.ratio
        checked = value if row.checks == "ratio" else None
    else:
        return None  # a figure this run did not measure
    if value is None:
        return None
    target, met, entry = judge(row.target, checked, recorded)
    better = better_when(name, row.unit, target, entry.get("better"))
    return Line(name, value, None, None, better, target, met, entry, percent=in_percent(target))


def judged_rows(kind: str, result: dict) -> list[Line]:
    """The rows of a run, comparisons and figures, as the page shows them: rows the run did not
    measure left out, the run's own targets without a row added as figures. Raises
    :class:`Unclear` for a row whose better side cannot be told."""
    recorded = json_targets(result)
    lines = []
    for row in KINDS[kind].rows(result) if kind in KINDS else []:
        line = line_of(row, recorded)
        if line is not None:
            lines.append(line)
    for t in recorded:  # the run's targets the renderer has no row for
        if all(t is not x.entry for x in lines):
            text = str(t["target"])
            better = better_when(text, "", text, t.get("better"))
            lines.append(Line(figure_name(text, t), t.get("value"), None, None, better, text,
                              bool(t.get("met")), t, percent=in_percent(text)))  # fmt: skip
    return lines


def shown(value: object, percent: bool) -> str:
    """A figure for a cell: in percent when its target is (``0.146%``)."""
    if percent and number(value):
        return f"{value * 100:.4g}%"
    return fmt(value)


def headline_of(lines: list[Line]) -> str:
    """One figure for a benchmark: its first comparison with a target, else its first figure with a
    target, else its first comparison, else its first figure."""
    for chosen in (
        [x for x in lines if x.ratio is not None and x.met is not None],
        [x for x in lines if x.met is not None],
        [x for x in lines if x.ratio is not None],
        lines,
    ):
        if chosen:
            x = chosen[0]
            shown_as = (
                f"ours ÷ alternative {fmt_ratio(x.ratio)}"
                if x.ratio is not None
                else shown(x.ours, x.percent)
            )
            return f"{plain(x.name)} — {shown_as} ({x.better} is better)"
    return "–"


def at_a_glance(runs: dict[str, tuple[Path, dict]]) -> list[str]:
    """One line per benchmark: its headline figure, its targets met of those it has, and the ones
    missed."""
    cells = []
    for name, (path, result) in runs.items():
        lines = judged_rows(kind_of(name), result)
        judged = [x for x in lines if x.met is not None]
        missed = [plain(x.target) for x in judged if not x.met]
        met = f"{len(judged) - len(missed)} of {len(judged)}" if judged else "no target"
        cells.append((f"[{name}](#{name})", run_date(result, path)[:10], headline_of(lines), met,
                      "; ".join(missed) or "–"))  # fmt: skip
    return table(("benchmark", "run of", "headline", "targets met", "missed"), cells) + [""]


def verdict(kind: str, line: Line, result: dict) -> str:
    if line.met is None:
        return "–"
    return "yes" if line.met else "**no**: " + reason(kind, line.target, line.entry, result)


def headline(kind: str, result: dict) -> list[str]:
    """The benchmark's comparison table and its figures table (each only when it has rows)."""
    lines = judged_rows(kind, result)
    out = []
    comparisons = [x for x in lines if x.ratio is not None]
    if comparisons:
        cells = [
            (plain(x.name), shown(x.ours, x.percent), shown(x.alternative, x.percent),
             fmt_ratio(x.ratio), x.better, plain(x.target) + (" (on ours)" if x.on_ours else ""),
             verdict(kind, x, result))
            for x in comparisons
        ]  # fmt: skip
        out += table(COMPARISON_HEADER, cells) + [""]
    figures = [x for x in lines if x.ratio is None]
    if figures:
        cells = [
            (plain(x.name), shown(x.ours, x.percent), x.better, plain(x.target),
             verdict(kind, x, result))
            for x in figures
        ]  # fmt: skip
        out += table(FIGURE_HEADER, cells) + [""]
    return out


COMPARISON_HEADER = (
    "comparison", "ours", "alternative", "ours ÷ alternative", "better when", "target", "met?"
)  # fmt: skip
FIGURE_HEADER = ("figure", "value", "better when", "target", "met?")


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
    fig.tight_layout()  # and the labels kept whole: the saved box grows to hold them
    fig.savefig(
        assets / f"{name}.svg", metadata={"Date": None}, bbox_inches="tight", pad_inches=0.1
    )
    plt.close(fig)
    return f"{name}.svg"


def module_of(kind: str) -> str:
    """The module of the benchmark that writes ``kind``'s runs (a module's name cannot start with a
    digit: ``3d`` is ``mesh3d``)."""
    return f"scripts.bench.{'mesh3d' if kind == '3d' else kind}"


def section(name: str, path: Path, result: dict, assets: Path) -> list[str]:
    kind = kind_of(name)
    lines = [f"## {name}", ""]
    if kind in KINDS:
        lines += [KINDS[kind].sentence(result), ""]
    lines += [
        f"`python -m {module_of(kind)}`, run of {run_date(result, path)} (`{path.name}`).",
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
        alt = KINDS[kind].alt(result) if KINDS[kind].alt else f"{name}: {words(kind)} chart"
        alt = plain(alt).replace("[", "(").replace("]", ")")
        src = f"assets/measurements/{chart}"
        lines += [f"[![{alt}]({src})]({src})", ""]  # a tap opens it at full size
    return lines + all_figures(result)


CONVENTION = (
    "A comparison puts ours beside an alternative measured in the same",
    "run, and its ratio is always **ours ÷ alternative**. **better when** says which way the",
    "figure is good: `lower` (times, memory, max/mean, padding, errors) means a ratio below 1 has",
    "ours ahead, `higher` (rates such as samples/s) a ratio above 1. **today** is the same loader",
    "without balancing: samples in the order they come, consecutive ones to each rank. A target is",
    "judged on the ratio unless it says *(on ours)*; its text is the benchmark's own. Figures with",
    "no alternative (a fit's R², its error, a padding fraction, a planning time) are in a",
    "**figures** table of their own, and the at-a-glance **headline** is one figure per benchmark:",
    "its first comparison with a target.",
)

HOW = """Each benchmark (`python -m scripts.bench.NAME`) measures ours and the alternative side by side in
one run and writes its figures as JSON with `--json`. To fill this page:

```bash
# illustrative: each benchmark takes minutes (balance --quick: seconds)
.venv/bin/python -m scripts.bench.balance --train --json bench-balance.json
.venv/bin/python -m scripts.bench.loader --json bench-loader.json
.venv/bin/python -m scripts.bench.restore --json bench-restore.json
.venv/bin/python -m scripts.bench.scale --json bench-scale.json
.venv/bin/python -m scripts.bench.convert --json bench-convert.json
.venv/bin/python -m scripts.bench.video --json bench-video.json
.venv/bin/python -m scripts.bench.trace --json bench-trace.json
.venv/bin/python -m scripts.bench.mesh3d --json bench-3d.json
.venv/bin/python -m scripts.bench.lengths --json bench-lengths.json
.venv/bin/python -m scripts.bench.mixing --json bench-mixing.json
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
    folded = ['??? info "How to read the tables"', "", *("    " + x for x in CONVENTION), ""]
    if not runs:
        lines += [*folded, "No benchmark JSON was found when this page was rendered.", "", HOW]
        return "\n".join(lines)
    lines += ["## At a glance", "", *at_a_glance(runs), *folded]
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
    try:
        page = render(runs, args.out.parent / "assets" / "measurements")
    except Unclear as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with write_atomic(args.out) as tmp:
        tmp.write_text(page)
    print(f"wrote {args.out} ({len(runs)} benchmark{'s' if len(runs) != 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
