"""Make an output folder Energon-ready: Energon's own prepare API plus ``dataset.yaml``.

After `prepare`, ``energon info OUT`` works and ``megatron.energon.get_train_dataset(OUT,
...)`` yields decoded samples: ``CaptioningSample`` for images, ``AudioTextSample`` for audio,
``TextSample`` for text documents (no media part).
"""

from __future__ import annotations

import contextlib
import io
import uuid
from pathlib import Path

import yaml

META = ".nv-meta"
#: The files of ``.nv-meta`` every dataset `prepare` wrote has (and the loader reads);
#: ``sample_loader.py`` too when ``dataset.yaml`` names it.
META_FILES = ("index.sqlite", "index.uuid", ".info.json", "split.yaml", "dataset.yaml")

_SAMPLE_TYPES = {
    "image": {"__module__": "megatron.energon", "__class__": "CaptioningSample"},
    "audio": {"__module__": "converters.sample_types", "__class__": "AudioTextSample"},
    "video": {"__module__": "converters.sample_types", "__class__": "VideoTextSample"},
    "pointcloud": {"__module__": "converters.sample_types", "__class__": "PointCloudTextSample"},
    "text": {"__module__": "megatron.energon", "__class__": "TextSample"},
}
_FIELDS = {  # sample field -> how to get it, per modality (MEDIA is the media part name)
    "image": {"image": "MEDIA", "caption": "text.json[caption]"},
    "audio": {"audio": "MEDIA", "text": "text.json[text]", "meta": "text.json"},
    "video": {"video": "MEDIA", "text": "text.json[text]", "meta": "text.json"},
    "pointcloud": {"geometry": "MEDIA", "text": "text.json[text]", "meta": "text.json"},
    "text": {"text": "text.json[text]"},
}

#: Written to .nv-meta/sample_loader.py when a dataset mixes media extensions (``keep`` mode):
#: a field_map can name only one part, this picks whichever ``image.*``/``audio.*`` part is there.
_SAMPLE_LOADER = '''"""Written by energon-platform: picks the {part}.* member, whatever its extension."""

def sample_loader(raw):
    media = next(v for k, v in raw.items() if k.startswith("{part}."))
    text = raw["text.json"]
    return {fields}


def part_filter(part):
    return part.startswith("{part}.") or part == "text.json"
'''


def dataset_yaml(modality: str, media_parts: list[str]) -> tuple[dict, str | None]:
    """The ``dataset.yaml`` document, and the sample-loader source when one is needed."""
    if modality == "conversation":  # ConversationSample: image<N> parts + conversation.json
        from converters.readers.llava import dataset_yaml as conversation_yaml

        return conversation_yaml()
    fields = _FIELDS[modality]
    doc = {"sample_type": _SAMPLE_TYPES[modality]}
    if len(media_parts) <= 1:
        media = (
            media_parts[0]
            if media_parts
            else f"{modality}.{'png' if modality == 'image' else 'flac'}"
        )
        doc["field_map"] = {k: media if v == "MEDIA" else v for k, v in fields.items()}
        return doc, None
    exprs = {
        k: "media"
        if v == "MEDIA"
        else ("text" if v == "text.json" else f"text[{v.split('[')[1][:-1]!r}]")
        for k, v in fields.items()
    }
    body = "{" + ", ".join(f"{k!r}: {e}" for k, e in exprs.items()) + "}"
    doc["sample_loader"] = "sample_loader.py:sample_loader"
    doc["part_filter"] = "sample_loader.py:part_filter"
    return doc, _SAMPLE_LOADER.format(part=modality, fields=body)


def prepare(
    out_dir: str,
    shards: list[str],
    modality: str,
    media_parts: list[str],
    identity: str,
    records=None,
) -> None:
    """Index the shards with Energon, write the split (``train/``, ``val/`` prefixes) and
    ``dataset.yaml``. ``identity`` (the conversion fingerprint) makes ``index.uuid`` a function
    of the content instead of a random value, so two conversions of the same input are identical.
    The index is always built into a fresh ``index.sqlite``: Energon reuses an existing file (left
    by an interrupted or earlier run) and its bytes would then depend on that file's history.

    ``records`` (``shard name -> record``, `converters.shard_index`): build the same index
    from the shards' records, without the shards in ``out_dir`` (nor their ``.tar.idx`` written)."""
    from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory

    preparator = BaseWebdatasetFactory
    if records is not None:
        from converters.shard_index import RecordPreparator

        RecordPreparator.records, preparator = staticmethod(records), RecordPreparator
    out = Path(out_dir)
    for stale in (out / META).glob("index.sqlite*"):
        stale.unlink()
    with contextlib.redirect_stdout(io.StringIO()):  # Energon prints progress lines of its own
        preparator.prepare_dataset(
            out,
            shards,
            split_parts_patterns=[("train", r"^train/.*"), ("val", r"^val/.*")],
            shuffle_seed=None,
            workers=1,  # one indexing process: row order (and so the sqlite bytes) is deterministic
        )
    (out / META / "index.uuid").write_text(
        str(uuid.uuid5(uuid.NAMESPACE_URL, f"energon-platform:{identity}"))
    )
    doc, loader_src = dataset_yaml(modality, media_parts)
    if loader_src:
        (out / META / "sample_loader.py").write_text(loader_src)
    (out / META / "dataset.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
