"""PyTorch Lightning on the public API only: written from docs/reference/api.md, the names
``from energon_platform import ...`` and the documented trainer integration
``energon_platform.integrations.lightning``, with Lightning's own checkpointing (``ModelCheckpoint``
and ``trainer.fit(ckpt_path="last")``). Nothing else from this repository: a held-out check that
the public API is enough (tests/project/test_public_api.py checks the imports, tests/integrations/test_lightning.py
kills and resumes it under check-resume).

    python scripts/examples/public_api_lightning.py --config run.yaml --out OUT --steps 6

``run.yaml``: an image-text run config without packing. A run continues from ``OUT/checkpoints/last.ckpt``
when there is one. Each step is logged to ``OUT/steps.jsonl`` (``StepLog``: keys, batch digest, loss).
"""

import argparse
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint

from energon_platform import StepLog, TrainLoader, build_encoder, load_config
from energon_platform.integrations.lightning import EnergonHooks

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--config", required=True)
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, required=True)
args = p.parse_args()


class ColourCaptioner(EnergonHooks, L.LightningModule):
    """Next-token logits from the token's embedding plus the image's mean colour."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        vocab_size = build_encoder(cfg).tokenizer.vocab_size
        self.embed, self.colour = torch.nn.Embedding(vocab_size, 16), torch.nn.Linear(3, 16)
        self.head = torch.nn.Linear(16, vocab_size)
        self.steps = StepLog(Path(args.out) / "steps.jsonl")
        self.resumed_from = {}

    def train_dataloader(self):
        return TrainLoader(self.cfg)

    def configure_optimizers(self):
        # momentum: optimizer state to restore
        return torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.9)

    def training_step(self, batch, batch_idx):
        hidden = self.embed(batch.tokens) + self.colour(batch.images.mean(dim=(2, 3)))[:, None]
        mask = batch.loss_mask.bool()
        loss = F.cross_entropy(self.head(hidden)[mask], batch.labels[mask])
        self.steps.write(
            self.global_step + 1,
            loss.item(),
            keys=batch.keys,
            batch=[batch.tokens, batch.labels, batch.images],
            **self.resumed_from,
        )
        self.resumed_from = {}
        return loss

    def on_load_checkpoint(self, checkpoint):
        self.resumed_from = {"resumed_from": checkpoint["global_step"]}


torch.manual_seed(0)
trainer = L.Trainer(
    accelerator="cpu",
    devices=1,
    max_steps=args.steps,
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[
        ModelCheckpoint(
            dirpath=Path(args.out) / "checkpoints", every_n_train_steps=2, save_last=True
        )
    ],
)
trainer.fit(ColourCaptioner(load_config(args.config)), ckpt_path="last")
