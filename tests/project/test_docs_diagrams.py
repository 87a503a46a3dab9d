"""The docs' diagrams: mermaid blocks that the built site renders offline, with mermaid's own
script shipped in docs/javascripts/ (the theme fetches it from a CDN only when the page lacks it,
and a test or a reader without network has none)."""

import html
import json
import re

import pytest

from scripts.browser import chromium_or_reason, run_chromium
from tests.helpers import REPO
from tests.project.test_docs_widths import WIDTHS, wide_elements

DOCS = REPO / "docs"
SCRIPT = "javascripts/mermaid.min.js"
#: pages drawn with mermaid, and the least number of diagrams each must have
PAGES = {"concepts": 5, "index": 1, "architecture": 1}
#: Material draws each diagram into a closed shadow root, which --dump-dom does not show; this
#: line, first in <head> of a copy of the page, makes the diagram land in the page itself
LIGHT_DOM = "<script>Element.prototype.attachShadow = function () { return this; };</script>"


def mermaid_blocks(page: str) -> int:
    return len(re.findall(r"^```mermaid\s*$", (DOCS / f"{page}.md").read_text(), re.M))


def built_page(site, page: str):
    return site / ("index.html" if page == "index" else f"{page}/index.html")


def test_the_pages_hold_their_mermaid_blocks_and_load_the_shipped_script(site):
    for page, least in PAGES.items():
        blocks = mermaid_blocks(page)
        assert blocks >= least, f"docs/{page}.md has {blocks} mermaid blocks, expected {least}+"
        html = built_page(site, page).read_text()
        assert html.count('<pre class="mermaid">') == blocks, page
        assert re.search(rf'<script src="(\.\./)?{re.escape(SCRIPT)}"', html), (
            f"{page}: the built page does not load {SCRIPT}"
        )
    shipped = DOCS / SCRIPT
    assert shipped.is_file() and (site / SCRIPT).is_file()
    assert 'globalThis["mermaid"]' in shipped.read_text()[-2000:], (
        f"{SCRIPT} is not mermaid's single-file build (dist/mermaid.min.js)"
    )
    assert "MIT License" in (DOCS / "javascripts" / "mermaid.LICENSE.txt").read_text()


#: the most nodes a left-to-right diagram may have: scaled to a phone's width, a longer row of
#: boxes draws its text a few pixels high
MOST_NODES_ACROSS = 4


def flowcharts(text: str) -> list[tuple[str, int]]:
    """``(direction, number of nodes)`` of every mermaid flowchart in ``text``."""
    charts = []
    for body in re.findall(r"^```mermaid\s*\n(.*?)^```", text, re.S | re.M):
        head = re.match(r"\s*(?:flowchart|graph)\s+(\w+)", body)
        if head:
            nodes = set(
                re.findall(r"(?:^|-->|---|-\.->|--\s[^-]*-->|\s)\s*(\w+)\s*[\[({]", body, re.M)
            )
            charts.append((head.group(1), len(nodes)))
    return charts


def test_long_diagrams_are_drawn_top_down():
    across = [
        f"{page.name}: {direction} with {nodes} nodes"
        for page in sorted(DOCS.rglob("*.md"))
        for direction, nodes in flowcharts(page.read_text())
        if direction in ("LR", "RL") and nodes > MOST_NODES_ACROSS
    ]
    assert not across, "draw these top-down (flowchart TB):\n" + "\n".join(across)
    assert flowcharts('```mermaid\nflowchart LR\n  a["x"] --> b["y"]\n  b --> c{"z"}\n```\n') == [
        ("LR", 3)
    ]


@pytest.fixture(scope="module")
def chromium():
    reason = chromium_or_reason()
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_diagram_renders_to_an_svg_without_network(chromium, site, page):
    built = built_page(site, page)
    light = built.with_name("light-dom.html")  # beside it: the same relative script paths
    light.write_text(built.read_text().replace("<head>", "<head>" + LIGHT_DOM, 1))
    r = run_chromium(light, "--dump-dom", "--virtual-time-budget=10000")
    assert r.returncode == 0, r.stderr[-2000:]
    drawn = r.stdout.count('<div class="mermaid"><svg')
    assert drawn == mermaid_blocks(page), (
        f"{page}: {drawn} of {mermaid_blocks(page)} diagrams became an <svg>"
    )
    assert "Syntax error" not in r.stdout


