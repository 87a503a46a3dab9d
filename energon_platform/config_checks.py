"""The checks of a run config that no section can make alone: the loader's keys against the encoder
the config builds, and the model against what that encoder makes.

`load_config` checks each section by itself (types, ranges, keys of one table that exclude each
other). What needs the encoder (whether it packs, pads its segments, states lengths and costs: its
abilities, `task_encoders.abilities`) or an encoded sample is checked here, once that exists:

- `check_with_encoder`, when the loader builds the encoder (`build_encoder`): the mixing
  method's options against the ranges the method declares (`check_mixing`: the declarations live
  beside each method, in the loader's mixing room, which this module may read and the config may
  not), context parallelism, the pack group, the blend unit and the balance mode;
- `check_model_fits`, when the trainer's preflight has encoded a sample: the model's patch.

Every refusal is one `ConfigError` naming the file, the key to change and what it must be.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from energon_platform.loader.balance.costs import COST_MODELS
from energon_platform.loader.context_parallel import segment_multiple
from energon_platform.loader.mixing.method import options_problem
from task_encoders.abilities import StatesLengths, missing, packing_buffer, packs, pads_segments
from task_encoders.config_parser import ConfigError

if TYPE_CHECKING:
    from energon_platform.config import ModelConfig, RunConfig
    from task_encoders.base import SeededTaskEncoder


def check_with_encoder(cfg: RunConfig, encoder: SeededTaskEncoder) -> None:
    """Refuse a loader config that ``encoder`` cannot serve, or whose mixing options are out of
    range (one-line `ConfigError`)."""
    check_mixing(cfg)
    _check_context_parallel(cfg, encoder)
    _check_pack_group(cfg, encoder)
    _check_blend_unit(cfg)
    if cfg.loader.balance.planned:
        _check_balance(cfg, encoder)


def check_mixing(cfg: RunConfig) -> None:
    """``loader.blend_adapt.options``: options the method has, each in the range it declares
    (`energon_platform.loader.mixing.method.Option`); `ConfigError` naming the file and the key."""
    adapt = cfg.loader.blend_adapt
    problem = options_problem(adapt.method, adapt.options) if adapt is not None else None
    if problem is None:
        return
    option, what, expected = problem
    key = "loader.blend_adapt.options" + (f".{option}" if option else "")
    raise ConfigError(cfg.source, key, what + (f" (expected {expected})" if expected else ""))


def pack_group(configured: int | None, encoder: object) -> int:
    """Samples per pack group: ``loader.pack_group``, or the encoder's packing buffer (1 without
    packing) when null. `check_with_encoder` has refused a group the encoder disagrees with."""
    return configured if configured is not None else (packing_buffer(encoder) or 1)


def _check_context_parallel(cfg: RunConfig, encoder: object) -> None:
    """``loader.context_parallel: N > 1`` needs an encoder that packs (`Packs`), pads its segments
    exactly (`PadsSegments`) and has a ``seq_len`` that is a multiple of ``2N``."""
    n = cfg.loader.context_parallel
    if n == 1:
        return
    name = type(encoder).__name__
    if not packs(encoder):
        problem = (
            f"{name} does not pack; context parallelism splits packed rows "
            "(set packing.enabled: true in the encoder config, or context_parallel: 1)"
        )
    elif not pads_segments(encoder):
        problem = (
            f"{name} cannot pad its documents' segments for context parallelism "
            "(its row lengths are not token positions); use context_parallel: 1"
        )
    elif encoder.seq_len % segment_multiple(n):
        problem = (
            f"text.seq_len {encoder.seq_len} is not a multiple of {segment_multiple(n)} "
            "(2 x context_parallel); change one of them"
        )
    else:
        return
    raise ConfigError(cfg.source, "loader.context_parallel", f"{n}: {problem}")


def _check_pack_group(cfg: RunConfig, encoder: object) -> None:
    """``loader.pack_group`` and the encoder's ``packing.enabled`` agree on whether to pack."""
    configured, buffer = cfg.loader.pack_group, packing_buffer(encoder)
    if configured is not None and configured > 1 and not buffer:
        raise ConfigError(
            cfg.source,
            "loader.pack_group",
            f"{configured} asks for packing, but the encoder's "
            "packing.enabled is false (set it, or pack_group: 1)",
        )
    if configured == 1 and buffer:
        raise ConfigError(
            cfg.source,
            "loader.pack_group",
            "1 disables packing, but the encoder's packing.enabled is "
            "true (use pack_group >= 2 or null)",
        )


def _check_blend_unit(cfg: RunConfig) -> None:
    """``blend_unit: batch`` takes whole micro-batches from one dataset: the micro-batch size must
    be fixed."""
    if cfg.loader.blend_unit == "batch" and cfg.loader.micro_batch_size is None:
        raise ConfigError(
            cfg.source,
            "loader.micro_batch_size",
            "blend_unit: batch takes whole micro-batches "
            "from one dataset, so the micro-batch size must be fixed (set micro_batch_size)",
        )


def _check_balance(cfg: RunConfig, encoder: object) -> None:
    """``loader.balance`` needs an encoder that states its lengths (`StatesLengths`) and what its
    cost function reads of it (`CostFunction.needs`: cost features for ``measured``, its own cost
    for ``encoder``), each missing method named; ``global_batch_tokens`` is a budget of unpacked
    samples (packed rows are a fixed size already)."""
    balance, name = cfg.loader.balance, type(encoder).__name__
    packed = packs(encoder) and pack_group(cfg.loader.pack_group, encoder) > 1
    if packed and balance.global_batch_tokens is not None:
        raise ConfigError(
            cfg.source,
            "loader.balance.global_batch_tokens",
            f"{balance.global_batch_tokens} with a packing encoder, whose global batches are "
            f"global_batch_size rows of seq_len={encoder.seq_len} already (null, or an encoder "
            "without packing)",
        )
    gone = missing(encoder, StatesLengths)
    if gone:
        raise ConfigError(
            cfg.source,
            "loader.balance",
            f"{balance.mode!r} needs lengths before decoding, but "
            f"{name} has no {', '.join(gone)} (see docs: balance)",
        )
    function = COST_MODELS[balance.mode]
    gone = missing(encoder, function.needs) if function.needs is not None else ()
    if gone:
        raise ConfigError(
            cfg.source,
            "loader.balance",
            f"{balance.mode!r} {function.reads}, but {name} has no {', '.join(gone)}",
        )


def check_model_fits(model: ModelConfig, encoded: Any, source: str) -> None:
    """``model.patch`` no larger than the encoded images (``encoded``: one encoded sample)."""
    image = getattr(encoded, "media", {}).get("image")
    if image is not None and model.patch > min(image.shape[-2:]):
        raise ConfigError(
            source,
            "model.patch",
            f"{model.patch} is larger than the encoder's images "
            f"({image.shape[-2]}x{image.shape[-1]}) (expected <= {min(image.shape[-2:])})",
        )
