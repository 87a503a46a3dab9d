"""``loader.balance`` is a config group (``mode``, ``window``, ``lookahead``, ``linear``,
``global_batch_tokens``); a mode alone is its short spelling, and the flat keys of earlier configs
are refused in one line naming the key to write."""

from __future__ import annotations

import logging

import pytest

from energon_platform.config import BalanceConfig, load_config
from task_encoders.config_parser import ConfigError

ENCODER = {"name": "image_text", "seq_len": 64}


def _balance(loader: dict, overrides: dict | None = None) -> BalanceConfig:
    cfg = load_config({"data": {"path": "/data"}, "encoder": ENCODER, "loader": loader}, overrides)
    return cfg.loader.balance


def test_a_mode_alone_is_the_group_with_that_mode():
    assert _balance({"balance": "tokens"}) == BalanceConfig(mode="tokens")
    assert _balance({}) == BalanceConfig() and not BalanceConfig().planned


def test_the_group_reads_its_keys():
    got = _balance({"balance": {"mode": "attention", "window": 1024, "lookahead": 2, "linear": 8}})
    assert got == BalanceConfig(mode="attention", window=1024, lookahead=2.0, linear=8.0)
    assert got.planned


@pytest.mark.parametrize(
    "flat,group",
    [
        ("balance_window", "window"),
        ("balance_lookahead", "lookahead"),
        ("balance_linear", "linear"),
        ("global_batch_tokens", "global_batch_tokens"),
    ],
)
def test_flat_keys_of_earlier_configs_are_refused_naming_the_key_to_write(flat, group):
    expected = f"loader.{flat}: not a key any more; write loader.balance.{group}"
    with pytest.raises(ConfigError, match=expected) as e:
        _balance({"balance": "tokens", flat: 2})
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=expected):  # the same from --set
        _balance({"balance": "tokens"}, {f"loader.{flat}": 2})


def test_overrides_change_the_mode_or_one_key_and_keep_the_rest():
    group = {"balance": {"mode": "tokens", "window": 1024}}
    assert _balance(group, {"loader.balance": "attention"}) == BalanceConfig("attention", 1024)
    assert _balance(group, {"loader.balance.window": 2048}) == BalanceConfig("tokens", 2048)


def test_bad_group_keys_and_values_are_named():
    with pytest.raises(ConfigError, match="loader.balance.windw: unknown key"):
        _balance({"balance": {"mode": "tokens", "windw": 1024}})
    with pytest.raises(ConfigError, match="loader.balance.mode: got 'fast'"):
        _balance({"balance": "fast"})
    with pytest.raises(
        ConfigError, match="loader.balance.global_batch_tokens: 5000 with mode 'none'"
    ):
        _balance({"balance": {"global_batch_tokens": 5000}})
    with pytest.raises(ConfigError, match="loader.balance.window: 16 < global_batch_size 32"):
        _balance({"global_batch_size": 32, "balance": {"mode": "tokens", "window": 16}})


def test_a_budget_is_whole_cost_units_but_any_positive_seconds_with_measured():
    """M10: a ``measured`` budget is in predicted seconds, and had to be a whole number."""
    measured = {"mode": "measured", "cost_model": "/costs.json", "global_batch_tokens": 0.5}
    assert _balance({"balance": measured}).global_batch_tokens == 0.5
    tokens = _balance({"balance": {"mode": "tokens", "global_batch_tokens": 4096.0}})
    assert tokens.global_batch_tokens == 4096 and isinstance(tokens.global_batch_tokens, int)
    for mode, value, said in [
        ("tokens", 0.5, "a whole number >= 1 of tokens cost units"),
        ("attention", 0, "a whole number >= 1 of attention cost units"),
        ("measured", -1, "seconds > 0"),
    ]:
        group = {"mode": mode, "global_batch_tokens": value}
        if mode == "measured":
            group["cost_model"] = "/costs.json"
        with pytest.raises(ConfigError, match=f"global_batch_tokens: got {value} .expected {said}"):
            _balance({"balance": group})


def test_overrides_set_the_mode_before_or_after_the_cost_file():
    """M11: ``--set loader.balance=measured --set loader.cost_model=X`` failed in that order
    ("is 'measured', not a section") on a config without a balance group."""
    first = {"loader.balance": "measured", "loader.cost_model": "/costs.json"}
    then = {"loader.cost_model": "/costs.json", "loader.balance": "measured"}
    for overrides in (first, then):
        got = _balance({}, overrides)
        assert (got.mode, str(got.cost_model)) == ("measured", "/costs.json"), overrides


