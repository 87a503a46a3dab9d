"""The blend's history as segments: planned from the config, and continued at resume.

A run's blend is a list of `Segment` records (start unit,
weights per dataset). ``plan_segments`` builds it from the metadataset's weights and
``loader.blend_schedule``. At resume, ``resume_segments`` keeps the saved history up to the resume
position and continues with the current config's plan from there, so

* an unchanged config reproduces the uninterrupted run's segments exactly;
* new weights (or a new ``blend_schedule``) take effect from the resume step on, and the change is
  returned (and logged) with its step; the state saved later holds the whole history, so a later
  resume replays the same past;
* a dataset added to the metadataset joins from the resume step with weight 0 before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from energon_platform.loader.blend import MAX_PERIOD, Segment, integer_counts
from storage import DatasetError


def _weights_for(names: Sequence[str], mapping: dict[str, Any]) -> tuple[str, ...]:
    unknown = sorted(set(mapping) - set(names))
    if unknown:
        raise DatasetError(
            f"loader.blend_schedule names dataset(s) {unknown} that the blend does not have "
            f"(its datasets: {list(names)})"
        )
    return tuple(str(Fraction(str(mapping.get(n, 0)))) for n in names)


def plan_segments(
    datasets: Any, blend_schedule: Sequence[Any], units_per_batch: int
) -> list[Segment]:
    """Segments from the metadataset's weights and ``blend_schedule`` (``BlendStep`` records: step, weights)."""
    segments = [Segment(0, datasets.weights())]
    for entry in blend_schedule:
        seg = Segment(entry.step * units_per_batch, _weights_for(datasets.names, entry.weights))
        if seg.start == segments[-1].start:
            segments[-1] = seg
        elif seg.weights != segments[-1].weights:
            segments.append(seg)
    return _checked(segments, datasets, units_per_batch)


def _checked(segments: list[Segment], datasets: Any, units_per_batch: int) -> list[Segment]:
    """``segments``, after refusing one where a dataset of non-zero weight gets no unit at all
    (weights so far apart that, rationalised to a period of at most ``MAX_PERIOD`` units, it rounds to 0)."""
    for seg in segments:
        counts = integer_counts(seg.weights)
        for name, w, c in zip(datasets.names, seg.weights, counts):
            if c == 0 and Fraction(w) > 0:
                total = sum(Fraction(x) for x in seg.weights)
                what = (
                    f"{w} samples per blend epoch of {total}"
                    if datasets.mode == "repetitions"
                    else f"{float(Fraction(w) / total):.3g} of the blend"
                )
                raise DatasetError(
                    f"blend from global batch {seg.start // units_per_batch}: dataset {name!r} has "
                    f"{what}, which rounds to 0 of the {sum(counts)} units of a blend period "
                    f"(at most {MAX_PERIOD}); raise its weight or set it to 0"
                )
    return segments


def _active(segments: Sequence[Segment], unit: int) -> Segment:
    return [s for s in segments if s.start <= unit][-1]


def resume_segments(
    state: Any,
    datasets: Any,
    blend_schedule: Sequence[Any],
    resume_batch: int,
    units_per_batch: int,
    resume_unit: int | None = None,
) -> tuple[list[Segment], list[str]]:
    """``(segments, changes)`` continuing the saved history ``state.blend`` from ``resume_batch``."""
    names = datasets.names
    index = {n: i for i, n in enumerate(state.datasets)}

    # saved order → current order, new datasets 0
    def remap(weights: Sequence[str]) -> tuple[str, ...]:
        return tuple(weights[index[n]] if n in index else "0" for n in names)

    # a planned run (loader.balance) says where its next batch starts reading
    if resume_unit is None:
        resume_unit = resume_batch * units_per_batch
    kept = [
        Segment(s["start"], remap(s["weights"])) for s in state.blend if s["start"] <= resume_unit
    ]
    plan = plan_segments(datasets, blend_schedule, units_per_batch)
    now, changes = _active(plan, resume_unit), []
    if now.weights != kept[-1].weights:
        old = dict(zip(names, kept[-1].weights))
        changes.append(
            f"from global batch {resume_batch}: weights {old} -> {dict(zip(names, now.weights))}"
        )
        if kept[-1].start == resume_unit:
            kept[-1] = Segment(resume_unit, now.weights)
        else:
            kept.append(Segment(resume_unit, now.weights))
    kept += [s for s in plan if s.start > resume_unit]
    return _checked(kept, datasets, units_per_batch), changes
