"""docs/encoders.md, "Adding a modality": its "Using it" and "Reaching a model" code runs as
written and ends; its config block is the shipped file; the `module:` rule and error it states
hold; the reference models ignore fields they do not know; preview names the fields it cannot
draw. And over the docs pages: code lines fit in 100 columns, powers are written in Unicode."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from task_encoders.config_parser import ConfigError
from task_encoders.registry import available, encoder_class, get_encoder
from tests.helpers import REPO

DOCS = REPO / "docs"
ENCODERS_PAGE = DOCS / "encoders.md"
WAVEFORM_CONFIG = REPO / "configs" / "encoders" / "waveform_text.yaml"
MAX_CODE_COLUMNS = 100
#: Pages whose code blocks are generated from other sources, not written here.
GENERATED = {"measurements.md": "rendered from benchmark JSON by scripts/render_measurements.py"}
#: (page, block language) pairs whose lines are not wrapped by hand, and why.
UNWRAPPED_BLOCKS = {
    ("reference/cli.md", "text"): "the CLI's --help text, generated from its argparse parser",
}
#: block languages drawn rather than shown as code (a diagram's source lines may be long)
DRAWN = {"mermaid"}


def section(text: str, title: str) -> str:
    """The part of a Markdown page under the heading ``title`` (any level), up to the next heading
    of the same or a higher level (``#`` lines inside code blocks are not headings);
    ``ValueError`` when the page has no such heading."""
    lines, level, start, in_code = text.splitlines(keepends=True), 0, None, False
    for i, line in enumerate(lines):
        in_code ^= line.startswith("```")
        m = None if in_code else re.match(r"(#+) (.*)$", line.rstrip("\n"))
        if m and start is not None and len(m.group(1)) <= level:
            return "".join(lines[start:i])
        if m and start is None and m.group(2) == title:
            level, start = len(m.group(1)), i + 1
    if start is None:
        raise ValueError(f"no heading {title!r}")
    return "".join(lines[start:])


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced code block of ``text``, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```\s*$", text, flags=re.M | re.S)


def repository_like(tmp_path: Path) -> Path:
    """A working folder that looks like the repository root to the page's commands (``data/``
    and ``configs/`` linked), so what they write stays out of the checkout."""
    for name in ("data", "configs"):
        (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


@pytest.mark.slow
def test_using_a_new_modality_runs_as_written_and_ends(tmp_path):
    page = ENCODERS_PAGE.read_text()
    blocks = fenced_blocks(section(page, "Using it")) + fenced_blocks(
        section(page, "Reaching a model")
    )
    shell = [body for lang, body in blocks if lang == "bash"]
    python = [body for lang, body in blocks if lang == "python"]
    assert len(shell) == 1 and len(python) == 2, [lang for lang, _ in blocks]
    cwd = repository_like(tmp_path)
    (cwd / "use_it.py").write_text("\n".join(python))
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    for command in (["bash", "-euc", shell[0]], [sys.executable, "use_it.py"]):
        r = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    printed = r.stdout.splitlines()
    assert len(printed) == 4 and printed[-1].startswith("loss "), r.stdout
    assert all(re.match(r"\S+ \(8, \d+\) \[(\d+, ){7}\d+\]$", line) for line in printed[:3])


def test_the_config_block_is_the_shipped_file():
    blocks = fenced_blocks(section(ENCODERS_PAGE.read_text(), "Config file"))
    shown = [yaml.safe_load(body) for lang, body in blocks if lang == "yaml"]
    assert shown == [yaml.safe_load(WAVEFORM_CONFIG.read_text())]


def test_module_is_imported_by_its_name_from_the_path_with_the_documented_error(
    tmp_path, monkeypatch
):
    blocks = fenced_blocks(section(ENCODERS_PAGE.read_text(), "Config file"))
    documented = [body.strip() for lang, body in blocks if lang == "text"]
    monkeypatch.chdir(tmp_path)
    Path("enc.yaml").write_text("module: depth\nencoder: depth_text\n")
    with pytest.raises(ConfigError) as e:
        get_encoder("enc.yaml")
    assert documented == [str(e.value)]
    Path("depth.py").write_text(
        textwrap.dedent(
            """
            from task_encoders.registry import register
            from task_encoders.text import TextTaskEncoder

            @register("depth_text")
            class DepthTextTaskEncoder(TextTaskEncoder):
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert type(get_encoder("enc.yaml")).__name__ == "DepthTextTaskEncoder"


