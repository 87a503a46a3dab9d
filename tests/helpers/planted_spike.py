"""The reference trainer with a planted bad step, as a process of its own::

    python -m tests.helpers.planted_spike CONFIG OUT STEP KEY [KEY ...]

trains CONFIG into OUT (one micro-batch per step: ``micro_batch_size`` = the global batch) where,
at logged step STEP only, the documents with the given keys have every target replaced by one
junk token whose loss counts ``JUNK_WEIGHT`` times: their own loss, and so the step's, jumps.
"""

from __future__ import annotations

import sys

import torch

from energon_platform.config import load_config
from energon_platform.training import model, train
from energon_platform.training.model import document_index

JUNK_WEIGHT = 10.0


def plant(step: int, keys: set[str]) -> None:
    """At step ``step`` (batches counted as the trainer moves them to its device), give the
    targets of the documents ``keys`` the last token of the vocabulary, its loss weighted
    ``JUNK_WEIGHT`` times."""
    calls, planted = {"n": 0}, {"mask": None}
    to, token_loss = train._to, model.lm_token_loss

    def marking(batch, device):
        calls["n"] += 1
        planted["mask"] = None
        if calls["n"] == step:
            docs = document_index(batch.position_ids, batch.num_docs)
            chosen = [j for j, key in enumerate(batch.keys) if key in keys]
            planted["mask"] = torch.isin(docs, torch.tensor(chosen)) & (batch.loss_mask > 0)
        return to(batch, device)

    def weighted(lm, x, position_ids, labels, loss_mask):
        mask = planted["mask"]
        if mask is None:
            return token_loss(lm, x, position_ids, labels, loss_mask)
        labels = labels.masked_fill(mask, lm.head.out_features - 1)
        loss = token_loss(lm, x, position_ids, labels, loss_mask)
        return torch.where(mask.flatten(), loss * JUNK_WEIGHT, loss)

    train._to, model.lm_token_loss = marking, weighted


def main(argv: list[str]) -> None:
    config, out, step, *keys = argv
    plant(int(step), set(keys))
    train.train(load_config(config), out=out, quiet=True)


if __name__ == "__main__":
    main(sys.argv[1:])
