"""The docs' pictures: every image a page shows (markdown ``![..](..)`` or ``<img src>``) is a file
on disk, and every PNG under ``docs/assets`` is shown by some page. The pictures themselves are
drawn by ``scripts/docs_pictures.py`` (slow, never run here), which writes beside each
``NAME.png`` a sidecar ``NAME.json``: the command that drew it and the figures of its run, read from
the run's own output. The text around each picture must state those figures (in the words of
:data:`PHRASES`) and the page must show that command (or link, from that text, to a page that
does): this checks only files."""

from __future__ import annotations

import json
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
    assert not missing, (
        "images shown but not on disk (draw them: python -m scripts.docs_pictures):\n"
        + ("\n".join(missing))
    )


def test_every_picture_in_docs_assets_is_shown_on_a_page():
    orphans = orphan_pictures(docs_pages(), ASSETS)
    assert not orphans, "pictures no page shows (show them or delete them):\n" + "\n".join(orphans)


#: an image that is a link to a file: ``[![alt](IMAGE)](TARGET)``
LINKED_IMAGE = re.compile(
    r"\[!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)\]\(\s*<?([^)\s>]+)>?\s*\)"
)


def unlinked_pictures(pages: list[Path]) -> list[str]:
    """``page: reference`` for each Markdown image a page shows that is not a link to its own
    file: shrunk to a phone's width, a picture's text is a few pixels high, and a tap on it must
    open it at full size."""
    problems = []
    for page in pages:
        prose = INLINE_CODE.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
        linked = {image for image, target in LINKED_IMAGE.findall(prose) if image == target}
        problems += [
            f"{page.relative_to(REPO)}: {ref}"
            for ref in MARKDOWN_IMAGE.findall(prose)
            if ref not in linked and not ref.startswith("data:")
        ]
    return problems


def test_every_picture_links_to_its_full_size_file():
    unlinked = unlinked_pictures(docs_pages())
    assert not unlinked, "pictures to wrap in a link to themselves, [![alt](X.png)](X.png):\n" + (
        "\n".join(unlinked)
    )


def test_the_check_finds_a_picture_without_a_link_to_itself(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    page = tmp_path / "page.md"
    page.write_text(
        "[![linked](assets/a.png)](assets/a.png)\n"
        "![bare](assets/b.png)\n"
        "[![to another](assets/c.png)](assets/d.png)\n"
        "`![in code](assets/e.png)`\n"
    )
    assert unlinked_pictures([page]) == ["page.md: assets/b.png", "page.md: assets/c.png"]


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


# --- sidecars: the figures and the command of each picture's run ---------------------------------

#: how a page states each figure a sidecar may hold (``{}``: its value; each item of a list)
PHRASES = {
    "steps": "{} steps",
    "kill_at": "during step {}",
    "resumed_from": "from step {}",
    "verdict": "{}",
    "spike_steps": "step {}",
    "z": "z >= {}",
    "replay_differs_at": "first differs at step {}",
    "ranks": "{} ranks",
    "balance": "balance: {}",
    "samples": "{} samples",
}
FENCED = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1", re.S | re.M)
HEADING = re.compile(r"#{1,6}\s")
PAGE_LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)\s]*)?\)")
#: an inline code span, which may run over a line break
CODE_SPAN = re.compile(r"`([^`]+)`")
ASSIGNMENT = re.compile(r'(\w+)="(.*)"')
#: a page's stand-in for any one argument: DATASET, CONFIG, RUN, ...
PLACEHOLDER = re.compile(r"[A-Z][A-Z_]{2,}")
#: the folders of a path (``out/demo/`` of ``out/demo/run.yaml``): commands compare without them
FOLDERS = re.compile(r"(?:[\w.{}~-]*/)+(?=[\w.{}-])")


def sidecars(assets: Path) -> dict[str, dict]:
    """Each sidecar ``NAME.json`` of ``assets`` (not its subfolders), by ``NAME``."""
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in assets.glob("*.json")}


def text_around(lines: list[str], at: int) -> str:
    """The prose around the image on line ``at``: the lines before and after it up to a heading,
    another image or a code block, inline-code and emphasis marks removed, one space between
    words."""
    fenced, inside = set(), False
    for i, line in enumerate(lines):
        if line.startswith(("```", "~~~")):
            inside = not inside
            fenced.add(i)
        elif inside:
            fenced.add(i)

    def prose(i: int) -> bool:
        line = lines[i]
        return not (i in fenced or HEADING.match(line) or MARKDOWN_IMAGE.search(line))

    first, last = at, at
    while first > 0 and prose(first - 1):
        first -= 1
    while last + 1 < len(lines) and prose(last + 1):
        last += 1
    around = lines[first:at] + lines[at + 1 : last + 1]
    return " ".join(" ".join(around).replace("`", "").replace("*", "").split())


def states(text: str, phrase: str) -> bool:
    """Whether ``text`` holds ``phrase`` as words of its own (``step 1`` is not in ``step 13``)."""
    return re.search(rf"(?<![\w.]){re.escape(phrase)}(?![\w]|\.\d)", text) is not None


def figure_phrases(figures: dict) -> list[str]:
    """The phrases (:data:`PHRASES`) that state ``figures``."""
    out = []
    for name, value in figures.items():
        for v in value if isinstance(value, list) else [value]:
            out.append(PHRASES[name].format(f"{v:g}" if isinstance(v, float) else v))
    return out


