"""megatron-core's own ``LLaVAModel`` on the provider's batches, on a CPU: the set-up
(`cpu_megatron`), a tiny model sized from `megatron_requirements` (`tiny_llava`),
what Megatron-LM's ``examples/multimodal/train.py`` ``get_batch`` makes of a provider dict
(`megatron_batch`), the masked loss (`llava_loss`), and a factory for
``energon-platform calibrate --model`` (`calibration_model`).

megatron-core is a test-only dependency: it is imported inside the functions, and a missing one
is one line naming ``pip install megatron-core``.

megatron-core assumes a GPU in a few places. `cpu_megatron` patches these while it is
entered, and only where no CUDA device is available (patch 5 only where Transformer Engine is
missing); everything is restored on exit:

1. ``CLIPViTModel.__init__`` moves its position ids with ``.cuda()``: ``torch.Tensor.cuda``
   returns the tensor itself while `tiny_llava` *constructs* the model (nothing else is
   built then).
2. The CUDA RNG tracker (``tensor_parallel.get_cuda_rng_tracker().fork()`` around attention
   dropout) needs CUDA RNG states: a tracker whose ``fork`` is a no-op (dropout is 0 here anyway).
3. The global memory buffer (``parallel_state.get_global_memory_buffer().get_tensor``, the
   attention-score buffer of ``DotProductAttention``) allocates on
   ``torch.cuda.current_device()``: allocate on the CPU instead.
4. The default causal mask (``get_default_causal_mask`` in ``fusions/fused_softmax.py``) is built
   with ``device="cuda"``: the same mask on the CPU.
5. Not a GPU assumption but one of Transformer Engine: ``CLIPViTModel``'s ``ln_pre`` defaults to
   TE's norm, falling back to ``torch.nn.LayerNorm``, which megatron-core's ``build_module``
   cannot build (it passes ``config=``); the fallback is replaced by megatron-core's
   ``WrappedTorchNorm``.

Packed batches: on GPU Megatron hands ``cu_lengths`` to Transformer Engine's ``thd`` attention
(``PackedSeqParams``); megatron-core's local ``DotProductAttention`` refuses
``packed_seq_params``, so `megatron_batch` passes the same attention as an explicit
block-diagonal causal mask built from ``cu_lengths`` (which must therefore be in spliced
coordinates and end at the sequence length).
"""

from __future__ import annotations

import contextlib
import functools
import operator
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from energon_platform.integrations.megatron.args import megatron_requirements
from energon_platform.integrations.megatron.batches import IGNORE_INDEX, to_megatron_batch
from energon_platform.training.calibrate import CalibrationError
from task_encoders.abilities import packing_buffer
from task_encoders.documents import DocumentTaskEncoder

#: The pad id `megatron_batch` masks by default (the shipped tokenizer's).
PAD_ID = 0


def require_megatron_core() -> None:
    """ImportError (one line naming ``pip install megatron-core``) when megatron-core is missing."""
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        raise ImportError(
            "megatron-core is not installed: pip install megatron-core (or pip install -e '.[test]')"
        ) from None


@contextlib.contextmanager
def cpu_megatron() -> Iterator[None]:
    """One process as Megatron's whole world: a gloo process group of world size 1 (an in-memory
    store, no port) unless one exists, tensor/pipeline model parallel 1 x 1 unless initialised,
    and, without CUDA, the CPU patches 2-5 of the module doc. On exit everything it set up is
    torn down and every patched attribute restored."""
    require_megatron_core()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_one_rank_world())
        if not torch.cuda.is_available():
            stack.enter_context(_cpu_patches())
        yield


@contextlib.contextmanager
def _one_rank_world() -> Iterator[None]:
    """gloo with world size 1 and model parallel 1 x 1, each only when not already there."""
    from megatron.core import parallel_state

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    initialised = not parallel_state.model_parallel_is_initialized()
    if initialised:
        parallel_state.initialize_model_parallel(1, 1)
    try:
        yield
    finally:
        if initialised:
            parallel_state.destroy_model_parallel()
        if started:
            dist.destroy_process_group()


class _NoCudaRngTracker:
    """Patch 2: the CUDA RNG tracker's interface, forking nothing."""

    def fork(self, name: str | None = None) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def add(self, name: str, seed: int) -> None:
        pass


def _cpu_buffer(self, tensor_shape, dtype, name, mem_alloc_context=None) -> torch.Tensor:
    """Patch 3: ``GlobalMemoryBuffer.get_tensor``, allocated on the CPU."""
    size = functools.reduce(operator.mul, tensor_shape, 1)
    return torch.empty(size, dtype=dtype).view(*tensor_shape)