def test_measured_reads_its_cost_file_relative_to_the_yaml_file(tmp_path, caplog):
    run = tmp_path / "run.yaml"
    run.write_text(
        "data: {path: /data}\nencoder: {name: image_text, seq_len: 64}\n"
        "loader: {balance: {mode: measured, cost_model: costs/model.json}}\n"
    )
    assert load_config(run).loader.balance == BalanceConfig(
        mode="measured", cost_model=tmp_path / "costs" / "model.json"
    )
    run.write_text(
        "data: {path: /data}\nencoder: {name: image_text, seq_len: 64}\n"
        "loader: {balance: measured, cost_model: model.json}\n"
    )
    with caplog.at_level(logging.WARNING, logger="energon_platform"):
        short = load_config(run).loader.balance
    assert short == BalanceConfig(mode="measured", cost_model=tmp_path / "model.json")
    assert "deprecated" not in caplog.text


def test_loader_cost_model_joins_the_group_whatever_its_spelling():
    for balance in ("measured", {"mode": "measured"}, {"mode": "measured", "window": 64}):
        got = _balance({"balance": balance, "cost_model": "/c.json"})
        assert (got.mode, str(got.cost_model)) == ("measured", "/c.json"), balance
    got = _balance({"balance": "tokens"}, {"loader.balance": "measured", "loader.cost_model": "/c"})
    assert (got.mode, str(got.cost_model)) == ("measured", "/c")
    group = {"balance": {"mode": "measured", "cost_model": "/a.json"}}
    assert str(_balance(group, {"loader.cost_model": "/b.json"}).cost_model) == "/b.json"


def test_a_cost_model_set_both_ways_is_refused():
    with pytest.raises(ConfigError, match="loader.cost_model: set twice"):
        _balance({"balance": {"mode": "measured", "cost_model": "/a"}, "cost_model": "/b"})


def test_measured_without_a_cost_file_or_a_cost_file_without_measured_is_named():
    with pytest.raises(ConfigError, match="loader.balance.cost_model: null with mode 'measured'"):
        _balance({"balance": "measured"})
    with pytest.raises(
        ConfigError, match="loader.balance.cost_model: /c.json with mode 'attention'"
    ):
        _balance({"balance": "attention", "cost_model": "/c.json"})
    with pytest.raises(ConfigError, match="loader.balance.cost_model: /c.json with mode 'none'"):
        _balance({"cost_model": "/c.json"})


def test_measured_is_one_cost_function_among_the_others(monkeypatch):
    """``measured`` is a `CostFunction` like ``tokens``: what sets it apart (a cost file, a budget
    in seconds, cost features, like-length plans) is what its entry declares, so another
    calibrated function registered beside it is treated the same way by the config, the checks
    and the planner."""
    import dataclasses

    from energon_platform.loader.balance.costs import COST_MODELS, CostFunction, SampleCost
    from energon_platform.loader.balance.planned import plans_like_lengths
    from task_encoders.abilities import StatesFeatures

    assert all(isinstance(f, CostFunction) for f in COST_MODELS.values())
    measured = COST_MODELS["measured"]
    assert (measured.work, measured.needs, measured.calibrated) == (
        "features",
        StatesFeatures,
        True,
    )
    assert not any(f.calibrated for name, f in COST_MODELS.items() if name != "measured")
    monkeypatch.setitem(COST_MODELS, "timed", dataclasses.replace(measured))
    with pytest.raises(ConfigError, match="loader.balance.cost_model: null with mode 'timed'"):
        _balance({"balance": "timed"})
    with pytest.raises(ConfigError, match="null unless mode is 'measured' or 'timed'"):
        _balance({"balance": "tokens", "cost_model": "/c.json"})
    timed = _balance({"balance": {"mode": "timed", "global_batch_tokens": 0.5}, "cost_model": "/c"})
    assert timed.calibrated and timed.global_batch_tokens == 0.5
    assert plans_like_lengths("timed", True) and not plans_like_lengths("tokens", True)
    assert SampleCost("timed", None, 0.0, "run.yaml").function is COST_MODELS["timed"]
