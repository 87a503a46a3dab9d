"""COCO captions: ``captions_*.json`` (``images`` + ``annotations``) and an image folder.

One record per image, all its captions kept in annotation-id order; key = the zero-padded image
id (``000000000042``), so lexical order equals numeric order. ``images`` and ``annotations`` must be
lists (else `InputError`). Nothing is dropped silently: a malformed image row or annotation
is a ``malformed_line``, an annotation whose ``image_id`` names no image (including ``"5"`` where
the image id is ``5``) is an ``unknown_image_id``.
"""

from __future__ import annotations

import json
from collections import defaultdict

from converters.readers import InputError, decode_text, existing_dir, existing_file, read_input
from converters.records import Media, Problem, ReadResult, Record, clean_texts, make_key


def image_key(image_id) -> str:
    return (
        f"{image_id:012d}"
        if isinstance(image_id, int) and image_id >= 0
        else make_key(str(image_id))
    )


def _is_id(value) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def _load(ann_path) -> tuple[list, list]:
    try:
        doc = json.loads(decode_text(read_input(ann_path, "COCO annotations file")))
        image_rows, ann_rows = doc["images"], doc["annotations"]
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{ann_path}: not a COCO captions file ({type(e).__name__}: {e})") from e
    for name, rows in (("images", image_rows), ("annotations", ann_rows)):
        if not isinstance(rows, list):
            raise InputError(
                f"{ann_path}: not a COCO captions file ({name!r} is {type(rows).__name__}, not a list)"
            )
    return image_rows, ann_rows


def _captions(ann_rows: list, image_ids: set) -> tuple[dict, list[Problem]]:
    """image id → captions in annotation-id order, and the annotations that cannot be used."""

    def ann_order(a: dict):  # annotation-id order; ints before anything else, never a TypeError
        i = a.get("id")
        return str(a.get("image_id")), (0, i, "") if isinstance(i, int) else (1, 0, str(i))

    captions, problems = defaultdict(list), []
    for ann in ann_rows:
        if not isinstance(ann, dict):
            problems.append(
                Problem(
                    "malformed_line",
                    str(ann)[:80],
                    f"annotation is not an object: {str(ann)[:200]}",
                )
            )
    for ann in sorted((a for a in ann_rows if isinstance(a, dict)), key=ann_order):
        image_id, where = ann.get("image_id"), f"annotation {ann.get('id')}"
        if not _is_id(image_id) or image_id not in image_ids:
            problems.append(
                Problem("unknown_image_id", where, f"image_id {image_id!r} names no image")
            )
        elif not isinstance(ann.get("caption"), str):
            problems.append(
                Problem(
                    "malformed_line",
                    where,
                    f"caption is not a string: {str(ann.get('caption'))[:100]}",
                )
            )
        else:
            captions[image_id].append(ann["caption"])
    return captions, problems


def read(annotations: str, images: str) -> ReadResult:
    ann_path = existing_file(annotations, "COCO annotations file")
    img_dir = existing_dir(images, "COCO image folder")
    image_rows, ann_rows = _load(ann_path)

    records, problems, good = [], [], []
    for row in image_rows:
        if (
            isinstance(row, dict)
            and _is_id(row.get("id"))
            and isinstance(row.get("file_name"), str)
        ):
            good.append(row)
        else:
            problems.append(
                Problem(
                    "malformed_line",
                    str(row.get("id") if isinstance(row, dict) else row)[:80],
                    f"image entry without an id and a file_name: {str(row)[:200]}",
                )
            )
    captions, ann_problems = _captions(ann_rows, {row["id"] for row in good})
    problems += ann_problems
    for row in sorted(good, key=lambda r: (isinstance(r["id"], str), r["id"])):
        image_id, file_name = row["id"], row["file_name"]
        texts = clean_texts(captions.get(image_id, ()))
        if not texts:
            problems.append(Problem("empty_text", str(image_id), "image has no non-empty caption"))
            continue
        records.append(
            Record(
                key=image_key(image_id),
                source_id=str(image_id),
                media=Media(path=str(img_dir / file_name), name=file_name),
                texts=texts,
                extra={"coco_image_id": image_id},
            )
        )
    return ReadResult("image", records, problems)
