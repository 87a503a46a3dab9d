"""What the benchmarks share: the repository's path, timing, and what every benchmark records
about its run (date, machine and load average, before and after).

The measurements page (``scripts/render_measurements.py``) shows the record next to each
benchmark's figures: on a shared machine the load average tells a quiet run from a disturbed one.

``--json PATH`` follows the output rule of every command that writes (`check_json_out` before the
run, `write_json` at its end): a new file, or a benchmark's JSON it replaces whole; any other
file is refused before any work, nothing changed."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from storage.outputs import OutputError, check_file, write_atomic

#: the repository's root: the benchmarks run from here (``python -m scripts.bench.NAME``), and so
#: do the child processes they start (``cwd=REPO``)
REPO = Path(__file__).resolve().parents[2]


def timings(fn: Callable[[], object], repeat: int) -> list[float]:
    """Wall seconds of each of ``repeat`` calls of ``fn`` (``time.perf_counter``), in order."""
    seconds = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - began)
    return seconds


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """The shortest wall time, in seconds, of ``repeat`` calls of ``fn``."""
    return min(timings(fn, repeat))


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded to 2 decimals."""
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    """``platform``, ``python``, ``processor`` and ``cpus``: the machine a benchmark ran on."""
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }


def run_record() -> dict:
    """``date`` (UTC, ISO), ``machine`` (:func:`machine`) and ``load_before``: the start of a
    benchmark's JSON; call :func:`finish_record` when the measuring is done."""
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_before": load_average(),
    }


def finish_record(result: dict) -> dict:
    """``result`` with ``load_after`` set to the load average now; returns it."""
    result["load_after"] = load_average()
    return result


def command() -> str:
    """How the running benchmark was started, for its error lines: ``python -m scripts.bench.NAME``
    when run as a module (a package's ``__main__`` named by its package), else the script's name."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if spec is None:
        return Path(sys.argv[0]).name
    return f"python -m {spec.name.removesuffix('.__main__')}"


def _is_bench_json(path: Path) -> bool:
    """Whether ``path`` holds a benchmark's JSON: an object with the date of its run (every
    benchmark records one, `run_record`)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and "date" in data


def check_json_out(path: str | Path | None) -> Path | None:
    """``--json PATH`` checked before the benchmark runs: new, or a benchmark's JSON; otherwise one
    line on stderr and exit status 2 (`storage.outputs.check_file`). None when not given."""
    if path is None:
        return None
    try:
        return check_file(
            path, _is_bench_json, "benchmark JSON", flag="--json", example="bench.json"
        )
    except OutputError as e:
        print(f"{command()}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def write_json(path: str | Path | None, result: dict, indent: int = 1) -> None:
    """``result`` written to ``path`` whole (a temporary file renamed over it), then its name
    printed; nothing when ``path`` is None."""
    if path is None:
        return
    with write_atomic(path) as tmp:
        tmp.write_text(json.dumps(result, indent=indent) + "\n")
    print(f"wrote {path}")
