"""``loader.blend_adapt``'s settings are checked at start, before any data is opened, in one line
naming the file and the key: every option of every mixing method against the range its method
declares (`config_checks.check_mixing`, when the loader builds the encoder), the floor against the
number of datasets (a floor written as a rounded 1/K is taken for it), and a blend to mix at all.
The adapter keeps every weight it decides at the floor or above."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from energon_platform.config import BlendAdaptConfig, load_config
from energon_platform.config_checks import check_mixing
from energon_platform.loader.mixing import METHODS, BlendAdapter, make_method
from energon_platform.loader.mixing.adapter import GRID
from scripts.bench.data import three_modality_blend
from task_encoders.config_parser import ConfigError
from tests.helpers import REPO
from tests.helpers.cli import one_line_error_in_process
from tests.helpers.run_configs import run_config, write_config

ENCODER = str(REPO / "configs/encoders/multimodal.yaml")


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    return three_modality_blend(tmp_path_factory.mktemp("mixing-settings"))


def adapt_config(data, **adapt) -> dict:
    """A run config over ``data`` with ``loader.blend_adapt`` (``loss_ratio`` unless given)."""
    return run_config(
        data,
        ENCODER,
        loader={"global_batch_size": 8, "blend_adapt": {"method": "loss_ratio", **adapt}},
    )


# --- the methods' own options ----------------------------------------------------------------


def outside(option) -> list[float]:
    """Values just outside ``option``'s declared range, and the ones no range holds."""
    low = option.low if option.ends[0] == "(" else option.low - 1e-6
    high = [option.high if option.ends[1] == ")" else option.high + 1e-6]
    return [low, math.nan, *(high if math.isfinite(option.high) else [math.inf])]


def cases():
    for name, cls in sorted(METHODS.items()):
        for option in sorted(cls.declared):
            yield name, option


@pytest.mark.parametrize("method,option", list(cases()))
def test_every_option_of_every_method_is_checked_against_its_declared_range(method, option):
    declared = METHODS[method].declared[option]
    base = {"data": {"path": "x"}, "encoder": ENCODER}

    def load(value):
        adapt = {"method": method, "options": {option: value}}
        cfg = load_config({**base, "loader": {"blend_adapt": adapt}})
        check_mixing(cfg)  # as the loader checks it, before any data is opened
        return cfg

    assert load(declared.default).loader.blend_adapt.options == {option: declared.default}
    for value in outside(declared):
        with pytest.raises(ConfigError) as e:
            load(value)
        assert str(e.value).startswith(f"<dict>: loader.blend_adapt.options.{option}: got ")
        assert declared.expected() in str(e.value)
        with pytest.raises(ValueError, match=f"^{option}: got "):  # a method made in code
            make_method(method, ["x", "y"], [1, 1], {option: value})


@pytest.mark.parametrize(
    "method,option,value,expected",
    [
        ("loss_ratio", "step", 7, "(expected a finite number in (0, 1]"),
        ("odm", "smoothing", -3, "(expected a finite number in [0, 1)"),
        ("ado", "warmup", 3.5, "(expected a whole number in [3, 1000]"),
        ("ado", "smoothing", 1, "(expected a finite number in [0, 1)"),
    ],
)
def test_the_reported_options_stop_train_in_one_line_naming_file_and_key(
    blend, tmp_path, capsys, method, option, value, expected
):
    path = write_config(
        tmp_path / "run.yaml", adapt_config(blend, method=method, options={option: value})
    )
    out = tmp_path / "out"
    line = one_line_error_in_process(
        capsys,
        ["train", "--config", path, "--out", out],
        f"{path}: loader.blend_adapt.options.{option}: got {float(value)} {expected}",
    )
    assert line.startswith("energon-platform train: error: ")
    assert not out.exists()


# --- the floor ---------------------------------------------------------------------------------


