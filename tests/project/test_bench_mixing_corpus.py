"""The real-text domains of scripts/bench/mixing.py: the files are the pinned ones, every domain
holds the same number of documents of exactly the same number of tokens, and a file whose digest
differs from its pin stops the benchmark in one line."""

from __future__ import annotations

import dataclasses

import pytest

from scripts.bench import mixing_corpus as corpus
from task_encoders.tokenization import DEFAULT_TOKENIZER_DIR, load_hf_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_hf_tokenizer(DEFAULT_TOKENIZER_DIR)


@pytest.mark.slow
def test_every_domain_holds_the_same_tokens_from_the_pinned_files(tokenizer):
    docs, facts = corpus.documents(tokenizer, 40, 60, seed=3)
    assert list(docs) == list(corpus.DOMAINS)
    assert {len(d) for d in docs.values()} == {40} and facts["tokens_per_domain"] == 40 * 60
    for name, texts in docs.items():
        lengths = {len(corpus.encode(tokenizer, t)) for t in texts}
        assert lengths == {60}, (name, lengths)
    pins = {f"{s.root}/{s.path}": s.sha256 for group in corpus.SOURCES.values() for s in group}
    assert {f["file"]: f["sha256"] for f in facts["files"]} == pins


def test_a_file_that_differs_from_its_pin_stops_in_one_line(tokenizer, monkeypatch):
    source = corpus.SOURCES["license"][0]
    changed = dataclasses.replace(source, sha256="0" * 64)
    with pytest.raises(corpus.SourceError) as e:
        corpus.read_source(changed, pinned=True)
    message = str(e.value)
    assert "\n" not in message and "LICENSE.txt: sha256 " in message and "pinned 000" in message
    text, digest = corpus.read_source(changed, pinned=False)  # --unpinned: its own digest
    assert digest == source.sha256 and text.startswith("A. HISTORY")
