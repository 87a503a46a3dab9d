"""Joining the Ray cluster of ``loader.ray_address`` (or starting a Ray of this node), and leaving.

`connect` returns whether this process started Ray itself (``ray_address: null`` and no Ray
connection yet): `disconnect` then shuts it down (no Ray process of ours is left), while a cluster
that was joined, or a connection the program made itself, is left as it was. An address that does
not answer is told in one line (`RayUnavailable`) after a short check of its port, instead of
Ray's own minute of retries.
"""

from __future__ import annotations

import socket

import ray

from energon_platform.loader.executors.base import WorkerLost

#: seconds the head's port gets to answer
ANSWER_TIMEOUT = 5.0

#: what to do after a run stopped for its Ray cluster
RESUME = (
    "resume from the latest checkpoint once the cluster answers (or with loader.executor: local); "
    "the data continues exactly"
)


class RayUnavailable(WorkerLost):
    """The Ray cluster does not answer, or has lost every actor of the pool (one line that says
    how to resume)."""

    says_how_to_resume = True

    def __init__(self, message: str, c: int):
        RuntimeError.__init__(self, f"{message}; {RESUME}")
        self.worker, self.c, self.reason = "the Ray cluster", c, message


def connect(address: str | None, c: int) -> bool:
    """Connect this process to Ray at ``address`` (None: a Ray of this node); True when this
    call started Ray (`disconnect` shuts it down). `RayUnavailable` when it does not answer."""
    if address not in (None, "auto") and not address.startswith("ray://"):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=ANSWER_TIMEOUT).close()
        except OSError as e:
            raise RayUnavailable(
                f"loader.ray_address {address} does not answer ({e.strerror or e}): no Ray "
                f"cluster's head listens there",
                c,
            ) from None
    if ray.is_initialized():  # the program's own connection (or an earlier loader's)
        return False
    try:
        ray.init(
            address=address or "local",  # None would join a cluster this node runs already
            include_dashboard=False,
            configure_logging=False,
            log_to_driver=True,
        )
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise RayUnavailable(
            f"loader.ray_address {address or 'null'}: Ray does not start or answer ({first})", c
        ) from None
    return address is None


def disconnect(started: bool) -> None:
    """Shut Ray down if `connect` started it (its processes end with it)."""
    if started and ray.is_initialized():
        ray.shutdown()
