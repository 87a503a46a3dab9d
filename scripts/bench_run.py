"""What every benchmark records about its run: date, machine and load average, before and after.

The measurements page (``scripts/render_measurements.py``) shows these next to each benchmark's
figures: on a shared machine the load average tells a quiet run from a disturbed one."""

from __future__ import annotations

import os
import platform
from datetime import datetime, timezone


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded to 2 decimals."""
    return [round(x, 2) for x in os.getloadavg()]


def run_record() -> dict:
    """``date`` (UTC, ISO), ``machine`` (platform, python, processor, cpus) and ``load_before``:
    the start of a benchmark's JSON; call :func:`finish_record` when the measuring is done."""
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        },
        "load_before": load_average(),
    }


def finish_record(result: dict) -> dict:
    """``result`` with ``load_after`` set to the load average now; returns it."""
    result["load_after"] = load_average()
    return result
