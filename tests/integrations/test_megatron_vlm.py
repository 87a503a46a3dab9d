"""Vision-language data on the Megatron provider path: encoders, converter, and resume.

* The ``image_text`` encoder in vision-language mode and the ``conversation`` encoder: the
  ``<image>`` placeholder (one per image, a special token), the prompt and chat templates, loss on
  answer tokens only, tiles (count, order, seeded augmentation), spliced lengths and packing that
  never overflows ``text.seq_len`` after splicing, Energon's ``VQASample``.
* ``energon-platform convert llava``: the shipped conversation corpus, bad entries counted.
* Exact and elastic resume through Megatron's calls, with tiles and conversations: a separate
  process plays Megatron's loop (the provider, ``next()`` per micro-batch, state files at checkpoint
  iterations) and is killed with SIGKILL in the middle of an iteration; a fresh process resumes from
  the last state files, on the same or another data-parallel size; every batch after the resume
  equals the uninterrupted run's (whole dicts on the same layout, every document's tokens, loss mask
  and tiles on another).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO
from tests.helpers.cli import run_cli

ENCODERS = REPO / "configs" / "encoders"
IMAGE = 2047


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, Path]:
    from converters.convert import ConvertOptions, run_conversion

    out = tmp_path_factory.mktemp("vlm")
    done = {}
    for name, kind, args in (
        (
            "coco",
            "coco",
            {
                "annotations": str(REPO / "data/coco_mini/captions.json"),
                "images": str(REPO / "data/coco_mini/images"),
            },
        ),
        (
            "conversations",
            "llava",
            {
                "json_file": str(REPO / "data/coco_mini/conversations.json"),
                "images": str(REPO / "data/coco_mini/images"),
            },
        ),
    ):
        outcome = run_conversion(
            kind, args, ConvertOptions(out=str(out / name), samples_per_shard=8, progress=False)
        )
        assert outcome.ok, outcome.report
        done[name] = out / name
    return done


def sample(kind: str, key: str, **fields):
    from megatron.energon import CaptioningSample, VQASample

    from converters.sample_types import ConversationSample

    cls = {"caption": CaptioningSample, "vqa": VQASample, "conversation": ConversationSample}[kind]
    if kind == "conversation":
        fields.setdefault("meta", {})
    subflavors = fields.pop("subflavors", {})
    return cls(__key__=key, __restore_key__=(), __subflavors__=subflavors, __sources__=(), **fields)


def encoder(name: str, **changes):
    import yaml

    from task_encoders.registry import get_encoder

    config = yaml.safe_load((ENCODERS / name).read_text())
    for section, values in changes.items():
        config[section] = (
            {**config.get(section, {}), **values} if isinstance(values, dict) else values
        )
    return get_encoder(config)


def answer_text(enc, doc) -> str:
    return enc.tokenizer.hf.decode(doc.tokens[doc.media["targets"]])


# --- encoders -------------------------------------------------------------------------------------


def test_caption_prompt_placeholder_tiles_and_answer_only_loss():
    enc = encoder("image_text_vlm_small.yaml")
    assert enc.image_token_index == IMAGE and enc.tokens_per_tile == 16
    wide = sample("caption", "wide", image=torch.rand(3, 40, 100), caption="A wide photo of a cat.")
    square = sample("caption", "square", image=torch.rand(3, 64, 64), caption="A square.")
    small = sample("caption", "small", image=torch.rand(3, 20, 20), caption="Tiny.")
    docs = [enc.encode(s) for s in (wide, square, small)]
    # Grids: 100x40 -> 3x1 (+ thumbnail), 64x64 -> 2x2 (+ thumbnail), 20x20 -> 1x1 (no thumbnail).
    assert [d.media["num_tiles"].tolist() for d in docs] == [[4], [5], [1]]
    assert [tuple(d.media["images"].shape) for d in docs] == [
        (4, 3, 32, 32),
        (5, 3, 32, 32),
        (1, 3, 32, 32),
    ]
    for doc, s in zip(docs, (wide, square, small)):
        text = enc.tokenizer.hf.decode(doc.tokens)
        assert doc.tokens.tolist().count(IMAGE) == 1 and int(doc.tokens[1]) == IMAGE
        assert text.startswith("<bos><image>\n") and text.endswith(s.caption + "<eos>")
        assert text.split("\n")[1] in (
            "Give a short description of the image.",
            "What does this picture show?",
        )
        # the loss covers the caption and EOS only
        assert answer_text(enc, doc) == s.caption + "<eos>"
        assert (
            enc.spliced_length(doc)
            == doc.tokens.numel() + int(doc.media["num_tiles"].sum()) * 16 - 1
        )
    # Same key, seed and epoch: the same instruction and tiles; the tiles of the 3x1 grid are the
    # resized image cut left to right (no flip drawn for this key) or its mirror.
    again = enc.encode(wide)
    assert torch.equal(again.tokens, docs[0].tokens) and torch.equal(
        again.media["images"], docs[0].media["images"]
    )
    batch = enc.batch(docs)
    assert batch.images.shape == (10, 3, 32, 32) and batch.num_tiles.tolist() == [4, 5, 1]
    assert batch.num_images.tolist() == [1, 1, 1] and batch.image_token_index == IMAGE
    assert torch.equal(batch.images[4:9], docs[1].media["images"])  # stacked in document order
    for row, doc in enumerate(docs):
        n = doc.tokens.numel()
        assert torch.equal(batch.loss_mask[row, : n - 1], doc.media["targets"][1:].float())
        assert batch.loss_mask[row, n - 1 :].sum() == 0
        assert torch.equal(batch.labels[row, : n - 1], doc.tokens[1:])


def test_tiles_are_seeded_per_sample_and_epoch_and_count_in_the_length():
    enc = encoder("image_text_vlm_small.yaml")
    image = torch.rand(3, 48, 96)
    a = enc.encode(sample("caption", "k1", image=image, caption="x"))
    b = enc.encode(sample("caption", "k2", image=image, caption="x"))
    c = enc.encode(sample("caption", "k1", image=image, caption="x"))
    e1 = enc.encode(sample("caption", "k1", image=image, caption="x", subflavors={"epoch": 1}))
    assert torch.equal(a.media["images"], c.media["images"])
    assert not torch.equal(a.media["images"], b.media["images"])  # another key: other draws
    assert not torch.equal(a.media["images"], e1.media["images"])  # another epoch: other draws
    assert a.media["num_tiles"].tolist() == b.media["num_tiles"].tolist() == [3]  # 2x1 + thumbnail
    # A caption longer than the room left by its tiles is cut (EOS kept); the spliced length fits.
    long = enc.encode(
        sample("caption", "long", image=torch.rand(3, 64, 64), caption=" ".join(["word"] * 400))
    )
    assert (
        enc.spliced_length(long) == enc.seq_len
        and int(long.tokens[-1]) == enc.tokenizer.special.eos
    )
    # Prompt and images alone do not fit: skipped (ValueError), never an overflowing row.
    tight = encoder("image_text_vlm_small.yaml", text={"seq_len": 60})
    with pytest.raises(ValueError, match="leave no room"):
        tight.encode(sample("caption", "big", image=torch.rand(3, 64, 64), caption="A square."))


def test_packing_counts_image_embeddings_and_never_overflows():
    from energon_platform.integrations.megatron import to_megatron_batch

    enc = encoder("image_text_vlm_small_packed.yaml")
    docs = [
        enc.encode(
            sample(
                "caption",
                f"d{i}",
                image=torch.rand(3, 32 + 16 * (i % 3), 64),
                caption=f"Photo {i}.",
            )
        )
        for i in range(8)
    ]
    groups = enc.select_samples_to_pack(docs)
    assert sorted(k for g in groups for k in [d.__key__ for d in g]) == sorted(
        d.__key__ for d in docs
    )
    for group in groups:
        assert sum(enc.spliced_length(d) for d in group) <= enc.seq_len
    batch = enc.batch([enc.pack_selected_samples(g) for g in groups])
    data = to_megatron_batch(batch, packed=True)
    n, s = batch.tokens.shape
    # Flattened: every row is exactly S positions after splicing; cu_lengths count them.
    assert int(data["cu_lengths"][0, -1]) == n * s
    spliced = (
        data["tokens"].shape[1]
        + int(data["num_tiles"].sum()) * enc.tokens_per_tile
        - data["num_tiles"].numel()
    )
    assert spliced == n * s and data["imgs"].shape[0] == int(batch.num_tiles.sum())
    assert int((data["tokens"] == IMAGE).sum()) == data["num_tiles"].numel() == len(docs)
    # Text tokens alone (the old way) would have packed more documents into a row than fit.
    assert max(len(g) for g in groups) < len(first_fit_by_text(enc, docs)[0])


def first_fit_by_text(enc, docs):
    from task_encoders.sequences import first_fit_decreasing

    return first_fit_decreasing(
        [d.tokens.numel() for d in docs], [d.__key__ for d in docs], enc.seq_len
    )


def test_conversation_template_multi_image_text_only_and_vqa():
    enc = encoder("conversation_small.yaml")
    two = sample(
        "conversation",
        "two",
        images=[torch.rand(3, 32, 32), torch.rand(3, 64, 32)],
        conversation=[
            {"from": "human", "value": "Compare them."},
            {"from": "gpt", "value": "The first is smaller."},
            {"from": "human", "value": "Sure?"},
            {"from": "gpt", "value": "Yes."},
        ],
    )
    doc = enc.encode(two)
    text = enc.tokenizer.hf.decode(doc.tokens)
    # Missing placeholders go in front of the first user turn, one per image.
    assert text == (
        "<bos>User: <image>\n<image>\nCompare them.\nAssistant: The first is smaller.\n"
        "User: Sure?\nAssistant: Yes.\n<eos>"
    )
    assert answer_text(enc, doc) == "The first is smaller.\nYes.\n<eos>"
    # 32x32: one tile; 32 wide x 64 high: 1x2 + thumbnail
    assert doc.media["num_tiles"].tolist() == [
        1,
        3,
    ]
    text_only = enc.encode(
        sample(
            "conversation",
            "t",
            images=[],
            conversation=[
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "Hi?"},
                {"from": "gpt", "value": "Hello."},
            ],
        )
    )
    assert (
        enc.tokenizer.hf.decode(text_only.tokens)
        == "<bos>System: Be brief.\nUser: Hi?\nAssistant: Hello.\n<eos>"
    )
    assert (
        text_only.media["images"].shape == (0, 3, 32, 32)
        and text_only.media["num_tiles"].numel() == 0
    )
    vqa = sample(
        "vqa",
        "q",
        image=torch.rand(3, 32, 32),
        context="<image>\nWhat colour?",
        answers=["red", "blue"],
        answer_weights=torch.tensor([0.0, 1.0]),
    )
    vdoc = enc.encode(vqa)
    assert (
        enc.tokenizer.hf.decode(vdoc.tokens)
        == "<bos>User: <image>\nWhat colour?\nAssistant: blue\n<eos>"
    )
    assert answer_text(enc, vdoc) == "blue\n<eos>"
    batch = enc.batch([doc, text_only, vdoc])
    assert batch.num_images.tolist() == [2, 0, 1] and batch.num_tiles.tolist() == [1, 3, 1]
    assert batch.image_docs.tolist() == [0, 0, 2]
    # A configurable template and system message.
    chatml = encoder(
        "conversation_small.yaml",
        chat={
            "system": "You see images.",
            "user_turn": {"prefix": "<|user|>\n", "suffix": "\n"},
            "assistant_turn": {"prefix": "<|assistant|>\n", "suffix": "\n"},
        },
    )
    assert enc.tokenizer.hf.decode(chatml.encode(vqa).tokens).startswith(
        "<bos>System: You see images.\n<|user|>\n<image>\nWhat colour?\n<|assistant|>\nblue\n"
    )
    # Bad conversations are skipped (ValueError / TypeError, counted by the skip policy).
    for conversation, match in (
        ([{"from": "gpt", "value": "<image> no"}], "image placeholder"),
        (
            [{"from": "human", "value": "<image><image>x"}, {"from": "gpt", "value": "y"}],
            "2 image placeholder",
        ),
        ([{"from": "human", "value": "x"}], "no assistant turn"),
        ([{"from": "robot", "value": "x"}], "role 'robot'"),
    ):
        with pytest.raises(ValueError, match=match):
            enc.encode(
                sample(
                    "conversation", "bad", images=[torch.rand(3, 32, 32)], conversation=conversation
                )
            )


def test_placeholder_is_added_to_a_users_tokenizer_like_megatron(tmp_path):
    import shutil

    from transformers import AutoTokenizer

    own = tmp_path / "tok"
    shutil.copytree(REPO / "task_encoders/assets/tokenizer", own)
    doc = json.loads((own / "tokenizer.json").read_text())
    doc["added_tokens"] = [t for t in doc["added_tokens"] if t["content"] != "<image>"]
    (own / "tokenizer.json").write_text(json.dumps(doc))
    conf = json.loads((own / "tokenizer_config.json").read_text())
    conf["added_tokens_decoder"] = {
        k: v for k, v in conf["added_tokens_decoder"].items() if v["content"] != "<image>"
    }
    (own / "tokenizer_config.json").write_text(json.dumps(conf))
    enc = encoder(
        "conversation_small.yaml",
        text={"seq_len": 256, "tokenizer": str(own)},
        prompt={"image_token": "<img>", "special_tokens": ["<img>", "<image>"]},
    )
    megatron = AutoTokenizer.from_pretrained(str(own))
    # what --special-tokens does
    assert megatron.add_tokens(["<img>", "<image>"], special_tokens=True) == 2
    assert enc.image_token_index == megatron.convert_tokens_to_ids("<img>") == 2047
    assert enc.special_token_ids == {"<img>": 2047, "<image>": 2048}
    # The shipped tokenizer has <image> already: nothing is added, ids stay.
    shipped = encoder("conversation_small.yaml")
    assert shipped.tokenizer.vocab_size == 2048 and shipped.image_token_index == IMAGE
    from task_encoders.config_parser import ConfigError

    with pytest.raises(ConfigError, match="ordinary token"):
        encoder("conversation_small.yaml", prompt={"image_token": "red", "special_tokens": ["red"]})


def test_config_errors_name_the_key():
    from task_encoders.config_parser import ConfigError

    with pytest.raises(
        ConfigError,
        match=r"image.transforms\[0\].name: RandomResizedCrop with image.tiling.enabled",
    ):
        encoder(
            "image_text_vlm_small.yaml",
            image={"transforms": [{"name": "RandomResizedCrop", "size": 32}]},
        )
    with pytest.raises(ConfigError, match="prompt.enabled: false with image.tiling.enabled"):
        encoder("image_text_vlm_small.yaml", prompt={"enabled": False})
    with pytest.raises(ConfigError, match="vision.image_size"):
        encoder("image_text_vlm_small.yaml", vision={"image_size": 30, "patch_dim": 8})
    with pytest.raises(ConfigError, match="prompt.template"):
        encoder("image_text_vlm_small.yaml", prompt={"template": "{instruction}"})


def test_image_text_with_prompt_enabled_builds_the_vision_language_class_under_the_old_fingerprint():
    """``encoder: image_text`` with ``prompt.enabled`` (a file, a dict or a parsed config) builds
    the vision-language class, which records the name a resume fingerprint held before it
    existed; the plain spelling builds the plain class."""
    from task_encoders.image_text import ImageTextTaskEncoder
    from task_encoders.registry import get_encoder
    from task_encoders.vision_language import VisionLanguageBatch, VisionLanguageTaskEncoder

    from_dict = encoder("image_text_vlm_small.yaml")
    for enc in (
        get_encoder(ENCODERS / "image_text_vlm_small.yaml"),
        from_dict,
        get_encoder(from_dict.config),
    ):
        assert type(enc) is VisionLanguageTaskEncoder and enc.batch_type is VisionLanguageBatch
        assert (enc.name, enc.fingerprint_name) == ("image_text", "ImageTextTaskEncoder")
    plain = get_encoder(ENCODERS / "image_text_small.yaml")
    assert type(plain) is ImageTextTaskEncoder and plain.image_token_index is None
    assert plain.fingerprint_name == "ImageTextTaskEncoder"
    assert encoder("conversation_small.yaml").fingerprint_name == "ConversationTaskEncoder"


def test_each_image_text_class_refuses_the_other_prompt_mode():
    from task_encoders.config_parser import ConfigError
    from task_encoders.image_text import ImageTextTaskEncoder
    from task_encoders.vision_language import VisionLanguageTaskEncoder

    with pytest.raises(
        ConfigError, match=r"prompt.enabled: true for ImageTextTaskEncoder \(expected .*Vision"
    ):
        ImageTextTaskEncoder(ENCODERS / "image_text_vlm_small.yaml")
    with pytest.raises(ConfigError, match="prompt.enabled: false for VisionLanguageTaskEncoder"):
        VisionLanguageTaskEncoder(ENCODERS / "image_text_small.yaml")


# --- the converter ----------------------------------------------------------------------------------


def test_convert_llava_shipped_corpus(shards):
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    report = json.loads((shards["conversations"] / "report.json").read_text())
    entries = json.loads((REPO / "data/coco_mini/conversations.json").read_text())
    assert report["totals"] == {
        "seen": len(entries),
        "written": len(entries),
        "skipped": 0,
        "skipped_fraction": 0.0,
    }
    assert report["modality"] == "conversation"
    dataset = get_train_dataset(
        str(shards["conversations"]),
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
    )
    seen = {}
    for s in get_loader(dataset):
        if s.__key__ in seen:
            break
        seen[s.__key__] = s
    assert sorted(seen) == sorted(e["id"] for e in entries)
    by_id = {e["id"]: e for e in entries}
    for key, s in seen.items():
        names = by_id[key].get("images", [by_id[key]["image"]] if "image" in by_id[key] else [])
        assert type(s).__name__ == "ConversationSample" and len(s.images) == len(names)
        assert s.conversation == by_id[key]["conversations"]
        assert [i["file"] for i in s.meta["source"]["images"]] == names
        for image, info in zip(s.images, s.meta["source"]["images"]):
            assert (
                image.shape == (3, info["height"], info["width"]) and image.dtype == torch.float32
            )
    assert seen["conv-0005"].images[0].shape == (3, 300, 451)  # the EXIF-rotated cat, upright


def test_convert_llava_counts_bad_entries(tmp_path):
    from converters.convert import ConvertOptions, reason_counts, run_conversion

    images = tmp_path / "images"
    images.mkdir()
    from PIL import Image

    Image.new("RGB", (40, 30), "red").save(images / "red.png")
    (images / "broken.jpg").write_bytes(b"not a jpeg")
    good = [{"from": "human", "value": "<image>\nColour?"}, {"from": "gpt", "value": "Red."}]
    entries = [
        {"id": "ok", "image": "red.png", "conversations": good},
        {"id": "two", "images": ["red.png", "red.png"], "conversations": good},
        {
            "id": "text",
            "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}],
        },
        {"id": "missing", "image": "nope.png", "conversations": good},
        {"id": "broken", "image": "broken.jpg", "conversations": good},
        {
            "id": "noanswer",
            "image": "red.png",
            "conversations": [{"from": "human", "value": "<image>"}],
        },
        {
            "id": "toomany",
            "image": "red.png",
            "conversations": [
                {"from": "human", "value": "<image><image>"},
                {"from": "gpt", "value": "x"},
            ],
        },
        {"image": "red.png", "conversations": good},
        "not an object",
        {"id": "ok", "image": "red.png", "conversations": good},
    ]
    (tmp_path / "llava.json").write_text(json.dumps(entries))
    outcome = run_conversion(
        "llava",
        {"json_file": str(tmp_path / "llava.json"), "images": str(images)},
        ConvertOptions(out=str(tmp_path / "out"), progress=False, max_error_fraction=1.0),
    )
    assert outcome.report["totals"]["written"] == 3
    assert reason_counts(outcome.report) == {
        "missing_file": 1,
        "not_an_image": 1,
        "empty_text": 1,
        "malformed_line": 3,
        "duplicate_id": 1,
    }
    skipped = [
        json.loads(line) for line in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()
    ]
    assert {s["id"] for s in skipped} >= {"missing", "broken", "noanswer", "toomany", "ok"}
    # The CLI has the source kind; a missing JSON file is one line and exit status 2.
    r = run_cli(
        "convert",
        "llava",
        "--json",
        str(tmp_path / "x.json"),
        "--images",
        str(images),
        "--out",
        str(tmp_path / "o2"),
    )
    assert r.returncode == 2 and "LLaVA json file not found" in r.stderr


# --- resume through Megatron's calls ------------------------------------------------------------------


def doc_digests(batch) -> dict[str, str]:
    """Per document: its tokens, loss mask and tiles (layout independent)."""
    out, tile, image = {}, 0, 0
    flat_tokens, flat_mask = batch.tokens.reshape(-1), batch.loss_mask.reshape(-1)
    starts = batch.cu_seqlens[:-1].tolist()
    for d, key in enumerate(batch.keys):
        n = int(batch.doc_lengths[d])
        h = hashlib.sha256()
        h.update(flat_tokens[starts[d] : starts[d] + n].numpy().tobytes())
        h.update(flat_mask[starts[d] : starts[d] + n].numpy().tobytes())
        tiles = int(batch.num_tiles[image : image + int(batch.num_images[d])].sum())
        h.update(batch.images[tile : tile + tiles].numpy().tobytes())
        tile, image = tile + tiles, image + int(batch.num_images[d])
        out[key] = h.hexdigest()
    return out


def dict_digest(data: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(data):
        value = data[name]
        h.update(name.encode())
        h.update(
            value.numpy().tobytes() + str(value.dtype).encode() + str(tuple(value.shape)).encode()
            if isinstance(value, torch.Tensor)
            else json.dumps(value).encode()
        )
    return h.hexdigest()


def worker(spec: dict) -> None:
    """One Megatron-like process: ``spec`` = data, encoder, dp, mbs, gbs, start, stop, save_interval,
    save, log, kill (``[iteration, micro]`` or None). Appends one JSON line per micro-batch."""
    import os

    from energon_platform.config import load_config
    from energon_platform.integrations.megatron import make_provider, save_dataloader_state

    cfg = load_config(
        {
            "data": {"path": spec["data"]},
            "encoder": spec["encoder"],
            "loader": {"global_batch_size": spec["gbs"], "num_workers": 0, "seed": 99},
        }
    )
    restore = spec["start"] if spec["start"] > 0 else None
    ranks = [
        make_provider(
            cfg,
            dp_rank=r,
            dp_size=spec["dp"],
            micro_batch_size=spec["mbs"],
            global_batch_size=spec["gbs"],
            dataloader_save=spec["save"],
            restore_iteration=restore,
            build_valid=False,
        )(None)[0]
        for r in range(spec["dp"])
    ]
    micro = spec["gbs"] // (spec["mbs"] * spec["dp"])
    with open(spec["log"], "a") as log:
        for iteration in range(spec["start"] + 1, spec["stop"] + 1):
            for rank, it in enumerate(ranks):
                for m in range(micro):
                    if spec["kill"] == [iteration, m] and rank == 0:
                        log.flush()
                        os.kill(os.getpid(), signal.SIGKILL)
                    data = next(it)
                    log.write(
                        json.dumps(
                            {
                                "it": iteration,
                                "rank": rank,
                                "micro": m,
                                "keys": it.last_keys,
                                "dict": dict_digest(data),
                                "docs": doc_digests(it.last_batch),
                            }
                        )
                        + "\n"
                    )
            log.flush()
            if iteration % spec["save_interval"] == 0:
                for rank, it in enumerate(ranks):
                    save_dataloader_state(it, spec["save"], iteration, rank)
    for it in ranks:
        it.close()


def run_worker(spec: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", __name__, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )


def read_log(path: Path) -> dict:
    return {
        (r["it"], r["rank"], r["micro"]): r for r in map(json.loads, path.read_text().splitlines())
    }


@pytest.fixture(scope="module")
def straight_and_killed(shards, tmp_path_factory):
    """``runs(dataset, encoder_file, mbs, gbs)``: the folder of an uninterrupted 6-iteration run on
    2 data-parallel ranks (``s.jsonl``) and of the same run SIGKILLed in iteration 5 (``k.jsonl``
    and its checkpoints ``k/``), run once per argument tuple for the tests that resume it."""
    done: dict[tuple, Path] = {}

    def runs(dataset: str, encoder_file: str, mbs: int, gbs: int) -> Path:
        key = (dataset, encoder_file, mbs, gbs)
        if key not in done:
            folder = tmp_path_factory.mktemp("megatron-runs")
            base = {
                "data": str(shards[dataset]),
                "encoder": str(ENCODERS / encoder_file),
                "mbs": mbs,
                "gbs": gbs,
                "dp": 2,
                "start": 0,
                "stop": 6,
            }
            straight = {
                **base,
                "save": str(folder / "s"),
                "log": str(folder / "s.jsonl"),
                "kill": None,
                "save_interval": 100,
            }
            killed = {
                **base,
                "save": str(folder / "k"),
                "log": str(folder / "k.jsonl"),
                "kill": [5, 1],
                "save_interval": 2,
            }
            assert run_worker(straight).returncode == 0
            r = run_worker(killed)
            assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
            done[key] = folder
        return done[key]

    return runs


@pytest.mark.slow
@pytest.mark.parametrize(
    "dataset,encoder_file,mbs,gbs,resume_dp",
    [
        ("coco", "image_text_vlm_small.yaml", 2, 8, 2),  # tiles, same layout: exact
        ("coco", "image_text_vlm_small.yaml", 2, 8, 1),  # tiles, 2 -> 1 data-parallel ranks
        ("conversations", "conversation_small_packed.yaml", 1, 4, 2),  # packed conversations: exact
        ("conversations", "conversation_small.yaml", 1, 4, 4),  # conversations, 2 -> 4 ranks
    ],
    ids=["captions-exact", "captions-dp2to1", "conversations-packed-exact", "conversations-dp2to4"],
)
def test_sigkill_and_resume_on_the_megatron_path(
    shards, straight_and_killed, tmp_path, dataset, encoder_file, mbs, gbs, resume_dp
):
    runs = straight_and_killed(dataset, encoder_file, mbs, gbs)
    shutil.copytree(runs / "k", tmp_path / "k")  # the resume saves into it: each test its own copy
    base = {
        "data": str(shards[dataset]),
        "encoder": str(ENCODERS / encoder_file),
        "mbs": mbs,
        "gbs": gbs,
        "save_interval": 2,
    }
    resumed_dp = dict(mbs=mbs if gbs % (mbs * resume_dp) == 0 else 1)
    resumed = {
        **base,
        **resumed_dp,
        "dp": resume_dp,
        "start": 4,
        "stop": 6,
        "save": str(tmp_path / "k"),
        "log": str(tmp_path / "r.jsonl"),
        "kill": None,
    }
    r = run_worker(resumed)
    assert r.returncode == 0, r.stderr[-3000:]
    want, before, after = (
        read_log(runs / "s.jsonl"),
        read_log(runs / "k.jsonl"),
        read_log(tmp_path / "r.jsonl"),
    )
    assert before and all(before[k]["dict"] == want[k]["dict"] for k in before)
    # killed in the middle of iteration 5 (rank 0 had not started)
    assert max(k[0] for k in before) == 5
    for iteration in (5, 6):
        w = [r for k, r in sorted(want.items()) if k[0] == iteration]
        g = [r for k, r in sorted(after.items()) if k[0] == iteration]
        assert [key for r in g for key in r["keys"]] == [key for r in w for key in r["keys"]], (
            iteration
        )
        assert {k: v for r in g for k, v in r["docs"].items()} == {
            k: v for r in w for k, v in r["docs"].items()
        }
        if resume_dp == 2:
            assert [r["dict"] for r in g] == [r["dict"] for r in w]  # the same dicts, bit for bit


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
