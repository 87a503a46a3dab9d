"""Random access to an Energon dataset split: index → decoded Energon sample.

Uses Energon's own pieces: ``get_dataset_from_config`` (reads ``.nv-meta``, ``dataset.yaml``,
split), ``ShardInfosITarReader`` (tar index lookups) and the factory's ``load_sample`` (decoder and
field map / sample loader). This is the same path Energon's ``restore_sample`` takes. Only the
order in which indices are asked for is ours (see :mod:`energon_platform.schedule`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from megatron.energon import WorkerConfig
from megatron.energon.epathlib import EPath


class DatasetError(ValueError):
    """The dataset path is not a usable Energon dataset (one line, names the path)."""


def _factory(path: str, split: str):
    from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory
    from megatron.energon.dataset_config import get_dataset_from_config

    if not (Path(path) / ".nv-meta" / "dataset.yaml").is_file():
        raise DatasetError(f"{path}: not an Energon dataset (no .nv-meta/dataset.yaml); "
                           f"convert it with `energon-platform convert ...` first")
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    factory = get_dataset_from_config(EPath(path), split_part=split, training=False, worker_config=wc)
    if not isinstance(factory, BaseWebdatasetFactory):
        raise DatasetError(f"{path}: a metadataset or non-webdataset source is not supported here yet")
    if not factory.shards:
        raise DatasetError(f"{path}: split {split!r} has no shards")
    return factory


class SampleSource:
    """``source[i]`` is the decoded Energon sample with dataset index ``i`` of one split.

    Cheap to construct on the main process (reads metadata only); the tar reader opens lazily, so
    a pickled copy sent to a DataLoader worker opens its own file handles.
    """

    def __init__(self, path: str, split: str = "train"):
        self.path, self.split = str(path), split
        self._factory = _factory(self.path, split)
        self.shard_counts = tuple(s.count for s in self._factory.shards)
        self._reader = None

    def __getstate__(self):
        return {"path": self.path, "split": self.split}

    def __setstate__(self, state):
        self.__init__(state["path"], state["split"])

    def __len__(self) -> int:
        return sum(self.shard_counts)

    def __getitem__(self, index: int) -> Any:
        if self._reader is None:
            from megatron.energon.flavors.webdataset.itar_reader import ShardInfosITarReader

            f = self._factory
            self._reader = ShardInfosITarReader(f.path, f.shards, part_filter=f.part_filter,
                                                sample_filter=f.sample_filter)
        raw = self._reader[index]
        if raw is None:
            raise KeyError(f"sample {index} is excluded from the dataset")
        return self._factory.load_sample(raw)

    def identity(self) -> dict:
        """What makes this data *this* data: Energon's index uuid, the split and its shard list."""
        meta = Path(self.path) / ".nv-meta"
        shards = [[s.name, s.count] for s in self._factory.shards]
        return {
            "index_uuid": (meta / "index.uuid").read_text().strip() if (meta / "index.uuid").is_file() else None,
            "split": self.split,
            "num_shards": len(shards),
            "num_samples": len(self),
            "shards_sha256": hashlib.sha256(json.dumps(shards).encode()).hexdigest(),
        }
