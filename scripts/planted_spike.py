"""The reference trainer with a planted bad step, as a process of its own::

    python -m scripts.planted_spike CONFIG OUT STEP KEY [KEY ...]
    python -m scripts.planted_spike --keys KEY[,KEY ...] -- ARGS ...

The first trains CONFIG into OUT (one micro-batch per step: ``micro_batch_size`` = the global
batch) where, at logged step STEP only, the documents with the given keys have every target
replaced by one junk token whose loss counts ``JUNK_WEIGHT`` times: their own loss, and so the
step's, jumps. The second runs ``energon-platform ARGS`` (``replay ...``) with those documents junk
wherever they are trained: a replay that does not skip them has the spike again.
:func:`planted_run` makes the first kind of run for tests; :func:`plant` is what ``make demo``
uses.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
import yaml

from energon_platform.config import load_config
from energon_platform.training import model, train
from energon_platform.training.model import document_index

JUNK_WEIGHT = 10.0
#: the step :func:`planted_run` plants its junk in
PLANTED_STEP = 13


def plant(step: int | None, keys: set[str]) -> None:
    """At step ``step`` (batches counted as the trainer moves them to its device; every step
    when None), give the targets of the documents ``keys`` the last token of the vocabulary,
    their loss weighted ``JUNK_WEIGHT`` times."""
    calls, planted = {"n": 0}, {"mask": None}
    to, token_loss = train._to, model.lm_token_loss

    def marking(batch, device):
        calls["n"] += 1
        planted["mask"] = None
        chosen = [j for j, key in enumerate(batch.keys) if key in keys]
        if chosen and (step is None or calls["n"] == step):
            docs = document_index(batch.position_ids, batch.num_docs)
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


def write_config(path: Path, data: Path) -> Path:
    """A 16-step run config of the COCO-style dataset ``data`` at ``path`` (one micro-batch of 8
    per step, a tiny model, checkpoints at steps 8 and 16)."""
    from scripts.bench.data import REPO

    path.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(data), "val_split": None},
                "encoder": str(REPO / "configs/encoders/image_text_small.yaml"),
                "loader": {
                    "global_batch_size": 8,
                    "micro_batch_size": 8,
                    "num_workers": 0,
                    "seed": 3,
                },
                "model": {"dim": 32, "layers": 1, "heads": 2, "patch": 16},
                "train": {"steps": 16, "checkpoint_every": 8, "warmup": 2},
            }
        )
    )
    return path


def planted_keys(config: Path) -> list[str]:
    """The two documents of step :data:`PLANTED_STEP` of ``config``'s run that get the junk."""
    from energon_platform.loader.trace import open_tracer

    return open_tracer(load_config(str(config))).step(PLANTED_STEP)["keys"][2:4]


def planted_run(base: Path, data: Path) -> dict:
    """A run of :func:`write_config`'s config into ``base/out`` whose step :data:`PLANTED_STEP`
    has two junk documents: ``{"config", "out", "planted"}`` (``planted``: their keys)."""
    from scripts.bench.data import REPO

    config = write_config(base / "run.yaml", data)
    planted, out = planted_keys(config), base / "out"
    cmd = [sys.executable, "-m", "scripts.planted_spike", config, out, PLANTED_STEP, *planted]
    subprocess.run(list(map(str, cmd)), check=True, timeout=300, cwd=REPO)
    return {"config": config, "out": out, "planted": planted}


def main(argv: list[str]) -> int:
    if argv[0] == "--keys":
        from energon_platform import cli

        keys, sep, args = argv[1], argv[2], argv[3:]
        assert sep == "--", "usage: --keys KEY[,KEY ...] -- ARGS ..."
        plant(None, set(keys.split(",")))
        return cli.main(args)
    config, out, step, *keys = argv
    plant(int(step), set(keys))
    train.train(load_config(config), out=out, quiet=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
