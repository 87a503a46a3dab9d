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
places; the ``cpu_megatron`` fixture patches these, for the duration of this module only:

1. ``CLIPViTModel.__init__`` moves its position ids with ``.cuda()``: ``torch.Tensor.cuda`` returns
   the tensor itself while the model is *constructed* (nothing else is built then).
2. The CUDA RNG tracker (``tensor_parallel.get_cuda_rng_tracker().fork()`` around attention
   dropout) needs CUDA RNG states: a tracker whose ``fork`` is a no-op (dropout is 0 here anyway).
3. The global memory buffer (``parallel_state.get_global_memory_buffer().get_tensor``, the
   attention-score buffer of ``DotProductAttention``) allocates on ``torch.cuda.current_device()``:
   allocate on the CPU instead.
4. The default causal mask (``get_default_causal_mask`` in ``fusions/fused_softmax.py``) is built
   with ``device="cuda"``: the same mask on the CPU.
5. Not a GPU assumption but one of Transformer Engine: ``CLIPViTModel``'s ``ln_pre`` defaults to
   TE's norm, falling back to ``torch.nn.LayerNorm``, which megatron-core's ``build_module`` cannot
   build (it passes ``config=``); the fallback is replaced by megatron-core's ``WrappedTorchNorm``.

Packed batches: on GPU Megatron hands ``cu_lengths`` to Transformer Engine's ``thd`` attention
(``PackedSeqParams``); megatron-core's local ``DotProductAttention`` refuses ``packed_seq_params``,
so the test passes the same attention as an explicit block-diagonal causal mask built from
``cu_lengths`` (which must therefore be in spliced coordinates and end at the sequence length).
"""

from __future__ import annotations

import contextlib
import functools
import operator
import os
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO

mcore = pytest.importorskip(
    "megatron.core", reason="megatron-core is a test dependency (pip install -e '.[test]')"
)

from energon_platform.config import load_config  # noqa: E402
from energon_platform.integrations.megatron import (  # noqa: E402
    IGNORE_INDEX,
    MegatronArgsError,
    check_megatron_args,
    make_provider,
    make_provider_from_args,
    megatron_requirements,
)

ENCODERS = REPO / "configs" / "encoders"
PAD = 0


@pytest.fixture(scope="module")
def cpu_megatron():
    """gloo, one rank, tensor/pipeline parallel 1, and the CPU patches of the module doc."""
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.models.vision.clip_vit_model as clip_vit_model
    import megatron.core.tensor_parallel.random as mrandom
    import megatron.core.utils as mutils
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    started = not dist.is_initialized()
    if started:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 500))
        dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)

    class NoCudaRngTracker:  # patch 2
        def fork(self, name=None):
            return contextlib.nullcontext()

        def add(self, name, seed):
            pass

    def cpu_buffer(self, tensor_shape, dtype, name, mem_alloc_context=None):  # patch 3
        return torch.empty(functools.reduce(operator.mul, tensor_shape, 1), dtype=dtype).view(
            *tensor_shape
        )

    saved = (
        mrandom._CUDA_RNG_STATE_TRACKER,
        mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED,
        mutils.GlobalMemoryBuffer.get_tensor,
        fused_softmax.get_default_causal_mask,
        clip_vit_model.CLIPViTModel.__init__.__defaults__,
    )
    mrandom._CUDA_RNG_STATE_TRACKER, mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = (
        NoCudaRngTracker(),
        True,
    )
    mutils.GlobalMemoryBuffer.get_tensor = cpu_buffer
    fused_softmax.get_default_causal_mask = lambda sq: torch.triu(
        torch.ones(sq, sq, dtype=torch.bool), 1
    )  # patch 4
    clip_vit_model.CLIPViTModel.__init__.__defaults__ = tuple(  # patch 5
        WrappedTorchNorm if d is torch.nn.LayerNorm else d for d in saved[4]
    )
    try:
        yield
    finally:
        (
            mrandom._CUDA_RNG_STATE_TRACKER,
            mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED,
            mutils.GlobalMemoryBuffer.get_tensor,
            fused_softmax.get_default_causal_mask,
            clip_vit_model.CLIPViTModel.__init__.__defaults__,
        ) = saved
        parallel_state.destroy_model_parallel()
        if started:
            dist.destroy_process_group()


def tiny_llava(req: dict, max_sequence_length: int):
    """megatron-core's LLaVAModel, sized from the provider's requirements (tile, patch, vocab,
    image token)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.multimodal.llava_model import LLaVAModel
    from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.transformer_config import TransformerConfig

    common = dict(
        use_cpu_initialization=True,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        pipeline_dtype=torch.float32,
    )
    language = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, **common)
    vision = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=2, **common)
    vision.vision_model_type = req["vision_model_type"]
    projection = TransformerConfig(
        num_layers=1, hidden_size=64, ffn_hidden_size=64, num_attention_heads=1, **common
    )
    torch.manual_seed(0)
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # patch 1: construction only
    try:
        model = LLaVAModel(
            language_transformer_config=language,
            language_transformer_layer_spec=get_gpt_layer_local_spec(),
            language_vocab_size=req["vocab_size"],
            language_max_sequence_length=max_sequence_length,
            vision_transformer_config=vision,
            vision_transformer_layer_spec=get_vit_layer_with_local_spec(),
            drop_vision_class_token=req["disable_vision_class_token"],
            vision_projection_config=projection,
            vision_projection_layer_spec=MLPSubmodules(
                linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear
            ),
            img_h=req["img_h"],
            img_w=req["img_w"],
            patch_dim=req["patch_dim"],
            image_token_index=req["image_token_index"],
        )
    finally:
        torch.Tensor.cuda = cuda
    assert (
        model.img_seq_len == req["tokens_per_tile"]
    )  # the encoder counts what the model splices in
    return model


