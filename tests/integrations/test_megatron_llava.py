"""megatron-core's own ``LLaVAModel`` trained on the Megatron provider's batches (CPU, gloo, one rank).

A tiny LLaVA (a 1-layer CLIP ViT on 32-pixel tiles with 8-pixel patches, an MLP projector, a
2-layer GPT over the shipped 2048-token vocabulary) gets exactly what Megatron-LM's
``examples/multimodal/train.py`` ``get_batch`` makes of our dicts, and trains a few Adam steps, for
captions (``image_text`` in vision-language mode, dynamic tiles) and conversations
(``conversation``, several images and text-only samples), unpacked and packed. Checked per case:
forward and backward run, every loss is finite and the loss on a fixed batch falls, the image
embeddings ``LLaVAModel`` splices in sit exactly at the ``<image>`` placeholders (every tile, in
order), and the loss mask it returns covers exactly the answer tokens.

megatron-core (a test-only dependency, pinned in pyproject's ``test`` extra) assumes a GPU in a few
places; the ``cpu_megatron`` fixture enters
:func:`energon_platform.integrations.megatron.llava.cpu_megatron` (its module doc lists the CPU
patches, and how packed batches are masked) for the duration of this module only. The model
(``tiny_llava``), Megatron's ``get_batch`` (``megatron_batch``) and the masked loss
(``llava_loss``) come from that module too; ``energon-platform calibrate`` runs them on its
vision-language micro-batches through ``calibration_model``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from task_encoders.features import MICRO_BATCH_FEATURES
from tests.helpers import REPO
from tests.helpers.cli import run_cli
from tests.helpers.run_configs import loader_config, write_config

mcore = pytest.importorskip(
    "megatron.core", reason="megatron-core is a test dependency (pip install -e '.[test]')"
)

from energon_platform.config import load_config  # noqa: E402
from energon_platform.integrations.megatron import (  # noqa: E402
    MegatronArgsError,
    check_megatron_args,
    llava_loss,
    make_provider,
    make_provider_from_args,
    megatron_batch,
    megatron_requirements,
    tiny_llava,
)
from energon_platform.integrations.megatron import cpu_megatron as cpu_megatron_setup  # noqa: E402

ENCODERS = REPO / "configs" / "encoders"


@pytest.fixture(scope="module")
def cpu_megatron():
    """gloo, one rank, tensor/pipeline parallel 1, and the CPU patches of ``cpu_megatron``."""
    with cpu_megatron_setup():
        yield


def spliced_layout(b: dict, image_token: int, per_tile: int):
    """Where LLaVA puts things: per row, the combined position of every text token, and the
    ``(position, tile)`` of every image embedding, tiles in ``imgs`` order."""
    text_pos, image_pos, tile = [], [], 0
    for row in b["tokens"]:
        pos, positions = 0, []
        for token in row.tolist():
            positions.append(pos)
            if token == image_token:
                n = int(b["num_tiles"][len(image_pos)])
                image_pos.append(
                    [
                        (pos + k * per_tile + e, tile + k, e)
                        for k in range(n)
                        for e in range(per_tile)
                    ]
                )
                tile += n
                pos += n * per_tile
            else:
                pos += 1
        text_pos.append(positions)
    return text_pos, image_pos


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, Path]:
    from converters.convert import ConvertOptions, run_conversion

    out = tmp_path_factory.mktemp("llava")
    done = {}
    for name, kind, args in (
        (
            "coco",
            "coco",
            {
                "annotations": str(REPO / "data/coco_mini/captions.json"),
                "images": str(REPO / "data/coco_mini/images"),
            },
        ),
        (
            "conversations",
            "llava",
            {
                "json_file": str(REPO / "data/coco_mini/conversations.json"),
                "images": str(REPO / "data/coco_mini/images"),
            },
        ),
    ):
        outcome = run_conversion(
            kind, args, ConvertOptions(out=str(out / name), samples_per_shard=64, progress=False)
        )
        assert outcome.ok, outcome.report
        done[name] = out / name
    return done


CASES = {  # id: (dataset, encoder config, micro-batch size, global batch)
    "captions": ("coco", "image_text_vlm_small.yaml", 2, 2),
    "captions-packed": ("coco", "image_text_vlm_small_packed.yaml", 1, 1),
    "conversations": ("conversations", "conversation_small.yaml", 3, 3),
    "conversations-packed": ("conversations", "conversation_small_packed.yaml", 1, 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_llava_trains_on_provider_batches(cpu_megatron, shards, case, capsys):
    dataset, encoder, mbs, gbs = CASES[case]
    cfg = load_config(
        {
            "data": {"path": str(shards[dataset])},
            "encoder": str(ENCODERS / encoder),
            "loader": {"global_batch_size": gbs, "num_workers": 0, "seed": 7},
        }
    )
    req = megatron_requirements(cfg)
    packed = "micro_batch_size" in req
    # Packed: a micro-batch is the pack group's rows flattened, at most pack_group x seq_len positions.
    max_len = req["decoder_seq_length"] * (cfg_pack_group(cfg) if packed else 1)
    model = tiny_llava(req, max_len)
    assert model.img_seq_len == req["tokens_per_tile"]  # the encoder counts what is spliced in
    train, _, _ = make_provider(cfg, dp_rank=0, dp_size=1, micro_batch_size=mbs, build_valid=False)(
        None
    )
    assert train.image_token_index == req["image_token_index"] == 2047
    batches = [megatron_batch(next(train)) for _ in range(3)]
    train.close()
    assert any(b["imgs"].shape[0] > 0 for b in batches)
    if packed:
        assert all(b["attention_mask"] is not None for b in batches)

    # The splice: image embeddings at the placeholders, the loss mask on the answer tokens only.
    captured = {}
    hooks = [
        model.vision_projection.register_forward_hook(
            lambda m, i, o: captured.__setitem__("proj", o)
        ),
        model.language_model.register_forward_pre_hook(
            lambda m, a, kw: captured.__setitem__("input", kw["decoder_input"]), with_kwargs=True
        ),
    ]
    for b in batches:
        with torch.no_grad():
            _, combined_mask = llava_loss(model, b)
        text_pos, image_pos = spliced_layout(b, req["image_token_index"], req["tokens_per_tile"])
        embeddings = captured["input"]  # [s, b, h]
        assert embeddings.shape[0] <= max_len
        if packed:
            assert embeddings.shape[0] == int(torch.as_tensor(b["attention_mask"].shape[-1]))
        image = 0
        for row, positions in enumerate(text_pos):
            for _placeholder in (
                (b["tokens"][row] == req["image_token_index"]).nonzero().flatten().tolist()
            ):
                for pos, tile, e in image_pos[image]:
                    assert torch.equal(embeddings[pos, row], captured["proj"][e, tile]), (
                        case,
                        row,
                        pos,
                    )
                image += 1
            answer_positions = {
                positions[t] for t in (b["loss_mask"][row] > 0).nonzero().flatten().tolist()
            }
            assert set((combined_mask[row] > 0).nonzero().flatten().tolist()) == answer_positions, (
                case,
                row,
            )
        assert image == b["num_tiles"].numel()
        assert int(combined_mask.sum()) == int(b["loss_mask"].sum()) > 0
    for h in hooks:
        h.remove()

    # Training: finite losses, and the loss on the first batch falls.
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    with torch.no_grad():
        before = float(llava_loss(model, batches[0])[0])
    losses = []
    for step in range(8):
        optimizer.zero_grad()
        loss, _ = llava_loss(model, batches[step % len(batches)])
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        optimizer.step()
        losses.append(loss.item())
    with torch.no_grad():
        after = float(llava_loss(model, batches[0])[0])
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert after < before - 0.5, (case, before, after, losses)
    with capsys.disabled():
        print(
            f"\n[{case}] loss on batch 0: {before:.3f} -> {after:.3f}; steps {[round(x, 3) for x in losses]}"
        )


def cfg_pack_group(cfg) -> int:
    from energon_platform.loader.train_loader import build_encoder

    return int(build_encoder(cfg).packing_buffer_size)


def test_the_vision_tower_is_sized_as_asked(cpu_megatron, shards):
    """``tiny_llava``'s vision tower: 1 layer of 32 by default, else the layers and width asked
    for (the bench's ``llava`` section sizes it so the tiles take a real share of the time)."""
    cfg = load_config(
        {
            "data": {"path": str(shards["coco"])},
            "encoder": str(ENCODERS / "image_text_vlm_small.yaml"),
            "loader": {"global_batch_size": 1, "num_workers": 0, "seed": 7},
        }
    )
    req = megatron_requirements(cfg)
    for asked, (layers, width) in (
        ({}, (1, 32)),
        ({"vision_layers": 3, "vision_hidden": 48}, (3, 48)),
    ):
        tower = tiny_llava(req, req["decoder_seq_length"], **asked).vision_model
        assert (tower.config.num_layers, tower.config.hidden_size) == (layers, width)


def test_provider_checks_megatrons_arguments(cpu_megatron, shards, tmp_path):
    from types import SimpleNamespace

    cfg = load_config(
        {
            "data": {"path": str(shards["conversations"])},
            "encoder": str(ENCODERS / "conversation_small.yaml"),
            "loader": {"global_batch_size": 2, "num_workers": 0},
        }
    )
    good = dict(
        dataloader_type="external",
        decoder_seq_length=256,
        seq_length=16,
        micro_batch_size=2,
        global_batch_size=2,
        data_parallel_size=1,
        special_tokens=["<image>"],
        img_h=32,
        img_w=32,
        patch_dim=8,
        vision_model_type="clip",
        disable_vision_class_token=True,
        pixel_shuffle=False,
        use_tiling=True,
        max_num_tiles=4,
        use_thumbnail=True,
        use_area_weighted_aspect_ratio=False,
        use_tile_tags=False,
        padded_vocab_size=2048,
        num_workers=0,
        load=None,
        iteration=0,
        dataloader_save=None,
        tokenizer_model=str(REPO / "task_encoders/assets/tokenizer"),
    )
    assert check_megatron_args(cfg, SimpleNamespace(**good))["image_token_index"] == 2047
    provider = make_provider_from_args(cfg, SimpleNamespace(**good), dp_rank=0, build_valid=False)
    train, _, _ = provider(None)
    assert train.image_token_index == 2047 and train.max_sequence_length == 256
    train.close()
    for change, message in (
        ({"dataloader_type": "single"}, "--dataloader-type is 'single'"),
        ({"decoder_seq_length": 128}, "--decoder-seq-length 128 < the encoder's text.seq_len 256"),
        ({"max_num_tiles": 6}, "--max-num-tiles is 6"),
        ({"use_thumbnail": False}, "--use-thumbnail is False"),
        ({"img_h": 336}, "--img-h is 336"),
        ({"disable_vision_class_token": False}, "--disable-vision-class-token"),
        ({"special_tokens": ["<img>", "<image>"]}, "--special-tokens"),
        ({"use_tile_tags": True}, "tile tags"),
    ):
        with pytest.raises(MegatronArgsError, match=message):
            make_provider_from_args(
                cfg, SimpleNamespace(**{**good, **change}), dp_rank=0, build_valid=False
            )(None)
    # A user's own tokenizer folder without <image>: Megatron appends it (--special-tokens), and so
    # does the encoder: the ids agree. Megatron's own tokenizer object is compared directly.
    import shutil

    from transformers import AutoTokenizer

    own = tmp_path / "own_tokenizer"
    shutil.copytree(REPO / "task_encoders/assets/tokenizer", own)
    doc = json.loads((own / "tokenizer.json").read_text())
    doc["added_tokens"] = [t for t in doc["added_tokens"] if t["content"] != "<image>"]
    (own / "tokenizer.json").write_text(json.dumps(doc))
    conf = json.loads((own / "tokenizer_config.json").read_text())
    conf["added_tokens_decoder"] = {
        k: v for k, v in conf["added_tokens_decoder"].items() if v["content"] != "<image>"
    }
    (own / "tokenizer_config.json").write_text(json.dumps(conf))
    assert "<image>" not in AutoTokenizer.from_pretrained(str(own)).get_vocab()
    cfg_own = load_config(
        {
            "data": {"path": str(shards["conversations"])},
            "encoder": {
                **_yaml(ENCODERS / "conversation_small.yaml"),
                "text": {"seq_len": 256, "tokenizer": str(own)},
                "prompt": {"special_tokens": ["<image>", "<extra>"]},
            },
            "loader": {"global_batch_size": 2, "num_workers": 0},
        }
    )
    two = {
        **good,
        "special_tokens": ["<image>", "<extra>"],
        "tokenizer_model": str(own),
        "padded_vocab_size": 2176,
    }
    req = check_megatron_args(cfg_own, SimpleNamespace(**two))  # loads the folder as Megatron would
    # <extra> appended after <image>
    assert req["image_token_index"] == 2047 and req["vocab_size"] == 2049
    megatron_tok = AutoTokenizer.from_pretrained(str(own))
    megatron_tok.add_tokens(["<image>", "<extra>"], special_tokens=True)
    check_megatron_args(cfg_own, SimpleNamespace(**two), tokenizer=megatron_tok)
    swapped = AutoTokenizer.from_pretrained(str(own))
    swapped.add_tokens(["<extra>", "<image>"], special_tokens=True)
    with pytest.raises(MegatronArgsError, match="gives <image> the id 2048, the batches use 2047"):
        check_megatron_args(cfg_own, SimpleNamespace(**two), tokenizer=swapped)
    with pytest.raises(MegatronArgsError, match="padded vocab size 2048 < the tokenizer's 2049"):
        check_megatron_args(cfg_own, SimpleNamespace(**{**two, "padded_vocab_size": 2048}))


def _yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def test_calibrate_command_times_megatrons_llava(shards, tmp_path):
    """``energon-platform calibrate --model ...llava:calibration_model`` on the tiny
    vision-language captions (a real CLI process: the CPU set-up is entered inside it). The times
    of a shared machine are noisy, so the fit's quality is not asserted: either the cost file is
    written naming the model, with non-negative coefficients, or the p90 refusal is one line and
    writes nothing; the table of measured vs predicted times is printed either way."""
    config = write_config(
        tmp_path / "run.yaml",
        loader_config(shards["coco"], ENCODERS / "image_text_vlm_small.yaml", global_batch_size=2),
    )
    out = tmp_path / "cost.json"
    model = "energon_platform.integrations.megatron.llava:calibration_model"
    argv = ["calibrate", "--config", config, "--model", model, "--out", out, "--no-progress"]
    done = run_cli(*argv, "--micro-batches", 4, "--repeats", 1, timeout=300)
    assert "measured ms" in done.stdout and done.stdout.count("(held back)") == 1, done.stderr
    assert "p90 error" in done.stdout
    if done.returncode == 0:
        report = json.loads(out.read_text())
        assert report["model"] == model and report["micro_batches"] == 4
        assert set(report["coefficients"]) == set(MICRO_BATCH_FEATURES)
        assert report["format_version"] == 2
        assert all(c >= 0 for c in report["coefficients"].values()), report["coefficients"]
        assert sum(report["coefficients"].values()) > 0
        assert f"wrote {out}" in done.stdout
    else:
        assert done.returncode == 2 and not out.exists(), done.stderr
        error = done.stderr.strip().splitlines()[-1]
        assert "p90 relative error" in error and error.startswith(
            "energon-platform calibrate: error: "
        ), done.stderr
