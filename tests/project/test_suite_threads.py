"""The suite's threads (``tests/conftest.py``): one compute thread per process, children included."""

from __future__ import annotations

import os


def test_the_suite_runs_torch_and_its_children_on_the_threads_it_set():
    import torch

    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        assert os.environ.get(name), f"{name} is not set for the suite and its children"
    # set before torch loaded here: its OpenMP read it (a child reads the same environment)
    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])
