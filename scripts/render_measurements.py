"""Render the benchmarks' JSON results into ``docs/measurements.md``: measurements are generated, never typed.

    python scripts/render_measurements.py [JSON ...] [--out docs/measurements.md]

Inputs: the files named, or else every ``bench-*.json`` in the repository root and in ``out/``
(``scripts/bench_NAME.py --json bench-NAME.json`` writes one). The benchmark's name is the file's
(``bench-NAME.json`` or ``bench_NAME.json``); when several files name one benchmark, the newest run
(its ``date``, else the file's modification time) is shown: the page holds one run per benchmark,
not a history.

Per benchmark the page shows the run's date, machine and load average (as recorded in the JSON;
the file's modification time when it records no date), the targets it states (``targets``: lists of
``{"target", "value", "met"}``) and every ratio it reports (keys containing ``ratio``, ``_over_``,
``/``, ``÷`` or ``speedup``), then all its other figures in a collapsed block. With no JSON the page
says how to produce it. Exit status: 0, or 2 with one line for an unreadable file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RATIO = re.compile(r"ratio|_over_|/|÷|speedup", re.I)
SKIP = {"settings", "config", "machine", "date", "load_before", "load_after", "targets"}
MAX_ROWS = 200


def find_inputs(paths: list[Path]) -> list[Path]:
    """The files named, or every ``bench-*.json`` in the repository root and ``out/``."""
    if paths:
        return paths
    return sorted({*REPO.glob("bench-*.json"), *(REPO / "out").glob("bench-*.json")})


def bench_name(path: Path) -> str:
    """``bench-balance.json`` → ``balance``; any other name → its stem."""
    return re.sub(r"^bench[-_]", "", path.stem)


def run_date(result: dict, path: Path) -> str:
    if isinstance(result.get("date"), str):
        return result["date"]
    mtime = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat(timespec="seconds")
    return f"{mtime} (file written)"


def newest_per_benchmark(paths: list[Path]) -> dict[str, tuple[Path, dict]]:
    """One run per benchmark: the newest by date."""
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


def label(item: object, index: int) -> str:
    """A list element's name: its short text/integer fields (``cost=tokens ranks=8``), else its index."""
    if isinstance(item, dict):
        parts = [
            f"{k}={v}"
            for k, v in item.items()
            if isinstance(v, (str, int)) and not isinstance(v, bool) and len(str(v)) <= 24
        ]
        if parts:
            return "[" + " ".join(parts[:4]) + "]"
    return f"[{index}]"


def leaves(node: object, path: str = "") -> list[tuple[str, object]]:
    """Every scalar of ``node`` with its dotted path (lists of dicts labelled by :func:`label`)."""
    if isinstance(node, dict):
        out = []
        for k, v in node.items():
            out += leaves(v, f"{path}.{k}" if path else str(k))
        return out
    if isinstance(node, list):
        if (
            all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in node)
            and len(node) <= 8
        ):
            return [(path, ", ".join(fmt(x) for x in node))]
        out = []
        for i, x in enumerate(node):
            out += leaves(x, f"{path}{label(x, i)}")
        return out
    return [(path, node)]


def fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def targets(node: object) -> list[dict]:
    """Every ``{"target", "value", "met"}`` found under a ``targets`` key."""
    found = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "targets" and isinstance(v, list):
                found += [t for t in v if isinstance(t, dict) and "target" in t]
            else:
                found += targets(v)
    elif isinstance(node, list):
        for x in node:
            found += targets(x)
    return found


def machine(result: dict) -> str:
    m = result.get("machine")
    if isinstance(m, dict):
        return ", ".join(f"{k} {v}" for k, v in m.items())
    if isinstance(m, str):
        return m
    config = result.get("config") if isinstance(result.get("config"), dict) else {}
    cpus = result.get("cpus") or config.get("cpus")
    return f"{cpus} CPUs" if cpus else "not recorded"


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows[:MAX_ROWS]]
    if len(rows) > MAX_ROWS:
        lines.append(f"| ... {len(rows) - MAX_ROWS} more in the JSON |" + " |" * (len(header) - 1))
    return lines


def section(name: str, path: Path, result: dict) -> list[str]:
    load = " / ".join(
        ", ".join(map(fmt, result[k])) if isinstance(result[k], list) else fmt(result[k])
        for k in ("load_before", "load_after")
        if result.get(k) is not None
    )
    lines = [
        f"## {name}",
        "",
        f"`scripts/bench_{name}.py`, run of {run_date(result, path)} (`{path.name}`).",
        "",
        f"- machine: {machine(result)}",
        f"- load average (1, 5, 15 min) before / after: {load or 'not recorded'}",
    ]
    settings = (
        result.get("settings") if isinstance(result.get("settings"), dict) else result.get("config")
    )
    if isinstance(settings, dict):
        lines.append("- settings: " + ", ".join(f"`{k}={fmt(v)}`" for k, v in settings.items()))
    lines.append("")
    tg = targets(result)
    if tg:
        lines += ["**Targets**", ""]
        lines += table(
            ("target", "value", "met"),
            [
                (fmt(t["target"]), fmt(t.get("value")), "yes" if t.get("met") else "**no**")
                for t in tg
            ],
        )
        lines.append("")
    body = {k: v for k, v in result.items() if k not in SKIP}
    figures = leaves(body)
    ratios = [(p, v) for p, v in figures if RATIO.search(re.sub(r"\[.*?\]", "", p))]  # labels aside
    if ratios:
        lines += (
            ["**Ratios**", ""]
            + table(("figure", "value"), [(f"`{p}`", fmt(v)) for p, v in ratios])
            + [""]
        )
    others = [(p, v) for p, v in figures if (p, v) not in ratios]
    if others:
        lines += ['??? note "All figures of this run"', ""]
        lines += [
            "    " + line
            for line in table(("figure", "value"), [(f"`{p}`", fmt(v)) for p, v in others])
        ]
        lines.append("")
    return lines


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


def render(runs: dict[str, tuple[Path, dict]]) -> str:
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
    for name, (path, result) in runs.items():
        lines += section(name, path, result)
    lines += ["## Producing these figures", "", HOW]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "json",
        nargs="*",
        type=Path,
        help="benchmark JSON files (default: bench-*.json in the repo root and out/)",
    )
    p.add_argument(
        "--out", type=Path, default=REPO / "docs" / "measurements.md", help="the page to write"
    )
    args = p.parse_args(argv)
    missing = [str(x) for x in args.json if not x.is_file()]
    if missing:
        print(f"error: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        runs = newest_per_benchmark(find_inputs(args.json))
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(runs))
    print(f"wrote {args.out} ({len(runs)} benchmark{'s' if len(runs) != 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
