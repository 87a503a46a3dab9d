"""Megatron-LM's ``train_valid_test_dataloaders_provider`` for ``--dataloader-type external``: from
plain values ([`make_provider`][energon_platform.integrations.megatron.provider.make_provider]) or
from Megatron's ``args``
([`make_provider_from_args`][energon_platform.integrations.megatron.provider.make_provider_from_args]).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from energon_platform.config import RunConfig
from energon_platform.integrations.megatron.args import check_megatron_args
from energon_platform.integrations.megatron.batches import BATCH_FORMATS, BatchFormat
from energon_platform.integrations.megatron.iterators import (
    MegatronTrainIterator,
    MegatronValidIterator,
)
from energon_platform.integrations.megatron.run_config import resolve_run_config
from energon_platform.integrations.megatron.state_files import (
    latest_iteration,
    load_dataloader_state,
    resolve_state_file,
)
from energon_platform.loader.schedule import LayoutError
from energon_platform.loader.train_loader import TrainLoader


def is_dataloader_rank(tp_rank: int = 0, pp_rank: int = 0, pp_size: int = 1) -> bool:
    """Whether Megatron builds data on this rank: tensor-parallel rank 0 on the first or last
    pipeline stage (the other tensor-parallel ranks receive the batch by broadcast)."""
    return tp_rank == 0 and (pp_size == 1 or pp_rank in (0, pp_size - 1))


def make_provider(
    config: str | os.PathLike | dict | RunConfig,
    *,
    dp_rank: int,
    dp_size: int,
    is_data_rank: bool = True,
    micro_batch_size: int | None = None,
    global_batch_size: int | None = None,
    num_workers: int | None = None,
    dataloader_save: str | os.PathLike | None = None,
    restore_iteration: int | str | None = None,
    batch_format: BatchFormat = "multimodal",
    eval_iters: int | None = None,
    build_valid: bool = True,
    pipeline_parallel: bool = False,
) -> Callable[[Any], tuple[Any, Any, Any]]:
    """Megatron's ``train_valid_test_dataloaders_provider`` for one rank, from plain values.

    Args:
        config: run config (YAML path, mapping for `load_config`, or `RunConfig`).
        dp_rank: this rank's data-parallel index (``parallel_state``'s).
        dp_size: the number of data-parallel ranks (``parallel_state``'s).
        is_data_rank: False where Megatron builds no data
            ([`is_dataloader_rank`][energon_platform.integrations.megatron.provider.is_dataloader_rank]);
            the provider then returns ``(None, None, None)`` and reads nothing.
        micro_batch_size: Megatron's ``--micro-batch-size`` in loader items (samples; pack
            groups with packing, which the multimodal format turns into one packed sequence per
            micro-batch); None keeps the config's ``loader`` value.
        global_batch_size: Megatron's ``--global-batch-size`` in loader items; None keeps the
            config's ``loader`` value. The global batch is part of the state's fingerprint.
        num_workers: DataLoader workers (None: the config's); may differ from the saved run.
        dataloader_save: Megatron's ``--dataloader-save`` folder (needed to restore).
        restore_iteration: None starts the data at the beginning; an iteration (Megatron's
            ``args.iteration`` after loading the model checkpoint) restores that iteration's state
            file; ``"latest"`` the highest ``iter_*`` in ``dataloader_save``. A missing file raises
            ``FileNotFoundError`` naming the path, other data/config `StateMismatchError`,
            an impossible layout `LayoutError`: the data never restarts silently.
        batch_format: ``"multimodal"`` or ``"gpt"`` (`to_megatron_batch`).
        eval_iters: Megatron's ``--eval-iters``: the validation iterator restarts every
            ``eval_iters`` × micro-batches-per-iteration ``next()`` calls (same data each evaluation).
        build_valid: False: no validation iterator.
        pipeline_parallel: state files under ``mp_rank_00_000`` (pipeline parallel size > 1).

    Returns:
        The provider, ``provider(train_val_test_num_samples) -> (train, valid, test)``:
            ``train`` is a `MegatronTrainIterator`, ``valid`` a `MegatronValidIterator` (None
            without ``data.val_split``), ``test`` None. The train stream is infinite, so the
            requested numbers of samples are not needed. ``provider.is_distributed`` is True
            (Megatron then calls it on every rank).
    """
    if batch_format not in BATCH_FORMATS:
        raise ValueError(f"batch_format {batch_format!r}: expected one of {BATCH_FORMATS}")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank {dp_rank} is not in [0, dp_size={dp_size})")
    if restore_iteration is not None and not dataloader_save:
        raise ValueError(
            f"restore_iteration={restore_iteration!r} needs dataloader_save (Megatron's "
            f"--dataloader-save): without it the data would restart from the beginning"
        )
    if (
        restore_iteration is not None
        and restore_iteration != "latest"
        and not isinstance(restore_iteration, int)
    ):
        raise ValueError(
            f"restore_iteration must be None, an int or 'latest', got {restore_iteration!r}"
        )

    def train_valid_test_dataloaders_provider(train_val_test_num_samples: Any = None):
        if not is_data_rank:
            return None, None, None
        cfg = resolve_run_config(config, micro_batch_size, global_batch_size)
        loader = TrainLoader(cfg, rank=dp_rank, world_size=dp_size, num_workers=num_workers)
        if micro_batch_size is not None and global_batch_size is not None:
            expected = global_batch_size // (micro_batch_size * dp_size)
            if loader.accumulation != expected or global_batch_size % (micro_batch_size * dp_size):
                raise LayoutError(
                    f"global batch {global_batch_size} / (micro batch {micro_batch_size} x dp "
                    f"{dp_size}) is not the loader's {loader.accumulation} micro-batches per step"
                )
        if restore_iteration is not None:
            iteration = (
                latest_iteration(dataloader_save)
                if restore_iteration == "latest"
                else restore_iteration
            )
            path = resolve_state_file(
                dataloader_save, iteration, dp_rank, dp_size, pipeline_parallel
            )
            loader.load_state_dict(load_dataloader_state(path))
        train = MegatronTrainIterator(loader, batch_format)
        valid = None
        if build_valid and cfg.data.val_split:
            valid = MegatronValidIterator(
                cfg,
                dp_rank=dp_rank,
                dp_size=dp_size,
                batch_size=loader.maker.micro_items,
                num_workers=loader.num_workers,
                batch_format=batch_format,
                packed=train.packed,
                restart_every=eval_iters * loader.accumulation if eval_iters else None,
            )
        return train, valid, None

    train_valid_test_dataloaders_provider.is_distributed = True
    return train_valid_test_dataloaders_provider


def provider_kwargs_from_args(args: Any) -> dict:
    """[`make_provider`][energon_platform.integrations.megatron.provider.make_provider] keyword
    arguments from Megatron's ``args`` (``get_args()``): ``micro_batch_size``,
    ``global_batch_size``, ``num_workers``, ``dataloader_save``, ``eval_iters``, ``dp_size``
    (``data_parallel_size``) and ``restore_iteration`` (``args.iteration`` when ``args.load`` is set
    and a checkpoint was loaded, else None)."""
    kwargs: dict[str, Any] = {
        "micro_batch_size": args.micro_batch_size,
        "global_batch_size": args.global_batch_size,
    }
    for ours, theirs in (
        ("num_workers", "num_workers"),
        ("dataloader_save", "dataloader_save"),
        ("dp_size", "data_parallel_size"),
    ):
        value = getattr(args, theirs, None)
        if value is not None and value != "":
            kwargs[ours] = value
    eval_iters = getattr(args, "eval_iters", None)
    if isinstance(eval_iters, int) and eval_iters > 0:
        kwargs["eval_iters"] = eval_iters
    iteration = int(getattr(args, "iteration", 0) or 0)
    kwargs["restore_iteration"] = (
        iteration if getattr(args, "load", None) is not None and iteration > 0 else None
    )
    return kwargs


def make_provider_from_args(
    config: str | os.PathLike | dict | RunConfig,
    args: Any,
    *,
    dp_rank: int,
    tp_rank: int = 0,
    pp_rank: int = 0,
    tokenizer: Any = None,
    **overrides: Any,
):
    """[`make_provider`][energon_platform.integrations.megatron.provider.make_provider] with
    Megatron's ``args``
    ([`provider_kwargs_from_args`][energon_platform.integrations.megatron.provider.provider_kwargs_from_args])
    and this rank's ``parallel_state`` ranks (tensor, pipeline, data parallel); ``overrides`` win.
    On a data rank the provider first runs `check_megatron_args` (``tokenizer``: Megatron's
    ``get_tokenizer()``, optional) and refuses disagreeing arguments before reading any data; its
    train iterator's ``image_token_index`` is the placeholder id, and packed micro-batches longer
    than ``args.decoder_seq_length`` after splicing raise instead of being cut."""
    pp_size = int(getattr(args, "pipeline_model_parallel_size", 1) or 1)
    kwargs = provider_kwargs_from_args(args)
    kwargs.update(
        is_data_rank=is_dataloader_rank(tp_rank, pp_rank, pp_size), pipeline_parallel=pp_size > 1
    )
    kwargs.update(overrides)
    if "dp_size" not in kwargs:
        raise ValueError("args has no data_parallel_size; pass dp_size=")
    provider = make_provider(config, dp_rank=dp_rank, **kwargs)
    if not kwargs["is_data_rank"]:
        return provider
    batch_format = kwargs.get("batch_format", "multimodal")

    def checked_provider(train_val_test_num_samples: Any = None):
        check_megatron_args(config, args, tokenizer=tokenizer, batch_format=batch_format)
        train, valid, test = provider(train_val_test_num_samples)
        train.max_sequence_length = getattr(args, "decoder_seq_length", None)
        return train, valid, test

    checked_provider.is_distributed = True
    return checked_provider
