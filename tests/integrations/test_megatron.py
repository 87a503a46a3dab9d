"""energon_platform.integrations.megatron against a loop that makes Megatron-LM's calls in Megatron's order.

megatron-core needs CUDA, so ``megatron_run`` plays ``pretrain()`` on CPU: every data-parallel rank
calls the provider (``is_distributed``), the iterators are wrapped like ``RerunDataIterator``
(``next(iterable)``), each iteration makes ``global_batch // (micro × dp)`` ``next()`` calls per
rank, and at every ``save_interval``-th iteration boundary ``save_checkpoint`` saves each rank's
``iterable.save_state()`` into ``{dataloader_save}/iter_N/mp_rank_00/...``. A "crash" stops the
loop in the middle of an iteration; the resumed run builds fresh providers with the iteration of
the last checkpoint, as Megatron does after ``load_checkpoint`` sets ``args.iteration``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from energon_platform.config import load_config
from energon_platform.integrations.megatron import (
    IGNORE_INDEX,
    LayoutError,
    MegatronTrainIterator,
    StateMismatchError,
    is_dataloader_rank,
    latest_iteration,
    load_dataloader_state,
    make_provider,
    make_provider_from_args,
    provider_kwargs_from_args,
    sample_losses,
    save_dataloader_state,
    state_file,
    to_megatron_batch,
)
from energon_platform.training.model import document_losses
from tests.helpers import REPO
from tests.helpers.run_configs import loader_config

SMALL = str(REPO / "configs" / "encoders" / "image_text_small.yaml")
SMALL_PACKED = str(REPO / "configs" / "encoders" / "image_text_small_packed.yaml")
GLOBAL, MICRO, DP = 8, 2, 2  # 2 micro-batches per iteration on each of 2 data-parallel ranks


def megatron_config(coco: Path, encoder: str = SMALL, **loader):
    """The loaded loader config the provider gets: ``GLOBAL`` per batch, seed 1234, ``loader``."""
    return load_config(
        loader_config(coco, encoder, **{"global_batch_size": GLOBAL, "seed": 1234, **loader})
    )


class RerunDataIterator:
    """What ``build_train_valid_test_data_iterators`` wraps an external loader in (no replay here)."""

    def __init__(self, iterable):
        self.iterable = iterable

    def __next__(self):
        return next(self.iterable)


def megatron_run(
    cfg,
    dataloader_save: Path,
    *,
    start: int,
    stop: int,
    save_interval: int,
    dp: int = DP,
    gbs: int = GLOBAL,
    mbs: int = MICRO,
    crash_after: int | None = None,
    workers: tuple[int, ...] | None = None,
    **provider_kwargs,
) -> dict:
    """Iterations ``start+1 .. stop``; returns ``{(iteration, rank, micro): (batch dict, keys)}``.
    ``crash_after``: micro-batches of iteration ``stop`` read before the process "dies"."""
    restore = start if start > 0 else None
    ranks = []
    for rank in range(dp):
        provider = make_provider(
            cfg,
            dp_rank=rank,
            dp_size=dp,
            micro_batch_size=mbs,
            global_batch_size=gbs,
            num_workers=workers[rank] if workers else None,
            dataloader_save=dataloader_save,
            restore_iteration=restore,
            build_valid=False,
            **provider_kwargs,
        )
        assert provider.is_distributed
        train, valid, test = provider((stop * gbs, 0, 0))
        assert valid is None and test is None
        ranks.append(RerunDataIterator(train))
    num_microbatches = gbs // (mbs * dp)
    assert all(r.iterable.accumulation == num_microbatches for r in ranks)
    seen = {}
    for iteration in range(start + 1, stop + 1):
        # the ranks run concurrently in Megatron; order does not matter
        for rank, it in enumerate(ranks):
            for micro in range(num_microbatches):
                if crash_after is not None and iteration == stop and micro == crash_after:
                    break
                batch = next(it)
                seen[iteration, rank, micro] = (batch, list(it.iterable.last_keys))
        if crash_after is None or iteration < stop:
            if iteration % save_interval == 0:  # save_checkpoint → maybe_save_dataloader_state
                for rank, it in enumerate(ranks):
                    save_dataloader_state(it, dataloader_save, iteration, rank)
    for it in ranks:
        it.iterable.close()
    return seen


def assert_same_batch(a: dict, b: dict, where) -> None:
    assert a.keys() == b.keys(), where
    for name in a:
        if isinstance(a[name], torch.Tensor):
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), (where, name)
        else:
            assert a[name] == b[name], (where, name)


@pytest.mark.parametrize(
    "encoder,batch_format,workers",
    [
        (SMALL, "multimodal", (1, 0)),  # resumed with a worker process on rank 0 (saved with none)
        (SMALL_PACKED, "gpt", None),  # packing; GPT-style dicts
    ],
    ids=["multimodal", "gpt-packed"],
)
def test_resume_continues_exactly_like_an_uninterrupted_run(
    coco, tmp_path, encoder, batch_format, workers
):
    # Packed: 4 pack groups of 16 samples per iteration, one group per next().
    sizes = {"gbs": 4, "mbs": 1} if encoder == SMALL_PACKED else {"gbs": GLOBAL, "mbs": MICRO}
    cfg = megatron_config(coco, encoder, global_batch_size=sizes["gbs"])
    straight = megatron_run(
        cfg,
        tmp_path / "straight",
        start=0,
        stop=7,
        save_interval=100,
        batch_format=batch_format,
        **sizes,
    )
    save = tmp_path / "save"
    crashed = megatron_run(
        cfg,
        save,
        start=0,
        stop=6,
        save_interval=2,
        crash_after=1,
        batch_format=batch_format,
        **sizes,
    )
    assert sorted(p.name for p in save.iterdir()) == ["iter_0000002", "iter_0000004"]
    assert latest_iteration(save) == 4
    resumed = megatron_run(
        cfg,
        save,
        start=4,
        stop=7,
        save_interval=2,
        workers=workers,
        batch_format=batch_format,
        **sizes,
    )
    for where, (batch, keys) in crashed.items():  # before the crash: the same run
        assert keys == straight[where][1], where
        assert_same_batch(batch, straight[where][0], where)
    assert sorted(resumed) == sorted(k for k in straight if k[0] > 4)
    for where, (batch, keys) in resumed.items():
        assert keys == straight[where][1], where
        assert_same_batch(batch, straight[where][0], where)
    # An iteration is one global batch of distinct samples, split over the ranks. (The packed run
    # crosses the first epoch boundary, 286 samples, in iteration 5: after the resume.)
    it2 = [k for (i, r, m), (_, keys) in sorted(straight.items()) if i == 2 for k in keys]
    assert len(it2) == len(set(it2)) == sizes["gbs"] * (16 if encoder == SMALL_PACKED else 1)


def test_state_file_is_megatrons_layout_and_loads_without_pickle_code(coco, tmp_path):
    provider = make_provider(
        megatron_config(coco),
        dp_rank=1,
        dp_size=DP,
        micro_batch_size=MICRO,
        global_batch_size=GLOBAL,
        build_valid=False,
    )
    train, _, _ = provider(None)
    for _ in range(train.accumulation * 3):
        next(train)
    path = save_dataloader_state(RerunDataIterator(train), tmp_path, 3, 1)
    assert path == tmp_path / "iter_0000003" / "mp_rank_00" / "train_dataloader_dprank001.pt"
    assert state_file(tmp_path, 3, 1, pipeline_parallel=True).parent.name == "mp_rank_00_000"
    content = torch.load(path, weights_only=True)  # what Megatron's own provider would read
    assert content == {"dataloader_state_dict": train.save_state()}
    state = content["dataloader_state_dict"]
    assert json.loads(json.dumps(state)) == state and state["next_microbatch"] == 6
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    # The same content as JSON is read too.
    as_json = tmp_path / "state.json"
    as_json.write_text(json.dumps(content))
    assert load_dataloader_state(as_json) == state == load_dataloader_state(path)
    # A pickle that needs code (e.g. an Energon savable-loader state) is refused, not executed.
    evil = tmp_path / "evil.pt"
    torch.save({"dataloader_state_dict": SimpleNamespace(x=1)}, evil)
    with pytest.raises(StateMismatchError, match="evil.pt"):
        load_dataloader_state(evil)
    train.close()


def test_restore_into_other_data_or_config_raises(coco, tmp_path):
    megatron_run(megatron_config(coco), tmp_path, start=0, stop=2, save_interval=2)

    def restore(cfg, **kwargs):
        provider = make_provider(
            cfg,
            dp_rank=0,
            dp_size=DP,
            micro_batch_size=MICRO,
            dataloader_save=tmp_path,
            restore_iteration=2,
            build_valid=False,
            **{"global_batch_size": GLOBAL, **kwargs},
        )
        return provider(None)

    with pytest.raises(StateMismatchError, match=r"dataset\.split: saved 'train', now 'val'"):
        restore(
            load_config(
                {
                    "data": {"path": str(coco), "train_split": "val"},
                    "encoder": SMALL,
                    "loader": {"global_batch_size": GLOBAL, "num_workers": 0},
                }
            )
        )
    with pytest.raises(StateMismatchError, match="seed"):
        restore(megatron_config(coco, seed=7))
    with pytest.raises(StateMismatchError, match="encoder.config_sha"):
        restore(
            load_config(
                {
                    "data": {"path": str(coco)},
                    "encoder": {"encoder": "image_text", "text": {"seq_len": 40}},
                    "loader": {"global_batch_size": GLOBAL, "num_workers": 0},
                }
            )
        )
    with pytest.raises(StateMismatchError, match="global_batch_size"):
        restore(megatron_config(coco), global_batch_size=16)
    train, _, _ = restore(megatron_config(coco))  # the unchanged config restores
    assert train.loader.global_batch == 2
    train.close()


def test_missing_state_raises_naming_the_path(coco, tmp_path):
    megatron_run(megatron_config(coco), tmp_path, start=0, stop=2, save_interval=2)
    provider = make_provider(
        megatron_config(coco),
        dp_rank=1,
        dp_size=DP,
        micro_batch_size=MICRO,
        global_batch_size=GLOBAL,
        dataloader_save=tmp_path,
        restore_iteration=3,
        build_valid=False,
    )
    expected = str(tmp_path / "iter_0000003" / "mp_rank_00" / "train_dataloader_dprank001.pt")
    with pytest.raises(FileNotFoundError) as e:
        provider(None)
    assert expected in str(e.value)
    # a rank's file lost
    (tmp_path / "iter_0000002" / "mp_rank_00" / "train_dataloader_dprank001.pt").unlink()
    with pytest.raises(FileNotFoundError, match="dprank001.pt does not exist"):
        make_provider(
            megatron_config(coco),
            dp_rank=1,
            dp_size=DP,
            micro_batch_size=MICRO,
            global_batch_size=GLOBAL,
            dataloader_save=tmp_path,
            restore_iteration="latest",
            build_valid=False,
        )(None)
    with pytest.raises(FileNotFoundError, match="no iter_NNNNNNN folder"):
        make_provider(
            megatron_config(coco),
            dp_rank=0,
            dp_size=DP,
            dataloader_save=tmp_path / "empty",
            restore_iteration="latest",
            build_valid=False,
        )(None)
    with pytest.raises(ValueError, match="needs dataloader_save"):
        make_provider(megatron_config(coco), dp_rank=0, dp_size=DP, restore_iteration=2)


def test_restore_on_another_data_parallel_size_continues_the_same_global_batches(coco, tmp_path):
    straight = megatron_run(
        megatron_config(coco), tmp_path / "a", start=0, stop=4, save_interval=100
    )
    megatron_run(
        megatron_config(coco), tmp_path / "b", start=0, stop=3, save_interval=2, crash_after=0
    )
    one = megatron_run(
        megatron_config(coco), tmp_path / "b", start=2, stop=4, save_interval=100, dp=1
    )
    for iteration in (3, 4):
        want = [
            k for (i, r, m), (_, keys) in sorted(straight.items()) if i == iteration for k in keys
        ]
        got = [k for (i, r, m), (_, keys) in sorted(one.items()) if i == iteration for k in keys]
        assert got == want
    # Growing to 4: ranks 0 and 1 continue from their own files, ranks 2 (the first without one)
    # and 3 from rank 0's position; every rank takes its quarter of iterations 3 and 4.
    for rank in range(4):
        four = make_provider(
            megatron_config(coco),
            dp_rank=rank,
            dp_size=4,
            micro_batch_size=1,
            global_batch_size=GLOBAL,
            dataloader_save=tmp_path / "b",
            restore_iteration=2,
            build_valid=False,
        )(None)[0]
        assert four.loader.global_batch == 2 and four.accumulation == 2, rank
        for iteration in (3, 4):
            keys = []
            for _ in range(four.accumulation):
                next(four)
                keys += four.last_keys
            want = [
                k for (i, r, m), (_, ks) in sorted(straight.items()) if i == iteration for k in ks
            ]
            assert keys == want[2 * rank : 2 * rank + 2], (rank, iteration)
        four.close()
    # A state saved in the middle of an iteration (Megatron never does) continues only on its own layout.
    mid = make_provider(
        megatron_config(coco),
        dp_rank=0,
        dp_size=DP,
        micro_batch_size=MICRO,
        global_batch_size=GLOBAL,
        build_valid=False,
    )(None)[0]
    next(mid)
    save_dataloader_state(mid, tmp_path / "c", 1, 0)
    mid.close()
    with pytest.raises(LayoutError, match="middle of a global batch"):
        make_provider(
            megatron_config(coco),
            dp_rank=0,
            dp_size=1,
            micro_batch_size=MICRO,
            global_batch_size=GLOBAL,
            dataloader_save=tmp_path / "c",
            restore_iteration=1,
            build_valid=False,
        )(None)


def test_only_megatrons_data_ranks_build_iterators(tmp_path):
    assert (
        is_dataloader_rank(0, 0, 1) and is_dataloader_rank(0, 3, 4) and is_dataloader_rank(0, 0, 4)
    )
    assert (
        not is_dataloader_rank(1, 0, 1)
        and not is_dataloader_rank(0, 1, 4)
        and not is_dataloader_rank(0, 2, 4)
    )
    # Nothing is read on other ranks: not even the config or the state files.
    provider = make_provider(
        tmp_path / "no-such-config.yaml",
        dp_rank=0,
        dp_size=2,
        is_data_rank=False,
        dataloader_save=tmp_path,
        restore_iteration=5,
    )
    assert provider.is_distributed and provider((100, 10, 10)) == (None, None, None)
    args = SimpleNamespace(
        micro_batch_size=MICRO,
        global_batch_size=GLOBAL,
        num_workers=1,
        dataloader_save=None,
        load=None,
        iteration=0,
        data_parallel_size=2,
        pipeline_model_parallel_size=4,
        eval_iters=3,
    )
    for tp, pp in ((1, 0), (0, 1), (0, 2)):
        provider = make_provider_from_args(
            tmp_path / "no-such-config.yaml", args, dp_rank=0, tp_rank=tp, pp_rank=pp
        )
        assert provider(None) == (None, None, None)


def test_megatron_args_helper(coco, tmp_path):
    args = SimpleNamespace(
        micro_batch_size=MICRO,
        global_batch_size=GLOBAL,
        num_workers=0,
        dataloader_save=str(tmp_path),
        load=str(tmp_path / "ckpt"),
        iteration=2,
        data_parallel_size=DP,
        eval_iters=1,
        pipeline_model_parallel_size=1,
    )
    assert provider_kwargs_from_args(args) == {
        "micro_batch_size": MICRO,
        "global_batch_size": GLOBAL,
        "num_workers": 0,
        "dataloader_save": str(tmp_path),
        "dp_size": DP,
        "eval_iters": 1,
        "restore_iteration": 2,
    }
    fresh = provider_kwargs_from_args(SimpleNamespace(**{**vars(args), "load": None}))
    assert fresh["restore_iteration"] is None
    # Megatron resumed a model checkpoint (args.load, iteration 2) but has no --dataloader-save:
    # its provider would restart the data; ours refuses.
    with pytest.raises(ValueError, match="needs dataloader_save"):
        make_provider_from_args(
            megatron_config(coco),
            SimpleNamespace(**{**vars(args), "dataloader_save": None}),
            dp_rank=0,
        )
    megatron_run(megatron_config(coco), tmp_path, start=0, stop=2, save_interval=2)
    train, valid, test = make_provider_from_args(megatron_config(coco), args, dp_rank=1)(None)
    assert train.loader.global_batch == 2 and train.loader.rank == 1 and test is None
    train.close()
    # Validation: Energon's val loader, this rank's share, the same batches at every evaluation.
    first = [next(valid) for _ in range(train.accumulation)]
    again = [next(valid) for _ in range(train.accumulation)]
    for a, b in zip(first, again):
        assert_same_batch(a, b, "valid")
    assert first[0]["tokens"].shape == (MICRO, 48) and first[0]["imgs"].shape == (MICRO, 3, 64, 64)
    assert valid.save_state() is None


def _megatron_multimodal_get_batch(data: dict, pad: int):
    """What examples/multimodal/train.py get_batch does with the dict (CPU, no broadcast)."""
    tokens = data["tokens"]
    labels = data["labels"][:, 1 : tokens.shape[1] + 1]
    loss_mask = torch.ones(labels.shape, dtype=torch.float)
    loss_mask[labels == pad] = 0.0
    loss_mask[labels == IGNORE_INDEX] = 0.0
    packed = data["cu_lengths"].shape != (1, 1)
    if packed:
        assert data["cu_lengths"].shape[0] == data["max_lengths"].shape[0] == 1, (
            "micro-batch-size must be 1"
        )
    no_images = data["imgs"].shape == (1, 1)
    return tokens, labels, loss_mask, packed, no_images


def _merged_cu_seqlens(cu: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Megatron's merge of per-row GPT cu_seqlens into one flat row (written from its docstring)."""
    parts = []
    for i, row in enumerate(cu):
        end = int((row == seq_len).nonzero()[0]) + 1
        parts.append(row[:end] + i * seq_len if i == 0 else row[1:end] + i * seq_len)
    return torch.cat(parts)


