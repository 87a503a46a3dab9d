"""``energon-platform calibrate``: time a model on real micro-batches, fit its cost coefficients.

A model's time for a micro-batch is modelled as a non-negative linear function of the batch's
cost features as it runs (`task_encoders.features.MICRO_BATCH_FEATURES`: positions and attention
of its rows as laid out, tiles, frames, one call per tower that runs):
``time ≈ Σ coef[f] · features[f] + overhead``.
`calibrate` picks micro-batches that spread the features (farthest-point in feature space
normalised per feature), times forward + backward of each on one thread (a warm-up round excluded,
the minimum of ``repeats`` rounds kept; a round times every micro-batch once, so a burst of load
from other processes inflates one run of several micro-batches, not every run of one), fits the
coefficients with non-negative least squares on three of every four and measures the relative error
of the prediction on the fourth (held back).

The fit also has an ``overhead``: seconds every micro-batch costs whatever it holds. Every rank
pays it once per micro-batch, so the planner balances only the features' part (`CostModel`
has no overhead); fitted without it, a model's fixed cost per micro-batch would land on the
per-sample coefficient, and the planner would balance sample counts.

The cost file (JSON, `FORMAT_VERSION`) holds ``features``, ``coefficients`` (seconds per
unit), ``row_width`` (how the timed rows were laid out, `Shape.as_run`), ``overhead``
(seconds per micro-batch), ``r2`` (of the fit), ``share`` (each feature's
part of the predicted time over the timed micro-batches; ``overhead_share`` the rest),
``p50_error``/``p90_error`` (relative, held-back micro-batches), ``model``,
``encoder_digest`` (`encoder_digest`), ``micro_batches``, ``repeats`` and ``rows`` (each
timed micro-batch: features, measured and predicted seconds, held back or not).
`load_cost_model` reads it back as a `CostModel` for the encoder it was made for
(both live in `energon_platform.loader.balance.cost_file`: ``loader.balance: measured``
plans with them).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import nnls
from tqdm import tqdm

from energon_platform import TrainLoader
from energon_platform.loader.balance.cost_file import (
    FORMAT_VERSION,
    CostFileError,
    CostModel,
    load_cost_model,
)
from energon_platform.loader.fingerprint import encoder_digest
from energon_platform.training import collector
from energon_platform.training.calibration_pool import composed, row_width
from energon_platform.training.two_tower import build_model
from energon_platform.training.user_model import build_user_model, check_loss
from storage.outputs import write_atomic
from task_encoders.abilities import MeasuresBatches, missing
from task_encoders.features import MICRO_BATCH_FEATURES as FITTED

__all__ = [
    "FORMAT_VERSION",
    "CalibrationError",
    "CostFileError",
    "CostModel",
    "calibrate",
    "calibrate_run",
    "check_fit",
    "load_cost_model",
    "write_report",
]

#: The largest p90 relative error (held-back micro-batches) a fit may have to be written.
MAX_P90_ERROR = 0.15
#: Every HOLD_EVERY-th chosen micro-batch is held back from the fit to measure its error.
HOLD_EVERY = 4
#: The micro-batches are chosen among the first POOL_FACTOR x as many of the stream.
POOL_FACTOR = 8

Features = Callable[[Any], Mapping[str, float]]
#: A micro-batch to time and its features as it runs (over `FITTED`; names not given are 0).
Measured = tuple[Any, Mapping[str, float]]


class CalibrationError(ValueError):
    """A calibration that cannot give a usable cost model (too few micro-batches, a poor fit)."""


def feature_matrix(vectors: Iterable[Mapping[str, float]]) -> np.ndarray:
    """float64 ``(B, len(FITTED))``: the vectors' values in `FITTED` order (0 where not given)."""
    return np.array(
        [[float(v.get(name, 0.0)) for name in FITTED] for v in vectors], dtype=np.float64
    ).reshape(-1, len(FITTED))


