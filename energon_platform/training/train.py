"""The reference trainer: ``energon-platform train --config FILE [--resume]``.

Single process, or one process per rank under ``torchrun`` (gloo on CPU, nccl on GPU). Each step
takes one global batch (``loader.accumulation`` micro-batches per rank), does AdamW with a warmup
schedule, and rank 0 appends one JSON line to ``OUT/log.jsonl``:

    {"step": 7, "loss": 5.91..., "keys": [...global batch keys, rank order...],
     "sample_losses": [...each key's document's mean loss over its own targets...],
     "batch_sha256": "...", "global_batch": 6, "epoch": 0.19, "world_size": 2, "num_workers": 2,
     "datasets": {"coco": {"samples": 56, "epochs": 0.19}, ...}}

``datasets``: per dataset of the blend (one entry, ``dataset``, without a metadataset), samples
and epochs consumed up to and including this step; ``epoch`` is the first dataset's ``epochs``
there (the end of the step, balanced or not). A resume whose blend differs from the saved
one (new weights, an added dataset) logs ``blend_changes`` on its first row.

Every ``checkpoint_every`` steps it saves model, optimizer, scheduler, RNG and every rank's
loader state atomically (`energon_platform.training.checkpoint`). ``--resume`` continues from the
newest complete checkpoint (falling back past corrupt ones, and saying so); the loader continues
at the same global batch, on any world size that divides the global batch and any number of
workers. At every checkpoint it also logs ``val_loss`` over the dataset's validation split
(Energon's own deterministic validation loader). The first row a process logs also says where it
started: ``"resumed_from": <step>`` (0 for a fresh start), plus ``"skipped_checkpoints"`` when it
fell back.

Before the first step it refuses, as one-line errors: an output folder that is not new, empty or
its own run's (`energon_platform.training.run_record.check_out`: never the file system's root,
the home folder or a repository's root, never a user's folder), an unusable dataset or
encoder/model mismatch (`energon_platform.training.preflight`), an output or checkpoint folder it
cannot write, checkpoints of another run in a fresh run's folder, and checkpoints none of which is
usable. A run's own ``run.yaml`` given as the config trains in the folder that holds it (wherever
the run was moved), unless ``--out`` says otherwise; ``--resume`` that finds no checkpoint says
so, ``--quiet`` or not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from energon_platform.config import RunConfig
from energon_platform.loader.train_loader import TrainLoader, build_val_loader
from energon_platform.training import checkpoint, collector
from energon_platform.training.digests import device_fields
from energon_platform.training.digests import row_digests as batch_digest
from energon_platform.training.preflight import preflight
from energon_platform.training.run_record import check_out, check_record, record_run, run_folder
from energon_platform.training.step_log_writer import open_for_append
from energon_platform.training.two_tower import build_model
from storage.outputs import refuse_places


def _init_distributed() -> tuple[int, int, torch.device]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def _to(batch: Any, device: torch.device) -> Any:
    if device.type == "cpu":
        return batch
    for f in device_fields(batch):  # the batch's own list (task_encoders.batch_tensors)
        t = getattr(batch, f, None)
        if isinstance(t, torch.Tensor):
            setattr(batch, f, t.to(device, non_blocking=True))
    return batch


def _filled(micro_batches: list, loader: Any, world: int, device: Any) -> dict:
    """Packed planned rows: ``{"padding": fraction of the step's row positions (all ranks) that
    hold no document}``, from the batches trained, so positions left empty where no stand-in fit
    an excluded or failed sample count too (the plan cannot know them); ``{}`` otherwise."""
    if not loader.plan.batching.packed_rows:
        return {}
    counts = torch.tensor(
        [
            float(sum(int(b.doc_lengths.sum()) for b in micro_batches)),
            float(sum(b.tokens.numel() for b in micro_batches)),
        ],
        dtype=torch.float64,
        device=device,
    )
    used, slots = _all_reduce(counts, world).tolist()
    return {"padding": round(1.0 - used / slots, 4) if slots else 0.0}


def _sorted_by_key(keys: list[str], losses: list[float]) -> tuple[list[str], list[float]]:
    """``keys`` sorted, with ``losses`` (aligned with ``keys``) in the same order."""
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return [keys[i] for i in order], [losses[i] for i in order]


def _gather(obj: Any, world: int) -> list:
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def all_ranks_ok(ok: bool, world: int, device: torch.device = torch.device("cpu")) -> bool:
    """Whether ``ok`` holds on every rank (a collective: every rank calls it; ``device``: where the
    backend reduces, the rank's GPU under nccl)."""
    if world == 1:
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _all_reduce(t: torch.Tensor, world: int) -> torch.Tensor:
    if world > 1:
        dist.all_reduce(t)
    return t


def evaluate(model: torch.nn.Module, val: Any, world: int, device: torch.device) -> float:
    """Token-weighted mean loss over the validation loader ``val`` (each rank its share of the
    split, Energon's deterministic val loader: no augmentation; no dropout)."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    targets = torch.zeros((), dtype=torch.float64, device=device)
    model.eval()
    with torch.no_grad():
        for batch in val:
            batch = _to(batch, device)
            total += model(batch).double()
            targets += batch.loss_mask.sum().double()
    model.train()
    return float(_all_reduce(total, world) / _all_reduce(targets, world).clamp(min=1.0))


def _lr_lambda(warmup: int, steps: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return float(0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * min(1.0, progress))))

    return f


def _resume(ckpt_dir: Path, rank: int, quiet: bool) -> tuple[dict | None, dict]:
    """The checkpoint to continue from (None: none there) and what the first log row records."""
    found = checkpoint.load_newest(ckpt_dir, rank)
    if found is None:
        if rank == 0:  # loud whatever --quiet says: --resume asked to continue a run
            print(
                f"warning: --resume: no checkpoint in {ckpt_dir}; starting from step 0",
                file=sys.stderr,
                flush=True,
            )
        return None, {"resumed_from": 0}
    note = {"resumed_from": found.content["step"], "checkpoint": found.path.name}
    if found.skipped:
        note["skipped_checkpoints"] = list(found.skipped)
        if rank == 0:  # loud whatever --quiet says: the run does not continue where it stopped
            print(
                f"warning: resuming from the older checkpoint {found.path} (step {found.content['step']}); "
                f"skipped: {'; '.join(found.skipped)}",
                file=sys.stderr,
                flush=True,
            )
    return found.content, note


def train(
    cfg: RunConfig,
    *,
    resume: bool = False,
    num_workers: int | None = None,
    out: str | None = None,
    steps: int | None = None,
    quiet: bool = False,
    until: int | None = None,
    lock: checkpoint.RunLock | None = None,
) -> dict:
    """Run (or continue) training; returns ``{"step", "loss", "out"}`` of the last step. Rank 0
    holds the checkpoint folder's `RunLock` for the
    whole run: a second run pointed at the same folder is refused. ``until``: stop after that
    step (checkpointing it) instead of after ``steps``, the learning-rate schedule still spanning
    ``steps`` (default ``train.steps``), as a replay of part of a longer run needs. ``lock``: the
    folder's `RunLock`, already held by the caller (a replay, which claims the folder under it
    by its own rule). ``out``: the run's folder (default: the folder of the run's own
    ``run.yaml`` given as ``cfg``, `run_folder`, else ``train.out``), under `check_out`'s rule."""
    out = str(_out_folder(cfg, out))
    ckpt_dir = Path(out) / "checkpoints"
    if lock is not None and lock.path.parent.resolve() != ckpt_dir.resolve():
        raise ValueError(f"the lock given is {lock.path}'s, not {ckpt_dir}'s")
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0 and lock is None:  # before the lock, which writes in the folder
        check_out(out, (cfg.data.path,), writes=(cfg.loader.length_cache,))
    else:  # the caller's folder, claimed under its own rule; or another rank's view of rank 0's
        refuse_places(Path(out), "--out", (cfg.data.path,))  # not in a dataset
    with (
        checkpoint.RunLock(ckpt_dir) if rank0 and lock is None else nullcontext(),
        progress_bars(not quiet),
    ):
        return _train(
            cfg,
            resume=resume,
            num_workers=num_workers,
            out=out,
            steps=steps,
            quiet=quiet,
            until=until,
        )


