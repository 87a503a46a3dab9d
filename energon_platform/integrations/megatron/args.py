"""Megatron-LM's arguments against the batches: what they must be
([`megatron_requirements`][energon_platform.integrations.megatron.args.megatron_requirements]) and
the refusal of a run whose arguments disagree
([`check_megatron_args`][energon_platform.integrations.megatron.args.check_megatron_args]).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from energon_platform.config import RunConfig
from energon_platform.integrations.megatron.batches import BatchFormat
from energon_platform.integrations.megatron.run_config import resolve_run_config
from energon_platform.loader.train_loader import build_encoder
from task_encoders.abilities import packs
from task_encoders.image_text import ImageTextTaskEncoder


class MegatronArgsError(ValueError):
    """Megatron-LM's arguments disagree with what the provider's batches need (names both values)."""


def megatron_requirements(config: str | os.PathLike | dict | RunConfig | Any) -> dict:
    """What Megatron-LM's arguments must be for the batches of ``config``'s encoder (a run config,
    or an encoder built by ``task_encoders``), by Megatron's argument names (``args.<name>``):

    * always: ``dataloader_type`` (``"external"``) and ``decoder_seq_length`` (at least the
      encoder's ``text.seq_len``, the positions of one row after splicing);
    * with packing: ``micro_batch_size`` 1 (Megatron's packed multimodal path) and the pack group;
    * vision-language encoders: ``image_token_index`` (the placeholder's id, for ``LLaVAModel``)
      and ``image_token`` (its text),
      ``special_tokens`` (Megatron's ``--special-tokens`` list, same order), ``img_h``/``img_w``,
      ``patch_dim``, ``vision_model_type``, ``disable_vision_class_token``, ``pixel_shuffle``,
      ``use_tiling``, ``max_num_tiles``, ``use_thumbnail``, ``use_area_weighted_aspect_ratio``,
      ``use_tile_tags`` (False), and ``tokens_per_tile``/``vocab_size`` for reference.
    """
    encoder = (
        config
        if hasattr(config, "seq_len") and hasattr(config, "tokenizer")
        else build_encoder(resolve_run_config(config, None, None))
    )
    packing = packs(encoder)
    req: dict[str, Any] = {
        "dataloader_type": "external",
        "decoder_seq_length": int(encoder.seq_len),
        "vocab_size": int(encoder.tokenizer.vocab_size),
    }
    if packing:
        req["micro_batch_size"] = 1
    if not isinstance(encoder, ImageTextTaskEncoder) or encoder.image_token_index is None:
        return req
    cfg = encoder.config
    tiling, vision = cfg.image.tiling, cfg.vision
    req.update(
        image_token_index=int(encoder.image_token_index),
        image_token=cfg.prompt.image_token,
        special_tokens=list(cfg.prompt.special_tokens),
        img_h=int(encoder.tile_size),
        img_w=int(encoder.tile_size),
        patch_dim=vision.patch_dim,
        vision_model_type=vision.model_type,
        disable_vision_class_token=vision.drop_class_token,
        pixel_shuffle=vision.pixel_shuffle,
        use_tiling=tiling.enabled,
        use_tile_tags=False,
        tokens_per_tile=int(encoder.tokens_per_tile),
    )
    if tiling.enabled:
        req.update(
            max_num_tiles=tiling.max_num_tiles,
            use_thumbnail=tiling.use_thumbnail,
            use_area_weighted_aspect_ratio=tiling.aspect_ratio == "area_weighted",
        )
    return req


def _megatron_image_token_id(args: Any, tokenizer: Any, token: str) -> tuple[int | None, str]:
    """The id Megatron's tokenizer gives ``token``: from its tokenizer object when given, else by
    loading ``args.tokenizer_model`` (a local folder) and adding ``args.special_tokens`` as
    Megatron's multimodal tokenizer does; (None, why) when neither is possible."""
    if tokenizer is not None:
        hf = getattr(tokenizer, "tokenizer", tokenizer)
        convert = getattr(hf, "convert_tokens_to_ids", None) or tokenizer.convert_tokens_to_ids
        return int(convert(token)), "Megatron's tokenizer"
    folder = getattr(args, "tokenizer_model", None)
    if folder and Path(str(folder)).is_dir():
        # only this fallback needs transformers: at the top it would add its import to every job's start-up
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        hf.add_tokens(list(getattr(args, "special_tokens", None) or []), special_tokens=True)
        token_id = hf.convert_tokens_to_ids(token)
        return (
            int(token_id) if token_id is not None and token_id != hf.unk_token_id else None
        ), f"--tokenizer-model {folder} with --special-tokens"
    return None, "no tokenizer to compare"


def check_megatron_args(
    config: str | os.PathLike | dict | RunConfig | Any,
    args: Any,
    *,
    tokenizer: Any = None,
    batch_format: BatchFormat = "multimodal",
) -> dict:
    """Refuse ([`MegatronArgsError`][energon_platform.integrations.megatron.args.MegatronArgsError],
    one line per disagreement, naming Megatron's argument, its value and the value the batches need)
    a Megatron run whose ``args`` do not fit the encoder's batches
    ([`megatron_requirements`][energon_platform.integrations.megatron.args.megatron_requirements]);
    returns the requirements. Arguments ``args`` lacks are not checked. ``tokenizer``: Megatron's
    ``get_tokenizer()``, to compare the placeholder's id exactly; without it
    ``args.tokenizer_model`` is loaded when it is a local folder."""
    req = megatron_requirements(config)
    problems = []

    def arg(name: str) -> Any:
        return getattr(args, name, None)

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    if arg("dataloader_type") not in (None, "external"):
        problems.append(
            f"{flag('dataloader_type')} is {arg('dataloader_type')!r}; this provider needs 'external'"
        )
    vision_language = "image_token_index" in req
    length = (
        (arg("decoder_seq_length") or arg("seq_length")) if vision_language else arg("seq_length")
    )
    if length is not None and int(length) < req["decoder_seq_length"]:
        which = "--decoder-seq-length" if vision_language else "--seq-length"
        problems.append(
            f"{which} {length} < the encoder's text.seq_len {req['decoder_seq_length']} "
            f"(positions per row after splicing); the model would cut the rows"
        )
    if (
        batch_format == "multimodal"
        and "micro_batch_size" in req
        and arg("micro_batch_size") not in (None, 1)
    ):
        problems.append(
            f"--micro-batch-size {arg('micro_batch_size')}: packed multimodal batches need 1 "
            f"(one packed sequence per micro-batch)"
        )
    vocab = arg("padded_vocab_size")
    if vocab is not None and int(vocab) < req["vocab_size"]:
        problems.append(f"padded vocab size {vocab} < the tokenizer's {req['vocab_size']} tokens")
    if vision_language:
        if batch_format != "multimodal":
            problems.append(
                f"batch format {batch_format!r}: vision-language batches travel in the 'multimodal' format"
            )
        given = arg("special_tokens")
        if given is not None and list(given)[: len(req["special_tokens"])] != req["special_tokens"]:
            problems.append(
                f"--special-tokens {list(given)} must start with the encoder's prompt.special_tokens "
                f"{req['special_tokens']} (same order, so the ids agree)"
            )
        token = req["image_token"]
        megatron_id, source = _megatron_image_token_id(args, tokenizer, token)
        if megatron_id is not None and megatron_id != req["image_token_index"]:
            problems.append(
                f"{source} gives {token} the id {megatron_id}, the batches use {req['image_token_index']}"
            )
        for name in (
            "img_h",
            "img_w",
            "patch_dim",
            "vision_model_type",
            "disable_vision_class_token",
            "pixel_shuffle",
            "use_tiling",
            "max_num_tiles",
            "use_thumbnail",
            "use_area_weighted_aspect_ratio",
        ):
            if name in req and arg(name) is not None and arg(name) != req[name]:
                problems.append(
                    f"{flag(name)} is {arg(name)!r}; the encoder's batches need {req[name]!r}"
                )
        if arg("use_tile_tags"):
            problems.append("--use-tile-tags: tile tags are not supported by these batches")
        if arg("class_token_len") not in (None, 1):
            problems.append(
                f"--class-token-len {arg('class_token_len')}: the encoder counts 1 class token"
            )
    if problems:
        raise MegatronArgsError(
            "Megatron-LM arguments do not fit the data:\n  " + "\n  ".join(problems)
        )
    return req
