"""``energon-platform index``: every dataset's length index of a run config, built ahead of
training, stored with the data (`energon_platform.loader.balance.length_store`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from energon_platform.loader.balance.length_store import build, publish, writable_place
from energon_platform.loader.datasets import open_datasets
from energon_platform.loader.fingerprint import encoder_digest
from energon_platform.loader.run_plan import build_encoder
from task_encoders.abilities import StatesFacts, missing
from task_encoders.base import SeededTaskEncoder


def index_run(
    cfg: Any,
    workers: int = 1,
    use_ray: bool = False,
    ray_address: str | None = None,
    progress: bool = True,
) -> list[dict]:
    """Build (or find fresh) the length index of every dataset of ``cfg``'s training split under
    its encoder (`index_dataset`); per dataset, what `build` returns plus ``dataset``."""
    encoder = build_encoder(cfg)
    return [
        index_dataset(
            entry.source, encoder, cfg.loader.length_cache, workers, use_ray, ray_address, progress
        )
        for entry in open_datasets(str(cfg.data.path), cfg.data.train_split).entries
    ]


def index_dataset(
    source: Any,
    encoder: SeededTaskEncoder,
    cache: str | None = None,
    workers: int = 1,
    use_ray: bool = False,
    ray_address: str | None = None,
    progress: bool = True,
) -> dict:
    """Build (or find fresh) ``source``'s length index under ``encoder`` in its first writable
    place (with the data first, else ``cache``, else the local cache), reusing the shards indexed
    before (a killed run, another version of the dataset); what `build` returns plus ``dataset``.
    `NotImplementedError` for an encoder that states no length facts."""
    if not isinstance(encoder, StatesFacts):
        gone = ", ".join(missing(encoder, StatesFacts))
        raise NotImplementedError(f"{type(encoder).__name__} has no {gone}: it has no length index")
    stats = build(
        source,
        encoder,
        encoder_digest(encoder),
        writable_place(source, cache),
        workers=workers,
        progress=progress,
        ray_address=ray_address,
        use_ray=use_ray,
    )
    published = publish(source, Path(stats["folder"]))
    return {"dataset": str(source.path), **stats, "published": published}


def summary(stats: dict) -> str:
    """One line of what `index_run` did for a dataset, a line per damaged file it replaced, and
    where the index is."""
    rate = stats["samples"] / stats["seconds"] if stats["indexed"] and stats["seconds"] else None
    done = (
        f"{stats['indexed']} of {stats['shards']} shards indexed now, {stats['reused']} reused"
        + (f", {rate:,.0f} samples/s" if rate else "")
    )
    unreadable = f", {stats['unreadable']} unreadable" if stats["unreadable"] else ""
    damaged = stats.get("damaged") or []
    healed = f"; {len(damaged)} damaged file(s) rebuilt" if damaged else ""
    where = stats.get("published") or Path(stats["folder"])
    return "\n".join(
        [
            f"{stats['dataset']}: {stats['samples']:,} samples; {done}{unreadable}{healed}",
            *(f"  damaged, rebuilt: {line}" for line in damaged),
            f"  index: {where}",
        ]
    )
