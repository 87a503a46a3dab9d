"""Commands that look at data and runs: ``preview``, ``trace``, ``spikes``, ``report``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from energon_platform.cli.common import (
    UsageError,
    positive,
    positive_float,
    replay_progress,
    run_config,
)


def add_preview(sub) -> None:
    p = sub.add_parser(
        "preview",
        help="draw a contact sheet of encoded training samples (PNG, JPEG, WebP, ...)",
        description="Encode the first training samples of a run config (any encoder, blends "
        "included) or of a dataset with energon-platform's loader and draw them: "
        "augmented images and tiles with their decoded text, a video clip's frames in a "
        "row, an audio sample's mel spectrogram with its transcript.",
    )
    p.add_argument(
        "target",
        metavar="CONFIG_OR_DATASET",
        help="a run config (data + encoder), a dataset folder or a metadataset YAML",
    )
    p.add_argument(
        "--out",
        required=True,
        help="the picture to write; its suffix names the format "
        "(.png, .jpg/.jpeg, .webp, .bmp, .tif/.tiff); a new file, or a sheet preview wrote "
        "(a picture of yours is never drawn over)",
    )
    p.add_argument("--n", type=positive, default=16, help="documents on the sheet (default 16)")
    p.add_argument(
        "--encoder",
        help="encoder config YAML (default: the run config's, or chosen by the dataset's "
        "sample type; a metadataset needs one)",
    )
    p.set_defaults(func=cmd_preview)


def cmd_preview(args) -> int:
    from energon_platform.tools.preview import preview, undrawn_line

    info = preview(args.target, args.out, n=args.n, encoder=args.encoder)
    if info["undrawn"]:
        print(undrawn_line(info["undrawn"]), file=sys.stderr)
    print(f"{info['path']}: {info['documents']} documents, {info['width']}x{info['height']} px")
    return 0


def add_trace(sub) -> None:
    p = sub.add_parser(
        "trace",
        help="which samples a step trained on, or which steps used a key (no logs needed)",
        description="Compute from the schedule (never from logs) the samples of global steps, "
        "numbered as log.jsonl numbers them, with dataset, epoch, shard, rank and "
        "micro-batch; or the steps that used one sample key (the inverse "
        "permutation, O(1) per epoch; a balanced run replays its planner up to "
        "the steps asked). See docs/provenance.md.",
    )
    p.add_argument("--config", help="the run config YAML (default: the one --run records)")
    p.add_argument(
        "--run",
        help="a run's output folder: its recorded config (run.yaml) and its checkpoints "
        "(as --checkpoint)",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("--step", type=positive, help="one step (log.jsonl numbering, from 1)")
    what.add_argument(
        "--key", help="a sample key as logged (DATASET:KEY in a blend): the steps that used it"
    )
    p.add_argument(
        "--steps",
        metavar="A:B|M",
        help="with --step omitted: steps A to B (both given and included, "
        "1 <= A <= B); with --key: a count M, search the first M steps "
        "(default train.steps)",
    )
    p.add_argument(
        "--world-size",
        type=positive,
        help="data-parallel ranks (default: the checkpoint's, else 1)",
    )
    p.add_argument(
        "--checkpoint",
        help="a checkpoint folder or a run's output folder: its blend and exclusion history",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, e.g. loader.seed=7 (KEY=@FILE: the value is FILE's YAML)",
    )
    p.set_defaults(func=cmd_trace)


def cmd_trace(args) -> int:
    from energon_platform.loader.trace import (
        TraceError,
        format_key,
        format_step,
        open_tracer,
        parse_steps,
    )
    from energon_platform.training import checkpoint

    if args.step is None and args.key is None and not args.steps:
        raise UsageError("say what to trace: --step N, --steps A:B or --key KEY")
    cfg = run_config(args, args.run)
    folder = args.checkpoint
    # a run's checkpoints, where it has saved any (one with none yet, killed or still before its
    # first, never resumed: its recorded config alone answers, as --config without --checkpoint)
    if folder is None and args.run is not None and checkpoint.newest_in(args.run) is not None:
        folder = args.run

    try:
        asked = parse_steps(args.steps, args.step, args.key, cfg.train.steps)
        state = checkpoint.loader_state(folder) if folder is not None else None
        tracer = open_tracer(cfg, args.world_size, state, progress=replay_progress)
        results = (
            [tracer.step(s) for s in asked] if args.key is None else [tracer.find(args.key, asked)]
        )
    except TraceError as e:
        raise UsageError(str(e)) from None
    for r in results:
        print(
            json.dumps(r) if args.json else (format_step(r) if args.key is None else format_key(r))
        )
    return 0


def add_spikes(sub) -> None:
    p = sub.add_parser(
        "spikes",
        help="loss spikes of a run and the samples of each (traced, not read from logs)",
        description="Find loss spikes in a run's step log (robust z-score against the rolling "
        "median and MAD of the previous --window steps, plus NaN/inf steps) and list each "
        "spike's samples, computed by trace from the run's config and checkpoints: dataset, "
        "key, shard, epoch, rank, and the sample's loss and its rank within the step where the "
        "log carries sample_losses. With --exclude-from STEP, print instead the loader.exclude "
        "rules (YAML) that skip that step's top samples from it on, for --set "
        "loader.exclude=@rules.yaml. See docs/spikes.md.",
    )
    p.add_argument("--run", required=True, help="the run's output folder (log and checkpoints)")
    p.add_argument("--config", help="the run config YAML (default: the one RUN/run.yaml records)")
    p.add_argument("--z", type=positive_float, default=4.0, help="z-score threshold (default 4)")
    p.add_argument(
        "--window", type=positive, default=50, help="steps of the rolling median (default 50)"
    )
    p.add_argument(
        "--top",
        type=positive,
        help="the N samples of highest loss per spike (default: all of the step)",
    )
    p.add_argument(
        "--exclude-from",
        type=positive,
        metavar="STEP",
        help="print loader.exclude rules skipping step STEP's (top) samples from STEP on",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per spike")
    p.add_argument("--log", help="the step log (default: RUN/log.jsonl)")
    p.add_argument(
        "--log-format",
        choices=["jsonl", "megatron", "torchtitan", "regex"],
        default="jsonl",
        help="as check-resume's --log-format (default jsonl)",
    )
    p.add_argument(
        "--regex", help="with --log-format regex: a Python regex with named groups step and loss"
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, as the run was started",
    )
    p.set_defaults(func=cmd_spikes)


def _spike_inputs(args) -> tuple:
    """``(LogRows, Tracer)`` of ``spikes``' arguments; ``UsageError`` for a missing input."""
    from energon_platform.loader.trace import open_tracer
    from energon_platform.training import checkpoint
    from energon_platform.training.spike_samples import LogRows
    from energon_platform.training.step_log_readers import LogFormatError, get_format

    cfg = run_config(args, args.run)
    log = Path(args.log) if args.log else Path(args.run) / "log.jsonl"
    if not log.is_file():
        raise UsageError(f"{log}: no step log there; pass --log FILE (and --log-format)")
    try:
        rows = LogRows(log, get_format(args.log_format, args.regex))
    except LogFormatError as e:
        raise UsageError(str(e)) from None
    state = checkpoint.loader_state(args.run)
    return rows, open_tracer(cfg, None, state, progress=replay_progress)


