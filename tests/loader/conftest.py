"""Runs the loader's test modules share: built once for the whole test run (`once_per_run`),
whichever test process asks first, and only read after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.once import once_per_run
from tests.helpers.run_configs import write_config


def _balanced_check(folder: Path) -> dict:
    """`check_resume` of our trainer on the packed 2:1:1 blend with ``balance: attention``:
    2 ranks x 2 workers, SIGKILL during step 5, resumed on 1 rank x 1 worker."""
    from energon_platform.training.resume_check import RunSpec, check_resume
    from scripts.bench.data import three_modality_blend
    from tests.helpers import REPO

    config = write_config(
        folder / "run.yaml",
        {
            "data": {"path": str(three_modality_blend(folder)), "val_split": None},
            "encoder": str(REPO / "configs/encoders/multimodal_packed.yaml"),
            "loader": {
                "global_batch_size": 4,
                "micro_batch_size": 1,
                "num_workers": 2,
                "seed": 11,
                "balance": "attention",
                "length_cache": str(folder / "lengths"),
            },
            "model": {"dim": 32, "layers": 1, "heads": 2, "patch": 16},
            "train": {"steps": 6, "checkpoint_every": 3, "warmup": 2},
        },
    )
    check_resume(
        RunSpec(str(config), 6, nproc=2),
        kill_at=5,
        out=folder / "check",
        resume_nproc=1,
        resume_workers=1,
        tolerance=1e-5,  # another world size sums the gradients in another order
        log=lambda *_: None,
    )
    return {"config": str(config), "check": str(folder / "check")}


@pytest.fixture
def balanced_check(tmp_path_factory) -> tuple[Path, Path, dict]:
    """The config, the check folder (``straight``, ``killed``: each a run's ``--out``) and the
    report of one balanced kill-and-resume check (`_balanced_check`), shared by the tests that
    read it: `test_balance` (the check passes, with the rank costs) and `test_trace_balance`
    (``trace`` of each run equals its log). A fresh trainer per run, as any check-resume."""
    paths = once_per_run(tmp_path_factory, "balanced_attention_check", _balanced_check)
    check = Path(paths["check"])
    return Path(paths["config"]), check, json.loads((check / "report.json").read_text())
