"""docs/get-started.md's commands, run as printed, as a new user would type them: every ```bash
block whose first line says it is run by this file runs, in the page's order, in one fresh shell
(``bash --noprofile --norc`` with an empty environment but ``HOME`` and a system ``PATH``) started
in a home folder that holds the clone (``energon-platform/``, its ``.venv`` the one running this
test) and ``work/photos/``, the page's tiny picture folder; each block's standard output is the
```text block the page shows right after it (the page writes the home folder as /home/me)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from PIL import Image

from tests.helpers import REPO

PAGE = REPO / "docs" / "get-started.md"
MARK = "# run by tests/project/test_get_started.py"
SHOWN_HOME = "/home/me"  #: the home folder the page's outputs name
#: what the fresh shell prints between two blocks' outputs
BETWEEN = "=== the next block of docs/get-started.md ==="
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


def fresh_home(home: Path) -> None:
    """``home`` as the page has it: the clone (here only its ``.venv``: the environment running
    this test) and ``work/photos``."""
    venv = Path(sys.prefix)
    assert (venv / "bin" / "activate").is_file(), f"the tests run from a venv (make test): {venv}"
    (home / "energon-platform").mkdir(parents=True)
    (home / "energon-platform" / ".venv").symlink_to(venv)
    make_photos(home / "work" / "photos")


def test_the_page_starts_from_the_clone_activates_and_runs_the_command():
    first = commands_and_outputs()[0][0]
    assert ". energon-platform/.venv/bin/activate" in first and "energon-platform --" in first


def test_get_started_commands_print_what_the_page_shows(tmp_path):
    fresh_home(tmp_path)
    pairs = commands_and_outputs()
    script = f"\necho '{BETWEEN}'\n".join(commands for commands, _ in pairs)
    r = subprocess.run(
        ["bash", "--noprofile", "--norc", "-e", "-c", script],
        cwd=tmp_path,
        env={"HOME": str(tmp_path), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, f"{script}\n{r.stderr[-3000:]}"
    printed = r.stdout.replace(str(tmp_path), SHOWN_HOME).split(BETWEEN + "\n")
    assert len(printed) == len(pairs), r.stdout[-2000:]
    for (commands, shown), out in zip(pairs, printed):
        assert out.strip() == shown.strip(), f"{commands}\nprinted:\n{out}"


def test_without_activating_a_fresh_shell_does_not_find_the_command(tmp_path):
    """What the page says a new user sees before activating (and the FAQ answers)."""
    fresh_home(tmp_path)
    r = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", "energon-platform --version"],
        cwd=tmp_path,
        env={"HOME": str(tmp_path), "PATH": "/usr/local/bin:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 127 and "energon-platform: command not found" in r.stderr, r.stderr
    assert "energon-platform: command not found" in PAGE.read_text()


def test_make_without_the_python_it_needs_says_how_to_name_another(tmp_path):
    """The FAQ's first-hour entry quotes what ``make`` prints when ``python3.11`` is missing: the
    repository's Makefile, run in a copy where the Python it is told to use does not exist."""
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    r = subprocess.run(
        ["make", "PY=python3.11-nowhere", "venv"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and not (tmp_path / ".venv").exists(), r.stdout + r.stderr
    assert "need python3.11-nowhere on PATH (or make PY=python3)" in r.stdout + r.stderr
    faq = (REPO / "docs" / "faq.md").read_text()
    for entry in (
        "need python3.11 on PATH (or make PY=python3)",
        "energon-platform: command not found",
        "building DeepSpeed",
    ):
        assert entry in faq, f"the FAQ has no first-hour entry for {entry!r}"
