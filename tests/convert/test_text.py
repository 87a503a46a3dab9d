"""``convert text``: text-only documents (JSONL, Parquet, CSV, TSV) → shards of Energon ``TextSample``s.

Read back with Energon's ``get_train_dataset`` and energon_platform's ``TrainLoader`` (``text`` encoder),
encoded by the ``multimodal`` encoder's TextSample dispatch; every bad-input reason counted;
deterministic bytes (two runs, 1 vs 2 workers, local vs Ray), rerun does nothing, SIGKILL + rerun
identical; the embedded ``data/text_mini`` corpus converts with nothing skipped.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from converters.convert import ConvertError, reason_counts
from converters.readers import InputError
from converters.records import KEY_PATTERN
from tests.convert.test_convert import (
    assert_kill_and_rerun_is_byte_identical,
    convert,
    members,
    tree_digest,
)
from tests.helpers import REPO
from tests.helpers.cli import one_line_error, run_cli

TEXT_MINI = REPO / "data" / "text_mini" / "documents.jsonl"
TEXT_SMALL = str(REPO / "configs" / "encoders" / "text_small.yaml")
WORDS = (
    "the loader reads shards of short documents and packs them into rows while a small model "
    "learns to predict the next token from the ones before it"
).split()


def doc(i: int) -> str:
    """A deterministic document of 4 to 15 words (varied lengths exercise packing)."""
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(4 + i % 12)).capitalize() + "."


def write_docs(path: Path, rows: list[dict], fmt: str | None = None) -> Path:
    fmt = fmt or path.suffix[1:]
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=7)
    else:
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="," if fmt == "csv" else "\t")
            w.writeheader()
            w.writerows(rows)
    return path


def good_rows(n: int) -> list[dict]:
    return [{"uid": f"doc-{i:03d}", "body": doc(i), "lang": "en"} for i in range(n)]


def read_back(out: Path, split: str = "train") -> dict[str, object]:
    """Every sample of one pass over ``split`` through Energon's get_train_dataset, by key."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    ds = get_train_dataset(
        out,
        split_part=split,
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
    )
    seen = {}
    for s in get_loader(ds):
        if s.__key__ in seen:
            break
        seen[s.__key__] = s
    return seen


# ---------------------------------------------------------------- formats and read-back


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv", "tsv"])
def test_documents_convert_to_text_samples_energon_reads(tmp_path, fmt):
    from megatron.energon import TextSample

    rows = good_rows(20)
    rows[3]["body"] = "  Leading and trailing blanks go.\nInner lines stay.  "
    path = write_docs(tmp_path / "raw" / f"docs.{fmt}", rows)
    out = tmp_path / "out"
    outcome = convert(
        "text",
        out,
        reader={"manifest": str(path), "text_column": "body", "id_column": "uid"},
        samples_per_shard=6,
    )
    rep = outcome.report
    assert outcome.ok and rep["modality"] == "text"
    assert rep["totals"] == {"seen": 20, "written": 20, "skipped": 0, "skipped_fraction": 0.0}
    assert [s["samples"] for s in rep["shards"]] == [6, 6, 6, 2]

    m = members(out)
    # one part per sample
    assert sorted(m) == sorted(f"train/doc-{i:03d}.text.json" for i in range(20))
    first = json.loads(m["train/doc-003.text.json"])
    row = 3 if fmt == "parquet" else (4 if fmt == "jsonl" else 5)  # row index / line number
    assert first == {
        "text": "Leading and trailing blanks go.\nInner lines stay.",
        "source": {
            "kind": "text",
            "id": "doc-003",
            "file": f"docs.{fmt}[{row}]",
            "manifest_row": row,
        },
    }
    assert yaml.safe_load((out / ".nv-meta" / "dataset.yaml").read_text()) == {
        "sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"},
        "field_map": {"text": "text.json[text]"},
    }

    seen = read_back(out)
    assert sorted(seen) == [r["uid"] for r in rows]
    assert all(type(s) is TextSample for s in seen.values())
    assert {k: s.text for k, s in seen.items()} == {r["uid"]: r["body"].strip() for r in rows}


