"""The checks a run config needs its encoder for (`energon_platform.config_checks`): every refusal is
one line naming the key to change, every shipped encoder passes with the default loader, and the
loader makes them before it opens any data."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from energon_platform.config import ModelConfig, load_config
from energon_platform.config_checks import check_model_fits, check_with_encoder, pack_group
from energon_platform.loader.run_plan import build_encoder
from task_encoders.abilities import (
    CostsItself,
    MeasuresBatches,
    Packs,
    PadsSegments,
    StatesFacts,
    StatesFeatures,
    StatesLengths,
    members,
    missing,
    packing_buffer,
    packs,
    pads_segments,
)
from task_encoders.config_parser import ConfigError
from task_encoders.registry import get_encoder
from tests.helpers import REPO
from tests.helpers.run_configs import SMALL_IMAGE_TEXT, loader_config

#: the methods a stand-in defines unless told not to (`task_encoders.abilities`: packing, lengths,
#: cost features)
METHODS = (
    "select_samples_to_pack",
    "pack_selected_samples",
    "sample_facts",
    "sample_length",
    "encoded_length",
    "sample_features",
)


def encoder(packs: int | None = None, pads: bool = True, seq_len: int = 64, **methods):
    """A stand-in encoder: what the checks read of one (packing buffer, segment padding, seq_len,
    the balance methods it defines)."""
    defined = {**dict.fromkeys(METHODS, True), **methods}
    methods = {name: (lambda *a: 1) for name, on in defined.items() if on}
    return SimpleNamespace(
        packing_buffer_size=packs,
        pads_segments=pads,
        segment_multiple=1,
        seq_len=seq_len,
        facts_width=1,
        **methods,
    )


def config(tmp_path, **loader):
    return load_config(loader_config(tmp_path / "data", SMALL_IMAGE_TEXT, **loader))


@pytest.mark.parametrize(
    "loader, stand_in, key, says",
    [
        ({"pack_group": 4}, encoder(), "loader.pack_group", "4 asks for packing"),
        ({"pack_group": 1}, encoder(packs=8), "loader.pack_group", "1 disables packing"),
        ({"blend_unit": "batch"}, encoder(), "loader.micro_batch_size", "blend_unit: batch takes"),
        (
            {"balance": {"mode": "tokens", "global_batch_tokens": 512}},
            encoder(packs=8),
            "loader.balance.global_batch_tokens",
            "with a packing encoder",
        ),
        ({"balance": "tokens"}, encoder(sample_facts=False), "loader.balance", "no sample_facts"),
        (
            {"balance": "measured", "cost_model": "cost.json"},
            encoder(sample_features=False),
            "loader.balance",
            "has no sample_features",
        ),
        ({"balance": "encoder"}, encoder(), "loader.balance", "balance_cost(length)"),
        ({"context_parallel": 2}, encoder(), "loader.context_parallel", "does not pack"),
        (
            {"context_parallel": 2},
            encoder(packs=8, pads=False),
            "loader.context_parallel",
            "cannot pad",
        ),
        (
            {"context_parallel": 3},
            encoder(packs=8),
            "loader.context_parallel",
            "not a multiple of 6",
        ),
    ],
)
def test_each_refusal_is_one_line_naming_the_key(tmp_path, loader, stand_in, key, says):
    cfg = config(tmp_path, **loader)
    with pytest.raises(ConfigError) as refused:
        check_with_encoder(cfg, stand_in)
    line = str(refused.value)
    assert f"{key}:" in line and says in line and "\n" not in line, line


@pytest.mark.parametrize(
    "loader, stand_in",
    [
        ({}, encoder()),
        ({"pack_group": 4}, encoder(packs=8)),
        ({"blend_unit": "batch", "micro_batch_size": 2}, encoder()),
        ({"balance": "tokens"}, encoder(packs=8)),
        ({"balance": "encoder"}, encoder(balance_cost=True)),
        ({"context_parallel": 2}, encoder(packs=8)),
    ],
)
def test_what_the_encoder_can_serve_passes(tmp_path, loader, stand_in):
    check_with_encoder(config(tmp_path, **loader), stand_in)


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs/encoders").glob("*.yaml")))
def test_every_shipped_encoder_passes_with_the_default_loader_and_with_balance(tmp_path, name):
    path = str(REPO / "configs/encoders" / name)
    for loader in ({}, {"balance": "attention"}):
        build_encoder(load_config(loader_config(tmp_path / "data", path, **loader)))


@pytest.mark.parametrize(
    "loader, stand_in, says",
    [
        (
            {"balance": "tokens"},
            encoder(sample_length=False),
            "has no sample_length(facts, key, epoch)",
        ),
        (
            {"balance": "attention"},
            encoder(sample_facts=False, encoded_length=False),
            "has no sample_facts(sample), encoded_length(doc) (see docs: balance)",
        ),
        (
            {"balance": "measured", "cost_model": "cost.json"},
            encoder(sample_features=False),
            "reads each sample's cost features, but SimpleNamespace has no "
            "sample_features(facts, key, epoch)",
        ),
        ({"balance": "encoder"}, encoder(), "SimpleNamespace has no balance_cost(length)"),
    ],
)
def test_a_refusal_names_each_missing_method(tmp_path, loader, stand_in, says):
    with pytest.raises(ConfigError) as refused:
        check_with_encoder(config(tmp_path, **loader), stand_in)
    line = str(refused.value)
    assert f"loader.balance: {loader['balance']!r} " in line and says in line, line


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs/encoders").glob("*.yaml")))
def test_every_shipped_encoder_has_the_abilities_its_docs_say(name):
    """Every ``DocumentTaskEncoder`` states facts, lengths, features, packs and pads; none costs
    itself (``balance: encoder`` is for a user's subclass)."""
    built = get_encoder(str(REPO / "configs/encoders" / name))
    for ability in (
        StatesFacts,
        StatesLengths,
        StatesFeatures,
        MeasuresBatches,
        Packs,
        PadsSegments,
    ):
        assert isinstance(built, ability) and missing(built, ability) == (), (name, ability)
    assert not isinstance(built, CostsItself)
    assert missing(built, CostsItself) == ("balance_cost(length)",)


def test_missing_names_absent_and_uncallable_members():
    assert missing(object(), PadsSegments) == ("pads_segments", "segment_multiple")
    lengths = SimpleNamespace(facts_width=1, sample_facts=None, seq_len=8)
    assert missing(lengths, StatesLengths) == (
        "sample_facts(sample)",
        "sample_length(facts, key, epoch)",
        "encoded_length(doc)",
    )
    assert members(StatesLengths)[:2] == members(StatesFacts)


def test_whether_an_encoder_packs_or_pads_is_its_value():
    packing = encoder(packs=8)
    assert packs(packing) and packing_buffer(packing) == 8 and pads_segments(packing)
    assert not packs(encoder()) and packing_buffer(encoder()) is None
    assert not pads_segments(encoder(pads=False)) and not packs(object())


def test_the_pack_group_follows_the_encoder_when_null():
    assert pack_group(None, encoder()) == 1
    assert pack_group(None, encoder(packs=8)) == 8
    assert pack_group(3, encoder(packs=8)) == 3


def test_the_loader_refuses_the_config_before_it_opens_any_data(tmp_path):
    cfg = config(tmp_path, balance="encoder")  # tmp_path/data does not exist
    with pytest.raises(
        ConfigError, match="loader.balance: 'encoder' calls the encoder's balance_cost"
    ):
        build_encoder(cfg)


def test_a_patch_larger_than_the_encoded_images_is_refused():
    encoded = SimpleNamespace(media={"image": torch.zeros(3, 8, 12)})
    check_model_fits(ModelConfig(patch=8), encoded, "run.yaml")
    with pytest.raises(
        ConfigError, match=r"model.patch: 16 is larger than the encoder's images \(8x12\)"
    ):
        check_model_fits(ModelConfig(patch=16), encoded, "run.yaml")
    check_model_fits(ModelConfig(patch=64), SimpleNamespace(media={}), "run.yaml")  # no image


@pytest.mark.parametrize(
    "loader, key, says",
    [
        ({"executor": "ray", "num_workers": 0}, "loader.num_workers", "0 with executor 'ray'"),
        (
            {"executor": "ray", "num_workers": 1, "ray_address": "head"},
            "loader.ray_address",
            "got 'head'",
        ),
        ({"ray_actor_options": {"cpus": 1}}, "loader.ray_actor_options", "keys ['cpus']"),
    ],
)
def test_the_ray_keys_are_refused_in_one_line_naming_the_key(tmp_path, loader, key, says):
    with pytest.raises(ConfigError) as e:
        config(tmp_path, **loader)
    line = str(e.value)
    assert "\n" not in line and f"{key}: {says}" in line


def test_the_ray_keys_take_an_address_and_the_actor_options(tmp_path):
    lc = config(
        tmp_path,
        executor="ray",
        num_workers=3,
        ray_address="10.0.0.1:6379",
        ray_actor_options={"num_cpus": 2, "resources": {"data_node": 1}},
    ).loader
    assert (lc.executor, lc.ray_address, lc.ray_actor_options["num_cpus"]) == (
        "ray",
        "10.0.0.1:6379",
        2,
    )
    assert config(tmp_path).loader.executor == "local"


# --- the names a key takes are its registry's -------------------------------------------------

#: key → (a name no registry holds, the one-line error it gives with the registries as shipped)
REFUSED = {
    "balance": "loader.balance.mode: got 'nope' (expected one of 'none', 'tokens', 'attention', "
    "'encoder', 'measured')",
    "blend_adapt": "loader.blend_adapt.method: got 'nope' (expected one of 'odm', 'loss_ratio', "
    "'ado')",
    "executor": "loader.executor: got 'nope' (expected one of 'local', 'ray')",
}


def named(key: str, name: str) -> dict:
    return {key: {"method": name}} if key == "blend_adapt" else {key: name}


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_a_name_no_registry_holds_is_refused_in_one_line_listing_the_registrys(tmp_path, key):
    with pytest.raises(ConfigError) as e:
        config(tmp_path, **named(key, "nope"))
    assert str(e.value).split(": ", 1)[1] == REFUSED[key]


def test_a_name_registered_is_one_a_config_takes_and_its_refusals_list(tmp_path, monkeypatch):
    from energon_platform.loader.balance.costs import COST_MODELS
    from energon_platform.loader.executors import EXECUTORS
    from energon_platform.loader.mixing import METHODS

    monkeypatch.setitem(COST_MODELS, "flops", COST_MODELS["tokens"])
    monkeypatch.setitem(METHODS, "greedy", METHODS["odm"])
    monkeypatch.setitem(EXECUTORS, "threads", EXECUTORS["local"])
    cfg = config(tmp_path, balance="flops", blend_adapt={"method": "greedy"}, executor="threads")
    assert (cfg.loader.balance.mode, cfg.loader.blend_adapt.method, cfg.loader.executor) == (
        "flops",
        "greedy",
        "threads",
    )
    for key, name in (("balance", "flops"), ("blend_adapt", "greedy"), ("executor", "threads")):
        with pytest.raises(ConfigError, match=rf", '{name}'\)$"):
            config(tmp_path, **named(key, "nope"))
