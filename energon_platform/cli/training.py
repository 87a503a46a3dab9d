"""Commands that train or time a model: ``train``, ``calibrate``, ``check-resume``, ``replay``."""

from __future__ import annotations

import sys
from pathlib import Path

from energon_platform.cli.common import (
    HelpFormatter,
    UsageError,
    add_run_args,
    non_negative,
    non_negative_float,
    overrides,
    positive,
    positive_float,
    run_config,
)


def add_train(sub) -> None:
    p = sub.add_parser(
        "train",
        help="the reference trainer (also under torchrun)",
        description="Train the reference captioning model on a config. Under `torchrun "
        "--nproc-per-node N` every process is one data-parallel rank (gloo on CPU, "
        "nccl on GPU). Logs JSON lines to OUT/log.jsonl and checkpoints model, "
        "optimizer, RNG and data-loader state atomically.",
    )
    add_run_args(p, "loader workers per rank (may differ from the saved run)")
    p.add_argument(
        "--resume", action="store_true", help="continue from the latest complete checkpoint in OUT"
    )
    p.add_argument(
        "--out",
        help="output folder: a new or empty one, or a run's own (its run.json), which --resume "
        "continues; any other folder, the file system's root, the home folder and a "
        "repository's root are refused (default: train.out of the config; with a run's own "
        "run.yaml as --config, the folder that holds it)",
    )
    p.add_argument(
        "--steps", type=positive, help="total steps (default: train.steps of the config)"
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="print no per-step lines (warnings and errors still print)",
    )
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    from energon_platform.training import collector

    collector.pause()  # until the trainer has set up (it calls collector.settle)
    try:
        from energon_platform.config import load_config
        from energon_platform.training.train import train

        cfg = load_config(args.config, overrides(args.set))
        train(
            cfg,
            resume=args.resume,
            num_workers=args.num_workers,
            out=args.out,
            steps=args.steps,
            quiet=args.quiet,
        )
    finally:  # every refusal comes before the trainer settles: the caller's collector is on again
        collector.resume()
    return 0


def add_calibrate(sub) -> None:
    from energon_platform.training.calibration_pool import ORDERS

    *firsts, last = [name for name in ORDERS if name != "stream"]
    p = sub.add_parser(
        "calibrate",
        help="time a model on micro-batches of a config's data and fit its cost coefficients",
        description="Compose micro-batches from a run config's training data (no loader "
        "workers): the documents of its first positions grouped in the stream's order, "
        f"{', '.join(firsts)} and {last} first, at the run's size, one "
        "document and half the size (a run that packs: its own micro-batches); pick N of the "
        "first 8N that spread the cost features, time forward + backward of each on one thread "
        "in rounds (each round times every micro-batch once; a warm-up round excluded, the "
        "least of K rounds kept) and fit non-negative seconds per unit of each "
        "feature of the micro-batch as it runs (its rows' positions and attention as laid out: "
        "seq_len wide unpacked, the documents' own packed; clips padded to the longest; one call "
        "per tower that runs) plus a fixed overhead per micro-batch (time = sum of coefficient "
        "x feature + overhead; every rank pays the overhead, so balancing ignores it; a "
        "feature that is the same in every timed micro-batch gets 0, its time the overhead's). "
        "With this file, unpacked balance: measured takes a global batch's samples of like "
        "length that run the same towers and deals each micro-batch by its cost as a whole. "
        "One micro-batch in "
        "four is held back to measure the prediction's relative error. Prints predicted vs "
        "measured times and writes --out (format version 2): coefficients, the row width, the "
        "overhead, R², each feature's share "
        "of the time, the held-back "
        "p50/p90 error, the model and the encoder configuration's digest. Refuses (writing "
        "nothing) a fit whose p90 error exceeds 15%.",
    )
    p.add_argument("--config", required=True, help="run config YAML (its data and encoder)")
    p.add_argument(
        "--model",
        metavar="FILE_OR_MODULE:FACTORY",
        help="FACTORY(encoder) returns a torch.nn.Module whose forward(batch) returns a scalar "
        "loss (e.g. my_model.py:build); default: the two-tower reference model of the "
        "config's model section",
    )
    p.add_argument(
        "--micro-batches",
        type=positive,
        default=24,
        help="micro-batches to time, at least 4 (default 24)",
    )
    p.add_argument("--repeats", type=positive, default=3, help="timed rounds, K (default 3)")
    p.add_argument(
        "--out",
        required=True,
        help="the cost file to write (JSON): a new file, or a cost file calibrate wrote (any "
        "other file, an input or a folder is refused before any timing)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, e.g. loader.micro_batch_size=4",
    )
    p.set_defaults(func=cmd_calibrate)


