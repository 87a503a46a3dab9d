"""``verify`` and ``info`` on damaged datasets, and every inspecting command on a path that is not
there: each names what is wrong (the file the loader needs, the report's missing section, the
missing path)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from energon_platform.cli import main as cli_main
from tests.helpers.cli import one_line_error, run_cli
from tests.helpers.corpora import numbered_docs as docs


@pytest.mark.parametrize("command", ["info", "verify", "preview"])
def test_a_path_that_does_not_exist_is_not_called_a_dataset_to_convert(tmp_path, capsys, command):
    """M13: ``info does/not/exist`` said "not an Energon dataset"."""
    missing = str(tmp_path / "does" / "not" / "exist")
    extra = ["--out", str(tmp_path / "sheet.png")] if command == "preview" else []
    assert cli_main([command, missing, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and err[0].endswith(f"{missing}: no such file or folder")
        or (command == "preview" and "no such run config, dataset or metadataset" in err[0])
    ), err


# ---------------------------------------------------------------- 3: verify checks what the loader reads


@pytest.fixture(scope="module")
def text_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("text_ds")
    out = root / "ds"
    r = run_cli(
        "convert",
        "text",
        "--manifest",
        docs(root / "docs.jsonl", 12),
        "--out",
        out,
        "--samples-per-shard",
        "5",
        "--no-progress",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize(
    "gone",
    [
        "train/shard-000001.tar.idx",
        ".nv-meta",
        ".nv-meta/split.yaml",
        ".nv-meta/index.sqlite",
        ".nv-meta/dataset.yaml",
        ".nv-meta/index.uuid",
    ],
)
def test_verify_names_each_missing_file_the_loader_needs(text_dataset, tmp_path, capsys, gone):

    ds = tmp_path / "ds"
    shutil.copytree(text_dataset, ds)
    assert cli_main(["verify", str(ds), "--no-progress"]) == 0
    capsys.readouterr()
    target = ds / gone
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    assert cli_main(["verify", str(ds), "--no-progress"]) == 1
    out = capsys.readouterr().out
    named = [
        line.split(": ", 1)[1]
        for line in out.splitlines()
        if line.startswith("  missing (the loader needs it)")
    ]
    assert named and all(n == gone or n.startswith(gone + "/") for n in named), out
    assert "file(s) the loader needs missing" in out.splitlines()[-1]


# ---------------------------------------------------------------- 11: info on a damaged report


@pytest.mark.parametrize("drop", ["totals", "shards", "splits"])
def test_info_with_a_report_missing_a_section_is_one_line(text_dataset, tmp_path, drop):

    ds = tmp_path / "ds"
    shutil.copytree(text_dataset, ds)
    report = json.loads((ds / "report.json").read_text())
    del report[drop]
    (ds / "report.json").write_text(json.dumps(report))
    r = run_cli("info", ds, timeout=120)
    assert one_line_error(r) and "report.json: corrupt conversion report" in r.stderr, r.stderr