def test_batch_dicts_match_megatrons_get_batch(coco):
    pad = 0
    plain = make_provider(
        megatron_config(coco),
        dp_rank=0,
        dp_size=1,
        micro_batch_size=MICRO,
        global_batch_size=GLOBAL,
        build_valid=False,
    )(None)[0]
    raw = next(plain.loader)
    plain.close()
    data = to_megatron_batch(raw, "multimodal")
    assert set(data) == {
        "tokens",
        "labels",
        "imgs",
        "num_tiles",
        "cu_lengths",
        "max_lengths",
        "__key__",
    }
    n, s = raw.tokens.shape
    for name, dtype, shape in (
        ("tokens", torch.int64, (n, s)),
        ("labels", torch.int64, (n, s + 1)),
        ("imgs", torch.float32, tuple(raw.images.shape)),
        ("num_tiles", torch.int32, (n,)),
        ("cu_lengths", torch.int32, (1, 1)),
        ("max_lengths", torch.int32, (1, 1)),
    ):
        assert data[name].dtype == dtype and tuple(data[name].shape) == shape, name
    assert data["__key__"] == raw.keys and torch.equal(data["imgs"], raw.images)
    tokens, labels, loss_mask, packed, no_images = _megatron_multimodal_get_batch(data, pad)
    assert torch.equal(loss_mask, raw.loss_mask) and not packed and not no_images
    assert torch.equal(labels[raw.loss_mask > 0], raw.labels[raw.loss_mask > 0])
    assert int(data["cu_lengths"].sum()) == 0 and int(data["max_lengths"].sum()) == 0
    gpt = to_megatron_batch(raw, "gpt")  # unpacked: one segment [0, S] per row
    assert torch.equal(gpt["cu_seqlens"], torch.tensor([[0] + [s] * s] * n, dtype=torch.int32))
    assert torch.equal(gpt["max_seqlen"], torch.full((n,), s, dtype=torch.int32))

    # Text only: [[0]] marks the absent images.
    text = SimpleNamespace(
        **{
            f: getattr(raw, f)
            for f in (
                "keys",
                "tokens",
                "labels",
                "loss_mask",
                "position_ids",
                "cu_seqlens",
                "max_seqlen",
                "num_docs",
                "doc_lengths",
            )
        }
    )
    data = to_megatron_batch(text, "multimodal")
    assert data["imgs"].shape == (1, 1) and data["imgs"].dtype == torch.float32
    assert data["num_tiles"].shape == (1, 1) and data["num_tiles"].dtype == torch.int32
    assert _megatron_multimodal_get_batch(data, pad)[4]

    # Packed: one flattened sequence per micro-batch, cu_lengths (1, D+1), max_lengths (1,).
    packed_it = make_provider(
        megatron_config(coco, SMALL_PACKED, global_batch_size=2),
        dp_rank=0,
        dp_size=1,
        micro_batch_size=1,
        build_valid=False,
    )(None)[0]
    raw = next(packed_it.loader)
    packed_it.close()
    assert (raw.num_docs > 1).any()
    data = to_megatron_batch(raw, "multimodal", packed=True)
    n, s = raw.tokens.shape
    d = len(raw.keys)
    assert data["tokens"].shape == (1, n * s) and data["labels"].shape == (1, n * s + 1)
    assert data["cu_lengths"].dtype == torch.int32 and data["cu_lengths"].shape == (1, d + 1)
    assert data["max_lengths"].dtype == torch.int32 and data["max_lengths"].shape == (1,)
    assert (
        torch.equal(data["cu_lengths"][0], raw.cu_seqlens)
        and int(data["max_lengths"][0]) == raw.max_seqlen
    )
    assert data["imgs"].shape[0] == d and torch.equal(
        data["num_tiles"], torch.ones(d, dtype=torch.int32)
    )
    tokens, labels, loss_mask, packed, _ = _megatron_multimodal_get_batch(data, pad)
    assert packed and torch.equal(loss_mask, raw.loss_mask.reshape(1, -1))
    with pytest.raises(ValueError, match="several documents"):
        to_megatron_batch(raw, "multimodal", packed=False)

    # GPT: per-row cu_seqlens padded with S, as Megatron's SFT dataset makes them.
    data = to_megatron_batch(raw, "gpt")
    assert set(data) == {
        "tokens",
        "labels",
        "loss_mask",
        "position_ids",
        "cu_seqlens",
        "max_seqlen",
    }
    for name, dtype, shape in (
        ("tokens", torch.int64, (n, s)),
        ("labels", torch.int64, (n, s)),
        ("loss_mask", torch.float32, (n, s)),
        ("position_ids", torch.int64, (n, s)),
        ("cu_seqlens", torch.int32, (n, s + 1)),
        ("max_seqlen", torch.int32, (n,)),
    ):
        assert data[name].dtype == dtype and tuple(data[name].shape) == shape, name
    assert torch.equal(_merged_cu_seqlens(data["cu_seqlens"], s), raw.cu_seqlens)
    assert int(data["max_seqlen"].max()) == raw.max_seqlen
    assert torch.equal(data["labels"], raw.labels) and torch.equal(
        data["position_ids"], raw.position_ids
    )
    with pytest.raises(ValueError, match="batch format"):
        to_megatron_batch(raw, "llava")
    audio = SimpleNamespace(**vars(text), features=torch.zeros(n, 4, 5))
    with pytest.raises(ValueError, match="features"):
        to_megatron_batch(audio, "multimodal")


