"""PyTorch Lightning: our TrainLoader returned from ``train_dataloader()``, our batch types moved by
Lightning's own transfer, a module without ``EnergonHooks`` refused at its first checkpoint,
Lightning's ModelCheckpoint carrying the loader state and the random state, and
``trainer.fit(ckpt_path=...)`` resuming exactly after SIGKILL (scripts/examples/lightning_example.py)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("lightning")

from tests.helpers.cli import run_python
from tests.helpers.trainer_examples import (
    assert_exact_pass,
    assert_fails,
    assert_sample_losses_fit,
    check_resume,
    example,
    write_run_config,
)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    return write_run_config(
        tmp_path_factory.getbasetemp(), tmp_path_factory.mktemp("lightning") / "run.yaml"
    )


def test_our_batch_types_move_with_lightnings_own_transfer(config_file):
    """Lightning's ``move_data_to_device`` (a module without ``EnergonHooks``) calls the batch's
    ``.to``: a moved copy of the same frozen type; the mixin's transfer gives the same."""
    import torch
    from lightning.fabric.utilities.apply_func import move_data_to_device

    from energon_platform import TrainLoader, load_config
    from energon_platform.integrations.lightning import EnergonHooks

    batch = next(TrainLoader(load_config(config_file)))
    for moved in (
        move_data_to_device(batch, torch.device("meta")),
        EnergonHooks().transfer_batch_to_device(batch, torch.device("meta"), 0),
    ):
        assert (
            type(moved) is type(batch)
            and moved.keys == batch.keys
            and moved.max_seqlen == batch.max_seqlen
        )
        assert moved.tokens.is_meta and moved.images.is_meta and moved.cu_seqlens.is_meta
    assert batch.tokens.device.type == "cpu"  # the batch itself is left as it was


def lightning_module(config_file, hooks: bool, dropout: float = 0.0):
    """A small LightningModule on the run config's TrainLoader (with or without ``EnergonHooks``)
    that records each step's loss in ``losses``."""
    import lightning as L
    import torch

    from energon_platform import TrainLoader, load_config
    from energon_platform.integrations.lightning import EnergonHooks

    class Model(*((EnergonHooks,) if hooks else ()), L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Dropout(dropout), torch.nn.Linear(3, 1))
            self.losses = []

        def train_dataloader(self):
            return TrainLoader(load_config(config_file))

        def training_step(self, batch, batch_idx):
            loss = self.net(batch.images.mean(dim=(2, 3))).square().mean()
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Model()


def fit(model, root, steps: int, ckpt_path=None, every: int | None = None) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    callbacks = (
        [ModelCheckpoint(dirpath=root, filename="{step}", every_n_train_steps=every, save_top_k=-1)]
        if every
        else []
    )
    L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_checkpointing=bool(every),
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    ).fit(model, ckpt_path=ckpt_path)


def test_a_module_without_the_mixin_trains_and_its_first_checkpoint_names_the_mixin(
    config_file, tmp_path
):
    """Without ``EnergonHooks`` batches move and train; Lightning's checkpoint, which would hold the
    state one prefetched batch ahead, is refused at once, naming the mixin."""
    model = lightning_module(config_file, hooks=False)
    fit(model, tmp_path / "plain", steps=2)
    assert len(model.losses) == 2
    with pytest.raises(
        RuntimeError, match=r"one prefetched batch ahead.*EnergonHooks into the LightningModule"
    ):
        fit(lightning_module(config_file, hooks=False), tmp_path / "saving", steps=3, every=1)
    assert not list((tmp_path / "saving").glob("*.ckpt"))


#: a script on Lightning and the public names only: it never imports our Lightning integration
NO_INTEGRATION_IMPORTED = """
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from energon_platform import TrainLoader, load_config

INTEGRATION = "energon_platform.integrations.lightning"


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(3, 1)

    def train_dataloader(self):
        return TrainLoader(load_config(sys.argv[1]))

    def training_step(self, batch, batch_idx):
        print("step", batch_idx, "integration imported:", INTEGRATION in sys.modules, flush=True)
        return self.net(batch.images.mean(dim=(2, 3))).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


assert INTEGRATION not in sys.modules
checkpoints = ModelCheckpoint(dirpath=sys.argv[2], every_n_train_steps=1, save_top_k=-1)
trainer = L.Trainer(
    accelerator="cpu", max_steps=3, logger=False, callbacks=[checkpoints],
    enable_progress_bar=False, enable_model_summary=False, default_root_dir=sys.argv[2],
)
try:
    trainer.fit(Model())
except RuntimeError as e:
    print("refused:", e)
    sys.exit(3)
"""


def test_a_script_that_never_imports_the_integration_is_refused_too(config_file, tmp_path):
    """The refusal does not depend on the user importing ``energon_platform.integrations.lightning``:
    a TrainLoader that starts while Lightning is imported imports it (`loader.on_start`), so the
    first checkpoint of a module without the mixin is refused and nothing is written."""
    r = run_python(NO_INTEGRATION_IMPORTED, config_file, tmp_path / "ckpt")
    assert r.returncode == 3, r.stdout + r.stderr[-3000:]
    assert "step 0 integration imported: True" in r.stdout
    assert "one prefetched batch ahead" in r.stdout and "EnergonHooks" in r.stdout, r.stdout
    assert not list((tmp_path / "ckpt").glob("*.ckpt"))


