"""COCO captions: ``captions_*.json`` (``images`` + ``annotations``) and an image folder.

One record per image, all its captions kept in annotation-id order; key = the zero-padded image
id (``000000000042``), so lexical order equals numeric order.
"""

from __future__ import annotations

import json
from collections import defaultdict

from converters.readers import InputError, existing_dir, existing_file
from converters.records import Media, Problem, ReadResult, Record, clean_texts, make_key


def image_key(image_id) -> str:
    return f"{image_id:012d}" if isinstance(image_id, int) and image_id >= 0 else make_key(str(image_id))


def read(annotations: str, images: str) -> ReadResult:
    ann_path = existing_file(annotations, "COCO annotations file")
    img_dir = existing_dir(images, "COCO image folder")
    try:
        doc = json.loads(ann_path.read_text(encoding="utf-8"))
        image_rows, ann_rows = doc["images"], doc["annotations"]
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{ann_path}: not a COCO captions file ({type(e).__name__}: {e})") from e

    captions = defaultdict(list)
    for ann in sorted(ann_rows, key=lambda a: (str(a.get("image_id")), a.get("id", 0))):
        captions[ann.get("image_id")].append(ann.get("caption"))

    records, problems = [], []
    for row in sorted(image_rows, key=lambda r: (isinstance(r.get("id"), str), r.get("id"))):
        image_id, file_name = row.get("id"), row.get("file_name")
        if image_id is None or not isinstance(file_name, str):
            problems.append(Problem("malformed_line", str(image_id), f"image entry without id/file_name: {row}"))
            continue
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