def _out_folder(cfg: RunConfig, out: str | None) -> Path:
    """``out`` when given; else the folder of the run whose own ``run.yaml`` ``cfg`` is (a run
    moved elsewhere resumes where it is: said on stderr when its record names another folder);
    else ``train.out``."""
    if out:
        return Path(out)
    folder = run_folder(cfg)
    if folder is None:
        return Path(cfg.train.out)
    if Path(cfg.train.out).resolve() != folder.resolve() and int(os.environ.get("RANK", "0")) == 0:
        print(
            f"note: {folder / 'run.yaml'} records train.out {cfg.train.out}; the run is in "
            f"{folder}, where it trains",
            file=sys.stderr,
            flush=True,
        )
    return folder


@contextmanager
def progress_bars(shown: bool):
    """With ``shown`` False, ``TQDM_DISABLE`` is set for the block (as it was after): the length
    index's bar reads it, and so does tqdm in every process the block starts (this process's
    tqdm read it once, at its import)."""
    if shown:
        yield
        return
    before = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = before


def _what_changed(ck: dict, tok) -> str:
    """Which config a checkpoint's model does not fit: the encoder's ``seq_len`` / tokenizer (they
    size the model's position and token tables), else the model config."""
    saved = ck.get("model_state", {}).get("model", {})
    positions, tokens = saved.get("positions.weight"), saved.get("tokens.weight")
    if positions is not None and positions.shape[0] != tok.seq_len:
        return (
            f"encoder's seq_len (the checkpoint's model takes {positions.shape[0]} tokens, "
            f"this encoder {tok.seq_len})"
        )
    if tokens is not None and tokens.shape[0] != tok.vocab_size:
        return f"encoder's tokenizer (vocabulary of {tokens.shape[0]} in the checkpoint, {tok.vocab_size} now)"
    return "model config (model.*)"


