"""What ``calibrate`` times: micro-batches composed from a run's documents to spread the features.

The three-modality blend at 2:1:1 with 8 samples per micro-batch is exact: every one of the run's
own micro-batches holds 4 images, 2 audio clips and 2 texts, so across them tiles and sample
counts do not vary and a fit cannot tell those features' costs apart.
"""

from __future__ import annotations

from itertools import islice

import numpy as np
import pytest

from energon_platform.training.calibrate import POOL_FACTOR, feature_matrix
from energon_platform.training.calibration_pool import (
    ORDERS,
    composed,
    groups,
    row_width,
    run_size,
)
from scripts.bench.data import three_modality_blend
from task_encoders.features import features, micro_batch_features, summed
from tests.helpers import REPO
from tests.helpers import run_configs as configs


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    return three_modality_blend(tmp_path_factory.mktemp("calibration-pool"))


def loader_of(blend, encoder="multimodal.yaml"):
    from energon_platform import TrainLoader
    from energon_platform.config import load_config

    data = {"path": str(blend), "val_split": None}
    cfg = load_config(
        configs.loader_config(
            data, REPO / "configs/encoders" / encoder, global_batch_size=8, seed=5
        )
    )
    return TrainLoader(cfg, num_workers=0)


def test_the_runs_own_micro_batches_do_not_vary_where_the_pool_does(blend):
    loader = loader_of(blend)
    of = loader.encoder.batch_features
    own = feature_matrix(of(loader.maker(c)) for c in range(8))
    samples, tiles = (list(own[:, k]) for k in (0, 3))
    assert set(samples) == {8.0} and set(tiles) == {4.0}  # what makes the pool necessary

    pool = list(islice(composed(loader, of, count=6), POOL_FACTOR * 6))  # what calibrate draws
    matrix = feature_matrix(of(b) for b, _ in pool)
    docs = matrix[:, 0]
    assert {1.0, 4.0, 8.0} <= set(docs)  # a cost per document and per micro-batch told apart
    media = matrix[:, 3] + matrix[:, 4]
    assert any((matrix[:, 3] == docs) & (matrix[:, 4] == 0))  # every document an image
    assert any((matrix[:, 4] > 0) & (matrix[:, 3] == 0) & (docs == 8))  # audio, no image
    assert any((media == 0) & (docs == 8))  # text only
    full = matrix[docs == 8]
    assert len(set(full[:, 3])) >= 4 and len(set(full[:, 1])) >= 8  # tiles and tokens spread


@pytest.mark.parametrize("encoder", ["multimodal.yaml", "multimodal_packed.yaml"])
def test_a_composed_micro_batch_holds_what_its_documents_state(blend, encoder):
    """The encoder's contract holds through `batch_of`, packed or not: a batch's features are
    the sum of its documents' (so what calibrate fits is what the planner sums)."""
    loader = loader_of(blend, encoder)
    docs = loader.maker.encoded_at(range(12))
    assert len(docs) == 12
    for group in ([0], [3, 5, 7], list(range(12))):
        batch = loader.maker.batch_of([docs[i] for i in group])
        stated = summed(loader.encoder.encoded_features(docs[i]) for i in group)
        assert loader.encoder.batch_features(batch) == stated
    if loader.maker.packing:  # documents share rows
        assert len(loader.encoder.batch_row_lengths(batch)) == 12 > batch.tokens.shape[0]


def test_a_run_that_packs_is_timed_on_its_own_micro_batches(blend):
    loader = loader_of(blend, "multimodal_packed.yaml")
    of = loader.encoder.batch_features
    pool = composed(loader, of, count=4)
    drawn = [next(pool) for _ in range(3)]
    assert [of(b) for b, _ in drawn] == [of(loader.maker(c)) for c in range(3)]
    for batch, vector in drawn:  # the documents' own positions, one call per tower that runs
        assert vector == micro_batch_features([of(batch)])
        assert vector["samples"] == of(batch)["samples"] > 1


