"""What the strict docs build does not catch: Markdown that renders, but not as written.

* A nested list indented 2 spaces (Python-Markdown nests under 4) collapses into its parent's
  paragraph: `rumdl` (a maintained Markdown linter, MkDocs flavour, ``.rumdl.toml``) checks the
  sources, and the built HTML is checked for list items inside a paragraph.
* reST in a docstring renders as text on the API page: ``X``\\ s, a literal block's ``::``, a
  cross-reference a line break cut (`` `[x`][y] ``).
* The API page shows no private name (``Class._helper``).
* The site loads nothing from the network (no web fonts), and its search splits text so that an
  identifier with underscores (``pin_memory``, quoted or after a dot) is one word it can find."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

from tests.helpers import REPO

#: a line of prose that starts like a list item: "- x", "* x", "+ x" or "3. x"
LIST_LINE = re.compile(r"(?m)^[ \t]*(?:[-*+]|\d+\.)[ \t]+\S")
REST_LEFTOVERS = {
    "a reST escaped suffix (`X`\\ s)": re.compile(r"\\ s\b"),
    "a reST literal-block marker (::)": re.compile(r"(?:^|\S)::\s*$"),
    "a cross-reference cut by a line break": re.compile(r"`\]\["),
}
#: ``Name._private`` (a single leading underscore; ``__init__`` and the like are dunders)
PRIVATE_NAME = re.compile(r"\b[A-Za-z]\w*\._(?!_)[A-Za-z]\w*")


class ProseText(HTMLParser):
    """The text of every ``<p>`` and ``<li>`` outside ``<pre>`` and ``<code>``, one string per
    element (an ``<li>``'s own text, without its nested elements' paragraphs)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[str] = []
        self._open: list[list[str]] = []
        self._code = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in ("pre", "code"):
            self._code += 1
        elif tag in ("p", "li"):
            self._open.append([])

    def handle_endtag(self, tag: str) -> None:
        if tag in ("pre", "code"):
            self._code = max(0, self._code - 1)
        elif tag in ("p", "li") and self._open:
            self.blocks.append("".join(self._open.pop()))

    def handle_data(self, data: str) -> None:
        if self._open:
            self._open[-1].append("\u2400" if self._code else data)


def prose_problems(html: str) -> list[str]:
    """What renders wrongly in ``html``'s paragraphs and list items, one line each."""
    parser = ProseText()
    parser.feed(html)
    problems = []
    for block in parser.blocks:
        for line in block.splitlines()[1:]:
            if LIST_LINE.match(line):
                problems.append(f"a list item inside a paragraph: {line.strip()[:80]!r}")
        for what, pattern in REST_LEFTOVERS.items():
            for line in block.splitlines():
                if pattern.search(line):
                    problems.append(f"{what}: {line.strip()[:80]!r}")
    return problems


def private_names(html: str) -> list[str]:
    """The private names (``X._y``) an API page shows, in its text or as a heading's anchor."""
    parser = ProseText()
    parser.feed(html.replace("<code", "<span").replace("</code>", "</span>"))
    text = "\n".join(parser.blocks)
    anchors = re.findall(r'\bid="([^"]+)"', html)
    found = PRIVATE_NAME.findall(text) + [a for a in anchors if PRIVATE_NAME.search(a)]
    return sorted(set(found))


def test_markdown_sources_pass_the_linter():
    rumdl = shutil.which("rumdl", path=str(Path(sys.executable).parent))
    assert rumdl, "rumdl is a test dependency (pyproject [test]): `make venv-test` installs it"
    r = subprocess.run(
        [rumdl, "check", "--no-cache", "README.md", "CHANGELOG.md", "docs"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_linter_refuses_a_nested_list_indented_two_spaces(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n- a point\n  - a nested point\n")
    shutil.copy(REPO / ".rumdl.toml", tmp_path / ".rumdl.toml")
    rumdl = shutil.which("rumdl", path=str(Path(sys.executable).parent))
    r = subprocess.run(
        [rumdl, "check", "--no-cache", str(page)], cwd=tmp_path, capture_output=True, text=True
    )
    assert r.returncode == 1 and "MD007" in r.stdout, r.stdout


def test_built_pages_render_lists_and_docstrings_as_written(site):
    problems = [
        f"{page.relative_to(site)}: {problem}"
        for page in sorted(site.rglob("index.html"))
        for problem in prose_problems(page.read_text(encoding="utf-8"))
    ]
    assert not problems, "\n".join(problems[:40])


def test_the_api_page_shows_no_private_name(site):
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "TrainLoader" in api
    assert not private_names(api), private_names(api)


def test_the_checks_find_each_fault_in_rendered_html():
    collapsed = "<p>The modes:\n- tokens\n- attention</p><ul><li>ok</li></ul>"
    assert any("list item inside" in p for p in prose_problems(collapsed))
    assert prose_problems("<ul><li>one</li><li>two</li></ul><pre><code>- x\n- y</code></pre>") == []
    assert prose_problems("<p>a text\n<code>\n- not prose</code></p>") == []
    rest = "<p>saved with <code>torch.save</code>\\ s and</p><p>Sample::</p><p>see [<code>x</code>`][y]</p>"
    found = " ".join(prose_problems(rest))
    assert "escaped suffix" in found and "literal-block" in found and "cut by a line" in found
    assert prose_problems("<p>a ratio 2:1 and a::b in prose</p>") == []
    html = '<h2 id="m.TrainLoader._replace_stuck"></h2><p>see <code>TrainLoader._x</code></p>'
    assert private_names(html) == ["TrainLoader._x", "m.TrainLoader._replace_stuck"]
    assert private_names("<p><code>Stateful.__init__</code> and <code>a.b</code></p>") == []


def test_the_site_loads_nothing_from_another_host(site):
    external = re.compile(r"<(?:link|script|img)\b[^>]*\b(?:href|src)=\"(?:https?:)?//", re.I)
    pages = [p.relative_to(site) for p in site.rglob("*.html") if external.search(p.read_text())]
    assert not pages, f"pages that load from another host: {pages[:5]}"


def search_words(site: Path) -> set[str]:
    """The words the site's search index holds: each page section's text split by the search
    configuration's separator, as the search's tokenizer splits it."""
    index = json.loads((site / "search" / "search_index.json").read_text())
    separator = re.compile(index["config"]["separator"])
    texts = (doc["title"] + " " + doc["text"] for doc in index["docs"])
    return {word.lower() for text in texts for word in separator.split(text) if word}


def test_search_finds_identifiers_with_underscores_quoted_or_after_a_dot(site):
    words = search_words(site)
    for name in ("pin_memory", "global_batch_size", "checkpoint_every", "sample_timeout"):
        assert name in words, f"{name!r} is not a word of the search index"
    glued = sorted(w for w in words if re.search(r"[`'.]\w+_\w+", w))
    assert not glued, f"words glued to a quote or a dot: {glued[:10]}"
