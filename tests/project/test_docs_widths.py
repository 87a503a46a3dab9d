"""Every page of the built site fits a desktop window (1400 px) and a phone (390 px) in headless
Chromium: no element reaches past the right edge unless a box that scrolls sideways holds it (a
code block, a wide table's scroll wrapper), so the page itself never scrolls sideways; no
identifier in a table cell is broken across lines; and inline code elsewhere ends a line only at
a space or after one of :data:`BREAK_AFTER` (``docs/hooks/identifiers.py`` puts its breaks
there), never inside a word or at a hyphen (``check-`` / ``resume``).

One Chromium per width: a frame of that width loads each page in turn (the frame's viewport is the
width, whatever Chromium's least window size), and a probe lists what reaches past its edge."""

from __future__ import annotations

import html
import json
import re
import runpy
from pathlib import Path

import pytest

from scripts.browser import chromium_or_reason, run_chromium
from tests.helpers import REPO

WIDTHS = {"desktop": (1400, 1000), "phone": (390, 844)}
#: the characters after which inline code outside a table may end a line (besides a space)
BREAK_AFTER = "./,=:)]}_"
#: in the frame's window ``w``: its viewport width, its page's scroll width, the elements that
#: reach past the right edge outside any box that clips or scrolls them, the table cells' code
#: without a space that runs over more than one line, and each line break inside a word of the
#: other inline code (``midword``: the text around it, ``|`` where the line ends) not after
#: :data:`BREAK_AFTER`
PROBE = """function probe(w) {
  const doc = w.document, edge = doc.documentElement.clientWidth;
  const held = (el) => {
    for (let up = el.parentElement; up && up !== doc.body; up = up.parentElement) {
      if (["auto", "scroll", "hidden", "clip"].includes(w.getComputedStyle(up).overflowX)) return true;
    }
    return false;
  };
  const wide = [];
  for (const el of doc.body.querySelectorAll("*")) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.height === 0 || box.right <= edge + 1 || held(el)) continue;
    const name = el.tagName.toLowerCase() + (el.id ? "#" + el.id : "");
    wide.push(name + " to " + Math.round(box.right) + " px: " + el.textContent.trim().slice(0, 50));
  }
  const broken = [...doc.querySelectorAll("td code, th code")]
    .filter((c) => !/\\s/.test(c.textContent) && c.getClientRects().length > 1)
    .map((c) => c.textContent.slice(0, 50));
  const midword = [];
  for (const c of doc.querySelectorAll("code")) {
    if (c.closest("pre") || c.getClientRects().length < 2) continue;
    const chars = [], walk = doc.createTreeWalker(c, w.NodeFilter.SHOW_TEXT);
    for (let node; (node = walk.nextNode()); ) {
      for (let i = 0; i < node.length; i++) chars.push([node, i]);
    }
    const text = chars.map(([node, i]) => node.data[i]).join("");
    let top = null;
    chars.forEach(([node, i], k) => {
      const range = doc.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const y = range.getBoundingClientRect().top;
      if (top !== null && y > top + 2 && !/[\\s${BREAK_AFTER}]/.test(text[k - 1])
          && !/\\s/.test(text[k])) {
        midword.push(text.slice(Math.max(0, k - 20), k) + "|" + text.slice(k, k + 20));
      }
      top = y;
    });
  }
  return {edge, page: doc.documentElement.scrollWidth, wide: wide.slice(0, 8),
          broken: broken.slice(0, 8), midword: midword.slice(0, 8)};
}""".replace("${BREAK_AFTER}", "".join("\\" + c for c in BREAK_AFTER))
#: the frame loads each page in turn and, once all are probed, <body> holds the findings
RUNNER = """<html><head></head><body style="margin:0">
<iframe id="frame" style="border:0;width:{width}px;height:{height}px"></iframe>
<script>{probe}
const pages = {pages}, found = {{}}, frame = document.getElementById("frame");
let i = 0;
frame.onload = () => setTimeout(() => {{
  try {{ found[pages[i]] = probe(frame.contentWindow); }}
  catch (e) {{ found[pages[i]] = {{error: String(e)}}; }}
  i += 1;
  if (i < pages.length) frame.src = pages[i];
  else document.body.setAttribute("data-wide", JSON.stringify(found));
}}, {delay});
frame.src = pages[0];
</script></body></html>"""


