"""The executor's keys of ``loader:`` (`ExecutorConfig`), beside the executors they pick.

``executor`` names one of the executors' registry (`registry.EXECUTORS`); ``ray_address`` and
``ray_actor_options`` configure the Ray pool. `energon_platform.loader.settings.LoaderConfig`
holds them as its last keys (``loader.executor``, not a group of their own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from energon_platform.loader.executors.registry import executor_names
from task_encoders.config_parser import CHOICES, At, require

#: The keys of ``loader.ray_actor_options`` (Ray's actor options that place and size an actor).
RAY_ACTOR_OPTIONS = frozenset(
    {"num_cpus", "num_gpus", "memory", "resources", "accelerator_type", "runtime_env"}
)


@dataclass(frozen=True)
class ExecutorConfig:
    """Who makes a rank's micro-batches: the executor's keys of ``loader:``."""

    executor: str = field(default="local", metadata={CHOICES: executor_names})
    """Who makes the micro-batches: ``local`` worker processes (``num_workers``; 0: the training
    process), or ``ray``: a pool of ``num_workers`` Ray actors (at least 1), on any node of a Ray
    cluster; every node must read the run's data, encoder config and tokenizer files."""
    ray_address: str | None = None
    """``executor: ray``: the cluster to join, ``auto`` (the one ``ray start`` made on this node)
    or ``HOST:PORT``; null: start a Ray of this node, shut down when the loader closes."""
    ray_actor_options: dict[str, Any] = field(default_factory=dict)
    """``executor: ray``: Ray's options of each actor (``num_cpus``, ``memory``, ``resources``:
    e.g. ``{resources: {data_node: 1}}`` places the actors on nodes that offer ``data_node``);
    default ``{num_cpus: 1}``."""

    def check_executor(self, at: At, num_workers: int) -> None:
        """The executor's keys, with the loader's ``num_workers`` (the Ray pool's actors)."""
        require(
            self.executor != "ray" or num_workers >= 1,
            at.child("num_workers"),
            "0 with executor 'ray'",
            "the number of Ray actors, at least 1 (or executor: local)",
        )
        require(
            self.ray_address in (None, "auto") or _host_port(self.ray_address),
            at.child("ray_address"),
            f"got {self.ray_address!r}",
            "null (a Ray of this node), auto, or HOST:PORT of the cluster's head",
        )
        require(
            set(self.ray_actor_options) <= RAY_ACTOR_OPTIONS,
            at.child("ray_actor_options"),
            f"keys {sorted(set(self.ray_actor_options) - RAY_ACTOR_OPTIONS)}",
            f"some of {sorted(RAY_ACTOR_OPTIONS)}",
        )


def _host_port(address: str) -> bool:
    """Whether ``address`` reads ``HOST:PORT`` (a port number after the last colon)."""
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit()
