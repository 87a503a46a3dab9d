"""PyTorch Lightning on energon-platform's loader: ``train_dataloader()`` returns the ``TrainLoader``
itself, ``EnergonHooks`` (``energon_platform.integrations.lightning``) is mixed into the module, and
Lightning's own ``ModelCheckpoint`` and ``trainer.fit(ckpt_path=...)`` carry and restore the loader
state (no replay).

    python scripts/examples/lightning_example.py --config run.yaml --out OUT --steps 12 [--resume]
    torchrun --standalone --nproc-per-node 2 scripts/examples/lightning_example.py ...   # DDP, gloo

``run.yaml`` is an energon-platform run config (an image-text encoder, or the ``multimodal`` one
over a blend, without packing; one micro-batch per rank and step: ``micro_batch_size`` unset). Rank
0 logs each optimizer step to ``OUT/steps.jsonl`` with ``StepLog``, for the global batch: every
rank's sample keys and row digests in rank order (the loader's global order, whatever the number of
processes), each sample's own loss (``sample_losses``, aligned with the keys) and the token-mean
loss over all ranks (the sample losses' mean weighted by their target counts); the gradient is that
of the same mean. So a checkpoint of a run on 2 processes resumes on 1 (or the reverse) with the
same keys and digests, the loss equal up to the order of the all-reduce: check-resume's exact check
with ``--tolerance 1e-5``.
``training_step`` reports each micro-batch's sample losses with ``self.report_losses``
(``EnergonHooks``): the loader gets every global step's, before its checkpoint, for online mixing
(``loader.blend_adapt``); a no-op without it.
``--skip-loader-restore`` breaks the resume on purpose (model, optimizer and step restored, the
data starts over): check-resume must fail it.
"""

import argparse
import os
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint
from tiny_model import TinyModel, batch_losses, row_images, row_tensors

from energon_platform import (
    StepLog,
    TrainLoader,
    batch_digest,
    build_encoder,
    load_config,
    record_run,
)
from energon_platform.integrations.lightning import EnergonHooks

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


class Captioner(EnergonHooks, L.LightningModule):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = TinyModel(build_encoder(cfg).tokenizer.vocab_size)
        self.log_file = StepLog(Path(args.out) / "steps.jsonl")
        self.resumed_from = None

    def train_dataloader(self):
        loader = TrainLoader(self.cfg, rank=self.global_rank, world_size=self.trainer.world_size)
        if self.global_rank == 0:  # OUT/run.yaml and run.json: how this run was made
            record_run(args.out, self.cfg, self.trainer.world_size, loader, resumed=args.resume)
        return loader

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=3e-3)

    def training_step(self, batch, batch_idx):
        loss_sum, targets, self.sample_losses = batch_losses(
            self.model(batch.tokens, row_images(batch)), batch
        )
        self.report_losses(batch.keys, self.sample_losses)  # online mixing's input (EnergonHooks)
        self.step_sums = loss_sum.detach(), self.sum_over_ranks(targets)
        # DDP averages the gradients over ranks: scaled so, they are those of the global batch's token mean
        return loss_sum * self.trainer.world_size / self.step_sums[1]

    def sum_over_ranks(self, value):
        return self.trainer.strategy.reduce(value.detach().clone(), reduce_op="sum")

    def on_train_batch_end(self, outputs, batch, batch_idx):
        # the global batch: every rank's keys, row digests and sample losses in rank order, the
        # token-mean loss of all ranks
        rows = [batch_digest(row_tensors(batch, i)) for i in range(len(batch.keys))]
        parts = [(list(batch.keys), rows, self.sample_losses)] * self.trainer.world_size
        if dist.is_initialized():
            dist.all_gather_object(parts, parts[0])
        loss_sum, targets = self.step_sums
        extra = {"resumed_from": self.resumed_from} if self.resumed_from is not None else {}
        self.log_file.write(
            self.global_step,
            (self.sum_over_ranks(loss_sum) / targets).item(),
            keys=[k for keys, _, _ in parts for k in keys],
            batch=[d for _, ds, _ in parts for d in ds],
            sample_losses=[v for _, _, losses in parts for v in losses],
            **extra,
        )
        self.resumed_from = None

    def on_load_checkpoint(self, checkpoint):
        self.resumed_from = checkpoint["global_step"]
        # Lightning then restores no loader state: the data starts over
        if args.skip_loader_restore:
            checkpoint["loops"]["fit_loop"]["state_dict"].pop("combined_loader", None)


torch.manual_seed(0)
ckpt_dir = Path(args.out) / "checkpoints"
saved = (
    sorted(ckpt_dir.glob("step=*.ckpt"), key=lambda f: int(f.stem.split("=")[1]))
    if args.resume
    else []
)
world = int(os.environ.get("WORLD_SIZE", 1))  # under torchrun: one process per device
trainer = L.Trainer(
    accelerator="cpu",
    devices=world,
    strategy="ddp" if world > 1 else "auto",
    max_steps=args.steps,
    callbacks=[
        ModelCheckpoint(
            dirpath=ckpt_dir,
            filename="{step}",
            every_n_train_steps=args.checkpoint_every,
            save_top_k=-1,
        )
    ],
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
)
model = Captioner(load_config(args.config))
model.resumed_from = 0 if args.resume else None  # a checkpoint sets the step it resumes from
trainer.fit(model, ckpt_path=str(saved[-1]) if saved else None)
if dist.is_initialized():
    # Lightning destroys only an NCCL process group at exit. A gloo one left to the interpreter's
    # finalization can abort a rank after training (SIGABRT, "terminate called without an
    # active exception") while gloo's threads still hold tensors.
    dist.destroy_process_group()
