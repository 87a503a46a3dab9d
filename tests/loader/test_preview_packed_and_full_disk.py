"""``preview`` of packed text, and its failures in one line: a dataset whose encoder packs is drawn
as one pack group of ``--n`` samples (it was asked for ``--n`` groups of the whole packing buffer,
and told to lower ``--n`` whatever it was); a refusal keeps its own cause's words; a full disk
(ENOSPC injected into the sheet's write) is one line and leaves ``--out`` as it was."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from PIL import Image

from energon_platform.tools.preview import is_sheet, preview
from tests.helpers.cli import one_line_error, one_line_error_in_process, run_cli
from tests.helpers.run_configs import run_config, write_config

# --- packed text ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [4, 16])
def test_a_packed_text_dataset_is_drawn_for_any_n_it_holds(text_mini, tmp_path, n):
    """M1: ``preview out/demo/text --n N`` failed for every N with "pass --n 86 or fewer" (a
    global batch of N packs of 512 samples each)."""
    info = preview(text_mini, tmp_path / "text.png", n=n)
    assert info["documents"] == n and is_sheet(tmp_path / "text.png")
    with Image.open(info["path"]) as im:
        assert im.height >= n * 96


def test_the_cli_draws_packed_text_and_names_n_only_when_n_is_the_cause(text_mini, tmp_path):
    r = run_cli("preview", text_mini, "--out", tmp_path / "a.png", "--n", 4, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith(f"{tmp_path / 'a.png'}: 4 documents"), r.stderr
    r = run_cli("preview", text_mini, "--out", tmp_path / "b.png", "--n", 87, timeout=300)
    one_line_error(r, "--n: 87 documents, but a dataset has 86 samples", "pass --n 86 or fewer")
    assert not (tmp_path / "b.png").exists()


def test_a_run_configs_own_batch_too_large_keeps_its_own_words(text_mini, tmp_path, capsys):
    """A run config's packed global batch (4 packs of 512 samples) larger than its dataset: the
    planner's refusal as it is, not a hint about ``--n`` that would change nothing."""
    config = run_config(text_mini, {"encoder": "text"}, loader={"global_batch_size": 4})
    path = write_config(tmp_path / "run.yaml", config)
    for n in ("2", "16"):
        line = one_line_error_in_process(
            capsys,
            ["preview", path, "--out", tmp_path / "s.png", "--n", n],
            "has 86 samples, but its share of a global batch of 2048 samples",
        )
        assert "--n" not in line
    assert not (tmp_path / "s.png").exists()


# --- a full disk ---------------------------------------------------------------------------------


def full_disk(monkeypatch) -> None:
    """From now on every picture write fails as a full disk makes it fail: some bytes, then
    ENOSPC."""

    def save(image, fp, format=None, **params):
        Path(fp).write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", save)


def test_a_full_disk_is_one_line_and_leaves_no_sheet(
    image_text_shards, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "sheets" / "s.png"
    full_disk(monkeypatch)
    line = one_line_error_in_process(
        capsys,
        ["preview", image_text_shards, "--out", out, "--n", 2],
        f"--out {out}: cannot write the contact sheet (No space left on device)",
    )
    assert line.startswith("energon-platform preview: error: ")
    assert sorted(p.name for p in out.parent.iterdir()) == []  # no sheet, no temporary file


def test_a_full_disk_leaves_the_previous_sheet_as_it_was(
    image_text_shards, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "s.jpg"
    preview(image_text_shards, out, n=2)
    before = out.read_bytes()
    full_disk(monkeypatch)
    one_line_error_in_process(
        capsys,
        ["preview", image_text_shards, "--out", out, "--n", 3],
        "No space left on device",
        "nothing was written there",
    )
    assert out.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["s.jpg"]