def _spike_listing(tracer, spike: dict) -> dict:
    """A spike with its traced samples joined with its log row; warns when the keys differ."""
    from energon_platform.training.spike_samples import step_samples

    listing = step_samples(tracer.step(spike["step"]), spike.get("row"))
    if listing["keys_agree"] is False:
        print(
            f"warning: step {spike['step']}: the log's keys are not the ones trace computes from "
            f"the config and checkpoints (another config or --set?); listing trace's",
            file=sys.stderr,
        )
    return listing


def _print_exclusions(args, rows, tracer) -> int:
    """``spikes --exclude-from STEP``: the rules as YAML on stdout."""
    import yaml

    from energon_platform.training.spike_samples import exclude_rules

    row = next((r for r in rows if r["step"] == args.exclude_from), None)
    if row is None:
        raise UsageError(
            f"--exclude-from {args.exclude_from}: {rows.path} logs no such step; "
            f"pick a step it logs (see the spikes listed without --exclude-from)"
        )
    listing = _spike_listing(tracer, {"step": row["step"], "row": row})
    top = args.top
    if not listing["losses_logged"] and top is not None:
        print(
            f"note: step {row['step']} logs no sample_losses: excluding all of its samples",
            file=sys.stderr,
        )
        top = None
    print(yaml.safe_dump(exclude_rules(row["step"], listing["samples"], top), sort_keys=False))
    return 0


