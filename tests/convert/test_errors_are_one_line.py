"""A user's mistake in a conversion is one line and exit status 2, never a traceback (6); the
input options' ``--help`` says what each one is.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.convert.test_convert import convert
from tests.helpers.cli import one_line_error, run_cli
from tests.helpers.corpora import folder_corpus, make_coco

# ---------------------------------------------------------------- 6: one line and exit 2


def test_unusable_out_gives_one_line(tmp_path):
    images = folder_corpus(tmp_path / "raw")
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for out, expected in ((a_file, "not a folder"), ("/sys/energon-platform-test", "--out")):
        r = run_cli("convert", "folder", "--root", images, "--out", out, "--no-progress")
        assert one_line_error(r) and expected in r.stderr, r.stderr
    assert a_file.read_text() == "x"


def test_read_only_out_gives_one_line(tmp_path, monkeypatch, capsys):
    import errno

    from energon_platform.cli import main

    real_mkdir = Path.mkdir

    def read_only(self, *a, **kw):
        if str(self).startswith(str(tmp_path / "ro")):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *a, **kw)

    monkeypatch.setattr(Path, "mkdir", read_only)
    root = folder_corpus(tmp_path / "raw")
    assert (
        main(
            [
                "convert",
                "folder",
                "--root",
                str(root),
                "--out",
                str(tmp_path / "ro" / "out"),
                "--no-progress",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "Read-only file system" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("field", ["images", "annotations"])
def test_coco_null_lists_give_one_line(tmp_path, field):
    ann, images, _ = make_coco(tmp_path / "raw", n_good=2)
    doc = json.loads(ann.read_text())
    doc[field] = None
    ann.write_text(json.dumps(doc))
    r = run_cli(
        "convert", "coco", "--annotations", ann, "--images", images, "--out", tmp_path / "o"
    )
    assert one_line_error(r) and "not a COCO captions file" in r.stderr and field in r.stderr
    assert not (tmp_path / "o").exists()


def test_unreachable_ray_address_fails_fast(tmp_path):
    root = folder_corpus(tmp_path / "raw")
    start = time.monotonic()
    r = run_cli(
        "convert",
        "folder",
        "--root",
        root,
        "--out",
        tmp_path / "o",
        "--no-progress",
        "--executor",
        "ray",
        "--ray-address",
        "127.0.0.1:1",
        timeout=90,
    )
    assert time.monotonic() - start < 30
    assert one_line_error(r) and "--ray-address" in r.stderr and "cannot reach" in r.stderr
    assert not (tmp_path / "o").exists()


def test_info_on_corrupt_metadata_gives_one_line(tmp_path):
    out = tmp_path / "out"
    convert("folder", out, reader={"root": str(folder_corpus(tmp_path / "raw"))})
    (out / ".nv-meta" / ".info.json").write_text("{not json")
    r = run_cli("info", out)
    assert one_line_error(r) and "corrupt dataset metadata" in r.stderr


# ---------------------------------------------------------------- 12: --help


def test_root_and_manifest_have_help():
    for kind, arg in (
        ("folder", "--root"),
        ("librispeech", "--root"),
        ("audio-manifest", "--manifest"),
    ):
        r = run_cli("convert", kind, "--help")
        options = r.stdout.split("\n\n", 1)[1]  # after the usage lines
        line = next(ln for ln in options.splitlines() if ln.strip().startswith(arg))
        assert len(line.split()) > 2, (kind, line)  # more than "--root ROOT"
