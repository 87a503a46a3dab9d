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
    def ann_order(a: dict):  # annotation-id order; ints before anything else, never a TypeError
        i = a.get("id")
        return str(a.get("image_id")), (0, i, "") if isinstance(i, int) else (1, 0, str(i))

    for ann in sorted((a for a in ann_rows if isinstance(a, dict)), key=ann_order):
        captions[ann.get("image_id")].append(ann.get("caption"))

    records, problems, good = [], [], []
    for row in image_rows:
        ok = isinstance(row, dict) and isinstance(row.get("id"), (int, str)) and not isinstance(row.get("id"), bool) \
            and isinstance(row.get("file_name"), str)
        if ok:
            good.append(row)
        else:
            problems.append(Problem("malformed_line", str(row.get("id") if isinstance(row, dict) else row)[:80],
                                    f"image entry without an id and a file_name: {str(row)[:200]}"))
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
