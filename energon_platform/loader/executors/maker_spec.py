"""What a worker on another machine needs to make a rank's micro-batches, as plain data.

A forked worker inherits the training process's `MicroBatchMaker`; a Ray actor cannot, so the
trainer hands it a `MakerSpec` (`spec_of`): the run config as plain data, the rank and world
size, the loader state at the position the workers start from (its fingerprint is the trainer's
`RunPlan`'s, with each dataset's identity) and a digest of the encoder's files (the tokenizer's).
`build_maker` rebuilds the plan and the maker from it on the worker's node, after checking that
the node reads the same data, length index and encoder: otherwise `NodeMismatch` (one line naming
the node and the path). No Ray here: the spec is built in the training process of any run.
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energon_platform.loader.state import StateMismatchError
from task_encoders.documents import DocumentTaskEncoder

#: files of the encoder larger than this (in all) are compared by size and mtime, not read
HASHED_BYTES = 64 * 1024 * 1024


class NodeMismatch(StateMismatchError):
    """A worker's node reads other data, another length index or another encoder than the
    trainer's, or cannot read one of them (one line naming the node and the path)."""


@dataclass(frozen=True)
class MakerSpec:
    """A rank's maker as plain, picklable data (module doc)."""

    config: dict  #: the run config (`config_dict`), paths absolute
    rank: int
    world_size: int
    state: dict  #: the `LoaderState` dict at the position the workers start from
    timed_out: dict  #: ``(dataset, index)`` → ``(key, limit)``: failed samples (stand-ins)
    files: dict  #: path → digest of the encoder's files (`encoder_files`)


def spec_of(source: Any, first: int, timed_out: dict) -> MakerSpec:
    """The spec of ``source`` (a `TrainLoader`: ``run_config``, ``rank``, ``world_size``,
    ``state_at``, ``encoder``) for workers starting at micro-batch ``first``."""
    from energon_platform.config import config_dict

    config = config_dict(source.run_config)
    if isinstance(config.get("encoder"), str):  # a file named relative to this process's folder
        config["encoder"] = os.path.abspath(config["encoder"])
    return MakerSpec(
        config=config,
        rank=source.rank,
        world_size=source.world_size,
        state=source.state_at(first),
        timed_out=dict(timed_out),
        files=encoder_files(source.plan.encoder),
    )


def node_name() -> str:
    """This node as messages name it: its host name and IP address."""
    host = socket.gethostname()
    try:
        ip = socket.gethostbyname(host)
    except OSError:
        return host
    return f"{host} ({ip})"


def encoder_files(encoder: object) -> dict[str, str]:
    """Path → digest of the files the encoder reads at start (a document encoder's tokenizer
    folder's files; none for another encoder)."""
    if not isinstance(encoder, DocumentTaskEncoder):
        return {}
    folder = encoder.tokenizer.path
    if not folder.is_dir():
        return {}
    files = sorted(p for p in Path(folder).iterdir() if p.is_file())
    total = sum(p.stat().st_size for p in files)
    return {str(p): _file_digest(p, total <= HASHED_BYTES) for p in files}


def _file_digest(path: Path, read: bool) -> str:
    if not read:
        stat = path.stat()
        return f"size {stat.st_size}"
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def build_maker(spec: MakerSpec, worker: str) -> tuple[Any, Any]:
    """``(maker, plan)`` of ``spec`` on this node, ``worker`` naming it in errors. A length index
    is required, not built (the trainer built or found it; a node that does not see it is told
    so). `NodeMismatch` (one line) for data, an index or an encoder that this node cannot read
    or reads otherwise than the trainer."""
    from energon_platform.config import load_config
    from energon_platform.loader.batches import MicroBatchMaker
    from energon_platform.loader.run_plan import RunPlan, build_encoder
    from energon_platform.loader.state import LoaderState

    where = f"{worker} on node {node_name()}"
    try:
        cfg = load_config(spec.config, {"loader.length_index": "require"})
        encoder = build_encoder(cfg)
        _check_files(spec.files, encoder_files(encoder), where)
        plan = RunPlan(cfg, encoder, spec.world_size, 0, rank=-1)  # rank 0 alone warns
        state = LoaderState.from_dict(spec.state)
        encoder_at = (
            spec.config["encoder"] if isinstance(spec.config["encoder"], str) else "(inline)"
        )
        _check_fingerprint(state.fingerprint, plan, where, encoder_at)
        plan.resume(state, announce=False)
    except NodeMismatch:
        raise
    except Exception as e:  # an unreadable path, a missing index: the error's own line names it
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise NodeMismatch(
            f"{where} cannot make the run's micro-batches: {first} (every node must read the "
            f"run's datasets, length index, encoder config and tokenizer files at the same paths)"
        ) from None
    maker = MicroBatchMaker(
        plan.datasets,
        encoder,
        plan.schedule,
        spec.rank,
        spec.world_size,
        plan.micro_items,
        planner=plan.planner,
        exclusions=plan.excluder,
    )
    maker.timed_out = dict(spec.timed_out)
    return maker, plan


def _check_files(trainer: dict, mine: dict, where: str) -> None:
    for path, digest in trainer.items():
        if path not in mine:
            raise NodeMismatch(
                f"{where} cannot read {path} (the encoder's tokenizer files must be on every node)"
            )
        if mine[path] != digest:
            raise NodeMismatch(
                f"{where} reads another {path} than the trainer (the encoder's tokenizer files "
                f"must be the same on every node)"
            )


def _check_fingerprint(trainer: dict, plan: Any, where: str, encoder: str) -> None:
    """The node's plan against the trainer's fingerprint: each dataset's identity, the encoder,
    then the rest (batching mode and length index included)."""
    identities = plan.dataset_identities()
    paths = {e.name: e.source.path for e in plan.datasets.entries}
    for name, identity in trainer.get("datasets", {}).items():
        if name not in identities:
            raise NodeMismatch(f"{where} finds no dataset {name!r} in the run's data.path")
        if identities[name] != identity:
            diff = sorted(k for k in identity if identities[name].get(k) != identity[k])
            raise NodeMismatch(
                f"{where} reads other data at {paths[name]} than the trainer ({', '.join(diff)} "
                f"differ): every node must see the same dataset (a shared folder or msc://)"
            )
    mine = plan.fingerprint
    for key, value in trainer.items():
        if key != "datasets" and mine.get(key) != value:
            raise NodeMismatch(
                f"{where} builds another {key} than the trainer ({mine.get(key)} against "
                f"{value}): the encoder config {encoder} must be the same on every node"
            )
