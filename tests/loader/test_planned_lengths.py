"""Planned lengths are the encoded ones, through the loader, where a stale cache or a wrong key
would make them differ; a tampered plan state is refused.

* The length cache is keyed by the encoder's config: two loaders on one dataset and one cache
  with ``max_num_tiles`` 4 and 1 each plan the rows they encode.
* In a metadataset the encoder sees ``"{dataset}:{key}"``: a VLM encoder drawing one of two
  instructions per key plans the rows it encodes.
* With ``loader.context_parallel: 2`` every document is planned as the padded segment (a multiple
  of 4) its row gives it.
* A saved plan whose ``carried`` holds the next stream position (or one position twice) is refused.
"""

from __future__ import annotations

import pytest
import yaml

from scripts.bench.data import coco_dataset
from tests.helpers import REPO

VLM = REPO / "configs/encoders/image_text_vlm_small_packed.yaml"


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    base = tmp_path_factory.mktemp("planned_lengths")
    return base, coco_dataset(base)


def _encoder(base, name: str, **image) -> str:
    data = yaml.safe_load(VLM.read_text())
    data["image"]["tiling"].update(image)
    path = base / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _loader(data, encoder, cache, **loader):
    from energon_platform import TrainLoader, load_config

    cfg = load_config(
        {
            "data": {"path": str(data), "val_split": None},
            "encoder": encoder,
            "loader": {
                "global_batch_size": 4,
                "micro_batch_size": 2,
                "num_workers": 0,
                "seed": 3,
                "balance": "tokens",
                "length_cache": str(cache),
                **loader,
            },
        }
    )
    return TrainLoader(cfg, num_workers=0)


def _planned_equals_encoded(loader, batches: int = 2) -> None:
    """Each row's planned positions (by the length index) equal its encoded documents' lengths,
    each padded to the encoder's segment multiple."""
    from task_encoders.sequences import padded_length

    multiple = loader.encoder.segment_multiple
    for b in range(batches):
        planned = sorted(loader.plan.planner.plan(b).used)
        encoded = []
        for _ in range(loader.accumulation):
            mb = next(loader)
            start = 0
            for n in mb.num_docs.tolist():
                lengths = getattr(mb, "spliced_lengths", mb.doc_lengths)[start : start + n]
                encoded.append(sum(padded_length(int(x), multiple) for x in lengths))
                start += n
        assert sorted(encoded) == planned, (b, sorted(encoded), planned)
    loader.close()


def test_one_dataset_two_tilings_each_plans_what_it_encodes(coco):
    from energon_platform.loader.balance.length_store import locate
    from energon_platform.loader.fingerprint import encoder_digest

    base, data = coco
    found = []
    for tiles in (4, 1):
        loader = _loader(data, _encoder(base, f"tiles{tiles}", max_num_tiles=tiles), base / "c")
        _planned_equals_encoded(loader)
        source, encoder = loader.plan.datasets.entries[0].source, loader.encoder
        found.append(locate(source, encoder, encoder_digest(encoder)).folder)
    assert found[0] != found[1] and all(f.parent == found[0].parent for f in found), (
        "one length index per encoder config, both stored with the data"
    )


def test_with_context_parallel_the_padded_segments_are_planned(coco):
    base, data = coco
    encoder = str(REPO / "configs/encoders/image_text_small_packed.yaml")
    loader = _loader(data, encoder, base / "lengths_cp", context_parallel=2)
    assert loader.encoder.segment_multiple == 4
    _planned_equals_encoded(loader, batches=3)


def test_in_a_blend_the_instruction_drawn_per_prefixed_key_is_planned(coco):
    base, data = coco
    mds = base / "one_entry_blend.yaml"
    mds.write_text(
        yaml.safe_dump(
            {
                "__module__": "megatron.energon",
                "__class__": "MetadatasetV2",
                "splits": {"train": {"blend": [{"weight": 1, "path": str(data)}]}},
            }
        )
    )
    loader = _loader(mds, str(VLM), base / "lengths_blend")
    assert loader.plan.planner.lengths.prefixes == ["coco_mini:"]
    _planned_equals_encoded(loader, batches=3)


@pytest.mark.parametrize("carried", [[10], [3, 3], [5, 2]])
def test_a_plan_state_carrying_the_next_position_or_one_twice_is_refused(carried):
    from energon_platform.loader.state import STATE_VERSION, LoaderState, StateMismatchError

    good = {
        "version": STATE_VERSION,
        "fingerprint": {},
        "next_microbatch": 2,
        "accumulation": 1,
        "layout": {},
        "datasets": ["d"],
        "blend": [{"start": 0, "weights": ["1"]}],
        "consumed": [],
        "plan": {"batch": 2, "position": 10, "carried": [2, 9]},
    }
    LoaderState.from_dict(good)  # a well-formed plan loads
    with pytest.raises(StateMismatchError, match="plan.carried"):
        LoaderState.from_dict({**good, "plan": {"batch": 2, "position": 10, "carried": carried}})


def test_a_state_of_an_earlier_planner_is_refused_naming_its_version(coco):
    """Before a first release a checkpoint of an older format is refused, not migrated: a plan
    of ``pool-led-v2`` (which could place a sample's next epoch before its epoch ended) names the
    planner in one line."""
    from energon_platform.loader.state import StateMismatchError

    base, data = coco
    loader = _loader(data, str(VLM), base / "lengths_old_planner")
    _planned_equals_encoded(loader, batches=1)
    state = loader.state_dict()
    state["fingerprint"]["balance"]["planner"] = "pool-led-v2"
    with pytest.raises(StateMismatchError, match="pool-led-v2") as e:
        _loader(data, str(VLM), base / "lengths_old_planner").load_state_dict(state)
    assert "epoch-fenced-v3" in str(e.value) and "\n" not in str(e.value)


def test_an_encoder_stating_more_facts_than_its_index_holds_gets_its_own_index(coco):
    from energon_platform.loader.balance.length_store import index_digest

    base, data = coco
    loader = _loader(data, str(VLM), base / "width_cache")
    source, encoder = loader.plan.datasets.entries[0].source, loader.encoder
    before = index_digest(source, encoder, "digest")
    encoder.facts_width += 1  # this encoder instance now states one more fact per sample
    assert index_digest(source, encoder, "digest") != before
