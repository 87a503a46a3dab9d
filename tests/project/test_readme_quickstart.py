"""The README's quickstart: its train, kill and resume lines (steps 2 to 4), run as written on a
small config, kill the run while it trains and resume it to the end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.helpers.run_configs import run_config, write_config

STEPS = 40  #: the reference config's train.steps


def quickstart_lines(start: str, stop: str) -> list[str]:
    """The lines of the README's quickstart block from the comment starting ``start`` up to the
    one starting ``stop``."""
    block = re.search(
        r"## Quickstart\n\n```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S
    ).group(1)
    lines = block.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(start))
    last = next(i for i, line in enumerate(lines) if line.startswith(stop))
    return lines[first:last]


@pytest.mark.slow
def test_the_quickstart_kills_its_run_mid_run_and_resumes_it(coco, tmp_path):
    config = tmp_path / "run.yaml"
    data = {"path": str(coco), "val_split": None}
    write_config(config, run_config(data, train={"steps": STEPS, "checkpoint_every": 10}))
    script = "\n".join(quickstart_lines("# 2.", "# 5.")).replace(
        "configs/train_image_text.yaml", str(config)
    )
    assert "kill -9" in script and "--resume" in script, script
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "out/qs/log.jsonl").read_text().splitlines()]
    # a fresh run logs 0
    resumed = next((i for i, row in enumerate(rows) if row.get("resumed_from")), None)
    assert resumed is not None, (
        f"no resumed run in the log: the kill found the run ended ({r.stderr[-500:]})"
    )
    killed_run = [row["step"] for row in rows[:resumed]]
    # killed while it trained, not after
    assert 20 in killed_run and max(killed_run) < STEPS, killed_run
    assert rows[resumed]["resumed_from"] in (10, 20) and rows[-1]["step"] == STEPS
