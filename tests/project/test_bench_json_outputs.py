"""Every benchmark's ``--json PATH`` follows the output rule: a file that is not a benchmark's JSON
is refused before any work (one line, exit status 2, nothing changed); a benchmark's JSON is
replaced whole."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from scripts.bench.common import check_json_out, write_json
from tests.helpers import REPO

#: every benchmark that takes ``--json`` (the balance package's runner holds its options)
BENCHMARKS = sorted(
    p
    for p in [*REPO.glob("scripts/bench/*.py"), REPO / "scripts/bench/balance/runner.py"]
    if '"--json"' in p.read_text() and p.name != "common.py"
)


def test_there_are_benchmarks_to_check():
    assert len(BENCHMARKS) >= 10, BENCHMARKS


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_each_benchmark_checks_its_json_before_the_run_and_writes_it_through_write_json(script):
    tree = ast.parse(script.read_text())
    calls = [
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    ]
    assert "check_json_out" in calls and "write_json" in calls, script
    writes = [
        ast.unparse(n)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("write_text", "write_bytes")
        and "args.json" in ast.unparse(n.func.value)
    ]
    assert not writes, writes  # --json written past the rule


def test_a_users_file_is_refused_in_one_line_and_left_as_it_was(tmp_path):
    mine = tmp_path / "results.json"
    mine.write_text('{"my": "notes"}')
    r = subprocess.run(
        [sys.executable, "-m", "scripts.bench.cli", "--repeat", "1", "--json", str(mine)],
        capture_output=True,
        cwd=REPO,
        text=True,
        timeout=120,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "is not a benchmark JSON" in lines[0] and not r.stdout, r.stdout
    assert mine.read_text() == '{"my": "notes"}'


def test_a_benchmarks_json_is_replaced_whole_and_a_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "bench.json"
    write_json(out, {"date": "then", "figure": 1})
    assert check_json_out(out) == out
    write_json(out, {"date": "now", "figure": 2})
    assert json.loads(out.read_text()) == {"date": "now", "figure": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]  # no temporary left
    with pytest.raises(SystemExit) as refused:
        check_json_out(tmp_path)
    assert refused.value.code == 2 and "a folder" in capsys.readouterr().err
    assert check_json_out(None) is None
