"""``cpu_megatron``: megatron-core's one-rank CPU set-up is entered and left cleanly.

A file of its own: ``test_megatron_llava.py`` keeps the set-up entered for its whole module, and
this checks what entering and leaving it changes from a process where it was never entered.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "megatron.core", reason="megatron-core is a test dependency (pip install -e '.[test]')"
)

from energon_platform.integrations.megatron import cpu_megatron  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.helpers.cli import run_cli  # noqa: E402
from tests.helpers.run_configs import loader_config, write_config  # noqa: E402


def megatron_globals() -> tuple:
    """What ``cpu_megatron`` may change: the patched attributes, ``Tensor.cuda``, the process
    group and model parallel."""
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.models.vision.clip_vit_model as clip_vit_model
    import megatron.core.tensor_parallel.random as mrandom
    import megatron.core.utils as mutils
    import torch.distributed as dist
    from megatron.core import parallel_state

    return (
        mrandom._CUDA_RNG_STATE_TRACKER,
        mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED,
        mutils.GlobalMemoryBuffer.get_tensor,
        fused_softmax.get_default_causal_mask,
        clip_vit_model.CLIPViTModel.__init__.__defaults__,
        torch.Tensor.cuda,
        dist.is_initialized(),
        parallel_state.model_parallel_is_initialized(),
    )


def runs_on_the_cpu() -> bool:
    """The patched code paths work without CUDA: RNG fork, memory buffer, causal mask, ViT norm."""
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.models.vision.clip_vit_model as clip_vit_model
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    with tensor_parallel.get_cuda_rng_tracker().fork():
        pass
    buffer = parallel_state.get_global_memory_buffer().get_tensor((2, 3), torch.float32, "x")
    mask = fused_softmax.get_default_causal_mask(3)
    assert buffer.device.type == mask.device.type == "cpu" and mask.tolist()[0] == [0, 1, 1]
    return WrappedTorchNorm in clip_vit_model.CLIPViTModel.__init__.__defaults__


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "cuda-available"])
def test_cpu_megatron_restores_everything_and_patches_only_without_cuda(cuda, monkeypatch):
    import torch.distributed as dist
    from megatron.core import parallel_state

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    before = megatron_globals()
    assert not before[6] and not before[7]  # nothing set up yet in this process
    with cpu_megatron():
        inside = megatron_globals()
        assert dist.get_world_size() == 1 and dist.get_backend() == "gloo"
        assert parallel_state.get_tensor_model_parallel_world_size() == 1
        assert parallel_state.get_pipeline_model_parallel_world_size() == 1
        if not cuda:
            assert runs_on_the_cpu()
    assert megatron_globals() == before
    assert inside[5] == before[5]  # Tensor.cuda is patched only while tiny_llava builds
    if cuda:  # on a GPU: one rank, no patch
        assert inside[:5] == before[:5]
    else:
        assert all(inside[i] != before[i] for i in (0, 2, 3, 4)) and inside[1] is True


def test_calibrate_without_megatron_core_is_one_line_naming_the_install(
    image_text_shards, tmp_path
):
    """A ``megatron.core`` that cannot be imported, first on the path, stands for a missing
    install (``megatron`` is a namespace package shared with ``megatron.energon``)."""
    import os

    (tmp_path / "shadow" / "megatron" / "core").mkdir(parents=True)
    (tmp_path / "shadow" / "megatron" / "core" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'megatron.core'\")\n"
    )
    config = write_config(
        tmp_path / "run.yaml",
        loader_config(image_text_shards, REPO / "configs/encoders/image_text_vlm_small.yaml"),
    )
    path = os.pathsep.join([str(tmp_path / "shadow"), os.environ.get("PYTHONPATH", ""), str(REPO)])
    done = run_cli(
        "calibrate",
        *("--config", config, "--out", tmp_path / "c.json", "--no-progress"),
        *("--model", "energon_platform.integrations.megatron.llava:calibration_model"),
        env={**os.environ, "PYTHONPATH": path},
        timeout=120,
    )
    assert done.returncode == 2 and not (tmp_path / "c.json").exists(), done.stderr
    assert done.stderr.count("\n") == 1 and "pip install megatron-core" in done.stderr, done.stderr
