"""The micro-batches ``calibrate`` chooses from: composed from a run's samples to spread the features.

A run's own micro-batches may all look alike. An exact blend puts the same number of samples of each
dataset into every micro-batch, so across them the tiles, frames and sample counts hardly vary, and
a fit cannot tell what each feature costs (on the demo blend every micro-batch holds the same
number of samples, and of images). `composed` therefore reads the encoded documents of the stream's
first positions (as the loader encodes them: stand-ins for failed samples, ``loader.exclude``
applied) and groups them in several orders:

* the stream's own (mixed, as the run batches them);
* most tiles first, most audio frames first, most points first (all-image, many tiles; all-audio);
* longest first, shortest first (long captions; short ones);
* text only first (documents without media, longest first);

each cut into micro-batches of the run's size (documents per micro-batch, `run_size`), and the
stream's order also into micro-batches of one document and of half the size, so that a cost per
document and a fixed cost per micro-batch can be told apart. Each is batched as the loader batches
(`MicroBatchMaker.batch_of`). The orders take turns, so any prefix of the pool holds some of each.
Each micro-batch comes with its features as it runs (`micro_batch_features`): every unpacked row is
``seq_len`` positions wide (`row_width`), clips padded to the longest, one call per tower that runs.

A run that packs is timed on its own micro-batches: its rows are full whatever documents they hold,
while documents regrouped by an order pack into rows of another padding, which the features do not
count, so a fit on them would misprice the run's own micro-batches (calibrate's held-back error,
in its report and in ``scripts/bench/balance/``'s measured sections, is where that would show).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tqdm import tqdm

from task_encoders.features import features as full
from task_encoders.features import micro_batch_features

#: Documents read per micro-batch to time: the pool has this many times as many documents as
#: `calibrate` times micro-batches of the run's size (each order cuts all of them).
DOCS_FACTOR = 2

#: The orders, each a sort key of ``(stream index, the document's features)``.
ORDERS: dict[str, Callable[[int, Mapping[str, float]], tuple]] = {
    "stream": lambda i, f: (i,),
    "most tiles": lambda i, f: (-f["vision_tiles"], i),
    "most audio frames": lambda i, f: (-f["audio_frames"], i),
    "most points": lambda i, f: (-f["points"], i),
    "longest": lambda i, f: (-f["llm_tokens"], i),
    "shortest": lambda i, f: (f["llm_tokens"], i),
    "text only": lambda i, f: (
        f["vision_tiles"] + f["audio_frames"] + f["points"] > 0,
        -f["llm_tokens"],
        i,
    ),
}


def run_size(loader: Any, features: Callable[[Any], Mapping[str, float]]) -> int:
    """Documents in the run's first micro-batch (its ``samples`` feature; at least 1)."""
    return max(1, round(features(loader.maker(0))["samples"]))


def groups(doc_features: list[Mapping[str, float]], size: int, count: int) -> Iterator[list[int]]:
    """Index groups of the documents (module doc): each order of `ORDERS` cut into groups of
    ``size``, and the stream's order into groups of 1 and of ``size // 2`` (``count`` of each of
    these), the orders taking turns; at most one group of any one set of documents."""
    n = len(doc_features)
    cuts = []
    for key in ORDERS.values():
        order = sorted(range(n), key=lambda i: key(i, doc_features[i]))
        cuts.append([order[a : a + size] for a in range(0, n - size + 1, size)])
    for small in sorted({1, size // 2} - {0, size}):
        ends = min(n - small + 1, small * count)
        cuts.append([list(range(a, a + small)) for a in range(0, max(ends, 0), small)])
    seen: set[frozenset[int]] = set()
    for k in range(max(map(len, cuts), default=0)):
        for cut in cuts:
            if k < len(cut) and frozenset(cut[k]) not in seen:
                seen.add(frozenset(cut[k]))
                yield sorted(cut[k])


def row_width(loader: Any) -> int | None:
    """How ``loader``'s micro-batches lay out their rows, for `micro_batch_features`: ``None``
    when it packs (a row's documents at their own lengths), else every row padded to the
    encoder's ``seq_len`` (the documents' batch: rows of one width, fixed shapes)."""
    return None if loader.maker.packing else int(loader.encoder.seq_len)


#: Documents encoded at a time while composing (one step of the progress bar).
ENCODE_CHUNK = 32


def composed(
    loader: Any,
    features: Callable[[Any], Mapping[str, float]],
    count: int,
    progress: bool = False,
) -> Iterator[tuple[Any, dict[str, float]]]:
    """``(micro-batch, its features as it runs)`` of ``loader``'s data composed to spread the
    cost features (module doc), enough for `calibrate` to choose ``count`` of: documents of the
    first ``DOCS_FACTOR x count x`` `run_size` stream positions (fewer where a position holds
    several), grouped by `groups`; a run that packs: its own micro-batches, in order, with
    ``features(batch)`` as their documents' sum. ``progress``: a bar while the documents are
    encoded (minutes on a large encoder), a line for a run that packs."""
    if loader.maker.packing:
        if progress:
            print("composing: the run's own packed micro-batches, in order", file=sys.stderr)
        for batch in loader:
            yield batch, micro_batch_features([features(batch)])
        return
    size = run_size(loader, features)
    docs = encoded(loader, DOCS_FACTOR * count * size, progress)
    encoder = loader.encoder
    of = [full(**encoder.encoded_features(d)) for d in docs]
    width = row_width(loader)
    for group in groups(of, min(size, len(docs)), count):
        vectors = [of[i] for i in group]
        yield loader.maker.batch_of([docs[i] for i in group]), micro_batch_features(vectors, width)


def encoded(loader: Any, n: int, progress: bool) -> list:
    """The encoded documents of ``loader``'s first ``n`` stream positions (`encoded_at`), in
    chunks of `ENCODE_CHUNK` under a progress bar."""
    docs = []
    with tqdm(
        total=n, desc="encoding documents to compose", unit="doc", disable=not progress
    ) as bar:
        for start in range(0, n, ENCODE_CHUNK):
            stop = min(n, start + ENCODE_CHUNK)
            docs += loader.maker.encoded_at(range(start, stop))
            bar.update(stop - start)
    return docs