def test_sample_losses_are_each_documents_mean_over_its_own_targets_in_every_layout(coco):
    """Unpacked and packed micro-batches, multimodal and gpt dicts: the reference trainer's
    document_losses of the same per-token losses, in key order; a loss that does not fit the
    batch is refused."""
    for encoder, loader, micro in ((SMALL, {}, MICRO), (SMALL_PACKED, {"global_batch_size": 2}, 1)):
        it = make_provider(
            megatron_config(coco, encoder, **loader),
            dp_rank=0,
            dp_size=1,
            micro_batch_size=micro,
            build_valid=False,
        )(None)[0]
        raw = next(it.loader)
        it.close()
        token_loss = torch.rand(raw.tokens.shape, generator=torch.Generator().manual_seed(0))
        expected = document_losses(
            (token_loss * raw.loss_mask).flatten(), raw.loss_mask, raw.position_ids, raw.num_docs
        )
        assert expected.shape == (len(raw.keys),)
        data = to_megatron_batch(raw, "multimodal")
        shifted = token_loss.reshape(data["labels"][:, 1:].shape)
        assert torch.allclose(sample_losses(data, shifted), expected, equal_nan=True), encoder
        gpt = to_megatron_batch(raw, "gpt")
        assert torch.allclose(sample_losses(gpt, token_loss), expected, equal_nan=True), encoder
    assert (raw.num_docs > 1).any()  # the second batch was packed
    with pytest.raises(ValueError, match="cu_lengths ends at"):
        sample_losses(data, token_loss, raw.loss_mask)
    with pytest.raises(ValueError, match="pass the model's loss_mask"):
        sample_losses(data, token_loss)


