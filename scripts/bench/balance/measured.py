"""The ``measured`` section: the two-tower model's forward + backward on simulated ranks."""

from __future__ import annotations

import sys
import time

import numpy as np

from energon_platform.loader.balance.dealing import deal_plan
from energon_platform.loader.balance.packer import sample_cost
from energon_platform.loader.balance.planned import plans_like_lengths
from energon_platform.loader.balance.planner import Planner
from scripts.bench.balance.common import (
    CALIBRATION_KEYS,
    KINDS,
    SyntheticLengths,
    ffd,
    spread,
    target_line,
)

# --- measured: the two-tower model's forward + backward on simulated ranks (--measured) -------
#: the methods the measured section plans with (``none``: today's consecutive samples)
MEASURED_METHODS = ("none", "tokens", "attention", "measured")


#: the tiny two-tower model the measured section times (positions are the bench's / --scale)
MEASURED_MODEL = dict(
    kind="two_tower",
    dim=64,
    layers=2,
    heads=4,
    patch=8,
    vision_dim=32,
    vision_layers=1,
    audio_dim=32,
    audio_layers=1,
)


VOCAB, N_MELS, TILE = 256, 16, 32


class Synthetic:
    """Synthetic two-tower batches of the bench's samples at ``1/scale`` of their positions: an
    image-text sample is one ``<image>`` placeholder (spliced into ``tiles x tokens_per_tile``
    embeddings) and its caption; an audio sample is its positions as tokens plus ``2 x`` its
    frames of log-mel through the audio tower (stride 2); a text sample its tokens."""

    def __init__(self, blend: SyntheticLengths, args):
        self.blend, self.scale = blend, args.scale
        self.per_tile = max(1, args.tokens_per_tile // args.scale)
        self.seq_len = max(2, args.seq_len // args.scale)
        self.known: dict[int, tuple] = {}  # position -> `work`'s answer

    def doc(self, part: dict) -> dict:
        """One sample's scaled shape: ``kind``, ``tiles``, ``frames`` (mel), ``tokens`` (row
        positions before the splice) and ``length`` (after); of `SyntheticLengths.parts` one part, or of
        `SyntheticLengths.part_arrays` arrays of them (each value then an array)."""
        scalar = np.ndim(part["length"]) == 0
        kind = np.asarray(part["kind"])
        length = np.minimum(self.seq_len, np.maximum(2, np.round(part["length"] / self.scale)))
        length = length.astype(np.int64)
        image, audio = kind == KINDS.index("image_text"), kind == KINDS.index("audio")
        tiles = np.where(image, np.minimum(part["tiles"], (length - 1) // self.per_tile), 0)
        frames = np.where(
            audio, 2 * np.minimum(length, np.maximum(1, np.round(part["frames"] / self.scale))), 0
        ).astype(np.int64)
        tokens = length - tiles * self.per_tile + (tiles > 0)
        out = {"tiles": tiles, "frames": frames, "tokens": tokens, "length": length}
        return {k: int(v) for k, v in out.items()} if scalar else out

    @staticmethod
    def named(doc: dict) -> dict[str, int]:
        """One scaled sample's (`doc`) cost features, by name (those it has)."""
        return {
            "samples": 1,
            "llm_tokens": doc["length"],
            "llm_attention": doc["length"] ** 2,
            "vision_tiles": doc["tiles"],
            "audio_frames": doc["frames"],
        }

    def features(self, docs: list[dict], packed: bool) -> dict[str, float]:
        """The features of a micro-batch of ``docs`` as it runs (`micro_batch_features`): packed,
        its rows' documents at their own lengths; unpacked, every row padded to the longest
        sample and the clips to the longest clip, as `batch` lays them out."""
        from task_encoders.features import LONGEST, micro_batch_features

        return micro_batch_features((self.named(d) for d in docs), None if packed else LONGEST)

    def work(self, positions) -> list[tuple[int, tuple[float, ...]]]:
        """The planner's lookup for ``measured``, as the loader's (`SampleLengths`, which
        remembers what it looked up): per position its length and its sample's cost features
        (`named` of its `doc`) as a tuple in FEATURES order. Computed over the new positions at
        once, as `SyntheticLengths.lookup` is for the other methods: the bench times the planner, not a
        lookup (an encoder's own costs what its `sample_length` and `sample_features` do)."""
        from task_encoders.features import FEATURES

        new = [p for p in positions if p not in self.known]
        if new:
            arrays = self.blend.part_arrays(new)
            named = self.named(self.doc(arrays))
            columns = [
                np.broadcast_to(np.asarray(named.get(name, 0), dtype=np.float64), len(new))
                for name in FEATURES
            ]
            for p, n, values in zip(
                new, arrays["length"].tolist(), zip(*(c.tolist() for c in columns))
            ):
                self.known[p] = (n, values)
        return [self.known[p] for p in positions]

    def batch(self, rows: list[list[int]], packed: bool):
        """The micro-batch of ``rows`` (stream positions per row): rows of ``seq_len`` (packed;
        longer where rounding the scaled lengths overfills one) or of the longest row (unpacked);
        carries its cost features as ``.cost_features``."""
        from types import SimpleNamespace

        import torch

        docs = [[self.doc(p) for p in self.blend.parts(row)] for row in rows]
        longest = max(sum(d["length"] for d in r) for r in docs)  # scaled lengths round up
        width = max(self.seq_len, longest) if packed else longest
        gen = torch.Generator().manual_seed(sum(map(sum, rows)))
        n = len(rows)
        tokens = torch.randint(1, VOCAB - 1, (n, width), generator=gen)
        position_ids = torch.zeros(n, width, dtype=torch.long)
        loss_mask = torch.zeros(n, width)
        frames = [d["frames"] for r in docs for d in r if d["frames"]]
        audio_docs = [i for i, d in enumerate(d for r in docs for d in r) if d["frames"]]
        for i, row in enumerate(docs):
            at = 0
            for d in row:
                if d["tiles"]:
                    tokens[i, at] = VOCAB - 1
                position_ids[i, at : at + d["tokens"]] = torch.arange(d["tokens"])
                loss_mask[i, at : at + d["tokens"]] = 1.0
                at += d["tokens"]
            position_ids[i, at:] = torch.arange(width - at) + (position_ids[i, at - 1] + 1)
        tiles = [d["tiles"] for r in docs for d in r if d["tiles"]]
        return SimpleNamespace(
            tokens=tokens,
            position_ids=position_ids,
            labels=torch.randint(1, VOCAB, (n, width), generator=gen),
            loss_mask=loss_mask,
            num_docs=torch.tensor([len(r) for r in docs], dtype=torch.int32),
            images=torch.randn(sum(tiles), 3, TILE, TILE, generator=gen),
            num_tiles=torch.tensor(tiles, dtype=torch.int32),
            tokens_per_tile=self.per_tile,
            image_token_index=VOCAB - 1,
            features=torch.randn(len(frames), N_MELS, max(frames, default=0), generator=gen),
            feature_lengths=torch.tensor(frames, dtype=torch.long),
            audio_docs=torch.tensor(audio_docs, dtype=torch.long),
            cost_features=self.features([d for r in docs for d in r], packed),
        )


def measured_model():
    import torch

    from energon_platform.config import ModelConfig
    from energon_platform.training.two_tower import TwoTowerModel

    torch.manual_seed(0)
    return TwoTowerModel(ModelConfig(**MEASURED_MODEL), VOCAB, 4096, ("image", "audio"), N_MELS)


def measured_calibration(model, args, packed: bool) -> dict:
    """:func:`~energon_platform.training.calibrate.calibrate` of ``model`` on micro-batches of a
    second stream of the blend (another seed), alternately one sample (`calibration_pool`) and
    one packed row of several: a pool of one-sample micro-batches only has ``samples`` = 1 in
    every micro-batch, so the fit cannot tell the cost of a document from the cost of a
    micro-batch and puts the latter on ``samples``; packed rows of many short documents then look
    far dearer than they run, and the plan evens document counts instead of time."""
    from energon_platform.training.calibrate import calibrate, paired
    from task_encoders.features import LONGEST

    other = Synthetic(SyntheticLengths(args, seed=args.seed + 1), args)
    n = 8 * args.calibrate_batches
    pool = calibration_pool(other, n) if packed else unpacked_pool(other, n, args.rows_per_rank)
    return calibrate(
        model,
        paired(pool, lambda b: b.cost_features),
        micro_batches=args.calibrate_batches,
        repeats=3,
        progress=False,
        row_width=None if packed else LONGEST,
    )


def unpacked_pool(synth: Synthetic, n: int, k: int):
    """``n`` unpacked micro-batches of 1 to ``k`` samples of ``synth``'s stream, drawn at random
    (seeded) from its first ``64 n`` positions, so padding, tiles, clips and tower calls vary
    across them as they do across a plan's micro-batches (what the unpacked cost model is
    fitted on: the micro-batch as it runs)."""
    rng = np.random.default_rng(0)
    for i in range(n):
        picked = rng.choice(64 * n, size=1 + i % k, replace=False)
        yield synth.batch([[int(p)] for p in sorted(picked)], packed=False)


#: a calibration row is filled from the stream until this fraction of its positions is used
CALIBRATION_ROW_FILL = 0.97


#: ... or until it has looked this many stream positions ahead for documents that fit
CALIBRATION_ROW_SCAN = 64


def calibration_pool(synth: Synthetic, n: int):
    """``n`` micro-batches of ``synth``'s stream, in order: even ones one sample (unpacked), odd
    ones one packed row of the next documents that fit it (skipping those that do not) until it
    is `CALIBRATION_ROW_FILL` full, as the planner's rows are; so both the per-document and the
    per-micro-batch cost vary across the pool."""
    position = 0
    for i in range(n):
        if i % 2 == 0:
            yield synth.batch([[position]], packed=False)
            position += 1
            continue
        row, used, scan = [], 0, position
        while (
            used < CALIBRATION_ROW_FILL * synth.seq_len and scan < position + CALIBRATION_ROW_SCAN
        ):
            length = synth.doc(synth.blend.parts([scan])[0])["length"]
            if used + length <= synth.seq_len:
                row.append(scan)
                used += length
            scan += 1
        position = scan
        yield synth.batch([row], packed=True)


def measured_plans(
    blend: SyntheticLengths,
    method: str,
    cost_model,
    ranks: int,
    k: int,
    packed: bool,
    steps: int,
    args,
):
    """``(steps of [rank][row] -> positions, planning seconds of each global batch)`` of
    ``method`` for ``steps`` global batches (no planning seconds for ``none``; the first batch's
    also fills the planner's window)."""
    from energon_platform.loader.balance.costs import SampleCost

    if method == "none":
        batches = []
        for s in range(steps):
            if not packed:
                base = s * ranks * k
                batches.append([[[base + r * k + i] for i in range(k)] for r in range(ranks)])
                continue
            group, base, step = args.pack_group, s * ranks * k * args.pack_group, []
            for r in range(ranks):
                rows = []
                for g in range(k):
                    pos = list(range(base + (r * k + g) * group, base + (r * k + g + 1) * group))
                    rows += [
                        [pos[i] for i in row] for row in ffd(blend[pos].tolist(), pos, args.seq_len)
                    ]
                step.append(rows)
            batches.append(step)
        return batches, []
    if method == "measured":  # the loader's own cost path: feature tuples, SampleCost
        lookup = Synthetic(blend, args).work
        cost = SampleCost("measured", None, 0.0, "bench", cost_model)
    else:
        lookup, cost = blend.lookup, lambda n, m=method: sample_cost(n, m, args.linear)  # noqa: E731
    planner = Planner(
        lookup,
        cost,
        ranks * k,
        capacity=args.seq_len if packed else 0,
        window=args.window,
        like_lengths=plans_like_lengths(method, fixed_samples=not packed),
    )
    batches, seconds = [], []
    for b in range(steps):
        t = time.perf_counter()
        plan = planner.plan(b)
        seconds.append(time.perf_counter() - t)
        dealt = deal_plan(plan, ranks, 1, fixed=True)
        batches.append([[list(plan.items[i]) for m in rank for i in m] for rank in dealt])
    return batches, seconds


def planning_ms(seconds: list[float], rows: int) -> dict:
    """The planner's milliseconds: the first global batch (it also fills the look-ahead window,
    once per process) and the mean of the later ones, per batch and per 64 rows (``rows`` per
    batch); empty for a method that does not plan."""
    if not seconds:
        return {}
    later = float(np.mean(seconds[1:] or seconds))
    return {
        "planner_ms_first_batch": 1000 * seconds[0],
        "planner_ms_per_batch": 1000 * later,
        "planner_ms_per_64_rows": 1000 * later * 64 / rows,
    }


def measured_section(args) -> dict:
    """``measured``: calibrate the two-tower model, then time every rank's micro-batch of each
    method's plans (each alone, the least of 3 after a warm-up, one thread)."""
    import torch

    from energon_platform.loader.balance.cost_file import CostModel
    from task_encoders.features import MICRO_BATCH_FEATURES

    if args.pack_group is None:
        args.pack_group = max(
            2,
            int(
                round(
                    args.seq_len
                    / float(SyntheticLengths(args).draw(np.random.default_rng(0), 20_000).mean())
                )
            ),
        )
    blend, threads = SyntheticLengths(args), torch.get_num_threads()
    synth, model = Synthetic(blend, args), measured_model()
    torch.set_num_threads(1)
    try:
        reports = {packed: measured_calibration(model, args, packed) for packed in (True, False)}
        cost_models = {
            packed: CostModel(
                {n: r["coefficients"][n] for n in MICRO_BATCH_FEATURES},
                "two_tower",
                "",
                r["row_width"],
            )
            for packed, r in reports.items()
        }
        results = []
        for ranks in args.measured_ranks:
            for packed in (True, False):
                plans = {}
                # `timed`'s reference (paired): the first rank's micro-batch of today's first batch
                reference = None
                if args.timing == "paired":
                    first = measured_plans(
                        blend, "none", None, ranks, args.rows_per_rank, packed, 1, args
                    )
                    reference = synth.batch(first[0][0][0], packed)
                for method in MEASURED_METHODS:
                    t = time.perf_counter()
                    plans[method] = steps, plan_s = measured_plans(
                        blend,
                        method,
                        cost_models[packed],
                        ranks,
                        args.rows_per_rank,
                        packed,
                        args.measured_steps,
                        args,
                    )
                    ratios, predicted = [], []
                    for step in steps:
                        batches = [synth.batch(rows, packed) for rows in step]
                        seconds = timed(model, batches, reference, args.timing)
                        ratios.append(float(seconds.max() / seconds.mean()))
                        predicted.append(
                            predicted_ratio(
                                batches, cost_models[packed], reports[packed]["overhead"]
                            )
                        )
                    results.append(
                        {
                            "ranks": ranks,
                            "per_rank": args.rows_per_rank,
                            "layout": "packed" if packed else "unpacked",
                            "method": method,
                            "max_over_mean": spread(ratios),
                            "predicted_max_over_mean": spread(predicted),
                            **planning_ms(plan_s, ranks * args.rows_per_rank),
                        }
                    )
                    print(
                        f"  [measured {method}, {ranks} ranks: {time.perf_counter() - t:.1f} s]",
                        file=sys.stderr,
                    )
                floor = timing_floor(
                    model, synth, plans["measured"][0], packed, reference, args.timing
                )
                results.append(
                    {
                        "ranks": ranks,
                        "per_rank": args.rows_per_rank,
                        "layout": "packed" if packed else "unpacked",
                        "method": IDENTICAL,
                        "max_over_mean": spread(floor),
                    }
                )
        planning = planning_64_rows(blend, cost_models, args)
    finally:
        torch.set_num_threads(threads)
    calibration = {k: reports[True][k] for k in CALIBRATION_KEYS}
    unpacked = {k: reports[False][k] for k in (*CALIBRATION_KEYS, "row_width")}
    return {
        "scale": args.scale,
        "steps": args.measured_steps,
        "timing": args.timing,
        "model": MEASURED_MODEL,
        "calibration": calibration,
        "calibration_unpacked": unpacked,
        "results": results,
        "planning_64_rows": planning,
        "targets": measured_targets(calibration, results, planning, args.timing, unpacked),
    }


def predicted_ratio(batches: list, cost_model, overhead: float) -> float:
    """max/mean over one step's micro-batches of the seconds ``cost_model`` predicts for each
    (`CostModel.predict` of its features as it runs) plus ``overhead``: how even the plan is by
    the cost model, without the timing's noise."""
    predicted = np.array([cost_model.predict(b.cost_features) + overhead for b in batches])
    return float(predicted.max() / predicted.mean())


#: ``--timing``: how the measured section times micro-batches (`timed`)
TIMINGS = ("plain", "paired")


def timed(model, batches: list, reference, timing: str) -> np.ndarray:
    """Seconds per micro-batch of ``batches``, each timed alone (forward + backward, one warm-up
    round, the least of 3 rounds). ``plain``: `time_rounds`, what the targets are stated on.
    ``paired``: each timing sits between two timings of ``reference`` and is divided by their mean,
    and the least ratio is multiplied by the reference's least time. Consecutive timings of equal
    work on a shared machine correlate (it drifts over a few timings), so a slow stretch hits a
    micro-batch and the reference around it alike and divides out, which the least of 3 alone does
    not; what is left of a spread is then mostly the micro-batches' own. Twice the timings."""
    from energon_platform.training import collector
    from energon_platform.training.calibrate import time_rounds, time_step

    if timing == "plain":
        return time_rounds(model, batches, 3)
    best, fastest = np.full(len(batches), np.inf), np.inf
    with collector.off():
        before = time_step(model, reference)
        for round_ in range(3 + 1):
            for i, batch in enumerate(batches):
                seconds, after = time_step(model, batch), time_step(model, reference)
                if round_:
                    best[i] = min(best[i], 2 * seconds / (before + after))
                    fastest = min(fastest, after)
                before = after
    return best * fastest


#: the measured section's timing floor (`timing_floor`), reported beside the methods
IDENTICAL = "identical"


def timing_floor(
    model, synth: Synthetic, steps: list, packed: bool, reference, timing: str
) -> list[float]:
    """Per global batch of ``steps``, max/mean of the times of its first rank's micro-batch timed
    once for every rank, as the methods' micro-batches are (`timed`): the ranks' work is equal,
    so what is left is the timing's own spread on this machine, the floor under any method's
    figure."""
    ratios = []
    for step in steps:
        seconds = timed(model, [synth.batch(step[0], packed)] * len(step), reference, timing)
        ratios.append(float(seconds.max() / seconds.mean()))
    return ratios


#: global batches the planning measurement plans per method and layout (the first one not counted)
PLANNING_BATCHES = 50


#: times the planning measurement plans each method's batches afresh; each batch's least time counts
PLANNING_REPEATS = 3


def planning_64_rows(blend: SyntheticLengths, cost_models: dict, args) -> list[dict]:
    """The planner alone on global batches of 64 rows (32 ranks x 2), per layout and method:
    `planning_ms` over `PLANNING_BATCHES` batches (no model is timed), each batch's least time
    of `PLANNING_REPEATS` plannings from the start (a fresh planner and lookup each time), as the
    micro-batches' timings are the least of 3: the plans are the same, so what varies between the
    repeats is this machine. ``cost_models``: the measured cost model of each layout (``packed``
    True or False)."""
    out = []
    for packed in (True, False):
        for method in MEASURED_METHODS[1:]:
            seconds = np.min(
                [
                    measured_plans(
                        blend, method, cost_models[packed], 32, 2, packed, PLANNING_BATCHES, args
                    )[1]
                    for _ in range(PLANNING_REPEATS)
                ],
                axis=0,
            ).tolist()
            out.append(
                {
                    "layout": "packed" if packed else "unpacked",
                    "method": method,
                    **planning_ms(seconds, 64),
                }
            )
    return out


#: the measured section's targets: p90 max/mean of the timed ranks by rank count, the calibration's
#: fit, the planner's steady milliseconds per 64 rows
MEASURED_TARGETS = {"ratio": {8: 1.05, 64: 1.08}, "r2": 0.95, "p90_error": 0.10, "plan_ms": 10.0}


def fit_summary(c: dict) -> str:
    """A calibration (`CALIBRATION_KEYS`) in one line: R², the held-back errors, each feature's
    share of the time and the overhead."""
    shares = ", ".join(f"{k} {v:.0%}" for k, v in c["share"].items() if v > 0.005)
    return (
        f"R² {c['r2']:.3f}, held-back p50 error {c['p50_error']:.1%}, p90 {c['p90_error']:.1%}; "
        f"share {shares}; overhead {1e3 * c['overhead']:.2f} ms per micro-batch "
        f"({c['overhead_share']:.0%})"
    )


def calibration_targets(calibration: dict, model: str = "") -> list[dict]:
    """The calibration's R² and held-back p90 error against `MEASURED_TARGETS` (``model``: named
    in the target, when there are several)."""
    of = f" ({model})" if model else ""
    return [
        {
            "target": f"calibration{of} R² >= {MEASURED_TARGETS['r2']}",
            "value": calibration["r2"],
            "met": calibration["r2"] >= MEASURED_TARGETS["r2"],
        },
        {
            "target": f"calibration{of} held-back p90 error <= {MEASURED_TARGETS['p90_error']:.0%}",
            "value": calibration["p90_error"],
            "met": calibration["p90_error"] <= MEASURED_TARGETS["p90_error"],
        },
    ]


def measured_targets(
    calibration: dict,
    results: list[dict],
    planning: list[dict],
    timing: str = "plain",
    unpacked: dict | None = None,
) -> list[dict]:
    """Each `MEASURED_TARGETS` entry judged on this run (``measured`` rows only). The max/mean
    targets are stated on plain timing (`timed`): a ``paired`` run is not judged on them.
    ``unpacked``: the unpacked layout's own calibration, judged as well, where there is one."""
    out = calibration_targets(calibration)
    if unpacked is not None:
        out += calibration_targets(unpacked, "unpacked micro-batches")
    for r in results:
        limit = MEASURED_TARGETS["ratio"].get(r["ranks"])
        if r["method"] != "measured" or timing != "plain":
            continue
        if limit is not None:
            p90 = r["max_over_mean"]["p90"]
            out.append(
                {
                    "target": f"measured p90 max/mean, {r['ranks']} ranks, {r['layout']} <= {limit}",
                    "value": p90,
                    "met": p90 <= limit,
                }
            )
    for r in planning:
        if r["method"] == "measured":
            ms = r["planner_ms_per_batch"]
            out.append(
                {
                    "target": f"measured plans a global batch of 64 rows, {r['layout']}, in "
                    f"<= {MEASURED_TARGETS['plan_ms']:g} ms",
                    "value": ms,
                    "met": ms <= MEASURED_TARGETS["plan_ms"],
                }
            )
    return out


def report_measured(section: dict, args) -> list[str]:
    c = section["calibration"]
    lines = [
        f"measured: the two-tower model ({section['model']['dim']}-wide, positions / {section['scale']}), "
        f"{section['steps']} global batches per method; each rank's micro-batch timed alone "
        "(forward + backward, the least of 3 after a warm-up, one thread"
        + (
            "; paired: divided by a reference micro-batch timed around it, so not judged on "
            "the max/mean targets)"
            if section.get("timing") == "paired"
            else ")"
        ),
        f"calibration on {c['micro_batches']} micro-batches of another stream (one sample or "
        "one packed row): " + fit_summary(c),
        *(
            [
                f"unpacked: calibration on {u['micro_batches']} micro-batches of 1 to "
                f"{args.rows_per_rank} random samples of it, rows padded to the longest: "
                + fit_summary(u)
            ]
            if (u := section.get("calibration_unpacked"))
            else []
        ),
        "",
        f"{'ranks':>5} {'layout':<8} {'method':<10} {'p50':>6} {'p90':>6} {'max':>6} "
        f"{'predicted p90':>13} {'plan ms/64 rows':>15} {'first batch ms':>14}",
    ]
    for r in section["results"]:
        m = r["max_over_mean"]
        predicted = r.get("predicted_max_over_mean")
        predicted = f"{predicted['p90']:>13.3f}" if predicted else f"{'-':>13}"
        plan = (
            f"{r['planner_ms_per_64_rows']:>15.2f} {r['planner_ms_first_batch']:>14.1f}"
            if r["method"] not in ("none", IDENTICAL)
            else f"{'-':>15} {'-':>14}"
        )
        lines.append(
            f"{r['ranks']:>5} {r['layout']:<8} {r['method']:<10} {m['p50']:>6.3f} {m['p90']:>6.3f} "
            f"{m['max']:>6.3f} {predicted} {plan}"
        )
    lines.append(
        "(predicted p90: the same max/mean of the times the calibration predicts for the "
        "micro-batches, how even a plan is by the cost model without the timing's noise. "
        "plan ms: the mean over the global batches after the first; the first also fills the "
        f"planner's look-ahead window, once per process. {IDENTICAL}: one rank's micro-batch "
        "timed for every rank, equal work, so the timing's own spread)"
    )
    lines.append(
        "planning alone, global batches of 64 rows (32 ranks x 2), ms per batch "
        f"(each batch the least of {PLANNING_REPEATS} plannings):"
    )
    for r in section.get("planning_64_rows", []):
        lines.append(
            f"  {r['layout']:<8} {r['method']:<10} {r['planner_ms_per_batch']:>7.2f} "
            f"(first {r['planner_ms_first_batch']:.1f})"
        )
    for t in section.get("targets", []):
        lines.append(target_line(t, 60))
    return lines