@dataclasses.dataclass
class Run:
    """What the training loop works with, made once by `set_up`."""

    cfg: RunConfig
    rank: int
    world: int
    device: torch.device
    out_dir: Path
    total_steps: int  #: the learning-rate schedule's length
    last_step: int  #: the step the loop stops after
    loader: TrainLoader
    model: torch.nn.Module
    ddp: torch.nn.Module  #: the model, wrapped in DistributedDataParallel on more than one rank
    opt: torch.optim.Optimizer
    sched: Any
    val: Any  #: the validation loader (re-iterable), or None
    quiet: bool

    @property
    def ckpt_dir(self) -> Path:
        return self.out_dir / "checkpoints"

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


@dataclasses.dataclass
class StepResult:
    """One step's outcome on this rank: the loss over the global batch (every rank's), and this
    rank's keys, batch digests and per-sample losses."""

    loss: float
    keys: list[str]
    digests: list[str]
    sample_losses: list[float]
    targets: int  #: loss targets of the global batch (all ranks)
    filled: dict  #: `_filled`'s padding figure, or {}


def set_up(cfg: RunConfig, num_workers, out, steps, until, quiet) -> Run:
    """The process group, the loader (checked by `preflight` before any global state changes),
    the seeded model, optimizer, schedule and validation loader."""
    rank, world, device = _init_distributed()
    out_dir = Path(out or cfg.train.out)
    if rank == 0:
        check_record(out_dir)  # its run.yaml and run.json: new, or this run's own record
    total_steps = steps or cfg.train.steps
    loader = TrainLoader(cfg, rank=rank, world_size=world, num_workers=num_workers)
    preflight(cfg, loader)  # before any global state is touched: a refused run changes nothing
    _seed_everything(cfg.loader.seed)
    model = build_model(cfg.model, loader.encoder).to(device)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay
    )
    return Run(
        cfg=cfg,
        rank=rank,
        world=world,
        device=device,
        out_dir=out_dir,
        total_steps=total_steps,
        last_step=until or total_steps,
        loader=loader,
        model=model,
        ddp=torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model,
        opt=opt,
        sched=torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg.train.warmup, total_steps)),
        val=build_val_loader(cfg, max(1, cfg.loader.global_batch_size // world), rank, world),
        quiet=quiet,
    )


def restore(run: Run, resume: bool) -> tuple[int, dict, bool]:
    """``(step, note, resumed)``: the step to continue after (0 fresh), what the first log row
    records about the start, and whether a checkpoint was restored (model, optimizer, schedule,
    loader state and RNG). A fresh run refuses a folder that holds checkpoints."""
    ckpt_dir = run.ckpt_dir
    if not resume and checkpoint.exists(ckpt_dir):
        raise checkpoint.CheckpointError(
            f"{ckpt_dir} already holds checkpoints of a run; pass --resume to continue "
            f"it, or choose another --out"
        )
    ck, note = _resume(ckpt_dir, run.rank, run.quiet) if resume else (None, {"resumed_from": 0})
    if ck is None:
        return 0, note, False
    try:
        run.model.load_state_dict(ck["model_state"]["model"])
        run.opt.load_state_dict(ck["model_state"]["optimizer"])
        run.sched.load_state_dict(ck["model_state"]["scheduler"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:  # another model config
        raise checkpoint.CheckpointError(
            f"{ckpt_dir / note['checkpoint']}: does not fit this model and "
            f"optimizer ({type(e).__name__}: {str(e).splitlines()[0]}); resume "
            f"with the {_what_changed(ck, run.loader.encoder.tokenizer)} it was saved with"
        ) from None
    run.loader.load_state_dict(ck["loader_state"])
    if run.loader.plan.blend_changes:  # new blend weights or datasets from this step on
        note["blend_changes"] = run.loader.plan.blend_changes  # printed by the loader's log, once
    checkpoint.set_rng_state(ck["rng"])
    if run.rank == 0 and not run.quiet:
        print(
            f"resumed from {ckpt_dir / note['checkpoint']} (step {ck['step']}, saved on "
            f"{ck['world_size']} rank(s)) on {run.world} rank(s) x {run.loader.num_workers} "
            f"worker(s)",
            flush=True,
        )
    return ck["step"], note, True


def open_log(run: Run, resumed: bool):
    """Rank 0: the step log, opened for appending, and the run's record (``run.yaml``,
    ``run.json``: how the run was made, which the commands over it read); None on other ranks.
    Every rank checks it can write the checkpoint folder."""
    checkpoint.writable_dir(run.ckpt_dir, "checkpoints")  # every rank writes its files there
    if run.rank != 0:
        return None
    checkpoint.writable_dir(run.out_dir, "the training log")
    cfg = run.cfg
    recorded = dataclasses.replace(
        cfg,
        train=dataclasses.replace(cfg.train, steps=run.total_steps, out=run.out_dir.resolve()),
    )
    # the record before the log: a run killed in between leaves a folder that is a run's
    record_run(run.out_dir, recorded, run.world, run.loader, resumed=resumed)
    return open_for_append(run.out_dir / "log.jsonl")


def train_step(run: Run, global_batch: int) -> StepResult:
    """One optimizer step on global batch ``global_batch``: this rank's micro-batches with
    gradient accumulation (DDP synchronises on the last), the loss token-weighted over the whole
    global batch whatever its split over ranks, the per-sample losses reported to the loader
    (``loader.blend_adapt``'s input), gradient clipping, AdamW and the schedule."""
    loader, world, device = run.loader, run.world, run.device
    micro_batches = [_to(next(loader), device) for _ in range(loader.accumulation)]
    keys = [k for b in micro_batches for k in b.keys]
    digests = [d for b in micro_batches for d in batch_digest(b)]
    targets = _all_reduce(sum(b.loss_mask.sum() for b in micro_batches).detach().double(), world)
    filled = _filled(micro_batches, loader, world, device)
    local_loss = torch.zeros((), dtype=torch.float64, device=device)
    sample_losses = []
    for micro, batch in enumerate(micro_batches):
        last = micro == len(micro_batches) - 1
        with run.ddp.no_sync() if world > 1 and not last else nullcontext():
            loss_sum, doc_losses = run.ddp(batch, per_document=True)
            (loss_sum * (world / targets.clamp(min=1.0)).float()).backward()
        local_loss += loss_sum.detach().double()
        sample_losses += doc_losses.tolist()
    loss = float(_all_reduce(local_loss, world) / targets.clamp(min=1.0))
    loader.report_losses(global_batch, keys, sample_losses)
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
    run.opt.step()
    run.sched.step()
    run.opt.zero_grad(set_to_none=True)
    return StepResult(loss, keys, digests, sample_losses, int(targets), filled)


def log_row(
    run: Run, step: int, global_batch: int, result: StepResult, elapsed: float
) -> dict | None:
    """The step's log row (module doc) on rank 0, from every rank's keys, digests and losses
    (gathered: every rank calls it); None on the other ranks."""
    gathered = _gather((result.keys, result.digests, result.sample_losses), run.world)
    if run.rank != 0:
        return None
    keys = [k for g in gathered for k in g[0]]
    digests = [d for g in gathered for d in g[1]]
    losses = [v for g in gathered for v in g[2]]
    loader = run.loader
    if loader.plan.batching.sorts_logged_keys:  # rank order depends on the world size
        keys, losses = _sorted_by_key(keys, losses)
        digests = sorted(digests)
    consumed = loader.consumed()  # before the next global batch: this step included
    row = {
        "step": step,
        "loss": result.loss,
        "keys": keys,
        "sample_losses": losses,
        "batch_sha256": hashlib.sha256("".join(digests).encode()).hexdigest(),
        "global_batch": global_batch,
        "epoch": round(next(iter(consumed.values()))["epochs"], 4),
        "world_size": run.world,
        "num_workers": loader.num_workers,
        "lr": run.sched.get_last_lr()[0],
        "elapsed_s": round(elapsed, 3),
        "datasets": consumed,
        "targets": result.targets,
        **loader.balance_stats(global_batch),
        **loader.exclusion_stats(global_batch),
        **result.filled,
    }
    if loader.plan.datasets.metadataset:  # the weights this step was drawn with
        row["blend_weights"] = loader.blend_weights(global_batch)
    return row


def save(run: Run, step: int) -> None:
    """Checkpoint step ``step`` (every rank: its loader state; rank 0: model, optimizer,
    schedule), atomically, then prune the older checkpoints."""
    state = {
        "model": run.model.state_dict(),
        "optimizer": run.opt.state_dict(),
        "scheduler": run.sched.state_dict(),
    }
    checkpoint.save(
        run.ckpt_dir,
        step,
        run.rank,
        run.world,
        model_state=state if run.rank == 0 else None,
        loader_state=run.loader.state_dict(),
        barrier=run.barrier,
        all_ok=lambda ok: all_ranks_ok(ok, run.world, run.device),
    )
    if run.rank == 0:
        checkpoint.prune(run.ckpt_dir, run.cfg.train.keep_checkpoints)


def _train(
    cfg: RunConfig,
    *,
    resume: bool,
    num_workers: int | None,
    out: str | None,
    steps: int | None,
    quiet: bool,
    until: int | None = None,
) -> dict:
    """The loop: set up, restore, then one step, one log row and (every ``checkpoint_every``
    steps and at the last) one checkpoint at a time."""
    run = set_up(cfg, num_workers, out, steps, until, quiet)
    step, start_note, resumed = restore(run, resume)
    log = open_log(run, resumed)
    # set up and past its last refusal: freeze it, before the loader's workers fork (first batch)
    collector.settle()
    loss = float("nan")
    t0 = time.perf_counter()
    try:  # the log closed whatever stops the loop (a full disk in a replay, in process)
        while step < run.last_step:
            global_batch = run.loader.global_batch
            result = train_step(run, global_batch)
            loss, step = result.loss, step + 1
            saving = step % cfg.train.checkpoint_every == 0 or step == run.last_step
            val_loss = (
                evaluate(run.model, run.val, run.world, run.device)
                if saving and run.val is not None
                else None
            )
            row = log_row(run, step, global_batch, result, time.perf_counter() - t0)
            if row is not None:
                if val_loss is not None:
                    row["val_loss"] = val_loss
                row.update(start_note)  # the first row only: where this process started
                start_note = {}
                log.write(json.dumps(row) + "\n")
                log.flush()
                if not quiet:
                    shown = f"  val loss {val_loss:.4f}" if val_loss is not None else ""
                    print(
                        f"step {step:5d}  loss {loss:.4f}  epoch {row['epoch']:.2f}{shown}",
                        flush=True,
                    )
            if saving:
                save(run, step)
    finally:
        if log is not None:
            log.close()
    run.loader.close()
    if run.world > 1:
        dist.destroy_process_group()
    return {"step": step, "loss": loss, "out": str(run.out_dir)}
