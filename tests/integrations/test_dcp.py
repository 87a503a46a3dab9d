"""The loader through torch.distributed.checkpoint (torchtitan's way): no pickle, elastic, blends."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
import torch
import torch.distributed.checkpoint as dcp
import yaml

from energon_platform.config import load_config
from energon_platform.integrations.dcp import KEY, DCPLoader, decode_state, encode_state
from energon_platform.loader.state import StateMismatchError
from energon_platform.loader.train_loader import TrainLoader
from energon_platform.training.resume_check.processes import torchrun_argv
from tests.conftest import _convert, _image_item
from tests.helpers import REPO

IMAGE = str(REPO / "configs/encoders/image_text_small.yaml")


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    root = tmp_path_factory.mktemp("dcp")
    for name, n, offset in (("a", 20, 0), ("b", 8, 300)):
        _convert(
            "image_text",
            [_image_item(offset + i, False) for i in range(n)],
            root / f"raw-{name}",
            root / name,
        )
    path = root / "blend.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "__module__": "megatron.energon",
                "__class__": "MetadatasetV2",
                "splits": {
                    "train": {"blend": [{"weight": 2, "path": "./a"}, {"weight": 1, "path": "./b"}]}
                },
            }
        )
    )
    return path


def config(path):
    return {
        "data": {"path": str(path), "val_split": None},
        "encoder": IMAGE,
        "loader": {"global_batch_size": 6, "num_workers": 0, "seed": 5},
    }


def test_state_round_trips_as_a_byte_tensor_and_garbage_is_refused():
    state = {"version": 2, "x": [1, "two"]}
    assert decode_state(encode_state(state)) == state
    with pytest.raises(StateMismatchError, match="not a loader state"):
        decode_state(torch.full((16,), 255, dtype=torch.uint8))
    with pytest.raises(StateMismatchError, match="uint8"):
        decode_state(torch.zeros(4))


def test_dcp_save_and_load_continue_a_blend_exactly(blend, tmp_path):
    cfg = load_config(config(blend))
    straight = TrainLoader(cfg)
    reference = [list(next(straight).keys) for _ in range(7)]
    straight.close()
    loader = DCPLoader(TrainLoader(cfg))
    for _ in range(3):
        next(loader)
    dcp.save({"dataloader": loader}, checkpoint_id=str(tmp_path / "ckpt"))
    loader.close()
    resumed = DCPLoader(TrainLoader(cfg, num_workers=2))
    dcp.load({"dataloader": resumed}, checkpoint_id=str(tmp_path / "ckpt"))
    assert [list(next(resumed).keys) for _ in range(4)] == reference[3:]
    resumed.close()
    with pytest.raises(StateMismatchError):
        DCPLoader(TrainLoader(cfg)).load_state_dict({"other": 1})


LOOP = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from energon_platform.config import load_config
    from energon_platform.integrations.dcp import DCPLoader
    from energon_platform.loader.train_loader import TrainLoader
    cfg_dict, ckpt, steps, mode, out = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = DCPLoader(TrainLoader(load_config(cfg_dict), rank=rank, world_size=world, num_workers=1))
    if mode == "load":
        dcp.load({"dataloader": loader}, checkpoint_id=ckpt)
    rows = []
    for _ in range(steps):
        keys = [None] * world
        dist.all_gather_object(keys, list(next(loader).keys))
        rows.append([k for part in keys for k in part])
    if mode == "save":
        dcp.save({"dataloader": loader}, checkpoint_id=ckpt)
    if rank == 0:
        open(out, "w").write(json.dumps(rows))
    loader.close()
    dist.destroy_process_group()
""")


def torchrun(script, nproc, *args):
    subprocess.run(
        torchrun_argv(nproc, script, *args),
        check=True,
        capture_output=True,
        timeout=300,
    )


@pytest.mark.slow
def test_dcp_checkpoint_from_two_ranks_resumes_on_one(blend, tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    cfg = json.dumps(config(blend))
    torchrun(script, 1, cfg, tmp_path / "unused", 6, "none", tmp_path / "straight.json")
    torchrun(script, 2, cfg, tmp_path / "ckpt", 2, "save", tmp_path / "before.json")
    torchrun(script, 1, cfg, tmp_path / "ckpt", 4, "load", tmp_path / "after.json")
    straight = json.loads((tmp_path / "straight.json").read_text())
    before, after = (
        json.loads((tmp_path / "before.json").read_text()),
        json.loads((tmp_path / "after.json").read_text()),
    )
    assert before == straight[:2] and after == straight[2:]
    # the checkpoint holds the state once, as tensor data (no pickled loader object)
    meta = dcp.FileSystemReader(str(tmp_path / "ckpt")).read_metadata()
    assert any(KEY in k for k in meta.state_dict_metadata)


def test_dcp_takes_balanced_fixed_shape_batches_unchanged(blend, tmp_path):
    """``loader.balance`` through DCP: the plan (position and carried samples) rides in the same
    byte tensor; the resumed loader continues with the same rows and shapes."""
    cfg = load_config(
        {
            **config(blend),
            "encoder": str(REPO / "configs/encoders/image_text_small_packed.yaml"),
            "loader": {
                "global_batch_size": 4,
                "micro_batch_size": 2,
                "num_workers": 0,
                "seed": 5,
                "balance": "tokens",
                "length_cache": str(tmp_path / "lengths"),
            },
        }
    )
    straight = TrainLoader(cfg)
    reference = [next(straight) for _ in range(7)]
    straight.close()
    assert {tuple(b.tokens.shape) for b in reference} == {(2, reference[0].tokens.shape[1])}
    loader = DCPLoader(TrainLoader(cfg))
    for _ in range(4):
        next(loader)
    dcp.save({"dataloader": loader}, checkpoint_id=str(tmp_path / "ckpt"))
    loader.close()
    resumed = DCPLoader(TrainLoader(cfg, num_workers=1))
    dcp.load({"dataloader": resumed}, checkpoint_id=str(tmp_path / "ckpt"))
    assert [list(next(resumed).keys) for _ in range(3)] == [list(b.keys) for b in reference[4:]]
    resumed.close()