@pytest.mark.parametrize("kind", ["tiny", "two_tower"])
def test_the_reference_models_ignore_batch_fields_they_do_not_know(kind, raw_samples):
    from energon_platform.config import ModelConfig
    from energon_platform.training.two_tower import build_model

    encoder = get_encoder(WAVEFORM_CONFIG, training=False)
    batch = encoder.batch([encoder.encode_sample(s) for s in raw_samples("audio_text")[:2]])
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind=kind, dim=16, layers=1, heads=2), encoder).eval()
    silent = dataclasses.replace(batch, waveforms=torch.zeros_like(batch.waveforms))
    with torch.no_grad():
        loss = model(batch)
        assert torch.isfinite(loss) and torch.equal(loss, model(silent))


def test_preview_names_the_fields_it_cannot_draw(audio_text_shards, tmp_path):
    out = tmp_path / "sheet.png"
    r = subprocess.run(
        [sys.executable, "-m", "energon_platform", "preview", str(audio_text_shards)]
        + ["--out", str(out), "--n", "2", "--encoder", str(WAVEFORM_CONFIG)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and out.is_file(), r.stderr[-2000:]
    said = [line for line in r.stderr.splitlines() if line.startswith("preview:")]
    assert len(said) == 1, r.stderr
    assert re.fullmatch(
        r"preview: cannot draw field\(s\) waveforms \(float32 \(2, \d+\)\): no drawer for such "
        r"tensors; the sheet shows the documents without them",
        said[0],
    ), said


def test_preview_draws_or_knows_every_field_of_the_shipped_batches():
    """No built-in encoder's batch is reported as undrawable: its fields are all ones the sheet
    reads (or Energon's own ``__key__``-style bookkeeping); the examples' are not all drawn."""
    from energon_platform.tools.preview import READ_FIELDS

    unknown = {
        name: [f.name for f in dataclasses.fields(cls.batch_type) if f.name not in READ_FIELDS]
        for name in available()
        for cls in [encoder_class(name)]
        if cls.__module__.startswith("task_encoders.")
        and not cls.__module__.startswith("task_encoders.examples.")
    }
    assert {"image_text", "audio_text", "video_text", "multimodal"} <= set(unknown)
    assert all(f.startswith("_") for fields in unknown.values() for f in fields), unknown


# --- every docs page: code that fits, powers in Unicode ------------------------------------------


def checked_pages() -> list[Path]:
    """The docs pages whose code blocks are written by hand (all but :data:`GENERATED`)."""
    pages = sorted([*DOCS.glob("*.md"), *(DOCS / "reference").glob("*.md")])
    return [p for p in pages if str(p.relative_to(DOCS)) not in GENERATED]


def long_code_lines(page: Path, root: Path = DOCS) -> list[str]:
    """``page:line: N columns`` (``page`` relative to ``root``) for each line of a fenced code
    block longer than :data:`MAX_CODE_COLUMNS`, blocks of :data:`UNWRAPPED_BLOCKS` left out."""
    name = str(page.relative_to(root))
    found, fence = [], None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        m = re.match(r"^\s*```(\w*)\s*$", line)
        if m and fence is None:
            fence = m.group(1)
        elif line.strip() == "```" and fence is not None:
            fence = None
        elif fence is not None and fence not in DRAWN and (name, fence) not in UNWRAPPED_BLOCKS:
            if len(line) > MAX_CODE_COLUMNS:
                found.append(f"{name}:{number}: {len(line)} columns")
    return found


def caret_powers(page: Path, root: Path = DOCS) -> list[str]:
    """``page: match`` (``page`` relative to ``root``) for each ``L^2``-style power outside code
    (fenced blocks, inline code)."""
    text = re.sub(r"^\s*```.*?^\s*```\s*$", "", page.read_text(), flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [f"{page.relative_to(root)}: {m}" for m in re.findall(r"\S*\^\d\S*", text)]


def test_code_lines_of_the_docs_fit_in_100_columns(tmp_path):
    found = [line for page in checked_pages() for line in long_code_lines(page)]
    assert not found, "code lines over 100 columns (wrap them):\n" + "\n".join(found)
    # the check bites: a long line in a code block, not one in prose
    page = tmp_path / "page.md"
    page.write_text(f"{'x' * 101}\n\n```bash\necho {'y' * 100}\n```\n")
    assert long_code_lines(page, root=tmp_path) == ["page.md:4: 105 columns"]


def test_powers_are_written_in_unicode_outside_code(tmp_path):
    found = [hit for page in checked_pages() for hit in caret_powers(page)]
    assert not found, "write powers as L², 2²⁰ (not L^2):\n" + "\n".join(found)
    page = tmp_path / "page.md"
    page.write_text("costs L^2 here, `L^2` in code\n\n```python\nx = L^2\n```\n")
    assert caret_powers(page, root=tmp_path) == ["page.md: L^2"]
