"""Hugging Face Accelerate on energon-platform's loader: ``accelerator.prepare`` takes model and
optimizer only; ``prepare_loader`` (``energon_platform.integrations.accelerate``) builds this
process's ``TrainLoader`` and puts its state into ``accelerator.save_state``/``load_state``
(restored in O(1), no ``skip_first_batches`` replay).

    python scripts/examples/accelerate_example.py --config run.yaml --out OUT --steps 12 [--resume]
    accelerate launch --multi_gpu --num_processes 2 scripts/examples/accelerate_example.py ...   # or torchrun

(On CPU too: ``Accelerator(cpu=True)`` then runs DDP over gloo. ``--multi_gpu`` selects Accelerate's
torchrun launcher; ``--cpu --num_processes 2`` without an MPI hostfile starts one process.)

``run.yaml`` is an energon-platform run config (an image-text encoder, or the ``multimodal`` one
over a blend, without packing). Each step is logged to ``OUT/steps.jsonl`` with ``StepLog`` (the
global batch's keys and digests: check-resume's exact check), each sample's own loss
(``sample_losses``, aligned with the keys), and each process's keys apart (``rank_keys``: disjoint,
together the global batch: no double sharding). The logged loss is the mean over processes of each
one's token-mean loss: over each process's keys, the sample losses' mean weighted by their target
counts, then averaged (with gradient accumulation, ``micro_batch_size`` set: each process's
micro-batches under ``accelerator.accumulate``, their token-mean losses averaged). After each
global step and before its checkpoint, every process reports the step's keys and sample losses of
its micro-batches to the loader (``loader.report_losses(global_batch, keys, sample_losses)``,
``global_batch`` read before the step's first ``next()``): online mixing's input
(``loader.blend_adapt``), a no-op without it. ``--skip-loader-restore`` breaks the resume on
purpose (model, optimizer and RNG restored, the data starts over): check-resume must fail it.
"""

import argparse
import os
import shutil
from pathlib import Path

import torch
from accelerate import Accelerator
from tiny_model import TinyModel, batch_losses, batch_tensors, row_images

from energon_platform import (
    StepLog,
    TrainLoader,
    batch_digest,
    gradient_accumulation_steps,
    load_config,
    record_run,
    to_device,
)
from energon_platform.integrations.accelerate import prepare_loader

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

cfg = load_config(args.config)
# the Accelerator takes the loader's accumulation when it is built; cpu=True joins the launched
# processes into one gloo group (without it, on CPU, each process is a world of one)
world = int(os.environ.get("WORLD_SIZE", 1))  # set by accelerate launch and torchrun
accelerator = Accelerator(
    cpu=True, gradient_accumulation_steps=gradient_accumulation_steps(cfg, world)
)
if args.skip_loader_restore:  # a loader that load_state does not restore
    loader = TrainLoader(cfg, rank=accelerator.process_index, world_size=accelerator.num_processes)
else:
    loader = prepare_loader(accelerator, cfg)
torch.manual_seed(0)
model = TinyModel(loader.encoder.tokenizer.vocab_size)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
model, optimizer = accelerator.prepare(model, optimizer)
ckpt_dir = Path(args.out) / "checkpoints"

step = 0
saved = (
    sorted(ckpt_dir.glob("step-*"), key=lambda d: int(d.name.split("-")[1])) if args.resume else []
)
if saved:  # the newest complete checkpoint: step-N folders appear by rename, once fully written
    accelerator.load_state(str(saved[-1]))
    step = int(saved[-1].name.split("-")[1])
resumed_from = {"resumed_from": step} if args.resume else {}

log = StepLog(Path(args.out) / "steps.jsonl", rank=accelerator.process_index)
if accelerator.is_main_process:  # OUT/run.yaml and run.json: how this run was made
    record_run(args.out, cfg, accelerator.num_processes, loader, resumed=args.resume and step > 0)
while step < args.steps:
    global_batch = loader.global_batch  # the step's index for report_losses
    keys, digests, losses, sample_losses = [], [], [], []
    for _ in range(loader.accumulation):  # the optimizer steps at the global batch's last one
        batch = to_device(next(loader), accelerator.device)
        with accelerator.accumulate(model):
            loss_sum, targets, batch_sample_losses = batch_losses(
                model(batch.tokens, row_images(batch)), batch
            )
            loss = loss_sum / targets
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
        keys += batch.keys
        digests.append(batch_digest(batch_tensors(batch)))
        losses.append(loss.detach())
        sample_losses += batch_sample_losses
    step += 1
    loader.report_losses(global_batch, keys, sample_losses)  # every process, before the checkpoint

    # the global batch: every process's keys, tensor digests and sample losses in rank order; the
    # loss averaged
    parts = accelerator.gather_for_metrics([(keys, digests, sample_losses)], use_gather_object=True)
    global_loss = accelerator.reduce(torch.stack(losses).mean(), reduction="mean")
    log.write(
        step,
        global_loss.item(),
        keys=[k for keys, _, _ in parts for k in keys],
        batch=[d for _, ds, _ in parts for d in ds],
        sample_losses=[v for _, _, losses in parts for v in losses],
        rank_keys=[keys for keys, _, _ in parts],
        **resumed_from,
    )
    resumed_from = {}

    if step % args.checkpoint_every == 0 or step == args.steps:
        tmp, final = ckpt_dir / f".tmp-step-{step}", ckpt_dir / f"step-{step}"
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()  # every process's files are written
        if accelerator.is_main_process:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        accelerator.wait_for_everyone()

log.close()
loader.close()
accelerator.end_training()