def test_default_columns_and_row_keys(tmp_path):
    path = write_docs(tmp_path / "raw" / "plain.jsonl", [{"text": doc(i)} for i in range(5)])
    out = tmp_path / "out"
    outcome = convert("text", out, reader={"manifest": str(path)})
    # by line number
    assert outcome.ok and sorted(read_back(out)) == [f"row-{n:09d}" for n in range(1, 6)]
    info = run_cli("info", out)
    assert (
        info.returncode == 0
        and "sample type: TextSample" in info.stdout
        and "parts: text.json" in info.stdout
    )


def test_parquet_bytes_column_is_decoded(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "id": ["a", "b", "c"],
            "text": pa.array([b"caf\xc3\xa9 au lait", b"caf\xe9", b"  "], type=pa.binary()),
        }
    )
    path = tmp_path / "raw" / "bytes.parquet"
    path.parent.mkdir()
    pq.write_table(table, path)
    outcome = convert(
        "text",
        tmp_path / "out",
        reader={"manifest": str(path), "id_column": "id"},
        max_error_fraction=1.0,
    )
    assert reason_counts(outcome.report) == {"invalid_utf8": 1, "empty_text": 1}
    assert {k: s.text for k, s in read_back(tmp_path / "out").items()} == {"a": "café au lait"}


# ---------------------------------------------------------------- bad input, counted by reason


def test_every_bad_input_reason_is_counted_and_listed(tmp_path):
    lines = [
        json.dumps({"id": "good-1", "text": doc(1)}),
        json.dumps({"id": "empty", "text": ""}),
        json.dumps({"id": "blank", "text": " \n\t "}),
        json.dumps({"id": "null-text", "text": None}),
        json.dumps({"id": "no-text"}),
        '{"id": "surrogate", "text": "broken \\ud800 text"}',  # valid JSON, not writable as UTF-8
        json.dumps({"id": "number", "text": 42}),
        json.dumps({"id": "list", "text": ["a", "b"]}),
        '{"id": "cut", "text": "no closing',
        json.dumps(["not", "an", "object"]),
        json.dumps({"id": "good-2", "text": doc(2)}),
        json.dumps({"id": "good-1", "text": "a second document with the first one's id"}),
        json.dumps({"id": None, "text": doc(3)}),
        json.dumps({"id": "", "text": doc(4)}),
        json.dumps({"text": doc(5)}),
        json.dumps({"id": 7, "text": doc(7)}),  # a number is an id
        '{"id": "bad\\udc80id", "text": "an id that cannot be a file name"}',
    ]
    path = tmp_path / "raw" / "bad.jsonl"
    path.parent.mkdir()
    path.write_bytes(("\n".join(lines) + "\n").encode() + b'{"id": "latin1", "text": "caf\xe9"}\n')
    out = tmp_path / "out"
    outcome = convert(
        "text", out, reader={"manifest": str(path), "id_column": "id"}, max_error_fraction=1.0
    )
    assert reason_counts(outcome.report) == {
        "empty_text": 4,
        "invalid_utf8": 3,
        "malformed_line": 7,
        "duplicate_id": 1,
    }
    assert outcome.report["totals"]["written"] == 3 and outcome.report["totals"]["seen"] == 18
    assert {k: s.text for k, s in read_back(out).items()} == {
        "good-1": doc(1),
        "good-2": doc(2),
        "7": doc(7),
    }
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    by_id = {p["id"]: p for p in skipped}
    assert (
        by_id["surrogate"]["reason"] == "invalid_utf8"
        and by_id["line 18"]["reason"] == "invalid_utf8"
    )
    assert by_id["row 17"]["reason"] == "invalid_utf8"  # the id
    assert (
        by_id["number"]["reason"] == "malformed_line"
        and "not a string" in by_id["number"]["detail"]
    )
    assert (
        by_id["good-1"]["reason"] == "duplicate_id" and "bad.jsonl[12]" in by_id["good-1"]["detail"]
    )
    # null, empty, missing id
    assert {by_id[f"row {n}"]["reason"] for n in (13, 14, 15)} == {"malformed_line"}
    assert "null" in by_id["row 13"]["detail"]
    assert len(skipped) == 15


