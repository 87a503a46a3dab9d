"""The real-text domains of ``scripts.bench.mixing``: files that ship with Python 3.11 or a
pinned package, each pinned by its SHA-256, cut into documents of the same number of tokens.

Domains (`SOURCES`; every document is ``length`` tokens of the shipped tokenizer, and every domain
gets the same number of documents, so the same number of tokens):

* ``code``: Python source, three modules of the standard library (``argparse``, ``shutil``,
  ``tarfile``), consecutive windows of the files' token stream;
* ``prose``: English prose, the language reference's topics that ``pydoc`` shows
  (``pydoc_data/topics.py``: the text of its ``topics`` dict, read without importing it);
* ``data``: structured data, a JSON registry shipped with ``torch`` (pinned in ``pyproject.toml``:
  ``torch/_dynamo/graph_break_registry.json``, as the file has it, indentation included);
* ``license``: near-duplicates: windows at random offsets of one short text, the start of the
  Python license (`LICENSE_TOKENS` tokens of the standard library's ``LICENSE.txt``, repeated end
  to end): the model learns it early, then little is left to learn (a domain that saturates);
* ``noise``: words drawn uniformly at random from the words of one token that occur in the other
  domains (unlearnable beyond which words occur: every word costs about ``ln V`` nats).

A window is kept only when its text encodes back to the same tokens (so each document is exactly
``length`` tokens); `documents` stops with one line when a pinned file is missing or its digest
differs (``pinned=False``: the files' own digests are recorded instead).
"""

from __future__ import annotations

import ast
import hashlib
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Source:
    """A file of a domain: ``root`` (``stdlib`` or an installed package's name), its path under
    the root, and its SHA-256."""

    root: str
    path: str
    sha256: str

    def locate(self) -> Path:
        if self.root == "stdlib":
            return Path(sysconfig.get_paths()["stdlib"]) / self.path
        module = __import__(self.root)
        return Path(module.__file__).parent / self.path


#: domain → its pinned files (Python 3.11.7's standard library; torch 2.14.1)
SOURCES: dict[str, tuple[Source, ...]] = {
    "code": (
        Source(
            "stdlib",
            "argparse.py",
            "dc1eba8adfdf615986421f981337458ba1072d3e718a0f76e3224940fd74118b",
        ),
        Source(
            "stdlib",
            "shutil.py",
            "d0dbfcd96ba06684aaf5d55e941aaaf36bb3a22cf537ea9d46317b363bcc5792",
        ),
        Source(
            "stdlib",
            "tarfile.py",
            "d6957647c11b6592e58e37d4e9f02f6cf9ee695cb0653b1072b542b8afac700d",
        ),
    ),
    "prose": (
        Source(
            "stdlib",
            "pydoc_data/topics.py",
            "abaa56a64551d8eead1b19cbae3c6db443f99f0cab81df07bed3cb75c0db9346",
        ),
    ),
    "data": (
        Source(
            "torch",
            "_dynamo/graph_break_registry.json",
            "c42ed142048852a6f04633340ea2b51c804ec7639c68a339cd93020e14d1f0f5",
        ),
    ),
    "license": (
        Source(
            "stdlib",
            "LICENSE.txt",
            "3b2f81fe21d181c499c59a256c8e1968455d6689d269aa85373bfb6af41da3bf",
        ),
    ),
}
#: the tokens of the license's start that its windows repeat (learned within a short run)
LICENSE_TOKENS = 1200
DOMAINS = ("code", "prose", "data", "license", "noise")
#: the domains a model can learn (the targets' mean held-out loss is over these)
LEARNABLE = tuple(d for d in DOMAINS if d != "noise")


class SourceError(SystemExit):
    """A pinned file missing or changed (one line)."""


def read_source(source: Source, pinned: bool) -> tuple[str, str]:
    """``(text, sha256)`` of a source file; `SourceError` when it is missing or, ``pinned``,
    when its digest differs from the pin."""
    path = source.locate()
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SourceError(f"error: {source.root}/{source.path}: cannot read it ({e})") from None
    digest = hashlib.sha256(data).hexdigest()
    if pinned and digest != source.sha256:
        raise SourceError(
            f"error: {source.root}/{source.path}: sha256 {digest}, pinned {source.sha256} (the "
            "corpus is Python 3.11.7's standard library and torch 2.14.1; --unpinned records the "
            "files' own digests instead)"
        )
    text = data.decode("utf-8")
    if source.path.endswith("pydoc_data/topics.py"):  # the prose: the values of ``topics``
        tree = ast.parse(text)
        topics = next(
            node.value
            for node in tree.body
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "topics"
        )
        text = "\n\n".join(ast.literal_eval(topics).values())
    return text, digest


def windows(tokenizer, ids: list[int], length: int, starts: list[int]) -> list[str]:
    """The texts of the windows ``ids[s : s + length]`` that encode back to the same tokens."""
    out = []
    for s in starts:
        part = ids[s : s + length]
        text = tokenizer.decode(part)
        if len(part) == length and encode(tokenizer, text) == part:
            out.append(text)
    return out


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def documents(
    tokenizer, count: int, length: int, seed: int, pinned: bool = True
) -> tuple[dict[str, list[str]], dict]:
    """``count`` documents of exactly ``length`` tokens per domain (fewer when a source holds
    fewer windows: then every domain gets as many as the smallest), and what was read:
    ``{"files": [{domain, file, sha256}], "source_tokens": {domain: tokens}, "documents": n,
    "tokens_per_domain": n * length}``."""
    rng = random.Random(seed)
    streams: dict[str, list[int]] = {}
    files = []
    for domain, sources in SOURCES.items():
        ids: list[int] = []
        for source in sources:
            text, digest = read_source(source, pinned)
            ids += encode(tokenizer, text)
            files.append(
                {"domain": domain, "file": f"{source.root}/{source.path}", "sha256": digest}
            )
        streams[domain] = ids
    docs: dict[str, list[str]] = {}
    for domain, ids in streams.items():
        if domain == "license":  # near-duplicates: random offsets into its start, repeated
            ids = ids[:LICENSE_TOKENS]
            reps = (count * length) // len(ids) + 2
            ring = ids * reps
            starts = [rng.randrange(len(ids)) for _ in range(2 * count)]
            docs[domain] = windows(tokenizer, ring, length, starts)[:count]
        else:
            starts = list(range(0, len(ids) - length + 1, length))
            rng.shuffle(starts)
            docs[domain] = windows(tokenizer, ids, length, starts[: 2 * count])[:count]
    words = sorted(
        {
            w
            for ids in streams.values()
            for w in (tokenizer.convert_ids_to_tokens(i) for i in set(ids))
            if w.startswith("Ġ") and w[1:].isalpha() and len(w) > 2
        }
    )
    single = [w[1:] for w in words if len(encode(tokenizer, " " + w[1:])) == 1]
    docs["noise"] = [
        " " + " ".join(rng.choice(single) for _ in range(length)) for _ in range(count)
    ]
    n = min(len(d) for d in docs.values())
    docs = {d: docs[d][:n] for d in DOMAINS}
    facts = {
        "files": files,
        "source_tokens": {d: len(ids) for d, ids in streams.items()},
        "noise_words": len(single),
        "documents": n,
        "tokens_per_domain": n * length,
    }
    return docs, facts
