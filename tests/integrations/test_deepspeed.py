"""DeepSpeed: the loader state in ``save_checkpoint(client_state=...)``/``load_checkpoint``,
DeepSpeed's batch arithmetic from the loader, and scripts/examples/deepspeed_example.py (ZeRO on
CPU with gloo) resuming exactly after SIGKILL, on 1 process and with ZeRO-2 on 2."""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")

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
        tmp_path_factory.getbasetemp(),
        tmp_path_factory.mktemp("deepspeed") / "run.yaml",
        micro_batch_size=1,
    )


def test_batch_config_and_client_state(config_file):
    from energon_platform import TrainLoader, load_config
    from energon_platform.integrations.deepspeed import (
        KEY,
        batch_config,
        client_state,
        restore_loader,
    )

    # 4 per global batch, 1 per micro-batch
    loader = TrainLoader(load_config(config_file), rank=1, world_size=2)
    assert batch_config(loader) == {
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 2,
    }
    next(loader), next(loader)
    state = client_state(loader, step=1)
    assert state == {KEY: loader.state_dict(), "step": 1}
    again = TrainLoader(load_config(config_file), rank=1, world_size=2)
    assert restore_loader(again, state) and again.next_microbatch == 2
    assert not restore_loader(again, None)  # load_checkpoint found no checkpoint
    with pytest.raises(KeyError, match="not saved with client_state"):
        restore_loader(again, {"step": 1})


def test_deepspeeds_cpu_communication_op_was_compiled_at_install():
    """`make` builds DeepSpeed with DS_BUILD_SHM_COMM=1: otherwise the first DeepSpeed process of
    every new environment JIT-compiles the op (about a minute of CPU inside a timed test)."""
    from deepspeed.git_version_info import installed_ops

    assert installed_ops.get("deepspeed_shm_comm"), (
        "DeepSpeed was installed without its shm op: run `make venv` (see the Makefile)"
    )


@pytest.mark.slow
def test_deepspeed_example_resumes_exactly_after_sigkill(config_file, tmp_path):
    """One process, ZeRO-1, micro-batches of one sample (DeepSpeed's gradient accumulation); the
    loss is the mean of the micro-batches' token means, so of the sample losses."""
    cmd = example("deepspeed_example.py", config_file, "--out {out} --steps 6")
    r, report = check_resume(tmp_path / "ok", cmd, cmd + " --resume", 6, 4)
    assert_exact_pass(r, report)
    assert_sample_losses_fit(report["logs"]["straight"], config_file, group=1)
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
def test_deepspeed_zero2_two_processes_resumes_exactly(config_file, tmp_path):
    cmd = example(
        "deepspeed_example.py", config_file, "--out {out} --steps 6 --zero-stage 2", nproc=2
    )
    r, report = check_resume(tmp_path / "ok", cmd, cmd + " --resume", 6, 4)
    assert_exact_pass(r, report)
    assert_sample_losses_fit(report["logs"]["straight"], config_file, group=1)
