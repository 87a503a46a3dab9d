"""Shared pytest fixtures. One section per owner; keep each section's helpers private to it."""

from __future__ import annotations

import os

# --- the run's threads ------------------------------------------------------------------------------

# One compute thread per process (this test process and every child it starts), as `torchrun` sets
# for its ranks. ``make test`` runs three test processes on two cores, each starting trainers; with
# torch's (OpenMP's) and numpy's (OpenBLAS's) default of one thread per core, their idle threads
# spin for the cores the other processes need: on the kill-and-resume tests, about a fifth of the
# CPU. Set before anything imports torch or numpy: both read it once, when their library loads. A
# test that needs more threads sets them itself (`torch.set_num_threads`).
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

# --- the exit of the processes the tests start ------------------------------------------------------

# Every Python process the tests start imports ``tests/helpers/exit_hook/sitecustomize.py``
# (first on PYTHONPATH): it skips the interpreter's last full collection at exit, as
# ``energon-platform`` itself does (`collector.before_exit`); read that module for why and what
# it leaves as it was.
_EXIT_HOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers", "exit_hook")
if _EXIT_HOOK not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_EXIT_HOOK, os.environ.get("PYTHONPATH")) if p
    )

import io  # noqa: E402
import json  # noqa: E402
from collections.abc import Callable, Iterable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from converters.executor import environment_as_found  # noqa: E402
from tests.helpers import tiers  # noqa: E402
from tests.helpers.cli import PER_TEST  # noqa: E402

#: fixtures any test may ask for by name, one instance per test process (`s3_server`, `s3`,
#: `ray_cluster`)
pytest_plugins = ("tests.helpers.s3_server", "tests.helpers.ray_cluster")

# --- the environment of the test process ------------------------------------------------------------


@pytest.fixture(autouse=True)
def _environment_as_found():
    """Every test leaves this process's environment as it found it. Libraries used inside a test
    set variables of their own (megatron-core's language model sets ``NVTE_*_ATTN`` when it is
    built); the warm CLI server (`tests.helpers.cli`) runs a command only in the environment it
    started in, so one such variable would send every later command of this process to a fresh
    interpreter (slower), and fail the runner's own tests. The variables `tests.helpers.cli.PER_TEST`
    names are left as they are: libraries set them once, at import."""
    with environment_as_found(keep=PER_TEST):
        yield


# --- the two tiers (tests/helpers/tiers.py) -------------------------------------------------------


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks ``fast`` the tests `tests.helpers.tiers.FAST` names (before ``-m`` selects)."""
    if tiers.is_fast(item.nodeid):
        item.add_marker(pytest.mark.fast)


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(request):
    """A ``fast`` test fails if it starts a process (`tests.helpers.tiers.fast_test`)."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    with tiers.fast_test(request.node.nodeid):
        yield


