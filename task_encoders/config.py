"""Encoder configuration: the sections every encoder shares (`EncoderConfig`: text, packing,
errors), read by `task_encoders.config_parser`.

An encoder adds its own sections by subclassing `EncoderConfig` (see
``task_encoders.image_text.ImageTextConfig``). Which subclass reads a file is decided by its
``encoder:`` name through `task_encoders.registry`. A section's keys that a file leaves out keep
the encoder's defaults for that section (``packing: {buffer_size: 64}`` in a text config keeps
packing enabled).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from task_encoders.config_parser import At, require

# --- Sections every encoder shares ---------------------------------------------------------------


@dataclass(frozen=True)
class TextConfig:
    """``text:``: tokenizer and sequence length."""

    tokenizer: Path | None = None
    """A local Hugging Face tokenizer folder (``AutoTokenizer.from_pretrained``); null: the
    shipped ``task_encoders/assets/tokenizer``."""
    seq_len: int = 128
    """Tokens per sequence, BOS and EOS included; longer texts are truncated (EOS kept)."""
    bos_token: str | None = None
    """The BOS token string; null: the tokenizer's own."""
    eos_token: str | None = None
    """The EOS token string; null: the tokenizer's own."""
    pad_token: str | None = None
    """The padding token string; null: the tokenizer's own, else EOS."""

    def check(self, at: At) -> None:
        require(
            4 <= self.seq_len <= 1 << 20,
            at.child("seq_len"),
            f"{self.seq_len} is impossible",
            "an integer from 4 (BOS, two tokens, EOS) to 1048576",
        )
        if self.tokenizer is not None:
            require(
                self.tokenizer.is_dir(),
                at.child("tokenizer"),
                f"no directory {self.tokenizer}",
                "a local Hugging Face tokenizer directory",
            )


@dataclass(frozen=True)
class PackingConfig:
    """``packing:``: several documents per sequence (Energon ``select_samples_to_pack``/``pack_selected_samples``).

    The encoder exposes ``buffer_size`` as ``packing_buffer_size`` (None when packing is off).
    """

    enabled: bool = False
    """Whether documents are packed."""
    buffer_size: int = 512
    """The ``packing_buffer_size`` handed to Energon's ``get_train_dataset``: a larger buffer
    packs tighter; the last pack of every buffer is the one left part-empty."""
    max_docs: int | None = None
    """At most this many documents per pack; null: no limit."""

    def check(self, at: At) -> None:
        require(
            self.buffer_size >= 1,
            at.child("buffer_size"),
            f"got {self.buffer_size}",
            "an integer >= 1",
        )
        if self.max_docs is not None:
            require(
                self.max_docs >= 1, at.child("max_docs"), f"got {self.max_docs}", "an integer >= 1"
            )


@dataclass(frozen=True)
class ErrorsConfig:
    """``errors:``: what a worker tolerates before a bad-data flood becomes an error."""

    max_consecutive_failures: int = 100
    """Energon's own limit (``failure_tolerance``), applied to every stage of this encoder and,
    by `task_encoders.skipping.SkipPolicy`, across all stages (decoding included)."""
    max_skipped_fraction: float = 0.05
    """The share of a worker's samples that may fail, checked once ``fraction_after`` samples
    were attempted."""
    fraction_after: int = 200
    """Samples a worker attempts before ``max_skipped_fraction`` is checked."""

    def check(self, at: At) -> None:
        require(
            self.max_consecutive_failures >= 1,
            at.child("max_consecutive_failures"),
            f"got {self.max_consecutive_failures}",
            "an integer >= 1",
        )
        require(
            0.0 <= self.max_skipped_fraction <= 1.0,
            at.child("max_skipped_fraction"),
            f"got {self.max_skipped_fraction}",
            "a number from 0 to 1",
        )
        require(
            self.fraction_after >= 1,
            at.child("fraction_after"),
            f"got {self.fraction_after}",
            "an integer >= 1",
        )


@dataclass(frozen=True)
class EncoderConfig:
    """Top level of every encoder config file (each encoder adds its own sections)."""

    encoder: str = ""
    """The registered name of the encoder (`task_encoders.registry`)."""
    module: str | None = None
    """A module to import first, for encoders registered outside this package."""
    seed: int = 0
    """The run seed of per-sample randomness (`task_encoders.seeding`); a run config's
    ``loader.seed`` overrides it."""
    text: TextConfig = field(default_factory=TextConfig)
    """Tokenizer and sequence length (the ``text`` table below)."""
    packing: PackingConfig = field(default_factory=PackingConfig)
    """Several documents per sequence (the ``packing`` table below)."""
    errors: ErrorsConfig = field(default_factory=ErrorsConfig)
    """How many bad samples a worker tolerates (the ``errors`` table below)."""

    def check(self, at: At) -> None:
        require(
            0 <= self.seed < 1 << 63,
            at.child("seed"),
            f"got {self.seed}",
            "an integer from 0 to 2**63-1",
        )