def built_pages(site: Path) -> list[str]:
    """Every page of the site, relative to it (404 left out)."""
    return sorted(
        str(p.relative_to(site)) for p in site.rglob("index.html") if p.parent != site / "404"
    )


def wide_elements(
    site: Path, pages: list[str], size: tuple[int, int], probe: str = PROBE, delay: int = 20
) -> dict[str, dict]:
    """Per page: ``{"edge", "page", "wide", "broken", "midword"}`` (see :data:`PROBE`) laid out
    ``size[0]`` wide; or what another ``probe(w)`` returns, ``delay`` ms after the page loaded."""
    runner = site / f"widths-{size[0]}.html"
    runner.write_text(
        RUNNER.format(
            width=size[0], height=size[1], probe=probe, pages=json.dumps(pages), delay=delay
        )
    )
    budget = 2000 + (1500 + delay) * len(pages)
    r = run_chromium(
        runner,
        "--allow-file-access-from-files",
        f"--window-size={size[0] + 20},{size[1] + 20}",
        f"--virtual-time-budget={budget}",
        "--dump-dom",
        timeout=60 + 5 * len(pages),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    found = re.search(r'data-wide="([^"]*)"', r.stdout)
    assert found, "the probe did not finish: " + r.stdout[-500:]
    return json.loads(html.unescape(found.group(1)))


def problems(found: dict[str, dict]) -> list[str]:
    return [
        f"{page}: {result}"
        for page, result in found.items()
        if "error" in result
        or result["wide"]
        or result["broken"]
        or result["midword"]
        or result["page"] > result["edge"] + 1
    ]


@pytest.fixture(scope="module")
def chromium():
    reason = chromium_or_reason()
    if reason:
        pytest.skip(reason)


@pytest.mark.slow
@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_no_page_is_wider_than_the_window(chromium, site, width):
    size = WIDTHS[width]
    pages = built_pages(site)
    assert len(pages) >= 20, pages
    found = wide_elements(site, pages, size)
    assert sorted(found) == pages and all(r.get("edge") == size[0] for r in found.values()), found
    assert not problems(found), f"at {size[0]} px:\n" + "\n".join(problems(found))


def test_the_probe_finds_an_element_past_the_edge_and_not_one_that_scrolls(chromium, tmp_path):
    page = tmp_path / "t" / "index.html"
    page.parent.mkdir()
    page.write_text(
        "<html><head></head><body style='margin:0'>"
        "<div style='overflow-x:auto'><pre>" + "x" * 300 + "</pre></div>"
        "<p><code style='white-space:nowrap'>" + "a_long_identifier." * 20 + "</code></p>"
        "<table style='width:200px'><tr><td><code style='word-break:break-all'>"
        + "loader.balance.global_batch_tokens"
        * 2
        + "</code></td></tr></table>"
        "</body></html>"
    )
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "index.html").write_text("<html><body><p>short</p></body></html>")
    # prose whose code the theme breaks anywhere (and a browser at a hyphen), and the same code
    # as the docs' build hook writes it
    name, option = "energon_platform.integrations.lightning.EnergonHooks", "--skip-loader-restore"
    theme = " style='word-break:break-word'"
    prose = (
        "<p style='width:{}px;font:16px monospace'>see <code{}>{}</code> and <code>{}</code></p>"
    )
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "index.html").write_text(
        "<html><body>" + prose.format(150, theme, name, option) + "</body></html>"
    )
    hook = runpy.run_path(str(REPO / "docs/hooks/identifiers.py"))
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "index.html").write_text(
        "<html><head><style>code .ident { white-space: nowrap }</style></head><body>"
        + hook["identifiers"](prose.format(230, "", name, option))
        + "</body></html>"
    )
    pages = ["t/index.html", "u/index.html", "v/index.html", "w/index.html"]
    found = wide_elements(tmp_path, pages, WIDTHS["phone"])
    assert found["t/index.html"]["edge"] == 390, found
    assert problems(found) == [f"{p}: {found[p]}" for p in ("t/index.html", "v/index.html")], found
    wide = found["t/index.html"]["wide"]
    assert all("xxxx" not in w for w in wide) and "a_long_identifier" in wide[-1], wide
    assert found["t/index.html"]["broken"][0].startswith("loader.balance.global_batch_tokens")
    midword = found["v/index.html"]["midword"]
    assert len(midword) >= 3 and any("--skip-|" in m or "-|" in m for m in midword), midword