def test_layout_that_megatron_cannot_step_raises(coco):
    with pytest.raises(LayoutError):
        make_provider(
            megatron_config(coco),
            dp_rank=0,
            dp_size=3,
            micro_batch_size=1,
            global_batch_size=GLOBAL,
            build_valid=False,
        )(None)
    it = make_provider(
        megatron_config(coco),
        dp_rank=0,
        dp_size=2,
        micro_batch_size=4,
        global_batch_size=GLOBAL,
        build_valid=False,
    )(None)[0]
    assert isinstance(it, MegatronTrainIterator) and it.accumulation == 1
    it.close()


def test_balanced_packed_batches_have_one_shape_on_every_rank_and_resume_exactly(coco, tmp_path):
    """``loader.balance``: the provider emits GPT dicts of exactly micro_batch_size rows of seq_len
    (``cu_seqlens`` per row) on every data-parallel rank, every iteration, so Megatron with TP > 1,
    pipeline parallelism or CUDA graphs gets the same shape everywhere; a restore continues exactly."""
    cfg = megatron_config(
        coco,
        SMALL_PACKED,
        global_batch_size=4,
        balance="tokens",
        length_cache=str(tmp_path / "lengths"),
    )
    straight = megatron_run(
        cfg,
        tmp_path / "straight",
        start=0,
        stop=5,
        save_interval=100,
        gbs=4,
        mbs=1,
        batch_format="gpt",
    )
    shapes = {
        (tuple(b["tokens"].shape), tuple(b["cu_seqlens"].shape)) for b, _ in straight.values()
    }
    seq_len = next(iter(straight.values()))[0]["tokens"].shape[1]
    assert shapes == {((1, seq_len), (1, seq_len + 1))}
    assert any(len(keys) > 1 for _, keys in straight.values()), "rows hold several documents"
    save = tmp_path / "save"
    megatron_run(
        cfg, save, start=0, stop=4, save_interval=2, crash_after=0, gbs=4, mbs=1, batch_format="gpt"
    )
    resumed = megatron_run(
        cfg, save, start=2, stop=5, save_interval=100, gbs=4, mbs=1, batch_format="gpt"
    )
    for where, (batch, keys) in resumed.items():
        assert keys == straight[where][1], where
        assert_same_batch(batch, straight[where][0], where)