def _cpu_causal_mask(sq: int) -> torch.Tensor:
    """Patch 4: ``get_default_causal_mask`` on the CPU (True above the diagonal: masked)."""
    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), 1)


@contextlib.contextmanager
def _cpu_patches() -> Iterator[None]:
    """Patches 2-5 of the module doc, restored on exit."""
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.models.vision.clip_vit_model as clip_vit_model
    import megatron.core.tensor_parallel.random as mrandom
    import megatron.core.utils as mutils
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    init = clip_vit_model.CLIPViTModel.__init__
    saved = (
        mrandom._CUDA_RNG_STATE_TRACKER,
        mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED,
        mutils.GlobalMemoryBuffer.get_tensor,
        fused_softmax.get_default_causal_mask,
        init.__defaults__,
    )
    mrandom._CUDA_RNG_STATE_TRACKER = _NoCudaRngTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    mutils.GlobalMemoryBuffer.get_tensor = _cpu_buffer
    fused_softmax.get_default_causal_mask = _cpu_causal_mask
    # patch 5 (a no-op where TE's norm is the default)
    init.__defaults__ = tuple(WrappedTorchNorm if d is torch.nn.LayerNorm else d for d in saved[4])
    try:
        yield
    finally:
        (
            mrandom._CUDA_RNG_STATE_TRACKER,
            mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED,
            mutils.GlobalMemoryBuffer.get_tensor,
            fused_softmax.get_default_causal_mask,
            init.__defaults__,
        ) = saved


@contextlib.contextmanager
def _tensor_cuda_is_identity() -> Iterator[None]:
    """Patch 1 (without CUDA only): ``torch.Tensor.cuda`` returns the tensor itself."""
    if torch.cuda.is_available():
        yield
        return
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = cuda


def tiny_llava(
    requirements: dict,
    max_sequence_length: int,
    *,
    vision_layers: int = 1,
    vision_hidden: int = 32,
) -> torch.nn.Module:
    """megatron-core's ``LLaVAModel`` (a CLIP ViT of ``vision_layers`` layers of
    ``vision_hidden`` (2 heads), an MLP projector, a 2-layer GPT of 64; fp32, no dropout,
    CPU-initialised, seed 0), sized from `megatron_requirements` (tile, patch, vocabulary,
    vision model type, class token, image token). Call inside `cpu_megatron`. ``ValueError`` when
    the model splices in another number of embeddings per tile than the encoder counts."""
    require_megatron_core()
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.multimodal.llava_model import LLaVAModel
    from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.transformer_config import TransformerConfig

    req = requirements
    common = dict(
        use_cpu_initialization=True,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        pipeline_dtype=torch.float32,
    )
    language = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, **common)
    vision = TransformerConfig(
        num_layers=vision_layers, hidden_size=vision_hidden, num_attention_heads=2, **common
    )
    vision.vision_model_type = req["vision_model_type"]
    projection = TransformerConfig(
        num_layers=1, hidden_size=64, ffn_hidden_size=64, num_attention_heads=1, **common
    )
    torch.manual_seed(0)
    with _tensor_cuda_is_identity():
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
    if model.img_seq_len != req["tokens_per_tile"]:  # the encoder counts what is spliced in
        raise ValueError(
            f"LLaVAModel splices {model.img_seq_len} embeddings per tile, the encoder counts "
            f"{req['tokens_per_tile']}"
        )
    return model


def megatron_batch(data: dict, pad_id: int = PAD_ID) -> dict:
    """What ``examples/multimodal/train.py`` ``get_batch`` makes of a provider dict
    (`to_megatron_batch`, ``"multimodal"``) on one rank (no broadcast): ``tokens``,
    ``labels`` shifted to next-token targets, ``loss_mask`` (0 at ``pad_id`` and
    ``IGNORE_INDEX``), ``position_ids``, ``imgs``/``num_tiles`` (empty for a text-only batch) and
    ``attention_mask`` (None unpacked; packed: the block-diagonal causal mask, True = masked, that
    ``thd`` attention applies to ``cu_lengths``)."""
    tokens = data["tokens"].long()
    labels = data["labels"][:, 1 : tokens.shape[1] + 1].contiguous()
    loss_mask = torch.ones(labels.shape, dtype=torch.float)
    loss_mask[labels == pad_id] = 0.0
    loss_mask[labels == IGNORE_INDEX] = 0.0
    position_ids = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    imgs, num_tiles = data["imgs"], data["num_tiles"]
    if imgs.shape == (1, 1):  # text only
        imgs, num_tiles = torch.zeros((0, 3, 1, 1)), torch.zeros(0, dtype=torch.int32)
    packed = data["cu_lengths"].shape != (1, 1)
    return {
        "tokens": tokens,
        "labels": labels,
        "loss_mask": loss_mask,
        "position_ids": position_ids,
        "imgs": imgs,
        "num_tiles": num_tiles,
        "attention_mask": _packed_attention_mask(data) if packed else None,
    }


