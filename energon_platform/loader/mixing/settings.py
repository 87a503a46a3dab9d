"""``loader.blend_adapt``'s config (`BlendAdaptConfig`), beside the mixing it configures; the
methods it names are the registry's (`method.METHODS`: a method registered is a method a config
may name). A method's own options are checked with the encoder (`config_checks.check_mixing`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from energon_platform.loader.mixing.method import METHODS
from task_encoders.config_parser import CHOICES, At, at_least, require


def method_names() -> tuple[str, ...]:
    """The names ``loader.blend_adapt.method`` takes: the registered methods, in their order."""
    return tuple(METHODS)


@dataclass(frozen=True)
class BlendAdaptConfig:
    """``loader.blend_adapt``: blend weights that follow the model's per-dataset loss (online data
    mixing, `energon_platform.loader.mixing`). Every ``every`` global steps the method reads each
    dataset's mean loss since its last update (reported by the trainer through
    ``TrainLoader.report_losses``) and sets the weights used from ``lag`` steps later on. The
    metadataset's weights are where it starts; each change is kept in the loader state, so a
    resume on any world size draws the same samples."""

    method: str = field(default="ado", metadata={CHOICES: method_names})
    """``ado`` (weight to the fastest fall of a fitted loss curve; the default: the only method
    that met every target of ``scripts/bench/mixing.py``), ``loss_ratio`` (weight to falling
    loss) or ``odm`` (a bandit: weight to high loss)."""
    every: int = 4
    """Global steps between two updates of the weights."""
    lag: int = 2
    """Global steps between an update and the batch its weights apply from; at least the loader's
    prefetch depth in global batches, or its workers wait for the weights."""
    floor: float = 0.02
    """The least weight of every dataset: at most 1 / the number of datasets (a rounded 1/K,
    ``0.3333`` for three, is taken for it); checked when the loader opens the blend."""
    resolution: float = 0.01
    """Losses are rounded to this before the method reads them (so ranks of any world size
    decide alike)."""
    options: dict[str, float] = field(default_factory=dict)
    """The method's own options (``odm``: ``smoothing``; ``loss_ratio``: ``step``, ``base``,
    ``window``; ``ado``: ``smoothing``, ``warmup``, ``points``), each
    in the range its method declares (checked with the encoder, `config_checks.check_mixing`)."""

    def check(self, at: At) -> None:
        at_least(self, at, every=1, lag=0)
        require(0 <= self.floor < 1, at.child("floor"), f"got {self.floor}", "a share in [0, 1)")
        require(
            0 < self.resolution <= 1,
            at.child("resolution"),
            f"got {self.resolution}",
            "a loss step in (0, 1]",
        )
