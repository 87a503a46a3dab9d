"""mkdocs hook: an identifier in prose wraps only where a reader expects it to.

The theme breaks inline code anywhere (``word-break: break-word``) and a browser after every
hyphen, so on a phone ``check-resume`` became ``check-`` / ``resume`` and
``energon_platform.integrations.lightning.EnergonHooks`` broke inside ``EnergonHooks``. Every
inline ``<code>`` outside code blocks and tables (table cells keep their code on one line and
scroll: ``stylesheets/extra.css``) is rewritten so that each word of it is pieces that never
wrap inside (``<span class="ident">``, ``white-space: nowrap``): a word of up to `LONG`
characters is one piece, a longer one has a break opportunity (``<wbr>``) after each ``.``, ``/``,
``,``, ``=``, ``:`` or closing bracket, and, in a piece still longer than `LONG`, after ``_``. The text,
what a copy takes and what the search indexes stay the same; only where a line may end changes.
``tests/project/test_docs_widths.py`` checks every page at 390 px for an identifier broken
anywhere else.
"""

from __future__ import annotations

import html
import re

#: what is left alone: code blocks and tables (cells: one line, scrolled; see extra.css)
KEEP = re.compile(r"<pre[\s>].*?</pre>|<table[\s>].*?</table>", re.S)
#: inline code as Markdown writes it: no attributes, no markup inside
INLINE = re.compile(r"<code>([^<]+)</code>")
#: a word of at most this many characters never wraps: it moves to the next line whole (a
#: phone's line holds about 40 characters of code)
LONG = 30
#: a longer word may end a line after one of these (none is part of an HTML entity) ...
AFTER = frozenset("./,=:)]}")
#: ... and a piece of it still longer than `LONG` after an underscore too
AFTER_TOO = frozenset("_")
#: the fewest characters a piece holds before a break may follow it (no break after the leading
#: ``.`` of ``.nv-meta`` or ``_`` of ``_private``)
SHORTEST = 2


def cut(word: str, after: frozenset) -> list[str]:
    """``word`` cut after each character of ``after`` that another character outside it follows,
    no piece shorter than `SHORTEST`."""
    out, start = [], 0
    for i, ch in enumerate(word[:-1]):
        if ch in after and word[i + 1] not in after and i + 1 - start >= SHORTEST:
            out.append(word[start : i + 1])
            start = i + 1
    return [*out, word[start:]]


def pieces(word: str) -> list[str]:
    """The pieces of ``word`` (no whitespace) between which a line may end: the word whole when
    it is at most `LONG` characters, else cut after `AFTER` and, in a piece still longer, after
    `AFTER_TOO`."""
    if len(html.unescape(word)) <= LONG:
        return [word]
    return [q for p in cut(word, AFTER) for q in (cut(p, AFTER_TOO) if len(p) > LONG else [p])]


def wrap_word(word: str) -> str:
    return "<wbr>".join(f'<span class="ident">{p}</span>' for p in pieces(word))


def wrap_code(text: str) -> str:
    """The inside of one inline ``<code>``: its words wrapped (`wrap_word`), its spaces kept."""
    return "".join(wrap_word(t) if t.strip() else t for t in re.split(r"(\s+)", text) if t)


def identifiers(html: str) -> str:
    """``html`` with every inline code outside `KEEP` rewritten (module doc)."""
    out, at = [], 0
    for kept in KEEP.finditer(html):
        out.append(INLINE.sub(lambda m: f"<code>{wrap_code(m[1])}</code>", html[at : kept.start()]))
        out.append(kept[0])
        at = kept.end()
    out.append(INLINE.sub(lambda m: f"<code>{wrap_code(m[1])}</code>", html[at:]))
    return "".join(out)


def on_page_content(html: str, **_) -> str:
    return identifiers(html)
