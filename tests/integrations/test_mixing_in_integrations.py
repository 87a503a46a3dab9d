"""Online mixing (``loader.blend_adapt``) through the integrations: the Lightning example reports
its losses on every rank and resumes exactly from 2 ranks to 1 with weights that moved;
Lightning's ``EnergonHooks.report_losses``, Megatron's ``MegatronTrainIterator.report_losses`` and
``DCPLoader.report_losses`` each hand the loader one report per global step, numbered by global
batch, with every micro-batch's keys and losses of the rank."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scripts.bench.data import three_modality_blend
from tests.helpers import REPO
from tests.helpers.run_configs import loader_config, write_config
from tests.helpers.trainer_examples import assert_exact_pass, check_resume, example

MULTIMODAL = str(REPO / "configs/encoders/multimodal.yaml")
ADAPT = {"method": "loss_ratio", "every": 2, "lag": 2}


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    return three_modality_blend(tmp_path_factory.mktemp("mixing_integrations"))


def config(blend, **loader):
    loader = {"global_batch_size": 8, "blend_adapt": ADAPT, **loader}
    return loader_config({"path": str(blend), "val_split": None}, MULTIMODAL, **loader)


def recorded(loader) -> list[tuple[int, list[str], int]]:
    """Every ``loader.report_losses`` call from now on, as (step, keys, number of losses); the
    calls still reach the loader."""
    calls, report = [], loader.report_losses

    def record(step, keys, losses, group=None):
        calls.append((step, list(keys), len(losses)))
        report(step, keys, losses, group)

    loader.report_losses = record
    return calls


def fake_loss(key: str) -> float:
    return {"coco_mini": 5.0, "librispeech_mini": 1.0, "text_mini": 2.5}[key.split(":")[0]]


@pytest.mark.slow
def test_lightning_example_with_an_adaptive_blend_resumes_exactly_from_two_ranks_to_one(
    blend, tmp_path
):
    """DDP on 2 processes, killed, resumed on 1: the same global batches (keys, row digests) and
    losses within the all-reduce order's 1e-5, with weights that the reported losses moved."""
    pytest.importorskip("lightning")
    run = write_config(tmp_path / "run.yaml", config(blend))
    cmd, resume = (
        example("lightning_example.py", run, "--out {out} --steps 8", nproc=n) for n in (2, 1)
    )
    r, report = check_resume(tmp_path / "check", cmd, resume + " --resume", 8, 5, tolerance=1e-5)
    assert_exact_pass(r, report, loss_tolerance=1e-5)
    assert report["steps_compared"] >= 2
    # the weights moved: the resumed run's last checkpoint holds the segments the mixer decided
    import torch

    ckpt = torch.load(
        tmp_path / "check" / "killed" / "out" / "checkpoints" / "step=8.ckpt", weights_only=True
    )
    (saved,) = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert len(saved["blend"]) > 1, saved["blend"]
    assert saved["blend_adapt"]["next_step"] == 8


def test_lightning_hook_reports_once_per_global_step_past_the_prefetched_batch(blend):
    """Two micro-batches per global step, Lightning's fetcher one batch ahead: the hook, called
    in every training_step, reports each global step once with both micro-batches."""
    from energon_platform import TrainLoader, load_config
    from energon_platform.integrations.lightning import EnergonHooks

    loader = TrainLoader(load_config(config(blend, global_batch_size=4, micro_batch_size=2)))
    assert loader.accumulation == 2
    calls = recorded(loader)
    fetcher = SimpleNamespace(batches=[])
    module = EnergonHooks()
    module.trainer = SimpleNamespace(
        train_dataloader=loader, fit_loop=SimpleNamespace(_data_fetcher=fetcher)
    )
    fetcher.batches.append(next(loader))
    trained = []
    for _ in range(8):  # Lightning's loop: pop one, fetch the next, train the popped one
        batch = fetcher.batches.pop(0)
        fetcher.batches.append(next(loader))
        trained.append(list(batch.keys))
        module.report_losses(batch.keys, [fake_loss(k) for k in batch.keys])
    assert [c[0] for c in calls] == [0, 1, 2, 3]
    assert [c[1] for c in calls] == [trained[i] + trained[i + 1] for i in range(0, 8, 2)]
    assert all(n == 4 for _, _, n in calls)
    assert len(loader.plan.blend.segments) > 1  # step 1's update decided new weights
    loader.close()


def test_megatron_iterator_and_dcp_loader_report_per_global_step(blend):
    from energon_platform import TrainLoader, load_config
    from energon_platform.integrations.dcp import DCPLoader
    from energon_platform.integrations.megatron import MegatronTrainIterator

    # (the blend's audio does not travel in Megatron's batch dicts: micro-batches drawn from the
    # loader itself; the iterator counts reports, not next() calls)
    train = MegatronTrainIterator(TrainLoader(load_config(config(blend, micro_batch_size=4))))
    assert train.accumulation == 2
    calls = recorded(train.loader)
    drawn = []
    for _ in range(6):  # Megatron's loss_func, once per micro-batch
        keys = next(train.loader).keys
        drawn += keys
        train.report_losses(keys, [fake_loss(k) for k in keys])
    assert [(s, k) for s, k, _ in calls] == [(i, drawn[8 * i : 8 * i + 8]) for i in range(3)]
    train.close()

    loader = DCPLoader(TrainLoader(load_config(config(blend))))
    calls = recorded(loader.loader)
    for _ in range(2):
        step = loader.global_batch
        keys = next(loader).keys
        loader.report_losses(step, keys, [fake_loss(k) for k in keys])
    assert [s for s, _, _ in calls] == [0, 1] and len(loader.loader.plan.blend.segments) > 1
    loader.close()
