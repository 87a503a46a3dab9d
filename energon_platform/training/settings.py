"""The reference model's and trainer's config (``model:``, ``train:``), beside the trainer:
`ModelConfig` (`energon_platform.training.model`, `energon_platform.training.two_tower`) and
`TrainConfig` (`energon_platform.training.train`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from energon_platform.loader.step_settings import MAX_STEP
from task_encoders.config_parser import At, at_least, at_most, require


@dataclass(frozen=True)
class ModelConfig:
    """``model:``: the reference model (``energon_platform.training.model`` and
    ``energon_platform.training.two_tower``)."""

    kind: Literal["tiny", "two_tower"] = "tiny"
    """``tiny`` (the captioning model) or ``two_tower`` (a ViT over image tiles and a conv +
    transformer audio encoder feeding the language model)."""
    dim: int = 64
    """The language model's width (a multiple of ``heads``)."""
    layers: int = 2
    """The language model's transformer blocks."""
    heads: int = 4
    """The language model's attention heads."""
    patch: int = 8
    """The image patch side, in pixels."""
    dropout: float = 0.0
    """Dropout probability, in [0, 1)."""
    vision_dim: int = 32
    """``two_tower``: the vision tower's width (a multiple of ``vision_heads``)."""
    vision_layers: int = 2
    """``two_tower``: the vision tower's transformer blocks."""
    vision_heads: int = 2
    """``two_tower``: the vision tower's attention heads."""
    audio_dim: int = 32
    """``two_tower``: the audio tower's width (a multiple of ``audio_heads``)."""
    audio_layers: int = 1
    """``two_tower``: the audio tower's transformer blocks."""
    audio_heads: int = 2
    """``two_tower``: the audio tower's attention heads."""

    def check(self, at: At) -> None:
        at_least(
            self,
            at,
            dim=1,
            layers=0,
            heads=1,
            patch=1,
            vision_dim=1,
            vision_layers=0,
            vision_heads=1,
            audio_dim=1,
            audio_layers=0,
            audio_heads=1,
        )
        for width, heads in (
            ("dim", "heads"),
            ("vision_dim", "vision_heads"),
            ("audio_dim", "audio_heads"),
        ):
            require(
                getattr(self, width) % getattr(self, heads) == 0,
                at.child(width),
                f"{getattr(self, width)} is not divisible by {heads}={getattr(self, heads)}",
                f"a multiple of {heads}",
            )
        require(
            0.0 <= self.dropout < 1.0,
            at.child("dropout"),
            f"got {self.dropout}",
            "a number in [0, 1)",
        )


@dataclass(frozen=True)
class TrainConfig:
    """``train:``: the reference trainer's run."""

    steps: int = 40
    """Optimizer steps."""
    lr: float = 3e-3
    """Peak learning rate."""
    weight_decay: float = 0.01
    """The optimizer's weight decay."""
    warmup: int = 5
    """Steps of linear learning-rate warm-up."""
    checkpoint_every: int = 10
    """A checkpoint every this many steps, into ``out``/checkpoints."""
    keep_checkpoints: int = 3
    """The newest checkpoints kept; older ones are deleted."""
    out: Path = Path("out/train")
    """The run's folder: checkpoints and the JSON-lines log ``log.jsonl``."""

    def check(self, at: At) -> None:
        at_least(
            self, at, steps=1, warmup=0, checkpoint_every=1, keep_checkpoints=1, weight_decay=0.0
        )
        at_most(
            self,
            at,
            steps=MAX_STEP,
            warmup=MAX_STEP,
            checkpoint_every=MAX_STEP,
            keep_checkpoints=MAX_STEP,
        )
        require(
            self.lr > 0 and math.isfinite(self.lr),
            at.child("lr"),
            f"got {self.lr}",
            "a finite number > 0",
        )