#: The most micro-batches calibrate times (each is timed ``--repeats`` + 1 times, one thread).
MAX_MICRO_BATCHES = 4096


def cmd_calibrate(args) -> int:
    from energon_platform.config import load_config
    from energon_platform.training.calibrate import (
        CalibrationError,
        calibrate_run,
        check_fit,
        format_table,
        is_cost_file,
        write_report,
    )
    from energon_platform.training.user_model import UserModelError, load_factory
    from storage.outputs import check_file

    if not 4 <= args.micro_batches <= MAX_MICRO_BATCHES:
        raise UsageError(
            f"--micro-batches {args.micro_batches}: expected 4 to {MAX_MICRO_BATCHES} (three "
            f"fitted for each one held back; each timed --repeats + 1 times)"
        )
    check_file(args.out, is_cost_file, "cost file", inputs=[args.config], example="cost.json")
    cfg = load_config(args.config, overrides(args.set))
    cfg = _plan_without(cfg, Path(args.out))
    try:
        factory = load_factory(args.model) if args.model else None
        report = calibrate_run(
            cfg,
            factory,
            model_name=args.model or "two_tower",
            micro_batches=args.micro_batches,
            repeats=args.repeats,
            progress=not args.no_progress,
        )
        print(format_table(report))
        check_fit(report)
    except (CalibrationError, UserModelError) as e:
        raise UsageError(str(e)) from None
    write_report(report, args.out)
    print(f"wrote {args.out}")
    return 0


def _plan_without(cfg, out: Path):
    """``cfg`` as calibrate reads its data: a run that balances with the cost file this
    calibration is to write (``loader.balance.cost_model`` = ``--out``), and that has none yet,
    plans with ``attention`` instead, a fixed number of samples a global batch (what calibrate
    times is the model, not the plan)."""
    import dataclasses

    balance = cfg.loader.balance
    if not balance.calibrated or Path(balance.cost_model).resolve() != out.resolve():
        return cfg
    if out.is_file():
        return cfg  # a calibration again: the run's plan, with its earlier cost file
    print(
        f"note: the config balances with {out}, which this calibration writes; its micro-batches "
        f"are drawn as balance: attention plans them",
        file=sys.stderr,
    )
    plain = dataclasses.replace(
        balance, mode="attention", cost_model=None, global_batch_tokens=None
    )
    return dataclasses.replace(cfg, loader=dataclasses.replace(cfg.loader, balance=plain))


CHECK_RESUME_EXAMPLES = """examples:
  energon-platform check-resume --config configs/train_image_text.yaml --steps 30 --kill-at 17
  energon-platform check-resume --steps 12 --kill-at 8 \\
      --cmd "torchrun --standalone --nproc-per-node 2 scripts/examples/torchtitan_style_loop.py \\
             --config run.yaml --out {out} --steps 12" \\
      --resume-cmd "torchrun --standalone --nproc-per-node 2 \\
             scripts/examples/torchtitan_style_loop.py --config run.yaml --out {out} --steps 12 \\
             --resume"
  energon-platform check-resume --steps 12 --kill-at 8 --log-format megatron \\
      --cmd "python scripts/examples/megatron_style_loop.py --config run.yaml --save {out} \\
             --train-iters 12" \\
      --resume-cmd "python scripts/examples/megatron_style_loop.py --config run.yaml \\
             --save {out} --load {out} --train-iters 12"
  ... --log-format regex \\
      --regex 'iter (?P<step>\\d+): loss (?P<loss>[-+.\\deE]+)'   # any other trainer's lines
"""


