"""The reference trainer's ``log.jsonl`` as the check reads it: complete lines only, rows by step."""

from __future__ import annotations

import json
from pathlib import Path


def complete_lines(path: Path) -> list[bytes]:
    """The newline-terminated lines of ``path`` (a last line still being written, or cut by a kill,
    is not one yet; the trainer drops such a line when it appends again)."""
    return path.read_bytes().split(b"\n")[:-1] if path.is_file() else []


def read_log(path: Path, skip_lines: int = 0) -> dict[int, dict]:
    """Rows by step, in the order logged, from complete line ``skip_lines`` on; a step logged
    twice keeps the last."""
    rows = {}
    for line in complete_lines(path)[skip_lines:]:
        if line.strip():
            row = json.loads(line)
            rows[row["step"]] = row
    return rows


def count_lines(path: Path) -> int:
    return len(complete_lines(path))
