"""Blends and metadatasets: every bad weight, repetitions, schedule entry, empty file, missing
split or folder is one line naming the file and key, exit 2; weights are read as written; names of
entries do not depend on list order; and changes at resume (resume segment with gradient
accumulation, blend_unit_samples in the fingerprint, per-window inner shuffle)."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from energon_platform.config import load_config
from energon_platform.loader.state import StateMismatchError
from energon_platform.loader.train_loader import TrainLoader
from tests.conftest import _convert, _image_item
from tests.helpers import REPO
from tests.helpers.cli import one_line_error_in_process, run_cli
from tests.helpers.run_configs import run_config, write_config

IMAGE = str(REPO / "configs/encoders/image_text_small.yaml")
HEAD = "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """``big`` (24 samples), ``small`` (10), ``ds/text`` (6) and ``ds3/text`` (6): image-text datasets."""
    root = tmp_path_factory.mktemp("h2blend")
    for name, n, offset in (
        ("big", 24, 0),
        ("small", 10, 100),
        ("ds/text", 6, 200),
        ("ds3/text", 6, 300),
    ):
        _convert(
            "image_text",
            [_image_item(offset + i, False) for i in range(n)],
            root / f"raw-{name}",
            root / name,
        )
    return root


def write_mds(root: Path, name: str, body: str, head: str = HEAD) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(head + body)
    return path


def blend_run(
    root: Path, data: str, name: str = "run", loader: dict | None = None, train: dict | None = None
) -> Path:
    """`run_config` of ``data`` (no validation split, global batches of 8, 2 steps into
    ``root/out-NAME``) with ``loader`` and ``train`` keys set, written to ``root/run-NAME.yaml``."""
    config = run_config(
        {"path": data, "val_split": None},
        loader={"global_batch_size": 8, **(loader or {})},
        train={"steps": 2, "out": str(root / f"out-{name}"), **(train or {})},
    )
    return write_config(root / f"run-{name}.yaml", config)


def cfg(path: Path, **loader):
    return load_config(
        {
            "data": {"path": str(path), "val_split": None},
            "encoder": IMAGE,
            "loader": {"global_batch_size": 8, "num_workers": 0, **loader},
        }
    )


# --- 1, 2: weights checked before Energon parses them ----------------------------------------------


@pytest.mark.parametrize(
    "first,second,key,problem",
    [
        ("weight: 1", "weight: -1", "blend[1]", "weight -1 is out of range"),
        ("weight: 2", "weight: -1", "blend[1]", "weight -1 is out of range"),
        ("weight: 0", "weight: 0", "blend:", "every weight is 0"),
        ("weight: 'abc'", "weight: 1", "blend[0]", "weight 'abc' is not a number"),
        ("weight: .nan", "weight: 1", "blend[0]", "is not a number"),
        ("weight: 1", "weight: .inf", "blend[1]", "is not a number"),
        ("weight: 1.0e30", "weight: 1", "blend[0]", "weight 1e+30 is out of range"),
        ("weight: 1.0e-300", "weight: 1", "blend[0]", "is out of range"),
    ],
)
def test_bad_metadataset_weights_are_one_line_naming_file_and_entry(
    root, capsys, first, second, key, problem
):
    mds = write_mds(
        root,
        "bad",
        f"    blend:\n    - {{{first}, path: ./big}}\n    - {{{second}, path: ./small}}\n",
    )
    err = one_line_error_in_process(capsys, ["train", "--config", str(blend_run(root, str(mds)))])
    assert f"bad.yaml: splits.train.{key}" in err and problem in err, err


def test_negative_repetitions_is_one_line(root, capsys):
    mds = write_mds(
        root,
        "badrep",
        "    blend_epochized:\n    - {repetitions: -1, path: ./big}\n"
        "    - {repetitions: 1, path: ./small}\n",
    )
    err = one_line_error_in_process(capsys, ["train", "--config", str(blend_run(root, str(mds)))])
    assert "splits.train.blend_epochized[0]: repetitions -1 is out of range" in err


def test_a_bad_weight_from_the_command_line_is_one_line_and_exit_2(root):
    mds = write_mds(
        root,
        "cli",
        "    blend:\n    - {weight: 1, path: ./big}\n    - {weight: -1, path: ./small}\n",
    )
    done = run_cli("train", "--config", str(blend_run(root, str(mds), "cli")), cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "cli.yaml: splits.train.blend[1]: weight -1" in done.stderr


@pytest.mark.parametrize(
    "entry,key",
    [
        ({"step": 1, "weights": {"big": 1.0e30}}, "loader.blend_schedule[0].weights.big"),
        (
            {"step": 1, "weights": {"big": 1e-300, "small": 1}},
            "loader.blend_schedule[0].weights.big",
        ),
        ({"step": 1, "weights": {"big": float("inf")}}, "loader.blend_schedule[0].weights.big"),
        ({"step": 10**20, "weights": {"big": 1}}, "loader.blend_schedule[0].step"),
    ],
)
def test_bad_blend_schedule_entries_are_one_line(root, capsys, entry, key):
    mds = write_mds(
        root,
        "sched",
        "    blend:\n    - {weight: 1, path: ./big}\n    - {weight: 1, path: ./small}\n",
    )
    config = blend_run(root, str(mds), "sched", loader={"blend_schedule": [entry]})
    err = one_line_error_in_process(capsys, ["train", "--config", str(config)])
    assert key in err, err


# --- 3: nothing rounds to 0 silently ---------------------------------------------------------------


def test_repetitions_rounding_to_no_sample_is_refused_naming_entry_and_rounding(root, capsys):
    mds = write_mds(
        root,
        "tinyrep",
        "    blend_epochized:\n    - {repetitions: 1, path: ./big}\n"
        "    - {repetitions: 0.001, path: ./small}\n",
    )
    err = one_line_error_in_process(capsys, ["train", "--config", str(blend_run(root, str(mds)))])
    assert (
        "splits.train.blend_epochized[1]: repetitions 0.001 x 10 samples" in err
        and "rounds to 0" in err
    ), err


def test_weights_rationalised_to_zero_units_are_refused_naming_the_dataset(root, capsys):
    mds = write_mds(
        root,
        "farapart",
        "    blend:\n    - {weight: 1.0e8, path: ./big}\n    - {weight: 1, path: ./small}\n",
    )
    err = one_line_error_in_process(capsys, ["train", "--config", str(blend_run(root, str(mds)))])
    assert "dataset 'small'" in err and "rounds to 0" in err and "blend period" in err, err


# --- 4, 5: empty file, folder without .nv-meta, missing or empty splits -------------------------------


def test_empty_yaml_and_folder_without_nv_meta_are_one_line(root, capsys):
    (root / "empty.yaml").write_text("")
    err = one_line_error_in_process(
        capsys, ["train", "--config", str(blend_run(root, str(root / "empty.yaml")))]
    )
    assert "empty.yaml: not an Energon metadataset (the file is empty" in err
    (root / "plain").mkdir(exist_ok=True)
    mds = write_mds(
        root,
        "nometa",
        "    blend:\n    - {weight: 1, path: ./big}\n    - {weight: 1, path: ./plain}\n",
    )
    err = one_line_error_in_process(capsys, ["train", "--config", str(blend_run(root, str(mds)))])
    assert "nometa.yaml" in err and "plain: not an Energon dataset (no .nv-meta)" in err, err


def test_missing_or_empty_split_of_an_entry_is_one_line_naming_it(root, capsys):
    mds = write_mds(
        root,
        "noval",
        "    blend:\n    - {weight: 1, path: ./big}\n"
        "    - {weight: 1, path: ./small, split_part: val}\n",
    )
    err = one_line_error_in_process(capsys, ["train", "--config", str(blend_run(root, str(mds)))])
    assert "noval.yaml: splits.train.blend[1]:" in err and "no split 'val'" in err, err
    empty = root / "emptytrain"
    if not empty.exists():
        shutil.copytree(root / "small", empty)
        split = empty / ".nv-meta" / "split.yaml"
        doc = yaml.safe_load(split.read_text())
        doc["split_parts"] = {"train": [], "val": doc["split_parts"]["train"]}
        split.write_text(yaml.safe_dump(doc))
    mds = write_mds(
        root,
        "emptymember",
        "    blend:\n    - {weight: 1, path: ./big}\n    - {weight: 1, path: ./emptytrain}\n",
    )
    err = one_line_error_in_process(capsys, ["train", "--config", str(blend_run(root, str(mds)))])
    assert "emptymember.yaml: splits.train.blend[1]:" in err and "no split 'train'" in err, err


def test_val_split_of_a_metadataset_whose_entries_lack_it_is_one_line(root, capsys):
    mds = write_mds(
        root,
        "valmissing",
        "    blend:\n    - {weight: 1, path: ./big}\n"
        "  val:\n    blend:\n    - {weight: 1, path: ./small}\n",
    )
    config = blend_run(root, str(mds), "valrun")
    doc = yaml.safe_load(config.read_text())
    doc["data"]["val_split"] = "val"
    config.write_text(yaml.safe_dump(doc))
    err = one_line_error_in_process(capsys, ["train", "--config", str(config)])
    assert "valmissing.yaml: splits.val.blend[0]:" in err and "no split 'val'" in err, err


# --- 6: preview --------------------------------------------------------------------------------


def test_preview_of_a_plain_folder_or_a_metadataset_without_encoder_is_one_line(root, capsys):
    (root / "plain").mkdir(exist_ok=True)
    err = one_line_error_in_process(
        capsys, ["preview", str(root / "plain"), "--out", str(root / "p.png")]
    )
    assert "plain: not an Energon dataset" in err
    mds = write_mds(root, "prev", "    blend:\n    - {weight: 1, path: ./big}\n")
    err = one_line_error_in_process(capsys, ["preview", str(mds), "--out", str(root / "p.png")])
    assert "prev.yaml: --encoder: cannot choose an encoder" in err and "pass --encoder" in err


# --- 7: surprises ----------------------------------------------------------------------------------


def test_weights_are_exact_as_written(root):
    thirds = write_mds(
        root,
        "thirds",
        "    blend:\n"
        + "".join(f"    - {{weight: 1, path: ./{d}}}\n" for d in ("big", "small", "ds/text")),
    )
    loader = TrainLoader(cfg(thirds))
    assert loader.state_dict()["blend"] == [{"start": 0, "weights": ["1/3", "1/3", "1/3"]}]
    keys = [k.split(":")[0] for _ in range(3) for k in next(loader).keys]
    assert Counter(keys) == {"big": 8, "small": 8, "text": 8}
    decimals = write_mds(
        root,
        "decimals",
        "    blend:\n    - {weight: 0.1, path: ./big}\n    - {weight: 0.2, path: ./small}\n",
    )
    assert TrainLoader(cfg(decimals)).state_dict()["blend"][0]["weights"] == ["1/3", "2/3"]


def test_entry_names_do_not_depend_on_list_order_and_a_clash_is_explained(root):
    one = write_mds(
        root,
        "one",
        "    blend:\n    - {weight: 1, path: ./big}\n    - {weight: 1, path: ./ds/text}\n",
    )
    loader = TrainLoader(cfg(one))
    next(loader)
    state = loader.state_dict()
    loader.close()
    # ds3/text listed before ds/text: ds/text keeps its name, the added one is text#2, resume works
    grown = write_mds(
        root,
        "grown",
        "    blend:\n    - {weight: 1, path: ./big}\n    - {weight: 1, path: ./ds3/text}\n"
        "    - {weight: 1, path: ./ds/text}\n",
    )
    resumed = TrainLoader(cfg(grown))
    assert resumed.plan.datasets.names == ["big", "text", "text#2"]
    assert str(resumed.plan.datasets.entries[1].source.path).endswith("/ds/text")
    resumed.load_state_dict(state)
    resumed.close()
    # an added folder whose path sorts first takes the name: refused, and the message says why
    (root / "aaa").mkdir(exist_ok=True)
    if not (root / "aaa" / "text").exists():
        (root / "aaa" / "text").symlink_to(root / "ds3" / "text")
    clash = write_mds(
        root,
        "clash",
        "    blend:\n    - {weight: 1, path: ./big}\n    - {weight: 1, path: ./ds/text}\n"
        "    - {weight: 1, path: ./aaa/text}\n",
    )
    with pytest.raises(
        StateMismatchError,
        match=r"datasets\.text\..*Note: this run has 2 datasets in folders named "
        r"'text'.*numbered .* in the order of their paths",
    ):
        TrainLoader(cfg(clash)).load_state_dict(state)


def _train(config: Path, *args: str) -> subprocess.CompletedProcess:
    return run_cli("train", "--config", str(config), "--quiet", *args, cwd=REPO)


@pytest.mark.slow
def test_blend_change_at_resume_is_printed_once_and_seq_len_change_names_the_encoder(root):
    mds = write_mds(
        root,
        "resumed",
        "    blend:\n    - {weight: 1, path: ./big}\n    - {weight: 1, path: ./small}\n",
    )
    config = blend_run(root, str(mds), "resumerun", train={"checkpoint_every": 1})
    shutil.rmtree(root / "out-resumerun", ignore_errors=True)
    assert _train(config).returncode == 0
    write_mds(
        root,
        "resumed",
        "    blend:\n    - {weight: 3, path: ./big}\n    - {weight: 1, path: ./small}\n",
    )
    done = _train(config, "--resume", "--steps", "3")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("blend changed at resume") == 1, done.stderr
    short = root / "enc32.yaml"
    short.write_text(Path(IMAGE).read_text().replace("seq_len: 48", "seq_len: 32"))
    done = _train(config, "--resume", "--steps", "4", "--set", f"encoder={short}")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "encoder's seq_len" in done.stderr and "model config" not in done.stderr, done.stderr


# --- 8: tests that kill bugs the suite let through ---------------------------------------------


def test_weights_changed_at_resume_with_accumulation_start_at_the_resume_global_batch(root):
    even = write_mds(
        root,
        "acc",
        "    blend:\n    - {weight: 1, path: ./big}\n    - {weight: 1, path: ./small}\n",
    )
    loader = TrainLoader(cfg(even, micro_batch_size=2))
    assert loader.accumulation == 4
    for _ in range(3 * 4):  # three global batches
        next(loader)
    state = loader.state_dict()
    loader.close()
    write_mds(
        root,
        "acc",
        "    blend:\n    - {weight: 3, path: ./big}\n    - {weight: 1, path: ./small}\n",
    )
    resumed = TrainLoader(cfg(even, micro_batch_size=2))
    resumed.load_state_dict(state)
    assert resumed.plan.blend_changes and "from global batch 3" in resumed.plan.blend_changes[0]
    assert [s["start"] for s in resumed.state_dict()["blend"]] == [0, 3 * 8]
    batch = [k.split(":")[0] for _ in range(4) for k in next(resumed).keys]
    resumed.close()
    assert Counter(batch) == {"big": 6, "small": 2}, (
        "the new weights apply from the resume global batch"
    )


def test_blend_unit_batch_restore_with_another_micro_batch_size_is_refused_naming_it(root):
    even = write_mds(
        root,
        "unit",
        "    blend:\n    - {weight: 1, path: ./big}\n    - {weight: 1, path: ./small}\n",
    )
    loader = TrainLoader(cfg(even, blend_unit="batch", micro_batch_size=4))
    next(loader)
    next(loader)
    state = loader.state_dict()
    loader.close()
    with pytest.raises(StateMismatchError, match=r"blend_unit_samples: saved 4, now 2"):
        TrainLoader(cfg(even, blend_unit="batch", micro_batch_size=2)).load_state_dict(state)


def test_locality_windows_of_an_epoch_have_different_inner_shuffles():
    from energon_platform.loader.orders import DatasetOrder

    order = DatasetOrder(4096, key=12345, shuffle_buffer=256)
    s, span = order.block_size, order.block_size * order.window_blocks
    out = order.indices(0, np.arange(4096))
    assert sorted(out.tolist()) == list(range(4096))
    offsets = [tuple((out[w * span : (w + 1) * span] % s).tolist()) for w in range(4096 // span)]
    assert len(set(offsets)) == len(offsets), (
        "every window must shuffle its samples with its own key"
    )
