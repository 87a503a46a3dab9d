"""``SeededTaskEncoder``: the base of every encoder here.

It owns three things and nothing else:

* **Per-sample randomness.** `SeededTaskEncoder.sample_seed` / ``sample_generator`` derive
  from (run seed, sample key, epoch) only (`task_encoders.seeding`). An encoder's output is a
  pure function of (sample, seed, epoch, config): every map function is ``@stateless``, so
  Energon's ``restore_sample`` can rebuild buffered samples exactly.
* **Its config**, a validated `task_encoders.config.EncoderConfig` subclass
  (``config_class``), given as an instance, a dict, a YAML path or None (defaults).
* **The bad-sample policy**: a `task_encoders.skipping.SkipPolicy` as Energon's error handler
  (`worker_config`), and Energon's consecutive-failure tolerance from the config.

Subclasses implement `encode` (one sample → one encoded sample) instead of
``encode_sample``; batching is theirs (see `task_encoders.documents.DocumentTaskEncoder`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from megatron.energon import DefaultTaskEncoder, WorkerConfig, stateless

from task_encoders.config import EncoderConfig
from task_encoders.config_parser import At, parse, read_yaml
from task_encoders.seeding import (
    derive_seed,
    make_generator,
    sample_epoch,
    sample_key,
    single_intra_op_thread,
)
from task_encoders.skipping import SkipPolicy

ConfigLike = EncoderConfig | Mapping | str | Path | None


class SeededTaskEncoder(DefaultTaskEncoder):
    """Energon ``DefaultTaskEncoder`` with per-sample seeds, a validated config and skip limits.

    Args:
        config: the encoder's config (see module doc). Invalid values raise
            `task_encoders.config_parser.ConfigError` here, before any worker starts.
        seed: overrides ``config.seed``, the run seed.
        training: True for training-time augmentation; False for deterministic evaluation
            transforms (each encoder says what changes).
    """

    #: The config dataclass this encoder reads.
    config_class: ClassVar[type[EncoderConfig]] = EncoderConfig
    #: The registered name (set by ``task_encoders.registry.register``).
    name: ClassVar[str] = ""
    #: The name a loader's resume fingerprint records for this encoder: the class's own name unless
    #: the class sets it (a class that took over a mode of another keeps that class's name, so the
    #: checkpoints saved before it existed still resume). Set for every subclass at its creation.
    fingerprint_name: ClassVar[str] = "SeededTaskEncoder"

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if "fingerprint_name" not in cls.__dict__:
            cls.fingerprint_name = cls.__name__

    def __init__(
        self, config: ConfigLike = None, *, seed: int | None = None, training: bool = True
    ):
        super().__init__()
        self.config, self.config_at = self._coerce_config(config)
        self.seed = self.config.seed if seed is None else seed
        self.training = training
        self.skip_policy = SkipPolicy(self.config.errors, self.config_at.source)
        # Energon reads this per stage (TaskEncoder.build_*): consecutive failures it tolerates.
        self.__default_failure_tolerance__ = self.config.errors.max_consecutive_failures

    @classmethod
    def _coerce_config(cls, config: ConfigLike) -> tuple[EncoderConfig, At]:
        if isinstance(config, cls.config_class):
            return config, At(source=f"<{cls.config_class.__name__}>")
        if isinstance(config, EncoderConfig):  # another encoder's config
            raise TypeError(
                f"{cls.__name__} reads a {cls.config_class.__name__}, got a {type(config).__name__}"
            )
        if config is None or isinstance(config, Mapping):
            data, at = dict(config or {}), At()
        else:
            data, at = read_yaml(config)
        data.setdefault("encoder", cls.name)
        if data["encoder"] != cls.name:
            raise at.child("encoder").error(
                f"{data['encoder']!r} given to {cls.__name__}", repr(cls.name)
            )
        return parse(cls.config_class, data, at), at

    # --- per-sample randomness -----------------------------------------------------------------

    def sample_seed(self, sample: Any, stream: str = "") -> int:
        """63-bit seed of (run seed, `sample_key`, `sample_epoch`, stream)."""
        return derive_seed(self.seed, sample_key(sample), sample_epoch(sample), stream)

    def sample_generator(self, sample: Any, stream: str = "") -> torch.Generator:
        """A private ``torch.Generator`` seeded with `sample_seed`."""
        return make_generator(self.sample_seed(sample, stream))

    # --- Energon hooks -------------------------------------------------------------------------

    def worker_config(
        self, *, rank: int = 0, world_size: int = 1, num_workers: int = 0, **kwargs: Any
    ) -> WorkerConfig:
        """An Energon ``WorkerConfig`` whose error handler is this encoder's `SkipPolicy`."""
        return WorkerConfig(
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            global_error_handler=self.skip_policy,
            **kwargs,
        )

    @stateless
    def encode_sample(self, sample: Any) -> Any:
        """Energon's per-sample hook: `encode` (with one intra-op thread, as in DataLoader
        workers, so tensors do not depend on ``num_workers``), then counts the success for the skip
        policy."""
        with single_intra_op_thread():
            encoded = self.encode(sample)
        self.skip_policy.record_success()
        return encoded

    def encode(self, sample: Any) -> Any:
        """One decoded sample → one encoded sample; a pure function of (sample, seed, epoch, config).

        Raise to skip the sample (it is logged and counted); draw randomness only through
        `sample_seed` / `sample_generator`.
        """
        raise NotImplementedError
