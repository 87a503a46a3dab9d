"""``loader.balance``, beside the planner it configures: `BalanceConfig` (the group's keys and
their checks), the modes it takes (read from the cost models' registry, `COST_MODELS`) and the
YAML shapes it is read from (a mode alone, ``loader.cost_model``; the flat keys of earlier configs
refused), which `energon_platform.config.load_config` applies before parsing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from energon_platform.loader.balance.costs import COST_MODELS
from task_encoders.config_parser import CHOICES, At, ConfigError, at_least, finite, require

#: Bounds of the planner's pool: samples (``balance.window``) and global batches (``balance.lookahead``).
MAX_BALANCE_WINDOW, MAX_BALANCE_LOOKAHEAD = 65536, 16.0


def balance_modes() -> tuple[str, ...]:
    """The ``loader.balance`` modes: ``none`` (`StreamBatching`) and the cost models of planned
    batching, read from their registry (`COST_MODELS`: a cost model registered there is a mode)."""
    return ("none", *COST_MODELS)


#: ``loader.balance`` modes (`balance_modes`); the batching registry is checked against it
BALANCE_MODES = balance_modes()


@dataclass(frozen=True)
class BalanceConfig:
    """``loader.balance``: how global batches are made (`planner`).

    Written as a mode alone (``balance: attention``) or as a group:

        balance:
          mode: attention      # none | tokens | attention | encoder | measured
          lookahead: 3.0       # the pool holds this many global batches of positions
          window: 4096         # and at most this many samples
          linear: null         # attention's linear term (null: the encoder's seq_len)
          global_batch_tokens: null   # unpacked: a global batch is this cost budget
          cost_model: null     # measured: the cost file of energon-platform calibrate

    The keys other than ``mode`` only matter when ``mode`` is not ``none``. ``loader.cost_model`` is read as
    ``cost_model`` (so ``balance: measured`` stays a mode alone). The flat keys of earlier configs
    (``loader.balance_window``, ``balance_lookahead``, ``balance_linear``,
    ``global_batch_tokens``) are refused in one line naming the key to write instead.
    """

    mode: str = field(default="none", metadata={CHOICES: balance_modes})
    """How global batches are made: ``none`` (consecutive stream positions), ``tokens`` (equal
    Σ L per rank), ``attention`` (equal Σ L² + ``linear``·L), ``encoder`` (the encoder's own
    ``balance_cost(length)``) or ``measured`` (the calibrated model's predicted time of each
    sample, from ``cost_model``)."""
    window: int = 4096
    """The planner's pool holds at most this many samples (at least ``global_batch_size``)."""
    lookahead: float = 3.0
    """The pool holds this many global batches of positions."""
    linear: float | None = None
    """The linear term of ``attention``'s cost; null: the encoder's ``seq_len``."""
    global_batch_tokens: float | None = None
    """Unpacked: a global batch is this cost budget (``global_batch_size`` samples at least);
    null: a fixed number of samples. A whole number of cost units (tokens, attention) in every
    mode but ``measured``, whose costs are predicted seconds (0.5 is a budget there)."""
    cost_model: Path | None = None
    """``measured`` only: the cost file written by ``energon-platform calibrate`` (also read
    from ``loader.cost_model``)."""

    @property
    def planned(self) -> bool:
        """Whether global batches are planned (any mode but ``none``)."""
        return self.mode != "none"

    @property
    def calibrated(self) -> bool:
        """Whether the mode's costs are a cost file's predicted seconds (`CostFunction.calibrated`:
        ``measured``), read from ``cost_model``."""
        function = COST_MODELS.get(self.mode)  # None: mode none
        return function is not None and function.calibrated

    def check(self, at: At) -> None:
        at_least(self, at, window=16, lookahead=1.0)
        require(
            self.lookahead <= self.window,
            at.child("lookahead"),
            f"got {self.lookahead}",
            f"at most window ({self.window}): the pool never holds more samples than that",
        )
        require(
            self.window <= MAX_BALANCE_WINDOW,
            at.child("window"),
            f"got {self.window}",
            f"at most {MAX_BALANCE_WINDOW} (the pool is planned every global batch and saved in the state)",
        )
        require(
            self.lookahead <= MAX_BALANCE_LOOKAHEAD,
            at.child("lookahead"),
            f"got {self.lookahead}",
            f"at most {MAX_BALANCE_LOOKAHEAD} global batches",
        )
        at_least(self, at, null_ok=True, linear=0)
        budget, calibrated = self.global_batch_tokens, self.calibrated
        if budget is not None:
            require(
                finite(budget) and budget > 0 and (calibrated or float(budget).is_integer()),
                at.child("global_batch_tokens"),
                f"got {budget:g}",
                "seconds > 0 (the cost model's predicted time)"
                if calibrated
                else f"a whole number >= 1 of {self.mode} cost units, or null",
            )
            if float(budget).is_integer():  # the fingerprint holds 4096, as before, not 4096.0
                object.__setattr__(self, "global_batch_tokens", int(budget))
        require(
            self.global_batch_tokens is None or self.planned,
            at.child("global_batch_tokens"),
            f"{self.global_batch_tokens} with mode 'none'",
            "null unless a balance mode is set",
        )
        require(
            not calibrated or self.cost_model is not None,
            at.child("cost_model"),
            f"null with mode {self.mode!r}",
            "the cost file written by energon-platform calibrate",
        )
        calibrated_modes = " or ".join(repr(m) for m, f in COST_MODELS.items() if f.calibrated)
        require(
            calibrated or self.cost_model is None,
            at.child("cost_model"),
            f"{self.cost_model} with mode {self.mode!r}",
            f"null unless mode is {calibrated_modes}",
        )