#: a line first in <head> of a copy of a page: once laid out, the page's <body> names the code
#: blocks wider than their box (each block's first line)
OVERFLOW = (
    "<script>addEventListener('load', () => document.body.setAttribute('data-overflow', "
    "JSON.stringify([...document.querySelectorAll('pre > code')]"
    ".filter(c => c.scrollWidth > c.clientWidth + 1)"
    ".map(c => c.textContent.split('\\n')[0].slice(0, 60)))));</script>"
)
#: pages whose code blocks hold the longest lines (up to 100 columns)
WIDE_PAGES = ("balance", "check-resume", "get-started", "encoders", "trainers", "megatron")


@pytest.mark.parametrize("page", WIDE_PAGES)
def test_code_lines_fit_the_page_at_1400_pixels(chromium, site, page):
    built = built_page(site, page)
    probe = built.with_name("overflow.html")
    probe.write_text(built.read_text().replace("<head>", "<head>" + OVERFLOW, 1))
    r = run_chromium(probe, "--dump-dom", "--window-size=1400,1000", "--virtual-time-budget=5000")
    assert r.returncode == 0, r.stderr[-2000:]
    found = re.search(r'data-overflow="([^"]*)"', r.stdout)
    assert found, "the probe did not run"
    wide = json.loads(html.unescape(found.group(1)))
    assert not wide, f"{page}: code blocks wider than the page at 1400 px: {wide}"


#: first in <head> of a copy of a page: Material's closed shadow root of each diagram made open,
#: so that a probe sees the diagram as the page lays it out (the page's own styles kept out)
OPEN_SHADOW = (
    "<script>const attach = Element.prototype.attachShadow; Element.prototype.attachShadow = "
    "function (o) { return attach.call(this, {...o, mode: 'open'}); };</script>"
)
#: in the frame's window ``w``: the page's viewport and scroll width, and per diagram the size
#: in pixels its text is drawn at (the label's font size times the drawing's scale; null when
#: not drawn)
TEXT_PROBE = """function probe(w) {
  const doc = w.document;
  const sizes = [...doc.querySelectorAll("div.mermaid")].map((d) => {
    const svg = d.shadowRoot && d.shadowRoot.querySelector("svg");
    const label = svg && svg.querySelector(".nodeLabel, text");
    if (!label) return null;
    const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
    return Math.round(parseFloat(w.getComputedStyle(label).fontSize) * scale * 10) / 10;
  });
  return {edge: doc.documentElement.clientWidth, page: doc.documentElement.scrollWidth, sizes};
}"""
#: the smallest text a diagram may draw (pixels): scaled to a phone's width, they drew 4.7 to 6.4
LEAST_TEXT_PX = 12


@pytest.mark.slow
@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_diagram_text_stays_readable_on_a_phone_and_a_desktop(chromium, site, width):
    """Each diagram is drawn at its own size (``docs/javascripts/mermaid-config.js``), never
    shrunk to the page's width: one wider than a phone scrolls sideways in its own box, and the
    page itself does not."""
    pages = {}
    for page in PAGES:
        built = built_page(site, page)
        copy = built.with_name("open-shadow.html")
        copy.write_text(built.read_text().replace("<head>", "<head>" + OPEN_SHADOW, 1))
        pages[str(copy.relative_to(site))] = mermaid_blocks(page)
    found = wide_elements(site, sorted(pages), WIDTHS[width], probe=TEXT_PROBE, delay=1500)
    for name, blocks in pages.items():
        result = found[name]
        assert result["edge"] == WIDTHS[width][0], result
        assert len(result["sizes"]) == blocks and None not in result["sizes"], (name, result)
        small = [px for px in result["sizes"] if px < LEAST_TEXT_PX]
        assert not small, f"{name} at {width}: diagram text of {small} px ({result})"
        assert result["page"] <= result["edge"] + 1, f"{name}: the page scrolls sideways"