def get_batch(data: dict) -> dict:
    """What examples/multimodal/train.py ``get_batch`` makes of a dict (one rank, no broadcast)."""
    tokens = data["tokens"].long()
    labels = data["labels"][:, 1 : tokens.shape[1] + 1].contiguous()
    loss_mask = torch.ones(labels.shape, dtype=torch.float)
    loss_mask[labels == PAD] = 0.0
    loss_mask[labels == IGNORE_INDEX] = 0.0
    position_ids = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    imgs, num_tiles = data["imgs"], data["num_tiles"]
    if imgs.shape == (1, 1):  # text only
        imgs, num_tiles = torch.zeros((0, 3, 1, 1)), torch.zeros(0, dtype=torch.int32)
    attention_mask = None
    if data["cu_lengths"].shape != (
        1,
        1,
    ):  # packed: the block-diagonal causal mask thd attention applies
        assert data["cu_lengths"].shape[0] == data["max_lengths"].shape[0] == 1, (
            "micro-batch-size must be 1"
        )
        cu = data["cu_lengths"][0].long()
        length = int(cu[-1])
        segment = torch.repeat_interleave(torch.arange(len(cu) - 1), cu[1:] - cu[:-1])
        allowed = (segment[:, None] == segment[None, :]) & torch.tril(
            torch.ones(length, length, dtype=torch.bool)
        )
        attention_mask = ~allowed[None, None]
    return {
        "tokens": tokens,
        "labels": labels,
        "loss_mask": loss_mask,
        "position_ids": position_ids,
        "imgs": imgs,
        "num_tiles": num_tiles,
        "attention_mask": attention_mask,
    }


def forward(model, b: dict):
    output, loss_mask = model(
        b["imgs"],
        b["tokens"],
        b["position_ids"],
        b["attention_mask"],
        labels=b["labels"],
        loss_mask=b["loss_mask"],
        num_image_tiles=b["num_tiles"],
    )
    return (output.float() * loss_mask).sum() / loss_mask.sum().clamp(min=1), loss_mask


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
    train, _, _ = make_provider(cfg, dp_rank=0, dp_size=1, micro_batch_size=mbs, build_valid=False)(
        None
    )
    assert train.image_token_index == req["image_token_index"] == 2047
    batches = [get_batch(next(train)) for _ in range(3)]
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
            _, combined_mask = forward(model, b)
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
        before = float(forward(model, batches[0])[0])
    losses = []
    for step in range(8):
        optimizer.zero_grad()
        loss, _ = forward(model, batches[step % len(batches)])
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        optimizer.step()
        losses.append(loss.item())
    with torch.no_grad():
        after = float(forward(model, batches[0])[0])
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert after < before - 0.5, (case, before, after, losses)
    with capsys.disabled():
        print(
            f"\n[{case}] loss on batch 0: {before:.3f} -> {after:.3f}; steps {[round(x, 3) for x in losses]}"
        )


def cfg_pack_group(cfg) -> int:
    from energon_platform.loader.train_loader import build_encoder

    return int(build_encoder(cfg).packing_buffer_size)


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
    import json
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
    assert (
        req["image_token_index"] == 2047 and req["vocab_size"] == 2049
    )  # <extra> appended after <image>
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
