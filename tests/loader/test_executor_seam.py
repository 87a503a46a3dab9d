"""The executor seam holds: no module of ``energon_platform/`` drives torch's ``DataLoader`` internals
or inspects its callers' frames, and the train loader stays one short module."""

from __future__ import annotations

import re

from tests.helpers import REPO

#: torch DataLoader internals the loader used to drive, and frame inspection (whole names only)
FORBIDDEN = re.compile(
    r"(?<![A-Za-z0-9_])_(?:iter|workers|shutdown_workers|getframe)(?![A-Za-z0-9_])"
    r"|DataLoader timed out"
)


def offenders(root, base=REPO) -> list[str]:
    """``path:line: text`` (path relative to ``base``) of each line under ``root`` naming a
    `FORBIDDEN` name."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if FORBIDDEN.search(line):
                out.append(f"{path.relative_to(base)}:{number}: {line.strip()}")
    return out


def test_no_module_names_torch_dataloader_internals_or_frames():
    assert offenders(REPO / "energon_platform") == []


def test_the_rule_sees_each_name_as_a_whole_word(tmp_path):
    (tmp_path / "a.py").write_text(
        "w = it._iter._workers[0].pid\nit._shutdown_workers()\nf = sys._getframe(2)\n"
        "ok = num_workers + self._iterations + my_iter\n"
        "if str(e).startswith('DataLoader timed out'): pass\n"
    )
    found = [line.split(": ", 1)[0].rsplit(":", 1)[1] for line in offenders(tmp_path, tmp_path)]
    assert found == ["1", "2", "3", "5"]


def test_train_loader_is_at_most_300_lines():
    lines = (REPO / "energon_platform/loader/train_loader.py").read_text().count("\n")
    assert lines <= 300, f"train_loader.py has {lines} lines"