# --- the order of the run ---------------------------------------------------------------------------


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test process starts with its share of the tests marked ``slow``.

    ``pytest -n N --dist worksteal`` (``make test``) hands process ``i`` the ``i``-th contiguous
    slice of this list (the first ``T // N`` tests, then ``(T - T // N) // (N - 1)`` of the rest,
    ...), and a process that runs out takes the back half of the longest queue. So the slow tests
    are dealt round-robin to the slices and put at the front of each: every process starts on
    minute-long kill-and-resume tests, and the short tests at the slices' backs are what moves
    between processes at the end. (Put all at the front of the list instead, one process would get
    them all and run them last, while the others wait.) Without xdist: slow tests first."""
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    fast = [item for item in items if item.get_closest_marker("slow") is None]
    ordered, left = [], len(items)
    for i in range(workers):
        size = left // (workers - i)
        mine = slow[i::workers]
        take = max(0, size - len(mine))
        ordered += mine + fast[:take]
        fast, left = fast[take:], left - size
    items[:] = ordered + fast


# --- task_encoders: tokenizer and small Energon datasets -----------------------------------------

SHIPPED_TOKENIZER = Path(__file__).resolve().parents[1] / "task_encoders" / "assets" / "tokenizer"
_WORDS = (
    "a small red cat sits on the green mat near two dogs while blue birds fly over an old "
    "wooden house by the river at night under bright stars and grey clouds"
).split()


def caption_for(index: int) -> str:
    """A deterministic caption of 3 to 17 words (varied lengths exercise packing)."""
    rng = np.random.default_rng(index)
    return " ".join(rng.choice(_WORDS, size=3 + index % 15))


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    """The shipped tokenizer (``scripts/build_tokenizer.py``): <pad>=0, <bos>=1, <eos>=2, <unk>=3."""
    assert (SHIPPED_TOKENIZER / "tokenizer.json").is_file(), f"missing {SHIPPED_TOKENIZER}"
    return SHIPPED_TOKENIZER


def _png(rng: np.random.Generator, height: int, width: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(
        buf, format="PNG"
    )
    return buf.getvalue()


def _flac(rng: np.random.Generator, seconds: float, rate: int) -> bytes:
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    wave = 0.3 * np.sin(2 * np.pi * rng.uniform(200, 800) * t) + 0.01 * rng.standard_normal(t.size)
    buf = io.BytesIO()
    soundfile.write(buf, wave.astype(np.float32), rate, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


def _image_item(index: int, broken: bool) -> tuple[str, bytes, str]:
    """(key, PNG bytes of 20-32 x 24-39 px, caption); the key is what the COCO converter makes."""
    rng = np.random.default_rng(index)
    return (
        f"{index:012d}",
        b"not a png" if broken else _png(rng, 20 + index % 3 * 6, 24 + index % 4 * 5),
        caption_for(index),
    )


def _audio_item(index: int, broken: bool) -> tuple[str, bytes, str]:
    """(key, FLAC of 0.25-0.45 s at 16 or 22.05 kHz, transcript); key as the LibriSpeech converter makes."""
    rng = np.random.default_rng(index)
    audio = (
        b"fLaC garbage"
        if broken
        else _flac(rng, 0.25 + 0.05 * (index % 5), (16000, 22050)[index % 2])
    )
    return f"9001-1-{index:04d}", audio, caption_for(index)


def _convert(kind: str, items: list[tuple[str, bytes, str]], raw: Path, out: Path) -> Path:
    """Lay ``items`` out as a raw COCO / LibriSpeech corpus and run the project's converter."""
    from converters.convert import ConvertOptions, run_conversion

    opts = ConvertOptions(out=str(out), samples_per_shard=8, progress=False)
    if kind == "image_text":
        (raw / "images").mkdir(parents=True)
        for key, data, _ in items:
            (raw / "images" / f"{key}.png").write_bytes(data)
        coco = {
            "images": [{"id": int(key), "file_name": f"{key}.png"} for key, _, _ in items],
            "annotations": [
                {"id": i, "image_id": int(key), "caption": text}
                for i, (key, _, text) in enumerate(items)
            ],
        }
        (raw / "captions.json").write_text(json.dumps(coco))
        outcome = run_conversion(
            "coco", {"annotations": str(raw / "captions.json"), "images": str(raw / "images")}, opts
        )
    else:
        chapter = raw / "9001" / "1"
        chapter.mkdir(parents=True)
        for key, data, _ in items:
            (chapter / f"{key}.flac").write_bytes(data)
        (chapter / "9001-1.trans.txt").write_text(
            "".join(f"{key} {text}\n" for key, _, text in items)
        )
        outcome = run_conversion("librispeech", {"root": str(raw)}, opts)
    assert outcome.ok and outcome.report["totals"]["skipped"] == 0, outcome.report
    return out


_DATASET_YAML = {
    "image_text": (
        "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\n"
        "field_map:\n  image: image.png\n  caption: text.json[caption]\n"
    ),
    "audio_text": (
        "sample_type:\n  __module__: converters.sample_types\n  __class__: AudioTextSample\n"
        "field_map:\n  audio: audio.flac\n  text: text.json[text]\n  meta: text.json\n"
    ),
}