def expand(line: str, variables: dict[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` of ``line`` replaced by ``variables``' values."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m[1], m[0]), line)


def shown_commands(text: str) -> list[str]:
    """The command lines a page shows: every line of its code blocks (a ``\\`` continuation joined,
    a ``$ `` prompt dropped, the ``$NAME`` of the block's ``NAME="..."`` lines expanded), and every
    inline code span (whatever its line breaks)."""
    found = []
    for block in FENCED.finditer(text):
        variables: dict[str, str] = {}
        for line in block[2].replace("\\\n", " ").splitlines():
            line = expand(line.strip().removeprefix("$ "), variables)
            assigned = ASSIGNMENT.fullmatch(line)
            if assigned:
                variables[assigned[1]] = assigned[2]
            else:
                found.append(line)
    return found + CODE_SPAN.findall(FENCED.sub("", text))


def same_command(sidecar: str, page: str) -> bool:
    """Whether the page's command line is the sidecar's, compared without the folders of paths,
    a page's placeholder (``DATASET``) standing for any one argument."""
    ours, theirs = (FOLDERS.sub("", " ".join(c.split())) for c in (sidecar, page))
    pattern = r"\s".join(
        r"\S+" if PLACEHOLDER.fullmatch(word) else re.escape(word) for word in theirs.split()
    )
    return bool(theirs) and re.fullmatch(pattern, ours) is not None


def picture_problems(pages: list[Path], assets: Path) -> list[str]:
    """What the pages get wrong of the pictures of ``assets`` they show: a figure of its sidecar
    that the text around the image does not state, or a command the page (or a page that text
    links to) does not show."""
    made = sidecars(assets)
    problems = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        lines = text.splitlines()
        for at, line in enumerate(lines):
            for ref in MARKDOWN_IMAGE.findall(line):
                path = (page.parent / ref).resolve()
                if path.parent != assets.resolve() or path.stem not in made:
                    continue
                where, sidecar = f"{page.relative_to(REPO)}:{at + 1} ({path.name})", made[path.stem]
                around = text_around(lines, at)
                for phrase in figure_phrases(sidecar["figures"]):
                    if not states(around, phrase):
                        problems.append(f"{where}: says nothing of {phrase!r} around the image")
                command = expand(sidecar["command"], sidecar.get("variables", {}))
                linked = {(page.parent / m).resolve() for m in PAGE_LINK.findall(around)}
                commands = [
                    c
                    for p in [page, *sorted(p for p in linked if p.is_file())]
                    for c in shown_commands(p.read_text(encoding="utf-8"))
                ]
                if not any(same_command(command, c) for c in commands):
                    problems.append(f"{where}: shows nowhere the command {command!r}")
    return problems


def test_every_picture_has_a_sidecar_and_every_sidecar_a_picture():
    pictures = {p.stem for p in ASSETS.glob("*.png")}
    made = sidecars(ASSETS)
    assert pictures == set(made), (
        f"pictures without a sidecar: {sorted(pictures - set(made))}, sidecars without a picture: "
        f"{sorted(set(made) - pictures)} (scripts/docs_pictures.py writes both)"
    )
    for name, sidecar in made.items():
        assert sidecar["picture"] == f"{name}.png" and sidecar["command"], name
        assert sidecar["figures"] and set(sidecar["figures"]) <= set(PHRASES), (name, sidecar)


def test_the_text_around_each_picture_states_the_figures_of_its_run_and_its_command():
    problems = picture_problems(docs_pages(), ASSETS)
    assert not problems, (
        "pictures whose text is not about their run (docs/assets/NAME.json: what "
        "scripts/docs_pictures.py drew):\n" + "\n".join(problems)
    )


def test_the_check_finds_a_wrong_figure_and_a_command_not_shown(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assets = tmp_path / "docs" / "assets"
    assets.mkdir(parents=True)
    sidecar = {
        "picture": "check.png",
        "command": 'energon-platform check-resume --steps 12 --kill-at 8 --cmd "$L"',
        "variables": {"L": "torchrun scripts/loop.py --config out/x/run.yaml --steps 12"},
        "figures": {"steps": 12, "kill_at": 8, "verdict": "FAIL", "z": 2.5},
    }
    (assets / "check.json").write_text(json.dumps(sidecar))
    page = tmp_path / "docs" / "page.md"
    good = (
        "## Check\n\n"
        "```bash\n"
        'L="torchrun scripts/loop.py"\n'
        'L="$L --config run.yaml --steps 12"\n'
        'energon-platform check-resume --steps 12 --kill-at 8 \\\n    --cmd "$L"\n'
        "```\n\n"
        "A `FAIL` of 12 steps,\n\n![the plot](assets/check.png)\n\n"
        "killed **during step 8** (z >= 2.5).\n\n## Next\n\nsay 13 steps, during step 9\n"
    )
    page.write_text(good)
    assert picture_problems([page], assets) == []
    page.write_text(good.replace("during step 8", "during step 9"))
    assert picture_problems([page], assets) == [
        "docs/page.md:12 (check.png): says nothing of 'during step 8' around the image"
    ]
    page.write_text(good.replace("z >= 2.5", "z >= 2.55").replace("--kill-at 8", "--kill-at 9"))
    assert picture_problems([page], assets) == [
        "docs/page.md:12 (check.png): says nothing of 'z >= 2.5' around the image",
        "docs/page.md:12 (check.png): shows nowhere the command 'energon-platform check-resume "
        '--steps 12 --kill-at 8 --cmd "torchrun scripts/loop.py --config out/x/run.yaml '
        "--steps 12\"'",
    ]
    # the command shown on a page the text links to, a placeholder for a path
    other = tmp_path / "docs" / "other.md"
    other.write_text(
        '```\nL="torchrun loop.py --config CONFIG --steps 12"\n'
        'energon-platform check-resume --steps 12 --kill-at 8 --cmd "$L"\n```\n'
    )
    page.write_text(
        "A FAIL of 12 steps killed during step 8, z >= 2.5 ([how](other.md#x)):\n\n"
        "![the plot](assets/check.png)\n"
    )
    assert picture_problems([page], assets) == []