def paired(batches: Iterable[Any], features: Features) -> Iterator[Measured]:
    """``(batch, features(batch))`` of each batch: what `calibrate` times and fits."""
    for batch in batches:
        yield batch, features(batch)


def spread(matrix: np.ndarray, n: int) -> list[int]:
    """Indices of ``n`` rows of ``matrix`` that spread its values: farthest-point selection in
    the space where each feature is divided by its largest value, starting at the largest row."""
    scale = matrix.max(axis=0)
    points = matrix / np.where(scale > 0, scale, 1.0)
    chosen = [int(np.argmax(points.sum(axis=1)))]
    distance = np.linalg.norm(points - points[chosen[0]], axis=1)
    while len(chosen) < min(n, len(points)):
        chosen.append(int(np.argmax(distance)))
        distance = np.minimum(distance, np.linalg.norm(points - points[chosen[-1]], axis=1))
    return chosen


def time_step(model: torch.nn.Module, batch: Any) -> float:
    """Seconds of one forward + backward of ``model`` on ``batch`` (gradients cleared first). On a
    GPU the clock is read only once the device has finished the queued work (CUDA runs the
    backward asynchronously), so the time is the device's, not the launch's."""
    device = _cuda_device(model)
    model.zero_grad(set_to_none=True)
    if device is not None:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    model(batch).backward()
    if device is not None:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _cuda_device(model: torch.nn.Module) -> torch.device | None:
    """The CUDA device of ``model``'s first parameter, or None (a CPU model, or no parameter)."""
    param = next(iter(model.parameters()), None)
    if param is not None and param.device.type == "cuda":
        return param.device
    return None


def time_rounds(
    model: torch.nn.Module, batches: list, repeats: int, progress: bool = False
) -> np.ndarray:
    """Seconds per batch: one warm-up round, then ``repeats`` rounds each timing every batch once
    (`time_step`), the least kept. The caller sets the threads. Python's garbage collector is off
    while timing (as ``timeit`` does): a full collection of a large process inside one timed step
    would add its own time to that batch."""
    best = np.full(len(batches), np.inf)
    bar = tqdm(
        total=(repeats + 1) * len(batches),
        desc="timing micro-batches",
        unit="run",
        disable=not progress,
    )
    with collector.off():
        for round_ in range(repeats + 1):
            for i, batch in enumerate(batches):
                seconds = time_step(model, batch)
                if round_:
                    best[i] = min(best[i], seconds)
                bar.update()
    bar.close()
    return best