def add_check_resume(sub) -> None:
    p = sub.add_parser(
        "check-resume",
        help="kill a run with SIGKILL mid-step, resume it, compare with an uninterrupted run",
        description="Run a trainer twice: straight through, and killed with SIGKILL (its whole "
        "process tree) during step K, then resumed from its latest checkpoint. Compares "
        "every step after the resume point; writes OUT/report.json and OUT/loss.png; "
        "exits 1 on any difference. Two forms: --config runs the reference trainer "
        "(optionally resumed on another layout) and compares sample keys, tensor hashes "
        "and loss; --cmd/--resume-cmd run any training command, {out} in them being each "
        "run's own folder, and read its steps from a log (--log-format): exact (keys, "
        "digests, loss) where the log carries keys and batch digests (StepLog), else "
        "|Δloss| <= 0.01 at every compared step.",
        epilog=CHECK_RESUME_EXAMPLES,
        formatter_class=HelpFormatter,
    )
    add_run_args(p, "loader workers per rank (default: the config's)", config_required=False)
    p.add_argument(
        "--steps",
        type=positive,
        help="steps of both runs (required, but with --straight-from RUN: the run's own)",
    )
    p.add_argument(
        "--kill-at",
        type=positive,
        required=True,
        help="K: the second run is killed once step K-1 is logged, while step K is in flight. A "
        "trainer that logs a step before it checkpoints it (the reference trainer does) is "
        "then killed while writing checkpoint K-1, so its saving must be atomic and it resumes "
        "from the checkpoint before: K must be at least 2 steps after the first checkpoint "
        "(with --config, >= train.checkpoint_every + 2)",
    )
    p.add_argument(
        "--nproc", type=positive, help="data-parallel ranks (torchrun) of both runs (default 1)"
    )
    p.add_argument(
        "--resume-nproc", type=positive, help="ranks for the resumed part (default: --nproc)"
    )
    p.add_argument(
        "--resume-workers", type=non_negative, help="workers per rank for the resumed part"
    )
    p.add_argument(
        "--tolerance",
        type=non_negative_float,
        help="allowed |loss difference|. Default 0 (bit-exact, right on CPU with the same world size); "
        "1e-5 when --resume-nproc changes the world size, since the gradient all-reduce then "
        "sums in another order. Keys and tensors must match exactly in every case. With --cmd: "
        "0 when the log carries keys and batch digests, else 0.01",
    )
    p.add_argument(
        "--out",
        default="out/check-resume",
        help="where runs, report.json and loss.png go: a new or empty folder, or one an earlier check "
        "made (a folder holding anything else is refused)",
    )
    g = p.add_argument_group("any training command (instead of --config)")
    g.add_argument(
        "--cmd",
        help="the training command (a shell command line) that runs --steps steps and "
        'checkpoints into {out}; e.g. "torchrun ... train.py --out {out}"',
    )
    g.add_argument(
        "--resume-cmd", help="the command that continues a run from its latest checkpoint in {out}"
    )
    g.add_argument(
        "--log",
        help="the steps' log, with {out} (default: {out}/steps.jsonl for jsonl, else the "
        "command's own output)",
    )
    g.add_argument(
        "--log-format",
        choices=["jsonl", "megatron", "torchtitan", "regex"],
        help="jsonl (default): StepLog's JSON lines; megatron: Megatron-LM's 'iteration N/ M | ... | "
        "lm loss: X |' lines (--log-interval 1); torchtitan: its 'step: N  loss: X' lines; "
        "regex: --regex",
    )
    g.add_argument(
        "--regex", help="with --log-format regex: a Python regex with named groups step and loss"
    )
    p.add_argument(
        "--straight-from",
        metavar="DIR",
        help="reuse an uninterrupted run instead of running it again: only the killed and the "
        "resumed runs run. Alone (no --config, no --cmd): a finished training run's folder "
        "(train --out DIR), whose recorded config, world size, steps and log are the "
        "uninterrupted run. With --cmd: an earlier check of the same --cmd (that check's --out), "
        "e.g. to try several --resume-cmd against one long run",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=3600,
        help="seconds each of the three runs may take, with --config or --cmd (default 3600); "
        "a run past it is killed and the check fails",
    )
    p.set_defaults(func=cmd_check_resume)