def test_an_unpacked_micro_batch_is_stated_as_it_runs(blend):
    """What calibrate fits is what the batch holds: rows of ``seq_len`` positions, clips padded to
    the longest, one call per tower that runs (break the width or the clip padding in
    `Shape.as_run` and this fails)."""
    loader = loader_of(blend)
    assert row_width(loader) == loader.encoder.seq_len
    seen_audio = seen_text_only = False
    for batch, vector in islice(composed(loader, loader.encoder.batch_features, count=6), 24):
        rows, width = batch.tokens.shape
        assert (vector["samples"], vector["llm_tokens"]) == (rows, rows * width)
        assert vector["llm_attention"] == rows * width * width
        assert vector["audio_frames"] == batch.features.shape[0] * batch.features.shape[-1]
        assert vector["vision_tiles"] == loader.encoder.batch_features(batch)["vision_tiles"]
        assert vector["vision_calls"] == float(vector["vision_tiles"] > 0)
        assert vector["audio_calls"] == float(batch.features.shape[0] > 0)
        seen_audio |= batch.features.shape[0] > 1
        seen_text_only |= vector["vision_calls"] + vector["audio_calls"] == 0
    assert seen_audio and seen_text_only


def test_run_size_counts_the_documents_of_the_first_micro_batch(blend):
    loader = loader_of(blend)
    assert run_size(loader, loader.encoder.batch_features) == 8


def doc_features(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        kind = rng.integers(3)
        out.append(
            features(
                samples=1,
                llm_tokens=int(rng.integers(1, 50)),
                vision_tiles=int(rng.integers(1, 13)) if kind == 0 else 0,
                audio_frames=int(rng.integers(10, 300)) if kind == 1 else 0,
            )
        )
    return out


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 40])
@pytest.mark.parametrize("size", [1, 2, 5, 8])
def test_groups_are_of_the_runs_size_one_or_half_and_never_the_same_twice(n, size):
    docs = doc_features(n, seed=n * 10 + size)
    got = list(groups(docs, size, count=3))
    assert len({frozenset(g) for g in got}) == len(got)
    assert all(g == sorted(g) and len(set(g)) == len(g) for g in got)
    assert all(0 <= i < n for g in got for i in g)
    assert {len(g) for g in got} <= {size, 1, size // 2}
    assert sum(len(g) == 1 for g in got) <= (3 if size > 1 else n)
    if n >= size:
        assert any(len(g) == size for g in got)


def test_the_orders_take_turns_so_a_short_pool_has_each():
    """The first groups come from the orders in turn: with many more documents than needed, a
    prefix of the pool already has the most-tiled, the most-audio, the longest, the shortest and
    a text-only group (here "most points" orders as the stream does: its group is not repeated)."""
    docs = doc_features(400, seed=3)
    rounds = list(groups(docs, 8, count=50))
    first = [g for g in rounds[: len(ORDERS) + 2] if len(g) == 8]  # one turn (no points: a repeat)
    tiles = [sum(docs[i]["vision_tiles"] for i in g) for g in first]
    frames = [sum(docs[i]["audio_frames"] for i in g) for g in first]
    tokens = [sum(docs[i]["llm_tokens"] for i in g) for g in first]
    everything = [sum(d[k] for d in docs) for k in ("vision_tiles", "audio_frames")]
    assert max(tiles) == sum(sorted((d["vision_tiles"] for d in docs), reverse=True)[:8])
    assert max(frames) == sum(sorted((d["audio_frames"] for d in docs), reverse=True)[:8])
    assert max(tokens) == sum(sorted((d["llm_tokens"] for d in docs), reverse=True)[:8])
    assert min(tokens) == sum(sorted(d["llm_tokens"] for d in docs)[:8])
    assert any(t == 0 and f == 0 for t, f in zip(tiles, frames)) and all(everything)


def test_calibrate_help_names_every_order_the_pool_composes(capsys):
    """The help text is written from `ORDERS`, so an order added there is in ``--help`` too."""
    from energon_platform.cli import main as cli_main

    with pytest.raises(SystemExit):
        cli_main(["calibrate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ORDERS:
        assert name in text, name