def fit(matrix: np.ndarray, seconds: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares of ``seconds ≈ matrix @ coef + overhead``: ``(coef, overhead)``.
    ``overhead`` is the seconds every micro-batch costs whatever it holds (a launch, the
    optimizer's hooks, Python): no sample causes it, and every rank pays it once per micro-batch,
    so it is reported but not planned with. Columns are scaled to a largest value of 1 for the
    solver; a feature that is always 0 gets 0. A feature of the same value in every micro-batch
    (``vision_calls`` where every micro-batch holds an image, ``samples`` of one-sample
    micro-batches) cannot be told apart from the overhead: it gets 0 and the overhead takes its
    time, so no share of the report is a guess."""
    scale = matrix.max(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    varies = (matrix != matrix[:1]).any(axis=0)  # all False for no rows
    design = np.hstack([matrix / scale * varies, np.ones((len(matrix), 1))])
    solution, _ = nnls(design, seconds)
    return solution[:-1] * varies / scale, float(solution[-1])


def r_squared(seconds: np.ndarray, predicted: np.ndarray) -> float:
    """1 - residual / total sum of squares (1.0 when every time is the same and predicted so)."""
    total = float(((seconds - seconds.mean()) ** 2).sum())
    residual = float(((seconds - predicted) ** 2).sum())
    return 1.0 - residual / total if total > 0 else float(residual == 0)


def calibrate(
    model: torch.nn.Module,
    measured: Iterable[Measured],
    *,
    micro_batches: int = 24,
    repeats: int = 3,
    pool: int | None = None,
    progress: bool = True,
    row_width: int | str | None = None,
    checked_as: str | None = None,
) -> dict:
    """The cost report (module doc, without ``model`` and ``encoder_digest``) of ``model`` on
    ``micro_batches`` of the first ``pool`` (default 8x) ``measured`` micro-batches (each with
    its features as it runs, `paired`), chosen by `spread` of their features. ``row_width``:
    how those features laid the rows out (`Shape.as_run`), written to the report for the
    planner to predict with. Runs on one thread (restored after). `CalibrationError` when fewer
    than `HOLD_EVERY` micro-batches can be timed. ``checked_as``: the name ``model`` is checked
    under on one micro-batch first (`check_loss`: a forward that returns no scalar loss with a
    gradient is refused, a loss that is not finite said); None: not checked."""
    drawn = _draw(measured, pool or POOL_FACTOR * micro_batches)
    matrix = feature_matrix([vector for _, vector in drawn])
    chosen = spread(matrix, micro_batches)
    if len(chosen) < HOLD_EVERY:
        raise CalibrationError(
            f"{len(chosen)} micro-batch(es) to time; at least {HOLD_EVERY} are needed "
            "(three to fit, one held back)"
        )
    if checked_as is not None:
        check_loss(model, drawn[chosen[0]][0], checked_as)
    seconds = _timed(model, [drawn[i][0] for i in chosen], repeats, progress)
    return {**_report(matrix[chosen], seconds, repeats), "row_width": row_width}


def _draw(batches: Iterable[Any], count: int) -> list:
    """The first ``count`` batches of ``batches`` (fewer if it ends)."""
    drawn = []
    for batch in batches:
        drawn.append(batch)
        if len(drawn) >= count:
            break
    return drawn


def _timed(model: torch.nn.Module, batches: list, repeats: int, progress: bool) -> np.ndarray:
    """`time_rounds` of ``batches`` on one thread (restored after), in training mode."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.train()
        return time_rounds(model, batches, repeats, progress)
    finally:
        torch.set_num_threads(threads)


def _report(matrix: np.ndarray, seconds: np.ndarray, repeats: int) -> dict:
    """Fit on all but every `HOLD_EVERY`-th row, measure the error on those."""
    held = np.arange(len(seconds)) % HOLD_EVERY == HOLD_EVERY - 1
    coef, overhead = fit(matrix[~held], seconds[~held])
    predicted = matrix @ coef + overhead
    errors = np.abs(predicted[held] - seconds[held]) / seconds[held]
    parts = (matrix * coef).sum(axis=0)
    total = max(parts.sum() + overhead * len(seconds), 1e-300)
    return {
        "format_version": FORMAT_VERSION,
        "features": list(FITTED),
        "coefficients": dict(zip(FITTED, coef.tolist(), strict=True)),
        "overhead": overhead,
        "r2": r_squared(seconds[~held], predicted[~held]),
        "share": dict(zip(FITTED, (parts / total).tolist(), strict=True)),
        "overhead_share": overhead * len(seconds) / total,
        "p50_error": float(np.percentile(errors, 50)),
        "p90_error": float(np.percentile(errors, 90)),
        "micro_batches": len(seconds),
        "repeats": repeats,
        "rows": [
            {
                "features": dict(zip(FITTED, row.tolist(), strict=True)),
                "seconds": float(s),
                "predicted": float(p),
                "held_back": bool(h),
            }
            for row, s, p, h in zip(matrix, seconds, predicted, held, strict=True)
        ],
    }


def check_fit(report: dict, max_p90: float = MAX_P90_ERROR) -> None:
    """`CalibrationError` when the held-back p90 relative error exceeds ``max_p90``, or when every
    coefficient is 0 (the micro-batches' times did not grow with any feature: nothing to
    balance with)."""
    if report["p90_error"] > max_p90:
        raise CalibrationError(
            f"the fit's p90 relative error on held-back micro-batches is "
            f"{report['p90_error']:.1%} (more than {max_p90:.0%}); time more micro-batches "
            "(--micro-batches) or repeats (--repeats) on a quiet machine"
        )
    if not any(report["coefficients"].values()):
        raise CalibrationError(
            "every fitted coefficient is 0: the timed micro-batches took the same time whatever "
            "they held (the model's fixed cost hides the samples'); time a larger model or "
            "longer samples"
        )


def format_table(report: dict) -> str:
    """Predicted vs measured milliseconds per timed micro-batch, then the held-back errors."""
    lines = [f"{'micro-batch':>11}  {'measured ms':>11}  {'predicted ms':>12}  {'error':>7}"]
    for i, row in enumerate(report["rows"]):
        error = abs(row["predicted"] - row["seconds"]) / row["seconds"]
        mark = " (held back)" if row["held_back"] else ""
        lines.append(
            f"{i:>11}  {1e3 * row['seconds']:>11.2f}  {1e3 * row['predicted']:>12.2f}  {error:>7.1%}{mark}"
        )
    lines.append(
        f"held back: p50 error {report['p50_error']:.1%}, p90 error {report['p90_error']:.1%}; "
        f"fit R² {report['r2']:.3f}; overhead {1e3 * report['overhead']:.2f} ms per micro-batch "
        f"({report['overhead_share']:.0%} of the time, not balanced)"
    )
    return "\n".join(lines)


def write_report(report: dict, path: str | Path) -> None:
    """Write the cost file (atomically: a temporary file renamed into place)."""
    with write_atomic(path) as tmp:
        tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def is_cost_file(path: Path) -> bool:
    """Whether ``path`` is a cost file calibrate wrote (a JSON object with its fields): the only
    existing file ``calibrate --out`` replaces (`storage.outputs.check_file`)."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"format_version", "coefficients", "encoder_digest"} <= set(
        data
    )


def batch_features_of(encoder: Any) -> Features:
    """The encoder's ``batch_features`` (the features contract, `MeasuresBatches`);
    `CalibrationError` naming what it lacks when it states none."""
    if not isinstance(encoder, MeasuresBatches):
        raise CalibrationError(
            f"encoder {type(encoder).__name__} has no {', '.join(missing(encoder, MeasuresBatches))} "
            "to read a micro-batch's cost features from"
        )
    return encoder.batch_features


def calibrate_run(
    cfg: Any,
    factory: Callable[[Any], torch.nn.Module] | None = None,
    *,
    model_name: str = "two_tower",
    features: Features | None = None,
    micro_batches: int = 24,
    repeats: int = 3,
    progress: bool = True,
) -> dict:
    """The cost report (module doc) of ``factory(encoder)`` (default: the two-tower model of
    ``cfg.model``) on micro-batches of ``cfg``'s training data (a ``TrainLoader`` without
    workers), composed to spread the features, each with its features as it runs
    (`calibration_pool.composed`, `calibration_pool.row_width`). ``features``: a
    batch's summed cost features (default: the encoder's ``batch_features``). A user's
    ``factory`` that cannot build a model, or whose model returns no usable loss, is a one-line
    `user_model.UserModelError`."""
    loader = TrainLoader(cfg, num_workers=0)
    encoder = loader.encoder
    features = features or batch_features_of(encoder)
    if factory is None:
        model = build_model(dataclasses.replace(cfg.model, kind="two_tower"), encoder)
    else:
        model = build_user_model(factory, encoder, model_name)
    report = calibrate(
        model,
        composed(loader, features, micro_batches, progress),
        micro_batches=micro_batches,
        repeats=repeats,
        progress=progress,
        row_width=row_width(loader),
        checked_as=model_name,
    )
    return {**report, "model": model_name, "encoder_digest": encoder_digest(encoder)}