#: The flat ``loader`` keys of earlier configs → their key in the ``loader.balance`` group (refused,
#: naming it).
FLAT_BALANCE_KEYS = {
    "balance_window": "window",
    "balance_lookahead": "lookahead",
    "balance_linear": "linear",
    "global_batch_tokens": "global_batch_tokens",
}
#: ``loader`` keys read into the ``loader.balance`` group as they are (not deprecated: they let a
#: mode alone, ``balance: measured``, name its file).
LOADER_BALANCE_KEYS = {"cost_model": "cost_model"}


def group_balance(data: dict, at: At) -> None:
    """Bring ``loader.balance`` to its group form in place: a mode alone (``balance: tokens``)
    becomes ``{"mode": "tokens"}``, and ``loader.cost_model`` (`LOADER_BALANCE_KEYS`) moves into
    the group. A key set both ways, and a flat key of earlier configs (`FLAT_BALANCE_KEYS`), are
    refused in one line naming the key to write."""
    loader = data.get("loader")
    if not isinstance(loader, dict):
        return
    for old, new in FLAT_BALANCE_KEYS.items():
        if old in loader:
            raise flat_key_error(at, old, new)
    group = loader.get("balance")
    if isinstance(group, str):
        group = loader["balance"] = {"mode": group}
    flat = [k for k in LOADER_BALANCE_KEYS if k in loader]
    if not flat:
        return
    if group is None:
        group = loader["balance"] = {}
    if not isinstance(group, dict):
        return  # parsing names what is wrong with it
    for old in flat:
        new = LOADER_BALANCE_KEYS[old]
        if new in group:
            raise ConfigError(
                at.source,
                f"loader.{old}",
                f"set twice: as loader.{old} and as loader.balance.{new} (keep the second)",
            )
        group[new] = loader.pop(old)


def flat_key_error(at: At, old: str, new: str) -> ConfigError:
    """The refusal of a flat key of earlier configs, naming the key to write."""
    return ConfigError(
        at.source, f"loader.{old}", f"not a key any more; write loader.balance.{new}"
    )


def balance_override(data: dict, dotted: str, value: Any, at: At) -> str | None:
    """Where an override of the balance settings goes: ``loader.balance=MODE`` on a group changes
    its mode (the group's other keys stay; None: done here), ``loader.cost_model`` goes to the
    group's; a flat key of earlier configs is refused; others as written."""
    if dotted == "loader.balance" and isinstance(value, str):
        if data.get("loader") is None:
            data["loader"] = {}
        loader = data["loader"]
        if isinstance(loader, dict):  # a mode: the group's other keys, given before or after, stay
            group = loader.get("balance")
            if isinstance(group, dict):
                group["mode"] = value
            else:
                loader["balance"] = {"mode": value}
            return None
    old = dotted.removeprefix("loader.")
    if old != dotted and old in LOADER_BALANCE_KEYS:
        return f"loader.balance.{LOADER_BALANCE_KEYS[old]}"
    if old != dotted and old in FLAT_BALANCE_KEYS:
        raise flat_key_error(at, old, FLAT_BALANCE_KEYS[old])
    return dotted
