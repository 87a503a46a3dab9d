"""The online-mixing part of ``make demo`` (``scripts/demo.py``'s ``mixing_run``) runs the
three-modality blend with ``loader.blend_adapt`` as a run config writes it: the weights it prints
move between the first and the last step, and its report draws them."""

from __future__ import annotations

import pytest

from scripts.bench.data import three_modality_blend
from tests.helpers.cli import run_python

LOOP = "from pathlib import Path; from scripts import demo; "


@pytest.mark.slow
def test_demo_mixing_run_moves_the_weights_and_draws_them(tmp_path_factory, tmp_path):
    blend = three_modality_blend(tmp_path_factory.mktemp("demo-mixing"))
    code = LOOP + f"demo.mixing_run(Path({str(tmp_path)!r}), Path({str(blend)!r}), steps=10)"
    done = run_python(code, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    first, last = [line for line in done.stdout.splitlines() if "  weights  " in line]
    assert first.split()[1] == "1" and last.split()[1] == "10", done.stdout
    assert first.split("weights")[1] != last.split("weights")[1]
    assert 'id="chart-mixing"' in (tmp_path / "mixing" / "report.html").read_text()
