"""A torchtitan-style training loop on energon-platform's loader.

As in torchtitan, model, optimizer and data loader are ``Stateful`` entries of one
``torch.distributed.checkpoint`` (DCP) checkpoint that every rank saves and loads; the loader is
our ``TrainLoader`` through ``energon_platform.integrations.dcp.DCPLoader`` (one
rank-independent entry, so a checkpoint resumes on another world size too).

    torchrun --standalone --nproc-per-node 2 scripts/examples/torchtitan_style_loop.py \\
        --config run.yaml --out OUT --steps 12 [--resume]

``run.yaml`` is an energon-platform run config (``data``, ``encoder``, ``loader``; an image-text
encoder, or the ``multimodal`` one over a blend, without packing, ``micro_batch_size: null``).
After each step's optimizer step and before its checkpoint, every rank reports its samples' losses
to the loader (``loader.report_losses(global_batch, keys, sample_losses)``, ``global_batch`` read
before the step's ``next()``): the input of online mixing (``loader.blend_adapt``), a no-op
without it. Each step is logged twice: to
``OUT/steps.jsonl`` with ``StepLog`` (sample keys and batch digest: check-resume's exact check;
each sample's own loss, ``sample_losses``, aligned with the keys; the loss is the mean over ranks
of each rank's token-mean loss, i.e. of its sample losses' mean weighted by their target counts)
and as torchtitan's ``step: N  loss: X`` line on stdout (``--log-format torchtitan``).
``--skip-loader-restore`` breaks the resume on purpose (model and optimizer restored, the data
starts over): check-resume must fail it.
"""

import argparse
import gc
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from tiny_model import TinyModel, batch_losses, batch_tensors, row_images
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from energon_platform import StepLog, TrainLoader, batch_digest, load_config, record_run
from energon_platform.integrations.dcp import DCPLoader

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--config", required=True)
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, required=True)
p.add_argument(
    "--resume", action="store_true", help="continue from the newest checkpoint in OUT/checkpoints"
)
p.add_argument("--checkpoint-every", type=int, default=2)
p.add_argument(
    "--skip-loader-restore", action="store_true", help="a broken resume, for the check to catch"
)
args = p.parse_args()

distributed = "RANK" in os.environ  # under torchrun
if distributed:
    dist.init_process_group("gloo")
rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
logging.basicConfig(
    level=logging.INFO,
    stream=sys.stdout,
    format="[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s",
)
logger = logging.getLogger()


class ModelAndOptimizer(Stateful):
    """torchtitan's ModelWrapper + OptimizersContainer in one: DCP's get/set_state_dict."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self):
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def load_state_dict(self, state):
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )


cfg = load_config(args.config)
loader = DCPLoader(TrainLoader(cfg, rank=rank, world_size=world))
torch.manual_seed(0)
model = TinyModel(loader.loader.encoder.tokenizer.vocab_size)
ddp = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
train_state = {"step": torch.tensor(0)}
ckpt_dir = Path(args.out) / "checkpoints"

step = 0
saved = (
    sorted(ckpt_dir.glob("step-*"), key=lambda d: int(d.name.split("-")[1])) if args.resume else []
)
if saved:  # the newest complete checkpoint: step-N folders appear by rename, once fully written
    state = {"app": ModelAndOptimizer(model, optimizer), "train_state": train_state}
    if not args.skip_loader_restore:
        state["dataloader"] = loader
    dcp.load(state, checkpoint_id=str(saved[-1]))
    step = int(train_state["step"])
resumed_from = {"resumed_from": step} if args.resume else {}

log = StepLog(Path(args.out) / "steps.jsonl")
if rank == 0:  # OUT/run.yaml and run.json: how this run was made
    record_run(args.out, cfg, world, loader, resumed=args.resume and step > 0)
while step < args.steps:
    t0 = time.perf_counter()
    global_batch = loader.global_batch  # the step's index for report_losses, before its next()
    batch = next(loader)
    logits = ddp(batch.tokens, row_images(batch))
    loss_sum, targets, sample_losses = batch_losses(logits, batch)
    loss = loss_sum / targets
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    step += 1
    # every rank, every step, before the step's checkpoint: loader.blend_adapt's input
    loader.report_losses(global_batch, batch.keys, sample_losses)

    # the global batch: every rank's keys, tensor digest and sample losses, in rank order; the loss
    # averaged over ranks
    part = (
        list(batch.keys),
        batch_digest(batch_tensors(batch)),
        sample_losses,
    )
    parts = [part] * world
    global_loss = loss.detach().clone()
    if distributed:
        dist.all_gather_object(parts, part)
        dist.all_reduce(global_loss)
        global_loss /= world
    log.write(
        step,
        global_loss.item(),
        keys=[k for keys, _, _ in parts for k in keys],
        batch=[d for _, d, _ in parts],
        sample_losses=[v for _, _, losses in parts for v in losses],
        **resumed_from,
    )
    resumed_from = {}
    if rank == 0:
        logger.info(
            f"step: {step:2}  loss: {global_loss.item():8.5f}  grad_norm: {grad_norm.item():7.4f}  "
            f"memory:  0.00GiB(0.00%)  tps: {batch.tokens.numel() / (time.perf_counter() - t0):,.0f}  "
            f"tflops: 0.00  mfu: 0.00%"
        )

    if step % args.checkpoint_every == 0 or step == args.steps:
        tmp, final = ckpt_dir / f".tmp-step-{step}", ckpt_dir / f"step-{step}"
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        train_state["step"] = torch.tensor(step)
        dcp.save(
            {
                "app": ModelAndOptimizer(model, optimizer),
                "dataloader": loader,
                "train_state": train_state,
            },
            checkpoint_id=str(tmp),
        )
        if rank == 0:  # every rank's files are written when dcp.save returns on the coordinator
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        if distributed:
            dist.barrier()

log.close()
loader.close()
if distributed:
    # An orderly teardown, while the interpreter is fully alive: no rank leaves while another still
    # communicates, and DDP (whose reducer holds the process group and its gloo work) goes before
    # the group does. Left to interpreter exit, the group's gloo threads were torn down during
    # finalization and could abort the process ("terminate called without an active exception").
    dist.barrier()
    del ddp
    gc.collect()
    dist.destroy_process_group()