# resumed in place
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_dropout_resumes_exactly_the_mixin_carries_every_generator(config_file, tmp_path):
    """Dropout draws from torch's generator: resumed from a checkpoint (another seed set before),
    the steps after it have the losses of the uninterrupted run."""
    import torch

    torch.manual_seed(0)
    straight = lightning_module(config_file, hooks=True, dropout=0.5)
    fit(straight, tmp_path, steps=5, every=2)
    torch.manual_seed(1)
    resumed = lightning_module(config_file, hooks=True, dropout=0.5)
    # the same callback
    fit(resumed, tmp_path, steps=5, ckpt_path=tmp_path / "step=2.ckpt", every=2)
    assert resumed.losses == straight.losses[2:] and len(resumed.losses) == 3


def test_state_at_is_the_state_a_loader_had_at_that_position(config_file):
    from energon_platform import TrainLoader, load_config

    loader, behind = TrainLoader(load_config(config_file)), TrainLoader(load_config(config_file))
    for _ in range(3):
        next(loader)
    next(behind)
    assert loader.state_at(1) == behind.state_dict() and loader.state_at(3) == loader.state_dict()
    assert loader.next_microbatch == 3  # not moved


def test_gradient_accumulation_other_than_the_loaders_is_refused(config_file, tmp_path):
    import lightning as L
    import torch

    from energon_platform import TrainLoader, load_config
    from energon_platform.integrations.lightning import EnergonHooks

    class Model(EnergonHooks, L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def train_dataloader(self):
            return TrainLoader(load_config(config_file))

        def training_step(self, batch, batch_idx):
            return self.w * batch.images.mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        accumulate_grad_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    with pytest.raises(ValueError, match="set accumulate_grad_batches=1"):
        trainer.fit(Model())


@pytest.mark.slow
def test_lightning_example_resumes_exactly_after_sigkill(config_file, tmp_path):
    """Lightning's own checkpoint and ckpt_path carry the loader (corrected for its one-batch
    prefetch); the resume that drops the loader state from the checkpoint fails. Each step logs
    its sample losses, whose target-weighted mean is the step's loss."""
    cmd = example("lightning_example.py", config_file, "--out {out} --steps 6")
    r, report = check_resume(tmp_path / "ok", cmd, cmd + " --resume", 6, 4)
    assert_exact_pass(r, report)
    assert_sample_losses_fit(report["logs"]["straight"], config_file)
    # the run folder records itself through the public record_run: the resume appended itself
    killed = json.loads((tmp_path / "ok" / "killed" / "out" / "run.json").read_text())
    assert killed["world_size"] == 1 and len(killed["resumes"]) == 1, killed
    assert "--resume" in killed["resumes"][0]["command"] and killed["datasets"]
    assert_fails(
        *check_resume(
            tmp_path / "broken",
            cmd,
            cmd + " --resume --skip-loader-restore",
            6,
            4,
            straight_from=tmp_path / "ok",
        )
    )


@pytest.mark.slow
@pytest.mark.parametrize("straight, resumed", [(2, 1), (1, 2)])
def test_lightning_ddp_resumes_exactly_on_another_number_of_processes(
    config_file, tmp_path, straight, resumed
):
    """DDP on CPU (gloo), killed, resumed with another number of processes: the same global batches
    (keys and row digests in the loader's global order), the loss within the all-reduce order's 1e-5."""
    # 8 steps, killed during step 4: DDP steps of this tiny model take about 30 ms, and on a
    # loaded machine the kill can land a few steps late; it must still land before the end
    cmd, resume = (
        example("lightning_example.py", config_file, "--out {out} --steps 8", nproc=n)
        for n in (straight, resumed)
    )
    r, report = check_resume(tmp_path / "ok", cmd, resume + " --resume", 8, 4, tolerance=1e-5)
    assert_exact_pass(r, report, loss_tolerance=1e-5)
    # killed during step 4: the resume is from checkpoint 2 or 3, or 4 when the kill let step 4's
    # checkpoint complete before its log line (check-resume accepts that)
    assert report["steps_compared"] >= 2
    assert_sample_losses_fit(report["logs"]["straight"], config_file)  # gathered in rank order


@pytest.mark.slow
def test_a_script_on_the_public_api_alone_resumes_exactly_after_sigkill(config_file, tmp_path):
    """scripts/examples/public_api_lightning.py: the documented names only (tests/project/test_public_api.py
    checks its imports) and Lightning's own ``ckpt_path="last"``; the same command resumes."""
    cmd = example("public_api_lightning.py", config_file, "--out {out} --steps 6")
    assert_exact_pass(*check_resume(tmp_path / "ok", cmd, cmd, 6, 4))