def _check_resume_cmd(args) -> int:
    """``check-resume --cmd ... --resume-cmd ...`` (any training command)."""
    from energon_platform.training.resume_check import RunFailed, check_resume_cmd, verdict
    from energon_platform.training.resume_check.options import command_spec

    if args.steps is None:
        raise UsageError("--steps is required: the steps of every run of the command")
    spec = command_spec(
        config=args.config,
        cmd=args.cmd,
        resume_cmd=args.resume_cmd,
        steps=args.steps,
        kill_at=args.kill_at,
        trainer_options={
            "--nproc": args.nproc,
            "--resume-nproc": args.resume_nproc,
            "--resume-workers": args.resume_workers,
            "--num-workers": args.num_workers,
            "--set": args.set,
        },
        log=args.log,
        log_format=args.log_format,
        regex=args.regex,
        tolerance=args.tolerance,
        timeout=args.timeout,
    )
    try:
        straight_from = Path(args.straight_from) if args.straight_from else None
        result = check_resume_cmd(spec, args.kill_at, Path(args.out), straight_from=straight_from)
    # a run failed, or logged nothing we can read: its output tail is in the message
    except RunFailed as e:
        print(f"energon-platform check-resume: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # a --kill-at past the last step of a log counted from 0
        raise UsageError(str(e)) from None
    return _print_verdict(verdict(result), args.out, result["passed"])


def _check_resume_from_run(args) -> int:
    """``check-resume --straight-from RUN``: a finished training run stands for the
    uninterrupted run; its recorded config is killed at ``--kill-at`` and resumed."""
    from energon_platform.config import load_config
    from energon_platform.training.resume_check.trainer import straight_run_spec
    from storage.outputs import refuse_places

    given = {"--steps": args.steps, "--nproc": args.nproc, "--set": args.set}
    for flag, value in given.items():
        if value is not None:
            raise UsageError(
                f"{flag} comes from the run with --straight-from RUN alone (its run.yaml and "
                f"run.json); use --resume-nproc or --resume-workers to resume on another layout"
            )
    run = Path(args.straight_from).resolve()
    refuse_places(args.out, "--out", inputs=(run,), folder=True)  # the run is read, never written
    try:
        spec = straight_run_spec(run, args.num_workers)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return _check_trainer(args, spec, load_config(spec.config), straight_run=run)


def _check_trainer(args, spec, cfg, straight_run: Path | None = None) -> int:
    """``check-resume`` on the reference trainer for ``spec`` (``cfg``: its config, loaded):
    the layout checked, the default tolerance set, the check run, its verdict printed."""
    from energon_platform.training.resume_check import RunFailed, check_resume, verdict
    from energon_platform.training.resume_check.options import (
        check_trainer_run,
        default_tolerance,
    )

    check_trainer_run(cfg, spec.nproc, args.resume_nproc, args.kill_at, spec.steps)
    if args.tolerance is None:
        args.tolerance = default_tolerance(spec.nproc, args.resume_nproc)
    try:
        result = check_resume(
            spec,
            args.kill_at,
            Path(args.out),
            args.resume_nproc,
            args.resume_workers,
            args.tolerance,
            timeout=args.timeout,
            straight_run=straight_run,
        )
    except RunFailed as e:  # a trainer process failed: its output tail is in the message
        print(f"energon-platform check-resume: {e}", file=sys.stderr)
        return 1
    return _print_verdict(verdict(result), args.out, result["passed"])


def _print_verdict(text: str, out: str, passed: bool) -> int:
    """Print a check's verdict and where its report and plot are; the exit status."""
    print(text)
    print(
        f"report: {Path(out).resolve() / 'report.json'}\nplot:   {Path(out).resolve() / 'loss.png'}"
    )
    return 0 if passed else 1


def cmd_check_resume(args) -> int:
    from energon_platform.config import load_config
    from energon_platform.training.resume_check import RunSpec
    from energon_platform.training.resume_check.options import (
        check_trainer_form,
        is_command_form,
    )

    if is_command_form(args.cmd, args.resume_cmd):
        return _check_resume_cmd(args)
    if args.straight_from is not None and args.config is None:
        return _check_resume_from_run(args)
    if args.steps is None:
        raise UsageError("--steps is required (with --straight-from RUN alone: the run's own)")
    check_trainer_form(
        args.config,
        {
            "--log": args.log,
            "--log-format": args.log_format,
            "--regex": args.regex,
            "--straight-from": args.straight_from,
        },
    )
    args.nproc = args.nproc or 1
    cfg = load_config(args.config, overrides(args.set))  # fail here, in one line, not in a child
    spec = RunSpec(args.config, args.steps, args.nproc, args.num_workers, tuple(args.set or ()))
    return _check_trainer(args, spec, cfg)


def add_replay(sub) -> None:
    p = sub.add_parser(
        "replay",
        help="re-run a run from the checkpoint before a step with other config values",
        description="Copy a run's newest checkpoint saved before step --from into --out (the "
        "run's folder is only read), train --steps steps after it with the reference trainer "
        "and the config's values with --set applied (typically loader.exclude=@rules.yaml from "
        "spikes --exclude-from), then check that every replayed step before --from has the "
        "original's keys and batch digests (exit 1 when one has not) and print where the "
        "replayed loss departs from the original. It trains on one process, its learning-rate "
        "schedule spanning train.steps as the original's did (--run R alone reads it from the "
        "run's run.yaml, which records a train --steps N too). See docs/spikes.md.",
    )
    p.add_argument(
        "--run",
        required=True,
        help="the original run's folder (log, checkpoints, and the config it records)",
    )
    add_run_args(p, "loader workers (default: the config's)", config_required=False)
    p.add_argument(
        "--from",
        dest="from_step",
        type=positive,
        required=True,
        metavar="STEP",
        help="the first step that may differ: the replay starts from the newest checkpoint "
        "saved before it",
    )
    p.add_argument(
        "--steps",
        type=positive,
        required=True,
        metavar="K",
        help="steps to train after the checkpoint (enough to reach --from)",
    )
    p.add_argument("--out", required=True, help="the replayed run's folder (new or empty)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run an earlier replay left in --out (marked by its replay.json; a "
        "training run's folder is never replaced)",
    )
    p.set_defaults(func=cmd_replay)


def cmd_replay(args) -> int:
    from energon_platform.training.replay import ReplayError, mismatch_line, replay, summary

    cfg = run_config(args, args.run)
    try:
        result = replay(
            cfg,
            args.run,
            args.out,
            args.from_step,
            args.steps,
            num_workers=args.num_workers,
            overwrite=args.overwrite,
        )
    except ReplayError as e:
        raise UsageError(str(e)) from None
    if not result["identical"]:
        print(f"energon-platform replay: {mismatch_line(result)}", file=sys.stderr)
        return 1
    print("\n".join(summary(result, args.run, args.out)))
    return 0