def test_bad_rows_in_parquet_and_csv(tmp_path):
    rows = [
        {"id": "a", "text": doc(0)},
        {"id": None, "text": doc(1)},
        {"id": "c", "text": None},
        {"id": "a", "text": doc(3)},
        {"id": "e", "text": doc(4)},
    ]
    p = write_docs(tmp_path / "raw" / "d.parquet", rows)
    rep = convert(
        "text",
        tmp_path / "pq",
        reader={"manifest": str(p), "id_column": "id"},
        max_error_fraction=1.0,
    ).report
    assert reason_counts(rep) == {"malformed_line": 1, "empty_text": 1, "duplicate_id": 1}
    c = tmp_path / "raw" / "d.csv"
    c.write_text('id,text\na,one document\n,no id\nc,\nd,"two\nlines"\ne,too,many\n')
    rep = convert(
        "text",
        tmp_path / "csv",
        reader={"manifest": str(c), "id_column": "id"},
        max_error_fraction=1.0,
    ).report
    assert reason_counts(rep) == {"malformed_line": 2, "empty_text": 1}
    assert {k: s.text for k, s in read_back(tmp_path / "csv").items()} == {
        "a": "one document",
        "d": "two\nlines",
    }


def test_user_errors_are_one_line_exit_2(tmp_path, capsys):
    path = write_docs(tmp_path / "raw" / "docs.parquet", good_rows(3))
    base = ["convert", "text", "--out", tmp_path / "out", "--no-progress"]
    r = run_cli(*base, "--manifest", path)
    assert r.returncode == 2 and "no column 'text'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    for reader, expected in (
        ({"manifest": str(path), "text_column": "body", "id_column": "nope"}, "no column 'nope'"),
        ({"manifest": str(tmp_path / "absent.jsonl")}, "not found"),
        ({"manifest": str(tmp_path / "raw")}, "not found"),
        (
            {"manifest": str(write_docs(tmp_path / "raw" / "d.txt", good_rows(2), "jsonl"))},
            "--format",
        ),
    ):
        with pytest.raises(InputError, match=expected):
            convert("text", tmp_path / "o1", reader=reader)
    latin = tmp_path / "raw" / "latin.csv"
    latin.write_bytes(b"text\ncaf\xe9\n")
    with pytest.raises(InputError, match="not UTF-8"):
        convert("text", tmp_path / "o2", reader={"manifest": str(latin)})
    # refused before writing
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    r = run_cli(*base, "--manifest", path, "--text-column", "body", "--id-column", "uid")
    assert r.returncode == 0 and "3 samples written, 0 skipped" in r.stdout, r.stderr

    from energon_platform.cli import EXAMPLES, main

    assert "energon-platform convert text --manifest" in EXAMPLES
    for argv in (["convert", "--help"], ["convert", "text", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
    helps = capsys.readouterr().out
    assert "convert text --manifest" in helps and "TextSample" in helps and "--text-column" in helps


def test_too_many_skipped_exits_1(tmp_path):
    path = write_docs(
        tmp_path / "raw" / "docs.jsonl", [{"text": doc(0)}, {"text": ""}, {"text": " "}]
    )
    r = run_cli("convert", "text", "--manifest", path, "--out", tmp_path / "out", "--no-progress")
    assert r.returncode == 1 and "exceeds --max-error-fraction" in r.stdout


# ---------------------------------------------------------------- determinism and resume


@pytest.fixture(scope="module")
def docs120(tmp_path_factory) -> Path:
    rows = [{"uid": f"d{i:04d}", "body": doc(i)} for i in range(120)] + [
        {"uid": "d0000", "body": "dup"},
        {"uid": "empty", "body": ""},
    ]
    return write_docs(tmp_path_factory.mktemp("docs120") / "docs.jsonl", rows)


def reader_of(path: Path) -> dict:
    """Reader arguments as the CLI passes them (every one, ``fmt`` too)."""
    return {"manifest": str(path), "text_column": "body", "id_column": "uid", "fmt": None}


def test_same_bytes_twice_and_for_any_worker_count(tmp_path, docs120):
    digests = []
    for name, workers in (("a", 1), ("b", 1), ("c", 2)):
        convert(
            "text",
            tmp_path / name,
            reader=reader_of(docs120),
            samples_per_shard=9,
            val_fraction=0.2,
            workers=workers,
        )
        digests.append(tree_digest(tmp_path / name))
    assert digests[0] == digests[1] == digests[2]
    report = json.loads(digests[0]["report.json"])
    assert report["splits"]["val"]["samples"] > 0 and report["totals"]["written"] == 120
    assert sum(k.endswith(".tar") for k in digests[0]) == len(report["shards"]) > 2
    assert ".nv-meta/index.sqlite" in digests[0] and ".nv-meta/index.uuid" in digests[0]


def test_rerun_does_nothing_and_changed_documents_are_refused(tmp_path, docs120):
    out = tmp_path / "out"
    first = convert("text", out, reader=reader_of(docs120), samples_per_shard=16)
    assert reason_counts(first.report) == {"duplicate_id": 1, "empty_text": 1}
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = convert("text", out, reader=reader_of(docs120), samples_per_shard=16)
    assert again.already_done and again.report == first.report
    assert before == {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    args = [
        "convert",
        "text",
        "--manifest",
        docs120,
        "--text-column",
        "body",
        "--id-column",
        "uid",
        "--samples-per-shard",
        16,
        "--out",
        out,
        "--no-progress",
    ]
    r = run_cli(*args)
    assert r.returncode == 0 and "nothing to do" in r.stdout
    # no media: no media options
    r = run_cli(*args, "--image-format", "keep", "--audio-format", "keep")
    assert (
        r.returncode == 2
        and "unrecognized arguments: --image-format keep --audio-format keep" in r.stderr
    ), r.stderr
    # an output of the release that counted media options for text
    state_path = next(out.rglob("state.json"))
    old_state = json.loads(state_path.read_text())
    old_state["options"].update(image={"image_format": "png"}, audio={"audio_format": "flac"})
    state_path.write_text(json.dumps(old_state))
    r = run_cli(*args)
    assert r.returncode == 0 and "nothing to do" in r.stdout, r.stdout + r.stderr
    changed = tmp_path / "changed.jsonl"
    changed.write_text(docs120.read_text().replace(doc(5), doc(5) + " One more sentence."))
    with pytest.raises(ConvertError, match=r"another input \(.*\) and input content"):
        convert("text", out, reader=reader_of(changed), samples_per_shard=16)
    with pytest.raises(ConvertError, match="another input"):
        convert(
            "text", out, reader={**reader_of(docs120), "text_column": "uid"}, samples_per_shard=16
        )
    (out / "train" / "shard-000002.tar").unlink()
    repaired = convert("text", out, reader=reader_of(docs120), samples_per_shard=16)
    assert repaired.repaired == ["train/shard-000002.tar"]
    ref = tmp_path / "ref"
    convert("text", ref, reader=reader_of(docs120), samples_per_shard=16)
    assert tree_digest(out) == tree_digest(ref)


@pytest.mark.slow
def test_sigkill_then_rerun_is_byte_identical(tmp_path):
    path = write_docs(
        tmp_path / "raw" / "docs.jsonl", [{"id": f"d{i:05d}", "text": doc(i)} for i in range(3000)]
    )
    args = [
        "convert",
        "text",
        "--manifest",
        path,
        "--id-column",
        "id",
        "--samples-per-shard",
        1,
        "--val-fraction",
        0.1,
        "--no-progress",
    ]
    assert_kill_and_rerun_is_byte_identical(args, tmp_path, kill_after_units=20, total_units=3000)


@pytest.mark.slow
def test_ray_executor_same_bytes_as_local(tmp_path, docs120):
    args = [
        "convert",
        "text",
        "--manifest",
        docs120,
        "--text-column",
        "body",
        "--id-column",
        "uid",
        "--samples-per-shard",
        9,
        "--val-fraction",
        0.2,
        "--no-progress",
    ]
    assert run_cli(*args, "--out", tmp_path / "local").returncode == 0
    r = run_cli(*args, "--out", tmp_path / "ray", "--executor", "ray", "--workers", 2, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert tree_digest(tmp_path / "local") == tree_digest(tmp_path / "ray")


# ---------------------------------------------------------------- encoders and loaders


@pytest.fixture(scope="module")
def text_shards(tmp_path_factory, docs120) -> Path:
    out = tmp_path_factory.mktemp("text-shards") / "out"
    convert("text", out, reader=reader_of(docs120), samples_per_shard=16)
    return out


def test_train_loader_with_the_text_encoder(text_shards):
    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader
    from task_encoders.documents import TextBatch

    config = load_config(
        {
            "data": {"path": str(text_shards), "val_split": None},
            "encoder": TEXT_SMALL,
            "loader": {"global_batch_size": 1, "num_workers": 0},
        }
    )
    loader = TrainLoader(config)
    assert loader.plan.pack_group == 8  # text_small.yaml: packing.buffer_size
    tokenizer = loader.encoder.tokenizer.hf
    keys, texts = [], {f"d{i:04d}": doc(i) for i in range(120)}
    for _ in range(15):  # one epoch: 120 documents, one pack group of 8 per global batch
        batch = next(loader)
        assert isinstance(batch, TextBatch) and batch.tokens.shape[1] == 48
        # packed
        assert int(batch.num_docs.sum()) == len(batch.keys) == 8 and batch.tokens.shape[0] < 8
        flat = batch.tokens.flatten()
        for j, key in enumerate(batch.keys):
            start, length = int(batch.cu_seqlens[j]), int(batch.doc_lengths[j])
            assert tokenizer.decode(flat[start + 1 : start + length - 1].tolist()) == texts[key]
        keys += batch.keys
    assert sorted(keys) == sorted(texts)  # every document once per epoch
    assert next(TrainLoader(config)).keys == keys[:8]  # the same order on a fresh loader


def test_multimodal_encoder_dispatches_text_samples_to_text(text_shards, make_encoder, one_pass):
    import torch

    from task_encoders.multimodal import MultimodalBatch

    text = make_encoder("text", packing={"enabled": False})
    multi = make_encoder("multimodal", packing={"enabled": False}, modalities={"text": {}})
    plain = one_pass(text, text_shards, batch_size=4)
    mixed = one_pass(multi, text_shards, batch_size=4)
    assert all(isinstance(b, MultimodalBatch) for b in mixed)
    assert {m for b in mixed for m in b.modalities} == {"text"}
    assert all(int(b.num_images.sum()) == 0 and int(b.num_audio.sum()) == 0 for b in mixed)
    assert [b.keys for b in mixed] == [b.keys for b in plain] and sum(
        len(b.keys) for b in plain
    ) == 120
    for a, b in zip(plain, mixed):  # the same tensors as the text encoder's own
        for name in ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "doc_lengths"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name


# ---------------------------------------------------------------- the embedded corpus


def test_embedded_text_corpus_converts_with_nothing_skipped(tmp_path):
    lines = TEXT_MINI.read_text(encoding="utf-8").splitlines()
    out = tmp_path / "out"
    r = run_cli(
        "convert",
        "text",
        "--manifest",
        TEXT_MINI,
        "--id-column",
        "id",
        "--out",
        out,
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["totals"] == {
        "seen": len(lines),
        "written": len(lines),
        "skipped": 0,
        "skipped_fraction": 0.0,
    }
    ids = [json.loads(line)["id"] for line in lines]
    seen = read_back(out)
    assert sorted(seen) == sorted(ids) and all(KEY_PATTERN.match(k) for k in seen)
    assert {k: s.text for k, s in seen.items()} == {
        json.loads(x)["id"]: json.loads(x)["text"] for x in lines
    }


# ---------------------------------------------------------------- manifests without the text column, or empty


def text_cli(manifest: Path, out: Path, *extra: str):
    """``energon-platform convert text --manifest MANIFEST --out OUT EXTRA...``, run to its end."""
    return run_cli(
        "convert",
        "text",
        "--manifest",
        manifest,
        "--out",
        out,
        "--no-progress",
        *extra,
        timeout=120,
    )


def test_jsonl_without_the_text_column_says_the_column_is_missing_like_csv(tmp_path):
    manifest = tmp_path / "docs.jsonl"
    manifest.write_text("".join(json.dumps({"id": i, "body": f"doc {i}"}) + "\n" for i in range(4)))
    r = text_cli(manifest, tmp_path / "out")
    assert one_line_error(r) and "no column 'text' (columns: body, id)" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    # a field missing from some lines only stays a per-row problem
    manifest.write_text(json.dumps({"id": 0, "text": "doc"}) + "\n" + json.dumps({"id": 1}) + "\n")
    r = text_cli(manifest, tmp_path / "out", "--max-error-fraction", "0.5")
    assert r.returncode == 0 and "skipped empty_text: 1" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.csv"])
def test_an_empty_manifest_is_named_empty(tmp_path, name):
    manifest = tmp_path / name
    manifest.write_text("" if name.endswith("jsonl") else "id,text\n")
    r = text_cli(manifest, tmp_path / "out")
    assert one_line_error(r) and f"{manifest}: empty" in r.stderr, r.stderr
    assert "100.0%" not in r.stdout
