"""DeepSpeed (ZeRO stage 1 or 2) on energon-platform's loader, on CPU with DeepSpeed's gloo backend:
``engine.save_checkpoint(..., client_state=client_state(loader))`` carries the loader state and
``engine.load_checkpoint`` gives it back (``energon_platform.integrations.deepspeed``); DeepSpeed's
batch sizes come from the loader (``batch_config``).

    python scripts/examples/deepspeed_example.py --config run.yaml --out OUT --steps 12 [--resume]
    torchrun --standalone --nproc-per-node 2 scripts/examples/deepspeed_example.py ... --zero-stage 2

``run.yaml`` is an energon-platform run config (an image-text encoder, or the ``multimodal`` one
over a blend, without packing). Each step is logged to ``OUT/steps.jsonl`` with ``StepLog`` (the
global batch's keys and digests: check-resume's exact check; each sample's own loss,
``sample_losses``, aligned with the keys). The logged loss is the mean of the micro-batches'
token-mean losses over all ranks: over each micro-batch's keys, the sample losses' mean weighted by
their target counts, then averaged. After each global step (all its micro-batches, DeepSpeed's
optimizer step at the last) and before its checkpoint, every rank reports the step's keys and
sample losses of its micro-batches to the loader (``loader.report_losses(global_batch, keys,
sample_losses)``, ``global_batch`` read before the step's first ``next()``): online mixing's input
(``loader.blend_adapt``), a no-op without it. ``--skip-loader-restore`` breaks the resume on
purpose (model and optimizer restored, the data starts over): check-resume must fail it.
"""

import argparse
import os
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from tiny_model import TinyModel, batch_losses, batch_tensors, row_images

from energon_platform import StepLog, TrainLoader, batch_digest, load_config, record_run
from energon_platform.integrations.deepspeed import (
    batch_config,
    client_state,
    init_distributed,
    restore_loader,
)

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--config", required=True)
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, required=True)
p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoints/latest")
p.add_argument("--checkpoint-every", type=int, default=2)
p.add_argument("--zero-stage", type=int, choices=(1, 2), default=1)
p.add_argument(
    "--skip-loader-restore", action="store_true", help="a broken resume, for the check to catch"
)
args = p.parse_args()

init_distributed()  # deepspeed.init_distributed(dist_backend="gloo"); a lone process is a world of one
rank, world = dist.get_rank(), dist.get_world_size()
loader = TrainLoader(load_config(args.config), rank=rank, world_size=world)
torch.manual_seed(0)
model = TinyModel(loader.encoder.tokenizer.vocab_size)
engine, *_ = deepspeed.initialize(
    model=model,
    optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
    config={
        **batch_config(loader),
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": args.zero_stage},
        "steps_per_print": 1 << 30,
    },
)
ckpt_dir = Path(args.out) / "checkpoints"

step = 0
if args.resume:  # "latest" names the newest complete checkpoint (written once every rank saved it)
    _, client = engine.load_checkpoint(str(ckpt_dir))
    if client is not None:
        step = client["step"]
        if not args.skip_loader_restore:
            restore_loader(loader, client)
resumed_from = {"resumed_from": step} if args.resume else {}

log = StepLog(Path(args.out) / "steps.jsonl")
if rank == 0:  # OUT/run.yaml and run.json: how this run was made
    record_run(args.out, load_config(args.config), world, loader, resumed=args.resume and step > 0)
while step < args.steps:
    global_batch = loader.global_batch  # the step's index for report_losses
    keys, digests, losses, sample_losses = [], [], [], []
    # DeepSpeed steps the optimizer at the global batch's last micro-batch
    for _ in range(loader.accumulation):
        batch = next(loader)
        loss_sum, targets, batch_sample_losses = batch_losses(
            engine(batch.tokens, row_images(batch)), batch
        )
        loss = loss_sum / targets
        engine.backward(loss)  # scaled by 1/gradient_accumulation_steps inside
        engine.step()
        keys += batch.keys
        digests.append(batch_digest(batch_tensors(batch)))
        losses.append(loss.detach())
        sample_losses += batch_sample_losses
    step += 1
    loader.report_losses(global_batch, keys, sample_losses)  # every rank, before the checkpoint

    # the global batch: every rank's keys, tensor digests and sample losses in rank order; the loss
    # averaged over all
    parts, global_loss = [(keys, digests, sample_losses)] * world, torch.stack(losses).mean()
    dist.all_gather_object(parts, (keys, digests, sample_losses))
    dist.all_reduce(global_loss)
    log.write(
        step,
        global_loss.item() / world,
        keys=[k for ks, _, _ in parts for k in ks],
        batch=[d for _, ds, _ in parts for d in ds],
        sample_losses=[v for _, _, vs in parts for v in vs],
        **resumed_from,
    )
    resumed_from = {}

    if step % args.checkpoint_every == 0 or step == args.steps:
        engine.save_checkpoint(
            str(ckpt_dir),
            tag=f"step-{step}",
            client_state=client_state(loader, step=step),
            save_latest=False,
        )
        dist.barrier()  # every rank's files are written
        if rank == 0:  # then the tracker, atomically (DeepSpeed's own rewrites it in place)
            (ckpt_dir / "latest.tmp").write_text(f"step-{step}")
            os.replace(ckpt_dir / "latest.tmp", ckpt_dir / "latest")

log.close()
loader.close()
dist.destroy_process_group()