def _packed_attention_mask(data: dict) -> torch.Tensor:
    """``(1, 1, L, L)`` bool, True where a position may not attend: across the ``cu_lengths``
    segments, or ahead of itself."""
    if not data["cu_lengths"].shape[0] == data["max_lengths"].shape[0] == 1:
        raise ValueError("a packed batch must be one sequence (Megatron's micro-batch-size 1)")
    cu = data["cu_lengths"][0].long()
    length = int(cu[-1])
    segment = torch.repeat_interleave(torch.arange(len(cu) - 1), cu[1:] - cu[:-1])
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool))
    return ~((segment[:, None] == segment[None, :]) & causal)[None, None]


def llava_loss(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean loss over the masked positions, the loss mask LLaVAModel returns)`` of ``model``
    on a `megatron_batch` dict (the mean is over at least one position)."""
    output, loss_mask = model(
        batch["imgs"],
        batch["tokens"],
        batch["position_ids"],
        batch["attention_mask"],
        labels=batch["labels"],
        loss_mask=batch["loss_mask"],
        num_image_tiles=batch["num_tiles"],
    )
    return (output.float() * loss_mask).sum() / loss_mask.sum().clamp(min=1), loss_mask


class LLaVACalibrationModel(torch.nn.Module):
    """``forward(batch)``: one of the loader's vision-language micro-batches → the provider's
    dict (`to_megatron_batch`) → `megatron_batch` → `llava_loss`'s scalar
    loss, on the model's device. Holds the `cpu_megatron` set-up open for its lifetime
    (released by `close`, or when it is garbage-collected)."""

    def __init__(self, model: torch.nn.Module, packed: bool, pad_id: int, setup: Any):
        super().__init__()
        self.llava, self.packed, self.pad_id = model, packed, pad_id
        self._release = weakref.finalize(self, setup.close)

    def forward(self, batch: Any) -> torch.Tensor:
        data = megatron_batch(to_megatron_batch(batch, packed=self.packed), self.pad_id)
        device = next(self.llava.parameters()).device
        data = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in data.items()}
        return llava_loss(self.llava, data)[0]

    def close(self) -> None:
        """Tear down the `cpu_megatron` set-up (once; later calls do nothing)."""
        self._release()


def calibration_model(encoder: Any, **vision: int) -> LLaVACalibrationModel:
    """``energon-platform calibrate --model
    energon_platform.integrations.megatron.llava:calibration_model``: `tiny_llava` sized
    for ``encoder`` (a vision-language encoder: ``image_text`` with ``vision`` or
    ``conversation``), its vision tower sized by ``vision`` (`tiny_llava`'s ``vision_layers``,
    ``vision_hidden``), inside `cpu_megatron` kept entered while the model lives; on a CUDA
    device the model runs there and no patch is applied. ``CalibrationError`` (one line) when
    megatron-core is missing or the encoder has no image placeholder."""
    try:
        require_megatron_core()
    except ImportError as e:
        raise CalibrationError(str(e)) from None
    req = megatron_requirements(encoder)
    if "image_token_index" not in req:
        raise CalibrationError(
            f"encoder {type(encoder).__name__} has no <image> placeholder: LLaVAModel needs a "
            "vision-language encoder (image_text with a vision section, or conversation)"
        )
    buffer = packing_buffer(encoder)
    packed = buffer is not None
    # Packed: a micro-batch is the pack group's rows flattened into one sequence.
    length = req["decoder_seq_length"] * (buffer or 1)
    setup = contextlib.ExitStack()
    setup.enter_context(cpu_megatron())
    try:
        model = tiny_llava(req, length, **vision)
    except BaseException:
        setup.close()
        raise
    if torch.cuda.is_available():
        model = model.cuda()
    return LLaVACalibrationModel(model, packed, _pad_id(encoder), setup)


def _pad_id(encoder: DocumentTaskEncoder) -> int:
    """The pad id of the encoder's tokenizer (a vision-language encoder's `TextTokenizer`)."""
    return int(encoder.tokenizer.special.pad)
