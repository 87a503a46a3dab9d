"""``loader.balance: none``: a global batch is consecutive stream positions.

The schedule cuts the stream into items of ``pack_group`` samples and global batches of
``global_batch_size`` items (`schedule`); every dataset's epoch
boundaries are guarded so that no global batch holds a sample at the end of one epoch and at the
start of the next (`orders`). Nothing is planned: the state is the
position alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from energon_platform.config import RunConfig
    from energon_platform.loader.datasets import DatasetSet
    from energon_platform.loader.schedule import Schedule
    from task_encoders.base import SeededTaskEncoder


@dataclass
class StreamBatching:
    """Global batches of consecutive positions (see the module docstring)."""

    pack_group: int  #: samples per item (packed by the encoder), 1 without packing
    samples_per_batch: int  #: stream positions per global batch

    name = "stream"
    planned = False  #: global batches are not planned (no planner, no plan state)
    packed_rows = False  #: no fixed rows of ``seq_len`` planned across the global batch
    sorts_logged_keys = False  #: the logged keys keep the ranks' order (it is layout-free)
    fixed_samples = True  #: a fixed number of samples per global batch
    planner = None
    changes: tuple = ()  #: nothing of its own changes at resume

    @classmethod
    def from_config(
        cls,
        cfg: RunConfig,
        encoder: SeededTaskEncoder,
        pack_group: int,
        datasets: DatasetSet,
        workers: int,
    ):
        """The mode for run config ``cfg`` (its encoder packs ``pack_group`` samples per item)."""
        return cls(pack_group, cfg.loader.global_batch_size * pack_group)

    @property
    def packed(self) -> bool:
        """Whether micro-batches hold packed sequences (the encoder packs each pack group)."""
        return self.pack_group > 1

    @property
    def epoch_guard(self) -> int:
        """Positions an epoch boundary is kept from (one global batch)."""
        return self.samples_per_batch

    @property
    def schedule_group(self) -> int:
        """Samples per schedule item: a pack group."""
        return self.pack_group

    def start(self, schedule: Schedule, plan_state: Any = None) -> None:
        """Nothing to (re)build for ``schedule``: its positions are the batches."""

    def fingerprint(self) -> dict:
        """No fingerprint entry of its own: the schedule's describes the batches."""
        return {}

    def state_at(self, batch: int) -> None:
        """No plan state (``LoaderState.plan`` is None)."""
        return None

    def resume_from(self, state: Any) -> None:
        """Nothing to restore but the position."""
        return None

    def resume_unit(self, plan_state: Any) -> None:
        """The next batch starts at its own position (None: the caller computes it)."""
        return None

    def consumed(self, batch: int, schedule: Schedule, names: list[str]) -> dict:
        """Per dataset name: ``{"samples", "epochs"}`` taken before global batch ``batch``."""
        return dict(zip(names, schedule.consumed(batch)))

    def stats(self, batch: int, world_size: int, accumulation: int) -> dict:
        """No balance statistics (``{}``)."""
        return {}

    def step_done(self, batch: int) -> None:
        """Nothing to keep current at the end of a global batch."""
