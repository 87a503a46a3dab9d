"""LLaVA-style instruction data: one JSON file (an array, or JSON lines) + an image folder.

Entry format (LLaVA-Instruct, ShareGPT4V, ...):

    {"id": "000000033471",
     "image": "coco/train2017/000000033471.jpg",            # or "images": [...], or neither
     "conversations": [{"from": "human", "value": "<image>\\nWhat are the colors of the bus?"},
                       {"from": "gpt", "value": "The bus is white and red."}, ...]}

Image paths resolve relative to ``--images``. Several images per entry (``images``: a list), and
entries without any (text-only conversations), are kept. Key = the ``id`` (made key-safe); order is
the file's. Each entry is checked here and a bad one is a counted problem, never fatal:
``malformed_line`` for an entry that is not an object, has no id, a non-string image path,
``conversations`` that are not a list of ``{"from", "value"}`` turns with ``from`` one of
``human``/``gpt``/``system``, more ``<image>`` placeholders than images, or a placeholder in a
``gpt`` turn; ``empty_text`` for a conversation without a ``gpt`` turn with text. A missing or
undecodable image is counted by the writer (``missing_file``, ``not_an_image``, ...), which decodes
every image of the entry; one bad image skips the whole entry.

Output (modality ``conversation``): ``KEY.image0.png``, ``KEY.image1.png``, ... (``--image-format``
as for every image source) and ``KEY.conversation.json`` = ``{"conversation": [...turns as
given...], "source": {"kind", "id", "images": [{"file", "width", "height", ...}]}}``;
``.nv-meta/dataset.yaml`` makes Energon yield `converters.sample_types.ConversationSample`
(through a small ``sample_loader.py`` that collects the ``image<N>`` parts in order).

Record layout (for `converters.convert`'s resume fingerprint): ``texts`` holds the
conversation as JSON and, second, the list of ``[file, size, mtime_ns]`` of every image, so a
changed image or conversation is a different input; ``media`` is the first image (none when
text-only); ``extra["images"]`` lists every image's path and name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from converters.readers import InputError, decode_text, existing_dir, existing_file, read_input
from converters.readers.tables import iter_rows
from converters.records import Media, Problem, ReadResult, Record, id_text, make_key

IMAGE_TOKEN = "<image>"
ROLES = ("human", "gpt", "system")

#: ``.nv-meta/sample_loader.py`` of a conversation dataset.
SAMPLE_LOADER = '''"""Written by energon-platform (convert llava): image<N>.* parts in order + conversation.json."""


def _index(part):
    return int(part.split(".", 1)[0][len("image"):])


def sample_loader(raw):
    parts = sorted((k for k in raw if k.startswith("image")), key=_index)
    meta = raw["conversation.json"]
    return {"images": [raw[k] for k in parts], "conversation": meta["conversation"], "meta": meta}


def part_filter(part):
    return part.startswith("image") or part == "conversation.json"
'''


def dataset_yaml() -> tuple[dict, str]:
    """The ``dataset.yaml`` document and ``sample_loader.py`` source of a conversation dataset."""
    return (
        {
            "sample_type": {
                "__module__": "converters.sample_types",
                "__class__": "ConversationSample",
            },
            "sample_loader": "sample_loader.py:sample_loader",
            "part_filter": "sample_loader.py:part_filter",
        },
        SAMPLE_LOADER,
    )


def _entries(path: Path):
    """``(where, entry or Problem)`` in file order: a JSON array, or JSON lines (``.jsonl``)."""
    if path.suffix.lower() == ".jsonl":
        for n, row in iter_rows(path, "jsonl"):
            yield f"line {n}", row
        return
    try:
        doc = json.loads(decode_text(read_input(path, "LLaVA json file")))
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not a JSON file ({type(e).__name__}: {str(e)[:200]})") from e
    if not isinstance(doc, list):
        raise InputError(
            f"{path}: expected a JSON array of conversations, got {type(doc).__name__}"
        )
    for i, entry in enumerate(doc):
        yield f"entry {i}", entry


def _check_conversation(turns, num_images: int) -> tuple[str, str] | None:
    """``(reason, detail)`` when the turns are unusable, else None."""
    if not isinstance(turns, list) or not turns:
        return "malformed_line", "'conversations' is not a non-empty list"
    placeholders = 0
    for i, turn in enumerate(turns):
        if (
            not isinstance(turn, dict)
            or turn.get("from") not in ROLES
            or not isinstance(turn.get("value"), str)
        ):
            return (
                "malformed_line",
                f"turn {i} is not {{'from': one of {list(ROLES)}, 'value': str}}: {str(turn)[:120]}",
            )
        count = turn["value"].count(IMAGE_TOKEN)
        if count and turn["from"] == "gpt":
            return "malformed_line", f"turn {i} ('gpt') holds an {IMAGE_TOKEN} placeholder"
        placeholders += count
    if placeholders > num_images:
        return (
            "malformed_line",
            f"{placeholders} {IMAGE_TOKEN} placeholders for {num_images} image(s)",
        )
    if not any(t["from"] == "gpt" and t["value"].strip() for t in turns):
        return "empty_text", "no 'gpt' turn with text"
    return None


def _stat(path: Path) -> list[int]:
    try:
        st = os.stat(path)
        return [st.st_size, st.st_mtime_ns]
    except OSError:
        return [-1, -1]


def read(json_file: str, images: str) -> ReadResult:
    path = existing_file(json_file, "LLaVA json file")
    img_dir = existing_dir(images, "LLaVA image folder")
    records, problems = [], []
    for where, entry in _entries(path):
        if isinstance(entry, Problem):
            problems.append(entry)
            continue
        if not isinstance(entry, dict):
            problems.append(Problem("malformed_line", where, f"not an object: {str(entry)[:200]}"))
            continue
        source_id = id_text(entry.get("id"))
        if source_id is None:
            problems.append(
                Problem(
                    "malformed_line", where, f"no 'id' (missing, null or empty): {str(entry)[:200]}"
                )
            )
            continue
        names = entry.get("images", entry.get("image", []))
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            problems.append(
                Problem(
                    "malformed_line",
                    source_id,
                    f"'image'/'images' is not a path or a list of paths: {str(names)[:200]}",
                )
            )
            continue
        bad = _check_conversation(entry.get("conversations"), len(names))
        if bad:
            problems.append(Problem(bad[0], source_id, bad[1]))
            continue
        files = [img_dir / n for n in names]
        records.append(
            Record(
                key=make_key(source_id),
                source_id=source_id,
                media=Media(path=str(files[0]), name=names[0]) if files else Media(name=""),
                texts=(
                    json.dumps(entry["conversations"], ensure_ascii=False, sort_keys=True),
                    json.dumps([[n, *_stat(f)] for n, f in zip(names, files)]),
                ),
                extra={"images": [[str(f), n] for f, n in zip(files, names)]},
            )
        )
    return ReadResult("conversation", records, problems)


def encode_record(rec: Record, opts, read_media: Callable[[Media], bytes]) -> dict:
    """A conversation record → its tar parts (module doc). ``read_media`` and the image encoding are
    the writer's own, so bad images are counted the same way as for every image source."""
    from converters.media import encode_image

    parts, infos = {"__key__": rec.key}, []
    for i, (file, name) in enumerate(rec.extra["images"]):
        ext, payload, info = encode_image(read_media(Media(path=file, name=name)), opts.image)
        parts[f"image{i}.{ext}"] = payload
        infos.append({"file": name, **info})
    doc = {
        "conversation": json.loads(rec.texts[0]),
        "source": {"kind": opts.source_kind, "id": rec.source_id, "images": infos},
    }
    parts["conversation.json"] = json.dumps(doc, sort_keys=True, ensure_ascii=False).encode("utf-8")
    return parts
