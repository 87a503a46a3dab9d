"""The docs' pictures: every image a page shows (markdown ``![..](..)`` or ``<img src>``) is a file
on disk, and every PNG under ``docs/assets`` is shown by some page. The pictures themselves are
drawn by ``scripts/docs_pictures.py`` (slow, never run here): this checks only files."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import REPO

DOCS = REPO / "docs"
ASSETS = DOCS / "assets"

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_IMAGE = re.compile(r"<img\b[^>]*?\bsrc\s*=\s*[\"']([^\"']+)[\"']", re.I)


def image_references(text: str) -> list[str]:
    """The targets of the images ``text`` shows (code blocks and inline code left out), each
    without its ``#fragment`` or ``?query``; ``data:`` URIs are not files and are left out."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    found = MARKDOWN_IMAGE.findall(prose) + HTML_IMAGE.findall(prose)
    return [re.split(r"[#?]", ref)[0] for ref in found if not ref.startswith("data:")]


def shown_images(pages: list[Path]) -> dict[Path, list[tuple[Path, str]]]:
    """Per resolved image path, the ``(page, reference as written)`` that show it."""
    shown: dict[Path, list[tuple[Path, str]]] = {}
    for page in pages:
        for ref in image_references(page.read_text(encoding="utf-8")):
            shown.setdefault((page.parent / ref).resolve(), []).append((page, ref))
    return shown


def missing_images(pages: list[Path]) -> list[str]:
    """``page: reference`` for each image a page shows that is not a file."""
    return [
        f"{page.relative_to(REPO)}: {ref}"
        for path, uses in shown_images(pages).items()
        if not path.is_file()
        for page, ref in uses
    ]


def orphan_pictures(pages: list[Path], assets: Path) -> list[str]:
    """The PNGs under ``assets`` that no page shows."""
    shown = shown_images(pages)
    return sorted(
        str(png.relative_to(REPO)) for png in assets.rglob("*.png") if png.resolve() not in shown
    )


def docs_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [REPO / "README.md"]


def test_every_image_a_page_shows_is_a_file():
    missing = missing_images(docs_pages())
    assert not missing, "images shown but not on disk (draw them: scripts/docs_pictures.py):\n" + (
        "\n".join(missing)
    )


def test_every_picture_in_docs_assets_is_shown_on_a_page():
    orphans = orphan_pictures(docs_pages(), ASSETS)
    assert not orphans, "pictures no page shows (show them or delete them):\n" + "\n".join(orphans)


def test_the_check_finds_a_missing_image_and_an_orphan_but_not_code(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assets = tmp_path / "docs" / "assets"
    assets.mkdir(parents=True)
    for name in ("shown.png", "html.png", "orphan.png", "in-code.png"):
        (assets / name).write_bytes(b"\x89PNG")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "![A shown one](assets/shown.png)\n"
        '<img alt="x" src="assets/html.png#dark" width="200">\n'
        '![Gone](assets/gone.png "its title")\n'
        "Inline `![not](assets/in-code.png)` and a block:\n"
        "```markdown\n![not either](assets/in-code.png)\n```\n"
        "![inline data](data:image/png;base64,AAAA)\n"
    )
    assert missing_images([page]) == ["docs/page.md: assets/gone.png"]
    assert orphan_pictures([page], assets) == ["docs/assets/in-code.png", "docs/assets/orphan.png"]
