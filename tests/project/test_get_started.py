"""docs/get-started.md's "your own data" commands, run as written: every ```bash block whose
first line says it is run by this file runs in a folder holding the page's tiny ``photos/``
folder, and its standard output is the ```text block the page shows right after it (the page
writes the folder as /home/me/work)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from PIL import Image

from tests.helpers import REPO

PAGE = REPO / "docs" / "get-started.md"
MARK = "# run by tests/project/test_get_started.py"
SHOWN_FOLDER = "/home/me/work"  #: the folder the page's outputs name
COLOURS = ("red", "green", "blue", "yellow", "purple", "orange", "white", "black")


def make_photos(root: Path) -> None:
    """The page's ``photos/``: eight one-colour JPEGs, every other one in ``beach/`` with a
    ``.json`` caption, the rest beside a two-line ``.txt``."""
    (root / "beach").mkdir(parents=True)
    for i, colour in enumerate(COLOURS):
        folder = root / "beach" if i % 2 else root
        Image.new("RGB", (64, 48), colour).save(folder / f"{colour}.jpg")
        if i % 2:
            (folder / f"{colour}.json").write_text(json.dumps({"caption": f"a {colour} picture"}))
        else:
            (folder / f"{colour}.txt").write_text(f"a {colour} picture\nplain {colour}\n")


def commands_and_outputs() -> list[tuple[str, str]]:
    """(commands, shown output) of each marked ```bash block and the ```text block after it."""
    pairs = re.findall(
        r"```bash\n(" + re.escape(MARK) + r".*?)```\s*```text\n(.*?)```", PAGE.read_text(), re.S
    )
    return [(commands, shown) for commands, shown in pairs]


def test_the_page_runs_a_folder_conversion_info_and_the_output_tree():
    commands = "\n".join(c for c, _ in commands_and_outputs())
    for needed in ("convert folder", "--image-format keep", "info shards/photos", "find "):
        assert needed in commands, f"get-started.md runs no {needed!r} under {MARK!r}"


def test_get_started_commands_print_what_the_page_shows(tmp_path):
    make_photos(tmp_path / "photos")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    for commands, shown in commands_and_outputs():
        r = subprocess.run(
            ["bash", "-e", "-c", commands],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, f"{commands}\n{r.stderr[-3000:]}"
        printed = r.stdout.replace(str(tmp_path), SHOWN_FOLDER)
        assert printed.strip() == shown.strip(), f"{commands}\nprinted:\n{printed}"
