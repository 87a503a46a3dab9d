"""What the ``energon-platform`` command costs before it does anything: its rooms imported when a
command runs (ours) against every room imported up front.

Each figure is the best of ``--repeat`` fresh processes:

- ``--help``: ``energon-platform --help`` as shipped;
- a usage error: ``energon-platform train`` without ``--config`` (argparse's one line, exit 2);
- the alternative: a process importing ``energon_platform.cli`` and every module its ``cmd_*``
  functions import (read from the CLI's own source, so the list follows the code).

    .venv/bin/python -m scripts.bench.cli [--json bench-cli.json]   # illustrative
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

from scripts.bench.common import (
    REPO,
    best_of,
    check_json_out,
    finish_record,
    run_record,
    write_json,
)

CLI = REPO / "energon_platform" / "cli"
#: ``--help`` within this many seconds (what a user waits for before reading the options)
HELP_LIMIT_S = 1.0


def command_rooms() -> list[str]:
    """The modules the CLI's functions import when a command runs, sorted."""
    found = set()
    for path in CLI.glob("*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                        found.add(node.module)
    return sorted(found)


def best_seconds(argv: list[str], repeat: int) -> float:
    """The shortest wall time of ``repeat`` runs of ``argv`` (its exit status ignored)."""
    return round(best_of(lambda: subprocess.run(argv, cwd=REPO, capture_output=True), repeat), 4)


def measure(repeat: int) -> dict:
    python = sys.executable
    cli = [python, "-m", "energon_platform"]
    rooms = command_rooms()
    eager = "import energon_platform.cli\n" + "".join(f"import {m}\n" for m in rooms)
    result = {
        "help_s": best_seconds([*cli, "--help"], repeat),
        "usage_error_s": best_seconds([*cli, "train"], repeat),
        "eager_import_s": best_seconds([python, "-c", eager], repeat),
        "rooms": rooms,
    }
    result["eager_over_help"] = round(result["eager_import_s"] / result["help_s"], 2)
    result["targets"] = [
        {
            "target": f"energon-platform --help <= {HELP_LIMIT_S} s",
            "value": result["help_s"],
            "met": result["help_s"] <= HELP_LIMIT_S,
        }
    ]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m scripts.bench.cli", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--repeat", type=int, default=5, help="fresh processes per figure (default 5)")
    ap.add_argument("--json", type=Path, metavar="PATH", help="write every figure as JSON here")
    args = ap.parse_args()
    check_json_out(args.json)  # before any work: new, or a benchmark JSON
    result = {**run_record(), "settings": {"repeat": args.repeat}}
    result.update(measure(args.repeat))
    finish_record(result)
    print(f"{'start-up':40} {'seconds':>8}")
    print(f"{'energon-platform --help':40} {result['help_s']:>8}")
    print(f"{'energon-platform train (usage error)':40} {result['usage_error_s']:>8}")
    print(f"{'every room imported up front':40} {result['eager_import_s']:>8}")
    print(f"up front ÷ --help: {result['eager_over_help']}x ({len(result['rooms'])} modules)")
    write_json(args.json, result)


if __name__ == "__main__":
    main()