def _write_unchecked(kind: str, items: list[tuple[str, bytes, str]], out: Path) -> Path:
    """Shards written directly (tar + Energon prepare + dataset.yaml), bad media included: the
    converter would drop those records, and tests of the loader's bad-sample path need them."""
    import webdataset
    from megatron.energon import BaseWebdatasetFactory

    media, field = ("image.png", "caption") if kind == "image_text" else ("audio.flac", "text")
    (out / "train").mkdir(parents=True)
    tars = []
    for shard, start in enumerate(range(0, len(items), 8)):
        tars.append(f"train/shard-{shard:06d}.tar")
        with webdataset.TarWriter(str(out / tars[-1])) as writer:
            for key, data, text in items[start : start + 8]:
                writer.write(
                    {"__key__": key, media: data, "text.json": json.dumps({field: text}).encode()}
                )
    BaseWebdatasetFactory.prepare_dataset(
        out, tars, split_parts_patterns=[("train", "train/.*")], workers=1
    )
    (out / ".nv-meta" / "dataset.yaml").write_text(_DATASET_YAML[kind])
    return out


@pytest.fixture(scope="session")
def make_dataset(tmp_path_factory) -> Callable[..., Path]:
    """``make_dataset(kind, n=24, broken=())``: an Energon-ready dataset, all samples in ``train``.

    ``kind``: ``"image_text"`` (CaptioningSample; keys ``000000000007``) or ``"audio_text"``
    (AudioTextSample; keys ``9001-1-0007``). Clean datasets come from the project's converter;
    indices in ``broken`` get undecodable media and are written without it.
    """
    items = {"image_text": _image_item, "audio_text": _audio_item}

    def make(kind: str, n: int = 24, broken: Iterable[int] = ()) -> Path:
        broken = set(broken)
        data = [items[kind](i, i in broken) for i in range(n)]
        tmp = tmp_path_factory.mktemp(kind)
        return (
            _write_unchecked(kind, data, tmp / "shards")
            if broken
            else _convert(kind, data, tmp / "raw", tmp / "shards")
        )

    return make


@pytest.fixture(scope="session")
def image_text_shards(make_dataset) -> Path:
    return make_dataset("image_text")


@pytest.fixture(scope="session")
def audio_text_shards(make_dataset) -> Path:
    return make_dataset("audio_text", n=12)


def per_doc_digests(batch) -> dict[str, str]:
    """key → sha256 of that document's tokens and media tensors (unpadded), for any task_encoders batch."""
    import hashlib

    flat = batch.tokens.flatten()
    out = {}
    for j, key in enumerate(batch.keys):
        start = int(batch.cu_seqlens[j])
        parts = [flat[start : start + int(batch.doc_lengths[j])]]
        if hasattr(batch, "images"):
            parts.append(batch.images[j])
        if hasattr(batch, "features"):  # without the batch's time padding
            parts.append(batch.features[j, :, : int(batch.feature_lengths[j])])
        out[key] = hashlib.sha256(
            b"".join(p.contiguous().numpy().tobytes() for p in parts)
        ).hexdigest()
    return out


@pytest.fixture(scope="session")
def doc_digests():
    """:func:`per_doc_digests`."""
    return per_doc_digests


@pytest.fixture(scope="session")
def caption_of():
    """Key (``000000000007``, ``9001-1-0007``) → the caption the dataset fixtures wrote for it."""
    return lambda key: caption_for(int(key.rsplit("-", 1)[-1]))


@pytest.fixture(scope="session")
def one_pass():
    """``one_pass(encoder, path, num_workers=0, batch_size=4, rank=0, world_size=1)``: every batch of
    one ordered pass over the rank's part of the train split through Energon's savable loader
    (val-style: no shuffle, no repeat)."""
    from megatron.energon import get_savable_loader, get_val_dataset

    def run(
        encoder, path, num_workers: int = 0, batch_size: int = 4, rank: int = 0, world_size: int = 1
    ) -> list:
        worker_config = encoder.worker_config(
            rank=rank, world_size=world_size, num_workers=num_workers
        )
        dataset = get_val_dataset(
            path,
            split_part="train",
            worker_config=worker_config,
            batch_size=batch_size,
            packing_buffer_size=encoder.packing_buffer_size,
            task_encoder=encoder,
        )
        return list(get_savable_loader(dataset))

    return run


