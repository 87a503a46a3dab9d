"""``loader.exclude`` rules checked at load: a rule that can be seen to match nothing, or to leave
nothing of a dataset, is refused in one line naming it; key patterns that match no sample warn once
per rule; a rule that leaves no stand-in mid-run is named."""

from __future__ import annotations

import logging

import pytest
import yaml

from scripts.bench.data import coco_dataset, three_modality_blend
from tests.helpers import REPO
from tests.helpers.cli import one_line_error_in_process


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("exclusion-rules")
    return {"coco": coco_dataset(base), "blend": three_modality_blend(base)}


def config(path, *rules, encoder="image_text_small.yaml"):
    from energon_platform.config import load_config

    return load_config(
        {
            "data": {"path": str(path), "val_split": None},
            "encoder": str(REPO / "configs/encoders" / encoder),
            "loader": {
                "global_batch_size": 8,
                "micro_batch_size": 2,
                "num_workers": 0,
                "seed": 5,
                "exclude": [{"step": 2, **r} for r in rules],
            },
        }
    )


def loader(cfg):
    from energon_platform.loader.train_loader import TrainLoader

    return TrainLoader(cfg, num_workers=0)


@pytest.mark.parametrize(
    "dataset,rule,says",
    [
        ("coco", {"keys": ["no-such-key"]}, "no sample has key 'no-such-key'"),
        ("coco", {"keys": ["[0-*"]}, "'[0-*' has a '[' without its ']'"),
        (
            "coco",
            {"shards": ["shard-000001.tar"]},
            "shard 'shard-000001.tar' matches no shard of the run (shards are "
            "named like 'train/shard-000000.tar')",
        ),
        ("coco", {"shards": ["train/shard-9*"]}, "shard 'train/shard-9*' matches no shard"),
        ("blend", {"keys": ["000000000139"]}, "'000000000139' names no dataset of the blend"),
        ("blend", {"keys": ["0000*"]}, "'0000*' names no dataset of the blend"),
        ("blend", {"shards": ["train/shard-000000.tar"]}, "names no dataset of the blend"),
        (
            "coco",
            {"shards": ["train/*"]},
            "exclude every sample of the dataset from step 2 by keys and shards; "
            "nothing would be left",
        ),
        (
            "blend",
            {"shards": ["coco_mini:train/*"]},
            "exclude the dataset instead (datasets: [coco_mini]",
        ),
    ],
)
def test_a_rule_that_matches_nothing_or_everything_is_refused_in_one_line(
    data, rule, dataset, says
):
    from storage import DatasetError

    encoder = "image_text_small.yaml" if dataset == "coco" else "multimodal.yaml"
    with pytest.raises(DatasetError) as e:
        loader(config(data[dataset], rule, encoder=encoder))
    assert (
        says in str(e.value) and "loader.exclude rule" in str(e.value) and "\n" not in str(e.value)
    ), e.value


def test_rules_that_together_exclude_a_whole_dataset_are_refused_from_their_common_step(
    data, tmp_path, capsys
):

    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(data["coco"]), "val_split": None},
                "encoder": str(REPO / "configs/encoders/image_text_small.yaml"),
                "loader": {
                    "global_batch_size": 8,
                    "num_workers": 0,
                    "exclude": [
                        {"step": 2, "shards": ["train/shard-000000.tar"]},
                        {"step": 5, "shards": ["train/shard-00000[1-9].tar"]},
                    ],
                },
            }
        )
    )
    one_line_error_in_process(
        capsys,
        ["trace", "--config", str(path), "--step", "1"],
        "rule(s) from step(s) [2, 5] exclude every sample of the dataset from step 5",
    )


def test_a_key_pattern_that_matches_no_sample_warns_once_per_rule(data, caplog):
    with caplog.at_level(logging.WARNING, logger="energon_platform.loader.train_loader"):
        loader(config(data["coco"], {"keys": ["zz*", "yy?"]}, {"keys": ["0000000001*"]}))
    said = [r.getMessage() for r in caplog.records if "loader.exclude" in r.getMessage()]
    assert said == [
        "loader.exclude rule from step 2: key pattern(s) ['zz*', 'yy?'] match no sample; "
        "the rule skips nothing by key"
    ]


def test_only_rank_0_scans_the_key_index_for_patterns_that_match_nothing(data, monkeypatch):
    """The warning is once per job: a rank other than 0 checks what it must refuse (exact keys,
    shards) and never runs a pattern's scan, whatever the number of samples."""
    from energon_platform.loader.key_index import KeyIndex
    from energon_platform.loader.run_plan import RunPlan, build_encoder

    scans = []
    matching = KeyIndex.matching
    monkeypatch.setattr(
        KeyIndex, "matching", lambda self, *a, **k: scans.append(a) or matching(self, *a, **k)
    )
    cfg = config(data["coco"], {"keys": ["*zz", "0000000001*"]})
    for rank in (1, 0):
        scans.clear()
        RunPlan(cfg, build_encoder(cfg), world_size=2, rank=rank)
        assert bool(scans) == (rank == 0), rank


def test_a_rule_that_leaves_no_stand_in_is_named_when_the_run_reaches_it(data):
    ld = loader(config(data["coco"], {"keys": ["*"]}))
    for _ in range(2 * ld.accumulation):
        next(ld)  # the two steps before the rule
    with pytest.raises(Exception) as e:
        next(ld)
    assert "is excluded by the loader.exclude rule from step 2 (keys ['*'])" in str(e.value), (
        e.value
    )
    assert "narrow it" in str(e.value)
    ld.close()


def test_a_key_pattern_reads_only_the_keys_that_start_with_its_literal_head(data):
    """Patterns are matched on the index's sorted keys from their literal head on: a pattern that
    matches nothing costs a lookup (no key is compared), one that starts with a wildcard scans;
    either way the indices are those a scan of every key finds."""
    from fnmatch import fnmatchcase

    from energon_platform.loader.key_index import KeyIndex
    from energon_platform.loader.source import SampleSource

    index = KeyIndex(SampleSource(str(data["coco"])))
    compared = []

    def counting(text, pattern):
        compared.append(text)
        return fnmatchcase(text, pattern)

    index._db.create_function("fnmatchcase", 2, counting, deterministic=True)
    everything = index.keys(range(index.shard_start(len(index.shard_names))))  # the split's
    stored = [key for (key,) in index._db.execute("SELECT sample_key FROM samples")]  # all splits
    for pattern, prefix in (
        ("00000000014*", ""),
        ("0000000001?7", ""),
        ("coco:0000000002[12]*", "coco:"),
        ("*7", ""),
        ("zz*", ""),
        ("other:0*", "coco:"),
    ):
        compared.clear()
        found = index.matching(pattern, prefix)
        expected = [i for i, key in enumerate(everything) if fnmatchcase(prefix + key, pattern)]
        assert found == expected, pattern
        scanned = len(compared)
        if pattern.startswith("*"):
            assert scanned == len(stored)
        elif not pattern.startswith(prefix):
            assert scanned == 0
        else:
            literal = pattern.split("*")[0].split("?")[0].split("[")[0].removeprefix(prefix)
            assert scanned == sum(k.startswith(literal) for k in stored) < len(stored), pattern
    compared.clear()
    assert index.matching("zz*", limit=1) == [] and compared == []
