"""Work units: one unit = one output shard (a slice of records and its final name).

Units are planned once from the reader's records and are independent, idempotent and retried
whole: the same unit always produces the same bytes. The split is decided per key by a hash, so a
sample's split does not depend on the rest of the corpus.
"""

from __future__ import annotations

from dataclasses import dataclass

from converters.records import Record, stable_hash

SPLITS = ("train", "val")


@dataclass(frozen=True)
class WorkUnit:
    split: str
    index: int
    records: tuple[Record, ...]

    @property
    def name(self) -> str:
        """Shard path relative to the output folder, e.g. ``train/shard-000003.tar``."""
        return f"{self.split}/shard-{self.index:06d}.tar"

    @property
    def stats_name(self) -> str:
        return f"{self.split}-shard-{self.index:06d}.json"


def split_of(key: str, val_fraction: float) -> str:
    """``val`` for a deterministic ``val_fraction`` of keys (by a 64-bit hash of the key)."""
    return "val" if int(stable_hash(key), 16) / 2**64 < val_fraction else "train"


def plan_units(
    records: list[Record], samples_per_shard: int, val_fraction: float
) -> list[WorkUnit]:
    """Split records into train/val (source order kept) and cut each split into shards."""
    by_split = {s: [r for r in records if split_of(r.key, val_fraction) == s] for s in SPLITS}
    return [
        WorkUnit(split, i // samples_per_shard, tuple(recs[i : i + samples_per_shard]))
        for split, recs in by_split.items()
        for i in range(0, len(recs), samples_per_shard)
    ]