SMALL_IMAGE = {
    "transforms": [
        {"name": "RandomResizedCrop", "size": 16, "scale": [0.4, 1.0]},
        {"name": "RandomHorizontalFlip"},
        {"name": "ColorJitter", "brightness": 0.3, "contrast": 0.3},
        {"name": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
    ]
}
SMALL_AUDIO = {
    "n_fft": 256,
    "hop_length": 128,
    "n_mels": 32,
    "spec_augment": {"freq_width": 8, "time_width": 6},
}


@pytest.fixture(scope="session")
def make_encoder(tokenizer_dir):
    """``make_encoder(kind, seed=None, training=True, **sections)``: a registered encoder with small
    test settings (16 px images, 32 mel bins, seq_len 32, the shipped tokenizer); ``sections`` are
    merged into the config's top-level sections."""
    from task_encoders.registry import get_encoder

    def make(kind: str, seed: int | None = None, training: bool = True, **sections):
        config = {
            "encoder": kind,
            "seed": 1234,
            "text": {"tokenizer": str(tokenizer_dir), "seq_len": 32},
        }
        config.update(
            {"image_text": {"image": SMALL_IMAGE}, "audio_text": {"audio": SMALL_AUDIO}}.get(
                kind, {}
            )
        )
        for name, section in sections.items():
            config[name] = (
                {**config.get(name, {}), **section} if isinstance(section, dict) else section
            )
        return get_encoder(config, seed=seed, training=training)

    return make


@pytest.fixture(scope="session")
def image_text_encoder(make_encoder):
    return make_encoder("image_text")


@pytest.fixture(scope="session")
def audio_text_encoder(make_encoder):
    return make_encoder("audio_text")


@pytest.fixture(scope="session")
def raw_samples(image_text_shards, audio_text_shards):
    """``raw_samples(kind)``: the train split as Energon decodes it (in order, no task encoding)."""
    from megatron.energon import DefaultTaskEncoder, WorkerConfig, get_loader, get_val_dataset

    paths = {"image_text": image_text_shards, "audio_text": audio_text_shards}
    cache: dict[str, list] = {}

    def get(kind: str) -> list:
        if kind not in cache:
            dataset = get_val_dataset(
                paths[kind],
                split_part="train",
                batch_size=None,
                task_encoder=DefaultTaskEncoder(),
                worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            )
            cache[kind] = list(get_loader(dataset))
        return cache[kind]

    return get


# --- the embedded corpora (data/), converted once per test run -----------------------------------


@pytest.fixture(scope="session")
def coco(tmp_path_factory) -> Path:
    """``data/coco_mini`` converted (64 per shard, 10% val) under the base temporary folder: the
    same folder ``scripts.bench.data.coco_dataset(tmp_path_factory.getbasetemp())`` gives. Read
    it only; a test that changes a dataset copies it first."""
    from scripts.bench.data import coco_dataset

    return coco_dataset(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def speech(tmp_path_factory) -> Path:
    """``data/librispeech_mini`` converted under the base temporary folder (read it only)."""
    from scripts.bench.data import librispeech_dataset

    return librispeech_dataset(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def text_mini(tmp_path_factory) -> Path:
    """``data/text_mini`` converted under the base temporary folder (read it only)."""
    from scripts.bench.data import text_dataset

    return text_dataset(tmp_path_factory.getbasetemp())


# --- training: a run with a planted loss spike -----------------------------------------------


@pytest.fixture(scope="session")
def spike_run(tmp_path_factory) -> dict:
    """:func:`scripts.planted_spike.planted_run`, once per test run, whichever test process asks
    first (its folder is only read by the tests): ``{"config", "out", "planted"}``."""
    from scripts.bench.data import coco_dataset
    from scripts.planted_spike import planted_run
    from tests.helpers.once import once_per_run

    def build(base: Path) -> dict:
        run = planted_run(base, coco_dataset(tmp_path_factory.getbasetemp()))
        return {**run, "config": str(run["config"]), "out": str(run["out"])}

    run = once_per_run(tmp_path_factory, "spike_run", build)
    return {**run, "config": Path(run["config"]), "out": Path(run["out"])}