def adapter(method: str, floor: float, k: int = 3) -> BlendAdapter:
    config = BlendAdaptConfig(method=method, every=1, lag=0, floor=floor)
    names = [f"d{i}" for i in range(k)]
    return BlendAdapter(config, names, [f"1/{k}"] * k, 0, 8)


@pytest.mark.parametrize("method", ["ado", "loss_ratio", "odm"])
def test_every_weight_the_adapter_decides_stays_at_the_floor_or_above(method):
    """Losses that push the third dataset's weight down (loss_ratio, ado: its loss never falls;
    odm: its loss is the lowest): without a floor it goes well under 0.3; with ``floor: 0.3`` no
    decided weight is under 0.3."""

    def lowest(floor: float) -> Fraction:
        mixer = adapter(method, floor)
        least = Fraction(1)
        for step in range(40):
            fall = 1.0 if method == "odm" else 0.8**step
            segment = mixer.report(step, [0, 1, 2], [9 * fall, 5 * fall, 0.01])
            weights = [Fraction(w) for w in segment.weights]
            assert sum(weights) == 1
            least = min(least, *weights)
        return least

    assert lowest(0.0) < Fraction(1, 5)  # the losses do push it down
    assert lowest(0.3) >= Fraction(3, 10)


def test_a_floor_of_a_rounded_third_serves_three_datasets(blend, tmp_path):
    from energon_platform.loader.train_loader import TrainLoader

    path = write_config(tmp_path / "run.yaml", adapt_config(blend, floor=0.3333, every=1, lag=0))
    loader = TrainLoader(load_config(path), num_workers=0)
    for step in range(3):
        keys = list(next(loader).__key__)
        loader.report_losses(step, keys, [1.0 + i for i in range(len(keys))])
    weights = loader.blend_weights(3)
    assert sorted(weights.values())[0] == pytest.approx(333 / GRID) and len(weights) == 3
    loader.close()
    mixer = adapter("odm", 0.3333)  # the equal share the grid can hold
    assert all(w in ("333/1000", "167/500") for w in mixer.report(0, [0, 1], [1.0, 2.0]).weights)


@pytest.mark.parametrize("floor", [0.34, 0.5])
def test_a_floor_above_one_over_the_datasets_stops_train_naming_the_file(
    blend, tmp_path, capsys, floor
):
    path = write_config(tmp_path / "run.yaml", adapt_config(blend, floor=floor))
    line = one_line_error_in_process(
        capsys,
        ["train", "--config", path, "--out", tmp_path / "out"],
        f"{path}: loader.blend_adapt.floor: {floor} for 3 datasets: the floors alone exceed the "
        f"whole blend (3 x {floor} = {3 * floor:g}; at most 1/3 = 0.333333)",
    )
    assert "at most 0.3333)" not in line


# --- a blend to mix ----------------------------------------------------------------------------


def test_blend_adapt_without_a_blend_names_data_path_not_the_config(blend, tmp_path, capsys):
    from energon_platform.loader.train_loader import TrainLoader

    single = blend.parent / "text_mini"
    one = tmp_path / "one.yaml"
    mds = yaml.safe_load(blend.read_text())
    mds["splits"]["train"]["blend"] = [{"weight": 1, "path": str(single)}]
    one.write_text(yaml.safe_dump(mds))
    for data, what in [(single, "is one dataset"), (one, "is a metadataset of one dataset")]:
        path = write_config(tmp_path / "run.yaml", adapt_config(data))
        with pytest.raises(ConfigError) as e:
            TrainLoader(load_config(path), num_workers=0)
        assert str(e.value) == (
            f"{path}: loader.blend_adapt: needs a blend, but data.path {data} {what} (set "
            f"data.path to a metadataset of two or more datasets, or loader.blend_adapt to null)"
        )
    line = one_line_error_in_process(
        capsys, ["train", "--config", path, "--out", tmp_path / "out"], f"data.path {one} is"
    )
    assert f"data.path {path}" not in line and Path(path).name in line
