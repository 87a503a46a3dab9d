"""task_encoders.seeding: seeds from (run seed, key, epoch) only; global RNGs untouched."""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from task_encoders.seeding import (
    derive_seed,
    make_generator,
    sample_epoch,
    sample_key,
    seeded_global_torch,
)


def sample(key="000123", subflavors=None):
    return SimpleNamespace(__key__=key, __subflavors__=subflavors)


def test_derive_seed_is_stable_63_bit_and_sensitive_to_each_input():
    base = derive_seed(1234, "000123", 0)
    assert base == derive_seed(1234, "000123", 0)
    assert 0 <= base < 2**63
    # Pinned: the seed must not change between releases, or resumed runs change augmentation.
    assert base == 2312940371684387062
    variants = {
        derive_seed(1235, "000123", 0),
        derive_seed(1234, "000124", 0),
        derive_seed(1234, "000123", 1),
        derive_seed(1234, "000123", 0, "image"),
    }
    assert base not in variants and len(variants) == 4


def test_sample_key_ignores_any_path_prefix():
    assert sample_key(sample("000123")) == "000123"
    assert sample_key(sample("train/shard-000000.tar/000123")) == "000123"
    with pytest.raises(ValueError):
        sample_key(sample(None))


def test_sample_epoch_reads_subflavors():
    assert sample_epoch(sample(subflavors=None)) == 0
    assert sample_epoch(sample(subflavors={})) == 0
    assert sample_epoch(sample(subflavors={"epoch": 3, "other": 1})) == 3
    for bad in (-1, "1", True, 1.0):
        with pytest.raises(ValueError):
            sample_epoch(sample(subflavors={"epoch": bad}))


def test_seeded_global_torch_matches_manual_seed_and_restores_state():
    torch.manual_seed(99)
    before = torch.get_rng_state()
    with seeded_global_torch(7):
        inside = torch.rand(5)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(inside, make_generator_draw(7))
    with pytest.raises(RuntimeError):
        with seeded_global_torch(7):
            raise RuntimeError("boom")
    assert torch.equal(torch.get_rng_state(), before)


def make_generator_draw(seed):
    return torch.rand(5, generator=make_generator(seed))


def test_encoding_leaves_global_rngs_untouched(image_text_encoder, audio_text_encoder, raw_samples):
    work = [(image_text_encoder, s) for s in raw_samples("image_text")[:3]]
    work += [(audio_text_encoder, s) for s in raw_samples("audio_text")[:3]]
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    states = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    for encoder, s in work:
        encoder.encode_sample(s)
    assert torch.equal(torch.get_rng_state(), states[0])
    assert np.array_equal(np.random.get_state()[1], states[1])
    assert random.getstate() == states[2]


def test_single_intra_op_thread_restores_the_thread_count():
    from task_encoders.seeding import single_intra_op_thread

    before = torch.get_num_threads()
    torch.set_num_threads(3)  # not 1 (the suite's default): a restore must be seen to happen
    try:
        with single_intra_op_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_encoding_runs_on_one_intra_op_thread_whatever_the_process_has(
    image_text_encoder, raw_samples, monkeypatch
):
    # float kernels split work by thread count: a sample encoded in the main process (0 workers)
    # must get the tensors a DataLoader worker (1 thread) gives it; the suite itself runs on one
    # thread (tests/conftest.py), so the process is given more here
    seen, encode = [], image_text_encoder.encode
    monkeypatch.setattr(
        image_text_encoder, "encode", lambda s: (seen.append(torch.get_num_threads()), encode(s))[1]
    )
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        image_text_encoder.encode_sample(raw_samples("image_text")[0])
        assert seen == [1] and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
