"""The comparison of the uninterrupted run's steps with the resumed run's, and the per-rank balance
summary of a run.
"""

from __future__ import annotations


def _same(a: dict, b: dict, field: str) -> bool | None:
    """Whether rows ``a`` and ``b`` agree on ``field``; None when neither logs it."""
    if field not in a and field not in b:
        return None
    return a.get(field) == b.get(field)


def _all(values: list) -> bool | None:
    """True/False over the values that were compared; None when none was (the log carries no such field)."""
    known = [v for v in values if v is not None]
    return all(known) if known else None


def compare(
    straight: dict[int, dict], resumed: dict[int, dict], first: int, last: int, tolerance: float
) -> dict:
    """Steps ``first..last`` of ``straight`` against the rows the resumed process logged
    (``resumed``). Passes when every step is there on both sides with identical keys and tensor
    hashes (where the rows carry them: ``keys``, ``batch_sha256``) and a loss within
    ``tolerance``, and the resumed process logged no step before ``first`` (it continued from
    the checkpoint; it did not start over). ``keys_identical``/``tensors_identical`` are None
    when no row carries the field."""
    rows = []
    for step in range(first, last + 1):
        a, b = straight.get(step), resumed.get(step)
        if a is None or b is None:
            rows.append({"step": step, "missing": "straight" if a is None else "resumed"})
            continue
        rows.append(
            {
                "step": step,
                "keys_identical": _same(a, b, "keys"),
                "tensors_identical": _same(a, b, "batch_sha256"),
                "loss_straight": a["loss"],
                "loss_resumed": b["loss"],
                "abs_loss_diff": abs(a["loss"] - b["loss"]),
            }
        )
    complete = [r for r in rows if "missing" not in r]
    max_diff = max((r["abs_loss_diff"] for r in complete), default=float("nan"))
    if any(d != d for d in (r["abs_loss_diff"] for r in complete)):  # a NaN loss on either side
        max_diff = float("nan")
    result = {
        "steps_compared": len(complete),
        "missing_steps": [r["step"] for r in rows if "missing" in r],
        "keys_identical": _all([r["keys_identical"] for r in complete]),
        "tensors_identical": _all([r["tensors_identical"] for r in complete]),
        "max_abs_loss_diff": max_diff,
        "tolerance": tolerance,
        "resumed_steps_before_resume_point": sorted(s for s in resumed if s < first),
        "rows": rows,
    }
    result["passed"] = (
        bool(complete)
        and not result["missing_steps"]
        and result["keys_identical"] is not False
        and result["tensors_identical"] is not False
        and max_diff <= tolerance
        and not result["resumed_steps_before_resume_point"]
    )
    return result


def balance_summary(rows: dict) -> dict:
    """``{"balance": {...}}`` over the logged steps of a run with ``loader.balance`` (per-step
    ``rank_cost``: max/mean of the ranks' costs, and ``padding``); ``{}`` for other runs."""
    steps = [r for r in rows.values() if "rank_cost" in r]
    if not steps:
        return {}
    costs, pads = [r["rank_cost"] for r in steps], [r.get("padding", 0.0) for r in steps]
    return {
        "balance": {
            "steps": len(steps),
            "rank_cost_max": max(costs),
            "rank_cost_mean": round(sum(costs) / len(costs), 4),
            "padding_mean": round(sum(pads) / len(pads), 4),
            "rank_cost": costs,
        }
    }