def cmd_spikes(args) -> int:
    from energon_platform.loader.trace import TraceError
    from energon_platform.training.spike_samples import format_spike
    from energon_platform.training.spikes import find_spikes

    rows, tracer = _spike_inputs(args)
    try:
        if args.exclude_from is not None:
            return _print_exclusions(args, rows, tracer)
        found, noted = 0, False
        for spike in find_spikes(rows, args.z, args.window):
            listing = _spike_listing(tracer, spike)
            spike.pop("row")
            found += 1
            if args.top is not None and not listing["losses_logged"] and not noted:
                noted = True
                print(
                    f"note: {rows.path} logs no sample_losses: --top {args.top} lists each "
                    f"spike's first {args.top} samples in trace's order, not its worst (log "
                    f"sample_losses, as the reference trainer does, to rank them)",
                    file=sys.stderr,
                )
            if args.json:
                print(json.dumps({**spike, **listing, "samples": listing["samples"][: args.top]}))
            else:
                print(format_spike(spike, listing, args.top))
    except TraceError as e:
        raise UsageError(str(e)) from None
    if not rows.rows:
        raise UsageError(
            f"{rows.path}: no step rows ({rows.skipped} line(s) that are no step, in "
            f"--log-format {args.log_format}); pass the run's step log and its --log-format"
        )
    if rows.skipped:
        print(f"skipped {rows.skipped} line(s) of {rows.path} that are no step", file=sys.stderr)
    if not args.json:
        print(f"{found} spike(s) (z >= {args.z:g} over {args.window} steps, or a NaN/inf loss)")
    return 0


#: Libraries that log the errors they raise: the CLI reports each error itself, in one line.
def add_report(sub) -> None:
    p = sub.add_parser(
        "report",
        help="a training run as one self-contained HTML page (curves, spikes and their samples)",
        description="Read RUN/log.jsonl and write one HTML file that opens offline: the loss "
        "curve with its spikes marked (and another run's loss with --compare), the learning "
        "rate, per-rank cost and padding of balanced runs, per-dataset samples and exclusions "
        "of blends, and for each spike its samples as the model sees them (read from the "
        "datasets of --config by key). Lines of the log that are not step rows are counted "
        "and skipped. See docs/spikes.md.",
    )
    p.add_argument("--run", required=True, help="the run's output folder (holds log.jsonl)")
    p.add_argument(
        "--out",
        required=True,
        help="the HTML file to write: a new file, or a report this command wrote (a run's own "
        "files and any other file are refused)",
    )
    p.add_argument(
        "--config",
        help="the run config YAML: its datasets and encoder draw the spikes' samples (default: "
        "the one RUN/run.yaml records)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, e.g. data.path=out/demo/blend.yaml",
    )
    p.add_argument("--compare", metavar="RUN", help="another run folder: its loss drawn against")
    p.add_argument(
        "--z", type=positive_float, default=4.0, help="spike threshold in z-scores (default 4)"
    )
    p.add_argument(
        "--window",
        type=positive,
        default=50,
        help="steps before each step that its z-score is taken over (default 50)",
    )
    p.set_defaults(func=cmd_report)


def _report_spikes(args, config) -> list[dict]:
    """The spikes of ``--run``'s log.jsonl (`find_spikes`),
    each with its samples traced from ``config`` and the run's newest checkpoint (none without
    ``--config``, or in a run without a checkpoint: the panels then list no samples)."""
    from energon_platform.loader.trace import open_tracer
    from energon_platform.training import checkpoint
    from energon_platform.training.spike_samples import LogRows, step_samples
    from energon_platform.training.spikes import find_spikes, spike_rows
    from energon_platform.training.step_log_readers import JsonLines

    log = Path(args.run) / "log.jsonl"
    if not log.is_file():
        return []  # the report names the missing log
    spikes = spike_rows(find_spikes(LogRows(log, JsonLines()), args.z, args.window))
    tracer = None
    if config is not None and spikes:
        try:
            tracer = open_tracer(config, None, checkpoint.loader_state(args.run))
        except checkpoint.CheckpointError as e:
            print(f"note: {e}; the spikes' samples are not listed", file=sys.stderr)
    for spike in spikes:
        row = spike.pop("row")
        if tracer is not None:
            spike["samples"] = step_samples(tracer.step(spike["step"]), row)["samples"]
    return spikes


def cmd_report(args) -> int:
    from energon_platform.tools.report import ReportError, build_report, is_report
    from storage.outputs import check_file

    logs = [Path(r) / "log.jsonl" for r in (args.run, args.compare) if r]
    check_file(
        args.out, is_report, "run report", inputs=[*logs, args.config], example="report.html"
    )
    config = run_config(args, args.run, required=False)
    try:
        info = build_report(
            args.run,
            args.out,
            spikes=_report_spikes(args, config),
            compare_run=args.compare,
            config=config,
        )
    except ReportError as e:
        raise UsageError(str(e)) from None
    skipped = f"; {info['corrupt']} corrupt lines skipped" if info["corrupt"] else ""
    print(
        f"{info['path']}: {info['steps']} steps, {info['spikes']} spikes, "
        f"{info['bytes']} bytes{skipped}"
    )
    return 0
